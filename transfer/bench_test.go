package transfer

import (
	"context"
	"testing"
)

// BenchmarkSmallRead times one 8-byte Read batch (Submit and Wait) from
// one node to another in this process: the engine's fixed cost per batch,
// which a small transfer is all of.
//
//	go test -run x -bench SmallRead ./transfer/
func BenchmarkSmallRead(b *testing.B) {
	for _, dev := range []string{"shm0", "tcp0"} {
		b.Run(dev, func(b *testing.B) {
			ctx := context.Background()
			nodes := cluster(b, dev, 2)
			if _, err := nodes[1].AllocSegment(ctx, "seg", 1<<20); err != nil {
				b.Fatal(err)
			}
			mr, err := nodes[0].AllocMR(4096)
			if err != nil {
				b.Fatal(err)
			}
			reqs := []Request{{Op: Read, Local: mr, Segment: "seg", Length: 8}}
			run := func() {
				bt, err := nodes[0].Submit(ctx, reqs)
				if err == nil {
					err = bt.Wait(ctx)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			run() // connect
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				run()
			}
		})
	}
}
