package tcp

// Per-QP driver: the soft.QPTransport methods. They run on the application's
// goroutines (verbs calls them without its locks held). Modify and Destroy
// are serialised by modMu; everything they share with the QP's link
// goroutines is guarded by mu, the requester engine of the link included.

import (
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	// defaultConnectTimeout is how long posted work requests wait for the
	// connection when the QP's Timeout is 0 (infinite on a live link).
	defaultConnectTimeout = 5 * time.Second
	// minConnectTimeout is the least time granted to set up a connection,
	// however small timeout×(retry+1) is: a TCP handshake between two
	// processes on a busy host can take milliseconds.
	minConnectTimeout = time.Second
	// deferAfter is how many requests in flight make PostSend leave new
	// ones to the reader, which sends them after the next response: under
	// load requests go out in batches, alone they go out at once.
	deferAfter = 4
)

type offerResult int

const (
	offerTaken offerResult = iota
	offerLater
	offerRejected
)

type qpDriver struct {
	cd    *ctxDriver
	qp    *soft.QP
	t     *rc.Target
	num   uint32
	nonce uint64
	addr  []byte
	srq   bool // receives come from an SRQ (never flushed by this QP)
	// hdrs holds the encoded request header of each send queue slot.
	hdrs [][headerLen]byte

	// modMu serialises Modify and Destroy: verbs does not, and a
	// transition waits for the link goroutines of the previous one.
	modMu sync.Mutex

	// mu guards the fields below and the fields of link marked as such.
	mu        sync.Mutex
	state     verbs.QPState // as last applied by Modify (verbs may lag)
	link      *link         // from RTR until ERROR/RESET
	destroyed bool
}

func newQPDriver(cd *ctxDriver, qp *soft.QP) *qpDriver {
	d := &qpDriver{
		cd:    cd,
		qp:    qp,
		t:     qp.Target(),
		num:   qp.Num(),
		nonce: randUint64(),
		srq:   qp.Cap().MaxRecvWR == 0,
		hdrs:  make([][headerLen]byte, qp.Cap().MaxSendWR),
	}
	a := qpAddr{ip: cd.ip, port: cd.port, qpn: d.num, nonce: d.nonce}
	if a.ip == nil {
		a.ip = net.IPv6unspecified
	}
	d.addr = a.encode()
	return d
}

// Address returns the encoded qpAddr (see address.go).
func (d *qpDriver) Address() []byte { return append([]byte(nil), d.addr...) }

// Modify applies a transition; attr is nil when verbs reports an error
// found in the control block.
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
		if l := d.link; l != nil && from == verbs.QPRTR && l.req == nil {
			l.startLocked(attr)
		} else if l != nil && from == verbs.QPRTS && l.req != nil {
			l.applyLocked(l.req.Retune(attr.Timeout, attr.RetryCount, attr.RNRRetry, l.now()))
		}
		d.state = to
		d.mu.Unlock()
	case verbs.QPError, verbs.QPReset:
		d.teardown()
		d.mu.Lock()
		d.state = to
		d.mu.Unlock()
	}
	return nil
}

func (d *qpDriver) toRTR(attr *verbs.QPAttr) error {
	a, err := decodeAddr(attr.AH.Dest)
	if err != nil {
		return fmt.Errorf("%w: AddressHandle.Dest: %w", verbs.ErrInvalidArgument, err)
	}
	if a.qpn != attr.DestQPN {
		return fmt.Errorf("%w: DestQPN %#x but the address is of QP %#x", verbs.ErrInvalidArgument, attr.DestQPN, a.qpn)
	}
	if a.qpn == d.num && a.nonce == d.nonce {
		return fmt.Errorf("%w: a tcp QP cannot be connected to itself", verbs.ErrNotSupported)
	}
	// The side with the smaller nonce dials; both sides compute the same.
	dialer := d.nonce < a.nonce || (d.nonce == a.nonce && d.num < a.qpn)
	ip, err := dialIP(a, attr.AH.GID)
	if err != nil {
		return fmt.Errorf("%w: %w", verbs.ErrInvalidArgument, err)
	}
	l := newLink(d, a, ip, dialer, psn(attr.RQPSN&psnMask), rdAtomicDepth(attr.MaxDestRdAtomic))
	d.mu.Lock()
	if d.link != nil {
		d.mu.Unlock()
		return fmt.Errorf("%w: QP already has a connection", verbs.ErrInvalidState)
	}
	d.link = l
	d.state = verbs.QPRTR
	l.wg.Add(1)
	d.mu.Unlock()
	go l.run()
	d.cd.notifyReady()
	return nil
}

