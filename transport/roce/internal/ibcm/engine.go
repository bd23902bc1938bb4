package ibcm

// The CM state machine, both roles, I/O-free: Input takes a received MAD,
// Connect/Accept/Ready/Reject/Disconnect take the application's steps,
// Tick takes the time; each returns what happened (Event), and the MADs
// to send collect in the outbox (Outbox). Times are durations since any
// fixed origin the caller keeps.
//
// Active side:  Connect → REQ ... REP (EvReply: the caller brings its QP
// to RTR and RTS) → Ready → RTU: established.
// Passive side: REQ (EvRequest, for a port Listen named) → Accept (the
// caller brought its QP to RTR and RTS) → REP ... RTU (EvEstablished).
// Either side: Disconnect → DREQ ... DREP (EvClosed); a DREQ received is
// answered with a DREP (EvDisconnected). A REJ fails the connection
// (EvRejected); a message not answered after Config.Retries resends
// fails it with ErrTimeout (EvTimeout).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Errors.
var (
	// ErrTimeout: the peer did not answer, after every retry.
	ErrTimeout = errors.New("ibcm: the peer did not answer (CM response timeout, retries exhausted)")
	// ErrUnknownConn: a message names a connection this side does not
	// have (or comes from another address than its peer's).
	ErrUnknownConn = errors.New("ibcm: message for an unknown connection")
	// ErrState: a step that the connection's state does not allow.
	ErrState = errors.New("ibcm: not allowed in the connection's state")
	// ErrBacklog: too many requests wait for Accept.
	ErrBacklog = errors.New("ibcm: too many connection requests waiting")
)

// RejectError is a connection the peer rejected.
type RejectError struct {
	Reason Reason
	// Msg is what the peer rejected (MsgREQ, MsgREP, MsgOther).
	Msg     uint8
	ARI     []byte
	Private []byte
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("ibcm: connection rejected by the peer: %v (%d)", e.Reason, uint16(e.Reason))
}

// State is a connection's state.
type State uint8

const (
	StateIdle State = iota
	StateReqSent
	StateReqRcvd
	StateRepSent
	StateRepRcvd
	StateEstablished
	StateDreqSent
	StateClosed
	StateFailed
)

var stateNames = [...]string{"idle", "REQ sent", "REQ received", "REP sent", "REP received", "established", "DREQ sent", "closed", "failed"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state %d", s)
}

// EventKind says what an Event is.
type EventKind uint8

const (
	EvNone         EventKind = iota
	EvRequest                // passive: a new REQ for a listened port; Accept or Reject it
	EvReply                  // active: the REP came; bring the QP to RTS, then Ready
	EvEstablished            // passive: the RTU came
	EvRejected               // Conn.Err is a *RejectError
	EvTimeout                // Conn.Err is ErrTimeout
	EvDisconnected           // the peer disconnected (its DREQ was answered)
	EvClosed                 // our DREQ was answered (or timed out)
)

// Event is what an input, a step or the time brought about.
type Event struct {
	Kind EventKind
	Conn *Conn
}

// Out is a MAD to send, to the peer's CM at To.
type Out struct {
	To  netip.AddrPort
	MAD [MADLen]byte
}

// Config configures an Engine; the zero value takes the defaults.
type Config struct {
	// CAGUID is this side's channel adapter GUID (in REQ and REP).
	CAGUID uint64
	// Timeout is how long a REQ, REP or DREQ waits for its answer
	// before it is sent again (default 1 s).
	Timeout time.Duration
	// Retries is how often it is sent again (default 8).
	Retries int
	// Backlog bounds the requests waiting for Accept (default 64).
	Backlog int
	// Rand returns random numbers (comm IDs, transaction IDs); required.
	Rand func() uint32
}

