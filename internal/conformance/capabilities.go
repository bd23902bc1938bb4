package conformance

// Device capabilities. Real devices differ where the verbs specification
// lets them, and the suite must hold each to what it says it can do rather
// than fail it for what it says it cannot:
//
//   - atomics: a device whose AtomicCap is NONE (siw) must refuse atomics at
//     post time with verbs.ErrNotSupported;
//   - iWARP (NodeType "RNIC": siw, Chelsio, ...) has no immediate data, no
//     receiver-not-ready retry (a Send without a posted receive terminates
//     the connection), RDMA Read into one local SGE only, and completes
//     Writes and Sends when they are transmitted, so remote errors surface
//     as the connection's termination (the QP goes to ERROR) rather than in
//     that work request's completion, and error completions may come out of
//     order;
//   - devices may use one key for local and remote access (rxe, siw: lkey
//     == rkey), so "an lkey used as an rkey" cannot be refused there;
//   - the IBA leaves some error codes to the responder: a QP without
//     remote-write access may NAK with Remote Access or Invalid Request
//     (rxe), a receive that is too small with Invalid Request or Remote
//     Operational error (rxe), and an invalid lkey may complete with Local
//     Protection or Local QP Operation error (rxe, siw);
//   - a device may round a CQ's size up (rxe: 4 → 7): overflow is checked
//     against the granted capacity;
//   - max_inline_data below what a case wants is used as the limit.
//
// The hook: init below wraps the suite's cases; each wrapper looks at the
// device of the local peer and runs a capability-aware variant where the
// device says it differs, the original case otherwise. Transports that can
// do everything (shm, tcp) run the cases unchanged, except that the
// loosened status sets above accept either IBA-permitted code.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Caps says what a device can do, where devices legitimately differ.
type Caps struct {
	Atomics bool
	// IWARP: no immediate data, no RNR retry, remote errors end the
	// connection instead of completing the work request, RDMA Read into one
	// SGE, no zero-length Read without an SGE.
	IWARP bool
	// MaxInline is the device's max_inline_data (0: unknown, no limit).
	MaxInline int
	// NoRemoteReadCheck: the device serves RDMA Read from a region without
	// REMOTE_READ, and NoQPAccessCheck: it ignores a QP's remote access
	// flags — known defects of siw in Linux 6.1 (read responses are checked
	// with no permission bits; SIW_RDMA_{READ,WRITE}_ENABLED are set but
	// never tested on receive).
	NoRemoteReadCheck, NoQPAccessCheck bool
	// SeparateKeys: the device declares lkey != rkey.
	SeparateKeys bool
	// Software transports are rdmakit's own: they get no leeway in the
	// error codes the IBA leaves to implementations.
	Software bool
}

// CapsOf reads the capabilities the device declares (DeviceInfo.Caps):
// nothing is guessed from names, node types or vendors.
func CapsOf(info verbs.DeviceInfo) Caps {
	d := info.Caps
	return Caps{
		Atomics: d.Has(verbs.CapAtomics),
		// The iWARP bundle: remote errors end the connection, no RNR
		// retry, no immediate data.
		IWARP:     !d.Has(verbs.CapRemoteErrorCompletion) || !d.Has(verbs.CapRNRRetry) || !d.Has(verbs.CapImmediate),
		MaxInline: info.MaxInline,

		SeparateKeys:      d.Has(verbs.CapSeparateKeys),
		Software:          d.Has(verbs.CapStrictStatus),
		NoRemoteReadCheck: !d.Has(verbs.CapRemoteAccessChecks),
		NoQPAccessCheck:   !d.Has(verbs.CapRemoteAccessChecks),
	}
}

func (c Caps) full() bool { return c.Atomics && !c.IWARP && (c.MaxInline == 0 || c.MaxInline >= 256) }

// variants replace cases by name; each gets the device's capabilities.
var variants = map[string]func(t *testing.T, e *env, c Caps){
	"read-sizes":         capReadSizes,
	"immediate":          capImmediate,
	"multi-sge":          capMultiSGE,
	"inline":             capInline,
	"atomics":            capNoAtomics,
	"misaligned-atomic":  capMisalignedAtomic,
	"fetch-add-2x4":      capNoAtomics,
	"rnr-retry-exceeded": capRNRExceeded,
	"rnr-then-receive":   capRNRThenRecv,
	"peer-death":         capPeerDeath,
}

