//go:build unix && !linux && !darwin && !openbsd

package sys

import "golang.org/x/sys/unix"

// IOVecs is unused here: this system's x/sys/unix has no writev.
type IOVecs [0][]byte

// Writev writes bufs (at most MaxIOV non-empty ones) to fd one write(2) at
// a time, stopping at the first short write, and returns the bytes
// written. It retries on EINTR and returns ErrAgain when fd is non-blocking
// and full before any byte is taken.
func Writev(fd int, bufs [][]byte, iov *IOVecs) (int, error) {
	total, k := 0, 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if k == MaxIOV {
			break
		}
		k++
		for {
			r, err := unix.Write(fd, b)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				if total > 0 {
					return total, nil
				}
				if err == unix.EAGAIN {
					return 0, ErrAgain
				}
				return 0, err
			}
			total += r
			if r < len(b) {
				return total, nil
			}
			break
		}
	}
	return total, nil
}
