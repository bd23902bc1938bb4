package tcp

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// openBusy opens a tcp context with busy polling on (whatever
// RDMAKIT_TCP_BUSY_POLL says), or off with bp < 0.
func openBusy(t *testing.T, bp time.Duration) *verbs.Context {
	t.Helper()
	ctx, err := verbs.Open(deviceName, verbs.Options{TCPBusyPoll: bp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	return ctx
}

// busyPair is newPair with busy polling on.
func busyPair(t *testing.T, o opts) (a, b *end) {
	t.Helper()
	o = o.withDefaults()
	a, b = newEnd(t, openBusy(t, 50*time.Microsecond), o, 0), newEnd(t, openBusy(t, 50*time.Microsecond), o, 0)
	connect(a, b, o)
	return a, b
}

// pollFrames returns how many frames pollers handled on qp's link.
func pollFrames(t *testing.T, qp *verbs.QP) uint64 {
	t.Helper()
	d := driverOf(t, qp)
	d.mu.Lock()
	l := d.link
	d.mu.Unlock()
	if l == nil {
		t.Fatal("no link")
	}
	return l.pollFrames.Load()
}

// spinCQ polls cq without sleeping until it has n completions.
func spinCQ(t *testing.T, e *end, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	var got []verbs.WorkCompletion
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n {
		k, err := cq.Poll(e.wcs[:min(len(e.wcs), n-len(got))])
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e.wcs[:k]...)
		if k == 0 && time.Now().After(deadline) {
			t.Fatalf("%d of %d completions", len(got), n)
		}
	}
	return got
}

// An application that polls handles its link's input itself; where
// nobody polls, the reader does.
func TestPollDrivesProgress(t *testing.T) {
	a, b := busyPair(t, opts{})
	wr := verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8),
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	for i := range 500 {
		a.mr.Bytes()[0] = byte(i)
		a.post(wr)
		expect(t, spinCQ(t, a, a.scq, 1)[0], verbs.StatusSuccess)
		if got := b.mr.Bytes()[0]; got != byte(i) {
			t.Fatalf("write %d: target holds %d", i, got)
		}
	}
	if n := pollFrames(t, a.qp); n == 0 {
		t.Error("the polling side's pollers handled no frame (its reader did all)")
	}
	if n := pollFrames(t, b.qp); n != 0 {
		t.Errorf("pollers handled %d frames on a side that never polls", n)
	}
}

// With busy polling off, polls leave the socket to the reader.
func TestPollOff(t *testing.T) {
	o := opts{}.withDefaults()
	a, b := newEnd(t, openBusy(t, -1), o, 0), newEnd(t, openBusy(t, -1), o, 0)
	connect(a, b, o)
	wr := verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8),
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	for range 50 {
		a.post(wr)
		expect(t, spinCQ(t, a, a.scq, 1)[0], verbs.StatusSuccess)
	}
	if n := pollFrames(t, a.qp); n != 0 {
		t.Errorf("pollers handled %d frames with busy polling off", n)
	}
}

// The reader takes over when the application stops polling: it goes to
// sleep in CQ.Wait, or it spins on memory instead (the peer's writes
// still land).
func TestPollHandoff(t *testing.T) {
	a, b := busyPair(t, opts{})
	// b polls (its reader leaves the socket to it), then waits.
	for round := range 20 {
		b.postRecv(uint64(round), b.mr.SGE(0, 8))
		deadline := time.Now().Add(time.Millisecond)
		for time.Now().Before(deadline) {
			if n, _ := b.rcq.Poll(b.wcs[:1]); n != 0 {
				t.Fatal("a completion before the send")
			}
		}
		go func() {
			time.Sleep(time.Duration(round%4) * 100 * time.Microsecond)
			a.post(verbs.SendWR{Opcode: verbs.OpSend, SGL: sgl(a.mr, 0, 8)})
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := b.rcq.Wait(ctx, b.wcs[:1])
		cancel()
		if err != nil || n != 1 {
			t.Fatalf("round %d: Wait: %d, %v", round, n, err)
		}
		expect(t, b.wcs[0], verbs.StatusSuccess)
	}
	// b polls, then spins on memory a writes.
	mem := b.mr.Bytes()
	for round := 1; round <= 20; round++ {
		deadline := time.Now().Add(time.Millisecond)
		for time.Now().Before(deadline) {
			b.rcq.Poll(b.wcs[:0])
		}
		a.mr.Bytes()[64] = byte(round)
		a.post(verbs.SendWR{Opcode: verbs.OpWrite, SGL: sgl(a.mr, 64, 1), RemoteAddr: b.mr.Addr() + 64, RKey: b.mr.RKey()})
		deadline = time.Now().Add(10 * time.Second)
		for byte(sys.Load32(mem, 64)) != byte(round) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the write never landed", round)
			}
		}
	}
}

