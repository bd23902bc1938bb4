package perftest

// The latency loops (perftest's run_iter_lat_write, run_iter_lat_send and
// run_iter_lat): one operation at a time, with the time of every post
// recorded; the client is the initiator and the server answers the
// ping-pong tests. Runs in the run's goroutine; nothing in the loops
// allocates.

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// latLoop is one size of a latency test on one side.
type latLoop struct {
	e         *endpoint
	cfg       *config
	w         *watch
	size      int64
	initiator bool
	iters     int64 // 0 in duration mode

	wr  []verbs.SendWR
	rf  *refill // send_lat's receives
	wcs []verbs.WorkCompletion

	epoch   time.Time
	tposted []int64
	// ticks: tposted holds time-stamp counter readings (sys.Ticks, as
	// perftest's get_cycles) until run converts them to ns since epoch,
	// calibrated against the clock over the whole loop; tick0 is the
	// reading at epoch. Reading the clock instead costs ~14 ns more per
	// iteration on the dev host, which every latency figure would carry.
	ticks bool
	tick0 int64
	// duration mode
	state                  int
	margin, total          int64
	sampleStart, sampleEnd int64
	startIdx, cur          int64
	sampled                int64
}

// latStats is what a latency loop measured: the post times (iterations
// mode) or the sample window and its iterations (duration mode).
type latStats struct {
	tposted                []int64
	sampleStart, sampleEnd int64
	n                      int64
}

func newLatLoop(e *endpoint, w *watch, size int64, initiator bool) *latLoop {
	cfg := e.cfg
	l := &latLoop{e: e, cfg: cfg, w: w, size: size, initiator: initiator, iters: cfg.iters,
		wcs: make([]verbs.WorkCompletion, 1)}
	l.wr = []verbs.SendWR{opWR(e, 0, size)}
	if size <= int64(cfg.inline) && (cfg.Test.Verb == VerbWrite || cfg.Test.Verb == VerbSend) {
		l.wr[0].Flags = verbs.SendInline
	}
	if cfg.Test.Verb == VerbSend {
		l.rf = newRefill(e, 0, size, l.iters)
	}
	// Against perftest (e.flat) the responder measures too, as perftest's
	// does: its posts are a round trip apart as well.
	if (initiator || e.flat) && l.iters > 0 {
		l.tposted = make([]int64, l.iters)
	}
	if cfg.Duration > 0 {
		l.margin = int64(cfg.margin) * int64(time.Second)
		l.total = int64(cfg.Duration) * int64(time.Second)
	}
	return l
}

// postRecvs posts the initial receives of send_lat (both sides).
func (l *latLoop) postRecvs() error {
	if l.rf == nil {
		return nil
	}
	return l.rf.fill(l.cfg.rx)
}

func (l *latLoop) now() int64 { return int64(time.Since(l.epoch)) }

// stamp is the time of a post for tposted (see latLoop.ticks).
func (l *latLoop) stamp() int64 {
	if l.ticks {
		return sys.Ticks()
	}
	return l.now()
}

// ticksToNs converts the counter readings in tposted to ns since epoch,
// at the rate the counter ran against the clock during the loop. A
// counter that did not advance leaves nothing to convert by: an error,
// not raw readings reported as nanoseconds.
func (l *latLoop) ticksToNs() error {
	t1, ns1 := sys.Ticks(), l.now()
	if t1 <= l.tick0 || ns1 <= 0 {
		return fmt.Errorf("the time-stamp counter did not advance over the loop (%d to %d in %d ns): a run with -D SECONDS times posts with the clock", l.tick0, t1, ns1)
	}
	scale := float64(ns1) / float64(t1-l.tick0)
	for i, v := range l.tposted {
		if v != 0 {
			l.tposted[i] = int64(float64(v-l.tick0) * scale)
		}
	}
	return nil
}

// tick advances the duration state machine; it reports false once the
// duration is over. Iteration i is about to start.
func (l *latLoop) tick(i int64) bool {
	if l.total == 0 {
		return i < l.iters
	}
	l.cur = i
	t := l.now()
	switch {
	case l.state == stWarm && t >= l.margin:
		l.state, l.sampleStart, l.startIdx = stSample, t, i
	case l.state == stSample && t >= l.total-l.margin:
		l.state, l.sampleEnd, l.sampled = stCool, t, i-l.startIdx
	case l.state == stCool && t >= l.total:
		l.state = stEnd
	}
	if l.state == stCool && l.margin == 0 {
		l.state = stEnd
	}
	return l.state != stEnd
}

// over reports, while spinning, that a duration run has ended.
func (l *latLoop) over() bool { return l.total > 0 && l.now() >= l.total }

func (l *latLoop) run() (latStats, error) {
	l.epoch = time.Now()
	if l.ticks = sys.HasTicks && l.total == 0 && l.tposted != nil; l.ticks {
		l.tick0 = sys.Ticks()
	}
	var err error
	switch l.cfg.Test.Verb {
	case VerbWrite:
		err = l.runWrite()
	case VerbSend:
		err = l.runSend()
	default:
		if l.initiator {
			err = l.runRead()
		}
	}
	if l.ticks {
		if cerr := l.ticksToNs(); err == nil {
			err = cerr
		}
	}
	st := latStats{tposted: l.tposted, sampleStart: l.sampleStart, sampleEnd: l.sampleEnd, n: l.sampled}
	if l.total > 0 && l.state == stSample {
		// Ended early (by the peer's clock): count up to now.
		st.sampleEnd, st.n = l.now(), l.cur-l.startIdx
	}
	return st, err
}

