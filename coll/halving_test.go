package coll

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
)

// withHDDirect lowers hdDirectMin to min for the test and counts the
// halving collectives that write directly into the partners' outputs.
func withHDDirect(t *testing.T, min int) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	old := hdDirectMin
	hdDirectMin = min
	testHookHDDirect = func(*Comm) { n.Add(1) }
	t.Cleanup(func() { hdDirectMin, testHookHDDirect = old, nil })
	return &n
}

// TestHalvingDirect runs the halving AllGather and AllReduce with every
// size on the direct path (doubling steps writing into the partner's
// output) over tcp at 4 and 8 goroutine ranks, and 6 (AllReduce's fold,
// AllGather's ring): registered and plain Go buffers (the output bounce
// buffer then takes the writes), in and out of place, one chunk and
// several, sizes the rank count does not divide.
func TestHalvingDirect(t *testing.T) {
	for _, n := range []int{4, 8, 6} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			calls := withHDDirect(t, 1)
			sc := scenario{kinds: []string{"allgather", "allreduce"},
				types: []DataType{Int8, Float32, Float64}, ops: []RedOp{Sum, Avg},
				counts: []int{1, 7, 3001}, algos: []Algorithm{AlgoHalving}}
			noErrors(t, runRanks(t, n, Options{Transport: "tcp", ChunkSize: 4096, Slots: 4, Channels: 2}, func(c *Comm) error {
				return exercise(context.Background(), c, sc)
			}))
			if calls.Load() == 0 {
				t.Fatal("no collective took the direct path")
			}
		})
	}
}

// TestHalvingDirectPerCall: the output's address is learnt in every
// call, so a buffer used as the output of one call is never written once
// that call has returned, whether freed or still registered and changed
// by the caller; and a freed one fails nothing.
func TestHalvingDirectPerCall(t *testing.T) {
	calls := withHDDirect(t, 1)
	const n, count = 4, 5000 // several 4 KiB chunks per block
	noErrors(t, runRanks(t, n, Options{Transport: "tcp", ChunkSize: 4096, Slots: 4, Channels: 2, Algorithm: AlgoHalving}, func(c *Comm) error {
		ctx := context.Background()
		r := c.Rank()
		send, err := c.Alloc(count)
		if err != nil {
			return err
		}
		for i := range send {
			send[i] = byte(r*31 + i)
		}
		check := func(what string, out []byte, round int) error {
			for j := 0; j < n; j++ {
				for i := 0; i < count; i++ {
					if want := byte(j*31 + i + round); out[j*count+i] != want {
						return fmt.Errorf("%s: rank %d: byte %d of block %d is %d, want %d", what, r, i, j, out[j*count+i], want)
					}
				}
			}
			return nil
		}
		kept, err := c.Alloc(n * count)
		if err != nil {
			return err
		}
		for round := 0; round < 4; round++ {
			// This round's data differs from the last (round added).
			for i := range send {
				send[i] = byte(r*31 + i + round)
			}
			freed, err := c.Alloc(n * count)
			if err != nil {
				return err
			}
			if err := c.AllGather(ctx, send, freed, Uint8); err != nil {
				return err
			}
			if err := check("freed buffer before Free", freed, round); err != nil {
				return err
			}
			if err := c.Free(freed); err != nil {
				return err
			}
			if err := c.AllGather(ctx, send, kept, Uint8); err != nil {
				return err
			}
			if err := check("kept buffer", kept, round); err != nil {
				return err
			}
			// The caller changes kept; the next calls write elsewhere.
			for i := range kept {
				kept[i] = 0xa5
			}
			other, err := c.Alloc(n * count)
			if err != nil {
				return err
			}
			plain := make([]byte, n*count)
			for _, out := range [][]byte{other, plain} {
				if err := c.AllGather(ctx, send, out, Uint8); err != nil {
					return err
				}
				if err := check("next buffer", out, round); err != nil {
					return err
				}
			}
			if err := c.AllReduce(ctx, other, other, Uint8, Sum); err != nil {
				return err
			}
			// Every rank is past its calls: nothing more may land in kept.
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			for i, b := range kept {
				if b != 0xa5 {
					return fmt.Errorf("rank %d: byte %d of an earlier call's output changed to %d after the call", r, i, b)
				}
			}
			if err := c.Free(other); err != nil {
				return err
			}
		}
		return nil
	}))
	if calls.Load() == 0 {
		t.Fatal("no collective took the direct path")
	}
}
