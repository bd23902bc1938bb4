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
// Conns nobody accepted. A connection beyond MaxHandshakes (or
// MaxHandshakesPerSource) is refused by the accept loop itself, without a
// goroutine.

import (
	"context"
	"crypto/tls"
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
	// Sharing says what connections share when Options.PD is nil (default
	// ShareContext: one verbs context opened at Listen, a PD per
	// connection).
	Sharing ContextSharing
	// MaxHandshakes bounds the handshakes in progress (default
	// DefaultMaxHandshakes); each holds a goroutine and a socket until it
	// ends, at the latest after HandshakeTimeout. A connection beyond the
	// bound is refused at once by the accept loop (a RejectBusy reply
	// where no TLS is in use, then close).
	MaxHandshakes int
	// MaxHandshakesPerSource bounds the handshakes in progress from one IP
	// address (default DefaultMaxHandshakesPerSource), so that one host
	// cannot take all MaxHandshakes.
	MaxHandshakesPerSource int
	// RequestTimeout bounds the first part of a handshake, before any
	// verbs object exists for it: the TLS handshake, the shared-secret
	// exchange and the request (default DefaultRequestTimeout, at most
	// HandshakeTimeout). A dialer that connects and then stalls holds its
	// slot for this long.
	RequestTimeout time.Duration
	// OnHandshakeError, if set, is told about every connection attempt
	// that did not end in the Accept queue, as a *HandshakeError: requests
	// rejected by Check or for a transport mismatch (matching ErrRejected,
	// ErrTransportMismatch), dialers that aborted, garbage. Accept does
	// not return such errors, so a misbehaving client cannot stop a server
	// loop. It runs on a handshake goroutine, or on the accept loop for
	// connections refused beyond MaxHandshakes or MaxHandshakesPerSource
	// (which it should not hold up).
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
	// TLS is the control connection's TLS state (the dialer's verified
	// certificate chains under mutual TLS), nil without TLS.
	TLS *tls.ConnectionState
	// SecretProved is true when the dialer proved Options.Secret.
	SecretProved bool
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
	pending   atomic.Int64  // handshakes past the request plus queued Conns
	wg        sync.WaitGroup
	tls       *tls.Config // nil without TLS
	shared    *sharedCtx  // nil with Options.PD or ContextPerConnection

	// mu guards hs, perSource and closed.
	mu        sync.Mutex
	hs        map[net.Conn]struct{} // handshakes in progress
	perSource map[string]int        // handshakes in progress by source IP
	closed    bool
}

// Listen listens for cm connections on the TCP address addr ("host:port";
// port 0 picks one, see Addr). ctx bounds the listen call only. The device
// (opts.Device, or opts.PD's) must exist; unless opts.PD is set or
// opts.Sharing is ContextPerConnection, Listen opens its context. opts
// must name a credential (Secret, or TLS with client certificates
// required) or say Insecure, else Listen fails with ErrNoCredential.
func Listen(ctx context.Context, addr string, opts ListenOptions) (l *Listener, err error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := opts.checkCredentials(true); err != nil {
		return nil, err
	}
	if opts.Backlog < 0 || opts.MaxHandshakes < 0 || opts.MaxHandshakesPerSource < 0 || opts.RequestTimeout < 0 {
		return nil, fmt.Errorf("cm: %w: negative Backlog, MaxHandshakes, MaxHandshakesPerSource or RequestTimeout", verbs.ErrInvalidArgument)
	}
	if opts.Sharing > ContextPerConnection {
		return nil, fmt.Errorf("cm: %w: %v", verbs.ErrInvalidArgument, opts.Sharing)
	}
	if opts.Backlog == 0 {
		opts.Backlog = DefaultBacklog
	}
	if opts.MaxHandshakes == 0 {
		opts.MaxHandshakes = DefaultMaxHandshakes
	}
	if opts.MaxHandshakesPerSource == 0 {
		opts.MaxHandshakesPerSource = DefaultMaxHandshakesPerSource
	}
	if opts.RequestTimeout == 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	opts.RequestTimeout = min(opts.RequestTimeout, opts.handshakeTimeout())
	opts.PrivateData = append([]byte(nil), opts.PrivateData...)
	opts.Secret = append([]byte(nil), opts.Secret...)
	if len(opts.Secret) == 0 {
		opts.Secret = nil
	}
	l = &Listener{
		opts:      opts,
		queue:     make(chan *Conn, opts.Backlog),
		closing:   make(chan struct{}),
		dead:      make(chan struct{}),
		hs:        map[net.Conn]struct{}{},
		perSource: map[string]int{},
		tls:       opts.tlsConfig(""),
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
		if opts.Sharing != ContextPerConnection {
			if l.shared, err = openShared(l.device, opts.Sharing == SharePD); err != nil {
				return nil, fmt.Errorf("cm: listen: %w", err)
			}
			defer func() {
				if err != nil {
					l.shared.release()
				}
			}()
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

// PD returns the protection domain every connection is built in:
// Options.PD, or with SharePD the one the Listener allocated; nil when
// each connection has its own. A PD the Listener allocated stays usable
// until the Listener and all its connections have closed.
func (l *Listener) PD() *verbs.PD {
	if l.opts.PD != nil {
		return l.opts.PD
	}
	if l.shared != nil {
		return l.shared.pd
	}
	return nil
}

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
			continue
		default:
		}
		break
	}
	if l.shared != nil {
		// Accepted connections keep the context open until they close.
		err = errors.Join(err, l.shared.release())
	}
	return err
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
		src := sourceOf(c.RemoteAddr())
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			return
		}
		if len(l.hs) >= l.opts.MaxHandshakes || l.perSource[src] >= l.opts.MaxHandshakesPerSource {
			n, ns := len(l.hs), l.perSource[src]
			l.mu.Unlock()
			l.refuse(c, n, ns)
			continue
		}
		// Set here, under mu, so that Close's expired deadline wins.
		start := time.Now()
		c.SetDeadline(start.Add(l.opts.RequestTimeout))
		l.hs[c] = struct{}{}
		l.perSource[src]++
		l.wg.Add(1)
		l.mu.Unlock()
		go l.handshake(c, src, start)
	}
}

