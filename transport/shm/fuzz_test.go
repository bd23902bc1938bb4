package shm

import "testing"

// FuzzParseAddress: a peer's address arrives from the network (cm); it
// must be rejected cleanly unless well formed.
func FuzzParseAddress(f *testing.F) {
	f.Add((&address{pid: 1, fd: 3, qpn: 7, size: 1 << 20, ino: 9, qcb: 4096, boot: bootID()}).encode())
	f.Add([]byte("SHM1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := parseAddress(b)
		if err != nil {
			return
		}
		if a.qcb+128 > a.size {
			t.Fatalf("accepted a control block outside the arena: %+v", a)
		}
		if got := a.encode(); string(got[:76]) != string(b[:76]) {
			t.Fatal("round trip changed the address")
		}
	})
}
