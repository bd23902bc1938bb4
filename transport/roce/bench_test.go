package roce

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// BenchmarkWriteBW: 64 KiB Writes, up to 64 outstanding, every 16th
// signaled, between two contexts of this process over loopback.
func BenchmarkWriteBW(b *testing.B) {
	a, p := pair(b, 4<<20, verbs.MTU4096)
	const size, depth, every = 64 << 10, 64, 16
	b.SetBytes(size)
	out := 0
	for i := 0; i < b.N; i++ {
		for out >= depth {
			n, err := a.scq.Poll(a.wcs[:])
			if err != nil {
				b.Fatal(err)
			}
			for _, wc := range a.wcs[:n] {
				if wc.Status != verbs.StatusSuccess {
					b.Fatal(wc.Err())
				}
			}
			out -= n * every
			if n == 0 {
				time.Sleep(time.Microsecond)
			}
		}
		flags := verbs.SendFlags(0)
		if i%every == every-1 {
			flags = verbs.SendSignaled
		}
		off := (i % 64) * size
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: flags, SGL: []verbs.SGE{a.mr.SGE(off, size)},
			RemoteAddr: p.mr.Addr() + uint64(off), RKey: p.mr.RKey()})
		out++
	}
	b.StopTimer()
	// Losses on loopback mean a bug (a bad ICRC, a packet the peer
	// dropped): they show as retransmissions.
	sa, _ := Stats(a.ctx)
	sp, _ := Stats(p.ctx)
	b.ReportMetric(float64(sa.Retransmits), "retransmits")
	b.ReportMetric(float64(sp.RxBadICRC+sp.RxMalformed+sp.RxUnknownQP), "rx-dropped")
}
