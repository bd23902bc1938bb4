package coll

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkAllReduce runs float32 sum all-reduces between two goroutine
// ranks (separate contexts, as separate processes would have). Throughput
// is the buffer size per call (algbw; busbw = algbw with 2 ranks).
func BenchmarkAllReduce(b *testing.B) {
	for _, tr := range []string{"shm", "tcp"} {
		for _, size := range []int{8, 4 << 10, 64 << 10, 1 << 20, 16 << 20} {
			b.Run(fmt.Sprintf("%s/%d", tr, size), func(b *testing.B) {
				benchColl(b, tr, size, func(ctx context.Context, c *Comm, buf []byte) error {
					return c.AllReduce(ctx, buf, buf, Float32, Sum)
				})
			})
		}
	}
}

func BenchmarkAllGather(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("shm/%d", size), func(b *testing.B) {
			benchColl(b, "shm", size, func(ctx context.Context, c *Comm, buf []byte) error {
				h := len(buf) / 2
				return c.AllGather(ctx, buf[c.Rank()*h:][:h], buf, Float32)
			})
		})
	}
}

func BenchmarkReduceScatter(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("shm/%d", size), func(b *testing.B) {
			benchColl(b, "shm", size, func(ctx context.Context, c *Comm, buf []byte) error {
				h := len(buf) / 2
				return c.ReduceScatter(ctx, buf, buf[c.Rank()*h:][:h], Float32, Sum)
			})
		})
	}
}

func benchColl(b *testing.B, tr string, size int, f func(context.Context, *Comm, []byte) error) {
	b.SetBytes(int64(size))
	b.ReportAllocs()
	noErrors(b, runRanks(b, 2, Options{Transport: tr}, func(c *Comm) error {
		ctx := context.Background()
		buf, err := c.Alloc(size)
		if err != nil {
			return err
		}
		for i := 0; i < 3; i++ {
			if err := f(ctx, c, buf); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 0 {
			b.ResetTimer()
		}
		for i := 0; i < b.N; i++ {
			if err := f(ctx, c, buf); err != nil {
				return err
			}
		}
		if c.Rank() == 0 {
			b.StopTimer()
		}
		return nil
	}))
}
