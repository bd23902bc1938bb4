package roce

// Congestion control: every datagram is sent ECN-capable (ECT(0)); a
// responder that receives a request marked CE (congestion experienced)
// answers with a congestion notification packet (CNP), at most one per
// cnpInterval per QP; a requester that receives a CNP cuts its rate by
// DCQCN (internal/rcproto.DCQCN) and paces its packets with a token
// bucket until the rate has recovered to line rate.
//
// Goroutines: the requester's state (dcqcn) is guarded by qpDriver.mu;
// sending CNPs belongs to the progress goroutine (rxState).

import (
	"time"

	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/transport/roce/header"
)

// DCQCN are the rate control parameters of new queue pairs (zero fields:
// the DCQCN paper's values, rcproto.DefaultDCQCN, on a 100 Gb/s line).
// Set it before creating queue pairs.
var DCQCN rcproto.DCQCNConfig

const (
	// cnpInterval is the least time between two CNPs of one QP (the
	// paper's N).
	cnpInterval = 50 * time.Microsecond
	// paceBurst is how many bytes a rate-limited QP may send at once.
	paceBurst = 64 << 10
)

type dcqcn struct {
	rc      *rcproto.DCQCN
	tokens  float64
	last    time.Duration
	minRate float64 // lowest rate reached (for tests and counters)
}

func (c *dcqcn) init(now time.Duration) {
	c.rc = rcproto.NewDCQCN(DCQCN, now)
	c.tokens, c.last, c.minRate = paceBurst, now, c.rc.Rate()
}

func (c *dcqcn) refill(now time.Duration) {
	if now > c.last {
		c.tokens = min(paceBurst, c.tokens+c.rc.Rate()*(now-c.last).Seconds())
		c.last = now
	}
}

// allow reports whether a packet may be sent now.
func (c *dcqcn) allow(now time.Duration) bool {
	if c.rc == nil || !c.rc.Limited() {
		return true
	}
	c.refill(now)
	return c.tokens > 0
}

// sent counts a packet of n bytes sent at now.
func (c *dcqcn) sent(n int, now time.Duration) {
	if c.rc == nil {
		return
	}
	c.rc.Sent(n, now)
	if c.rc.Limited() {
		c.tokens -= float64(n)
	}
}

// wait is how long until the next packet may go (0: now, or no limit).
func (c *dcqcn) wait(now time.Duration) time.Duration {
	if c.rc == nil || !c.rc.Limited() || c.tokens > 0 {
		return 0
	}
	return time.Duration(-c.tokens/c.rc.Rate()*1e9) + time.Microsecond
}

func (c *dcqcn) acked(now time.Duration) {
	if c.rc != nil {
		c.rc.Advance(now)
	}
}

func (c *dcqcn) cnp(now time.Duration) {
	if c.rc == nil {
		return
	}
	c.refill(now)
	c.rc.CNP(now)
	c.minRate = min(c.minRate, c.rc.Rate())
}

// armPacer calls flush again after wait (a rate-limited QP with more to
// send).
func (d *qpDriver) armPacer(wait time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	if d.pacer == nil {
		d.pacer = time.AfterFunc(wait, d.flush)
		return
	}
	d.pacer.Reset(wait)
}

// sendCNP answers a CE-marked request with a congestion notification
// (progress goroutine, under rxMu).
func (d *qpDriver) sendCNP(now time.Duration) {
	r := &d.rx
	if r.cnpSent && now-r.lastCNP < cnpInterval {
		return
	}
	r.cnpSent, r.lastCNP = true, now
	ep := d.ep
	buf := ep.txBuf()
	h := &r.hdr
	total := header.Build(h, buf, header.CNP, 0)
	h.BTH.Encode(&header.BTHFields{Opcode: header.CNP, PKey: header.DefaultPKey, BECN: true, DestQP: r.peerQPN})
	ep.txAdd(total, r.peer, false)
	ep.stats.txCNP.Add(1)
}
