package header

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// samples builds one valid packet of every opcode, with a few payload
// lengths (pad 0..3).
func samples() [][]byte {
	a := Addrs{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 4791, DstPort: 4791}
	var out [][]byte
	for op := 0; op < 256; op++ {
		o := Opcode(op)
		if !o.Known() {
			continue
		}
		lens := []int{0}
		if o.HasPayload() {
			lens = []int{0, 1, 2, 3, 4, 33}
		}
		for _, n := range lens {
			buf := make([]byte, Len(o, n))
			var p Packet
			Build(&p, buf, o, n)
			p.BTH.Encode(&BTHFields{Opcode: o, PadCount: PadCount(n), PKey: DefaultPKey, DestQP: 0x123456, PSN: 0xabcdef, AckReq: true})
			if p.RETH != nil {
				p.RETH.Encode(0x1122334455667788, 0xdeadbeef, uint32(n))
			}
			if p.AtomicETH != nil {
				p.AtomicETH.Encode(0x1000, 7, 5, 6)
			}
			if p.AETH != nil {
				p.AETH.Encode(SynACK|CreditsUnlimited, 42)
			}
			if p.AtomicAckETH != nil {
				p.AtomicAckETH.Encode(99)
			}
			if p.ImmDt != nil {
				p.ImmDt.Encode(0x01020304)
			}
			if p.IETH != nil {
				p.IETH.Encode(0x77)
			}
			if p.DETH != nil {
				p.DETH.Encode(0x11111111, 1)
			}
			for i := range p.Payload {
				p.Payload[i] = byte(i + 1)
			}
			PutICRC(&a, buf)
			out = append(out, buf)
		}
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	for _, b := range samples() {
		var p Packet
		if err := Parse(&p, b); err != nil {
			t.Fatalf("%x: %v", b, err)
		}
		o := p.Opcode()
		if p.BTH.DestQP() != 0x123456 || p.BTH.PSN() != 0xabcdef || !p.BTH.AckReq() || p.BTH.PKey() != DefaultPKey {
			t.Fatalf("%s: BTH %x", o, []byte(p.BTH))
		}
		if o.HasRETH() && (p.RETH.VA() != 0x1122334455667788 || p.RETH.RKey() != 0xdeadbeef || int(p.RETH.DMALen()) != len(p.Payload)) {
			t.Fatalf("%s: RETH %x", o, []byte(p.RETH))
		}
		if o.HasImmDt() && p.ImmDt.Imm() != 0x01020304 {
			t.Fatalf("%s: imm", o)
		}
		if o.HasAETH() && (p.AETH.Kind() != SynACK || p.AETH.Value() != CreditsUnlimited || p.AETH.MSN() != 42) {
			t.Fatalf("%s: AETH", o)
		}
		if p.AtomicETH != nil && (p.AtomicETH.VA() != 0x1000 || p.AtomicETH.RKey() != 7 || p.AtomicETH.SwapAdd() != 5 || p.AtomicETH.Compare() != 6) {
			t.Fatalf("%s: AtomicETH", o)
		}
		if p.AtomicAckETH != nil && p.AtomicAckETH.Orig() != 99 {
			t.Fatalf("%s: AtomicAckETH", o)
		}
		if p.DETH != nil && (p.DETH.QKey() != 0x11111111 || p.DETH.SrcQP() != 1) {
			t.Fatalf("%s: DETH", o)
		}
		if p.IETH != nil && p.IETH.RKey() != 0x77 {
			t.Fatalf("%s: IETH", o)
		}
		for i, c := range p.Payload {
			if c != byte(i+1) {
				t.Fatalf("%s: payload %x", o, p.Payload)
			}
		}
		if len(b)%4 != 0 {
			t.Fatalf("%s: %d bytes, not padded", o, len(b))
		}
	}
}

// Every truncated prefix of a valid packet is rejected, or parses as a
// packet whose ICRC no longer matches (a prefix that happens to be well
// formed: a payload packet cut by a multiple of four bytes).
func TestTruncatedPrefixes(t *testing.T) {
	a := Addrs{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 4791, DstPort: 4791}
	for _, b := range samples() {
		for n := 0; n < len(b); n++ {
			var p Packet
			err := Parse(&p, b[:n])
			if err == nil {
				if _, ok := CheckICRC(&a, b[:n]); ok {
					t.Fatalf("%s: prefix of %d/%d bytes accepted with a valid ICRC", Opcode(b[0]), n, len(b))
				}
				if !p.Opcode().HasPayload() {
					t.Fatalf("%s: prefix of %d/%d bytes parsed", Opcode(b[0]), n, len(b))
				}
				continue
			}
			if !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s: prefix %d: %v", Opcode(b[0]), n, err)
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	ok := samples()[0]
	cases := map[string]func(b []byte) []byte{
		"unknown opcode": func(b []byte) []byte { b[0] = 0x40; return b },
		"tver":           func(b []byte) []byte { b[1] |= 1; return b },
		"ack with data": func(b []byte) []byte {
			b2 := make([]byte, Len(RCAcknowledge, 0)+4)
			b2[0] = byte(RCAcknowledge)
			return b2
		},
		"pad beyond payload": func(b []byte) []byte {
			b2 := make([]byte, Len(RCSendOnly, 0))
			b2[0] = byte(RCSendOnly)
			b2[1] = 3 << padShift
			return b2
		},
		"unaligned": func(b []byte) []byte {
			b2 := make([]byte, Len(RCSendOnly, 4)+1)
			b2[0] = byte(RCSendOnly)
			return b2
		},
	}
	for name, f := range cases {
		b := f(bytes.Clone(ok))
		var p Packet
		if err := Parse(&p, b); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestParseAllocs(t *testing.T) {
	b := samples()[3]
	var p Packet
	a := Addrs{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 4791, DstPort: 4791}
	var h Hasher
	if n := testing.AllocsPerRun(100, func() {
		if Parse(&p, b) != nil {
			panic("parse")
		}
		if _, ok := h.CheckICRC(&a, b); !ok {
			panic("icrc")
		}
	}); n != 0 {
		t.Fatalf("%v allocations per packet", n)
	}
}

func FuzzParse(f *testing.F) {
	for _, b := range samples() {
		f.Add(b)
	}
	a := Addrs{Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"), SrcPort: 4791, DstPort: 4791}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if err := Parse(&p, b); err != nil {
			return
		}
		// Every view of a parsed packet is readable, and the pieces
		// account for the whole packet.
		_ = p.BTH.PSN() + p.BTH.DestQP()
		n := BTHLen + len(p.DETH) + len(p.RETH) + len(p.AtomicETH) + len(p.AETH) + len(p.AtomicAckETH) + len(p.ImmDt) + len(p.IETH)
		if p.Opcode() == CNP {
			n += CNPReservedLen
		}
		if n+len(p.Payload)+p.BTH.PadCount()+ICRCLen != len(b) {
			t.Fatalf("%s: pieces %d + %d + %d + 4 != %d", p.Opcode(), n, len(p.Payload), p.BTH.PadCount(), len(b))
		}
		if p.RETH != nil {
			_ = p.RETH.VA() + uint64(p.RETH.RKey())
		}
		if p.AETH != nil {
			_ = p.AETH.MSN()
		}
		CheckICRC(&a, b)
	})
}

// TestWriteSeedCorpus keeps testdata/fuzz/FuzzParse in step with samples
// (run with ROCE_WRITE_CORPUS=1).
func TestWriteSeedCorpus(t *testing.T) {
	if os.Getenv("ROCE_WRITE_CORPUS") == "" {
		t.Skip("set ROCE_WRITE_CORPUS=1 to rewrite testdata/fuzz/FuzzParse")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	os.MkdirAll(dir, 0o755)
	for i, b := range samples() {
		if i%3 != 0 {
			continue
		}
		s := "go test fuzz v1\n[]byte(" + quote(b) + ")\n"
		os.WriteFile(filepath.Join(dir, "seed"+itoa(i)), []byte(s), 0o644)
	}
}
