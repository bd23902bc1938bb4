package cm

// Goroutines. A Listener runs one accept loop goroutine, which accepts TCP
// connections and starts one handshake goroutine per connection. A
// handshake goroutine reads the request, runs ListenOptions.Check, creates
// and connects the QP, and queues the established Conn (whose own
// goroutines are running by then, so heartbeats flow while it waits) for
// Accept; on failure it reports to ListenOptions.OnHandshakeError. Accept
// runs on the application's goroutines and only takes Conns off the queue.
// Close stops the accept loop, aborts handshakes in progress by closing
// their connections, waits for all of these goroutines, then closes the
// Conns nobody accepted.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// ListenOptions configure a Listener. The embedded Options apply to every
// accepted connection (PrivateData is the accept reply's private data).
type ListenOptions struct {
	Options
	// Check, if set, decides on each request before any QP is created: a
	// non-nil error rejects it, and the dialer's Dial fails with a
	// *RejectError (matching ErrRejected) whose Reason is the error's
	// message (cut to MaxRejectReason bytes). Check may set
	// Request.ReplyPrivateData. It runs on a handshake goroutine, possibly
	// concurrently with itself.
	Check func(*Request) error
	// Backlog bounds connections being handshaken or waiting for Accept
	// (default DefaultBacklog); requests beyond it are rejected (RejectBusy).
	Backlog int
	// OnHandshakeError, if set, is told about every connection attempt
	// that did not end in the Accept queue, as a *HandshakeError: requests
	// rejected by Check or for a transport mismatch (matching ErrRejected,
	// ErrTransportMismatch), dialers that aborted, garbage. Accept does
	// not return such errors, so a misbehaving client cannot stop a server
	// loop. It runs on a handshake goroutine.
	OnHandshakeError func(error)
}

// Request is a dialer's connection request as ListenOptions.Check sees it.
type Request struct {
	// RemoteAddr is the dialer's address on the handshake connection.
	RemoteAddr net.Addr
	// Transport and Device name the dialer's verbs transport and device.
	Transport, Device string
	// QPN is the dialer's QP number; Address its transport address
	// (qp.Address()), which becomes AddressHandle.Dest.
	QPN     uint32
	Address []byte
	// PathMTU is the largest MTU the dialer offered.
	PathMTU verbs.MTU
	// PeerTimeout is the dialer's peer timeout.
	PeerTimeout time.Duration
	// PrivateData is the dialer's private data.
	PrivateData []byte
	// ReplyPrivateData, if Check sets it, is sent with the accept instead
	// of ListenOptions.PrivateData (at most MaxPrivateData bytes).
	ReplyPrivateData []byte
}

// Listener accepts cm connections on a TCP address.
type Listener struct {
	ln        net.Listener
	opts      ListenOptions
	transport string // of the device accepted QPs are created on
	device    string
	queue     chan *Conn
	closing   chan struct{}
	dead      chan struct{} // closed when the accept loop fails
	deadErr   error         // written before dead is closed
	pending   atomic.Int64  // handshakes in progress plus queued Conns
	wg        sync.WaitGroup

	// mu guards hs and closed.
	mu     sync.Mutex
	hs     map[net.Conn]struct{} // handshakes in progress
	closed bool
}

