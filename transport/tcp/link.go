package tcp

// A link is one connection of a QP, from RTR until the QP leaves RTR/RTS
// or the connection ends.
//
// Goroutines of a link:
//
//   - the link goroutine (run): waits for verbs to record RTR, connects
//     (dials, or takes the connection the accept side hands over), then
//     becomes the reader: the transport's progress goroutine. It runs the
//     responder (executes requests against the QP's Target, reading payloads
//     straight into target memory) and the requester's completion side
//     (ACK/NAK/READ_RESP/ATOMIC_RESP complete send entries in order).
//   - the writer goroutine (writer): idle on wake; it takes over output
//     that could not be written without blocking (see output.go).
//   - timers (time.AfterFunc): the watchdog (no progress while work
//     requests are outstanding → RetryExceeded) and the RNR retry timer.
//
// Application goroutines write too: PostSend encodes and writes new
// requests itself, without blocking and without waking anyone, when the
// socket has room. Who writes at a time is decided by the busy token.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	// readBufSize is the reader's buffer for headers and small payloads.
	readBufSize = 64 << 10
	// directRead is the payload size from which the reader reads straight
	// into the destination instead of through its buffer.
	directRead = 8 << 10
	// lingerTimeout bounds the orderly close after a responder error.
	lingerTimeout = time.Second
	// wdTicks is how many watchdog periods make up the stall limit.
	wdTicks = 4
	// flushFrames and flushBytes bound how much the reader handles before
	// it writes the responses it owes while input keeps coming.
	flushFrames = 32
	flushBytes  = 4 << 20
)

var (
	errStopped   = errors.New("tcp: link stopped")
	errProtocol  = errors.New("tcp: protocol violation by the peer")
	errBadAccept = errors.New("tcp: unexpected connection accept")
)

type link struct {
	d        *qpDriver
	qp       *soft.QP
	t        *rc.Target
	peer     qpAddr
	peerIP   net.IP
	dialer   bool
	rqpsn    psn
	stop     chan struct{} // closed by stopLocked
	dialCtx  context.Context
	cancel   context.CancelFunc
	incoming chan *net.TCPConn // accept side: the connection, handed over by ctxDriver
	wake     chan struct{}     // hands the busy token to the writer goroutine
	wg       sync.WaitGroup    // link and writer goroutines
	cond     sync.Cond         // on d.mu: busy released, output drained
	wd       *time.Timer       // watchdog
	rnr      *time.Timer       // RNR retry
	writeFn  func(fd uintptr) bool
	readFn   func(fd uintptr) bool
	progress atomic.Uint64 // bytes moved either way, responses seen

	// Guarded by d.mu: connection state.
	conn      *net.TCPConn
	raw       syscall.RawConn
	up        bool         // connected, reader running
	accepted  bool         // accept side: a connection was handed over
	stopped   bool         // stop closed, connection closed
	detached  bool         // the QP expects nothing more of this link
	dead      bool         // the connection ended on its own; later sends fail
	lingering bool         // orderly close after a responder error in progress
	failSt    verbs.Status // status for the oldest WR when the reader exits
	failQP    bool         // move the QP to ERROR when the reader exits

	// Guarded by d.mu: requester.
	rts      bool
	sqBase   uint64 // send queue position of the first entry sent on this link
	psnBase  psn    // its PSN (SQPSN)
	next     uint64 // next send queue position to transmit
	encoded  uint64 // headers in d.hdrs are valid below this position
	paused   bool   // RNR wait
	probe    bool   // after RNR: transmit only up to probeSeq until it completes
	probeSeq uint64
	rnrSeq   uint64
	rnrCount int
	wdArmed  bool
	wdLast   uint64
	wdStale  int

	// Guarded by d.mu: output (see output.go); the batch belongs to whoever
	// holds busy.
	out output

	// Reader goroutine only.
	rbuf    []byte
	rpos    int
	rend    int
	epsn    psn          // next request PSN expected
	rnrWait bool         // RNR NAK sent: drop requests until epsn comes again
	dropAll bool         // fatal NAK sent: drop everything
	keys    keytab.Cache // last rkey resolved
	// frames and bytes handled since output was last flushed
	owedFrames int
	owedBytes  int
	// non-blocking read attempt (read, rawRead)
	tryBuf []byte
	tryN   int
	tryErr error
	wqe    rc.RecvWQE
	segs   [rc.MaxSGE][]byte
	one    [1][]byte
}

