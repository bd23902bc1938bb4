package roce

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/verbs"
)

var rcprotoDefault rcproto.DCQCNConfig

// TestECN: requests arriving CE-marked (1 in 50 here, marked at the
// receiving socket) are answered with CNPs; the sender's DCQCN cuts its
// rate and paces, and the data still arrives intact.
func TestECN(t *testing.T) {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(3, 4))
	testMarkCE = func() bool {
		mu.Lock()
		defer mu.Unlock()
		return rng.IntN(50) == 0
	}
	// A 2 GB/s line (the default, 100 Gb/s, is far above what loopback
	// moves, so cuts from it would not slow anything down).
	// alpha decays while no CNP comes (a slow start under the race
	// detector leaves it near 0): a larger gain makes the CNPs count.
	// alpha decays, and the rate recovers, every 55 µs by default: on a
	// slow start (the race detector, a loaded machine) alpha is near 0
	// by the first CNP and the cuts are slight. Slower timers keep the
	// cuts visible whatever the timing.
	DCQCN.LineRate, DCQCN.G = 2e9, 1.0/16
	DCQCN.AlphaPeriod, DCQCN.RateTimer = 10*time.Millisecond, 10*time.Millisecond
	defer func() { testMarkCE, DCQCN = nil, rcprotoDefault }()
	size := 8 << 20
	if testing.Short() {
		size = 2 << 20
	}
	a, b := pair(t, size, verbs.MTU4096)
	fill(a.mr.Bytes(), 9)
	const chunk = 256 << 10
	for off := 0; off < size; off += chunk {
		a.post(verbs.SendWR{ID: uint64(off), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(off, chunk)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()})
	}
	a.wait(a.scq, size/chunk, 60*time.Second)
	sameBytes(t, "written", b.mr.Bytes(), a.mr.Bytes())
	sa, _ := Stats(a.ctx)
	sb, _ := Stats(b.ctx)
	d := qpOf(a.ctx, a.qp)
	d.mu.Lock()
	c, minRate, rate := d.cc.rc.Counters(), d.cc.minRate, d.cc.rc.Rate()
	d.mu.Unlock()
	t.Logf("b: %d CE-marked, %d CNPs sent; a: %d CNPs received, DCQCN %+v, lowest rate %.3g B/s, now %.3g B/s",
		sb.RxCE, sb.TxCNP, sa.RxCNP, c, minRate, rate)
	if sb.RxCE == 0 || sb.TxCNP == 0 || sa.RxCNP == 0 || c.Cuts == 0 || minRate > 0.9*DCQCN.LineRate {
		t.Fatal("congestion marks did not make the sender cut its rate")
	}
}
