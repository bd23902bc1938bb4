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
//     crosses a 4 KiB boundary is posted as two Reads cut at the boundary:
//     the first unsignaled under a tag, the second with the caller's id and
//     flags (see fixups), so the caller sees what one Read would give it.
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

// fixups is a QP's state for completions this package rewrites: split
// Reads (siw) and watched work requests (rxe). Guarded by mu; pending says
// whether anything is outstanding, and the context counts QPs with pending
// set so that Poll looks at nothing while there is none.
//
// A split Read's first part is unsignaled (the caller's flags, less
// SendSignaled) and its id is a tag: tagBase (random high bits, so that a
// tag never meets a caller's id in practice) | a sequence number. It
// completes only on error, or on a QP that signals everything: Poll drops
// that completion and, for an error, gives its status to the next send
// completion of the QP, which is the second part's flush under the
// caller's id. Nothing is recorded per split, so a split costs no
// completion queue entry; the caller's completion reports the second
// part's length.
type fixups struct {
	mu      sync.Mutex
	pending bool

	tagBase     uint64
	seq         uint64
	sigAllTags  int          // first parts outstanding on a QP that signals every work request
	carry       bool         // a first part failed: the next send completion
	carryStatus verbs.Status //   (the second part's flush) gets its status

	bad      bool // a work request rxe will fail locally is outstanding
	badID    uint64
	badSince time.Time // when it was posted or the QP last completed anything
	stalled  bool      // the QP was failed for it: its flush becomes LocalProtection
	timer    *time.Timer
}

func (f *fixups) busy() bool { return f.sigAllTags > 0 || f.carry || f.bad || f.stalled }

// fixUpdateLocked adjusts the context's count after q.fix changed; q.fix.mu
// is held.
func (q *qp) fixUpdateLocked() {
	f := &q.fix
	b := f.busy()
	if b && !f.pending {
		f.pending = true
		q.d.fixQPs.Add(1)
	} else if !b && f.pending {
		f.pending = false
		q.d.fixQPs.Add(-1)
	}
}

// fixReset forgets all fix-up state (RESET, destroy).
func (q *qp) fixReset() {
	f := &q.fix
	f.mu.Lock()
	f.sigAllTags = 0
	f.carry, f.bad, f.stalled = false, false, false
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	q.fixUpdateLocked()
	f.mu.Unlock()
}

// splitTagLocked returns the id for a split Read's first part; q.fix.mu is
// held.
func (q *qp) splitTagLocked() uint64 {
	f := &q.fix
	f.seq++
	if q.signalAll {
		f.sigAllTags++
	}
	return f.tagBase | f.seq&0xfffff
}

// isTag reports whether id is one of q's first-part tags.
func (q *qp) isTag(id uint64) bool { return q.fix.tagBase != 0 && id&^0xfffff == q.fix.tagBase }

// needsFix reports whether Poll must look at wcs: some QP has fix-up state,
// or, on a device that splits Reads, a completion is an error (it may be a
// first part's).
func (d *ctxDriver) needsFix(wcs []verbs.WorkCompletion) bool {
	if d.fixQPs.Load() > 0 {
		return true
	}
	if d.quirks&quirkShortReadPage != 0 {
		for i := range wcs {
			if wcs[i].Status != verbs.StatusSuccess {
				return true
			}
		}
	}
	return false
}

// fixCompletions rewrites the device's completions in place where a quirk
// workaround needs it and returns how many remain.
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
	tag := q.isTag(wc.WRID)
	if !f.pending && !tag {
		return true
	}
	defer q.fixUpdateLocked()
	keep := true
	switch {
	case tag:
		// A split Read's first part: signaled only by the QP, or failed.
		if q.signalAll && f.sigAllTags > 0 {
			f.sigAllTags--
		}
		if wc.Status != verbs.StatusSuccess {
			f.carry, f.carryStatus = true, wc.Status
		}
		keep = false
	case f.carry:
		// The second part of a split whose first part failed.
		f.carry = false
		if wc.Status == verbs.StatusWRFlush {
			wc.Status = f.carryStatus
		}
	}
	if keep && (f.bad || f.stalled) {
		f.badSince = time.Now()
		if wc.WRID == f.badID && wc.Status != verbs.StatusSuccess {
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
	mp := q.d.lkeys.Load()
	for _, sg := range wr.SGL {
		if sg.Length == 0 {
			continue
		}
		r, ok := q.lkc.r, q.lkc.m == mp && q.lkc.key == sg.LKey
		if !ok {
			if r, ok = (*mp)[sg.LKey]; ok {
				q.lkc = lkeyCache{m: mp, key: sg.LKey, r: r}
			}
		}
		if !ok || r.pd != q.pd || sg.Addr < r.addr || sg.Addr+uint64(sg.Length) > r.addr+r.n {
			return true
		}
	}
	return false
}

// lkeyCache is a QP's last lkey found in the context's table: a post that
// uses the same region as the one before skips the map lookup. The table
// is copied on every change, so a cache of an older table (m) is stale.
// Guarded by the QP's smu.
type lkeyCache struct {
	m   *map[uint32]lkeyRange
	key uint32
	r   lkeyRange
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
