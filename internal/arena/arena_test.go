package arena

import "testing"

func TestAllocFree(t *testing.T) {
	a, err := New("test", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
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
	a, err := New("big", DefaultSize)
	if err != nil {
		t.Fatal(err)
	}
	a.Close()
}
