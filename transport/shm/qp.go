package shm

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// qpDriver executes one queue pair's send queue against its peer's arena.
type qpDriver struct {
	c    *ctxDriver
	qp   *soft.QP
	addr []byte

	// mu guards the fields below and is held while entries execute, so
	// entries run one at a time and in order; the engine posts and
	// completes under it too (soft.LockedExecutor).
	mu       sync.Mutex
	running  bool // in RTS: PostSend executes entries
	peer     *peer
	target   *rc.Target
	next     uint64    // next entry to execute; entries complete as they run
	rnrTries int       // receiver-not-ready retries spent on entry next
	rnrAt    time.Time // non-zero while entry next waits out an RNR
	attr     verbs.QPAttr
	segs     [rc.MaxSGE][]byte     // receive scatter scratch
	pins     [rc.MaxSGE]keytab.Pin // and the keys of its segments
	wqe      rc.RecvWQE
	keys     keytab.Cache // the peer's last rkey
}

func (d *qpDriver) Address() []byte { return d.addr }

func (d *qpDriver) Modify(from, to verbs.QPState, attr *verbs.QPAttr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch to {
	case verbs.QPRTR:
		a, err := parseAddress(attr.AH.Dest)
		if err != nil {
			return err
		}
		if a.boot != bootID() {
			return ErrOtherHost
		}
		if a.qpn != attr.DestQPN {
			return fmt.Errorf("%w: address is for QP %#x, DestQPN is %#x", ErrAddress, a.qpn, attr.DestQPN)
		}
		p, err := acquirePeer(a)
		if err != nil {
			return err
		}
		t, err := rc.Attach(p.mem, a.qcb)
		if err != nil || t.QPN() != a.qpn {
			releasePeer(p)
			return fmt.Errorf("%w: no QP %#x at the advertised control block", ErrAddress, a.qpn)
		}
		if d.peer != nil {
			releasePeer(d.peer)
		}
		d.peer, d.target = p, t
		d.attr = *attr
	case verbs.QPRTS:
		d.attr = *attr
		d.running = true
		d.next = d.qp.SendTail()
	case verbs.QPError:
		d.running = false
		d.unpark()
	case verbs.QPReset:
		d.running = false
		d.unpark()
		if d.peer != nil {
			releasePeer(d.peer)
			d.peer, d.target = nil, nil
		}
	}
	return nil
}

func (d *qpDriver) PostSend() {
	d.mu.Lock()
	d.run()
	d.mu.Unlock()
}

// qpDriver is a soft.LockedExecutor: the engine appends work requests
// under d.mu and has them executed before unlocking, and d.mu guards
// completing (CompleteSend, Fail) too.
var _ soft.LockedExecutor = (*qpDriver)(nil)

// Lock takes the execution lock (soft.LockedExecutor).
func (d *qpDriver) Lock() { d.mu.Lock() }

// Unlock releases the execution lock.
func (d *qpDriver) Unlock() { d.mu.Unlock() }

// RunLocked executes the posted entries; d.mu is held.
func (d *qpDriver) RunLocked() { d.run() }

// qpDriver is a soft.DirectExecutor too: Writes, Reads and atomics posted
// to an empty send queue go straight from the caller's work request list
// to the peer's memory.
var _ soft.DirectExecutor = (*qpDriver)(nil)

// PostDirect executes the longest prefix of wrs that succeeds at once
// (soft.DirectExecutor); d.mu is held, the QP is in RTS and its send
// queue is empty. Every check of the queued path is made, before anything
// is touched; a work request that fails one, or needs a receive, is left
// to the queued path (exec), which reports it. The peer's region stays
// entered from one work request to the next within the call
// (rc.RemoteHold), for rc.ChunkSize bytes at most, and is left before the
// call returns: a Dereg in the peer waits at most that long, as it would
// for one chunk. While a region is entered, a work request to the same
// key on either side is checked against what the previous one found (the
// key's flags and the region's bounds), not looked up again.
func (d *qpDriver) PostDirect(wrs []soft.SendWR) int {
	if !d.running || !d.rnrAt.IsZero() || d.next != d.qp.SendTail() {
		return 0
	}
	t, qp := d.target, d.qp
	var held rc.RemoteHold
	var lm soft.LocalMemo
	n := 0
	for ; n < len(wrs); n++ {
		wr := &wrs[n]
		local, ok := qp.DirectLocal(wr, &lm)
		if !ok || !t.Accepting() || t.DestQPN() != qp.Num() {
			break
		}
		access := rc.AccessRemoteAtomic
		switch wr.Opcode {
		case verbs.OpWrite:
			access = rc.AccessRemoteWrite
		case verbs.OpRead:
			access = rc.AccessRemoteRead
		}
		mem, ok := held.Resolve(t, &d.keys, wr.RKey, wr.RemoteAddr, len(local), access)
		if !ok {
			break
		}
		switch wr.Opcode {
		case verbs.OpWrite:
			sys.Copy(mem, local)
		case verbs.OpRead:
			sys.Copy(local, mem)
		case verbs.OpFetchAndAdd:
			binary.LittleEndian.PutUint64(local, fetchAdd(mem, wr.CompareAdd))
		default:
			binary.LittleEndian.PutUint64(local, compareSwap(mem, wr.CompareAdd, wr.Swap))
		}
		held.Touched(t, len(local))
	}
	// Leave is the first locked instruction after the copy and waits for
	// the copy's stores to reach the peer; deferring it (and a plain-store
	// unlock) bought nothing at 2-rank AllReduce 8 B: docs/benchmarks.md,
	// "shm post path: no locked instruction after the copy?".
	held.Leave(t)
	return n
}