// teardown stops the current link and waits for its goroutines. What is
// queued for the peer is written first if the socket takes it (an ACK a
// poller left for the next post, deferAck), so that the peer's last work
// requests complete.
func (d *qpDriver) teardown() {
	d.mu.Lock()
	l := d.link
	d.mu.Unlock()
	if l != nil {
		l.flush()
	}
	d.mu.Lock()
	l = d.link
	d.link = nil
	if l != nil {
		l.detached = true
		if !l.lingering {
			l.stopLocked()
		}
	}
	d.mu.Unlock()
	if l != nil {
		l.wait()
	}
}

// PostSend gives what verbs published to the requester engine and
// transmits what it hands out (from the caller's goroutine, without
// blocking: what the socket cannot take now goes to the writer).
func (d *qpDriver) PostSend() {
	d.mu.Lock()
	l := d.link
	if l == nil || l.detached || l.req == nil {
		d.mu.Unlock()
		return
	}
	if !l.postLocked() {
		d.mu.Unlock()
		return
	}
	if l.up && d.qp.SendTail()-d.qp.SendHead()-uint64(l.req.Unsent()) >= deferAfter {
		// Enough is in flight: the reader sends these with its next
		// batch, when the responses come (one writev for many).
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	l.flush()
}

// PostRecv needs nothing: a requester that got an RNR NAK retries on its
// timer.
func (d *qpDriver) PostRecv() {}

// Destroy releases the QP; verbs has moved it to RESET before.
func (d *qpDriver) Destroy() error {
	d.modMu.Lock()
	defer d.modMu.Unlock()
	d.teardown()
	d.mu.Lock()
	d.destroyed = true
	d.mu.Unlock()
	d.cd.removeQP(d)
	return nil
}

// offer hands an accepted connection to the QP if it expects it.
func (d *qpDriver) offer(c *net.TCPConn, h *hello) offerResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.destroyed || h.dstNonce != d.nonce {
		return offerRejected
	}
	l := d.link
	if l == nil {
		if d.state == verbs.QPReset || d.state == verbs.QPInit {
			return offerLater
		}
		return offerRejected
	}
	if l.dialer || l.accepted || l.stopped || l.detached || h.srcQPN != l.peer.qpn || h.srcNonce != l.peer.nonce {
		return offerRejected
	}
	l.accepted = true
	l.incoming <- c // buffered; accepted once
	return offerTaken
}

// defaultRdAtomic is max_rd_atomic and max_dest_rd_atomic when the QP's
// attributes leave them 0.
const defaultRdAtomic = 16

// rdAtomicDepth is the READ/atomic depth an attribute asks for.
func rdAtomicDepth(n uint8) int {
	if n == 0 {
		return defaultRdAtomic
	}
	return int(n)
}

// connectLimit is how long posted work requests wait for the connection:
// timeout×(retry+1), at least minConnectTimeout; defaultConnectTimeout
// when the timeout is infinite.
func connectLimit(timeout, retry uint8) time.Duration {
	if timeout == 0 {
		return defaultConnectTimeout
	}
	return max(verbs.TimeoutDuration(timeout)*time.Duration(int(retry)+1), minConnectTimeout)
}
