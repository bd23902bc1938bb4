package soft

// Tests of CQ.Wait's goroutine waiters (cq.go): waiters of a CQ that no
// QP uses as its receive CQ park on a channel, and every one of them is
// woken by the completions, the closing or its context; a CQ that becomes
// a receive CQ moves them to the ring's futex.
//
// Goroutines: the test's, the waiters, and a watchdog per test that fails
// it if the waiters do not all return (a lost wake-up leaves one parked).

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs/driver"
)

type waitEnv struct {
	c      driver.Context
	pd     driver.PD
	cq     *CQ // the send CQ
	rcq    driver.CQ
	qp     driver.QP
	mr     driver.MR
	wr     [1]SendWR
	sge    [1]SGE
	doneCh chan struct{}
}

func newWaitEnv(t *testing.T) *waitEnv {
	t.Helper()
	c, err := NewDriver(loopTransport{}).Open(DeviceInfo{Name: "fuzz0", Transport: "fuzz", AtomicCap: driver.AtomicHCA},
		driver.Options{ArenaSize: 1 << 24})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	e := &waitEnv{c: c}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	e.pd, err = c.AllocPD()
	must(err)
	scq, err := c.CreateCQ(256)
	must(err)
	e.cq = scq.(*CQ)
	e.rcq, err = c.CreateCQ(256)
	must(err)
	e.qp, err = e.pd.CreateQP(driver.QPConfig{SendCQ: e.cq, RecvCQ: e.rcq,
		Cap: driver.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(err)
	for _, s := range []QPAttr{{State: QPInit, AccessFlags: driver.AccessAll, Port: 1},
		{State: QPRTR, DestQPN: 2, MinRNRTimer: 1}, {State: QPRTS, Timeout: 14, RetryCount: 7, RNRRetry: 7}} {
		must(e.qp.Modify(&s))
	}
	e.mr, err = e.pd.AllocMR(4096, driver.AccessAll)
	must(err)
	if e.cq.recv.Load() || !e.rcq.(*CQ).recv.Load() {
		t.Fatal("only the receive CQ is marked as one")
	}
	return e
}

// post posts n signaled Writes, which the loop transport completes at
// once on this goroutine (with whatever status local validation gave:
// only the completions count here).
func (e *waitEnv) post(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		e.sge[0] = SGE{Addr: 0, Length: 8, LKey: e.mr.LKey()}
		e.wr[0] = SendWR{ID: uint64(i), Opcode: OpWrite, Flags: SendSignaled, SGL: e.sge[:], RemoteAddr: 64, RKey: e.mr.RKey()}
		if err := e.qp.PostSend(e.wr[:]); err != nil {
			t.Fatal(err)
		}
	}
}

// waiters starts n goroutines that Wait for one completion each with ctx
// and waits until all are parked; their results come on the channel.
func waiters(t *testing.T, cq *CQ, ctx context.Context, n int) chan error {
	t.Helper()
	res := make(chan error, n)
	for range n {
		go func() {
			var wcs [1]WorkCompletion
			k, err := cq.Wait(ctx, wcs[:])
			if err == nil && k != 1 {
				err = errors.New("no completion")
			}
			res <- err
		}()
	}
	for cq.gw.Load() != int32(n) {
		runtime.Gosched()
	}
	return res
}

// collect takes n results, failing the test if they do not all come
// within a minute (a waiter never woken).
func collect(t *testing.T, res chan error, n int, want error) {
	t.Helper()
	deadline := time.After(time.Minute)
	for i := range n {
		select {
		case err := <-res:
			if !errors.Is(err, want) && !(want == nil && err == nil) {
				t.Fatalf("waiter %d: %v, want %v", i, err, want)
			}
		case <-deadline:
			t.Fatalf("%d of %d waiters not woken", n-i, n)
		}
	}
}

// TestCQWaitGoroutines: eight parked waiters of one CQ, eight completions
// delivered one after another: every waiter returns with one (the token
// is passed on while completions are left).
func TestCQWaitGoroutines(t *testing.T) {
	e := newWaitEnv(t)
	for round := range 20 {
		res := waiters(t, e.cq, context.Background(), 8)
		e.post(t, 8)
		collect(t, res, 8, nil)
		if n := e.cq.gw.Load(); n != 0 {
			t.Fatalf("round %d: %d waiters still counted", round, n)
		}
	}
	// Completions delivered first, then the waiters: none parks.
	e.post(t, 4)
	res := make(chan error, 4)
	for range 4 {
		go func() {
			var wcs [1]WorkCompletion
			_, err := e.cq.Wait(context.Background(), wcs[:])
			res <- err
		}()
	}
	collect(t, res, 4, nil)
}

// TestCQWaitEnds: parked waiters return with their context's error when
// it ends, and with ErrClosed when the CQ is closed.
func TestCQWaitEnds(t *testing.T) {
	e := newWaitEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	res := waiters(t, e.cq, ctx, 4)
	cancel()
	collect(t, res, 4, context.Canceled)

	res = waiters(t, e.cq, context.Background(), 4)
	if err := e.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.cq.Close(); err != nil {
		t.Fatal(err)
	}
	collect(t, res, 4, ErrClosed)
}

// TestCQWaitBecomesRecv: a CQ that a new QP takes as its receive CQ
// (where a peer process may deliver) moves its parked waiters to the
// ring's futex, where a completion still wakes them.
func TestCQWaitBecomesRecv(t *testing.T) {
	e := newWaitEnv(t)
	cq2, err := e.c.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	cq := cq2.(*CQ)
	res := waiters(t, cq, context.Background(), 2)
	qp2, err := e.pd.CreateQP(driver.QPConfig{SendCQ: cq, RecvCQ: cq,
		Cap: driver.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); cq.gw.Load() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters still parked on the channel", cq.gw.Load())
		}
		runtime.Gosched() // both left the channel for the futex
	}
	for _, s := range []QPAttr{{State: QPInit, AccessFlags: driver.AccessAll, Port: 1},
		{State: QPRTR, DestQPN: 2, MinRNRTimer: 1}, {State: QPRTS, Timeout: 14, RetryCount: 7, RNRRetry: 7}} {
		if err := qp2.Modify(&s); err != nil {
			t.Fatal(err)
		}
	}
	e.qp = qp2
	e.post(t, 2)
	collect(t, res, 2, nil)
}

// TestCQWaitCloseAfterDroppedToken: two waiters have checked the ring and
// not yet parked; a completion leaves its token in wch, and the closing's
// token is dropped (wch is full). The waiter that takes the token and the
// completion must pass the wake-up on: the CQ is closed, and the other
// waiter, parked after it, has nobody else to wake it.
func TestCQWaitCloseAfterDroppedToken(t *testing.T) {
	e := newWaitEnv(t)
	arrived := make(chan int, 2)
	gates := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	var next atomic.Int32
	testHookPark = func() {
		i := next.Add(1) - 1
		arrived <- int(i)
		<-gates[i]
	}
	defer func() { testHookPark = nil }()
	res := make(chan error, 2)
	wait := func() {
		var wcs [1]WorkCompletion
		_, err := e.cq.Wait(context.Background(), wcs[:])
		res <- err
	}
	go wait() // the waiter that will park last
	<-arrived
	go wait() // the waiter that takes the token
	<-arrived
	e.post(t, 1) // its token stays in wch: nobody is parked yet
	if err := e.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.cq.Close(); err != nil { // its token is dropped
		t.Fatal(err)
	}
	close(gates[1])
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the waiter that took the token: %v, want its completion", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiter with a token waiting for it did not return")
	}
	close(gates[0])
	collect(t, res, 1, ErrClosed)
}
