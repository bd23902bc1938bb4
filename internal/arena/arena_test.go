package arena

import (
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/rdmakit/rdmakit/internal/sys"
)

func newOrSkip(t *testing.T, name string, size int) *Arena {
	t.Helper()
	a, err := New(name, size)
	if errors.Is(err, sys.ErrNotSupported) {
		if runtime.GOOS == "linux" {
			t.Fatalf("not supported on Linux, where it must be: %v", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAllocFree(t *testing.T) { testAllocFree(t) }

// TestAllocFreeAnon runs TestAllocFree on the anonymous-mapping arena that
// systems without memfd get.
func TestAllocFreeAnon(t *testing.T) {
	withoutMemfd(t)
	testAllocFree(t)
}

func withoutMemfd(t *testing.T) {
	old := memfd
	memfd = func(string, int64) (int, error) {
		return -1, fmt.Errorf("test: %w", sys.ErrNotSupported)
	}
	t.Cleanup(func() { memfd = old })
}

func testAllocFree(t *testing.T) {
	a := newOrSkip(t, "test", 1<<30)
	defer a.Close()
	o1, b1, err := a.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	b1[0] = 7
	o2, _, err := a.Alloc(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	if o2 == o1 {
		t.Fatal("overlap")
	}
	a.Free(o1, 100)
	o3, b3, _ := a.Alloc(10)
	if o3 != o1 || b3[0] != 0 {
		t.Fatalf("reuse: off %d want %d, byte %d want 0", o3, o1, b3[0])
	}
	a.Free(o3, 10)
	a.Free(o2, 1<<20)
	if len(a.free) != 1 || a.free[0].n != a.Size {
		t.Fatalf("free list not coalesced: %v", a.free)
	}
	if _, _, err := a.Alloc(2 << 30); err == nil {
		t.Fatal("oversized alloc succeeded")
	}
}

func TestDefaultSizeMaps(t *testing.T) {
	newOrSkip(t, "big", DefaultSize).Close()
}

func TestDefaultSizeMapsAnon(t *testing.T) {
	withoutMemfd(t)
	a := newOrSkip(t, "big", DefaultSize)
	if a.Fd != -1 || a.Ino != 0 {
		t.Errorf("anonymous arena: Fd %d Ino %d, want -1 and 0", a.Fd, a.Ino)
	}
	a.Close()
}

// Closed arenas give their address space back at once, except the spans
// still in use (kept mapped for the grace period): Open/Close churn never
// exhausts the address space. 2100 default-size arenas are 131 TiB of
// reservations, more than a 47-bit address space (128 TiB) holds.
func TestCloseChurnReleasesAddressSpace(t *testing.T) {
	n := 2100
	for i := 0; i < n; i++ {
		a, err := New("churn", DefaultSize)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		off, b, err := a.Alloc(64 << 10)
		if err != nil {
			t.Fatal(err)
		}
		b[0] = 1
		if _, _, err := a.Alloc(8 << 10); err != nil {
			t.Fatal(err)
		}
		a.Free(off, 64<<10)
		a.Close()
	}
}

// A span in use stays readable (zeros) after Close until the grace period
// ends.
func TestUsedSpanReadableAfterClose(t *testing.T) {
	a, err := New("grace", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := a.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	b[10] = 42
	a.Close()
	if b[10] != 0 {
		t.Fatalf("closed arena's page kept its data: %d", b[10])
	}
	b[11] = 1 // writable, no fault
}
