//go:build ibverbs

package ibverbs

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

// qp is a device RC queue pair.
//
// Posting: PostSend validates the batch in Go (what verbs does for its own
// transports: state, opcode, SGE count, inline size, atomic operands and
// the device's capabilities), writes it into the QP's preallocated C
// arrays and posts it with one cgo call as one linked chain of
// ibv_send_wr. Nothing is allocated per call.
//
// Connecting: on InfiniBand and RoCE, Modify(RTR) builds the address vector
// from the peer's Address (or AddressHandle.GID) and ibv_modify_qp does the
// rest, as with any out-of-band exchange. iWARP has no out-of-band
// connection setup, so there RTR and RTS drive an rdma_cm connection
// instead (cm.go); the QP keeps its number and objects either way.
type qp struct {
	d      *ctxDriver
	id     uint64
	c      *cQP
	num    uint32
	cap    verbs.QPCap
	hasSRQ bool
	port   uint8

	addr []byte
	self Address
	// gidIndex is the source GID index plus one set by SetGIDIndex; 0:
	// chosen per destination (sgidIndex).
	gidIndex int

	// state is the last state set through Modify (the device may have
	// moved on to ERROR; State asks the device).
	state atomic.Uint32
	// attrMu guards attr: the attributes applied so far.
	attrMu sync.Mutex
	attr   verbs.QPAttr

	smu sync.Mutex // send queue C memory
	sq  *cWQ
	rmu sync.Mutex // receive queue C memory
	rq  *cWQ

	iw *iwConn // iWARP connection state, nil on IB/RoCE

	scq, rcq *cq

	// fatal: the QP is known to be in ERROR. flushed: an iWARP QP was moved
	// to ERROR on the device, which flushed what was outstanding; later work
	// requests are completed here with WRFlush.
	fatal   atomic.Bool
	flushed atomic.Bool

	pd        *pdT
	quirks    quirk // the device's driver defects worked around (quirks.go)
	fix       fixups
	lkc       lkeyCache // guarded by smu
	signalAll bool
	// slotWR maps a send queue slot of the chain being posted to the
	// index of its work request (a split Read takes two slots); slotSplit
	// marks the first part of a split. Guarded by smu.
	slotWR    []int32
	slotSplit []bool
}

var wrOpcodes = [...]uint32{
	verbs.OpWrite:          ibvWROpWrite,
	verbs.OpWriteWithImm:   ibvWROpWriteImm,
	verbs.OpSend:           ibvWROpSend,
	verbs.OpSendWithImm:    ibvWROpSendImm,
	verbs.OpRead:           ibvWROpRead,
	verbs.OpCompareAndSwap: ibvWROpCAS,
	verbs.OpFetchAndAdd:    ibvWROpFAA,
}

func (p *pdT) CreateQP(cfg vdriver.QPConfig) (vdriver.QP, error) {
	d := p.d
	scq, ok1 := cfg.SendCQ.(*cq)
	rcq, ok2 := cfg.RecvCQ.(*cq)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("%w: CQs of another transport", verbs.ErrInvalidArgument)
	}
	var s *srq
	if cfg.SRQ != nil {
		s, _ = cfg.SRQ.(*srq)
	}
	cp := cfg.Cap
	// Clamp to what the device can do; the granted caps are reported.
	if d.info.MaxSGE > 0 {
		cp.MaxSendSGE = min(cp.MaxSendSGE, d.info.MaxSGE)
		cp.MaxRecvSGE = min(cp.MaxRecvSGE, d.info.MaxSGE)
	}
	if d.info.MaxQPWR > 0 {
		cp.MaxSendWR = min(cp.MaxSendWR, d.info.MaxQPWR)
		cp.MaxRecvWR = min(cp.MaxRecvWR, d.info.MaxQPWR)
	}
	cp.MaxInlineData = min(cp.MaxInlineData, d.info.MaxInline)
	id := d.newID()
	var cs *cSRQ
	if s != nil {
		cs = s.c
	}
	c, err := p.c.createQP(scq.c, rcq.c, cs, id, cfg.SignalAll, &cp)
	if err != nil {
		return nil, wrap(fmt.Sprintf("ibv_create_qp(%+v)", cfg.Cap), err)
	}
	q := &qp{d: d, id: id, c: c, num: c.num(), cap: cp, hasSRQ: s != nil, port: 1, scq: scq, rcq: rcq,
		pd: p, quirks: d.quirks, signalAll: cfg.SignalAll}
	q.state.Store(uint32(verbs.QPReset))
	q.sq = newWQ(c.ptr(), cp.MaxSendWR, cp.MaxSendSGE, true)
	q.slotWR = make([]int32, q.sq.maxWR())
	q.slotSplit = make([]bool, q.sq.maxWR())
	if q.quirks&quirkShortReadPage != 0 {
		q.fix.tagBase = newTagBase()
	}
	if s == nil {
		q.rq = newWQ(c.ptr(), cp.MaxRecvWR, cp.MaxRecvSGE, false)
	}
	if err := q.initAddress(); err != nil {
		q.destroy()
		return nil, err
	}
	d.mu.Lock()
	d.qps[id] = q
	d.qpNums[q.num] = q
	d.mu.Unlock()
	return q, nil
}

