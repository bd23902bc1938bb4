package roce

// RDMA CM over RoCE: the communication manager's MADs in UD packets to
// and from queue pair 1 (the GSI QP), so that rdma_cm peers (the kernel's
// rxe or a RoCE NIC, through librdmacm: rping, perftest -R) connect to
// rdmakit RC queue pairs and rdmakit ones to them. The protocol is
// internal/ibcm's I/O-free engine; this file is its shell: packets in
// (from whoever steps the endpoint: its progress goroutine or a goroutine
// polling a CQ, endpoint.input), packets out
// (the endpoint's socket), the timer, and the QP transitions the engine's
// events call for.
//
// Goroutines: the engine is guarded by cmService.mu, taken by the
// endpoint's stepper (cmInput), the timer (onTimer) and the application goroutines
// in ListenCM, Accept, DialCM and Close. Events reach the goroutine that
// waits for them through a channel per connection (or per listener, for
// requests); QP transitions are made there, never by the stepper (which
// may hold a QP's rxMu), and never under cmService.mu. Each CMConn has a watcher
// goroutine that moves its QP to ERROR when the peer disconnects; it
// ends with Close or the endpoint.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/transport/roce/internal/ibcm"
	"github.com/rdmakit/rdmakit/verbs"
)

// Errors of the CM.
var (
	// ErrCMTimeout: the peer's CM did not answer.
	ErrCMTimeout = ibcm.ErrTimeout
	// ErrCMClosed: the listener or the device closed.
	ErrCMClosed = errors.New("roce: RDMA CM listener or device closed")
)

// CMRejectError is a connection the peer's CM rejected (errors.As).
type CMRejectError = ibcm.RejectError

// CM defaults.
const (
	cmAckTimeout = 14 // local ACK timeout exponent: 67 ms
	cmRdAtomic   = 16 // RDMA Reads and atomics outstanding each way
	cmAckDelay   = 15 // target ACK delay in a REP
	cmRNRTimer   = 12 // min RNR timer: 0.64 ms
)

// CMOptions are DialCM's and ListenCM's options; the zero value is the
// default.
type CMOptions struct {
	// UDPPort is the peer's RoCEv2 UDP port (default 4791; other ports
	// reach rdmakit peers only).
	UDPPort uint16
	// Private is private data for the REQ (after the RDMA CM header, at
	// most 56 bytes) or the REP (at most 196).
	Private []byte
	// Timeout is how long a CM message waits for its answer before it
	// is sent again (default 1 s); Retries how often (default 8). They
	// are the device socket's CM's, set by the first ListenCM or DialCM
	// on it.
	Timeout time.Duration
	Retries int
}

// cmService is an endpoint's CM.
type cmService struct {
	ep    *endpoint
	epoch time.Time

	// mu guards everything below.
	mu      sync.Mutex
	eng     *ibcm.Engine
	timer   *time.Timer
	waiters map[*ibcm.Conn]chan ibcm.Event
	listens map[uint16]*CMListener
	closed  bool
	psn     uint32
	hasher  header.Hasher
	pkt     header.Packet
	buf     [header.BTHLen + header.DETHLen + ibcm.MADLen + header.ICRCLen]byte
	evs     []ibcm.Event

	// Counters: MADs sent, received and refused.
	sent, received, errors atomic.Uint64
}

// CMCounters are a device socket's RDMA CM counters.
type CMCounters struct {
	Sent, Received uint64
	Errors         uint64 // MADs not used: malformed, for unknown connections, or rejected
}

// CMStats returns the RDMA CM counters of roce context ctx's socket.
func CMStats(ctx *verbs.Context) CMCounters {
	cd := ctxOf(ctx)
	if cd == nil {
		return CMCounters{}
	}
	g := cd.ep.cm.Load()
	if g == nil {
		return CMCounters{}
	}
	return CMCounters{Sent: g.sent.Load(), Received: g.received.Load(), Errors: g.errors.Load()}
}

