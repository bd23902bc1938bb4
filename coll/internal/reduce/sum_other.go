//go:build !amd64

package reduce

// The Go loops elsewhere (sum_amd64.go has AVX kernels).

var haveAVX = false

func sumF32(d, a, b []float32) { sum(d, a, b) }

func sumF64(d, a, b []float64) { sum(d, a, b) }
