//go:build linux

package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Readable reports whether a read from the socket fd would not block
// now: data is waiting, the stream has ended, or the socket has an error.
// It consumes nothing (recv with MSG_PEEK|MSG_DONTWAIT) and allocates
// nothing.
func Readable(fd int) bool {
	var b [1]byte
	for {
		_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EINTR {
			continue
		}
		return e != unix.EAGAIN
	}
}

// SetRcvLowat sets the socket's SO_RCVLOWAT: how many bytes must be
// waiting before the socket counts as readable for poll and epoll (and
// before the kernel wakes a waiter). Non-blocking reads return what is
// there whatever it is. Linux caps large values (at half the largest
// receive buffer).
func SetRcvLowat(fd, n int) error {
	return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVLOWAT, n)
}
