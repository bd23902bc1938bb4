package roce

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/transport/roce/internal/ibcm"
	"github.com/rdmakit/rdmakit/verbs"
)

// cmPair connects two rdmakit roce QPs (two sockets on 127.0.0.1) through
// the RDMA CM: DialCM on one, ListenCM/Accept on the other.
func cmPair(t *testing.T, port uint16, xa, xb *verbs.Context) (a, b *side, ca, cb *CMConn) {
	t.Helper()
	a = newSide(t, xa, 1<<20)
	b = newSide(t, xb, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := ListenCM(b.ctx, nil, port, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type res struct {
		c   *CMConn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx, b.qp)
		acc <- res{c, err}
	}()
	la := LocalAddr(b.ctx)
	ca, err = DialCM(ctx, a.qp, net.IP(la.Addr().AsSlice()), port, &CMOptions{UDPPort: la.Port()})
	if err != nil {
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { ca.Close(); r.c.Close() })
	return a, b, ca, r.c
}

// TestCMWire: rdmakit to rdmakit through the RDMA CM's MADs over QP 1;
// then a Write, a Read and a Send travel on the connected QPs; the
// client's Close disconnects the server (its QP goes to ERROR).
func TestCMWire(t *testing.T) {
	needDevices(t)
	a, b, ca, cb := cmPair(t, 7174, openTest(t), openTest(t))
	if a.qp.State() != verbs.QPRTS || b.qp.State() != verbs.QPRTS {
		t.Fatalf("states %v %v", a.qp.State(), b.qp.State())
	}
	if ca.PeerQPN() != b.qp.Num() || cb.PeerQPN() != a.qp.Num() {
		t.Fatalf("peer QPNs %#x %#x, want %#x %#x", ca.PeerQPN(), cb.PeerQPN(), b.qp.Num(), a.qp.Num())
	}
	fill(a.mr.Bytes()[:100000], 5)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100000)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*time.Second)
	fill(b.mr.Bytes()[200000:300000], 9)
	b.post(verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{b.mr.SGE(400000, 100000)},
		RemoteAddr: a.mr.Addr() + 0, RKey: a.mr.RKey()})
	b.wait(b.scq, 1, 10*time.Second)
	for i := 0; i < 100000; i++ {
		if b.mr.Bytes()[i] != a.mr.Bytes()[i] || b.mr.Bytes()[400000+i] != a.mr.Bytes()[i] {
			t.Fatalf("byte %d differs", i)
		}
	}
	st := CMStats(a.ctx)
	if st.Sent < 2 || st.Received < 1 {
		t.Fatalf("CM counters %+v", st)
	}
	ca.Close()
	select {
	case <-cb.Disconnected():
	case <-time.After(5 * time.Second):
		t.Fatal("the server side did not see the disconnect")
	}
	if s := b.qp.State(); s != verbs.QPError {
		t.Fatalf("server QP in %v after the peer disconnected", s)
	}
}

// TestCMWireIPv6: the same over ::1 (IPv6 GIDs and RDMA CM header).
func TestCMWireIPv6(t *testing.T) {
	needDevices(t)
	old := os.Getenv(EnvAddr)
	os.Setenv(EnvAddr, "[::1]:0")
	xa, err := verbs.Open(testDevice, verbs.Options{})
	if err == nil {
		t.Cleanup(func() { xa.Close() })
	}
	xb, err2 := verbs.Open(testDevice, verbs.Options{})
	os.Setenv(EnvAddr, old)
	if err != nil || err2 != nil {
		t.Skipf("SKIP (loud): no IPv6 loopback here: %v %v", err, err2)
	}
	t.Cleanup(func() { xb.Close() })
	a, b, ca, _ := cmPair(t, 7175, xa, xb)
	if ca.c.Request().LocalGID().Is4In6() || ca.c.Request().LocalGID() != LocalAddr(xa).Addr() {
		t.Fatalf("REQ GID %v", ca.c.Request().LocalGID())
	}
	fill(a.mr.Bytes()[:50000], 3)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 50000)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*time.Second)
	sameBytes(t, "written over IPv6", b.mr.Bytes()[:50000], a.mr.Bytes()[:50000])
}

