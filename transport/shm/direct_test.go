package shm_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"github.com/rdmakit/rdmakit/verbs"
)

// Writes, Reads and atomics posted to an empty send queue are executed
// straight from the caller's list (soft.DirectExecutor); these tests pin
// down that a list behaves as it did when every work request was queued.

// pollN polls cq until n completions have arrived and returns them.
func pollN(t *testing.T, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	wcs := make([]verbs.WorkCompletion, 16)
	for spins := 0; len(out) < n; spins++ {
		k, err := cq.Poll(wcs[:min(len(wcs), n-len(out))])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, wcs[:k]...)
		if spins > 1e8 {
			t.Fatalf("%d of %d completions", len(out), n)
		}
	}
	return out
}

func newDirectPair(t *testing.T, size, depth int) *conformance.Pair {
	t.Helper()
	p, err := conformance.NewPair("shm0", size, depth)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A list longer than the send queue fails at the first work request that
// does not fit, as it did when the list was queued; those before it ran.
func TestDirectListLongerThanQueue(t *testing.T) {
	const depth = 16
	p := newDirectPair(t, 1<<16, depth)
	a, b := p.A, p.B
	src := a.MR.Bytes()
	wrs := make([]verbs.SendWR, depth+1)
	for i := range wrs {
		src[i] = byte(i + 1)
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(i, 1)},
			RemoteAddr: b.MR.Addr() + uint64(i), RKey: b.MR.RKey()}
	}
	wrs[depth-1].Flags = verbs.SendSignaled
	err := a.QP.PostSend(wrs)
	var pe *verbs.PostError
	if !errors.Is(err, verbs.ErrQueueFull) || !errors.As(err, &pe) || pe.Index != depth {
		t.Fatalf("posting %d work requests to a queue of %d: %v, want ErrQueueFull at index %d", len(wrs), depth, err, depth)
	}
	if w := pollN(t, a.SCQ, 1)[0]; w.WRID != depth-1 || w.Status != verbs.StatusSuccess {
		t.Fatalf("completion %+v", w)
	}
	if got := b.MR.Bytes()[:depth+1]; !bytes.Equal(got[:depth], src[:depth]) || got[depth] != 0 {
		t.Fatalf("target holds % x, want the first %d bytes of % x", got, depth, src[:depth+1])
	}
}

// A list whose middle work request fails a post-time check: the error
// names its index in the whole list, and the ones before it completed.
func TestDirectPostErrorIndex(t *testing.T) {
	p := newDirectPair(t, 1<<16, 16)
	a, b := p.A, p.B
	wrs := make([]verbs.SendWR, 5)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(8*i, 8)},
			RemoteAddr: b.MR.Addr() + uint64(8*i), RKey: b.MR.RKey()}
	}
	wrs[3].Opcode, wrs[3].RemoteAddr = verbs.OpFetchAndAdd, b.MR.Addr()+4 // misaligned atomic
	err := a.QP.PostSend(wrs)
	var pe *verbs.PostError
	if !errors.Is(err, verbs.ErrInvalidArgument) || !errors.As(err, &pe) || pe.Index != 3 {
		t.Fatalf("misaligned atomic at index 3: %v", err)
	}
	for i, w := range pollN(t, a.SCQ, 3) {
		if w.WRID != uint64(i) || w.Status != verbs.StatusSuccess {
			t.Fatalf("completion %d: %+v", i, w)
		}
	}
	if n, _ := a.SCQ.Poll(make([]verbs.WorkCompletion, 4)); n != 0 {
		t.Fatalf("%d completions more than the 3 work requests posted", n)
	}
}

