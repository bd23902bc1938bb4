package rcproto

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// Responses the owner still holds (handed out, not transmitted) count
// against max_dest_rd_atomic: a peer that sends READs and never reads
// their responses is NAKed once the bound is reached, instead of making
// the owner queue responses without end.
func TestResponderHold(t *testing.T) {
	r := NewResponder(RespConfig{FirstPSN: 10, MaxDestRdAtomic: 2})
	var out Packet
	held := 0
	for i := 0; i < 2; i++ {
		p := Packet{Op: OpRead, Seg: SegOnly, PSN: PSN(10 + i)}
		if r.Step(&p) != Execute {
			t.Fatalf("READ %d: not executed", i)
		}
		r.Done(Result{})
		if !r.NextResponse(&out, true) || out.Op != OpReadResp {
			t.Fatalf("READ %d: no response (%v)", i, &out)
		}
		held++
		r.Hold(held)
	}
	p := Packet{Op: OpRead, Seg: SegOnly, PSN: 12}
	if r.Step(&p) != Drop || !r.Failed() {
		t.Fatal("a READ beyond max_dest_rd_atomic with two responses held was not refused")
	}
	if !r.NextResponse(&out, true) || out.Op != OpNak || out.Syn != SynInvalidReq {
		t.Fatalf("got %v, want NAK(invalid request)", &out)
	}
	// Once transmitted, they no longer count.
	r2 := NewResponder(RespConfig{MaxDestRdAtomic: 1})
	for i := 0; i < 3; i++ {
		p := Packet{Op: OpFetchAdd, Seg: SegOnly, PSN: PSN(i), Len: 8}
		if r2.Step(&p) != Execute {
			t.Fatalf("atomic %d refused with nothing held", i)
		}
		r2.Done(Result{Status: rc.Success})
		r2.NextResponse(&out, true)
		r2.Hold(0)
	}
}
