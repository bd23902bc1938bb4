package shm_test

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/conformance"
	_ "github.com/rdmakit/rdmakit/transport/shm"
	"github.com/rdmakit/rdmakit/verbs"
)

func TestMain(m *testing.M) {
	conformance.ServePeerIfChild()
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) { conformance.Run(t, "shm0") }

func TestDeregInFlight(t *testing.T) { conformance.DeregInFlight(t, "shm0") }

// The executor keeps the local region of its last operation entered
// between operations (rc.LocalPins with a Hold): Dereg must release it,
// so the memory is free again at once (a fresh region of the same size
// gets it back) and a later operation on the old lkey fails.
func TestDeregReleasesHeldLocalRegion(t *testing.T) {
	p, err := conformance.NewPair("shm0", 1<<16, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a := p.A
	mr, err := a.PD.AllocMR(1<<16, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	addr, lkey := mr.Addr(), mr.LKey()
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(0, 8)},
		RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()}}
	if err := a.QP.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitSend(1); err != nil {
		t.Fatal(err)
	}
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	fresh, err := a.PD.AllocMR(1<<16, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Addr() != addr {
		t.Fatalf("the deregistered region's memory was not freed (still entered?): new region at %#x, old at %#x", fresh.Addr(), addr)
	}
	wr[0].SGL = []verbs.SGE{{Addr: addr, Length: 8, LKey: lkey}}
	if err := a.QP.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := a.WaitSend(1); !errors.Is(err, verbs.StatusLocalProtection) {
		t.Fatalf("write from a deregistered lkey: %v, want a local protection error", err)
	}
}

// Posts from several goroutines race a move to ERROR: under the executor's
// one lock (soft.LockedExecutor) every work request still completes
// exactly once, executed or flushed.
func TestConcurrentPostsAndError(t *testing.T) {
	const posters, each = 4, 50
	p, err := conformance.NewPair("shm0", 1<<16, posters*each)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	a := p.A
	var wg sync.WaitGroup
	var posted atomic.Int64
	start := make(chan struct{})
	for g := range posters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := range each {
				wr := []verbs.SendWR{{ID: uint64(g*each + i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{a.MR.SGE(8*g, 8)}, RemoteAddr: p.B.MR.Addr() + uint64(8*g), RKey: p.B.MR.RKey()}}
				if err := a.QP.PostSend(wr); err != nil {
					t.Errorf("post %d: %v", g*each+i, err)
					return
				}
				posted.Add(1)
			}
		}()
	}
	close(start)
	runtime.Gosched()
	if err := a.QP.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	seen := make(map[uint64]bool)
	flushed := 0
	wcs := make([]verbs.WorkCompletion, 64)
	for {
		n, err := a.SCQ.Poll(wcs)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		for _, w := range wcs[:n] {
			if w.Status != verbs.StatusSuccess && w.Status != verbs.StatusWRFlush {
				t.Errorf("work request %d completed with %s", w.WRID, w.Status)
			}
			if seen[w.WRID] {
				t.Errorf("work request %d completed twice", w.WRID)
			}
			seen[w.WRID] = true
			if w.Status == verbs.StatusWRFlush {
				flushed++
			}
		}
	}
	t.Logf("%d work requests posted, %d of them flushed", posted.Load(), flushed)
	if int64(len(seen)) != posted.Load() {
		t.Fatalf("%d work requests posted, %d completed", posted.Load(), len(seen))
	}
}