// Direct and queued work requests in one list (a Send needs the peer's
// receive) complete in order, and the target sees every byte.
func TestDirectMixedList(t *testing.T) {
	p := newDirectPair(t, 1<<16, 16)
	a, b := p.A, p.B
	if err := b.QP.PostRecv([]verbs.RecvWR{{ID: 77, SGL: []verbs.SGE{b.MR.SGE(1024, 64)}}}); err != nil {
		t.Fatal(err)
	}
	copy(a.MR.Bytes(), "0123456789abcdef")
	wrs := []verbs.SendWR{
		{ID: 0, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 4)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
		{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(4, 4)}},
		{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled | verbs.SendInline, SGL: []verbs.SGE{a.MR.SGE(8, 4)}, RemoteAddr: b.MR.Addr() + 4, RKey: b.MR.RKey()},
		{ID: 3, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(512, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
	}
	if err := a.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	for i, w := range pollN(t, a.SCQ, len(wrs)) {
		if w.WRID != uint64(i) || w.Status != verbs.StatusSuccess {
			t.Fatalf("completion %d: %+v", i, w)
		}
	}
	if r := pollN(t, b.RCQ, 1)[0]; r.WRID != 77 || r.ByteLen != 4 {
		t.Fatalf("receive %+v", r)
	}
	if got := string(b.MR.Bytes()[:8]); got != "012389ab" {
		t.Fatalf("target holds %q", got)
	}
	if got := string(b.MR.Bytes()[1024:1028]); got != "4567" {
		t.Fatalf("receive buffer holds %q", got)
	}
	if got := string(a.MR.Bytes()[512:520]); got != "012389ab" {
		t.Fatalf("read back %q", got)
	}
}

// A bad rkey in the middle of a list: the work requests before it
// succeed, it fails with a remote access error, the rest are flushed.
func TestDirectBadKeyMidList(t *testing.T) {
	p := newDirectPair(t, 1<<16, 16)
	a, b := p.A, p.B
	wrs := make([]verbs.SendWR, 4)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 8)},
			RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}
	}
	wrs[2].RKey ^= 0x5a5a00
	if err := a.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	want := []verbs.Status{verbs.StatusSuccess, verbs.StatusSuccess, verbs.StatusRemoteAccess, verbs.StatusWRFlush}
	for i, w := range pollN(t, a.SCQ, len(wrs)) {
		if w.WRID != uint64(i) || w.Status != want[i] {
			t.Fatalf("completion %d: %+v, want status %s", i, w, want[i])
		}
	}
}

// Two regions of the target in turn, and more bytes than one chunk in
// one list (the peer's key is held across work requests for a chunk at
// most): every byte lands, and the target deregisters both regions at
// once afterwards (nothing left entered).
func TestDirectKeysAndChunks(t *testing.T) {
	const size = 64 << 10
	p := newDirectPair(t, 1<<20, 32)
	a, b := p.A, p.B
	other, err := b.PD.AllocMR(1<<20, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	src := a.MR.Bytes()
	for i := range src {
		src[i] = byte(i * 7)
	}
	var wrs []verbs.SendWR
	for i := range 12 { // 768 KiB: three chunks' worth, the last on other
		mr := b.MR
		if i%3 == 2 {
			mr = other
		}
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(i%8*size, size)},
			RemoteAddr: mr.Addr() + uint64(i%8*size), RKey: mr.RKey()})
	}
	wrs[len(wrs)-1].Flags = verbs.SendSignaled
	if err := a.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	if w := pollN(t, a.SCQ, 1)[0]; w.Status != verbs.StatusSuccess {
		t.Fatal(w.Err())
	}
	for i := range wrs {
		mr := b.MR
		if i%3 == 2 {
			mr = other
		}
		off := i % 8 * size
		if !bytes.Equal(mr.Bytes()[off:off+size], src[off:off+size]) {
			t.Fatalf("write %d did not land", i)
		}
	}
	addr := other.Addr()
	if err := other.Dereg(); err != nil {
		t.Fatal(err)
	}
	fresh, err := b.PD.AllocMR(1<<20, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Addr() != addr {
		t.Fatalf("the deregistered region's memory was not freed (still entered?): new region at %#x, old at %#x", fresh.Addr(), addr)
	}
}

