package tcp

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// pollerEnd is a QP with busy polling whose input only pollers read
// (pollersOnly), connected to a fake peer that dials it; the reader has
// gone idle.
func pollerEnd(t *testing.T) (*end, net.Conn) {
	t.Helper()
	pollersOnly.Store(true)
	t.Cleanup(func() { pollersOnly.Store(false) })
	o := opts{}.withDefaults()
	a := newEnd(t, openBusy(t, 50*time.Microsecond), o, 0)
	f := newFakePeer(t, 0)
	f.connectReal(a, o)
	c := f.dialTo(a)
	linkConn(t, a.qp)
	pollFor(a, 20*time.Millisecond)
	return a, c
}

// pollFor polls a's CQs (driving its pollers) for d.
func pollFor(a *end, d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		a.rcq.Poll(a.wcs[:0])
		a.scq.Poll(a.wcs[:0])
	}
}

// midPayload reports whether a poller left a payload half moved on qp's
// link (l.pl), and how much of it is in place.
func midPayload(t *testing.T, qp *verbs.QP) (bool, int) {
	t.Helper()
	d := driverOf(t, qp)
	d.mu.Lock()
	l := d.link
	d.mu.Unlock()
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return l.pl.active, l.pl.got
}

func writeAll(t *testing.T, c net.Conn, b ...[]byte) {
	t.Helper()
	for _, x := range b {
		if _, err := c.Write(x); err != nil {
			t.Fatal(err)
		}
	}
}

func hdr(f frame) []byte {
	b := make([]byte, headerLen)
	header(b).encode(&f)
	return b
}

// Payloads larger than the link's buffer, arriving in parts, are moved
// into place by pollers over several polls (straight from the socket, no
// hand-over to the reader): a WRITE, a SEND scattered over three
// buffers, and a READ's response, each intact.
func TestPollPayloadAcrossPolls(t *testing.T) {
	a, c := pollerEnd(t)
	mem := a.mr.Bytes()
	const n = 200 << 10
	src := make([]byte, n)
	pattern(src, 7)

	// WRITE at offset 64.
	writeAll(t, c, hdr(frame{op: opWrite, psn: 1000, length: n, rkey: a.mr.RKey(), raddr: a.mr.Addr() + 64}), src[:90<<10])
	pollFor(a, 20*time.Millisecond)
	if active, got := midPayload(t, a.qp); !active || got == 0 {
		t.Fatalf("after part of a WRITE's payload: payload in progress %v, %d bytes placed", active, got)
	}
	writeAll(t, c, src[90<<10:])
	// A SEND into three buffers; its PSN follows.
	sgl := []verbs.SGE{a.mr.SGE(1<<20, 10<<10), a.mr.SGE(2<<20, 100<<10), a.mr.SGE(3<<20, 100<<10)}
	a.postRecv(9, sgl...)
	writeAll(t, c, hdr(frame{op: opSend, psn: 1001, length: n}), src[:150<<10])
	pollFor(a, 20*time.Millisecond)
	writeAll(t, c, src[150<<10:])
	wc := spinCQ(t, a, a.rcq, 1)[0]
	expect(t, wc, verbs.StatusSuccess)
	if wc.ByteLen != n || wc.WRID != 9 {
		t.Fatalf("receive %+v", wc)
	}
	if !bytes.Equal(mem[64:64+n], src) {
		t.Fatal("WRITE data differs")
	}
	got := append(append(append([]byte(nil), mem[1<<20:1<<20+10<<10]...), mem[2<<20:2<<20+100<<10]...), mem[3<<20:3<<20+90<<10]...)
	if !bytes.Equal(got, src) {
		t.Fatal("SEND data differs")
	}

	// A READ: the fake peer answers in two parts.
	a.post(verbs.SendWR{ID: 5, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(512<<10, n)}, RemoteAddr: 0x1000, RKey: 77})
	var rb [headerLen]byte
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var req frame
	for {
		if _, err := io.ReadFull(c, rb[:]); err != nil {
			t.Fatal(err)
		}
		header(rb[:]).decode(&req)
		if req.op == opReadReq {
			break
		}
	}
	pattern(src, 8)
	writeAll(t, c, hdr(frame{op: opReadResp, psn: req.psn, length: n, flags: flagStatus}), src[:100<<10])
	pollFor(a, 20*time.Millisecond)
	if active, got := midPayload(t, a.qp); !active || got == 0 {
		t.Fatalf("after part of a READ's response: payload in progress %v, %d bytes placed", active, got)
	}
	writeAll(t, c, src[100<<10:], trailerOK[:])
	wc = spinCQ(t, a, a.scq, 1)[0]
	expect(t, wc, verbs.StatusSuccess)
	if !bytes.Equal(mem[512<<10:512<<10+n], src) {
		t.Fatal("READ data differs")
	}
}

