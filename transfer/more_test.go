package transfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
)

// TestStaleSegment: a request to a segment unregistered since this node
// looked it up fails with the target's refusal, and the next Submit sees
// the segment gone.
func TestStaleSegment(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	nodes[1].AllocSegment(ctx, "s", 1<<20)
	buf, _ := nodes[0].AllocMR(1 << 20)
	bt, err := nodes[0].Submit(ctx, []Request{{Local: buf, Segment: "s", Length: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	bt.Wait(ctx)
	if err := nodes[1].UnregisterSegment(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	bt, err = nodes[0].Submit(ctx, []Request{{Local: buf, Segment: "s", Length: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if err := bt.Wait(ctx); !errors.Is(err, ErrTransfer) {
		t.Fatalf("Wait: %v", err)
	}
	if s, cause := bt.Status(0); s != Failed || cause == nil {
		t.Fatalf("%v %v", s, cause)
	}
	if _, err := nodes[0].Submit(ctx, []Request{{Local: buf, Segment: "s", Length: 1}}); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("after the failure: %v", err)
	}
	if err := nodes[1].UnregisterSegment(ctx, "s"); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("unregister twice: %v", err)
	}
}

// TestLeaseExpiry: the table drops a node and its segments when its lease
// runs out, and Renew then says so.
func TestLeaseExpiry(t *testing.T) {
	ctx := context.Background()
	tab := newMemTable()
	now := time.Unix(1000, 0)
	tab.now = func() time.Time { return now }
	tab.PutNode(ctx, NodeInfo{Name: "x"}, time.Second)
	tab.PutNode(ctx, NodeInfo{Name: "y"}, 0)
	if err := tab.PutSegment(ctx, SegmentDesc{Name: "sx", Node: "x", Size: 1}); err != nil {
		t.Fatal(err)
	}
	tab.PutSegment(ctx, SegmentDesc{Name: "sy", Node: "y", Size: 1})
	if err := tab.PutSegment(ctx, SegmentDesc{Name: "sz", Node: "z"}); !errors.Is(err, ErrNoNode) {
		t.Fatalf("segment of an unknown node: %v", err)
	}
	now = now.Add(900 * time.Millisecond)
	if err := tab.Renew(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	now = now.Add(900 * time.Millisecond)
	if _, err := tab.GetSegment(ctx, "sx"); err != nil {
		t.Fatalf("renewed: %v", err)
	}
	now = now.Add(200 * time.Millisecond)
	if _, err := tab.GetSegment(ctx, "sx"); !errors.Is(err, ErrNoSegment) {
		t.Fatalf("expired: %v", err)
	}
	if err := tab.Renew(ctx, "x"); !errors.Is(err, ErrNoNode) {
		t.Fatalf("renew after expiry: %v", err)
	}
	if _, err := tab.GetSegment(ctx, "sy"); err != nil {
		t.Fatalf("no lease: %v", err)
	}
}

// Frame types of transfer/internal/rpc's handshake, as on the wire.
const (
	fHello   = 1
	fOK      = 4
	fRequest = 6
	fAnswer  = 7
)

// TestMetadataService: garbage, a wrong magic and a client without the
// secret are refused; the service keeps serving; an insecure node cannot
// join a table with a secret.
func TestMetadataService(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 1)
	addr := nodes[0].Addr()
	for _, hello := range [][]byte{
		[]byte("GET / HTTP/1.1\r\n\r\n"),
		frame.AppendFrame(nil, fHello, append(append(frame.AppendUint32(nil, 0x12345678), metaProto.Version, 1), make([]byte, 32)...)),
		frame.AppendFrame(nil, fHello, append(append(frame.AppendUint32(nil, metaProto.Magic), metaProto.Version, 0), make([]byte, 32)...)),
		frame.AppendFrame(nil, fRequest, []byte{opGetSeg, 1, 'x'}),
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(hello)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		r := frame.NewReader(bufio.NewReader(c), 1<<20)
		for {
			typ, _, err := r.Next()
			if err != nil {
				break
			}
			if typ == fOK || typ == fAnswer {
				t.Fatalf("%q: accepted", hello)
			}
		}
		c.Close()
	}
	if _, err := New(ctx, Config{Devices: []string{"tcp0"}, Insecure: true, MetadataAddr: addr}); !errors.Is(err, ErrAuth) {
		t.Fatalf("insecure node: %v", err)
	}
	n, err := New(ctx, Config{Name: "late", Devices: []string{"tcp0"}, Secret: secret, MetadataAddr: addr})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
}

// TestNoAllocPerSlice: a request of many slices costs the same
// allocations as a request of one.
func TestNoAllocPerSlice(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "shm0", 2)
	nodes[1].AllocSegment(ctx, "a", 4<<20)
	buf, _ := nodes[0].AllocMR(4 << 20)
	allocs := func(length int) float64 {
		reqs := []Request{{Local: buf, Segment: "a", Length: length}}
		return testing.AllocsPerRun(20, func() {
			bt, err := nodes[0].Submit(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			<-bt.Done()
		})
	}
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	allocs(4096) // connect
	// Background goroutines (heartbeats, the lease) allocate now and then:
	// one clean measurement of three is enough.
	var one, many float64
	for try := 0; try < 3; try++ {
		one, many = allocs(64<<10), allocs(4<<20) // 1 and 64 slices
		if many <= one+2 {
			t.Logf("allocations per batch: %v (1 slice), %v (64 slices)", one, many)
			return
		}
	}
	t.Fatalf("%v allocations for 64 slices, %v for 1", many, one)
}

// countingMeta is a Metadata of the caller's (as an etcd one would be):
// the embedded table, counting lookups.
type countingMeta struct {
	*memTable
	gets atomic.Int32
}

func (m *countingMeta) GetSegment(ctx context.Context, name string) (SegmentDesc, error) {
	m.gets.Add(1)
	return m.memTable.GetSegment(ctx, name)
}

// TestCustomMetadata: nodes given Config.Metadata publish to it and find
// each other through it, with no metadata service.
func TestCustomMetadata(t *testing.T) {
	ctx := context.Background()
	m := &countingMeta{memTable: newMemTable()}
	var nodes []*Node
	for _, name := range []string{"p", "q"} {
		n, err := New(ctx, Config{Name: name, Devices: []string{"tcp0"}, Secret: secret, ArenaSize: 1 << 30, Metadata: m})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if n.Addr() != "" {
			t.Fatalf("a node with Config.Metadata serves %s", n.Addr())
		}
		nodes = append(nodes, n)
	}
	seg, _ := nodes[0].AllocSegment(ctx, "m", 4096)
	copy(seg.Bytes(), "custom")
	buf, _ := nodes[1].AllocMR(4096)
	b, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: "m", Length: 6}})
	if err == nil {
		err = b.Wait(ctx)
	}
	if err != nil || string(buf.Bytes()[:6]) != "custom" || m.gets.Load() == 0 {
		t.Fatalf("%v %q %d", err, buf.Bytes()[:6], m.gets.Load())
	}
}

// TestDuplicateNodeName: a name held by a live node is refused.
func TestDuplicateNodeName(t *testing.T) {
	ctx := context.Background()
	nodes := cluster(t, "tcp0", 2)
	for _, name := range []string{"n0", "n1"} {
		if _, err := New(ctx, Config{Name: name, Devices: []string{"tcp0"}, Secret: secret, MetadataAddr: nodes[0].Addr()}); !errors.Is(err, ErrExists) {
			t.Fatalf("%s again: %v", name, err)
		}
	}
	// The refused node did not disturb the holder.
	if _, err := nodes[1].AllocSegment(ctx, "still", 4096); err != nil {
		t.Fatal(err)
	}
}

// TestMultiRail: with Rails 2 and both shm0 and tcp0, a large request's
// slices go over both devices, and the bytes arrive whole.
func TestMultiRail(t *testing.T) {
	ctx := context.Background()
	var nodes []*Node
	for i := 0; i < 2; i++ {
		c := Config{Name: fmt.Sprintf("rail%d", i), Devices: []string{"shm0", "tcp0"}, Secret: secret, ArenaSize: 1 << 30,
			Rails: 2, SliceSize: 256 << 10}
		if i > 0 {
			c.MetadataAddr = nodes[0].Addr()
		}
		n, err := New(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	seg, err := nodes[0].AllocSegment(ctx, "big", 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	fill(seg.Bytes(), 4)
	buf, _ := nodes[1].AllocMR(16 << 20)
	b, err := nodes[1].Submit(ctx, []Request{{Local: buf, Segment: "big", Length: 16 << 20}})
	if err == nil {
		err = b.Wait(ctx)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), seg.Bytes()) {
		t.Fatal("data differs")
	}
	for _, d := range nodes[1].devs {
		if d.posted.Load() == 0 {
			t.Fatalf("no slice over %s", d.name)
		}
	}
	// Default Rails: the same-host device alone for a node of this host.
	nodes[1].cfg.Rails = 0
	before := nodes[1].devs[1].posted.Load()
	b, _ = nodes[1].Submit(ctx, []Request{{Local: buf, Segment: "big", Length: 16 << 20}})
	if err := b.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if nodes[1].devs[1].posted.Load() != before {
		t.Fatal("tcp0 used for a same-host peer by default")
	}
}

// TestSubmitAsync: SubmitAsync returns before posting (requests Waiting
// or Pending), refuses bad requests at once, and the batch completes.
func TestSubmitAsync(t *testing.T) {
	ctx := context.Background()
	for _, dev := range []string{"shm0", "tcp0"} {
		nodes := cluster(t, dev, 2)
		seg, _ := nodes[0].AllocSegment(ctx, "a-"+dev, 8<<20)
		fill(seg.Bytes(), 6)
		buf, _ := nodes[1].AllocMR(8 << 20)
		if _, err := nodes[1].SubmitAsync(ctx, []Request{{Local: buf, Segment: "a-" + dev, Offset: 1, Length: 8 << 20}}); !errors.Is(err, ErrBounds) {
			t.Fatalf("bounds: %v", err)
		}
		var reqs []Request
		for i := 0; i < 128; i++ {
			reqs = append(reqs, Request{Local: buf, LocalOffset: i << 16, Segment: "a-" + dev, Offset: uint64(i) << 16, Length: 1 << 16})
		}
		b, err := nodes[1].SubmitAsync(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := b.Status(127); s.Final() && s != Completed {
			t.Fatalf("status %v", s)
		}
		if err := b.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), seg.Bytes()) {
			t.Fatal("data differs")
		}
	}
}

// TestMetaRetries: a PutNode or PutSegment repeated after a lost answer
// succeeds for the caller's own record; another's is refused; a node's
// segments are capped.
func TestMetaRetries(t *testing.T) {
	ctx := context.Background()
	tab := newMemTable()
	n := NodeInfo{Name: "a", Host: "h", Endpoints: []Endpoint{{"tcp0", "x:1"}}}
	if err := tab.PutNode(ctx, n, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := tab.PutNode(ctx, n, time.Minute); err != nil {
		t.Fatalf("retry of own node: %v", err)
	}
	other := n
	other.Host = "h2"
	if err := tab.PutNode(ctx, other, time.Minute); !errors.Is(err, ErrExists) {
		t.Fatalf("another node of that name: %v", err)
	}
	s := SegmentDesc{Name: "s", Node: "a", Size: 10, Regions: []Region{{"tcp0", 1, 2}}}
	if err := tab.PutSegment(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := tab.PutSegment(ctx, s); err != nil {
		t.Fatalf("retry of own segment: %v", err)
	}
	s2 := s
	s2.Size = 11
	if err := tab.PutSegment(ctx, s2); !errors.Is(err, ErrExists) {
		t.Fatalf("another segment of that name: %v", err)
	}
	for i := 1; i < MaxSegmentsPerNode; i++ {
		if err := tab.PutSegment(ctx, SegmentDesc{Name: fmt.Sprint("s", i), Node: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.PutSegment(ctx, SegmentDesc{Name: "one-too-many", Node: "a"}); !errors.Is(err, ErrTableFull) {
		t.Fatalf("cap: %v", err)
	}
	tab.DeleteSegment(ctx, "a", "s")
	if err := tab.PutSegment(ctx, SegmentDesc{Name: "one-too-many", Node: "a"}); err != nil {
		t.Fatalf("after a delete: %v", err)
	}
}

// TestCompletionWithoutWait: a batch Submit posted completes without a
// Wait: the completion goroutines reap it once Done or Status is asked,
// or else once the janitor finds the QPs busy.
func TestCompletionWithoutWait(t *testing.T) {
	ctx := context.Background()
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			var nodes []*Node
			for i := 0; i < 2; i++ {
				cfg := Config{Name: fmt.Sprintf("n%d", i), Secret: secret, ArenaSize: 1 << 30, Devices: []string{dev},
					SliceSize: 64 << 10, IdleTimeout: 400 * time.Millisecond}
				if i > 0 {
					cfg.MetadataAddr = nodes[0].Addr()
				}
				n, err := New(ctx, cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer n.Close()
				nodes = append(nodes, n)
			}
			seg, _ := nodes[0].AllocSegment(ctx, "s", 1<<20)
			fill(seg.Bytes(), 3)
			buf, _ := nodes[1].AllocMR(1 << 20)
			reqs := []Request{{Local: buf, Segment: "s", Length: 1 << 20}}
			deadline := time.After(10 * time.Second)
			// Done alone.
			b, err := nodes[1].Submit(ctx, reqs)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-b.Done():
			case <-deadline:
				t.Fatal("Done never closed")
			}
			// Status alone.
			if b, err = nodes[1].Submit(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			for {
				s, err := b.Status(0)
				if s == Completed {
					break
				}
				if s.Final() {
					t.Fatalf("status %v: %v", s, err)
				}
				select {
				case <-deadline:
					t.Fatalf("still %v", s)
				case <-time.After(time.Millisecond):
				}
			}
			// Neither: the janitor (every IdleTimeout/4) hands it over.
			if b, err = nodes[1].Submit(ctx, reqs); err != nil {
				t.Fatal(err)
			}
			for b.pending.Load() != 0 {
				select {
				case <-deadline:
					t.Fatal("never reaped")
				case <-time.After(time.Millisecond):
				}
			}
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), seg.Bytes()) {
				t.Fatal("data differs")
			}
		})
	}
}

func TestBusyPollConfig(t *testing.T) {
	t.Setenv("RDMAKIT_TCP_BUSY_POLL", "")
	for _, c := range []struct{ in, want time.Duration }{{0, DefaultTCPBusyPoll}, {-1, -1}, {30 * time.Microsecond, 30 * time.Microsecond}} {
		if got := (Config{TCPBusyPoll: c.in}).busyPoll(); got != c.want {
			t.Errorf("TCPBusyPoll %v: %v, want %v", c.in, got, c.want)
		}
	}
	t.Setenv("RDMAKIT_TCP_BUSY_POLL", "50us")
	if got := (Config{}).busyPoll(); got != 0 {
		t.Errorf("with the environment set: %v, want 0 (verbs reads it)", got)
	}
}

func TestSpinFor(t *testing.T) {
	b := &Batch{bytes: 2 * (256 << 10)} // two requests of 256 KiB (prepare adds them up)
	if got := b.spinFor(false); got != waitSpin {
		t.Errorf("not alone: %v, want %v", got, waitSpin)
	}
	if got, want := b.spinFor(true), waitSpin+2*(256<<10)/spinRate*time.Microsecond; got != want {
		t.Errorf("alone, 512 KiB: %v, want %v", got, want)
	}
	b.bytes = 1<<40 + 256<<10
	if got := b.spinFor(true); got != waitSpin+maxWaitSpin {
		t.Errorf("alone, 1 TiB: %v, want %v", got, waitSpin+maxWaitSpin)
	}
	if got := (&Batch{}).spinFor(true); got != waitSpin {
		t.Errorf("alone, empty: %v, want %v", got, waitSpin)
	}
}