// cmOf returns ep's CM, starting it on first use. opts tunes its
// timeouts (the first caller's).
func cmOf(ep *endpoint, opts *CMOptions) *cmService {
	regMu.Lock()
	defer regMu.Unlock()
	if g := ep.cm.Load(); g != nil {
		return g
	}
	cfg := ibcm.Config{CAGUID: nodeGUID, Rand: rand.Uint32}
	if opts != nil {
		cfg.Timeout, cfg.Retries = opts.Timeout, opts.Retries
	}
	g := &cmService{ep: ep, epoch: time.Now(), eng: ibcm.New(cfg), waiters: map[*ibcm.Conn]chan ibcm.Event{},
		listens: map[uint16]*CMListener{}, psn: rand.Uint32() & 0xffffff}
	g.timer = time.AfterFunc(time.Hour, g.onTimer)
	g.timer.Stop()
	ep.cm.Store(g)
	return g
}

func (g *cmService) now() time.Duration { return time.Since(g.epoch) + 1 }

// close ends the CM with its endpoint: waiters get ErrCMClosed.
func (g *cmService) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = true
	g.timer.Stop()
	for c, ch := range g.waiters {
		close(ch)
		delete(g.waiters, c)
	}
	for p, l := range g.listens {
		close(l.reqs)
		delete(g.listens, p)
	}
}

// cmInput takes a datagram for QP 1 (progress goroutine).
func (ep *endpoint) cmInput(b []byte, p *header.Packet, from netip.AddrPort) {
	g := ep.cm.Load()
	if g == nil || p.Opcode() != header.UDSendOnly || p.DETH.QKey() != header.GSIQKey || p.BTH.PKey()&0x7fff != header.DefaultPKey&0x7fff {
		ep.stats.rxUnknownQP.Add(1)
		return
	}
	a := header.Addrs{Src: from.Addr(), Dst: ep.local.Addr(), SrcPort: from.Port(), DstPort: ep.local.Port()}
	if _, ok := ep.hasher.CheckICRC(&a, b); !ok {
		ep.stats.rxBadICRC.Add(1)
		return
	}
	g.received.Add(1)
	g.input(p.Payload, from)
}

// input hands a MAD to the engine (any goroutine but the holder of mu).
func (g *cmService) input(mad []byte, from netip.AddrPort) {
	replyTo := netip.AddrPortFrom(from.Addr(), ibcm.ReplyPort(mad, header.UDPPort))
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	ev, err := g.eng.Input(mad, from, replyTo, g.now())
	if err != nil {
		g.errors.Add(1)
	}
	g.evs = append(g.evs[:0], ev)
	g.settleLocked()
}

// settleLocked delivers g.evs, sends the outbox and sets the timer.
func (g *cmService) settleLocked() {
	for _, ev := range g.evs {
		if ev.Kind == ibcm.EvNone {
			continue
		}
		if ev.Kind == ibcm.EvRequest {
			l := g.listens[ev.Conn.Port]
			if l == nil {
				g.eng.Reject(ev.Conn, ibcm.RejInvalidServiceID, nil)
				continue
			}
			select {
			case l.reqs <- ev.Conn:
			default:
				g.eng.Reject(ev.Conn, ibcm.RejNoResources, nil)
			}
			continue
		}
		if ch := g.waiters[ev.Conn]; ch != nil {
			select {
			case ch <- ev:
			default: // a waiter's channel holds every event it can get
			}
		}
	}
	clear(g.evs)
	g.evs = g.evs[:0]
	for _, o := range g.eng.Outbox() {
		g.sendLocked(&o.MAD, o.To)
	}
	if next := g.eng.Next(); next != 0 {
		g.timer.Reset(max(next-g.now(), time.Millisecond))
	}
}

func (g *cmService) onTimer() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return
	}
	g.evs = g.eng.Tick(g.now(), g.evs[:0])
	g.settleLocked()
}

