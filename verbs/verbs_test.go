package verbs_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/conformance"
	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
	"github.com/rdmakit/rdmakit/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t *testing.T) (*verbs.Context, *verbs.PD) {
	t.Helper()
	ctx, err := verbs.Open("shm0", verbs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	return ctx, pd
}

func TestDevicesAndOpenErrors(t *testing.T) {
	devs, err := verbs.Devices()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, d := range devs {
		if d.Name == "shm0" && d.Transport == "shm" && len(d.Ports) == 1 {
			found = true
		}
	}
	if !found {
		t.Fatalf("shm0 not listed: %+v", devs)
	}
	if _, err := verbs.Open("mlx5_9", verbs.Options{}); !errors.Is(err, verbs.ErrNoDevice) {
		t.Fatalf("open of a missing device: %v", err)
	}
}

func TestKeysRandomUniqueAndRevoked(t *testing.T) {
	_, pd := open(t)
	seen := map[uint32]bool{}
	var mrs []*verbs.MR
	hi := uint32(0)
	for i := 0; i < 200; i++ {
		mr, err := pd.AllocMR(64, verbs.AccessAll)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []uint32{mr.LKey(), mr.RKey()} {
			if k == 0 || seen[k] {
				t.Fatalf("key %#x reused or zero", k)
			}
			seen[k] = true
			hi |= k
		}
		mrs = append(mrs, mr)
	}
	if hi>>28 == 0 {
		t.Fatal("keys never use the top bits: not 32 bits of entropy")
	}
	for _, mr := range mrs {
		if err := mr.Dereg(); err != nil {
			t.Fatal(err)
		}
	}
	if err := mrs[0].Dereg(); err == nil {
		t.Fatal("double dereg accepted")
	}
}

func TestRegMRRules(t *testing.T) {
	_, pd := open(t)
	if _, err := pd.AllocMR(64, verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("REMOTE_WRITE without LOCAL_WRITE: %v", err)
	}
	if _, err := pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite); !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("RegMR of heap memory on shm: %v", err)
	}
	mr, _ := pd.AllocMR(4096, verbs.AccessLocalWrite)
	if _, err := pd.RegMR(mr.Bytes()[100:200], verbs.AccessAll); err != nil {
		t.Fatalf("re-registering arena memory: %v", err)
	}
}

func TestQPStateMachine(t *testing.T) {
	ctx, pd := open(t)
	cq, _ := ctx.CreateCQ(16)
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	if qp.State() != verbs.QPReset {
		t.Fatalf("new QP is %s", qp.State())
	}
	if qp.Num() == 0 || qp.Num() > 0xffffff {
		t.Fatalf("QP number %#x", qp.Num())
	}
	for _, bad := range []verbs.QPState{verbs.QPRTR, verbs.QPRTS} {
		if err := qp.Modify(verbs.QPAttr{State: bad}); !errors.Is(err, verbs.ErrInvalidState) {
			t.Fatalf("RESET → %s: %v", bad, err)
		}
	}
	if err := qp.PostRecv([]verbs.RecvWR{{ID: 1}}); !errors.Is(err, verbs.ErrInvalidState) {
		t.Fatalf("post recv in RESET: %v", err)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit}); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend}}); !errors.Is(err, verbs.ErrInvalidState) {
		t.Fatalf("post send in INIT: %v", err)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTS}); !errors.Is(err, verbs.ErrInvalidState) {
		t.Fatalf("INIT → RTS: %v", err)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: 5, AH: verbs.AddressHandle{Dest: []byte("junk")}}); err == nil {
		t.Fatal("RTR with a garbage address accepted")
	}
	if qp.State() != verbs.QPInit {
		t.Fatalf("failed transition left the QP in %s", qp.State())
	}
	// Receives posted in INIT flush when the QP enters ERROR.
	if err := qp.PostRecv([]verbs.RecvWR{{ID: 7}}); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]verbs.WorkCompletion, 4)
	n, _ := cq.Poll(wcs)
	if n != 1 || wcs[0].WRID != 7 || !errors.Is(wcs[0].Err(), verbs.StatusWRFlush) {
		t.Fatalf("flush of a posted receive: %d %+v", n, wcs[0])
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPReset}); err != nil {
		t.Fatal(err)
	}
	if err := cq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("closing a CQ in use: %v", err)
	}
	qp.Close()
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestCQWaitCancelAndClose(t *testing.T) {
	ctx, _ := open(t)
	cq, _ := ctx.CreateCQ(4)
	wcs := make([]verbs.WorkCompletion, 1)
	c, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := cq.Wait(c, wcs); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with an expiring context: %v", err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := cq.Wait(context.Background(), wcs)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	cq.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("Wait after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Wait")
	}
}

