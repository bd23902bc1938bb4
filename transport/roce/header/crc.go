package header

// The CRC-32 under the ICRC, in three implementations: the standard
// library's (carry-less multiplication where the CPU has it, ~25 GB/s on
// a 4 KiB payload on this project's development machines), a
// slicing-by-16 table (~2.8 GB/s there), and on amd64 with AVX-512
// VPCLMULQDQ a fold of four 512-bit registers at a time (crc_amd64.s,
// ~45 GB/s). Under an emulating hypervisor (QEMU's TCG, as in test/vm)
// the carry-less multiply instruction is emulated bit by bit and the
// table is the faster one (a run: 6.5 against 9.9 µs per 4 KiB). Which
// one a process uses is decided once, at package initialisation, by
// timing them on a 4 KiB buffer (tens of µs); all give the same CRC
// (TestCRCImplementations, FuzzCRC).

import (
	"encoding/binary"
	"hash/crc32"
	"time"
)

// crcUpdate is crc32.Update(c, crc32.IEEETable, p), by the fastest of the
// implementations here.
var crcUpdate = pickCRC()

// foldMin is the shortest input crcFold folds (where it folds); shorter
// ones go to the library.
const foldMin = 512

func crcLibrary(c uint32, p []byte) uint32 { return crc32.Update(c, crc32.IEEETable, p) }

var slice16 = func() (t [16][256]uint32) {
	for i := range t[0] {
		t[0][i] = crc32.IEEETable[i]
	}
	for i := range t[0] {
		c := t[0][i]
		for k := 1; k < 16; k++ {
			c = c>>8 ^ t[0][c&0xff]
			t[k][i] = c
		}
	}
	return t
}()

// crcSlice16 is crc32.Update with the IEEE table, sixteen bytes a step.
func crcSlice16(crc uint32, p []byte) uint32 {
	crc = ^crc
	t := &slice16
	for len(p) >= 16 {
		a := crc ^ binary.LittleEndian.Uint32(p)
		b := binary.LittleEndian.Uint32(p[4:])
		c := binary.LittleEndian.Uint32(p[8:])
		d := binary.LittleEndian.Uint32(p[12:])
		crc = t[15][a&0xff] ^ t[14][a>>8&0xff] ^ t[13][a>>16&0xff] ^ t[12][a>>24] ^
			t[11][b&0xff] ^ t[10][b>>8&0xff] ^ t[9][b>>16&0xff] ^ t[8][b>>24] ^
			t[7][c&0xff] ^ t[6][c>>8&0xff] ^ t[5][c>>16&0xff] ^ t[4][c>>24] ^
			t[3][d&0xff] ^ t[2][d>>8&0xff] ^ t[1][d>>16&0xff] ^ t[0][d>>24]
		p = p[16:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// pickCRC times the implementations this CPU has (the best of five runs
// over 4 KiB each) and returns the fastest.
func pickCRC() func(uint32, []byte) uint32 {
	var buf [4096]byte
	best := func(f func(uint32, []byte) uint32) time.Duration {
		m := time.Duration(1 << 62)
		for range 5 {
			t := time.Now()
			f(0, buf[:])
			m = min(m, time.Since(t))
		}
		return m
	}
	f, t := crcLibrary, best(crcLibrary)
	if d := best(crcSlice16); d < t {
		f, t = crcSlice16, d
	}
	if haveFold {
		if d := best(crcFold); d < t {
			f = crcFold
		}
	}
	return f
}

// crcBTH is crc32.Update with the IEEE table over exactly BTHLen (12)
// bytes, by the slicing tables in one step: the standard library takes
// inputs this short a byte at a time (~40 ns; this, ~5).
func crcBTH(crc uint32, p *[BTHLen]byte) uint32 {
	t := &slice16
	a := ^crc ^ binary.LittleEndian.Uint32(p[0:])
	b := binary.LittleEndian.Uint32(p[4:])
	c := binary.LittleEndian.Uint32(p[8:])
	return ^(t[11][a&0xff] ^ t[10][a>>8&0xff] ^ t[9][a>>16&0xff] ^ t[8][a>>24] ^
		t[7][b&0xff] ^ t[6][b>>8&0xff] ^ t[5][b>>16&0xff] ^ t[4][b>>24] ^
		t[3][c&0xff] ^ t[2][c>>8&0xff] ^ t[1][c>>16&0xff] ^ t[0][c>>24])
}
