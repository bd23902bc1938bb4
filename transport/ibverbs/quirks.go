//go:build ibverbs

package ibverbs

// Known defects of the Linux kernel's software RDMA drivers, seen on
// Linux 6.1 (Debian 12, 6.1.0-57) by running the same work requests on
// rxe, siw and rdmakit's own transports. Each is worked around here where
// that costs a correct program nothing, and declared in the device's
// capabilities where it cannot be (docs/architecture.md, "Where devices
// differ"). The knowledge stays in this package: a device's driver is
// recognised by its vendor id (siw "bmt", rxe 0xffffff) and consumers only
// ever see capabilities.
//
//   - every device: a zero-length SGE is dropped before posting (siw
//     dereferences NULL in siw_tx_hdt for a Write whose first SGE is empty
//     and whose next one is not: a kernel panic). Free: the SGE moves no
//     bytes. A Read keeps one SGE (iWARP needs exactly one).
//   - siw: siw_try_1seg copies the wrong bytes into a short Read Response
//     (payload up to 32 bytes) whose source crosses a page (it computes the
//     first part's length as bytes-(PAGE_SIZE-off)), yet the Read completes
//     with success. A Read of up to shortReadMax bytes whose remote range
//     crosses a 4 KiB boundary is posted as two Reads cut at the boundary;
//     the first carries a tag and its completion is taken out in Poll, so
//     the caller sees one completion with its id and the whole length.
//   - siw: a zero-length Read Response queued behind another transmission
//     (siw_activate_tx from the IRQ) is sent with the previous work
//     request's SGE length, and the requester ends the connection. Nothing
//     the requester sends avoids it, so siw does not declare
//     CapZeroLengthRead and a zero-length Read is refused when posted.
//   - rxe: a work request that fails locally (invalid lkey) while an
//     earlier Send waits out an RNR NAK leaves both the requester and the
//     completer waiting: nothing completes and the QP stays in RTS. A work
//     request whose lkey this context does not know, or whose range is
//     outside its region, is watched: if neither it nor anything before it
//     completes within rxeStallTimeout, the QP is moved to ERROR (what
//     rxe should have done); the earlier work requests complete with
//     WRFlush and the bad one with LocalProtection.
//   - rxe: a receive posted to a QP already in ERROR is flushed only at the
//     next state change. Receives posted to a QP known to be in ERROR are
//     completed here with WRFlush at once (as for iWARP).

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// quirk is a known driver defect this package works around.
type quirk uint8

const (
	// quirkShortReadPage: split short Reads whose source crosses a page (siw).
	quirkShortReadPage quirk = 1 << iota
	// quirkZeroLengthRead: refuse zero-length Reads (siw).
	quirkZeroLengthRead
	// quirkLocalErrorStall: watch work requests that will fail locally (rxe).
	quirkLocalErrorStall
	// quirkRecvInError: flush receives posted in ERROR here (rxe).
	quirkRecvInError
)

// quirksOff turns workarounds off for contexts opened from then on: only
// the tests that show each defect still exists set it (export_test.go).
var quirksOff quirk

// rxeVendorID is Soft-RoCE's vendor id (RXE_VENDOR_ID).
const rxeVendorID = 0xffffff

// quirksOf names the defects of a device's driver.
func quirksOf(vendor uint32) quirk {
	switch vendor {
	case siwVendorID:
		return quirkShortReadPage | quirkZeroLengthRead
	case rxeVendorID:
		return quirkLocalErrorStall | quirkRecvInError
	}
	return 0
}

const (
	// shortReadMax: Reads up to this many bytes are split at a page
	// boundary of their source on siw (the driver's limit is 32 bytes,
	// MAX_HDR_INLINE; the margin costs nothing).
	shortReadMax = 64
	// splitPage is the boundary a short Read is cut at: every page size a
	// responder can have is a multiple of it.
	splitPage = 4096
)

// rxeStallTimeout is how long a work request that rxe will fail locally
// may go without any completion of its QP before the QP is failed.
var rxeStallTimeout = 2 * time.Second

// shortReadSplit returns where a Read must be cut so that neither part's
// source crosses a 4 KiB boundary, or 0 if it need not be.
func shortReadSplit(wr *verbs.SendWR) uint32 {
	if wr.Opcode != verbs.OpRead || len(wr.SGL) != 1 {
		return 0
	}
	n := wr.SGL[0].Length
	if n < 2 || n > shortReadMax {
		return 0
	}
	off := wr.RemoteAddr & (splitPage - 1)
	if off+uint64(n) <= splitPage {
		return 0
	}
	return uint32(splitPage - off)
}

