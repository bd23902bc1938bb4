//go:build unix && !linux

package sys

import "golang.org/x/sys/unix"

// Read reads from fd into b with one read(2), retrying on EINTR. On a
// non-blocking fd with nothing to read it returns ErrAgain; at end of file
// it returns 0 and nil.
func Read(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return 0, ErrAgain
		}
		if n < 0 {
			n = 0
		}
		return n, err
	}
}
