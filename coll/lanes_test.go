package coll

import (
	"context"
	"fmt"
	"testing"
	"time"
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

// TestLaneCredits sends many times a lane's depth of messages one way to a
// rank that starts receiving late, so that the sender runs out of credits
// and waits for the receiver's count (one word per lane, which jumps by
// half a ring at a time) again and again: every message must arrive
// intact, none overwritten by a sender running ahead of its credits.
func TestLaneCredits(t *testing.T) {
	sizes := []int{8, llMax, llMax + 1, 1024}
	const rounds = 3
	noErrors(t, runRanks(t, 2, Options{Transport: "shm", Channels: 1, Timeout: 20 * time.Second}, func(c *Comm) error {
		ctx := context.Background()
		buf, err := c.Alloc(1024)
		if err != nil {
			return err
		}
		for si, n := range sizes {
			count := rounds*llSlots + 5
			for i := 0; i < count; i++ {
				if c.Rank() == 0 {
					for j := range buf[:n] {
						buf[j] = byte(si*31 + i*7 + j)
					}
					if err := c.Send(ctx, buf[:n], Uint8, 1); err != nil {
						return err
					}
					continue
				}
				if i%llSlots == 0 {
					time.Sleep(5 * time.Millisecond) // the sender runs out of credits
				}
				clear(buf)
				if err := c.Recv(ctx, buf[:n], Uint8, 0); err != nil {
					return err
				}
				for j := range buf[:n] {
					if want := byte(si*31 + i*7 + j); buf[j] != want {
						return fmt.Errorf("%d-byte message %d: byte %d is %d, want %d", n, i, j, buf[j], want)
					}
				}
			}
		}
		return nil
	}))
}
