//go:build ibverbs

package ibverbs

// Host-side tests of the driver-defect workarounds (quirks.go): what is
// handed to the provider, and how completions are rewritten. They need no
// RDMA device; the guest tests (quirks_test.go) show the same on rxe and
// siw.

import (
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestSendDropsZeroLengthSGEs: the shape that panics siw in Linux 6.1 (a
// Write whose first SGE is empty, the next not) never reaches the provider.
func TestSendDropsZeroLengthSGEs(t *testing.T) {
	w := newWQ(nil, 4, 4, true)
	defer w.free()
	a := verbs.SGE{Addr: 0x1000, Length: 0, LKey: 7}
	b := verbs.SGE{Addr: 0x2000, Length: 64, LKey: 7}
	c := verbs.SGE{Addr: 0x3000, Length: 0, LKey: 9}
	d := verbs.SGE{Addr: 0x4000, Length: 8, LKey: 9}
	for _, tc := range []struct {
		name string
		wr   verbs.SendWR
		want []verbs.SGE
	}{
		{"write empty first", verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a, b}}, []verbs.SGE{b}},
		{"write empty between", verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, SGL: []verbs.SGE{b, c, d}}, []verbs.SGE{b, d}},
		{"send empty first and last", verbs.SendWR{ID: 3, Opcode: verbs.OpSend, SGL: []verbs.SGE{a, d, c}}, []verbs.SGE{d}},
		{"write all empty", verbs.SendWR{ID: 4, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a, c}}, nil},
		{"read keeps one", verbs.SendWR{ID: 5, Opcode: verbs.OpRead, SGL: []verbs.SGE{a}}, []verbs.SGE{a}},
		{"read drops empty", verbs.SendWR{ID: 6, Opcode: verbs.OpRead, SGL: []verbs.SGE{c, b}}, []verbs.SGE{b}},
		{"inline empty first", verbs.SendWR{ID: 7, Opcode: verbs.OpWrite, Flags: verbs.SendInline, SGL: []verbs.SGE{a, b}}, []verbs.SGE{b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.setSend(1, &tc.wr, wrOpcodes[tc.wr.Opcode], uint32(tc.wr.Flags))
			id, op, _, _, got := w.sendSlot(1)
			if id != tc.wr.ID || op != wrOpcodes[tc.wr.Opcode] {
				t.Fatalf("slot holds id %d opcode %d", id, op)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("SGEs %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("SGEs %+v, want %+v", got, tc.want)
				}
				if got[i].Length == 0 && tc.wr.Opcode != verbs.OpRead {
					t.Fatalf("a zero-length SGE reaches the provider: %+v", got)
				}
			}
		})
	}
}

func TestShortReadSplit(t *testing.T) {
	rd := func(raddr uint64, n uint32) *verbs.SendWR {
		return &verbs.SendWR{Opcode: verbs.OpRead, RemoteAddr: raddr, SGL: []verbs.SGE{{Addr: 0x10000, Length: n, LKey: 1}}}
	}
	for _, tc := range []struct {
		wr   *verbs.SendWR
		want uint32
	}{
		{rd(0x7000-10, 29), 10},
		{rd(0x7000-1, 2), 1},
		{rd(0x7000-63, 64), 63},
		{rd(0x7000-10, 10), 0},  // ends at the boundary
		{rd(0x7000, 29), 0},     // starts at it
		{rd(0x7000-10, 65), 0},  // long enough for the driver's correct path
		{rd(0x7000-10, 1), 0},   // one byte never crosses
		{rd(0x7000-32, 64), 32}, //
		{&verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: 0x7000 - 10, SGL: []verbs.SGE{{Length: 29}}}, 0},
	} {
		if got := shortReadSplit(tc.wr); got != tc.want {
			t.Errorf("%s of %d at %#x: cut at %d, want %d", tc.wr.Opcode, tc.wr.SGL[0].Length, tc.wr.RemoteAddr, got, tc.want)
		}
	}
	// The parts as the provider sees them.
	w := newWQ(nil, 4, 1, true)
	defer w.free()
	wr := rd(0x7000-10, 29)
	wr.ID, wr.RKey = 42, 5
	w.setReadPart(0, wr, 0xabc, uint32(verbs.SendSignaled), 0, 10)
	w.setReadPart(1, wr, wr.ID, 0, 10, 19)
	for i, want := range []struct {
		id, raddr, laddr uint64
		n                uint32
	}{{0xabc, 0x7000 - 10, 0x10000, 10}, {42, 0x7000, 0x10000 + 10, 19}} {
		id, op, _, raddr, sg := w.sendSlot(i)
		if id != want.id || op != ibvWROpRead || raddr != want.raddr || len(sg) != 1 || sg[0].Addr != want.laddr || sg[0].Length != want.n || sg[0].LKey != 1 {
			t.Errorf("part %d: id %#x op %d raddr %#x sges %+v", i, id, op, raddr, sg)
		}
		if raddr&^(splitPage-1) != (raddr+uint64(want.n)-1)&^(splitPage-1) {
			t.Errorf("part %d still crosses a page", i)
		}
	}
}

