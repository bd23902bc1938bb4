//go:build linux

package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// IOVecs is the iovec array Writev fills. Keeping one per writer makes
// gathered writes allocation-free.
type IOVecs [MaxIOV]unix.Iovec

// Writev writes bufs (at most MaxIOV non-empty ones; the rest are left for
// the next call) to fd with a single writev(2) and returns the bytes
// written, which may be fewer than asked. It retries on EINTR and returns
// ErrAgain when fd is full. fd must be non-blocking (see iovCall). Memory
// is not copied: the kernel reads the buffers in place.
func Writev(fd int, bufs [][]byte, iov *IOVecs) (int, error) {
	n, raw := 0, true
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if n == MaxIOV {
			break
		}
		iov[n].Base = unsafe.SliceData(b)
		iov[n].SetLen(len(b))
		n++
		raw = raw && rawOK(b)
	}
	if n == 0 {
		return 0, nil
	}
	return iovCall(unix.SYS_WRITEV, fd, &iov[0], n, raw)
}

// iovCall makes readv(2) or writev(2) (trap) of fd with the n iovecs at
// iov, retrying on EINTR; EAGAIN is ErrAgain. With raw (the buffers touch
// no caller memory: rawmem.go) a raw system call: the Go scheduler is not
// told that the thread may block (entersyscall and exitsyscall were a
// fifth of the user time of a two-rank 8-byte AllReduce over tcp, and a
// large writev made through them had its processor handed to another
// thread after 20 µs), so fd must be non-blocking, as every socket in
// Go's network poller is; the call then returns as soon as the kernel has
// copied what there was room or data for.
func iovCall(trap uintptr, fd int, iov *unix.Iovec, n int, raw bool) (int, error) {
	return rawIO(trap, fd, unsafe.Pointer(iov), n, raw)
}

// rawIO makes the system call trap(fd, p, n) (with raw, a raw one), a
// read or write of some kind on a non-blocking descriptor, retrying on
// EINTR; it returns the count, ErrAgain for EAGAIN, or the error. p stays a pointer until
// the call itself converts it (a uintptr made by the caller would not keep
// a stack buffer in place if the stack moved).
func rawIO(trap uintptr, fd int, p unsafe.Pointer, n int, raw bool) (int, error) {
	for {
		var r uintptr
		var e unix.Errno
		if raw {
			r, _, e = unix.RawSyscall(trap, uintptr(fd), uintptr(p), uintptr(n))
		} else {
			r, _, e = unix.Syscall(trap, uintptr(fd), uintptr(p), uintptr(n))
		}
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, ErrAgain
		}
		return 0, e
	}
}