// post posts the work request, retrying while the send queue is full of
// unsignaled work requests the transport has not finished.
func (l *latLoop) post(progress uint64) error {
	for {
		err := l.e.qps[0].PostSend(l.wr)
		if err == nil {
			return nil
		}
		if !errors.Is(err, verbs.ErrQueueFull) {
			return fmt.Errorf("posting %s: %w", l.wr[0].Opcode, err)
		}
		if err := l.w.wait(progress); err != nil {
			return err
		}
	}
}

// pollOne spins until cq has a completion, or a duration run is over
// (then ok is false).
func (l *latLoop) pollOne(cq *verbs.CQ, progress uint64) (ok bool, err error) {
	for spins := 0; ; spins++ {
		n, err := cq.Poll(l.wcs)
		if n == 0 && err == nil && l.cfg.Events {
			// -e: sleep until the completion comes, as perftest waits for
			// a completion event.
			n, err = eventWait(l.w.ctx, cq, l.wcs)
		}
		if err != nil {
			return false, fmt.Errorf("polling a CQ: %w", err)
		}
		if n == 1 {
			if l.wcs[0].Status != verbs.StatusSuccess {
				return false, fmt.Errorf("after %d iterations: %w", progress, l.wcs[0].Err())
			}
			return true, nil
		}
		if spins%gosEvery == gosEvery-1 && l.over() {
			return false, nil
		}
		if err := l.w.wait(progress); err != nil {
			return false, err
		}
	}
}

// runWrite is write_lat: each side writes size bytes whose last byte is
// the iteration number into the other's receive half, and spins on the
// last byte of its own receive half for the peer's next number.
func (l *latLoop) runWrite() error {
	mem := l.e.mrs[0].Bytes()
	last := int(l.size) - 1
	pollAt := int(l.e.half) + last
	word, shift := pollAt&^3, uint(pollAt&3)*8
	l.wr[0].Flags |= verbs.SendSignaled
	// On tcp the peer's write lands only when this process reads its
	// socket: while the loop spins on memory it polls the (empty) send CQ
	// too, which drives the transport's progress (transport/tcp poll.go),
	// as a busy-polling library's wait loop calls its progress function.
	// With nothing taken from the CQ (a zero-length slice), no completion
	// is lost.
	cq := l.e.scq
	drive := l.w.drive
	wait := func(seq byte, progress uint64) (bool, error) {
		for spins := 0; byte(sys.Load32(mem, word)>>shift) != seq; spins++ {
			if drive {
				cq.Poll(l.wcs[:0])
				if byte(sys.Load32(mem, word)>>shift) == seq {
					break
				}
			}
			if spins%gosEvery == gosEvery-1 && l.over() {
				return false, nil
			}
			if err := l.w.wait(progress); err != nil {
				return false, fmt.Errorf("waiting for the peer's write %d (the byte at offset %d of the receive half holds %d): %w",
					seq, last, byte(sys.Load32(mem, word)>>shift), err)
			}
		}
		return true, nil
	}
	for i := int64(0); l.tick(i); i++ {
		seq := byte(i + 1)
		if !l.initiator {
			if ok, err := wait(seq, uint64(i)); !ok || err != nil {
				return err
			}
		}
		if l.tposted != nil {
			l.tposted[i] = l.stamp()
		}
		mem[last] = seq
		if err := l.post(uint64(i)); err != nil {
			return err
		}
		if ok, err := l.pollOne(l.e.scq, uint64(i)); !ok || err != nil {
			if err != nil {
				err = fmt.Errorf("waiting for the completion of write %d: %w", seq, err)
			}
			return err
		}
		if l.initiator {
			if ok, err := wait(seq, uint64(i)); !ok || err != nil {
				return err
			}
		}
	}
	return nil
}

// runSend is send_lat: the initiator sends, the responder receives and
// sends back; sends are signaled every cqMod.
func (l *latLoop) runSend() error {
	cqMod := int64(l.cfg.cqMod)
	base := l.wr[0].Flags
	recv := func(i int64) (bool, error) {
		ok, err := l.pollOne(l.e.rcq, uint64(i))
		if !ok || err != nil {
			return false, err
		}
		return true, l.rf.consumed()
	}
	for i := int64(0); l.tick(i); i++ {
		if !l.initiator {
			if ok, err := recv(i); !ok || err != nil {
				return err
			}
		}
		if l.tposted != nil {
			l.tposted[i] = l.stamp()
		}
		signaled := (i+1)%cqMod == 0 || (l.iters > 0 && i == l.iters-1)
		l.wr[0].Flags = base
		if signaled {
			l.wr[0].Flags |= verbs.SendSignaled
		}
		if err := l.post(uint64(i)); err != nil {
			return err
		}
		if signaled {
			if ok, err := l.pollOne(l.e.scq, uint64(i)); !ok || err != nil {
				return err
			}
		}
		if l.initiator {
			if ok, err := recv(i); !ok || err != nil {
				return err
			}
		}
	}
	return nil
}

// runRead is read_lat and atomic_lat: post one signaled operation, spin
// for its completion, repeat. The server takes no part.
func (l *latLoop) runRead() error {
	l.wr[0].Flags |= verbs.SendSignaled
	for i := int64(0); l.tick(i); i++ {
		if l.tposted != nil {
			l.tposted[i] = l.stamp()
		}
		if err := l.post(uint64(i)); err != nil {
			return err
		}
		if ok, err := l.pollOne(l.e.scq, uint64(i)); !ok || err != nil {
			return err
		}
	}
	return nil
}
