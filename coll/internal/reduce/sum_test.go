package reduce

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSumFloatKernels: the float sums (AVX on amd64 where the CPU has it)
// give the bits of the portable loop for every length and tail, with the
// output apart from or equal to either input, on values that include
// infinities, NaNs with payloads, signed zeros and subnormals.
func TestSumFloatKernels(t *testing.T) {
	if !haveAVX {
		t.Skip("no AVX kernels on this CPU/architecture: nothing but the portable loop to compare with itself")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	special32 := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		math.Float32frombits(0x7fc00001), math.Float32frombits(0xffc12345), math.Float32frombits(1), 3.4e38, -1.5}
	special64 := []float64{0, math.Copysign(0, -1), math.Inf(1), math.Inf(-1),
		math.Float64frombits(0x7ff8000000000123), math.Float64frombits(0xfff0000000000777), math.Float64frombits(1), 1.7e308, -2.5}
	for n := 0; n <= 100; n++ {
		a32, b32 := make([]float32, n), make([]float32, n)
		a64, b64 := make([]float64, n), make([]float64, n)
		for i := 0; i < n; i++ {
			a32[i], b32[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			a64[i], b64[i] = rng.NormFloat64(), rng.NormFloat64()
			if rng.IntN(4) == 0 {
				a32[i], a64[i] = special32[rng.IntN(len(special32))], special64[rng.IntN(len(special64))]
			}
			if rng.IntN(4) == 0 {
				b32[i], b64[i] = special32[rng.IntN(len(special32))], special64[rng.IntN(len(special64))]
			}
		}
		for alias := 0; alias < 3; alias++ {
			checkSum(t, alias, a32, b32, sumF32, func(x float32) uint64 { return uint64(math.Float32bits(x)) })
			checkSum(t, alias, a64, b64, sumF64, math.Float64bits)
		}
	}
}

// checkSum compares kernel(d, a, b) with the portable loop, d apart from
// the inputs (alias 0), a itself (1) or b itself (2).
func checkSum[T float32 | float64](t *testing.T, alias int, a, b []T, kernel func(d, a, b []T), bits func(T) uint64) {
	t.Helper()
	want, got := make([]T, len(a)), make([]T, len(a))
	sum(want, a, b)
	x, y := append([]T(nil), a...), append([]T(nil), b...)
	switch alias {
	case 0:
		kernel(got, x, y)
	case 1:
		kernel(x, x, y)
		got = x
	case 2:
		kernel(y, x, y)
		got = y
	}
	for i := range want {
		if bits(got[i]) != bits(want[i]) {
			t.Fatalf("%T n=%d alias %d [%d]: %#x + %#x = %#x, want %#x", a[0], len(a), alias, i, bits(a[i]), bits(b[i]), bits(got[i]), bits(want[i]))
		}
	}
}
