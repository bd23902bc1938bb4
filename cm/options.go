package cm

// No goroutines: options, their defaults, and the verbs resources a
// connection is built in (created and destroyed by the goroutine that runs
// Dial, a Listener handshake, or Conn.Close).

import (
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Defaults for zero Options fields.
const (
	DefaultDevice           = "tcp0"
	DefaultAccess           = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	DefaultPeerTimeout      = 5 * time.Second
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultBacklog          = 64
	// DefaultMaxHandshakes bounds a Listener's handshakes in progress.
	DefaultMaxHandshakes = 32
	// DefaultMaxHandshakesPerSource bounds a Listener's handshakes in
	// progress from one IP address.
	DefaultMaxHandshakesPerSource = 8
	// DefaultRequestTimeout is how long a Listener waits for a dialer's
	// TLS handshake and (authenticated) request.
	DefaultRequestTimeout = 5 * time.Second
	// MaxRdAtomic is used for both the initiator depth (max_rd_atomic)
	// and the responder resources (max_dest_rd_atomic) of every QP.
	MaxRdAtomic = 16
)

// Retry are the QP's transport timing attributes (see verbs.QPAttr).
type Retry struct {
	// Timeout is the local ACK timeout exponent, 4.096 µs × 2^Timeout
	// (0: infinite).
	Timeout uint8
	// RetryCount is how often a timed-out request is retried (0..7).
	RetryCount uint8
	// RNRRetry is how often a receiver-not-ready NAK is retried (7: forever).
	RNRRetry uint8
	// MinRNRTimer is the RNR NAK delay this side asks senders to wait
	// (IB encoding, 0..31).
	MinRNRTimer uint8
}

// DefaultRetry returns the Retry used when Options.Retry is nil: Timeout 14
// (about 67 ms), RetryCount 7, RNRRetry 7 (forever), MinRNRTimer 12
// (0.64 ms).
func DefaultRetry() Retry {
	return Retry{Timeout: 14, RetryCount: 7, RNRRetry: 7, MinRNRTimer: 12}
}

// Options configure one side of a connection. Every zero field takes the
// default documented on it; the zero value as a whole is refused by Listen
// and Dial with ErrNoCredential, because it names no credential: set
// Secret or TLS (see doc.go, "Authentication"), or Insecure to connect
// without one.
type Options struct {
	// Secret, if set, is a secret shared by both sides, at least
	// MinSecretLen random bytes. Each side proves it holds the secret to
	// the other by challenge and response (HMAC-SHA256 over a fresh nonce
	// from each side, compared in constant time); the secret itself never
	// travels. The proofs also cover the QP data both sides exchange, so
	// nobody without the secret can alter it. A side with a Secret refuses
	// a peer without one (ErrAuth), and a side without refuses a peer that
	// offers one.
	Secret []byte
	// TLS, if set, runs the control connection (handshake, heartbeats,
	// disconnect) over TLS with this config: for a listener a server
	// config (Certificates; for mutual TLS ClientAuth
	// tls.RequireAndVerifyClientCert and ClientCAs), for a dialer a client
	// config (RootCAs; Certificates for mutual TLS; ServerName defaults to
	// the host of Dial's address). TLS 1.2 at least. Both sides must use
	// TLS or neither (ErrAuth). With Secret as well, the secret's proofs
	// are bound to the TLS session (its exported keying material), so they
	// cannot be relayed into another connection; a man in the middle then
	// fails even against a dialer whose TLS skips verification.
	//
	// A listener's TLS authenticates dialers only with ClientAuth
	// tls.RequireAndVerifyClientCert; a dialer's authenticates the
	// listener unless InsecureSkipVerify is set.
	TLS *tls.Config
	// Insecure allows a Listener or Dial without a credential: without
	// Secret, and without TLS that authenticates the peer (see TLS). Then
	// anyone who reaches the listener's port gets a connected QP with the
	// listener's Access (by default remote read, write and atomics on
	// memory registered for them in the connection's PD). Use it on
	// trusted networks and in tests only.
	Insecure bool
	// Device is the verbs device to open (default DefaultDevice, "tcp0").
	// Ignored when PD is set. Dial opens its own verbs.Context per
	// connection and closes it in Conn.Close; a Listener opens one at
	// Listen for all its connections (see ListenOptions.Sharing).
	// Programs with many connections should pass a shared PD.
	Device string
	// PD, if set, is the protection domain the QP is created in (and its
	// context the one CQs are created in). cm does not close it.
	PD *verbs.PD
	// SendCQ and RecvCQ, if set, are used for the QP; they must belong to
	// PD's context. cm creates (and later destroys) those that are nil.
	SendCQ, RecvCQ *verbs.CQ
	// SRQ, if set, supplies the QP's receives.
	SRQ *verbs.SRQ
	// Cap are the QP's capabilities (zero fields take verbs' defaults).
	Cap verbs.QPCap
	// SignalAll makes every send work request generate a completion.
	SignalAll bool
	// CQSize is the size of each CQ cm creates (default: the QP's
	// MaxSendWR + MaxRecvWR, so that nothing overflows).
	CQSize int
	// Access are the remote operations the QP accepts (default
	// DefaultAccess: remote write, read and atomic). To accept none, set
	// verbs.AccessLocalWrite.
	Access verbs.Access
	// PathMTU is the largest path MTU this side offers (default: the
	// device's active MTU on port 1, else 4096). The connection uses the
	// smaller of both sides'.
	PathMTU verbs.MTU
	// Retry, if set, replaces DefaultRetry().
	Retry *Retry
	// PrivateData is sent to the peer with the request (Dial) or the
	// accept reply (listener); at most MaxPrivateData bytes.
	PrivateData []byte
	// PeerTimeout is how long the peer may stay silent on the control
	// connection before it is declared lost (default DefaultPeerTimeout,
	// 5 s). Both sides send heartbeats every quarter of the smaller of
	// their two PeerTimeouts.
	PeerTimeout time.Duration
	// HandshakeTimeout bounds the handshake (default
	// DefaultHandshakeTimeout). Dial also honours its ctx.
	HandshakeTimeout time.Duration
}

func (o *Options) validate() error {
	if len(o.PrivateData) > MaxPrivateData {
		return fmt.Errorf("%w: %d bytes (max %d)", ErrPrivateDataTooLong, len(o.PrivateData), MaxPrivateData)
	}
	if o.PD == nil && (o.SendCQ != nil || o.RecvCQ != nil || o.SRQ != nil) {
		return fmt.Errorf("cm: %w: SendCQ, RecvCQ and SRQ need PD", verbs.ErrInvalidArgument)
	}
	if o.PeerTimeout < 0 || o.HandshakeTimeout < 0 || o.CQSize < 0 {
		return fmt.Errorf("cm: %w: negative PeerTimeout, HandshakeTimeout or CQSize", verbs.ErrInvalidArgument)
	}
	if o.PeerTimeout > 0 && o.PeerTimeout < time.Millisecond {
		return fmt.Errorf("cm: %w: PeerTimeout below 1 ms", verbs.ErrInvalidArgument)
	}
	if o.PathMTU != 0 && o.PathMTU.Bytes() == 0 {
		return fmt.Errorf("cm: %w: path MTU %d", verbs.ErrInvalidArgument, o.PathMTU)
	}
	if o.Retry != nil && (o.Retry.Timeout > 31 || o.Retry.RetryCount > 7 || o.Retry.RNRRetry > 7 || o.Retry.MinRNRTimer > 31) {
		return fmt.Errorf("cm: %w: Retry %+v out of range", verbs.ErrInvalidArgument, *o.Retry)
	}
	return nil
}

// ContextSharing says what the connections of a Listener without
// Options.PD share.
type ContextSharing uint8

const (
	// ShareContext (the zero value): the Listener opens one verbs context
	// at Listen; each connection gets its own PD, CQs and QP in it, so a
	// peer reaches only memory registered in its own connection's PD. The
	// context closes when the Listener and the last of its connections
	// have closed.
	ShareContext ContextSharing = iota
	// SharePD: one context and one PD for all connections (Listener.PD);
	// memory registered in it is open to every connected peer that knows
	// its rkey, within the QP's Access.
	SharePD
	// ContextPerConnection: each connection opens its own context and PD
	// and closes them in Conn.Close (the behaviour before contexts were
	// shared). Each context reserves address space (Options.ArenaSize in
	// verbs), so ListenOptions.MaxHandshakes also bounds how many a flood
	// of requests can hold.
	ContextPerConnection
)

func (s ContextSharing) String() string {
	switch s {
	case ShareContext:
		return "ShareContext"
	case SharePD:
		return "SharePD"
	case ContextPerConnection:
		return "ContextPerConnection"
	}
	return fmt.Sprintf("ContextSharing(%d)", uint8(s))
}

// sharedCtx is a Listener's context (and PD with SharePD), counted: the
// Listener holds one reference, every connection built in it another; the
// last release closes it. Any goroutine.
type sharedCtx struct {
	ctx *verbs.Context
	pd  *verbs.PD // SharePD only

	mu   sync.Mutex
	refs int
}

func openShared(dev string, sharePD bool) (*sharedCtx, error) {
	ctx, err := verbs.Open(dev, verbs.Options{})
	if err != nil {
		return nil, err
	}
	s := &sharedCtx{ctx: ctx, refs: 1}
	if sharePD {
		if s.pd, err = ctx.AllocPD(); err != nil {
			ctx.Close()
			return nil, fmt.Errorf("alloc PD: %w", err)
		}
	}
	return s, nil
}

// acquire takes a reference; false once the context is closed.
func (s *sharedCtx) acquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refs == 0 {
		return false
	}
	s.refs++
	return true
}

