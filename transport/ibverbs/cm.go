//go:build ibverbs

package ibverbs

// iWARP connection setup through rdma_cm.
//
// iWARP runs over TCP, so a queue pair cannot be connected by exchanging
// QP numbers out of band and calling ibv_modify_qp: the kernel must open
// the TCP connection and do the MPA handshake. rdmakit's model is still the
// verbs one (create the QP, exchange Address()es any way you like, Modify to
// RTR and RTS), and this file maps it onto rdma_cm:
//
//   - CreateQP also creates an rdma_cm listener bound to the device's IP
//     address on an ephemeral port; Address() carries that IP and port.
//   - At RTR each side knows both addresses. The side with the lower
//     (IP, port) is the active one: it resolves the peer's address and
//     route and calls rdma_connect with its own QP number (the QP was
//     created with ibv_create_qp, not rdma_create_qp; the kernel finds it
//     by number). The passive side's listener accepts the one connect
//     request it gets with rdma_accept and its QP number, whenever it comes,
//     even before that side reaches RTR.
//   - Modify(RTS) on the active side waits until the connection is
//     ESTABLISHED (or fails with the reason: unreachable, rejected...); on
//     the passive side it returns at once, and the first PostSend waits for
//     ESTABLISHED. The kernel moves the QP to RTS itself.
//   - Close disconnects and destroys the rdma_cm ids with the QP.
//
// So two programs that exchange Address()es through cm, a TCP side channel
// or the conformance suite's pipes connect iWARP QPs exactly as they
// connect RoCE ones, and the posting and completion path is the same.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// cmMux is a context's rdma_cm event channel and the goroutine that
// dispatches its events to connections by id context.
type cmMux struct {
	d  *ctxDriver
	ch *cCMChannel

	// mu guards conns.
	mu    sync.Mutex
	conns map[uint64]cmHandler
}

type cmHandler interface {
	cmEvent(ev cmEvent)
}

func (d *ctxDriver) cmMux() (*cmMux, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cm != nil {
		return d.cm, nil
	}
	ch, err := newCMChannel()
	if err != nil {
		return nil, err
	}
	m := &cmMux{d: d, ch: ch, conns: map[uint64]cmHandler{}}
	d.mu.Unlock()
	err = d.startLoop(ch.fd(), m.drain)
	d.mu.Lock()
	if err != nil {
		ch.destroy()
		return nil, err
	}
	d.cm = m
	return m, nil
}

func (m *cmMux) register(id uint64, h cmHandler) {
	m.mu.Lock()
	m.conns[id] = h
	m.mu.Unlock()
}

func (m *cmMux) unregister(id uint64) {
	m.mu.Lock()
	delete(m.conns, id)
	m.mu.Unlock()
}

func (m *cmMux) drain() {
	for {
		ev, ok := m.ch.event()
		if !ok {
			return
		}
		m.mu.Lock()
		h := m.conns[ev.idCtx]
		m.mu.Unlock()
		if h == nil {
			if ev.newID != nil {
				ev.newID.reject()
				ev.newID.destroy()
			}
			continue
		}
		h.cmEvent(ev)
	}
}

// close runs after the event goroutine stopped.
func (m *cmMux) close() { m.ch.destroy() }

// pdataMagic starts the private data of rdmakit's connect requests and
// accepts: magic, QP number.
var pdataMagic = []byte("rkcm")

func pdata(qpn uint32) []byte {
	b := make([]byte, 8)
	copy(b, pdataMagic)
	binary.BigEndian.PutUint32(b[4:], qpn)
	return b
}

// iwConn is the rdma_cm side of an iWARP queue pair.
type iwConn struct {
	q    *qp
	m    *cmMux
	ip   net.IP
	port uint16
	lis  *cCMID

	// mu guards everything below.
	mu      sync.Mutex
	conn    *cCMID
	active  bool
	peer    Address
	started bool
	estab   bool
	err     error
	done    chan struct{} // closed when established or failed
	closed  bool
	peerQPN uint32
	redials int // new ids after a taken port (redial)
}

