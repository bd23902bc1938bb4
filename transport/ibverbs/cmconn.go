//go:build ibverbs

package ibverbs

// Connecting a verbs QP through rdma_cm, for peers that speak rdma_cm
// (rping, ib_*_bw -R, NCCL's and MPI's rdma_cm modes) rather than rdmakit's
// Address exchange. The QP is created with verbs as usual and stays an
// ordinary verbs.QP; rdma_cm only carries the connection:
//
//   - InfiniBand/RoCE: the active side resolves the address and route,
//     sends a connect request with the QP's number, gets the response,
//     moves the QP to RTR and RTS with the attributes rdma_cm derives
//     (rdma_init_qp_attr: GIDs, path MTU, PSNs, QP numbers) and confirms
//     with rdma_establish; the passive side does the same on the request
//     and accepts.
//   - iWARP: as above, but the kernel moves the QP to RTS when the
//     connection is established.

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/rdmakit/rdmakit/verbs"
)

// DeviceForIP returns the name of the verbs device that rdma_cm uses for
// ip: the device that owns the address when local is set (a server's bind
// address), else the one that routes to it.
func DeviceForIP(ip net.IP, local bool) (string, error) {
	n, err := deviceForIP(ip, local, 2000)
	if err != nil {
		what := "resolve"
		if local {
			what = "bind"
		}
		return "", fmt.Errorf("%w: rdma_cm cannot %s %s: %v: no RDMA device %s this address; check `rdma link` (the device's netdev must have %s) and `ip route get %s`",
			ErrNoCM, what, ip, err, map[bool]string{true: "owns", false: "routes to"}[local],
			map[bool]string{true: "this address", false: "a route to it"}[local], ip)
	}
	return n, nil
}

// CMConn is a QP connection made through rdma_cm.
type CMConn struct {
	d   *ctxDriver
	m   *cmMux
	q   *qp
	hid uint64
	id  *cCMID
	ev  chan cmEvent

	// PrivateData is what the peer sent with its request or reply.
	PrivateData []byte
}

func (c *CMConn) cmEvent(ev cmEvent) {
	if ev.event == cmDisconnected || ev.event == cmDeviceRemoval {
		c.q.enterError()
	}
	select {
	case c.ev <- ev:
	default:
	}
}

// wait returns the next event that is one of want, or an error for a
// failure event or the end of ctx.
func (c *CMConn) wait(ctx context.Context, what string, want ...int) (cmEvent, error) {
	for {
		select {
		case <-ctx.Done():
			return cmEvent{}, fmt.Errorf("%w: %s: %v", ErrNoCM, what, ctx.Err())
		case ev := <-c.ev:
			for _, w := range want {
				if ev.event == w {
					return ev, nil
				}
			}
			switch ev.event {
			case cmAddrError:
				return ev, fmt.Errorf("%w: %s: the address does not resolve to an RDMA device (%s, status %d): check the IP, `rdma link` and `ip route get`", ErrNoCM, what, cmEventName(ev.event), ev.status)
			case cmRouteError, cmUnreachable:
				return ev, fmt.Errorf("%w: %s: %s (status %d): is the peer listening and reachable?", ErrNoCM, what, cmEventName(ev.event), ev.status)
			case cmRejected:
				return ev, fmt.Errorf("%w: %s: rejected by the peer (status %d): is a server listening on that port?", ErrNoCM, what, ev.status)
			case cmConnError, cmDisconnected, cmDeviceRemoval:
				return ev, fmt.Errorf("%w: %s: %s", ErrNoCM, what, cmEventName(ev.event))
			}
		}
	}
}

func nativeQP(vq *verbs.QP) (*qp, *ctxDriver, error) {
	q, ok := vq.Driver().(*qp)
	if !ok {
		return nil, nil, fmt.Errorf("%w: rdma_cm connects QPs of ibverbs devices only", verbs.ErrNotSupported)
	}
	return q, q.d, nil
}

func (d *ctxDriver) newCMConn(q *qp, id *cCMID) (*CMConn, error) {
	m, err := d.cmMux()
	if err != nil {
		return nil, err
	}
	c := &CMConn{d: d, m: m, q: q, hid: d.newID(), ev: make(chan cmEvent, 16)}
	m.register(c.hid, c)
	if id == nil {
		if id, err = m.ch.createID(c.hid); err != nil {
			m.unregister(c.hid)
			return nil, err
		}
	} else {
		id.setContext(c.hid)
	}
	c.id = id
	return c, nil
}

