//go:build linux

package sys

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// A socket outside the network poller: bound where asked (port chosen),
// a second bind of the same port refused, a datagram sent with SendToFD
// makes WaitFD report it readable and RecvBatch gets it; an empty socket
// waits the timeout out, and a signalled event ends a wait at once, until
// drained.
func TestUDPFD(t *testing.T) {
	for _, ip := range []string{"127.0.0.1", "::1"} {
		t.Run(ip, func(t *testing.T) {
			bind := netip.AddrPortFrom(netip.MustParseAddr(ip), 0)
			a, la, err := ListenUDPFD(bind)
			if err != nil {
				if ip == "::1" && errors.Is(err, syscall.EADDRNOTAVAIL) {
					t.Skip("no IPv6 loopback address on this host")
				}
				t.Fatal(err)
			}
			defer Close(a)
			if la.Addr() != bind.Addr() || la.Port() == 0 {
				t.Fatalf("bound to %v, want %v with a port", la, bind.Addr())
			}
			if fd, _, err := ListenUDPFD(la); err == nil {
				Close(fd)
				t.Fatal("a second socket bound the same port")
			}
			b, lb, err := ListenUDPFD(bind)
			if err != nil {
				t.Fatal(err)
			}
			defer Close(b)
			efd, err := NewEvent()
			if err != nil {
				t.Fatal(err)
			}
			defer Close(efd)

			if r, w := WaitFD(b, efd, false, time.Millisecond); r || w {
				t.Fatalf("an empty socket: readable %v, woken %v", r, w)
			}
			Signal(efd)
			if r, w := WaitFD(b, efd, false, -1); r || !w {
				t.Fatalf("after Signal: readable %v, woken %v", r, w)
			}
			if !Drain(efd) || Drain(efd) {
				t.Fatal("Drain: want true once, then false")
			}
			if r, _ := WaitFD(a, -1, true, -1); !r {
				t.Fatal("a fresh socket is not writable")
			}
			if err := SendToFD(a, []byte("hello"), lb); err != nil {
				t.Fatal(err)
			}
			if r, w := WaitFD(b, efd, false, 5*time.Second); !r || w {
				t.Fatalf("after a datagram: readable %v, woken %v", r, w)
			}
			var rb UDPBatch
			rb.Bufs[0] = make([]byte, 64)
			n, err := rb.RecvBatch(b, 1)
			if err != nil || n != 1 || string(rb.Bufs[0][:rb.Lens[0]]) != "hello" || rb.Addrs[0] != la {
				t.Fatalf("RecvBatch: %d %v %q from %v, want hello from %v", n, err, rb.Bufs[0][:rb.Lens[0]], rb.Addrs[0], la)
			}
			if _, err := rb.RecvBatch(b, 1); err != ErrAgain {
				t.Fatalf("an empty socket: %v, want ErrAgain", err)
			}
		})
	}
}
