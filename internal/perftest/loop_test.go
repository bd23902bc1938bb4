package perftest

import (
	"context"
	"runtime"
	"testing"

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

// TestTuneIbverbs: on a cgo device the spinner yields rarely and keeps a
// second P; on the others neither.
func TestTuneIbverbs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w := newWatch(context.Background(), nil)
	w.tune(verbs.DeviceInfo{Name: "shm0", Transport: "shm"})
	if w.schedEvery != gosEvery || runtime.GOMAXPROCS(0) != 1 {
		t.Fatalf("shm: Gosched every %d, GOMAXPROCS %d", w.schedEvery, runtime.GOMAXPROCS(0))
	}
	w.tune(verbs.DeviceInfo{Name: "rxe0", Transport: "ibverbs"})
	if w.schedEvery != spinCgo || w.yieldEvery != spinCgo || runtime.GOMAXPROCS(0) != minProcsCgo {
		t.Fatalf("ibverbs: Gosched every %d, yield every %d, GOMAXPROCS %d", w.schedEvery, w.yieldEvery, runtime.GOMAXPROCS(0))
	}
	// roce: a bandwidth loop waits in the driver after blockRoce empty
	// polls where CPUs are few, and spins on elsewhere.
	w.tune(verbs.DeviceInfo{Name: "roce0", Transport: "roce"})
	if want := map[bool]uint32{true: blockRoce, false: 0}[runtime.NumCPU() <= fewCPUs]; w.blockAfter != want {
		t.Fatalf("roce on %d CPUs: blocks after %d empty polls, want %d", runtime.NumCPU(), w.blockAfter, want)
	}
	w.tune(verbs.DeviceInfo{Name: "tcp0", Transport: "tcp"})
	if w.blockAfter != 0 {
		t.Fatalf("tcp: blocks after %d empty polls, want never", w.blockAfter)
	}
}
