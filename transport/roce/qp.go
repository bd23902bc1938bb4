package roce

// Per-QP driver: the soft.QPTransport methods, and the requester side.
//
// Goroutines: Modify, PostSend and Destroy run on application goroutines
// (Modify and Destroy serialised by modMu). The requester engine (req)
// and everything marked "mu" are guarded by mu and touched by
// application goroutines (PostSend), the timer (onTimer) and the
// endpoint's progress goroutine (responses). Transmitting requests is
// serialised by txMu (its batch and buffers); the order is txMu, then
// mu. Whoever asks for a flush while another goroutine transmits leaves
// it to that one (txMore) instead of waiting. The progress goroutine
// does not transmit requests itself: when a response lets more go, it
// hands the QP to the endpoint's sender goroutine (endpoint.kick), so
// that composing and checksumming a window of data does not hold up
// receiving. The responder side (responder.go) belongs to the progress
// goroutine, under rxMu.

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/stats"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	// defaultRdAtomic is max_rd_atomic / max_dest_rd_atomic when 0.
	defaultRdAtomic = 16
	// window bounds the request packets outstanding (unacknowledged) per
	// QP: the peer's socket buffer must hold them. A QP that retransmits
	// halves its window (down to minWindow: go-back-N resends at most a
	// window per loss) and grows it by 8 packets per ACK back to window.
	// 1024 (4 MiB at a 4096-byte MTU) rather than the 256 of before: a
	// round trip crosses several goroutine wake-ups on each side. In the
	// test VM write_bw 64 KiB went from 0.95 to 1.02 of rxe's, on the
	// host loopback from 3077 to 3417 MiB/s (medians of 6, 2026-11-30).
	window    = 1024
	minWindow = 32
	// referMin is the shortest request payload sent from registered
	// memory in place rather than copied into the packet buffer: below
	// it the copy costs less than the extra iovecs and key entries.
	referMin = 512
	// readRing bounds the READs whose PSNs are remembered (at least
	// max_rd_atomic).
	readRing = 256
)

// reqOps maps verbs opcodes to the engine's.
var reqOps = [...]rcproto.Opcode{
	verbs.OpWrite:          rcproto.OpWrite,
	verbs.OpWriteWithImm:   rcproto.OpWriteImm,
	verbs.OpSend:           rcproto.OpSend,
	verbs.OpSendWithImm:    rcproto.OpSendImm,
	verbs.OpRead:           rcproto.OpRead,
	verbs.OpCompareAndSwap: rcproto.OpCmpSwap,
	verbs.OpFetchAndAdd:    rcproto.OpFetchAdd,
}

type readRec struct {
	wr   uint64
	psn  rcproto.PSN
	npkt uint32
}

type qpDriver struct {
	ep   *endpoint
	qp   *soft.QP
	t    *rc.Target
	ltab keytab.Table
	num  uint32
	srq  bool
	// stats: the device's counters (internal/stats; nil: not counted).
	stats *stats.Counters

	modMu sync.Mutex

	// mu guards the fields below.
	mu      sync.Mutex
	state   verbs.QPState
	peer    netip.AddrPort
	peerQPN uint32
	mtu     uint32
	gso     bool               // the peer is rdmakit: GSO runs are fine
	req     *rcproto.Requester // from RTS until ERROR/RESET
	stopped bool               // the QP let go of the requester
	posted  uint64
	timer   *time.Timer
	pacer   *time.Timer // rate-limited sending resumes (armPacer)
	timerAt time.Duration
	armedAt time.Duration
	epoch   time.Time
	reads   [readRing]readRec
	rdHead  uint64
	rdTail  uint64
	maxSent rcproto.PSN // one past the highest request PSN sent
	anySent bool
	shrunk  bool // the window was halved for the retransmission in progress
	cc      dcqcn

	// txMore: a flush was asked for while txMu was held; its holder
	// flushes again before it leaves (see flush).
	txMore atomic.Bool
	// txKicked: queued for the endpoint's sender goroutine.
	txKicked atomic.Bool

	// txMu serialises transmitting requests: the batch below.
	txMu  sync.Mutex
	tx    *txBatch
	txPkt header.Packet
	next  rcproto.Packet
	peek  rcproto.Packet // canSend's scratch, under mu

	// rxMu: the responder side, held by the progress goroutine while it
	// handles this QP's packets (see responder.go).
	rxMu sync.Mutex
	rx   rxState
	// rxTouched: the progress goroutine holds rxMu for the current batch
	// (progress goroutine only).
	rxTouched bool
	// rxFlush: responses stepped this batch let requests go (progress
	// goroutine, set under mu).
	rxFlush bool
	// inBacklog: in the endpoint's backlog (progress goroutine only).
	inBacklog bool
}

