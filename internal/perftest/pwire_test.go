package perftest

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
)

// The expected bytes below are written out from perftest's definitions
// (perftest_communication.h: KEY_MSG_SIZE_GID 108, KEY_PRINT_FMT_GID;
// perftest_parameters.h: MAX_VERSION 16), not produced by the encoder.

const pwSampleKey = "0000:0000:000011:abcdef:00001234:00005566778899aa:" +
	"00:00:00:00:00:00:00:00:00:00:ff:ff:0a:c8:00:01:00000000:"

var pwSample = pwKey{qpn: 0x11, psn: 0xabcdef, rkey: 0x1234, vaddr: 0x5566778899aa,
	gid: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 200, 14: 0, 15: 1}}

func TestPWKeyEncode(t *testing.T) {
	if len(pwSampleKey) != pwKeyLen-1 {
		t.Fatalf("sample is %d characters, KEY_PRINT_FMT_GID makes %d", len(pwSampleKey), pwKeyLen-1)
	}
	want := append([]byte(pwSampleKey), 0)
	if got := pwSample.encode(); !bytes.Equal(got, want) {
		t.Fatalf("encode:\n got %q\nwant %q", got, want)
	}
	k, err := parsePWKey(want)
	if err != nil || k != pwSample {
		t.Fatalf("parse: %+v, %v; want %+v", k, err, pwSample)
	}
	// perftest's sprintf masks nothing: widths are minimums, and 24-bit
	// QPN/PSN are printed as they are; ours masks to 24 bits.
	full := pwKey{lid: 0xffff, outReads: 0x10, qpn: 0xffffff, psn: 0xffffff, rkey: 0xffffffff, vaddr: ^uint64(0), srqn: 0xffffffff}
	for i := range full.gid {
		full.gid[i] = 0xfe
	}
	b := full.encode()
	if n := bytes.IndexByte(b, 0); n != pwKeyLen-1 {
		t.Fatalf("full key: NUL at %d, want %d", n, pwKeyLen-1)
	}
	if k, err := parsePWKey(b); err != nil || k != full {
		t.Fatalf("full key round trip: %+v, %v", k, err)
	}
	// Upper-case hex (sscanf/strtol accept it) parses too.
	up := append([]byte(strings.ToUpper(pwSampleKey)), 0)
	if k, err := parsePWKey(up); err != nil || k != pwSample {
		t.Fatalf("upper case: %+v, %v", k, err)
	}
}

func TestPWKeyBad(t *testing.T) {
	pad := func(s string) []byte {
		b := make([]byte, pwKeyLen)
		copy(b, s)
		return b
	}
	good := pad(pwSampleKey)
	bad := map[string][]byte{
		"short":         good[:pwKeyLen-1],
		"long":          append(append([]byte(nil), good...), 0),
		"no NUL":        bytes.Repeat([]byte("a"), pwKeyLen),
		"junk after":    func() []byte { b := pad("0000:"); b[100] = 'x'; return b }(),
		"no GID":        pad("0000:0000:000011:abcdef:00001234:00005566778899aa:00000000"),
		"no colon":      pad(strings.TrimSuffix(pwSampleKey, ":")),
		"not hex":       pad(strings.Replace(pwSampleKey, "abcdef", "abcdeg", 1)),
		"short field":   pad(strings.Replace(pwSampleKey, ":000011:", ":00011:", 1)),
		"sign":          pad(strings.Replace(pwSampleKey, ":000011:", ":+00011:", 1)),
		"empty":         make([]byte, pwKeyLen),
		"KEY_PRINT_FMT": pad("0000:0000:000011:abcdef:00001234:00005566778899aa:00000000"),
	}
	for name, b := range bad {
		if _, err := parsePWKey(b); err == nil {
			t.Errorf("%s: parsed %q", name, b)
		}
	}
}

func TestPWVersion(t *testing.T) {
	want := []byte("6.06\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	if got := encodePWVersion(pwVersion); !bytes.Equal(got, want) {
		t.Fatalf("version: %q, want %q", got, want)
	}
	for in, f := range map[string]float64{"6.06": 6.06, "5.70": 5.70, "4.5": 4.5, "6.21.1": 6.21, "x": 0, "": 0, "7.": 7} {
		b := make([]byte, pwVersionLen)
		copy(b, in)
		if _, got := parsePWVersion(b); got != f {
			t.Errorf("%q: %v, want %v", in, got, f)
		}
	}
	if _, f := parsePWVersion(bytes.Repeat([]byte("9"), pwVersionLen)); f == 0 {
		t.Error("unterminated version")
	}
}

