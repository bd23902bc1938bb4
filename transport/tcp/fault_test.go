package tcp

// Fault tests: two tcp QPs (two contexts) whose one connection runs through
// a faultnet proxy (internal/testutil/faultnet) that stalls, truncates,
// resets, drops, delays or refuses it, with Write, Read, Send and atomic
// work requests outstanding. Every fault must end in the documented
// completion status (doc.go, docs/architecture.md "Semantics decisions"):
// the oldest outstanding work request RetryExceeded, the rest WRFlush, the
// QP in ERROR; never success for data that did not arrive; target memory
// untouched beyond what the proxy forwarded.
//
// Goroutines: the test's own (posts, polls, commands the proxy); the
// proxy's accept and pump goroutines; the transport's (see link.go). Each
// test arms a timer (bound) that panics with every goroutine's stack if it
// runs too long, so a hang fails instead of stalling the run.
//
// No test hook in the transport is needed: a QP address carries its
// context's listen port (doc.go, address.go), and the hello names QPs and
// nonces only. The dialing side (the smaller nonce dials, doc.go) is given
// its peer's address with the proxy's port in it; the accepting side takes
// the proxied connection as its own.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/testutil/faultnet"
	"github.com/rdmakit/rdmakit/verbs"
)

// Wire sizes from doc.go and address.go, spelled out: the warm-up checks
// the proxy's byte counts against them before any fault is placed.
const (
	fHelloLen  = 32
	fHeaderLen = 48
)

// bound fails the whole test binary, with stacks, if the test (cleanups
// included) is still running after d: a hang must not pass quietly.
func bound(t *testing.T, d time.Duration) {
	t.Helper()
	if raceEnabled {
		d *= 3
	}
	name := t.Name()
	timer := time.AfterFunc(d, func() { panic(fmt.Sprintf("%s still running after %v: hang", name, d)) })
	t.Cleanup(func() { timer.Stop() })
}

// slack is the scheduling allowance added to time bounds. The upper
// bounds only tell a retry that ends from one that never does, so they are
// generous: on a 2-core host running other test packages and builds, the
// 134 ms stall of TestFault/stall-requests/send once took 1.93 s.
func slack() time.Duration {
	if raceEnabled {
		return 6 * time.Second
	}
	return 3 * time.Second
}

// Helpers on the documented QP address layout.
func addrPort(a []byte) int     { return int(binary.BigEndian.Uint16(a[2:])) }
func addrNonce(a []byte) uint64 { return binary.BigEndian.Uint64(a[8:]) }

// viaProxy returns address a with the proxy's loopback address in it.
func viaProxy(a []byte, port int) []byte {
	b := append([]byte(nil), a...)
	binary.BigEndian.PutUint16(b[2:], uint16(port))
	copy(b[16:32], net.IPv4(127, 0, 0, 1).To16())
	return b
}

// fpair is a requester a and a responder b connected through a proxy.
type fpair struct {
	t       *testing.T
	o       opts
	a, b    *end
	p       *faultnet.Proxy
	reqDir  faultnet.Dir // a → b (a's requests) through the proxy
	respDir faultnet.Dir // b → a (b's responses)
	reqBase int64        // bytes forwarded before the faults: hellos + warm-up
	rspBase int64
	aDest   []byte // the addresses each side was given
	bDest   []byte
}

// newFaultPair connects a and b through a new proxy; before, if not nil,
// runs between the proxy's creation and the transitions to RTR.
func newFaultPair(t *testing.T, o opts, before func(*faultnet.Proxy)) *fpair {
	t.Helper()
	o = o.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	b := newEnd(t, openCtx(t), o, 0)
	aa, ba := a.qp.Address(), b.qp.Address()
	aDials := addrNonce(aa) < addrNonce(ba) || (addrNonce(aa) == addrNonce(ba) && a.qp.Num() < b.qp.Num())
	acceptor := aa
	if aDials {
		acceptor = ba
	}
	if ip := net.IP(acceptor[16:32]); !ip.IsUnspecified() && !ip.IsLoopback() {
		t.Skipf("contexts listen on %v (%s): the proxy forwards to loopback only", ip, EnvAddr)
	}
	p, err := faultnet.New(fmt.Sprintf("127.0.0.1:%d", addrPort(acceptor)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	fp := &fpair{t: t, o: o, a: a, b: b, p: p, reqDir: faultnet.Up, respDir: faultnet.Down}
	aDest, bDest := ba, aa
	if aDials {
		aDest = viaProxy(ba, p.Port())
	} else {
		bDest = viaProxy(aa, p.Port())
		fp.reqDir, fp.respDir = faultnet.Down, faultnet.Up
	}
	if before != nil {
		before(p)
	}
	fp.aDest, fp.bDest = aDest, bDest
	fp.connect()
	return fp
}

// connect moves a, then b, from INIT to RTS through the proxy.
func (fp *fpair) connect() {
	fp.t.Helper()
	a, b, o := fp.a, fp.b, fp.o
	a.toRTR(fp.aDest, b.qp.Num(), b.psn, o)
	a.toRTS(o)
	b.toRTR(fp.bDest, a.qp.Num(), a.psn, o)
	b.toRTS(o)
}

// reconnect takes both QPs through RESET and INIT back to RTS, with new
// PSNs; the dialer dials the proxy again.
func (fp *fpair) reconnect() {
	fp.t.Helper()
	for _, e := range []*end{fp.a, fp.b} {
		if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPReset}); err != nil {
			fp.t.Fatal(err)
		}
		if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPInit, Port: 1,
			AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
			fp.t.Fatal(err)
		}
		e.psn = verbs.RandomPSN()
	}
	fp.connect()
}