func (d *qpDriver) PostRecv() {
	// A queue pair of this process may be waiting for this receive.
	if parked.Load() > 0 {
		wakeAll()
	}
}

// parked counts queue pairs of this process waiting out an RNR.
var parked atomic.Int32

// unpark clears an RNR wait; d.mu is held.
func (d *qpDriver) unpark() {
	if !d.rnrAt.IsZero() {
		d.rnrAt = time.Time{}
		parked.Add(-1)
	}
}

func (d *qpDriver) Destroy() error {
	d.c.mu.Lock()
	delete(d.c.qps, d)
	d.c.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.running = false
	d.unpark()
	if d.peer != nil {
		releasePeer(d.peer)
		d.peer, d.target = nil, nil
	}
	return nil
}

// run executes entries until the queue is empty, an entry must wait for a
// receive, or the QP fails. d.mu is held.
func (d *qpDriver) run() {
	for d.running && d.rnrAt.IsZero() && d.next < d.qp.SendTail() {
		e := d.qp.SendEntry(d.next)
		st := rc.Status(e.Status)
		if st == rc.Success {
			st = d.exec(e)
		}
		if st == rc.RNR {
			if d.attr.RNRRetry != 7 && d.rnrTries >= int(d.attr.RNRRetry) {
				st = rc.RNRRetryExceeded
			} else {
				d.rnrTries++
				if d.rnrAt.IsZero() {
					parked.Add(1)
				}
				d.rnrAt = time.Now().Add(verbs.RNRTimerDuration(d.target.MinRNR()))
				d.c.wake()
				return
			}
		}
		d.rnrTries = 0
		d.next++
		if !d.qp.CompleteSend(verbs.Status(st)) {
			d.running = false
			return
		}
	}
}

// exec performs one work request on the peer's memory, as the peer's
// responder would, and returns its status. A request the responder would
// NAK as a remote access error or an invalid request moves the peer's QP
// to ERROR too (its receives flushed), as the IBTA requires.
func (d *qpDriver) exec(e *soft.SendEntry) rc.Status {
	st := d.execOne(e)
	if st == rc.RemoteAccess || st == rc.RemoteInvalidReq {
		d.target.Fail(true)
	}
	return st
}

