package rcproto

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// A repeated READ request is executed again only inside a READ the
// responder executed, and for no more than that READ had left: a peer
// cannot have a response made for PSNs it never used, nor ask a repeat
// for more bytes than the READ named.
func TestRepeatedReadUnknownDropped(t *testing.T) {
	r := NewResponder(RespConfig{FirstPSN: 100, MTU: 10, MaxDestRdAtomic: 4})
	if r.Step(&Packet{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 40}) != Execute {
		t.Fatal("READ not executed")
	}
	r.Done(Result{Status: rc.Success, Ref: 1})
	for _, p := range []Packet{
		{Op: OpRead, Seg: SegOnly, PSN: 99, Len: 10},                           // never used
		{Op: OpRead, Seg: SegOnly, PSN: PSN(100).Add(PSNMask - 5000), Len: 10}, // never used
		{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 1 << 30},                     // more than the READ named
		{Op: OpRead, Seg: SegOnly, PSN: 102, Off: 20, Len: 21},
	} {
		if r.Step(&p) != Drop {
			t.Errorf("repeated READ %v executed", &p)
		}
	}
	// The rest of the READ, asked again, is served.
	if r.Step(&Packet{Op: OpRead, Seg: SegOnly, PSN: 102, Off: 20, Len: 20}) != Execute {
		t.Fatal("repeated READ of the last 2 packets not executed")
	}
}

// Repeats of a READ the responder remembers queue responses up to
// MaxDestRdAtomic only (repeats included): the queue stays bounded
// however often a peer repeats, and the scans over it stay short.
func TestRepeatedReadBounded(t *testing.T) {
	const max = 4
	r := NewResponder(RespConfig{FirstPSN: 100, MTU: 10, MaxDestRdAtomic: max})
	if r.Step(&Packet{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 40}) != Execute {
		t.Fatal("READ not executed")
	}
	r.Done(Result{Status: rc.Success, Ref: 1})
	for i := range 100_000 {
		if r.Step(&Packet{Op: OpRead, Seg: SegOnly, PSN: 100, Len: 40}) == Execute {
			r.Done(Result{Status: rc.Success, Ref: uint64(i + 2)})
		}
	}
	if n := r.qTail - r.qHead; n > max {
		t.Fatalf("%d responses queued after 100000 repeats, want ≤ %d", n, max)
	}
	// The same for a repeated atomic.
	a := NewResponder(RespConfig{FirstPSN: 7, MaxDestRdAtomic: max})
	if a.Step(&Packet{Op: OpFetchAdd, Seg: SegOnly, PSN: 7}) != Execute {
		t.Fatal("atomic not executed")
	}
	a.Done(Result{Status: rc.Success, Value: 3})
	for range 1000 {
		a.Step(&Packet{Op: OpFetchAdd, Seg: SegOnly, PSN: 7})
	}
	if n := a.qTail - a.qHead; n > max {
		t.Fatalf("%d atomic responses queued after 1000 repeats, want ≤ %d", n, max)
	}
	var out Packet
	for a.NextResponse(&out, true) {
		if out.Op != OpAtomicResp || out.Value != 3 {
			t.Fatalf("response %v", &out)
		}
	}
}
