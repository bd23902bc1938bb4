package transfer

// Batches: Submit validates, slices and posts on the caller's goroutine.
// Completions are reaped by whoever polls the QPs' completion queues
// (qpConn.poll/reap, conn.go): Wait on the waiter's goroutine first, the
// QPs' completion goroutines once handed over (Wait after its poll window,
// Done, Status, SubmitAsync, a full queue, the janitor). Reaping updates
// request states with atomics and closes Batch.done when the last slice
// returns.

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// Op is a request's direction.
type Op uint8

const (
	Read  Op = iota // segment → local memory
	Write           // local memory → segment
)

func (o Op) String() string {
	if o == Write {
		return "write"
	}
	return "read"
}

// Status is a request's state.
type Status int32

const (
	Waiting   Status = iota // submitted, nothing posted yet
	Pending                 // slices posted
	Completed               // every slice done
	Failed                  // a slice failed (see the cause)
	Timeout                 // the Submit context's deadline passed before all was posted
	Canceled                // the Submit context was canceled before all was posted
)

func (s Status) String() string {
	switch s {
	case Waiting:
		return "waiting"
	case Pending:
		return "pending"
	case Completed:
		return "completed"
	case Failed:
		return "failed"
	case Timeout:
		return "timeout"
	case Canceled:
		return "canceled"
	}
	return fmt.Sprintf("Status(%d)", int32(s))
}

// Final reports whether the status is a final one.
func (s Status) Final() bool { return s >= Completed }

// Request is one transfer between local memory and a segment.
type Request struct {
	Op          Op
	Local       *verbs.MR // local memory: from Node.AllocMR, or a caller region tcp can register
	LocalOffset int
	Segment     string
	Offset      uint64 // in the segment
	Length      int
	// After: the request starts only once the one before it in the batch
	// is done (a fence: it goes on the same QP, after it, flagged
	// verbs.SendFence). Both must be on the same segment and each fit one
	// slice (Config.SliceSize); Submit refuses it otherwise (ErrAfter).
	// A Read after a Read then sees memory as it is after the first read
	// all of its bytes.
	After bool
}

type reqState struct {
	status    atomic.Int32
	remaining atomic.Int32
	failed    atomic.Bool
}

// Batch is a submitted set of requests.
type Batch struct {
	reqs    []Request
	bytes   int64 // the requests' lengths together (prepare)
	st      []reqState
	pending atomic.Int32 // requests not final
	done    chan struct{}
	qps     []*qpConn   // the QPs its slices went to (polled by Wait)
	posted  atomic.Bool // qps is complete
	// handed: the completion goroutines of qps reap this batch's slices
	// (set by post for SubmitAsync, else by the first Wait that stops
	// polling, Done or Status).
	handed atomic.Bool

	// mu guards errs.
	mu   sync.Mutex
	errs []error // per request, its cause
}

// handOver has the completion goroutines reap what is in flight, once.
func (b *Batch) handOver() {
	if !b.posted.Load() || b.handed.Swap(true) {
		return // not posted yet: post hands over itself (SubmitAsync)
	}
	for _, qc := range b.qps {
		qc.wake()
	}
}

// Len returns the number of requests.
func (b *Batch) Len() int { return len(b.reqs) }

