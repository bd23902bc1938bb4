package reduce

import "math"

// Half-precision conversions. float16 is IEEE 754 binary16; bfloat16 is the
// top half of a binary32. Both convert to float32 exactly; float32 → half
// rounds to nearest, ties to even, with overflow to infinity and NaN kept
// NaN (quiet).
//
// Arithmetic on halves is done in float32 and rounded once: float32 has
// 24 significand bits, at least 2p+2 for both p = 11 (float16) and p = 8
// (bfloat16), so the double rounding of + − × ÷ is innocuous and results
// equal correctly rounded half-precision arithmetic.
//
// The conversions use the FPU for the rare subnormal cases and integer
// arithmetic otherwise, with one well-predicted branch on ordinary data,
// and are small enough to inline into the kernels.

const (
	f16ExpShifted = 0x7c00 << 13 // float16 exponent field, moved to float32's place
	// f16Denorm is 2^-14 as float32: adding it aligns a float16 subnormal's
	// bits at the bottom of the significand.
	f16Denorm = 113 << 23
)

// F16ToF32 converts a float16 (as its bits) to float32.
func F16ToF32(h uint16) float32 {
	u := uint32(h&0x7fff) << 13
	e := u & f16ExpShifted
	u += (127 - 15) << 23
	if e == f16ExpShifted { // Inf, NaN
		u += (128 - 16) << 23
	} else if e == 0 { // zero, subnormal: renormalise through the FPU
		u += 1 << 23
		u = math.Float32bits(math.Float32frombits(u) - math.Float32frombits(f16Denorm))
	}
	return math.Float32frombits(u | uint32(h&0x8000)<<16)
}

// F32ToF16 converts float32 to float16 bits, rounding to nearest even.
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	a := u & 0x7fffffff
	if a-113<<23 >= (127+16-113)<<23 { // not a float16 normal: rare
		return f32ToF16Rare(u)
	}
	// Rebias and round in one add: 0xfff is just under half an ulp, the
	// odd bit breaks ties to even; a carry into the exponent is right.
	return uint16(u>>16)&0x8000 | uint16((a+0xfff+(a>>13)&1-(127-15)<<23)>>13)
}

//go:noinline
func f32ToF16Rare(u uint32) uint16 {
	sign := uint16(u>>16) & 0x8000
	u &= 0x7fffffff
	if u >= (127+16)<<23 { // overflow, Inf, NaN
		if u > 0x7f800000 {
			return sign | 0x7e00 | uint16(u>>13)&0x1ff
		}
		return sign | 0x7c00
	}
	// Subnormal or zero: adding the magic float puts float16's last
	// subnormal bit at float32's last significand bit, and the FPU rounds
	// to nearest even.
	const magic = (127 - 15 + 23 - 10 + 1) << 23
	v := math.Float32frombits(u) + math.Float32frombits(magic)
	return sign | uint16(math.Float32bits(v)-magic)
}

// BF16ToF32 converts a bfloat16 (as its bits) to float32.
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts float32 to bfloat16 bits, rounding to nearest even.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40 // quiet NaN
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// halfKey maps half-precision bits (float16 or bfloat16: sign, then
// magnitude) to integers in the order of the values, for min and max
// without conversion. -0 sorts below +0; NaNs sort beyond the infinities.
func halfKey(h uint16) int32 {
	s := int32(int16(h))
	return s ^ (s>>15)&0x7fff
}
