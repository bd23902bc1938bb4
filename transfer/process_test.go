//go:build linux

package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
)

// A child node: reexec role "transfer-node" with the metadata address, its
// name, its device and the size of the segment "seg-NAME" it allocates (bytes i*7+1).
// It prints "ready" and serves until its standard input ends.
func init() {
	reexec.Register("transfer-node", func(args []string) int {
		size, _ := strconv.Atoi(args[3])
		ctx := context.Background()
		n, err := New(ctx, Config{Name: args[1], MetadataAddr: args[0], Devices: []string{args[2]}, Secret: secret,
			ArenaSize: 1 << 30, LeaseTTL: time.Second, PeerTimeout: time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		defer n.Close()
		mr, err := n.AllocSegment(ctx, "seg-"+args[1], size)
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		fill(mr.Bytes(), 1)
		fmt.Println("ready")
		io.Copy(io.Discard, os.Stdin)
		return 0
	})
}

// TestNodeKilledMidBatch: of two child nodes, one is stopped while a batch
// reads from both and then killed; its requests fail with ErrPeerLost
// within a bound, the other's complete, and its segment leaves the table
// within its lease.
func TestNodeKilledMidBatch(t *testing.T) {
	ctx := context.Background()
	a, err := New(ctx, Config{Name: "a", Devices: []string{"tcp0"}, Secret: secret, ArenaSize: 1 << 30, PeerTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const size = 8 << 20
	startChild(t, a.Addr(), "b", "tcp0", size)
	pc := startChild(t, a.Addr(), "c", "tcp0", size)
	defer pc.Kill()

	buf, _ := a.AllocMR(2 * size)
	// Connect to both first.
	b, err := a.Submit(ctx, []Request{{Local: buf, Segment: "seg-b", Length: 4096}, {Local: buf, LocalOffset: size, Segment: "seg-c", Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	pc.Signal(syscall.SIGSTOP)
	waitStopped(t, pc.Pid)
	var reqs []Request
	for i := 0; i < 8; i++ {
		reqs = append(reqs, Request{Local: buf, LocalOffset: i << 20, Segment: "seg-b", Offset: uint64(i) << 20, Length: 1 << 20})
		reqs = append(reqs, Request{Local: buf, LocalOffset: size + i<<20, Segment: "seg-c", Offset: uint64(i) << 20, Length: 1 << 20})
	}
	b, err = a.Submit(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	killed := time.Now()
	pc.Kill()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = b.Wait(wctx)
	if took := time.Since(killed); took > 5*time.Second || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("batch took %v after the kill: %v", took, err)
	}
	for i, r := range reqs {
		s, cause := b.Status(i)
		switch r.Segment {
		case "seg-b":
			if s != Completed {
				t.Errorf("request %d to the live node: %v %v", i, s, cause)
			}
		case "seg-c":
			if s != Failed || !errors.Is(cause, ErrPeerLost) {
				t.Errorf("request %d to the killed node: %v %v", i, s, cause)
			}
		}
	}
	if !errors.Is(err, ErrTransfer) || !errors.Is(err, ErrPeerLost) {
		t.Errorf("Wait: %v", err)
	}
	// The killed node's segment disappears within its lease (1 s).
	deadline := time.Now().Add(3 * time.Second)
	for {
		_, err := a.OpenSegment(ctx, "seg-c")
		if errors.Is(err, ErrNoSegment) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("seg-c still there: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := a.OpenSegment(ctx, "seg-b"); err != nil {
		t.Fatalf("seg-b: %v", err)
	}
}

// waitStopped waits until every thread of process pid is stopped (state T
// in /proc), so that it serves nothing more.
func waitStopped(t *testing.T, pid int) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		stopped := len(tasks) > 0
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			i := strings.LastIndexByte(string(b), ')')
			if err != nil || i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
				stopped = false
			}
		}
		if stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("child did not stop")
		}
		time.Sleep(time.Millisecond)
	}
}

// startChild starts a child node and waits until it is ready; the test's
// cleanup ends it (closing its standard input) and reaps it.
func startChild(t *testing.T, meta, name, dev string, size int, env ...string) *os.Process {
	cmd := reexec.Command("transfer-node", []string{meta, name, dev, strconv.Itoa(size)}, env...)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child %s: %q", name, line)
	}
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return cmd.Process
}

// TestNodeKilledShm: over shm0 (where one-sided operations are copies the
// requester makes), requests to a killed node fail within a bound, at
// Submit (its segment gone) or in the batch (ErrPeerLost), and requests to
// the live node keep completing.
func TestNodeKilledShm(t *testing.T) {
	ctx := context.Background()
	a, err := New(ctx, Config{Name: "a", Devices: []string{"shm0"}, Secret: secret, ArenaSize: 1 << 30, PeerTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const size = 4 << 20
	startChild(t, a.Addr(), "b", "shm0", size)
	pc := startChild(t, a.Addr(), "c", "shm0", size)
	defer pc.Kill()
	buf, _ := a.AllocMR(2 * size)
	read := func(seg string, off int) (*Batch, error) {
		return a.Submit(ctx, []Request{{Local: buf, LocalOffset: off, Segment: seg, Length: size}})
	}
	for _, seg := range []string{"seg-b", "seg-c"} {
		b, err := read(seg, 0)
		if err == nil {
			err = b.Wait(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pc.Kill()
	killed := time.Now()
	for {
		b, err := read("seg-c", size)
		if err != nil {
			if !errors.Is(err, ErrNoSegment) && !errors.Is(err, ErrNoNode) && !errors.Is(err, ErrPeerLost) {
				t.Fatalf("Submit to the killed node: %v", err)
			}
			break
		}
		if err := b.Wait(ctx); err != nil {
			if !errors.Is(err, ErrPeerLost) {
				t.Fatalf("batch to the killed node: %v", err)
			}
			break
		}
		if time.Since(killed) > 5*time.Second {
			t.Fatal("requests to the killed node still complete")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b, err := read("seg-b", 0)
	if err == nil {
		err = b.Wait(ctx)
	}
	if err != nil {
		t.Fatalf("live node: %v", err)
	}
}