func newLink(d *qpDriver, peer qpAddr, ip net.IP, dialer bool, rqpsn psn) *link {
	l := &link{
		d: d, qp: d.qp, t: d.t, peer: peer, peerIP: ip, dialer: dialer, rqpsn: rqpsn,
		stop:     make(chan struct{}),
		incoming: make(chan *net.TCPConn, 1),
		wake:     make(chan struct{}, 1),
		rnrSeq:   ^uint64(0),
	}
	l.dialCtx, l.cancel = context.WithCancel(context.Background())
	l.cond.L = &d.mu
	l.writeFn = l.rawWrite
	l.readFn = l.rawRead
	l.wd = time.AfterFunc(time.Hour, l.watchdog)
	l.wd.Stop()
	l.rnr = time.AfterFunc(time.Hour, l.rnrExpired)
	l.rnr.Stop()
	l.out.init()
	return l
}

// stopLocked closes the connection and stops the goroutines (they exit on
// their own; wait waits for them).
func (l *link) stopLocked() {
	if l.stopped {
		return
	}
	l.stopped = true
	close(l.stop)
	l.cancel()
	if l.conn != nil {
		l.conn.Close()
	}
	l.wd.Stop()
	l.rnr.Stop()
	l.wdArmed = false
	l.cond.Broadcast()
}

// wait waits until the link's goroutines have exited and nobody writes.
func (l *link) wait() {
	l.wg.Wait()
	d := l.d
	d.mu.Lock()
	for l.out.busy {
		l.cond.Wait()
	}
	d.mu.Unlock()
	for {
		select {
		case c := <-l.incoming:
			c.Close()
		default:
			return
		}
	}
}

// failHeadLocked completes the oldest posted work request with st, which
// moves the QP to ERROR and flushes the rest; the link stops first.
func (l *link) failHeadLocked(st verbs.Status) {
	l.detached = true
	l.stopLocked()
	l.qp.CompleteSend(st)
}

// completeLocked completes the oldest work request successfully.
func (l *link) completeLocked() bool {
	if l.qp.CompleteSend(verbs.StatusSuccess) {
		return true
	}
	// The QP went to ERROR under us (a transition in progress).
	l.detached = true
	l.stopLocked()
	return false
}

// advanceLocked completes a head entry that failed local validation once
// everything before it is done (it is never transmitted). It returns false
// when that moved the QP to ERROR.
func (l *link) advanceLocked() bool {
	head := l.qp.SendHead()
	if head < l.qp.SendTail() && head == l.next {
		if e := l.qp.SendEntry(head); e.Status != verbs.StatusSuccess {
			l.failHeadLocked(e.Status)
			return false
		}
	}
	return true
}

func (l *link) psnOf(seq uint64) psn { return l.psnBase.add(seq - l.sqBase) }

// run is the link goroutine.
func (l *link) run() {
	defer l.wg.Done()
	err := l.establish()
	if err == nil {
		err = l.readLoop()
	}
	l.exit(err)
}

// exit ends the link. Unless the QP let go of it, a connection that ended
// by itself fails the oldest posted work request (RetryExceeded, or the
// status a protocol error or the watchdog chose).
func (l *link) exit(err error) {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.detached {
		l.stopLocked()
		return
	}
	st := l.failSt
	if st == verbs.StatusSuccess {
		st = verbs.StatusRetryExceeded
	}
	l.dead = true
	l.stopLocked()
	if !l.advanceLocked() {
		return // the oldest failed local validation: that is its status
	}
	if l.qp.SendHead() < l.qp.SendTail() {
		l.failHeadLocked(st)
	} else if l.failQP {
		l.detached = true
		l.qp.Fail()
	}
}

// waitCommitted waits until verbs has recorded RTR in the control block
// (it does so right after Modify returns): the responder must not judge
// requests by the old state.
func (l *link) waitCommitted() bool {
	for sleep := 20 * time.Microsecond; l.t.State() == rc.StateInit; sleep = min(2*sleep, time.Millisecond) {
		select {
		case <-l.stop:
			return false
		case <-time.After(sleep):
		}
	}
	return true
}

func (l *link) establish() error {
	if !l.waitCommitted() {
		return errStopped
	}
	var c *net.TCPConn
	var err error
	if l.dialer {
		c, err = l.dial()
	} else {
		c, err = l.accept()
	}
	if err != nil {
		return err
	}
	return l.attach(c)
}

// setConn records the connection being set up, so that stopLocked closes
// it; false if the link stopped already.
func (l *link) setConn(c *net.TCPConn) bool {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.stopped {
		return false
	}
	l.conn = c
	return true
}

