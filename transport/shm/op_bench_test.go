package shm_test

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"github.com/rdmakit/rdmakit/verbs"
)

// BenchmarkOp times one verbs operation on shm0 from PostSend to its
// polled completion, one at a time (latency, like atomic_lat and
// read_lat), and reports its allocations. The profile in
// docs/benchmarks.md comes from these.
func BenchmarkOp(b *testing.B) {
	for _, c := range []struct {
		name string
		op   verbs.Opcode
		n    int
	}{
		{"write8", verbs.OpWrite, 8},
		{"read8", verbs.OpRead, 8},
		{"fadd", verbs.OpFetchAndAdd, 8},
		{"cswap", verbs.OpCompareAndSwap, 8},
	} {
		b.Run(c.name, func(b *testing.B) {
			p, err := conformance.NewPair("shm0", 1<<16, 64)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			a := p.A
			wr := []verbs.SendWR{{Opcode: c.op, Flags: verbs.SendSignaled,
				SGL:        []verbs.SGE{{Addr: a.MR.Addr(), Length: uint32(c.n), LKey: a.MR.LKey()}},
				RemoteAddr: p.B.MR.Addr() + 4096, RKey: p.B.MR.RKey(), CompareAdd: 1}}
			wcs := make([]verbs.WorkCompletion, 4)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := a.QP.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				for {
					n, err := a.SCQ.Poll(wcs)
					if err != nil {
						b.Fatal(err)
					}
					if n > 0 {
						if wcs[0].Status != verbs.StatusSuccess {
							b.Fatal(wcs[0].Err())
						}
						break
					}
				}
			}
		})
	}
}