// sendLocked sends a MAD to QP 1 at to, as a UD SEND_ONLY.
func (g *cmService) sendLocked(mad *[ibcm.MADLen]byte, to netip.AddrPort) {
	ep := g.ep
	to = netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
	n := header.Build(&g.pkt, g.buf[:], header.UDSendOnly, ibcm.MADLen)
	g.pkt.BTH.Encode(&header.BTHFields{Opcode: header.UDSendOnly, PKey: header.DefaultPKey, DestQP: header.GSIQP, PSN: g.psn})
	g.psn = (g.psn + 1) & 0xffffff
	g.pkt.DETH.Encode(header.GSIQKey, header.GSIQP)
	copy(g.pkt.Payload, mad[:])
	a := header.Addrs{Src: ep.local.Addr(), Dst: to.Addr(), SrcPort: ep.local.Port(), DstPort: to.Port()}
	g.hasher.PutICRC(&a, g.buf[:n])
	ep.stats.txPackets.Add(1)
	g.sent.Add(1)
	ep.sendOne(g.buf[:n], to)
}

// watch registers a waiter for c's events.
func (g *cmService) watchLocked(c *ibcm.Conn) chan ibcm.Event {
	ch := make(chan ibcm.Event, 8)
	g.waiters[c] = ch
	return ch
}

func (g *cmService) unwatchLocked(c *ibcm.Conn) {
	if ch := g.waiters[c]; ch != nil {
		delete(g.waiters, c)
		close(ch)
	}
}

// wait waits for the next event on a connection's channel.
func (g *cmService) wait(ctx context.Context, ch chan ibcm.Event) (ibcm.Event, error) {
	select {
	case ev, ok := <-ch:
		if !ok {
			return ev, ErrCMClosed
		}
		return ev, nil
	case <-ctx.Done():
		return ibcm.Event{}, ctx.Err()
	}
}

// CMListener listens for RDMA CM connection requests to one port.
type CMListener struct {
	g    *cmService
	port uint16
	ip   netip.Addr
	opts CMOptions
	reqs chan *ibcm.Conn
}

// ListenCM listens for RDMA CM connection requests (rdma_cm's TCP port
// space) to port on the device socket of roce context vctx; ip, if not
// nil or unspecified, must be the socket's address.
func ListenCM(vctx *verbs.Context, ip net.IP, port uint16, opts *CMOptions) (*CMListener, error) {
	cd := ctxOf(vctx)
	if cd == nil {
		return nil, fmt.Errorf("%w: not a roce context", verbs.ErrInvalidArgument)
	}
	local := cd.ep.local.Addr()
	if a, ok := netip.AddrFromSlice(ip); ok && !a.IsUnspecified() && a.Unmap() != local {
		return nil, fmt.Errorf("%w: %s is not the address of %s's socket (%s; %s chooses it)", verbs.ErrInvalidArgument, ip, vctx.Info().Name, local, EnvAddr)
	}
	g := cmOf(cd.ep, opts)
	l := &CMListener{g: g, port: port, ip: local, reqs: make(chan *ibcm.Conn, 64)}
	if opts != nil {
		l.opts = *opts
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, ErrCMClosed
	}
	if err := g.eng.Listen(port); err != nil {
		return nil, fmt.Errorf("%w: %w", verbs.ErrBusy, err)
	}
	g.listens[port] = l
	return l, nil
}

// Close stops listening; requests not yet accepted are rejected.
func (l *CMListener) Close() error {
	g := l.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.listens[l.port] != l {
		return nil
	}
	g.eng.Unlisten(l.port)
	delete(g.listens, l.port)
	close(l.reqs)
	for c := range l.reqs {
		g.eng.Reject(c, ibcm.RejConsumerDefined, nil)
	}
	g.settleLocked()
	return nil
}

