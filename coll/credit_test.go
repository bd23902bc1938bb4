package coll

import (
	"context"
	"fmt"
	"testing"
)

// TestCreditsRideAlong: over tcp the credits a rank owes its peer go out
// with its next message to that peer (no write of their own) in a
// 2-rank AllReduce, and where a rank only receives it pays them when it
// waits: a one-way stream through two slots, which stalls (and times
// out) if a waiting rank keeps them.
func TestCreditsRideAlong(t *testing.T) {
	const calls = 200
	opts := Options{Transport: "tcp", Slots: 4, Channels: 1, ChunkSize: 4096}
	paid := make([]uint64, 2)
	noErrors(t, runRanks(t, 2, opts, func(c *Comm) error {
		ctx := context.Background()
		send, err := c.Alloc(8)
		if err != nil {
			return err
		}
		recv, err := c.Alloc(8)
		if err != nil {
			return err
		}
		for i := 0; i < calls; i++ {
			fill(Int64, Sum, send, c.Rank(), i)
			if err := c.AllReduce(ctx, send, recv, Int64, Sum); err != nil {
				return err
			}
			if err := diff(fmt.Sprintf("call %d", i), Int64, recv, expect(Int64, Sum, 2, i, 1)); err != nil {
				return err
			}
		}
		paid[c.Rank()] = c.paidAlone
		return nil
	}))
	for r, n := range paid {
		if n != 0 {
			t.Errorf("rank %d wrote credits alone %d times in %d AllReduces (want 0: with its next message)", r, n, calls)
		}
	}

	// One way: rank 0 sends, rank 1 receives and never writes to rank 0
	// but for credits.
	const n = 3 * 4096 // three chunks a message
	var recvPaid uint64
	noErrors(t, runRanks(t, 2, opts, func(c *Comm) error {
		ctx := context.Background()
		buf, err := c.Alloc(n)
		if err != nil {
			return err
		}
		for i := 0; i < 50; i++ {
			if c.Rank() == 0 {
				for j := range buf {
					buf[j] = byte(i + j)
				}
				if err := c.Send(ctx, buf, Uint8, 1); err != nil {
					return err
				}
				continue
			}
			if err := c.Recv(ctx, buf, Uint8, 0); err != nil {
				return err
			}
			for j := range buf {
				if buf[j] != byte(i+j) {
					return fmt.Errorf("message %d byte %d: %d, want %d", i, j, buf[j], byte(i+j))
				}
			}
		}
		if c.Rank() == 1 {
			recvPaid = c.paidAlone
		}
		return nil
	}))
	if recvPaid == 0 {
		t.Errorf("the receiving rank never paid credits alone; the stream cannot have needed them")
	}
}
