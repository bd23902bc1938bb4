package roce

import (
	"errors"
	"net"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestBindAddr: RDMAKIT_ROCE_ADDR's forms, ":port" included (the
// device's own address with that port; ":0" lets several rdmakit programs
// of one host share an address).
func TestBindAddr(t *testing.T) {
	dev := verbs.DeviceInfo{Name: "roce9", Ports: []verbs.PortInfo{{GIDs: []net.IP{
		net.ParseIP("fe80::1"), net.ParseIP("fd00::2"), net.ParseIP("192.0.2.7")}}}}
	for _, c := range []struct{ in, want string }{
		{"", "192.0.2.7:4791"},
		{":0", "192.0.2.7:0"},
		{":5000", "192.0.2.7:5000"},
		{"127.0.0.2", "127.0.0.2:4791"},
		{"127.0.0.2:0", "127.0.0.2:0"},
		{"[::1]:7", "[::1]:7"},
		{"::ffff:127.0.0.3", "127.0.0.3:4791"},
	} {
		got, err := bindAddr(c.in, dev)
		if err != nil || got.String() != c.want {
			t.Errorf("bindAddr(%q) = %v, %v; want %s", c.in, got, err, c.want)
		}
	}
	v6 := verbs.DeviceInfo{Name: "roce9", Ports: []verbs.PortInfo{{GIDs: []net.IP{net.ParseIP("fe80::1"), net.ParseIP("fd00::2")}}}}
	if got, err := bindAddr(":0", v6); err != nil || got.String() != "[fd00::2]:0" {
		t.Errorf("bindAddr(:0) on IPv6 = %v, %v", got, err)
	}
	for _, bad := range []string{":", ":x", ":65536", "0.0.0.0", "[::]:1", "host:1"} {
		if _, err := bindAddr(bad, dev); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("bindAddr(%q): %v, want ErrInvalidArgument", bad, err)
		}
	}
}
