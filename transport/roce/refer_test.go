package roce

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestWriteFromMR: Writes and Sends whose payloads are sent from
// registered memory in place (gather lists of several segments, packets
// that span segments, lengths that need a pad, a short payload that is
// copied) arrive intact, and once they completed nothing holds the
// source region's key: the batch let go of every key it entered.
func TestWriteFromMR(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.MTU1024)
	src := a.mr.Bytes()
	fill(src, 7)
	cases := [][]int{{100}, {600}, {1024}, {1000, 5000, 3}, {511, 2, 4096, 1}, {64 << 10}, {300 << 10, 77}}
	for i, segs := range cases {
		var sgl []verbs.SGE
		off, total := 0, 0
		for _, n := range segs {
			sgl = append(sgl, a.mr.SGE(off, n))
			off += n + 13 // the segments are not adjacent
			total += n
		}
		var want []byte
		for _, s := range sgl {
			o := int(s.Addr - a.mr.Addr())
			want = append(want, src[o:o+int(s.Length)]...)
		}
		dst := b.mr.Bytes()[512<<10:]
		clear(dst[:total])
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl,
			RemoteAddr: b.mr.Addr() + 512<<10, RKey: b.mr.RKey()})
		a.wait(a.scq, 1, 10*time.Second)
		sameBytes(t, "written", dst[:total], want)
	}
	d := qpOf(a.ctx, a.qp)
	d.txMu.Lock()
	held := len(d.tx.pins)
	d.txMu.Unlock()
	if held != 0 {
		t.Fatalf("%d keys entered after the sends", held)
	}
	// Nothing touches the region now: removed, its slot is idle at once.
	if s := d.ltab.RemoveSlot(a.mr.LKey()); s == 0 || !d.ltab.Idle(s, 0) {
		t.Fatalf("the source region's key is in use after its Writes completed (slot %d)", s)
	}
}
