package coll

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStalledRank: a rank that never calls the collective makes the
// others time out within Options.Timeout, and the communicator is then
// aborted everywhere. The tree algorithm is forced: in it rank 1 waits
// for rank 0, which waits for the stalled rank; with the direct exchange
// rank 1 waits for the stalled rank itself and may still complete, with
// every contribution, once rank 2 comes late.
func TestStalledRank(t *testing.T) {
	const timeout = 500 * time.Millisecond
	start := time.Now()
	var stalled sync.WaitGroup
	stalled.Add(1)
	errs := runRanks(t, 3, Options{Timeout: timeout, Algorithm: AlgoTree}, func(c *Comm) error {
		buf, _ := c.Alloc(1024)
		if c.Rank() == 2 {
			stalled.Wait() // until the others gave up
			return c.AllReduce(context.Background(), buf, buf, Float32, Sum)
		}
		err := c.AllReduce(context.Background(), buf, buf, Float32, Sum)
		if c.Rank() == 0 {
			stalled.Done()
		}
		return err
	})
	if d := time.Since(start); d > 10*timeout+5*time.Second {
		t.Errorf("took %v", d)
	}
	for r, err := range errs {
		if err == nil && r == 2 {
			// The late rank may still find everything it needs already
			// written into its memory before the others gave up.
			continue
		}
		if err == nil {
			t.Errorf("rank %d: no error", r)
			continue
		}
		if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrAborted) && !errors.Is(err, ErrPeerLost) {
			t.Errorf("rank %d: %v, want ErrTimeout, ErrAborted or ErrPeerLost", r, err)
		}
	}
	if !errors.Is(errs[0], ErrTimeout) && !errors.Is(errs[1], ErrTimeout) {
		t.Errorf("no rank reported the timeout: %v", errs)
	}
}

// TestAbort: Abort on one rank fails the others' pending collective.
func TestAbort(t *testing.T) {
	errs := runRanks(t, 3, Options{Timeout: time.Minute}, func(c *Comm) error {
		buf, _ := c.Alloc(1 << 20)
		if c.Rank() == 1 {
			time.Sleep(100 * time.Millisecond)
			c.Abort("test")
			return nil
		}
		start := time.Now()
		err := c.AllReduce(context.Background(), buf, buf, Float32, Sum)
		if time.Since(start) > 20*time.Second {
			t.Errorf("rank %d: abort took %v", c.Rank(), time.Since(start))
		}
		if !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: %v, want ErrAborted", c.Rank(), err)
		}
		if err2 := c.Barrier(context.Background()); !errors.Is(err2, ErrAborted) {
			t.Errorf("rank %d: after abort, Barrier: %v", c.Rank(), err2)
		}
		return nil
	})
	noErrors(t, errs)
}

// TestMismatch: different counts on different ranks are reported as
// ErrMismatch, and no rank hangs.
func TestMismatch(t *testing.T) {
	if mismatch := countMismatch(t, Options{Timeout: 5 * time.Second, Algorithm: AlgoRing}, [2]int{1000, 1500}); mismatch == 0 {
		t.Error("nobody reported ErrMismatch")
	}
	// Sizes of different lanes (proto.go): LL against the small-message
	// ring, and that against the chunk slots.
	for _, sizes := range [][2]int{{16, 1000}, {1000, 5000}} {
		testLaneMismatch(t, sizes)
	}
	// Different collectives entirely.
	errs := runRanks(t, 2, Options{Timeout: 5 * time.Second}, func(c *Comm) error {
		buf, _ := c.Alloc(64)
		var err error
		if c.Rank() == 0 {
			err = c.Broadcast(context.Background(), buf, buf, Int8, 1)
		} else {
			err = c.AllReduce(context.Background(), buf, buf, Int8, Sum)
		}
		if err == nil {
			t.Errorf("rank %d: no error", c.Rank())
		}
		return nil
	})
	noErrors(t, errs)
}