// Listen listens for cm connections on the TCP address addr ("host:port";
// port 0 picks one, see Addr). ctx bounds the listen call only. The device
// (opts.Device, or opts.PD's) must exist.
func Listen(ctx context.Context, addr string, opts ListenOptions) (*Listener, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.Backlog < 0 {
		return nil, fmt.Errorf("cm: %w: negative Backlog", verbs.ErrInvalidArgument)
	}
	if opts.Backlog == 0 {
		opts.Backlog = DefaultBacklog
	}
	opts.PrivateData = append([]byte(nil), opts.PrivateData...)
	l := &Listener{
		opts:    opts,
		queue:   make(chan *Conn, opts.Backlog),
		closing: make(chan struct{}),
		dead:    make(chan struct{}),
		hs:      map[net.Conn]struct{}{},
	}
	if opts.PD != nil {
		info := opts.PD.Context().Info()
		l.transport, l.device = info.Transport, info.Name
	} else {
		l.device = opts.Device
		if l.device == "" {
			l.device = DefaultDevice
		}
		devs, _ := verbs.Devices()
		for _, d := range devs {
			if d.Name == l.device {
				l.transport = d.Transport
			}
		}
		if l.transport == "" {
			var names []string
			for _, d := range devs {
				names = append(names, d.Name)
			}
			return nil, fmt.Errorf("cm: listen: %w %q (devices: %v; import a transport such as rdmakit/transport/tcp)", verbs.ErrNoDevice, l.device, names)
		}
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cm: listen: %w", err)
	}
	l.ln = ln
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Accept waits for the next established connection. It returns ctx's error
// if ctx ends first, and an error matching ErrClosed once the Listener is
// closed. Connections whose peer went away while they were queued are
// skipped.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	for {
		select {
		case <-l.closing:
			return nil, fmt.Errorf("cm: accept: %w", ErrClosed)
		default:
		}
		select {
		case c := <-l.queue:
			l.pending.Add(-1)
			if c.Err() != nil {
				c.Close()
				continue
			}
			return c, nil
		case <-l.closing:
			return nil, fmt.Errorf("cm: accept: %w", ErrClosed)
		case <-l.dead:
			return nil, l.deadErr
		case <-ctx.Done():
			return nil, fmt.Errorf("cm: accept: %w", ctx.Err())
		}
	}
}

// Close stops listening, aborts handshakes in progress (their dialers are
// rejected, or disconnected if they had already connected), closes the
// connections not yet accepted and unblocks Accept. Accepted Conns are not
// affected.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.closing)
	for c := range l.hs {
		c.SetDeadline(time.Unix(1, 0)) // the handshake goroutine says goodbye
	}
	l.mu.Unlock()
	err := l.ln.Close()
	l.wg.Wait()
	for {
		select {
		case c := <-l.queue:
			c.Close()
		default:
			return err
		}
	}
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var backoff time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-l.closing:
					return
				}
			}
			l.deadErr = fmt.Errorf("cm: accept: %w", err)
			close(l.dead)
			return
		}
		backoff = 0
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		// Set here, under mu, so that Close's expired deadline wins.
		c.SetDeadline(time.Now().Add(l.opts.handshakeTimeout()))
		l.hs[c] = struct{}{}
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(c)
	}
}

// Handshake progress, as far as the dialer knows.
const (
	sentNothing = iota
	sentReject
	sentAccept
)

// handshake runs the listener side of one connection attempt.
func (l *Listener) handshake(c net.Conn) {
	defer l.wg.Done()
	conn, req, sent, err := l.runHandshake(c)
	l.mu.Lock()
	delete(l.hs, c)
	if err == nil && l.closed {
		err = ErrClosed
	}
	if err == nil {
		l.queue <- conn // never blocks: pending ≤ Backlog = cap(queue)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	if conn != nil {
		// Established, but the listener closed meanwhile: disconnect.
		l.pending.Add(-1)
		conn.Close()
	} else {
		c.SetWriteDeadline(time.Now().Add(lingerMax))
		switch sent {
		case sentNothing:
			select {
			case <-l.closing:
				writeMsg(c, &msg{typ: msgReject, code: RejectBusy, reason: ErrListenerClosed.Error()})
			default:
			}
		case sentAccept:
			writeMsg(c, &msg{typ: msgDisconnect})
		}
		closeGracefully(c)
	}
	if l.opts.OnHandshakeError != nil {
		l.opts.OnHandshakeError(&HandshakeError{Remote: c.RemoteAddr(), Request: req, Err: err})
	}
}

// closeGracefully shuts the write half of c and reads until the peer
// closes (for lingerMax at most) before closing, so that what was written
// last reaches the peer instead of being lost to a reset.
func closeGracefully(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok && tc.CloseWrite() == nil {
		c.SetReadDeadline(time.Now().Add(lingerMax))
		io.Copy(io.Discard, io.LimitReader(c, 1<<20))
	}
	c.Close()
}

