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
		t.Log("no AVX kernels on this CPU/architecture: comparing the portable loop with itself")
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
			want32, got32 := make([]float32, n), make([]float32, n)
			sum(want32, a32, b32)
			x, y := append([]float32(nil), a32...), append([]float32(nil), b32...)
			switch alias {
			case 0:
				sumF32(got32, x, y)
			case 1:
				sumF32(x, x, y)
				got32 = x
			case 2:
				sumF32(y, x, y)
				got32 = y
			}
			for i := range want32 {
				if math.Float32bits(got32[i]) != math.Float32bits(want32[i]) {
					t.Fatalf("float32 n=%d alias %d [%d]: %#x + %#x = %#x, want %#x", n, alias, i,
						math.Float32bits(a32[i]), math.Float32bits(b32[i]), math.Float32bits(got32[i]), math.Float32bits(want32[i]))
				}
			}
			want64, got64 := make([]float64, n), make([]float64, n)
			sum(want64, a64, b64)
			u, v := append([]float64(nil), a64...), append([]float64(nil), b64...)
			switch alias {
			case 0:
				sumF64(got64, u, v)
			case 1:
				sumF64(u, u, v)
				got64 = u
			case 2:
				sumF64(v, u, v)
				got64 = v
			}
			for i := range want64 {
				if math.Float64bits(got64[i]) != math.Float64bits(want64[i]) {
					t.Fatalf("float64 n=%d alias %d [%d]: %#x + %#x = %#x, want %#x", n, alias, i,
						math.Float64bits(a64[i]), math.Float64bits(b64[i]), math.Float64bits(got64[i]), math.Float64bits(want64[i]))
				}
			}
		}
	}
}