// Conn is one connection's state. Its fields are the engine's; read them
// between calls.
type Conn struct {
	LocalID, RemoteID uint32
	// Peer is where this connection's MADs go.
	Peer  netip.AddrPort
	State State
	// Err is why the connection failed or closed (nil: by agreement).
	Err error
	// Port is the rdma_cm port (the service ID's).
	Port uint16
	// Active: this side sent the REQ.
	Active bool

	tid      uint64
	req      [MADLen]byte // the REQ, sent or received
	rep      [MADLen]byte // the REP, sent or received
	last     [MADLen]byte // the message a timeout or a duplicate sends again
	hasLast  bool
	retries  int
	deadline time.Duration // 0: none
}

// Request is the connection's REQ (sent or received).
func (c *Conn) Request() REQ { return REQ{MAD(c.req[:])} }

// Reply is the connection's REP (sent or received; zero before).
func (c *Conn) Reply() REP { return REP{MAD(c.rep[:])} }

type dupKey struct {
	peer     netip.Addr
	remoteID uint32
}

// Engine is the CM of one RoCE port (one UDP endpoint): its connections
// by local comm ID and its listened ports. Not safe for concurrent use.
type Engine struct {
	cfg     Config
	conns   map[uint32]*Conn
	byPeer  map[dupKey]*Conn // passive connections by the requester's comm ID
	listen  map[uint16]bool
	waiting int // requests not yet accepted or rejected
	out     []Out
}

// New returns an engine.
func New(cfg Config) *Engine {
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Retries <= 0 {
		cfg.Retries = 8
	}
	if cfg.Backlog <= 0 {
		cfg.Backlog = 64
	}
	return &Engine{cfg: cfg, conns: map[uint32]*Conn{}, byPeer: map[dupKey]*Conn{}, listen: map[uint16]bool{}}
}

// Outbox returns the MADs to send and empties it; the slice is valid
// until the next call into the engine.
func (e *Engine) Outbox() []Out {
	o := e.out
	e.out = e.out[:0]
	return o
}

// Listen makes REQs to port (rdma_cm's TCP port space) EvRequests.
func (e *Engine) Listen(port uint16) error {
	if e.listen[port] {
		return fmt.Errorf("ibcm: port %d is listened on already", port)
	}
	e.listen[port] = true
	return nil
}

// Unlisten stops listening on port; REQs to it are rejected from now on.
func (e *Engine) Unlisten(port uint16) { delete(e.listen, port) }

// Conns returns how many connections the engine keeps.
func (e *Engine) Conns() int { return len(e.conns) }

func (e *Engine) newID() uint32 {
	for {
		id := e.cfg.Rand()
		if _, dup := e.conns[id]; id != 0 && !dup {
			return id
		}
	}
}

func (e *Engine) send(to netip.AddrPort, m *[MADLen]byte) {
	e.out = append(e.out, Out{To: to})
	e.out[len(e.out)-1].MAD = *m
}

// sendLast sends c.last and waits for its answer (expect) or not.
func (e *Engine) sendLast(c *Conn, now time.Duration, expect bool) {
	c.hasLast = true
	e.send(c.Peer, &c.last)
	c.retries, c.deadline = 0, 0
	if expect {
		c.deadline = now + e.cfg.Timeout
	}
}

// ConnectParams are an active connection's.
type ConnectParams struct {
	Peer netip.AddrPort // the peer's CM (IP, UDP port)
	Port uint16         // rdma_cm port to connect to
	QPN  uint32         // this side's QP
	// PSN is the PSN this side's QP expects to receive first (a REQ's or
	// REP's starting PSN is its sender's receive PSN: the peer sends
	// from it).
	PSN       uint32
	LocalGID  netip.Addr // this side's address
	RemoteGID netip.Addr // the peer's
	// LocalLID is sent as the primary local port LID (0xffff, the
	// permissive LID, as RoCE peers send; rdmakit puts a UDP port other
	// than 4791 here, see transport/roce).
	LocalLID   uint16
	MTU        uint8 // IB MTU enum (1: 256 ... 5: 4096)
	RespRes    uint8 // RDMA Reads/atomics this side serves at once
	InitDepth  uint8 // ... and issues at once
	AckTimeout uint8 // local ACK timeout exponent
	RetryCount uint8
	RNRRetry   uint8
	SrcPort    uint16 // the RDMA CM header's source port
	Private    []byte // after the RDMA CM header (at most ReqPrivateLen-CMAHeaderLen)
}