// TestMissingRank: a rank that never joins is named in the error.
func TestMissingRank(t *testing.T) {
	id, err := GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := NewComm(context.Background(), id, 3, r, &Options{BootstrapTimeout: 300 * time.Millisecond})
			if err == nil {
				c.Close()
			}
			errs[r] = err
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrBootstrap) || !strings.Contains(err.Error(), "[2]") {
			t.Errorf("rank %d: %v, want ErrBootstrap naming rank [2]", r, err)
		}
	}
	// Nobody at all: the root is unreachable.
	id2 := makeID("127.0.0.1:1", 1)
	_, err = NewComm(context.Background(), id2, 2, 0, &Options{BootstrapTimeout: 200 * time.Millisecond})
	if !errors.Is(err, ErrBootstrap) {
		t.Errorf("unreachable root: %v", err)
	}
}

// TestContextDeadline: the context bounds a collective too.
func TestContextDeadline(t *testing.T) {
	done := make(chan struct{})
	errs := runRanks(t, 2, Options{Timeout: time.Minute}, func(c *Comm) error {
		if c.Rank() == 1 {
			<-done // never joins the all-reduce, stays until rank 0 gave up
			return nil
		}
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		buf := make([]byte, 8)
		err := c.AllReduce(ctx, buf, buf, Int64, Sum)
		if !errors.Is(err, ErrTimeout) {
			t.Errorf("got %v, want ErrTimeout", err)
		}
		return nil
	})
	noErrors(t, errs)
}

func TestArguments(t *testing.T) {
	errs := runRanks(t, 2, Options{}, func(c *Comm) error {
		ctx := context.Background()
		b := make([]byte, 12)
		for _, err := range []error{
			c.AllReduce(ctx, b, b[:8], Int32, Sum),
			c.AllReduce(ctx, b[:8], b[4:], Int32, Sum), // overlapping, not in place
			c.AllReduce(ctx, b[4:], b[:8], Int32, Sum),
			c.AllReduce(ctx, b, b, Float64, Sum),
			c.AllReduce(ctx, b, b, DataType(99), Sum),
			c.AllReduce(ctx, b, b, Int32, RedOp(9)),
			c.AllGather(ctx, b, b, Int32),
			c.Broadcast(ctx, b, b, Int32, 2),
			c.Send(ctx, b, Int32, c.Rank()),
			c.AllToAll(ctx, b, b, Int32),
		} {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("rank %d: %v, want ErrInvalidArgument", c.Rank(), err)
			}
		}
		// Still usable.
		return c.AllReduce(ctx, b, b, Int32, Sum)
	})
	noErrors(t, errs)
}

func TestClosed(t *testing.T) {
	var comms [2]*Comm
	noErrors(t, runRanks(t, 2, Options{}, func(c *Comm) error {
		comms[c.Rank()] = c
		return nil
	}))
	b := make([]byte, 8)
	if err := comms[0].AllReduce(context.Background(), b, b, Int8, Sum); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
	if _, err := comms[0].Alloc(8); !errors.Is(err, ErrClosed) {
		t.Errorf("Alloc after Close: %v", err)
	}
}