// moveQP brings an IB/RoCE QP to RTS with rdma_cm's attributes.
func (c *CMConn) moveQP() error {
	q := c.q
	if c.d.iwarp {
		if verbs.QPState(q.state.Load()) == verbs.QPReset {
			if err := q.c.modifyInit(q.port, verbs.AccessAll&^verbs.AccessLocalWrite, true); err != nil {
				return wrap("ibv_modify_qp(INIT)", err)
			}
			q.state.Store(uint32(verbs.QPInit))
		}
		return nil
	}
	if verbs.QPState(q.state.Load()) == verbs.QPReset {
		if err := c.id.initQP(q.c, ibvQPSInit, 0); err != nil {
			return wrap("rdma_init_qp_attr/ibv_modify_qp(INIT)", err)
		}
	}
	if err := c.id.initQP(q.c, ibvQPSRTR, clampRd(0, c.d.extra.maxRdAtom)); err != nil {
		return wrap("rdma_init_qp_attr/ibv_modify_qp(RTR)", err)
	}
	if err := c.id.initQP(q.c, ibvQPSRTS, clampRd(0, c.d.extra.maxInitRd)); err != nil {
		return wrap("rdma_init_qp_attr/ibv_modify_qp(RTS)", err)
	}
	return nil
}

func (c *CMConn) checkDevice() error {
	if n := c.id.deviceName(); n != "" && n != c.d.info.Name {
		return fmt.Errorf("%w: rdma_cm chose device %s for this address, but the QP is on %s: open %s instead", verbs.ErrInvalidArgument, n, c.d.info.Name, n)
	}
	return nil
}

// DialCM connects qp (RESET or INIT, on an ibverbs device) to the rdma_cm
// listener at dst:port, as rping -c or ib_write_bw -R do, and returns when
// the connection is established and the QP is in RTS.
func DialCM(ctx context.Context, vq *verbs.QP, dst net.IP, port uint16, privateData []byte) (*CMConn, error) {
	q, d, err := nativeQP(vq)
	if err != nil {
		return nil, err
	}
	c, err := d.newCMConn(q, nil)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*CMConn, error) { c.Close(); return nil, err }
	if err := c.id.resolveAddr(nil, dst, port, 2000); err != nil {
		return fail(fmt.Errorf("%w: rdma_resolve_addr %s: %v: check the address and `ip route get %s`", ErrNoCM, dst, err, dst))
	}
	if _, err := c.wait(ctx, fmt.Sprintf("resolving %s", dst), cmAddrResolved); err != nil {
		return fail(err)
	}
	if err := c.checkDevice(); err != nil {
		return fail(err)
	}
	if err := c.id.resolveRoute(2000); err != nil {
		return fail(fmt.Errorf("%w: rdma_resolve_route %s: %v", ErrNoCM, dst, err))
	}
	if _, err := c.wait(ctx, fmt.Sprintf("route to %s", dst), cmRouteResolved); err != nil {
		return fail(err)
	}
	if c.d.iwarp {
		if err := c.moveQP(); err != nil {
			return fail(err)
		}
	} else if verbs.QPState(q.state.Load()) == verbs.QPReset {
		if err := c.id.initQP(q.c, ibvQPSInit, 0); err != nil {
			return fail(wrap("rdma_init_qp_attr/ibv_modify_qp(INIT)", err))
		}
		q.state.Store(uint32(verbs.QPInit))
	}
	if err := c.id.connect(q.num, clampRd(0, d.extra.maxRdAtom), clampRd(0, d.extra.maxInitRd), privateData, false); err != nil {
		return fail(fmt.Errorf("%w: rdma_connect %s:%d: %v", ErrNoCM, dst, port, err))
	}
	ev, err := c.wait(ctx, fmt.Sprintf("connecting to %s:%d", dst, port), cmConnResponse, cmEstablished)
	if err != nil {
		return fail(err)
	}
	c.PrivateData = ev.privateData
	if ev.event == cmConnResponse {
		if err := c.moveQP(); err != nil {
			return fail(err)
		}
		if err := c.id.establish(); err != nil {
			return fail(fmt.Errorf("%w: %v", ErrNoCM, err))
		}
	}
	q.state.Store(uint32(verbs.QPRTS))
	if q.iw != nil {
		q.iw.adopt()
	}
	return c, nil
}