func newQPDriver(ep *endpoint, qp *soft.QP, st *stats.Counters) *qpDriver {
	d := &qpDriver{ep: ep, qp: qp, stats: st, t: qp.Target(), ltab: qp.Keys(), num: qp.Num(), srq: qp.Cap().MaxRecvWR == 0, epoch: time.Now()}
	d.timer = time.AfterFunc(time.Hour, d.onTimer)
	d.timer.Stop()
	return d
}

func (d *qpDriver) Address() []byte { return encodeAddr(d.ep.local, d.num) }

func (d *qpDriver) now() time.Duration { return time.Since(d.epoch) + 1 }

func (d *qpDriver) Modify(from, to verbs.QPState, attr *verbs.QPAttr) error {
	d.modMu.Lock()
	defer d.modMu.Unlock()
	switch to {
	case verbs.QPInit:
		d.mu.Lock()
		d.state = to
		d.mu.Unlock()
	case verbs.QPRTR:
		if attr == nil {
			return fmt.Errorf("%w: RTR without attributes", verbs.ErrInvalidArgument)
		}
		return d.toRTR(attr)
	case verbs.QPRTS:
		if attr == nil {
			return fmt.Errorf("%w: RTS without attributes", verbs.ErrInvalidArgument)
		}
		d.mu.Lock()
		if from == verbs.QPRTR && d.req == nil && !d.stopped {
			d.startLocked(attr)
		} else if from == verbs.QPRTS && d.req != nil {
			d.applyLocked(d.req.Retune(attr.Timeout, attr.RetryCount, attr.RNRRetry, d.now()))
		}
		d.state = to
		d.mu.Unlock()
		d.flush()
	case verbs.QPError, verbs.QPReset:
		d.teardown()
		d.mu.Lock()
		d.state = to
		d.mu.Unlock()
	}
	return nil
}

func (d *qpDriver) toRTR(attr *verbs.QPAttr) error {
	var peer netip.AddrPort
	var err error
	qpn := attr.DestQPN
	rdmakitPeer := len(attr.AH.Dest) == addrLen
	if len(attr.AH.Dest) == 16 {
		// A bare GID, as other transports take it.
		peer, err = peerFromGID(net.IP(attr.AH.Dest))
	} else if len(attr.AH.Dest) > 0 {
		var n uint32
		peer, n, err = decodeAddr(attr.AH.Dest)
		if err == nil && n != qpn {
			err = fmt.Errorf("DestQPN %#x but the address is of QP %#x", qpn, n)
		}
	} else {
		peer, err = peerFromGID(attr.AH.GID)
	}
	if err != nil {
		return fmt.Errorf("%w: AddressHandle: %w", verbs.ErrInvalidArgument, err)
	}
	if peer.Addr().Is4() != d.ep.local.Addr().Is4() {
		return fmt.Errorf("%w: peer %s and local %s are of different IP families", verbs.ErrInvalidArgument, peer, d.ep.local)
	}
	if qpn > 0xffffff {
		return fmt.Errorf("%w: DestQPN %#x beyond 24 bits", verbs.ErrInvalidArgument, qpn)
	}
	mtu := uint32(d.ep.mtu.Bytes())
	if m := attr.PathMTU.Bytes(); m > 0 && uint32(m) < mtu {
		mtu = uint32(m)
	}
	d.rxMu.Lock()
	d.rx.start(d, peer, qpn, mtu, attr)
	d.rx.gso = rdmakitPeer
	d.rxMu.Unlock()
	d.mu.Lock()
	d.peer, d.peerQPN, d.mtu, d.gso = peer, qpn, mtu, rdmakitPeer
	d.state = verbs.QPRTR
	d.stopped = false
	d.mu.Unlock()
	if err := d.ep.addQP(d); err != nil {
		d.teardown()
		return err
	}
	return nil
}

