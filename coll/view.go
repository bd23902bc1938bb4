package coll

import "github.com/rdmakit/rdmakit/coll/internal/reduce"

// Element is a Go type whose values can be collective elements.
type Element interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64 | F16 | BF16
}

// Slice views b (for example memory from Comm.Alloc) as elements of T,
// sharing its memory. It returns nil when b is not aligned for T.
func Slice[T Element](b []byte) []T { return reduce.View[T](b) }

// Bytes views s as bytes, to pass typed Go memory to a collective.
func Bytes[T Element](s []T) []byte { return reduce.Bytes(s) }

// F16 is an IEEE 754 binary16 value (DataType Float16), as its bits.
type F16 uint16

// F16From rounds f to the nearest float16 (ties to even).
func F16From(f float32) F16 { return F16(reduce.F32ToF16(f)) }

// Float32 returns h exactly as float32.
func (h F16) Float32() float32 { return reduce.F16ToF32(uint16(h)) }

// Bits returns the encoding.
func (h F16) Bits() uint16 { return uint16(h) }

// BF16 is a bfloat16 value (DataType BFloat16), as its bits.
type BF16 uint16

// BF16From rounds f to the nearest bfloat16 (ties to even).
func BF16From(f float32) BF16 { return BF16(reduce.F32ToBF16(f)) }

// Float32 returns h exactly as float32.
func (h BF16) Float32() float32 { return reduce.BF16ToF32(uint16(h)) }

// Bits returns the encoding.
func (h BF16) Bits() uint16 { return uint16(h) }