// release drops a reference and closes the context with the last one.
func (s *sharedCtx) release() error {
	s.mu.Lock()
	s.refs--
	last := s.refs == 0
	s.mu.Unlock()
	if !last {
		return nil
	}
	// Closing the context releases whatever the connections left in it
	// (PDs still holding regions, the shared PD).
	return s.ctx.Close()
}

func (o *Options) access() verbs.Access {
	if o.Access == 0 {
		return DefaultAccess
	}
	return o.Access
}

func (o *Options) retry() Retry {
	if o.Retry == nil {
		return DefaultRetry()
	}
	return *o.Retry
}

func (o *Options) peerTimeout() time.Duration {
	if o.PeerTimeout == 0 {
		return DefaultPeerTimeout
	}
	return o.PeerTimeout
}

func (o *Options) handshakeTimeout() time.Duration {
	if o.HandshakeTimeout == 0 {
		return DefaultHandshakeTimeout
	}
	return o.HandshakeTimeout
}

// peerTimeoutMs is the PeerTimeout as sent on the wire (≥ 1 ms).
func (o *Options) peerTimeoutMs() uint32 {
	ms := o.peerTimeout().Milliseconds()
	if ms > 0xffffffff {
		ms = 0xffffffff
	}
	if ms < 1 {
		ms = 1
	}
	return uint32(ms)
}

