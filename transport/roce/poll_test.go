package roce

import (
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Goroutines that poll their CQs receive the datagrams themselves
// (Progress), the progress goroutines stepping aside: Writes land and
// complete, every datagram counted as polled.
func TestPollerReceives(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.MTU1024)
	testPollOnly.Store(true)
	defer testPollOnly.Store(false)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the responder's application, polling
		defer close(done)
		var wcs [1]verbs.WorkCompletion
		for {
			select {
			case <-stop:
				return
			default:
			}
			b.rcq.Poll(wcs[:0])
			runtime.Gosched()
		}
	}()
	defer func() { close(stop); <-done }()
	fill(a.mr.Bytes()[:256<<10], 7)
	for i := 0; i < 16; i++ {
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(i<<14, 16<<10)}, RemoteAddr: b.mr.Addr() + uint64(i<<14), RKey: b.mr.RKey()})
		a.wait(a.scq, 1, 10*time.Second)
	}
	sameBytes(t, "written", b.mr.Bytes()[:256<<10], a.mr.Bytes()[:256<<10])
	for _, s := range []*side{a, b} {
		if st, _ := Stats(s.ctx); st.RxPolled != st.RxPackets || st.RxPackets == 0 {
			t.Fatalf("%d of %d datagrams received by polling goroutines, want all", st.RxPolled, st.RxPackets)
		}
	}
}

// A poller holds the endpoint while a Write arrives; the progress
// goroutine finds it held and leaves the datagram to it. The poller lets
// go and never polls again: the Write must still land, with nobody
// polling (the test watches memory, not a CQ), and without the
// requester's ACK timeout sending it again.
func TestPollerHandsBack(t *testing.T) {
	a, b := pair(t, 1<<16, verbs.MTU1024)
	ep := writeWhileHeld(t, a, b, 3)
	deadline := time.Now().Add(10 * time.Second)
	ep.endTurn() // the poller's turn ends; it never polls again
	for string(b.mr.Bytes()[:4096]) != string(a.mr.Bytes()[:4096]) {
		if time.Now().After(deadline) {
			t.Fatal("the Write never landed: a datagram was left in the socket")
		}
		time.Sleep(100 * time.Microsecond)
	}
	a.wait(a.scq, 1, 10*time.Second)
	if st, _ := Stats(a.ctx); st.Retransmits != 0 {
		t.Fatalf("the Write landed after %d retransmissions: the first copy was left in the socket", st.Retransmits)
	}
}

// A poller that stops with work left (its last batch was full, so the
// socket may hold more) wakes the progress goroutine, which finishes it:
// the Write lands without the requester sending it again.
func TestPollerWakes(t *testing.T) {
	a, b := pair(t, 1<<16, verbs.MTU1024)
	ep := writeWhileHeld(t, a, b, 5)
	// As if the poller had received a full batch before the Write came
	// and the progress goroutine's miss had been seen: only the wake-up
	// is left to bring the Write in.
	ep.missed.Store(false)
	ep.more = true
	if ep.unlockPoll() {
		t.Fatal("unlockPoll reported a miss that was cleared")
	}
	a.wait(a.scq, 1, 10*time.Second)
	sameBytes(t, "written", b.mr.Bytes()[:4096], a.mr.Bytes()[:4096])
	if st, _ := Stats(a.ctx); st.Retransmits != 0 {
		t.Fatalf("the Write landed after %d retransmissions: the progress goroutine was not woken", st.Retransmits)
	}
}

// writeWhileHeld holds b's endpoint as a poller would (stepMu), has a
// Write 4 KiB into b, and returns once b's progress goroutine has found
// the endpoint held (missed), with stepMu still held.
func writeWhileHeld(t *testing.T, a, b *side, seed uint64) *endpoint {
	t.Helper()
	ep := ctxOf(b.ctx).ep
	ep.stepMu.Lock()
	ep.missed.Store(false)
	fill(a.mr.Bytes()[:4096], seed)
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	deadline := time.Now().Add(10 * time.Second)
	for !ep.missed.Load() {
		if time.Now().After(deadline) {
			ep.stepMu.Unlock()
			t.Fatal("the progress goroutine never found the endpoint held")
		}
		time.Sleep(100 * time.Microsecond)
	}
	return ep
}
