// Package reduce holds collective reduction kernels: element-wise sum,
// product, minimum and maximum of two byte buffers interpreted as one of
// the ten element types, and the division of avg. Kernels allocate
// nothing, run in the caller's goroutine, and process eight elements per
// loop iteration. Memory must be aligned to the element size (it is when
// it comes from registered regions at element offsets); misaligned
// buffers are handled through a small aligned scratch on the stack.
package reduce

//go:generate go run gen.go

// Type is an element type. The values are coll.DataType's.
type Type uint8

// Element types.
const (
	Int8 Type = iota
	Uint8
	Int32
	Uint32
	Int64
	Uint64
	Float16
	BFloat16
	Float32
	Float64
	NumTypes
)

var sizes = [NumTypes]int{1, 1, 4, 4, 8, 8, 2, 2, 4, 8}

// Size returns the size of an element of t in bytes.
func Size(t Type) int { return sizes[t] }

// Op is a reduction operator. The values are coll.RedOp's (avg is Sum
// followed by Div).
type Op uint8

// Operators.
const (
	Sum Op = iota
	Prod
	Min
	Max
	NumOps
)

type number interface {
	~int8 | ~uint8 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

func sum[T number](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8:8], b[:8:8], d[:8:8]
		z[0] = x[0] + y[0]
		z[1] = x[1] + y[1]
		z[2] = x[2] + y[2]
		z[3] = x[3] + y[3]
		z[4] = x[4] + y[4]
		z[5] = x[5] + y[5]
		z[6] = x[6] + y[6]
		z[7] = x[7] + y[7]
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] + b[i]
	}
}

func prod[T number](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8:8], b[:8:8], d[:8:8]
		z[0] = x[0] * y[0]
		z[1] = x[1] * y[1]
		z[2] = x[2] * y[2]
		z[3] = x[3] * y[3]
		z[4] = x[4] * y[4]
		z[5] = x[5] * y[5]
		z[6] = x[6] * y[6]
		z[7] = x[7] * y[7]
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] * b[i]
	}
}

// lo and hi are the builtin min and max: branch-free, and for floats they
// propagate NaN.
func lo[T number](x, y T) T { return min(x, y) }

func hi[T number](x, y T) T { return max(x, y) }

func minimum[T number](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8:8], b[:8:8], d[:8:8]
		z[0] = lo(x[0], y[0])
		z[1] = lo(x[1], y[1])
		z[2] = lo(x[2], y[2])
		z[3] = lo(x[3], y[3])
		z[4] = lo(x[4], y[4])
		z[5] = lo(x[5], y[5])
		z[6] = lo(x[6], y[6])
		z[7] = lo(x[7], y[7])
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = lo(a[i], b[i])
	}
}

func maximum[T number](d, a, b []T) {
	a, b = a[:len(d)], b[:len(d)]
	for len(d) >= 8 {
		x, y, z := a[:8:8], b[:8:8], d[:8:8]
		z[0] = hi(x[0], y[0])
		z[1] = hi(x[1], y[1])
		z[2] = hi(x[2], y[2])
		z[3] = hi(x[3], y[3])
		z[4] = hi(x[4], y[4])
		z[5] = hi(x[5], y[5])
		z[6] = hi(x[6], y[6])
		z[7] = hi(x[7], y[7])
		a, b, d = a[8:], b[8:], d[8:]
	}
	for i := range d {
		d[i] = hi(a[i], b[i])
	}
}

// pickMin returns whichever of the halves x, y has the smaller value; no
// conversion or rounding is involved.
func pickMin(x, y uint16) uint16 {
	m := uint16((halfKey(y) - halfKey(x)) >> 31) // all ones when y < x
	return x ^ (x^y)&m
}

func pickMax(x, y uint16) uint16 {
	m := uint16((halfKey(x) - halfKey(y)) >> 31) // all ones when y > x
	return x ^ (x^y)&m
}

func div[T number](d, a []T, n T) {
	a = a[:len(d)]
	for len(d) >= 8 {
		x, z := a[:8:8], d[:8:8]
		z[0] = x[0] / n
		z[1] = x[1] / n
		z[2] = x[2] / n
		z[3] = x[3] / n
		z[4] = x[4] / n
		z[5] = x[5] / n
		z[6] = x[6] / n
		z[7] = x[7] / n
		a, d = a[8:], d[8:]
	}
	for i := range d {
		d[i] = a[i] / n
	}
}

func divF16(d, a []uint16, n float32) {
	a = a[:len(d)]
	for i := range d {
		d[i] = F32ToF16(F16ToF32(a[i]) / n)
	}
}

func divBF16(d, a []uint16, n float32) {
	a = a[:len(d)]
	for i := range d {
		d[i] = F32ToBF16(BF16ToF32(a[i]) / n)
	}
}