// Status returns request i's status and, for Failed, Timeout and
// Canceled, its cause.
func (b *Batch) Status(i int) (Status, error) {
	s := Status(b.st[i].status.Load())
	if !s.Final() {
		b.handOver() // someone watches: let the node reap
		return s, nil
	}
	if s == Completed {
		return s, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return s, b.errs[i]
}

// Done is closed when every request is final. (Asking for it has the
// node's goroutines reap the batch, which Wait otherwise does itself.)
func (b *Batch) Done() <-chan struct{} {
	b.handOver()
	return b.done
}

// Wait waits until every request is final (every slice has returned, so
// local memory is no longer touched) or ctx ends (ctx.Err(); the batch
// carries on). It returns nil if all completed, else the first failure as
// a *RequestError (errors.Join of all of them).
func (b *Batch) Wait(ctx context.Context) error {
	// The waiter reaps its own completions: it polls for up to waitSpin,
	// then hands over to the completion goroutines and sleeps. (Until
	// everything is posted, SubmitAsync's goroutine owns b.qps, and hands
	// over itself.)
	if b.posted.Load() && b.pending.Load() != 0 {
		alone := waitsNow.Add(1) == 1
		defer waitsNow.Add(-1)
		if waitSpinning.Add(1) <= maxWaitSpinning() {
			b.spin(ctx, b.spinFor(alone))
		}
		waitSpinning.Add(-1)
		if b.pending.Load() != 0 {
			b.handOver()
		}
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	var errs []error
	for i := range b.reqs {
		if s, err := b.Status(i); s != Completed {
			errs = append(errs, &RequestError{Index: i, Segment: b.reqs[i].Segment, Status: s, Err: err})
		}
	}
	return errors.Join(errs...)
}

// waitSpin is how long Wait polls before it sleeps: what completes
// within it (shm0 at once, a small transfer over tcp0 in about 20 µs)
// costs no goroutine handoff, where sleeping costs two wake-ups (the
// completion goroutine's, then the waiter's) of tens of microseconds
// each on a busy host. Longer measured no better while other Waits are
// in progress: the poller takes a processor from the goroutines and
// processes that do the transfer.
const waitSpin = 20 * time.Microsecond

// The only Wait in progress in the process polls longer: waitSpin plus
// the time its batch's bytes take at spinRate bytes per microsecond (1
// GB/s, below what tcp0 moves on one host), that part at most
// maxWaitSpin. Over tcp0 its polls read the sockets themselves (the
// transport's progress driven by the application's polls, which the
// engine's default Config.TCPBusyPoll turns on): the answer's data is
// moved by the waiting goroutine as it arrives, and neither the QP's
// reader, nor the completion goroutine, nor the waiter is woken (a 1
// MiB Read between two processes, 2 cores: 1.6 context switches per
// Read in the reading process against 9.4; 4.6 against 3.0 GB/s; kv
// bench GET over tcp0 with one client: 256 KiB 18-25k against 14k
// ops/s, 1 MiB 4.6-4.9k against 3.4-4.0k). With other Waits in
// progress it stays at waitSpin: the poller would hold a processor the
// others' transfers need.
const (
	spinRate    = 1000
	maxWaitSpin = 2 * time.Millisecond
)

// waitsNow counts the Waits of this process in progress (polling or
// asleep).
var waitsNow atomic.Int32

// spinFor is how long Wait polls b (alone: it is the only Wait in
// progress).
func (b *Batch) spinFor(alone bool) time.Duration {
	if !alone {
		return waitSpin
	}
	return waitSpin + time.Duration(min(b.bytes/spinRate, int64(maxWaitSpin/time.Microsecond)))*time.Microsecond
}

// waitSpinning counts the Waits of this process polling now. At most
// GOMAXPROCS-1 (at least one) do, the others sleep at once: a poller
// holds a Go processor, and Go's network poller, which wakes tcp0's
// readers, runs only on an idle one (8 clients of kv bench in one process
// over tcp0, 2 cores: GET 4 KiB 6.9k ops/s with every Wait polling, 7.5k
// with one; 5.6k with none).
var waitSpinning atomic.Int32

func maxWaitSpinning() int32 { return int32(max(1, runtime.GOMAXPROCS(0)-1)) }

// spin polls b's QPs until b is done, ctx ends or limit passes (or, past
// waitSpin, another Wait has begun: the longer poll is for a Wait alone),
// yielding the processor between polls (the goroutines and processes that
// complete the transfer may need it).
func (b *Batch) spin(ctx context.Context, limit time.Duration) {
	var start time.Time
	for i := 0; ; i++ {
		for _, qc := range b.qps {
			qc.poll()
		}
		if b.pending.Load() == 0 {
			return
		}
		if i%8 == 0 {
			if i == 0 {
				start = time.Now()
			} else if d := time.Since(start); d > limit || d > waitSpin && waitsNow.Load() > 1 || ctx.Err() != nil {
				return
			}
		}
		sys.Yield()
	}
}

// fail records a slice's failure of request i.
func (b *Batch) fail(i int, err error) {
	b.mu.Lock()
	if b.errs[i] == nil {
		b.errs[i] = err
	}
	b.mu.Unlock()
	b.st[i].failed.Store(true)
}

// sliceDone accounts for n slices of request i, failed with err if not nil.
func (b *Batch) sliceDone(i int, n int32, err error) {
	if err != nil {
		b.fail(i, err)
	}
	st := &b.st[i]
	if st.remaining.Add(-n) != 0 {
		return
	}
	final := Completed
	if st.failed.Load() {
		final = Failed
		b.mu.Lock()
		cause := b.errs[i]
		b.mu.Unlock()
		switch {
		case errors.Is(cause, context.DeadlineExceeded):
			final = Timeout
		case errors.Is(cause, context.Canceled):
			final = Canceled
		}
	}
	st.status.Store(int32(final))
	if b.pending.Add(-1) == 0 {
		close(b.done)
	}
}

// Submit checks every request (segment known, offsets inside the segment
// and the local region, no Write to a read-only segment) before anything
// moves, then slices them (Config.SliceSize) and posts the slices over
// the QPs to each segment's node, connecting on first use. It returns
// once everything is posted (it blocks while the QPs' queues are full);
// the Batch tells when it completes. If ctx ends before all is posted,
// the rest fails with Timeout or Canceled; what was posted completes (or
// fails when its peer is lost, within Config.PeerTimeout).
func (n *Node) Submit(ctx context.Context, reqs []Request) (*Batch, error) {
	b, plans, err := n.prepare(ctx, reqs)
	if err != nil {
		return nil, err
	}
	n.post(ctx, b, plans, false)
	return b, nil
}

// SubmitAsync is Submit that returns once every request is checked and
// its connections made, before anything is posted: the slices are posted
// by a goroutine of the node (requests are Waiting until then). ctx
// governs the posting, as Submit's does; Wait or Done tell the end.
func (n *Node) SubmitAsync(ctx context.Context, reqs []Request) (*Batch, error) {
	b, plans, err := n.prepare(ctx, reqs)
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, ErrClosed
	}
	n.wg.Add(1)
	n.mu.Unlock()
	go func() {
		defer n.wg.Done()
		n.post(ctx, b, plans, true)
	}()
	return b, nil
}

// plan is how one request reaches its segment.
type plan struct {
	rails []railPlan
	slice int
}

// prepare checks the requests and connects to their segments' nodes.
func (n *Node) prepare(ctx context.Context, reqs []Request) (*Batch, []plan, error) {
	reqs = slices.Clone(reqs) // the caller may reuse its slice at once
	b := &Batch{reqs: reqs, st: make([]reqState, len(reqs)), done: make(chan struct{}), errs: make([]error, len(reqs)),
		qps: make([]*qpConn, 0, n.cfg.QPsPerPeer)}
	plans := make([]plan, len(reqs))
	for i, r := range reqs {
		if r.Op != Read && r.Op != Write {
			return nil, nil, fmt.Errorf("transfer: request %d: unknown op %d", i, r.Op)
		}
		if r.Local == nil || r.Length <= 0 || r.LocalOffset < 0 || r.LocalOffset > r.Local.Len() || r.Length > r.Local.Len()-r.LocalOffset {
			return nil, nil, fmt.Errorf("%w: request %d: local range [%d, +%d) of a %d-byte region", ErrBounds, i, r.LocalOffset, r.Length, lenOf(r.Local))
		}
		d, err := n.lookup(ctx, r.Segment, false)
		if err != nil {
			return nil, nil, fmt.Errorf("transfer: request %d: %w", i, err)
		}
		if r.Offset > d.Size || uint64(r.Length) > d.Size-r.Offset {
			return nil, nil, fmt.Errorf("%w: request %d: [%d, +%d) of segment %q (%d bytes)", ErrBounds, i, r.Offset, r.Length, r.Segment, d.Size)
		}
		if r.Op == Write && d.ReadOnly {
			return nil, nil, fmt.Errorf("%w: request %d: segment %q", ErrReadOnly, i, r.Segment)
		}
		b.bytes += int64(r.Length)
		rails, err := n.railsFor(ctx, d)
		if err != nil {
			return nil, nil, fmt.Errorf("transfer: request %d (segment %q): %w", i, r.Segment, err)
		}
		if r.After && len(rails) > 1 {
			rails = rails[:1] // the first rail: the one the request before used first
		}
		pl := plan{slice: 0, rails: make([]railPlan, 0, len(rails))}
		for k, rl := range rails {
			lmr, err := n.regionFor(r.Local, rl.dev)
			if err != nil {
				if k == 0 {
					return nil, nil, fmt.Errorf("transfer: request %d: %w", i, err)
				}
				continue // this rail cannot reach the local region
			}
			pl.rails = append(pl.rails, railPlan{qps: rl.p.qps, addr: rl.reg.Addr + r.Offset, rkey: rl.reg.RKey, lmr: lmr})
			if s := n.sliceSize(rl.dev); pl.slice == 0 || s < pl.slice {
				pl.slice = s
			}
			rl.p.touch()
		}
		plans[i] = pl
		if r.After && (i == 0 || reqs[i-1].Segment != r.Segment || r.Length > pl.slice || reqs[i-1].Length > plans[i-1].slice) {
			return nil, nil, fmt.Errorf("%w: request %d", ErrAfter, i)
		}
	}
	return b, plans, nil
}

// post posts the slices of a prepared batch. With handOver the QPs'
// completion goroutines reap what is in flight; without, that waits for
// Batch.Wait, Done or Status (or other traffic on the QPs, or the
// janitor), so that a waiter that polls wakes no goroutine.
func (n *Node) post(ctx context.Context, b *Batch, plans []plan, handOver bool) {
	reqs := b.reqs
	b.pending.Store(int32(len(reqs)))
	if len(reqs) == 0 {
		close(b.done)
		return
	}
	for i, r := range reqs {
		slice := plans[i].slice
		ns := (r.Length + slice - 1) / slice
		b.st[i].remaining.Store(int32(ns))
	}
	op := verbs.OpRead
	var last *qpConn // the QP of the last slice posted
	for i, r := range reqs {
		pl := plans[i]
		slice := pl.slice
		ns := int32((r.Length + slice - 1) / slice)
		if r.Op == Write {
			op = verbs.OpWrite
		} else {
			op = verbs.OpRead
		}
		b.st[i].status.Store(int32(Pending))
		for k := int32(0); k < ns; k++ {
			off := int(k) * slice
			l := min(slice, r.Length-off)
			rp := &pl.rails[int(k)%len(pl.rails)]
			var flags verbs.SendFlags
			var qc *qpConn
			if r.After {
				qc, flags = last, verbs.SendFence
			} else {
				qc = pickQP(rp.qps, int(n.rr.Add(1)))
			}
			if qc == nil {
				b.sliceDone(i, ns-k, fmt.Errorf("%w: request %d: the request before it was not posted", ErrAfter, i))
				break
			}
			last = nil
			if !slices.Contains(b.qps, qc) {
				b.qps = append(b.qps, qc)
			}
			err := qc.post(ctx, b, i, op, flags, rp.lmr.SGE(r.LocalOffset+off, l), rp.addr+uint64(off), rp.rkey)
			if err != nil {
				b.sliceDone(i, ns-k, err)
				break
			}
			last = qc
		}
	}
	if handOver {
		b.handed.Store(true)
	}
	for _, qc := range b.qps {
		if qc.p.dev.sameHost {
			// shm0 completes as it posts. (Elsewhere nothing is back
			// yet, and over tcp0 a poll of an empty CQ reads the socket
			// and yields the CPU when nothing came: with 8 kv clients
			// in a process, the largest source of context switches.)
			qc.poll()
		}
		if handOver && len(qc.free) < cap(qc.free) {
			qc.wake() // in flight: the completion goroutine reaps it
		}
	}
	b.posted.Store(true)
}

// pickQP returns the QP of qps with the most free slots, the first of
// them from start on (round robin among equals) unless the first QP is
// among them: an idle peer's small requests go to the same QP one after
// another, the QP whose tcp0 reader, at both ends, having just handled
// the request before, is the one busy-polling (when that is on:
// Config.TCPBusyPoll) where another QP's sleeps in the network poller.
// Under load slices spread over all of them.
func pickQP(qps []*qpConn, start int) *qpConn {
	if qc := qps[0]; len(qc.free) == cap(qc.free) {
		return qc
	}
	var best *qpConn
	for k := range qps {
		qc := qps[(start+k)%len(qps)]
		if best == nil || len(qc.free) > len(best.free) {
			best = qc
		}
	}
	return best
}

// railPlan is how a request's slices reach its segment over one device.
type railPlan struct {
	qps  []*qpConn
	addr uint64
	rkey uint32
	lmr  *verbs.MR
}

func lenOf(mr *verbs.MR) int {
	if mr == nil {
		return 0
	}
	return mr.Len()
}