// warmup runs one write through the proxy and records the byte counts
// the faults are placed from, checking them against the wire format.
func (fp *fpair) warmup() {
	t := fp.t
	t.Helper()
	a, b := fp.a, fp.b
	a.post(verbs.SendWR{ID: 99, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	expect(t, a.waitCQ(a.scq, 1, 5*time.Second)[0], verbs.StatusSuccess)
	fp.reqBase = fHelloLen + fHeaderLen + 8 // hello, WRITE + 8 bytes
	fp.rspBase = fHelloLen + fHeaderLen     // hello, ACK
	deadline := time.Now().Add(2 * time.Second)
	for {
		req, rsp := fp.p.Forwarded(0, fp.reqDir), fp.p.Forwarded(0, fp.respDir)
		if req == fp.reqBase && rsp == fp.rspBase && fp.p.Conns() == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the warm-up the proxy forwarded %d bytes a→b and %d b→a on %d connections, want %d and %d on 1",
				req, rsp, fp.p.Conns(), fp.reqBase, fp.rspBase)
		}
		time.Sleep(time.Millisecond)
	}
}

// stallLimit is timeout×(retry+1) of the pair's options.
func (fp *fpair) stallLimit() time.Duration {
	return verbs.TimeoutDuration(fp.o.timeout) * time.Duration(int(fp.o.retry)+1)
}

// finish ends the fault: the proxy closes (so its counts are final), b
// must see the end cleanly (a write it posts now fails with RetryExceeded
// and b goes to ERROR), then both QPs are moved to ERROR, which waits for
// their goroutines, so memory is quiet for the checks. It returns the
// bytes forwarded after the warm-up (or the hellos) a→b and b→a.
func (fp *fpair) finish() (req, rsp int64) {
	t := fp.t
	t.Helper()
	fp.p.Close()
	b := fp.b
	want := verbs.StatusRetryExceeded
	if b.qp.State() == verbs.QPError {
		want = verbs.StatusWRFlush // its own work requests failed already
	}
	b.post(verbs.SendWR{ID: 77, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(b.mr, 0, 8),
		RemoteAddr: fp.a.mr.Addr() + uint64(len(fp.a.mr.Bytes())-scratchOff), RKey: fp.a.mr.RKey()})
	wc := b.waitCQ(b.scq, 1, 5*time.Second+slack())[0]
	if wc.Status != want {
		t.Errorf("responder's write after the connection ended: %q, want %q", wc.Status, want)
	}
	b.waitState(verbs.QPError, 2*time.Second)
	for _, e := range []*end{fp.a, fp.b} {
		if err := e.qp.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
			t.Fatal(err)
		}
	}
	// The data went over the last connection (earlier ones failed in the
	// handshake, when a case makes them).
	last := fp.p.Conns() - 1
	req = fp.p.Forwarded(last, fp.reqDir) - fp.reqBase
	rsp = fp.p.Forwarded(last, fp.respDir) - fp.rspBase
	return max(req, 0), max(rsp, 0)
}

// Workloads: k work requests of one kind, laid out so that every byte a
// fault may touch is known.
const (
	wlK        = 4
	wlSize     = 96 << 10 // default size: several proxy chunks, read straight into place
	atomOff    = 8192     // b: the atomic word
	scratchOff = 64       // a: from the end, the responder's write after the fault
	atomInit   = 1000
)

type opKind int

const (
	opkWrite opKind = iota
	opkRead
	opkSend
	opkAtomic
	opkWriteImm
)

var opKinds = []opKind{opkWrite, opkRead, opkSend, opkAtomic, opkWriteImm}

func (k opKind) String() string { return [...]string{"write", "read", "send", "atomic", "writeimm"}[k] }

// consumesRecv reports whether the work requests use receives.
func (k opKind) consumesRecv() bool { return k == opkSend || k == opkWriteImm }

type workload struct {
	t          *testing.T
	op         opKind
	fp         *fpair
	oldA, oldB []byte                 // the memory before the work requests
	size       int                    // bytes per work request (atomics: 8)
	dstOff     int                    // b: write targets, receive buffers; a: read destinations
	resOff     int                    // a: atomic results
	recvs      []verbs.WorkCompletion // by WRID, once collected
	recvSeen   []bool
	lostRecvOK bool // a known bug loses receives: log, do not fail
}

