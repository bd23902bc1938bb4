package tcp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/conformance"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

func TestMain(m *testing.M) {
	conformance.ServePeerIfChild()
	goleak.VerifyTestMain(m)
}

// TestConformance runs the suite every transport must pass, in one process
// and across two.
func TestConformance(t *testing.T) { conformance.Run(t, "tcp0") }

var sizes = []int{0, 1, 7, 63, 4095, 4097, 65537, 1<<20 + 3}

func sgl(mr *verbs.MR, off, n int) []verbs.SGE {
	if n == 0 {
		return nil
	}
	return []verbs.SGE{mr.SGE(off, n)}
}

func TestDeviceInfo(t *testing.T) {
	devs, err := verbs.Devices()
	if err != nil {
		t.Fatal(err)
	}
	var info *verbs.DeviceInfo
	for i := range devs {
		if devs[i].Name == deviceName {
			info = &devs[i]
		}
	}
	if info == nil {
		t.Fatalf("no %s in %+v", deviceName, devs)
	}
	if info.Transport != "tcp" || info.NodeType != "Software" || info.AtomicCap != verbs.AtomicHCA ||
		info.MaxMRSize != 1<<40 || info.MaxCQE != 1<<20 || info.MaxQPWR != verbs.MaxQPWR || info.MaxMsgSize != verbs.MaxMsgSize {
		t.Fatalf("device info %+v", info)
	}
	if len(info.Ports) != 1 || info.Ports[0].State != verbs.PortActive || info.Ports[0].LinkLayer != "TCP" || len(info.Ports[0].Addrs) != 1 {
		t.Fatalf("ports %+v", info.Ports)
	}
	ctx := openCtx(t)
	if a, ok := ListenAddr(ctx).(*net.TCPAddr); !ok || a.Port == 0 {
		t.Fatalf("listen address %v", ListenAddr(ctx))
	}
	pd, _ := ctx.AllocPD()
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, verbs.AccessAll)
	if err != nil {
		t.Fatalf("RegMR of caller memory: %v", err)
	}
	mr.Dereg()
}

func TestAddressEncoding(t *testing.T) {
	ctx := openCtx(t)
	e := newEnd(t, ctx, opts{}.withDefaults(), 0)
	addr := e.qp.Address()
	a, err := decodeAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	if len(addr) != addrLen || a.qpn != e.qp.Num() || int(a.port) != ListenAddr(ctx).(*net.TCPAddr).Port || a.nonce == 0 {
		t.Fatalf("address %x decodes to %+v", addr, a)
	}
	if !a.ip.IsUnspecified() {
		t.Fatalf("listening on every interface, address IP is %v", a.ip)
	}
	if ip, err := dialIP(a, nil); err != nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("dial IP without GID %v, %v", ip, err)
	}
	if ip, err := dialIP(a, net.IPv4(10, 1, 2, 3)); err != nil || !ip.Equal(net.IPv4(10, 1, 2, 3)) {
		t.Fatalf("dial IP with GID %v, %v", ip, err)
	}
	a.ip = net.IPv4(192, 0, 2, 1)
	if ip, err := dialIP(a, nil); err != nil || !ip.Equal(a.ip) {
		t.Fatalf("dial IP with listen IP %v, %v", ip, err)
	}
	if ip, err := dialIP(a, net.IPv4(192, 0, 2, 1)); err != nil || !ip.Equal(a.ip) {
		t.Fatalf("dial IP with listen IP = GID %v, %v", ip, err)
	}
	// A third address: the request names 192.0.2.1, the handshake came
	// from 10.1.2.3. Never dialled.
	if ip, err := dialIP(a, net.IPv4(10, 1, 2, 3)); err == nil {
		t.Fatalf("dial IP of a third address %v accepted", ip)
	}
	for _, bad := range [][]byte{nil, addr[:31], append(addr, 0), {2, 0, 1, 1}} {
		if _, err := decodeAddr(bad); err == nil {
			t.Fatalf("decodeAddr(%x) succeeded", bad)
		}
	}
	// Connecting with a malformed address fails and leaves the QP in INIT.
	err = e.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: 5, AH: verbs.AddressHandle{Dest: []byte{1, 2, 3}}})
	if !errors.Is(err, verbs.ErrInvalidArgument) || e.qp.State() != verbs.QPInit {
		t.Fatalf("RTR with a bad address: %v, state %s", err, e.qp.State())
	}
	err = e.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: e.qp.Num(), AH: verbs.AddressHandle{Dest: addr}})
	if !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("connecting a QP to itself: %v", err)
	}
}

func TestWriteReadSizes(t *testing.T) {
	a, b := newPair(t, opts{})
	for i, n := range sizes {
		src := a.mr.Bytes()
		pattern(src[:n], uint64(i))
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n),
			RemoteAddr: b.mr.Addr() + 3, RKey: b.mr.RKey()})
		wc := a.sends(1)[0]
		expect(t, wc, verbs.StatusSuccess)
		if wc.Opcode != verbs.WCWrite || wc.WRID != uint64(i) || wc.ByteLen != uint32(n) {
			t.Fatalf("write completion %+v", wc)
		}
		if !bytes.Equal(b.mr.Bytes()[3:3+n], src[:n]) {
			t.Fatalf("write of %d bytes: target differs", n)
		}

		pattern(b.mr.Bytes()[5:5+n], uint64(i)+100)
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 1, n),
			RemoteAddr: b.mr.Addr() + 5, RKey: b.mr.RKey()})
		wc = a.sends(1)[0]
		expect(t, wc, verbs.StatusSuccess)
		if wc.Opcode != verbs.WCRead || wc.ByteLen != uint32(n) {
			t.Fatalf("read completion %+v", wc)
		}
		if !bytes.Equal(src[1:1+n], b.mr.Bytes()[5:5+n]) {
			t.Fatalf("read of %d bytes: data differs", n)
		}
	}
}