// startLocked creates the requester engine at RTS.
func (d *qpDriver) startLocked(attr *verbs.QPAttr) {
	tail := d.qp.SendTail()
	d.posted = tail
	d.rdHead, d.rdTail = 0, 0
	d.anySent = false
	d.req = rcproto.NewRequester(rcproto.Config{
		FirstPSN:    rcproto.PSN(attr.SQPSN & rcproto.PSNMask),
		FirstWR:     tail,
		MaxWR:       d.qp.Cap().MaxSendWR,
		Timeout:     attr.Timeout,
		RetryCount:  attr.RetryCount,
		RNRRetry:    attr.RNRRetry,
		MaxRdAtomic: rdDepth(attr.MaxRdAtomic),
		MTU:         d.mtu,
		Window:      window,
		Stats:       d.stats,
	})
	d.cc.init(d.now())
	if d.tx == nil {
		d.tx = newTxBatch(d.ep)
		d.tx.referring(d.ltab)
		// Requests leave from a socket of the QP's own, so that each QP
		// has its UDP source port and ECMP spreads QPs over paths;
		// everything arrives on the endpoint's socket. Without one (out
		// of descriptors), the endpoint's port.
		if fd, local, err := listenFD(netip.AddrPortFrom(d.ep.local.Addr(), 0), false); err == nil {
			d.tx.fd, d.tx.local = fd, netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
		}
	}
	d.applyLocked(d.req.Connected(d.now()))
}

func rdDepth(n uint8) int {
	if n == 0 {
		return defaultRdAtomic
	}
	return int(n)
}

// teardown stops the QP's protocol: no packet is handled or sent for it
// once it returns.
func (d *qpDriver) teardown() {
	d.ep.removeQP(d)
	d.mu.Lock()
	d.stopLocked()
	d.req = nil
	d.mu.Unlock()
	d.rxMu.Lock()
	d.rx.stop()
	d.rxMu.Unlock()
	d.txMu.Lock()
	d.txMu.Unlock()
}

func (d *qpDriver) stopLocked() {
	d.stopped = true
	d.timer.Stop()
	if d.pacer != nil {
		d.pacer.Stop()
	}
	d.armedAt, d.timerAt = 0, 0
}

func (d *qpDriver) PostSend() {
	d.mu.Lock()
	ok := d.req != nil && !d.stopped
	d.mu.Unlock()
	if ok {
		d.flush()
	}
}

// PostRecv needs nothing: a requester that got an RNR NAK retries on its
// timer.
func (d *qpDriver) PostRecv() {}

func (d *qpDriver) Destroy() error {
	d.modMu.Lock()
	defer d.modMu.Unlock()
	if d.tx != nil {
		// A send waiting for room lets go of txMu, which teardown
		// takes.
		d.tx.closing.Store(true)
	}
	d.teardown()
	if d.tx != nil {
		d.txMu.Lock()
		if d.tx.fd >= 0 {
			sys.Close(d.tx.fd)
			d.tx.fd = -1
		}
		d.txMu.Unlock()
	}
	return nil
}

// failHeadLocked completes the oldest work request with st; the QP goes
// to ERROR.
func (d *qpDriver) failHeadLocked(st verbs.Status) {
	d.stopLocked()
	d.qp.CompleteSend(st)
}

// applyLocked carries out the requester's actions; a READ's placement is
// returned for the caller. ok is false once the QP let go.
func (d *qpDriver) applyLocked(acts []rcproto.Action) (place rcproto.Action, ok bool) {
	qp := d.qp
	for i := range acts {
		a := &acts[i]
		switch a.Kind {
		case rcproto.ActComplete:
			if d.stopped {
				return place, false
			}
			if fail, ok := qp.FinishSend(d.ltab, a.WR, verbs.Status(a.Status), a.Value); !ok {
				if fail != verbs.StatusSuccess {
					d.failHeadLocked(fail)
				} else {
					d.stopLocked()
				}
				return place, false
			}
		case rcproto.ActError:
			d.stopLocked()
			qp.Fail()
			return place, false
		case rcproto.ActTimer:
			d.setTimerLocked(a.Deadline)
		case rcproto.ActReadData:
			place = *a
		}
	}
	return place, !d.stopped
}

func (d *qpDriver) setTimerLocked(at time.Duration) {
	d.timerAt = at
	if at == 0 || d.stopped || (d.armedAt != 0 && d.armedAt <= at) {
		return
	}
	d.armedAt = at
	d.timer.Reset(at - d.now())
}