func addend(i int) uint64 { return 1 << (8 * i) }

// atomPrefix is the word after the first n atomics executed.
func atomPrefix(n int) uint64 {
	v := uint64(atomInit)
	for i := 0; i < n; i++ {
		v += addend(i)
	}
	return v
}

// wlMem is the memory a workload of k requests of size bytes needs.
func wlMem(size int) int { return 2*wlK*size + 1<<20 }

func newWorkload(fp *fpair, op opKind, size int) *workload {
	a, b := fp.a, fp.b
	w := &workload{t: fp.t, op: op, fp: fp, size: size, dstOff: wlK*size + 64<<10}
	w.resOff = w.dstOff + wlK*size + 64<<10
	if n := wlMem(size); len(a.mr.Bytes()) < n || len(b.mr.Bytes()) < n {
		fp.t.Fatalf("memory regions of %d bytes, want %d", len(a.mr.Bytes()), n)
	}
	pattern(a.mr.Bytes(), 1)
	pattern(b.mr.Bytes(), 2)
	binary.LittleEndian.PutUint64(b.mr.Bytes()[atomOff:], atomInit)
	switch op {
	case opkSend:
		for i := 0; i < wlK; i++ {
			b.postRecv(uint64(i), b.mr.SGE(w.dstOff+i*w.size, w.size))
		}
	case opkWriteImm:
		for i := 0; i < wlK; i++ {
			b.postRecv(uint64(i))
		}
	}
	w.oldA, w.oldB = append([]byte(nil), a.mr.Bytes()...), append([]byte(nil), b.mr.Bytes()...)
	return w
}

func (w *workload) wrs() []verbs.SendWR {
	a, b := w.fp.a, w.fp.b
	var wrs []verbs.SendWR
	for i := 0; i < wlK; i++ {
		wr := verbs.SendWR{ID: uint64(i), Flags: verbs.SendSignaled, RKey: b.mr.RKey()}
		switch w.op {
		case opkWrite, opkWriteImm:
			wr.Opcode, wr.SGL, wr.RemoteAddr = verbs.OpWrite, sgl(a.mr, i*w.size, w.size), b.mr.Addr()+uint64(w.dstOff+i*w.size)
			if w.op == opkWriteImm {
				wr.Opcode, wr.Imm = verbs.OpWriteWithImm, uint32(i)
			}
		case opkRead:
			wr.Opcode, wr.SGL, wr.RemoteAddr = verbs.OpRead, sgl(a.mr, w.dstOff+i*w.size, w.size), b.mr.Addr()+uint64(i*w.size)
		case opkSend:
			wr.Opcode, wr.SGL, wr.RKey = verbs.OpSend, sgl(a.mr, i*w.size, w.size), 0
		case opkAtomic:
			wr.Opcode, wr.SGL, wr.RemoteAddr = verbs.OpFetchAndAdd, sgl(a.mr, w.resOff+8*i, 8), b.mr.Addr()+atomOff
			wr.CompareAdd = addend(i)
			if i == 2 {
				wr.Opcode, wr.CompareAdd, wr.Swap = verbs.OpCompareAndSwap, atomPrefix(2), atomPrefix(3)
			}
		}
		wrs = append(wrs, wr)
	}
	return wrs
}

// Writes from b to a, for the cases with traffic both ways: 4 KiB each,
// from b's memory past its atomic results into a's.
const backSize = 4 << 10

func (w *workload) backOff() int { return w.resOff + 64<<10 }

func (w *workload) backWrites() []verbs.SendWR {
	a, b := w.fp.a, w.fp.b
	var wrs []verbs.SendWR
	for i := 0; i < wlK; i++ {
		off := w.backOff() + i*backSize
		wrs = append(wrs, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: sgl(b.mr, off, backSize), RemoteAddr: a.mr.Addr() + uint64(off), RKey: a.mr.RKey()})
	}
	return wrs
}

// checkBackWrites checks that the ok writes b completed successfully
// arrived whole.
func (w *workload) checkBackWrites(ok int) {
	w.t.Helper()
	for i := 0; i < ok; i++ {
		off := w.backOff() + i*backSize
		if !bytes.Equal(w.fp.a.mr.Bytes()[off:off+backSize], w.fp.b.mr.Bytes()[off:off+backSize]) {
			w.t.Errorf("b's write %d completed successfully, but the data differs", i)
		}
	}
}

// dataDir is the direction that carries the data of the work requests.
func (w *workload) dataDir() faultnet.Dir {
	if w.op == opkRead {
		return w.fp.respDir
	}
	return w.fp.reqDir
}

func (w *workload) frameLen() int64 {
	if w.op == opkAtomic {
		return fHeaderLen
	}
	return int64(fHeaderLen + w.size)
}