func TestSendSizes(t *testing.T) {
	a, b := newPair(t, opts{})
	for i, n := range sizes {
		for _, imm := range []bool{false, true} {
			b.postRecv(uint64(100+i), b.mr.SGE(9, n+16))
			pattern(a.mr.Bytes()[2:2+n], uint64(i))
			op := verbs.OpSend
			if imm {
				op = verbs.OpSendWithImm
			}
			a.post(verbs.SendWR{ID: uint64(i), Opcode: op, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 2, n), Imm: 0xabc0 + uint32(i)})
			wc := a.sends(1)[0]
			expect(t, wc, verbs.StatusSuccess)
			if wc.Opcode != verbs.WCSend {
				t.Fatalf("send completion %+v", wc)
			}
			r := b.recvs(1)[0]
			expect(t, r, verbs.StatusSuccess)
			if r.WRID != uint64(100+i) || r.Opcode != verbs.WCRecv || r.ByteLen != uint32(n) || r.QPNum != b.qp.Num() || r.SrcQP != a.qp.Num() {
				t.Fatalf("receive completion %+v for %d bytes", r, n)
			}
			if imm != (r.Flags&verbs.WCWithImm != 0) || (imm && r.Imm != 0xabc0+uint32(i)) {
				t.Fatalf("receive completion %+v: immediate (want %v)", r, imm)
			}
			if !bytes.Equal(a.mr.Bytes()[2:2+n], b.mr.Bytes()[9:9+n]) {
				t.Fatalf("send of %d bytes: data differs", n)
			}
		}
	}
}

func TestWriteWithImm(t *testing.T) {
	a, b := newPair(t, opts{})
	for i, n := range []int{0, 1, 4096, 100003} {
		b.postRecv(uint64(i), b.mr.SGE(0, 16))
		pattern(a.mr.Bytes()[:n], uint64(i))
		a.post(verbs.SendWR{ID: 7, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n), Imm: uint32(i) + 77,
			RemoteAddr: b.mr.Addr() + 8192, RKey: b.mr.RKey()})
		expect(t, a.sends(1)[0], verbs.StatusSuccess)
		r := b.recvs(1)[0]
		if r.Status != 0 || r.Opcode != verbs.WCRecvWriteWithImm || r.ByteLen != uint32(n) || r.Flags&verbs.WCWithImm == 0 ||
			r.Imm != uint32(i)+77 || r.WRID != uint64(i) || r.SrcQP != a.qp.Num() {
			t.Fatalf("write-with-imm receive completion %+v (want %d bytes)", r, n)
		}
		if !bytes.Equal(a.mr.Bytes()[:n], b.mr.Bytes()[8192:8192+n]) {
			t.Fatalf("write-with-imm of %d bytes: data differs", n)
		}
	}
}

func TestAtomics(t *testing.T) {
	a, b := newPair(t, opts{})
	word := b.mr.Bytes()[4096:]
	binary.LittleEndian.PutUint64(word, 1000)
	res := a.mr.Bytes()[64:72]
	faa := func(add uint64) {
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 64, 8),
			RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: add})
	}
	cas := func(cmp, swap uint64) {
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpCompareAndSwap, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 64, 8),
			RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: cmp, Swap: swap})
	}
	faa(5)
	wc := a.sends(1)[0]
	if wc.Status != 0 || wc.Opcode != verbs.WCFetchAndAdd || binary.LittleEndian.Uint64(res) != 1000 || binary.LittleEndian.Uint64(word) != 1005 {
		t.Fatalf("FAA: %+v, got %d, word %d", wc, binary.LittleEndian.Uint64(res), binary.LittleEndian.Uint64(word))
	}
	cas(1000, 99) // fails: the word is 1005
	wc = a.sends(1)[0]
	if wc.Status != 0 || wc.Opcode != verbs.WCCompareAndSwap || binary.LittleEndian.Uint64(res) != 1005 || binary.LittleEndian.Uint64(word) != 1005 {
		t.Fatalf("failing CAS: %+v, got %d, word %d", wc, binary.LittleEndian.Uint64(res), binary.LittleEndian.Uint64(word))
	}
	cas(1005, 99)
	wc = a.sends(1)[0]
	if wc.Status != 0 || binary.LittleEndian.Uint64(res) != 1005 || binary.LittleEndian.Uint64(word) != 99 {
		t.Fatalf("CAS: %+v, got %d, word %d", wc, binary.LittleEndian.Uint64(res), binary.LittleEndian.Uint64(word))
	}
	// Many pipelined adds, each returning a distinct prior value.
	const k = 100
	var wrs []verbs.SendWR
	for i := 0; i < k; i++ {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled,
			SGL: sgl(a.mr, 128+8*i, 8), RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey(), CompareAdd: 1})
	}
	a.post(wrs...)
	for i, wc := range a.sends(k) {
		if wc.Status != 0 || wc.WRID != uint64(i) || binary.LittleEndian.Uint64(a.mr.Bytes()[128+8*i:]) != 99+uint64(i) {
			t.Fatalf("pipelined FAA %d: %+v, got %d", i, wc, binary.LittleEndian.Uint64(a.mr.Bytes()[128+8*i:]))
		}
	}
	if v := binary.LittleEndian.Uint64(word); v != 99+k {
		t.Fatalf("word %d after %d adds, want %d", v, k, 99+k)
	}
}

