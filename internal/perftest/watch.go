package perftest

// The timed loops' guard against waiting forever. A watch belongs to the
// run's goroutine, which spins; it reads the control connection's dead flag,
// which the connection's reader goroutine sets.

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// stallTimeout is how long a timed loop waits without any progress before
// it gives up: the peer is stopped, or gone in a way neither the transport
// nor the control connection noticed.
const stallTimeout = 10 * time.Second

// watch is what a timed loop consults while it spins: cancellation, the
// peer hanging up (the control connection's dead flag) and lack of
// progress. It costs a counter increment per empty poll; the clock is read
// once every checkEvery empty polls.
type watch struct {
	ctx        context.Context
	k          *ctrl
	stall      time.Duration
	schedEvery uint32 // Gosched every; a multiple of it: yield, check
	yieldEvery uint32
	// blockAfter: a bandwidth loop that found nothing to do this many
	// times in a row waits in the driver for a completion (as -e does)
	// instead of spinning on (0: it spins).
	blockAfter uint32
	// drive: a loop that waits for memory the peer writes polls a CQ
	// meanwhile, which is what moves the data on tcp (lat.go, runWrite).
	drive bool
	idle  uint32
	// last is the loop's progress counter at the last check, at time since.
	last  uint64
	since time.Time
}

// How often a spinning loop lets others run, in empty polls: the Go
// scheduler (runtime.Gosched) every gosEvery, the OS (sched_yield) every
// watch.yieldEvery, and the clock is read every checkEvery.
//
// The OS yield matters where progress needs other threads of this host:
// the tcp transport's reader goroutines (woken from the network poller)
// and the peer process, when spinners outnumber cores. With shm the peer
// copies by itself and a yield only delays noticing its answer (under
// load, one costs microseconds), so it comes late.
//
// On ibverbs nothing of this host needs the spinner's CPU (the kernel or
// the adapter moves the data, in the poster's system call on Soft-RoCE),
// and with GOMAXPROCS 2 (procs.go) each Gosched wakes a thread to take
// the idle P: on one CPU that is a context switch for every few hundred
// polls, a cost that grows with the wait. There the spinner lets others
// run only every spinCgo polls, which bounds how late it sees the peer
// hang up or the context end.
//
// On roce the transport's own goroutines (the socket's progress and
// sender goroutines) do the work the spinner waits for, checksums and
// copies included. On a machine with few CPUs (fewCPUs or fewer), a
// bandwidth loop spins blockRoce empty polls (tens of µs on a host; under
// an emulator far longer) and then waits in the driver, so that the
// spinner does not take the CPU those goroutines need: in the 2-CPU test
// VM, write_bw 64 KiB against rxe's went from 0.70 to 0.81 with -e, and
// from 0.81 to 0.86 (medians of 3) this way, 2026-11-30. With more CPUs
// it spins, as on every other transport.
const (
	gosEvery    = 256
	checkEvery  = 4096
	yieldShm    = 16384
	yieldOthers = 256
	spinCgo     = 16384
	blockRoce   = 512
	fewCPUs     = 4
)

func newWatch(ctx context.Context, k *ctrl) *watch {
	return &watch{ctx: ctx, k: k, stall: stallTimeout, schedEvery: gosEvery, yieldEvery: yieldOthers, since: time.Now()}
}

// wait is called on each empty poll with the loop's progress counter (any
// number that grows while the loop progresses).
func (w *watch) wait(progress uint64) error {
	w.idle++
	if w.idle%w.schedEvery != 0 {
		return nil
	}
	runtime.Gosched()
	if w.idle%w.yieldEvery == 0 {
		osYield()
	}
	if w.idle%checkEvery != 0 {
		return nil
	}
	return w.check(progress)
}

// check tests for cancellation, a dead peer and a stall.
func (w *watch) check(progress uint64) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if w.k != nil && w.k.dead.Load() {
		return fmt.Errorf("lost the %s during the test (%w)", w.k.peer, w.k.goneReason())
	}
	now := time.Now()
	if progress != w.last {
		w.last, w.since = progress, now
		return nil
	}
	if now.Sub(w.since) > w.stall {
		peer := "peer"
		if w.k != nil {
			peer = w.k.peer
		}
		return fmt.Errorf("no progress for %v: the %s is not responding", w.stall, peer)
	}
	return nil
}

// start restarts the stall clock: a timed loop begins (setup and the
// exchange before it do not count).
func (w *watch) start() { w.last, w.since = 0, time.Now() }

// tune adapts the spinning to the device's transport (and the Go
// scheduler to a cgo transport: procs.go).
func (w *watch) tune(dev verbs.DeviceInfo) {
	tuneProcs(dev)
	w.schedEvery, w.yieldEvery, w.blockAfter, w.drive = gosEvery, yieldOthers, 0, false
	switch dev.Transport {
	case "tcp":
		w.drive = true
	case "shm":
		w.yieldEvery = yieldShm
	case "ibverbs":
		w.schedEvery, w.yieldEvery = spinCgo, spinCgo
	case "roce":
		if runtime.NumCPU() <= fewCPUs {
			w.blockAfter = blockRoce
		}
	}
}