// A region deregistered between the polls that move a WRITE's payload
// into it is not touched after Dereg returns: the rest of the payload is
// discarded and the WRITE is NAKed with a remote access error.
func TestPollPayloadDereg(t *testing.T) {
	a, c := pollerEnd(t)
	buf := make([]byte, 256<<10)
	mr, err := a.pd.RegMR(buf, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200 << 10
	src := make([]byte, n)
	pattern(src, 9)
	writeAll(t, c, hdr(frame{op: opWrite, psn: 1000, length: n, rkey: mr.RKey(), raddr: mr.Addr()}), src[:100<<10])
	pollFor(a, 20*time.Millisecond)
	active, got := midPayload(t, a.qp)
	if !active || got == 0 {
		t.Fatalf("payload in progress %v, %d bytes placed", active, got)
	}
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	writeAll(t, c, src[100<<10:])
	// The NAK, while a polls.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	nak := make(chan error, 1)
	var f frame
	go func() {
		var rb [headerLen]byte
		for {
			if _, err := io.ReadFull(c, rb[:]); err != nil {
				nak <- err
				return
			}
			header(rb[:]).decode(&f)
			if f.op == opNak {
				nak <- nil
				return
			}
		}
	}()
	for waiting := true; waiting; {
		pollFor(a, time.Millisecond)
		select {
		case err := <-nak:
			if err != nil {
				t.Fatalf("no NAK: %v", err)
			}
			waiting = false
		default:
		}
	}
	if f.syndrome != synRemoteAccess || f.psn != 1000 {
		t.Fatalf("NAK %+v", f)
	}
	if !bytes.Equal(buf[:got], src[:got]) {
		t.Fatal("data placed before Dereg differs")
	}
	if !bytes.Equal(buf[got:], make([]byte, len(buf)-got)) {
		t.Fatal("memory written after Dereg returned")
	}
	a.waitState(verbs.QPError, 5*time.Second)
}

// TestPollPayloadDeregLinkEnds: a WRITE_IMM's target is deregistered in
// the middle of its payload (the rest is being skipped) and then the
// connection ends: the receive the WRITE_IMM took must still complete
// (it is in no queue a flush would find).
func TestPollPayloadDeregLinkEnds(t *testing.T) {
	a, c := pollerEnd(t)
	buf := make([]byte, 256<<10)
	mr, err := a.pd.RegMR(buf, verbs.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	a.postRecv(7)
	const n = 200 << 10
	src := make([]byte, n)
	pattern(src, 3)
	writeAll(t, c, hdr(frame{op: opWriteImm, psn: 1000, length: n, rkey: mr.RKey(), raddr: mr.Addr(), imm: 5}), src[:100<<10])
	pollFor(a, 20*time.Millisecond)
	if active, got := midPayload(t, a.qp); !active || got == 0 {
		t.Fatalf("payload in progress %v, %d bytes placed", active, got)
	}
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	writeAll(t, c, src[100<<10:150<<10]) // the rest never comes
	pollFor(a, 20*time.Millisecond)
	if active, _ := midPayload(t, a.qp); !active {
		t.Fatal("the payload ended before the connection did")
	}
	// The link goroutine, not pollers (which leave the end of the stream
	// to it), finds the connection's end.
	pollersOnly.Store(false)
	c.Close()
	wc := a.waitCQ(a.rcq, 1, 5*time.Second)[0]
	if wc.WRID != 7 || wc.Status == verbs.StatusSuccess {
		t.Fatalf("receive completed as %+v, want wr 7 with an error", wc)
	}
}

// A peer's close found by a poller's read is handed to the link
// goroutine at once (a kick), also while the application polls the
// link's CQ without a pause: before, the poller left the end of the
// stream to a link goroutine that slept leased until the application
// stopped polling, and the link never ended (the peer's loss went
// unnoticed until a send failed).
func TestPollEOFWhilePolling(t *testing.T) {
	a, c := pollerEnd(t)
	pollersOnly.Store(false)
	pollFor(a, 5*time.Millisecond)
	c.Close()
	d := driverOf(t, a.qp)
	d.mu.Lock()
	l := d.link
	d.mu.Unlock()
	deadline := time.Now().Add(time.Second) // the kick takes milliseconds
	for {
		a.rcq.Poll(a.wcs[:0])
		d.mu.Lock()
		dead := l.dead
		d.mu.Unlock()
		if dead {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the peer's close went unnoticed for 1 s by an application polling its CQ")
		}
	}
}
