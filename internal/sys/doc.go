// Package sys is rdmakit's one gateway to raw system calls and unsafe memory
// access: anonymous and memfd-backed mappings, hole punching, futexes, and
// atomic operations on words that live inside byte slices (which may be
// shared with other processes through a MAP_SHARED mapping).
//
// Every other package reaches the kernel or unsafe.Pointer through here, so
// the audit surface for memory safety is the files named *_unsafe.go in this
// directory.
package sys
