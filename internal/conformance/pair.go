package conformance

import (
	"context"
	"runtime"

	"github.com/rdmakit/rdmakit/verbs"
)

// Pair is two connected queue pairs in one process, for tests and
// examples (the Go benchmarks run perftest's loops: perftest.Bench): A and B each with a context, PD, CQs and a 2×BufSize region.
type Pair struct {
	A, B *End
}

// End is one side of a Pair.
type End struct {
	Ctx    *verbs.Context
	PD     *verbs.PD
	SCQ    *verbs.CQ
	RCQ    *verbs.CQ
	QP     *verbs.QP
	MR     *verbs.MR
	remote *verbs.MR
	wcs    []verbs.WorkCompletion
}

// NewPair connects two QPs on device, each with a bufSize region.
func NewPair(device string, bufSize, depth int) (*Pair, error) {
	mk := func() (*End, error) {
		ctx, err := verbs.Open(device, verbs.Options{})
		if err != nil {
			return nil, err
		}
		pd, _ := ctx.AllocPD()
		scq, err := ctx.CreateCQ(depth * 2)
		if err != nil {
			return nil, err
		}
		rcq, _ := ctx.CreateCQ(depth * 2)
		qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq, Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth, MaxInlineData: 256}})
		if err != nil {
			return nil, err
		}
		mr, err := pd.AllocMR(bufSize, verbs.AccessAll)
		if err != nil {
			return nil, err
		}
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
			return nil, err
		}
		return &End{Ctx: ctx, PD: pd, SCQ: scq, RCQ: rcq, QP: qp, MR: mr, wcs: make([]verbs.WorkCompletion, 64)}, nil
	}
	a, err := mk()
	if err != nil {
		return nil, err
	}
	b, err := mk()
	if err != nil {
		a.Ctx.Close()
		return nil, err
	}
	pa, pb := verbs.RandomPSN(), verbs.RandomPSN()
	for _, s := range []struct {
		e, r   *End
		sp, rp uint32
	}{{a, b, pa, pb}, {b, a, pb, pa}} {
		if err := s.e.QP.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: s.r.QP.Num(), RQPSN: s.rp, AH: verbs.AddressHandle{Dest: s.r.QP.Address()}, MinRNRTimer: 1}); err != nil {
			return nil, err
		}
	}
	for _, s := range []struct {
		e  *End
		sp uint32
	}{{a, pa}, {b, pb}} {
		if err := s.e.QP.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: s.sp, Timeout: 14, RetryCount: 7, RNRRetry: 7}); err != nil {
			return nil, err
		}
	}
	a.remote, b.remote = b.MR, a.MR
	return &Pair{A: a, B: b}, nil
}

// Close releases both sides.
func (p *Pair) Close() {
	p.A.Ctx.Close()
	p.B.Ctx.Close()
}

// WaitSend polls the send CQ (spinning) for n completions and fails on error.
func (e *End) WaitSend(n int) error { return e.wait(e.SCQ, n) }

// WaitRecv polls the receive CQ for n completions.
func (e *End) WaitRecv(n int) error { return e.wait(e.RCQ, n) }

func (e *End) wait(cq *verbs.CQ, n int) error {
	for got := 0; got < n; {
		// Wait spins briefly, then sleeps: asynchronous transports (tcp)
		// need the CPU for their reader goroutines on a small machine.
		k, err := cq.Wait(context.Background(), e.wcs[:min(len(e.wcs), n-got)])
		if err != nil {
			return err
		}
		for _, w := range e.wcs[:k] {
			if w.Status != verbs.StatusSuccess {
				return w.Err()
			}
		}
		got += k
		if k == 0 {
			runtime.Gosched()
		}
	}
	return nil
}
