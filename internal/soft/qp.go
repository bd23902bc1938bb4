package soft

// Goroutines and ordering. Application goroutines (through verbs) call PostSend, PostRecv,
// Modify, Close in any number. PostSend validates and appends to the send
// queue under mu, then calls the driver's PostSend outside the lock. The
// driver executes entries strictly in order, on whatever goroutine it likes
// (the caller's for shm, a progress goroutine for tcp), and completes them
// in order with CompleteSend, which takes cmu. A transport that executes
// entries on the posting goroutine under a lock of its own (shm) can
// implement LockedExecutor instead: PostSend then appends and executes
// under that one lock, which also replaces cmu, so an uncontended post
// takes one lock pair, not three; one that is also a DirectExecutor
// executes what it can of the caller's list straight away, on the posting
// goroutine under that lock, while nothing is queued. A transition to ERROR (by
// Modify, by a failed completion, or by a peer through the control block)
// flushes what is left in the send queue and receive queue with WRFlush
// completions, so every posted work request completes exactly once.

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/ring"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// SendEntry is a posted send work request as a transport sees it: the work
// request with its SGL copied, the local memory resolved, and a Status
// preset when local validation already failed (the transport completes
// such an entry with that status when its turn comes, without executing it).
type SendEntry struct {
	WR SendWR
	// Local is the gather list (Send, Write) or scatter list (Read, atomic
	// result) in local memory; inline data is one segment of a private copy.
	Local [][]byte
	// Len is the total length of Local.
	Len int
	// Pins holds the key pin of each Local segment (zero for inline data,
	// a private copy): transports touch Local under them, a chunk at a
	// time (see rc.LocalPins), so that a Dereg of the local region stops
	// the work request too.
	Pins   []keytab.Pin
	Status Status
	Seq    uint64

	sgl    []SGE
	segs   [][]byte
	pins   []keytab.Pin
	inline []byte
}

// Keys returns the QP's context's key table (for the pins of SendEntry).
func (qp *QP) Keys() keytab.Table { return qp.ctx.keys }

// LocalPins returns the entry's local side for rc's copies.
// With a LockedExecutor (whose lock is held) the local region stays
// entered between operations, in qp.hold.
func (e *SendEntry) LocalPins(qp *QP) rc.LocalPins {
	lp := rc.LocalPins{Keys: qp.ctx.keys, Pins: e.Pins}
	if qp.xl != nil {
		lp.Hold = &qp.hold
	}
	return lp
}

// QP is a reliable-connected queue pair.
type QP struct {
	ctx    *Context
	pd     *PD
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	num    uint32
	cap    QPCap
	sigAll bool
	drv    QPTransport

	qcb    rc.QCB
	qcbOff int
	rq     ring.Ring
	rqOff  int
	rqLen  int
	target *rc.Target

	// xl is drv as a LockedExecutor, or nil: then its lock, not mu,
	// guards appending to the send queue, and not cmu completing.
	xl LockedExecutor
	// dx is drv as a DirectExecutor, or nil.
	dx DirectExecutor

	// mu guards state, attr, and appending to the send queue (unless xl).
	mu     sync.Mutex
	state  QPState
	pstate atomic.Uint32 // state, for PostSend under xl's lock
	attr   QPAttr

	sq     []SendEntry   // a power of two slots, cap.MaxSendWR of them in use at most
	sqMask uint64        // len(sq)-1
	tail   atomic.Uint64 // entries below tail are published to the driver
	lcache keytab.Cache  // last local key resolved

	// cmu guards completing entries (head) and flushing (unless xl).
	cmu  sync.Mutex
	head atomic.Uint64

	// With xl, its lock guards every access to the queue positions, and
	// these plain words stand for tail and head (an atomic store costs a
	// locked instruction).
	tailL, headL uint64

	// hold is the local region the executor keeps entered (with xl,
	// under its lock; see rc.LocalPins); Dereg and Close release it.
	hold keytab.Hold
}

func (qp *QP) tailPos() uint64 {
	if qp.xl != nil {
		return qp.tailL
	}
	return qp.tail.Load()
}

func (qp *QP) headPos() uint64 {
	if qp.xl != nil {
		return qp.headL
	}
	return qp.head.Load()
}

func (qp *QP) setTail(v uint64) {
	if qp.xl != nil {
		qp.tailL = v
		return
	}
	qp.tail.Store(v)
}

func (qp *QP) setHead(v uint64) {
	if qp.xl != nil {
		qp.headL = v
		return
	}
	qp.head.Store(v)
}

