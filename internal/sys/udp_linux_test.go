//go:build linux

package sys

import (
	"bytes"
	"net"
	"testing"
	"time"
)

func udpPair(t *testing.T, gro bool) (a, b *net.UDPConn, fa, fb int) {
	t.Helper()
	open := func(gro bool) (*net.UDPConn, int) {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		f, err := c.File() // a dup of the socket (RecvBatch does not wait)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if err := SetUDPOptions(int(f.Fd()), false, 0x02, 1<<20, gro); err != nil {
			t.Fatal(err)
		}
		return c, int(f.Fd())
	}
	a, fa = open(false)
	b, fb = open(gro)
	return
}

func recvAll(t *testing.T, fd int, rb *UDPBatch, want int) int {
	t.Helper()
	got := 0
	deadline := time.Now().Add(5 * time.Second)
	for got < want && time.Now().Before(deadline) {
		n, err := rb.RecvBatch(fd, MaxBatch)
		if err == ErrAgain {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got += n
		return n
	}
	return got
}

func TestUDPBatch(t *testing.T) {
	_, b, fa, fb := udpPair(t, false)
	to := b.LocalAddr().(*net.UDPAddr).AddrPort()
	var sb, rb UDPBatch
	for i := 0; i < 3; i++ {
		sb.Bufs[i] = []byte{byte(i), 1, 2}
		sb.Addrs[i] = to
	}
	if n, err := sb.SendBatch(fa, 0, 3); err != nil || n != 3 {
		t.Fatalf("sent %d: %v", n, err)
	}
	buf := make([]byte, 3*MaxBatch*64)
	for i := range rb.Bufs {
		rb.Bufs[i] = buf[i*64 : (i+1)*64]
	}
	got := 0
	for got < 3 {
		n := recvAll(t, fb, &rb, 3-got)
		for i := 0; i < n; i++ {
			if rb.Lens[i] != 3 || rb.Bufs[i][0] != byte(got+i) || rb.TOS[i]&3 != 2 || !rb.Addrs[i].Addr().Is4() {
				t.Fatalf("datagram %d: len %d tos %#x from %v %x", got+i, rb.Lens[i], rb.TOS[i], rb.Addrs[i], rb.Bufs[i][:3])
			}
		}
		got += n
	}
}

// A GSO message of three 100-byte segments arrives as three datagrams
// (or, with GRO, as one buffer with its segment size), whether it is one
// buffer or a gather list (Vecs) cut across the segments' bounds.
func TestUDPGSO(t *testing.T) {
	for _, c := range []struct{ gro, vecs bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		gro := c.gro
		_, b, fa, fb := udpPair(t, gro)
		to := b.LocalAddr().(*net.UDPAddr).AddrPort()
		var sb, rb UDPBatch
		msg := make([]byte, 250)
		for i := range msg {
			msg[i] = byte(i/100) + byte(i)*3
		}
		sb.Bufs[0], sb.Addrs[0], sb.Seg[0] = msg, to, 100
		if c.vecs {
			sb.Bufs[0] = nil
			sb.Vecs[0] = [][]byte{msg[:10], msg[10:10], msg[10:100], msg[100:103], msg[103:240], msg[240:]}
		}
		var got []byte
		if n, err := sb.SendBatch(fa, 0, 1); err == ErrGSO {
			t.Skipf("SKIP (loud): the kernel refuses UDP GSO here: %v", err)
		} else if err != nil || n != 1 {
			t.Fatalf("sent %d: %v", n, err)
		}
		buf := make([]byte, MaxBatch*1024)
		for i := range rb.Bufs {
			rb.Bufs[i] = buf[i*1024 : (i+1)*1024]
		}
		var sizes []int
		total := 0
		for total < 250 {
			n := recvAll(t, fb, &rb, 1)
			if n == 0 {
				t.Fatalf("gro=%v: got %v", gro, sizes)
			}
			for i := 0; i < n; i++ {
				seg := int(rb.Seg[i])
				if seg == 0 {
					seg = rb.Lens[i]
				}
				for off := 0; off < rb.Lens[i]; off += seg {
					sizes = append(sizes, min(seg, rb.Lens[i]-off))
				}
				total += rb.Lens[i]
				got = append(got, rb.Bufs[i][:rb.Lens[i]]...)
			}
		}
		if len(sizes) != 3 || sizes[0] != 100 || sizes[1] != 100 || sizes[2] != 50 {
			t.Fatalf("%+v: segments %v", c, sizes)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("%+v: the bytes differ", c)
		}
	}
}

// TestUDPBatchReuse: one UDPBatch receives, sends, and receives again,
// and a receive after Bufs changed fills the new buffers (RecvBatch
// keeps its headers between calls), with the sender's address and
// traffic class each time.
func TestUDPBatchReuse(t *testing.T) {
	a, b, fa, fb := udpPair(t, false)
	to := b.LocalAddr().(*net.UDPAddr).AddrPort()
	back := a.LocalAddr().(*net.UDPAddr).AddrPort()
	var sb, rb UDPBatch
	buf := make([]byte, 2*MaxBatch*64)
	for i := range rb.Bufs {
		rb.Bufs[i] = buf[i*64 : (i+1)*64]
	}
	for round := 0; round < 4; round++ {
		sb.Bufs[0], sb.Addrs[0] = []byte{byte(round), 9, 9, 9}, to
		sb.Bufs[1], sb.Addrs[1] = []byte{byte(round), 8}, to
		if n, err := sb.SendBatch(fa, 0, 2); err != nil || n != 2 {
			t.Fatalf("round %d: sent %d: %v", round, n, err)
		}
		if round == 2 {
			rb.Bufs[1] = buf[MaxBatch*64 : MaxBatch*64+32] // the second buffer moves
		}
		got := 0
		for got < 2 {
			n := recvAll(t, fb, &rb, 2-got)
			for i := 0; i < n; i++ {
				k := got + i
				want := []byte{byte(round), 9, 9, 9}
				if k == 1 {
					want = []byte{byte(round), 8}
				}
				if !bytes.Equal(rb.Bufs[i][:rb.Lens[i]], want) || rb.Addrs[i] != back || rb.TOS[i]&3 != 2 {
					t.Fatalf("round %d datagram %d: %x from %v tos %#x", round, k, rb.Bufs[i][:rb.Lens[i]], rb.Addrs[i], rb.TOS[i])
				}
			}
			got += n
		}
		// The receiving batch sends from its own first buffer, as it
		// is (its headers change, its buffers do not), then receives.
		rb.Bufs[0][0], rb.Addrs[0] = 7, back
		if n, err := rb.SendBatch(fb, 0, 1); err != nil || n != 1 {
			t.Fatalf("round %d: reply %d: %v", round, n, err)
		}
		var xb UDPBatch
		xb.Bufs[0] = make([]byte, 128)
		if n := recvAll(t, fa, &xb, 1); n != 1 || xb.Lens[0] != 64 || xb.Bufs[0][0] != 7 {
			t.Fatalf("round %d: reply %d %x", round, n, xb.Bufs[0][:xb.Lens[0]])
		}
	}
}