// Apply computes dst = a op b element-wise over len(dst) bytes (a whole
// number of elements). a and b must be at least as long; dst may be a or
// b (exactly, not partly overlapping).
func Apply(t Type, op Op, dst, a, b []byte) {
	if len(dst) == 0 {
		return
	}
	if !aligned(dst, t) || !aligned(a, t) || !aligned(b, t) {
		applyMisaligned(t, op, dst, a, b)
		return
	}
	apply(t, op, dst, a[:len(dst)], b[:len(dst)])
}

func apply(t Type, op Op, dst, a, b []byte) {
	switch t {
	case Int8:
		typed(op, as[int8](dst), as[int8](a), as[int8](b))
	case Uint8:
		typed(op, dst, a, b)
	case Int32:
		typed(op, as[int32](dst), as[int32](a), as[int32](b))
	case Uint32:
		typed(op, as[uint32](dst), as[uint32](a), as[uint32](b))
	case Int64:
		typed(op, as[int64](dst), as[int64](a), as[int64](b))
	case Uint64:
		typed(op, as[uint64](dst), as[uint64](a), as[uint64](b))
	case Float32:
		if op == Sum {
			sumF32(as[float32](dst), as[float32](a), as[float32](b))
			return
		}
		typed(op, as[float32](dst), as[float32](a), as[float32](b))
	case Float64:
		if op == Sum {
			sumF64(as[float64](dst), as[float64](a), as[float64](b))
			return
		}
		typed(op, as[float64](dst), as[float64](a), as[float64](b))
	case Float16:
		d, x, y := as[uint16](dst), as[uint16](a), as[uint16](b)
		switch op {
		case Sum:
			sumF16(d, x, y)
		case Prod:
			prodF16(d, x, y)
		case Min:
			minF16(d, x, y)
		case Max:
			maxF16(d, x, y)
		}
	case BFloat16:
		d, x, y := as[uint16](dst), as[uint16](a), as[uint16](b)
		switch op {
		case Sum:
			sumBF16(d, x, y)
		case Prod:
			prodBF16(d, x, y)
		case Min:
			minBF16(d, x, y)
		case Max:
			maxBF16(d, x, y)
		}
	}
}

func typed[T number](op Op, d, a, b []T) {
	switch op {
	case Sum:
		sum(d, a, b)
	case Prod:
		prod(d, a, b)
	case Min:
		minimum(d, a, b)
	case Max:
		maximum(d, a, b)
	}
}

// Div computes dst = src / n element-wise (the final step of avg):
// integer division truncates toward zero, floating point divides exactly
// and rounds once. dst may be src.
func Div(t Type, dst, src []byte, n int) {
	if len(dst) == 0 {
		return
	}
	if !aligned(dst, t) || !aligned(src, t) {
		divMisaligned(t, dst, src, n)
		return
	}
	src = src[:len(dst)]
	switch t {
	case Int8:
		div(as[int8](dst), as[int8](src), int8(n))
	case Uint8:
		div(dst, src, uint8(n))
	case Int32:
		div(as[int32](dst), as[int32](src), int32(n))
	case Uint32:
		div(as[uint32](dst), as[uint32](src), uint32(n))
	case Int64:
		div(as[int64](dst), as[int64](src), int64(n))
	case Uint64:
		div(as[uint64](dst), as[uint64](src), uint64(n))
	case Float32:
		div(as[float32](dst), as[float32](src), float32(n))
	case Float64:
		div(as[float64](dst), as[float64](src), float64(n))
	case Float16:
		divF16(as[uint16](dst), as[uint16](src), float32(n))
	case BFloat16:
		divBF16(as[uint16](dst), as[uint16](src), float32(n))
	}
}

// scratch is the aligned bounce size for misaligned buffers.
const scratch = 512

func applyMisaligned(t Type, op Op, dst, a, b []byte) {
	var x, y, z [scratch / 8]uint64
	xb, yb, zb := bytesOf(x[:]), bytesOf(y[:]), bytesOf(z[:])
	for len(dst) > 0 {
		n := min(len(dst), scratch)
		copy(xb, a[:n])
		copy(yb, b[:n])
		apply(t, op, zb[:n], xb[:n], yb[:n])
		copy(dst, zb[:n])
		dst, a, b = dst[n:], a[n:], b[n:]
	}
}

func divMisaligned(t Type, dst, src []byte, n int) {
	var x [scratch / 8]uint64
	xb := bytesOf(x[:])
	for len(dst) > 0 {
		k := min(len(dst), scratch)
		copy(xb, src[:k])
		Div(t, xb[:k], xb[:k], n)
		copy(dst, xb[:k])
		dst, src = dst[k:], src[k:]
	}
}
