//go:build unix && !linux

package sys

import "golang.org/x/sys/unix"

// Readable reports whether a read from the socket fd would not block
// now: data is waiting, the stream has ended, or the socket has an error.
// It consumes nothing (recv with MSG_PEEK|MSG_DONTWAIT).
func Readable(fd int) bool {
	var b [1]byte
	for {
		_, _, err := unix.Recvfrom(fd, b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err == unix.EINTR {
			continue
		}
		return err != unix.EAGAIN
	}
}

// SetRcvLowat does nothing here (only Linux is known to leave
// non-blocking reads alone under a large SO_RCVLOWAT).
func SetRcvLowat(fd, n int) error { return nil }