// midSecond is the position, counted from the start of the data
// direction's stream, in the middle of the second work request's frame:
// half its payload, or half its header for atomics.
func (w *workload) midSecond() int64 {
	base := w.fp.reqBase
	if w.dataDir() == w.fp.respDir {
		base = w.fp.rspBase
	}
	if w.op == opkAtomic {
		return base + fHeaderLen + fHeaderLen/2
	}
	return base + w.frameLen() + int64(fHeaderLen+w.size/2)
}

// arrived is how many payload bytes of work request i were forwarded when
// fwd bytes of the data stream (after the warm-up) were.
func (w *workload) arrived(i int, fwd int64) int {
	n := fwd - int64(i)*w.frameLen() - fHeaderLen
	return int(min(max(n, 0), int64(w.size)))
}

// checkStatuses checks a's completions: in order, successes, then at most
// one with status st, then WRFlush. It returns the number of successes.
func (w *workload) checkStatuses(wcs []verbs.WorkCompletion, st verbs.Status) int {
	t := w.t
	t.Helper()
	ok := len(wcs)
	for i, wc := range wcs {
		if wc.WRID != uint64(i) {
			t.Fatalf("completion %d is of work request %d: %+v", i, wc.WRID, wcs)
		}
		if wc.Status != verbs.StatusSuccess && ok == len(wcs) {
			ok = i
			if wc.Status != st {
				t.Errorf("work request %d: %q, want %q (all: %v)", i, wc.Status, st, statuses(wcs))
			}
		} else if i > ok && wc.Status != verbs.StatusWRFlush {
			t.Errorf("work request %d after the failed one: %q, want %q (all: %v)", i, wc.Status, verbs.StatusWRFlush, statuses(wcs))
		}
	}
	return ok
}

func statuses(wcs []verbs.WorkCompletion) []string {
	var s []string
	for _, wc := range wcs {
		s = append(s, wc.Status.String())
	}
	return s
}

// checkRange checks n-byte region got (old before, src wanted) after a
// transfer of which arrived bytes went through: complete if done, else
// new or old bytes up to arrived and old bytes after.
func checkRange(t *testing.T, what string, got, old, src []byte, arrived int, done bool) {
	t.Helper()
	if done {
		if !bytes.Equal(got, src) {
			t.Errorf("%s completed successfully, but the data differs", what)
		}
		return
	}
	if !bytes.Equal(got[arrived:], old[arrived:]) {
		i := arrived
		for got[i] == old[i] {
			i++
		}
		t.Errorf("%s: byte %d changed, only %d bytes went through", what, i, arrived)
	}
	for i := 0; i < arrived; i++ {
		if got[i] != old[i] && got[i] != src[i] {
			t.Errorf("%s: byte %d is neither the old nor the new data", what, i)
			break
		}
	}
}

// checkData checks memory after the fault: ok work requests succeeded;
// req and rsp bytes went through a→b and b→a after the warm-up.
func (w *workload) checkData(ok int, req, rsp int64) {
	t := w.t
	t.Helper()
	a, b := w.fp.a.mr.Bytes(), w.fp.b.mr.Bytes()
	fwd := req
	if w.op == opkRead {
		fwd = rsp
	}
	for i := 0; i < ok; i++ {
		if w.op.consumesRecv() && !w.recvDone(i) {
			t.Errorf("send %d succeeded, receive %d did not: %v", i, i, statuses(w.recvs))
		}
		if w.op != opkAtomic && w.arrived(i, fwd) != w.size {
			t.Errorf("work request %d succeeded, yet only %d of its %d bytes went through", i, w.arrived(i, fwd), w.size)
		}
	}
	// Everything outside the work requests' ranges is untouched (the
	// responder's write after the fault never arrives: a's scratch is
	// excluded anyway).
	span := func(m []byte, lo, hi int) []byte { return append(append([]byte(nil), m[:lo]...), m[hi:]...) }
	switch w.op {
	case opkWrite, opkSend, opkWriteImm:
		if !bytes.Equal(span(b, w.dstOff, w.dstOff+wlK*w.size), span(w.oldB, w.dstOff, w.dstOff+wlK*w.size)) {
			t.Errorf("responder memory outside the %s targets changed", w.op)
		}
		for i := 0; i < wlK; i++ {
			r := w.dstOff + i*w.size
			done := i < ok
			if w.op.consumesRecv() && w.recvDone(i) {
				done = true // the responder said the message arrived
			}
			checkRange(t, fmt.Sprintf("%s %d", w.op, i), b[r:r+w.size], w.oldB[r:r+w.size], a[i*w.size:(i+1)*w.size], w.arrived(i, fwd), done)
		}
	case opkRead:
		if !bytes.Equal(b, w.oldB) {
			t.Error("reads changed the responder's memory")
		}
		for i := 0; i < wlK; i++ {
			r := w.dstOff + i*w.size
			checkRange(t, fmt.Sprintf("read %d", i), a[r:r+w.size], w.oldA[r:r+w.size], b[i*w.size:(i+1)*w.size], w.arrived(i, fwd), i < ok)
		}
	case opkAtomic:
		if !bytes.Equal(span(b, atomOff, atomOff+8), span(w.oldB, atomOff, atomOff+8)) {
			t.Error("responder memory outside the atomic word changed")
		}
		word := binary.LittleEndian.Uint64(b[atomOff:])
		executed := -1
		for n := 0; n <= wlK; n++ {
			if word == atomPrefix(n) {
				executed = n
			}
		}
		if executed < 0 {
			t.Fatalf("atomic word %#x is no prefix of the atomics executed in order", word)
		}
		if whole := int(req / fHeaderLen); executed > whole {
			t.Errorf("%d atomics executed, only %d went through whole", executed, whole)
		}
		if ok > executed {
			t.Errorf("%d atomics succeeded, %d executed", ok, executed)
		}
		for i := 0; i < ok; i++ {
			if got := binary.LittleEndian.Uint64(a[w.resOff+8*i:]); got != atomPrefix(i) {
				t.Errorf("atomic %d succeeded with prior value %#x, want %#x", i, got, atomPrefix(i))
			}
		}
	}
}

