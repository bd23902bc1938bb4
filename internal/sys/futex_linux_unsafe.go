//go:build linux

package sys

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	futexWait = 0 // FUTEX_WAIT, shared (not PRIVATE): works across processes
	futexWake = 1 // FUTEX_WAKE
)

// FutexWait blocks while the uint32 at b[off:] equals val, for at most d.
// Spurious wakeups are possible; callers re-check their condition.
func FutexWait(b []byte, off int, val uint32, d time.Duration) {
	p := p32(b, off)
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// FutexWake wakes up to n waiters on the uint32 at b[off:].
func FutexWake(b []byte, off int, n int) {
	p := p32(b, off)
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(p)), futexWake, uintptr(n), 0, 0, 0)
}
