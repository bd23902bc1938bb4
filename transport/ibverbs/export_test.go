//go:build ibverbs

package ibverbs

// WithoutWorkarounds runs f with the driver-defect workarounds of
// quirks.go off for the contexts it opens (dropping zero-length SGEs stays
// on: without it siw panics the kernel).
func WithoutWorkarounds(f func()) {
	quirksOff = ^quirk(0)
	defer func() { quirksOff = 0 }()
	f()
}
