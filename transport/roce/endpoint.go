package roce

// A device's UDP socket and its progress goroutine.
//
// Goroutines: one progress goroutine per endpoint (run), and one sender
// goroutine (sender) that transmits requests for the QPs the progress
// goroutine hands it (kick). Receiving is a step (step): one batch of
// datagrams (recvmmsg), checked and dispatched to queue pairs by
// destination QP number: requests to the QP's responder (under the QP's
// rxMu), responses to its requester (under the QP's mu). Responses owed
// are gathered in the endpoint's transmit batch and sent (sendmmsg) when
// the batch is full and after each step, so ACKs coalesce under load and
// leave at once otherwise.
//
// Who steps: whoever holds stepMu. The progress goroutine steps when the
// socket becomes readable (it waits for it itself: the socket is not in
// Go's network poller; see run); a goroutine that polls a CQ of a context on
// this endpoint and finds it empty steps too (Progress, through
// soft.Progresser), so that an application that spins on its CQ receives
// its ACKs and sends what they let go on its own thread, with no
// goroutine to wake, as the tcp transport's sender writes its socket
// itself. A progress goroutine that finds stepMu held sets missed and
// goes back to waiting; the holder steps again when it lets go, so a
// datagram that made the socket readable is never left behind.
//
// Requests are sent by whoever makes them possible: PostSend's caller,
// the timer, a polling goroutine after an ACK it received; when the
// progress goroutine received the ACK, by the sender goroutine, so that
// composing and checksumming a window of data (the larger part of a
// bandwidth run's work) overlaps with receiving on another core.
//
// Contexts opened with the same bind address share one endpoint
// (refcounted): a UDP port can be bound once.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	// maxPacket is the largest UDP payload sent or accepted: a 4096-byte
	// MTU and the longest header set.
	maxPacket = 4096 + 64
	// sockBuf is the socket buffer size asked for each way: a window of
	// requests (4 MiB) and room to spare.
	sockBuf = 8 << 20
	// tosECT is the traffic class of every datagram: ECN-capable (ECT(0)).
	tosECT  = 0x02
	ecnMask = 0x03
	ecnCE   = 0x03
)

// Counters are an endpoint's packet counters (see Stats).
type Counters struct {
	RxPackets, TxPackets uint64
	RxBadICRC            uint64 // dropped: ICRC mismatch
	RxMalformed          uint64 // dropped: header parse error
	RxUnknownQP          uint64 // dropped: no such QP, or not from its peer
	RxIDRecovered        uint64 // IPv4 ICRC matched with a non-zero identification (solved for; GSO runs, rxe)
	RxCE                 uint64 // arrived with ECN CE marked
	TxCNP, RxCNP         uint64 // congestion notifications sent and received
	Retransmits          uint64 // request packets sent again
	SendErrors           uint64 // datagrams the socket refused (dropped)
	RxPolled             uint64 // of RxPackets, received by a goroutine polling a CQ (Progress)
}

type counters struct {
	rxPackets, txPackets, rxBadICRC, rxMalformed, rxUnknownQP, rxIDRecovered, rxCE, txCNP, rxCNP, retransmits, sendErrors, rxPolled atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{RxPackets: c.rxPackets.Load(), TxPackets: c.txPackets.Load(), RxBadICRC: c.rxBadICRC.Load(),
		RxMalformed: c.rxMalformed.Load(), RxUnknownQP: c.rxUnknownQP.Load(), RxIDRecovered: c.rxIDRecovered.Load(),
		RxCE: c.rxCE.Load(), TxCNP: c.txCNP.Load(), RxCNP: c.rxCNP.Load(), Retransmits: c.retransmits.Load(),
		SendErrors: c.sendErrors.Load(), RxPolled: c.rxPolled.Load()}
}

// Stats returns the packet counters of the roce context ctx's device
// socket (shared by the contexts bound to the same address).
func Stats(ctx *verbs.Context) (Counters, bool) {
	if a := ctxOf(ctx); a != nil {
		return a.ep.stats.snapshot(), true
	}
	return Counters{}, false
}

// registry of endpoints by bind address.
var (
	regMu sync.Mutex
	reg   = map[netip.AddrPort]*endpoint{}
)