// sourceOf is the key of a dialer's address for MaxHandshakesPerSource:
// its IP.
func sourceOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// refuse turns away a connection beyond the handshake limits, on the
// accept loop: a reject where the reply cannot block (an empty socket
// buffer; never under TLS, where the dialer expects a TLS handshake),
// then close.
func (l *Listener) refuse(c net.Conn, n, fromSource int) {
	cause := fmt.Errorf("listener busy: %d handshakes in progress (MaxHandshakes %d), %d from this source (MaxHandshakesPerSource %d)",
		n, l.opts.MaxHandshakes, fromSource, l.opts.MaxHandshakesPerSource)
	if l.tls == nil {
		c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
		writeMsg(c, &msg{typ: msgReject, code: RejectBusy, reason: cause.Error()})
	}
	remote := c.RemoteAddr()
	c.Close()
	if l.opts.OnHandshakeError != nil {
		l.opts.OnHandshakeError(&HandshakeError{Remote: remote, Err: &RejectError{Code: RejectBusy, Reason: truncateReason(cause.Error()), Err: cause}})
	}
}

// extendDeadline moves a handshake's deadline to t once its request is
// in, unless Close has expired it.
func (l *Listener) extendDeadline(c net.Conn, t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		c.SetDeadline(t)
	}
}

// Handshake progress, as far as the dialer knows.
const (
	sentNothing = iota
	sentReject
	sentAccept
)

