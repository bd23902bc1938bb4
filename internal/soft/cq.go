package soft

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/ring"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// CQ is a completion queue. Its ring lives in the context's arena, so a
// transport may deliver completions into it from another process (shm
// delivers receive completions that way); Poll and Wait see them all.
//
// Any goroutine may Poll or Wait; completions are handed out once each.
//
// Waiting: a CQ that no QP uses as its receive CQ gets every completion
// from this process (send completions are delivered by the QP's engine
// here, on the goroutine that completes the work request: the poster's
// for shm, the transport's reader for tcp), so its waiters park as
// goroutines on a channel that the delivering goroutine signals (goWait,
// goWake): a wake-up is the Go scheduler's, no futex and no thread. A
// receive CQ may be written by a peer process (rc.Target.Complete through
// the shared ring), so its waiters sleep on the ring's futex word.
type CQ struct {
	ctx  *Context
	r    ring.Ring
	off  int
	size int
	prog Progresser // the transport's, if it has one (progress.go)

	closed atomic.Bool
	// recv: some QP uses the CQ as its receive CQ (set before the QP
	// exists, never cleared): waiters sleep on the ring's futex.
	recv atomic.Bool
	// gw counts the waiters parked on wch (cap 1); a producer that sees
	// one sends a token, and a waiter woken passes it on while
	// completions, a closing or an overflow are left for the others.
	gw  atomic.Int32
	wch chan struct{}
}

// CreateCQ creates a completion queue with room for at least cqe entries.
func (c *Context) CreateCQ(cqe int) (driver.CQ, error) {
	if cqe <= 0 {
		return nil, fmt.Errorf("%w: cqe must be positive", ErrInvalidArgument)
	}
	n := ring.Size(cqe, rc.WCSize)
	off, b, err := c.allocShared(n)
	if err != nil {
		return nil, err
	}
	cq := &CQ{ctx: c, r: ring.Init(b, cqe, rc.WCSize), off: off, size: n, prog: progresser(c), wch: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.arena.Free(off, n)
		return nil, ErrClosed
	}
	c.cqs[cq] = struct{}{}
	c.mu.Unlock()
	return cq, nil
}

// Cap returns the number of entries the CQ holds.
func (cq *CQ) Cap() int { return cq.r.Cap() }

// Poll moves up to len(wcs) completions into wcs and returns how many. It
// never blocks and never allocates. Once the CQ has overflowed, Poll
// returns what is left and then ErrCQOverflow.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) {
	n := 0
	cq.progress()
	for n < len(wcs) {
		// What is there, up to len(wcs), claimed with one CAS of the
		// head; decoded in place, field by field: no copy of the slot (a
		// 40-byte copy read back in pieces stalls on store forwarding).
		r := &cq.r
		want := len(wcs) - n
		pos, k := r.ClaimN(want)
		for i := range k {
			p := pos + uint64(i)
			decodeWC(r.Slot(p), &wcs[n])
			r.Release(p)
			n++
		}
		if k < want {
			break // that was all (another consumer's CAS may have cut it short; the next Poll sees the rest)
		}
	}
	if s := cq.ctx.stats; s != nil {
		s.Completions(wcs[:n])
	}
	if n == 0 {
		if cq.r.Flags()&ring.FlagOverflow != 0 {
			return 0, ErrCQOverflow
		}
		if cq.closed.Load() {
			return 0, ErrClosed
		}
	}
	return n, nil
}

// Wait blocks until at least one completion is available (verbs has
// spun on Poll first), then behaves like Poll. It returns ctx's error if
// ctx ends first and ErrClosed if the CQ or its context is closed; it
// allocates only when ctx can be cancelled.
func (cq *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	if ctx.Done() != nil {
		// Only a cancellable context needs waking (and costs an allocation).
		stop := context.AfterFunc(ctx, cq.r.Kick)
		defer stop()
	}
	for {
		if n, err := cq.Poll(wcs); n > 0 || err != nil {
			if err != nil || cq.ends() {
				cq.goWake() // left for another parked waiter, or closed
			}
			return n, err
		}
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		cq.sleeping()
		if cq.recv.Load() {
			cq.r.Wait(100 * time.Millisecond)
		} else {
			cq.goWait(ctx)
		}
	}
}