// CreateQP creates an RC queue pair in RESET; verbs has applied the
// default capabilities and checked them against the limits.
func (pd *PD) CreateQP(dc driver.QPConfig) (driver.QP, error) {
	c := pd.ctx
	var cfg struct {
		SendCQ, RecvCQ *CQ
		SRQ            *SRQ
		SignalAll      bool
	}
	var ok bool
	if cfg.SendCQ, ok = dc.SendCQ.(*CQ); !ok || cfg.SendCQ.ctx != c {
		return nil, fmt.Errorf("%w: send CQ of another device or context", ErrInvalidArgument)
	}
	if cfg.RecvCQ, ok = dc.RecvCQ.(*CQ); !ok || cfg.RecvCQ.ctx != c {
		return nil, fmt.Errorf("%w: receive CQ of another device or context", ErrInvalidArgument)
	}
	if dc.SRQ != nil {
		if cfg.SRQ, ok = dc.SRQ.(*SRQ); !ok || cfg.SRQ.pd.ctx != c {
			return nil, fmt.Errorf("%w: SRQ of another device or context", ErrInvalidArgument)
		}
	}
	cfg.SignalAll = dc.SignalAll
	cp := dc.Cap
	if cfg.SRQ != nil {
		cp.MaxRecvWR, cp.MaxRecvSGE = 0, cfg.SRQ.maxSGE
	}
	qp := &QP{ctx: c, pd: pd, sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ, srq: cfg.SRQ, cap: cp, sigAll: cfg.SignalAll}

	// Control block, and the receive queue unless an SRQ serves it.
	qcbOff, qcbMem, err := c.allocShared(rc.QCBSize)
	if err != nil {
		return nil, err
	}
	qp.qcbOff = qcbOff
	var rqOff, rqLen int
	if cfg.SRQ == nil {
		qp.rqLen = ring.Size(cp.MaxRecvWR, rc.RecvWQESize(cp.MaxRecvSGE))
		off, b, err := c.allocShared(qp.rqLen)
		if err != nil {
			c.arena.Free(qcbOff, rc.QCBSize)
			return nil, err
		}
		qp.rqOff = off
		qp.rq = ring.Init(b, cp.MaxRecvWR, rc.RecvWQESize(cp.MaxRecvSGE))
		qp.cap.MaxRecvWR = qp.rq.Cap()
		rqOff, rqLen = off, qp.rqLen
	} else {
		rqOff, rqLen = cfg.SRQ.off, cfg.SRQ.n
	}
	cqOff, cqLen := cfg.RecvCQ.location()
	cfg.RecvCQ.usedForRecv() // a peer may deliver into it: its waiters use the futex

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.arena.Free(qcbOff, rc.QCBSize)
		if cfg.SRQ == nil {
			c.arena.Free(qp.rqOff, qp.rqLen)
		}
		return nil, ErrClosed
	}
	for {
		qp.num = randUint32() & 0xffffff
		if _, dup := c.qps[qp.num]; !dup && qp.num > 1 {
			break
		}
	}
	c.qps[qp.num] = qp
	c.mu.Unlock()

	qp.qcb = rc.InitQCB(qcbMem, rc.Layout{
		QPN: qp.num, PD: pd.handle, MaxRecvSGE: uint32(cp.MaxRecvSGE), SRQ: cfg.SRQ != nil,
		RQOff: uint64(rqOff), RQLen: uint64(rqLen),
		CQOff: uint64(cqOff), CQLen: uint64(cqLen),
		KeysOff: uint64(c.keysOff), KeysLen: uint64(c.keysLen),
	})
	qp.target, err = rc.Attach(c.arena.Mem, uint64(qcbOff))
	if err != nil {
		panic("verbs: own control block does not attach: " + err.Error())
	}
	qp.target.Ext = c.extMemory

	// A power of two slots, so that a position maps to its slot with a
	// mask (a division costs more than the rest of the bookkeeping).
	slots := 1
	for slots < cp.MaxSendWR {
		slots <<= 1
	}
	qp.sq = make([]SendEntry, slots)
	qp.sqMask = uint64(slots - 1)
	for i := range qp.sq {
		e := &qp.sq[i]
		e.sgl = make([]SGE, cp.MaxSendSGE)
		e.segs = make([][]byte, cp.MaxSendSGE)
		e.pins = make([]keytab.Pin, cp.MaxSendSGE)
		e.inline = make([]byte, cp.MaxInlineData)
	}
	qp.drv, err = c.drv.NewQP(qp)
	if x, ok := qp.drv.(LockedExecutor); ok && err == nil {
		qp.xl = x
		qp.dx, _ = x.(DirectExecutor)
	}
	if err != nil {
		c.mu.Lock()
		delete(c.qps, qp.num)
		c.mu.Unlock()
		qp.freeMemory()
		return nil, err
	}
	return qp, nil
}