func TestSRQ(t *testing.T) {
	p, err := conformance.NewPair("shm0", 4096, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A second QP on B fed by an SRQ.
	srq, err := p.B.PD.CreateSRQ(verbs.SRQConfig{})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := p.B.PD.CreateQP(verbs.QPConfig{SendCQ: p.B.SCQ, RecvCQ: p.B.RCQ, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := p.A.PD.CreateQP(verbs.QPConfig{SendCQ: p.A.SCQ, RecvCQ: p.A.RCQ})
	for _, s := range []struct{ x, y *verbs.QP }{{qp, a2}, {a2, qp}} {
		must(t, s.x.Modify(verbs.QPAttr{State: verbs.QPInit}))
		must(t, s.x.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: s.y.Num(), AH: verbs.AddressHandle{Dest: s.y.Address()}}))
		must(t, s.x.Modify(verbs.QPAttr{State: verbs.QPRTS, RNRRetry: 7}))
	}
	if err := qp.PostRecv([]verbs.RecvWR{{ID: 1}}); err == nil {
		t.Fatal("PostRecv on an SRQ QP accepted")
	}
	must(t, srq.PostRecv([]verbs.RecvWR{{ID: 42, SGL: []verbs.SGE{p.B.MR.SGE(0, 100)}}}))
	copy(p.A.MR.Bytes(), "hello srq")
	must(t, a2.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.A.MR.SGE(0, 9)}}}))
	must(t, p.A.WaitSend(1))
	wcs := make([]verbs.WorkCompletion, 1)
	n, err := p.B.RCQ.Wait(context.Background(), wcs)
	if err != nil || n != 1 || wcs[0].WRID != 42 || wcs[0].QPNum != qp.Num() || wcs[0].ByteLen != 9 {
		t.Fatalf("SRQ receive: %d %v %+v", n, err, wcs[0])
	}
	if string(p.B.MR.Bytes()[:9]) != "hello srq" {
		t.Fatal("SRQ receive data wrong")
	}
	if err := srq.Close(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("closing an SRQ in use: %v", err)
	}
}

