package roce

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/rdmakit/rdmakit/transport/roce/header"
)

// pcapPackets returns the UDP datagrams to or from port 4791 of a pcap
// file (Ethernet or Linux cooked link layer, IPv4 or IPv6), with the
// addresses and IPv4 identification their ICRC covers.
func pcapPackets(b []byte) ([]header.Addrs, [][]byte, error) {
	if len(b) < 24 {
		return nil, nil, fmt.Errorf("short pcap")
	}
	var bo binary.ByteOrder = binary.LittleEndian
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4, 0xa1b23c4d:
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		return nil, nil, fmt.Errorf("not a pcap file")
	}
	link := bo.Uint32(b[20:])
	var addrs []header.Addrs
	var pkts [][]byte
	for off := 24; off+16 <= len(b); {
		n := int(bo.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) {
			return nil, nil, fmt.Errorf("truncated record")
		}
		f := b[off : off+n]
		off += n
		var et uint16
		switch link {
		case 1: // Ethernet
			if len(f) < 14 {
				continue
			}
			et, f = binary.BigEndian.Uint16(f[12:]), f[14:]
		case 113: // Linux cooked
			if len(f) < 16 {
				continue
			}
			et, f = binary.BigEndian.Uint16(f[14:]), f[16:]
		default:
			return nil, nil, fmt.Errorf("link type %d", link)
		}
		var a header.Addrs
		switch {
		case et == 0x0800 && len(f) >= 20 && f[9] == 17:
			ihl := int(f[0]&15) * 4
			a.Src, a.Dst = netip.AddrFrom4([4]byte(f[12:16])), netip.AddrFrom4([4]byte(f[16:20]))
			a.ID = binary.BigEndian.Uint16(f[4:])
			f = f[ihl:]
		case et == 0x86dd && len(f) >= 40 && f[6] == 17:
			a.Src, a.Dst = netip.AddrFrom16([16]byte(f[8:24])), netip.AddrFrom16([16]byte(f[24:40]))
			f = f[40:]
		default:
			continue
		}
		if len(f) < 8 {
			continue
		}
		a.SrcPort, a.DstPort = binary.BigEndian.Uint16(f), binary.BigEndian.Uint16(f[2:])
		ul := int(binary.BigEndian.Uint16(f[4:]))
		if a.DstPort != header.UDPPort || ul < 8 || ul > len(f) {
			continue
		}
		addrs = append(addrs, a)
		pkts = append(pkts, f[8:ul])
	}
	return addrs, pkts, nil
}

// TestPcapICRC parses every RoCEv2 packet of a capture and checks its
// ICRC with the IP identification the capture shows (a full 32-bit
// check) and as a receiver on a socket does (solving for it). The
// committed capture (testdata/rxe-interop.pcap) is an exchange between
// this transport and the Linux kernel's rxe recorded in the test VM;
// ROCE_PCAP names another file.
func TestPcapICRC(t *testing.T) {
	name := os.Getenv("ROCE_PCAP")
	if name == "" {
		name = "testdata/rxe-interop.pcap"
	}
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	addrs, pkts, err := pcapPackets(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(pkts) == 0 {
		t.Fatal("no RoCEv2 packets in the capture")
	}
	var h header.Hasher
	withID, ops := 0, map[header.Opcode]int{}
	for i, pk := range pkts {
		var p header.Packet
		if err := header.Parse(&p, pk); err != nil {
			t.Fatalf("packet %d (%v -> %v): %v", i, addrs[i].Src, addrs[i].Dst, err)
		}
		ops[p.Opcode()]++
		if got, want := h.ICRC(&addrs[i], p.Body), binary.LittleEndian.Uint32(p.ICRC); got != want {
			t.Fatalf("packet %d %s (%v -> %v id %#x): ICRC %#08x, packet says %#08x", i, p.Opcode(), addrs[i].Src, addrs[i].Dst, addrs[i].ID, got, want)
		}
		id, ok := h.CheckICRC(&addrs[i], pk)
		if !ok || id != addrs[i].ID {
			t.Fatalf("packet %d: CheckICRC solved id %#x, %v; the capture says %#x", i, id, ok, addrs[i].ID)
		}
		if id != 0 {
			withID++
		}
	}
	t.Logf("checked %d packets (%d with a non-zero IPv4 identification); opcodes %v", len(pkts), withID, ops)
}
