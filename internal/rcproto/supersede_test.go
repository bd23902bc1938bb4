package rcproto

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// A repeated READ request (the requester lost a response and asks for
// the rest) supersedes what is left of the queued answer: every response
// PSN goes out once more at most.
func TestRepeatedReadSupersedes(t *testing.T) {
	r := NewResponder(RespConfig{FirstPSN: 100, MTU: 10})
	p := Packet{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 40}
	if r.Step(&p) != Execute {
		t.Fatal("READ not executed")
	}
	r.Done(Result{Status: rc.Success, Ref: 1})
	var out Packet
	if !r.NextResponse(&out, true) || out.PSN != 100 {
		t.Fatalf("first response %v", &out)
	}
	// Lost: 100. The requester asks again from 100 (offset 0).
	p = Packet{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 40}
	if r.Step(&p) != Execute {
		t.Fatal("repeated READ not executed")
	}
	r.Done(Result{Status: rc.Success, Ref: 2})
	var psns []PSN
	for r.NextResponse(&out, true) {
		if out.Ref != 2 {
			t.Fatalf("response of the superseded answer: %v ref %d", &out, out.Ref)
		}
		psns = append(psns, out.PSN)
	}
	if len(psns) != 4 || psns[0] != 100 || psns[3] != 103 {
		t.Fatalf("responses %v, want 100..103 once", psns)
	}
	// The new response's segments are those of the full READ.
	if r.Step(&Packet{Op: OpWrite, Seg: SegOnly, PSN: 104, Len: 1}) != Execute {
		t.Fatal("next request")
	}
}