func (qp *QP) freeMemory() {
	c := qp.ctx
	qp.qcb.SetState(rc.StateReset)
	// Peers re-check the control block before each operation; give any
	// operation already past that check time to finish before the pages
	// can be reused.
	time.AfterFunc(2*time.Second, func() {
		c.arena.Free(qp.qcbOff, rc.QCBSize)
		if qp.srq == nil {
			c.arena.Free(qp.rqOff, qp.rqLen)
		}
	})
}

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Cap returns the QP's capabilities (as granted, which may exceed those
// requested).
func (qp *QP) Cap() QPCap { return qp.cap }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// Context returns the QP's context.
func (qp *QP) Context() *Context { return qp.ctx }

// Address returns the transport address a peer puts in AddressHandle.Dest.
func (qp *QP) Address() []byte { return qp.drv.Address() }

// State returns the current state.
func (qp *QP) State() QPState {
	qp.syncState()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.state
}

// Attr returns the attributes applied so far and the current state.
func (qp *QP) Attr() QPAttr {
	qp.syncState()
	qp.mu.Lock()
	defer qp.mu.Unlock()
	a := qp.attr
	a.State = qp.state
	return a
}

// Modify moves the QP to attr.State, applying the attributes of that
// transition (see QPAttr). Invalid transitions return ErrInvalidState.
func (qp *QP) Modify(attr *QPAttr) error {
	qp.syncState()
	qp.mu.Lock()
	from := qp.state
	to := attr.State
	if err := driver.CheckModify(from, attr); err != nil {
		qp.mu.Unlock()
		return err
	}
	next := driver.MergeAttr(qp.attr, from, attr)
	qp.mu.Unlock()

	// Responders (a tcp reader goroutine, a peer process) judge requests by
	// the control block, so it must say RTR/RTS by the time the driver
	// starts accepting; undo it if the driver refuses.
	if to == QPRTR || to == QPRTS {
		qp.qcb.SetMinRNR(next.MinRNRTimer)
		qp.qcb.SetDestQPN(next.DestQPN)
		qp.qcb.SetState(uint32(to))
	}
	if err := qp.drv.Modify(from, to, &next); err != nil {
		if to == QPRTR || to == QPRTS {
			qp.qcb.SetState(uint32(from))
		}
		return err
	}

	qp.mu.Lock()
	if qp.state != from {
		// A concurrent error transition won; report it.
		s := qp.state
		qp.mu.Unlock()
		if to != QPError && to != QPReset {
			return fmt.Errorf("%w: QP moved to %s during the transition", ErrInvalidState, s)
		}
		qp.mu.Lock()
	}
	qp.attr = next
	qp.setState(to)
	switch to {
	case QPInit:
		qp.qcb.SetAccess(uint32(next.AccessFlags))
	case QPRTR:
		qp.qcb.SetMinRNR(next.MinRNRTimer)
		qp.qcb.SetDestQPN(next.DestQPN)
	}
	qp.qcb.SetState(uint32(to))
	qp.mu.Unlock()

	switch to {
	case QPError:
		qp.flushSQ()
		qp.flushRQ()
	case QPReset:
		qp.lockC()
		qp.setHead(qp.tailPos())
		qp.unlockC()
		if qp.srq == nil {
			var buf [rc.RecvWQEMax]byte
			for qp.rq.TryPop(buf[:qp.rq.Payload()]) {
			}
		}
	}
	return nil
}

// setState sets the state; qp.mu is held.
func (qp *QP) setState(s QPState) {
	qp.state = s
	qp.pstate.Store(uint32(s))
}

// lockC takes the lock that guards completing and flushing: the
// transport's (LockedExecutor) or cmu.
func (qp *QP) lockC() {
	if qp.xl != nil {
		qp.xl.Lock()
	} else {
		qp.cmu.Lock()
	}
}

func (qp *QP) unlockC() {
	if qp.xl != nil {
		qp.xl.Unlock()
	} else {
		qp.cmu.Unlock()
	}
}

// releaseHold releases the executor's held local pin if it is on slot s
// (0: whatever it is). Dereg and destroy call it; nothing of the engine is
// locked.
func (qp *QP) releaseHold(s keytab.Slot) {
	if qp.xl == nil {
		return
	}
	qp.xl.Lock()
	if s == 0 {
		qp.ctx.keys.Release(&qp.hold)
	} else {
		qp.ctx.keys.ReleaseSlot(&qp.hold, s)
	}
	qp.xl.Unlock()
}

