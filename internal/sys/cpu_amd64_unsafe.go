//go:build amd64 && !race

package sys

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// movsb copies n bytes from src to dst with REP MOVSB (cpu_amd64.s); the
// ranges must not overlap.
//
//go:noescape
func movsb(dst, src unsafe.Pointer, n int)

// useMovsb: the CPU has enhanced REP MOVSB (ERMS), which on current cores
// moves in-cache blocks of tens of KiB faster than the runtime's AVX loop
// (see Copy).
var useMovsb = cpu.X86.HasERMS

// copyAVX512 copies n bytes, a positive multiple of 256, from src to dst
// with 64-byte loads and stores (cpu_amd64.s); the ranges must not
// overlap.
//
//go:noescape
func copyAVX512(dst, src unsafe.Pointer, n int)

// useAVX512: the CPU and the OS support AVX-512 (see Copy).
var useAVX512 = cpu.X86.HasAVX512F

// Copy is copy(dst, src) for the data path of the memory transports.
// Copies whose ranges do not overlap go, by size:
//
//   - from avx512Min to avx512Max bytes, on CPUs with AVX-512, through a
//     loop of 64-byte moves: on the AMD EPYC (Zen 5) dev host a 4 KiB
//     in-cache copy takes ~16 ns that way against ~26 ns for the
//     runtime's memmove (32-byte moves), 16 KiB ~62 against ~94 ns.
//     Above 16 KiB the two buffers stop fitting in the first-level cache
//     together and the loop loses its lead;
//   - from MovsbMin bytes on, on CPUs with ERMS, through REP MOVSB: a
//     64 KiB in-cache copy takes ~510 ns that way against ~680 ns for the
//     runtime's memmove (glibc's memcpy makes the same choice, ~520 ns).
//
// Other copies, and every copy in race builds (which must see the
// accesses), use copy. Like copy, Copy promises nothing about the order in
// which other CPUs see the bytes (these stores may become visible out of
// order): a reader of shared memory needs a separate flag written after
// it, as it does with copy.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < avx512Min {
		return copy(dst, src)
	}
	d, s := unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src))
	if uintptr(d) < uintptr(s)+uintptr(n) && uintptr(s) < uintptr(d)+uintptr(n) {
		return copy(dst, src) // overlapping: memmove
	}
	switch {
	case n <= avx512Max && useAVX512:
		copyAVX512(d, s, n&^255)
		if r := n & 255; r != 0 {
			// The last 256 bytes, overlapping what the loop wrote with
			// the same bytes.
			copyAVX512(unsafe.Add(d, n-256), unsafe.Add(s, n-256), 256)
		}
	case n >= MovsbMin && useMovsb:
		movsb(d, s, n)
	default:
		return copy(dst, src)
	}
	return n
}

// The sizes Copy moves with copyAVX512.
const (
	avx512Min = 256
	avx512Max = 16 << 10
)

// storeRel64 is a plain store (cpu_amd64.s): on amd64 every store has
// release order, and the call keeps the compiler from moving memory
// accesses across it.
//
//go:noescape
func storeRel64(p *uint64, v uint64)

// StoreRelease64 stores v at b[off:] with release order only: every
// access before it is visible before it, but a later load may be
// performed first (unlike Store64, a locked instruction on amd64). For a
// word that hands a slot back, where no one waits on the store.
func StoreRelease64(b []byte, off int, v uint64) { storeRel64(p64(b, off), v) }

func rdtsc() int64

func cpuid(eax, ecx uint32) (a, b, c, d uint32)

// HasTicks reports whether Ticks reads a counter that runs at a constant
// rate on every CPU (the invariant time-stamp counter: CPUID
// 0x80000007, EDX bit 8).
var HasTicks = func() bool {
	if max, _, _, _ := cpuid(0x80000000, 0); max < 0x80000007 {
		return false
	}
	_, _, _, d := cpuid(0x80000007, 0)
	return d&(1<<8) != 0
}()

// Ticks reads the CPU's time-stamp counter (RDTSC, unserialised, as
// perftest's get_cycles): about 9 ns on the dev host against 23 ns for
// the monotonic clock. Its rate is constant where HasTicks; callers
// calibrate it against the clock.
func Ticks() int64 { return rdtsc() }
