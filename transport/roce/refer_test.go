package roce

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/transport/roce/header"
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

// TestReferPark: a batch that refers to registered memory holds its key
// entered until it is sent, lets it go while it waits for a full socket
// (park: a Dereg meanwhile does not wait for it), and on resuming finds
// the key gone and drops what it had (unpark fails), holding nothing.
func TestReferPark(t *testing.T) {
	a, _ := pair(t, 1<<20, verbs.MTU4096)
	d := qpOf(a.ctx, a.qp)
	_, pin, ok := d.ltab.LookupPin(a.mr.LKey(), nil)
	if !ok {
		t.Fatal("no pin for the region's lkey")
	}
	e := &soft.SendEntry{Local: [][]byte{a.mr.Bytes()[:8192]}, Pins: []keytab.Pin{pin}, Len: 8192}
	d.txMu.Lock()
	defer d.txMu.Unlock()
	tx := d.tx
	if tx.buf() == nil {
		t.Fatal("batch full")
	}
	if ok, keyOK := tx.refer(e, 4096, 4096, header.BTHLen); !ok || !keyOK {
		t.Fatalf("refer = %v, %v", ok, keyOK)
	}
	if len(tx.pins) != 1 {
		t.Fatalf("%d pins entered, want 1", len(tx.pins))
	}
	tx.park()
	if !tx.unpark() || tx.parked {
		t.Fatal("unpark of a live key failed")
	}
	tx.park()
	tx.park() // twice: still one Leave
	s := d.ltab.RemoveSlot(a.mr.LKey())
	if !d.ltab.Idle(s, 0) {
		t.Fatal("a parked batch still holds the key")
	}
	if tx.unpark() {
		t.Fatal("unpark entered a removed key")
	}
	if len(tx.pins) != 0 || tx.parked {
		t.Fatalf("after a failed unpark: %d pins, parked %v", len(tx.pins), tx.parked)
	}
	tx.release()
	if !d.ltab.Idle(s, 0) {
		t.Fatal("the key is in use after release")
	}
}
