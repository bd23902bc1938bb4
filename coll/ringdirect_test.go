package coll

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// TestRingDirectNet runs the ring AllReduce over tcp with every size on
// the direct path (final values written straight into the next rank's
// output, ringDirectNet lowered to one byte; the ring AllGather and the
// broadcast chain, which stay on the FIFO, in between) at 2 and 3
// goroutine ranks: registered and plain Go buffers (the output bounce
// buffer then takes the writes), in and out of place, one chunk and
// several, sizes the rank count does not divide. With Slots 4 the 2-rank
// ring takes one piece per step (ringARPieces), and several rounds.
func TestRingDirectNet(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			var calls atomic.Int64
			old := ringDirectNet
			ringDirectNet = 1
			testHookRingDirect = func(*Comm) { calls.Add(1) }
			t.Cleanup(func() { ringDirectNet, testHookRingDirect = old, nil })
			sc := scenario{kinds: []string{"allreduce", "allgather", "broadcast"},
				types: []DataType{Int8, Float32, Float64}, ops: []RedOp{Sum, Avg},
				counts: []int{1, 7, 3001}, algos: []Algorithm{AlgoRing}, roots: []int{0, 1}}
			noErrors(t, runRanks(t, n, Options{Transport: "tcp", ChunkSize: 4096, Slots: 4}, func(c *Comm) error {
				return exercise(context.Background(), c, sc)
			}))
			if calls.Load() == 0 {
				t.Fatal("no collective took the direct path")
			}
		})
	}
}