type endpoint struct {
	key netip.AddrPort
	// fd is the device socket, outside Go's network poller (see run);
	// efd wakes the progress goroutine from WaitFD (wake, release; in
	// quiet it waits on wakec and stop instead). fd is closed
	// under stepMu and fdMu (write) once the progress goroutine ended;
	// whoever uses it outside stepMu holds fdMu (read).
	fd    int
	efd   int
	fdMu  sync.RWMutex
	local netip.AddrPort
	mtu   verbs.MTU
	stats counters
	wg    sync.WaitGroup

	refs int // under regMu

	// qps maps QP numbers to QPs from RTR on; copy on write under qmu,
	// read lock-free by the progress goroutine.
	qmu sync.Mutex
	qps atomic.Pointer[map[uint32]*qpDriver]

	// wrap is the socket wrapper used by tests to lose, duplicate and
	// reorder datagrams (nil: none).
	wrap Filter
	// testCE, when set, marks arriving datagrams CE as it says (tests).
	testCE func() bool
	// noGSO: the kernel refused segmentation offload once.
	noGSO atomic.Bool
	// cm is the RDMA CM (cm.go), started on first use.
	cm atomic.Pointer[cmService]

	// kickMu guards kicked, the QPs handed to the sender goroutine (each
	// at most once: qpDriver.txKicked); kickc wakes it (one token),
	// stop ends it.
	kickMu sync.Mutex
	kicked []*qpDriver
	kickc  chan struct{}
	stop   chan struct{}
	// wakec (one token) wakes the progress goroutine while it waits in
	// Go for pollers to stop (quiet, quietT); wake sends on it as well
	// as on efd.
	wakec  chan struct{}
	quietT *time.Timer

	// stepMu is held by whoever steps (the progress goroutine or a
	// poller) and guards the fields below it. missed: the progress
	// goroutine found it held after the socket became readable.
	// closed: the socket was closed under a step.
	missed  atomic.Bool
	closed  atomic.Bool
	stepMu  sync.Mutex
	rx      sys.UDPBatch
	tx      *txBatch
	hasher  header.Hasher
	pkt     header.Packet
	touched []*qpDriver
	backlog []*qpDriver // QPs with responses left to send
	inline  bool        // a poller steps: it sends what ACKs let go itself
	more    bool        // the last step's batch was full: the socket may hold more
	rxSlots int         // datagrams the next receive asks for (rxSlotsFor)
	didStep bool        // the last step handed a datagram to a QP
	taken   int         // datagrams input handed to a QP in this step
	// recvErrs counts the receives in a row that failed (step);
	// recvBroken: maxRecvErrors of them, the socket is retried every
	// idleWait (run) until one succeeds.
	recvErrs   int
	recvBroken atomic.Bool

	// polls counts Progress calls; sleeping: a CQ waiter went to sleep
	// since (Sleep). The progress goroutine waits for the socket only
	// while nobody polls (run).
	polls    atomic.Uint64
	sleeping atomic.Bool

	// busyPoll: how long the progress goroutine spins after receiving
	// (spin; 0: never).
	busyPoll time.Duration
}

// Filter sees every datagram an endpoint sends, for tests that make the
// network lossy: it sends what it wants with send (nothing: lost; twice:
// duplicated; a copy later: reordered). b is reused after it returns.
type Filter func(b []byte, to netip.AddrPort, send func(b []byte, to netip.AddrPort))

// testFilter and testMarkCE, when set, are installed on endpoints as
// they are created.
var (
	testFilter Filter
	testMarkCE func() bool
	// testRx sees every parsed datagram (progress goroutines).
	testRx func(from netip.AddrPort, p *header.Packet)
	// testDropRx drops arriving datagrams as it says (tests).
	testDropRx func() bool
	// testPollOnly leaves all receiving to pollers (tests): the progress
	// goroutine behaves as if it always found stepMu held.
	testPollOnly atomic.Bool
)

func acquire(bind netip.AddrPort, mtu verbs.MTU) (*endpoint, error) {
	regMu.Lock()
	defer regMu.Unlock()
	if bind.Port() != 0 {
		if ep := reg[bind]; ep != nil {
			ep.refs++
			return ep, nil
		}
	}
	ep, err := newEndpoint(bind, mtu)
	if err != nil {
		return nil, err
	}
	ep.refs = 1
	if bind.Port() != 0 {
		reg[bind] = ep
	}
	return ep, nil
}

func (ep *endpoint) release() error {
	regMu.Lock()
	ep.refs--
	last := ep.refs == 0
	if last && reg[ep.key] == ep {
		delete(reg, ep.key)
	}
	regMu.Unlock()
	if !last {
		return nil
	}
	ep.closed.Store(true)
	sys.Signal(ep.efd)
	close(ep.stop)
	ep.wg.Wait()
	ep.stepMu.Lock()
	ep.fdMu.Lock()
	err := sys.Close(ep.fd)
	ep.fd = -1
	ep.fdMu.Unlock()
	ep.stepMu.Unlock()
	sys.Close(ep.efd)
	if g := ep.cm.Load(); g != nil {
		g.close()
	}
	if err != nil {
		return fmt.Errorf("roce: closing the socket: %w", err)
	}
	return nil
}

// bindError explains a failed bind.
func bindError(bind netip.AddrPort, err error) error {
	return fmt.Errorf("roce: binding %s (%s; another RoCE endpoint on this address, e.g. the kernel's rxe, holds the port; %s=:0 binds a free port, which rdmakit peers reach): %w", bind, EnvAddr, EnvAddr, err)
}

// listenFD opens a UDP socket on bind, outside Go's network poller, with
// RoCEv2's options: the device socket (rx: it receives, with the kernel's
// coalescing), or a QP's own, which only sends. Outside the poller, a
// socket's arrivals and the room its sent datagrams leave when the
// kernel frees them wake no thread of the runtime: a QP's sending socket
// in the poller made the runtime's idle thread return from epoll_pwait
// about once per 64 KiB sent (write_bw over loopback, 20000 × 64 KiB:
// about 10000 epoll_pwait and 4000 thread switches more, docs/benchmarks.md).
func listenFD(bind netip.AddrPort, rx bool) (int, netip.AddrPort, error) {
	fd, local, err := sys.ListenUDPFD(bind)
	if err != nil {
		return -1, local, bindError(bind, err)
	}
	v6 := local.Addr().Is6() // the family ListenUDPFD chose (it unmaps an AF_INET address)
	if err := sys.SetUDPOptions(fd, v6, tosECT, sockBuf, rx); err != nil {
		sys.Close(fd)
		return -1, local, fmt.Errorf("roce: socket options: %w", err)
	}
	return fd, local, nil
}

