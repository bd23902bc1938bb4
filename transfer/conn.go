package transfer

// Connections to peer nodes: a peer is Config.QPsPerPeer cm connections to
// one node over one device, made on first use and cached. Goroutines: each
// qpConn runs a completion goroutine (cq.Wait; it finishes slices) and a
// watcher (closes the peer when cm reports the connection lost); the
// node's janitor closes idle and dead peers. Posting runs on Submit's
// goroutine under qpConn.mu.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/cm"
	"github.com/rdmakit/rdmakit/verbs"
)

type peerKey struct{ node, dev string }

type peer struct {
	key   peerKey
	n     *Node
	dev   *device
	ready chan struct{} // closed when dialled (err or qps set)
	err   error
	qps   []*qpConn
	used  atomic.Int64 // unix nanos of last use
	dead  atomic.Bool
	once  sync.Once
}

func (p *peer) touch() { p.used.Store(time.Now().UnixNano()) }

type slot struct {
	b   *Batch
	req int
}

type qpConn struct {
	p      *peer
	c      *cm.Conn
	free   chan int      // free slot indices
	kick   chan struct{} // wakes the completion goroutine (cap 1)
	gone   chan struct{} // closed when the connection is lost or closed
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// reapMu serialises handling completions (the completion goroutine,
	// and Submit and Wait polling for them) and guards firstErr.
	reapMu sync.Mutex
	// firstErr is the first failure on the QP.
	firstErr error
	pollWCs  [16]verbs.WorkCompletion // poll's buffer

	// mu serialises posting and guards everything below.
	mu     sync.Mutex
	slots  []slot
	closed bool // set by close: nothing more is posted
	wr     [1]verbs.SendWR
	sge    [1]verbs.SGE
}

// rail is one device over which a segment is reached: the connected peer
// over it, and the segment's region there.
type rail struct {
	p   *peer
	dev *device
	reg Region
}

// railsFor returns the devices over which this node reaches segment d,
// connected: the first that works (the same-host device for a node of this
// host, else the first network device both have) and, up to Config.Rails,
// more (by default every other network device both have, for a node of
// another host). A failure to connect over the first is the error; the
// others are skipped when they fail.
func (n *Node) railsFor(ctx context.Context, d SegmentDesc) ([]rail, error) {
	n.mu.Lock()
	info, ok := n.nodeInfo[d.Node]
	n.mu.Unlock()
	if !ok {
		var err error
		if info, err = n.meta.GetNode(ctx, d.Node); err != nil {
			return nil, err
		}
		n.mu.Lock()
		n.nodeInfo[d.Node] = info
		n.mu.Unlock()
	}
	sameHost := info.Host == n.host
	var rails []rail
	for _, dev := range n.devs {
		if dev.sameHost && !sameHost {
			continue
		}
		if len(rails) > 0 {
			limit := n.cfg.Rails
			if limit == 0 {
				// Default: every network device to another host; the
				// same-host device alone on this one.
				if sameHost || dev.sameHost || rails[0].dev.sameHost {
					break
				}
				limit = len(n.devs)
			}
			if len(rails) >= limit {
				break
			}
		}
		var reg *Region
		for i := range d.Regions {
			if d.Regions[i].Device == dev.name {
				reg = &d.Regions[i]
			}
		}
		var ep *Endpoint
		for i := range info.Endpoints {
			if info.Endpoints[i].Device == dev.name {
				ep = &info.Endpoints[i]
			}
		}
		if reg == nil || ep == nil {
			continue
		}
		p, err := n.connect(ctx, peerKey{d.Node, dev.name}, dev, ep.Addr)
		if err != nil {
			if len(rails) == 0 {
				return nil, err
			}
			continue
		}
		rails = append(rails, rail{p: p, dev: dev, reg: *reg})
	}
	if len(rails) == 0 {
		return nil, fmt.Errorf("%w: node %q offers %v", ErrNoDevice, d.Node, info.Endpoints)
	}
	return rails, nil
}

