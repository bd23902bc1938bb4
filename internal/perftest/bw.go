package perftest

// The bandwidth loop (perftest's run_iter_bw, run_iter_bw_server and
// run_iter_bi in one): keep up to tx work requests outstanding on every
// QP, signal every cqMod-th, spin-poll the send CQ, and on the receiving
// side of send tests spin-poll the receive CQ and repost. Runs in the
// run's goroutine; nothing in the loop allocates.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// bwLoop is one size of a bandwidth test on one side.
type bwLoop struct {
	e     *endpoint
	cfg   *config
	w     *watch
	size  int64
	send  bool  // this side posts the measured operations
	recv  bool  // this side consumes receives (send tests)
	iters int64 // per QP; 0 in duration mode

	flags verbs.SendFlags
	wrs   [][]verbs.SendWR
	rf    []*refill
	scnt  []int64
	ccnt  []int64
	wcs   []verbs.WorkCompletion
	// With -e, completions a blocking wait returned (evN of them, from
	// evCQ) are handed to the next poll of that CQ.
	evWCs []verbs.WorkCompletion
	evN   int
	evCQ  *verbs.CQ

	// credits: after each batch of receives, write every QP's count of
	// receives (4 bytes, little endian) to the peer's advertised address:
	// perftest's send_bw sender on iWARP (no RNR retry) waits for them.
	credits bool
	rcnt    []uint32
	credWR  []verbs.SendWR

	epoch      time.Time
	tposted    []int64 // ns since epoch of each post (unless noPeak)
	tcompleted []int64 // ns since epoch each work request was known complete
}

// prefault touches every page of a fresh stamp array, so that the timed
// loop does not take its page faults (one per 4 KiB, ~1-3 µs each).
func prefault(a []int64) []int64 {
	for i := 0; i < len(a); i += 512 {
		a[i] = 0
	}
	return a
}

// poll polls cq into b.wcs, first handing over what a blocking wait (-e)
// took from it.
func (b *bwLoop) poll(cq *verbs.CQ) (int, error) {
	if b.evN > 0 && b.evCQ == cq {
		n := copy(b.wcs, b.evWCs[:b.evN])
		b.evN = 0
		return n, nil
	}
	return cq.Poll(b.wcs)
}

// block is -e (events): with nothing to post and nothing completed, sleep
// in the driver's blocking wait on the CQ this side consumes (the send
// CQ, or the receive CQ of a passive send_bw side) instead of spinning,
// as perftest waits for a completion event. It wakes at least every
// eventSlice to let the loop check on the peer and the clock.
func (b *bwLoop) block() error {
	if b.evN > 0 {
		return nil
	}
	cq := b.e.scq
	if !b.send {
		cq = b.e.rcq
	}
	if b.evWCs == nil {
		b.evWCs = make([]verbs.WorkCompletion, len(b.wcs))
	}
	n, err := eventWait(b.w.ctx, cq, b.evWCs)
	b.evN, b.evCQ = n, cq
	return err
}

// eventSlice bounds one blocking wait of -e.
const eventSlice = 20 * time.Millisecond

// eventWait waits in the driver (no spinning) up to eventSlice for
// completions of cq; a timeout is no error.
func eventWait(ctx context.Context, cq *verbs.CQ, wcs []verbs.WorkCompletion) (int, error) {
	tctx, cancel := context.WithTimeout(ctx, eventSlice)
	defer cancel()
	n, err := cq.Driver().Wait(tctx, wcs)
	if err != nil && ctx.Err() == nil && tctx.Err() != nil {
		err = nil // the slice is over
	}
	return n, err
}

// bwStats is what a bandwidth loop measured.
type bwStats struct {
	n          int64 // work requests (or receives) counted
	tposted    []int64
	tcompleted []int64
	// In duration mode: the sample window.
	sampleStart, sampleEnd int64
	// --cpu_util: /proc/stat at the window's start and end.
	cpu [2]cpuStat
}