// fakeQP is a QP with no device behind it, for the completion fix-ups.
func fakeQP(quirks quirk, signalAll bool) (*ctxDriver, *cq, *qp) {
	d := &ctxDriver{qpNums: map[uint32]*qp{}, quirks: quirks}
	c := &cq{d: d}
	q := &qp{d: d, num: 0x11, scq: c, rcq: c, quirks: quirks, signalAll: signalAll}
	q.fix.tagBase = newTagBase()
	d.qpNums[q.num] = q
	return d, c, q
}

func (q *qp) split() uint64 {
	q.fix.mu.Lock()
	defer q.fix.mu.Unlock()
	tag := q.splitTagLocked()
	q.fixUpdateLocked()
	return tag
}

// poll runs what Poll runs on the device's completions.
func (d *ctxDriver) poll(c *cq, wcs []verbs.WorkCompletion) []verbs.WorkCompletion {
	if !d.needsFix(wcs) {
		return wcs
	}
	return wcs[:d.fixCompletions(c, wcs)]
}

// TestSplitCompletions: a split Read completes as one Read would: once,
// with the caller's id, an error in either part reported once under it.
func TestSplitCompletions(t *testing.T) {
	ok, flush, rerr := verbs.StatusSuccess, verbs.StatusWRFlush, verbs.StatusRemoteAccess
	wc := func(id uint64, st verbs.Status) verbs.WorkCompletion {
		return verbs.WorkCompletion{WRID: id, Status: st, Opcode: verbs.WCRead, ByteLen: 4, QPNum: 0x11}
	}
	same := func(t *testing.T, got []verbs.WorkCompletion, want ...verbs.WorkCompletion) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("completions %+v, want %+v", got, want)
		}
		for i := range got {
			if got[i].WRID != want[i].WRID || got[i].Status != want[i].Status {
				t.Fatalf("completions %+v, want %+v", got, want)
			}
		}
	}
	t.Run("success", func(t *testing.T) {
		d, c, q := fakeQP(quirkShortReadPage, false)
		q.split()
		if d.fixQPs.Load() != 0 {
			t.Fatal("a split leaves state behind")
		}
		same(t, d.poll(c, []verbs.WorkCompletion{wc(1, ok), wc(7, ok)}), wc(1, ok), wc(7, ok))
	})
	t.Run("first part fails", func(t *testing.T) {
		d, c, q := fakeQP(quirkShortReadPage, false)
		tag := q.split()
		same(t, d.poll(c, []verbs.WorkCompletion{wc(1, ok), wc(tag, rerr)}), wc(1, ok))
		same(t, d.poll(c, []verbs.WorkCompletion{wc(7, flush), wc(8, flush)}), wc(7, rerr), wc(8, flush))
		if d.fixQPs.Load() != 0 {
			t.Fatal("fix-up state left behind")
		}
	})
	t.Run("second part fails", func(t *testing.T) {
		d, c, q := fakeQP(quirkShortReadPage, false)
		q.split()
		same(t, d.poll(c, []verbs.WorkCompletion{wc(7, rerr), wc(8, flush)}), wc(7, rerr), wc(8, flush))
	})
	t.Run("signal all", func(t *testing.T) {
		d, c, q := fakeQP(quirkShortReadPage, true)
		t1, t2 := q.split(), q.split()
		if d.fixQPs.Load() != 1 {
			t.Fatal("first parts on a signal-all QP not counted")
		}
		same(t, d.poll(c, []verbs.WorkCompletion{wc(t1, ok), wc(7, ok), wc(t2, ok)}), wc(7, ok))
		same(t, d.poll(c, []verbs.WorkCompletion{wc(7, ok)}), wc(7, ok))
		if d.fixQPs.Load() != 0 {
			t.Fatal("fix-up state left behind")
		}
	})
	t.Run("receives untouched", func(t *testing.T) {
		d, c, q := fakeQP(quirkShortReadPage, false)
		tag := q.split()
		r := verbs.WorkCompletion{WRID: tag, Status: flush, Opcode: verbs.WCRecv, QPNum: 0x11}
		got := d.poll(c, []verbs.WorkCompletion{r, wc(5, ok)})
		if len(got) != 2 || got[0].Opcode != verbs.WCRecv {
			t.Fatalf("%+v", got)
		}
	})
}