// goWait parks the goroutine until a producer of this process signals a
// completion (goWake), the CQ becomes a receive CQ or is closed, or ctx
// ends. No wake-up is lost: the waiter counts itself in gw before it
// re-checks the ring, and a producer publishes before it reads gw (all
// sequentially consistent), so either the waiter sees the entry or the
// producer sees the waiter and leaves a token in wch. wch holds one
// token, so a producer's token may be dropped while another waits there;
// whoever takes a token therefore passes it on while anything that ends
// a wait is left (ends: entries, the closing, an overflow, the receive
// CQ mark), and every waiter still parked is woken in turn.
func (cq *CQ) goWait(ctx context.Context) {
	cq.gw.Add(1)
	if !cq.ends() {
		if testHookPark != nil {
			testHookPark()
		}
		select {
		case <-cq.wch:
		case <-ctx.Done():
		}
	}
	cq.gw.Add(-1)
	if cq.stopsParking() {
		cq.goWake() // the others move to the futex, or return, too
	}
}

// ends reports whether a waiter must not park: entries are there, or
// stopsParking.
func (cq *CQ) ends() bool { return !cq.r.Empty() || cq.stopsParking() }

// stopsParking reports what ends every parked wait for good: the CQ is
// closed or overflowed, or it is a receive CQ (whose waiters use the
// futex).
func (cq *CQ) stopsParking() bool { return cq.recv.Load() || cq.closed.Load() || cq.Overflowed() }

// testHookPark, if set (tests only), runs in goWait after the waiter has
// counted itself and checked the ring, before it parks.
var testHookPark func()

// goWake wakes a waiter parked in goWait, if there is one: it costs one
// load when nobody is.
func (cq *CQ) goWake() {
	if cq.gw.Load() != 0 {
		select {
		case cq.wch <- struct{}{}:
		default: // a token is there already: its waiter passes it on
		}
	}
}

// usedForRecv marks the CQ a receive CQ (CreateQP) and moves its parked
// waiters to the futex.
func (cq *CQ) usedForRecv() {
	if !cq.recv.Load() {
		cq.recv.Store(true)
		cq.goWake()
	}
}

// decodeWC reads a completion in its ring encoding (rc.WC) from b.
func decodeWC(b []byte, wc *WorkCompletion) {
	le := binary.LittleEndian
	_ = b[rc.WCSize-1]
	// Field by field: a composite literal is built on the stack in 4-byte
	// stores and copied in 16-byte loads, which the CPU cannot forward
	// (measured: half of Poll's time).
	wc.WRID = le.Uint64(b[0:])
	wc.Status = Status(le.Uint32(b[8:]))
	wc.Opcode = WCOpcode(le.Uint32(b[12:]))
	wc.ByteLen = le.Uint32(b[16:])
	wc.Imm = le.Uint32(b[20:])
	wc.QPNum = le.Uint32(b[24:])
	wc.SrcQP = le.Uint32(b[28:])
	wc.Flags = WCFlags(le.Uint32(b[32:]))
}

// push delivers a completion from a local producer, encoded in place.
func (cq *CQ) push(w *rc.WC) bool {
	pos, b, ok := cq.r.Reserve()
	if !ok {
		// Kick, not Notify: a waiter that read the event word before
		// the flag was set must not sleep out its timeout.
		cq.r.SetFlag(ring.FlagOverflow)
		cq.r.Kick()
		cq.goWake()
		return false
	}
	w.Encode(b)
	cq.r.Publish(pos)
	cq.r.Notify()
	cq.goWake()
	return true
}

// Overflowed reports whether completions were lost.
func (cq *CQ) Overflowed() bool { return cq.r.Flags()&ring.FlagOverflow != 0 }

func (cq *CQ) markClosed() {
	cq.closed.Store(true)
	cq.r.SetFlag(ring.FlagClosed)
	cq.r.Kick()
	cq.goWake()
}

// Close destroys the CQ and wakes its waiters, which return ErrClosed. It
// fails with ErrBusy while queue pairs use it.
func (cq *CQ) Close() error {
	c := cq.ctx
	c.mu.Lock()
	for _, q := range c.qps {
		if q.sendCQ == cq || q.recvCQ == cq {
			c.mu.Unlock()
			return fmt.Errorf("%w: CQ still used by QP %#x", ErrBusy, q.num)
		}
	}
	_, live := c.cqs[cq]
	delete(c.cqs, cq)
	c.mu.Unlock()
	cq.markClosed()
	if live {
		// Give waiters a moment to see the closed flag before the pages go.
		time.AfterFunc(time.Second, func() { c.arena.Free(cq.off, cq.size) })
	}
	return nil
}

// location returns the CQ's ring in the arena (for QP control blocks).
func (cq *CQ) location() (off, n int) { return cq.off, cq.size }