// runHandshake reads the request, checks it, connects a QP and waits for
// the dialer's ready. On success the Conn is started and counted in
// pending. sent says what the dialer was sent.
func (l *Listener) runHandshake(c net.Conn) (conn *Conn, req *Request, sent int, err error) {
	o := l.opts.Options
	reject := func(code RejectCode, cause error) (*Conn, *Request, int, error) {
		e := &RejectError{Code: code, Reason: truncateReason(cause.Error()), Err: cause}
		c.SetWriteDeadline(time.Now().Add(lingerMax)) // even if Close expired it
		writeMsg(c, &msg{typ: msgReject, code: code, reason: e.Reason})
		return nil, req, sentReject, e
	}

	m, err := readMsg(c)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return reject(RejectProtocol, err)
		}
		return nil, nil, sentNothing, fmt.Errorf("reading request: %w", err)
	}
	if m.typ != msgRequest {
		return reject(RejectProtocol, fmt.Errorf("%w: expected a request, got message type %d", ErrProtocol, m.typ))
	}
	req = &Request{
		RemoteAddr:  c.RemoteAddr(),
		Transport:   m.transport,
		Device:      m.device,
		QPN:         m.qpn,
		Address:     m.addr,
		PathMTU:     m.mtu,
		PeerTimeout: time.Duration(m.peerTimeoutMs) * time.Millisecond,
		PrivateData: m.priv,
	}
	if m.transport != l.transport {
		// The RejectError matches ErrTransportMismatch by its code.
		return reject(RejectTransport, fmt.Errorf("dialer uses transport %q (device %s), listener uses %q (device %s)",
			m.transport, m.device, l.transport, l.device))
	}
	if n := l.pending.Add(1); n > int64(l.opts.Backlog) {
		l.pending.Add(-1)
		return reject(RejectBusy, fmt.Errorf("listener busy: %d connections pending (backlog)", n-1))
	}
	defer func() {
		if conn == nil {
			l.pending.Add(-1)
		}
	}()
	if l.opts.Check != nil {
		if err := l.opts.Check(req); err != nil {
			return reject(RejectApplication, err)
		}
		select {
		case <-l.closing:
			return reject(RejectBusy, ErrListenerClosed)
		default:
		}
	}
	if req.ReplyPrivateData != nil {
		if len(req.ReplyPrivateData) > MaxPrivateData {
			return reject(RejectInvalid, fmt.Errorf("%w: listener's reply private data is %d bytes (max %d)",
				ErrPrivateDataTooLong, len(req.ReplyPrivateData), MaxPrivateData))
		}
		o.PrivateData = append([]byte(nil), req.ReplyPrivateData...)
	}

	res, err := newResources(&o)
	if err != nil {
		return reject(RejectResources, fmt.Errorf("listener: %w", err))
	}
	ok := false
	defer func() {
		if !ok {
			res.close()
		}
	}()
	mtu := min(res.mtu, m.mtu)
	if err := res.toRTR(&o, m, remoteIP(c), mtu); err != nil {
		return reject(RejectResources, fmt.Errorf("listener: %w", err))
	}
	psn := verbs.RandomPSN()
	err = writeMsg(c, &msg{
		typ:           msgAccept,
		qpn:           res.qp.Num(),
		psn:           psn,
		mtu:           mtu,
		peerTimeoutMs: o.peerTimeoutMs(),
		addr:          res.qp.Address(),
		priv:          o.PrivateData,
	})
	if err != nil {
		return nil, req, sentNothing, fmt.Errorf("sending accept: %w", err)
	}
	r, err := readMsg(c)
	if err != nil {
		return nil, req, sentAccept, fmt.Errorf("waiting for ready: %w", err)
	}
	switch r.typ {
	case msgReady:
	case msgReject:
		return nil, req, sentAccept, &RejectError{Code: r.code, Reason: r.reason, ByPeer: true}
	default:
		return nil, req, sentAccept, fmt.Errorf("%w: expected ready, got message type %d", ErrProtocol, r.typ)
	}
	if err := res.toRTS(&o, psn); err != nil {
		return nil, req, sentAccept, err
	}
	c.SetDeadline(time.Time{})
	ok = true
	conn = newConn(res, c, &o, m)
	conn.start()
	return conn, req, sentAccept, nil
}
