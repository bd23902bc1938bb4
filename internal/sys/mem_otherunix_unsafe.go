//go:build unix && !linux

package sys

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory and process calls on Unix systems other than Linux. Plain
// mappings and descriptors work; memfd, hole punching, /proc/PID/fd and
// pidfd do not exist, and their functions return errors wrapping
// ErrNotSupported.

// Memfd would create an anonymous memory file; not on this system (use
// MapAnon).
func Memfd(name string, size int64) (int, error) { return -1, notSupported("memfd_create") }

// MapShared maps size bytes of fd read-write and shared.
func MapShared(fd int, size int) ([]byte, error) {
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes shared: %w", size, err)
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// MapAnon maps size bytes of private anonymous memory, zero-filled and
// charged only as pages are touched.
func MapAnon(size int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes anonymous: %w", size, err)
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// Unmap releases a mapping made by MapShared or MapAnon, or any
// page-aligned part of one (raw munmap: x/sys's Munmap takes whole
// mappings only).
func Unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}

// PunchHole would release file pages; not on this system (an anonymous
// mapping releases pages with ReplaceWithAnon).
func PunchHole(fd int, off, n int64) error { return notSupported("fallocate(PUNCH_HOLE)") }

// OpenPeerFd would open another process's descriptor through /proc; not on
// this system.
func OpenPeerFd(pid, fd int) (int, error) { return -1, notSupported("/proc/PID/fd") }

// Inode returns the inode number of fd.
func Inode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return uint64(st.Ino), nil
}

// Close closes a file descriptor.
func Close(fd int) error { return unix.Close(fd) }

// PidfdOpen would return a pidfd; not on this system.
func PidfdOpen(pid int) (int, error) { return -1, notSupported("pidfd_open") }

// ProcessExited reports whether the process behind pidfd has exited. There
// are no pidfds here (PidfdOpen fails), so it never has.
func ProcessExited(pidfd int) bool { return false }

// ReplaceWithAnon maps fresh anonymous zero pages over the mapping b, in
// place: the pages behind b are released at once, while the addresses stay
// valid.
func ReplaceWithAnon(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("mmap %d bytes anonymous over a mapping: %w", len(b), err)
	}
	return nil
}

// Yield lets other goroutines run (runtime.Gosched; sched_yield is a Linux
// call here).
func Yield() { runtime.Gosched() }

// RawYield is Yield.
func RawYield() { Yield() }
