//go:build ibverbs && linux

package roce

// Interoperability with the Linux kernel's Soft-RoCE (rxe), in the test
// VM (test/vm/guest/roce.sh): this process drives an rxe QP through
// transport/ibverbs in the root network namespace, and runs itself again
// in another namespace (ip netns exec) as the roce side; the two are
// joined by a veth pair and exchange QP numbers, PSNs, keys and addresses
// on the child's stdin/stdout. Each side in turn is the requester:
// Write (multi-packet), Write with immediate, Send with immediate
// (multi-packet), Read (multi-packet), compare-and-swap and fetch-and-add;
// the requester checks what it read and the atomics' prior values, the
// responder checks its memory and its receive completions.
//
// RDMAKIT_ROCE_INTEROP="rxe=DEV ns=NETNS iface=IFACE ip=ROCE_IP peer=RXE_IP mtu=4096 [rounds=N] [lossy=1] [bulk=MiB] [timeout=N]"
// (lossy=1: the roce side loses 5% of what it sends and receives,
// duplicates 2% and reorders 2% of what it sends; bulk=M: after the
// rounds, each side in turn Writes and Reads back M/2 MiB, 256 KiB at a
// time, every chunk's data different and checked; timeout=N: the QPs'
// local ACK timeout exponent, 14 by default)
//
// TestInteropECN (RDMAKIT_ROCE_ECN="ns=NETNS iface=IFACE ip=IP rootiface=IFACE rootip=IP"):
// rdmakit roce on both ends of the veth, its root end on port 4792
// (rxe has 4791 there); the link marks CE (netem's ecn); the requester's
// DCQCN must cut its rate.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	offW     = 0          // peer writes 256 KiB here
	offWI    = 256 << 10  // peer writes 1000 bytes with immediate here
	offR     = 320 << 10  // read source, 256 KiB
	offRD    = 640 << 10  // our read destination, 256 KiB
	offRecv  = 960 << 10  // two 32 KiB receives
	offAtom  = 1088 << 10 // the atomic word (starts at 5)
	offRes   = 1096 << 10 // prior values of our atomics
	offSrc   = 1152 << 10 // what we write and send, 256 KiB
	lenBig   = 256 << 10
	lenWI    = 1000
	lenSend  = 20000
	immWI    = 0x0a0b0c0d
	immSend  = 0x01020304
	interMR  = 2 << 20
	seedSelf = 1
)

type interInfo struct {
	QPN, PSN, RKey uint32
	Addr           uint64
	IP             string
}

type interSide struct {
	*side
	role string // "rxe" or "roce": seeds differ
	in   *bufio.Scanner
	out  io.Writer
}

func seedOf(role string, what int) uint64 {
	s := uint64(what) * 1000
	if role == "roce" {
		s++
	}
	return s
}

func (s *interSide) prepare() {
	b := s.mr.Bytes()
	fill(b[offSrc:offSrc+lenBig], seedOf(s.role, 1))
	fill(b[offR:offR+lenBig], seedOf(s.role, 2))
	clear(b[offW : offW+lenBig])
	putU64(b[offAtom:], 5)
	for i := 0; i < 2; i++ {
		if err := s.qp.PostRecv([]verbs.RecvWR{{ID: uint64(100 + i), SGL: []verbs.SGE{s.mr.SGE(offRecv+i*(32<<10), 32<<10)}}}); err != nil {
			s.t.Fatal(err)
		}
	}
}

func putU64(b []byte, v uint64) {
	for i := 0; i < 8; i++ {
		b[i] = byte(v >> (8 * i))
	}
}
func getU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func (s *interSide) send(v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(s.out, "%s\n", b)
}

func (s *interSide) recv(v any) {
	s.t.Helper()
	var line []byte
	for {
		if !s.in.Scan() {
			s.t.Fatalf("peer gone: %v", s.in.Err())
		}
		// The child's test framework prints its own lines (=== RUN, and
		// its log and failure messages) among the JSON ones: pass them on.
		if line = s.in.Bytes(); len(line) > 0 && (line[0] == '{' || line[0] == '"') {
			break
		}
		if len(line) > 0 {
			s.t.Logf("peer: %s", line)
		}
	}
	if err := json.Unmarshal(line, v); err != nil {
		s.t.Fatalf("peer said %q: %v", line, err)
	}
}