// syncState applies an ERROR state a peer recorded in the control block.
func (qp *QP) syncState() {
	if qp.qcb.State() == rc.StateError {
		qp.mu.Lock()
		s := qp.state
		qp.mu.Unlock()
		if s != QPError {
			qp.enterError(true, false)
		}
	}
}

// Fail moves the QP to ERROR on the transport's behalf (peer lost, or a
// peer recorded an error in the control block) and flushes both queues.
// The transport must have stopped executing send entries. Outstanding
// entries it wants to fail with a specific status it completes first.
// A LockedExecutor calls it with its lock held.
func (qp *QP) Fail() { qp.enterError(false, qp.xl != nil) }

// enterError moves the QP to ERROR (notify: telling the transport) and
// flushes; held says the transport's lock (LockedExecutor) is held.
func (qp *QP) enterError(notify, held bool) {
	from, changed := qp.markError()
	if notify && changed {
		qp.drv.Modify(from, QPError, nil)
	}
	if held {
		qp.flushSQLocked()
	} else {
		qp.flushSQ()
	}
	qp.flushRQ()
}

// markError moves the QP to ERROR without flushing; it reports the state
// it left and whether it changed anything.
func (qp *QP) markError() (from QPState, changed bool) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	from = qp.state
	if from == QPError {
		return from, false
	}
	qp.setState(QPError)
	qp.attr.State = QPError
	qp.qcb.SetState(rc.StateError)
	return from, true
}

func (qp *QP) flushSQ() {
	qp.lockC()
	defer qp.unlockC()
	qp.flushSQLocked()
}

// flushSQLocked is flushSQ with the completion lock held.
func (qp *QP) flushSQLocked() {
	for h := qp.headPos(); h < qp.tailPos(); h++ {
		w, emit := qp.sendWC(&qp.sq[h&qp.sqMask], StatusWRFlush)
		qp.setHead(h + 1)
		if emit {
			qp.pushSend(&w)
		}
	}
}

func (qp *QP) flushRQ() {
	if qp.srq != nil {
		return
	}
	var buf [rc.RecvWQEMax]byte
	var w rc.RecvWQE
	for qp.rq.TryPop(buf[:qp.rq.Payload()]) {
		w.Decode(buf[:qp.rq.Payload()])
		qp.recvCQ.push(&rc.WC{WRID: w.WRID, Status: rc.WRFlush, Opcode: rc.WCRecv, QPN: qp.num})
	}
}

var wcOpcodes = [...]uint32{rc.WCWrite, rc.WCWrite, rc.WCSend, rc.WCSend, rc.WCRead, rc.WCCompSwap, rc.WCFetchAdd}

func (qp *QP) emitSend(e *SendEntry, st Status) {
	if w, ok := qp.sendWC(e, st); ok {
		qp.pushSend(&w)
	}
}

// sendWC is the completion of e with st, and whether it is emitted
// (successful unsignaled work requests complete silently).
func (qp *QP) sendWC(e *SendEntry, st Status) (rc.WC, bool) {
	if st == StatusSuccess && e.WR.Flags&SendSignaled == 0 && !qp.sigAll {
		return rc.WC{}, false
	}
	return rc.WC{WRID: e.WR.ID, Status: rc.Status(st), Opcode: wcOpcodes[e.WR.Opcode], ByteLen: uint32(e.Len), QPN: qp.num}, true
}

// pushSend delivers a send completion.
func (qp *QP) pushSend(w *rc.WC) {
	if !qp.sendCQ.push(w) && w.Status == rc.Success {
		// The completion was lost: the CQ reports overflow, and the QP
		// cannot go on as if nothing happened.
		go qp.enterError(true, false)
	}
}

// PostSend posts a batch of send work requests. Local validation errors
// (state, opcode, SGE count, inline size, atomic alignment, full queue)
// stop the batch and are returned as a *PostError; work requests before it
// were posted. Errors found while executing arrive as completions.
func (qp *QP) PostSend(wrs []SendWR) error {
	qp.syncState()
	if qp.xl != nil {
		return qp.postLocked(wrs)
	}
	qp.mu.Lock()
	if qp.state == QPError {
		qp.mu.Unlock()
		return qp.flushPosted(wrs, &qp.cmu)
	}
	if qp.state != QPRTS {
		s := qp.state
		qp.mu.Unlock()
		return postErr(0, ErrInvalidState, "QP is %s, send needs RTS", s)
	}
	posted, err := qp.prepareAll(wrs)
	qp.mu.Unlock()
	if posted > 0 {
		qp.drv.PostSend()
	}
	return err
}