// recvDone collects b's receive completions (once: b is in ERROR, so
// every posted receive must have one: success for a whole message, else
// WRFlush) and reports whether receive i succeeded.
func (w *workload) recvDone(i int) bool {
	t := w.t
	t.Helper()
	if w.recvs == nil {
		w.recvs = make([]verbs.WorkCompletion, wlK)
		w.recvSeen = make([]bool, wlK)
		seen := w.recvSeen
		b := w.fp.b
		wait := 5 * time.Second
		if w.lostRecvOK {
			wait = time.Second
		}
		deadline := time.Now().Add(wait)
		for n := 0; n < wlK && time.Now().Before(deadline); {
			k, err := b.rcq.Poll(b.wcs[:1])
			if err != nil {
				t.Fatalf("poll: %v", err)
			}
			if k == 0 {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			wc := b.wcs[0]
			if wc.WRID >= wlK || seen[wc.WRID] {
				t.Fatalf("receive completion %+v: unknown or repeated", wc)
			}
			seen[wc.WRID], w.recvs[wc.WRID] = true, wc
			n++
		}
		failed := false
		for j, wc := range w.recvs {
			switch {
			case !seen[j]:
				if w.lostRecvOK {
					t.Logf("known bug: receive %d never completed", j)
				} else {
					t.Errorf("receive %d never completed (no completion %v after its QP went to ERROR): the receive is lost", j, wait)
				}
				failed = true
			case wc.Status == verbs.StatusSuccess && !failed:
				if w.op == opkSend && int(wc.ByteLen) != w.size {
					t.Errorf("receive %d succeeded with %d bytes, want %d", j, wc.ByteLen, w.size)
				}
			case wc.Status == verbs.StatusWRFlush:
				failed = true
			default:
				t.Errorf("receive %d: %q after an earlier failure", j, wc.Status)
				failed = true
			}
		}
	}
	return w.recvSeen[i] && w.recvs[i].Status == verbs.StatusSuccess
}

// A fault case: what to do to the connection, and what must come of it.
type faultCase struct {
	name   string
	o      opts
	size   int                          // bytes per work request (0: wlSize)
	bidir  bool                         // b writes to a meanwhile (byte positions then approximate)
	slow   bool                         // a second or more: -short runs it for writes only
	before func(fp *fpair)              // before the transitions to RTR (no warm-up then)
	inject func(fp *fpair, w *workload) // after the warm-up, before posting
	during func(fp *fpair, w *workload) // after posting
	want   verbs.Status                 // status of the one failing work request
	maxOK  int                          // how many may succeed before it
	// bounds on the time from posting to the last completion
	minEl, maxEl func(fp *fpair) time.Duration
}

func stallBounds(fp *fpair) (time.Duration, time.Duration) {
	l := fp.stallLimit()
	return l, l*3/2 + slack()
}

// faultConnectLimit is how long work requests wait for a connection: the
// stall limit, at least a second (doc.go).
func faultConnectLimit(fp *fpair) time.Duration { return max(fp.stallLimit(), time.Second) }

var (
	fastOpts  = opts{timeout: 13, retry: 3} // 33.5 ms × 4 = 134 ms
	slowOpts  = opts{timeout: 18, retry: 3} // 1.07 s × 4 = 4.3 s: the watchdog never fires first
	stallMin  = func(fp *fpair) time.Duration { l, _ := stallBounds(fp); return l }
	stallMax  = func(fp *fpair) time.Duration { _, h := stallBounds(fp); return h }
	connMin   = faultConnectLimit
	connMax   = func(fp *fpair) time.Duration { return faultConnectLimit(fp)*3/2 + slack() }
	promptMax = func(fp *fpair) time.Duration { return fp.stallLimit() / 2 }
)

// scheduleAt places action at the position mid-second in the data stream.
func scheduleMid(a faultnet.Action) func(fp *fpair, w *workload) {
	return func(fp *fpair, w *workload) {
		fp.p.Schedule(faultnet.Step{Conn: 0, On: w.dataDir(), After: w.midSecond(), Action: a})
	}
}

var faultCases = []faultCase{
	{name: "stall-both", o: fastOpts, inject: func(fp *fpair, _ *workload) { fp.p.Stall(faultnet.Both) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	{name: "stall-requests", o: fastOpts, inject: func(fp *fpair, _ *workload) { fp.p.Stall(fp.reqDir) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	{name: "stall-responses", o: fastOpts, inject: func(fp *fpair, _ *workload) { fp.p.Stall(fp.respDir) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	// Large transfers: the socket fills, so a writer goroutine is blocked
	// when the fault strikes (requester's for requests, responder's for
	// read responses).
	{name: "stall-requests-large", o: fastOpts, size: 4 << 20, inject: func(fp *fpair, _ *workload) { fp.p.Stall(fp.reqDir) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	{name: "stall-responses-large", o: fastOpts, size: 4 << 20, inject: func(fp *fpair, _ *workload) { fp.p.Stall(fp.respDir) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	// Traffic both ways: b's own work requests end alike.
	{name: "stall-both-bidir", o: fastOpts, bidir: true, inject: func(fp *fpair, _ *workload) { fp.p.Stall(faultnet.Both) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	{name: "reset-mid-bidir", o: slowOpts, bidir: true, inject: scheduleMid(faultnet.Reset),
		want: verbs.StatusRetryExceeded, maxOK: 1, maxEl: promptMax},
	{name: "delay-under-bidir", o: opts{timeout: 14, retry: 7}, bidir: true, inject: func(fp *fpair, _ *workload) { fp.p.Delay(faultnet.Both, 3*time.Millisecond) },
		want: verbs.StatusSuccess, maxOK: wlK},
	{name: "stall-transient", o: opts{timeout: 16, retry: 3}, inject: func(fp *fpair, _ *workload) { fp.p.Stall(faultnet.Both) },
		during: func(fp *fpair, _ *workload) { time.Sleep(100 * time.Millisecond); fp.p.Resume(faultnet.Both) },
		want:   verbs.StatusSuccess, maxOK: wlK},
	{name: "reset-mid", o: slowOpts, inject: scheduleMid(faultnet.Reset),
		want: verbs.StatusRetryExceeded, maxOK: 1, maxEl: promptMax},
	{name: "drop-mid", o: slowOpts, inject: scheduleMid(faultnet.Drop),
		want: verbs.StatusRetryExceeded, maxOK: 1, maxEl: promptMax},
	{name: "reset-mid-large", o: slowOpts, size: 4 << 20, inject: scheduleMid(faultnet.Reset),
		want: verbs.StatusRetryExceeded, maxOK: 1, maxEl: promptMax},
	{name: "truncate-mid", o: slowOpts, inject: func(fp *fpair, w *workload) {
		base := fp.reqBase
		if w.dataDir() == fp.respDir {
			base = fp.rspBase
		}
		fp.p.Truncate(w.dataDir(), w.midSecond()-base)
	}, want: verbs.StatusRetryExceeded, maxOK: 1, maxEl: promptMax},
	{name: "reset-responses", o: slowOpts, inject: func(fp *fpair, _ *workload) {
		fp.p.Schedule(faultnet.Step{Conn: 0, On: fp.respDir, After: fp.rspBase, Action: faultnet.Reset})
	}, want: verbs.StatusRetryExceeded, maxEl: promptMax},
	{name: "delay-under", o: opts{timeout: 14, retry: 7}, inject: func(fp *fpair, _ *workload) { fp.p.Delay(faultnet.Both, 3*time.Millisecond) },
		want: verbs.StatusSuccess, maxOK: wlK},
	{name: "delay-under-large", o: opts{timeout: 14, retry: 7}, size: 1 << 20, inject: func(fp *fpair, _ *workload) { fp.p.Delay(faultnet.Both, 2*time.Millisecond) },
		want: verbs.StatusSuccess, maxOK: wlK},
	{name: "delay-over", o: fastOpts, inject: func(fp *fpair, _ *workload) { fp.p.Delay(faultnet.Both, 2*time.Second) },
		want: verbs.StatusRetryExceeded, minEl: stallMin, maxEl: stallMax},
	{name: "refuse-reset", slow: true, o: fastOpts, before: func(fp *fpair) { fp.p.Refuse(faultnet.RefuseReset) },
		want: verbs.StatusRetryExceeded, minEl: connMin, maxEl: connMax},
	{name: "refuse-closed", slow: true, o: fastOpts, before: func(fp *fpair) { fp.p.Refuse(faultnet.RefuseClosed) },
		want: verbs.StatusRetryExceeded, minEl: connMin, maxEl: connMax},
	{name: "stall-connect", slow: true, o: fastOpts, before: func(fp *fpair) { fp.p.Stall(faultnet.Both) },
		want: verbs.StatusRetryExceeded, minEl: connMin, maxEl: connMax},
	// The handshake cut: the dialer's hello (Up is always the dialer's
	// direction) or the acceptor's answer.
	{name: "drop-hello-connect", o: opts{timeout: 17, retry: 7}, before: func(fp *fpair) {
		fp.p.Schedule(faultnet.Step{Conn: 0, On: faultnet.Up, After: fHelloLen / 2, Action: faultnet.Drop})
	}, want: verbs.StatusSuccess, maxOK: wlK},
	// Once the acceptor has taken a connection its QP accepts no other, so
	// the dialer's retries are all turned away: the pair fails, cleanly
	// (fault_bugs_test.go has the case that expects it to recover). The acceptor sees the end at
	// once; a requester that dials retries until the connect limit.
	{name: "drop-hello-accept", slow: true, o: fastOpts, before: func(fp *fpair) {
		fp.p.Schedule(faultnet.Step{Conn: 0, On: faultnet.Down, After: fHelloLen / 2, Action: faultnet.Drop})
	}, want: verbs.StatusRetryExceeded, maxEl: connMax},
	{name: "refuse-transient", o: opts{timeout: 17, retry: 7}, before: func(fp *fpair) { fp.p.Refuse(faultnet.RefuseClosed) },
		during: func(fp *fpair, _ *workload) {
			time.Sleep(200 * time.Millisecond)
			if err := fp.p.Refuse(faultnet.RefuseNone); err != nil {
				fp.t.Error(err)
			}
		}, want: verbs.StatusSuccess, maxOK: wlK},
}

// knownBugs are the cases that fail on a transport bug (see
// fault_bugs_test.go, build tag faultbugs, which runs them strictly). Here
// they run with the failing check relaxed to a log line. None today: a
// receive taken by a SEND or WRITE_IMM whose payload never arrived whole
// used to vanish (reader.go popped it and dropped it on the read error);
// it now completes with WRFlush, and those cases are checked strictly.
var knownBugs = map[string]string{}

// TestFault runs every fault case with every kind of work request.
func TestFault(t *testing.T) {
	for _, c := range faultCases {
		for _, op := range opKinds {
			name := c.name + "/" + op.String()
			t.Run(name, func(t *testing.T) {
				if testing.Short() && c.slow && op != opkWrite {
					t.Skip("-short: slow connect cases run for writes only")
				}
				if bug, ok := knownBugs[name]; ok {
					t.Logf("known bug, checked strictly with -tags faultbugs: %s", bug)
					runFault(t, c, op, true)
					return
				}
				runFault(t, c, op, false)
			})
		}
	}
}

func runFault(t *testing.T, c faultCase, op opKind, lostRecvOK bool) {
	bound(t, 30*time.Second)
	var before func(*faultnet.Proxy)
	var fp *fpair
	if c.before != nil {
		before = func(p *faultnet.Proxy) {
			fp := &fpair{t: t, p: p}
			c.before(fp)
		}
	}
	size := c.size
	if size == 0 {
		size = wlSize
	}
	c.o.mrSize = wlMem(size)
	fp = newFaultPair(t, c.o, before)
	if c.before == nil {
		fp.warmup()
	} else {
		fp.reqBase, fp.rspBase = fHelloLen, fHelloLen
	}
	w := newWorkload(fp, op, size)
	w.lostRecvOK = lostRecvOK
	if c.inject != nil {
		c.inject(fp, w)
	}
	maxEl := 10 * time.Second
	if c.maxEl != nil {
		maxEl = c.maxEl(fp)
	}
	start := time.Now()
	fp.a.post(w.wrs()...)
	if c.bidir {
		fp.b.post(w.backWrites()...)
	}
	if c.during != nil {
		c.during(fp, w)
	}
	wcs := fp.a.waitCQ(fp.a.scq, wlK, maxEl+slack())
	el := time.Since(start)
	ok := w.checkStatuses(wcs, c.want)
	backOK := 0
	if c.bidir {
		bwcs := fp.b.waitCQ(fp.b.scq, wlK, maxEl+slack())
		backOK = w.checkStatuses(bwcs, c.want)
		t.Logf("b's writes: %v", statuses(bwcs))
	}
	if ok > c.maxOK {
		t.Errorf("%d work requests succeeded despite the fault, at most %d may (%v)", ok, c.maxOK, statuses(wcs))
	}
	if c.minEl != nil && el < c.minEl(fp) {
		t.Errorf("completed after %v, before the %v limit", el, c.minEl(fp))
	}
	if el > maxEl {
		t.Errorf("completed after %v, later than %v", el, maxEl)
	}
	if c.want != verbs.StatusSuccess {
		fp.a.waitState(verbs.QPError, 2*time.Second)
		fp.a.post(verbs.SendWR{ID: 50, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(fp.a.mr, 0, 8),
			RemoteAddr: fp.b.mr.Addr(), RKey: fp.b.mr.RKey()})
		expect(t, fp.a.waitCQ(fp.a.scq, 1, 2*time.Second)[0], verbs.StatusWRFlush)
	}
	req, rsp := fp.finish()
	if c.bidir {
		// Frames of both requesters share each direction: which bytes of
		// a work request went through is not known, only what succeeded.
		w.checkData(ok, 1<<40, 1<<40)
		w.checkBackWrites(backOK)
	} else {
		w.checkData(ok, req, rsp)
	}
	if op.consumesRecv() {
		w.recvDone(0) // every receive has a completion
	}
	t.Logf("%v after %v; forwarded after the warm-up %d bytes a→b, %d b→a; proxy events %v", statuses(wcs), el.Round(time.Millisecond), req, rsp, fp.p.Events())
}

// A stall while the requester is in its RNR loop (a send without a
// receive, rnr_retry 7: forever) still ends in RetryExceeded: the RNR
// wait must not keep the watchdog from firing.
func TestFaultStallDuringRNR(t *testing.T) {
	bound(t, 30*time.Second)
	fp := newFaultPair(t, opts{timeout: 13, retry: 3, rnrRetry: 7, minRNR: 1}, nil)
	fp.warmup()
	a, b := fp.a, fp.b
	a.post(verbs.SendWR{ID: 0, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 64)},
		verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 64), RemoteAddr: b.mr.Addr() + 4096, RKey: b.mr.RKey()})
	a.noCompletion(a.scq, 50*time.Millisecond) // RNR NAKs and retries go round
	if fp.p.Forwarded(0, fp.respDir) <= fp.rspBase {
		t.Fatal("no RNR NAK went through")
	}
	fp.p.Stall(faultnet.Both)
	start := time.Now()
	wcs := a.waitCQ(a.scq, 2, fp.stallLimit()*3/2+slack())
	el := time.Since(start)
	expect(t, wcs[0], verbs.StatusRetryExceeded)
	expect(t, wcs[1], verbs.StatusWRFlush)
	if max := fp.stallLimit()*3/2 + slack(); el > max {
		t.Errorf("RetryExceeded after %v, later than %v", el, max)
	}
	a.waitState(verbs.QPError, 2*time.Second)
	t.Logf("stall during the RNR loop: RetryExceeded after %v (limit %v)", el, fp.stallLimit())
}

// With Timeout 0 a stalled connection never times out (doc.go: "never
// when Timeout is 0"); its end still fails the work request.
func TestFaultStallNoTimeout(t *testing.T) {
	bound(t, 30*time.Second)
	fp := newFaultPair(t, fastOpts, nil) // 134 ms, until Timeout becomes 0
	fp.warmup()
	a, b := fp.a, fp.b
	if err := a.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, Timeout: 0, RetryCount: 3, RNRRetry: 7}); err != nil {
		t.Fatal(err)
	}
	fp.p.Stall(faultnet.Both)
	a.post(verbs.SendWR{ID: 0, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 64), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.noCompletion(a.scq, 500*time.Millisecond) // well past 134 ms × 5/4
	fp.p.Reset()
	start := time.Now()
	expect(t, a.waitCQ(a.scq, 1, 2*time.Second)[0], verbs.StatusRetryExceeded)
	a.waitState(verbs.QPError, 2*time.Second)
	t.Logf("Timeout 0: no completion while stalled; RetryExceeded %v after the reset", time.Since(start))
}

// After a fault both QPs recover through RESET: the dialer dials the
// proxy again and traffic flows on the new connection.
func TestFaultRecover(t *testing.T) {
	bound(t, 30*time.Second)
	o := opts{timeout: 18, retry: 3, mrSize: wlMem(wlSize)}
	fp := newFaultPair(t, o, nil)
	fp.warmup()
	w := newWorkload(fp, opkWrite, wlSize)
	scheduleMid(faultnet.Reset)(fp, w)
	fp.a.post(w.wrs()...)
	wcs := fp.a.waitCQ(fp.a.scq, wlK, 5*time.Second)
	if ok := w.checkStatuses(wcs, verbs.StatusRetryExceeded); ok == wlK {
		t.Fatal("every write succeeded despite the reset")
	}
	fp.reconnect()
	a, b := fp.a, fp.b
	pattern(a.mr.Bytes()[:4096], 7)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 4096), RemoteAddr: b.mr.Addr() + 8, RKey: b.mr.RKey()},
		verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 8192, 4096), RemoteAddr: b.mr.Addr() + 8, RKey: b.mr.RKey()})
	for _, wc := range a.waitCQ(a.scq, 2, 5*time.Second) {
		expect(t, wc, verbs.StatusSuccess)
	}
	if !bytes.Equal(a.mr.Bytes()[:4096], b.mr.Bytes()[8:8+4096]) || !bytes.Equal(a.mr.Bytes()[:4096], a.mr.Bytes()[8192:8192+4096]) {
		t.Fatal("data differs after reconnecting")
	}
	if n := fp.p.Conns(); n != 2 {
		t.Fatalf("%d connections through the proxy, want 2", n)
	}
}
