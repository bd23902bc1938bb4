package perftest

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// localPair opens two endpoints on shm0 in this process and connects them
// to each other, without the exchange.
func localPair(t *testing.T, args ...string) (a, b *endpoint) {
	t.Helper()
	o, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := findDevice("shm0")
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.resolve(dev)
	if err != nil {
		t.Fatal(err)
	}
	if a, err = openEndpoint(c, dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.close)
	if b, err = openEndpoint(c, dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	if err := a.connect([]qpInfo{b.local(0)}, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.connect([]qpInfo{a.local(0)}, nil); err != nil {
		t.Fatal(err)
	}
	return a, b
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// The timed loops allocate nothing per operation (starting a goroutine
// and the transports' background goroutines allocate a little).
func TestLoopsDoNotAllocate(t *testing.T) {
	const n = 20000
	for _, name := range []string{"write_bw", "send_bw", "atomic_bw"} {
		t.Run(name, func(t *testing.T) {
			a, b := localPair(t, name, "-s", "8", "-n", "20000", "-d", "shm0")
			w := newWatch(context.Background(), nil)
			tx := newBWLoop(a, w, 8, true, false)
			var rx *bwLoop
			if name == "send_bw" {
				rx = newBWLoop(b, newWatch(context.Background(), nil), 8, false, true)
				if err := rx.postRecvs(); err != nil {
					t.Fatal(err)
				}
			}
			done := make(chan error, 1)
			before := mallocs()
			if rx != nil {
				go func() { _, err := rx.run(); done <- err }()
			}
			st, err := tx.run()
			if err != nil {
				t.Fatal(err)
			}
			if rx != nil {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			got := int64(mallocs() - before)
			if st.n != n || got > n/200 {
				t.Errorf("%d operations, %d allocations", st.n, got)
			}
		})
	}
	for _, name := range []string{"write_lat", "send_lat", "read_lat"} {
		t.Run(name, func(t *testing.T) {
			a, b := localPair(t, name, "-s", "8", "-n", "20000", "-d", "shm0")
			ping := newLatLoop(a, newWatch(context.Background(), nil), 8, true)
			pong := newLatLoop(b, newWatch(context.Background(), nil), 8, false)
			if err := ping.postRecvs(); err != nil {
				t.Fatal(err)
			}
			if err := pong.postRecvs(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			before := mallocs()
			go func() { _, err := pong.run(); done <- err }()
			st, err := ping.run()
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			got := int64(mallocs() - before)
			if len(st.tposted) != n || st.tposted[n-1] == 0 || got > n/200 {
				t.Errorf("%d iterations, %d allocations", len(st.tposted), got)
			}
		})
	}
}

// TestLatTicks: with watch.ticks (ibverbs) the latency loop stamps its
// posts with the TSC and hands back ns since its start, as with the clock:
// in order, within the run.
func TestLatTicks(t *testing.T) {
	const n = 2000
	a, b := localPair(t, "write_lat", "-s", "8", "-n", "2000", "-d", "shm0")
	w := newWatch(context.Background(), nil)
	w.ticks = true
	ping := newLatLoop(a, w, 8, true)
	pong := newLatLoop(b, newWatch(context.Background(), nil), 8, false)
	done := make(chan error, 1)
	go func() { _, err := pong.run(); done <- err }()
	start := time.Now()
	st, err := ping.run()
	elapsed := int64(time.Since(start))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(st.tposted) != n {
		t.Fatalf("%d post times, want %d", len(st.tposted), n)
	}
	for i, v := range st.tposted {
		if v < 0 || v > elapsed || (i > 0 && v < st.tposted[i-1]) {
			t.Fatalf("post %d at %d ns (previous %d, run %d ns): not ns since the start, in order", i, v, st.tposted[max(i-1, 0)], elapsed)
		}
	}
}

// TestTuneIbverbs: on a cgo device the spinner yields rarely, times with
// the TSC and keeps a second P; on the others nothing of that.
func TestTuneIbverbs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w := newWatch(context.Background(), nil)
	w.tune(verbs.DeviceInfo{Name: "shm0", Transport: "shm"})
	if w.ticks || w.schedEvery != gosEvery || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("shm: ticks %v, Gosched every %d, GOMAXPROCS %d", w.ticks, w.schedEvery, runtime.GOMAXPROCS(0))
	}
	w.tune(verbs.DeviceInfo{Name: "rxe0", Transport: "ibverbs"})
	if !w.ticks || w.schedEvery != spinCgo || w.yieldEvery != spinCgo || runtime.GOMAXPROCS(0) != minProcsCgo {
		t.Fatalf("ibverbs: ticks %v, Gosched every %d, yield every %d, GOMAXPROCS %d", w.ticks, w.schedEvery, w.yieldEvery, runtime.GOMAXPROCS(0))
	}
}