// resources are the verbs objects of one connection and which of them cm
// owns.
type resources struct {
	ctx    *verbs.Context
	pd     *verbs.PD
	sendCQ *verbs.CQ
	recvCQ *verbs.CQ
	qp     *verbs.QP
	mtu    verbs.MTU
	shared *sharedCtx // a Listener's context this connection holds a reference to

	ownCtx, ownPD, ownSendCQ, ownRecvCQ bool
}

// newResources opens or adopts the context and PD, creates missing CQs and
// the QP, and moves the QP to INIT. With sh (and no Options.PD) the
// context is sh's, and the PD too if sh has one.
func newResources(o *Options, sh *sharedCtx) (r *resources, err error) {
	r = &resources{}
	defer func() {
		if err != nil {
			r.close()
			r = nil
		}
	}()
	if o.PD != nil {
		r.pd = o.PD
		r.ctx = o.PD.Context()
	} else if sh != nil {
		if !sh.acquire() {
			return r, fmt.Errorf("cm: %w: the listener's context is closed", ErrClosed)
		}
		r.shared = sh
		r.ctx = sh.ctx
		if sh.pd != nil {
			r.pd = sh.pd
		} else {
			if r.pd, err = r.ctx.AllocPD(); err != nil {
				return r, fmt.Errorf("alloc PD: %w", err)
			}
			r.ownPD = true
		}
	} else {
		dev := o.Device
		if dev == "" {
			dev = DefaultDevice
		}
		if r.ctx, err = verbs.Open(dev, verbs.Options{}); err != nil {
			return r, err
		}
		r.ownCtx = true
		if r.pd, err = r.ctx.AllocPD(); err != nil {
			return r, fmt.Errorf("alloc PD: %w", err)
		}
		r.ownPD = true
	}
	cp := o.Cap
	if cp.MaxSendWR == 0 {
		cp.MaxSendWR = verbs.DefaultQPWR
	}
	if cp.MaxRecvWR == 0 {
		cp.MaxRecvWR = verbs.DefaultQPWR
	}
	cqSize := o.CQSize
	if cqSize == 0 {
		cqSize = cp.MaxSendWR + cp.MaxRecvWR
		if max := r.ctx.Info().MaxCQE; max > 0 && cqSize > max {
			cqSize = max
		}
	}
	r.sendCQ, r.recvCQ = o.SendCQ, o.RecvCQ
	if r.sendCQ == nil {
		if r.sendCQ, err = r.ctx.CreateCQ(cqSize); err != nil {
			return r, fmt.Errorf("create send CQ: %w", err)
		}
		r.ownSendCQ = true
	}
	if r.recvCQ == nil {
		if r.recvCQ, err = r.ctx.CreateCQ(cqSize); err != nil {
			return r, fmt.Errorf("create receive CQ: %w", err)
		}
		r.ownRecvCQ = true
	}
	r.qp, err = r.pd.CreateQP(verbs.QPConfig{SendCQ: r.sendCQ, RecvCQ: r.recvCQ, SRQ: o.SRQ, Cap: o.Cap, SignalAll: o.SignalAll})
	if err != nil {
		return r, fmt.Errorf("create QP: %w", err)
	}
	if err = r.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: o.access(), Port: 1}); err != nil {
		return r, fmt.Errorf("QP to INIT: %w", err)
	}
	r.mtu = o.PathMTU
	if r.mtu == 0 {
		r.mtu = verbs.MTU4096
		if ports := r.ctx.Info().Ports; len(ports) > 0 && ports[0].ActiveMTU.Bytes() != 0 {
			r.mtu = ports[0].ActiveMTU
		}
	}
	return r, nil
}

