package roce

// The responder side of a QP: run by the endpoint's progress goroutine
// under qpDriver.rxMu. It feeds request packets to the responder engine,
// executes what it says against the QP's rc.Target (keys, access and
// bounds are checked there), and turns the engine's responses into
// packets in the endpoint's transmit batch.

import (
	"net/netip"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

// rdSlots is how many READs' target memory is remembered for their
// responses. The engine queues fewer READ responses than that: up to
// MaxDestRdAtomic (≤ 255) new READs and, besides them, up to
// MaxDestRdAtomic repeated ones (510 at most), and a response is sent before another
// READ is executed; each READ takes the next slot, so a queued response's
// slot is never reused while it is queued. A slot also keeps the ref it
// was taken for, and emit checks it: a response whose slot was taken
// again is dropped rather than sent with another READ's bytes.
const rdSlots = 512

type rdSlot struct {
	mem []byte
	pin keytab.Pin
	ref uint64
}

type rxState struct {
	live    bool
	dropAll bool
	peer    netip.AddrPort
	peerIP  netip.Addr
	peerQPN uint32
	resp    *rcproto.Responder
	keys    keytab.Cache
	pkt     rcproto.Packet
	hdr     header.Packet

	// The WRITE in progress (from its FIRST packet).
	wMem []byte
	wPin keytab.Pin
	wOff int
	// The SEND in progress: its receive and where it is.
	wqe   rc.RecvWQE
	segs  [rc.MaxSGE][]byte
	rpins [rc.MaxSGE]keytab.Pin
	nseg  int
	sOff  int
	sCap  int

	rd    [rdSlots]rdSlot
	rdSeq uint64

	cnpSent bool
	lastCNP time.Duration
	gso     bool // the peer is rdmakit
}

func (r *rxState) start(d *qpDriver, peer netip.AddrPort, peerQPN, mtu uint32, attr *verbs.QPAttr) {
	*r = rxState{live: true, peer: peer, peerIP: peer.Addr(), peerQPN: peerQPN}
	r.resp = rcproto.NewResponder(rcproto.RespConfig{FirstPSN: rcproto.PSN(attr.RQPSN & rcproto.PSNMask), MTU: mtu,
		MaxDestRdAtomic: rdDepth(attr.MaxDestRdAtomic)})
}

func (r *rxState) stop() {
	r.live = false
	r.resp = nil
	r.wMem = nil
	clear(r.segs[:])
	clear(r.rd[:])
}

// input handles one packet for this QP.
func (d *qpDriver) input(p *header.Packet, ce bool) {
	r := &d.rx
	if !r.live {
		return
	}
	op := p.Opcode()
	switch {
	case op == header.CNP:
		d.ep.stats.rxCNP.Add(1)
		d.mu.Lock()
		d.cc.cnp(d.now())
		d.mu.Unlock()
		return
	case isRequest(op):
		if ce {
			d.sendCNP(d.now())
		}
		d.request(p)
	default:
		d.response(p)
	}
}

func isRequest(op header.Opcode) bool {
	return op <= header.RCReadRequest || op == header.RCCompareSwap || op == header.RCFetchAdd
}

// reqPacket maps a request's wire opcode to the engine's: the operation
// family (WRITE and SEND stay the same across the packets of a message;
// immediate data is the owner's business) and the segment.
func reqPacket(op header.Opcode) (rcproto.Opcode, rcproto.Seg, bool) {
	switch op {
	case header.RCSendFirst:
		return rcproto.OpSend, rcproto.SegFirst, true
	case header.RCSendMiddle:
		return rcproto.OpSend, 0, true
	case header.RCSendLast, header.RCSendLastImm:
		return rcproto.OpSend, rcproto.SegLast, true
	case header.RCSendOnly, header.RCSendOnlyImm:
		return rcproto.OpSend, rcproto.SegOnly, true
	case header.RCWriteFirst:
		return rcproto.OpWrite, rcproto.SegFirst, true
	case header.RCWriteMiddle:
		return rcproto.OpWrite, 0, true
	case header.RCWriteLast, header.RCWriteLastImm:
		return rcproto.OpWrite, rcproto.SegLast, true
	case header.RCWriteOnly, header.RCWriteOnlyImm:
		return rcproto.OpWrite, rcproto.SegOnly, true
	case header.RCReadRequest:
		return rcproto.OpRead, rcproto.SegOnly, true
	case header.RCCompareSwap:
		return rcproto.OpCmpSwap, rcproto.SegOnly, true
	case header.RCFetchAdd:
		return rcproto.OpFetchAdd, rcproto.SegOnly, true
	}
	return 0, 0, false
}

// request feeds a request packet to the responder engine and executes it
// if the engine says so.
func (d *qpDriver) request(p *header.Packet) {
	r := &d.rx
	if r.dropAll || r.resp.Failed() {
		return
	}
	op := p.Opcode()
	eop, seg, ok := reqPacket(op)
	if !ok {
		return // SEND with invalidate and the like: not served
	}
	rp := &r.pkt
	*rp = rcproto.Packet{Op: eop, Seg: seg, PSN: rcproto.PSN(p.BTH.PSN()), AckReq: p.BTH.AckReq(), Len: uint32(len(p.Payload))}
	switch eop {
	case rcproto.OpWrite:
		if seg&rcproto.SegFirst == 0 {
			rp.Off = uint32(r.wOff)
		}
	case rcproto.OpSend:
		if seg&rcproto.SegFirst == 0 {
			rp.Off = uint32(r.sOff)
		}
	case rcproto.OpRead:
		rp.Len = p.RETH.DMALen()
	case rcproto.OpCmpSwap, rcproto.OpFetchAdd:
		rp.Len = 8
	}
	if r.resp.Step(rp) == rcproto.Drop {
		if r.resp.Failed() {
			d.failResponder()
		}
		return
	}
	t := d.t
	if !t.Accepting() {
		r.dropAll = true
		return
	}
	var res rcproto.Result
	last := seg&rcproto.SegLast != 0
	switch eop {
	case rcproto.OpWrite:
		if seg&rcproto.SegFirst != 0 {
			m, pin, st := t.RemotePin(&r.keys, p.RETH.RKey(), p.RETH.VA(), int(p.RETH.DMALen()), rc.AccessRemoteWrite)
			if st != rc.Success {
				res.Status = st
				break
			}
			r.wMem, r.wPin, r.wOff = m, pin, 0
		}
		end := r.wOff + len(p.Payload)
		if end > len(r.wMem) || (last && end != len(r.wMem)) {
			res.Status = rc.RemoteInvalidReq
			break
		}
		imm := p.ImmDt != nil
		if imm && !t.PopRecv(&r.wqe) {
			res.Status, res.RNRTimer = rc.RNR, t.MinRNR()
			break
		}
		if len(p.Payload) > 0 {
			if !t.Enter(r.wPin) {
				if imm {
					d.recvDone(rc.WRFlush, 0, 0, false)
				}
				res.Status = rc.RemoteAccess
				break
			}
			copy(r.wMem[r.wOff:], p.Payload)
			t.Leave(r.wPin)
		}
		r.wOff = end
		if imm {
			t.Complete(&rc.WC{WRID: r.wqe.WRID, Opcode: rc.WCRecvWriteImm, ByteLen: uint32(len(r.wMem)), Imm: p.ImmDt.Imm(),
				Flags: rc.WCWithImm, QPN: t.QPN(), SrcQP: r.peerQPN})
		}
		if last {
			r.wMem = nil
		}
	case rcproto.OpSend:
		if seg&rcproto.SegFirst != 0 {
			if !t.PopRecv(&r.wqe) {
				res.Status, res.RNRTimer = rc.RNR, t.MinRNR()
				break
			}
			k, st := t.ScatterRecvPin(&r.wqe, int(r.wqe.Total()), r.segs[:], r.rpins[:])
			if st != rc.Success {
				d.recvFailed(st)
				return
			}
			r.nseg, r.sOff, r.sCap = k, 0, int(r.wqe.Total())
		}
		if r.sOff+len(p.Payload) > r.sCap {
			d.recvFailed(rc.LocalLength)
			return
		}
		if !d.scatterRecv(p.Payload) {
			d.recvFailed(rc.LocalProtection)
			return
		}
		if last {
			var imm uint32
			if p.ImmDt != nil {
				imm = p.ImmDt.Imm()
			}
			d.recvDone(rc.Success, uint32(r.sOff), imm, p.ImmDt != nil)
		}
	case rcproto.OpRead:
		m, pin, st := t.RemotePin(&r.keys, p.RETH.RKey(), p.RETH.VA(), int(p.RETH.DMALen()), rc.AccessRemoteRead)
		res.Status = st
		if st == rc.Success {
			r.rd[r.rdSeq%rdSlots] = rdSlot{mem: m, pin: pin, ref: r.rdSeq}
			res.Ref = r.rdSeq
			r.rdSeq++
		}
	case rcproto.OpCmpSwap, rcproto.OpFetchAdd:
		a := p.AtomicETH
		m, pin, st := t.AtomicPin(a.RKey(), a.VA())
		if st != rc.Success {
			res.Status = st
			break
		}
		if !t.Enter(pin) {
			res.Status = rc.RemoteAccess
			break
		}
		if eop == rcproto.OpCmpSwap {
			res.Value = sys.CompareSwap64(m, 0, a.Compare(), a.SwapAdd())
		} else {
			res.Value = sys.FetchAdd64(m, 0, a.SwapAdd())
		}
		t.Leave(pin)
	}
	r.resp.Done(res)
	if r.resp.Failed() {
		d.failResponder()
	}
}

// scatterRecv copies a SEND packet's payload into the receive at sOff.
func (d *qpDriver) scatterRecv(src []byte) bool {
	r := &d.rx
	off := r.sOff
	for i := 0; i < r.nseg && len(src) > 0; i++ {
		s := r.segs[i]
		if off >= len(s) {
			off -= len(s)
			continue
		}
		if !d.t.Enter(r.rpins[i]) {
			return false
		}
		c := copy(s[off:], src)
		d.t.Leave(r.rpins[i])
		src = src[c:]
		r.sOff += c
		off = 0
	}
	return len(src) == 0
}

// recvDone completes the receive of the SEND (or WRITE with immediate)
// in progress.
func (d *qpDriver) recvDone(st rc.Status, n, imm uint32, withImm bool) {
	r := &d.rx
	wc := rc.WC{WRID: r.wqe.WRID, Status: st, Opcode: rc.WCRecv, ByteLen: n, QPN: d.t.QPN(), SrcQP: r.peerQPN}
	if withImm {
		wc.Imm, wc.Flags = imm, rc.WCWithImm
	}
	d.t.Complete(&wc)
	clear(r.segs[:])
	r.nseg = 0
}

// recvFailed: the receive cannot take the message. It completes with st,
// the requester is NAKed and this QP goes to ERROR.
func (d *qpDriver) recvFailed(st rc.Status) {
	d.recvDone(st, 0, 0, false)
	res := rcproto.Result{Status: rc.RemoteOperation}
	if st == rc.LocalLength {
		res.Status = rc.RemoteInvalidReq
	}
	d.rx.resp.Done(res)
	d.failResponder()
}

// failResponder sends the fatal NAK and moves the QP to ERROR.
func (d *qpDriver) failResponder() {
	d.drainResponses()
	d.rx.dropAll = true
	d.t.Fail(!d.srq)
	d.mu.Lock()
	d.stopLocked()
	d.mu.Unlock()
	d.qp.Fail()
}

// rxDone ends a receive batch for this QP: responses out, the lock given
// back, and requests the responses let go sent.
func (d *qpDriver) rxDone() {
	if d.rx.live && d.rx.resp != nil {
		d.drainBurst()
	}
	d.rxTouched = false
	fl := d.rxFlush
	d.rxFlush = false
	d.rxMu.Unlock()
	if fl && d.canSend() {
		d.ep.kick(d)
	}
}

// respBurst bounds the responses (READ data, mostly) one QP sends before
// the progress goroutine receives again: a long READ goes out in bursts
// between receive batches instead of in one blast.
const respBurst = 128

// drainBurst sends up to respBurst responses; a QP with more waits in
// the endpoint's backlog for the next round.
func (d *qpDriver) drainBurst() {
	r := &d.rx
	for i := 0; i < respBurst; i++ {
		if !r.resp.NextResponse(&r.pkt, true) {
			return
		}
		d.emit(&r.pkt)
	}
	if r.resp.Pending(true) && !d.inBacklog {
		d.inBacklog = true
		d.ep.backlog = append(d.ep.backlog, d)
	}
}

// drainResponses turns the engine's responses into packets.
func (d *qpDriver) drainResponses() {
	r := &d.rx
	for r.resp.NextResponse(&r.pkt, true) {
		d.emit(&r.pkt)
	}
}

// emit writes one response packet into the endpoint's batch.
func (d *qpDriver) emit(p *rcproto.Packet) {
	r := &d.rx
	ep := d.ep
	buf := ep.txBuf()
	var op header.Opcode
	n := 0
	var data []byte
	var slot *rdSlot
	switch p.Op {
	case rcproto.OpAck, rcproto.OpNak:
		op = header.RCAcknowledge
	case rcproto.OpAtomicResp:
		op = header.RCAtomicAcknowledge
	case rcproto.OpReadResp:
		switch p.Seg {
		case rcproto.SegOnly:
			op = header.RCReadResponseOnly
		case rcproto.SegFirst:
			op = header.RCReadResponseFirst
		case rcproto.SegLast:
			op = header.RCReadResponseLast
		default:
			op = header.RCReadResponseMiddle
		}
		slot = &r.rd[p.Ref%rdSlots]
		n = int(p.Len)
		if slot.ref != p.Ref || int(p.Off)+n > len(slot.mem) {
			return // cannot happen: the engine asks for what the READ named, while its slot is kept
		}
		data = slot.mem[p.Off : int(p.Off)+n]
	}
	h := &r.hdr
	total := header.Build(h, buf, op, n)
	h.BTH.Encode(&header.BTHFields{Opcode: op, PadCount: header.PadCount(n), PKey: header.DefaultPKey, DestQP: r.peerQPN, PSN: uint32(p.PSN)})
	if h.AETH != nil {
		syn := uint8(header.SynACK | header.CreditsUnlimited)
		if p.Op == rcproto.OpNak {
			syn = nakSyndrome(p)
		}
		h.AETH.Encode(syn, p.MSN)
	}
	if h.AtomicAckETH != nil {
		h.AtomicAckETH.Encode(p.Value)
	}
	if n > 0 {
		if !d.t.Enter(slot.pin) {
			// Deregistered before its data went out: the READ fails
			// with a remote access error, and this QP goes to ERROR.
			total = header.Build(h, buf, header.RCAcknowledge, 0)
			h.BTH.Encode(&header.BTHFields{Opcode: header.RCAcknowledge, PKey: header.DefaultPKey, DestQP: r.peerQPN, PSN: uint32(p.PSN)})
			h.AETH.Encode(header.SynNAK|header.NAKRemoteAccess, p.MSN)
			r.dropAll = true
			d.t.Fail(!d.srq)
		} else {
			copy(h.Payload, data)
			d.t.Leave(slot.pin)
		}
	}
	ep.txAdd(total, r.peer, r.gso)
}

func nakSyndrome(p *rcproto.Packet) uint8 {
	switch p.Syn {
	case rcproto.SynRNR:
		return header.SynRNRNAK | p.RNRTimer&0x1f
	case rcproto.SynSeqErr:
		return header.SynNAK | header.NAKSeqErr
	case rcproto.SynRemoteAccess:
		return header.SynNAK | header.NAKRemoteAccess
	case rcproto.SynRemoteOp:
		return header.SynNAK | header.NAKRemoteOp
	}
	return header.SynNAK | header.NAKInvalidReq
}
