//go:build darwin || openbsd

package sys

import "golang.org/x/sys/unix"

// IOVecs is the scratch space Writev gathers the non-empty buffers in.
type IOVecs [MaxIOV][]byte

// Writev writes bufs (at most MaxIOV non-empty ones; the rest are left for
// the next call) to fd with a single writev(2) and returns the bytes
// written, which may be fewer than asked. It retries on EINTR and returns
// ErrAgain when fd is non-blocking and full.
func Writev(fd int, bufs [][]byte, iov *IOVecs) (int, error) {
	n := 0
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		if n == MaxIOV {
			break
		}
		iov[n] = b
		n++
	}
	if n == 0 {
		return 0, nil
	}
	defer clear(iov[:n])
	for {
		r, err := unix.Writev(fd, iov[:n])
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			return 0, ErrAgain
		}
		if err != nil {
			return 0, err
		}
		return r, nil
	}
}