// Connect starts an active connection: a REQ to p.Peer.
func (e *Engine) Connect(p *ConnectParams, now time.Duration) (*Conn, error) {
	if len(p.Private) > ReqPrivateLen-CMAHeaderLen {
		return nil, fmt.Errorf("ibcm: %d bytes of private data, at most %d", len(p.Private), ReqPrivateLen-CMAHeaderLen)
	}
	c := &Conn{LocalID: e.newID(), Peer: p.Peer, Port: p.Port, State: StateReqSent, Active: true}
	c.tid = uint64(e.cfg.Rand())<<32 | uint64(c.LocalID)
	r := REQ{MAD(c.req[:])}
	r.Init(AttrREQ, c.tid)
	r.SetCommIDs(c.LocalID, 0)
	r.SetServiceID(ServiceID(p.Port))
	r.SetCAGUID(e.cfg.CAGUID)
	r.SetQPN(p.QPN)
	r.SetResponderResources(p.RespRes)
	r.SetInitiatorDepth(p.InitDepth)
	cmTimeout := timeoutExp(e.cfg.Timeout)
	r.SetRemoteCMTimeout(cmTimeout)
	r.SetTransportType(0) // RC
	r.SetFlowControl(true)
	r.SetPSN(p.PSN)
	r.SetLocalCMTimeout(cmTimeout)
	r.SetRetryCount(p.RetryCount)
	r.SetPKey(0xffff)
	r.SetPathMTU(p.MTU)
	r.SetRNRRetryCount(p.RNRRetry)
	r.SetMaxCMRetries(uint8(min(e.cfg.Retries, 15)))
	r.SetLIDs(p.LocalLID, 0xffff)
	r.SetGIDs(p.LocalGID, p.RemoteGID)
	r.SetPacketRate(0x10) // 100 Gb/s, as rdma_cm says for RoCE
	r.SetHopLimit(64)
	r.SetAckTimeout(p.AckTimeout)
	CMAHeader(r.PrivateData()).Encode(p.LocalGID, p.SrcPort, p.RemoteGID)
	copy(r.PrivateData()[CMAHeaderLen:], p.Private)
	e.conns[c.LocalID] = c
	c.last = c.req
	e.sendLast(c, now, true)
	return c, nil
}

// timeoutExp is the CM response timeout exponent (4.096 µs × 2^t) that
// covers d.
func timeoutExp(d time.Duration) uint8 {
	for t := uint8(0); t < 31; t++ {
		if time.Duration(4096<<t) >= d {
			return t
		}
	}
	return 31
}

// AcceptParams are a passive connection's answer.
type AcceptParams struct {
	QPN, PSN  uint32 // this side's QP, and the PSN it expects to receive first
	RespRes   uint8
	InitDepth uint8
	RNRRetry  uint8
	AckDelay  uint8
	Private   []byte // at most RepPrivateLen
}

// Accept answers an EvRequest's connection with a REP.
func (e *Engine) Accept(c *Conn, p *AcceptParams, now time.Duration) error {
	if c.State != StateReqRcvd {
		return fmt.Errorf("%w: accept in %v", ErrState, c.State)
	}
	if len(p.Private) > RepPrivateLen {
		return fmt.Errorf("ibcm: %d bytes of private data, at most %d", len(p.Private), RepPrivateLen)
	}
	e.waiting--
	r := REP{MAD(c.rep[:])}
	r.Init(AttrREP, c.tid)
	r.SetCommIDs(c.LocalID, c.RemoteID)
	r.SetQPN(p.QPN)
	r.SetPSN(p.PSN)
	r.SetResponderResources(p.RespRes)
	r.SetInitiatorDepth(p.InitDepth)
	r.SetTargetAckDelay(p.AckDelay)
	r.SetFlowControl(true)
	r.SetRNRRetryCount(p.RNRRetry)
	r.SetCAGUID(e.cfg.CAGUID)
	copy(r.PrivateData(), p.Private)
	c.State = StateRepSent
	c.last = c.rep
	e.sendLast(c, now, true)
	return nil
}

