package shm_test

import (
	"errors"
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
