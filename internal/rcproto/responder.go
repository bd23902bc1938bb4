package rcproto

// The responder half of an RC queue pair.
//
// Goroutines: none. A Responder is a plain state machine; its owner calls
// it from one goroutine at a time (transport/tcp: the link's reader
// goroutine only, without locks) and executes what it is told against
// target memory (rc.Target), reporting the outcome with Done.

import "github.com/rdmakit/rdmakit/internal/rc"

// RespConfig configures a Responder.
type RespConfig struct {
	FirstPSN PSN    // RQPSN: the PSN expected first
	MTU      uint32 // as the requester's Config.MTU
	// MaxDestRdAtomic bounds the READs and atomics whose responses are
	// not handed out yet; a request beyond it is NAKed as an invalid
	// request. 0 is unbounded.
	MaxDestRdAtomic int
}

// Verdict is what the owner does with a request packet.
type Verdict uint8

const (
	// Drop: discard the packet and its payload; whatever response it
	// needs (a repeated ACK, a replayed atomic result, a NAK) is queued.
	Drop Verdict = iota
	// Execute: check and execute the packet against target memory (a
	// repeated READ is executed again), then report with Done. For a
	// SEND or WRITE_IMM, a FIRST/ONLY packet takes a receive; none posted
	// is reported as rc.RNR.
	Execute
)

// Result is the outcome of an executed request.
type Result struct {
	// Status is Success; rc.RNR (no receive posted); or the status the
	// requester is to see: rc.RemoteAccess, rc.RemoteInvalidReq,
	// rc.RemoteOperation (each moves the responder to ERROR).
	Status   rc.Status
	Value    uint64 // atomics: the prior value of the target word
	Ref      uint64 // READ: the owner's tag for the data, echoed in its READ_RESP packets
	RNRTimer uint8  // rc.RNR: the responder's min_rnr_timer
}

// atomSlots is how many atomic results are kept for replay.
const atomSlots = 16

// readSlots is how many recent READs are remembered: a repeated READ
// request is executed again only when its PSN falls inside one of them
// (others are dropped; they were never asked for, or are too old to
// matter). It covers any max_rd_atomic (8 bits).
const readSlots = 256

// maxRepeats bounds the READ and atomic responses queued, repeats
// included, past which a repeated request is dropped when
// MaxDestRdAtomic is 0 (unbounded).
const maxRepeats = 255

type savedRead struct {
	psn PSN
	n   uint32 // READ_RESP packets
	len uint32
	ok  bool
}

type respEntry struct {
	pkt     Packet
	npkt    uint32 // READ_RESP packets
	done    uint32 // of which handed out
	stop    uint32 // hand out packets below this one (npkt, or fewer once superseded)
	counted bool   // counts against MaxDestRdAtomic
}

// Responder is the responder state machine (see the package comment).
type Responder struct {
	cfg  RespConfig
	epsn PSN    // next PSN expected
	msn  uint32 // messages completed (24 bits)

	inMsg  bool // inside a multi-packet WRITE/SEND
	msgOp  Opcode
	msgOff uint32

	nakSent bool // sequence error NAKed; quiet until epsn comes
	rnrWait bool // RNR NAKed; drop until epsn comes again
	failed  bool // ERROR after a fatal NAK

	cur  Packet // the packet told to Execute
	dup  bool   // cur is a repeated READ
	busy bool

	rdOut int // READs/atomics queued, not handed out
	rdQ   int // READ/atomic responses queued, repeats included
	held  int // READ/atomic responses handed out, not yet transmitted (Hold)

	atom    [atomSlots]savedAtomic
	atomPos int

	reads   [readSlots]savedRead
	readPos int

	q            []respEntry // ring of responses
	qHead, qTail uint64
}

type savedAtomic struct {
	psn   PSN
	value uint64
	ok    bool
}

// NewResponder returns a responder expecting cfg.FirstPSN.
func NewResponder(cfg RespConfig) *Responder {
	return &Responder{cfg: cfg, epsn: cfg.FirstPSN, q: make([]respEntry, 32)}
}

// Hold tells how many READ and atomic responses handed out by
// NextResponse the owner still holds, not yet transmitted (queued behind a
// peer that does not read): they count against MaxDestRdAtomic until they
// are on their way, so a peer cannot make the owner buffer responses
// without bound.
func (r *Responder) Hold(n int) { r.held = n }

// Expected returns the PSN expected next.
func (r *Responder) Expected() PSN { return r.epsn }

// Failed reports whether a fatal NAK moved the responder to ERROR.
func (r *Responder) Failed() bool { return r.failed }