func (d *qpDriver) execOne(e *soft.SendEntry) rc.Status {
	t := d.target
	if !t.Accepting() || t.DestQPN() != d.qp.Num() {
		// A QP that is not ready, gone, or connected elsewhere does not
		// answer; a real requester would exhaust its retries.
		return rc.RetryExceeded
	}
	wr := &e.WR
	switch wr.Opcode {
	case verbs.OpWrite:
		// Memory is copied a chunk at a time under the keys' in-use counts
		// (rc.CopyIn), target and local: once a Dereg returns, nothing
		// here touches the region, and the rest of the WRITE fails with
		// RemoteAccess (LocalProtection for a local region).
		dst, pin, st := t.RemotePin(&d.keys, wr.RKey, wr.RemoteAddr, e.Len, rc.AccessRemoteWrite)
		if st != rc.Success {
			return st
		}
		if st := t.CopyIn(pin, dst, e.Local, e.LocalPins(d.qp)); st != rc.Success {
			return st
		}
	case verbs.OpWriteWithImm:
		dst, pin, st := t.RemotePin(&d.keys, wr.RKey, wr.RemoteAddr, e.Len, rc.AccessRemoteWrite)
		if st != rc.Success {
			return st
		}
		if !t.PopRecv(&d.wqe) {
			return rc.RNR
		}
		if st := t.CopyIn(pin, dst, e.Local, e.LocalPins(d.qp)); st != rc.Success {
			// The receive was taken: it completes flushed, the rest with
			// the target's move to ERROR.
			t.Complete(&rc.WC{WRID: d.wqe.WRID, Status: rc.WRFlush, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: d.qp.Num()})
			t.Fail(true)
			return st
		}
		if !t.Complete(&rc.WC{WRID: d.wqe.WRID, Opcode: rc.WCRecvWriteImm, ByteLen: uint32(e.Len),
			Imm: wr.Imm, Flags: rc.WCWithImm, QPN: t.QPN(), SrcQP: d.qp.Num()}) {
			return rc.RemoteOperation
		}
	case verbs.OpSend, verbs.OpSendWithImm:
		if !t.PopRecv(&d.wqe) {
			return rc.RNR
		}
		n, st := t.ScatterRecvPin(&d.wqe, e.Len, d.segs[:], d.pins[:])
		if st == rc.Success {
			var lst rc.Status
			// st: a receive buffer deregistered while the message went in;
			// lst: the local gather list's region.
			st, lst = t.CopySGPinned(d.segs[:n], d.pins[:n], e.Local, e.LocalPins(d.qp))
			if lst != rc.Success {
				clear(d.segs[:n])
				t.Complete(&rc.WC{WRID: d.wqe.WRID, Status: rc.WRFlush, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: d.qp.Num()})
				t.Fail(true)
				return lst
			}
		}
		clear(d.segs[:n])
		if st != rc.Success {
			// The receiver's error: its receive completes with it, its QP
			// goes to ERROR; the requester learns of a remote error.
			t.Complete(&rc.WC{WRID: d.wqe.WRID, Status: st, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: d.qp.Num()})
			t.Fail(true)
			if st == rc.LocalLength {
				return rc.RemoteInvalidReq
			}
			return rc.RemoteOperation
		}
		w := rc.WC{WRID: d.wqe.WRID, Opcode: rc.WCRecv, ByteLen: uint32(e.Len), QPN: t.QPN(), SrcQP: d.qp.Num()}
		if wr.Opcode == verbs.OpSendWithImm {
			w.Imm, w.Flags = wr.Imm, rc.WCWithImm
		}
		if !t.Complete(&w) {
			return rc.RemoteOperation
		}
	case verbs.OpRead:
		src, pin, st := t.RemotePin(&d.keys, wr.RKey, wr.RemoteAddr, e.Len, rc.AccessRemoteRead)
		if st != rc.Success {
			return st
		}
		if st := t.CopyOut(pin, e.Local, src, e.LocalPins(d.qp)); st != rc.Success {
			return st
		}
	case verbs.OpCompareAndSwap, verbs.OpFetchAndAdd:
		word, pin, st := t.AtomicPinCached(&d.keys, wr.RKey, wr.RemoteAddr)
		if st != rc.Success {
			return st
		}
		// The result buffer is pinned first: an atomic refused for its
		// local buffer must not have been executed at the target.
		lp := e.LocalPins(d.qp)
		result := len(e.Local) == 1
		if result && !lp.Enter(0) {
			return rc.LocalProtection
		}
		if !t.Enter(pin) {
			if result {
				lp.Leave(0)
			}
			return rc.RemoteAccess
		}
		var old uint64
		if wr.Opcode == verbs.OpCompareAndSwap {
			old = compareSwap(word, wr.CompareAdd, wr.Swap)
		} else {
			old = fetchAdd(word, wr.CompareAdd)
		}
		t.Leave(pin)
		if result {
			binary.LittleEndian.PutUint64(e.Local[0], old)
			lp.Leave(0)
		}
	default:
		return rc.LocalQPOperation
	}
	return rc.Success
}

// poll is the progress goroutine's visit: peer death, errors a peer
// recorded in our control block, and RNR retries. It returns how soon it
// wants to be called again (0: no preference).
func (d *qpDriver) poll(now time.Time) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.peer != nil && d.peer.dead() {
		d.fail(rc.RetryExceeded)
		return 0
	}
	if d.qp.Target().State() == rc.StateError && d.running {
		// The peer recorded a receive-side error of ours.
		d.fail(rc.WRFlush)
		return 0
	}
	if d.rnrAt.IsZero() || !d.running {
		return 0
	}
	if now.Before(d.rnrAt) && !d.target.HasRecv() {
		return d.rnrAt.Sub(now)
	}
	d.unpark()
	d.run()
	if !d.rnrAt.IsZero() {
		return time.Until(d.rnrAt)
	}
	return 0
}

// fail ends the QP: the oldest outstanding entry completes with st (unless
// it is a flush), the rest flush. d.mu is held.
func (d *qpDriver) fail(st rc.Status) {
	if !d.running && d.qp.Target().State() == rc.StateError {
		return
	}
	d.running = false
	d.unpark()
	if st != rc.WRFlush && d.qp.SendHead() < d.qp.SendTail() {
		d.qp.CompleteSend(verbs.Status(st))
		return
	}
	d.qp.Fail()
}

// wakeAll prods every context's progress goroutine in this process.
func wakeAll() {
	ctxsMu.Lock()
	for c := range ctxs {
		c.wake()
	}
	ctxsMu.Unlock()
}

var (
	// ctxsMu guards ctxs.
	ctxsMu sync.Mutex
	ctxs   = map[*ctxDriver]struct{}{}
)