func TestLarge(t *testing.T) {
	const n = 64 << 20
	a, b := newPair(t, opts{mrSize: n + 4096})
	pattern(a.mr.Bytes()[:n], 1)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n), RemoteAddr: b.mr.Addr() + 1, RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(a.mr.Bytes()[:n], b.mr.Bytes()[1:n+1]) {
		t.Fatal("64 MiB write: data differs")
	}
	pattern(b.mr.Bytes()[:n], 2)
	a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(a.mr.Bytes()[:n], b.mr.Bytes()[:n]) {
		t.Fatal("64 MiB read: data differs")
	}
	pattern(a.mr.Bytes()[:n], 3)
	b.postRecv(3, b.mr.SGE(0, n))
	a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n)})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.Status != 0 || r.ByteLen != n {
		t.Fatalf("receive %+v", r)
	}
	if !bytes.Equal(a.mr.Bytes()[:n], b.mr.Bytes()[:n]) {
		t.Fatal("64 MiB send: data differs")
	}
}

func TestMultiSGE(t *testing.T) {
	a, b := newPair(t, opts{})
	gl := []int{3, 100, 4093, 1, 65536}
	var sges []verbs.SGE
	off, total := 7, 0
	for _, n := range gl {
		sges = append(sges, a.mr.SGE(off, n))
		off += n
		total += n
	}
	pattern(a.mr.Bytes()[7:7+total], 9)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sges, RemoteAddr: b.mr.Addr() + 11, RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(a.mr.Bytes()[7:7+total], b.mr.Bytes()[11:11+total]) {
		t.Fatal("multi-SGE write: data differs")
	}

	// Send gathered from five SGEs, scattered into four.
	b.postRecv(5, b.mr.SGE(100000, 10), b.mr.SGE(100010, 5), b.mr.SGE(100015, 2000), b.mr.SGE(100015+2000, 70000))
	a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sges})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.Status != 0 || r.ByteLen != uint32(total) {
		t.Fatalf("receive %+v", r)
	}
	if !bytes.Equal(a.mr.Bytes()[7:7+total], b.mr.Bytes()[100000:100000+total]) {
		t.Fatal("multi-SGE send: data differs")
	}

	// Read scattered into five SGEs, one of them in caller memory. The
	// caller memory is checked by writing it on into the target's arena:
	// the race detector cannot see a completion order the memory it is
	// about (CQs live in the arena, see the package tests' notes).
	pattern(b.mr.Bytes()[:total], 10)
	ext := make([]byte, 4093)
	emr, err := a.pd.RegMR(ext, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rs := append([]verbs.SGE(nil), sges...)
	rs[2] = emr.SGE(0, 4093)
	a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: rs, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	a.post(verbs.SendWR{ID: 4, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: rs, RemoteAddr: b.mr.Addr() + 1<<20, RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(b.mr.Bytes()[:total], b.mr.Bytes()[1<<20:1<<20+total]) {
		t.Fatal("multi-SGE read: data differs")
	}
}

// Caller memory (RegMR) is a valid target. It is checked by reading it
// back into arena memory rather than directly: the race detector does not
// see that a completion orders the memory written by the transport's
// goroutine before the application's read (CQ rings live in mmap'd memory,
// whose atomics it does not track).
func TestRegMRTarget(t *testing.T) {
	a, b := newPair(t, opts{})
	buf := make([]byte, 10000)
	mr, err := b.pd.RegMR(buf, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	pattern(a.mr.Bytes()[:10000], 4)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10000), RemoteAddr: mr.Addr(), RKey: mr.RKey()},
		verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 20000, 10000), RemoteAddr: mr.Addr(), RKey: mr.RKey()})
	for _, wc := range a.sends(2) {
		expect(t, wc, verbs.StatusSuccess)
	}
	if !bytes.Equal(a.mr.Bytes()[20000:30000], a.mr.Bytes()[:10000]) {
		t.Fatal("write into registered caller memory: data differs")
	}
}

