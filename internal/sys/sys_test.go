package sys

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// skipIfNotSupported skips the test when err says the call does not exist
// on this system, and fails it on any other error.
func skipIfNotSupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, ErrNotSupported) {
		if runtime.GOOS == "linux" {
			t.Fatalf("not supported on Linux, where it must be: %v", err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestErrNotSupported(t *testing.T) {
	err := notSupported("memfd_create")
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("%v does not match ErrNotSupported and errors.ErrUnsupported", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "memfd_create") || !strings.Contains(msg, runtime.GOOS) {
		t.Fatalf("message %q does not name the call and the system", msg)
	}
	if errors.Is(errors.New("other"), ErrNotSupported) {
		t.Fatal("an unrelated error matches ErrNotSupported")
	}
}

func TestFutexWaitWake(t *testing.T) {
	w := make([]byte, 64)
	start := time.Now()
	FutexWait(w, 8, 1, time.Second) // the word is 0, not 1: no wait
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Fatalf("FutexWait on a changed word waited %v", d)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for Load32(w, 8) == 0 {
			FutexWait(w, 8, 0, 5*time.Second)
		}
	}()
	time.Sleep(10 * time.Millisecond)
	Store32(w, 8, 1)
	FutexWake(w, 8, 1)
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("waiter not woken")
	}
}

func TestMapAnonReplaceWithAnon(t *testing.T) {
	p := PageSize
	b, err := MapAnon(4 * p)
	skipIfNotSupported(t, err)
	defer Unmap(b)
	for i := range b {
		b[i] = 0xAB
	}
	if err := ReplaceWithAnon(b[p : 2*p]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b[p:2*p], make([]byte, p)) {
		t.Fatal("replaced page is not zero")
	}
	if b[p-1] != 0xAB || b[2*p] != 0xAB {
		t.Fatal("ReplaceWithAnon touched the neighbouring pages")
	}
}

func TestMemlockLimit(t *testing.T) {
	v, err := MemlockLimit()
	skipIfNotSupported(t, err)
	if v == 0 {
		t.Log("RLIMIT_MEMLOCK is 0")
	}
}

func TestProcessCPUTime(t *testing.T) {
	d, err := ProcessCPUTime()
	if err != nil || d < 0 {
		t.Fatalf("ProcessCPUTime = %v, %v", d, err)
	}
}

func TestIsTerminalPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if IsTerminal(r.Fd()) || IsTerminal(w.Fd()) {
		t.Fatal("a pipe is reported as a terminal")
	}
}

func TestDupNonblockReadWritev(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	rfd, err := DupNonblock(int(r.Fd()))
	skipIfNotSupported(t, err)
	defer Close(rfd)
	buf := make([]byte, 64)
	if _, err := Read(rfd, buf); err != ErrAgain {
		t.Fatalf("Read of an empty non-blocking pipe: %v, want ErrAgain", err)
	}
	wfd, err := DupNonblock(int(w.Fd())) // Writev wants a non-blocking descriptor
	skipIfNotSupported(t, err)
	var iov IOVecs
	n, err := Writev(wfd, [][]byte{[]byte("ab"), nil, []byte("cde")}, &iov)
	if err != nil || n != 5 {
		t.Fatalf("Writev = %d, %v; want 5", n, err)
	}
	n, err = Read(rfd, buf)
	if err != nil || string(buf[:n]) != "abcde" {
		t.Fatalf("Read = %q, %v; want abcde", buf[:n], err)
	}
	w.Close()
	Close(wfd) // the last write end: the read end sees the end of file
	if n, err := Read(rfd, buf); n != 0 || err != nil {
		t.Fatalf("Read at end of file = %d, %v; want 0, nil", n, err)
	}
}

func TestKillProcessGroup(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	cmd := exec.Command(sleep, "30")
	StartInNewProcessGroup(cmd)
	ChildDiesWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := KillProcessGroup(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		skipIfNotSupported(t, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("sleep exited normally after KillProcessGroup")
		}
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("KillProcessGroup did not kill the group")
	}
}

