package frame

// No goroutines: field encoders and the Decoder work on the caller's
// goroutine; a Decoder is not shared.

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Field encoding inside a payload: big-endian integers, and byte strings
// prefixed with their length as a uint8, uint16 or uint32.

// AppendUint16 appends v, big-endian.
func AppendUint16(dst []byte, v uint16) []byte { return binary.BigEndian.AppendUint16(dst, v) }

// AppendUint32 appends v, big-endian.
func AppendUint32(dst []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(dst, v) }

// AppendUint64 appends v, big-endian.
func AppendUint64(dst []byte, v uint64) []byte { return binary.BigEndian.AppendUint64(dst, v) }

// AppendBytes8 appends b with a uint8 length prefix. It panics if b is
// over 255 bytes: callers bound their fields before encoding.
func AppendBytes8(dst, b []byte) []byte {
	checkLen(len(b), math.MaxUint8)
	return append(append(dst, uint8(len(b))), b...)
}

// AppendBytes16 appends b with a uint16 length prefix. It panics if b is
// over 65535 bytes.
func AppendBytes16(dst, b []byte) []byte {
	checkLen(len(b), math.MaxUint16)
	return append(AppendUint16(dst, uint16(len(b))), b...)
}

// AppendBytes32 appends b with a uint32 length prefix. It panics if b is
// over MaxLimit bytes.
func AppendBytes32(dst, b []byte) []byte {
	checkLen(len(b), math.MaxUint32)
	return append(AppendUint32(dst, uint32(len(b))), b...)
}

// AppendString8 is AppendBytes8 for a string.
func AppendString8(dst []byte, s string) []byte {
	checkLen(len(s), math.MaxUint8)
	return append(append(dst, uint8(len(s))), s...)
}

// AppendString16 is AppendBytes16 for a string.
func AppendString16(dst []byte, s string) []byte {
	checkLen(len(s), math.MaxUint16)
	return append(AppendUint16(dst, uint16(len(s))), s...)
}

// AppendString32 is AppendBytes32 for a string.
func AppendString32(dst []byte, s string) []byte {
	checkLen(len(s), math.MaxUint32)
	return append(AppendUint32(dst, uint32(len(s))), s...)
}

func checkLen(n int, most uint64) {
	if uint64(n) > most {
		panic(fmt.Sprintf("frame: %d-byte field does not fit a %d-byte length prefix", n, most))
	}
}

// Decoder reads fields off a payload, checking every length against what
// remains. The first failure sticks: later reads return zero values and
// Err reports the failure (matching ErrTruncated). Byte slices it returns
// alias the payload.
type Decoder struct {
	p   []byte
	off int
	err error
}

// NewDecoder returns a Decoder of payload p.
func NewDecoder(p []byte) Decoder { return Decoder{p: p} }

// Err returns the first failure, or nil.
func (d *Decoder) Err() error { return d.err }

// Finish returns the first failure, or an ErrTrailing error if bytes are
// left: a payload must hold its fields and nothing else.
func (d *Decoder) Finish() error {
	if d.err == nil && d.off != len(d.p) {
		return fmt.Errorf("%w: %d bytes after the last field (at offset %d)", ErrTrailing, len(d.p)-d.off, d.off)
	}
	return d.err
}

// Len returns the number of bytes not yet read (0 after a failure).
func (d *Decoder) Len() int {
	if d.err != nil {
		return 0
	}
	return len(d.p) - d.off
}

// Rest returns the bytes not yet read (nil after a failure) without
// consuming them.
func (d *Decoder) Rest() []byte {
	if d.err != nil {
		return nil
	}
	return d.p[d.off:]
}

// Bytes returns the next n bytes.
func (d *Decoder) Bytes(n int) []byte { return d.next(uint64(n), n < 0) }

func (d *Decoder) next(n uint64, bad bool) []byte {
	if d.err != nil {
		return nil
	}
	if left := uint64(len(d.p) - d.off); bad || n > left {
		d.err = fmt.Errorf("%w: a %d-byte field at offset %d with %d bytes left", ErrTruncated, n, d.off, left)
		d.off = len(d.p)
		return nil
	}
	v := d.p[d.off : d.off+int(n) : d.off+int(n)]
	d.off += int(n)
	return v
}

// Uint8 reads a byte.
func (d *Decoder) Uint8() uint8 {
	if b := d.next(1, false); b != nil {
		return b[0]
	}
	return 0
}

// Uint16 reads a big-endian uint16.
func (d *Decoder) Uint16() uint16 {
	if b := d.next(2, false); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

// Uint32 reads a big-endian uint32.
func (d *Decoder) Uint32() uint32 {
	if b := d.next(4, false); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// Uint64 reads a big-endian uint64.
func (d *Decoder) Uint64() uint64 {
	if b := d.next(8, false); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

// Bytes8 reads a byte string with a uint8 length prefix.
func (d *Decoder) Bytes8() []byte { return d.prefixed(uint64(d.Uint8())) }

// Bytes16 reads a byte string with a uint16 length prefix.
func (d *Decoder) Bytes16() []byte { return d.prefixed(uint64(d.Uint16())) }

// Bytes32 reads a byte string with a uint32 length prefix.
func (d *Decoder) Bytes32() []byte { return d.prefixed(uint64(d.Uint32())) }

// String8 reads a string with a uint8 length prefix.
func (d *Decoder) String8() string { return string(d.Bytes8()) }

// String16 reads a string with a uint16 length prefix.
func (d *Decoder) String16() string { return string(d.Bytes16()) }

// String32 reads a string with a uint32 length prefix.
func (d *Decoder) String32() string { return string(d.Bytes32()) }

// prefixed reads the n bytes after a length prefix; an empty string is a
// non-nil empty slice, so that a caller can tell it from a failure.
func (d *Decoder) prefixed(n uint64) []byte {
	if d.err != nil {
		return nil
	}
	return d.next(n, false)
}
