package rcproto

// The requester half of an RC queue pair.
//
// Goroutines: none. A Requester is a plain state machine; its owner calls
// it from one goroutine at a time (transport/tcp: under qpDriver.mu) and
// carries out the actions it returns. It reads no clock: every input that
// needs the time takes the owner's monotonic now.

import (
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/stats"
)

// Config configures a Requester.
type Config struct {
	FirstPSN PSN    // SQPSN: the PSN of the first packet
	FirstWR  uint64 // the number of the first work request posted (e.g. a send queue position)
	MaxWR    int    // work requests outstanding at once at most (the send queue depth)

	Timeout     uint8 // local ACK timeout, IB encoding: 4.096 µs × 2^Timeout; 0 is infinite
	RetryCount  uint8 // retry_cnt: timeouts (and sequence NAKs) retried before RetryExceeded
	RNRRetry    uint8 // rnr_retry: RNR NAKs retried per request; 7 is infinite
	MaxRdAtomic int   // max_rd_atomic: READs and atomics outstanding at once; 0 is unbounded

	// MTU is the payload of one packet: longer WRITEs and SENDs go out as
	// FIRST/MIDDLE/LAST packets, longer READs come back so. 0 means one
	// packet per message (a stream transport).
	MTU uint32
	// Window bounds the packets outstanding at once; 0 is unbounded.
	Window int
	// Reliable says the network is a reliable ordered stream (TCP): it
	// loses nothing, so nothing is retransmitted on a timeout (the timeout
	// only bounds a stalled peer), a sequence error NAK means the two sides
	// disagree on the initial PSN (fatal: RetryExceeded), and a response
	// that makes no sense is fatal too (BadResponse) instead of a stale
	// duplicate to ignore.
	Reliable bool
	// ConnectTimeout bounds how long posted work requests wait for
	// Connected before the oldest fails with RetryExceeded; 0 is forever.
	ConnectTimeout time.Duration
	// Stats counts retransmissions and RNR NAKs (nil: not counted).
	Stats *stats.Counters
}

// WR is what the requester needs of a work request.
type WR struct {
	Op  Opcode // request opcode
	Len uint32 // message length (8 for atomics)
	// Err, unless Success, is the status of a work request that failed
	// local validation: it is never transmitted and completes with Err,
	// in order, once everything posted before it has completed.
	Err rc.Status
	// Fence (IBV_SEND_FENCE): the work request is not transmitted until
	// every READ and atomic posted before it has completed.
	Fence bool
}

type wrState struct {
	op    Opcode
	err   rc.Status
	fence bool
	len   uint32
	psn   PSN    // first PSN
	npkt  uint32 // PSNs it occupies (READ: response packets)
	got   uint32 // READ: bytes received, in order
	sent  bool   // transmitted at least once
}

func (w *wrState) end() PSN { return w.psn.Add(w.npkt) }

// Requester is the requester state machine (see the package comment).
type Requester struct {
	cfg   Config
	ackTO time.Duration
	wrs   []wrState // ring indexed by WR number
	mask  uint64

	head, tail uint64 // oldest uncompleted WR, next WR number
	tx         uint64 // next WR to transmit
	txSeg      uint32 // and its next packet (WRITE/SEND)
	psnTail    PSN    // first PSN of the next WR posted
	una        PSN    // oldest unacknowledged PSN
	sent       PSN    // one past the highest PSN transmitted
	rdOut      int    // READs/atomics transmitted and not completed
	accepted   bool   // the response last fed to Step answered a PSN outstanding

	connected bool
	lost      bool // the peer is gone for good (stream closed)
	failed    bool // ERROR: everything completed or flushed

	rnrWait  bool
	rnrUntil time.Duration
	probe    bool   // after an RNR NAK: transmit only probeWR until it completes
	probeWR  uint64 // the WR that got the RNR NAK
	rnrWR    uint64 // WR that rnrUsed counts for
	rnrUsed  int
	retries  int           // retries left (retry_cnt)
	ackAt    time.Duration // ACK timeout deadline, 0 if disarmed
	connAt   time.Duration // connect deadline, 0 if disarmed
	timerAt  time.Duration // deadline last announced with ActTimer
	txPend   bool          // packets handed out by Next since Flushed
	inaValid bool          // an implied NAK went back to inaPSN
	inaPSN   PSN
	placing  bool // ActReadData given, Placed not called yet
	placeWR  uint64
	placeLen uint32

	acts []Action
}

