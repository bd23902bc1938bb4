//go:build !amd64 || race

package sys

// Copy is copy(dst, src) for the data path of the memory transports (see
// cpu_amd64_unsafe.go; elsewhere, and in race builds, it is copy).
func Copy(dst, src []byte) int { return copy(dst, src) }

// StoreRelease64 stores v at b[off:] with (at least) release order; here
// it is Store64.
func StoreRelease64(b []byte, off int, v uint64) { Store64(b, off, v) }

// HasTicks reports whether Ticks reads a constant-rate CPU counter; not
// here (see cpu_amd64_unsafe.go).
const HasTicks = false

// Ticks is 0 here: callers check HasTicks.
func Ticks() int64 { return 0 }
