package frame

// No goroutines: a Writer is used by one goroutine at a time (the caller
// serialises concurrent writers, with a mutex for instance).

import (
	"io"
	"net"
)

// copyMax is the largest payload a Writer copies into its buffer to send
// the frame in one Write; larger payloads go out from where they are
// (writev on a net.Conn), so that the buffer stays small.
const copyMax = 16 << 10

// Writer writes frames to a stream, each with one Write when its payload
// is small.
type Writer struct {
	dst   io.Writer
	limit int
	buf   []byte
}

// NewWriter returns a Writer to dst that refuses payloads over limit bytes
// (DefaultLimit if limit ≤ 0, at most MaxLimit): set it to the peer's
// Reader limit, so that an oversized frame fails here, clearly, rather
// than at the peer.
func NewWriter(dst io.Writer, limit int) *Writer {
	return &Writer{dst: dst, limit: limitOf(limit)}
}

// SetLimit changes the limit (DefaultLimit if n ≤ 0, at most MaxLimit).
func (w *Writer) SetLimit(n int) { w.limit = limitOf(n) }

// Limit returns the limit in force.
func (w *Writer) Limit() int { return w.limit }

// WriteFrame writes one frame. A payload over the limit is refused with a
// *SizeError (matching ErrTooLarge) and nothing is written. Errors of the
// stream are returned as they are.
func (w *Writer) WriteFrame(typ byte, payload []byte) error {
	if len(payload) > w.limit {
		return &SizeError{Size: uint64(len(payload)), Limit: w.limit, Type: typ, Write: true}
	}
	if len(payload) <= copyMax {
		w.buf = AppendFrame(w.buf[:0], typ, payload)
		_, err := w.dst.Write(w.buf)
		return err
	}
	h := make([]byte, HeaderLen)
	PutHeader(h, typ, len(payload))
	bufs := net.Buffers{h, payload}
	_, err := bufs.WriteTo(w.dst)
	return err
}