func TestOrderingAndUnsignaled(t *testing.T) {
	a, b := newPair(t, opts{sendWR: 512})
	const k = 300
	var wrs []verbs.SendWR
	for i := 0; i < k; i++ {
		binary.LittleEndian.PutUint64(a.mr.Bytes()[8*i:], uint64(i)+1000)
		f := verbs.SendFlags(0)
		if i%3 == 0 {
			f = verbs.SendSignaled
		}
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: f, SGL: sgl(a.mr, 8*i, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	}
	wrs = append(wrs, verbs.SendWR{ID: k, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 8*k, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.post(wrs...)
	last := -1
	for _, wc := range a.sends(k/3 + 1) {
		expect(t, wc, verbs.StatusSuccess)
		if int(wc.WRID) <= last {
			t.Fatalf("completion for %d after %d", wc.WRID, last)
		}
		last = int(wc.WRID)
	}
	if got := binary.LittleEndian.Uint64(a.mr.Bytes()[8*k:]); got != k-1+1000 {
		t.Fatalf("read after %d writes saw %d", k, got)
	}
}

func TestSameContext(t *testing.T) {
	a, b := newPair(t, opts{sameCtx: true})
	pattern(a.mr.Bytes()[:100], 5)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 100), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	b.post(verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(b.mr, 200, 100), RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()})
	expect(t, b.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(b.mr.Bytes()[200:300], a.mr.Bytes()[:100]) {
		t.Fatal("data differs")
	}
}

// Work requests posted before the peer reaches RTR wait for the connection.
func TestPostBeforeConnected(t *testing.T) {
	o := opts{}.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	b := newEnd(t, openCtx(t), o, 0)
	a.toRTR(b.qp.Address(), b.qp.Num(), b.psn, o)
	a.toRTS(o)
	pattern(a.mr.Bytes()[:64], 6)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 64), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	time.Sleep(20 * time.Millisecond)
	b.toRTR(a.qp.Address(), a.qp.Num(), a.psn, o)
	b.toRTS(o)
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(b.mr.Bytes()[:64], a.mr.Bytes()[:64]) {
		t.Fatal("data differs")
	}
}

func TestRNRThenReceive(t *testing.T) {
	a, b := newPair(t, opts{rnrRetry: 7, minRNR: 1})
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSendWithImm, Imm: 5, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)},
		verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10), RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey()},
		verbs.SendWR{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 20)})
	a.noCompletion(a.scq, 30*time.Millisecond)
	b.postRecv(9, b.mr.SGE(0, 64))
	wcs := a.sends(2)
	expect(t, wcs[0], verbs.StatusSuccess)
	expect(t, wcs[1], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.WRID != 9 || r.Imm != 5 || r.ByteLen != 10 || r.Flags&verbs.WCWithImm == 0 {
		t.Fatalf("receive %+v", r)
	}
	a.noCompletion(a.scq, 10*time.Millisecond)
	b.postRecv(10, b.mr.SGE(0, 64))
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.WRID != 10 || r.ByteLen != 20 || r.Flags&verbs.WCWithImm != 0 {
		t.Fatalf("receive %+v", r)
	}
}

func TestRNRRetryExceeded(t *testing.T) {
	for _, retries := range []uint8{1, 3} {
		t.Run(fmt.Sprint(retries), func(t *testing.T) {
			o := opts{rnrRetry: retries, minRNR: 1}
			a, b := newPair(t, o)
			// rnrRetry 0 is spelled 1 here: withDefaults maps 0 to 7.
			a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)},
				verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
			wcs := a.sends(2)
			expect(t, wcs[0], verbs.StatusRNRRetryExceeded)
			expect(t, wcs[1], verbs.StatusWRFlush)
			if s := a.qp.State(); s != verbs.QPError {
				t.Fatalf("QP %s after RNR retry exceeded", s)
			}
			// The write behind the send never reached the target.
			if !bytes.Equal(b.mr.Bytes()[:10], make([]byte, 10)) {
				t.Fatal("write after the failed send was executed")
			}
		})
	}
}

// A write-with-immediate without a receive is not executed until one is
// posted.
func TestRNRWriteWithImm(t *testing.T) {
	a, b := newPair(t, opts{minRNR: 1})
	pattern(a.mr.Bytes()[:32], 8)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWriteWithImm, Imm: 1, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 32), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.noCompletion(a.scq, 20*time.Millisecond)
	if !bytes.Equal(b.mr.Bytes()[:32], make([]byte, 32)) {
		t.Fatal("write-with-imm executed without a receive")
	}
	b.postRecv(1)
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.Opcode != verbs.WCRecvWriteWithImm || r.ByteLen != 32 {
		t.Fatalf("receive %+v", r)
	}
	if !bytes.Equal(b.mr.Bytes()[:32], a.mr.Bytes()[:32]) {
		t.Fatal("data differs")
	}
}

func TestRemoteAccess(t *testing.T) {
	type bad struct {
		name  string
		wr    func(b *end, ro, wo *verbs.MR) verbs.SendWR
		qpAcc verbs.Access
	}
	bads := []bad{
		{"wrong-rkey", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey() ^ 0x5a5a5a5a}
		}, 0},
		{"lkey-as-rkey", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: b.mr.Addr(), RKey: b.mr.LKey()}
		}, 0},
		{"write-without-REMOTE_WRITE", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: ro.Addr(), RKey: ro.RKey()}
		}, 0},
		{"read-without-REMOTE_READ", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpRead, RemoteAddr: wo.Addr(), RKey: wo.RKey()}
		}, 0},
		{"atomic-without-REMOTE_ATOMIC", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpFetchAndAdd, RemoteAddr: wo.Addr(), RKey: wo.RKey(), CompareAdd: 1}
		}, 0},
		{"write-past-end", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: wo.Addr() + 4096 - 15, RKey: wo.RKey()}
		}, 0},
		{"read-past-end", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpRead, RemoteAddr: ro.Addr() + 4095, RKey: ro.RKey()}
		}, 0},
		{"write-before-start", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: wo.Addr() - 8, RKey: wo.RKey()}
		}, 0},
		{"qp-without-remote-write", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWrite, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
		}, verbs.AccessRemoteRead},
		{"write-with-imm-wrong-rkey", func(b *end, ro, wo *verbs.MR) verbs.SendWR {
			return verbs.SendWR{Opcode: verbs.OpWriteWithImm, RemoteAddr: b.mr.Addr(), RKey: 1}
		}, 0},
	}
	for _, c := range bads {
		t.Run(c.name, func(t *testing.T) {
			a, b := newPair(t, opts{access: c.qpAcc, mrSize: 1 << 20})
			ro, err := b.pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
			if err != nil {
				t.Fatal(err)
			}
			wo, err := b.pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			b.postRecv(1, b.mr.SGE(0, 64))
			pattern(ro.Bytes(), 1)
			pattern(wo.Bytes(), 2)
			pattern(b.mr.Bytes()[:8192], 3)
			snap := func() []byte {
				return append(append(append([]byte(nil), ro.Bytes()...), wo.Bytes()...), b.mr.Bytes()[:8192]...)
			}
			before := snap()
			for i := range a.mr.Bytes()[:64] {
				a.mr.Bytes()[i] = 0xee
			}
			w := c.wr(b, ro, wo)
			w.ID, w.Flags = 1, verbs.SendSignaled
			w.SGL = sgl(a.mr, 0, 16)
			if w.Opcode.IsAtomic() {
				w.SGL = sgl(a.mr, 0, 8)
			}
			good := verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr() + 1<<19, RKey: b.mr.RKey()}
			a.post(w, good)
			wcs := a.sends(2)
			expect(t, wcs[0], verbs.StatusRemoteAccess)
			expect(t, wcs[1], verbs.StatusWRFlush)
			if s := a.qp.State(); s != verbs.QPError {
				t.Fatalf("requester QP is %s, want ERROR", s)
			}
			if !bytes.Equal(before, snap()) {
				t.Fatal("target memory changed by a refused operation")
			}
			if !bytes.Equal(b.mr.Bytes()[1<<19:1<<19+8], make([]byte, 8)) {
				t.Fatal("the work request after the refused one was executed")
			}
			a.post(good)
			expect(t, a.sends(1)[0], verbs.StatusWRFlush)
			// The responder NAKed: its QP went to ERROR, as the IBTA
			// requires, and the receive was flushed, not consumed.
			r := b.recvs(1)
			expect(t, r[0], verbs.StatusWRFlush)
			if s := b.qp.State(); s != verbs.QPError {
				t.Fatalf("responder QP is %s after a fatal NAK, want ERROR", s)
			}
		})
	}
}