// connect returns the cached peer or dials it.
func (n *Node) connect(ctx context.Context, key peerKey, dev *device, addr string) (*peer, error) {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	p := n.peers[key]
	if p == nil || p.dead.Load() {
		p = &peer{key: key, n: n, dev: dev, ready: make(chan struct{})}
		p.touch()
		n.peers[key] = p
		n.mu.Unlock()
		// Close cancels a dial in progress.
		dctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(n.ctx, cancel)
		p.err = p.dial(dctx, dev, addr)
		stop()
		cancel()
		if p.err != nil {
			p.dead.Store(true)
			n.mu.Lock()
			if n.peers[key] == p {
				delete(n.peers, key)
			}
			n.mu.Unlock()
			close(p.ready)
			p.close()
		} else {
			close(p.ready)
		}
	} else {
		p.touch() // under n.mu: the janitor does not close it now
		n.mu.Unlock()
	}
	select {
	case <-p.ready:
	default:
		select {
		case <-p.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	return p, nil
}

func (p *peer) dial(ctx context.Context, dev *device, addr string) error {
	n := p.n
	for i := 0; i < n.cfg.QPsPerPeer; i++ {
		c, err := cm.Dial(ctx, addr, n.cmOptions(dev))
		for try := 0; err != nil && isBusy(err) && try < 20 && ctx.Err() == nil; try++ {
			// The listener has many handshakes in progress: back off.
			time.Sleep(time.Duration(1+try) * 5 * time.Millisecond)
			c, err = cm.Dial(ctx, addr, n.cmOptions(dev))
		}
		if err != nil {
			n.forget(p.key.node)
			return fmt.Errorf("%w: connecting to node %q (%s at %s): %w", ErrPeerLost, p.key.node, dev.name, addr, err)
		}
		qc := &qpConn{p: p, c: c, free: make(chan int, n.cfg.QueueDepth), kick: make(chan struct{}, 1), gone: make(chan struct{}), slots: make([]slot, n.cfg.QueueDepth)}
		for s := 0; s < n.cfg.QueueDepth; s++ {
			qc.free <- s
		}
		qc.ctx, qc.cancel = context.WithCancel(context.Background())
		p.qps = append(p.qps, qc)
		qc.wg.Add(2)
		go qc.complete()
		go qc.watch()
	}
	return nil
}

// post posts one slice of request req of b.
func (qc *qpConn) post(ctx context.Context, b *Batch, req int, op verbs.Opcode, flags verbs.SendFlags, sge verbs.SGE, raddr uint64, rkey uint32) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var s int
	select {
	case s = <-qc.free:
	default:
		// The queue is full: reap, or have the completion goroutine do it.
		qc.poll()
		qc.wake()
		select {
		case s = <-qc.free:
		case <-qc.gone:
			return fmt.Errorf("%w: node %q: %v", ErrPeerLost, qc.p.key.node, qc.cause())
		case <-ctx.Done():
			return ctx.Err()
		}
	case <-qc.gone:
		return fmt.Errorf("%w: node %q: %v", ErrPeerLost, qc.p.key.node, qc.cause())
	case <-ctx.Done():
		return ctx.Err()
	}
	// Under mu, so that close either sees the slot (and fails it) or
	// has marked the QP closed (and nothing is posted).
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if qc.closed {
		qc.free <- s
		return fmt.Errorf("%w: node %q: connection closed", ErrPeerLost, qc.p.key.node)
	}
	qc.slots[s] = slot{b: b, req: req}
	qc.p.dev.posted.Add(1)
	qc.sge[0] = sge
	qc.wr[0] = verbs.SendWR{ID: uint64(s), Opcode: op, Flags: verbs.SendSignaled | flags, SGL: qc.sge[:], RemoteAddr: raddr, RKey: rkey}
	if err := qc.c.QP().PostSend(qc.wr[:]); err != nil {
		qc.slots[s] = slot{}
		qc.free <- s
		return fmt.Errorf("%w: node %q: post: %v", ErrPeerLost, qc.p.key.node, err)
	}
	return nil
}

func (qc *qpConn) cause() error {
	if err := qc.c.Err(); err != nil {
		return err
	}
	return ErrClosed
}

// complete finishes slices as their completions arrive, while slices are
// in flight that Submit and Wait did not reap themselves: it sleeps on
// kick until then, so that a transport that completes as it posts (shm0)
// wakes no goroutine. Once kicked it sleeps in the driver's Wait at once,
// without verbs.CQ.Wait's spin: whoever kicked it has polled already
// (Batch.Wait for waitSpin), and several completion goroutines spinning
// with runtime.Gosched starve Go's network poller, which wakes the tcp
// transport's readers that deliver the completions (kv bench GET over
// tcp0, 8 clients in one process, 2 cores: 256 KiB Gets without the
// master went from 4.2-5.5k to 5.8-7.5k ops/s).
func (qc *qpConn) complete() {
	defer qc.wg.Done()
	var wcs [16]verbs.WorkCompletion
	cq := qc.c.SendCQ().Driver()
	for {
		select {
		case <-qc.kick:
		case <-qc.ctx.Done():
			return
		}
		for len(qc.free) < cap(qc.free) {
			k, err := cq.Wait(qc.ctx, wcs[:])
			if err != nil {
				return
			}
			qc.reapMu.Lock()
			qc.reap(wcs[:k])
			qc.reapMu.Unlock()
		}
	}
}

// wake makes the completion goroutine reap what is in flight.
func (qc *qpConn) wake() {
	select {
	case qc.kick <- struct{}{}:
	default:
	}
}

// poll handles the completions already there, unless another goroutine is
// handling some (then they are in good hands). Submit and Wait call it,
// so that a transport that completes at once (shm0 copies as it posts)
// costs no goroutine handoff.
func (qc *qpConn) poll() {
	if !qc.reapMu.TryLock() {
		return
	}
	defer qc.reapMu.Unlock()
	wcs := qc.pollWCs[:]
	for {
		k, err := qc.c.SendCQ().Poll(wcs)
		if k > 0 {
			qc.reap(wcs[:k])
		}
		if err != nil || k < len(wcs) {
			return
		}
	}
}

// reap finishes the slices of completions wcs; reapMu is held.
func (qc *qpConn) reap(wcs []verbs.WorkCompletion) {
	for i := range wcs {
		wc := &wcs[i]
		qc.mu.Lock()
		sl := qc.slots[wc.WRID]
		qc.slots[wc.WRID] = slot{}
		qc.mu.Unlock()
		qc.free <- int(wc.WRID)
		if sl.b == nil {
			continue
		}
		var err error
		if wc.Status != verbs.StatusSuccess {
			err = qc.failure(wc)
		}
		sl.b.sliceDone(sl.req, 1, err)
	}
}

// failure returns the cause of a failed completion and, the QP being in
// ERROR now, retires the peer: the next request reconnects.
func (qc *qpConn) failure(wc *verbs.WorkCompletion) error {
	p := qc.p
	err := wc.Err()
	switch wc.Status {
	case verbs.StatusWRFlush:
		if qc.firstErr != nil {
			// Flushed because an earlier work request failed.
			err = fmt.Errorf("%w, after: %w", err, qc.firstErr)
		} else if cerr := qc.c.Err(); cerr != nil {
			err = fmt.Errorf("%w: node %q: %w (%w)", ErrPeerLost, p.key.node, cerr, err)
		} else {
			err = fmt.Errorf("%w: node %q: connection closed (%w)", ErrPeerLost, p.key.node, err)
		}
	case verbs.StatusRetryExceeded, verbs.StatusRNRRetryExceeded, verbs.StatusResponseTimeout:
		err = fmt.Errorf("%w: node %q: %w", ErrPeerLost, p.key.node, err)
	}
	if qc.firstErr == nil {
		qc.firstErr = err
	}
	p.n.forget(p.key.node)
	if !p.dead.Swap(true) {
		n := p.n
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.dropPeer(p) }()
	}
	return err
}