// handshake runs the listener side of one connection attempt.
func (l *Listener) handshake(raw net.Conn, src string, start time.Time) {
	defer l.wg.Done()
	c := raw
	if l.tls != nil {
		c = tls.Server(raw, l.tls)
	}
	conn, req, sent, err := l.runHandshake(raw, c, start)
	// release frees the handshake's slot (under mu). A failed handshake
	// keeps it until its goodbye (which may linger) is over, so that the
	// goroutines and sockets of handshakes never exceed the limits.
	release := func() {
		delete(l.hs, raw)
		if l.perSource[src]--; l.perSource[src] <= 0 {
			delete(l.perSource, src)
		}
	}
	l.mu.Lock()
	if err == nil && l.closed {
		err = ErrClosed
	}
	if err == nil {
		release()
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
	l.mu.Lock()
	release()
	l.mu.Unlock()
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

// runHandshake runs TLS (c is raw or a TLS server over it) and the
// shared-secret exchange, reads the request, checks it, connects a QP and
// waits for the dialer's ready. On success the Conn is started and
// counted in pending. sent says what the dialer was sent.
func (l *Listener) runHandshake(raw, c net.Conn, start time.Time) (conn *Conn, req *Request, sent int, err error) {
	o := l.opts.Options
	reject := func(code RejectCode, cause error) (*Conn, *Request, int, error) {
		e := &RejectError{Code: code, Reason: truncateReason(cause.Error()), Err: cause}
		c.SetWriteDeadline(time.Now().Add(lingerMax)) // even if Close expired it
		writeMsg(c, &msg{typ: msgReject, code: code, reason: e.Reason})
		return nil, req, sentReject, e
	}

	var tlsState *tls.ConnectionState
	if tc, ok := c.(*tls.Conn); ok {
		if err := tc.Handshake(); err != nil {
			var rec tls.RecordHeaderError
			if errors.As(err, &rec) && rec.Conn != nil {
				// A dialer without TLS: tell it so in plain text.
				cause := fmt.Errorf("%w: this listener requires TLS", ErrAuth)
				raw.SetWriteDeadline(time.Now().Add(lingerMax))
				writeMsg(raw, &msg{typ: msgReject, code: RejectAuth, reason: cause.Error()})
				return nil, nil, sentReject, &RejectError{Code: RejectAuth, Reason: cause.Error(), Err: cause}
			}
			return nil, nil, sentNothing, fmt.Errorf("TLS handshake: %w", tlsError(err, true))
		}
		st := tc.ConnectionState()
		tlsState = &st
	}

	m, err := readMsg(c)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			return reject(RejectProtocol, err)
		}
		return nil, nil, sentNothing, fmt.Errorf("reading request: %w", err)
	}
	secret := l.opts.Secret
	var sess *session
	switch {
	case m.typ == msgAuthHello && secret == nil:
		return reject(RejectAuth, fmt.Errorf("%w: the dialer offers a shared secret; this listener has none", ErrAuth))
	case m.typ == msgRequest && secret != nil:
		return reject(RejectAuth, fmt.Errorf("%w: this listener requires a shared secret; the dialer has none", ErrAuth))
	case m.typ == msgAuthHello:
		if sess, m, err = l.authenticate(c, m.nonce); err != nil {
			var rej *RejectError
			switch {
			case errors.As(err, &rej) && rej.ByPeer:
				return nil, nil, sentReject, err // the dialer refused our proof
			case errors.Is(err, ErrAuth), errors.Is(err, ErrProtocol):
				code := RejectAuth
				if !errors.Is(err, ErrAuth) {
					code = RejectProtocol
				}
				return reject(code, err)
			}
			return nil, nil, sentNothing, fmt.Errorf("authenticating: %w", err)
		}
	}
	if m.typ != msgRequest {
		return reject(RejectProtocol, fmt.Errorf("%w: expected a request, got message type %d", ErrProtocol, m.typ))
	}
	l.extendDeadline(raw, start.Add(o.handshakeTimeout()))
	req = &Request{
		TLS:          tlsState,
		SecretProved: secret != nil,
		RemoteAddr:   c.RemoteAddr(),
		Transport:    m.transport,
		Device:       m.device,
		QPN:          m.qpn,
		Address:      m.addr,
		PathMTU:      m.mtu,
		PeerTimeout:  time.Duration(m.peerTimeoutMs) * time.Millisecond,
		PrivateData:  m.priv,
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

	res, err := newResources(&o, l.shared)
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
	accept, err := writeMsgRaw(c, &msg{
		typ:           msgAccept,
		qpn:           res.qp.Num(),
		psn:           psn,
		mtu:           mtu,
		peerTimeoutMs: o.peerTimeoutMs(),
		addr:          res.qp.Address(),
		priv:          o.PrivateData,
	})
	if err == nil && sess != nil {
		err = writeMsg(c, &msg{typ: msgProof, mac: sess.mac(labelAccept, accept)})
	}
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

// authenticate runs the listener's side of the shared-secret exchange
// after the dialer's hello (with nonce nD): it sends the challenge with
// its own proof, then reads the request and the dialer's proof over it.
// A proof that does not verify is an ErrAuth error; a reject from the
// dialer (which did not accept this side's proof) a *RejectError.
func (l *Listener) authenticate(c net.Conn, nD []byte) (*session, *msg, error) {
	cb, err := channelBinding(c)
	if err != nil {
		return nil, nil, err
	}
	s := &session{secret: l.opts.Secret, nD: nD, nL: newNonce(), cb: cb}
	if err := writeMsg(c, &msg{typ: msgAuthChallenge, nonce: s.nL, mac: s.mac(labelChallenge, nil)}); err != nil {
		return nil, nil, fmt.Errorf("sending challenge: %w", err)
	}
	m, payload, err := readMsgRaw(c)
	if err != nil {
		return nil, nil, err
	}
	switch m.typ {
	case msgRequest:
	case msgReject:
		return nil, nil, &RejectError{Code: m.code, Reason: m.reason, ByPeer: true}
	default:
		return nil, nil, fmt.Errorf("%w: expected a request, got message type %d", ErrProtocol, m.typ)
	}
	p, err := readMsg(c)
	if err != nil {
		return nil, nil, err
	}
	if p.typ != msgProof {
		return nil, nil, fmt.Errorf("%w: expected the request's proof, got message type %d", ErrProtocol, p.typ)
	}
	if !verifyProof(p.mac, s.mac(labelRequest, payload)) {
		return nil, nil, fmt.Errorf("%w: the dialer's proof of the shared secret does not verify (wrong secret, or a replayed or relayed proof)", ErrAuth)
	}
	return s, m, nil
}
