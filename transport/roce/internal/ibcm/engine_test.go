package ibcm

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

var (
	addrA = netip.MustParseAddrPort("10.0.0.1:4791")
	addrB = netip.MustParseAddrPort("10.0.0.2:4791")
)

func newEngine(seed uint64) *Engine {
	r := rand.New(rand.NewPCG(seed, seed))
	return New(Config{CAGUID: 0x1122334455667700 + seed, Timeout: 100 * time.Millisecond, Retries: 3, Backlog: 2, Rand: r.Uint32})
}

func connectParams() *ConnectParams {
	return &ConnectParams{Peer: addrB, Port: 7174, QPN: 0x123456, PSN: 0xabcdef, LocalGID: addrA.Addr(), RemoteGID: addrB.Addr(),
		LocalLID: 0xffff, MTU: 3, RespRes: 4, InitDepth: 5, AckTimeout: 14, RetryCount: 7, RNRRetry: 6, SrcPort: 40000, Private: []byte("hello")}
}

// deliver hands every MAD in from's outbox to to (as from at fromAddr),
// returning the events.
func deliver(t *testing.T, from *Engine, fromAddr netip.AddrPort, to *Engine, now time.Duration) []Event {
	t.Helper()
	var evs []Event
	for _, o := range append([]Out(nil), from.Outbox()...) {
		ev, err := to.Input(o.MAD[:], fromAddr, fromAddr, now)
		if err != nil {
			t.Fatalf("input: %v", err)
		}
		if ev.Kind != EvNone {
			evs = append(evs, ev)
		}
	}
	return evs
}

func one(t *testing.T, evs []Event, k EventKind) *Conn {
	t.Helper()
	if len(evs) != 1 || evs[0].Kind != k {
		t.Fatalf("events %+v, want one of kind %d", evs, k)
	}
	return evs[0].Conn
}

// handshake runs REQ, REP, RTU between a (active) and b (passive).
func handshake(t *testing.T, a, b *Engine) (ca, cb *Conn) {
	t.Helper()
	if err := b.Listen(7174); err != nil {
		t.Fatal(err)
	}
	ca, err := a.Connect(connectParams(), 1)
	if err != nil {
		t.Fatal(err)
	}
	cb = one(t, deliver(t, a, addrA, b, 2), EvRequest)
	r := cb.Request()
	if r.QPN() != 0x123456 || r.PSN() != 0xabcdef || r.PathMTU() != 3 || r.ResponderResources() != 4 || r.InitiatorDepth() != 5 ||
		r.AckTimeout() != 14 || r.RetryCount() != 7 || r.RNRRetryCount() != 6 || r.LocalGID().Unmap() != addrA.Addr() ||
		r.RemoteGID().Unmap() != addrB.Addr() || r.ServiceID() != 0x01061c06 || r.CAGUID() != a.cfg.CAGUID || r.TransportType() != 0 {
		t.Fatalf("REQ as received: qpn %#x psn %#x mtu %d rr %d id %d to %d rc %d rnr %d gids %v %v sid %#x", r.QPN(), r.PSN(), r.PathMTU(),
			r.ResponderResources(), r.InitiatorDepth(), r.AckTimeout(), r.RetryCount(), r.RNRRetryCount(), r.LocalGID(), r.RemoteGID(), r.ServiceID())
	}
	h, err := ParseCMAHeader(r.PrivateData())
	if err != nil || h.Src() != addrA.Addr() || h.Dst() != addrB.Addr() || h.Port() != 40000 || h.IPVersion() != 4 {
		t.Fatalf("CMA header %v %v %v %d: %v", h.Src(), h.Dst(), h.Port(), h.IPVersion(), err)
	}
	if !bytes.HasPrefix(r.PrivateData()[CMAHeaderLen:], []byte("hello")) {
		t.Fatal("private data")
	}
	if err := b.Accept(cb, &AcceptParams{QPN: 0x654321, PSN: 0x111111, RespRes: 2, InitDepth: 3, RNRRetry: 7, AckDelay: 15, Private: []byte("yo")}, 3); err != nil {
		t.Fatal(err)
	}
	if cb.State != StateRepSent {
		t.Fatal(cb.State)
	}
	if c := one(t, deliver(t, b, addrB, a, 4), EvReply); c != ca {
		t.Fatal("REP for another connection")
	}
	p := ca.Reply()
	if p.QPN() != 0x654321 || p.PSN() != 0x111111 || p.ResponderResources() != 2 || p.InitiatorDepth() != 3 || p.RNRRetryCount() != 7 ||
		p.TargetAckDelay() != 15 || p.CAGUID() != b.cfg.CAGUID || !bytes.HasPrefix(p.PrivateData(), []byte("yo")) {
		t.Fatalf("REP as received: %x", p.MAD[:64])
	}
	if ca.RemoteID != cb.LocalID || cb.RemoteID != ca.LocalID {
		t.Fatal("comm IDs")
	}
	if err := a.Ready(ca, 5); err != nil {
		t.Fatal(err)
	}
	one(t, deliver(t, a, addrA, b, 6), EvEstablished)
	if ca.State != StateEstablished || cb.State != StateEstablished || a.Next() != 0 || b.Next() != 0 {
		t.Fatalf("states %v %v, deadlines %v %v", ca.State, cb.State, a.Next(), b.Next())
	}
	return ca, cb
}