// Accept waits for the next connection request and connects qp (in
// INIT, on the listener's context) to the requester: RTR and RTS with
// the request's QP number, PSN, path MTU and timeouts, then the reply,
// then the requester's ready-to-use. A request that is not for this
// address or asks for a bad MTU is rejected and Accept waits for the
// next, the QP still in INIT (one stray request does not end a server);
// a failure after the QP moved leaves it in ERROR.
func (l *CMListener) Accept(ctx context.Context, qp *verbs.QP) (*CMConn, error) {
	g := l.g
	if ctxOf(qp.Context()) == nil || ctxOf(qp.Context()).ep != g.ep {
		return nil, fmt.Errorf("%w: the QP is not on the listener's device socket", verbs.ErrInvalidArgument)
	}
	for {
		var c *ibcm.Conn
		select {
		case c = <-l.reqs:
			if c == nil {
				return nil, ErrCMClosed
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if reason, err := l.check(c.Request()); err != nil {
			g.mu.Lock()
			g.eng.Reject(c, reason, nil)
			g.settleLocked()
			g.mu.Unlock()
			continue
		}
		return l.accept(ctx, qp, c)
	}
}

// check refuses a request not for this listener's address or with a
// path MTU that is no InfiniBand MTU.
func (l *CMListener) check(r ibcm.REQ) (ibcm.Reason, error) {
	if gid := r.RemoteGID().Unmap(); gid != l.ip {
		return ibcm.RejInvalidGID, fmt.Errorf("roce: connection request for GID %s, not ours (%s)", gid, l.ip)
	}
	if verbs.MTU(r.PathMTU()).Bytes() == 0 {
		return ibcm.RejInvalidMTU, fmt.Errorf("roce: connection request with path MTU code %d", r.PathMTU())
	}
	return 0, nil
}

// accept connects qp to the requester of c (checked).
func (l *CMListener) accept(ctx context.Context, qp *verbs.QP, c *ibcm.Conn) (*CMConn, error) {
	g := l.g
	r := c.Request()
	fail := func(reason ibcm.Reason, err error) (*CMConn, error) {
		g.mu.Lock()
		g.eng.Reject(c, reason, nil)
		g.settleLocked()
		g.mu.Unlock()
		qp.Modify(verbs.QPAttr{State: verbs.QPError}) // it may have left INIT
		return nil, err
	}
	mtu := verbs.MTU(r.PathMTU())
	psn := verbs.RandomPSN()
	rd := clampRd(r.InitiatorDepth()) // the Reads it issues, this side serves
	ird := clampRd(r.ResponderResources())
	timeout := r.AckTimeout()
	if timeout == 0 {
		timeout = cmAckTimeout
	}
	// A CM message's starting PSN is the one its sender's QP expects to
	// receive first: the REQ's is the PSN this side sends from, the REP
	// carries the one it receives from.
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: mtu, DestQPN: r.QPN(), RQPSN: psn,
		AH: cmAH(c.Peer, r.QPN()), MinRNRTimer: cmRNRTimer, MaxDestRdAtomic: rd}); err != nil {
		return fail(ibcm.RejNoQP, fmt.Errorf("roce: accepting %s: %w", c.Peer, err))
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: r.PSN(), Timeout: timeout, RetryCount: r.RetryCount(),
		RNRRetry: r.RNRRetryCount(), MaxRdAtomic: ird}); err != nil {
		return fail(ibcm.RejNoQP, fmt.Errorf("roce: accepting %s: %w", c.Peer, err))
	}
	g.mu.Lock()
	ch := g.watchLocked(c)
	err := g.eng.Accept(c, &ibcm.AcceptParams{QPN: qp.Num(), PSN: psn, RespRes: rd, InitDepth: ird, RNRRetry: 7,
		AckDelay: cmAckDelay, Private: l.opts.Private}, g.now())
	if err != nil {
		// E.g. the peer's DREQ closed the request while it was queued:
		// the engine forgot it, so nothing would ever end this watch.
		g.unwatchLocked(c)
	}
	g.settleLocked()
	g.mu.Unlock()
	if err != nil {
		qp.Modify(verbs.QPAttr{State: verbs.QPError})
		return nil, fmt.Errorf("roce: accepting %s: %w", c.Peer, err)
	}
	ev, err := g.wait(ctx, ch)
	if err == nil {
		switch ev.Kind {
		case ibcm.EvEstablished:
			return newCMConn(g, c, ch, qp), nil
		case ibcm.EvDisconnected:
			err = fmt.Errorf("roce: %s disconnected before the connection was up", c.Peer)
		default: // rejected, or the REP timed out
			err = fmt.Errorf("roce: accepting %s: %w", c.Peer, c.Err)
		}
	}
	g.mu.Lock()
	g.eng.Disconnect(c, g.now())
	g.unwatchLocked(c)
	g.settleLocked()
	g.mu.Unlock()
	qp.Modify(verbs.QPAttr{State: verbs.QPError})
	return nil, err
}