func newIWConn(q *qp) (*iwConn, error) {
	d := q.d
	pi, _ := d.port(int(q.port))
	var ip net.IP
	for _, s := range pi.Addrs {
		if a := net.ParseIP(s); a != nil {
			ip = a
			break
		}
	}
	if ip == nil {
		for _, a := range netdevAddrs(d.info.Name, int(q.port), d.c) {
			ip = a
			break
		}
	}
	if ip == nil {
		return nil, fmt.Errorf("%w: iWARP device %s has no IP address: rdma_cm needs one on its network device (ip addr add ... dev <netdev>)", verbs.ErrInvalidArgument, d.info.Name)
	}
	m, err := d.cmMux()
	if err != nil {
		return nil, err
	}
	w := &iwConn{q: q, m: m, ip: ip, done: make(chan struct{})}
	lis, err := m.ch.createID(q.id)
	if err != nil {
		return nil, err
	}
	port, err := lis.bind(ip, 0, 4)
	if err != nil {
		lis.destroy()
		return nil, fmt.Errorf("ibverbs: rdma_bind_addr/rdma_listen on %s: %v (iWARP device %s)", ip, err, d.info.Name)
	}
	w.lis, w.port = lis, port
	m.register(q.id, w)
	return w, nil
}

// lessAddr orders (IP, port) pairs; the lower side connects.
func lessAddr(ip1 net.IP, p1 uint16, ip2 net.IP, p2 uint16) bool {
	if c := bytes.Compare(ip1.To16(), ip2.To16()); c != 0 {
		return c < 0
	}
	return p1 < p2
}