// onTimer runs on the timer at the requester's deadline.
func (d *qpDriver) onTimer() {
	d.mu.Lock()
	d.armedAt = 0
	if d.stopped || d.req == nil || d.timerAt == 0 {
		d.mu.Unlock()
		return
	}
	now := d.now()
	if now < d.timerAt {
		d.armedAt = d.timerAt
		d.timer.Reset(d.timerAt - now)
		d.mu.Unlock()
		return
	}
	_, ok := d.applyLocked(d.req.Tick(now))
	d.mu.Unlock()
	if ok {
		d.flush()
	}
}

// postLocked gives the engine the entries verbs published since.
func (d *qpDriver) postLocked() bool {
	qp := d.qp
	for tail := qp.SendTail(); d.posted < tail; {
		e := qp.SendEntry(d.posted)
		d.posted++
		w := rcproto.WR{Op: reqOps[e.WR.Opcode], Len: uint32(e.Len), Err: rc.Status(e.Status), Fence: e.WR.Flags&verbs.SendFence != 0}
		if e.WR.Opcode.IsAtomic() {
			w.Len = 8
		}
		if _, ok := d.applyLocked(d.req.Post(w, d.now())); !ok {
			return false
		}
	}
	return true
}

// flush transmits what the requester engine lets go, in batches. When
// another goroutine is transmitting for this QP, flush leaves the work
// to it and returns at once: the holder of txMu flushes again for every
// request that came while it held it, and looks once more after it lets
// go, so that none is lost.
func (d *qpDriver) flush() {
	d.txMore.Store(true)
	for d.txMu.TryLock() {
		for d.txMore.Swap(false) {
			d.flushLocked()
		}
		d.txMu.Unlock()
		if !d.txMore.Load() {
			return
		}
	}
}

// canSend reports whether the requester has packets it may send now
// (or work requests it has not taken yet).
func (d *qpDriver) canSend() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.req != nil && !d.stopped && (d.posted < d.qp.SendTail() || d.req.Peek(&d.peek))
}

// flushLocked is flush's work, under txMu.
func (d *qpDriver) flushLocked() {
	for {
		d.mu.Lock()
		if d.req == nil || d.stopped || !d.postLocked() {
			d.mu.Unlock()
			return
		}
		n := 0
		now := d.now()
		for buf := d.tx.buf(); buf != nil && d.cc.allow(now) && d.req.Next(&d.next); buf = d.tx.buf() {
			k := d.buildLocked(buf, &d.next)
			if k < 0 {
				d.mu.Unlock()
				// What was built goes (the batch holds keys entered
				// for it: they are let go once it is sent).
				d.tx.send()
				return
			}
			d.cc.sent(k, now)
			d.tx.add(k, d.peer, d.gso)
			n++
		}
		if n > 0 {
			d.applyLocked(d.req.Flushed(now))
		}
		wait := d.cc.wait(now)
		d.mu.Unlock()
		full := d.tx.buf() == nil
		if n > 0 {
			d.tx.send()
		}
		if !full {
			if wait > 0 {
				d.armPacer(wait)
			}
			return
		}
	}
}

// reqOpcode is the wire opcode of a request packet.
func reqOpcode(op verbs.Opcode, seg rcproto.Seg) header.Opcode {
	first, last := seg&rcproto.SegFirst != 0, seg&rcproto.SegLast != 0
	pick := func(f, m, l, limm, o, oimm header.Opcode, imm bool) header.Opcode {
		switch {
		case first && last && imm:
			return oimm
		case first && last:
			return o
		case first:
			return f
		case last && imm:
			return limm
		case last:
			return l
		}
		return m
	}
	switch op {
	case verbs.OpWrite, verbs.OpWriteWithImm:
		return pick(header.RCWriteFirst, header.RCWriteMiddle, header.RCWriteLast, header.RCWriteLastImm,
			header.RCWriteOnly, header.RCWriteOnlyImm, op == verbs.OpWriteWithImm)
	case verbs.OpSend, verbs.OpSendWithImm:
		return pick(header.RCSendFirst, header.RCSendMiddle, header.RCSendLast, header.RCSendLastImm,
			header.RCSendOnly, header.RCSendOnlyImm, op == verbs.OpSendWithImm)
	case verbs.OpRead:
		return header.RCReadRequest
	case verbs.OpCompareAndSwap:
		return header.RCCompareSwap
	}
	return header.RCFetchAdd
}