// withCaps adapts a capability-aware case to the case table; these cases
// hold every device to the same rules, with the leeway Caps grants.
func withCaps(f func(t *testing.T, e *env, c Caps)) func(t *testing.T, e *env) {
	return func(t *testing.T, e *env) { f(t, e, CapsOf(e.a.Context().Info())) }
}

// origs are the unwrapped cases, by name.
var origs = map[string]func(t *testing.T, e *env){}

func init() {
	for i := range cases {
		c := &cases[i]
		orig, name := c.fn, c.name
		origs[name] = orig
		c.fn = func(t *testing.T, e *env) {
			caps := CapsOf(e.a.Context().Info())
			if f, ok := variants[name]; ok && !caps.full() {
				f(t, e, caps)
				return
			}
			orig(t, e)
		}
	}
}

// expectOneOf fails unless wc's status is one of sts.
func expectOneOf(t *testing.T, wc WC, sts ...verbs.Status) {
	t.Helper()
	for _, s := range sts {
		if wc.Status == s {
			return
		}
	}
	t.Fatalf("wr %d completed with %q, want one of %q", wc.ID, wc.Status, sts)
}

// expectNotSupported fails unless err says the device cannot do it.
func expectNotSupported(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, verbs.ErrNotSupported) {
		t.Fatalf("%s on a device without it: got %v, want %v", what, err, verbs.ErrNotSupported)
	}
}

