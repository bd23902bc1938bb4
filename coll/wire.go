package coll

// Framing and encoding of bootstrap messages, with internal/frame: a frame
// is a 4-byte big-endian payload length, a type byte and the payload; the
// fields inside are big-endian integers and uint32-length-prefixed byte
// strings. Each frameConn has one reader at a time (the goroutine that
// owns the connection's reading: a root's goroutine for that rank, or the
// rank's creator during setup and then its watcher) and serialises writers
// with wmu. enc and dec work on their caller's goroutine.

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
)

// Bootstrap message types.
const (
	msgHello  = 1 // rank → root: who I am
	msgInfo   = 2 // root → rank: everyone, once all joined
	msgXchg   = 3 // rank → root: one setup round, a blob per destination
	msgXchgR  = 4 // root → rank: the blobs addressed to it, per source
	msgAbort  = 5 // both ways: a rank failed (rank, reason)
	msgBye    = 6 // rank → root: leaving cleanly
	msgLeft   = 7 // root → rank: a rank left cleanly
	msgAllBye = 8 // root → rank: every rank has left
	msgError  = 9 // root → rank: the communicator cannot form (reason)
)

const (
	bootMagic = 0x524b4342 // "RKCB"
	bootVer   = 2          // 2: internal/frame header (payload length, then type)
)

// Frame size limits, the same for reading and writing (a frame too big to
// send fails at the sender, with the sizes, rather than at the reader).
//
// Until a connection's hello has shown the communicator's nonce, the root
// reads at most helloLimit: a hello is 4+4+8+4+4 bytes of fixed fields,
// the host identity (4 + a 36-byte boot id, "/" and a "pid:[N]" namespace
// link, ~60 bytes), the hostname (4 + at most 255, 64 on Linux), the PID
// and the timeout: about 400 bytes at most. A stranger thus costs the root
// a few KiB, however large a frame it claims.
//
// Once the number of ranks is known (the root: from the hello; a rank:
// from its own arguments) the limit is bootLimit(nranks). The messages
// that grow with the rank count carry one entry per rank:
//
//   - INFO, a row of the rank table per rank: IP (4 + ≤ 46 bytes, or a
//     little more with an IPv6 zone), host identity (4 + ~60), hostname
//     (4 + ≤ 255) and PID (4): under 512 bytes;
//   - XCHG and XCHG-R, a setup blob per peer (net.go): 4 (its length) +
//     device name (4 + ≤ 64) + channel count (4) + per channel (at most
//     maxChannels = 16) QPN, PSN, QP address (4 + 32 for tcp, 48 for
//     ibverbs, 88 for shm), three addresses, two keys and an ack address
//     (52 + the QP address): 2316 bytes with 16 channels and shm's 88-byte
//     addresses, and room for QP addresses up to ~190 bytes.
//
// perRank = 4 KiB bounds both with room to spare; baseLimit covers the
// fixed fields and the free-form reasons of ABORT and ERROR messages (error
// texts). So 8 ranks may send 96 KiB frames, 1024 ranks 4.06 MiB, and a
// peer claiming more is refused before anything is allocated (frame.Reader
// also grows its buffer only as bytes arrive).
const (
	helloLimit = 4 << 10
	perRank    = 4 << 10
	baseLimit  = 64 << 10
)

// bootLimit is the largest frame of a communicator of nranks ranks (at
// most 2 GiB, for absurd rank counts).
func bootLimit(nranks int) int {
	return baseLimit + min(max(nranks, 0), (math.MaxInt32-baseLimit)/perRank)*perRank
}

var errFrame = errors.New("malformed bootstrap message")

type frameConn struct {
	c  net.Conn
	fr *frame.Reader // the reading goroutine's

	// wmu serialises writes.
	wmu sync.Mutex
	fw  *frame.Writer
}

// newFrameConn frames c, with limit bytes at most per frame either way.
func newFrameConn(c net.Conn, limit int) *frameConn {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 5})
	}
	return &frameConn{c: c, fr: frame.NewReader(bufio.NewReader(c), limit), fw: frame.NewWriter(c, limit)}
}

// setLimit changes the frame limit both ways; the reading goroutine calls
// it, between frames.
func (f *frameConn) setLimit(n int) {
	f.fr.SetLimit(n)
	f.wmu.Lock()
	f.fw.SetLimit(n)
	f.wmu.Unlock()
}

func (f *frameConn) write(typ byte, payload []byte) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	return f.fw.WriteFrame(typ, payload)
}

// read returns the next frame. The payload is valid until the next read:
// copy what outlives it. A frame over the limit is an errFrame error
// naming its size and the limit, refused before anything is allocated.
func (f *frameConn) read() (byte, []byte, error) {
	typ, p, err := f.fr.Next()
	if err != nil {
		if errors.Is(err, frame.ErrTooLarge) {
			err = fmt.Errorf("%w: %w", errFrame, err)
		}
		return 0, nil, err
	}
	return typ, p, nil
}

func (f *frameConn) close() error { return f.c.Close() }

// enc appends big-endian fields.
type enc []byte

func (e *enc) u32(v uint32)   { *e = frame.AppendUint32(*e, v) }
func (e *enc) u64(v uint64)   { *e = frame.AppendUint64(*e, v) }
func (e *enc) bytes(b []byte) { *e = frame.AppendBytes32(*e, b) }
func (e *enc) str(s string)   { *e = frame.AppendString32(*e, s) }

// dec reads what enc wrote, with frame's checked Decoder: every length is
// checked against what remains; the first short read sets err (matching
// errFrame and frame.ErrTruncated) and zeroes the rest. bytes aliases b.
type dec struct {
	b   []byte // not read yet
	err error
}

func (d *dec) u32() uint32 {
	fd := frame.NewDecoder(d.b)
	v := fd.Uint32()
	d.done(&fd)
	return v
}

func (d *dec) u64() uint64 {
	fd := frame.NewDecoder(d.b)
	v := fd.Uint64()
	d.done(&fd)
	return v
}

func (d *dec) bytes() []byte {
	fd := frame.NewDecoder(d.b)
	v := fd.Bytes32()
	d.done(&fd)
	return v
}

func (d *dec) str() string { return string(d.bytes()) }

// done takes what fd left, and its failure if it is the first.
func (d *dec) done(fd *frame.Decoder) {
	if err := fd.Err(); err != nil && d.err == nil {
		d.err = fmt.Errorf("%w: %w", errFrame, err)
	}
	d.b = fd.Rest()
}