func newEndpoint(bind netip.AddrPort, mtu verbs.MTU) (*endpoint, error) {
	busyPoll, err := busyPollFromEnv()
	if err != nil {
		return nil, err
	}
	fd, la, err := listenFD(bind, true)
	if err != nil {
		return nil, err
	}
	efd, err := sys.NewEvent()
	if err != nil {
		sys.Close(fd)
		return nil, fmt.Errorf("roce: %w", err)
	}
	ep := &endpoint{key: bind, fd: fd, efd: efd, local: la, mtu: mtu, wrap: testFilter, testCE: testMarkCE, busyPoll: busyPoll}
	m := map[uint32]*qpDriver{}
	ep.qps.Store(&m)
	// Receive buffers hold a coalesced run (UDP_GRO) each.
	const rxBuf = 64 << 10
	pool := make([]byte, sys.MaxBatch*rxBuf)
	for i := 0; i < sys.MaxBatch; i++ {
		ep.rx.Bufs[i] = pool[i*rxBuf : (i+1)*rxBuf : (i+1)*rxBuf]
	}
	ep.tx = newTxBatch(ep)
	ep.kickc, ep.stop, ep.wakec = make(chan struct{}, 1), make(chan struct{}), make(chan struct{}, 1)
	ep.quietT = time.NewTimer(time.Hour)
	ep.quietT.Stop()
	ep.wg.Add(2)
	go ep.run()
	go ep.sender()
	return ep, nil
}

// kick hands d to the sender goroutine, which flushes it; a poller that
// steps (under stepMu) flushes it itself.
func (ep *endpoint) kick(d *qpDriver) {
	if ep.inline {
		d.flush()
		return
	}
	if d.txKicked.Swap(true) {
		return // queued already
	}
	ep.kickMu.Lock()
	ep.kicked = append(ep.kicked, d)
	ep.kickMu.Unlock()
	select {
	case ep.kickc <- struct{}{}:
	default:
	}
}

// sender is the sender goroutine: it flushes the QPs kick hands it.
func (ep *endpoint) sender() {
	defer ep.wg.Done()
	var work []*qpDriver
	for {
		select {
		case <-ep.kickc:
		case <-ep.stop:
			return
		}
		ep.kickMu.Lock()
		work, ep.kicked = ep.kicked, work[:0]
		ep.kickMu.Unlock()
		for i, d := range work {
			work[i] = nil
			d.txKicked.Store(false)
			d.flush()
		}
	}
}

