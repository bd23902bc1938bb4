package cm

import (
	"net"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// openFDs counts this process's open file descriptors and, among them,
// memfds of verbs contexts (one per open context).
func openFDs(t *testing.T) (fds, contexts int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	for _, e := range ents {
		fds++
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(l, "memfd:rdmakit-") {
			contexts++
		}
	}
	return fds, contexts
}

// bogusRequest is a well-formed request for a QP that will never connect
// (its nonce 0 leaves the dialing of the data connection to it).
func bogusRequest() []byte {
	addr := make([]byte, 32)
	addr[0] = 1                   // tcp address version
	addr[2], addr[3] = 0x12, 0x34 // port
	addr[7] = 1                   // QPN 1
	b, _ := (&msg{typ: msgRequest, version: protoVersion, transport: "tcp", device: "tcp0", qpn: 1, psn: 1,
		mtu: verbs.MTU1024, peerTimeoutMs: 60000, addr: addr}).encode()
	return b
}

// flood opens n connections from the IPs src(i) to addr that each send
// nothing, a request they never complete, a partial header, or garbage.
func flood(t *testing.T, addr string, n int, src func(i int) net.IP) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src(i)}, Timeout: 5 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			if i == 0 {
				t.Skipf("cannot dial from %v: %v", src(i), err)
			}
			t.Fatalf("flood connection %d: %v", i, err)
		}
		switch i % 4 {
		case 1:
			c.Write(bogusRequest())
		case 2:
			c.Write([]byte{0, 0, 0}) // a header cut short
		case 3:
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n")) // refused at once; never closes its end
		}
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// A flood of half-open and bogus handshakes holds at most MaxHandshakes
// goroutines and sockets and no verbs context of its own; verbs.Open in
// the same process keeps working, and a dialer from another source still
// connects while one source floods. (Before listeners shared a context
// and bounded handshakes, every request opened a context and every
// connection held a goroutine and a socket for HandshakeTimeout.)
func TestHandshakeFlood(t *testing.T) {
	if !hasDevice("tcp0") {
		t.Skip("tcp0 not linked")
	}
	leakCheck(t)
	var ended atomic.Int64 // refused or failed
	l := listen(t, ListenOptions{Options: Options{Device: "tcp0", Insecure: true}, OnHandshakeError: func(error) { ended.Add(1) }})
	inProgress := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.hs)
	}
	// settled waits until the listener has taken all n connections (each
	// refused, failed, or being handshaken).
	settled := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for int(ended.Load())+inProgress() < n {
			if time.Now().After(deadline) {
				t.Fatalf("the listener took %d ended + %d in progress of %d connections", ended.Load(), inProgress(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	baseFDs, baseCtxs := openFDs(t)
	baseG := runtime.NumGoroutine()

	// One source floods: it gets MaxHandshakesPerSource slots, and a
	// dialer from another address connects meanwhile.
	const n1 = 60
	flood(t, l.Addr().String(), n1, func(int) net.IP { return net.IPv4(127, 0, 0, 2) })
	settled(n1)
	if got := inProgress(); got > DefaultMaxHandshakesPerSource {
		t.Errorf("%d handshakes in progress from one source (limit %d)", got, DefaultMaxHandshakesPerSource)
	}
	d, a := pair(t, l, Options{Device: "tcp0", Insecure: true})
	checkTraffic(t, d, a)
	d.Close()
	a.Close()

	// Many sources: MaxHandshakes in all.
	const n2 = 180
	flood(t, l.Addr().String(), n2, func(i int) net.IP { return net.IPv4(127, 0, 1, byte(1+i%60)) })
	settled(n1 + n2)
	if got := inProgress(); got > DefaultMaxHandshakes {
		t.Errorf("%d handshakes in progress (limit %d)", got, DefaultMaxHandshakes)
	}
	for i := range 20 {
		vctx, err := verbs.Open("tcp0", verbs.Options{})
		if err != nil {
			t.Fatalf("verbs.Open %d during the flood: %v", i, err)
		}
		vctx.Close()
	}
	fds, ctxs := openFDs(t)
	g := runtime.NumGoroutine()
	// The test's own ends of the flood are n1+n2 descriptors; the
	// listener's share is bounded by its handshakes (a socket each, and
	// for the bogus requests a QP's, which connects nowhere).
	if server := fds - baseFDs - n1 - n2; server > 2*DefaultMaxHandshakes+16 {
		t.Errorf("the listener holds %d descriptors under a flood of %d connections", server, n1+n2)
	}
	if ctxs > baseCtxs {
		t.Errorf("%d verbs contexts open under the flood, %d before: requests open contexts", ctxs, baseCtxs)
	}
	if extra := g - baseG; extra > 4*DefaultMaxHandshakes+16 {
		t.Errorf("%d more goroutines under a flood of %d connections", extra, n1+n2)
	}
	t.Logf("flood of %d: %d handshakes in progress, %d more descriptors (listener side), %d more goroutines, %d contexts",
		n1+n2, inProgress(), fds-baseFDs-n1-n2, g-baseG, ctxs)
}

// Connections of a Listener share its context (and with SharePD its PD);
// the context outlives the Listener while connections use it.
func TestListenerSharing(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		for _, sh := range []ContextSharing{ShareContext, SharePD, ContextPerConnection} {
			t.Run(sh.String(), func(t *testing.T) {
				l, err := Listen(testCtx(t), "127.0.0.1:0", ListenOptions{Options: Options{Device: dev, Insecure: true}, Sharing: sh})
				if err != nil {
					t.Fatal(err)
				}
				d1, a1 := pair(t, l, Options{Device: dev, Insecure: true})
				d2, a2 := pair(t, l, Options{Device: dev, Insecure: true})
				sameCtx, samePD := a1.Context() == a2.Context(), a1.PD() == a2.PD()
				if sameCtx != (sh != ContextPerConnection) || samePD != (sh == SharePD) {
					t.Errorf("same context %v, same PD %v", sameCtx, samePD)
				}
				if (l.PD() != nil) != (sh == SharePD) || sh == SharePD && l.PD() != a1.PD() {
					t.Errorf("Listener.PD %v", l.PD())
				}
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				// The connections still work after the Listener closed.
				checkTraffic(t, d1, a1)
				a1.Close()
				checkTraffic(t, d2, a2)
				for _, c := range []*Conn{d1, d2, a2} {
					if err := c.Close(); err != nil {
						t.Error(err)
					}
				}
			})
		}
	})
}