// NewRequester returns a requester in its initial state (not connected).
func NewRequester(cfg Config) *Requester {
	n := 1
	for n < cfg.MaxWR {
		n <<= 1
	}
	return &Requester{
		cfg:     cfg,
		ackTO:   TimeoutDuration(cfg.Timeout),
		wrs:     make([]wrState, n),
		mask:    uint64(n - 1),
		head:    cfg.FirstWR,
		tail:    cfg.FirstWR,
		tx:      cfg.FirstWR,
		psnTail: cfg.FirstPSN,
		una:     cfg.FirstPSN,
		sent:    cfg.FirstPSN,
		retries: int(cfg.RetryCount),
		rnrWR:   ^uint64(0),
		acts:    make([]Action, 0, 16),
	}
}

// npkt is how many PSNs a message of n bytes occupies.
func npkt(mtu, n uint32) uint32 {
	if mtu == 0 || n <= mtu {
		return 1
	}
	return (n + mtu - 1) / mtu
}

func (r *Requester) wr(n uint64) *wrState { return &r.wrs[n&r.mask] }

// Accepted reports whether the response last fed to Step answered a PSN
// outstanding (what owners let feed congestion control: a stray or
// spoofed response does not).
func (r *Requester) Accepted() bool { return r.accepted }

// Failed reports whether the requester moved the QP to ERROR.
func (r *Requester) Failed() bool { return r.failed }

// Outstanding returns the number of posted, uncompleted work requests.
func (r *Requester) Outstanding() int { return int(r.tail - r.head) }

// Head returns the number of the oldest uncompleted work request.
func (r *Requester) Head() uint64 { return r.head }

// Unsent returns how many WRs were posted but not transmitted yet (a
// go-back counts again what it will retransmit).
func (r *Requester) Unsent() int { return int(r.tail - r.tx) }

// Post adds a work request; it is transmitted when Next hands it out.
func (r *Requester) Post(w WR, now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.failed {
		r.acts = append(r.acts, Action{Kind: ActComplete, WR: r.tail, Status: rc.WRFlush})
		r.tail++
		r.head, r.tx = r.tail, r.tail
		return r.acts
	}
	if r.tail-r.head >= uint64(len(r.wrs)) {
		panic(fmt.Sprintf("rcproto: more than %d work requests posted", len(r.wrs)))
	}
	if w.Op.IsAtomic() {
		w.Len = 8
	}
	n := npkt(r.cfg.MTU, w.Len)
	*r.wr(r.tail) = wrState{op: w.Op, err: w.Err, fence: w.Fence, len: w.Len, psn: r.psnTail, npkt: n}
	r.tail++
	r.psnTail = r.psnTail.Add(n)
	if !r.connected && r.cfg.ConnectTimeout > 0 && r.connAt == 0 {
		r.connAt = now + r.cfg.ConnectTimeout
	}
	r.settle()
	r.timer()
	return r.acts
}

// Connected tells that the network path is up: transmission may start.
func (r *Requester) Connected(now time.Duration) []Action {
	r.acts = r.acts[:0]
	r.connected = true
	r.connAt = 0
	r.timer()
	return r.acts
}

// PeerLost tells that the peer is gone for good (a stream transport's
// connection ended): the oldest work request, now or when one is posted,
// fails with RetryExceeded.
func (r *Requester) PeerLost(now time.Duration) []Action {
	r.acts = r.acts[:0]
	r.lost = true
	r.settle()
	r.timer()
	return r.acts
}