// dial connects to the peer until it answers or the link stops; the
// watchdog fails posted work requests that wait too long meanwhile.
func (l *link) dial() (*net.TCPConn, error) {
	addr := (&net.TCPAddr{IP: l.peerIP, Port: int(l.peer.port)}).String()
	dialer := net.Dialer{Timeout: handshakeTimeout}
	backoff := time.Millisecond
	for {
		c, err := dialer.DialContext(l.dialCtx, "tcp", addr)
		if err == nil {
			tc := c.(*net.TCPConn)
			if !l.setConn(tc) {
				tc.Close()
				return nil, errStopped
			}
			if err = l.helloDialer(tc); err == nil {
				return tc, nil
			}
			tc.Close()
		}
		select {
		case <-l.stop:
			return nil, errStopped
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

func (l *link) helloDialer(c *net.TCPConn) error {
	d := l.d
	// Wait longer than the accepting side keeps an unclaimed connection,
	// so that an accept never arrives after we gave up on it.
	c.SetDeadline(time.Now().Add(handshakeTimeout + 2*time.Second))
	var b [helloLen]byte
	h := hello{kind: helloConnect, dstQPN: l.peer.qpn, srcQPN: d.num, dstNonce: l.peer.nonce, srcNonce: d.nonce}
	h.encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		return err
	}
	if _, err := readFull(c, b[:]); err != nil {
		return err
	}
	a, err := parseHello(b[:])
	if err != nil {
		return err
	}
	if a.kind != helloAccept || a.dstQPN != d.num || a.dstNonce != d.nonce || a.srcQPN != l.peer.qpn || a.srcNonce != l.peer.nonce {
		return errBadAccept
	}
	return c.SetDeadline(time.Time{})
}

// accept waits for the connection the peer dials and answers its hello.
func (l *link) accept() (*net.TCPConn, error) {
	d := l.d
	select {
	case c := <-l.incoming:
		if !l.setConn(c) {
			c.Close()
			return nil, errStopped
		}
		var b [helloLen]byte
		h := hello{kind: helloAccept, dstQPN: l.peer.qpn, srcQPN: d.num, dstNonce: l.peer.nonce, srcNonce: d.nonce}
		h.encode(b[:])
		c.SetDeadline(time.Now().Add(handshakeTimeout))
		if _, err := c.Write(b[:]); err != nil {
			return nil, err
		}
		if err := c.SetDeadline(time.Time{}); err != nil {
			return nil, err
		}
		return c, nil
	case <-l.stop:
		return nil, errStopped
	}
}

// attach makes the connection live: writer started, queued requests sent.
func (l *link) attach(c *net.TCPConn) error {
	c.SetNoDelay(true)
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	l.rbuf = make([]byte, readBufSize)
	l.epsn = l.rqpsn
	d := l.d
	d.mu.Lock()
	if l.stopped {
		d.mu.Unlock()
		return errStopped
	}
	l.raw = raw
	l.up = true
	l.progress.Add(1)
	if l.wdArmed {
		// The stall limit of a live link replaces the connect limit.
		l.wdArmed = false
		l.armWatchdogLocked()
	}
	l.wg.Add(1)
	go l.writer()
	d.mu.Unlock()
	l.flush()
	return nil
}

// watchdog runs on a timer while work requests are outstanding: with no
// progress for the stall limit it closes the link, whose goroutine then
// fails the oldest work request with RetryExceeded.
func (l *link) watchdog() {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if !l.wdArmed || l.stopped {
		return
	}
	limit := d.stallLimitLocked(l.up)
	if l.qp.SendHead() >= l.qp.SendTail() || limit <= 0 {
		l.wdArmed = false
		return
	}
	p := l.progress.Load()
	if p != l.wdLast || l.paused {
		l.wdLast, l.wdStale = p, 0
	} else if l.wdStale++; l.wdStale >= wdTicks {
		l.wdArmed = false
		l.failSt = verbs.StatusRetryExceeded
		l.stopLocked()
		return
	}
	l.wd.Reset(limit / wdTicks)
}

// armWatchdogLocked starts the watchdog if work requests are outstanding.
func (l *link) armWatchdogLocked() {
	if l.wdArmed || l.stopped || l.qp.SendHead() >= l.qp.SendTail() {
		return
	}
	limit := l.d.stallLimitLocked(l.up)
	if limit <= 0 {
		return
	}
	l.wdArmed = true
	l.wdLast, l.wdStale = l.progress.Load(), 0
	l.wd.Reset(limit / wdTicks)
}

// rnrExpired resumes transmission after an RNR wait.
func (l *link) rnrExpired() {
	d := l.d
	d.mu.Lock()
	if l.stopped || !l.paused {
		d.mu.Unlock()
		return
	}
	l.paused = false
	d.mu.Unlock()
	l.flush()
}
