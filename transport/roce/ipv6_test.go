package roce

import (
	"os"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestIPv6: two contexts on ::1 (the ICRC over the IPv6 pseudo header).
func TestIPv6(t *testing.T) {
	needDevices(t)
	old := os.Getenv(EnvAddr)
	os.Setenv(EnvAddr, "[::1]:0")
	ca, err := verbs.Open(testDevice, verbs.Options{})
	if err == nil {
		t.Cleanup(func() { ca.Close() })
	}
	cb, err2 := verbs.Open(testDevice, verbs.Options{})
	os.Setenv(EnvAddr, old)
	if err != nil || err2 != nil {
		t.Skipf("SKIP (loud): no IPv6 loopback here: %v %v", err, err2)
	}
	t.Cleanup(func() { cb.Close() })
	if !LocalAddr(ca).Addr().Is6() {
		t.Fatalf("bound %s", LocalAddr(ca))
	}
	a, b := newSide(t, ca, 1<<20), newSide(t, cb, 1<<20)
	link(t, a, b, verbs.MTU1024)
	fill(a.mr.Bytes()[:100000], 5)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 100000)},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*time.Second)
	sameBytes(t, "written over IPv6", b.mr.Bytes()[:100000], a.mr.Bytes()[:100000])
	if s, _ := Stats(cb); s.RxIDRecovered != 0 || s.RxBadICRC != 0 {
		t.Fatalf("counters %+v", s)
	}
}
