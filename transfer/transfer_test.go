package transfer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/reexec"
	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestMain(m *testing.M) {
	reexec.Init()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func cluster(t testing.TB, dev string, k int) []*Node {
	t.Helper()
	ctx := context.Background()
	cfg := Config{Secret: secret, ArenaSize: 1 << 30, LeaseTTL: time.Second, PeerTimeout: time.Second, SliceSize: 64 << 10}
	var nodes []*Node
	for i := 0; i < k; i++ {
		c := cfg
		c.Name = fmt.Sprintf("n%d", i)
		if dev != "" {
			c.Devices = []string{dev}
		}
		if i > 0 {
			c.MetadataAddr = nodes[0].Addr()
		}
		n, err := New(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	t.Cleanup(func() {
		for i := len(nodes) - 1; i >= 0; i-- {
			nodes[i].Close()
		}
	})
	return nodes
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7) + seed
	}
}

func testCluster(t *testing.T, dev string) {
	ctx := context.Background()
	nodes := cluster(t, dev, 3)
	const size = 1 << 20
	for i, n := range nodes {
		mr, err := n.AllocSegment(ctx, fmt.Sprintf("seg%d", i), size)
		if err != nil {
			t.Fatal(err)
		}
		fill(mr.Bytes(), byte(i))
	}
	// Every node reads every segment and writes the next node's.
	for i, n := range nodes {
		buf, err := n.AllocMR(3 * size)
		if err != nil {
			t.Fatal(err)
		}
		var reqs []Request
		for j := range nodes {
			reqs = append(reqs, Request{Op: Read, Local: buf, LocalOffset: j * size, Segment: fmt.Sprintf("seg%d", j), Length: size})
		}
		b, err := n.Submit(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, size)
		for j := range nodes {
			fill(want, byte(j))
			if !bytes.Equal(buf.Bytes()[j*size:(j+1)*size], want) {
				t.Fatalf("node %d: seg%d read back wrong", i, j)
			}
			if s, _ := b.Status(j); s != Completed {
				t.Fatalf("status %v", s)
			}
		}
	}
	for i, n := range nodes {
		buf, _ := n.AllocMR(100)
		// Write 100 bytes into the next node's segment at an odd offset.
		fill(buf.Bytes()[:100], 99)
		next := (i + 1) % 3
		b, err := n.Submit(ctx, []Request{{Op: Write, Local: buf, Segment: fmt.Sprintf("seg%d", next), Offset: 12345 + uint64(i), Length: 100}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range nodes {
		seg := n.segs[fmt.Sprintf("seg%d", i)].mr.Bytes()
		prev := (i + 2) % 3
		want := make([]byte, 100)
		fill(want, 99)
		if !bytes.Equal(seg[12345+prev:12345+prev+100], want) {
			t.Fatalf("write into seg%d missing", i)
		}
	}
	for i, n := range nodes {
		info, err := n.OpenSegment(ctx, "seg2")
		if err != nil || info.Node != "n2" || info.Size != size || info.Access != ReadWrite {
			t.Fatalf("node %d: OpenSegment: %+v, %v", i, info, err)
		}
	}
}

func TestClusterShm(t *testing.T) { testCluster(t, "shm0") }
func TestClusterTCP(t *testing.T) { testCluster(t, "tcp0") }

func TestErrors(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	if _, err := nodes[0].AllocSegment(ctx, "a", 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := nodes[1].AllocSegment(ctx, "a", 4096); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate on another node: %v", err)
	}
	if _, err := nodes[0].AllocSegment(ctx, "a", 4096); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate on the same node: %v", err)
	}
	buf, _ := nodes[1].AllocMR(8192)
	if _, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: "nope", Length: 1}}); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("unknown segment: %v", err)
	}
	if _, err := nodes[1].OpenSegment(ctx, "nope"); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("OpenSegment unknown: %v", err)
	}
	for _, r := range []Request{
		{Local: buf, Segment: "a", Offset: 4000, Length: 97},
		{Local: buf, Segment: "a", Offset: 1 << 62, Length: 1},
		{Local: buf, LocalOffset: 8190, Segment: "a", Length: 3},
		{Local: buf, Segment: "a", Length: 0},
		{Local: buf, LocalOffset: 1<<62 + 1<<61, Segment: "a", Length: 1 << 62},
		{Local: buf, LocalOffset: -1, Segment: "a", Length: 1},
		{Segment: "a", Length: 1},
	} {
		if _, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: "a", Length: 10}, r}); !errors.Is(err, ErrBounds) {
			t.Fatalf("%+v: %v", r, err)
		}
	}
	if _, err := New(ctx, Config{Devices: []string{"nope0"}, Secret: secret}); err == nil || !strings.Contains(err.Error(), "nope0") {
		t.Fatalf("unknown device: %v", err)
	}
	if _, err := New(ctx, Config{Devices: []string{"tcp0"}}); !errors.Is(err, ErrNoCredential) {
		t.Fatalf("no credential: %v", err)
	}
	if _, err := New(ctx, Config{Devices: []string{"tcp0"}, Secret: []byte("another secret, 32 bytes long!!"), MetadataAddr: nodes[0].Addr()}); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong secret: %v", err)
	}
}