// Step feeds a request packet and says what to do with it.
func (r *Responder) Step(p *Packet) Verdict {
	r.busy = false
	if r.failed || !p.Op.IsRequest() {
		return Drop
	}
	d := p.PSN.Sub(r.epsn)
	switch {
	case d == 0:
		r.nakSent, r.rnrWait = false, false
		if r.inMsg {
			if p.Seg&SegFirst != 0 || p.Op != r.msgOp || p.Off != r.msgOff {
				r.fatal(p.PSN, SynInvalidReq)
				return Drop
			}
		} else if p.Seg&SegFirst == 0 {
			r.fatal(p.PSN, SynInvalidReq)
			return Drop
		}
		if mtu := r.cfg.MTU; mtu != 0 && p.Op.isWriteLike() && (p.Len > mtu || (p.Seg&SegLast == 0 && p.Len != mtu)) {
			r.fatal(p.PSN, SynInvalidReq)
			return Drop
		}
		if p.Op.isReadLike() && r.cfg.MaxDestRdAtomic > 0 && r.rdOut+r.held >= r.cfg.MaxDestRdAtomic {
			r.fatal(p.PSN, SynInvalidReq)
			return Drop
		}
		r.cur, r.dup, r.busy = *p, false, true
		return Execute
	case d > 0:
		if !r.nakSent && !r.rnrWait {
			r.nakSent = true
			r.push(Packet{Op: OpNak, Syn: SynSeqErr, PSN: r.epsn}, 1, false)
		}
		return Drop
	}
	// A duplicate: the requester retransmitted.
	if p.Op.isReadLike() && !r.repeatRoom() {
		return Drop // as many responses queued as allowed: it asks again
	}
	switch {
	case p.Op.isWriteLike():
		r.ack(r.epsn.Add(PSNMask)) // acknowledge everything done
	case p.Op == OpRead:
		if !r.remembered(p) {
			return Drop
		}
		r.supersede(p.PSN)
		r.cur, r.dup, r.busy = *p, true, true
		return Execute
	default:
		for i := range r.atom {
			if a := &r.atom[i]; a.ok && a.psn == p.PSN {
				r.push(Packet{Op: OpAtomicResp, PSN: p.PSN, Len: 8, Value: a.value}, 1, false)
				break
			}
		}
		// Too old to remember: the requester has its response.
	}
	return Drop
}

// repeatRoom reports whether a repeated READ or atomic may queue its
// response: the READ and atomic responses queued, repeats included, and
// those the owner holds stay below MaxDestRdAtomic, so that a peer
// repeating requests cannot make the queue (or the owner's memory of
// READs) grow without bound.
func (r *Responder) repeatRoom() bool {
	limit := r.cfg.MaxDestRdAtomic
	if limit <= 0 {
		limit = maxRepeats
	}
	return r.rdQ+r.held < limit
}

// remembered reports whether a repeated READ request p asks again for
// (part of) a READ executed before: its PSN falls inside that READ's
// response PSNs, before the PSN expected, and it asks for no more than
// what that READ had left from there.
func (r *Responder) remembered(p *Packet) bool {
	for i := range r.reads {
		s := &r.reads[i]
		if !s.ok || !p.PSN.InRange(s.psn, s.psn.Add(s.n)) || s.psn.Sub(r.epsn) >= 0 {
			continue
		}
		left := s.len
		if mtu := r.cfg.MTU; mtu != 0 {
			left -= min(s.len, uint32(p.PSN.Sub(s.psn))*mtu)
		}
		return p.Len <= left
	}
	return false
}

// supersede stops handing out the rest of a queued READ response that a
// repeated READ request starting at q asks for again: the requester has
// everything before q and gets the rest from the new response, so the
// old one would only send it twice (on a datagram network, a READ answer
// is resent at most once per request).
func (r *Responder) supersede(q PSN) {
	for i := r.qHead; i < r.qTail; i++ {
		e := &r.q[i%uint64(len(r.q))]
		if e.pkt.Op == OpReadResp && q.InRange(e.pkt.PSN, e.pkt.PSN.Add(e.npkt)) && e.done < e.stop {
			e.stop = e.done
		}
	}
}