// TestCMNoListener: a request to a port nobody listens on is rejected
// (invalid service ID), at once.
func TestCMNoListener(t *testing.T) {
	needDevices(t)
	a := newSide(t, openTest(t), 4096)
	b := newSide(t, openTest(t), 4096)
	l, err := ListenCM(b.ctx, nil, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	la := LocalAddr(b.ctx)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = DialCM(ctx, a.qp, net.IP(la.Addr().AsSlice()), 1001, &CMOptions{UDPPort: la.Port()})
	var rej *CMRejectError
	if !errors.As(err, &rej) || rej.Reason != ibcm.RejInvalidServiceID {
		t.Fatalf("err %v, want a reject for an invalid service ID", err)
	}
	// The QP stays in INIT: once the port is listened on, the same QP
	// connects (perftest's clients retry so).
	if a.qp.State() != verbs.QPInit {
		t.Fatalf("QP in %v after a reject", a.qp.State())
	}
	l2, err := ListenCM(b.ctx, nil, 1001, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	acc := make(chan *CMConn, 1)
	go func() {
		c, _ := l2.Accept(ctx, b.qp)
		acc <- c
	}()
	c, err := DialCM(ctx, a.qp, net.IP(la.Addr().AsSlice()), 1001, &CMOptions{UDPPort: la.Port()})
	if err != nil {
		t.Fatalf("the retry: %v", err)
	}
	c.Close()
	if s := <-acc; s == nil {
		t.Fatal("not accepted")
	} else {
		s.Close()
	}
}

// TestCMTimeout: nobody answers (a socket that drops everything): the
// dial fails with ErrCMTimeout after its retries.
func TestCMTimeout(t *testing.T) {
	needDevices(t)
	a := newSide(t, openTest(t), 4096)
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	port := uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = DialCM(ctx, a.qp, net.IPv4(127, 0, 0, 1), 7174, &CMOptions{UDPPort: port, Timeout: 50 * time.Millisecond, Retries: 3})
	if !errors.Is(err, ErrCMTimeout) {
		t.Fatalf("err %v, want ErrCMTimeout", err)
	}
	// 4 REQs were sent (and a REJ with reason timeout after them).
	buf := make([]byte, 2048)
	n := 0
	pc.SetReadDeadline(time.Now().Add(time.Second))
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			break
		}
		n++
	}
	if n != 5 {
		t.Fatalf("%d datagrams reached the silent peer, want 4 REQs and a REJ (in %v)", n, time.Since(start))
	}
}

// TestCMCaptureRXE: the kernel's CM MADs, captured between rxe (rping,
// 10.98.0.1) and this transport (rdmakit ping, 10.98.0.2) in the test VM
// (roce-cm.sh): every packet's ICRC checks, every MAD parses, the
// kernel's REQ carries what a listener needs (service ID of port 7400,
// the RDMA CM header with both addresses, the GIDs) and an engine
// listening on that port takes it.
func TestCMCaptureRXE(t *testing.T) {
	b, err := os.ReadFile("testdata/rxe-cm.pcap")
	if err != nil {
		t.Fatal(err)
	}
	addrs, pkts, err := pcapPackets(b)
	if err != nil {
		t.Fatal(err)
	}
	rxe, us := netip.MustParseAddr("10.98.0.1"), netip.MustParseAddr("10.98.0.2")
	seen := map[ibcm.AttrID]int{}
	var p header.Packet
	for i, pk := range pkts {
		if _, ok := header.CheckICRC(&addrs[i], pk); !ok {
			t.Fatalf("packet %d: ICRC", i)
		}
		if err := header.Parse(&p, pk); err != nil || p.BTH.DestQP() != header.GSIQP || p.Opcode() != header.UDSendOnly ||
			p.DETH.QKey() != header.GSIQKey || p.DETH.SrcQP() != header.GSIQP {
			t.Fatalf("packet %d: %v", i, err)
		}
		m, err := ibcm.Parse(p.Payload)
		if err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		if addrs[i].Src != rxe {
			continue
		}
		seen[m.Attr()]++
		if m.Attr() != ibcm.AttrREQ {
			continue
		}
		r := ibcm.REQ{MAD: m}
		h, err := ibcm.ParseCMAHeader(r.PrivateData())
		if port, ok := ibcm.PortOf(r.ServiceID()); !ok || port != 7400 || err != nil || h.Src() != rxe || h.Dst() != us ||
			r.LocalGID().Unmap() != rxe || r.RemoteGID().Unmap() != us || r.TransportType() != 0 || verbs.MTU(r.PathMTU()).Bytes() != 4096 {
			t.Fatalf("the kernel's REQ: service ID %#x, header %v -> %v (%v), GIDs %v -> %v, MTU %d", r.ServiceID(), h.Src(), h.Dst(), err,
				r.LocalGID(), r.RemoteGID(), r.PathMTU())
		}
		e := ibcm.New(ibcm.Config{Rand: func() uint32 { return 7 }})
		e.Listen(7400)
		from := netip.AddrPortFrom(rxe, 4791)
		if ev, err := e.Input(m, from, from, 1); err != nil || ev.Kind != ibcm.EvRequest {
			t.Fatalf("the kernel's REQ not taken: %v", err)
		}
	}
	// rping as client: REQ, RTU, DREP; as server: REP, DREQ.
	for _, a := range []ibcm.AttrID{ibcm.AttrREQ, ibcm.AttrREP, ibcm.AttrRTU, ibcm.AttrDREQ, ibcm.AttrDREP} {
		if seen[a] == 0 {
			t.Errorf("no %v from the kernel in the capture (%v)", a, seen)
		}
	}
}

