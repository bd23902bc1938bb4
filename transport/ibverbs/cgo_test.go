//go:build ibverbs

package ibverbs

import "testing"

// BenchmarkCgoNop is the fixed cost of one Go→C→Go crossing, what every
// PostSend and Poll pays once. Needs no device.
func BenchmarkCgoNop(b *testing.B) {
	for b.Loop() {
		cgoNop()
	}
}
