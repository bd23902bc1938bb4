package sys

// Windows. Atomics, IsTerminal, ProcessCPUTime and the portable fallbacks
// (Yield, FutexWait, FutexWake; futex_other.go) work. Memory mappings,
// descriptor I/O (Read, Writev) and process groups are not implemented:
// those functions return errors wrapping ErrNotSupported, so an arena, and
// with it every software verbs context, cannot be created here.

import (
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// IOVecs is unused on this system (Writev is not supported).
type IOVecs struct{}

// Memfd is not supported on Windows.
func Memfd(name string, size int64) (int, error) { return -1, notSupported("memfd_create") }

// MapShared is not supported on Windows.
func MapShared(fd int, size int) ([]byte, error) { return nil, notSupported("mmap") }

// MapAnon is not supported on Windows.
func MapAnon(size int) ([]byte, error) { return nil, notSupported("mmap") }

// Unmap is not supported on Windows (nothing is ever mapped).
func Unmap(b []byte) error { return notSupported("munmap") }

// PunchHole is not supported on Windows.
func PunchHole(fd int, off, n int64) error { return notSupported("fallocate(PUNCH_HOLE)") }

// OpenPeerFd is not supported on Windows.
func OpenPeerFd(pid, fd int) (int, error) { return -1, notSupported("/proc/PID/fd") }

// Inode is not supported on Windows.
func Inode(fd int) (uint64, error) { return 0, notSupported("fstat") }

// Close closes a handle.
func Close(fd int) error { return syscall.CloseHandle(syscall.Handle(fd)) }

// PidfdOpen is not supported on Windows.
func PidfdOpen(pid int) (int, error) { return -1, notSupported("pidfd_open") }

// ProcessExited reports whether the process behind pidfd has exited. There
// are no pidfds here (PidfdOpen fails), so it never has.
func ProcessExited(pidfd int) bool { return false }

// ReplaceWithAnon is not supported on Windows.
func ReplaceWithAnon(b []byte) error { return notSupported("mmap") }

// Yield lets other goroutines run (runtime.Gosched).
func Yield() { runtime.Gosched() }

// RawYield is Yield.
func RawYield() { Yield() }

// Read is not supported on Windows.
func Read(fd int, b []byte) (int, error) { return 0, notSupported("read") }

// Writev is not supported on Windows.
func Writev(fd int, bufs [][]byte, iov *IOVecs) (int, error) { return 0, notSupported("writev") }

// IsTerminal reports whether fd is a console handle.
func IsTerminal(fd uintptr) bool {
	var mode uint32
	return syscall.GetConsoleMode(syscall.Handle(fd), &mode) == nil
}

// ChildDiesWithParent would have cmd's process killed when this process
// exits; Windows has no such flag for a plain child, so it does nothing,
// and callers still kill their children on a normal exit.
func ChildDiesWithParent(cmd *exec.Cmd) {}

// StartInNewProcessGroup does nothing on Windows (KillProcessGroup is not
// supported; kill the process itself).
func StartInNewProcessGroup(cmd *exec.Cmd) {}

// KillProcessGroup is not supported on Windows.
func KillProcessGroup(pid int) error { return notSupported("kill(-pgid)") }

// MemlockLimit is not supported on Windows (there is no RLIMIT_MEMLOCK).
func MemlockLimit() (uint64, error) { return 0, notSupported("getrlimit(RLIMIT_MEMLOCK)") }

// StopProcess is not supported on Windows.
func StopProcess(pid int) error { return notSupported("SIGSTOP") }

// ContinueProcess is not supported on Windows.
func ContinueProcess(pid int) error { return notSupported("SIGCONT") }

// ProcessLimits: Windows has no such per-user limits.
func ProcessLimits() (nproc, nofile uint64, err error) { return Unlimited, Unlimited, nil }

// DupNonblock is not supported on Windows.
func DupNonblock(fd int) (int, error) { return -1, notSupported("dup") }

// ProcessCPUTime returns the user plus kernel CPU time this process has
// used (GetProcessTimes).
func ProcessCPUTime() (time.Duration, error) {
	var creation, exit, kernel, user syscall.Filetime
	h, err := syscall.GetCurrentProcess()
	if err != nil {
		return 0, err
	}
	if err := syscall.GetProcessTimes(h, &creation, &exit, &kernel, &user); err != nil {
		return 0, err
	}
	ticks := func(f syscall.Filetime) int64 { return int64(f.HighDateTime)<<32 | int64(f.LowDateTime) }
	return time.Duration(ticks(kernel)+ticks(user)) * 100, nil
}

// Readable is not supported on Windows: it reports true (a caller then
// reads, which fails).
func Readable(fd int) bool { return true }

// SetRcvLowat does nothing on Windows.
func SetRcvLowat(fd, n int) error { return nil }