// TestCMBadPackets: datagrams for QP 1 that are not CM MADs in UD
// SEND_ONLY packets with the GSI Q_Key and a good ICRC are dropped and
// counted; a well-formed MAD that the CM cannot use is counted as a CM
// error; a REQ for a port nobody listens on is rejected.
func TestCMBadPackets(t *testing.T) {
	needDevices(t)
	ctx := openTest(t)
	l, err := ListenCM(ctx, nil, 5000, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	to := LocalAddr(ctx)
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	from := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	e := ibcm.New(ibcm.Config{Rand: func() uint32 { return 3 }})
	e.Connect(&ibcm.ConnectParams{Peer: to, Port: 5001, QPN: 5, LocalGID: from.Addr(), RemoteGID: to.Addr(), LocalLID: from.Port(), MTU: 3}, 1)
	req := e.Outbox()[0].MAD
	build := func(op header.Opcode, qkey uint32, mad []byte, corrupt bool) []byte {
		buf := make([]byte, 512)
		var p header.Packet
		n := header.Build(&p, buf, op, len(mad))
		p.BTH.Encode(&header.BTHFields{Opcode: op, PKey: header.DefaultPKey, DestQP: header.GSIQP})
		if p.DETH != nil {
			p.DETH.Encode(qkey, header.GSIQP)
		}
		copy(p.Payload, mad)
		header.PutICRC(&header.Addrs{Src: from.Addr(), Dst: to.Addr(), SrcPort: from.Port(), DstPort: to.Port()}, buf[:n])
		if corrupt {
			buf[n-1] ^= 1
		}
		return buf[:n]
	}
	before, _ := Stats(ctx)
	garbage := make([]byte, ibcm.MADLen)
	for _, b := range [][]byte{
		build(header.UDSendOnly, 0x1234, req[:], false), // wrong Q_Key
		build(header.RCSendOnly, 0, req[:], false),      // not UD
		build(header.UDSendOnly, header.GSIQKey, req[:], true),
	} {
		pc.WriteToUDPAddrPort(b, to)
	}
	pc.WriteToUDPAddrPort(build(header.UDSendOnly, header.GSIQKey, garbage, false), to)
	pc.WriteToUDPAddrPort(build(header.UDSendOnly, header.GSIQKey, req[:], false), to) // port 5001: rejected
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1024)
	n, _, err := pc.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatalf("no answer to the REQ: %v", err)
	}
	var p header.Packet
	if err := header.Parse(&p, buf[:n]); err != nil {
		t.Fatal(err)
	}
	m, err := ibcm.Parse(p.Payload)
	if err != nil || m.Attr() != ibcm.AttrREJ || (ibcm.REJ{MAD: m}).Reason() != ibcm.RejInvalidServiceID || m.RemoteCommID() != req2ID(req[:]) {
		t.Fatalf("answer %v %v", m.Attr(), err)
	}
	after, _ := Stats(ctx)
	if d := after.RxUnknownQP - before.RxUnknownQP; d != 2 {
		t.Errorf("%d dropped as not for the CM, want 2", d)
	}
	if d := after.RxBadICRC - before.RxBadICRC; d != 1 {
		t.Errorf("%d bad ICRCs, want 1", d)
	}
	// The garbage MAD and the REQ reach the CM, both unusable; the REJ
	// is sent.
	if st := CMStats(ctx); st.Errors != 2 || st.Received != 2 || st.Sent != 1 {
		t.Errorf("CM counters %+v, want 2 received, 2 errors, 1 sent", st)
	}
}

func req2ID(b []byte) uint32 { return ibcm.MAD(b).LocalCommID() }

// rawCM is a hostile CM peer on a plain UDP socket: it sends MADs to to
// as GSI packets and reads the answers.
type rawCM struct {
	t    *testing.T
	pc   *net.UDPConn
	from netip.AddrPort
	to   netip.AddrPort
}

