package header

import (
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
)

// TestCRCImplementations: the table, the library and the fold agree on
// every length around the 16-byte step, on every length from just below
// the fold's shortest to a few of its 256-byte steps and 64-byte blocks
// past it, on payload-sized inputs, and on random data and seeds.
func TestCRCImplementations(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 5000)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for n := 0; n <= 80; n++ {
		for _, off := range []int{0, 1, 7} {
			seed := rng.Uint32()
			p := buf[off : off+n]
			if a, b := crcSlice16(seed, p), crcLibrary(seed, p); a != b {
				t.Fatalf("len %d off %d seed %#x: table %#x, library %#x", n, off, seed, a, b)
			}
		}
	}
	if a, b := crcSlice16(0, buf), crc32.ChecksumIEEE(buf); a != b {
		t.Fatalf("5000 bytes: table %#x, library %#x", a, b)
	}
	if !haveFold {
		t.Logf("SKIP (loud) for the fold: this CPU lacks AVX-512 VPCLMULQDQ; the table and the library were compared")
	}
	lens := []int{0, 1, 63, 64, 255, 256, 4096, 4096 + 12, 4096 + 12 + 20, 4999}
	for n := foldMin - 70; n <= foldMin+3*256+70; n++ {
		lens = append(lens, n)
	}
	for _, n := range lens {
		for _, off := range []int{0, 1, 7} {
			if off+n > len(buf) {
				continue
			}
			seed := rng.Uint32()
			p := buf[off : off+n]
			if a, b := crcFold(seed, p), crcLibrary(seed, p); a != b {
				t.Fatalf("len %d off %d seed %#x: fold %#x, library %#x", n, off, seed, a, b)
			}
		}
	}
	t.Logf("this process uses the %s", crcName())
}

// crcName names the implementation pickCRC chose.
func crcName() string {
	switch reflect.ValueOf(crcUpdate).Pointer() {
	case reflect.ValueOf(crcSlice16).Pointer():
		return "table"
	case reflect.ValueOf(crcFold).Pointer():
		return "fold"
	}
	return "library"
}

func FuzzCRC(f *testing.F) {
	f.Add(uint32(0), []byte("123456789"))
	f.Add(uint32(0xffffffff), make([]byte, 33))
	f.Add(uint32(0x12345678), make([]byte, foldMin+64+13))
	f.Fuzz(func(t *testing.T, seed uint32, p []byte) {
		if a, b := crcSlice16(seed, p), crcLibrary(seed, p); a != b {
			t.Fatalf("table %#x, library %#x", a, b)
		}
		if a, b := crcFold(seed, p), crcLibrary(seed, p); a != b {
			t.Fatalf("fold %#x, library %#x", a, b)
		}
	})
}

// TestHasherSolverLengths: one Hasher checking IPv4 packets of changing
// lengths with non-zero identifications solves each for its own length
// (the solver it keeps is rebuilt when the length changes).
func TestHasherSolverLengths(t *testing.T) {
	var h Hasher
	a := Addrs{Src: netip.MustParseAddr("10.1.1.1"), Dst: netip.MustParseAddr("10.1.1.2"), SrcPort: 4000, DstPort: UDPPort}
	for i, n := range []int{100, 100, 4096, 100, 4096, 4096, 7, 100} {
		pkt := make([]byte, BTHLen+n+ICRCLen)
		BTH(pkt).Encode(&BTHFields{Opcode: RCSendOnly, PKey: DefaultPKey, DestQP: 3, PSN: uint32(i)})
		for j := BTHLen; j < BTHLen+n; j++ {
			pkt[j] = byte(j * i)
		}
		a.ID = uint16(1 + i*977)
		PutICRC(&a, pkt)
		if got, ok := h.CheckICRC(&a, pkt); !ok || got != a.ID {
			t.Fatalf("packet %d (%d bytes), id %d: solved %d, %v", i, n, a.ID, got, ok)
		}
		pkt[BTHLen] ^= 1
		if _, ok := h.CheckICRC(&a, pkt); ok {
			// A flipped payload bit is not an identification.
			t.Fatalf("packet %d: a corrupted payload passed", i)
		}
	}
}

// TestCRCBTH: the one-step 12-byte CRC is the library's, from any register.
func TestCRCBTH(t *testing.T) {
	var p [BTHLen]byte
	for i := 0; i < 1000; i++ {
		for k := range p {
			p[k] = byte(i*31 + k*k*7)
		}
		c := uint32(i) * 0x9E3779B1
		if got, want := crcBTH(c, &p), crc32.Update(c, crc32.IEEETable, p[:]); got != want {
			t.Fatalf("crcBTH(%#x, %x) = %#x, want %#x", c, p, got, want)
		}
	}
}

// BenchmarkCRC: each implementation over a 4 KiB payload with its 12-byte
// header (an RDMA WRITE_MIDDLE's ICRC input past the IP and UDP headers).
func BenchmarkCRC(b *testing.B) {
	p := make([]byte, 4096+BTHLen)
	for i := range p {
		p[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name string
		f    func(uint32, []byte) uint32
	}{{"library", crcLibrary}, {"table", crcSlice16}, {"fold", crcFold}} {
		b.Run(c.name, func(b *testing.B) {
			if c.name == "fold" && !haveFold {
				b.Skip("SKIP (loud): this CPU lacks AVX-512 VPCLMULQDQ")
			}
			b.SetBytes(int64(len(p)))
			var s uint32
			for b.Loop() {
				s = c.f(s, p)
			}
			crcSink = s
		})
	}
}

var crcSink uint32
