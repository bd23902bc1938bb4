package sys

// Read2 is not supported on Windows.
func Read2(fd int, a, b []byte) (int, error) { return 0, notSupported("readv") }