func newRawCM(t *testing.T, to netip.AddrPort) *rawCM {
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	from := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	return &rawCM{t: t, pc: pc, from: netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), to: to}
}

// req is a REQ for port from this peer, addressed to GID gid.
func (x *rawCM) req(port uint16, gid netip.Addr) [ibcm.MADLen]byte {
	e := ibcm.New(ibcm.Config{Rand: func() uint32 { return 5 }})
	e.Connect(&ibcm.ConnectParams{Peer: x.to, Port: port, QPN: 5, LocalGID: x.from.Addr(), RemoteGID: gid, LocalLID: x.from.Port(), MTU: 3}, 1)
	return e.Outbox()[0].MAD
}

func (x *rawCM) send(mad []byte) {
	buf := make([]byte, 512)
	var p header.Packet
	n := header.Build(&p, buf, header.UDSendOnly, len(mad))
	p.BTH.Encode(&header.BTHFields{Opcode: header.UDSendOnly, PKey: header.DefaultPKey, DestQP: header.GSIQP})
	p.DETH.Encode(header.GSIQKey, header.GSIQP)
	copy(p.Payload, mad)
	header.PutICRC(&header.Addrs{Src: x.from.Addr(), Dst: x.to.Addr(), SrcPort: x.from.Port(), DstPort: x.to.Port()}, buf[:n])
	x.pc.WriteToUDPAddrPort(buf[:n], x.to)
}

func (x *rawCM) recv() ibcm.MAD {
	x.t.Helper()
	x.pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1024)
	n, _, err := x.pc.ReadFromUDPAddrPort(buf)
	if err != nil {
		x.t.Fatalf("no answer: %v", err)
	}
	var p header.Packet
	if err := header.Parse(&p, buf[:n]); err != nil {
		x.t.Fatal(err)
	}
	m, err := ibcm.Parse(p.Payload)
	if err != nil {
		x.t.Fatal(err)
	}
	return m
}

// A requester that disconnects (DREQ) while its request waits in the
// listener's queue: Accept fails, and leaves neither a watch the engine
// will never end nor the QP connected.
func TestCMAcceptClosedRequest(t *testing.T) {
	needDevices(t)
	ctx := openTest(t)
	l, err := ListenCM(ctx, nil, 5002, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	x := newRawCM(t, LocalAddr(ctx))
	req := x.req(5002, x.to.Addr())
	// The REQ twice: the second is answered with an MRA, which names the
	// listener's comm ID for the request.
	x.send(req[:])
	x.send(req[:])
	m := x.recv()
	if m.Attr() != ibcm.AttrMRA {
		t.Fatalf("duplicate REQ answered with %v", m.Attr())
	}
	var d [ibcm.MADLen]byte
	dreq := ibcm.MAD(d[:])
	dreq.Init(ibcm.AttrDREQ, 77)
	dreq.SetCommIDs(req2ID(req[:]), m.LocalCommID())
	x.send(d[:])
	if m := x.recv(); m.Attr() != ibcm.AttrDREP {
		t.Fatalf("DREQ answered with %v", m.Attr())
	}
	s := newSide(t, ctx, 4096)
	actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := l.Accept(actx, s.qp); err == nil {
		t.Fatal("accepted a request its requester had closed")
	}
	g := ctxOf(ctx).ep.cm.Load()
	g.mu.Lock()
	n := len(g.waiters)
	g.mu.Unlock()
	if n != 0 {
		t.Errorf("%d watches left after the failed Accept", n)
	}
	if st := s.qp.State(); st != verbs.QPError && st != verbs.QPInit {
		t.Errorf("QP left in %v", st)
	}
}

// A request for another GID is rejected, and Accept goes on waiting for
// the next one: a stray request does not end a server.
func TestCMAcceptStrayRequest(t *testing.T) {
	needDevices(t)
	ctx := openTest(t)
	l, err := ListenCM(ctx, nil, 5003, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	x := newRawCM(t, LocalAddr(ctx))
	req := x.req(5003, netip.MustParseAddr("192.0.2.7"))
	x.send(req[:])
	s := newSide(t, ctx, 4096)
	actx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(actx, s.qp); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept after a stray request: %v, want it to wait on (deadline exceeded)", err)
	}
	if m := x.recv(); m.Attr() != ibcm.AttrREJ || (ibcm.REJ{MAD: m}).Reason() != ibcm.RejInvalidGID {
		t.Fatalf("stray request answered with %v", m.Attr())
	}
	if st := s.qp.State(); st != verbs.QPInit {
		t.Errorf("QP left in %v", st)
	}
}