func TestLocalLength(t *testing.T) {
	a, b := newPair(t, opts{})
	b.postRecv(1, b.mr.SGE(0, 10))
	b.postRecv(2, b.mr.SGE(64, 1000))
	pattern(b.mr.Bytes()[:64], 1)
	before := append([]byte(nil), b.mr.Bytes()[:64]...)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 100)},
		verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)})
	wcs := a.sends(2)
	expect(t, wcs[0], verbs.StatusRemoteInvalidReq)
	expect(t, wcs[1], verbs.StatusWRFlush)
	r := b.recvs(2)
	expect(t, r[0], verbs.StatusLocalLength)
	expect(t, r[1], verbs.StatusWRFlush)
	if r[0].WRID != 1 || r[1].WRID != 2 {
		t.Fatalf("receive completions %+v", r)
	}
	b.waitState(verbs.QPError, 2*time.Second)
	if !bytes.Equal(before, b.mr.Bytes()[:64]) {
		t.Fatal("receive buffer written by a message too long for it")
	}
}

func TestRecvLocalProtection(t *testing.T) {
	a, b := newPair(t, opts{})
	b.postRecv(1, verbs.SGE{Addr: b.mr.Addr(), Length: 64, LKey: 0x1234567})
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)})
	expect(t, a.sends(1)[0], verbs.StatusRemoteOperation)
	expect(t, b.recvs(1)[0], verbs.StatusLocalProtection)
	b.waitState(verbs.QPError, 2*time.Second)
}

func TestLocalProtectionPreset(t *testing.T) {
	a, b := newPair(t, opts{})
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 8, LKey: 0x7654321}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr() + 64, RKey: b.mr.RKey()})
	wcs := a.sends(3)
	expect(t, wcs[0], verbs.StatusSuccess)
	expect(t, wcs[1], verbs.StatusLocalProtection)
	expect(t, wcs[2], verbs.StatusWRFlush)
}

func TestPeerDestroyed(t *testing.T) {
	o := opts{timeout: 12, retry: 3}
	a, b := newPair(t, o)
	a.post(verbs.SendWR{ID: 0, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 4096), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	// A send the peer never receives (RNR forever), then a write.
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 100)},
		verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 1<<20), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	b.qp.Close()
	wcs := a.waitCQ(a.scq, 2, 2*time.Second)
	expect(t, wcs[0], verbs.StatusRetryExceeded)
	expect(t, wcs[1], verbs.StatusWRFlush)
	t.Logf("peer QP destroyed: RetryExceeded after %v", time.Since(start))
	// Later work requests flush.
	a.post(verbs.SendWR{ID: 3, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusWRFlush)
}

// A connection reset (the network, or a peer process that died) fails the
// oldest outstanding work request; a QP without outstanding work requests
// stays in RTS until it posts one.
func TestConnectionReset(t *testing.T) {
	a, b := newPair(t, opts{})
	b.postRecv(1, b.mr.SGE(0, 8))
	a.post(verbs.SendWR{ID: 0, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8)})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8)}) // RNR loop
	time.Sleep(10 * time.Millisecond)
	c := linkConn(t, b.qp)
	c.SetLinger(0)
	c.Close() // RST
	expect(t, a.waitCQ(a.scq, 1, 2*time.Second)[0], verbs.StatusRetryExceeded)
	if s := b.qp.State(); s != verbs.QPRTS {
		t.Fatalf("idle QP is %s after losing its connection", s)
	}
	b.post(verbs.SendWR{ID: 5, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(b.mr, 0, 8), RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()})
	expect(t, b.waitCQ(b.scq, 1, 2*time.Second)[0], verbs.StatusRetryExceeded)
	b.waitState(verbs.QPError, time.Second)
}