// Reject answers an EvRequest's connection (or a REP, on the active
// side) with a REJ, and forgets the connection.
func (e *Engine) Reject(c *Conn, reason Reason, private []byte) error {
	var msg uint8
	switch c.State {
	case StateReqRcvd:
		msg = MsgREQ
		e.waiting--
	case StateRepRcvd:
		msg = MsgREP
	default:
		return fmt.Errorf("%w: reject in %v", ErrState, c.State)
	}
	e.reject(c.Peer, c.tid, c.LocalID, c.RemoteID, msg, reason, private)
	c.State, c.Err = StateFailed, &RejectError{Reason: reason, Msg: msg}
	e.forget(c)
	return nil
}

func (e *Engine) reject(to netip.AddrPort, tid uint64, local, remote uint32, msg uint8, reason Reason, private []byte) {
	var b [MADLen]byte
	r := REJ{MAD(b[:])}
	r.Init(AttrREJ, tid)
	r.SetCommIDs(local, remote)
	r.SetRejected(msg)
	r.SetReason(reason)
	copy(r.PrivateData(), private)
	e.send(to, &b)
}

// Ready completes an EvReply's connection with an RTU: established.
func (e *Engine) Ready(c *Conn, now time.Duration) error {
	if c.State != StateRepRcvd {
		return fmt.Errorf("%w: ready in %v", ErrState, c.State)
	}
	m := MAD(c.last[:])
	m.Init(AttrRTU, c.tid)
	m.SetCommIDs(c.LocalID, c.RemoteID)
	c.State = StateEstablished
	e.sendLast(c, now, false) // sent again when a REP comes again
	return nil
}

// Disconnect starts a disconnection (DREQ) of an established connection
// or one on its way there; other connections are forgotten at once
// (returns EvClosed's connection state: closed).
func (e *Engine) Disconnect(c *Conn, now time.Duration) {
	switch c.State {
	case StateEstablished, StateRepSent, StateRepRcvd:
		m := MAD(c.last[:])
		m.Init(AttrDREQ, uint64(e.cfg.Rand())<<32|uint64(c.LocalID))
		m.SetCommIDs(c.LocalID, c.RemoteID)
		DREQ{m}.SetRemoteQPN(c.remoteQPN())
		c.State = StateDreqSent
		e.sendLast(c, now, true)
	case StateDreqSent:
	case StateReqRcvd:
		_ = e.Reject(c, RejConsumerDefined, nil)
	default:
		if c.State != StateFailed {
			c.State = StateClosed
		}
		e.forget(c)
	}
}

// remoteQPN is the peer's QP number.
func (c *Conn) remoteQPN() uint32 {
	if c.Active {
		return c.Reply().QPN()
	}
	return c.Request().QPN()
}

func (e *Engine) forget(c *Conn) {
	if e.conns[c.LocalID] == c {
		delete(e.conns, c.LocalID)
	}
	k := dupKey{c.Peer.Addr(), c.RemoteID}
	if e.byPeer[k] == c {
		delete(e.byPeer, k)
	}
	c.deadline = 0
}

// Forget drops a connection the caller is done with (closed or failed
// ones are forgotten already).
func (e *Engine) Forget(c *Conn) {
	if c.State == StateReqRcvd {
		e.waiting--
	}
	e.forget(c)
}

