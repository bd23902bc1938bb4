package coll

import (
	"context"
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
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

// TestAckAfterLeave: the acknowledgement that completes a write may come
// after the peer's bye (it travels on the data connection, the bye on
// the bootstrap's, and a tcp peer's poll may leave it for its reader).
// A rank waiting for its write's completion keeps waiting when the peer
// has left: it must not fail with "closed the communicator". Rank 0 sends
// a message large enough to be written from the caller's buffer, which the
// Send waits to complete; it is held at the start of that wait until rank
// 1 has received it and left, and its completion queue then looks empty
// up to and including the look that follows the first departure check.
func TestAckAfterLeave(t *testing.T) {
	var held, checked, hide atomic.Bool
	holdAckWait(t, func() { held.Store(true); hide.Store(true) })
	testHookCheckWait = func(c *Comm, peer int) {
		if c.rank == 0 && hide.Load() {
			checked.Store(true)
		}
	}
	testHookPoll = func(c *Comm) bool {
		if c.rank != 0 || !hide.Load() {
			return false
		}
		if checked.Load() {
			hide.Store(false) // the look after the check is the last hidden
		}
		return true
	}
	defer func() { testHookAckWait, testHookCheckWait, testHookPoll = nil, nil, nil }()
	const n = 4 * stageMax
	noErrors(t, runRanks(t, 2, Options{Transport: "tcp", Timeout: 30 * time.Second}, func(c *Comm) error {
		buf := make([]byte, n)
		if c.rank == 0 {
			for i := range buf {
				buf[i] = byte(i * 7)
			}
			return c.Send(context.Background(), buf, Int8, 1)
		}
		if err := c.Recv(context.Background(), buf, Int8, 0); err != nil {
			return err
		}
		for i := range buf {
			if buf[i] != byte(i*7) {
				t.Errorf("byte %d is %d, want %d", i, buf[i], byte(i*7))
				break
			}
		}
		return nil
	}))
	if !held.Load() || !checked.Load() {
		t.Fatalf("rank 0 was not held in its wait for the write's completion (held %v, checked %v)", held.Load(), checked.Load())
	}
}

// TestNoAckAfterLeave: completions that never come once the peer has left
// (its transport stopped first) do not hold the waiting rank for the whole
// timeout: it fails with ErrPeerLost ackAfterBye after it saw the bye.
// Rank 0's completion queue looks empty from the peer's departure on.
func TestNoAckAfterLeave(t *testing.T) {
	var hide atomic.Bool
	old := ackAfterBye
	ackAfterBye = 100 * time.Millisecond
	holdAckWait(t, func() { hide.Store(true) })
	testHookPoll = func(c *Comm) bool { return c.rank == 0 && hide.Load() }
	defer func() { testHookAckWait, testHookPoll, ackAfterBye = nil, nil, old }()
	var took time.Duration
	errs := runRanks(t, 2, Options{Transport: "tcp", Timeout: time.Minute}, func(c *Comm) error {
		buf := make([]byte, 4*stageMax)
		if c.rank == 1 {
			return c.Recv(context.Background(), buf, Int8, 0)
		}
		start := time.Now()
		err := c.Send(context.Background(), buf, Int8, 1)
		took = time.Since(start)
		return err
	})
	if errs[1] != nil {
		t.Errorf("rank 1: %v", errs[1])
	}
	if !hide.Load() {
		t.Fatal("rank 0 was not held in its wait for the write's completion")
	}
	if !errors.Is(errs[0], ErrPeerLost) {
		t.Fatalf("rank 0: %v after %v; want ErrPeerLost", errs[0], took)
	}
	t.Logf("rank 0: %v after %v", errs[0], took.Round(time.Millisecond))
}

// holdAckWait sets testHookAckWait to hold rank 0 at the start of its first
// wait for the completions of writes to rank 1 until rank 1 has left, and
// then to call then.
func holdAckWait(t *testing.T, then func()) {
	var once sync.Once
	testHookAckWait = func(c *Comm, peer int) {
		if c.rank != 0 || peer != 1 {
			return
		}
		once.Do(func() {
			for end := time.Now().Add(10 * time.Second); !c.gone[1].Load(); {
				if time.Now().After(end) {
					t.Errorf("rank 1 did not leave")
					return
				}
				time.Sleep(time.Millisecond)
			}
			then()
		})
	}
}