func TestPWScalars(t *testing.T) {
	if got := encodePWInt(pwCycleBuffer); !bytes.Equal(got, []byte{0, 0, 0x10, 0}) {
		t.Errorf("cycle buffer: % x", got)
	}
	if got := parsePWInt([]byte{0, 0, 0, 64}); got != 64 {
		t.Errorf("cache line: %d", got)
	}
	// check_mtu: sprintf("%d", IBV_MTU_1024) sent as 2 bytes.
	if got := encodePWMTU(3); !bytes.Equal(got, []byte("3\x00")) {
		t.Errorf("mtu: %q", got)
	}
	for in, m := range map[string]int{"3\x00": 3, "5\x00": 5, "1\x00": 1, "0\x00": 0, "6\x00": 0, "\x00\x00": 0, "x\x00": 0, "4x": 4} {
		if got := parsePWMTU([]byte(in)); got != m {
			t.Errorf("mtu %q: %d, want %d", in, got, m)
		}
	}
	if !bytes.Equal(pwDone, []byte{'d', 'o', 'n', 'e', 0}) {
		t.Error("done")
	}
}

func TestPWReport(t *testing.T) {
	r := pwReport{size: 65536, iters: 200, peak: 1, avg: 2, msgRateAvg: 0.5}
	want := []byte{
		0, 0, 0, 0, 0, 1, 0, 0, // size, hton_long
		0, 0, 0, 0, 0, 0, 0, 200, // iters, 8 bytes for peers >= 5.33
		0x3f, 0xf0, 0, 0, 0, 0, 0, 0, // bw_peak 1.0, hton_double
		0x40, 0, 0, 0, 0, 0, 0, 0, // bw_avg 2.0
		0x3f, 0xe0, 0, 0, 0, 0, 0, 0, // msgRate_avg 0.5
	}
	if got := r.encode(); !bytes.Equal(got, want) {
		t.Fatalf("report: % x\nwant % x", got, want)
	}
	if got, err := parsePWReport(want); err != nil || got != r {
		t.Fatalf("parse: %+v, %v", got, err)
	}
	if _, err := parsePWReport(want[:39]); err == nil {
		t.Fatal("short report parsed")
	}
}

func TestPWAddr(t *testing.T) {
	a := make([]byte, 48)
	copy(a, "RKIB")
	a[4] = 1
	a[8] = 7
	copy(a[16:], pwSample.gid[:])
	gid, lid, ok := pwAddrGID(a)
	if !ok || gid != pwSample.gid || lid != 7 {
		t.Fatalf("%x %d %v", gid, lid, ok)
	}
	if _, _, ok := pwAddrGID([]byte("SMH1")); ok {
		t.Fatal("shm address taken for an ibverbs one")
	}
	// transport/roce: version 1, port, QP number, then the IP (IPv4
	// mapped), which is the RoCEv2 GID.
	r := make([]byte, 24)
	r[0] = 1
	ip := netip.MustParseAddr("::ffff:10.98.0.2").As16()
	copy(r[8:], ip[:])
	if gid, lid, ok := pwAddrGID(r); !ok || gid != ip || lid != 0 {
		t.Fatalf("roce address: %x %d %v", gid, lid, ok)
	}
	if _, _, ok := pwAddrGID(make([]byte, 24)); ok {
		t.Fatal("an all-zero roce address taken")
	}
}