// request runs the requester's operations against peer and checks
// what comes back.
func (s *interSide) request(peer interInfo, peerRole string) {
	t := s.t
	t.Helper()
	mr := s.mr
	wrs := []verbs.SendWR{
		{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offSrc, lenBig)}, RemoteAddr: peer.Addr + offW, RKey: peer.RKey},
		{ID: 2, Opcode: verbs.OpWriteWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offSrc, lenWI)}, RemoteAddr: peer.Addr + offWI, RKey: peer.RKey, Imm: immWI},
		{ID: 3, Opcode: verbs.OpSendWithImm, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offSrc, lenSend)}, Imm: immSend},
		{ID: 4, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offRD, lenBig)}, RemoteAddr: peer.Addr + offR, RKey: peer.RKey},
		{ID: 5, Opcode: verbs.OpCompareAndSwap, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offRes, 8)}, RemoteAddr: peer.Addr + offAtom, RKey: peer.RKey, CompareAdd: 5, Swap: 7},
		{ID: 6, Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(offRes+8, 8)}, RemoteAddr: peer.Addr + offAtom, RKey: peer.RKey, CompareAdd: 3},
	}
	for i := range wrs {
		if err := s.qp.PostSend(wrs[i : i+1]); err != nil {
			t.Fatalf("post %d: %v", wrs[i].ID, err)
		}
	}
	wcs := s.wait(s.scq, len(wrs), 30*time.Second)
	for i, wc := range wcs {
		if wc.WRID != uint64(i+1) {
			t.Fatalf("completion %d is of wr %d", i, wc.WRID)
		}
	}
	want := make([]byte, lenBig)
	fill(want, seedOf(peerRole, 2))
	sameBytes(t, s.role+" read from "+peerRole, mr.Bytes()[offRD:offRD+lenBig], want)
	if v := getU64(mr.Bytes()[offRes:]); v != 5 {
		t.Fatalf("%s: compare-and-swap prior value %d, want 5", s.role, v)
	}
	if v := getU64(mr.Bytes()[offRes+8:]); v != 7 {
		t.Fatalf("%s: fetch-and-add prior value %d, want 7", s.role, v)
	}
}

// serve checks what the peer's requests left here.
func (s *interSide) serve(peerRole string) {
	t := s.t
	t.Helper()
	b := s.mr.Bytes()
	wcs := s.wait(s.rcq, 2, 30*time.Second)
	want := make([]byte, lenBig)
	fill(want, seedOf(peerRole, 1))
	sameBytes(t, s.role+": written by "+peerRole, b[offW:offW+lenBig], want)
	sameBytes(t, s.role+": written with immediate by "+peerRole, b[offWI:offWI+lenWI], want[:lenWI])
	if wc := wcs[0]; wc.Opcode != verbs.WCRecvWriteWithImm || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != immWI {
		t.Fatalf("%s: first receive %+v, want RECV_RDMA_WITH_IMM imm %#x", s.role, wc, immWI)
	}
	if wc := wcs[1]; wc.Opcode != verbs.WCRecv || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != immSend || wc.ByteLen != lenSend {
		t.Fatalf("%s: second receive %+v, want RECV of %d bytes imm %#x", s.role, wc, lenSend, immSend)
	}
	recvd := b[offRecv+(32<<10) : offRecv+(32<<10)+lenSend]
	if wcs[1].WRID == 100 {
		recvd = b[offRecv : offRecv+lenSend]
	}
	sameBytes(t, s.role+": sent by "+peerRole, recvd, want[:lenSend])
	if v := getU64(b[offAtom:]); v != 10 {
		t.Fatalf("%s: atomic word %d after compare-and-swap 5->7 and add 3, want 10", s.role, v)
	}
}

func interopConfig(t *testing.T) map[string]string {
	return envConfig(t, "RDMAKIT_ROCE_INTEROP", "with rxe")
}