// initAddress fills the QP's Address; on iWARP it starts the QP's rdma_cm
// listener, whose IP and port the peer connects to.
func (q *qp) initAddress() error {
	d := q.d
	a := Address{Port: q.port, QPN: q.num}
	if pi, ok := d.port(int(q.port)); ok {
		a.MTU = uint8(pi.ActiveMTU)
	}
	if g, ok := primaryGID(d.portGIDs(int(q.port), false)); ok {
		a.GID = g.gid
	}
	if d.iwarp {
		a.IWARP = true
		iw, err := newIWConn(q)
		if err != nil {
			return err
		}
		q.iw = iw
		a.IP, a.CMPort = iw.ip, iw.port
	}
	q.self = a
	q.addr = a.Encode()
	return nil
}

func (q *qp) Num() uint32      { return q.num }
func (q *qp) Cap() verbs.QPCap { return q.cap }
func (q *qp) Address() []byte  { return q.addr }

func (q *qp) State() verbs.QPState {
	if q.fatal.Load() {
		return verbs.QPError
	}
	if q.iw != nil {
		// siw's query_qp does not report the state: track it here (Modify,
		// error completions, fatal events, rdma_cm disconnects).
		return verbs.QPState(q.state.Load())
	}
	s := q.c.queryState()
	if s < 0 {
		return verbs.QPState(q.state.Load())
	}
	return verbs.QPState(s) // ibv_qp_state values: RESET 0, INIT 1, RTR 2, RTS 3, SQD 4, SQE 5, ERR 6
}

// Attr returns the attributes applied so far, with the current state.
func (q *qp) Attr() verbs.QPAttr {
	q.attrMu.Lock()
	a := q.attr
	q.attrMu.Unlock()
	a.State = q.State()
	return a
}

func (q *qp) Modify(attr *verbs.QPAttr) error {
	from := verbs.QPState(q.state.Load())
	if dev := q.State(); dev == verbs.QPError && attr.State != verbs.QPReset && attr.State != verbs.QPError {
		from = verbs.QPError
	}
	to := attr.State
	if err := vdriver.CheckModify(from, attr); err != nil {
		return err
	}
	var err error
	switch to {
	case verbs.QPInit:
		port := attr.Port
		if port == 0 {
			port = 1
		}
		if _, ok := q.d.port(int(port)); !ok {
			return fmt.Errorf("%w: device %s has no port %d", verbs.ErrInvalidArgument, q.d.info.Name, port)
		}
		err = q.c.modifyInit(port, attr.AccessFlags, q.iw != nil)
		if err != nil {
			err = wrap("ibv_modify_qp(INIT)", err)
		} else if port == q.port || q.iw != nil {
			q.port = port
		} else {
			// Another port than the one CreateQP assumed: advertise its
			// GID and MTU.
			q.port = port
			q.gidIndex = 0
			q.self.Port = port
			if pi, ok := q.d.port(int(port)); ok {
				q.self.MTU = uint8(pi.ActiveMTU)
			}
			if g, ok := primaryGID(q.d.portGIDs(int(port), false)); ok {
				q.self.GID = g.gid
			}
			q.addr = q.self.Encode()
		}
	case verbs.QPRTR:
		if q.iw != nil {
			err = q.iw.rtr(attr)
		} else {
			err = q.rtr(attr)
		}
	case verbs.QPRTS:
		if q.iw != nil {
			err = q.iw.rts(attr)
		} else {
			maxRd := clampRd(attr.MaxRdAtomic, q.d.extra.maxInitRd)
			err = q.c.modifyRTS(attr.SQPSN&0xffffff, attr.Timeout, attr.RetryCount, attr.RNRRetry, maxRd, from == verbs.QPRTR)
			if err != nil {
				err = wrap("ibv_modify_qp(RTS)", err)
			}
		}
	case verbs.QPError:
		q.smu.Lock()
		err = q.c.modifyState(ibvQPSErr)
		if err != nil {
			err = wrap("ibv_modify_qp(ERR)", err)
		} else {
			q.fatal.Store(true)
			if q.iw != nil {
				q.flushed.Store(true)
			}
		}
		q.smu.Unlock()
	case verbs.QPReset:
		q.fixReset()
		q.fatal.Store(false)
		q.flushed.Store(false)
		if q.iw != nil {
			q.iw.reset()
		}
		err = q.c.modifyState(ibvQPSReset)
		if err != nil {
			err = wrap("ibv_modify_qp(RESET)", err)
		}
	}
	if err != nil {
		return err
	}
	q.attrMu.Lock()
	q.attr = vdriver.MergeAttr(q.attr, from, attr)
	q.attrMu.Unlock()
	q.state.Store(uint32(to))
	return nil
}