// TestStallRewrite: once the stall watch failed a QP, the watched work
// request's flush is reported as the local protection error it is.
func TestStallRewrite(t *testing.T) {
	d, c, q := fakeQP(quirkLocalErrorStall, false)
	q.fix.mu.Lock()
	q.fix.bad, q.fix.badID, q.fix.stalled = false, 5, true
	q.fixUpdateLocked()
	q.fix.mu.Unlock()
	got := []verbs.WorkCompletion{
		{WRID: 4, Status: verbs.StatusWRFlush, Opcode: verbs.WCSend, QPNum: 0x11},
		{WRID: 5, Status: verbs.StatusWRFlush, Opcode: verbs.WCSend, QPNum: 0x11},
	}
	if n := d.fixCompletions(c, got); n != 2 || got[0].Status != verbs.StatusWRFlush || got[1].Status != verbs.StatusLocalProtection {
		t.Fatalf("%+v", got)
	}
	if d.fixQPs.Load() != 0 {
		t.Fatal("fix-up state left behind")
	}
}

// TestFailsLocally: the post-time check rxe's stall watch relies on.
func TestFailsLocally(t *testing.T) {
	d := &ctxDriver{quirks: quirkLocalErrorStall}
	d.lkeys.Store(&map[uint32]lkeyRange{})
	pd, other := &pdT{d: d}, &pdT{d: d}
	d.addLKey(10, lkeyRange{addr: 0x1000, n: 0x1000, pd: pd})
	d.addLKey(11, lkeyRange{addr: 0x8000, n: 0x100, pd: other})
	q := &qp{d: d, pd: pd}
	for _, tc := range []struct {
		sge   verbs.SGE
		flags verbs.SendFlags
		want  bool
	}{
		{verbs.SGE{Addr: 0x1000, Length: 0x1000, LKey: 10}, 0, false},
		{verbs.SGE{Addr: 0x1800, Length: 0x801, LKey: 10}, 0, true},
		{verbs.SGE{Addr: 0x0fff, Length: 2, LKey: 10}, 0, true},
		{verbs.SGE{Addr: 0x1000, Length: 8, LKey: 12}, 0, true},
		{verbs.SGE{Addr: 0x8000, Length: 8, LKey: 11}, 0, true}, // another PD
		{verbs.SGE{Addr: 0x1000, Length: 8, LKey: 12}, verbs.SendInline, false},
		{verbs.SGE{Addr: 0, Length: 0, LKey: 12}, 0, false},
	} {
		wr := &verbs.SendWR{Opcode: verbs.OpSend, Flags: tc.flags, SGL: []verbs.SGE{tc.sge}}
		if got := q.failsLocally(wr); got != tc.want {
			t.Errorf("%+v flags %d: fails %v, want %v", tc.sge, tc.flags, got, tc.want)
		}
	}
	// The last lkey looked up is cached; a change to the table retires it.
	if q.failsLocally(&verbs.SendWR{SGL: []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: 10}}}) {
		t.Fatal("a registered lkey fails")
	}
	d.dropLKey(10)
	if !q.failsLocally(&verbs.SendWR{SGL: []verbs.SGE{{Addr: 0x1000, Length: 8, LKey: 10}}}) {
		t.Error("a deregistered lkey passes")
	}
}