// envConfig is the key=value fields of environment variable name; the
// test is skipped without it (it runs in the test VM, where).
func envConfig(t *testing.T, name, where string) map[string]string {
	s := os.Getenv(name)
	if s == "" {
		t.Skip(name + " not set: runs in the test VM " + where + " (test/vm/guest/roce.sh)")
	}
	m := map[string]string{}
	for _, f := range strings.Fields(s) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

func mtuOf(t *testing.T, s string) verbs.MTU {
	n, _ := strconv.Atoi(s)
	for m := verbs.MTU256; m <= verbs.MTU4096; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	t.Fatalf("mtu %q", s)
	return 0
}

// timeoutOf is the QPs' local ACK timeout exponent (timeout=N, default
// 14: 67 ms, perftest's default).
func timeoutOf(cfg map[string]string) uint8 {
	if n, err := strconv.Atoi(cfg["timeout"]); err == nil && n > 0 && n < 32 {
		return uint8(n)
	}
	return 14
}

func connectTo(t *testing.T, s *side, peer interInfo, mtu verbs.MTU, timeout uint8) {
	ip := net.ParseIP(peer.IP)
	if err := s.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: mtu, DestQPN: peer.QPN, RQPSN: peer.PSN,
		AH: verbs.AddressHandle{GID: ip}, MinRNRTimer: 12, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: s.psn, Timeout: timeout, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
}

// TestInteropRXE is the rxe side (root namespace) and starts the roce side.
func TestInteropRXE(t *testing.T) {
	if os.Getenv("RDMAKIT_ROCE_INTEROP_CHILD") != "" {
		t.Skip("child")
	}
	cfg := interopConfig(t)
	ctx, err := verbs.Open(cfg["rxe"], verbs.Options{})
	if err != nil {
		t.Fatalf("open %s: %v", cfg["rxe"], err)
	}
	defer ctx.Close()
	s := &interSide{side: newSide(t, ctx, interMR), role: "rxe"}
	defer s.startChild(cfg, "TestInteropRoCE")()
	var peer interInfo
	s.recv(&peer)
	s.send(interInfo{QPN: s.qp.Num(), PSN: s.psn, RKey: s.mr.RKey(), Addr: s.mr.Addr(), IP: cfg["peer"]})
	connectTo(t, s.side, peer, mtuOf(t, cfg["mtu"]), timeoutOf(cfg))
	var msg string
	s.recv(&msg) // the roce side is connected
	rounds := roundsOf(cfg)
	for round := 0; round < rounds; round++ {
		s.prepare()
		s.recv(&msg) // the roce side is prepared
		// rxe requests, roce serves.
		s.request(peer, "roce")
		s.send("served?")
		s.recv(&msg)
		if msg != "ok" {
			t.Fatalf("roce side as responder: %s", msg)
		}
		// roce requests, rxe serves.
		s.send("request")
		s.recv(&msg)
		if msg != "ok" {
			t.Fatalf("roce side as requester: %s", msg)
		}
		s.serve("roce")
	}
	t.Logf("%d rounds: rxe -> roce and roce -> rxe: Write, Write with immediate, Send with immediate, Read, compare-and-swap, fetch-and-add: ok", rounds)
	if mib := bulkOf(cfg); mib > 0 {
		start := time.Now()
		n := s.bulk(peer, mib<<20/2)
		s.send("bulk")
		s.recv(&msg)
		if msg != "ok" {
			t.Fatalf("roce side's bulk transfer: %s", msg)
		}
		t.Logf("bulk: rxe wrote and read back %d MiB, roce wrote and read back %d MiB, every byte checked, in %v",
			n>>20, n>>20, time.Since(start).Round(time.Millisecond))
	}
	s.send("bye")
}

// bulkOf is bulk=MiB (0: none).
func bulkOf(cfg map[string]string) int {
	n, _ := strconv.Atoi(cfg["bulk"])
	return max(n, 0)
}

// bulk Writes total bytes into the peer's memory, lenBig at a time, each
// chunk's data different, and Reads each chunk back into its own memory
// to check it: the peer's memory holds what was written and the Read
// returns it. It returns the bytes written (as many were read back).
func (s *interSide) bulk(peer interInfo, total int) int {
	t := s.t
	t.Helper()
	b := s.mr.Bytes()
	src, dst := b[offSrc:offSrc+lenBig], b[offRD:offRD+lenBig]
	n := 0
	for i := 0; n < total; i++ {
		fill(src, seedOf(s.role, 100+i))
		clear(dst)
		s.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.mr.SGE(offSrc, lenBig)},
			RemoteAddr: peer.Addr + offW, RKey: peer.RKey},
			verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{s.mr.SGE(offRD, lenBig)},
				RemoteAddr: peer.Addr + offW, RKey: peer.RKey})
		s.wait(s.scq, 2, 60*time.Second)
		sameBytes(t, fmt.Sprintf("%s: chunk %d read back", s.role, i), dst, src)
		n += lenBig
	}
	return n
}