func (ep *endpoint) addQP(d *qpDriver) error {
	ep.qmu.Lock()
	defer ep.qmu.Unlock()
	old := *ep.qps.Load()
	if o := old[d.num]; o != nil && o != d {
		return fmt.Errorf("%w: QP number %#x is in use on %s by another context; create the QP again", verbs.ErrBusy, d.num, ep.local)
	}
	m := make(map[uint32]*qpDriver, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[d.num] = d
	ep.qps.Store(&m)
	return nil
}

func (ep *endpoint) removeQP(d *qpDriver) {
	ep.qmu.Lock()
	defer ep.qmu.Unlock()
	old := *ep.qps.Load()
	if old[d.num] != d {
		return
	}
	m := make(map[uint32]*qpDriver, len(old))
	for k, v := range old {
		if k != d.num {
			m[k] = v
		}
	}
	ep.qps.Store(&m)
}

// tryStep is the progress goroutine's turn: it steps unless a poller
// is stepping (held: the poller steps again for it), and reports whether
// it should step again at once (the socket may hold more, or responses
// are left to send).
func (ep *endpoint) tryStep() (again, held, got bool) {
	if testPollOnly.Load() {
		ep.missed.Store(true)
		return false, true, false
	}
	if !ep.stepMu.TryLock() {
		ep.missed.Store(true)
		if !ep.stepMu.TryLock() {
			return false, true, false // the holder steps again when it lets go
		}
	}
	ep.missed.Store(false)
	if !ep.closed.Load() {
		ep.step(ep.fd)
		got = ep.didStep
	}
	again = ep.more || len(ep.backlog) > 0
	ep.stepMu.Unlock()
	return again, false, got
}

// steps steps until the socket is drained and no responses are left
// (again), or a poller holds stepMu (held); got: something was received.
func (ep *endpoint) steps() (held, got bool) {
	for !ep.closed.Load() {
		again, h, g := ep.tryStep()
		got = got || g
		if h || !again {
			return h, got
		}
	}
	return false, got
}

// Busy polling (RDMAKIT_ROCE_BUSY_POLL, endpoint.busyPoll): after steps
// that received something, the progress goroutine keeps stepping
// (non-blocking recvmmsg) for up to busyPoll before it waits for the
// socket in the kernel, so that while traffic flows the next datagrams
// are taken without a thread sleeping and being woken (the largest cost
// of a bandwidth run on a 2-core host: a wake-up every few datagrams).
// Every empty attempt is followed by a sched_yield, so that other
// runnable threads (the peer process, the application) get the core,
// made without telling the Go scheduler (sys.RawYield: a yield that
// takes long on a loaded host would otherwise have the runtime hand the
// goroutine's processor to another thread); the clock is read every
// spinClock attempts. At most maxSpinning endpoints
// of the process spin at once.
const spinClock = 8

var (
	spinning    atomic.Int32
	maxSpinning atomic.Int32 // max(1, NumCPU/2)
)

func init() { maxSpinning.Store(int32(max(1, runtime.NumCPU()/2))) }

// spin is the progress goroutine's busy poll: it returns once it received
// something (got), a poller holds stepMu (held), goroutines polled CQs
// (Progress) busyPolls times since base (the count when the traffic
// started flowing: they receive then, see run), or busyPoll passed.
func (ep *endpoint) spin(base uint64, d time.Duration) (held, got bool) {
	if spinning.Add(1) > maxSpinning.Load() {
		spinning.Add(-1)
		return false, false
	}
	defer spinning.Add(-1)
	deadline := time.Now().Add(d)
	for i := 1; !ep.closed.Load(); i++ {
		if held, got = ep.steps(); held || got {
			return held, got
		}
		if ep.polls.Load()-base >= busyPolls {
			return false, false // goroutines poll: they receive (run)
		}
		if i%spinClock == 0 && !time.Now().Before(deadline) {
			return false, false
		}
		sys.RawYield()
	}
	return false, false
}

// Waits of the progress goroutine: pollQuiet while goroutines poll (or
// after it found a poller stepping), idleWait at most for the socket.
// Goroutines poll when they called Progress busyPolls times in the last
// pollQuiet: a spinning poller calls it every few microseconds; one that
// polls now and then must not hold the endpoint's ACKs back until its
// next poll.
const (
	pollQuiet = time.Millisecond
	idleWait  = 100 * time.Millisecond
	busyPolls = 16
)

// run is the progress goroutine. The device socket is not in Go's
// network poller (whose threads a datagram would wake whether or not
// anyone waits for it): while goroutines spin on their CQs (Progress), they
// receive, and this goroutine only waits for a wake-up (wake, release)
// or pollQuiet to pass; once nobody polled for that long, or a CQ waiter
// went to sleep (Sleep), it waits for the socket itself, in the kernel.
func (ep *endpoint) run() {
	defer ep.wg.Done()
	seen := ep.polls.Load()
	backoff, flowing, base := false, false, seen
	for !ep.closed.Load() {
		p := ep.polls.Load()
		slept := ep.sleeping.Swap(false)
		busy := p-seen >= busyPolls && !slept
		seen = p
		switch {
		case busy || backoff:
			backoff, flowing = false, false
			if !ep.quiet(pollQuiet) {
				continue
			}
		case flowing && ep.busyPoll > 0:
			held, got := ep.spin(base, ep.busyPoll)
			backoff, flowing = held, got
			if ep.polls.Load()-base >= busyPolls {
				// Goroutines poll CQs while it spins: they receive.
				backoff, flowing = true, false
			}
			continue
		case ep.recvBroken.Load():
			// A socket that keeps failing is always readable.
			sys.WaitFD(-1, ep.efd, false, idleWait)
		default:
			sys.WaitFD(ep.fd, ep.efd, false, idleWait)
		}
		sys.Drain(ep.efd)
		held, got := ep.steps()
		backoff, flowing = held, got
		base = ep.polls.Load()
	}
}

// quiet is the progress goroutine's wait while goroutines poll: up to d,
// or until woken (wake, release), which it reports. It waits in Go rather
// than in the kernel (ppoll on efd): a thread blocked in a system call
// holds its processor (P), and with the pollers' goroutines on the other
// Ps, the runtime's sysmon takes it back every time (and keeps itself
// awake at its shortest period doing so), waking a thread to look for
// work that finds none. Parked in Go, the goroutine leaves its P idle.
func (ep *endpoint) quiet(d time.Duration) (woken bool) {
	ep.quietT.Reset(d)
	select {
	case <-ep.wakec:
		ep.quietT.Stop()
		return true
	case <-ep.stop:
		ep.quietT.Stop()
		return true
	case <-ep.quietT.C:
		return false
	}
}

// pollSteps bounds the steps of one Progress call: a poller that keeps
// finding full batches hands the rest to the progress goroutine.
const pollSteps = 4

// Progress steps on the calling goroutine, which polls a CQ of a context
// on this endpoint and found it empty (soft.Progresser): it reports
// whether it received anything. It never waits: when the progress
// goroutine (or another poller) is stepping, it returns at once.
func (ep *endpoint) Progress() bool {
	ep.polls.Add(1)
	if !ep.stepMu.TryLock() {
		return false
	}
	did := ep.pollLocked()
	return ep.endTurn() || did
}

// endTurn ends a poller's turn (it holds stepMu) and takes another while
// the progress goroutine found stepMu held meanwhile, and nobody else
// holds it now: the datagram that woke the progress goroutine may be
// behind the poller's last receive.
func (ep *endpoint) endTurn() (did bool) {
	for ep.unlockPoll() && ep.stepMu.TryLock() {
		did = ep.pollLocked() || did
	}
	return did
}

// pollLocked is a poller's turn under stepMu: up to pollSteps steps.
func (ep *endpoint) pollLocked() (did bool) {
	ep.missed.Store(false)
	ep.inline = true
	for i := 0; i < pollSteps; i++ {
		if ep.closed.Load() {
			break
		}
		ep.step(ep.fd)
		did = did || ep.didStep
		if !ep.more {
			break
		}
	}
	ep.inline = false
	return did
}

// unlockPoll ends a poller's turn: it lets go of stepMu, wakes the
// progress goroutine if the turn left work behind, and reports whether
// the progress goroutine found stepMu held meanwhile (then the poller
// takes another turn, or leaves it to whoever holds stepMu now).
func (ep *endpoint) unlockPoll() bool {
	left := ep.more || len(ep.backlog) > 0
	ep.stepMu.Unlock()
	if left {
		ep.wake()
	}
	return ep.missed.Load()
}

// wake makes the progress goroutine step even if the socket does not
// become readable again: a poller left datagrams or a backlog behind.
func (ep *endpoint) wake() {
	sys.Signal(ep.efd)
	select {
	case ep.wakec <- struct{}{}:
	default:
	}
}

// step receives one batch of datagrams, runs them through their QPs and
// sends the responses they call for (under stepMu).
func (ep *endpoint) step(fd int) {
	slots := ep.rxSlots
	if slots == 0 {
		slots = sys.MaxBatch
	}
	n, err := ep.rx.RecvBatchRaw(fd, slots)
	ep.more, ep.didStep = false, false
	switch {
	case err == sys.ErrAgain:
		n = 0
	case errors.Is(err, syscall.EBADF):
		ep.closed.Store(true)
		return
	case err != nil:
		// E.g. ECONNREFUSED from an ICMP error: nothing to do, but the
		// socket may hold datagrams behind it. An error that persists
		// (the socket broken) stops the stepping after maxRecvErrors in
		// a row: the caller waits for the socket as when it is empty,
		// rather than spin on it.
		ep.recvErrs++
		ep.more = ep.recvErrs < maxRecvErrors
		if !ep.more {
			ep.recvBroken.Store(true)
		}
		return
	}
	if ep.recvErrs > 0 {
		ep.recvErrs = 0
		ep.recvBroken.Store(false)
	}
	ep.more, ep.taken = n == slots, 0
	since, largest := 0, 0
	for i := 0; i < n; i++ {
		b := ep.rx.Bufs[i][:ep.rx.Lens[i]]
		largest = max(largest, len(b))
		seg := int(ep.rx.Seg[i])
		if seg == 0 {
			seg = len(b)
		}
		for len(b) > 0 {
			k := min(seg, len(b))
			ep.input(b[:k], ep.rx.Addrs[i], ep.rx.TOS[i])
			b = b[k:]
			since++
		}
		if since >= ackEvery && i < n-1 {
			// A long batch: answer what came so far before going on,
			// so that the requester's window opens while this side
			// is still busy (one ACK per batch would make the window
			// a stop-and-wait unit).
			ep.counted(since)
			ep.settle()
			since = 0
		}
	}
	ep.counted(since)
	if n > 0 {
		// (An empty receive, which pollers and the busy poll make all
		// the time, says nothing of the traffic.)
		ep.rxSlots = rxSlotsFor(largest)
	}
	ep.settle()
	ep.serviceBacklog()
	ep.flushTx()
	// Only traffic for a QP counts as received: datagrams anyone can send
	// (malformed, bad ICRC, unknown QP) must not keep the progress
	// goroutine busy polling (run).
	ep.didStep = ep.taken > 0
}

// rxBudget bounds the bytes one receive batch brings in: the kernel copies
// the whole batch into the receive buffers before step reads the first
// datagram of it (its ICRC, then a copy into the target memory), so a
// batch larger than the core's cache is read back from farther away than
// it was written. 64 slots of GRO runs (up to 64 KiB each) are 4 MiB;
// 512 KiB is a quarter to a half of a server core's L2. On this project's
// 2-core host, roce write_bw 64 KiB over loopback, alternating launches,
// MiB/s medians of 6: 64 slots 2464, 16 slots 2791, 8 slots 2837, 4 slots
// 2539 (docs/benchmarks.md, "tenth session").
const rxBudget = 512 << 10

// rxSlotsFor is how many datagrams the next receive asks for after a
// batch whose largest datagram (or GRO run) had largest bytes: as many
// as rxBudget holds, between 8 and sys.MaxBatch (small datagrams keep
// whole batches: a message rate needs the system calls amortized).
func rxSlotsFor(largest int) int {
	return min(sys.MaxBatch, max(8, rxBudget/max(largest, 1)))
}

// maxRecvErrors is how many failed receives in a row step takes before it
// stops asking to be called again.
const maxRecvErrors = 64

// counted adds n datagrams handled to the counters, once per settle
// rather than per datagram (before the responses go, so a peer that sees
// them sees the count).
func (ep *endpoint) counted(n int) {
	if n == 0 {
		return
	}
	ep.stats.rxPackets.Add(uint64(n))
	if ep.inline {
		ep.stats.rxPolled.Add(uint64(n))
	}
}

// serviceBacklog sends the next burst of each backlogged QP's responses.
func (ep *endpoint) serviceBacklog() {
	if len(ep.backlog) == 0 {
		return
	}
	b := ep.backlog
	ep.backlog = ep.backlog[len(ep.backlog):]
	for i, d := range b {
		b[i] = nil
		d.inBacklog = false
		d.rxMu.Lock()
		if d.rx.live && d.rx.resp != nil {
			d.drainBurst()
		}
		d.rxMu.Unlock()
	}
	if len(ep.backlog) == 0 {
		ep.backlog = b[:0]
	}
}

// ackEvery is how many datagrams of a receive batch the progress
// goroutine handles before it sends the responses they call for: a
// quarter of a requester's window.
const ackEvery = window / 4

// settle finishes the QPs that datagrams reached since the last settle
// (their responses, and the requests their ACKs let go) and sends the
// responses.
func (ep *endpoint) settle() {
	for _, d := range ep.touched {
		d.rxDone()
	}
	clear(ep.touched)
	ep.touched = ep.touched[:0]
	ep.flushTx()
}

// input checks one datagram and hands it to its QP.
func (ep *endpoint) input(b []byte, from netip.AddrPort, tos uint8) {
	if testDropRx != nil && testDropRx() {
		return
	}
	p := &ep.pkt
	if err := header.Parse(p, b); err != nil {
		ep.stats.rxMalformed.Add(1)
		return
	}
	if testRx != nil {
		testRx(from, p)
	}
	if p.BTH.DestQP() == header.GSIQP {
		ep.cmInput(b, p, from) // RDMA CM (cm.go)
		return
	}
	d := (*ep.qps.Load())[p.BTH.DestQP()]
	if d == nil {
		ep.stats.rxUnknownQP.Add(1)
		return
	}
	if !d.rxTouched {
		d.rxTouched = true
		d.rxMu.Lock()
		ep.touched = append(ep.touched, d)
	}
	if from.Addr() != d.rx.peerIP {
		ep.stats.rxUnknownQP.Add(1)
		return
	}
	a := header.Addrs{Src: from.Addr(), Dst: ep.local.Addr(), SrcPort: from.Port(), DstPort: ep.local.Port()}
	id, ok := ep.hasher.CheckICRC(&a, b)
	if !ok || (d.rx.gso && id >= sys.MaxGSOSegments) {
		// An rdmakit peer's datagrams carry identification 0, or their
		// place in a GSO run: anything else is corruption.
		ep.stats.rxBadICRC.Add(1)
		return
	}
	if id != 0 {
		ep.stats.rxIDRecovered.Add(1)
	}
	ce := tos&ecnMask == ecnCE || (ep.testCE != nil && ep.testCE())
	if ce {
		ep.stats.rxCE.Add(1)
	}
	ep.taken++
	d.input(p, ce)
}

// txBuf returns room for the next response datagram, flushing the
// batch first if it is full.
func (ep *endpoint) txBuf() []byte {
	if b := ep.tx.buf(); b != nil {
		return b
	}
	ep.flushTx()
	return ep.tx.buf()
}

// txAdd queues the first n bytes of the room txBuf returned, to to.
func (ep *endpoint) txAdd(n int, to netip.AddrPort, gso bool) { ep.tx.add(n, to, gso) }

// flushTx sends the response batch.
func (ep *endpoint) flushTx() { ep.tx.send() }

// txBatch gathers datagrams to send, built back to back in one arena,
// and sends them: runs of equal-sized datagrams to one rdmakit peer go
// as one UDP segmentation offload (GSO) message each where the kernel
// takes it, the rest one by one, all with one sendmmsg(2). The ICRCs are
// computed here, when it is known which datagram goes where in a run:
// the kernel numbers the IPv4 identifications of a run's datagrams 0, 1,
// 2, ... (unconnected socket, DF set). The socket callback is made once
// (no allocation per send). One goroutine at a time (the owner's lock).
type txBatch struct {
	sys.UDPBatch // the messages
	ep           *endpoint
	fd           int            // the socket it sends on: a QP's own (txMu), or -1 for the endpoint's
	local        netip.AddrPort // and its address
	// closing: the QP's socket is about to be closed (Destroy); a send
	// waiting for room drops the rest.
	closing   atomic.Bool
	arena     []byte
	pos       int
	np        int
	off       [sys.MaxBatch]int
	size      [sys.MaxBatch]int
	to        [sys.MaxBatch]netip.AddrPort
	gso       [sys.MaxBatch]bool // may be in a GSO run (an rdmakit peer)
	first     [sys.MaxBatch]int  // message -> its first datagram
	hasher    header.Hasher
	n, from   int
	gsoFailed bool

	// Datagrams whose payload is sent from registered memory in place
	// (refer): hdrLen[i] > 0 says datagram i is its headers (the first
	// hdrLen[i] bytes of its room), the pieces pays[pFrom[i]:pTo[i]]
	// (payN[i] bytes), then its pad and ICRC (the end of its room); the
	// pieces' keys stay entered (pins, in ltab) from refer until the
	// batch is sent, so that the memory cannot be deregistered while the
	// ICRC and the kernel read it. While the socket is full the pins are
	// let go (parked) and entered again before the next try.
	hdrLen     [sys.MaxBatch]int
	payN       [sys.MaxBatch]int
	pFrom, pTo [sys.MaxBatch]int
	pays       [][]byte
	vecs       [][]byte // the messages' gather lists (UDPBatch.Vecs)
	pins       []keytab.Pin
	ltab       keytab.Table
	parked     bool
	flat       []byte // a referring datagram in one piece, for the test filter
}

func newTxBatch(ep *endpoint) *txBatch {
	return &txBatch{ep: ep, fd: -1, local: ep.local, arena: make([]byte, sys.MaxBatch*maxPacket)}
}

// referring prepares b for datagrams that refer to memory under the keys
// of table t (a QP's batch).
func (b *txBatch) referring(t keytab.Table) {
	b.ltab = t
	b.pays = make([][]byte, 0, sys.MaxBatch*2)
	b.vecs = make([][]byte, 0, sys.MaxBatch*4)
	b.pins = make([]keytab.Pin, 0, sys.MaxBatch)
	b.flat = make([]byte, maxPacket)
}

// buf returns room for the next datagram (maxPacket bytes), or nil when
// the batch is full.
func (b *txBatch) buf() []byte {
	if b.np == sys.MaxBatch || b.pos+maxPacket > len(b.arena) {
		return nil
	}
	b.hdrLen[b.np] = 0
	return b.arena[b.pos : b.pos+maxPacket : b.pos+maxPacket]
}

// refer makes the datagram being built in the room buf returned (whose
// headers are its first hdr bytes) carry n bytes of e's local gather
// list from offset off in place, with the keys of the pieces entered
// until the batch is sent. It returns false, having referred to nothing,
// when a piece is not under a key (inline data: the caller copies) or
// the list is short; keyOK is false when a key went away.
func (b *txBatch) refer(e *soft.SendEntry, off, n, hdr int) (ok, keyOK bool) {
	from, pins := len(b.pays), len(b.pins)
	left := n
	for i, s := range e.Local {
		if left == 0 {
			break
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		p := e.Pins[i]
		if p.Zero() {
			b.unrefer(from, pins)
			return false, true
		}
		// A pin entered for this batch already stays entered until it
		// is sent: the memory is safe to read without entering again.
		if len(b.pins) == 0 || b.pins[len(b.pins)-1] != p {
			if !b.ltab.Enter(p) {
				b.unrefer(from, pins)
				return false, false
			}
			b.pins = append(b.pins, p)
		}
		c := min(left, len(s)-off)
		b.pays = append(b.pays, s[off:off+c:off+c])
		left -= c
		off = 0
	}
	if left > 0 {
		b.unrefer(from, pins)
		return false, true
	}
	i := b.np
	b.hdrLen[i], b.payN[i], b.pFrom[i], b.pTo[i] = hdr, n, from, len(b.pays)
	return true, true
}

// unrefer undoes a refer that failed part way: the pieces and pins it
// took since from and pins.
func (b *txBatch) unrefer(from, pins int) {
	for _, p := range b.pins[pins:] {
		b.ltab.Leave(p)
	}
	clear(b.pays[from:])
	b.pays, b.pins = b.pays[:from], b.pins[:pins]
}

// release lets go of the pins the batch's datagrams held and forgets
// their pieces (the batch was sent or dropped).
func (b *txBatch) release() {
	if !b.parked {
		for _, p := range b.pins {
			b.ltab.Leave(p)
		}
	}
	b.parked = false
	clear(b.pays)
	clear(b.vecs)
	clear(b.Vecs[:])
	b.pays, b.vecs, b.pins = b.pays[:0], b.vecs[:0], b.pins[:0]
}

// park lets go of the pins while the sender waits for the socket; unpark
// enters them again, or reports that a key went away (then the rest of
// the batch is dropped: the protocol retransmits, and the retransmission
// finds the key gone).
func (b *txBatch) park() {
	if len(b.pins) == 0 || b.parked {
		return
	}
	for _, p := range b.pins {
		b.ltab.Leave(p)
	}
	b.parked = true
}

func (b *txBatch) unpark() bool {
	if !b.parked {
		return true
	}
	for i, p := range b.pins {
		if !b.ltab.Enter(p) {
			for _, q := range b.pins[:i] {
				b.ltab.Leave(q)
			}
			b.pins = b.pins[:0]
			b.parked = false
			return false
		}
	}
	b.parked = false
	return true
}

// parts returns datagram i's headers, payload pieces and pad (without
// the ICRC's four bytes, which end its room) when it refers to memory.
func (b *txBatch) parts(i int) (hdr []byte, mid [][]byte, pad, icrc []byte) {
	o, hl := b.off[i], b.hdrLen[i]
	end := o + b.size[i]
	return b.arena[o : o+hl], b.pays[b.pFrom[i]:b.pTo[i]], b.arena[o+hl+b.payN[i] : end-header.ICRCLen], b.arena[end-header.ICRCLen : end]
}

// putICRC computes datagram i's ICRC for addresses a.
func (b *txBatch) putICRC(a *header.Addrs, i int) {
	if b.hdrLen[i] == 0 {
		b.hasher.PutICRC(a, b.arena[b.off[i]:b.off[i]+b.size[i]])
		return
	}
	hdr, mid, pad, icrc := b.parts(i)
	binary.LittleEndian.PutUint32(icrc, b.hasher.ICRCParts(a, hdr, mid, pad))
}

// datagram returns datagram i in one piece (a referring one copied into
// b.flat; for the test filter).
func (b *txBatch) datagram(i int) []byte {
	if b.hdrLen[i] == 0 {
		return b.arena[b.off[i] : b.off[i]+b.size[i]]
	}
	hdr, mid, pad, icrc := b.parts(i)
	f := append(b.flat[:0], hdr...)
	for _, m := range mid {
		f = append(f, m...)
	}
	f = append(f, pad...)
	return append(f, icrc...)
}

// add queues the first k bytes of the room buf returned, for to; gso
// says the receiver is rdmakit (which checks ICRCs whatever identification
// the kernel gives a datagram).
func (b *txBatch) add(k int, to netip.AddrPort, gso bool) {
	b.off[b.np], b.size[b.np], b.to[b.np], b.gso[b.np] = b.pos, k, to, gso
	b.np++
	b.pos += k
}

// compose fills the messages from datagram p on; it returns how many. A
// message with a datagram that refers to memory is a gather list.
func (b *txBatch) compose(p int, useGSO bool) int {
	m := 0
	clear(b.vecs)
	b.vecs = b.vecs[:0]
	for p < b.np {
		q := p + 1
		l := b.size[p]
		total := l
		gather := b.hdrLen[p] > 0
		if useGSO && b.gso[p] {
			for q < b.np && b.gso[q] && b.to[q] == b.to[p] && q-p < sys.MaxGSOSegments &&
				b.size[q] <= l && total+b.size[q] <= sys.MaxGSOBytes && b.off[q] == b.off[q-1]+b.size[q-1] {
				total += b.size[q]
				gather = gather || b.hdrLen[q] > 0
				q++
				if b.size[q-1] < l {
					break // a shorter datagram ends a run
				}
			}
		}
		b.Bufs[m] = b.arena[b.off[p] : b.off[p]+total]
		b.Vecs[m] = nil
		if gather {
			// The pieces in the arena: a datagram's headers, and its
			// pad and ICRC, which end its room, right before the next
			// datagram's headers: one iovec for those two.
			v0, at, end := len(b.vecs), -1, -1
			arena := func(from, to int) {
				if from == end {
					b.vecs[len(b.vecs)-1] = b.arena[at:to]
				} else {
					b.vecs = append(b.vecs, b.arena[from:to])
					at = from
				}
				end = to
			}
			for i := p; i < q; i++ {
				o := b.off[i]
				if b.hdrLen[i] == 0 {
					arena(o, o+b.size[i])
					continue
				}
				hl := b.hdrLen[i]
				arena(o, o+hl)
				b.vecs = append(b.vecs, b.pays[b.pFrom[i]:b.pTo[i]]...)
				end = -1
				arena(o+hl+b.payN[i], o+b.size[i]) // pad and ICRC
			}
			b.Vecs[m] = b.vecs[v0:len(b.vecs):len(b.vecs)]
		}
		b.Addrs[m] = b.to[p]
		b.Seg[m] = 0
		if q-p > 1 {
			b.Seg[m] = uint16(l)
		}
		b.first[m] = p
		local := b.local
		for i := p; i < q; i++ {
			a := header.Addrs{Src: local.Addr(), Dst: b.to[i].Addr(), SrcPort: local.Port(), DstPort: b.to[i].Port(), ID: uint16(i - p)}
			b.putICRC(&a, i)
		}
		m++
		p = q
	}
	return m
}

// send sends the queued datagrams, waiting for the socket when it is
// full; a datagram the socket refuses is dropped (the protocol
// retransmits). The batch is empty when it returns.
func (b *txBatch) send() {
	ep := b.ep
	if b.np == 0 {
		b.release()
		return
	}
	ep.stats.txPackets.Add(uint64(b.np))
	if ep.wrap != nil {
		for i := 0; i < b.np; i++ {
			a := header.Addrs{Src: ep.local.Addr(), Dst: b.to[i].Addr(), SrcPort: ep.local.Port(), DstPort: b.to[i].Port()}
			b.putICRC(&a, i)
			ep.wrap(b.datagram(i), b.to[i], ep.sendOne)
		}
	} else {
		p := 0
		for {
			b.n, b.from, b.gsoFailed = b.compose(p, !ep.noGSO.Load()), 0, false
			if b.fd >= 0 {
				b.writeOn(b.fd)
			} else {
				b.writeFD()
			}
			if !b.gsoFailed {
				break
			}
			// The kernel refused segmentation offload: send the rest
			// one by one from now on.
			ep.noGSO.Store(true)
			p = b.first[b.from]
		}
	}
	b.release()
	b.np, b.pos = 0, 0
}

// write sends the composed messages on fd until done or the socket is
// full (false: call again when writable).
func (b *txBatch) write(fd uintptr) bool {
	if !b.unpark() {
		// A key went away while the socket was full: drop the rest.
		b.ep.stats.sendErrors.Add(uint64(b.n - b.from))
		b.from = b.n
		return true
	}
	for b.from < b.n {
		k, err := b.SendBatchRaw(int(fd), b.from, b.n)
		if err == sys.ErrAgain {
			b.park() // the wait is not bounded: let go of the memory
			return false
		}
		if err == sys.ErrGSO {
			b.gsoFailed = true
			return true
		}
		if err != nil {
			// One message refused (e.g. an ICMP error reported): skip it.
			b.ep.stats.sendErrors.Add(1)
			b.from++
			continue
		}
		b.from += k
	}
	return true
}

// writeFD is write on the endpoint's socket (under fdMu, which its
// closing takes), waiting as writeOn does.
func (b *txBatch) writeFD() {
	ep := b.ep
	ep.fdMu.RLock()
	defer ep.fdMu.RUnlock()
	if ep.fd >= 0 {
		b.writeOn(ep.fd)
	}
}

// writeOn is write on fd, the endpoint's socket or the QP's own (txMu
// held), both outside Go's network poller (listenFD): while the socket is
// full it waits in the kernel for room, a while at a time; once the QP is
// being destroyed (closing) or the endpoint closes, the rest is dropped.
func (b *txBatch) writeOn(fd int) {
	for !b.write(uintptr(fd)) {
		if b.closing.Load() || b.ep.closed.Load() {
			b.ep.stats.sendErrors.Add(uint64(b.n - b.from))
			b.from = b.n
			return
		}
		sys.WaitFD(fd, -1, true, pollQuiet)
	}
}

// sendOne sends one datagram from the endpoint's socket (the RDMA CM,
// the test filter), waiting for room as writeFD does.
func (ep *endpoint) sendOne(b []byte, to netip.AddrPort) {
	ep.fdMu.RLock()
	defer ep.fdMu.RUnlock()
	for {
		err := error(sys.ErrNotSupported)
		if ep.fd >= 0 {
			err = sys.SendToFD(ep.fd, b, to)
		}
		if err == sys.ErrAgain && !ep.closed.Load() {
			sys.WaitFD(ep.fd, -1, true, pollQuiet)
			continue
		}
		if err != nil {
			ep.stats.sendErrors.Add(1)
		}
		return
	}
}
