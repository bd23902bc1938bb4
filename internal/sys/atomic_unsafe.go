package sys

import (
	"sync/atomic"
	"unsafe"
)

// The helpers below operate on naturally aligned words at byte offset off of
// b. They panic if the word is out of range. Alignment is the caller's duty: all shared layouts in rdmakit place
// 32-bit words at multiples of 4 and 64-bit words at multiples of 8, relative
// to page-aligned mappings.

func p32(b []byte, off int) *uint32 {
	if off < 0 || off+4 > len(b) {
		panic("sys: 32-bit word out of range")
	}
	return (*uint32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), off))
}

func p64(b []byte, off int) *uint64 {
	if off < 0 || off+8 > len(b) {
		panic("sys: 64-bit word out of range")
	}
	return (*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), off))
}

// Load32 atomically loads the uint32 at b[off:].
func Load32(b []byte, off int) uint32 { return atomic.LoadUint32(p32(b, off)) }

// Store32 atomically stores v at b[off:].
func Store32(b []byte, off int, v uint32) { atomic.StoreUint32(p32(b, off), v) }

// Add32 atomically adds d to the uint32 at b[off:] and returns the new value.
func Add32(b []byte, off int, d uint32) uint32 { return atomic.AddUint32(p32(b, off), d) }

// CAS32 is an atomic compare-and-swap of the uint32 at b[off:].
func CAS32(b []byte, off int, old, new uint32) bool {
	return atomic.CompareAndSwapUint32(p32(b, off), old, new)
}

// Load64 atomically loads the uint64 at b[off:].
func Load64(b []byte, off int) uint64 { return atomic.LoadUint64(p64(b, off)) }

// Store64 atomically stores v at b[off:].
func Store64(b []byte, off int, v uint64) { atomic.StoreUint64(p64(b, off), v) }

// Add64 atomically adds d to the uint64 at b[off:] and returns the new value.
func Add64(b []byte, off int, d uint64) uint64 { return atomic.AddUint64(p64(b, off), d) }

// CAS64 is an atomic compare-and-swap of the uint64 at b[off:].
func CAS64(b []byte, off int, old, new uint64) bool {
	return atomic.CompareAndSwapUint64(p64(b, off), old, new)
}

// CompareSwap64 performs an RDMA-style compare-and-swap: if the word equals
// cmp it is replaced by swap; either way the prior value is returned.
func CompareSwap64(b []byte, off int, cmp, swap uint64) uint64 {
	p := p64(b, off)
	for {
		old := atomic.LoadUint64(p)
		if old != cmp {
			return old
		}
		if atomic.CompareAndSwapUint64(p, old, swap) {
			return old
		}
	}
}

// FetchAdd64 atomically adds d and returns the prior value.
func FetchAdd64(b []byte, off int, d uint64) uint64 {
	return atomic.AddUint64(p64(b, off), d) - d
}

// Addr returns the address of the first byte of b (0 for an empty slice).
func Addr(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