// A frame handled by a poller that ends the link (a malformed one) hands
// the end to the reader: the QP fails and the connection closes.
func TestPollerEndsLink(t *testing.T) {
	pollersOnly.Store(true)
	defer pollersOnly.Store(false)
	o := opts{}.withDefaults()
	a := newEnd(t, openBusy(t, 50*time.Microsecond), o, 0)
	f := newFakePeer(t, 0)
	f.connectReal(a, o)
	c := f.dialTo(a)
	a.postRecv(1, a.mr.SGE(0, 8))
	// Give the reader time to go idle (it leaves input to pollers).
	linkConn(t, a.qp)
	for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
		a.rcq.Poll(a.wcs[:0])
	}
	// A good SEND first, then garbage.
	b := make([]byte, headerLen+8)
	header(b).encode(&frame{op: opSend, psn: 1000, length: 8})
	copy(b[headerLen:], "abcdefgh")
	b = append(b, bytes.Repeat([]byte{0xff}, headerLen)...)
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	wc := spinCQ(t, a, a.rcq, 1)[0]
	expect(t, wc, verbs.StatusSuccess)
	if got := string(a.mr.Bytes()[:8]); got != "abcdefgh" {
		t.Fatalf("received %q", got)
	}
	a.waitState(verbs.QPError, 5*time.Second)
	if n := pollFrames(t, a.qp); n == 0 {
		t.Error("no frame handled by a poller")
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("connection not closed after a malformed frame: %v", err)
	}
}

// An ACK a poller holds back for the application's next post still goes
// out when the application posts nothing and stops polling: here the
// reader waited for input (nobody had polled for a while) when the
// application began to poll, so nothing but the poll itself may write it.
func TestPollAckNotLost(t *testing.T) {
	a, b := busyPair(t, opts{timeout: 10, retry: 1})
	wr := verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8),
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
	mem := b.mr.Bytes()
	for round := 1; round <= 20; round++ {
		time.Sleep(2 * time.Millisecond) // b's reader goes back to waiting for input
		done := make(chan struct{})
		go func() {
			// Poll until the write has landed, then stop: the poll that
			// handled it is the last.
			defer close(done)
			for deadline := time.Now().Add(10 * time.Second); byte(sys.Load32(mem, 0)) != byte(round); {
				b.rcq.Poll(b.wcs[:0])
				if time.Now().After(deadline) {
					return
				}
			}
		}()
		time.Sleep(200 * time.Microsecond)
		a.mr.Bytes()[0] = byte(round)
		a.post(wr)
		<-done
		expect(t, a.waitCQ(a.scq, 1, 10*time.Second)[0], verbs.StatusSuccess)
	}
}

// A link whose CQ the application stops polling gets its reader back
// while the application keeps polling another CQ of the context (after
// up to maxIdleLooks of the lease keeper's looks): writes to it land.
func TestPollOtherCQLeaseEnds(t *testing.T) {
	o := opts{}.withDefaults()
	cb := openBusy(t, 50*time.Microsecond)
	a1, b1 := newEnd(t, openBusy(t, 50*time.Microsecond), o, 0), newEnd(t, cb, o, 0)
	a2, b2 := newEnd(t, openBusy(t, 50*time.Microsecond), o, 0), newEnd(t, cb, o, 0)
	connect(a1, b1, o)
	connect(a2, b2, o)
	mem := b2.mr.Bytes()
	for round := 1; round <= 5; round++ {
		// b polls both links' CQs (both readers leased), then only b1's.
		deadline := time.Now().Add(time.Millisecond)
		for time.Now().Before(deadline) {
			b1.scq.Poll(b1.wcs[:0])
			b2.scq.Poll(b2.wcs[:0])
		}
		a2.mr.Bytes()[0] = byte(round)
		a2.post(verbs.SendWR{Opcode: verbs.OpWrite, SGL: sgl(a2.mr, 0, 1), RemoteAddr: b2.mr.Addr(), RKey: b2.mr.RKey()})
		start := time.Now()
		deadline = start.Add(10 * time.Second)
		for byte(sys.Load32(mem, 0)) != byte(round) {
			b1.scq.Poll(b1.wcs[:0])
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the write to the link nobody polls never landed", round)
			}
		}
		t.Logf("round %d: landed after %v", round, time.Since(start))
	}
}

