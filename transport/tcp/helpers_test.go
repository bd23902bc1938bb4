package tcp

import (
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/verbs"
)

// end is one side of a test connection.
type end struct {
	t   testing.TB
	ctx *verbs.Context
	pd  *verbs.PD
	scq *verbs.CQ
	rcq *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	psn uint32
	wcs []verbs.WorkCompletion
}

type opts struct {
	sendWR   int
	recvWR   int
	cqSize   int
	mrSize   int
	timeout  uint8
	retry    uint8
	rnrRetry uint8
	minRNR   uint8
	access   verbs.Access // B's QP access flags (0: all remote)
	sameCtx  bool
}

func (o opts) withDefaults() opts {
	if o.sendWR == 0 {
		o.sendWR = 256
	}
	if o.recvWR == 0 {
		o.recvWR = 64
	}
	if o.cqSize == 0 {
		o.cqSize = 1024
	}
	if o.mrSize == 0 {
		o.mrSize = 4 << 20
	}
	if o.timeout == 0 {
		o.timeout = 14
	}
	if o.retry == 0 {
		o.retry = 7
	}
	if o.rnrRetry == 0 {
		o.rnrRetry = 7
	}
	if o.minRNR == 0 {
		o.minRNR = 1
	}
	return o
}

func openCtx(t testing.TB) *verbs.Context {
	t.Helper()
	ctx, err := verbs.Open(deviceName, verbs.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

func newEnd(t testing.TB, ctx *verbs.Context, o opts, access verbs.Access) *end {
	t.Helper()
	e := &end{t: t, ctx: ctx, psn: verbs.RandomPSN(), wcs: make([]verbs.WorkCompletion, 64)}
	var err error
	if e.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = ctx.CreateCQ(o.cqSize); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = ctx.CreateCQ(o.cqSize); err != nil {
		t.Fatal(err)
	}
	if e.qp, err = e.pd.CreateQP(verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, Cap: verbs.QPCap{
		MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}}); err != nil {
		t.Fatal(err)
	}
	if e.mr, err = e.pd.AllocMR(o.mrSize, verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	if access == 0 {
		access = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: access, Port: 1}); err != nil {
		t.Fatal(err)
	}
	return e
}

// toRTR moves e to RTR towards a QP with address addr and number qpn whose
// first PSN is psn.
func (e *end) toRTR(addr []byte, qpn, psn uint32, o opts) {
	e.t.Helper()
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: verbs.MTU4096, DestQPN: qpn, RQPSN: psn,
		AH: verbs.AddressHandle{Dest: addr}, MinRNRTimer: o.minRNR, MaxDestRdAtomic: 16}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *end) toRTS(o opts) {
	e.t.Helper()
	if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: e.psn, Timeout: o.timeout, RetryCount: o.retry,
		RNRRetry: o.rnrRetry, MaxRdAtomic: 16}); err != nil {
		e.t.Fatal(err)
	}
}

// connect brings a fully up, then b, as one goroutine doing both would.
func connect(a, b *end, o opts) {
	a.toRTR(b.qp.Address(), b.qp.Num(), b.psn, o)
	a.toRTS(o)
	b.toRTR(a.qp.Address(), a.qp.Num(), a.psn, o)
	b.toRTS(o)
}

// newPair creates two connected QPs, in two contexts unless o.sameCtx.
func newPair(t testing.TB, o opts) (a, b *end) {
	t.Helper()
	o = o.withDefaults()
	ca := openCtx(t)
	cb := ca
	if !o.sameCtx {
		cb = openCtx(t)
	}
	a = newEnd(t, ca, o, 0)
	b = newEnd(t, cb, o, o.access)
	connect(a, b, o)
	return a, b
}

func (e *end) post(wrs ...verbs.SendWR) {
	e.t.Helper()
	if err := e.qp.PostSend(wrs); err != nil {
		e.t.Fatal(err)
	}
}

func (e *end) postRecv(id uint64, sgl ...verbs.SGE) {
	e.t.Helper()
	if err := e.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: sgl}}); err != nil {
		e.t.Fatal(err)
	}
}

// waitCQ returns n completions of cq, failing after timeout.
func (e *end) waitCQ(cq *verbs.CQ, n int, timeout time.Duration) []verbs.WorkCompletion {
	e.t.Helper()
	var got []verbs.WorkCompletion
	deadline := time.Now().Add(timeout)
	for spins := 0; len(got) < n; spins++ {
		k, err := cq.Poll(e.wcs[:min(len(e.wcs), n-len(got))])
		if err != nil {
			e.t.Fatalf("poll: %v (after %d of %d completions)", err, len(got), n)
		}
		got = append(got, e.wcs[:k]...)
		if k == 0 {
			if time.Now().After(deadline) {
				e.t.Fatalf("%d of %d completions after %v: %+v", len(got), n, timeout, got)
			}
			if spins > 1000 {
				time.Sleep(50 * time.Microsecond)
			} else {
				runtime.Gosched()
			}
		}
	}
	return got
}

