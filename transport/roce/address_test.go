package roce

import (
	"net/netip"
	"testing"
)

func TestAddressRoundTrip(t *testing.T) {
	for _, s := range []string{"127.0.0.2:4791", "[fd00::5]:9", "10.1.2.3:60000"} {
		ap := netip.MustParseAddrPort(s)
		got, qpn, err := decodeAddr(encodeAddr(ap, 0xabcdef))
		if err != nil || got != ap || qpn != 0xabcdef {
			t.Fatalf("%s: %v %#x %v", s, got, qpn, err)
		}
	}
	for _, b := range [][]byte{nil, make([]byte, 24), make([]byte, 23), encodeAddr(netip.MustParseAddrPort("0.0.0.0:1"), 5)} {
		if _, _, err := decodeAddr(b); err == nil {
			t.Fatalf("%x decoded", b)
		}
	}
}

func FuzzDecodeAddr(f *testing.F) {
	f.Add(encodeAddr(netip.MustParseAddrPort("127.0.0.1:4791"), 7))
	f.Add(encodeAddr(netip.MustParseAddrPort("[fd00::1]:1"), 0xffffff))
	f.Fuzz(func(t *testing.T, b []byte) {
		ap, qpn, err := decodeAddr(b)
		if err != nil {
			return
		}
		if qpn > 0xffffff || ap.Port() == 0 || !ap.Addr().IsValid() {
			t.Fatalf("accepted %x as %v %#x", b, ap, qpn)
		}
		if got, n, err := decodeAddr(encodeAddr(ap, qpn)); err != nil || got != ap || n != qpn {
			t.Fatalf("round trip of %x", b)
		}
	})
}
