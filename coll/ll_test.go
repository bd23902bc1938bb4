package coll

import (
	"context"
	"fmt"
	"testing"
)

// TestLLRing sends several times llSlots small messages mixed with larger
// ones, through few chunk slots, so that both rings of a channel (the LL
// ring with its own counter and credits, and the chunk slots) wrap many
// times while the other stream moves on: every byte must arrive, and
// neither stream may take the other's message for a mismatch.
func TestLLRing(t *testing.T) {
	const chunk = 4096
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
				x := uint32(12345)
				for i := 0; i < 5*llSlots; i++ {
					// Mostly LL sizes, runs of them longer than the chunk
					// ring, now and then a chunk-slot message.
					x = x*1664525 + 1013904223
					n := int(x>>8) % (llMax + 1)
					if x>>28 == 0 {
						n = llMax + 1 + int(x>>4)%(chunk-llMax)
					}
					for j := range send[:n] {
						send[j] = byte(c.Rank()*101 + i*7 + j)
					}
					clear(recv)
					if err := c.SendRecv(ctx, send[:n], peer, recv[:n], peer, Uint8); err != nil {
						return err
					}
					for j := range recv[:n] {
						if want := byte(peer*101 + i*7 + j); recv[j] != want {
							return fmt.Errorf("message %d (%d bytes): byte %d is %d, want %d", i, n, j, recv[j], want)
						}
					}
				}
				return nil
			}))
		})
	}
}