func TestFileSegment(t *testing.T) {
	ctx := context.Background()
	for _, dev := range []string{"shm0", "tcp0", ""} {
		t.Run("devices="+dev, func(t *testing.T) {
			nodes := cluster(t, dev, 2)
			data := make([]byte, 3<<20+17)
			fill(data, 5)
			path := filepath.Join(t.TempDir(), "f")
			os.WriteFile(path, data, 0o600)
			if err := nodes[0].RegisterFileSegment(ctx, "file", path, true); err != nil {
				t.Fatal(err)
			}
			buf, _ := nodes[1].AllocMR(len(data))
			b, err := nodes[1].Submit(ctx, []Request{{Op: Read, Local: buf, Segment: "file", Length: len(data)}})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), data) {
				t.Fatal("file read back wrong")
			}
			if _, err := nodes[1].Submit(ctx, []Request{{Op: Write, Local: buf, Segment: "file", Length: 1}}); !errors.Is(err, ErrReadOnly) {
				t.Fatalf("write to read-only: %v", err)
			}
			// Read-write: a write reaches the file (at once on tcp, at
			// unregister on shm).
			path2 := filepath.Join(t.TempDir(), "g")
			os.WriteFile(path2, data[:4096], 0o600)
			if err := nodes[0].RegisterFileSegment(ctx, "rw", path2, false); err != nil {
				t.Fatal(err)
			}
			if dev == "" {
				ro, _ := nodes[1].OpenSegment(ctx, "file")
				rw, _ := nodes[1].OpenSegment(ctx, "rw")
				if fmt.Sprint(ro.Devices) != "[shm0 tcp0]" || fmt.Sprint(rw.Devices) != "[tcp0]" || rw.Access != ReadWrite || ro.Access != ReadOnly {
					t.Fatalf("file segments offered as %+v and %+v", ro, rw)
				}
			}
			copy(buf.Bytes(), "hello")
			b, err = nodes[1].Submit(ctx, []Request{{Op: Write, Local: buf, Segment: "rw", Offset: 100, Length: 5}})
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if err := nodes[0].UnregisterSegment(ctx, "rw"); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(path2)
			if string(got[100:105]) != "hello" {
				t.Fatalf("file not written: %q", got[100:105])
			}
		})
	}
}