// Fail moves the requester to ERROR from outside the protocol (a local
// error): the oldest work request, if any, completes with st.
func (r *Requester) Fail(st rc.Status) []Action {
	r.acts = r.acts[:0]
	if !r.failed {
		r.fail(st)
	}
	r.timer()
	return r.acts
}

// Activity tells that the peer showed signs of life other than responses
// (a stream transport moved bytes): the ACK timeout starts over with
// every retry available.
func (r *Requester) Activity(now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.ackAt != 0 {
		r.ackAt = now + r.ackTO
		r.retries = int(r.cfg.RetryCount)
	}
	r.timer()
	return r.acts
}

// Peek is Next without taking the packet.
func (r *Requester) Peek(p *Packet) bool { return r.next(p, false) }

// Next hands out the next packet to transmit, if the protocol allows one
// now; the owner builds it from its work request p.WR (p.Off and p.Len
// select the part of the payload or of the remote range). Call Flushed
// once the packets handed out are on their way.
func (r *Requester) Next(p *Packet) bool { return r.next(p, true) }

func (r *Requester) next(p *Packet, take bool) bool {
	if r.failed || !r.connected || r.rnrWait || r.lost {
		return false
	}
	if r.tx < r.head {
		r.tx, r.txSeg = r.head, 0
	}
	if r.tx == r.tail || (r.probe && r.tx != r.probeWR) {
		return false
	}
	w := r.wr(r.tx)
	if w.err != rc.Success {
		return false // completed by settle when its turn comes
	}
	mtu := r.cfg.MTU
	*p = Packet{Op: w.op, Seg: SegOnly, WR: r.tx, Len: w.len, PSN: w.psn}
	last := w.psn // last PSN this packet occupies
	switch {
	case w.op.isWriteLike():
		if mtu != 0 && w.npkt > 1 {
			p.PSN = w.psn.Add(r.txSeg)
			p.Off = r.txSeg * mtu
			p.Len = min(mtu, w.len-p.Off)
			p.Seg = 0
			if r.txSeg == 0 {
				p.Seg |= SegFirst
			}
			if r.txSeg == w.npkt-1 {
				p.Seg |= SegLast
			}
		}
		last = p.PSN
	case w.op == OpRead:
		// A partially answered READ asks again for what is missing.
		seg := uint32(0)
		if mtu != 0 {
			seg = w.got / mtu
		}
		p.PSN = w.psn.Add(seg)
		p.Off = seg * mtu
		p.Len = w.len - p.Off
		last = w.end().Add(PSNMask) // end - 1
	}
	if n := r.cfg.Window; n > 0 {
		if p.PSN.Sub(r.una) >= int32(n) {
			return false
		}
		p.AckReq = p.PSN.Sub(r.una) == int32(n)-1
	}
	if w.op.isReadLike() && !w.sent && r.cfg.MaxRdAtomic > 0 && r.rdOut >= r.cfg.MaxRdAtomic {
		return false
	}
	if w.fence && !w.sent && r.rdOut > 0 {
		// Every READ and atomic before it was transmitted (in order), so
		// rdOut counts exactly those still outstanding before it.
		return false
	}
	if !take {
		return true
	}
	if w.op.isWriteLike() && p.Seg&SegLast == 0 {
		r.txSeg++
	} else {
		r.tx++
		r.txSeg = 0
	}
	if end := last.Add(1); end.After(r.sent) {
		r.sent = end
	}
	if !w.sent {
		w.sent = true
		if w.op.isReadLike() {
			r.rdOut++
		}
	}
	r.txPend = true
	return true
}

// Flushed tells that the packets handed out by Next left at now: the ACK
// timeout runs from there.
func (r *Requester) Flushed(now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.txPend {
		r.txPend = false
		if r.ackAt == 0 && r.ackTO > 0 && r.outstanding() {
			r.ackAt = now + r.ackTO
		}
	}
	r.timer()
	return r.acts
}