// CMListener is an rdma_cm listener (rping -s, ib_write_bw -R server).
type CMListener struct {
	d    *ctxDriver
	m    *cmMux
	hid  uint64
	id   *cCMID
	reqs chan cmEvent
	// Port is the bound port.
	Port uint16
}

func (l *CMListener) cmEvent(ev cmEvent) {
	if ev.event != cmConnRequest {
		return
	}
	select {
	case l.reqs <- ev:
	default:
		ev.newID.reject()
		ev.newID.destroy()
	}
}

// ListenCM listens for rdma_cm connection requests on ip:port (port 0: an
// ephemeral one) of the device of vctx.
func ListenCM(vctx *verbs.Context, ip net.IP, port uint16) (*CMListener, error) {
	d, ok := vctx.Driver().(*ctxDriver)
	if !ok {
		return nil, fmt.Errorf("%w: rdma_cm listens on ibverbs devices only", verbs.ErrNotSupported)
	}
	m, err := d.cmMux()
	if err != nil {
		return nil, err
	}
	l := &CMListener{d: d, m: m, hid: d.newID(), reqs: make(chan cmEvent, 8)}
	m.register(l.hid, l)
	if l.id, err = m.ch.createID(l.hid); err != nil {
		m.unregister(l.hid)
		return nil, err
	}
	if l.Port, err = l.id.bind(ip, port, 8); err != nil {
		l.Close()
		hint := "is the address on this host's RDMA device?"
		if strings.Contains(err.Error(), "in use") {
			hint = "another listener has that port"
		}
		return nil, fmt.Errorf("%w: rdma_bind_addr/rdma_listen %s:%d: %v: %s", ErrNoCM, ip, port, err, hint)
	}
	if n := l.id.deviceName(); n != "" && n != d.info.Name {
		l.Close()
		return nil, fmt.Errorf("%w: %s belongs to device %s, not %s", verbs.ErrInvalidArgument, ip, n, d.info.Name)
	}
	return l, nil
}

// Accept waits for a connection request, connects qp (RESET or INIT) to it
// and returns when the connection is established.
func (l *CMListener) Accept(ctx context.Context, vq *verbs.QP, privateData []byte) (*CMConn, error) {
	q, d, err := nativeQP(vq)
	if err != nil {
		return nil, err
	}
	if d != l.d {
		return nil, fmt.Errorf("%w: the QP belongs to another context than the listener", verbs.ErrInvalidArgument)
	}
	var req cmEvent
	select {
	case req = <-l.reqs:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c, err := d.newCMConn(q, req.newID)
	if err != nil {
		req.newID.reject()
		req.newID.destroy()
		return nil, err
	}
	c.PrivateData = req.privateData
	fail := func(err error) (*CMConn, error) { c.id.reject(); c.Close(); return nil, err }
	if err := c.moveQP(); err != nil {
		return fail(err)
	}
	if err := c.id.connect(q.num, clampRd(0, d.extra.maxRdAtom), clampRd(0, d.extra.maxInitRd), privateData, true); err != nil {
		return fail(fmt.Errorf("%w: rdma_accept: %v", ErrNoCM, err))
	}
	if _, err := c.wait(ctx, "accepting", cmEstablished); err != nil {
		c.Close()
		return nil, err
	}
	q.state.Store(uint32(verbs.QPRTS))
	if q.iw != nil {
		q.iw.adopt()
	}
	return c, nil
}

// Close stops listening.
func (l *CMListener) Close() error {
	l.m.unregister(l.hid)
	if l.id != nil {
		l.id.destroy()
		l.id = nil
	}
	return nil
}

// Disconnected reports whether the peer has disconnected (non-blocking).
func (c *CMConn) Disconnected() bool { return c.q.fatal.Load() }

// Close disconnects and releases the rdma_cm id (the QP is the caller's).
func (c *CMConn) Close() error {
	c.m.unregister(c.hid)
	if c.id != nil {
		c.id.disconnect()
		c.id.destroy()
		c.id = nil
	}
	return nil
}