func TestHandshakeAndDisconnect(t *testing.T) {
	for _, activeCloses := range []bool{true, false} {
		a, b := newEngine(1), newEngine(2)
		ca, cb := handshake(t, a, b)
		x, y, cx, xa, ya := a, b, ca, addrA, addrB
		if !activeCloses {
			x, y, cx, xa, ya = b, a, cb, addrB, addrA
		}
		x.Disconnect(cx, 10)
		if cx.State != StateDreqSent {
			t.Fatal(cx.State)
		}
		one(t, deliver(t, x, xa, y, 11), EvDisconnected)
		one(t, deliver(t, y, ya, x, 12), EvClosed)
		if a.Conns() != 0 || b.Conns() != 0 {
			t.Fatalf("%d and %d connections left", a.Conns(), b.Conns())
		}
	}
}

// Lost messages: a REQ, REP or RTU lost is made up for by the
// retransmission (REQ, REP) or by the duplicate it provokes (REP → RTU).
func TestDuplicates(t *testing.T) {
	a, b := newEngine(3), newEngine(4)
	b.Listen(7174)
	ca, _ := a.Connect(connectParams(), 1)
	a.Outbox() // the REQ is lost
	if evs := a.Tick(50*time.Millisecond, nil); len(evs) != 0 || len(a.out) != 0 {
		t.Fatal("resent before the timeout")
	}
	a.Tick(101*time.Millisecond, nil) // resent
	cb := one(t, deliver(t, a, addrA, b, 102*time.Millisecond), EvRequest)
	// The same REQ again (a late duplicate): no second connection, an MRA.
	a.Tick(202*time.Millisecond, nil)
	if evs := deliver(t, a, addrA, b, 203*time.Millisecond); len(evs) != 0 || b.Conns() != 1 {
		t.Fatalf("duplicate REQ: %v, %d connections", evs, b.Conns())
	}
	out := b.Outbox()
	if len(out) != 1 || MAD(out[0].MAD[:]).Attr() != AttrMRA {
		t.Fatalf("duplicate REQ answered with %d MADs", len(out))
	}
	// The MRA makes the requester wait longer than its timeout.
	if ev, err := a.Input(out[0].MAD[:], addrB, addrB, 204*time.Millisecond); err != nil || ev.Kind != EvNone {
		t.Fatal(ev, err)
	}
	if a.Next() < 2*time.Second {
		t.Fatalf("after an MRA the next deadline is %v", a.Next())
	}
	b.Accept(cb, &AcceptParams{QPN: 9, PSN: 10}, 300*time.Millisecond)
	b.Outbox() // the REP is lost
	b.Tick(401*time.Millisecond, nil)
	one(t, deliver(t, b, addrB, a, 402*time.Millisecond), EvReply)
	a.Ready(ca, 403*time.Millisecond)
	a.Outbox() // the RTU is lost
	b.Tick(502*time.Millisecond, nil)
	// The REP again: the RTU is sent again.
	if evs := deliver(t, b, addrB, a, 503*time.Millisecond); len(evs) != 0 {
		t.Fatal(evs)
	}
	one(t, deliver(t, a, addrA, b, 504*time.Millisecond), EvEstablished)
}