// clampRd bounds a read/atomic depth by the device's limit; 0 asks for the
// device's maximum (up to 16), so that RDMA Read and atomics work unless the
// caller says otherwise.
func clampRd(v uint8, dev int) uint8 {
	if dev <= 0 {
		dev = 1
	}
	if v == 0 {
		v = 16
	}
	if int(v) > dev {
		v = uint8(min(dev, 255))
	}
	return v
}

// peerAddress resolves the RTR address handle into the peer's Address
// (GID, LID, MTU, QPN where known).
func peerAddress(ah verbs.AddressHandle) (Address, error) {
	if len(ah.Dest) == AddressLen {
		return ParseAddress(ah.Dest)
	}
	if len(ah.Dest) == 16 {
		var a Address
		copy(a.GID[:], ah.Dest)
		return a, nil
	}
	if len(ah.Dest) != 0 {
		return Address{}, fmt.Errorf("%w (%d bytes)", ErrAddress, len(ah.Dest))
	}
	if ah.GID != nil {
		g, ok := GIDFromIP(ah.GID)
		if !ok {
			return Address{}, fmt.Errorf("%w: AddressHandle.GID %v", ErrAddress, ah.GID)
		}
		a := Address{GID: g}
		if ah.GID.To4() != nil || isV4Mapped(g) {
			a.IP = ah.GID
		}
		return a, nil
	}
	return Address{}, fmt.Errorf("%w: no peer address: set AddressHandle.Dest to the peer QP's Address() or AddressHandle.GID to its GID or IP", verbs.ErrInvalidArgument)
}

// rtr moves an IB/RoCE QP to RTR with an address vector for the peer.
func (q *qp) rtr(attr *verbs.QPAttr) error {
	if attr.MinRNRTimer > 31 {
		return fmt.Errorf("%w: min_rnr_timer %d (0..31)", verbs.ErrInvalidArgument, attr.MinRNRTimer)
	}
	if attr.PathMTU != 0 && attr.PathMTU.Bytes() == 0 {
		return fmt.Errorf("%w: path MTU %d", verbs.ErrInvalidArgument, attr.PathMTU)
	}
	peer, err := peerAddress(attr.AH)
	if err != nil {
		return err
	}
	pi, _ := q.d.port(int(q.port))
	mtu := attr.PathMTU
	if mtu == 0 {
		mtu = verbs.MTU4096
	}
	if pi.ActiveMTU != 0 && mtu > pi.ActiveMTU {
		mtu = pi.ActiveMTU
	}
	if peer.MTU != 0 && verbs.MTU(peer.MTU) < mtu {
		mtu = verbs.MTU(peer.MTU)
	}
	r := rtrAttr{destQPN: attr.DestQPN & 0xffffff, rqPSN: attr.RQPSN & 0xffffff, mtu: uint8(mtu),
		maxDestRd: clampRd(attr.MaxDestRdAtomic, q.d.extra.maxRdAtom), minRNR: attr.MinRNRTimer,
		port: q.port, dlid: peer.LID, dgid: peer.GID, hopLimit: 64, sl: attr.AH.SL, tclass: attr.AH.TrafficClass}
	if attr.AH.SL > 15 {
		return fmt.Errorf("%w: service level %d (0..15)", verbs.ErrInvalidArgument, attr.AH.SL)
	}
	if pi.LinkLayer == "Ethernet" || peer.LID == 0 {
		r.global = true
		idx, err := q.sgidIndex(peer.GID)
		if err != nil {
			return err
		}
		r.sgid = uint8(idx)
	}
	if err := q.c.modifyRTR(&r); err != nil {
		return wrap(fmt.Sprintf("ibv_modify_qp(RTR, dest QPN %#x, dgid %v, sgid index %d, mtu %d)",
			r.destQPN, fmtGID(peer.GID), r.sgid, mtu.Bytes()), err)
	}
	return nil
}

