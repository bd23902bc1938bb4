package perftest

// Go benchmarks over the perftest loops: the loops `rdmakit perf` times,
// run between two endpoints of one process connected to each other
// without the out-of-band exchange. Transports call Bench from their
// BenchmarkVerbs; there is no second copy of the loops.
//
// Goroutines: the benchmark goroutine runs the initiator's loop; the
// responder's loop (latency ping-pong, send_bw receives) runs on one more
// goroutine per benchmark, joined before it returns.

import (
	"context"
	"fmt"
	"strconv"
	"testing"
)

// BenchSizes are the message sizes every transport is measured at.
var BenchSizes = []int{8, 4096, 65536, 1 << 20}

// BenchTests are the perftest tests Bench runs.
var BenchTests = []string{"write_lat", "read_lat", "send_lat", "write_bw", "read_bw", "send_bw"}

// Bench runs BenchTests × BenchSizes on device as sub-benchmarks named
// TEST/SIZE. Latency tests report perftest's t_avg in "usec"; bandwidth
// tests set the bytes per operation (Go's MB/s column) and report
// perftest's BW average in "MiB/s".
func Bench(b *testing.B, device string) {
	for _, test := range BenchTests {
		for _, n := range BenchSizes {
			b.Run(fmt.Sprintf("%s/%d", test, n), func(b *testing.B) { benchOne(b, device, test, n) })
		}
	}
}

// newLocalPair opens two endpoints on device in this process and connects
// them to each other, without the exchange.
func newLocalPair(device string, args ...string) (a, b *endpoint, err error) {
	o, err := ParseArgs(append(args, "-d", device))
	if err != nil {
		return nil, nil, err
	}
	dev, err := findDevice(device)
	if err != nil {
		return nil, nil, err
	}
	c, err := o.resolve(dev)
	if err != nil {
		return nil, nil, err
	}
	if a, err = openEndpoint(c, dev); err != nil {
		return nil, nil, err
	}
	if b, err = openEndpoint(c, dev); err != nil {
		a.close()
		return nil, nil, err
	}
	if err = a.connect([]qpInfo{b.local(0)}, nil); err == nil {
		err = b.connect([]qpInfo{a.local(0)}, nil)
	}
	if err != nil {
		a.close()
		b.close()
		return nil, nil, err
	}
	return a, b, nil
}

// minBenchIters keeps the loops' statistics meaningful when b.N is tiny.
const minBenchIters = 16

func benchOne(b *testing.B, device, test string, size int) {
	iters := max(b.N, minBenchIters)
	a, peer, err := newLocalPair(device, test, "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters))
	if err != nil {
		b.Fatal(err)
	}
	defer a.close()
	defer peer.close()
	ctx := context.Background()
	b.ReportAllocs()
	if a.cfg.Test.Kind == KindLat {
		ping := newLatLoop(a, newWatch(ctx, nil), int64(size), true)
		pong := newLatLoop(peer, newWatch(ctx, nil), int64(size), false)
		if err := ping.postRecvs(); err != nil {
			b.Fatal(err)
		}
		if err := pong.postRecvs(); err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		b.ResetTimer()
		go func() { _, err := pong.run(); done <- err }()
		st, err := ping.run()
		if err2 := <-done; err == nil {
			err = err2
		}
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		r := latResult(int64(size), int64(iters), latSamples(a.cfg, st.tposted))
		b.ReportMetric(r.tAvg, "usec")
		return
	}
	b.SetBytes(int64(size))
	tx := newBWLoop(a, newWatch(ctx, nil), int64(size), true, false)
	var rx *bwLoop
	if a.cfg.Test.Verb == VerbSend {
		rx = newBWLoop(peer, newWatch(ctx, nil), int64(size), false, true)
		if err := rx.postRecvs(); err != nil {
			b.Fatal(err)
		}
	}
	done := make(chan error, 1)
	b.ResetTimer()
	if rx != nil {
		go func() { _, err := rx.run(); done <- err }()
	} else {
		done <- nil
	}
	st, err := tx.run()
	if err2 := <-done; err == nil {
		err = err2
	}
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(bwResult(a.cfg, int64(size), st).bwAvg, "MiB/s")
}
