// Package frame reads and writes length-and-type frames over a byte stream:
// the control-plane framing of cm's handshake connections and coll's
// bootstrap connections.
//
// A frame is a header of HeaderLen bytes (the payload's length as a
// big-endian uint32, then a type byte) followed by the payload. Readers
// refuse frames whose payload exceeds their limit as soon as the header is
// in, before allocating anything for the payload, and grow a payload buffer
// only as the peer's bytes actually arrive.
//
// No goroutines: a Reader belongs to the one goroutine that reads its
// stream, a Writer to the one goroutine that writes (or to writers that
// the caller serialises); the functions and the Decoder work on the
// caller's goroutine and share nothing.
package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// HeaderLen is the length of a frame header: a big-endian uint32 payload
// length and a type byte.
const HeaderLen = 5

// MaxLimit is the largest payload a header can describe.
const MaxLimit = math.MaxUint32

// DefaultLimit is the payload limit of a Reader or Writer made with a
// limit of 0 or less.
const DefaultLimit = 64 << 10

// Errors. Errors from a Reader, a Writer and a Decoder wrap one of them, or
// are the underlying stream's errors as they are.
var (
	// ErrTooLarge: a frame's payload exceeds the limit. The error is a
	// *SizeError.
	ErrTooLarge = errors.New("frame: frame too large")
	// ErrTruncated: the stream ended inside a frame (the error also
	// matches io.ErrUnexpectedEOF), or a field runs past the end of its
	// payload.
	ErrTruncated = errors.New("frame: truncated")
	// ErrTrailing: a payload has bytes left after its last field.
	ErrTrailing = errors.New("frame: trailing bytes")
)

// SizeError reports a frame over the limit; it matches ErrTooLarge.
type SizeError struct {
	Size  uint64 // payload bytes the frame has, or claims to have
	Limit int    // the limit in force
	Type  byte   // the frame's type
	Write bool   // refused for sending rather than on receipt
}

func (e *SizeError) Error() string {
	if e.Write {
		return fmt.Sprintf("frame: cannot send a %d-byte frame (type %d): exceeds the %d-byte limit", e.Size, e.Type, e.Limit)
	}
	return fmt.Sprintf("frame: %d-byte frame exceeds the %d-byte limit", e.Size, e.Limit)
}

// Is makes a SizeError match ErrTooLarge.
func (e *SizeError) Is(target error) bool { return target == ErrTooLarge }

// PutHeader writes the header of a frame of type typ with an n-byte
// payload into b[:HeaderLen]. It panics if n is negative or over MaxLimit.
func PutHeader(b []byte, typ byte, n int) {
	if n < 0 || uint64(n) > MaxLimit {
		panic(fmt.Sprintf("frame: payload length %d out of range", n))
	}
	_ = b[HeaderLen-1]
	binary.BigEndian.PutUint32(b, uint32(n))
	b[4] = typ
}

// AppendFrame appends a frame of type typ carrying payload to dst. It
// panics if the payload is over MaxLimit bytes.
func AppendFrame(dst []byte, typ byte, payload []byte) []byte {
	var h [HeaderLen]byte
	PutHeader(h[:], typ, len(payload))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// limitOf turns a limit argument into the limit in force.
func limitOf(n int) int {
	if n <= 0 {
		return DefaultLimit
	}
	if uint64(n) > MaxLimit {
		return int(uint64(MaxLimit) & uint64(math.MaxInt)) // MaxLimit where an int holds it
	}
	return n
}