// sgidIndex chooses the local GID index for a destination GID;
// SetGIDIndex on the QP, else Options.GIDIndex (or RDMAKIT_IBV_GID_INDEX),
// overrides the choice.
func (q *qp) sgidIndex(dgid [16]byte) (int, error) {
	if q.gidIndex > 0 {
		return q.gidIndex - 1, nil
	}
	if o := q.d.opts; o.SetGIDIndex {
		return o.GIDIndex, nil
	}
	e, ok := pickSGID(q.d.portGIDs(int(q.port), false), dgid)
	if !ok {
		e, ok = pickSGID(q.d.portGIDs(int(q.port), true), dgid)
	}
	if !ok {
		return 0, fmt.Errorf("%w: port %d of %s has no GID; give its network device an IP address", verbs.ErrInvalidArgument, q.port, q.d.info.Name)
	}
	return e.index, nil
}

func fmtGID(g [16]byte) string {
	return fmt.Sprintf("%x:%x:%x:%x:%x:%x:%x:%x",
		uint16(g[0])<<8|uint16(g[1]), uint16(g[2])<<8|uint16(g[3]), uint16(g[4])<<8|uint16(g[5]), uint16(g[6])<<8|uint16(g[7]),
		uint16(g[8])<<8|uint16(g[9]), uint16(g[10])<<8|uint16(g[11]), uint16(g[12])<<8|uint16(g[13]), uint16(g[14])<<8|uint16(g[15]))
}

func postErr(i int, err error, format string, args ...any) error {
	return &verbs.PostError{Index: i, Err: fmt.Errorf("%w: "+format, append([]any{err}, args...)...)}
}

// check validates wr as verbs does for its own transports, plus the
// device's own limits (atomics, iWARP's missing immediate data and
// single-SGE RDMA Read).
func (q *qp) check(i int, wr *verbs.SendWR) error {
	if int(wr.Opcode) >= len(wrOpcodes) {
		return postErr(i, verbs.ErrInvalidArgument, "unknown opcode %d", wr.Opcode)
	}
	if len(wr.SGL) > q.cap.MaxSendSGE {
		return postErr(i, verbs.ErrInvalidArgument, "%d SGEs, max_send_sge is %d", len(wr.SGL), q.cap.MaxSendSGE)
	}
	if wr.Flags&verbs.SendInline != 0 {
		if wr.Opcode == verbs.OpRead || wr.Opcode.IsAtomic() {
			return postErr(i, verbs.ErrInvalidArgument, "%s cannot be inline", wr.Opcode)
		}
		total := uint64(0)
		for _, sg := range wr.SGL {
			total += uint64(sg.Length)
		}
		if total > uint64(q.cap.MaxInlineData) {
			return postErr(i, verbs.ErrInvalidArgument, "%d inline bytes, max_inline_data is %d", total, q.cap.MaxInlineData)
		}
	}
	if wr.Opcode.IsAtomic() {
		if q.d.info.AtomicCap == verbs.AtomicNone {
			return postErr(i, verbs.ErrNotSupported, "device %s has no atomics (atomic_cap ATOMIC_NONE)", q.d.info.Name)
		}
		if len(wr.SGL) != 1 || wr.SGL[0].Length != 8 {
			return postErr(i, verbs.ErrInvalidArgument, "an atomic needs one 8-byte SGE for the prior value")
		}
		if wr.RemoteAddr&7 != 0 {
			return postErr(i, verbs.ErrInvalidArgument, "misaligned atomic: remote address %#x is not 8-byte aligned", wr.RemoteAddr)
		}
	}
	if q.iw != nil {
		if wr.Opcode.HasImm() {
			return postErr(i, verbs.ErrNotSupported, "%s: iWARP has no immediate data (device %s)", wr.Opcode, q.d.info.Name)
		}
		if wr.Opcode == verbs.OpRead && len(wr.SGL) != 1 {
			return postErr(i, verbs.ErrNotSupported, "iWARP RDMA Read takes exactly one local SGE, got %d (device %s)", len(wr.SGL), q.d.info.Name)
		}
	}
	if q.quirks&quirkZeroLengthRead != 0 && wr.Opcode == verbs.OpRead && (len(wr.SGL) == 0 || wr.SGL[0].Length == 0) {
		return postErr(i, verbs.ErrNotSupported, "zero-length RDMA Read on %s: siw (Linux 6.1) can answer one with another request's length "+
			"and end the connection; the device does not declare zero-length-read", q.d.info.Name)
	}
	return nil
}