// A peer that accepts the connection but never answers: RetryExceeded
// after timeout×(retry+1).
func TestSilentPeer(t *testing.T) {
	o := opts{timeout: 12, retry: 2}.withDefaults() // 16.8 ms × 3
	a := newEnd(t, openCtx(t), o, 0)
	f := newFakePeer(t, ^uint64(0))
	f.connectReal(a, o)
	c := f.acceptFrom(a)
	go func() {
		buf := make([]byte, 1<<16)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: 4096, RKey: 1},
		verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: 4096, RKey: 1})
	wcs := a.waitCQ(a.scq, 2, 5*time.Second)
	el := time.Since(start)
	expect(t, wcs[0], verbs.StatusRetryExceeded)
	expect(t, wcs[1], verbs.StatusWRFlush)
	limit := verbs.TimeoutDuration(12) * 3
	if el < limit {
		t.Fatalf("RetryExceeded after %v, before the %v limit", el, limit)
	}
	t.Logf("silent peer: RetryExceeded after %v (limit %v)", el, limit)
}

// Nobody listens where the peer should be: posted work requests fail
// after the connect timeout.
func TestConnectFails(t *testing.T) {
	o := opts{timeout: 10, retry: 1}.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	f := newFakePeer(t, ^uint64(0))
	f.ln.Close()
	f.connectReal(a, o)
	start := time.Now()
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: 4096, RKey: 1})
	expect(t, a.waitCQ(a.scq, 1, 5*time.Second)[0], verbs.StatusRetryExceeded)
	if el := time.Since(start); el < minConnectTimeout {
		t.Fatalf("failed after %v", el)
	}
}

// Malformed frames close the connection and fail the QP, without panics
// or huge allocations.
func TestMalformedFrames(t *testing.T) {
	mk := func(f frame) []byte {
		b := make([]byte, headerLen)
		header(b).encode(&f)
		return b
	}
	cases := map[string][]byte{
		"bad-opcode":       mk(frame{op: 99}),
		"absurd-length":    append(mk(frame{op: opWrite, length: 1}), 0)[:headerLen],
		"nak-no-syndrome":  mk(frame{op: opNak}),
		"response-unasked": mk(frame{op: opAck, psn: 5}),
		"garbage":          bytes.Repeat([]byte{0xff}, headerLen),
	}
	binary.BigEndian.PutUint32(cases["absurd-length"][hdrLength:], 0xffffffff)
	for name, frameBytes := range cases {
		t.Run(name, func(t *testing.T) {
			o := opts{}.withDefaults()
			a := newEnd(t, openCtx(t), o, 0)
			f := newFakePeer(t, 0)
			f.connectReal(a, o)
			c := f.dialTo(a)
			a.postRecv(1, a.mr.SGE(0, 8))
			if _, err := c.Write(frameBytes); err != nil {
				t.Fatal(err)
			}
			a.waitState(verbs.QPError, 2*time.Second)
			expect(t, a.recvs(1)[0], verbs.StatusWRFlush)
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatal("connection still open after a malformed frame")
			}
		})
	}
}

// A fake requester drives the responder directly: requests are executed in
// PSN order and acknowledged with coalesced ACKs.
func TestResponderWire(t *testing.T) {
	o := opts{}.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	f := newFakePeer(t, 0)
	f.connectReal(a, o)
	c := f.dialTo(a)
	var out []byte
	for i := 0; i < 10; i++ {
		out = append(out, mkFrame(frame{op: opWrite, psn: psn(1000 + i), length: 4, rkey: a.mr.RKey(), raddr: a.mr.Addr() + uint64(4*i)})...)
		out = append(out, byte(i), byte(i), byte(i), byte(i))
	}
	out = append(out, mkFrame(frame{op: opReadReq, psn: 1010, length: 8, rkey: a.mr.RKey(), raddr: a.mr.Addr()})...)
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// Coalesced ACKs, possibly none: the READ_RESP acknowledges the
	// WRITEs before it implicitly.
	var fr frame
	for acked := psn(999); ; acked = fr.psn {
		readFrame(t, c, &fr)
		if fr.op != opAck {
			break
		}
		if !acked.Before(fr.psn) || fr.psn.After(1009) {
			t.Fatalf("ACK %d after %d", fr.psn, acked)
		}
	}
	if fr.op != opReadResp || fr.psn != 1010 || fr.length != 8 {
		t.Fatalf("got %+v, want READ_RESP", fr)
	}
	data := make([]byte, 8)
	if _, err := readFull(c, data); err != nil || !bytes.Equal(data, []byte{0, 0, 0, 0, 1, 1, 1, 1}) {
		t.Fatalf("read data %v, %v", data, err)
	}
	if fr.flags&flagStatus == 0 {
		t.Fatal("READ_RESP without a status trailer")
	}
	if _, err := readFull(c, data); err != nil || !bytes.Equal(data, make([]byte, trailerLen)) {
		t.Fatalf("status trailer %v, %v", data, err)
	}
	// Out of sequence: NAKed, then everything is dropped.
	if _, err := c.Write(mkFrame(frame{op: opWrite, psn: 2000, rkey: a.mr.RKey(), raddr: a.mr.Addr()})); err != nil {
		t.Fatal(err)
	}
	readFrame(t, c, &fr)
	if fr.op != opNak || fr.syndrome != synSeqErr {
		t.Fatalf("got %+v, want NAK(sequence)", fr)
	}
}

func mkFrame(f frame) []byte {
	b := make([]byte, headerLen)
	header(b).encode(&f)
	return b
}

func readFrame(t *testing.T, c net.Conn, f *frame) {
	t.Helper()
	b := make([]byte, headerLen)
	if _, err := readFull(c, b); err != nil {
		t.Fatal(err)
	}
	h, err := parseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	h.decode(f)
}

