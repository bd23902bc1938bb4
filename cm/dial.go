package cm

// Goroutines: Dial runs the whole handshake on its caller's goroutine; a
// context.AfterFunc callback expires the handshake connection's deadline
// when ctx (or HandshakeTimeout) ends, which unblocks it. The Conn it
// returns has started its own goroutines (see conn.go).

import (
	"context"
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
// or ctx's error if ctx ends first.
func Dial(ctx context.Context, addr string, opts Options) (*Conn, error) {
	o := opts
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.PrivateData = append([]byte(nil), o.PrivateData...)
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

	res, err := newResources(&o)
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", addr, err)
	}
	var d net.Dialer
	ctl, err := d.DialContext(hsCtx, "tcp", addr)
	if err != nil {
		res.close()
		return nil, fail(err)
	}
	stop := context.AfterFunc(hsCtx, func() { ctl.SetDeadline(time.Unix(1, 0)) })
	peer, err := dialHandshake(ctl, res, &o)
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

// dialHandshake sends the request, reads the reply, brings the QP to RTS
// and sends ready. It returns the listener's accept message.
func dialHandshake(ctl net.Conn, res *resources, o *Options) (*msg, error) {
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
	if err := writeMsg(ctl, req); err != nil {
		return nil, fmt.Errorf("sending request: %w", err)
	}
	reply, err := readMsg(ctl)
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("%w: listener closed the connection without a reply", ErrProtocol)
		}
		return nil, fmt.Errorf("reading reply: %w", err)
	}
	switch reply.typ {
	case msgAccept:
	case msgReject:
		return nil, &RejectError{Code: reply.code, Reason: reply.reason, ByPeer: true}
	default:
		return nil, fmt.Errorf("%w: reply of type %d", ErrProtocol, reply.typ)
	}
	abort := func(err error) error {
		writeMsg(ctl, &msg{typ: msgReject, code: RejectResources, reason: "dialer: " + err.Error()})
		return err
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

// remoteIP is the peer's IP on c (the GID of its QP).
func remoteIP(c net.Conn) net.IP {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP
	}
	return nil
}
