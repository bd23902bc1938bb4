package roce

import (
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestWriteAllocs: a Write of several packets, its ACK and its
// completion allocate nothing in the steady state, on either side.
func TestWriteAllocs(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.MTU4096)
	wr := []verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 64<<10)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}
	var wcs [4]verbs.WorkCompletion
	op := func() {
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, err := a.scq.Poll(wcs[:])
			if err != nil || (n == 1 && wcs[0].Status != verbs.StatusSuccess) {
				t.Fatalf("%v %v", err, wcs[0].Status)
			}
			if n == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no completion")
			}
			runtime.Gosched()
		}
	}
	for i := 0; i < 100; i++ {
		op()
	}
	if n := testing.AllocsPerRun(200, op); n > 0 {
		t.Fatalf("%v allocations per 64 KiB Write", n)
	}
}