// buildLocked writes request packet p into buf and returns its length,
// or -1 when the work request's local memory went away (the QP failed).
func (d *qpDriver) buildLocked(buf []byte, p *rcproto.Packet) int {
	e := d.qp.SendEntry(p.WR)
	op := reqOpcode(e.WR.Opcode, p.Seg)
	n := 0
	if op.HasPayload() {
		n = int(p.Len)
	}
	hp := &d.txPkt
	total := header.Build(hp, buf, op, n)
	last := p.Seg&rcproto.SegLast != 0
	f := header.BTHFields{Opcode: op, PadCount: header.PadCount(n), PKey: header.DefaultPKey, DestQP: d.peerQPN,
		PSN: uint32(p.PSN), AckReq: p.AckReq || (last && op.HasPayload()) || p.Op.IsAtomic() || p.Op == rcproto.OpRead,
		Solicited: last && e.WR.Flags&verbs.SendSolicited != 0}
	hp.BTH.Encode(&f)
	if hp.RETH != nil {
		if op == header.RCReadRequest {
			hp.RETH.Encode(e.WR.RemoteAddr+uint64(p.Off), e.WR.RKey, p.Len)
			d.noteRead(p)
		} else {
			hp.RETH.Encode(e.WR.RemoteAddr, e.WR.RKey, uint32(e.Len))
		}
	}
	if hp.ImmDt != nil {
		hp.ImmDt.Encode(e.WR.Imm)
	}
	if hp.AtomicETH != nil {
		if e.WR.Opcode == verbs.OpCompareAndSwap {
			hp.AtomicETH.Encode(e.WR.RemoteAddr, e.WR.RKey, e.WR.Swap, e.WR.CompareAdd)
		} else {
			hp.AtomicETH.Encode(e.WR.RemoteAddr, e.WR.RKey, e.WR.CompareAdd, 0)
		}
	}
	if n > 0 {
		// A payload of referMin bytes or more goes from registered
		// memory in place (d.tx.refer), a shorter one or inline data
		// is copied.
		ok, keyOK := false, true
		if n >= referMin {
			ok, keyOK = d.tx.refer(e, int(p.Off), n, total-n-int(f.PadCount)-header.ICRCLen)
		}
		if !keyOK || (!ok && !d.gather(hp.Payload, e, int(p.Off))) {
			d.failHeadLocked(verbs.StatusLocalProtection)
			return -1
		}
	}
	if d.anySent && !p.PSN.After(d.maxSent.Add(rcproto.PSNMask)) {
		d.ep.stats.retransmits.Add(1)
		if !d.shrunk {
			// Once per go-back: halve the window.
			d.shrunk = true
			d.req.SetWindow(max(minWindow, d.req.Window()/2))
		}
	} else {
		d.shrunk = false
	}
	if !d.anySent || p.PSN.Add(1).After(d.maxSent) {
		d.maxSent, d.anySent = p.PSN.Add(1), true
	}
	return total // the ICRC is txBatch's
}

// gather copies len(dst) bytes of e's local gather list from offset off,
// each segment under its key.
func (d *qpDriver) gather(dst []byte, e *soft.SendEntry, off int) bool {
	return d.copyLocal(e, off, dst, false)
}

// scatter copies src into e's local scatter list at offset off.
func (d *qpDriver) scatter(e *soft.SendEntry, off int, src []byte) bool {
	return d.copyLocal(e, off, src, true)
}