func TestPWireChecks(t *testing.T) {
	wbw, _ := ParseTest("write_bw")
	for _, o := range []Options{{Test: wbw, Bidir: true}, {Test: wbw, Duration: 2}, {Test: wbw, Infinite: true}} {
		if err := checkPWire(o); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	for _, name := range []string{"write_bw", "write_lat", "read_bw", "read_lat", "send_bw", "send_lat", "atomic_bw", "atomic_lat"} {
		tt, _ := ParseTest(name)
		for _, o := range []Options{{Test: tt}, {Test: tt, All: tt.Verb != VerbAtomic, QPs: 2}} {
			if err := checkPWire(o); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}
	}
	// The flag of earlier releases is still accepted (and not needed).
	o, err := ParseArgs([]string{"send_bw", "--perftest-wire", "-s", "65536", "10.0.0.1"})
	if err != nil || !o.PerftestWire {
		t.Fatalf("%+v %v", o, err)
	}
}

// TestGreet: rdmakit's opening is perftest's version message with a
// marker after the NUL; each side tells an rdmakit peer from perftest.
func TestGreet(t *testing.T) {
	g := pwGreeting()
	if len(g) != pwVersionLen || !bytes.HasPrefix(g, []byte("6.06\x00rdmakit\x00")) {
		t.Fatalf("greeting %q", g)
	}
	if v, f := parsePWVersion(g); v != pwVersion || f != 6.06 {
		t.Fatalf("perftest reads %q %v", v, f)
	}
	perftest := encodePWVersion("6.06")
	for _, tc := range []struct {
		name     string
		peer     []byte
		perftest bool
		err      string
	}{
		{"rdmakit", g, false, ""},
		{"perftest", perftest, true, ""},
		{"old perftest", encodePWVersion("5.60"), false, "neither"},
		{"old rdmakit", []byte("HELLO 1 test=write_bw all=0\n")[:pwVersionLen], false, "older rdmakit"},
	} {
		for _, client := range []bool{true, false} {
			a, b := net.Pipe()
			go func() {
				buf := make([]byte, pwVersionLen)
				if client {
					io.ReadFull(b, buf)
					b.Write(tc.peer)
				} else {
					b.Write(tc.peer)
					io.ReadFull(b, buf)
				}
			}()
			got, err := greet(a, client, "peer")
			a.Close()
			b.Close()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("%s (client %v): %v, want %q", tc.name, client, err, tc.err)
				}
				continue
			}
			if err != nil || got != tc.perftest {
				t.Errorf("%s (client %v): perftest %v, %v", tc.name, client, got, err)
			}
		}
	}
}

// FuzzParsePWKey: no input makes the key parser panic, and whatever
// parses encodes back to the same key.
func FuzzParsePWKey(f *testing.F) {
	f.Add(append([]byte(pwSampleKey), 0))
	f.Add(pwKey{lid: 1, outReads: 16, qpn: 0xffffff, rkey: 1, vaddr: 1 << 40, srqn: 3}.encode())
	f.Add(make([]byte, pwKeyLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parsePWKey(b)
		if err != nil {
			return
		}
		k2, err := parsePWKey(k.encode())
		if err != nil || k2 != k {
			t.Fatalf("%q → %+v → %+v, %v", b, k, k2, err)
		}
	})
}

func TestPWKeyBin(t *testing.T) {
	k := pwSample
	k.lid = 0
	b := k.encodeBin()
	if len(b) != pwKeyBinLen {
		t.Fatalf("%d bytes", len(b))
	}
	// The layout perftest's struct pingpong_dest has: QPN at 8, rkey at 16,
	// the address at 24, the GID at 32, all big endian.
	if binary.BigEndian.Uint32(b[8:]) != k.qpn || binary.BigEndian.Uint32(b[16:]) != k.rkey ||
		binary.BigEndian.Uint64(b[24:]) != k.vaddr || !bytes.Equal(b[32:48], k.gid[:]) {
		t.Fatalf("layout: %x", b)
	}
	got, err := parsePWKeyBin(b)
	if err != nil || got != k {
		t.Fatalf("round trip: %+v, %v, want %+v", got, err, k)
	}
	if _, err := parsePWKeyBin(b[:55]); err == nil {
		t.Fatal("short key parsed")
	}
	b[8] = 1 // QPN beyond 24 bits
	if _, err := parsePWKeyBin(b); err == nil {
		t.Fatal("QPN beyond 24 bits parsed")
	}
}

func FuzzParsePWKeyBin(f *testing.F) {
	f.Add(pwSample.encodeBin())
	f.Add(make([]byte, pwKeyBinLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parsePWKeyBin(b)
		if err != nil {
			return
		}
		k2, err := parsePWKeyBin(k.encodeBin())
		if err != nil || k2 != k {
			t.Fatalf("%x → %+v → %+v, %v", b, k, k2, err)
		}
	})
}
