package tcp

// A link is one connection of a QP, from RTR until the QP leaves RTR/RTS
// or the connection ends.
//
// Goroutines of a link:
//
//   - the link goroutine (run): waits for verbs to record RTR, connects
//     (dials, or takes the connection the accept side hands over), then
//     becomes the reader: the transport's progress goroutine. It feeds
//     request frames to the responder engine (resp, an rcproto.Responder
//     that only this goroutine touches) and executes what it says against
//     the QP's Target, reading payloads straight into target memory; and
//     it feeds response frames to the requester engine (req, an
//     rcproto.Requester, under d.mu), carrying out its actions: complete
//     send entries, read READ data into place, arm the timer, fail the QP.
//   - the writer goroutine (writer): idle on wake; it takes over output
//     that could not be written without blocking (see output.go).
//   - the timer (time.AfterFunc, onTimer): calls the requester's Tick at
//     the deadline it asked for (ACK timeout, RNR wait, connect timeout),
//     first telling it of progress the connection made meanwhile.
//
// The protocol's decisions (PSNs, what to transmit and retransmit, ACK
// coalescing, RNR and timeout retries, which status completes what) are
// the engines'; the link keeps sockets, framing, and timers.
//
// Application goroutines write too: PostSend feeds new work requests to
// the requester engine and writes what it hands out itself, without
// blocking and without waking anyone, when the socket has room. Who
// writes at a time is decided by the busy token.

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
	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	// readBufSize is the reader's buffer for headers and small payloads;
	// a poller handles frames that fit in it whole (poll.go): a 64 KiB
	// payload with its header and trailer, and the next header.
	readBufSize = 64<<10 + 4<<10
	// directRead is the payload size from which the reader reads straight
	// into the destination instead of through its buffer.
	directRead = 8 << 10
	// After a frame with a payload of capAfter bytes or more, the next
	// capFrames frames are read with reads into the buffer capped at
	// capRead bytes (room).
	capAfter  = 32 << 10
	capFrames = 4
	capRead   = 1 << 10
	// lingerTimeout bounds the orderly close after a responder error.
	lingerTimeout = time.Second
	// flushFrames and flushBytes bound how much the reader handles before
	// it writes the responses it owes while input keeps coming.
	flushFrames = 32
	flushBytes  = 4 << 20
	// maxQueuedResp bounds the responses queued for the peer: at it, the
	// reader stops reading requests until the peer reads (or is
	// disconnected, see awaitOutput). A peer that reads its responses
	// never gets near it: READ and atomic responses are bounded by
	// max_dest_rd_atomic, ACKs coalesce.
	maxQueuedResp = 1024
)

var (
	errStopped   = errors.New("tcp: link stopped")
	errProtocol  = errors.New("tcp: protocol violation by the peer")
	errBadAccept = errors.New("tcp: unexpected connection accept")
	errStalled   = errors.New("tcp: the peer does not read its responses")
	// errLinger: the responder failed; the link goroutine closes the
	// connection in order (linger) before it exits.
	errLinger = errors.New("tcp: responder failed")
	// errDeregistered: the region a request was moving data into or out
	// of was deregistered meanwhile; the rest must not touch its memory.
	errDeregistered = errors.New("tcp: memory region deregistered during the transfer")
	// errLocalDereg: the same for the local memory of a request being
	// sent; the stream is cut and the work request fails with
	// LocalProtection.
	errLocalDereg = errors.New("tcp: local memory region deregistered while its request was sent")
)