func (r *resources) transport() string { return r.ctx.Info().Transport }
func (r *resources) device() string    { return r.ctx.Info().Name }

// toRTR applies the peer's parameters.
func (r *resources) toRTR(o *Options, peer *msg, gid []byte, mtu verbs.MTU) error {
	err := r.qp.Modify(verbs.QPAttr{
		State:           verbs.QPRTR,
		PathMTU:         mtu,
		DestQPN:         peer.qpn,
		RQPSN:           peer.psn,
		AH:              verbs.AddressHandle{GID: gid, Dest: peer.addr},
		MinRNRTimer:     o.retry().MinRNRTimer,
		MaxDestRdAtomic: MaxRdAtomic,
	})
	if err != nil {
		return fmt.Errorf("QP to RTR: %w", err)
	}
	return nil
}

// toRTS starts the send queue at psn.
func (r *resources) toRTS(o *Options, psn uint32) error {
	rt := o.retry()
	err := r.qp.Modify(verbs.QPAttr{
		State:       verbs.QPRTS,
		SQPSN:       psn,
		Timeout:     rt.Timeout,
		RetryCount:  rt.RetryCount,
		RNRRetry:    rt.RNRRetry,
		MaxRdAtomic: MaxRdAtomic,
	})
	if err != nil {
		return fmt.Errorf("QP to RTS: %w", err)
	}
	return nil
}

// close destroys what cm created, QP first.
func (r *resources) close() error {
	var errs []error
	if r.qp != nil {
		errs = append(errs, r.qp.Close())
	}
	if r.ownSendCQ && r.sendCQ != nil {
		errs = append(errs, r.sendCQ.Close())
	}
	if r.ownRecvCQ && r.recvCQ != nil {
		errs = append(errs, r.recvCQ.Close())
	}
	if r.ownPD && r.pd != nil {
		// Regions the application left in the PD keep it busy; closing the
		// context below releases them anyway.
		// (In a Listener's shared context they stay until it closes.)
		if err := r.pd.Close(); err != nil && !((r.ownCtx || r.shared != nil) && errors.Is(err, verbs.ErrBusy)) {
			errs = append(errs, err)
		}
	}
	if r.ownCtx && r.ctx != nil {
		errs = append(errs, r.ctx.Close())
	}
	if r.shared != nil {
		errs = append(errs, r.shared.release())
		r.shared = nil
	}
	return errors.Join(errs...)
}