// ---------------------------------------------------------------- completion fix-ups

// splitRec is a Read posted in two parts: the first part's tag, the
// caller's id and flags, and the first part's length.
type splitRec struct {
	tag, id  uint64
	firstLen uint32
	signaled bool
}

// fixups is a QP's state for completions this package rewrites: split
// Reads (siw) and watched work requests (rxe). Guarded by mu; pending
// counts what is outstanding, and the context counts QPs with pending > 0
// so that Poll looks at nothing while there is none.
type fixups struct {
	mu      sync.Mutex
	pending int

	splits     []splitRec // ring, preallocated
	head, n    int
	tagBase    uint64
	seq        uint64
	dropNext   bool   // the first part of a split failed: drop the second part's flush
	second     bool   // the next send completion should be the second part of split
	secondID   uint64 //   with this id,
	secondAdds uint32 //   whose length gains the first part's

	bad      bool // a work request rxe will fail locally is outstanding
	badID    uint64
	badSince time.Time // when it was posted or the QP last completed anything
	stalled  bool      // the QP was failed for it: its flush becomes LocalProtection
	timer    *time.Timer
}

func (f *fixups) busy() bool { return f.n > 0 || f.dropNext || f.second || f.bad || f.stalled }

// update adjusts the context's count after f changed; f.mu is held.
func (q *qp) fixUpdateLocked() {
	f := &q.fix
	b := f.busy()
	if b && f.pending == 0 {
		f.pending = 1
		q.d.fixQPs.Add(1)
	} else if !b && f.pending != 0 {
		f.pending = 0
		q.d.fixQPs.Add(-1)
	}
}

// fixReset forgets all fix-up state (RESET, destroy).
func (q *qp) fixReset() {
	f := &q.fix
	f.mu.Lock()
	f.head, f.n = 0, 0
	f.dropNext, f.second, f.bad, f.stalled = false, false, false, false
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	q.fixUpdateLocked()
	f.mu.Unlock()
}

// pushSplit records a split Read and returns the tag for its first part.
// f.mu is held.
func (q *qp) pushSplitLocked(wr *verbs.SendWR, firstLen uint32) (uint64, bool) {
	f := &q.fix
	if f.n == len(f.splits) {
		return 0, false
	}
	f.seq++
	tag := f.tagBase | f.seq&0xfffff
	f.splits[(f.head+f.n)%len(f.splits)] = splitRec{tag: tag, id: wr.ID, firstLen: firstLen, signaled: wr.Flags&verbs.SendSignaled != 0}
	f.n++
	return tag, true
}

// unpushSplitsLocked forgets the last k splits (their first parts were not
// posted).
func (q *qp) unpushSplitsLocked(k int) {
	q.fix.n -= k
}

// fixCompletions rewrites the device's completions in place where a quirk
// workaround needs it and returns how many remain. Called by Poll only
// while some QP of the context has fix-up state.
func (d *ctxDriver) fixCompletions(c *cq, wcs []verbs.WorkCompletion) int {
	out := 0
	for i := range wcs {
		wc := wcs[i]
		d.mu.Lock()
		q := d.qpNums[wc.QPNum]
		d.mu.Unlock()
		if q != nil && c == q.scq && (q.scq != q.rcq || wc.Opcode < verbs.WCRecv) && !q.fixSend(&wc) {
			continue
		}
		wcs[out] = wc
		out++
	}
	return out
}

// fixSend looks at one send completion of q; false drops it.
func (q *qp) fixSend(wc *verbs.WorkCompletion) bool {
	f := &q.fix
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pending == 0 {
		return true
	}
	defer q.fixUpdateLocked()
	keep := true
	switch {
	case f.dropNext:
		// The second part of a split whose first part failed: the caller
		// has had the error under its own id.
		f.dropNext = false
		keep = false
	case f.n > 0 && wc.WRID == f.splits[f.head].tag:
		r := f.splits[f.head]
		f.head = (f.head + 1) % len(f.splits)
		f.n--
		if wc.Status == verbs.StatusSuccess {
			if r.signaled {
				f.second, f.secondID, f.secondAdds = true, r.id, r.firstLen
			}
			keep = false
		} else {
			wc.WRID = r.id
			f.dropNext = true
		}
	case f.second:
		f.second = false
		if wc.WRID == f.secondID && wc.Status == verbs.StatusSuccess && wc.ByteLen != 0 {
			wc.ByteLen += f.secondAdds
		}
	}
	if f.bad || f.stalled {
		f.badSince = time.Now()
		if keep && wc.WRID == f.badID && wc.Status != verbs.StatusSuccess {
			if f.stalled && wc.Status == verbs.StatusWRFlush {
				wc.Status = verbs.StatusLocalProtection
			}
			f.bad, f.stalled = false, false
			if f.timer != nil {
				f.timer.Stop()
				f.timer = nil
			}
		}
	}
	return keep
}

