package roce

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// side is one end of a test connection.
type side struct {
	t   testing.TB
	ctx *verbs.Context
	pd  *verbs.PD
	scq *verbs.CQ
	rcq *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	psn uint32
	wcs [64]verbs.WorkCompletion
}

func newSide(t testing.TB, ctx *verbs.Context, mrSize int) *side {
	t.Helper()
	s := &side{t: t, ctx: ctx, psn: verbs.RandomPSN()}
	var err error
	check := func(e error) {
		if e != nil {
			t.Helper()
			t.Fatal(e)
		}
	}
	s.pd, err = ctx.AllocPD()
	check(err)
	s.scq, err = ctx.CreateCQ(1024)
	check(err)
	s.rcq, err = ctx.CreateCQ(1024)
	check(err)
	s.qp, err = s.pd.CreateQP(verbs.QPConfig{SendCQ: s.scq, RecvCQ: s.rcq, Cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 64, MaxSendSGE: 4, MaxRecvSGE: 4}})
	check(err)
	s.mr, err = s.pd.AllocMR(mrSize, verbs.AccessAll)
	check(err)
	check(s.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic, Port: 1}))
	return s
}

func openTest(t testing.TB) *verbs.Context {
	t.Helper()
	needDevices(t)
	ctx, err := verbs.Open(testDevice, verbs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

// link connects a and b (timeout 14: 67 ms, retry 7).
func link(t testing.TB, a, b *side, mtu verbs.MTU) {
	t.Helper()
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		x, y := p[0], p[1]
		if err := x.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: mtu, DestQPN: y.qp.Num(), RQPSN: y.psn,
			AH: verbs.AddressHandle{Dest: y.qp.Address()}, MinRNRTimer: 1, MaxDestRdAtomic: 16}); err != nil {
			t.Fatal(err)
		}
		if err := x.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: x.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 16}); err != nil {
			t.Fatal(err)
		}
	}
}

func pair(t testing.TB, mrSize int, mtu verbs.MTU) (a, b *side) {
	a = newSide(t, openTest(t), mrSize)
	b = newSide(t, openTest(t), mrSize)
	link(t, a, b, mtu)
	return a, b
}

func (s *side) post(wrs ...verbs.SendWR) {
	s.t.Helper()
	if err := s.qp.PostSend(wrs); err != nil {
		s.t.Fatal(err)
	}
}

// wait returns n completions of cq, failing after timeout.
func (s *side) wait(cq *verbs.CQ, n int, timeout time.Duration) []verbs.WorkCompletion {
	s.t.Helper()
	var got []verbs.WorkCompletion
	deadline := time.Now().Add(timeout)
	for spins := 0; len(got) < n; spins++ {
		k, err := cq.Poll(s.wcs[:min(len(s.wcs), n-len(got))])
		if err != nil {
			s.t.Fatal(err)
		}
		got = append(got, s.wcs[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				s.t.Fatalf("%d of %d completions after %v", len(got), n, timeout)
			}
			if spins > 1000 {
				time.Sleep(20 * time.Microsecond)
			} else {
				runtime.Gosched()
			}
		}
	}
	for _, wc := range got {
		if wc.Status != verbs.StatusSuccess {
			s.t.Fatalf("wr %d: %v", wc.WRID, wc.Status)
		}
	}
	return got
}

// fill writes a pattern derived from seed.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(i)
	}
}

func sameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		t.Fatalf("%s: differs from byte %d of %d", what, i, len(want))
	}
}

// qpOf is the roce driver of a connected QP of ctx.
func qpOf(ctx *verbs.Context, q *verbs.QP) *qpDriver {
	return (*ctxOf(ctx).ep.qps.Load())[q.Num()]
}
