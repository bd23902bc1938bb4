package conformance

// Responder-side rules of the IBTA that every transport keeps: a responder
// that NAKs a request with a remote access error or an invalid request
// moves its own QP to ERROR and flushes its receives; a QP's remote access
// flags hold for zero-length requests too.

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	cases = append(cases,
		testCase{"responder-error-after-nak", withCaps(capResponderError)},
		testCase{"zero-length-write-needs-access", withCaps(capZeroLengthAccess)},
	)
}

func capResponderError(t *testing.T, e *env, c Caps) {
	for _, bc := range []struct {
		name string
		wr   WR
	}{
		{"wrong-rkey", WR{Op: verbs.OpWrite, Lens: []int{16}, RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey ^ 0x5a5a5a5a}},
		{"read-past-end", WR{Op: verbs.OpRead, Lens: []int{2}, RemoteAddr: e.rb["ro"].Addr + SmallSize - 1, RKey: e.rb["ro"].RKey}},
	} {
		t.Run(bc.name, func(t *testing.T) {
			ia, ib := e.pair(t, defaultOpts, defaultOpts)
			must(t, e.b.PostRecv(ib, 7, "rw", 0, []int{64}))
			must(t, e.b.PostRecv(ib, 8, "rw", 64, []int{64}))
			w := bc.wr
			w.ID, w.Signaled, w.Region = 1, true, "src"
			e.post(t, e.a, ia, []WR{w})
			wc := e.poll(t, e.a, ia, false, 1)[0]
			if wc.Status == verbs.StatusSuccess && (!c.IWARP || bc.wr.Op == verbs.OpRead) {
				// (iWARP completes a Write when it is sent; the refusal
				// terminates the connection.)
				t.Fatal("a refused request completed with success")
			}
			waitState(t, e.b, ib, verbs.QPError, 10*time.Second)
			r := e.poll(t, e.b, ib, true, 2)
			for _, x := range r {
				if x.Status != verbs.StatusWRFlush {
					t.Fatalf("responder receive %d completed with %q, want a flush", x.ID, x.Status)
				}
			}
		})
	}
}

func capZeroLengthAccess(t *testing.T, e *env, c Caps) {
	if c.NoQPAccessCheck {
		t.Skip("the device declares no remote access checks (siw in Linux 6.1 ignores a QP's access flags)")
	}
	ob := defaultOpts
	ob.Access = verbs.AccessRemoteRead // no remote write
	ia, ib := e.pair(t, defaultOpts, ob)
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpWrite, Signaled: true, Region: "src", RemoteAddr: e.rb["rw"].Addr, RKey: e.rb["rw"].RKey}})
	wc := e.poll(t, e.a, ia, false, 1)[0]
	if c.IWARP {
		// Writes complete when sent; the refusal ends the connection.
		waitState(t, e.a, ia, verbs.QPError, 10*time.Second)
		return
	}
	// The IBA lets a responder NAK this as an invalid request too (rxe
	// does); rdmakit's own transports say remote access.
	if c.Software {
		expectOneOf(t, wc, verbs.StatusRemoteAccess)
	} else {
		expectOneOf(t, wc, verbs.StatusRemoteAccess, verbs.StatusRemoteInvalidReq)
	}
	waitState(t, e.b, ib, verbs.QPError, 10*time.Second)
}

func init() {
	cases = append(cases, testCase{"inline-ignores-lkey", withCaps(capInlineIgnoresLKey)})
}

// capInlineIgnoresLKey: inline data is copied when posted and its SGE's
// lkey is not consulted (RNICs copy the bytes the CPU can read; rdmakit's
// software transports find them by address among the context's registered
// regions). The rule rdmakit promises on every transport: an inline SGE
// with a wrong lkey over registered memory is sent.
func capInlineIgnoresLKey(t *testing.T, e *env, c Caps) {
	n := 64
	if c.MaxInline > 0 && c.MaxInline < n {
		n = c.MaxInline
	}
	ia, _ := e.pair(t, defaultOpts, defaultOpts)
	must(t, e.a.Fill("src", 0, n, 9))
	want, _ := e.a.Read("src", 0, n)
	e.post(t, e.a, ia, []WR{{ID: 1, Op: verbs.OpWrite, Inline: true, Signaled: true, Region: "src", Lens: []int{n},
		LKey: 0x12345678, RemoteAddr: e.rb["rw"].Addr + 8192, RKey: e.rb["rw"].RKey}})
	expectStatus(t, e.poll(t, e.a, ia, false, 1)[0], verbs.StatusSuccess)
	got, err := e.b.Read("rw", 8192, n)
	must(t, err)
	if string(got) != string(want) {
		t.Fatal("inline write with a wrong lkey delivered other bytes")
	}
}