// Done reports the outcome of the packet last told to Execute.
func (r *Responder) Done(res Result) {
	if !r.busy {
		return
	}
	r.busy = false
	p := &r.cur
	switch res.Status {
	case rc.Success:
	case rc.RNR:
		r.push(Packet{Op: OpNak, Syn: SynRNR, RNRTimer: res.RNRTimer & 31, PSN: p.PSN}, 1, false)
		r.rnrWait = true
		return
	default:
		r.fatal(p.PSN, synOf(res.Status))
		return
	}
	switch {
	case p.Op.isWriteLike():
		r.epsn = r.epsn.Add(1)
		if p.Seg&SegLast != 0 {
			r.inMsg = false
			r.msn = (r.msn + 1) & PSNMask
			r.ack(p.PSN)
		} else {
			r.inMsg, r.msgOp, r.msgOff = true, p.Op, p.Off+p.Len
			if p.AckReq {
				r.ack(p.PSN)
			}
		}
	case p.Op == OpRead:
		n := npkt(r.cfg.MTU, p.Len)
		if !r.dup {
			r.reads[r.readPos] = savedRead{psn: p.PSN, n: n, len: p.Len, ok: true}
			r.readPos = (r.readPos + 1) % readSlots
			r.epsn = r.epsn.Add(n)
			r.msn = (r.msn + 1) & PSNMask
			r.rdOut++
		}
		r.push(Packet{Op: OpReadResp, PSN: p.PSN, Off: p.Off, Len: p.Len, Ref: res.Ref}, n, !r.dup)
	default:
		r.epsn = r.epsn.Add(1)
		r.msn = (r.msn + 1) & PSNMask
		r.rdOut++
		r.atom[r.atomPos] = savedAtomic{psn: p.PSN, value: res.Value, ok: true}
		r.atomPos = (r.atomPos + 1) % atomSlots
		r.push(Packet{Op: OpAtomicResp, PSN: p.PSN, Len: 8, Value: res.Value}, 1, true)
	}
}

// fatal NAKs q and moves to ERROR: nothing more is executed.
func (r *Responder) fatal(q PSN, syn Syndrome) {
	r.push(Packet{Op: OpNak, Syn: syn, PSN: q}, 1, false)
	r.failed = true
}

// ack queues an ACK of q, coalesced with an ACK still queued last.
func (r *Responder) ack(q PSN) {
	if r.qTail > r.qHead {
		if last := &r.q[(r.qTail-1)%uint64(len(r.q))]; last.pkt.Op == OpAck {
			last.pkt.PSN, last.pkt.MSN = q, r.msn
			return
		}
	}
	r.push(Packet{Op: OpAck, PSN: q}, 1, false)
}

// push queues a response. A trailing ACK of an earlier PSN is dropped:
// the new response acknowledges it implicitly.
func (r *Responder) push(p Packet, n uint32, counted bool) {
	if r.qTail > r.qHead {
		if last := &r.q[(r.qTail-1)%uint64(len(r.q))]; last.pkt.Op == OpAck && last.pkt.PSN.Before(p.PSN) {
			r.qTail--
		}
	}
	if r.qTail-r.qHead == uint64(len(r.q)) {
		q := make([]respEntry, 2*len(r.q))
		for i := r.qHead; i < r.qTail; i++ {
			q[i%uint64(len(q))] = r.q[i%uint64(len(r.q))]
		}
		r.q = q
	}
	p.MSN = r.msn
	if p.Op == OpReadResp || p.Op == OpAtomicResp {
		r.rdQ++
	}
	r.q[r.qTail%uint64(len(r.q))] = respEntry{pkt: p, npkt: n, stop: n, counted: counted}
	r.qTail++
}

// Pending reports whether responses are queued; with acks false, a lone
// trailing ACK (which may still coalesce) does not count.
func (r *Responder) Pending(acks bool) bool {
	if r.qTail == r.qHead {
		return false
	}
	return acks || r.qTail-r.qHead > 1 || r.q[r.qHead%uint64(len(r.q))].pkt.Op != OpAck
}

// NextResponse hands out the next response packet to transmit. With acks
// false it keeps back a trailing ACK, so that later ones coalesce with it:
// owners pass true when they are about to wait (ACKs then go out at once
// when idle, one for many under load).
func (r *Responder) NextResponse(p *Packet, acks bool) bool {
	for r.qHead < r.qTail {
		// Drop what a repeated READ superseded.
		e := &r.q[r.qHead%uint64(len(r.q))]
		if e.done < e.stop {
			break
		}
		r.pop(e)
	}
	if !r.Pending(acks) {
		return false
	}
	e := &r.q[r.qHead%uint64(len(r.q))]
	*p = e.pkt
	if e.pkt.Op == OpReadResp {
		p.Seg = SegOnly
		if e.npkt > 1 {
			mtu := r.cfg.MTU
			p.PSN = e.pkt.PSN.Add(e.done)
			p.Off = e.pkt.Off + e.done*mtu
			p.Len = min(mtu, e.pkt.Off+e.pkt.Len-p.Off)
			p.Seg = 0
			if e.done == 0 {
				p.Seg |= SegFirst
			}
			if e.done == e.npkt-1 {
				p.Seg |= SegLast
			}
		}
	}
	if e.done++; e.done >= e.stop {
		r.pop(e)
	}
	return true
}

// pop removes the head response e.
func (r *Responder) pop(e *respEntry) {
	if e.counted {
		r.rdOut--
	}
	if e.pkt.Op == OpReadResp || e.pkt.Op == OpAtomicResp {
		r.rdQ--
	}
	*e = respEntry{}
	r.qHead++
}