// startChild runs this test binary's test named test in network
// namespace cfg["ns"] on roce device cfg["iface"] at cfg["ip"], speaking
// JSON lines with s on its stdin and stdout; the returned function ends
// it (and fails the test if it failed).
func (s *interSide) startChild(cfg map[string]string, test string) (wait func()) {
	t := s.t
	cmd := exec.Command("ip", "netns", "exec", cfg["ns"], os.Args[0], "-test.run=^"+test+"$", "-test.v")
	cmd.Env = append(os.Environ(), "RDMAKIT_ROCE_INTEROP_CHILD=1", EnvIfaces+"="+cfg["iface"], EnvAddr+"="+cfg["ip"])
	cmd.Stderr = os.Stderr
	w, _ := cmd.StdinPipe()
	r, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.in, s.out = bufio.NewScanner(r), w
	return func() {
		w.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s in %s: %v", test, cfg["ns"], err)
		}
	}
}

// roundsOf is how many times the exchange runs (rounds=N, default 1).
func roundsOf(cfg map[string]string) int {
	if n, err := strconv.Atoi(cfg["rounds"]); err == nil && n > 0 {
		return n
	}
	return 1
}

// TestInteropRoCE is the roce side, run by TestInteropRXE in the other
// namespace; it speaks JSON lines on stdin/stdout and logs to stderr.
func TestInteropRoCE(t *testing.T) {
	if os.Getenv("RDMAKIT_ROCE_INTEROP_CHILD") == "" {
		t.Skip("run by TestInteropRXE")
	}
	cfg := interopConfig(t)
	if cfg["lossy"] != "" {
		// Loss, duplication and reordering at this side's socket, both
		// ways: what it sends through the test filter, what arrives
		// dropped at the same rate.
		l := &lossy{rng: rand.New(rand.NewPCG(5, 6)), drop: 0.05, dup: 0.02, reorder: 0.02}
		testFilter = l.filter
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(7, 8))
		testDropRx = func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rng.Float64() < 0.05
		}
		defer func() {
			testFilter, testDropRx = nil, nil
			l.mu.Lock()
			fmt.Fprintf(os.Stderr, "lossy socket: sent %d dropped, %d duplicated, %d reordered\n", l.dropped, l.duplicated, l.reordered)
			l.mu.Unlock()
		}()
	}
	ctx, err := verbs.Open("roce0", verbs.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open roce0:", err)
		t.Fatal(err)
	}
	defer ctx.Close()
	out := os.Stdout
	os.Stdout = os.Stderr // test output must not mix with the protocol
	s := &interSide{side: newSide(t, ctx, interMR), role: "roce", in: bufio.NewScanner(os.Stdin), out: out}
	s.send(interInfo{QPN: s.qp.Num(), PSN: s.psn, RKey: s.mr.RKey(), Addr: s.mr.Addr(), IP: cfg["ip"]})
	var peer interInfo
	s.recv(&peer)
	connectTo(t, s.side, peer, mtuOf(t, cfg["mtu"]), timeoutOf(cfg))
	s.send("connected")
	var msg string
	for round := 0; round < roundsOf(cfg); round++ {
		s.prepare()
		s.send("prepared")
		s.recv(&msg)
		s.serve("rxe")
		s.send("ok")
		s.recv(&msg)
		s.request(peer, "rxe")
		s.send("ok")
	}
	s.recv(&msg)
	if msg == "bulk" {
		s.bulk(peer, bulkOf(cfg)<<20/2)
		s.send("ok")
		s.recv(&msg)
	}
	st, _ := Stats(ctx)
	fmt.Fprintf(os.Stderr, "roce side counters: %+v\n", st)
}

type ecnInfo struct {
	QPN, PSN, RKey uint32
	Addr           uint64
	QPAddr         []byte
}

type ecnReport struct {
	Stats Counters
	Err   string
}

func ecnConnect(t *testing.T, s *side, peer ecnInfo) {
	if err := s.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: verbs.MTU4096, DestQPN: peer.QPN, RQPSN: peer.PSN,
		AH: verbs.AddressHandle{Dest: peer.QPAddr}, MinRNRTimer: 12, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
	if err := s.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: s.psn, Timeout: 14, RetryCount: 7, RNRRetry: 7, MaxRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
}

