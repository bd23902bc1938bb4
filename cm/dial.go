package cm

// Goroutines: Dial runs the whole handshake (TLS and the shared-secret
// exchange included) on its caller's goroutine; a
// context.AfterFunc callback expires the handshake connection's deadline
// when ctx (or HandshakeTimeout) ends, which unblocks it. The Conn it
// returns has started its own goroutines (see conn.go).

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Dial connects to a Listener at addr ("host:port") and returns a Conn
// whose QP is in RTS. It fails with an error matching ErrRejected (a
// *RejectError with the listener's reason; also ErrTransportMismatch when
// the two sides use different transports), ErrPrivateDataTooLong, a
// network error (for instance connection refused when nothing listens),
// ErrAuth (the listener did not prove the shared secret, refused this
// side's proof or certificate, or the two sides disagree on Secret or
// TLS), or ctx's error if ctx ends first. opts must name a credential
// (Secret, or TLS that verifies the listener's certificate) or say
// Insecure, else Dial fails with ErrNoCredential.
func Dial(ctx context.Context, addr string, opts Options) (*Conn, error) {
	o := opts
	if err := o.validate(); err != nil {
		return nil, err
	}
	if err := o.checkCredentials(false); err != nil {
		return nil, err
	}
	o.PrivateData = append([]byte(nil), o.PrivateData...)
	o.Secret = append([]byte(nil), o.Secret...)
	if len(o.Secret) == 0 {
		o.Secret = nil
	}
	hsCtx, cancel := context.WithTimeout(ctx, o.handshakeTimeout())
	defer cancel()
	fail := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("cm: dial %s: %w", addr, ctx.Err())
		}
		if hsCtx.Err() != nil {
			return fmt.Errorf("cm: dial %s: handshake timeout (%v): %w", addr, o.handshakeTimeout(), hsCtx.Err())
		}
		return fmt.Errorf("cm: dial %s: %w", addr, err)
	}

	res, err := newResources(&o, nil)
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	var d net.Dialer
	raw, err := d.DialContext(hsCtx, "tcp", addr)
	if err != nil {
		res.close()
		return nil, fail(err)
	}
	ctl := raw
	stop := context.AfterFunc(hsCtx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	var peer *msg
	if cfg := o.tlsConfig(addr); cfg != nil {
		tc := tls.Client(raw, cfg)
		ctl = tc
		if err = tc.Handshake(); err != nil {
			err = fmt.Errorf("TLS handshake: %w", tlsError(err, true))
		}
	}
	if err == nil {
		peer, err = dialHandshake(ctl, res, &o)
	}
	if !stop() && err == nil {
		err = hsCtx.Err()
	}
	if err != nil {
		ctl.Close()
		res.close()
		var rej *RejectError
		if errors.As(err, &rej) && rej.ByPeer {
			return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
		}
		return nil, fail(err)
	}
	ctl.SetDeadline(time.Time{})
	c := newConn(res, ctl, &o, peer)
	c.start()
	return c, nil
}