func TestSingleRank(t *testing.T) {
	c, err := InitLaunch(context.Background(), Launch{NRanks: 1, Addr: "127.0.0.1:0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc := scenario{kinds: []string{"allreduce", "reducescatter", "allgather", "broadcast", "reduce", "alltoall", "barrier"},
		types: []DataType{Int32, Float16}, ops: []RedOp{Sum, Avg}, counts: []int{1, 33}, roots: []int{0}}
	if err := exercise(context.Background(), c, sc); err != nil {
		t.Fatal(err)
	}
}

// TestNoAllocs: collectives on registered memory allocate nothing in the
// steady state.
func TestNoAllocs(t *testing.T) {
	const measures = 3
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			var start, stop sync.WaitGroup
			start.Add(1)
			stop.Add(1)
			noErrors(t, runRanks(t, 2, Options{Transport: tr}, func(c *Comm) error {
				ctx := context.Background()
				small, _ := c.Alloc(64)
				big, _ := c.Alloc(1 << 20)
				in, _ := c.Alloc(1 << 20)
				run := func() error {
					for _, err := range [...]error{
						c.AllReduce(ctx, small, small, Float32, Sum),
						c.AllReduce(ctx, big, big, Float32, Sum),
						c.ReduceScatter(ctx, big, big[c.Rank()*len(big)/2:][:len(big)/2], Float32, Sum),
						c.Broadcast(ctx, big, big, Float32, 0),
						direct(c, func() error { return c.AllReduce(ctx, small, small, Float32, Sum) }),
						direct(c, func() error { return c.AllGather(ctx, small[:32], small, Float32) }),
						direct(c, func() error { return c.ReduceScatter(ctx, small, small[:32], Float32, Sum) }),
						halving(c, func() error { return c.AllReduce(ctx, big, big, Float32, Sum) }),
						halving(c, func() error { return c.AllReduce(ctx, in, big, Float32, Sum) }),
						halving(c, func() error { return c.AllGather(ctx, big[c.Rank()*len(big)/2:][:len(big)/2], big, Float32) }),
						halving(c, func() error { return c.ReduceScatter(ctx, big, big[c.Rank()*len(big)/2:][:len(big)/2], Float32, Sum) }),
						c.Barrier(ctx),
					} {
						if err != nil {
							return err
						}
					}
					return nil
				}
				for i := 0; i < 3; i++ { // warm up: staging, transports
					if err := run(); err != nil {
						return err
					}
				}
				if c.Rank() == 1 {
					// The peer runs the same calls meanwhile; both count.
					start.Wait()
					for i := 0; i < measures*11; i++ {
						if err := run(); err != nil {
							return err
						}
					}
					stop.Done()
					return nil
				}
				var ferr error
				start.Done()
				// The least of a few measures: an allocation of coll's is
				// in every one, while the runtime's now and then (a
				// channel receive's sudog when the per-P caches, cleared
				// at each GC, run dry: the tcp readers park on channels)
				// is not.
				allocs := math.Inf(1)
				for range measures {
					allocs = min(allocs, testing.AllocsPerRun(10, func() {
						if err := run(); err != nil {
							ferr = err
						}
					}))
				}
				stop.Wait()
				// coll allocates nothing; the tcp transport's goroutines
				// (netpoll wake-ups) allocate now and then.
				if limit := map[string]float64{"shm": 0, "tcp": 3}[tr]; allocs > limit {
					t.Errorf("%v allocations per round of 12 collectives", allocs)
				} else {
					t.Logf("%v allocations per round of 12 collectives (all goroutines)", allocs)
				}
				return ferr
			}))
		})
	}
}

// halving runs f with the halving algorithms forced.
func halving(c *Comm, f func() error) error {
	c.opts.Algorithm = AlgoHalving
	defer func() { c.opts.Algorithm = AlgoAuto }()
	return f()
}

// direct runs f with the direct algorithms forced.
func direct(c *Comm, f func() error) error {
	c.opts.Algorithm = AlgoDirect
	defer func() { c.opts.Algorithm = AlgoAuto }()
	return f()
}

// testLaneMismatch: an AllReduce of sizes[0] float32 on rank 0 and of
// sizes[1] on rank 1 fails with ErrMismatch, quickly.
func testLaneMismatch(t *testing.T, sizes [2]int) {
	t.Helper()
	start := time.Now()
	mismatch := countMismatch(t, Options{Timeout: 20 * time.Second, Transport: "shm"}, sizes)
	if mismatch == 0 || time.Since(start) > 10*time.Second {
		t.Errorf("sizes %v: %d ErrMismatch, after %v", sizes, mismatch, time.Since(start))
	}
}

// countMismatch runs an AllReduce of sizes[r] float32 on rank r of two,
// each expected to fail, and returns how many ranks failed with
// ErrMismatch.
func countMismatch(t *testing.T, opts Options, sizes [2]int) int {
	t.Helper()
	var mu sync.Mutex
	mismatch := 0
	errs := runRanks(t, 2, opts, func(c *Comm) error {
		buf, _ := c.Alloc(4 * sizes[c.Rank()])
		err := c.AllReduce(context.Background(), buf, buf, Float32, Sum)
		if errors.Is(err, ErrMismatch) {
			mu.Lock()
			mismatch++
			mu.Unlock()
		}
		if err == nil {
			t.Errorf("rank %d: no error", c.Rank())
		}
		return nil
	})
	noErrors(t, errs)
	return mismatch
}