// Modify to ERROR with work outstanding flushes it; the QP can then be
// reset and connected again.
func TestErrorResetReconnect(t *testing.T) {
	o := opts{}.withDefaults()
	a, b := newPair(t, o)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8)}) // RNR loop
	time.Sleep(5 * time.Millisecond)
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
		t.Fatal(err)
	}
	expect(t, a.sends(1)[0], verbs.StatusWRFlush)
	for _, e := range []*end{a, b} {
		if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPReset}); err != nil {
			t.Fatal(err)
		}
		if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
			t.Fatal(err)
		}
		e.psn = verbs.RandomPSN()
	}
	connect(a, b, o)
	pattern(a.mr.Bytes()[:100], 11)
	a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 100), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if !bytes.Equal(a.mr.Bytes()[:100], b.mr.Bytes()[:100]) {
		t.Fatal("data differs after reconnecting")
	}
}

func TestCQOverflow(t *testing.T) {
	a, b := newPair(t, opts{cqSize: 4, sendWR: 16})
	var wrs []verbs.SendWR
	for i := 0; i < 8; i++ {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	}
	a.post(wrs...)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := a.scq.Poll(a.wcs[:8])
		if errors.Is(err, verbs.ErrCQOverflow) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no overflow reported")
		}
		time.Sleep(time.Millisecond)
	}
	a.waitState(verbs.QPError, 2*time.Second)
}

// Posting and polling a small write allocates nothing, on either side.
func TestWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, b := newPair(t, opts{})
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}
	wcs := make([]verbs.WorkCompletion, 4)
	run := func() {
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := a.scq.Poll(wcs)
			if err != nil || (n > 0 && wcs[0].Status != 0) {
				t.Fatal(err, wcs[0])
			}
			if n > 0 {
				return
			}
			// AllocsPerRun sets GOMAXPROCS to 1: sleeping lets the
			// scheduler poll the network for the reader goroutines.
			time.Sleep(time.Microsecond)
		}
	}
	for i := 0; i < 200; i++ {
		run()
	}
	if n := testing.AllocsPerRun(2000, run); n > 0 {
		t.Fatalf("%.2f allocations per write", n)
	}
	// Sends and receives too.
	swr := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8)}}
	rwr := []verbs.RecvWR{{SGL: []verbs.SGE{b.mr.SGE(0, 8)}}}
	sr := func() {
		if err := b.qp.PostRecv(rwr); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(swr); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 2; {
			n, _ := a.scq.Poll(wcs[:1])
			m, _ := b.rcq.Poll(wcs[1:2])
			got += n + m
			if got < 2 {
				time.Sleep(time.Microsecond)
			}
		}
	}
	for i := 0; i < 200; i++ {
		sr()
	}
	if n := testing.AllocsPerRun(2000, sr); n > 0 {
		t.Fatalf("%.2f allocations per send/receive", n)
	}
}

// Destroying QPs and closing contexts with connections up, connecting,
// and in RNR waits leaves no goroutine behind (TestMain checks).
func TestCloseEverywhere(t *testing.T) {
	for i := 0; i < 3; i++ {
		o := opts{}.withDefaults()
		ca, cb := openCtx(t), openCtx(t)
		a, b := newEnd(t, ca, o, 0), newEnd(t, cb, o, 0)
		c, d := newEnd(t, ca, o, 0), newEnd(t, cb, o, 0)
		connect(a, b, o)
		c.toRTR(d.qp.Address(), d.qp.Num(), d.psn, o) // d never comes up
		c.toRTS(o)
		c.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SGL: sgl(c.mr, 0, 8), RemoteAddr: d.mr.Addr(), RKey: d.mr.RKey()})
		a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, SGL: sgl(a.mr, 0, 8)})
		a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpWrite, SGL: sgl(a.mr, 0, 1<<20), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
		time.Sleep(time.Duration(i) * time.Millisecond)
		ca.Close()
		cb.Close()
	}
}

// Both sides stream large writes and reads at each other at once: the
// readers must never block on writes (that would deadlock two full
// sockets).
func TestBidirectional(t *testing.T) {
	const n = 8 << 20
	a, b := newPair(t, opts{mrSize: 4 * n})
	pattern(a.mr.Bytes()[:n], 1)
	pattern(b.mr.Bytes()[:n], 2)
	for _, e := range []struct{ from, to *end }{{a, b}, {b, a}} {
		var wrs []verbs.SendWR
		for i := 0; i < 4; i++ {
			wrs = append(wrs,
				verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(e.from.mr, 0, n), RemoteAddr: e.to.mr.Addr() + n, RKey: e.to.mr.RKey()},
				verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(e.from.mr, 2*n, n), RemoteAddr: e.to.mr.Addr(), RKey: e.to.mr.RKey()})
		}
		e.from.post(wrs...)
	}
	for _, e := range []*end{a, b} {
		for _, wc := range e.sends(8) {
			expect(t, wc, verbs.StatusSuccess)
		}
	}
	for _, e := range []struct{ from, to *end }{{a, b}, {b, a}} {
		if !bytes.Equal(e.from.mr.Bytes()[:n], e.to.mr.Bytes()[n:2*n]) || !bytes.Equal(e.from.mr.Bytes()[2*n:3*n], e.to.mr.Bytes()[:n]) {
			t.Fatal("data differs")
		}
	}
}

