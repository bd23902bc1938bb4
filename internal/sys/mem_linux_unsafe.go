//go:build linux

package sys

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memfd creates an anonymous memory file of the given size. The file is
// sparse: pages cost memory only once touched.
func Memfd(name string, size int64) (int, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("ftruncate memfd to %d bytes: %w", size, err)
	}
	return fd, nil
}

// MapShared maps size bytes of fd read-write and shared. MAP_NORESERVE keeps
// large sparse arenas from being charged against overcommit.
func MapShared(fd int, size int) ([]byte, error) {
	// Raw mmap and munmap rather than x/sys's: its Munmap refuses anything
	// but a whole mapping it made, and arenas unmap parts of theirs.
	p, err := unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes shared: %w", size, err)
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// MapAnon maps size bytes of private anonymous memory, zero-filled and
// charged only as pages are touched (MAP_NORESERVE).
func MapAnon(size int) ([]byte, error) {
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes anonymous: %w", size, err)
	}
	return unsafe.Slice((*byte)(p), size), nil
}

// Unmap releases a mapping made by MapShared or MapAnon, or any
// page-aligned part of one.
func Unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(len(b)))
}

// PunchHole releases the pages backing [off, off+n) of fd; reads then return
// zeros and no memory is held.
func PunchHole(fd int, off, n int64) error {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
}

// OpenPeerFd opens file descriptor fd of process pid through /proc. For the
// same user this needs no cooperation from the other process.
func OpenPeerFd(pid, fd int) (int, error) {
	path := fmt.Sprintf("/proc/%d/fd/%d", pid, fd)
	nfd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", path, err)
	}
	return nfd, nil
}

// Inode returns the inode number of fd, used to prove that a file opened
// through /proc is the one a peer advertised.
func Inode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// Close closes a file descriptor.
func Close(fd int) error { return unix.Close(fd) }

// PidfdOpen returns a pidfd for pid, readable once the process exits.
func PidfdOpen(pid int) (int, error) { return unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK) }

// ProcessExited reports whether the process behind pidfd has exited.
func ProcessExited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0
}

// ReplaceWithAnon maps fresh anonymous zero pages over the mapping b, in
// place. The file pages behind b are released at once, while the addresses
// stay valid for any goroutine that still touches them.
func ReplaceWithAnon(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, _, e := unix.Syscall6(unix.SYS_MMAP, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE, ^uintptr(0), 0)
	if e != 0 {
		return e
	}
	return nil
}

// Yield gives up the processor to other threads (sched_yield), for poll
// loops that have waited long enough to let others run but not long enough
// to sleep.
func Yield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// RawYield is Yield without telling the Go scheduler that a system call
// is in progress (sched_yield never blocks): the processor (P) stays with
// the calling goroutine, so the runtime neither hands it to another thread
// nor wakes one to run it, which on an oversubscribed host costs more
// context switches than the yield saves. For poll loops that yield often.
func RawYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