// Input handles a MAD b from the CM at from. It returns the event it
// caused (EvNone for none) and an error for a message it could not use
// (malformed, unknown connection, from the wrong peer); a REQ for a port
// nobody listens on is answered with a REJ.
func (e *Engine) Input(b []byte, from netip.AddrPort, replyTo netip.AddrPort, now time.Duration) (Event, error) {
	m, err := Parse(b)
	if err != nil {
		return Event{}, err
	}
	if m.Attr() == AttrREQ {
		return e.inputREQ(REQ{m}, from, replyTo, now)
	}
	if m.Attr() == AttrDREQ {
		return e.inputDREQ(m, from)
	}
	c := e.conns[m.RemoteCommID()]
	if c == nil || c.Peer.Addr() != from.Addr() || (c.RemoteID != 0 && c.RemoteID != m.LocalCommID()) {
		return Event{}, fmt.Errorf("%w: %v for comm ID %#x from %s", ErrUnknownConn, m.Attr(), m.RemoteCommID(), from)
	}
	switch m.Attr() {
	case AttrREP:
		switch c.State {
		case StateReqSent:
			copy(c.rep[:], m)
			c.RemoteID = m.LocalCommID()
			c.State, c.deadline = StateRepRcvd, 0
			return Event{EvReply, c}, nil
		case StateEstablished:
			e.send(c.Peer, &c.last) // the RTU was lost
		}
	case AttrRTU:
		if c.State == StateRepSent {
			c.State, c.deadline = StateEstablished, 0
			return Event{EvEstablished, c}, nil
		}
	case AttrMRA:
		r := MRA{m}
		if (c.State == StateReqSent && r.MRAed() == MsgREQ) || (c.State == StateRepSent && r.MRAed() == MsgREP) {
			// The peer needs time: wait its service timeout as well. Each
			// MRA uses up a retry, so a peer that keeps sending them
			// cannot hold the connection (and its waiter) forever.
			if c.retries >= e.cfg.Retries {
				return Event{}, nil // the deadline already set stands
			}
			c.retries++
			c.deadline = now + e.cfg.Timeout + time.Duration(4096<<min(r.ServiceTimeout(), 24))
		}
	case AttrREJ:
		r := REJ{m}
		switch c.State {
		case StateReqSent, StateRepSent, StateRepRcvd, StateEstablished, StateDreqSent:
			c.Err = &RejectError{Reason: r.Reason(), Msg: r.Rejected(), ARI: append([]byte(nil), r.ARI()...), Private: append([]byte(nil), r.PrivateData()...)}
			c.State = StateFailed
			e.forget(c)
			return Event{EvRejected, c}, nil
		}
	case AttrDREP:
		if c.State == StateDreqSent {
			c.State = StateClosed
			e.forget(c)
			return Event{EvClosed, c}, nil
		}
	}
	return Event{}, nil
}

func (e *Engine) inputREQ(r REQ, from, replyTo netip.AddrPort, now time.Duration) (Event, error) {
	k := dupKey{from.Addr(), r.LocalCommID()}
	if c := e.byPeer[k]; c != nil {
		switch c.State {
		case StateReqRcvd:
			// Asked again before the application answered: ask for
			// patience (service timeout 2^20 × 4.096 µs ≈ 4 s).
			var b [MADLen]byte
			mra := MRA{MAD(b[:])}
			mra.Init(AttrMRA, c.tid)
			mra.SetCommIDs(c.LocalID, c.RemoteID)
			mra.SetMRAed(MsgREQ)
			mra.SetServiceTimeout(20)
			e.send(c.Peer, &b)
		case StateRepSent:
			e.send(c.Peer, &c.rep) // the REP was lost
		}
		return Event{}, nil
	}
	port, ok := PortOf(r.ServiceID())
	if !ok || !e.listen[port] {
		e.reject(replyTo, r.TID(), 0, r.LocalCommID(), MsgREQ, RejInvalidServiceID, nil)
		return Event{}, fmt.Errorf("ibcm: REQ for service ID %#x, not listened on: rejected", r.ServiceID())
	}
	if r.TransportType() != 0 {
		e.reject(replyTo, r.TID(), 0, r.LocalCommID(), MsgREQ, RejInvalidTransport, nil)
		return Event{}, fmt.Errorf("ibcm: REQ for transport type %d (only RC is served): rejected", r.TransportType())
	}
	if _, err := ParseCMAHeader(r.PrivateData()); err != nil {
		e.reject(replyTo, r.TID(), 0, r.LocalCommID(), MsgREQ, RejConsumerDefined, nil)
		return Event{}, fmt.Errorf("ibcm: REQ without a valid RDMA CM header: %w", err)
	}
	if e.waiting >= e.cfg.Backlog {
		e.reject(replyTo, r.TID(), 0, r.LocalCommID(), MsgREQ, RejNoResources, nil)
		return Event{}, ErrBacklog
	}
	c := &Conn{LocalID: e.newID(), RemoteID: r.LocalCommID(), Peer: replyTo, Port: port, State: StateReqRcvd, tid: r.TID()}
	copy(c.req[:], r.MAD)
	e.conns[c.LocalID] = c
	e.byPeer[k] = c
	e.waiting++
	return Event{EvRequest, c}, nil
}