// waitState waits up to d for the QP to reach st.
func waitState(t *testing.T, p Peer, idx int, st verbs.QPState, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		s, err := p.State(idx)
		must(t, err)
		if s == st {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QP is %s after %v, want %s", s, d, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// byID indexes completions by work request id (iWARP may complete error
// work requests out of order).
func byID(wcs []WC) map[uint64]WC {
	m := map[uint64]WC{}
	for _, w := range wcs {
		m[w.ID] = w
	}
	return m
}

func capReadSizes(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testReadSizes(t, e)
		return
	}
	ia, _ := e.pair(t, defaultOpts, defaultOpts)
	for i, n := range sizes {
		if n == 0 {
			// iWARP Read takes exactly one SGE; a zero-length one is
			// refused like any other count.
			err := e.a.PostSend(ia, []WR{{ID: 99, Op: verbs.OpRead, Signaled: true, Region: "src", RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}})
			expectNotSupported(t, err, "RDMA Read without an SGE")
			continue
		}
		must(t, e.b.Fill("rw", 5, n, byte(i+7)))
		e.post(t, e.a, ia, []WR{{ID: uint64(i), Op: verbs.OpRead, Signaled: true, Region: "src", Off: 1, Lens: lens(n),
			RemoteAddr: e.rb["rw"].Addr + 5, RKey: e.rb["rw"].RKey}})
		wc := e.poll(t, e.a, ia, false, 1)[0]
		expectStatus(t, wc, verbs.StatusSuccess)
		hashEq(t, e.a, "src", 1, e.b, "rw", 5, n)
	}
}

func capImmediate(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testImmediate(t, e)
		return
	}
	ia, ib := e.pair(t, defaultOpts, defaultOpts)
	must(t, e.b.PostRecv(ib, 1, "rw", 0, []int{8192}))
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 1, Op: verbs.OpSendWithImm, Signaled: true, Region: "src", Lens: []int{16}, Imm: 7}}), "SendWithImm")
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 2, Op: verbs.OpWriteWithImm, Signaled: true, Region: "src", Lens: []int{16}, Imm: 7,
		RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}}), "WriteWithImm")
	// The QP is still usable: a plain Send consumes the posted receive.
	e.post(t, e.a, ia, []WR{{ID: 3, Op: verbs.OpSend, Signaled: true, Region: "src", Lens: []int{16}}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	if r := e.poll(t, e.b, ib, true, 1)[0]; r.Status != 0 || r.ByteLen != 16 || r.Flags&verbs.WCWithImm != 0 {
		t.Fatalf("receive %+v", r)
	}
}

func capMultiSGE(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testMultiSGE(t, e)
		return
	}
	ia, ib := e.pair(t, defaultOpts, defaultOpts)
	gl := []int{3, 100, 4093, 1, 65536}
	total := 0
	for _, n := range gl {
		total += n
	}
	must(t, e.a.Fill("src", 7, total, 42))
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpWrite, Signaled: true, Region: "src", Off: 7, Lens: gl,
		RemoteAddr: e.rb["rw"].Addr + 11, RKey: e.rb["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	hashEq(t, e.a, "src", 7, e.b, "rw", 11, total)

	must(t, e.b.PostRecv(ib, 5, "rw", 100000, []int{10, 5, 2000, 70000}))
	e.post(t, e.a, ia, []WR{{ID: 2, Op: verbs.OpSend, Signaled: true, Region: "src", Off: 7, Lens: gl}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	if r := e.poll(t, e.b, ib, true, 1)[0]; r.Status != 0 || r.ByteLen != uint32(total) {
		t.Fatalf("receive %+v", r)
	}
	hashEq(t, e.a, "src", 7, e.b, "rw", 100000, total)

	// iWARP Read scatters into one SGE only.
	must(t, e.b.Fill("rw", 0, total, 9))
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 3, Op: verbs.OpRead, Signaled: true, Region: "src", Off: 1, Lens: gl,
		RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}}), "RDMA Read into several SGEs")
	e.post(t, e.a, ia, []WR{{ID: 4, Op: verbs.OpRead, Signaled: true, Region: "src", Off: 1, Lens: []int{total},
		RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	hashEq(t, e.a, "src", 1, e.b, "rw", 0, total)
}

func capInline(t *testing.T, e *env, c Caps) {
	n := 200
	if c.MaxInline > 0 && c.MaxInline < n {
		n = c.MaxInline
	}
	if n == 0 {
		t.Skip("device has no inline data")
	}
	ia, ib := e.pair(t, defaultOpts, defaultOpts)
	must(t, e.b.PostRecv(ib, 1, "rw", 0, []int{256}))
	must(t, e.a.Fill("src", 0, n, 1))
	want, _ := e.a.Read("src", 0, n)
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpSend, Inline: true, Signaled: true, Region: "src", Lens: []int{n}}})
	must(t, e.a.Fill("src", 0, n, 2))
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	e.poll(t, e.b, ib, true, 1)
	got, err := e.b.Read("rw", 0, n)
	must(t, err)
	if string(got) != string(want) {
		t.Fatal("inline send delivered data changed after posting")
	}
	if err := e.a.PostSend(ia, []WR{{ID: 2, Op: verbs.OpSend, Inline: true, Region: "src", Lens: []int{4096}}}); err == nil {
		t.Fatalf("4096-byte inline send accepted with max_inline_data %d", c.MaxInline)
	}
}

// capNoAtomics: a device without atomics refuses them at post time.
func capNoAtomics(t *testing.T, e *env, c Caps) {
	if c.Atomics {
		origs[t.Name()[strings.LastIndex(t.Name(), "/")+1:]](t, e)
		return
	}
	ia, _ := e.pair(t, defaultOpts, defaultOpts)
	word := e.rb["rw"].Addr + 1<<16
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 1, Op: verbs.OpFetchAndAdd, Signaled: true, Region: "src", Off: 64, Lens: []int{8},
		RemoteAddr: word, RKey: e.rb["rw"].RKey, CompareAdd: 5}}), "FetchAndAdd")
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 2, Op: verbs.OpCompareAndSwap, Signaled: true, Region: "src", Off: 64, Lens: []int{8},
		RemoteAddr: word, RKey: e.rb["rw"].RKey, CompareAdd: 0, Swap: 99}}), "CompareAndSwap")
	// Nothing was posted: the QP still works.
	e.post(t, e.a, ia, []WR{{ID: 3, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{8}, RemoteAddr: word, RKey: e.rb["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
}

func capMisalignedAtomic(t *testing.T, e *env, c Caps) {
	if c.Atomics {
		testMisalignedAtomic(t, e)
		return
	}
	ia, _ := e.pair(t, defaultOpts, defaultOpts)
	expectNotSupported(t, e.a.PostSend(ia, []WR{{ID: 1, Op: verbs.OpFetchAndAdd, Signaled: true, Region: "src", Lens: []int{8},
		RemoteAddr: e.rb["rw"].Addr + 4, RKey: e.rb["rw"].RKey, CompareAdd: 1}}), "misaligned FetchAndAdd")
}

// capRNRExceeded: on iWARP a Send without a posted receive is fatal to the
// connection: both QPs end in ERROR and every work request completes.
func capRNRExceeded(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testRNRExceeded(t, e)
		return
	}
	o := QPOpts{RNRRetry: 2, MinRNRTimer: 1, Timeout: 14, RetryCount: 7}
	ia, ib := e.pair(t, o, o)
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpSend, Signaled: true, Region: "src", Lens: []int{10}}})
	e.poll(t, e.a, ia, false, 1)
	waitState(t, e.b, ib, verbs.QPError, 10*time.Second)
	waitState(t, e.a, ia, verbs.QPError, 10*time.Second)
	e.post(t, e.a, ia, []WR{{ID: 2, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{10}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusWRFlush)
}

func capRNRThenRecv(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testRNRThenRecv(t, e)
		return
	}
	t.Skip("iWARP has no receiver-not-ready retry: a Send needs a posted receive (rnr-retry-exceeded checks that its absence is fatal)")
}