func (e *end) sends(n int) []verbs.WorkCompletion {
	e.t.Helper()
	return e.waitCQ(e.scq, n, 20*time.Second)
}
func (e *end) recvs(n int) []verbs.WorkCompletion {
	e.t.Helper()
	return e.waitCQ(e.rcq, n, 20*time.Second)
}

// noCompletion checks that cq stays empty for d.
func (e *end) noCompletion(cq *verbs.CQ, d time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if k, _ := cq.Poll(e.wcs[:1]); k > 0 {
			e.t.Fatalf("unexpected completion %+v", e.wcs[0])
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func (e *end) waitState(s verbs.QPState, timeout time.Duration) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for e.qp.State() != s {
		if time.Now().After(deadline) {
			e.t.Fatalf("QP state %s, want %s", e.qp.State(), s)
		}
		time.Sleep(time.Millisecond)
	}
}

func expect(t testing.TB, wc verbs.WorkCompletion, st verbs.Status) {
	t.Helper()
	if wc.Status != st {
		t.Fatalf("wr %d: %q, want %q (%+v)", wc.WRID, wc.Status, st, wc)
	}
}

// pattern fills b with a sequence derived from seed (8 bytes at a time,
// fast enough for 64 MiB under the race detector).
func pattern(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < len(b); i++ {
		b[i] = byte(x >> (8 * (i & 7)))
	}
}

// fakePeer is a hand-driven peer speaking the wire protocol, for tests of
// silent, slow and misbehaving peers.
type fakePeer struct {
	t     testing.TB
	ln    net.Listener
	qpn   uint32
	nonce uint64
}

// newFakePeer listens on loopback; with a maximal nonce the real QP dials
// it, with nonce 0 the real QP waits to be dialed.
func newFakePeer(t testing.TB, nonce uint64) *fakePeer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &fakePeer{t: t, ln: ln, qpn: 0x123456, nonce: nonce}
}

func (f *fakePeer) address() []byte {
	ta := f.ln.Addr().(*net.TCPAddr)
	a := qpAddr{ip: ta.IP, port: uint16(ta.Port), qpn: f.qpn, nonce: f.nonce}
	return a.encode()
}

// acceptFrom accepts the real QP's connection and answers its hello.
func (f *fakePeer) acceptFrom(e *end) net.Conn {
	f.t.Helper()
	c, err := f.ln.Accept()
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	var b [helloLen]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		f.t.Fatal(err)
	}
	h, err := parseHello(b[:])
	if err != nil || h.kind != helloConnect || h.dstQPN != f.qpn || h.dstNonce != f.nonce || h.srcQPN != e.qp.Num() {
		f.t.Fatalf("hello %+v, %v", h, err)
	}
	a := hello{kind: helloAccept, dstQPN: h.srcQPN, srcQPN: f.qpn, dstNonce: h.srcNonce, srcNonce: f.nonce}
	a.encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		f.t.Fatal(err)
	}
	return c
}

// dialTo connects to the real QP e as its peer.
func (f *fakePeer) dialTo(e *end) net.Conn {
	f.t.Helper()
	ea, err := decodeAddr(e.qp.Address())
	if err != nil {
		f.t.Fatal(err)
	}
	c, err := net.Dial("tcp", (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(ea.port)}).String())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { c.Close() })
	var b [helloLen]byte
	h := hello{kind: helloConnect, dstQPN: ea.qpn, srcQPN: f.qpn, dstNonce: ea.nonce, srcNonce: f.nonce}
	h.encode(b[:])
	if _, err := c.Write(b[:]); err != nil {
		f.t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, b[:]); err != nil {
		f.t.Fatal(err)
	}
	c.SetReadDeadline(time.Time{})
	a, err := parseHello(b[:])
	if err != nil || a.kind != helloAccept || a.srcQPN != ea.qpn {
		f.t.Fatalf("accept %+v, %v", a, err)
	}
	return c
}

// connectReal moves e to RTS towards the fake peer.
func (f *fakePeer) connectReal(e *end, o opts) {
	e.toRTR(f.address(), f.qpn, 1000, o)
	e.toRTS(o)
}

// driverOf returns the transport state of qp.
func driverOf(t testing.TB, qp *verbs.QP) *qpDriver {
	t.Helper()
	cd := qp.Context().Driver().(*soft.Context).Transport().(*ctxDriver)
	cd.mu.Lock()
	defer cd.mu.Unlock()
	d := cd.qps[qp.Num()]
	if d == nil {
		t.Fatal("QP not in its context's table")
	}
	return d
}

// linkConn returns the connection of qp's link once it is up.
func linkConn(t testing.TB, qp *verbs.QP) *net.TCPConn {
	t.Helper()
	d := driverOf(t, qp)
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		if l := d.link; l != nil && l.up && l.conn != nil {
			c := l.conn
			d.mu.Unlock()
			return c
		}
		d.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("link never came up")
		}
		time.Sleep(time.Millisecond)
	}
}