// ---------------------------------------------------------------- rxe: local errors behind an RNR wait

// lkeyRange is a registered region, for the post-time lkey check on rxe.
type lkeyRange struct {
	addr, n uint64
	pd      *pdT
}

// addLKey and dropLKey keep the context's lkey table (copy on write; read
// without locks when posting).
func (d *ctxDriver) addLKey(lkey uint32, r lkeyRange) {
	if d.quirks&quirkLocalErrorStall == 0 {
		return
	}
	d.lkeyMu.Lock()
	defer d.lkeyMu.Unlock()
	old := d.lkeys.Load()
	m := make(map[uint32]lkeyRange, len(*old)+1)
	for k, v := range *old {
		m[k] = v
	}
	m[lkey] = r
	d.lkeys.Store(&m)
}

func (d *ctxDriver) dropLKey(lkey uint32) {
	if d.quirks&quirkLocalErrorStall == 0 {
		return
	}
	d.lkeyMu.Lock()
	defer d.lkeyMu.Unlock()
	old := d.lkeys.Load()
	m := make(map[uint32]lkeyRange, len(*old))
	for k, v := range *old {
		if k != lkey {
			m[k] = v
		}
	}
	d.lkeys.Store(&m)
}

// failsLocally reports whether the device will refuse wr's local memory:
// an SGE whose lkey this context did not hand out to the QP's PD, or whose
// range lies outside the region. Inline data is not looked up.
func (q *qp) failsLocally(wr *verbs.SendWR) bool {
	if wr.Flags&verbs.SendInline != 0 {
		return false
	}
	m := *q.d.lkeys.Load()
	for _, sg := range wr.SGL {
		if sg.Length == 0 {
			continue
		}
		r, ok := m[sg.LKey]
		if !ok || r.pd != q.pd || sg.Addr < r.addr || sg.Addr+uint64(sg.Length) > r.addr+r.n {
			return true
		}
	}
	return false
}

// watchLocked starts watching a work request rxe will fail, before it is
// posted, and reports whether it did; q.fix.mu is held.
func (q *qp) watchLocked(id uint64) bool {
	f := &q.fix
	if f.bad || f.stalled {
		return false // the first one decides; later ones flush behind it
	}
	f.bad, f.badID, f.badSince = true, id, time.Now()
	f.timer = time.AfterFunc(rxeStallTimeout, q.checkStall)
	q.fixUpdateLocked()
	return true
}

// unwatchLocked forgets a watched work request the device refused to
// post; q.fix.mu is held.
func (q *qp) unwatchLocked() {
	f := &q.fix
	f.bad = false
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	q.fixUpdateLocked()
}

// checkStall runs when a watched work request has been outstanding for
// rxeStallTimeout: if its QP completed nothing in that time, rxe is stuck
// and the QP is failed.
func (q *qp) checkStall() {
	f := &q.fix
	f.mu.Lock()
	if !f.bad {
		f.mu.Unlock()
		return
	}
	if wait := rxeStallTimeout - time.Since(f.badSince); wait > 0 {
		f.timer = time.AfterFunc(wait, q.checkStall)
		f.mu.Unlock()
		return
	}
	f.bad, f.stalled, f.timer = false, true, nil
	q.fixUpdateLocked()
	f.mu.Unlock()
	q.smu.Lock()
	if q.c != nil && !q.fatal.Load() {
		if err := q.c.modifyState(ibvQPSErr); err == nil {
			q.fatal.Store(true)
		}
	}
	q.smu.Unlock()
}

// newTagBase picks a QP's split tag space: random high bits, so a tag
// never meets a caller's id in practice.
func newTagBase() uint64 { return rand.Uint64() &^ 0xfffff }
