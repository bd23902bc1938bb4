package roce

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// lossy is a Filter that drops, duplicates and reorders datagrams.
type lossy struct {
	mu                  sync.Mutex
	rng                 *rand.Rand
	drop, dup, reorder  float64
	held                []byte
	heldTo              netip.AddrPort
	heldSend            func([]byte, netip.AddrPort) // the socket it came from
	dropped, duplicated int
	reordered           int
}

func (l *lossy) filter(b []byte, to netip.AddrPort, send func([]byte, netip.AddrPort)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	x := l.rng.Float64()
	switch {
	case x < l.drop:
		l.dropped++
		return
	case x < l.drop+l.dup:
		l.duplicated++
		send(b, to)
		send(b, to)
	case x < l.drop+l.dup+l.reorder && l.held == nil:
		l.reordered++
		l.held = append(l.held[:0:0], b...)
		l.heldTo, l.heldSend = to, send
		return
	default:
		send(b, to)
	}
	if l.held != nil {
		l.heldSend(l.held, l.heldTo)
		l.held = nil
	}
}

// TestLossy moves Writes and Reads through a network that loses 5%,
// duplicates 2% and reorders 2% of the datagrams: everything arrives
// intact, and the retransmission counters show the loss was real.
func TestLossy(t *testing.T) {
	size := 4 << 20
	if testing.Short() {
		size = 1 << 20
	}
	l := &lossy{rng: rand.New(rand.NewPCG(1, 2)), drop: 0.05, dup: 0.02, reorder: 0.02}
	testFilter = l.filter
	defer func() { testFilter = nil }()
	a, b := pair(t, 2*size, verbs.MTU1024)
	src := a.mr.Bytes()[:size]
	fill(src, 7)
	const chunk = 64 << 10
	// Writes a -> b.
	n := 0
	for off := 0; off < size; off += chunk {
		if err := a.qp.PostSend([]verbs.SendWR{{ID: uint64(off), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(off, chunk)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		n++
		if n == 64 {
			a.wait(a.scq, n, 60*time.Second)
			n = 0
		}
	}
	a.wait(a.scq, n, 60*time.Second)
	sameBytes(t, "written", b.mr.Bytes()[:size], src)
	// Reads b -> a's second half.
	n = 0
	for off := 0; off < size; off += chunk {
		if err := a.qp.PostSend([]verbs.SendWR{{ID: uint64(off), Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(size+off, chunk)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		n++
		if n == 16 {
			a.wait(a.scq, n, 60*time.Second)
			n = 0
		}
	}
	a.wait(a.scq, n, 60*time.Second)
	sameBytes(t, "read back", a.mr.Bytes()[size:2*size], src)
	sa, _ := Stats(a.ctx)
	sb, _ := Stats(b.ctx)
	l.mu.Lock()
	t.Logf("network: %d dropped, %d duplicated, %d reordered; a: %+v; b: %+v", l.dropped, l.duplicated, l.reordered, sa, sb)
	l.mu.Unlock()
	if sa.RxBadICRC+sb.RxBadICRC != 0 {
		t.Fatal("packets arrived corrupted")
	}
	if sa.Retransmits == 0 {
		t.Fatal("no retransmission counted on a lossy network")
	}
	if l.dropped == 0 || l.duplicated == 0 || l.reordered == 0 {
		t.Fatal("the network did not misbehave")
	}
}