type link struct {
	d          *qpDriver
	qp         *soft.QP
	t          *rc.Target
	ltab       keytab.Table // the QP's own key table (pins of send entries)
	peer       qpAddr
	peerIP     net.IP
	dialer     bool
	rqpsn      psn
	stop       chan struct{} // closed by stopLocked
	dialCtx    context.Context
	cancel     context.CancelFunc
	incoming   chan *net.TCPConn // accept side: the connection, handed over by ctxDriver
	wake       chan struct{}     // hands the busy token to the writer goroutine
	wg         sync.WaitGroup    // link and writer goroutines
	cond       sync.Cond         // on d.mu: busy released, output drained
	timer      *time.Timer       // runs onTimer
	epoch      time.Time         // the engines' clock starts here
	writeFn    func(fd uintptr) bool
	readFn     func(fd uintptr)
	waitFn     func(fd uintptr) bool
	readWaitFn func(fd uintptr) bool
	// the reader's SO_RCVLOWAT (setLowat; the link goroutine only)
	lowat    int // as last set (1 at first)
	lowatFn  func(fd uintptr)
	busyPoll time.Duration // the reader's spin before it sleeps (0: none)
	progress atomic.Uint64 // bytes moved either way, responses seen
	// rdHeld counts READ and atomic responses queued and not yet taken
	// into a batch: the responder engine counts them against
	// max_dest_rd_atomic. Written under d.mu, read by the reader.
	rdHeld atomic.Int32

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
	req     *rcproto.Requester // from RTS
	posted  uint64             // send queue entries before this were given to req
	encoded uint64             // headers in d.hdrs are valid below this position
	timerAt time.Duration      // deadline req asked for (0: none)
	armedAt time.Duration      // deadline the timer is set for (0: stopped)
	wdLast  uint64             // progress when the deadline was last set or reached

	// Guarded by d.mu: output (see output.go); the batch belongs to whoever
	// holds busy.
	out  output
	pkt2 rcproto.Packet // buildBatchLocked's

	// polled counts the application's polls of this link's CQs (poll);
	// the reader does not busy-poll while it moves.
	polled atomic.Uint64
	// pollFrames counts the frames pollers handled (for tests; atomic:
	// read without rmu, which a reader waiting for input may hold).
	pollFrames atomic.Uint64
	// appAsleep: a waiter on the link's CQs went to sleep (Sleep); polls
	// clear it.
	appAsleep atomic.Bool
	// handover: a poller kicked the reader (kickLocked); pollers keep off
	// until the reader has taken the read side.
	handover atomic.Bool
	// leased: the reader sleeps in await while pollers read; it comes
	// back once the application stopped polling (stopAfter after its
	// last poll), woken by the lease keeper, which sets leaseOver.
	leased    atomic.Bool
	leaseOver atomic.Bool
	rwake     chan struct{} // wakes the reader from its sleep in await
	// keeperSeen is polled as the lease keeper last saw it, keeperSince
	// when it saw it move (the keeper's own).
	keeperSeen  uint64
	keeperSince time.Time

	// rmu is the read side: the fields below belong to whoever holds it.
	// The link goroutine holds it from its start, and lets go of it only
	// while it waits for input between frames (idle) and once it has
	// exited (rdone); an application goroutine polling an empty CQ takes
	// it meanwhile with TryLock and handles what has arrived (poll.go).
	rmu        sync.Mutex
	rdone      bool      // the link goroutine has exited: nothing more is read
	perr       error     // a poller's handling ended the link: the reader exits with it
	kicked     bool      // a poller set a read deadline to wake the reader
	lastPolled uint64    // polled when the reader last went idle
	appSeen    time.Time // when the reader last saw polled move
	// polled as spinFor last saw it, and when (since epoch) it saw it
	// move
	idlePolled   uint64
	idlePolledAt time.Duration
	resp         *rcproto.Responder
	rbuf         []byte
	rpos         int
	rend         int
	dropAll      bool         // the QP left RTR/RTS: drop every request
	stall        bool         // maxQueuedResp responses queued: wait for the peer to read
	keys         keytab.Cache // last rkey resolved
	rdMem        []byte       // data of the READ_RESP the responder queued last
	rdPin        keytab.Pin   // and its key's pin
	// pinned read (readDirectPinned, rawReadPinned)
	ptab      keytab.Table
	pin       keytab.Pin
	pinWait   bool
	pinLost   bool
	readPinFn func(fd uintptr) bool
	// frames and bytes handled since output was last flushed
	owedFrames int
	owedBytes  int
	// non-blocking read attempt (read, rawRead)
	tryBuf   []byte
	tryAfter []byte // read after tryBuf in the same readv (place), or nil
	tryN     int
	tryErr   error
	// drained: the last read from the socket (place's, pollRead) did not
	// fill what it was given, so it took all there was: the next look
	// need not come at once (pump, idle)
	drained bool
	wqe     rc.RecvWQE
	segs    [rc.MaxSGE][]byte
	rpins   [rc.MaxSGE]keytab.Pin
	pkt     rcproto.Packet
	// READ_RESP status trailer (handleResponse)
	trailer [trailerLen]byte
	// pl is the frame whose payload is being moved into place (payload.go);
	// nb: the holder of the read side is a poller, which never waits.
	pl payload
	nb bool
	// bigRun: frames left to read with capped reads (room)
	bigRun int
}

