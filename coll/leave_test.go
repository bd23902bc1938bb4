package coll

import (
	"context"
	"encoding/binary"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestLeaveAfterLastMessage: a rank that has all it needs closes the
// communicator at once, and its bye may be seen by a peer that has not
// yet looked at the rank's last message (it was preempted between its
// last look and the check for departures). The peer must still finish
// with that message, not fail with "closed the communicator". Rank 1
// is held in its first departure check until rank 0 has finished the
// collective and left.
func TestLeaveAfterLastMessage(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		for _, count := range []int{1, 4096} {
			t.Run(tr+"/"+strconv.Itoa(count), func(t *testing.T) {
				var once sync.Once
				inWait := make(chan struct{})
				testHookCheckWait = func(c *Comm, peer int) {
					if c.rank != 1 || peer != 0 {
						return
					}
					once.Do(func() {
						close(inWait)
						for end := time.Now().Add(10 * time.Second); !c.gone[0].Load(); {
							if time.Now().After(end) {
								t.Errorf("rank 0 did not leave")
								return
							}
							time.Sleep(time.Millisecond)
						}
					})
				}
				defer func() { testHookCheckWait = nil }()
				noErrors(t, runRanks(t, 2, Options{Transport: tr, Timeout: 30 * time.Second}, func(c *Comm) error {
					if c.rank == 0 {
						select {
						case <-inWait:
						case <-time.After(10 * time.Second):
							t.Errorf("rank 1 never waited")
						}
					}
					in, out := make([]byte, 8*count), make([]byte, 8*count)
					for i := 0; i < count; i++ {
						binary.LittleEndian.PutUint64(in[8*i:], uint64(c.rank+1))
					}
					if err := c.AllReduce(context.Background(), in, out, Int64, Sum); err != nil {
						return err
					}
					for i := 0; i < count; i++ {
						if v := binary.LittleEndian.Uint64(out[8*i:]); v != 3 {
							t.Errorf("rank %d: element %d is %d, want 3", c.rank, i, v)
							break
						}
					}
					return nil
				}))
			})
		}
	}
}