// Atomics in one list run in order, each result in its own buffer.
func TestDirectAtomicList(t *testing.T) {
	p := newDirectPair(t, 1<<16, 16)
	a, b := p.A, p.B
	var wrs []verbs.SendWR
	for i := range 5 {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpFetchAndAdd, SGL: []verbs.SGE{a.MR.SGE(8*i, 8)},
			RemoteAddr: b.MR.Addr() + 64, RKey: b.MR.RKey(), CompareAdd: 10})
	}
	wrs = append(wrs, verbs.SendWR{ID: 5, Opcode: verbs.OpCompareAndSwap, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(40, 8)},
		RemoteAddr: b.MR.Addr() + 64, RKey: b.MR.RKey(), CompareAdd: 50, Swap: 7})
	if err := a.QP.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	if w := pollN(t, a.SCQ, 1)[0]; w.WRID != 5 || w.Status != verbs.StatusSuccess || w.Opcode != verbs.WCCompareAndSwap {
		t.Fatalf("completion %+v", w)
	}
	for i := range 6 {
		if got := binary.LittleEndian.Uint64(a.MR.Bytes()[8*i:]); got != uint64(10*i) {
			t.Fatalf("result %d: %d, want %d", i, got, 10*i)
		}
	}
	if got := binary.LittleEndian.Uint64(b.MR.Bytes()[64:]); got != 7 {
		t.Fatalf("target word %d, want 7", got)
	}
}

// The direct path allocates nothing: a list of Writes and Reads, and
// atomics one at a time, each polled back.
func TestDirectNoAllocs(t *testing.T) {
	p := newDirectPair(t, 1<<16, 64)
	a, b := p.A, p.B
	list := make([]verbs.SendWR, 32)
	for i := range list {
		op := verbs.OpWrite
		if i%2 == 1 {
			op = verbs.OpRead
		}
		list[i] = verbs.SendWR{Opcode: op, SGL: []verbs.SGE{a.MR.SGE(64*i, 64)}, RemoteAddr: b.MR.Addr() + uint64(64*i), RKey: b.MR.RKey()}
	}
	list[31].Flags = verbs.SendSignaled
	fadd := []verbs.SendWR{{Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(4096, 8)},
		RemoteAddr: b.MR.Addr() + 4096, RKey: b.MR.RKey(), CompareAdd: 1}}
	wcs := make([]verbs.WorkCompletion, 1)
	poll := func() {
		for {
			if n, err := a.SCQ.Poll(wcs); err != nil || n == 1 && wcs[0].Status != verbs.StatusSuccess {
				t.Fatal(err, wcs[0].Err())
			} else if n == 1 {
				return
			}
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := a.QP.PostSend(list); err != nil {
			t.Fatal(err)
		}
		poll()
		if err := a.QP.PostSend(fadd); err != nil {
			t.Fatal(err)
		}
		poll()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per list and atomic", allocs)
	}
}

// Work requests of one list on a key the list already used are checked
// against what the earlier one found (the region's bounds and access),
// not looked up again; those checks still fail a request they should:
// past the end of the local or the remote region, a Read into a region
// without local write access after a Write from it, a Read from a remote
// region without remote read access after a Write to it.
func TestDirectSameKeyChecks(t *testing.T) {
	for _, c := range []struct {
		name string
		want verbs.Status
	}{
		{"local past the end", verbs.StatusLocalProtection},
		{"remote past the end", verbs.StatusRemoteAccess},
		{"read into a region without local write", verbs.StatusLocalProtection},
		{"read from a region without remote read", verbs.StatusRemoteAccess},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newDirectPair(t, 1<<16, 16)
			a, b := p.A, p.B
			ro, err := a.PD.AllocMR(4096, verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			wo, err := b.PD.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			lmr, rmr := a.MR, b.MR
			switch c.name {
			case "read into a region without local write":
				lmr = ro
			case "read from a region without remote read":
				rmr = wo
			}
			wrs := []verbs.SendWR{
				{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{lmr.SGE(0, 8)}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()},
				{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{lmr.SGE(8, 8)}, RemoteAddr: rmr.Addr() + 8, RKey: rmr.RKey()},
			}
			switch c.name {
			case "local past the end":
				wrs[1].Opcode = verbs.OpWrite
				wrs[1].SGL[0].Addr = lmr.Addr() + uint64(lmr.Len()) - 4
			case "remote past the end":
				wrs[1].Opcode = verbs.OpWrite
				wrs[1].RemoteAddr = rmr.Addr() + uint64(rmr.Len()) - 4
			}
			if err := a.QP.PostSend(wrs); err != nil {
				t.Fatal(err)
			}
			got := pollN(t, a.SCQ, 2)
			if got[0].Status != verbs.StatusSuccess || got[1].Status != c.want {
				t.Fatalf("completions %+v, %+v; want success, then %s", got[0], got[1], c.want)
			}
		})
	}
}