// spinFor: a reader with a busy poll under unpolledSpin spins
// unpolledSpin once the application has not polled its link for maxIdle,
// its own busy poll while it polls; a longer busy poll is kept as it is.
func TestSpinForUnpolled(t *testing.T) {
	l := &link{busyPoll: time.Microsecond, epoch: time.Now().Add(-time.Second)}
	if d := l.spinFor(); d != unpolledSpin {
		t.Errorf("never polled, link a second old: spin %v, want %v", d, unpolledSpin)
	}
	l.polled.Add(1)
	if d := l.spinFor(); d != time.Microsecond {
		t.Errorf("polled just now: spin %v, want 1µs", d)
	}
	if d := l.spinFor(); d != time.Microsecond {
		t.Errorf("polled within maxIdle: spin %v, want 1µs", d)
	}
	l.idlePolledAt -= maxIdle
	if d := l.spinFor(); d != unpolledSpin {
		t.Errorf("not polled for maxIdle: spin %v, want %v", d, unpolledSpin)
	}
	l.busyPoll = 50 * time.Microsecond
	if d := l.spinFor(); d != 50*time.Microsecond {
		t.Errorf("busy poll 50µs: spin %v", d)
	}
	l.busyPoll = time.Nanosecond // coll's
	if d := l.spinFor(); d != time.Nanosecond {
		t.Errorf("busy poll 1ns, not polled for maxIdle: spin %v, want 1ns", d)
	}
}

// An ACK a poll left for the application's next post (deferAck) is
// written by the lease keeper when the application stops polling and
// sleeps (other than in CQ.Wait): the reader keeps its lease for
// stopAfter then, and the peer's write must not wait for it. The peer is
// a fake that waits for the ACK in a blocking read, so that nothing in
// this process runs meanwhile. Without the keeper's write the ACK goes
// when the lease ends (stopAfter after the last poll at the earliest),
// written by the reader once it is no longer leased; a round counts when
// the poll left the ACK queued, and it passes when the ACK came while the
// reader was still leased.
func TestKeeperWritesDeferredAck(t *testing.T) {
	a, c := pollerEnd(t)
	pollersOnly.Store(false)
	mem := a.mr.Bytes()
	d := driverOf(t, a.qp)
	d.mu.Lock()
	l := d.link
	d.mu.Unlock()
	next := psn(1000)
	deferred, fast := 0, 0
	for round := 1; round <= 40 && fast == 0; round++ {
		pollFor(a, time.Millisecond) // the reader is leased
		writeAll(t, c, hdr(frame{op: opWrite, psn: next, length: 1, rkey: a.mr.RKey(), raddr: a.mr.Addr() + 64}), []byte{byte(round)})
		// Poll until the write has landed, then sleep: the poll that took
		// it in may have left its ACK queued.
		for deadline := time.Now().Add(10 * time.Second); byte(sys.Load32(mem, 64)) != byte(round); {
			a.scq.Poll(a.wcs[:0])
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the write never landed", round)
			}
		}
		last := time.Now()
		queued := l.outQueued()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var rb [headerLen]byte
		var f frame
		for {
			if _, err := io.ReadFull(c, rb[:]); err != nil {
				t.Fatalf("round %d: no ACK: %v", round, err)
			}
			header(rb[:]).decode(&f)
			if f.op == opAck && f.psn == next {
				break
			}
		}
		if took := time.Since(last); queued {
			deferred++
			leased := l.leased.Load()
			if leased {
				fast++
			}
			t.Logf("round %d: the deferred ACK came %v after the last poll (reader leased: %v)", round, took, leased)
		}
		next++
	}
	if deferred == 0 {
		t.Skip("SKIP: no poll left its ACK queued in 40 rounds: nothing to check")
	}
	if fast == 0 {
		t.Fatalf("none of %d deferred ACKs came while the reader was leased: the keeper did not write them", deferred)
	}
}