// Several goroutines post to one QP at once; every work request completes
// once, in order.
func TestConcurrentPosters(t *testing.T) {
	a, b := newPair(t, opts{sendWR: 1024, cqSize: 4096})
	const goroutines, each = 4, 200
	errc := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		go func() {
			for i := 0; i < each; i++ {
				wr := verbs.SendWR{ID: uint64(g*each + i), Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled,
					SGL: sgl(a.mr, 8*(g*each+i), 8), RemoteAddr: b.mr.Addr() + 1<<20, RKey: b.mr.RKey(), CompareAdd: 1}
				if i%2 == 1 {
					wr = verbs.SendWR{ID: uint64(g*each + i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
						SGL: sgl(a.mr, 0, 64), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
				}
				for {
					err := a.qp.PostSend([]verbs.SendWR{wr})
					if errors.Is(err, verbs.ErrQueueFull) {
						time.Sleep(10 * time.Microsecond)
						continue
					}
					if err != nil {
						errc <- err
						return
					}
					break
				}
			}
			errc <- nil
		}()
	}
	for g := 0; g < goroutines; g++ {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint64]bool{}
	for _, wc := range a.sends(goroutines * each) {
		expect(t, wc, verbs.StatusSuccess)
		if seen[wc.WRID] {
			t.Fatalf("wr %d completed twice", wc.WRID)
		}
		seen[wc.WRID] = true
	}
	if v := binary.LittleEndian.Uint64(b.mr.Bytes()[1<<20:]); v != goroutines*each/2 {
		t.Fatalf("counter %d, want %d", v, goroutines*each/2)
	}
}

func TestSRQ(t *testing.T) {
	o := opts{}.withDefaults()
	ca, cb := openCtx(t), openCtx(t)
	a := newEnd(t, ca, o, 0)
	// b's QP takes receives from an SRQ.
	b := &end{t: t, ctx: cb, psn: verbs.RandomPSN(), wcs: make([]verbs.WorkCompletion, 64)}
	var err error
	b.pd, _ = cb.AllocPD()
	b.scq, _ = cb.CreateCQ(64)
	b.rcq, _ = cb.CreateCQ(64)
	srq, err := b.pd.CreateSRQ(verbs.SRQConfig{MaxWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	if b.qp, err = b.pd.CreateQP(verbs.QPConfig{SendCQ: b.scq, RecvCQ: b.rcq, SRQ: srq}); err != nil {
		t.Fatal(err)
	}
	if b.mr, err = b.pd.AllocMR(1<<20, verbs.AccessAll); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite}); err != nil {
		t.Fatal(err)
	}
	connect(a, b, o)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)})
	a.noCompletion(a.scq, 10*time.Millisecond) // RNR until the SRQ has a receive
	if err := srq.PostRecv([]verbs.RecvWR{{ID: 7, SGL: []verbs.SGE{b.mr.SGE(0, 64)}}, {ID: 8, SGL: []verbs.SGE{b.mr.SGE(64, 4)}}, {ID: 9, SGL: []verbs.SGE{b.mr.SGE(128, 64)}}}); err != nil {
		t.Fatal(err)
	}
	expect(t, a.sends(1)[0], verbs.StatusSuccess)
	if r := b.recvs(1)[0]; r.WRID != 7 || r.ByteLen != 10 || r.QPNum != b.qp.Num() {
		t.Fatalf("receive %+v", r)
	}
	// Too long for receive 8: the QP fails, the SRQ keeps receive 9.
	a.post(verbs.SendWR{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 10)})
	expect(t, a.sends(1)[0], verbs.StatusRemoteInvalidReq)
	expect(t, b.recvs(1)[0], verbs.StatusLocalLength)
	b.waitState(verbs.QPError, 2*time.Second)
	b.noCompletion(b.rcq, 10*time.Millisecond)
}

// Moving a QP to ERROR in the middle of large transfers returns promptly
// and flushes everything.
func TestErrorDuringTransfer(t *testing.T) {
	const n = 16 << 20
	a, b := newPair(t, opts{mrSize: n})
	var wrs []verbs.SendWR
	for i := 0; i < 8; i++ {
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			verbs.SendWR{ID: uint64(100 + i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, n), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	}
	a.post(wrs...)
	time.Sleep(5 * time.Millisecond)
	start := time.Now()
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("Modify(ERROR) took %v", el)
	}
	wcs := a.sends(16)
	flushed := 0
	for i, wc := range wcs {
		if wc.Status == verbs.StatusWRFlush {
			flushed++
		} else if wc.Status != verbs.StatusSuccess || flushed > 0 {
			t.Fatalf("completion %d: %+v", i, wc)
		}
	}
	if flushed == 0 {
		t.Log("every transfer finished before the transition")
	}
}

// Caller memory a region registers is listed, while it is registered, as
// memory that the transport's raw reads and writes avoid (it may be a
// file mapping: internal/sys rawmem.go); memory from AllocMR is not.
func TestCallerMemoryNotRaw(t *testing.T) {
	ctx := openCtx(t)
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	mr, err := pd.RegMR(buf, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if !sys.IsCallerMemory(buf) {
		t.Fatal("registered caller memory is left to raw system calls")
	}
	am, err := pd.AllocMR(4096, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	if sys.IsCallerMemory(am.Bytes()) {
		t.Fatal("AllocMR memory is listed as caller memory")
	}
	am.Dereg()
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	if sys.IsCallerMemory(buf) {
		t.Fatal("caller memory is still listed after Dereg")
	}
	if _, err := pd.RegMR(buf, verbs.AccessAll); err != nil { // left registered
		t.Fatal(err)
	}
	ctx.Close()
	if sys.IsCallerMemory(buf) {
		t.Fatal("caller memory is still listed after the context closed")
	}
}