// outstanding reports whether transmitted packets await acknowledgement.
func (r *Requester) outstanding() bool { return !r.failed && r.una.Before(r.sent) }

// Tick tells the time; the owner calls it at (or after) the deadline of
// the last ActTimer.
func (r *Requester) Tick(now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.failed {
		r.timer()
		return r.acts
	}
	if r.connAt != 0 && now >= r.connAt {
		r.connAt = 0
		if !r.connected && r.head < r.tail {
			r.fail(rc.RetryExceeded)
			r.timer()
			return r.acts
		}
	}
	if r.rnrWait && now >= r.rnrUntil {
		r.rnrWait, r.rnrUntil = false, 0
	}
	if r.ackAt != 0 && now >= r.ackAt {
		r.ackAt = 0
		switch {
		case !r.outstanding():
		case r.retries == 0:
			r.fail(rc.RetryExceeded)
		default:
			r.retries--
			if r.cfg.Reliable {
				r.ackAt = now + r.ackTO // nothing was lost; keep waiting
			} else {
				r.inaValid = false
				r.goBack(r.una)
			}
		}
	}
	r.timer()
	return r.acts
}

// Step feeds a response packet.
func (r *Requester) Step(p *Packet, now time.Duration) []Action {
	r.acts = r.acts[:0]
	r.accepted = false
	if !r.failed && !r.placing {
		r.step(p, now)
		r.settle()
	}
	r.timer()
	return r.acts
}

// bad handles a response that makes no sense: fatal on a reliable
// stream, a stale duplicate to ignore otherwise.
func (r *Requester) bad() {
	if r.cfg.Reliable {
		r.fail(rc.BadResponse)
	}
}

func (r *Requester) step(p *Packet, now time.Duration) {
	if p.Op == OpNak && p.Syn == SynSeqErr && r.cfg.Reliable {
		// An ordered stream loses nothing: the sides disagree on the PSN.
		r.fail(rc.RetryExceeded)
		return
	}
	if p.Op.IsRequest() || r.head == r.tail || !p.PSN.InRange(r.wr(r.head).psn, r.sent) {
		r.bad()
		return
	}
	r.accepted = true
	n := r.find(p.PSN)
	w := r.wr(n)
	switch p.Op {
	case OpAck:
		r.ackUpTo(p.PSN.Add(1), now)
	case OpNak:
		if !r.ackUpTo(p.PSN, now) || r.head != n {
			return
		}
		switch p.Syn {
		case SynRNR:
			if n != r.rnrWR {
				r.rnrWR, r.rnrUsed = n, 0
			}
			if !rnrRetryAllowed(r.cfg.RNRRetry, r.rnrUsed) {
				r.fail(rc.RNRRetryExceeded)
				return
			}
			r.rnrUsed++
			r.cfg.Stats.RNR()
			r.goBack(p.PSN)
			r.rnrWait, r.rnrUntil = true, now+RNRDuration(p.RNRTimer)
			r.ackAt = 0
			r.probe, r.probeWR = true, n
		case SynSeqErr:
			if r.retries == 0 {
				r.fail(rc.RetryExceeded)
				return
			}
			r.retries--
			r.inaValid = false
			r.goBack(p.PSN)
			r.ackAt = 0
		default:
			r.fail(nakStatus(p.Syn))
		}
	case OpReadResp:
		if w.op != OpRead {
			r.bad()
			return
		}
		if !r.ackUpTo(w.psn, now) || r.head != n {
			return
		}
		mtu := r.cfg.MTU
		exp := w.psn
		want := w.len
		if mtu != 0 {
			exp = w.psn.Add(w.got / mtu)
			want = min(mtu, w.len-w.got)
		}
		switch d := p.PSN.Sub(exp); {
		case d < 0:
			return // duplicate
		case d > 0:
			if r.cfg.Reliable {
				r.fail(rc.BadResponse)
			} else {
				r.impliedNak(exp) // responses lost: ask again for the rest
			}
			return
		}
		if p.Off != w.got || p.Len != want {
			r.bad()
			return
		}
		r.una = p.PSN.Add(1)
		r.progress(now)
		r.acts = append(r.acts, Action{Kind: ActReadData, WR: n, Off: p.Off, Len: p.Len})
		r.placing, r.placeWR, r.placeLen = true, n, p.Len
	case OpAtomicResp:
		if !w.op.IsAtomic() {
			r.bad()
			return
		}
		if !r.ackUpTo(w.psn, now) || r.head != n {
			return
		}
		r.una = p.PSN.Add(1)
		r.complete(rc.Success, p.Value)
		r.progress(now)
	default:
		r.bad()
	}
}

