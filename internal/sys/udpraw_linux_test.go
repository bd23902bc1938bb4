//go:build linux

package sys

import (
	"bytes"
	"net/netip"
	"testing"
	"time"
)

// SendBatchRaw and RecvBatchRaw move what SendBatch and RecvBatch move: a
// GSO message sent from a gather list arrives, coalesced (GRO) or not,
// with its bytes, segment size, sender and traffic class; an empty socket
// answers ErrAgain at once. The coalesced round sends from caller memory.
func TestUDPBatchRaw(t *testing.T) {
	for _, gro := range []bool{false, true} {
		lo := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)
		a, la, err := ListenUDPFD(lo)
		if err != nil {
			t.Fatal(err)
		}
		defer Close(a)
		b, lb, err := ListenUDPFD(lo)
		if err != nil {
			t.Fatal(err)
		}
		defer Close(b)
		if err := SetUDPOptions(a, false, 0x02, 1<<20, false); err != nil {
			t.Fatal(err)
		}
		if err := SetUDPOptions(b, false, 0x02, 1<<20, gro); err != nil {
			t.Fatal(err)
		}
		var sb, rb UDPBatch
		buf := make([]byte, MaxBatch*1024)
		for i := range rb.Bufs {
			rb.Bufs[i] = buf[i*1024 : (i+1)*1024]
		}
		if n, err := rb.RecvBatchRaw(b, MaxBatch); n != 0 || err != ErrAgain {
			t.Fatalf("gro=%v: an empty socket: %d, %v", gro, n, err)
		}
		msg := make([]byte, 250)
		for i := range msg {
			msg[i] = byte(i/100) + byte(i)*5
		}
		if gro {
			// And from caller memory, which goes through the ordinary
			// system-call path (rawmem.go) with MSG_DONTWAIT.
			defer NoteCallerMemory(msg)()
		}
		sb.Addrs[0], sb.Seg[0] = lb, 100
		sb.Vecs[0] = [][]byte{msg[:7], msg[7:100], msg[100:180], msg[180:]}
		sb.Bufs[1], sb.Addrs[1] = []byte("one"), lb
		n, err := sb.SendBatchRaw(a, 0, 2)
		if err == ErrGSO {
			t.Skipf("SKIP (loud): the kernel refuses UDP GSO here: %v", err)
		}
		if err != nil || n != 2 {
			t.Fatalf("gro=%v: sent %d: %v", gro, n, err)
		}
		var got []byte
		var sizes []int
		deadline := time.Now().Add(5 * time.Second)
		for len(got) < 253 && time.Now().Before(deadline) {
			WaitFD(b, -1, false, 100*time.Millisecond)
			k, err := rb.RecvBatchRaw(b, MaxBatch)
			if err == ErrAgain {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < k; i++ {
				if rb.Addrs[i] != la || rb.TOS[i]&3 != 0x02 {
					t.Fatalf("gro=%v: from %v tos %#x, want %v and ECT(0)", gro, rb.Addrs[i], rb.TOS[i], la)
				}
				seg := int(rb.Seg[i])
				if seg == 0 {
					seg = rb.Lens[i]
				}
				for off := 0; off < rb.Lens[i]; off += seg {
					sizes = append(sizes, min(seg, rb.Lens[i]-off))
				}
				got = append(got, rb.Bufs[i][:rb.Lens[i]]...)
			}
		}
		want := append(append([]byte{}, msg...), "one"...)
		if !bytes.Equal(got, want) || len(sizes) != 4 || sizes[0] != 100 || sizes[1] != 100 || sizes[2] != 50 || sizes[3] != 3 {
			t.Fatalf("gro=%v: got %d bytes in segments %v (equal: %v)", gro, len(got), sizes, bytes.Equal(got, want))
		}
	}
}
