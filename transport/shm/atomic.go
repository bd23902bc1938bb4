package shm

import "github.com/rdmakit/rdmakit/internal/sys"

func compareSwap(word []byte, cmp, swap uint64) uint64 { return sys.CompareSwap64(word, 0, cmp, swap) }

func fetchAdd(word []byte, add uint64) uint64 { return sys.FetchAdd64(word, 0, add) }