// Placed tells that the data of the last ActReadData is in place.
func (r *Requester) Placed(now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.placing {
		r.placing = false
		if !r.failed && r.head == r.placeWR {
			w := r.wr(r.placeWR)
			w.got += r.placeLen
			if w.got >= w.len {
				r.complete(rc.Success, 0)
				r.progress(now)
			}
			r.settle()
		}
	}
	r.timer()
	return r.acts
}

// PlaceFailed tells that the data of the last ActReadData could not be
// placed as sent: the responder reported st (a remote access error: the
// region was deregistered while the data went out). The READ completes
// with st and the requester moves to ERROR, as for a fatal NAK.
func (r *Requester) PlaceFailed(st rc.Status, now time.Duration) []Action {
	r.acts = r.acts[:0]
	if r.placing {
		r.placing = false
		if !r.failed && r.head == r.placeWR {
			r.fail(st)
		}
	}
	r.timer()
	return r.acts
}

// find returns the WR whose PSNs include q (q in the window).
func (r *Requester) find(q PSN) uint64 {
	if r.cfg.MTU == 0 && r.head < r.tail {
		// One PSN per WR: no search.
		if d := q.Sub(r.wr(r.head).psn); d >= 0 && uint64(d) < r.tail-r.head {
			return r.head + uint64(d)
		}
		return r.tail
	}
	for n := r.head; n < r.tail; n++ {
		if q.Before(r.wr(n).end()) {
			return n
		}
	}
	return r.tail
}

// ackUpTo acknowledges every packet before upto: completes the WRs that
// end there. A READ or atomic among them without its response means the
// response was lost (an implied NAK: ask again; on a stream, a protocol
// error). It returns false if that failed the QP.
func (r *Requester) ackUpTo(upto PSN, now time.Duration) bool {
	moved := false
	for r.head < r.tail {
		w := r.wr(r.head)
		if w.end().After(upto) {
			break
		}
		if w.op.isReadLike() {
			if r.cfg.Reliable {
				r.fail(rc.BadResponse)
				return false
			}
			upto = w.psn
			r.impliedNak(w.psn)
			break
		}
		r.complete(rc.Success, 0)
		moved = true
	}
	if upto.After(r.una) {
		r.una = upto
		moved = true
	}
	if moved {
		r.progress(now)
	}
	return true
}

// SetWindow changes Config.Window, the packets outstanding at once (0:
// unbounded), for the packets handed out from now on: an owner on a
// lossy network shrinks it when it sees retransmissions (go-back-N
// resends at most a window per loss) and grows it back.
func (r *Requester) SetWindow(n int) { r.cfg.Window = max(n, 0) }

// Window returns the current window (Config.Window, or as SetWindow set it).
func (r *Requester) Window() int { return r.cfg.Window }