type badAccess struct {
	name   string
	wr     WR
	region string
	off, n int
	qpAcc  verbs.Access
	alt    []verbs.Status // other IBA-permitted statuses
}

func capRemoteAccess(t *testing.T, e *env, c Caps) {
	rb := e.rb
	bads := []badAccess{
		{"write-without-REMOTE_WRITE", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: rb["ro"].Addr, RKey: rb["ro"].RKey}, "ro", 0, 64, 0, nil},
		{"read-without-REMOTE_READ", WR{Op: verbs.OpRead, Lens: []int{16}, RemoteAddr: rb["wo"].Addr, RKey: rb["wo"].RKey}, "wo", 0, 64, 0, nil},
		{"atomic-without-REMOTE_ATOMIC", WR{Op: verbs.OpFetchAndAdd, Lens: []int{8}, CompareAdd: 1, RemoteAddr: rb["wo"].Addr, RKey: rb["wo"].RKey}, "wo", 0, 64, 0, nil},
		{"wrong-rkey", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: rb["rw"].Addr, RKey: rb["rw"].RKey ^ 0x5a5a5a5a}, "rw", 0, 64, 0, nil},
		{"lkey-as-rkey", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: rb["rw"].Addr, RKey: rb["rw"].LKey}, "rw", 0, 64, 0, nil},
		{"deregistered-mr", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: rb["stale"].Addr, RKey: rb["stale"].RKey}, "rw", 0, 64, 0, nil},
		{"write-one-byte-past-end", WR{Op: verbs.OpWrite, Lens: []int{7}, RemoteAddr: rb["wo"].Addr + SmallSize - 6, RKey: rb["wo"].RKey}, "wo", SmallSize - 64, 64, 0, nil},
		{"read-one-byte-past-end", WR{Op: verbs.OpRead, Lens: []int{2}, RemoteAddr: rb["ro"].Addr + SmallSize - 1, RKey: rb["ro"].RKey}, "ro", SmallSize - 64, 64, 0, nil},
		{"write-before-start", WR{Op: verbs.OpWrite, Lens: []int{8}, RemoteAddr: rb["wo"].Addr - 4, RKey: rb["wo"].RKey}, "wo", 0, 64, 0, nil},
		{"qp-without-remote-write", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: rb["rw"].Addr, RKey: rb["rw"].RKey}, "rw", 0, 64, verbs.AccessRemoteRead,
			[]verbs.Status{verbs.StatusRemoteInvalidReq}},
	}
	for _, bc := range bads {
		t.Run(bc.name, func(t *testing.T) {
			if bc.name == "lkey-as-rkey" && rb["rw"].LKey == rb["rw"].RKey && !c.SeparateKeys {
				t.Skip("the device uses one key for local and remote access (lkey == rkey)")
			}
			if bc.name == "read-without-REMOTE_READ" && c.NoRemoteReadCheck {
				t.Skip("known device defect: siw does not check REMOTE_READ on read responses")
			}
			if bc.name == "qp-without-remote-write" && c.NoQPAccessCheck {
				t.Skip("known device defect: siw does not check a QP's remote access flags")
			}
			if bc.wr.Op.IsAtomic() && !c.Atomics {
				t.Skip("the device has no atomics")
			}
			ob := defaultOpts
			ob.Access = bc.qpAcc
			ia, _ := e.pair(t, defaultOpts, ob)
			before, err := e.b.Hash(bc.region, bc.off, bc.n)
			must(t, err)
			must(t, e.a.Fill("src", 0, 64, 0xee))
			w := bc.wr
			w.ID, w.Signaled, w.Region = 1, true, "src"
			good := WR{ID: 2, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{8}, RemoteAddr: rb["rw"].Addr + 1<<20, RKey: rb["rw"].RKey}
			e.post(t, e.a, ia, []WR{w, good})
			wcs := e.poll(t, e.a, ia, false, 2)
			if c.IWARP {
				// Writes complete when transmitted; the refusal comes back as
				// a TERMINATE that ends the connection. A Read's completion
				// carries the error.
				if bc.wr.Op == verbs.OpRead {
					if wc := byID(wcs)[1]; wc.Status == verbs.StatusSuccess {
						t.Fatalf("refused RDMA Read completed with success")
					}
				}
				waitState(t, e.a, ia, verbs.QPError, 10*time.Second)
			} else {
				alt := bc.alt
				if c.Software {
					alt = nil
				}
				expectOneOf(t, wcs[0], append([]verbs.Status{verbs.StatusRemoteAccess}, alt...)...)
				expectStatus(t, wcs[1], verbs.StatusWRFlush)
				if s, _ := e.a.State(ia); s != verbs.QPError {
					t.Fatalf("requester QP is %s, want ERROR", s)
				}
			}
			after, err := e.b.Hash(bc.region, bc.off, bc.n)
			must(t, err)
			if before != after {
				t.Fatal("target memory changed by a refused operation")
			}
			e.post(t, e.a, ia, []WR{good})
			expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusWRFlush)
		})
	}
}

