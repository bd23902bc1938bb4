//go:build !linux

package sys

import "time"

// Without futexes (Linux only) a waiter sleeps in short naps and wakes are
// no-ops: the word is re-read after every nap, so a wake is at most
// futexNap late.

const futexNap = 50 * time.Microsecond

// FutexWait blocks while the uint32 at b[off:] equals val, for at most d.
// On this system it checks the word, then sleeps for the shorter of d and
// a short nap. Spurious wakeups are possible; callers re-check their
// condition.
func FutexWait(b []byte, off int, val uint32, d time.Duration) {
	if Load32(b, off) != val || d <= 0 {
		return
	}
	time.Sleep(min(d, futexNap))
}

// FutexWake wakes up to n waiters on the uint32 at b[off:]. On this system
// waiters poll, so it only checks the bounds.
func FutexWake(b []byte, off int, n int) { _ = p32(b, off) }