func newBWLoop(e *endpoint, w *watch, size int64, send, recv bool) *bwLoop {
	cfg := e.cfg
	b := &bwLoop{e: e, cfg: cfg, w: w, size: size, send: send, recv: recv, iters: cfg.iters,
		scnt: make([]int64, cfg.qps), ccnt: make([]int64, cfg.qps), wcs: make([]verbs.WorkCompletion, 64)}
	if send {
		b.wrs = make([][]verbs.SendWR, cfg.qps)
		for q := range b.wrs {
			// -l: a list of postList work requests per post; without
			// it, up to postBatch work requests per post.
			b.wrs[q] = make([]verbs.SendWR, max(cfg.PostList, min(cfg.tx, postBatch), 1))
			for i := range b.wrs[q] {
				b.wrs[q][i] = opWR(e, q, size)
			}
		}
		if size <= int64(cfg.inline) && (cfg.Test.Verb == VerbWrite || cfg.Test.Verb == VerbSend) {
			b.flags = verbs.SendInline
		}
		if !cfg.noPeak && b.iters > 0 {
			n := b.iters * int64(cfg.qps)
			b.tposted = prefault(make([]int64, n))
			b.tcompleted = prefault(make([]int64, n))
		}
	}
	if recv {
		for q := range e.qps {
			b.rf = append(b.rf, newRefill(e, q, size, b.iters))
		}
	}
	return b
}

// opWR is the work request of the test's verb on QP q for size bytes, with
// the layout described in endpoint.go.
func opWR(e *endpoint, q int, size int64) verbs.SendWR {
	mr, r := e.mrs[q], e.remote[q]
	half := uint64(e.half)
	// Writes and atomics land in the peer's second half, reads come from
	// its first; against perftest both are its advertised address.
	dst, src := r.vaddr+half, r.vaddr
	if e.flat {
		dst = r.vaddr
	}
	switch e.cfg.Test.Verb {
	case VerbWrite:
		return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(0, int(size))}, RemoteAddr: dst, RKey: r.rkey}
	case VerbRead:
		return verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{mr.SGE(int(half), int(size))}, RemoteAddr: src, RKey: r.rkey}
	case VerbAtomic:
		wr := verbs.SendWR{Opcode: verbs.OpFetchAndAdd, SGL: []verbs.SGE{mr.SGE(0, 8)}, RemoteAddr: dst, RKey: r.rkey, CompareAdd: 1}
		if e.cfg.Atomic == CmpAndSwap {
			wr.Opcode, wr.CompareAdd, wr.Swap = verbs.OpCompareAndSwap, 0, 1
		}
		return wr
	default:
		return verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{mr.SGE(0, int(size))}}
	}
}

// postRecvs posts the initial receives (rx per QP, at most iters); it runs
// before the peer is told this side is ready.
func (b *bwLoop) postRecvs() error {
	for _, r := range b.rf {
		if err := r.fill(b.cfg.rx); err != nil {
			return err
		}
	}
	return nil
}

// warmUp posts tx signaled operations per QP and waits for them, as
// perftest's perform_warm_up (not for Send, which would use up receives).
func (b *bwLoop) warmUp() error {
	if !b.send || b.cfg.Test.Verb == VerbSend {
		return nil
	}
	const warmID = 1 << 63
	var outstanding int
	for q, qp := range b.e.qps {
		wr := b.wrs[q][:1]
		wr[0].Flags, wr[0].ID = b.flags|verbs.SendSignaled, warmID
		for i := 0; i < b.cfg.tx; i++ {
			if err := qp.PostSend(wr); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
			outstanding++
		}
	}
	var done uint64
	for outstanding > 0 {
		n, err := b.e.scq.Poll(b.wcs)
		if err != nil {
			return fmt.Errorf("warm-up: polling the send CQ: %w", err)
		}
		for _, wc := range b.wcs[:n] {
			if wc.Status != verbs.StatusSuccess {
				return fmt.Errorf("warm-up: %w", wc.Err())
			}
		}
		outstanding -= n
		done += uint64(n)
		if n == 0 {
			if err := b.w.wait(done); err != nil {
				return err
			}
		}
	}
	return nil
}

func (b *bwLoop) now() int64 { return int64(time.Since(b.epoch)) }

// Duration-mode states (perftest's catch_alarm).
const (
	stWarm = iota
	stSample
	stCool
	stEnd
)

