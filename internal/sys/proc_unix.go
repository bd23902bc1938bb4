//go:build unix

package sys

import (
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// StartInNewProcessGroup makes cmd, once started, the leader of a new
// process group (setpgid), so that KillProcessGroup reaches it and every
// process it starts. Call it before cmd.Start.
func StartInNewProcessGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// KillProcessGroup sends SIGKILL to every process of the group led by pid
// (see StartInNewProcessGroup).
func KillProcessGroup(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("kill process group %d: %w", pid, syscall.EINVAL)
	}
	return unix.Kill(-pid, unix.SIGKILL)
}

// MemlockLimit returns the soft RLIMIT_MEMLOCK in bytes, the most memory
// the process may pin (for RDMA registrations), or Unlimited.
func MemlockLimit() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	if uint64(r.Cur) == uint64(unix.RLIM_INFINITY) {
		return Unlimited, nil
	}
	return uint64(r.Cur), nil
}

// StopProcess stops process pid (SIGSTOP) and ContinueProcess resumes it
// (SIGCONT): a stalled peer, for fault tests.
func StopProcess(pid int) error { return syscall.Kill(pid, syscall.SIGSTOP) }

// ContinueProcess resumes a process StopProcess stopped.
func ContinueProcess(pid int) error { return syscall.Kill(pid, syscall.SIGCONT) }

// ProcessLimits returns the soft RLIMIT_NPROC (processes of this user) and
// RLIMIT_NOFILE (open files) limits; Unlimited where there is none.
func ProcessLimits() (nproc, nofile uint64, err error) {
	get := func(res int, name string) (uint64, error) {
		var r unix.Rlimit
		if err := unix.Getrlimit(res, &r); err != nil {
			return 0, fmt.Errorf("getrlimit(%s): %w", name, err)
		}
		if uint64(r.Cur) == uint64(unix.RLIM_INFINITY) {
			return Unlimited, nil
		}
		return uint64(r.Cur), nil
	}
	if nproc, err = get(unix.RLIMIT_NPROC, "RLIMIT_NPROC"); err != nil {
		return 0, 0, err
	}
	nofile, err = get(unix.RLIMIT_NOFILE, "RLIMIT_NOFILE")
	return nproc, nofile, err
}

// DupNonblock duplicates fd (close-on-exec) and puts the copy in
// non-blocking mode, for handing a descriptor owned by a C library to the
// Go netpoller (os.NewFile) without taking it from the library.
func DupNonblock(fd int) (int, error) {
	nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup fd %d: %w", fd, err)
	}
	if err := unix.SetNonblock(nfd, true); err != nil {
		unix.Close(nfd)
		return -1, fmt.Errorf("set fd %d non-blocking: %w", nfd, err)
	}
	return nfd, nil
}

// ProcessCPUTime returns the user plus system CPU time this process has
// used (getrusage).
func ProcessCPUTime() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
