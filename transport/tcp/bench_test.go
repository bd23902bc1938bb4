package tcp

import (
	"context"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/perftest"
	"runtime"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// BenchmarkWrite measures RDMA Write over loopback TCP:
//
//	lat/N:      post one signaled write, poll its completion (a full round
//	            trip to the responder's ACK); usec per write
//	pingpong/N: perftest write_lat: each side writes the other's buffer and
//	            waits to see the peer's write land; half a round trip
//	bw/N:       perftest write_bw: up to 128 writes outstanding, every 32nd
//	            signaled; MB/s
//
// Each runs with three ways of waiting for completions:
//
//	sleep: Poll, and time.Sleep(1µs) when empty
//	wait:  CQ.Wait (spins 50µs, then sleeps on the CQ's futex)
//	spin:  Poll, and runtime.Gosched when empty
//
// A goroutine that keeps a P busy delays the Go network poller's wakeups
// of the transport's reader goroutines, so on a small machine sleeping
// gives the lowest latency.
func BenchmarkWrite(b *testing.B) {
	for _, w := range []waitMode{waitSleep, waitCQ, waitSpin} {
		for _, n := range []int{8, 4096} {
			b.Run(fmt.Sprintf("lat/%s/%d", w, n), func(b *testing.B) { benchWriteLat(b, n, w) })
		}
		b.Run(fmt.Sprintf("pingpong/%s/8", w), func(b *testing.B) { benchPingPong(b, 8, w) })
		for _, n := range []int{8, 65536, 1 << 20} {
			b.Run(fmt.Sprintf("bw/%s/%d", w, n), func(b *testing.B) { benchWriteBW(b, n, w) })
		}
	}
}

type waitMode string

const (
	waitSleep waitMode = "sleep"
	waitCQ    waitMode = "wait"
	waitSpin  waitMode = "spin"
)

// pollCQ returns at least one completion (at most len(wcs)).
func pollCQ(b *testing.B, cq *verbs.CQ, wcs []verbs.WorkCompletion, w waitMode) int {
	for {
		n, err := cq.Poll(wcs)
		if err == nil && n == 0 && w == waitCQ {
			n, err = cq.Wait(context.Background(), wcs)
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.StatusSuccess {
				b.Fatal(wc.Err())
			}
		}
		if n > 0 {
			return n
		}
		pause(w, 1<<20)
	}
}

func poll1(b *testing.B, cq *verbs.CQ, wcs []verbs.WorkCompletion, w waitMode) {
	pollCQ(b, cq, wcs[:1], w)
}

func benchWriteLat(b *testing.B, n int, w waitMode) {
	a, p := newPair(b, opts{})
	fl := verbs.SendSignaled
	if n <= 256 {
		fl |= verbs.SendInline
	}
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: fl, SGL: sgl(a.mr, 0, n), RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey()}}
	wcs := make([]verbs.WorkCompletion, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		poll1(b, a.scq, wcs, w)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N), "usec")
}

func benchPingPong(b *testing.B, n int, w waitMode) {
	const dst = 4096 // each side writes from [0, n) into the other's [dst, dst+n)
	a, p := newPair(b, opts{})
	mk := func(from, to *end) []verbs.SendWR {
		return []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.SendSignaled | verbs.SendInline, SGL: sgl(from.mr, 0, n), RemoteAddr: to.mr.Addr() + dst, RKey: to.mr.RKey()}}
	}
	wa, wp := mk(a, p), mk(p, a)
	bufA, bufP := a.mr.Bytes(), p.mr.Bytes()
	done := make(chan error, 1)
	go func() {
		wcs := make([]verbs.WorkCompletion, 1)
		for i := 0; i < b.N; i++ {
			seq := byte(i + 1)
			for spins := 0; bufP[dst+n-1] != seq; spins++ {
				pause(w, spins)
			}
			bufP[n-1] = seq
			if err := p.qp.PostSend(wp); err != nil {
				done <- err
				return
			}
			poll1(b, p.scq, wcs, w)
		}
		done <- nil
	}()
	wcs := make([]verbs.WorkCompletion, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq := byte(i + 1)
		bufA[n-1] = seq
		if err := a.qp.PostSend(wa); err != nil {
			b.Fatal(err)
		}
		poll1(b, a.scq, wcs, w)
		for spins := 0; bufA[dst+n-1] != seq; spins++ {
			pause(w, spins)
		}
	}
	b.StopTimer()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/2e3/float64(b.N), "usec")
}

func benchWriteBW(b *testing.B, n int, w waitMode) {
	const depth, every = 128, 32
	a, p := newPair(b, opts{sendWR: depth, cqSize: depth, mrSize: max(n, 4096)})
	wr := []verbs.SendWR{{Opcode: verbs.OpWrite, SGL: sgl(a.mr, 0, n), RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey()}}
	wcs := make([]verbs.WorkCompletion, 16)
	b.SetBytes(int64(n))
	b.ReportAllocs()
	cpu0 := cpuTime()
	b.ResetTimer()
	posted, completed := 0, 0
	for completed < b.N {
		for posted < b.N && posted-completed < depth {
			wr[0].Flags = 0
			if (posted+1)%every == 0 || posted == b.N-1 {
				wr[0].Flags = verbs.SendSignaled
			}
			if err := a.qp.PostSend(wr); err != nil {
				b.Fatal(err)
			}
			posted++
		}
		k := pollCQ(b, a.scq, wcs, w)
		for j := 0; j < k; j++ {
			completed = min((completed/every+1)*every, b.N)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds()/1e6, "MB/s")
	// CPU time (both sides, user and system) per MB: steadier than MB/s on
	// a shared machine.
	b.ReportMetric(float64(cpuTime()-cpu0)/1e3/(float64(n)*float64(b.N)/1e6), "cpu-us/MB")
}

// pause waits a little for memory to change: yielding, or sleeping after a
// while when not spinning.
func pause(w waitMode, spins int) {
	if w == waitSpin || spins < 64 {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Microsecond)
}

// cpuTime returns the process's user+system CPU time.
func cpuTime() time.Duration {
	d, _ := sys.ProcessCPUTime()
	return d
}

// BenchmarkVerbs is the benchmark set every transport runs (latency in
// usec with perftest's definitions, bandwidth in MB/s).
func BenchmarkVerbs(b *testing.B) { perftest.Bench(b, "tcp0") }

// BenchmarkEmptyPoll is what a poll of an empty CQ of a connected QP
// costs, with busy polling on (a non-blocking read and a sched_yield:
// poll.go) and off (the ring check alone).
func BenchmarkEmptyPoll(b *testing.B) {
	for _, bp := range []time.Duration{0, -1} {
		name := "on"
		if bp < 0 {
			name = "off"
		}
		b.Run(name, func(b *testing.B) {
			o := opts{}.withDefaults()
			open := func() *verbs.Context {
				ctx, err := verbs.Open(deviceName, verbs.Options{TCPBusyPoll: bp})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { ctx.Close() })
				return ctx
			}
			x, y := newEnd(b, open(), o, 0), newEnd(b, open(), o, 0)
			connect(x, y, o)
			linkConn(b, x.qp)
			wcs := make([]verbs.WorkCompletion, 1)
			b.ResetTimer()
			for range b.N {
				if n, _ := x.rcq.Poll(wcs); n != 0 {
					b.Fatal("a completion")
				}
			}
		})
	}
}