func newLink(d *qpDriver, peer qpAddr, ip net.IP, dialer bool, rqpsn psn, maxDestRd int) *link {
	l := &link{
		d: d, qp: d.qp, t: d.t, ltab: d.qp.Keys(), peer: peer, peerIP: ip, dialer: dialer, rqpsn: rqpsn,
		stop:     make(chan struct{}),
		incoming: make(chan *net.TCPConn, 1),
		wake:     make(chan struct{}, 1),
		rwake:    make(chan struct{}, 1),
		epoch:    time.Now(),
		resp:     rcproto.NewResponder(rcproto.RespConfig{FirstPSN: rqpsn, MaxDestRdAtomic: maxDestRd}),
		busyPoll: d.cd.busyPoll,
	}
	l.dialCtx, l.cancel = context.WithCancel(context.Background())
	l.cond.L = &d.mu
	l.writeFn = l.rawWrite
	l.readFn = l.rawRead
	l.waitFn = l.rawWait
	l.readWaitFn = l.rawReadWait
	l.lowat, l.lowatFn = 1, l.rawLowat
	l.readPinFn = l.rawReadPinned
	l.timer = time.AfterFunc(time.Hour, l.onTimer)
	l.timer.Stop()
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
	l.timer.Stop()
	l.armedAt = 0
	l.cond.Broadcast()
	l.wakeReader()
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

// now is the engines' clock: monotonic, from the link's creation.
func (l *link) now() time.Duration { return time.Since(l.epoch) + 1 }

// failHeadLocked completes the oldest posted work request with st, which
// moves the QP to ERROR and flushes the rest; the link stops first.
func (l *link) failHeadLocked(st verbs.Status) {
	l.detached = true
	l.stopLocked()
	l.qp.CompleteSend(st)
}

// applyLocked carries out the requester engine's actions. A READ's data
// placement is returned (ok) for the caller, who reads it into place and
// reports with Placed. It returns false once the link let go of the QP.
func (l *link) applyLocked(acts []rcproto.Action) (place rcproto.Action, ok bool) {
	qp := l.qp
	for i := range acts {
		a := &acts[i]
		switch a.Kind {
		case rcproto.ActComplete:
			if l.detached {
				return place, false
			}
			if fail, ok := qp.FinishSend(l.ltab, a.WR, verbs.Status(a.Status), a.Value); !ok {
				if fail != verbs.StatusSuccess {
					l.failHeadLocked(fail)
				} else {
					l.detached = true
					l.stopLocked()
				}
				return place, false
			}
		case rcproto.ActError:
			l.detached = true
			l.stopLocked()
			qp.Fail()
			return place, false
		case rcproto.ActTimer:
			l.setTimerLocked(a.Deadline)
		case rcproto.ActReadData:
			place = *a
		}
	}
	return place, !l.detached
}

// setTimerLocked records the requester's deadline. The timer itself is
// only moved earlier: a deadline that moves later (every ACK pushes the
// ACK timeout) is found when it fires, and re-armed then.
func (l *link) setTimerLocked(at time.Duration) {
	if at != 0 && l.timerAt == 0 {
		l.wdLast = l.progress.Load()
	}
	l.timerAt = at
	if at == 0 || l.stopped || (l.armedAt != 0 && l.armedAt <= at) {
		return
	}
	l.armedAt = at
	l.timer.Reset(at - l.now())
}

// onTimer runs on the timer: at the requester's deadline it tells the
// engine of progress the connection made since (bytes moved count as
// signs of life on a stream), then the time, and transmits what that let
// go (an RNR wait ended).
func (l *link) onTimer() {
	d := l.d
	d.mu.Lock()
	l.armedAt = 0
	if l.stopped || l.detached || l.req == nil || l.timerAt == 0 {
		d.mu.Unlock()
		return
	}
	now := l.now()
	if now < l.timerAt {
		l.armedAt = l.timerAt
		l.timer.Reset(l.timerAt - now)
		d.mu.Unlock()
		return
	}
	if p := l.progress.Load(); p != l.wdLast {
		l.wdLast = p
		if _, ok := l.applyLocked(l.req.Activity(now)); !ok {
			d.mu.Unlock()
			return
		}
	}
	_, ok := l.applyLocked(l.req.Tick(now))
	d.mu.Unlock()
	if ok {
		l.flush()
	}
}

// postLocked gives the requester engine the entries verbs published since
// the last call.
func (l *link) postLocked() bool {
	qp := l.qp
	for tail := qp.SendTail(); l.posted < tail; {
		e := qp.SendEntry(l.posted)
		l.posted++
		w := rcproto.WR{Op: rcproto.Opcode(reqOpcodes[e.WR.Opcode]), Len: uint32(e.Len), Err: rc.Status(e.Status),
			Fence: e.WR.Flags&verbs.SendFence != 0}
		if _, ok := l.applyLocked(l.req.Post(w, l.now())); !ok {
			return false
		}
	}
	return true
}

// startLocked creates the requester engine at RTS.
func (l *link) startLocked(attr *verbs.QPAttr) {
	d := l.d
	tail := l.qp.SendTail()
	l.posted, l.encoded = tail, tail
	l.req = rcproto.NewRequester(rcproto.Config{
		FirstPSN:       psn(attr.SQPSN & psnMask),
		FirstWR:        tail,
		MaxWR:          len(d.hdrs),
		Timeout:        attr.Timeout,
		RetryCount:     attr.RetryCount,
		RNRRetry:       attr.RNRRetry,
		MaxRdAtomic:    rdAtomicDepth(attr.MaxRdAtomic),
		Reliable:       true,
		ConnectTimeout: connectLimit(attr.Timeout, attr.RetryCount),
		Stats:          d.cd.ctx.Stats(),
	})
	if l.up {
		l.applyLocked(l.req.Connected(l.now()))
	}
	if l.dead {
		l.applyLocked(l.req.PeerLost(l.now()))
	}
}

// run is the link goroutine. It holds the read side (rmu) but while it
// waits for input between frames.
func (l *link) run() {
	defer l.wg.Done()
	l.rmu.Lock()
	defer l.rmu.Unlock()
	err := l.establish()
	if err == nil {
		err = l.readLoop()
	}
	l.abortPayload()
	if err == errLinger {
		l.linger()
		err = errStopped
	}
	l.rdone = true
	l.d.cd.removePoller(l)
	l.exit(err)
}

// exit ends the link. Unless the QP let go of it, a connection that ended
// by itself is the loss of the peer for the requester engine (the oldest
// outstanding work request fails with RetryExceeded, now or when one is
// posted); a protocol error fails the QP (BadResponse for the oldest work
// request, if any).
func (l *link) exit(err error) {
	d := l.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if l.detached {
		l.stopLocked()
		return
	}
	l.dead = true
	l.stopLocked()
	switch {
	case l.req != nil && l.failQP:
		st := l.failSt
		if st == verbs.StatusSuccess {
			st = verbs.StatusBadResponse
		}
		if l.postLocked() {
			l.applyLocked(l.req.Fail(rc.Status(st)))
		}
	case l.req != nil:
		if l.postLocked() {
			l.applyLocked(l.req.PeerLost(l.now()))
		}
	case l.failQP:
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
// requester engine's connect timeout fails posted work requests that
// wait too long meanwhile.
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
	d := l.d
	d.mu.Lock()
	if l.stopped {
		d.mu.Unlock()
		return errStopped
	}
	l.raw = raw
	l.up = true
	l.progress.Add(1)
	if l.req != nil {
		l.applyLocked(l.req.Connected(l.now()))
	}
	l.wg.Add(1)
	go l.writer()
	d.mu.Unlock()
	l.d.cd.addPoller(l)
	l.flush()
	return nil
}
