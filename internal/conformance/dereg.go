package conformance

// DeregInFlight is not one of the suite's cases (it runs on the software
// devices only, called by their tests): it checks the memory-registration
// guarantee for operations already in flight.

import (
	"fmt"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// DeregInFlight races a large WRITE, READ and SEND with a Dereg followed
// by AllocMR of the same size (which gets the same memory back when the
// old memory is free), of the target's region (written, read, or
// receiving) and of the initiator's own (read or written): once Dereg has
// returned, the operation must not touch the memory, so it never writes
// into the new region nor reads out of it. The operation either completes
// before Dereg returns or fails: RemoteAccess for a target region (a SEND
// whose receive buffer went away: RemoteOperation), LocalProtection for
// the initiator's.
func DeregInFlight(t *testing.T, device string) {
	const size = 48 << 20
	for _, side := range []string{"target", "local"} {
		for _, op := range []verbs.Opcode{verbs.OpWrite, verbs.OpRead, verbs.OpSend} {
			for i, delay := range []time.Duration{0, time.Millisecond, 4 * time.Millisecond} {
				t.Run(fmt.Sprintf("%s-%s-%d", side, op, i), func(t *testing.T) { deregRound(t, device, op, side == "local", size, delay) })
			}
		}
	}
}

type deregEnd struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	psn uint32
}

func newDeregEnd(t *testing.T, device string) *deregEnd {
	ctx, err := verbs.Open(device, verbs.Options{})
	must(t, err)
	t.Cleanup(func() { ctx.Close() })
	e := &deregEnd{ctx: ctx, psn: verbs.RandomPSN()}
	e.pd, err = ctx.AllocPD()
	must(t, err)
	e.cq, err = ctx.CreateCQ(64)
	must(t, err)
	e.qp, err = e.pd.CreateQP(verbs.QPConfig{SendCQ: e.cq, RecvCQ: e.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err)
	must(t, e.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead, Port: 1}))
	return e
}

func (e *deregEnd) connect(t *testing.T, r *deregEnd) {
	must(t, e.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: verbs.MTU4096, DestQPN: r.qp.Num(), RQPSN: r.psn,
		AH: verbs.AddressHandle{Dest: r.qp.Address()}, MinRNRTimer: 1, MaxDestRdAtomic: 16}))
	must(t, e.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: e.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 16}))
}

func deregRound(t *testing.T, device string, op verbs.Opcode, local bool, size int, delay time.Duration) {
	a := newDeregEnd(t, device)
	b := newDeregEnd(t, device)
	a.connect(t, b)
	b.connect(t, a)
	src, err := a.pd.AllocMR(size, verbs.AccessAll)
	must(t, err)
	dst, err := b.pd.AllocMR(size, verbs.AccessAll)
	must(t, err)
	if op == verbs.OpRead {
		src, dst = dst, src // data flows from b's region to a's
	}
	// gone is the region deregistered; owner the PD it was allocated
	// from, which allocates the new one.
	gone, owner := dst, b.pd
	if op == verbs.OpRead {
		gone, owner = src, b.pd
	}
	if local {
		gone, owner = src, a.pd
		if op == verbs.OpRead {
			gone = dst
		}
	}
	// What the new region must never see: written after Dereg returned
	// (gone is the destination), or read out of it (gone is the source).
	goneIsDst := gone == dst
	const old, secret = 0x11, 0xEE
	fill(src.Bytes(), old)
	laddr, lmr := src, dst // a's region and b's
	if op == verbs.OpRead {
		laddr, lmr = dst, src
	}
	if op == verbs.OpSend {
		must(t, b.qp.PostRecv([]verbs.RecvWR{{ID: 9, SGL: []verbs.SGE{dst.SGE(0, size)}}}))
	}
	posted := make(chan error, 1)
	go func() {
		// shm executes in PostSend: the copy runs on this goroutine.
		posted <- a.qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op, Flags: verbs.SendSignaled, SGL: []verbs.SGE{laddr.SGE(0, size)},
			RemoteAddr: lmr.Addr(), RKey: lmr.RKey()}})
	}()
	time.Sleep(delay)
	must(t, gone.Dereg())
	deregAt := time.Now()
	fresh, err := owner.AllocMR(size, verbs.AccessAll)
	must(t, err)
	// The new region is zeroed; what is not zero now was written after
	// Dereg returned.
	for i, x := range fresh.Bytes() {
		if x != 0 {
			t.Fatalf("byte %d of a region allocated after Dereg returned is %#x at once", i, x)
		}
	}
	if !goneIsDst {
		fill(fresh.Bytes(), secret)
	}
	must(t, <-posted)
	var wcs [1]verbs.WorkCompletion
	deadline := time.Now().Add(pollTimeout)
	for {
		n, err := a.cq.Poll(wcs[:])
		must(t, err)
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion")
		}
		time.Sleep(100 * time.Microsecond)
	}
	wc := wcs[0]
	t.Logf("%s of %d bytes, Dereg after %v: %s (%v after Dereg returned)", op, size, delay, wc.Status, time.Since(deregAt))
	fail := verbs.StatusRemoteAccess
	switch {
	case local:
		fail = verbs.StatusLocalProtection
	case op == verbs.OpSend:
		fail = verbs.StatusRemoteOperation
	}
	if wc.Status != verbs.StatusSuccess && wc.Status != fail {
		t.Fatalf("completed with %s, want success or %s", wc.Status, fail)
	}
	// Give a transfer that ignores the Dereg time to do its harm.
	time.Sleep(20 * time.Millisecond)
	if goneIsDst {
		for i, x := range fresh.Bytes() {
			if x != 0 {
				t.Fatalf("the %s wrote byte %d of a region allocated after Dereg returned", op, i)
			}
		}
		return
	}
	for i, x := range dst.Bytes() {
		if x == secret {
			t.Fatalf("the %s moved byte %d of a region allocated after Dereg returned", op, i)
		}
		if x != old && wc.Status == verbs.StatusSuccess {
			t.Fatalf("the %s succeeded but byte %d is %#x, not what the region held before Dereg", op, i, x)
		}
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}
