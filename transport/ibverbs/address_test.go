package ibverbs

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

func TestAddressRoundTrip(t *testing.T) {
	a := Address{IWARP: true, Port: 1, MTU: 5, LID: 7, CMPort: 40000, QPN: 0x123456, IP: net.ParseIP("10.201.0.1")}
	copy(a.GID[:], net.ParseIP("10.200.0.1").To16())
	b, err := ParseAddress(a.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if b.IWARP != a.IWARP || b.Port != a.Port || b.MTU != a.MTU || b.LID != a.LID || b.CMPort != a.CMPort || b.QPN != a.QPN || b.GID != a.GID || !b.IP.Equal(a.IP) {
		t.Fatalf("round trip: %+v → %+v", a, b)
	}
	if _, err := ParseAddress([]byte("short")); !errors.Is(err, ErrAddress) {
		t.Fatalf("short address: %v", err)
	}
}

func TestGIDFromIP(t *testing.T) {
	g, ok := GIDFromIP(net.ParseIP("10.200.0.1").To4())
	if !ok || !isV4Mapped(g) || net.IP(g[:]).String() != "10.200.0.1" {
		t.Fatalf("IPv4 → %v %v", net.IP(g[:]), ok)
	}
	g, ok = GIDFromIP(net.ParseIP("fe80::1"))
	if !ok || isV4Mapped(g) {
		t.Fatalf("IPv6 → %v", net.IP(g[:]))
	}
}

func gid(s string) [16]byte {
	var g [16]byte
	copy(g[:], net.ParseIP(s).To16())
	return g
}

// A RoCE port's table as rxe shows it: link-local v2 at 0, IPv4-mapped at 1.
func TestPickSGID(t *testing.T) {
	table := []gidEntry{
		{gid: gid("fe80::1"), index: 0, typ: gidTypeRoCEv2},
		{gid: gid("10.200.0.1"), index: 1, typ: gidTypeRoCEv2},
		{gid: gid("10.201.0.5"), index: 2, typ: gidTypeRoCEv2},
		{gid: gid("2001:db8::5"), index: 3, typ: gidTypeRoCEv2},
	}
	for _, c := range []struct {
		dst  string
		want int
	}{
		{"10.200.0.1", 1},  // loopback on the device: its own address
		{"10.200.0.9", 1},  // same /24
		{"10.201.0.7", 2},  // the other subnet
		{"192.0.2.1", 1},   // any IPv4-mapped GID
		{"fe80::9", 0},     // link-local
		{"2001:db8::9", 3}, // global IPv6
	} {
		e, ok := pickSGID(table, gid(c.dst))
		if !ok || e.index != c.want {
			t.Errorf("dst %s: index %d, want %d", c.dst, e.index, c.want)
		}
	}
	if p, _ := primaryGID(table); p.index != 1 {
		t.Errorf("primary GID index %d, want the IPv4-mapped 1", p.index)
	}
}

func TestRegErrorSaysUlimit(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.ENOMEM, syscall.EPERM} {
		err := regError(1<<20, e)
		if !errors.Is(err, ErrMemlock) || !errors.Is(err, verbs.ErrNoMemory) || !strings.Contains(err.Error(), "ulimit -l") {
			t.Fatalf("%v → %v", e, err)
		}
	}
	if err := regError(10, syscall.EINVAL); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Fatalf("EINVAL → %v", err)
	}
}