func TestNoAllocationOnDataPath(t *testing.T) {
	p, err := conformance.NewPair("shm0", 1<<16, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.A.MR.SGE(0, 4096)}, RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()}}
	send := []verbs.SendWR{{Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.A.MR.SGE(0, 64)}}}
	recv := []verbs.RecvWR{{SGL: []verbs.SGE{p.B.MR.SGE(0, 64)}}}
	allocs := testing.AllocsPerRun(1000, func() {
		p.A.QP.PostSend(wr)
		p.A.WaitSend(1)
		p.B.QP.PostRecv(recv)
		p.A.QP.PostSend(send)
		p.A.WaitSend(1)
		p.B.WaitRecv(1)
	})
	if allocs != 0 {
		t.Fatalf("%.1f allocations per post/poll round", allocs)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCloseWhileWaiting(t *testing.T) {
	for i := 0; i < 20; i++ {
		ctx, err := verbs.Open("shm0", verbs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		cq, _ := ctx.CreateCQ(4)
		done := make(chan error, 2)
		go func() {
			_, err := cq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
			done <- err
		}()
		go func() {
			var err error
			for err == nil {
				_, err = cq.Poll(make([]verbs.WorkCompletion, 1))
			}
			done <- err
		}()
		time.Sleep(time.Millisecond)
		ctx.Close()
		for j := 0; j < 2; j++ {
			select {
			case err := <-done:
				if !errors.Is(err, verbs.ErrClosed) {
					t.Fatalf("waiter after Context.Close: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Context.Close did not unblock a waiter")
			}
		}
	}
}

func TestOpenOptions(t *testing.T) {
	t.Setenv("RDMAKIT_ARENA_SIZE", "lots")
	if _, err := verbs.Open("shm0", verbs.Options{}); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("malformed RDMAKIT_ARENA_SIZE: %v, want ErrInvalidArgument", err)
	}
	t.Setenv("RDMAKIT_ARENA_SIZE", "256M")
	ctx, err := verbs.Open("shm0", verbs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	if got := ctx.Options().ArenaSize; got != 256<<20 {
		t.Fatalf("arena size from the environment: %d", got)
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.AllocMR(512<<20, verbs.AccessLocalWrite); err == nil {
		t.Fatal("512 MiB allocated from a 256 MiB arena")
	}
	ctx2, err := verbs.Open("shm0", verbs.Options{ArenaSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer ctx2.Close()
	if got := ctx2.Options().ArenaSize; got != 1<<30 {
		t.Fatalf("explicit arena size: %d", got)
	}
}

// A work request with an unknown opcode is refused in every state, without
// a panic and without leaving a lock held (the QP keeps working).
func TestInvalidOpcodeInError(t *testing.T) {
	ctx, pd := open(t)
	cq, err := ctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Close()
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
		t.Fatal(err)
	}
	for _, op := range []verbs.Opcode{7, 99, 255} {
		err := qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: op}})
		var pe *verbs.PostError
		if !errors.As(err, &pe) || !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Fatalf("opcode %d on a QP in ERROR: %v", op, err)
		}
	}
	// Still usable: a valid one completes with WRFlush, and state changes work.
	if err := qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled}}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]verbs.WorkCompletion, 4)
	n, err := cq.Poll(wcs)
	if err != nil || n != 1 || wcs[0].WRID != 2 || wcs[0].Status != verbs.StatusWRFlush {
		t.Fatalf("flush completion: n=%d %v %+v", n, err, wcs[0])
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPReset}); err != nil {
		t.Fatal(err)
	}
}

// Open never fails because of contexts already closed: each reserves 64
// GiB of address space, so 2100 of them held past Close exhaust a 47-bit
// address space.
func TestOpenCloseChurn(t *testing.T) {
	for i := 0; i < 2100; i++ {
		ctx, err := verbs.Open("shm0", verbs.Options{})
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		pd, err := ctx.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pd.AllocMR(4096, verbs.AccessLocalWrite); err != nil {
			t.Fatal(err)
		}
		if err := ctx.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Memory registered more than once stays reserved until its last
// registration goes.
func TestAliasKeepsMemoryReserved(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) { conformance.AliasKeepsMemoryReserved(t, dev) })
	}
}

// A send queue slot is free by the time its completion can be polled: a
// program that keeps the queue full, posting one work request for each
// completion it polls, never sees ErrQueueFull.
func TestSlotFreeWhenCompletionPolled(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			const depth = 8
			p, err := conformance.NewPair(dev, 4096, depth)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			a, b := p.A, p.B
			depthGot := a.QP.Cap().MaxSendWR
			wr := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}}
			for i := 0; i < depthGot; i++ {
				if err := a.QP.PostSend(wr); err != nil {
					t.Fatal(err)
				}
			}
			wcs := make([]verbs.WorkCompletion, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for i := 0; i < 20000; i++ {
				n, err := a.SCQ.Wait(ctx, wcs)
				if err != nil || n != 1 || wcs[0].Status != verbs.StatusSuccess {
					t.Fatalf("completion %d: %v %+v", i, err, wcs[0])
				}
				if err := a.QP.PostSend(wr); err != nil {
					t.Fatalf("post %d right after polling a completion: %v", i, err)
				}
			}
		})
	}
}