func capLocalProtection(t *testing.T, e *env, c Caps) {
	for _, lc := range []struct {
		name string
		wr   WR
	}{
		{"bad-lkey", WR{Op: verbs.OpWrite, Region: "src", Lens: []int{8}, LKey: 0x12345678, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}},
		{"sge-past-end", WR{Op: verbs.OpWrite, Region: "local", Off: SmallSize - 4, Lens: []int{8}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}},
		{"read-into-mr-without-LOCAL_WRITE", WR{Op: verbs.OpRead, Region: "readonly", Lens: []int{8}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}},
	} {
		t.Run(lc.name, func(t *testing.T) {
			ia, _ := e.pair(t, defaultOpts, defaultOpts)
			w := lc.wr
			w.ID, w.Signaled = 1, true
			e.post(t, e.a, ia, []WR{w, {ID: 2, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{8}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}})
			wcs := e.poll(t, e.a, ia, false, 2)
			local := []verbs.Status{verbs.StatusLocalProtection, verbs.StatusLocalQPOperation}
			if c.Software {
				local = local[:1]
			}
			if c.IWARP {
				// A Read's local sink is checked when the response arrives,
				// after later Writes may have completed.
				m := byID(wcs)
				if m[1].Status == verbs.StatusSuccess || m[1].Status == verbs.StatusWRFlush {
					t.Fatalf("wr 1 completed with %q, want a local error", m[1].Status)
				}
				waitState(t, e.a, ia, verbs.QPError, 10*time.Second)
				return
			}
			expectOneOf(t, wcs[0], local...)
			expectStatus(t, wcs[1], verbs.StatusWRFlush)
		})
	}
}

