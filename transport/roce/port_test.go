package roce

import (
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestPort4791 runs two endpoints on the RoCEv2 port itself, on two
// loopback addresses (what two programs on one host do).
func TestPort4791(t *testing.T) {
	needDevices(t)
	open := func(addr string) *verbs.Context {
		t.Helper()
		old := os.Getenv(EnvAddr)
		os.Setenv(EnvAddr, addr)
		defer os.Setenv(EnvAddr, old)
		ctx, err := verbs.Open(testDevice, verbs.Options{})
		if errors.Is(err, syscall.EADDRINUSE) {
			t.Skipf("SKIP (loud): %s is taken on this host (another RoCE endpoint or test run): %v", addr, err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctx.Close() })
		return ctx
	}
	ca, cb := open("127.0.0.1"), open("127.0.0.2")
	if a := LocalAddr(ca); a.Port() != 4791 {
		t.Fatalf("bound %s", a)
	}
	a, b := newSide(t, ca, 1<<20), newSide(t, cb, 1<<20)
	link(t, a, b, verbs.MTU1024)
	fill(a.mr.Bytes()[:300000], 3)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 300000)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*1e9)
	sameBytes(t, "written", b.mr.Bytes()[:300000], a.mr.Bytes()[:300000])
	b.post(verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{b.mr.SGE(500000, 300000)},
		RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()})
	b.wait(b.scq, 1, 10*1e9)
	sameBytes(t, "read", b.mr.Bytes()[500000:800000], a.mr.Bytes()[:300000])
}