func (e *Engine) inputDREQ(m MAD, from netip.AddrPort) (Event, error) {
	c := e.conns[m.RemoteCommID()]
	var b [MADLen]byte
	d := MAD(b[:])
	d.Init(AttrDREP, m.TID())
	if c == nil || c.Peer.Addr() != from.Addr() || c.RemoteID != m.LocalCommID() {
		// Answered anyway (the connection may be gone already), to the
		// port the DREQ came from.
		d.SetCommIDs(m.RemoteCommID(), m.LocalCommID())
		e.send(from, &b)
		return Event{}, fmt.Errorf("%w: DREQ for comm ID %#x from %s (answered)", ErrUnknownConn, m.RemoteCommID(), from)
	}
	d.SetCommIDs(c.LocalID, c.RemoteID)
	e.send(c.Peer, &b)
	switch c.State {
	case StateDreqSent:
		// Both sides disconnect at once.
		c.State = StateClosed
		e.forget(c)
		return Event{EvClosed, c}, nil
	case StateReqRcvd:
		e.waiting--
	}
	c.State = StateClosed
	e.forget(c)
	return Event{EvDisconnected, c}, nil
}

// Next returns the earliest deadline (0: none).
func (e *Engine) Next() time.Duration {
	var next time.Duration
	for _, c := range e.conns {
		if c.deadline != 0 && (next == 0 || c.deadline < next) {
			next = c.deadline
		}
	}
	return next
}

// Tick sends again what was not answered in time and fails what was
// sent too often; it returns the connections that failed or closed.
func (e *Engine) Tick(now time.Duration, evs []Event) []Event {
	for _, c := range e.conns {
		if c.deadline == 0 || now < c.deadline {
			continue
		}
		if c.retries < e.cfg.Retries {
			c.retries++
			c.deadline = now + e.cfg.Timeout
			e.send(c.Peer, &c.last)
			continue
		}
		c.Err = ErrTimeout
		switch c.State {
		case StateDreqSent:
			c.State = StateClosed
			evs = append(evs, Event{EvClosed, c})
		default:
			// A REQ or REP unanswered: tell the peer, as the CM does.
			m := MAD(c.last[:])
			msg := uint8(MsgREQ)
			if m.Attr() == AttrREP {
				msg = MsgREP
			}
			e.reject(c.Peer, c.tid, c.LocalID, c.RemoteID, msg, RejTimeout, nil)
			c.State = StateFailed
			evs = append(evs, Event{EvTimeout, c})
		}
		e.forget(c)
	}
	return evs
}

// ReplyPort is the UDP port a REQ's answers go to: a primary local port
// LID other than 0 and 0xffff is an rdmakit requester's UDP port (on
// RoCE the LID means nothing; rdmakit puts its port there when it is not
// 4791), else def (4791: RoCEv2's).
func ReplyPort(b []byte, def uint16) uint16 {
	if len(b) < MADLen || binary.BigEndian.Uint16(b[offAttrID:]) != uint16(AttrREQ) {
		return def
	}
	if l := (REQ{MAD(b)}).LocalLID(); l != 0 && l != 0xffff {
		return l
	}
	return def
}