// copyLocal copies between b and e's local segments from offset off, into
// the segments when in is set, out of them otherwise, each segment under
// its key; false when a key went away.
func (d *qpDriver) copyLocal(e *soft.SendEntry, off int, b []byte, in bool) bool {
	for i, s := range e.Local {
		if len(b) == 0 {
			break
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		if !d.ltab.EnterOpt(e.Pins[i]) {
			return false
		}
		var c int
		if in {
			c = copy(s[off:], b)
		} else {
			c = copy(b, s[off:])
		}
		d.ltab.LeaveOpt(e.Pins[i])
		b = b[c:]
		off = 0
	}
	return true
}

// noteRead remembers where a READ's response PSNs start.
func (d *qpDriver) noteRead(p *rcproto.Packet) {
	if d.rdTail > d.rdHead && d.reads[(d.rdTail-1)%readRing].wr == p.WR {
		return // asked again for the rest: same PSNs
	}
	first := p.PSN
	if d.mtu > 0 {
		first = p.PSN.Add(uint32(-int32(p.Off / d.mtu)))
	}
	if d.rdTail-d.rdHead == readRing {
		d.rdHead++
	}
	d.reads[d.rdTail%readRing] = readRec{wr: p.WR, psn: first, npkt: max(1, (p.Off+p.Len+d.mtu-1)/d.mtu)}
	d.rdTail++
}

// readOffset is the offset in its READ of a READ response with PSN q.
func (d *qpDriver) readOffset(q rcproto.PSN) (uint32, bool) {
	head := d.qp.SendHead()
	for d.rdHead < d.rdTail && d.reads[d.rdHead%readRing].wr < head {
		d.rdHead++
	}
	for i := d.rdHead; i < d.rdTail; i++ {
		r := &d.reads[i%readRing]
		if q.InRange(r.psn, r.psn.Add(r.npkt)) {
			return uint32(q.Sub(r.psn)) * d.mtu, true
		}
	}
	return 0, false
}

// response steps a response packet through the requester engine
// (progress goroutine, under rxMu).
func (d *qpDriver) response(p *header.Packet) {
	var rp rcproto.Packet
	rp.PSN = rcproto.PSN(p.BTH.PSN())
	op := p.Opcode()
	if p.AETH != nil {
		rp.MSN = p.AETH.MSN()
	}
	switch op {
	case header.RCAcknowledge:
		switch p.AETH.Kind() {
		case header.SynACK:
			rp.Op = rcproto.OpAck
		case header.SynRNRNAK:
			rp.Op, rp.Syn, rp.RNRTimer = rcproto.OpNak, rcproto.SynRNR, p.AETH.Value()
		case header.SynNAK:
			rp.Op = rcproto.OpNak
			switch p.AETH.Value() {
			case header.NAKSeqErr:
				rp.Syn = rcproto.SynSeqErr
			case header.NAKRemoteAccess:
				rp.Syn = rcproto.SynRemoteAccess
			case header.NAKRemoteOp:
				rp.Syn = rcproto.SynRemoteOp
			default:
				rp.Syn = rcproto.SynInvalidReq
			}
		default:
			return
		}
	case header.RCAtomicAcknowledge:
		rp.Op, rp.Value, rp.Len = rcproto.OpAtomicResp, p.AtomicAckETH.Orig(), 8
	case header.RCReadResponseFirst, header.RCReadResponseMiddle, header.RCReadResponseLast, header.RCReadResponseOnly:
		rp.Op, rp.Len = rcproto.OpReadResp, uint32(len(p.Payload))
		switch op {
		case header.RCReadResponseFirst:
			rp.Seg = rcproto.SegFirst
		case header.RCReadResponseLast:
			rp.Seg = rcproto.SegLast
		case header.RCReadResponseOnly:
			rp.Seg = rcproto.SegOnly
		}
	default:
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.req == nil || d.stopped || !d.postLocked() {
		return
	}
	if rp.Op == rcproto.OpReadResp {
		off, ok := d.readOffset(rp.PSN)
		if !ok {
			return // a stale response
		}
		rp.Off = off
	}
	now := d.now()
	acts := d.req.Step(&rp, now)
	// Only a response the engine took (it answers a PSN outstanding)
	// raises the rate and the window: a stray or spoofed one does not.
	if d.req.Accepted() && (rp.Op == rcproto.OpAck || rp.Op == rcproto.OpReadResp || rp.Op == rcproto.OpAtomicResp) {
		d.cc.acked(now)
		if w := d.req.Window(); w < window && rp.Op == rcproto.OpAck {
			d.req.SetWindow(min(window, w+8))
		}
	}
	place, ok := d.applyLocked(acts)
	d.rxFlush = true
	if !ok || place.Kind != rcproto.ActReadData {
		return
	}
	e := d.qp.SendEntry(place.WR)
	if int(place.Off)+len(p.Payload) > e.Len {
		d.applyLocked(d.req.PlaceFailed(rc.BadResponse, d.now()))
		return
	}
	if !d.scatter(e, int(place.Off), p.Payload) {
		d.applyLocked(d.req.PlaceFailed(rc.LocalProtection, d.now()))
		return
	}
	d.applyLocked(d.req.Placed(d.now()))
}
