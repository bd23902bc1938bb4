package conformance

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// BenchSizes are the message sizes every transport is measured at.
var BenchSizes = []int{8, 4096, 65536, 1 << 20}

// Pair is two connected queue pairs in one process, for benchmarks and
// examples: A and B each with a context, PD, CQs and a 2×BufSize region.
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

// Bench runs the standard verbs benchmarks on device.
func Bench(b *testing.B, device string) {
	for _, op := range []string{"write", "read", "send"} {
		for _, n := range BenchSizes {
			b.Run(fmt.Sprintf("%s_lat/%d", op, n), func(b *testing.B) { benchLat(b, device, op, n) })
		}
	}
	for _, op := range []string{"write", "read", "send"} {
		for _, n := range BenchSizes {
			b.Run(fmt.Sprintf("%s_bw/%d", op, n), func(b *testing.B) { benchBW(b, device, op, n) })
		}
	}
}

func fatal(b *testing.B, err error) {
	if err != nil {
		b.Fatal(err)
	}
}

// benchLat measures latency as perftest defines it: half a round trip of
// write or send ping-pong, the full operation for read.
func benchLat(b *testing.B, device, op string, n int) {
	p, err := NewPair(device, 2*n, 16)
	fatal(b, err)
	defer p.Close()
	b.ReportAllocs()
	switch op {
	case "read":
		wr := []verbs.SendWR{{Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.A.MR.SGE(0, n)}, RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()}}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			fatal(b, p.A.QP.PostSend(wr))
			fatal(b, p.A.WaitSend(1))
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "usec")
	case "write":
		// Like perftest's write_lat: each side writes n bytes whose last byte
		// is a sequence number into the other's receive half, and spins on
		// its own receive half for the peer's next number.
		mkwr := func(from, to *End) []verbs.SendWR {
			fl := verbs.SendSignaled
			if n <= 256 {
				fl |= verbs.SendInline
			}
			return []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: fl, SGL: []verbs.SGE{from.MR.SGE(0, n)}, RemoteAddr: to.MR.Addr() + uint64(n), RKey: to.MR.RKey()}}
		}
		wa, wb := mkwr(p.A, p.B), mkwr(p.B, p.A)
		seqAt := 2*n - 4 // the 32-bit word holding the last byte
		wait := func(e *End, seq byte) bool {
			m := e.MR.Bytes()
			deadline := time.Now().Add(10 * time.Second)
			for spins := 0; byte(sys.Load32(m, seqAt)>>24) != seq; spins++ {
				if spins&0x3f == 0x3f {
					if time.Now().After(deadline) {
						return false
					}
					runtime.Gosched()
				}
			}
			return true
		}
		pong := func(e *End, w []verbs.SendWR, seq byte) error {
			e.MR.Bytes()[n-1] = seq
			if err := e.QP.PostSend(w); err != nil {
				return err
			}
			return e.WaitSend(1)
		}
		done := make(chan error, 1)
		go func() {
			for i := 0; i < b.N; i++ {
				seq := byte(i + 1)
				if !wait(p.B, seq) {
					done <- fmt.Errorf("write %d never arrived", i)
					return
				}
				if err := pong(p.B, wb, seq); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			seq := byte(i + 1)
			fatal(b, pong(p.A, wa, seq))
			if !wait(p.A, seq) {
				b.Fatalf("write %d never came back", i)
			}
		}
		b.StopTimer()
		fatal(b, <-done)
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/2e3/float64(b.N), "usec")
	case "send":
		sa := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.A.MR.SGE(0, n)}}}
		sb := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.B.MR.SGE(0, n)}}}
		if n <= 256 {
			sa[0].Flags |= verbs.SendInline
			sb[0].Flags |= verbs.SendInline
		}
		ra := []verbs.RecvWR{{SGL: []verbs.SGE{p.A.MR.SGE(0, n)}}}
		rb := []verbs.RecvWR{{SGL: []verbs.SGE{p.B.MR.SGE(0, n)}}}
		for i := 0; i < 8; i++ {
			fatal(b, p.A.QP.PostRecv(ra))
			fatal(b, p.B.QP.PostRecv(rb))
		}
		done := make(chan error, 1)
		go func() {
			for i := 0; i < b.N; i++ {
				if err := p.B.WaitRecv(1); err != nil {
					done <- err
					return
				}
				p.B.QP.PostRecv(rb)
				if err := p.B.QP.PostSend(sb); err != nil {
					done <- err
					return
				}
				if err := p.B.WaitSend(1); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			fatal(b, p.A.QP.PostSend(sa))
			fatal(b, p.A.WaitSend(1))
			fatal(b, p.A.WaitRecv(1))
			fatal(b, p.A.QP.PostRecv(ra))
		}
		b.StopTimer()
		select {
		case err := <-done:
			fatal(b, err)
		case <-time.After(10 * time.Second):
			b.Fatal("responder did not finish")
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/2e3/float64(b.N), "usec")
	}
}

// benchBW streams operations with up to depth outstanding, as perftest's
// *_bw tests do with tx depth 128, completions signaled every depth/4.
func benchBW(b *testing.B, device, op string, n int) {
	const depth = 128
	p, err := NewPair(device, n, depth)
	fatal(b, err)
	defer p.Close()
	b.ReportAllocs()
	b.SetBytes(int64(n))
	var opc verbs.Opcode
	switch op {
	case "write":
		opc = verbs.OpWrite
	case "read":
		opc = verbs.OpRead
	case "send":
		opc = verbs.OpSend
	}
	const every = depth / 4
	wr := []verbs.SendWR{{Opcode: opc, SGL: []verbs.SGE{p.A.MR.SGE(0, n)}, RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()}}
	rwr := []verbs.RecvWR{{SGL: []verbs.SGE{p.B.MR.SGE(0, n)}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recvDone := make(chan error, 1)
	if op == "send" {
		for i := 0; i < depth; i++ {
			fatal(b, p.B.QP.PostRecv(rwr))
		}
		go func() {
			wcs := make([]verbs.WorkCompletion, 32)
			for got := 0; got < b.N; {
				k, err := p.B.RCQ.Poll(wcs)
				if err != nil {
					recvDone <- err
					return
				}
				for j := 0; j < k; j++ {
					if wcs[j].Status != verbs.StatusSuccess {
						recvDone <- wcs[j].Err()
						return
					}
					p.B.QP.PostRecv(rwr)
				}
				got += k
				if k == 0 {
					if ctx.Err() != nil {
						recvDone <- nil
						return
					}
					runtime.Gosched()
				}
			}
			recvDone <- nil
		}()
	}
	b.ResetTimer()
	posted, completed := 0, 0
	wcs := make([]verbs.WorkCompletion, 16)
	for completed < b.N {
		for posted < b.N && posted-completed < depth {
			wr[0].Flags = 0
			if (posted+1)%every == 0 || posted == b.N-1 {
				wr[0].Flags = verbs.SendSignaled
			}
			fatal(b, p.A.QP.PostSend(wr))
			posted++
		}
		k, err := p.A.SCQ.Poll(wcs)
		fatal(b, err)
		for j := 0; j < k; j++ {
			if wcs[j].Status != verbs.StatusSuccess {
				b.Fatal(wcs[j].Err())
			}
			c := (completed/every + 1) * every
			if c > b.N {
				c = b.N
			}
			completed = c
		}
		if k == 0 {
			runtime.Gosched()
		}
	}
	b.StopTimer()
	if op == "send" {
		fatal(b, <-recvDone)
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
}