func (w *iwConn) rtr(attr *verbs.QPAttr) error {
	peer, err := peerAddress(attr.AH)
	if err != nil {
		return err
	}
	if peer.IP == nil || peer.CMPort == 0 {
		return fmt.Errorf("%w: iWARP needs the peer QP's Address() in AddressHandle.Dest (its rdma_cm IP and port)", verbs.ErrInvalidArgument)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.peer = peer
	if !lessAddr(w.ip, w.port, peer.IP, peer.CMPort) {
		return nil // passive: the listener accepts the peer's request
	}
	if w.conn != nil || w.started {
		return nil
	}
	w.active, w.started = true, true
	id, err := w.m.ch.createID(w.q.id)
	if err != nil {
		return err
	}
	w.conn = id
	if err := id.resolveAddr(w.ip, peer.IP, peer.CMPort, 5000); err != nil {
		return fmt.Errorf("%w: rdma_resolve_addr %s → %s:%d: %v: check that the address is reachable from %s's network device",
			ErrNoCM, w.ip, peer.IP, peer.CMPort, err, w.q.d.info.Name)
	}
	return nil
}

func (w *iwConn) rts(*verbs.QPAttr) error {
	w.mu.Lock()
	active := w.active
	w.mu.Unlock()
	if !active {
		return nil
	}
	return w.waitEstablished()
}

func (w *iwConn) waitEstablished() error {
	w.mu.Lock()
	if w.estab {
		w.mu.Unlock()
		return nil
	}
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	done := w.done
	w.mu.Unlock()
	select {
	case <-done:
	case <-time.After(establishTimeout):
		return fmt.Errorf("%w: no iWARP connection to %s:%d after %v (is the peer QP at RTR?)", ErrNoCM, w.peer.IP, w.peer.CMPort, establishTimeout)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *iwConn) fail(err error) {
	if w.err == nil && !w.estab {
		w.err = err
		close(w.done)
	}
}

// cmEvent runs on the context's rdma_cm goroutine.
func (w *iwConn) cmEvent(ev cmEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.q
	rd := clampRd(0, q.d.extra.maxRdAtom)
	init := clampRd(0, q.d.extra.maxInitRd)
	switch ev.event {
	case cmConnRequest:
		if w.closed || w.conn != nil {
			ev.newID.reject()
			ev.newID.destroy()
			return
		}
		w.conn = ev.newID
		w.conn.setContext(q.id)
		if len(ev.privateData) >= 8 && bytes.Equal(ev.privateData[:4], pdataMagic) {
			w.peerQPN = binary.BigEndian.Uint32(ev.privateData[4:])
		}
		if err := w.conn.connect(q.num, rd, init, pdata(q.num), true); err != nil {
			w.fail(fmt.Errorf("%w: rdma_accept: %v", ErrNoCM, err))
		}
	case cmAddrResolved:
		if w.conn == nil {
			return // reset or closed meanwhile
		}
		if err := w.conn.resolveRoute(5000); err != nil {
			w.fail(fmt.Errorf("%w: rdma_resolve_route to %s: %v", ErrNoCM, w.peer.IP, err))
		}
	case cmRouteResolved:
		if w.conn == nil {
			return // reset or closed meanwhile
		}
		err := w.conn.connect(q.num, rd, init, pdata(q.num), false)
		if err == nil {
			return
		}
		again, rerr := w.redial(err)
		if again {
			return
		}
		if rerr != nil {
			err = fmt.Errorf("%v (and starting over with a new id: %v)", err, rerr)
		}
		w.fail(fmt.Errorf("%w: rdma_connect to %s:%d: %v", ErrNoCM, w.peer.IP, w.peer.CMPort, err))
	case cmEstablished:
		if !w.estab && w.err == nil {
			w.estab = true
			close(w.done)
		}
	case cmConnResponse:
		// IB/RoCE semantics (not reached on iWARP): finish the handshake.
		if err := w.conn.establish(); err != nil {
			w.fail(fmt.Errorf("%w: %v", ErrNoCM, err))
		}
	case cmAddrError, cmRouteError, cmUnreachable, cmRejected, cmConnError:
		w.fail(fmt.Errorf("%w: %s (status %d) connecting %s:%d → %s:%d: is the peer QP alive and its device reachable?",
			ErrNoCM, cmEventName(ev.event), ev.status, w.ip, w.port, w.peer.IP, w.peer.CMPort))
	case cmDisconnected, cmDeviceRemoval:
		// The kernel moves an iWARP QP to ERROR when its connection ends.
		if w.estab {
			q.enterError()
		}
		w.fail(fmt.Errorf("%w: %s", ErrNoCM, cmEventName(ev.event)))
	}
}

// redial starts the active side's connection over with a new rdma_cm id
// after rdma_connect failed with err, when err says the id's port was
// taken (mu held): again reports that it did, rerr why starting over
// failed. On iWARP the id's port, which rdma_cm chose from its own port
// space, becomes the TCP connection's source port, and a TCP socket of
// another program may hold it already: siw's connect then fails with
// EADDRNOTAVAIL or EADDRINUSE (seen in the guest, three ranks setting up
// at once). A new id gets another port. Events are acknowledged before
// they are handled (rk_cm_get_event), so the old id is destroyed here;
// disconnect holds mu too. Only a synchronous rdma_connect error starts
// over: the same errno in a later CONNECT_ERROR event fails the
// connection.
func (w *iwConn) redial(err error) (again bool, rerr error) {
	if w.closed || w.redials >= maxRedials || !errors.Is(err, syscall.EADDRNOTAVAIL) && !errors.Is(err, syscall.EADDRINUSE) {
		return false, nil
	}
	id, err := w.m.ch.createID(w.q.id)
	if err != nil {
		return false, err
	}
	if err := id.resolveAddr(w.ip, w.peer.IP, w.peer.CMPort, 5000); err != nil {
		id.destroy()
		return false, fmt.Errorf("rdma_resolve_addr: %v", err)
	}
	w.redials++
	old := w.conn
	w.conn = id
	old.destroy()
	return true, nil
}

// maxRedials bounds redial per connection.
const maxRedials = 3

// adopt records that the QP was connected through a CMConn (DialCM,
// ListenCM) instead of Address exchange: posting need not wait.
func (w *iwConn) adopt() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.estab && w.err == nil {
		w.estab = true
		close(w.done)
	}
}

// reset forgets the connection (Modify to RESET).
func (w *iwConn) reset() {
	w.mu.Lock()
	c := w.conn
	w.conn, w.started, w.active, w.estab, w.err, w.redials = nil, false, false, false, nil, 0
	w.done = make(chan struct{})
	w.mu.Unlock()
	if c != nil {
		c.disconnect()
		c.destroy()
	}
}

// disconnect runs under mu: the event goroutine may replace and destroy
// the active id meanwhile (redial).
func (w *iwConn) disconnect() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		w.conn.disconnect()
	}
}

// destroy releases the ids; the QP is already destroyed.
func (w *iwConn) destroy() {
	w.m.unregister(w.q.id)
	w.mu.Lock()
	w.closed = true
	c, l := w.conn, w.lis
	w.conn, w.lis = nil, nil
	w.fail(errors.New("ibverbs: QP closed"))
	w.mu.Unlock()
	if c != nil {
		c.destroy()
	}
	if l != nil {
		l.destroy()
	}
}
