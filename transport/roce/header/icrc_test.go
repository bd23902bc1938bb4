package header

import (
	"encoding/binary"
	"encoding/hex"
	"hash/crc32"
	"net/netip"
	"strings"
	"testing"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A congestion notification packet captured from a ConnectX-4 Lx RoCE
// NIC (the UDP payload: BTH, 16 reserved bytes, ICRC), sent from
// 10.0.17.1 to 10.0.18.1, UDP 0 -> 4791, IP identification 0x718c.
const cx4CNP = "8100ffff 40000118 00000000 00000000 00000000 00000000 00000000 82fd002a"

func TestICRCKnownCNP(t *testing.T) {
	pkt := unhex(t, cx4CNP)
	a := Addrs{Src: netip.MustParseAddr("10.0.17.1"), Dst: netip.MustParseAddr("10.0.18.1"), SrcPort: 0, DstPort: 4791, ID: 0x718c}
	var p Packet
	if err := Parse(&p, pkt); err != nil {
		t.Fatal(err)
	}
	if p.Opcode() != CNP || !p.BTH.BECN() || p.BTH.DestQP() != 0x118 || p.BTH.PKey() != 0xffff {
		t.Fatalf("parsed %s becn=%v qp=%#x", p.Opcode(), p.BTH.BECN(), p.BTH.DestQP())
	}
	if got, want := ICRC(&a, p.Body), binary.LittleEndian.Uint32(p.ICRC); got != want {
		t.Fatalf("ICRC %#08x, captured %#08x", got, want)
	}
	id, ok := CheckICRC(&a, pkt)
	if !ok || id != 0x718c {
		t.Fatalf("CheckICRC = %#x, %v; want the identification 0x718c", id, ok)
	}
	pkt[20] ^= 1
	if _, ok := CheckICRC(&a, pkt); ok {
		t.Fatal("a corrupted reserved byte passed")
	}
}

// A UC SEND_ONLY packet with two pad bytes, from 192.168.0.7 to itself,
// UDP 49152 -> 4791, IP identification 1144, whose ICRC is known.
func TestICRCKnownUCSend(t *testing.T) {
	bth := make([]byte, BTHLen)
	BTH(bth).Encode(&BTHFields{Opcode: 0x24, MigReq: true, PadCount: 2, PKey: 0xffff, DestQP: 211, PSN: 13571856})
	body := append(bth, []byte("F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P\x00\x00")...)
	ip := netip.MustParseAddr("192.168.0.7")
	a := Addrs{Src: ip, Dst: ip, SrcPort: 49152, DstPort: 4791, ID: 1144}
	if got := ICRC(&a, body); got != 0xf353f378 { // on the wire: 78 f3 53 f3
		t.Fatalf("ICRC %#08x", got)
	}
	pkt := append(body, 0, 0, 0, 0)
	PutICRC(&a, pkt)
	if id, ok := CheckICRC(&a, pkt); !ok || id != 1144 {
		t.Fatalf("CheckICRC = %d, %v", id, ok)
	}
}

func TestICRCIPv6AndID0(t *testing.T) {
	for _, pair := range [][2]string{{"fd00::1", "fd00::2"}, {"127.0.0.1", "127.0.0.2"}, {"::ffff:10.0.0.1", "::ffff:10.0.0.2"}} {
		a := Addrs{Src: netip.MustParseAddr(pair[0]), Dst: netip.MustParseAddr(pair[1]), SrcPort: 50000, DstPort: UDPPort}
		pkt := make([]byte, BTHLen+RETHLen+100+ICRCLen)
		BTH(pkt).Encode(&BTHFields{Opcode: RCWriteOnly, PKey: DefaultPKey, DestQP: 0x12, PSN: 7})
		RETH(pkt[BTHLen:]).Encode(0x1000, 0x55, 100)
		PutICRC(&a, pkt)
		if id, ok := CheckICRC(&a, pkt); !ok || id != 0 {
			t.Fatalf("%v: CheckICRC = %d, %v", pair, id, ok)
		}
		// FECN/BECN, TOS/TTL are masked: the BTH reserved byte may change.
		pkt[bthResv8a] |= flagBECN
		if _, ok := CheckICRC(&a, pkt); !ok {
			t.Fatalf("%v: BECN is not masked", pair)
		}
		for _, i := range []int{0, 3, 9, BTHLen + 3, len(pkt) - 5, len(pkt) - 1} {
			pkt[i] ^= 0x10
			if _, ok := CheckICRC(&a, pkt); ok {
				t.Fatalf("%v: flipped byte %d passed", pair, i)
			}
			pkt[i] ^= 0x10
		}
		b := a
		b.DstPort++
		if _, ok := CheckICRC(&b, pkt); ok {
			t.Fatalf("%v: wrong port passed", pair)
		}
	}
}

func TestSolveIDAllBits(t *testing.T) {
	a := Addrs{Src: netip.MustParseAddr("10.1.1.1"), Dst: netip.MustParseAddr("10.1.1.2"), SrcPort: 1, DstPort: UDPPort}
	pkt := make([]byte, BTHLen+AETHLen+ICRCLen)
	BTH(pkt).Encode(&BTHFields{Opcode: RCAcknowledge, PKey: DefaultPKey, DestQP: 3, PSN: 9})
	for _, id := range []uint16{1, 2, 0x8000, 0xffff, 0x1234, 0xabcd} {
		a.ID = id
		PutICRC(&a, pkt)
		if got, ok := CheckICRC(&a, pkt); !ok || got != id {
			t.Fatalf("id %#x: solved %#x, %v", id, got, ok)
		}
	}
}

// TestICRCParts: the ICRC of a packet in pieces is that of the packet in
// one buffer, however the payload is cut, for IPv4 (any identification)
// and IPv6.
func TestICRCParts(t *testing.T) {
	for _, src := range []string{"10.0.0.1", "fd00::1"} {
		dst := "10.0.0.2"
		if src == "fd00::1" {
			dst = "fd00::2"
		}
		a := Addrs{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), SrcPort: 49152, DstPort: UDPPort, ID: 7}
		for _, n := range []int{1, 3, 64, 4093} {
			var p Packet
			pkt := make([]byte, Len(RCWriteFirst, n))
			Build(&p, pkt, RCWriteFirst, n)
			p.BTH.Encode(&BTHFields{Opcode: RCWriteFirst, PadCount: PadCount(n), PKey: DefaultPKey, DestQP: 5, PSN: 11})
			p.RETH.Encode(0x1000, 0x77, uint32(n))
			for i := range p.Payload {
				p.Payload[i] = byte(i*7 + 1)
			}
			var h Hasher
			want := h.ICRC(&a, p.Body)
			hl := len(pkt) - ICRCLen - n - PadCount(n)
			pad := p.Body[hl+n:]
			for _, cut := range []int{0, 1, n / 2, n} {
				mid := [][]byte{p.Payload[:cut], p.Payload[cut:]}
				if got := h.ICRCParts(&a, p.Body[:hl], mid, pad); got != want {
					t.Fatalf("%s n=%d cut=%d: ICRCParts %#x, want %#x", src, n, cut, got, want)
				}
			}
		}
	}
}