// run measures one size. With iterations it returns when every work
// request has completed (and every expected receive arrived); with a
// duration, when the duration is over.
func (b *bwLoop) run() (bwStats, error) {
	cfg, e := b.cfg, b.e
	qps := len(e.qps)
	dur := cfg.Duration > 0
	tx, cqMod := int64(cfg.tx), int64(cfg.cqMod)
	var totalS, totalR int64
	if b.send {
		totalS = b.iters * int64(qps)
	}
	if b.recv {
		totalR = b.iters * int64(qps)
	}
	var totS, totC, totR int64
	var st bwStats
	state := stWarm
	margin := int64(cfg.margin) * int64(time.Second)
	total := int64(cfg.Duration) * int64(time.Second)
	noPeak := b.tposted == nil
	var progress uint64
	var idleRun uint32 // empty rounds in a row
	b.epoch = time.Now()
	cpuUtil := dur && cfg.CPUUtil
	if dur && margin == 0 {
		state = stSample
		if cpuUtil {
			st.cpu[0] = readCPUStat()
		}
	}
	if !dur {
		// Without per-operation times (noPeak), the average still spans
		// the first post to the last completion.
		st.sampleStart = b.now()
	}
	for {
		if dur {
			t := b.now()
			switch {
			case state == stWarm && t >= margin:
				state, st.sampleStart = stSample, t
				if cpuUtil {
					st.cpu[0] = readCPUStat()
				}
			case state == stSample && t >= total-margin:
				state, st.sampleEnd = stCool, t
				if cpuUtil {
					st.cpu[1] = readCPUStat()
				}
				if margin == 0 {
					state = stEnd
				}
			case state == stCool && t >= total:
				state = stEnd
			}
			if state == stEnd {
				break
			}
		} else if totS >= totalS && totC >= totalS && totR >= totalR {
			break
		}
		busy := false
		if b.send {
			for q, qp := range e.qps {
				wr := b.wrs[q]
				if cfg.PostList > 1 {
					wr = wr[:cfg.PostList]
					// -l: whole lists, the last work request signaled
					// (-Q is the list length, iterations a multiple of it).
					k := int64(len(wr))
					for (dur || b.scnt[q]+k <= b.iters) && b.scnt[q]-b.ccnt[q]+k <= tx {
						n := b.scnt[q]
						var t int64
						if !noPeak {
							t = b.now()
						}
						for i := range wr {
							wr[i].Flags = b.flags
							wr[i].ID = uint64(q)<<32 | uint64(n+int64(i)+1)
							if !noPeak {
								b.tposted[totS+int64(i)] = t
							}
						}
						wr[k-1].Flags |= verbs.SendSignaled
						if err := qp.PostSend(wr); err != nil {
							if errors.Is(err, verbs.ErrQueueFull) {
								break
							}
							return st, fmt.Errorf("posting %s: %w", wr[0].Opcode, err)
						}
						b.scnt[q] += k
						totS += k
						busy = true
					}
					continue
				}
				// Everything the send queue has room for, in one post
				// (one call into the transport: for ibverbs one cgo call
				// and one doorbell), signaled every cqMod-th as before.
				for {
					k := min(tx-(b.scnt[q]-b.ccnt[q]), int64(len(wr)))
					if !dur {
						k = min(k, b.iters-b.scnt[q])
					}
					if k <= 0 {
						break
					}
					n := b.scnt[q]
					var t int64
					if !noPeak {
						t = b.now()
					}
					// The i-th is signaled when n+i+1 is a multiple of
					// cqMod: one division per post, not per work request.
					sig := cqMod - 1 - n%cqMod
					for i := int64(0); i < k; i++ {
						w := &wr[i]
						w.Flags = b.flags
						if i == sig || (!dur && n+i == b.iters-1) {
							w.Flags |= verbs.SendSignaled
							if i == sig {
								sig += cqMod
							}
						}
						w.ID = uint64(q)<<32 | uint64(n+i+1)
						if !noPeak {
							b.tposted[totS+i] = t
						}
					}
					posted, err := postSome(qp, wr[:k])
					b.scnt[q] += posted
					totS += posted
					if posted > 0 {
						busy = true
					}
					if err != nil {
						return st, fmt.Errorf("posting %s: %w", wr[0].Opcode, err)
					}
					if posted < k {
						break // the send queue is full
					}
				}
			}
			n, err := b.poll(e.scq)
			if err != nil {
				return st, fmt.Errorf("polling the send CQ: %w", err)
			}
			for i := 0; i < n; i++ {
				wc := &b.wcs[i]
				if wc.Status != verbs.StatusSuccess {
					return st, fmt.Errorf("after %d work requests completed: %w", totC, wc.Err())
				}
				q := int(wc.WRID >> 32)
				if q >= qps {
					continue
				}
				delta := int64(wc.WRID&0xffffffff) - b.ccnt[q]
				if delta <= 0 {
					continue
				}
				b.ccnt[q] += delta
				if !noPeak {
					t := b.now()
					for k := totC; k < totC+delta && k < int64(len(b.tcompleted)); k++ {
						b.tcompleted[k] = t
					}
				}
				totC += delta
				if dur && state == stSample {
					st.n += delta
				}
			}
			if n > 0 {
				busy = true
			}
		}
		if b.recv {
			n, err := b.poll(e.rcq)
			if err != nil {
				return st, fmt.Errorf("polling the receive CQ: %w", err)
			}
			for i := 0; i < n; i++ {
				wc := &b.wcs[i]
				if wc.Status != verbs.StatusSuccess {
					return st, fmt.Errorf("after %d receives: %w", totR, wc.Err())
				}
				q := int(wc.WRID)
				if q >= qps {
					continue
				}
				totR++
				if dur && state == stSample && !b.send {
					st.n++
				}
				if err := b.rf[q].consumed(); err != nil {
					return st, err
				}
				if b.credits {
					b.rcnt[q]++
				}
			}
			if n > 0 {
				busy = true
				if b.credits {
					if err := b.sendCredits(); err != nil {
						return st, err
					}
				}
			}
		}
		if busy {
			progress++
			idleRun = 0
			if progress%checkEvery == 0 {
				if err := b.w.check(progress); err != nil {
					return st, err
				}
			}
		} else if idleRun++; cfg.Events || (b.w.blockAfter > 0 && idleRun >= b.w.blockAfter) {
			idleRun = 0
			if err := b.block(); err != nil {
				return st, err
			}
			if err := b.w.wait(progress); err != nil {
				return st, err
			}
		} else if err := b.w.wait(progress); err != nil {
			return st, err
		}
	}
	if !dur {
		st.sampleEnd = b.now()
		st.n = totalS
		if !b.send {
			st.n = totalR
		}
	}
	st.tposted, st.tcompleted = b.tposted, b.tcompleted
	return st, nil
}