// watch closes the peer when cm reports the connection gone.
func (qc *qpConn) watch() {
	defer qc.wg.Done()
	select {
	case <-qc.c.Done():
		p := qc.p
		p.n.forget(p.key.node)
		if !p.dead.Swap(true) {
			n := p.n
			n.wg.Add(1)
			go func() { defer n.wg.Done(); n.dropPeer(p) }()
		}
	case <-qc.ctx.Done():
	}
}

// dropPeer removes p from the cache and closes it.
func (n *Node) dropPeer(p *peer) {
	n.mu.Lock()
	if n.peers[p.key] == p {
		delete(n.peers, p.key)
	}
	n.mu.Unlock()
	p.close()
}

// close drains and closes the peer's connections: each is disconnected
// (outstanding work requests flush and fail their slices), its
// goroutines stopped, then closed. Slices that never come back within a
// second fail with ErrPeerLost.
func (p *peer) close() {
	<-p.ready // p.qps is complete
	p.once.Do(func() {
		p.dead.Store(true)
		for _, qc := range p.qps {
			qc.c.Disconnect()
			qc.wake() // the flushed completions need reaping
		}
		deadline := time.Now().Add(time.Second)
		for _, qc := range p.qps {
			for len(qc.free) < cap(qc.free) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			close(qc.gone)
			qc.cancel()
			qc.wg.Wait()
			qc.mu.Lock()
			qc.closed = true
			for s, sl := range qc.slots {
				if sl.b != nil {
					qc.slots[s] = slot{}
					sl.b.sliceDone(sl.req, 1, fmt.Errorf("%w: node %q: connection closed", ErrPeerLost, p.key.node))
				}
			}
			qc.mu.Unlock()
			qc.c.Close()
		}
	})
}

// janitor closes peers idle for Config.IdleTimeout.
func (n *Node) janitor() {
	defer n.wg.Done()
	t := time.NewTicker(max(n.cfg.IdleTimeout/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		var idle []*peer
		now := time.Now().UnixNano()
		n.mu.Lock()
		for k, p := range n.peers {
			select {
			case <-p.ready:
			default:
				continue
			}
			busy := false
			for _, qc := range p.qps {
				if len(qc.free) < cap(qc.free) {
					busy = true
					qc.wake() // in flight and perhaps nobody waiting: reap it
				}
			}
			if !busy && now-p.used.Load() > int64(n.cfg.IdleTimeout) {
				delete(n.peers, k)
				idle = append(idle, p)
			}
		}
		n.mu.Unlock()
		for _, p := range idle {
			p.close()
		}
	}
}

// isBusy: a listener refused a dial for load (RejectBusy).
func isBusy(err error) bool {
	var re *cm.RejectError
	return errors.As(err, &re) && re.Code == cm.RejectBusy
}

// Transport returns the transport ("shm", "tcp", "ibverbs", ...) of the
// device this node reaches segment name over first (the one a request of
// one slice goes over), connecting to its node if it is not yet.
func (n *Node) Transport(ctx context.Context, name string) (string, error) {
	d, err := n.lookup(ctx, name, false)
	if err != nil {
		return "", err
	}
	rails, err := n.railsFor(ctx, d)
	if err != nil {
		return "", err
	}
	return rails[0].dev.ctx.Info().Transport, nil
}