func TestTimeout(t *testing.T) {
	a := newEngine(5)
	ca, _ := a.Connect(connectParams(), 1)
	var evs []Event
	now := time.Duration(1)
	sent := len(a.Outbox())
	for i := 0; i < 10 && len(evs) == 0; i++ {
		now += 100 * time.Millisecond
		evs = a.Tick(now, evs)
		for _, o := range a.Outbox() {
			sent++
			if MAD(o.MAD[:]).Attr() == AttrREJ {
				if REJ(REJ{MAD(o.MAD[:])}).Reason() != RejTimeout {
					t.Fatal("REJ reason")
				}
				sent += 100
			}
		}
	}
	if c := one(t, evs, EvTimeout); c != ca || !errors.Is(c.Err, ErrTimeout) || c.State != StateFailed {
		t.Fatalf("%+v", c)
	}
	if sent != 5+100 { // the REQ, 3 retries, a REJ (timeout)
		t.Fatalf("sent %d", sent)
	}
	if a.Conns() != 0 {
		t.Fatal("failed connection kept")
	}
	// The passive side: a REP never answered.
	b := newEngine(6)
	b.Listen(7174)
	a = newEngine(7)
	a.Connect(connectParams(), 1)
	cb := one(t, deliver(t, a, addrA, b, 1), EvRequest)
	b.Accept(cb, &AcceptParams{}, 2)
	evs = nil
	for now := time.Duration(2); len(evs) == 0 && now < 10*time.Second; now += 100 * time.Millisecond {
		evs = b.Tick(now, evs)
	}
	one(t, evs, EvTimeout)
}

func TestRejects(t *testing.T) {
	// Nobody listens on the port: REJ (invalid service ID).
	a, b := newEngine(8), newEngine(9)
	ca, _ := a.Connect(connectParams(), 1)
	for _, o := range a.Outbox() {
		if _, err := b.Input(o.MAD[:], addrA, addrA, 2); err == nil {
			t.Fatal("REQ to an unlistened port taken")
		}
	}
	c := one(t, deliver(t, b, addrB, a, 3), EvRejected)
	var rej *RejectError
	if c != ca || !errors.As(c.Err, &rej) || rej.Reason != RejInvalidServiceID || rej.Msg != MsgREQ {
		t.Fatalf("%v", c.Err)
	}
	// The listener rejects.
	a, b = newEngine(10), newEngine(11)
	b.Listen(7174)
	ca, _ = a.Connect(connectParams(), 1)
	cb := one(t, deliver(t, a, addrA, b, 2), EvRequest)
	if err := b.Reject(cb, RejConsumerDefined, []byte("no")); err != nil {
		t.Fatal(err)
	}
	c = one(t, deliver(t, b, addrB, a, 3), EvRejected)
	if !errors.As(c.Err, &rej) || rej.Reason != RejConsumerDefined || !bytes.HasPrefix(rej.Private, []byte("no")) {
		t.Fatal(c.Err)
	}
	if err := b.Accept(cb, &AcceptParams{}, 4); !errors.Is(err, ErrState) {
		t.Fatalf("accept after reject: %v", err)
	}
}

