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

// Copy is copy(dst, src) for the data path of the memory transports.
// Copies of MovsbMin bytes or more, whose ranges do not overlap, go
// through REP MOVSB on CPUs with ERMS: on the AMD EPYC (Zen 5) dev host a
// 64 KiB in-cache copy takes ~510 ns that way against ~680 ns for the
// runtime's memmove (glibc's memcpy makes the same choice, ~520 ns).
// Smaller copies, and every copy in race builds (which must see the
// accesses), use copy. Like copy, Copy promises nothing about the order in
// which other CPUs see the bytes (REP MOVSB's stores may become visible
// out of order): a reader of shared memory needs a separate flag written
// after it, as it does with copy.
func Copy(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < MovsbMin || !useMovsb {
		return copy(dst, src)
	}
	d, s := unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src))
	if uintptr(d) < uintptr(s)+uintptr(n) && uintptr(s) < uintptr(d)+uintptr(n) {
		return copy(dst, src) // overlapping: memmove
	}
	movsb(d, s, n)
	return n
}

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