func capRecvTooSmall(t *testing.T, e *env, c Caps) {
	ia, ib := e.pair(t, defaultOpts, defaultOpts)
	must(t, e.b.PostRecv(ib, 1, "rw", 0, []int{10}))
	must(t, e.b.PostRecv(ib, 2, "rw", 64, []int{1000}))
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpSend, Signaled: true, Region: "src", Lens: []int{100}}})
	wc := e.poll(t, e.a, ia, false, 1)[0]
	switch {
	case c.Software:
		expectStatus(t, wc, verbs.StatusRemoteInvalidReq)
	case !c.IWARP:
		// IBA: NAK Invalid Request; rxe NAKs Remote Operational Error.
		expectOneOf(t, wc, verbs.StatusRemoteInvalidReq, verbs.StatusRemoteOperation)
	}
	r := e.poll(t, e.b, ib, true, 2)
	if c.Software {
		expectStatus(t, r[0], verbs.StatusLocalLength)
	} else {
		// IBA: local length error; rxe reports a local QP operation error.
		expectOneOf(t, r[0], verbs.StatusLocalLength, verbs.StatusLocalQPOperation)
	}
	expectStatus(t, r[1], verbs.StatusWRFlush)
	waitState(t, e.b, ib, verbs.QPError, 2*time.Second)
}

// capCQOverflow overflows the CQ the device granted, which may be larger
// than the 4 entries asked for.
func capCQOverflow(t *testing.T, e *env, c Caps) {
	o := defaultOpts
	o.CQSize = 4
	o.SendWR = 64
	ia, _ := e.pair(t, o, defaultOpts)
	e.a.mu.Lock()
	granted := e.a.qps[ia].scq.Cap()
	e.a.mu.Unlock()
	if granted+4 > o.SendWR {
		t.Skipf("the device grants %d entries for a 4-entry CQ", granted)
	}
	var wrs []WR
	for i := 0; i < granted+4; i++ {
		wrs = append(wrs, WR{ID: uint64(i), Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{8}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey})
	}
	e.post(t, e.a, ia, wrs)
	// Let every work request execute before polling: a transport that
	// completes asynchronously (tcp) would otherwise have its completions
	// drained as they arrive and never overflow. Overflow moves the QP to
	// ERROR where verbs implements the CQ; give devices a moment either way.
	settle := time.Now().Add(time.Second)
	for time.Now().Before(settle) {
		if s, _ := e.a.State(ia); s == verbs.QPError {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(pollTimeout)
	got := 0
	for {
		wcs, err := e.a.Poll(ia, false, len(wrs), 50*time.Millisecond)
		got += len(wcs)
		if err != nil {
			if !strings.Contains(err.Error(), "overflow") {
				t.Fatalf("poll error %v, want an overflow error", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no overflow reported after %d of %d completions into a %d-entry CQ", got, len(wrs), granted)
		}
	}
	if got > granted {
		t.Fatalf("%d completions from a %d-entry CQ", got, granted)
	}
}

// capPeerDeath (iWARP): Sends without receives end an iWARP connection by
// themselves, so the victim gets writes only; after it dies the QP must
// reach ERROR and flush within a bounded time.
func capPeerDeath(t *testing.T, e *env, c Caps) {
	if !c.IWARP {
		testPeerDeath(t, e)
		return
	}
	victim, closeV, err := e.newPeer()
	must(t, err)
	o := QPOpts{RNRRetry: 7, MinRNRTimer: 1, Timeout: 12, RetryCount: 3}
	ia, ib := connect(t, e.a, victim, o, o)
	regs, _ := victim.Regions()
	e.post(t, e.a, ia, []WR{{ID: 0, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{4096}, RemoteAddr: regs["rw"].Addr, RKey: regs["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	start := time.Now()
	if rp, ok := victim.(*remotePeer); ok {
		rp.Kill()
	} else {
		victim.CloseQP(ib)
		closeV()
	}
	waitState(t, e.a, ia, verbs.QPError, 10*time.Second)
	t.Logf("peer death surfaced as QP ERROR after %v", time.Since(start).Round(time.Millisecond))
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpWrite, Signaled: true, Region: "src", Lens: []int{8}, RemoteAddr: regs["rw"].Addr, RKey: regs["rw"].RKey}})
	if wc := e.poll(t, e.a, ia, false, 1)[0]; wc.Status == verbs.StatusSuccess {
		t.Fatal("write to a dead peer completed with success")
	}
	if _, ok := victim.(*remotePeer); ok {
		closeV()
	}
}
