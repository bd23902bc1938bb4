//go:build unix

package transfer

// Mapping files for file segments (unix: mmap, MAP_SHARED).

import (
	"os"
	"syscall"
)

const canMap = true

func mapFile(f *os.File, size int, writable bool) ([]byte, error) {
	prot := syscall.PROT_READ
	if writable {
		prot |= syscall.PROT_WRITE
	}
	return syscall.Mmap(int(f.Fd()), 0, size, prot, syscall.MAP_SHARED)
}

func unmapFile(b []byte) { syscall.Munmap(b) }
