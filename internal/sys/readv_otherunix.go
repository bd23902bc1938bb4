//go:build unix && !linux

package sys

// Read2 reads from fd into a and then b and returns the bytes read in all
// (a is filled before b gets any): here a read(2) into a and, when that
// filled it, one into b (nothing there for b counts as nothing read). On a
// non-blocking fd with nothing to read it returns ErrAgain; at end of file
// 0 and nil.
func Read2(fd int, a, b []byte) (int, error) {
	if len(a) == 0 {
		return Read(fd, b)
	}
	n, err := Read(fd, a)
	if err != nil || n < len(a) || len(b) == 0 {
		return n, err
	}
	m, err := Read(fd, b)
	if err != nil {
		return n, nil // ErrAgain, or an error the next read reports
	}
	return n + m, nil
}