// Hostile input: wrong class, truncated, unknown comm IDs, a spoofed
// source, a REQ without the RDMA CM header or for UD, a full backlog.
func TestHostile(t *testing.T) {
	a, b := newEngine(12), newEngine(13)
	ca, cb := handshake(t, a, b)
	var m [MADLen]byte
	MAD(m[:]).Init(AttrREP, 1)
	MAD(m[:]).SetCommIDs(cb.LocalID, ca.LocalID)
	// From the wrong address, or with the wrong sender comm ID.
	if _, err := a.Input(m[:], netip.MustParseAddrPort("10.0.0.9:4791"), addrB, 1); !errors.Is(err, ErrUnknownConn) {
		t.Fatal(err)
	}
	MAD(m[:]).SetCommIDs(cb.LocalID+1, ca.LocalID)
	if _, err := a.Input(m[:], addrB, addrB, 1); !errors.Is(err, ErrUnknownConn) {
		t.Fatal(err)
	}
	MAD(m[:]).SetCommIDs(cb.LocalID, ca.LocalID+1)
	if _, err := a.Input(m[:], addrB, addrB, 1); !errors.Is(err, ErrUnknownConn) {
		t.Fatal(err)
	}
	// A REJ from elsewhere does not end the connection.
	MAD(m[:]).Init(AttrREJ, 1)
	MAD(m[:]).SetCommIDs(cb.LocalID, ca.LocalID)
	if _, err := a.Input(m[:], netip.MustParseAddrPort("10.0.0.9:4791"), addrB, 1); !errors.Is(err, ErrUnknownConn) || ca.State != StateEstablished {
		t.Fatal(err, ca.State)
	}
	// Wrong class, version, method, attribute; every truncation.
	good := append([]byte(nil), m[:]...)
	for _, c := range []struct {
		off int
		v   byte
	}{{0, 2}, {1, 0x81}, {2, 1}, {3, 0x83}, {17, 0x19}} {
		b := append([]byte(nil), good...)
		b[c.off] = c.v
		if _, err := a.Input(b, addrB, addrB, 1); err == nil {
			t.Fatalf("byte %d = %#x taken", c.off, c.v)
		}
	}
	for n := 0; n < MADLen; n++ {
		if _, err := a.Input(good[:n], addrB, addrB, 1); !errors.Is(err, ErrTruncated) {
			t.Fatalf("%d bytes: %v", n, err)
		}
	}
	if ca.State != StateEstablished {
		t.Fatal(ca.State)
	}
	// A REQ without the RDMA CM header, and one for UD, are rejected.
	c := newEngine(14)
	c.Listen(7174)
	for _, mutate := range []func(r REQ){
		func(r REQ) { clear(r.PrivateData()); r.PrivateData()[1] = 0x50 },
		func(r REQ) { r.SetTransportType(3) },
	} {
		x := newEngine(15)
		x.Connect(connectParams(), 1)
		o := x.Outbox()[0]
		mutate(REQ{MAD(o.MAD[:])})
		if ev, err := c.Input(o.MAD[:], addrA, addrA, 1); err == nil || ev.Kind != EvNone {
			t.Fatal("bad REQ taken")
		}
		if out := c.Outbox(); len(out) != 1 || MAD(out[0].MAD[:]).Attr() != AttrREJ {
			t.Fatal("bad REQ not rejected")
		}
	}
	// Backlog 2: the third request waiting is refused.
	for i := 0; i < 3; i++ {
		x := newEngine(uint64(20 + i))
		x.Connect(connectParams(), 1)
		_, err := c.Input(x.Outbox()[0].MAD[:], addrA, addrA, 1)
		if (i < 2) != (err == nil) || (i == 2 && !errors.Is(err, ErrBacklog)) {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	// A DREQ for a connection that does not exist is answered (DREP).
	MAD(m[:]).Init(AttrDREQ, 77)
	MAD(m[:]).SetCommIDs(5, 6)
	if _, err := a.Input(m[:], addrB, addrB, 1); !errors.Is(err, ErrUnknownConn) {
		t.Fatal(err)
	}
	if out := a.Outbox(); len(out) != 1 || MAD(out[0].MAD[:]).Attr() != AttrDREP || MAD(out[0].MAD[:]).TID() != 77 ||
		MAD(out[0].MAD[:]).LocalCommID() != 6 || MAD(out[0].MAD[:]).RemoteCommID() != 5 {
		t.Fatal("DREQ for no connection not answered")
	}
}

func TestReplyPort(t *testing.T) {
	x := newEngine(30)
	p := connectParams()
	x.Connect(p, 1)
	if got := ReplyPort(x.Outbox()[0].MAD[:], 4791); got != 4791 {
		t.Fatal(got)
	}
	p.LocalLID = 40001
	x.Connect(p, 1)
	if got := ReplyPort(x.Outbox()[0].MAD[:], 4791); got != 40001 {
		t.Fatal(got)
	}
	if got := ReplyPort(make([]byte, 10), 4791); got != 4791 {
		t.Fatal(got)
	}
}

// A peer that keeps sending MRAs cannot keep a connection waiting
// forever: each MRA uses up a retry, so once they are spent the deadline
// stops moving and passing it ends the connection with a timeout.
func TestMRAFlood(t *testing.T) {
	a, b := newEngine(16), newEngine(17)
	b.Listen(7174)
	ca, _ := a.Connect(connectParams(), 1)
	req := a.Outbox()[0]
	if _, err := b.Input(req.MAD[:], addrA, addrA, 2); err != nil {
		t.Fatal(err)
	}
	b.Outbox()
	// The REQ again: b answers with an MRA.
	if _, err := b.Input(req.MAD[:], addrA, addrA, 3); err != nil {
		t.Fatal(err)
	}
	mra := b.Outbox()[0]
	now := time.Duration(4)
	var evs []Event
	for i := 0; i < 100; i++ {
		// Each MRA comes just before the deadline.
		if _, err := a.Input(mra.MAD[:], addrB, addrB, now); err != nil {
			t.Fatal(err)
		}
		now = a.Next() - 1
		if evs = a.Tick(now, evs[:0]); len(evs) != 0 || ca.State != StateReqSent {
			t.Fatalf("MRA %d: %v %v", i, evs, ca.State)
		}
	}
	a.Tick(a.Next()+1, evs[:0])
	if ca.State != StateFailed || !errors.Is(ca.Err, ErrTimeout) {
		t.Fatalf("after 100 MRAs and the deadline: %v (%v), want failed with a timeout", ca.State, ca.Err)
	}
}
