package sys

import "testing"

// Caller memory is listed while noted (as often as it is noted), any
// overlap counts, and forget is idempotent.
func TestCallerMemory(t *testing.T) {
	buf := make([]byte, 4096)
	other := make([]byte, 64)
	if IsCallerMemory(buf) {
		t.Fatal("memory nobody noted is caller memory")
	}
	f1 := NoteCallerMemory(buf[1024:2048])
	f2 := NoteCallerMemory(buf[1024:2048])
	for _, c := range []struct {
		b    []byte
		want bool
	}{
		{buf, true}, {buf[1024:2048], true}, {buf[2047:2049], true}, {buf[1000:1025], true},
		{buf[:1024], false}, {buf[2048:], false}, {other, false}, {nil, false},
	} {
		if got := IsCallerMemory(c.b); got != c.want {
			t.Errorf("IsCallerMemory(%d bytes at %#x) = %v, want %v", len(c.b), Addr(c.b), got, c.want)
		}
	}
	f1()
	f1() // a second call does nothing
	if !IsCallerMemory(buf[1500:1600]) {
		t.Fatal("memory noted twice and forgotten once is no longer listed")
	}
	f2()
	if IsCallerMemory(buf) {
		t.Fatal("memory forgotten as often as it was noted is still listed")
	}
}

// Many spans, some overlapping, against a linear check.
func TestCallerMemoryMany(t *testing.T) {
	buf := make([]byte, 1<<16)
	var forget []func()
	var spans [][2]int
	for i := 0; i < 200; i++ {
		lo := (i * 7919) % (len(buf) - 600)
		n := 1 + (i*104729)%500
		spans = append(spans, [2]int{lo, lo + n})
		forget = append(forget, NoteCallerMemory(buf[lo:lo+n]))
	}
	defer func() {
		for _, f := range forget {
			f()
		}
	}()
	for lo := 0; lo < len(buf); lo += 37 {
		for _, n := range []int{1, 13, 300} {
			if lo+n > len(buf) {
				continue
			}
			want := false
			for _, s := range spans {
				if lo < s[1] && s[0] < lo+n {
					want = true
				}
			}
			if got := IsCallerMemory(buf[lo : lo+n]); got != want {
				t.Fatalf("IsCallerMemory(buf[%d:%d]) = %v, want %v", lo, lo+n, got, want)
			}
		}
	}
}

// The look-up allocates nothing (it runs for every read and write).
func TestCallerMemoryNoAlloc(t *testing.T) {
	buf := make([]byte, 4096)
	forget := NoteCallerMemory(buf[100:200])
	defer forget()
	if n := testing.AllocsPerRun(100, func() { IsCallerMemory(buf[300:400]) }); n != 0 {
		t.Fatalf("IsCallerMemory allocates %v times", n)
	}
}