// Retune applies the attributes an RTS → RTS transition may change: the
// local ACK timeout, retry_cnt and rnr_retry. A running ACK timer restarts
// with the new timeout (none when it is 0, the infinite timeout).
func (r *Requester) Retune(timeout, retryCount, rnrRetry uint8, now time.Duration) []Action {
	r.acts = r.acts[:0]
	r.cfg.Timeout, r.cfg.RetryCount, r.cfg.RNRRetry = timeout, retryCount, rnrRetry
	r.ackTO = TimeoutDuration(timeout)
	r.retries = int(retryCount)
	if r.ackAt != 0 || (r.ackTO > 0 && r.outstanding() && !r.rnrWait) {
		r.ackAt = 0
		if r.ackTO > 0 && r.outstanding() && !r.rnrWait {
			r.ackAt = now + r.ackTO
		}
	}
	r.timer()
	return r.acts
}

// progress restarts the ACK timeout after forward progress.
func (r *Requester) progress(now time.Duration) {
	r.retries = int(r.cfg.RetryCount)
	r.ackAt = 0
	if r.ackTO > 0 && r.outstanding() && !r.rnrWait {
		r.ackAt = now + r.ackTO
	}
}

// complete completes the head WR.
func (r *Requester) complete(st rc.Status, v uint64) {
	w := r.wr(r.head)
	if w.sent && w.op.isReadLike() {
		r.rdOut--
	}
	r.acts = append(r.acts, Action{Kind: ActComplete, WR: r.head, Status: st, Value: v})
	if r.probe && r.head == r.probeWR {
		r.probe = false
	}
	r.head++
	if r.una.Before(r.wr(r.head - 1).end()) {
		r.una = r.wr(r.head - 1).end()
	}
	if r.tx < r.head {
		r.tx, r.txSeg = r.head, 0
	}
}

// impliedNak goes back to q because a response is missing before one
// that came. Once per PSN until a timeout or a NAK goes back: the
// responses to the rest of the window, and to what it retransmits, would
// each imply the same again; if the retransmission is lost too, the ACK
// timeout takes over.
func (r *Requester) impliedNak(q PSN) {
	if r.inaValid && r.inaPSN == q {
		return
	}
	r.inaValid, r.inaPSN = true, q
	r.goBack(q)
}

// goBack makes transmission resume at PSN q (go-back-N).
func (r *Requester) goBack(q PSN) {
	r.cfg.Stats.Retransmit()
	n := r.find(q)
	r.tx, r.txSeg = n, 0
	if n < r.tail {
		if w := r.wr(n); w.op.isWriteLike() {
			r.txSeg = uint32(q.Sub(w.psn))
		}
	}
}

// settle completes what needs no response: a head WR that failed local
// validation, or any head WR once the peer is lost.
func (r *Requester) settle() {
	if r.failed || r.head == r.tail {
		return
	}
	if w := r.wr(r.head); w.err != rc.Success && r.tx <= r.head {
		r.fail(w.err)
	} else if r.lost {
		r.fail(rc.RetryExceeded)
	}
}

// fail completes the head WR (if any) with st and moves to ERROR; the
// owner flushes the rest.
func (r *Requester) fail(st rc.Status) {
	if r.head < r.tail {
		r.acts = append(r.acts, Action{Kind: ActComplete, WR: r.head, Status: st})
	}
	r.acts = append(r.acts, Action{Kind: ActError, Status: st})
	r.failed = true
	r.head, r.tx = r.tail, r.tail
	r.rdOut = 0
	r.ackAt, r.connAt, r.rnrWait, r.rnrUntil, r.probe, r.placing = 0, 0, false, 0, false, false
}

// timer announces a change of the earliest deadline.
func (r *Requester) timer() {
	var d time.Duration
	for _, t := range [3]time.Duration{r.ackAt, r.connAt, r.rnrUntil} {
		if t != 0 && (d == 0 || t < d) {
			d = t
		}
	}
	if d != r.timerAt {
		r.timerAt = d
		r.acts = append(r.acts, Action{Kind: ActTimer, Deadline: d})
	}
}
