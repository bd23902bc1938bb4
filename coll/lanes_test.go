package coll

import (
	"context"
	"fmt"
	"testing"
)

// TestLanes sends several times llSlots messages of every lane's sizes
// (LL, small-message, chunk slots), mixed, through few chunk slots, so
// that every ring of a channel wraps many times while the others move on:
// every byte must arrive, and no lane may take another's message for a
// mismatch. With ProtoSimple the small-message ring takes the LL sizes.
func TestLanes(t *testing.T) {
	const chunk = 3 * midMax
	for _, tc := range []struct {
		tr    string
		proto Protocol
	}{{"shm", ProtoAuto}, {"shm", ProtoSimple}, {"tcp", ProtoAuto}} {
		t.Run(fmt.Sprintf("%s/%v", tc.tr, tc.proto), func(t *testing.T) {
			noErrors(t, runRanks(t, 2, Options{Transport: tc.tr, Protocol: tc.proto, ChunkSize: chunk, Slots: 4, Channels: 1}, func(c *Comm) error {
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
					x = x*1664525 + 1013904223
					var n int
					switch r := x >> 28; {
					case r < 9: // LL
						n = int(x>>8) % (llMax + 1)
					case r < 14: // small-message ring
						n = llMax + 1 + int(x>>4)%(midMax-llMax)
					default: // chunk slots
						n = midMax + 1 + int(x>>4)%(chunk-midMax)
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
