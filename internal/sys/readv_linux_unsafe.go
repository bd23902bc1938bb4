//go:build linux

package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read2 reads from fd into a and then b with one readv(2), retrying on
// EINTR, and returns the bytes read in all (a is filled before b gets
// any). fd must be non-blocking (see iovCall): with nothing to read it
// returns ErrAgain; at end of file 0 and nil. An empty b makes it a plain
// read into a. It allocates nothing.
func Read2(fd int, a, b []byte) (int, error) {
	if len(b) == 0 {
		return Read(fd, a)
	}
	var iov [2]unix.Iovec
	n := 0
	if len(a) > 0 {
		iov[0].Base = unsafe.SliceData(a)
		iov[0].SetLen(len(a))
		n++
	}
	iov[n].Base = unsafe.SliceData(b)
	iov[n].SetLen(len(b))
	n++
	return iovCall(unix.SYS_READV, fd, &iov[0], n, rawOK(a) && rawOK(b))
}

// Read reads from fd into b with one read(2), retrying on EINTR. A raw
// system call where iovCall makes one: fd must be non-blocking; with
// nothing to read it returns ErrAgain, at end of file 0 and nil.
func Read(fd int, b []byte) (int, error) {
	n, err := rawIO(unix.SYS_READ, fd, unsafe.Pointer(unsafe.SliceData(b)), len(b), rawOK(b))
	if n > 0 {
		raceWrote(b[:n]) // what unix.Read told the race detector
	}
	return n, err
}
