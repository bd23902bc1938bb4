package coll

import (
	"context"
	"fmt"
	"testing"
)

var allKinds = []string{"allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "sendrecv", "sendpair", "barrier"}

// TestInProcess runs the full type × operator matrix on goroutine ranks
// over shm, with small chunks so that pieces, rounds and channels are all
// exercised.
func TestInProcess(t *testing.T) {
	for _, n := range []int{2, 3} {
		for _, tr := range []string{"shm", "tcp"} {
			t.Run(fmt.Sprintf("n%d/%s", n, tr), func(t *testing.T) {
				sc := scenario{kinds: allKinds, types: DataTypes, ops: RedOps, counts: []int{1, 7, 3001},
					algos: []Algorithm{AlgoRing, AlgoTree, AlgoDirect, AlgoHalving}, roots: []int{0, 1}}
				if tr == "tcp" || testing.Short() {
					sc.types = []DataType{Int8, Float16, Float32, Float64}
					sc.ops = []RedOp{Sum, Max, Avg}
				}
				noErrors(t, runRanks(t, n, Options{Transport: tr, ChunkSize: 4096, Slots: 4, Channels: 2}, func(c *Comm) error {
					return exercise(context.Background(), c, sc)
				}))
			})
		}
	}
}

// TestLargeCounts moves counts that take many chunks, rounds and FIFO
// wrap-arounds, on fewer types.
func TestLargeCounts(t *testing.T) {
	counts := []int{20011, 100003}
	if testing.Short() {
		counts = counts[:1]
	}
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			sc := scenario{kinds: allKinds, types: []DataType{Float32, Float16}, ops: []RedOp{Sum, Avg}, counts: counts,
				algos: []Algorithm{AlgoRing, AlgoTree, AlgoDirect, AlgoHalving}, roots: []int{2}}
			chunk := map[string]int{"shm": 4096, "tcp": 16384}[tr]
			noErrors(t, runRanks(t, 3, Options{Transport: tr, ChunkSize: chunk, Slots: 4, Channels: 2}, func(c *Comm) error {
				return exercise(context.Background(), c, sc)
			}))
		})
	}
}

// TestDirectRanks checks the direct algorithms (forced, and as auto picks
// them) at 4 to 8 ranks: odd sizes, several chunks, in and out of place.
func TestDirectRanks(t *testing.T) {
	ns := []int{4, 5, 8}
	if testing.Short() {
		ns = []int{4}
	}
	for _, n := range ns {
		for _, tr := range []string{"shm", "tcp"} {
			if tr == "tcp" && n > 4 {
				continue // the tcp path is the same code; 4 ranks exercise it
			}
			t.Run(fmt.Sprintf("n%d/%s", n, tr), func(t *testing.T) {
				sc := scenario{kinds: []string{"allreduce", "reducescatter", "allgather"},
					types: []DataType{Int8, Float16, Float32, Float64}, ops: []RedOp{Sum, Max, Avg},
					counts: []int{1, 7, 3001}, algos: []Algorithm{AlgoDirect, AlgoAuto}}
				noErrors(t, runRanks(t, n, Options{Transport: tr, ChunkSize: 4096, Slots: 4, Channels: 2}, func(c *Comm) error {
					return exercise(context.Background(), c, sc)
				}))
			})
		}
	}
}

// TestHalvingRanks checks the halving algorithms (forced) at 4 to 8
// ranks, powers of two and not: odd sizes, sizes smaller than the rank
// count, several chunks, in and out of place.
func TestHalvingRanks(t *testing.T) {
	ns := []int{2, 4, 5, 6, 8}
	if testing.Short() {
		ns = []int{2, 4, 5}
	}
	for _, n := range ns {
		for _, tr := range []string{"shm", "tcp"} {
			if tr == "tcp" && n > 5 {
				continue // the same code; 4 and 5 ranks exercise it
			}
			t.Run(fmt.Sprintf("n%d/%s", n, tr), func(t *testing.T) {
				sc := scenario{kinds: []string{"allreduce", "allgather", "reducescatter", "broadcast"},
					types: []DataType{Int8, Float16, Float32, Float64}, ops: []RedOp{Sum, Max, Avg},
					counts: []int{1, 3, 7, 3001, 20011}, algos: []Algorithm{AlgoHalving}, roots: []int{1}}
				noErrors(t, runRanks(t, n, Options{Transport: tr, ChunkSize: 4096, Slots: 4, Channels: 2}, func(c *Comm) error {
					return exercise(context.Background(), c, sc)
				}))
			})
		}
	}
}

// TestProtoSimple runs small collectives on shm with the LL protocol off.
func TestProtoSimple(t *testing.T) {
	sc := scenario{kinds: []string{"allreduce", "allgather", "broadcast"}, types: []DataType{Float32}, ops: []RedOp{Sum},
		counts: []int{1, 7}, algos: []Algorithm{AlgoRing, AlgoTree, AlgoDirect}, roots: []int{0}}
	noErrors(t, runRanks(t, 3, Options{Transport: "shm", Protocol: ProtoSimple}, func(c *Comm) error {
		return exercise(context.Background(), c, sc)
	}))
}

// TestSlotSizes sends messages of changing sizes through the same FIFO
// slots (whole chunks, a byte short of one, around the LL limit, single
// bytes), so that a message finds the leftovers of a longer one in its
// slot: on write-on-post devices a message ends at its slot's tail flag
// (proto.go), elsewhere it starts at the slot. Every byte must arrive.
func TestSlotSizes(t *testing.T) {
	const chunk = 4096
	sizes := []int{chunk, 1, chunk - 1, llMax, llMax + 1, 3, chunk, 8, 2000, llMax - 1, chunk - 8, 0, 5}
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			noErrors(t, runRanks(t, 2, Options{Transport: tr, ChunkSize: chunk, Slots: 4, Channels: 1}, func(c *Comm) error {
				ctx := context.Background()
				peer := 1 - c.Rank()
				send, err := c.Alloc(chunk)
				if err != nil {
					return err
				}
				recv, err := c.Alloc(chunk)
				if err != nil {
					return err
				}
				for round := 0; round < 3; round++ {
					for i, n := range sizes {
						for j := range send[:n] {
							send[j] = byte(c.Rank()*101 + round*31 + i*7 + j)
						}
						clear(recv)
						if err := c.SendRecv(ctx, send[:n], peer, recv[:n], peer, Uint8); err != nil {
							return err
						}
						for j := range recv[:n] {
							if want := byte(peer*101 + round*31 + i*7 + j); recv[j] != want {
								return fmt.Errorf("round %d, message %d (%d bytes): byte %d is %d, want %d", round, i, n, j, recv[j], want)
							}
						}
					}
				}
				return nil
			}))
		})
	}
}