func clampRd(n uint8) uint8 { return max(1, min(n, cmRdAtomic)) }

// cmAH is the address of a CM peer's QP qpn: its GID (RoCEv2 port 4791),
// or, for an rdmakit peer on another port, its rdmakit QP address.
func cmAH(peer netip.AddrPort, qpn uint32) verbs.AddressHandle {
	if peer.Port() != header.UDPPort {
		return verbs.AddressHandle{Dest: encodeAddr(peer, qpn)}
	}
	g := peer.Addr().As16()
	return verbs.AddressHandle{GID: net.IP(g[:])}
}

// DialCM connects qp (a roce QP in INIT) through the RDMA CM to the
// listener on port at ip: a request, the reply, RTR and RTS with the
// reply's QP number and PSN, ready-to-use. When the peer rejects the
// request or does not answer, the QP stays in INIT (DialCM may be called
// again, as perftest's clients do while the server is not listening
// yet); when it fails after the reply, the QP goes to ERROR.
func DialCM(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16, opts *CMOptions) (*CMConn, error) {
	cd := ctxOf(qp.Context())
	if cd == nil {
		return nil, fmt.Errorf("%w: not a roce QP", verbs.ErrInvalidArgument)
	}
	var o CMOptions
	if opts != nil {
		o = *opts
	}
	if o.UDPPort == 0 {
		o.UDPPort = header.UDPPort
	}
	a, ok := netip.AddrFromSlice(ip)
	if !ok || a.Unmap().IsUnspecified() {
		return nil, fmt.Errorf("%w: address %v", verbs.ErrInvalidArgument, ip)
	}
	ep := cd.ep
	peer := netip.AddrPortFrom(a.Unmap(), o.UDPPort)
	if peer.Addr().Is4() != ep.local.Addr().Is4() {
		return nil, fmt.Errorf("%w: %s and the device socket's %s are of different IP families", verbs.ErrInvalidArgument, peer.Addr(), ep.local.Addr())
	}
	lid := uint16(0xffff)
	if ep.local.Port() != header.UDPPort {
		lid = ep.local.Port() // an rdmakit-only port: answers come here
	}
	mtu := ep.mtu
	psn := verbs.RandomPSN()
	g := cmOf(ep, opts)
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, ErrCMClosed
	}
	c, err := g.eng.Connect(&ibcm.ConnectParams{Peer: peer, Port: port, QPN: qp.Num(), PSN: psn, LocalGID: ep.local.Addr(),
		RemoteGID: peer.Addr(), LocalLID: lid, MTU: uint8(mtu), RespRes: cmRdAtomic, InitDepth: cmRdAtomic,
		AckTimeout: cmAckTimeout, RetryCount: 7, RNRRetry: 7, SrcPort: uint16(32768 + rand.IntN(28232)), Private: o.Private}, g.now())
	var ch chan ibcm.Event
	if err == nil {
		ch = g.watchLocked(c)
	}
	g.settleLocked()
	g.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", verbs.ErrInvalidArgument, err)
	}
	moved := false // the QP left INIT
	abort := func(err error) (*CMConn, error) {
		g.mu.Lock()
		if c.State == ibcm.StateRepRcvd {
			g.eng.Reject(c, ibcm.RejConsumerDefined, nil)
		} else {
			g.eng.Disconnect(c, g.now())
		}
		g.unwatchLocked(c)
		g.settleLocked()
		g.mu.Unlock()
		if moved {
			qp.Modify(verbs.QPAttr{State: verbs.QPError})
		}
		return nil, fmt.Errorf("roce: connecting to %s port %d through the RDMA CM: %w", peer.Addr(), port, err)
	}
	ev, err := g.wait(ctx, ch)
	if err != nil {
		return abort(err)
	}
	if ev.Kind != ibcm.EvReply {
		return abort(c.Err)
	}
	r := c.Reply()
	moved = true
	// The REQ carried the PSN this side receives from; the REP carries
	// the one it sends from.
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: mtu, DestQPN: r.QPN(), RQPSN: psn,
		AH: cmAH(peer, r.QPN()), MinRNRTimer: cmRNRTimer, MaxDestRdAtomic: clampRd(r.InitiatorDepth())}); err != nil {
		return abort(err)
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: r.PSN(), Timeout: cmAckTimeout, RetryCount: 7,
		RNRRetry: r.RNRRetryCount(), MaxRdAtomic: clampRd(r.ResponderResources())}); err != nil {
		return abort(err)
	}
	g.mu.Lock()
	err = g.eng.Ready(c, g.now())
	g.settleLocked()
	g.mu.Unlock()
	if err != nil {
		return abort(err)
	}
	return newCMConn(g, c, ch, qp), nil
}

