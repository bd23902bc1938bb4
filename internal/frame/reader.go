package frame

// No goroutines: a Reader is used by the one goroutine reading its stream.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Payload buffer sizes. A Reader allocates at most growMin bytes for a
// frame before the peer has sent that many, then doubles as bytes arrive,
// so that what a frame costs follows what the peer sent, not what it
// claimed. Buffers up to keepMax are kept for the next frame; larger ones
// are dropped once the frame has been consumed.
const (
	growMin = 16 << 10
	keepMax = 64 << 10
)

// Reader reads frames from a stream into a reusable buffer.
//
// It reads exactly the bytes of the frames it returns (nothing ahead), so
// a stream can be handed from one Reader to another between frames; wrap
// the stream in a bufio.Reader to save system calls.
//
// Deadlines: when the stream's Read fails with something other than an
// end of stream (a net.Conn deadline that expired, for instance), Next
// returns that error as it is and keeps what it had read of the frame; a
// later Next (after the deadline moves) carries on with the same frame.
// To make a blocked Next return when a context ends, expire the
// connection's deadline from context.AfterFunc.
//
// A frame over the limit and a stream that ends inside a frame leave the
// stream out of step: every later Next returns the same error.
type Reader struct {
	src   io.Reader
	limit int
	hdr   [HeaderLen]byte
	nh    int    // header bytes of the frame in progress read so far
	np    int    // payload bytes of the frame in progress read so far
	buf   []byte // payload buffer (len = what is allocated)
	err   error  // sticky: the stream is out of step
}

// NewReader returns a Reader of src refusing payloads over limit bytes
// (DefaultLimit if limit ≤ 0, at most MaxLimit).
func NewReader(src io.Reader, limit int) *Reader {
	return &Reader{src: src, limit: limitOf(limit)}
}

// Reset makes r read a new stream, keeping its limit and buffer.
func (r *Reader) Reset(src io.Reader) {
	r.src, r.nh, r.np, r.err = src, 0, 0, nil
}

// SetLimit changes the limit for the frames whose header is not complete
// yet (DefaultLimit if n ≤ 0, at most MaxLimit).
func (r *Reader) SetLimit(n int) { r.limit = limitOf(n) }

// Limit returns the limit in force.
func (r *Reader) Limit() int { return r.limit }

// Next reads the next frame and returns its type and payload. The payload
// is valid until the next call to Next or Reset (copy what you keep). At
// the end of the stream between frames Next returns io.EOF; within a
// frame, an error matching ErrTruncated and io.ErrUnexpectedEOF. A frame
// over the limit is refused with a *SizeError (matching ErrTooLarge) as
// soon as its header is in, before anything is allocated for it.
func (r *Reader) Next() (typ byte, payload []byte, err error) {
	if r.err != nil {
		return 0, nil, r.err
	}
	if r.nh == 0 && len(r.buf) > keepMax {
		r.buf = nil // the big payload handed out last time is the caller's now
	}
	if r.nh < HeaderLen {
		n, err := io.ReadFull(r.src, r.hdr[r.nh:])
		r.nh += n
		if err != nil {
			if r.nh == 0 && err == io.EOF {
				return 0, nil, io.EOF
			}
			return 0, nil, r.ended(err, -1, r.nh, HeaderLen)
		}
	}
	typ = r.hdr[4]
	size := uint64(binary.BigEndian.Uint32(r.hdr[:4]))
	if size > uint64(r.limit) {
		r.err = &SizeError{Size: size, Limit: r.limit, Type: typ}
		return 0, nil, r.err
	}
	want := int(size)
	for r.np < want {
		room := min(want, len(r.buf))
		if r.np == room {
			// Out of room: grow by what has arrived so far, not by what
			// the header claims.
			room = min(want, max(2*len(r.buf), growMin))
			nb := make([]byte, room)
			copy(nb, r.buf[:r.np])
			r.buf = nb
		}
		n, err := io.ReadFull(r.src, r.buf[r.np:room])
		r.np += n
		if err != nil {
			return 0, nil, r.ended(err, int(typ), r.np, want)
		}
	}
	r.nh, r.np = 0, 0
	if want == 0 {
		return typ, nil, nil
	}
	return typ, r.buf[:want:want], nil
}

// ended turns an end of stream inside a frame (in its header if typ < 0)
// into a sticky ErrTruncated error and passes any other error through,
// keeping the frame's progress.
func (r *Reader) ended(err error, typ, got, want int) error {
	if err != io.EOF && !errors.Is(err, io.ErrUnexpectedEOF) {
		return err
	}
	if typ < 0 {
		r.err = fmt.Errorf("%w: stream ended after %d of %d header bytes: %w", ErrTruncated, got, want, io.ErrUnexpectedEOF)
	} else {
		r.err = fmt.Errorf("%w: stream ended after %d of %d payload bytes (type %d): %w", ErrTruncated, got, want, typ, io.ErrUnexpectedEOF)
	}
	return r.err
}