// refICRC is the ICRC as the file comment defines it, computed from the
// masked headers in one buffer every time.
func refICRC(a *Addrs, body []byte) uint32 {
	var buf [pseudoMax]byte
	ps, _ := pseudo(&buf, a, body, len(body)+ICRCLen)
	all := append(append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, ps...), body[BTHLen:]...)
	return crc32.ChecksumIEEE(all)
}

// TestICRCMemo: one Hasher fed packets of changing shapes (families,
// addresses, ports, lengths, identifications) agrees with the reference
// every time: its memo of the masked IP and UDP headers follows the
// shape, and the identification's effect is added right.
func TestICRCMemo(t *testing.T) {
	addrs := [][2]string{{"10.0.0.1", "10.0.0.2"}, {"10.0.0.1", "10.0.0.3"}, {"fd00::1", "fd00::2"}, {"::ffff:10.0.0.1", "::ffff:10.0.0.2"}}
	var h Hasher
	x := uint32(1)
	rnd := func(n uint32) uint32 { x = x*1664525 + 1013904223; return (x >> 8) % n }
	body := make([]byte, 600)
	for i := range body {
		body[i] = byte(i * 13)
	}
	for i := 0; i < 2000; i++ {
		p := addrs[rnd(uint32(len(addrs)))]
		a := Addrs{Src: netip.MustParseAddr(p[0]), Dst: netip.MustParseAddr(p[1]), SrcPort: uint16(49152 + rnd(2)), DstPort: UDPPort}
		if a.Src.Is4() || a.Src.Is4In6() {
			a.ID = uint16(rnd(3) * rnd(65536))
		}
		b := body[:BTHLen+int(rnd(3))*100]
		b[5] = byte(i) // the PSN changes
		b[bthResv8a] = byte(rnd(256))
		want := refICRC(&a, b)
		if got := h.ICRC(&a, b); got != want {
			t.Fatalf("packet %d %+v len %d: ICRC %#x, want %#x", i, a, len(b), got, want)
		}
		pkt := binary.LittleEndian.AppendUint32(append([]byte(nil), b...), want)
		if id, ok := h.CheckICRC(&a, pkt); !ok || (a.Src.Is4() && id != a.ID) {
			t.Fatalf("packet %d %+v: CheckICRC = %d, %v", i, a, id, ok)
		}
	}
}

// BenchmarkCheckICRC: the receiver's check of a 4 KiB WRITE MIDDLE
// packet (a stream's: same addresses and length each time).
func BenchmarkCheckICRC(b *testing.B) {
	a := Addrs{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.1"), SrcPort: 50000, DstPort: UDPPort}
	var p Packet
	pkt := make([]byte, Len(RCWriteMiddle, 4096))
	Build(&p, pkt, RCWriteMiddle, 4096)
	p.BTH.Encode(&BTHFields{Opcode: RCWriteMiddle, PKey: DefaultPKey, DestQP: 5, PSN: 11})
	var h Hasher
	h.PutICRC(&a, pkt)
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		if _, ok := h.CheckICRC(&a, pkt); !ok {
			b.Fatal("bad ICRC")
		}
	}
}
