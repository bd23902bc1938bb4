package shm_test

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/perftest"
)

// BenchmarkVerbs runs rdmakit perf's loops in one process: latency (usec,
// perftest's definitions) and bandwidth (MB/s) of write, read and send at
// 8 B, 4 KiB, 64 KiB, 1 MiB.
func BenchmarkVerbs(b *testing.B) { perftest.Bench(b, "shm0") }
