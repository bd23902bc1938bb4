package roce

import (
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

// TestSourcePortPerQP: each QP's requests leave from a UDP source port
// of its own (ECMP spreads QPs), responses from the socket's port.
func TestSourcePortPerQP(t *testing.T) {
	var mu sync.Mutex
	ports := map[uint32]map[uint16]bool{} // destination QP -> source ports of requests
	testRx = func(from netip.AddrPort, p *header.Packet) {
		if op := p.Opcode(); op == header.RCWriteOnly {
			mu.Lock()
			if ports[p.BTH.DestQP()] == nil {
				ports[p.BTH.DestQP()] = map[uint16]bool{}
			}
			ports[p.BTH.DestQP()][from.Port()] = true
			mu.Unlock()
		}
	}
	defer func() { testRx = nil }()
	ca, cb := openTest(t), openTest(t)
	var qps [][2]*side
	for i := 0; i < 3; i++ {
		a, b := newSide(t, ca, 4096), newSide(t, cb, 4096)
		link(t, a, b, verbs.MTU4096)
		qps = append(qps, [2]*side{a, b})
	}
	for _, q := range qps {
		a, b := q[0], q[1]
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		a.wait(a.scq, 1, 10*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[uint16]bool{LocalAddr(ca).Port(): true}
	for _, q := range qps {
		ps := ports[q[1].qp.Num()]
		if len(ps) != 1 {
			t.Fatalf("QP %#x: requests from ports %v", q[1].qp.Num(), ps)
		}
		for p := range ps {
			if seen[p] {
				t.Fatalf("source port %d shared (socket's port %d)", p, LocalAddr(ca).Port())
			}
			seen[p] = true
		}
	}
}

// TestQPSocketClosed: a QP's own sending socket (a descriptor outside Go's
// network poller, which no finalizer closes) is closed when the QP is
// destroyed: creating and destroying connected QPs leaves no descriptor
// behind.
func TestQPSocketClosed(t *testing.T) {
	ca, cb := openTest(t), openTest(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skipf("SKIP: counting descriptors needs /proc: %v", err)
		}
		return len(ents)
	}
	round := func() {
		a, b := newSide(t, ca, 4096), newSide(t, cb, 4096)
		link(t, a, b, verbs.MTU4096)
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		a.wait(a.scq, 1, 10*time.Second)
		for _, s := range []*side{a, b} {
			if err := s.qp.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	round() // the first round may open what stays (the CM, say)
	before := fds()
	for i := 0; i < 8; i++ {
		round()
	}
	if after := fds(); after > before {
		t.Fatalf("%d descriptors open after 8 QP pairs came and went, %d before", after, before)
	}
}
