//go:build linux

package sys

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// Read2 fills a before b, reports what it read in all, ErrAgain on an
// empty non-blocking descriptor, 0 at its end, and allocates nothing.
func TestRead2(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	a, b := make([]byte, 4), make([]byte, 8)
	if _, err := Read2(p[0], a, b); err != ErrAgain {
		t.Fatalf("empty: %v, want ErrAgain", err)
	}
	msg := []byte("0123456789")
	for _, want := range []struct{ in, a, b string }{{"0123456789", "0123", "456789"}, {"012", "012", ""}} {
		clear(a)
		clear(b)
		unix.Write(p[1], []byte(want.in))
		n, err := Read2(p[0], a, b)
		if err != nil || n != len(want.in) || !bytes.HasPrefix(a, []byte(want.a)) || !bytes.HasPrefix(b, []byte(want.b)) {
			t.Fatalf("%q: %d, %v, a %q b %q", want.in, n, err, a, b)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		unix.Write(p[1], msg)
		Read2(p[0], a, b)
	}); n != 0 {
		t.Fatalf("%v allocations per Read2", n)
	}
	unix.Close(p[1])
	if n, err := Read2(p[0], a, b); n != 0 || err != nil {
		t.Fatalf("at the end: %d, %v", n, err)
	}
}
