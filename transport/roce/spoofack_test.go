package roce

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

// An ACK that answers no PSN outstanding (a stray or spoofed one) leaves
// congestion control alone: it neither grows the window nor counts as
// the rate recovering.
func TestSpoofedAckNoCongestionCredit(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.MTU4096)
	// One WRITE done, so the requester has nothing outstanding.
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*time.Second)
	d := qpOf(a.ctx, a.qp)
	d.mu.Lock()
	d.req.SetWindow(8)
	d.mu.Unlock()
	buf := make([]byte, header.Len(header.RCAcknowledge, 0))
	var p header.Packet
	header.Build(&p, buf, header.RCAcknowledge, 0)
	for _, psn := range []uint32{0x400000, 0x7fffff, 0x123456} {
		p.BTH.Encode(&header.BTHFields{Opcode: header.RCAcknowledge, PKey: header.DefaultPKey, DestQP: a.qp.Num(), PSN: psn})
		p.AETH.Encode(header.SynACK|header.CreditsUnlimited, 1)
		d.rxMu.Lock()
		d.response(&p)
		d.rxMu.Unlock()
	}
	d.mu.Lock()
	w := d.req.Window()
	d.mu.Unlock()
	if w != 8 {
		t.Fatalf("window %d after spoofed ACKs, want 8 (unchanged)", w)
	}
}