// dialHandshake runs the shared-secret exchange if configured, sends the
// request, reads the reply, brings the QP to RTS and sends ready. It
// returns the listener's accept message.
func dialHandshake(ctl net.Conn, res *resources, o *Options) (*msg, error) {
	var sess *session
	if o.Secret != nil {
		var err error
		if sess, err = dialAuth(ctl, o.Secret); err != nil {
			return nil, err
		}
	}
	psn := verbs.RandomPSN()
	req := &msg{
		typ:           msgRequest,
		version:       protoVersion,
		transport:     res.transport(),
		device:        res.device(),
		qpn:           res.qp.Num(),
		psn:           psn,
		mtu:           res.mtu,
		peerTimeoutMs: o.peerTimeoutMs(),
		addr:          res.qp.Address(),
		priv:          o.PrivateData,
	}
	payload, err := writeMsgRaw(ctl, req)
	if err == nil && sess != nil {
		err = writeMsg(ctl, &msg{typ: msgProof, mac: sess.mac(labelRequest, payload)})
	}
	if err != nil {
		return nil, fmt.Errorf("sending request: %w", err)
	}
	reply, accept, err := readReply(ctl)
	if err != nil {
		return nil, err
	}
	switch reply.typ {
	case msgAccept:
	case msgReject:
		return nil, &RejectError{Code: reply.code, Reason: reply.reason, ByPeer: true}
	default:
		return nil, fmt.Errorf("%w: reply of type %d", ErrProtocol, reply.typ)
	}
	abortCode := func(code RejectCode, err error) error {
		writeMsg(ctl, &msg{typ: msgReject, code: code, reason: "dialer: " + err.Error()})
		return err
	}
	abort := func(err error) error { return abortCode(RejectResources, err) }
	if sess != nil {
		p, err := readMsg(ctl)
		if err != nil {
			return nil, fmt.Errorf("reading the accept's proof: %w", tlsError(err, false))
		}
		if p.typ != msgProof {
			return nil, abortCode(RejectProtocol, fmt.Errorf("%w: expected the accept's proof, got message type %d", ErrProtocol, p.typ))
		}
		if !verifyProof(p.mac, sess.mac(labelAccept, accept)) {
			return nil, abortCode(RejectAuth, fmt.Errorf("%w: the listener's proof over its accept does not verify", ErrAuth))
		}
	}
	if err := res.toRTR(o, reply, remoteIP(ctl), min(res.mtu, reply.mtu)); err != nil {
		return nil, abort(err)
	}
	if err := res.toRTS(o, psn); err != nil {
		return nil, abort(err)
	}
	if err := writeMsg(ctl, &msg{typ: msgReady}); err != nil {
		return nil, fmt.Errorf("sending ready: %w", err)
	}
	return reply, nil
}

// readReply reads the listener's reply (and its payload, for a proof).
func readReply(ctl net.Conn) (*msg, []byte, error) {
	reply, payload, err := readMsgRaw(ctl)
	if err != nil {
		if err == io.EOF {
			return nil, nil, fmt.Errorf("%w: listener closed the connection without a reply", ErrProtocol)
		}
		return nil, nil, fmt.Errorf("reading reply: %w", tlsError(err, false))
	}
	return reply, payload, nil
}

// dialAuth runs the dialer's side of the shared-secret exchange up to the
// request: hello with a fresh nonce, then the listener's challenge, whose
// proof must verify before this side discloses anything about its QP.
func dialAuth(ctl net.Conn, secret []byte) (*session, error) {
	cb, err := channelBinding(ctl)
	if err != nil {
		return nil, err
	}
	s := &session{secret: secret, nD: newNonce(), cb: cb}
	if err := writeMsg(ctl, &msg{typ: msgAuthHello, version: protoVersion, nonce: s.nD}); err != nil {
		return nil, fmt.Errorf("sending hello: %w", err)
	}
	ch, _, err := readReply(ctl)
	if err != nil {
		return nil, err
	}
	switch ch.typ {
	case msgAuthChallenge:
	case msgReject:
		return nil, &RejectError{Code: ch.code, Reason: ch.reason, ByPeer: true}
	default:
		return nil, fmt.Errorf("%w: expected a challenge, got message type %d", ErrProtocol, ch.typ)
	}
	s.nL = ch.nonce
	if !verifyProof(ch.mac, s.mac(labelChallenge, nil)) {
		err := fmt.Errorf("%w: the listener's proof of the shared secret does not verify (wrong secret, or a replayed or relayed challenge)", ErrAuth)
		writeMsg(ctl, &msg{typ: msgReject, code: RejectAuth, reason: "dialer: " + err.Error()})
		return nil, err
	}
	return s, nil
}

// remoteIP is the peer's IP on c (the GID of its QP).
func remoteIP(c net.Conn) net.IP {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP
	}
	return nil
}
