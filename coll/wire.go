package coll

// Framing and encoding of bootstrap messages. A frame is a 4-byte
// big-endian length (of what follows), a type byte and a payload. Each
// frameConn has one reader at a time (the goroutine that owns the
// connection's reading) and serialises writers with wmu.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
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
	maxFrame  = 256 << 20
	bootMagic = 0x524b4342 // "RKCB"
	bootVer   = 1
)

var errFrame = errors.New("malformed bootstrap message")

type frameConn struct {
	c net.Conn
	r *bufio.Reader

	// wmu serialises writes.
	wmu sync.Mutex
}

func newFrameConn(c net.Conn) *frameConn {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 5})
	}
	return &frameConn{c: c, r: bufio.NewReader(c)}
}

func (f *frameConn) write(typ byte, payload []byte) error {
	var h [5]byte
	binary.BigEndian.PutUint32(h[:], uint32(len(payload)+1))
	h[4] = typ
	f.wmu.Lock()
	defer f.wmu.Unlock()
	f.c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err := (&net.Buffers{h[:], payload}).WriteTo(f.c)
	return err
}

func (f *frameConn) read() (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(f.r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[:])
	if n < 1 || n > maxFrame {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes", errFrame, n)
	}
	p := make([]byte, n-1)
	if _, err := io.ReadFull(f.r, p); err != nil {
		return 0, nil, err
	}
	return h[4], p, nil
}

func (f *frameConn) close() error { return f.c.Close() }

// enc appends big-endian fields.
type enc []byte

func (e *enc) u32(v uint32) { *e = binary.BigEndian.AppendUint32(*e, v) }
func (e *enc) u64(v uint64) { *e = binary.BigEndian.AppendUint64(*e, v) }
func (e *enc) bytes(b []byte) {
	e.u32(uint32(len(b)))
	*e = append(*e, b...)
}
func (e *enc) str(s string) { e.bytes([]byte(s)) }

// dec reads what enc wrote; the first short read sets err and zeroes the
// rest.
type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || n < 0 || len(d.b) < n {
		d.err = errFrame
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *dec) u32() uint32 {
	if b := d.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *dec) bytes() []byte {
	n := d.u32()
	if n > maxFrame {
		d.err = errFrame
		return nil
	}
	return d.take(int(n))
}

func (d *dec) str() string { return string(d.bytes()) }