func (q *qp) PostSend(wrs []verbs.SendWR) error {
	st := verbs.QPState(q.state.Load())
	if st != verbs.QPRTS && st != verbs.QPError {
		return postErr(0, verbs.ErrInvalidState, "QP is %s, send needs RTS", st)
	}
	if q.iw != nil && st == verbs.QPRTS {
		if err := q.iw.waitEstablished(); err != nil {
			return &verbs.PostError{Index: 0, Err: err}
		}
	}
	if q.iw != nil && q.fatal.Load() {
		q.smu.Lock()
		q.flushLocked()
		q.smu.Unlock()
	}
	if q.iw != nil && q.flushed.Load() {
		for i := range wrs {
			q.scq.addSynth(verbs.WorkCompletion{WRID: wrs[i].ID, Status: verbs.StatusWRFlush,
				Opcode: wcOpcodes[wrs[i].Opcode&7], QPNum: q.num})
		}
		return nil
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.sq == nil {
		return postErr(0, verbs.ErrClosed, "QP %#x destroyed", q.num)
	}
	done := 0
	for done < len(wrs) {
		slots, used, splits := q.sq.maxWR(), 0, 0
		watch, watchID := -1, uint64(0)
		var verr error
		// q.fix.mu: siw's splits take it in the loop; rxe's stall watch
		// only when a work request will fail locally (rare).
		locked := q.quirks&quirkShortReadPage != 0
		if locked {
			q.fix.mu.Lock()
		}
		for done < len(wrs) && used < slots {
			wr := &wrs[done]
			if err := q.check(done, wr); err != nil {
				verr = err
				break
			}
			var cut uint32
			if q.quirks&quirkShortReadPage != 0 {
				cut = shortReadSplit(wr)
			}
			if cut == 0 {
				q.sq.setSend(used, wr, wrOpcodes[wr.Opcode], uint32(wr.Flags))
				q.slotWR[used], q.slotSplit[used] = int32(done), false
				used++
				if q.quirks&quirkLocalErrorStall != 0 && watch < 0 && q.failsLocally(wr) {
					watch, watchID = used-1, wr.ID
				}
				done++
				continue
			}
			// siw: a short Read across a page of its source, in two parts
			// (quirks.go). The first is unsignaled and tagged.
			if used+2 > slots {
				if used == 0 {
					verr = postErr(done, verbs.ErrQueueFull, "a %d-byte RDMA Read across a page boundary takes two send queue slots on %s, max_send_wr is %d",
						wr.SGL[0].Length, q.d.info.Name, slots)
				}
				break
			}
			splits++
			q.sq.setReadPart(used, wr, q.splitTagLocked(), uint32(wr.Flags)&^uint32(verbs.SendSignaled), 0, cut)
			q.slotWR[used], q.slotSplit[used] = int32(done), true
			q.sq.setReadPart(used+1, wr, wr.ID, uint32(wr.Flags), cut, wr.SGL[0].Length-cut)
			q.slotWR[used+1], q.slotSplit[used+1] = int32(done), false
			used += 2
			done++
		}
		if splits > 0 {
			q.fixUpdateLocked()
		}
		if watch >= 0 && !locked {
			q.fix.mu.Lock()
			locked = true
		}
		armed := watch >= 0 && q.watchLocked(watchID)
		var bad int
		var e syscall.Errno
		if used > 0 {
			bad, e = q.sq.postSend(used)
		}
		if e != 0 && armed && watch >= bad {
			q.unwatchLocked()
		}
		if e != 0 && splits > 0 && q.signalAll {
			// Forget the first parts that were not posted.
			for i := bad; i < used; i++ {
				if q.slotSplit[i] {
					q.fix.sigAllTags--
				}
			}
			q.fixUpdateLocked()
		}
		if locked {
			q.fix.mu.Unlock()
		}
		if e != 0 {
			return &verbs.PostError{Index: int(q.slotWR[bad]), Err: sendErr(e, q)}
		}
		if verr != nil {
			return verr
		}
	}
	return nil
}

func sendErr(e syscall.Errno, q *qp) error {
	switch e {
	case syscall.ENOMEM:
		return fmt.Errorf("%w: ibv_post_send: send queue holds %d work requests; poll completions first", verbs.ErrQueueFull, q.cap.MaxSendWR)
	case syscall.ENOTCONN:
		return fmt.Errorf("%w: ibv_post_send: QP %#x is not connected", verbs.ErrInvalidState, q.num)
	}
	return fmt.Errorf("ibv_post_send: %v: %w", e, mapErrno(e))
}

func (q *qp) PostRecv(wrs []verbs.RecvWR) error {
	if q.rq == nil && !q.hasSRQ {
		return postErr(0, verbs.ErrClosed, "QP %#x destroyed", q.num)
	}
	if verbs.QPState(q.state.Load()) == verbs.QPReset {
		return postErr(0, verbs.ErrInvalidState, "QP is RESET; receives can be posted from INIT on")
	}
	if q.iw != nil && q.fatal.Load() {
		q.smu.Lock()
		q.flushLocked()
		q.smu.Unlock()
	}
	if (q.iw != nil && q.flushed.Load()) || (q.quirks&quirkRecvInError != 0 && q.fatal.Load()) {
		// iWARP completes nothing posted in ERROR; rxe (Linux 6.1) flushes
		// it only at the next state change.
		for i := range wrs {
			q.rcq.addSynth(verbs.WorkCompletion{WRID: wrs[i].ID, Status: verbs.StatusWRFlush, Opcode: verbs.WCRecv, QPNum: q.num})
		}
		return nil
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.rq == nil {
		return postErr(0, verbs.ErrClosed, "QP %#x destroyed", q.num)
	}
	return postRecvChunks(q.rq, wrs, false)
}

// asyncEvent handles an asynchronous event for the QP. On a fatal error
// the QP is moved to ERROR explicitly: a provider that only reports the
// event (siw on a local protection error) then flushes the outstanding
// work requests, as the verbs contract promises.
func (q *qp) asyncEvent(typ int) {
	if !isFatalQPEvent(typ) {
		return
	}
	q.fatal.Store(true)
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.c != nil {
		q.c.modifyState(ibvQPSErr)
		if q.iw != nil {
			q.flushed.Store(true)
		}
	}
}

// enterError is called when an iWARP QP is known to have failed (error
// completion, connection lost): it moves the device QP to ERROR, so that
// outstanding work requests flush, on a goroutine of its own (callers hold
// locks that destroy takes).
func (q *qp) enterError() {
	q.fatal.Store(true)
	if q.iw == nil || q.flushed.Load() {
		return
	}
	go func() {
		q.smu.Lock()
		defer q.smu.Unlock()
		q.flushLocked()
	}()
}

// flushLocked moves a failed iWARP QP to ERROR on the device once; q.smu
// is held.
func (q *qp) flushLocked() {
	if q.c != nil && !q.flushed.Load() {
		q.c.modifyState(ibvQPSErr)
		q.flushed.Store(true)
	}
}

var wcOpcodes = [8]verbs.WCOpcode{verbs.WCWrite, verbs.WCWrite, verbs.WCSend, verbs.WCSend, verbs.WCRead,
	verbs.WCCompareAndSwap, verbs.WCFetchAndAdd, verbs.WCSend}

func (q *qp) Close() error {
	q.d.mu.Lock()
	delete(q.d.qps, q.id)
	if q.d.qpNums[q.num] == q {
		delete(q.d.qpNums, q.num)
	}
	q.d.mu.Unlock()
	return q.destroy()
}

func (q *qp) destroy() error {
	if q.iw != nil {
		q.iw.disconnect()
	}
	q.smu.Lock()
	q.rmu.Lock()
	defer q.rmu.Unlock()
	defer q.smu.Unlock()
	if q.c == nil {
		return nil
	}
	q.fixReset()
	err := q.c.destroy()
	q.c = nil
	if q.iw != nil {
		q.iw.destroy()
	}
	q.sq.free()
	q.rq.free()
	q.sq, q.rq = nil, nil
	if err != nil {
		return wrap("ibv_destroy_qp", err)
	}
	return nil
}

// establishTimeout bounds waiting for an rdma_cm connection.
var establishTimeout = 30 * time.Second
