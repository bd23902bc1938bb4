package tcp

import (
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"github.com/rdmakit/rdmakit/verbs"
)

// flood writes the frames that gen makes, in 256 KiB batches, until the
// connection fails or limit bytes are sent; it returns the bytes sent and
// whether the connection failed. While it floods it samples the heap.
func flood(t *testing.T, c net.Conn, limit int, gen func(i int) []byte, maxHeap *uint64) (int, bool) {
	t.Helper()
	var buf []byte
	sent, i := 0, 0
	var ms runtime.MemStats
	for sent < limit {
		buf = buf[:0]
		for len(buf) < 256<<10 {
			buf = append(buf, gen(i)...)
			i++
		}
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Write(buf)
		sent += n
		if err != nil {
			return sent, true
		}
		runtime.ReadMemStats(&ms)
		*maxHeap = max(*maxHeap, ms.HeapAlloc)
	}
	return sent, false
}

func heapNow() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// dropped waits for the victim to close the connection.
func dropped(c net.Conn, within time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(within))
	b := make([]byte, 64<<10)
	for {
		if _, err := c.Read(b); err != nil {
			ne, ok := err.(net.Error)
			return !ok || !ne.Timeout()
		}
	}
}

// A peer that completes a handshake and floods zero-length READs without
// reading the responses: the responses it does not read count against
// max_dest_rd_atomic, so the flood is NAKed and the connection dropped,
// and the victim's heap does not grow with what the peer sends (it grew
// about 4x the bytes sent).
func TestReadFloodBounded(t *testing.T) {
	o := opts{}.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	f := newFakePeer(t, 0)
	f.connectReal(a, o)
	c := f.dialTo(a)
	c.(*net.TCPConn).SetReadBuffer(4 << 10) // read nothing, and buffer little
	base := heapNow()
	maxHeap := base
	const limit = 32 << 20
	sent, failed := flood(t, c, limit, func(i int) []byte {
		return mkFrame(frame{op: opReadReq, psn: psn(1000 + i), rkey: a.mr.RKey(), raddr: a.mr.Addr()})
	}, &maxHeap)
	t.Logf("sent %d bytes (%d READs), connection failed while sending: %v, heap grew by %d bytes",
		sent, sent/headerLen, failed, int64(maxHeap)-int64(base))
	if grew := int64(maxHeap) - int64(base); grew > 16<<20 {
		t.Errorf("heap grew by %d bytes while a peer sent %d bytes of READs it never read answers to", grew, sent)
	}
	if !failed && !dropped(c, 10*time.Second) {
		t.Fatal("the connection of a peer that floods READs and reads nothing was not dropped")
	}
	a.waitState(verbs.QPError, 5*time.Second)
}

// A peer that does not read its responses is disconnected, not buffered:
// here it sends SENDs to a QP without receives (each gets an RNR NAK) and
// never reads. Once a peer has not read for timeout×(retry_cnt+1) (at
// least a second) it is disconnected; the next work request fails with
// RetryExceeded.
func TestStalledPeerDisconnected(t *testing.T) {
	o := opts{timeout: 10, retry: 1}.withDefaults() // connectLimit: 1 s
	a := newEnd(t, openCtx(t), o, 0)
	f := newFakePeer(t, 0)
	f.connectReal(a, o)
	c := f.dialTo(a)
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	base := heapNow()
	maxHeap := base
	start := time.Now()
	sent, failed := flood(t, c, 32<<20, func(i int) []byte {
		return mkFrame(frame{op: opSend, psn: 1000})
	}, &maxHeap)
	t.Logf("sent %d bytes in %v, connection failed while sending: %v, heap grew by %d bytes",
		sent, time.Since(start), failed, int64(maxHeap)-int64(base))
	if grew := int64(maxHeap) - int64(base); grew > 16<<20 {
		t.Errorf("heap grew by %d bytes while a peer that reads nothing sent %d bytes", grew, sent)
	}
	if !failed && !dropped(c, 10*time.Second) {
		t.Fatal("a peer that reads nothing was not disconnected")
	}
	if time.Since(start) < time.Second {
		t.Errorf("disconnected after %v, before timeout×(retry_cnt+1)", time.Since(start))
	}
	a.post(verbs.SendWR{ID: 7, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: sgl(a.mr, 0, 8), RKey: 1, RemoteAddr: 0})
	wc := a.waitCQ(a.scq, 1, 10*time.Second)
	expect(t, wc[0], verbs.StatusRetryExceeded)
}

// Once Dereg returns, a WRITE or READ in flight no longer touches the
// region: it never writes into, or reads out of, a region AllocMR hands
// out next.
func TestDeregInFlight(t *testing.T) { conformance.DeregInFlight(t, "tcp0") }

// Connections that complete no handshake do not pile up: beyond
// maxHandshakes a new one is closed at once.
func TestHandshakesBounded(t *testing.T) {
	old := maxHandshakes
	maxHandshakes = 4
	t.Cleanup(func() { maxHandshakes = old })
	o := opts{}.withDefaults()
	a := newEnd(t, openCtx(t), o, 0)
	ea, err := decodeAddr(a.qp.Address())
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(ea.port)}).String()
	var conns []net.Conn
	for i := 0; i < 12; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		time.Sleep(2 * time.Millisecond) // accepted in order
	}
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err != nil {
			if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
				closed++
			}
		}
	}
	if closed < 8 {
		t.Fatalf("%d of 12 connections without a hello closed at once, want at least 8 (limit 4)", closed)
	}
}
