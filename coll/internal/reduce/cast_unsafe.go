package reduce

import "unsafe"

// The one place in coll that reinterprets memory: byte buffers as typed
// element slices. Callers have checked alignment (aligned), so the
// conversions are valid for checkptr too.

func aligned(b []byte, t Type) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))&uintptr(sizes[t]-1) == 0
}

// as views b as a slice of T; b must be aligned for T.
func as[T any](b []byte) []T {
	var z T
	n := len(b) / int(unsafe.Sizeof(z))
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

func bytesOf(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}

// View returns b as a slice of T (len(b)/sizeof(T) elements) sharing its
// memory, or nil when b is not aligned for T.
func View[T any](b []byte) []T {
	var z T
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%unsafe.Alignof(z) != 0 {
		return nil
	}
	return as[T](b)
}

// Bytes returns the memory of s as bytes.
func Bytes[T any](s []T) []byte {
	var z T
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}