// flushPosted completes work requests posted to a QP in ERROR with
// WRFlush, each under mu when given (else the caller holds the
// completion lock). They are still checked for what makes them work
// requests at all: an unknown opcode fails the post at its index.
func (qp *QP) flushPosted(wrs []SendWR, mu *sync.Mutex) error {
	for i := range wrs {
		if wrs[i].Opcode > OpFetchAndAdd {
			return postErr(i, ErrInvalidArgument, "unknown opcode %d", wrs[i].Opcode)
		}
		e := SendEntry{WR: wrs[i]}
		if mu != nil {
			mu.Lock()
		}
		qp.emitSend(&e, StatusWRFlush)
		if mu != nil {
			mu.Unlock()
		}
	}
	return nil
}

// prepareAll prepares wrs in order until one fails; it returns how
// many were prepared and the failure.
func (qp *QP) prepareAll(wrs []SendWR) (int, error) {
	for i := range wrs {
		if err := qp.prepare(i, &wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// postLocked is PostSend for a LockedExecutor: the work requests are
// appended and executed under the transport's lock, which also guards
// completing and flushing, so a post that sees RTS is either flushed by
// a transition to ERROR or executed; one that sees ERROR completes with
// WRFlush.
func (qp *QP) postLocked(wrs []SendWR) error {
	qp.xl.Lock()
	switch s := QPState(qp.pstate.Load()); s {
	case QPRTS:
	case QPError:
		defer qp.xl.Unlock()
		return qp.flushPosted(wrs, nil)
	default:
		qp.xl.Unlock()
		return postErr(0, ErrInvalidState, "QP is %s, send needs RTS", s)
	}
	base := 0
	if qp.dx != nil && qp.headL == qp.tailL {
		// Nothing queued: the transport executes what it can right away.
		// At most a full queue's worth, so that a list longer than the
		// send queue fails where it did when it was queued.
		k := min(len(wrs), qp.cap.MaxSendWR)
		base = qp.dx.PostDirect(wrs[:k])
		qp.completeDirect(wrs[:base])
		if base == len(wrs) {
			qp.xl.Unlock()
			return nil
		}
		if base == qp.cap.MaxSendWR {
			qp.xl.Unlock()
			return postErr(base, ErrQueueFull, "send queue holds %d work requests; poll completions first", qp.cap.MaxSendWR)
		}
	}
	posted, err := qp.prepareAll(wrs[base:])
	if posted > 0 {
		qp.xl.RunLocked()
	}
	qp.xl.Unlock()
	if pe, ok := err.(*driver.PostError); ok && base > 0 {
		pe.Index += base
	}
	return err
}

// LocalMemo remembers the local region of the last work request of one
// PostDirect call that DirectLocal resolved: the region the executor
// holds (QP.hold), which no Dereg can finish removing while the
// executor's lock is held. A later work request of the same call on the
// same key is then checked against the remembered flags and bounds
// without the key table: one that a Dereg racing with the call removed
// still succeeds, as the Dereg has not returned (it waits for the hold).
// A LocalMemo lives for one call (start each call with the zero value);
// it is not for concurrent use.
type LocalMemo struct {
	key   uint32
	write bool   // the region grants local write access
	va    uint64 // the region's address
	mem   []byte // the region's memory, from va
}

// DirectLocal checks wr for a DirectExecutor (its lock held, the QP in
// RTS) as prepare would, resolves its local memory and enters it through
// the executor's hold (see rc.LocalPins): it returns the memory of its
// one SGE. It returns ok false for anything but a Write (inline or not),
// Read or atomic of one SGE of 1 to rc.ChunkSize bytes whose every local
// check passes and whose key is still registered: those go through the
// send queue, whose path reports the error or handles the case. m carries
// the call's last region from one work request to the next.
func (qp *QP) DirectLocal(wr *SendWR, m *LocalMemo) (local []byte, ok bool) {
	if len(wr.SGL) != 1 || qp.cap.MaxSendSGE < 1 {
		return nil, false
	}
	sg := &wr.SGL[0]
	if sg.Length == 0 || sg.Length > rc.ChunkSize {
		return nil, false
	}
	needWrite := true
	switch wr.Opcode {
	case OpWrite:
		needWrite = false
		if wr.Flags&SendInline != 0 && sg.Length > uint32(qp.cap.MaxInlineData) {
			return nil, false
		}
	case OpRead:
		if wr.Flags&SendInline != 0 {
			return nil, false
		}
	case OpCompareAndSwap, OpFetchAndAdd:
		if wr.Flags&SendInline != 0 || sg.Length != 8 || wr.RemoteAddr&7 != 0 || qp.ctx.info.AtomicCap == AtomicNone {
			return nil, false
		}
	default:
		return nil, false
	}
	if m.mem != nil && sg.LKey == m.key && (m.write || !needWrite) {
		if off, end := sg.Addr-m.va, sg.Addr+uint64(sg.Length); sg.Addr >= m.va && end >= sg.Addr && off+uint64(sg.Length) <= uint64(len(m.mem)) {
			return m.mem[off : off+uint64(sg.Length)], true
		}
	}
	e, region, pin, ok := qp.localRegion(sg.LKey)
	if !ok || needWrite && e.Flags&uint32(AccessLocalWrite) == 0 || !inRegion(e, sg) || !qp.ctx.keys.EnterHeld(&qp.hold, pin) {
		*m = LocalMemo{}
		return nil, false
	}
	// Field by field: a composite literal is built on the stack and
	// copied in 16-byte pieces the CPU cannot forward (half of the call).
	m.key, m.write, m.va, m.mem = sg.LKey, e.Flags&uint32(AccessLocalWrite) != 0, e.VA, region
	off := sg.Addr - e.VA
	return region[off : off+uint64(sg.Length)], true
}

// completeDirect delivers the completions of work requests a
// DirectExecutor executed with success (the signaled ones, or all if the
// QP signals all), in order, reserving and publishing the CQ's slots for
// them in batches (one CAS of the CQ's tail for a batch, not one each).
// xl's lock is held.
func (qp *QP) completeDirect(wrs []SendWR) {
	k := len(wrs)
	if !qp.sigAll {
		k = 0
		for i := range wrs {
			if wrs[i].Flags&SendSignaled != 0 {
				k++
			}
		}
	}
	r := &qp.sendCQ.r
	i := 0
	for k > 0 {
		pos, n := r.ReserveN(k)
		if n == 0 {
			// The completion was lost (as in pushSend): the CQ reports
			// overflow, and the QP cannot go on as if nothing happened.
			r.SetFlag(ring.FlagOverflow)
			r.Kick()
			qp.sendCQ.goWake()
			go qp.enterError(true, false)
			return
		}
		for j := range n {
			for !qp.sigAll && wrs[i].Flags&SendSignaled == 0 {
				i++
			}
			wr := &wrs[i]
			w := rc.WC{WRID: wr.ID, Opcode: wcOpcodes[wr.Opcode], ByteLen: wr.SGL[0].Length, QPN: qp.num}
			w.Encode(r.Slot(pos + uint64(j)))
			i++
		}
		r.PublishN(pos, n)
		r.Notify()
		qp.sendCQ.goWake()
		k -= n
	}
}

// prepare validates wr and appends it; qp.mu (xl's lock) is held.
func (qp *QP) prepare(i int, wr *SendWR) error {
	if wr.Opcode > OpFetchAndAdd {
		return postErr(i, ErrInvalidArgument, "unknown opcode %d", wr.Opcode)
	}
	if len(wr.SGL) > qp.cap.MaxSendSGE {
		return postErr(i, ErrInvalidArgument, "%d SGEs, max_send_sge is %d", len(wr.SGL), qp.cap.MaxSendSGE)
	}
	total := uint64(0)
	for _, sg := range wr.SGL {
		total += uint64(sg.Length)
	}
	if total > MaxMsgSize {
		return postErr(i, ErrInvalidArgument, "message of %d bytes exceeds max_msg_sz %d", total, uint64(MaxMsgSize))
	}
	inline := wr.Flags&SendInline != 0
	if inline {
		if wr.Opcode == OpRead || wr.Opcode.IsAtomic() {
			return postErr(i, ErrInvalidArgument, "%s cannot be inline", wr.Opcode)
		}
		if total > uint64(qp.cap.MaxInlineData) {
			return postErr(i, ErrInvalidArgument, "%d inline bytes, max_inline_data is %d", total, qp.cap.MaxInlineData)
		}
	}
	if wr.Opcode.IsAtomic() {
		if qp.ctx.info.AtomicCap == AtomicNone {
			return postErr(i, ErrNotSupported, "device %s has no atomics", qp.ctx.info.Name)
		}
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return postErr(i, ErrInvalidArgument, "an atomic needs one 8-byte SGE for the prior value")
		}
		if wr.RemoteAddr&7 != 0 {
			return postErr(i, ErrInvalidArgument, "misaligned atomic: remote address %#x is not 8-byte aligned", wr.RemoteAddr)
		}
	}
	t := qp.tailPos()
	if t-qp.headPos() >= uint64(qp.cap.MaxSendWR) {
		return postErr(i, ErrQueueFull, "send queue holds %d work requests; poll completions first", qp.cap.MaxSendWR)
	}
	e := &qp.sq[t&qp.sqMask]
	e.WR = *wr
	e.WR.SGL = e.sgl[:len(wr.SGL)]
	copy(e.WR.SGL, wr.SGL)
	e.Seq = t
	e.Status = StatusSuccess
	e.Len = int(total)
	needWrite := wr.Opcode == OpRead || wr.Opcode.IsAtomic()
	e.Local = e.segs[:0]
	e.Pins = e.pins[:0]
	for _, sg := range wr.SGL {
		m, pin, ok := qp.resolveLocal(sg, needWrite && !inline)
		if !ok && inline {
			// Inline data is copied now and its lkey is not consulted, as
			// on RNICs; the bytes must be registered memory of this
			// context, since nothing else can be read safely.
			m, ok = qp.ctx.registeredAt(sg.Addr, int(sg.Length))
			if !ok {
				return postErr(i, ErrInvalidArgument, "inline SGE %#x+%d is not in memory registered with this context", sg.Addr, sg.Length)
			}
		}
		if !ok {
			e.Status = StatusLocalProtection
			break
		}
		if len(m) > 0 {
			e.Local = append(e.Local, m)
			e.Pins = append(e.Pins, pin)
		}
	}
	if inline && e.Status == StatusSuccess {
		n := 0
		for _, m := range e.Local {
			n += copy(e.inline[n:], m)
		}
		e.segs[0] = e.inline[:n]
		e.Local = e.segs[:1]
		e.pins[0] = keytab.Pin{}
		e.Pins = e.pins[:1]
		if n == 0 {
			e.Local, e.Pins = e.segs[:0], e.pins[:0]
		}
	}
	qp.setTail(t + 1)
	return nil
}

// resolveLocal maps an SGE to local memory, checking key, PD, bounds and
// (for Read and atomic results) local write access.
func (qp *QP) resolveLocal(sg SGE, needWrite bool) ([]byte, keytab.Pin, bool) {
	if sg.Length == 0 {
		return nil, keytab.Pin{}, true
	}
	e, region, pin, ok := qp.localRegion(sg.LKey)
	if !ok || needWrite && e.Flags&uint32(AccessLocalWrite) == 0 || !inRegion(e, &sg) {
		return nil, pin, false
	}
	off := sg.Addr - e.VA
	return region[off : off+uint64(sg.Length)], pin, true
}

// localRegion looks up a local key (through the QP's cache) of this QP's
// PD and returns its entry, the region's memory (from its address) and
// the key's pin.
func (qp *QP) localRegion(lkey uint32) (*keytab.Entry, []byte, keytab.Pin, bool) {
	e, pin, ok := qp.ctx.keys.LookupRef(lkey, &qp.lcache)
	if !ok || e.Flags&keytab.FlagRemoteKey != 0 || e.PD != qp.pd.handle {
		return nil, nil, pin, false
	}
	if e.Handle != keytab.NoHandle {
		mem := qp.ctx.arena.Mem
		if e.Handle > uint64(len(mem)) || e.Length > uint64(len(mem))-e.Handle {
			return nil, nil, pin, false
		}
		return e, mem[e.Handle : e.Handle+e.Length], pin, true
	}
	m := qp.ctx.extMemory(e.Index)
	if uint64(len(m)) < e.Length {
		return nil, nil, pin, false
	}
	return e, m[:e.Length], pin, true
}

// inRegion reports whether sg lies in e's region.
func inRegion(e *keytab.Entry, sg *SGE) bool {
	end := sg.Addr + uint64(sg.Length)
	return sg.Addr >= e.VA && end <= e.VA+e.Length && end >= sg.Addr
}

// PostRecv posts a batch of receive work requests. A QP with an SRQ takes
// its receives from the SRQ and refuses PostRecv.
func (qp *QP) PostRecv(wrs []RecvWR) error {
	if qp.srq != nil {
		return postErr(0, ErrInvalidArgument, "QP %#x uses an SRQ; post receives to the SRQ", qp.num)
	}
	qp.syncState()
	qp.mu.Lock()
	s := qp.state
	qp.mu.Unlock()
	if s == QPReset {
		return postErr(0, ErrInvalidState, "QP is RESET; receives can be posted from INIT on")
	}
	if s == QPError {
		for i := range wrs {
			qp.recvCQ.push(&rc.WC{WRID: wrs[i].ID, Status: rc.WRFlush, Opcode: rc.WCRecv, QPN: qp.num})
		}
		return nil
	}
	err := postRecvRing(qp.rq, qp.cap.MaxRecvSGE, wrs)
	qp.drv.PostRecv()
	if qp.qcb.State() == rc.StateError {
		// Raced with an error transition; make sure nothing is stranded.
		qp.flushRQ()
	}
	return err
}

// Close destroys the QP. Outstanding work requests are dropped without
// completions, as with ibv_destroy_qp.
func (qp *QP) Close() error {
	qp.destroyOnce()
	return nil
}

func (qp *QP) destroyOnce() {
	c := qp.ctx
	c.mu.Lock()
	if c.qps[qp.num] != qp {
		c.mu.Unlock()
		return
	}
	delete(c.qps, qp.num)
	c.mu.Unlock()
	qp.mu.Lock()
	from := qp.state
	qp.setState(QPReset)
	qp.mu.Unlock()
	if from != QPReset {
		qp.drv.Modify(from, QPReset, &QPAttr{})
	}
	qp.drv.Destroy()
	qp.releaseHold(0)
	qp.freeMemory()
}

func (qp *QP) destroy() { qp.destroyOnce() }

// The methods below are for transports.

// SendTail returns the position one past the newest published send entry
// (a LockedExecutor asks with its lock held).
func (qp *QP) SendTail() uint64 { return qp.tailPos() }

// SendHead returns the position of the oldest uncompleted send entry (a
// LockedExecutor asks with its lock held).
func (qp *QP) SendHead() uint64 { return qp.headPos() }

// SendEntry returns the entry at position seq (SendHead <= seq < SendTail).
func (qp *QP) SendEntry(seq uint64) *SendEntry { return &qp.sq[seq&qp.sqMask] }

// CompleteSend completes the oldest outstanding send entry with st. A
// failure moves the QP to ERROR and flushes the rest; CompleteSend then
// returns false and the transport must stop executing entries. A
// LockedExecutor calls it with its lock held.
func (qp *QP) CompleteSend(st Status) bool {
	if st != StatusSuccess {
		// The QP shows ERROR before its first error completion can be
		// polled.
		qp.markError()
	}
	held := qp.xl != nil
	if !held {
		qp.cmu.Lock()
	}
	h := qp.headPos()
	if h >= qp.tailPos() {
		if !held {
			qp.cmu.Unlock()
		}
		return qp.qcb.State() != rc.StateError
	}
	// The slot is free before its completion can be polled, so a post
	// made right after polling it never finds the queue full; the
	// completion is taken from the entry first.
	w, emit := qp.sendWC(&qp.sq[h&qp.sqMask], st)
	qp.setHead(h + 1)
	if emit {
		qp.pushSend(&w)
	}
	if !held {
		qp.cmu.Unlock()
	}
	if st != StatusSuccess {
		qp.enterError(false, held)
		return false
	}
	return true
}

// FinishSend completes the oldest send entry as a reliable-connection
// engine reported it (rcproto's completion action): wr is the entry's
// position, st the engine's status and value an atomic's original value,
// written into the entry's 8-byte result buffer through ltab (the QP's
// own key table) so that a Dereg racing with it is seen.
//
// ok is true when the entry completed and the QP goes on. Otherwise the
// transport must stop executing entries, and then, when fail is not
// StatusSuccess, fail the head with it (CompleteSend(fail)); fail is
// StatusSuccess when the QP went to ERROR under the completion (a
// transition in progress).
func (qp *QP) FinishSend(ltab keytab.Table, wr uint64, st Status, value uint64) (fail Status, ok bool) {
	if st != StatusSuccess {
		return st, false
	}
	if wr != qp.SendHead() {
		// The engine and the send queue disagree: a bug, not the peer's
		// doing; fail rather than complete the wrong entry.
		return driver.StatusGeneral, false
	}
	if e := qp.SendEntry(wr); e.WR.Opcode.IsAtomic() && len(e.Local) == 1 && len(e.Local[0]) == 8 {
		if !ltab.EnterOpt(e.Pins[0]) {
			return StatusLocalProtection, false // the result buffer was deregistered meanwhile
		}
		binary.LittleEndian.PutUint64(e.Local[0], value)
		ltab.LeaveOpt(e.Pins[0])
	}
	return StatusSuccess, qp.CompleteSend(StatusSuccess)
}

// Target returns the QP's own responder view (for transports whose
// responder runs in this process).
func (qp *QP) Target() *rc.Target { return qp.target }

// ControlOffset returns where the QP's control block is in the arena (for
// transports whose peers map the arena).
func (qp *QP) ControlOffset() int { return qp.qcbOff }

// Config returns the current attributes without syncing (for transports,
// from inside driver calls).
func (qp *QP) Config() QPAttr {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	return qp.attr
}