func TestTicks(t *testing.T) {
	if !HasTicks {
		t.Skip("no invariant time-stamp counter on this CPU or build (Ticks is not used)")
	}
	t0, c0 := Ticks(), time.Now()
	time.Sleep(2 * time.Millisecond)
	t1, d := Ticks(), time.Since(c0)
	if t1 <= t0 {
		t.Fatalf("ticks went from %d to %d across %v", t0, t1, d)
	}
	if hz := float64(t1-t0) / d.Seconds(); hz < 1e8 || hz > 1e11 {
		t.Fatalf("counter rate %.3g Hz", hz)
	}
}

func TestCopy(t *testing.T) {
	for _, n := range []int{0, 1, 8, 255, 256, 257, 511, 4096, 4096 + 100, 16<<10 - 1, 16 << 10, 16<<10 + 1, MovsbMin - 1, MovsbMin, 64 << 10, 300 << 10} {
		src := make([]byte, n+64)
		for i := range src {
			src[i] = byte(i*7 + 1)
		}
		dst := make([]byte, n)
		if got := Copy(dst, src[:n]); got != n || !bytes.Equal(dst, src[:n]) {
			t.Fatalf("%d bytes: copied %d, equal %v", n, got, bytes.Equal(dst, src[:n]))
		}
		// Overlapping, both ways: memmove semantics.
		want := append([]byte(nil), src[:n]...)
		if n > 0 && Copy(src[64:], src[:n]) != n || !bytes.Equal(src[64:64+n], want) {
			t.Fatalf("%d bytes overlapping forward: wrong", n)
		}
		want = append([]byte(nil), src[64:64+n]...)
		if n > 0 && Copy(src[:n], src[64:64+n]) != n || !bytes.Equal(src[:n], want) {
			t.Fatalf("%d bytes overlapping backward: wrong", n)
		}
	}
}

// copyPath is one way Copy goes (copyPaths, per platform): set switches
// to it for the rest of the test, or returns why it cannot run here.
type copyPath struct {
	name string
	set  func(t *testing.T) (skip string)
}

// TestCopyUnaligned: Copy on every path this host has, from and to
// unaligned addresses, over every length from 200 to 1200 bytes (around
// the 256-byte start of the AVX-512 loop and its 256-byte tail), then
// every 61st up to 17 KiB and the edges of the loop's range (16 KiB) and
// of REP MOVSB's (MovsbMin); guard bytes around the destination must stay
// untouched.
func TestCopyUnaligned(t *testing.T) {
	var lengths []int
	for n := 200; n <= 1200; n++ {
		lengths = append(lengths, n)
	}
	for n := 1201; n <= 17<<10; n += 61 {
		lengths = append(lengths, n)
	}
	lengths = append(lengths, 16<<10, 16<<10+1, MovsbMin-1, MovsbMin, MovsbMin+1, 64<<10+13)
	const guard, pad = 0xAA, 128
	maxN := slices.Max(lengths)
	src := make([]byte, maxN+64)
	dst := make([]byte, pad+64+maxN+pad)
	for _, p := range copyPaths() {
		t.Run(p.name, func(t *testing.T) {
			if why := p.set(t); why != "" {
				t.Skip(why)
			}
			for _, so := range []int{0, 1, 7, 63} {
				for _, do := range []int{0, 3, 64} {
					for _, n := range lengths {
						for i := range src[so : so+n] {
							src[so+i] = byte(i*7 + n + so + 1)
						}
						// The destination and pad bytes either side.
						d := dst[pad+do : pad+do+n]
						around := dst[pad+do-pad : pad+do+n+pad]
						for i := range around {
							around[i] = guard
						}
						if got := Copy(d, src[so:so+n]); got != n {
							t.Fatalf("src+%d dst+%d %d bytes: copied %d", so, do, n, got)
						}
						if !bytes.Equal(d, src[so:so+n]) {
							i := 0
							for d[i] == src[so+i] {
								i++
							}
							t.Fatalf("src+%d dst+%d %d bytes: byte %d differs", so, do, n, i)
						}
						for i, b := range around {
							if (i < pad || i >= pad+n) && b != guard {
								t.Fatalf("src+%d dst+%d %d bytes: guard byte %d written (0x%02x)", so, do, n, i-pad, b)
							}
						}
					}
				}
			}
		})
	}
}