func TestConcurrentBatches(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	mr, _ := nodes[0].AllocSegment(ctx, "big", 4<<20)
	fill(mr.Bytes(), 1)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf, _ := nodes[1].AllocMR(1 << 20)
			for it := 0; it < 5; it++ {
				off := uint64((g + it) % 4 << 20)
				b, err := nodes[1].Submit(ctx, []Request{{Op: Read, Local: buf, Segment: "big", Offset: off, Length: 1 << 20}})
				if err == nil {
					err = b.Wait(ctx)
				}
				if err == nil && !bytes.Equal(buf.Bytes(), mr.Bytes()[off:off+1<<20]) {
					err = errors.New("mismatch")
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestIdleReconnect: connections unused for IdleTimeout close, and the
// next request connects again.
func TestIdleReconnect(t *testing.T) {
	ctx := context.Background()
	a, err := New(ctx, Config{Name: "a", Devices: []string{"tcp0"}, Secret: secret, ArenaSize: 1 << 30, IdleTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(ctx, Config{Name: "b", Devices: []string{"tcp0"}, Secret: secret, ArenaSize: 1 << 30, MetadataAddr: a.Addr(), IdleTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a.AllocSegment(ctx, "s", 4096)
	buf, _ := b.AllocMR(4096)
	peers := func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.peers) }
	for round := 0; round < 2; round++ {
		bt, err := b.Submit(ctx, []Request{{Local: buf, Segment: "s", Length: 4096}})
		if err != nil {
			t.Fatal(err)
		}
		if err := bt.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if peers() != 1 {
			t.Fatalf("round %d: %d peers", round, peers())
		}
		deadline := time.Now().Add(2 * time.Second)
		for peers() != 0 {
			if time.Now().After(deadline) {
				t.Fatal("idle connections not closed")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestTargetClosedFailsRequests: requests to a node that closed fail (at
// Submit when its segment is already gone from this node's view, else in
// the batch with ErrPeerLost), within a bound.
func TestTargetClosedFailsRequests(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	nodes[1].AllocSegment(ctx, "t", 8<<20)
	buf, _ := nodes[0].AllocMR(8 << 20)
	bt, err := nodes[0].Submit(ctx, []Request{{Local: buf, Segment: "t", Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	bt.Wait(ctx)
	nodes[1].Close()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	bt, err = nodes[0].Submit(wctx, []Request{{Local: buf, Segment: "t", Length: 8 << 20}})
	if err == nil {
		err = bt.Wait(wctx)
		if !errors.Is(err, ErrPeerLost) && !errors.Is(err, ErrTransfer) {
			t.Fatalf("batch to a closed node: %v", err)
		}
	} else if !errors.Is(err, ErrNoSegment) && !errors.Is(err, ErrNoNode) {
		t.Fatalf("segment of a closed node: %v", err)
	}
	// Its segment is gone from the table at once (Close unregisters).
	if _, err := nodes[0].OpenSegment(ctx, "t"); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("OpenSegment after Close: %v", err)
	}
}

// TestCanceled: requests that Submit could not post because its context
// ended are Canceled (or Timeout) with the context's error as cause.
func TestCanceled(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	nodes[1].AllocSegment(ctx, "c", 1<<20)
	buf, _ := nodes[0].AllocMR(1 << 20)
	bt, err := nodes[0].Submit(ctx, []Request{{Local: buf, Segment: "c", Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	bt.Wait(ctx)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	bt, err = nodes[0].Submit(cctx, []Request{{Local: buf, Segment: "c", Length: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	<-bt.Done()
	if s, cause := bt.Status(0); s != Canceled || !errors.Is(cause, context.Canceled) {
		t.Fatalf("%v %v", s, cause)
	}
	dctx, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel2()
	bt, _ = nodes[0].Submit(dctx, []Request{{Local: buf, Segment: "c", Length: 1 << 20}})
	if err := bt.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait: %v", err)
	}
	if s, _ := bt.Status(0); s != Timeout {
		t.Fatalf("%v", s)
	}
}

// TestAfter: a request with After goes after the one before it on the
// same QP (a Read after a Write of the same bytes reads what it wrote,
// many times over, on every QP the round robin would have used), and is
// refused where it cannot be ordered so.
func TestAfter(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			ctx := context.Background()
			nodes := cluster(t, dev, 2)
			if _, err := nodes[0].AllocSegment(ctx, "s", 1<<20); err != nil {
				t.Fatal(err)
			}
			if _, err := nodes[0].AllocSegment(ctx, "t", 1<<20); err != nil {
				t.Fatal(err)
			}
			n := nodes[1]
			buf, _ := n.AllocMR(2 << 10)
			for i := 0; i < 200; i++ {
				fill(buf.Bytes()[:1<<10], byte(i))
				clear(buf.Bytes()[1<<10:])
				b, err := n.Submit(ctx, []Request{
					{Op: Write, Local: buf, Segment: "s", Offset: 4096, Length: 1 << 10},
					{Op: Read, Local: buf, LocalOffset: 1 << 10, Segment: "s", Offset: 4096, Length: 1 << 10, After: true}})
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Wait(ctx); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(buf.Bytes()[:1<<10], buf.Bytes()[1<<10:]) {
					t.Fatalf("round %d: the read after the write did not see it", i)
				}
			}
			for _, reqs := range [][]Request{
				{{Op: Read, Local: buf, Segment: "s", Length: 8, After: true}},
				{{Op: Read, Local: buf, Segment: "s", Length: 8}, {Op: Read, Local: buf, Segment: "t", Length: 8, After: true}},
			} {
				if _, err := n.Submit(ctx, reqs); !errors.Is(err, ErrAfter) {
					t.Fatalf("%+v: %v", reqs, err)
				}
			}
			big, _ := n.AllocMR(256 << 10)
			if _, err := n.Submit(ctx, []Request{{Op: Read, Local: big, Segment: "s", Length: 128 << 10}, {Op: Read, Local: buf, Segment: "s", Length: 8, After: true}}); !errors.Is(err, ErrAfter) {
				t.Fatalf("after a request of two slices: %v", err)
			}
		})
	}
}