func ecnConfig(t *testing.T) map[string]string {
	return envConfig(t, "RDMAKIT_ROCE_ECN", "with netem marking CE")
}

// TestInteropECN is the root-namespace side: the requester, whose
// packets the link marks CE; the other side (TestInteropECNChild, in the
// namespace) answers with CNPs.
func TestInteropECN(t *testing.T) {
	if os.Getenv("RDMAKIT_ROCE_INTEROP_CHILD") != "" {
		t.Skip("child")
	}
	cfg := ecnConfig(t)
	t.Setenv(EnvIfaces, cfg["rootiface"])
	t.Setenv(EnvAddr, cfg["rootip"]+":4792")
	// The default line rate (100 Gb/s) is far above what the test VM
	// moves; a gain of 1/16 makes each CNP count (as TestECN does).
	DCQCN.LineRate, DCQCN.G = 2e9, 1.0/16
	DCQCN.AlphaPeriod, DCQCN.RateTimer = 10*time.Millisecond, 10*time.Millisecond
	defer func() { DCQCN = rcprotoDefault }()
	ctx, err := verbs.Open("roce0", verbs.Options{})
	if err != nil {
		t.Fatalf("open roce0 on %s: %v", cfg["rootiface"], err)
	}
	defer ctx.Close()
	s := &interSide{side: newSide(t, ctx, interMR), role: "root"}
	defer s.startChild(cfg, "TestInteropECNChild")()
	var peer ecnInfo
	s.recv(&peer)
	s.send(ecnInfo{QPN: s.qp.Num(), PSN: s.psn, RKey: s.mr.RKey(), Addr: s.mr.Addr(), QPAddr: s.qp.Address()})
	ecnConnect(t, s.side, peer)
	var msg string
	s.recv(&msg) // connected
	mib := 32
	if v, err := strconv.Atoi(cfg["mib"]); err == nil && v > 0 {
		mib = v
	}
	start := time.Now()
	n := s.bulk(interInfo{Addr: peer.Addr, RKey: peer.RKey}, mib<<20)
	el := time.Since(start)
	s.send("report")
	var rep ecnReport
	s.recv(&rep)
	if rep.Err != "" {
		t.Fatalf("namespace side: %s", rep.Err)
	}
	st, _ := Stats(ctx)
	d := qpOf(ctx, s.qp)
	d.mu.Lock()
	c, minRate := d.cc.rc.Counters(), d.cc.minRate
	d.mu.Unlock()
	t.Logf("wrote and read back %d MiB in %v; namespace side: RxCE:%d TxCNP:%d; this side: RxCNP:%d DCQCN cuts:%d lowest rate %.3g of %.3g B/s",
		n>>20, el.Round(time.Millisecond), rep.Stats.RxCE, rep.Stats.TxCNP, st.RxCNP, c.Cuts, minRate, DCQCN.LineRate)
	if rep.Stats.RxCE == 0 || rep.Stats.TxCNP == 0 || st.RxCNP == 0 || c.Cuts == 0 || minRate > 0.9*DCQCN.LineRate {
		t.Fatal("CE marks on the link did not make the sender cut its rate")
	}
}

// TestInteropECNChild is the namespace side of TestInteropECN: it
// serves, then reports its counters.
func TestInteropECNChild(t *testing.T) {
	if os.Getenv("RDMAKIT_ROCE_INTEROP_CHILD") == "" {
		t.Skip("run by TestInteropECN")
	}
	ecnConfig(t)
	ctx, err := verbs.Open("roce0", verbs.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "open roce0:", err)
		t.Fatal(err)
	}
	defer ctx.Close()
	out := os.Stdout
	os.Stdout = os.Stderr
	s := &interSide{side: newSide(t, ctx, interMR), role: "ns", in: bufio.NewScanner(os.Stdin), out: out}
	s.send(ecnInfo{QPN: s.qp.Num(), PSN: s.psn, RKey: s.mr.RKey(), Addr: s.mr.Addr(), QPAddr: s.qp.Address()})
	var peer ecnInfo
	s.recv(&peer)
	ecnConnect(t, s.side, peer)
	s.send("connected")
	var msg string
	s.recv(&msg)
	st, _ := Stats(ctx)
	s.send(ecnReport{Stats: st})
}