// postBatch bounds the work requests of one post in the bandwidth loop
// (perftest's default tx depth).
const postBatch = 128

// postSome posts wrs and reports how many the transport took: all of them,
// or those before the one a full send queue refused (no error then).
func postSome(qp *verbs.QP, wrs []verbs.SendWR) (int64, error) {
	err := qp.PostSend(wrs)
	if err == nil {
		return int64(len(wrs)), nil
	}
	if !errors.Is(err, verbs.ErrQueueFull) {
		return 0, err
	}
	var pe *verbs.PostError
	if errors.As(err, &pe) && pe.Index > 0 && pe.Index < len(wrs) {
		return int64(pe.Index), nil
	}
	return 0, nil
}

// enableCredits turns on perftest's receive credits (see bwLoop.credits).
func (b *bwLoop) enableCredits() {
	qps := len(b.e.qps)
	b.credits = true
	b.rcnt = make([]uint32, qps)
	b.credWR = make([]verbs.SendWR, 1)
	b.credWR[0].SGL = make([]verbs.SGE, 1)
}

// sendCredits writes each QP's receive count to the peer and waits for
// the writes to complete (this side posts nothing else: the send CQ holds
// only these).
func (b *bwLoop) sendCredits() error {
	e := b.e
	for q, n := range b.rcnt {
		mr := e.mrs[q]
		binary.LittleEndian.PutUint32(mr.Bytes()[:4], n)
		r := &e.remote[q]
		b.credWR[0] = verbs.SendWR{ID: uint64(q), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: append(b.credWR[0].SGL[:0], mr.SGE(0, 4)), RemoteAddr: r.vaddr, RKey: r.rkey}
		if err := e.qps[q].PostSend(b.credWR); err != nil {
			return fmt.Errorf("posting the receive credit: %w", err)
		}
		for {
			n, err := e.scq.Poll(b.wcs[:1])
			if err != nil {
				return err
			}
			if n == 1 {
				if err := b.wcs[0].Err(); err != nil {
					return fmt.Errorf("writing the receive credit: %w", err)
				}
				break
			}
			if err := b.w.check(1); err != nil {
				return err
			}
		}
	}
	return nil
}