// CMConn is a connection made through the RDMA CM.
type CMConn struct {
	g    *cmService
	c    *ibcm.Conn
	qp   *verbs.QP
	done chan struct{} // closed when the watcher ends
	once sync.Once
	// closing: Close started (the watcher leaves the QP alone).
	closing chan struct{}
}

func newCMConn(g *cmService, c *ibcm.Conn, ch chan ibcm.Event, qp *verbs.QP) *CMConn {
	cc := &CMConn{g: g, c: c, qp: qp, done: make(chan struct{}), closing: make(chan struct{})}
	go cc.watch(ch)
	return cc
}

// watch moves the QP to ERROR when the peer disconnects (or the device
// closes), as rdma_cm does, so that its work requests flush.
func (cc *CMConn) watch(ch chan ibcm.Event) {
	defer close(cc.done)
	for {
		select {
		case ev, ok := <-ch:
			if !ok || ev.Kind == ibcm.EvDisconnected || ev.Kind == ibcm.EvRejected || ev.Kind == ibcm.EvTimeout {
				cc.qp.Modify(verbs.QPAttr{State: verbs.QPError})
				if ok {
					cc.g.mu.Lock()
					cc.g.unwatchLocked(cc.c)
					cc.g.mu.Unlock()
				}
				return
			}
			if ev.Kind == ibcm.EvClosed {
				return
			}
		case <-cc.closing:
			return
		}
	}
}

// QP returns the connected QP.
func (cc *CMConn) QP() *verbs.QP { return cc.qp }

// PeerQPN returns the peer's QP number.
func (cc *CMConn) PeerQPN() uint32 {
	if cc.c.Active {
		return cc.c.Reply().QPN()
	}
	return cc.c.Request().QPN()
}

// Disconnected is closed when the connection ended (the peer
// disconnected, or Close).
func (cc *CMConn) Disconnected() <-chan struct{} { return cc.done }

// Close disconnects: the QP goes to ERROR (its work requests flush) and a
// disconnect request goes to the peer, whose answer Close waits for, up
// to a second.
func (cc *CMConn) Close() error {
	cc.once.Do(func() {
		g := cc.g
		cc.qp.Modify(verbs.QPAttr{State: verbs.QPError})
		close(cc.closing)
		<-cc.done
		g.mu.Lock()
		ch := g.waiters[cc.c]
		if ch == nil {
			g.mu.Unlock()
			return // the peer disconnected, or the device closed
		}
		g.eng.Disconnect(cc.c, g.now())
		g.settleLocked()
		g.mu.Unlock()
		t := time.NewTimer(time.Second)
		defer t.Stop()
	wait:
		for {
			select {
			case ev, ok := <-ch:
				if !ok || ev.Kind != ibcm.EvNone {
					break wait
				}
			case <-t.C:
				break wait
			}
		}
		g.mu.Lock()
		g.eng.Forget(cc.c)
		g.unwatchLocked(cc.c)
		g.mu.Unlock()
	})
	return nil
}
