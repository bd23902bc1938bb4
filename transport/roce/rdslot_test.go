package roce

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/rcproto"
)

// The most READ responses the engine queues at once fit in rdSlots: a
// peer at the largest MaxDestRdAtomic that has 255 READs answered, repeats
// them and sends 255 new ones gets 510 queued responses, each
// taking the next slot; none may share one (a later packet of the older
// response would read the newer READ's memory).
func TestReadSlotsCoverQueuedResponses(t *testing.T) {
	const max = 255
	r := rcproto.NewResponder(rcproto.RespConfig{FirstPSN: 0, MTU: 1024, MaxDestRdAtomic: max})
	var seq uint64
	exec := func(p *rcproto.Packet) bool {
		if r.Step(p) != rcproto.Execute {
			return false
		}
		r.Done(rcproto.Result{Status: rc.Success, Ref: seq})
		seq++
		return true
	}
	psn := rcproto.PSN(0)
	for range max {
		if !exec(&rcproto.Packet{Op: rcproto.OpRead, Seg: rcproto.SegOnly, PSN: psn, Len: 8}) {
			t.Fatal("READ refused")
		}
		psn = psn.Add(1)
	}
	var out rcproto.Packet
	for r.NextResponse(&out, true) {
	}
	for i := range rcproto.PSN(max) {
		exec(&rcproto.Packet{Op: rcproto.OpRead, Seg: rcproto.SegOnly, PSN: i, Len: 8})
	}
	for range max {
		if !exec(&rcproto.Packet{Op: rcproto.OpRead, Seg: rcproto.SegOnly, PSN: psn, Len: 8}) {
			break
		}
		psn = psn.Add(1)
	}
	used := map[uint64]uint64{}
	n := 0
	for r.NextResponse(&out, true) {
		if out.Op != rcproto.OpReadResp {
			continue
		}
		n++
		if old, ok := used[out.Ref%rdSlots]; ok && old != out.Ref {
			t.Fatalf("READs %d and %d share slot %d (%d responses queued)", old, out.Ref, out.Ref%rdSlots, n)
		}
		used[out.Ref%rdSlots] = out.Ref
	}
	t.Logf("%d READ responses queued at once", n)
}
