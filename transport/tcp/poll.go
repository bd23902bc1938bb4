package tcp

// Progress driven by the application's polling. When the application polls
// an empty CQ of a connected QP (CQ.Poll, and CQ.Wait, which polls before
// it sleeps), soft calls Progress on its goroutine: the poller takes the
// link's read side if the link goroutine has let go of it (rmu, TryLock),
// reads what has arrived without blocking, handles every whole frame in
// the buffer (the responder's and the requester's work, completions
// included), and writes what that owes (ACKs, responses). One busy thread
// per process then does all the work, as in a busy-polling RDMA library,
// instead of the application's thread and the reader both (a thread
// wake-up per message, or two spinning threads per process).
//
// Ownership: rmu is held by the link goroutine from its start, except
// while it waits between frames (idle, await). A poller never blocks: it
// moves the part of a payload that has arrived straight into place and
// leaves the rest in l.pl (payload.go), which the next holder of rmu
// finishes first. What it must not do it hands to the link goroutine
// with a kick (kickLocked): the output stall (awaitOutput blocks), the
// end of the link (an error, a responder failure that lingers). The kick
// sets handover, which keeps pollers off, wakes the link goroutine from either of its waits (rwake ends a sleep,
// a read deadline in the past a wait for input), and the link goroutine
// clears both under rmu before it reads. So the socket is read by one
// goroutine at a time.
//
// While the application polls (polled moves, and it has not gone to sleep
// in CQ.Wait: Sleep), the link goroutine sleeps until the context's lease
// keeper sees the application stop polling the link (it looks at all links
// every appLease: one timer wake-up per context, not one per link), and
// the socket's SO_RCVLOWAT is raised so that arriving data wakes no thread
// (setLowat). Otherwise it busy-polls (Options.TCPBusyPoll)
// and then waits until the socket is readable, SO_RCVLOWAT back at 1: input
// that arrives while nobody polls is always found by the link goroutine,
// at the latest about stopAfter after the application's last poll of the
// link.
// An ACK a poller owes may wait for the application's next post (deferAck)
// only while the link goroutine sleeps, since it writes it when it looks.

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// Progress is soft.Progresser: cq was found empty by a poll. Links whose
// QP completes into cq make what progress they can. It does nothing when
// busy polling is off (Options.TCPBusyPoll 0).
func (cd *ctxDriver) Progress(cq *soft.CQ) {
	if cd.busyPoll == 0 {
		return
	}
	ls := cd.pollers.Load()
	if ls == nil {
		return
	}
	cd.polls.Add(1)
	polled, busy := false, false
	for _, l := range *ls {
		if s, r := l.qp.CQs(); s == cq || r == cq {
			polled, busy = true, l.poll() || busy
		}
	}
	if polled && !busy {
		// None of the CQ's links had anything (one that did keeps the
		// CPU). As the reader's busy poll does (reader.go): on a host
		// with more busy threads than cores, the one this poll waits for
		// may need this CPU; with the transfer engine's busy poll, the
		// goroutine it waits for may need this processor (goYield).
		// The thread's yield does not go through the Go scheduler's
		// system-call path (sys.RawYield): there a yield that lasts (the
		// core is taken) has the runtime hand this goroutine's processor
		// to another thread, or wake one, a switch more. coll over tcp,
		// 4 ranks on 2 cores, medians of 5 alternating launches, µs,
		// sys.Yield against RawYield: AllReduce 1 MiB 988 / 904,
		// AllGather 1 MiB 452 / 366; 8 ranks AllReduce 1 MiB 2444 /
		// 2091; 2-rank 8 B and perf latencies unchanged.
		if cd.goYield() {
			yieldGo()
		} else {
			sys.RawYield()
		}
	}
}

// goYield reports whether polls that find nothing yield to the process's
// other goroutines (runtime.Gosched) rather than the thread to the
// system's (sched_yield): with busy polls from 1 µs to unpolledSpin, the
// transfer engine's (DefaultTCPBusyPoll there), whose processes run many
// goroutines on few processors (a store node's links and its clients,
// Batch.Wait's poller, the completion goroutines), so that what a poll
// waits for is most often a goroutine of its own process: handing it the
// processor costs no switch of threads. kv bench GET over tcp0, 256 KiB,
// 8 clients, 2 shared cores, alternating with sched_yield: a median 103
// against 114 µs of CPU and 0.76 against 1.0 context switches per Get,
// 3-12% more GET/s where the host was not taken by other work
// (docs/benchmarks.md, "tcp0: pollers of the transfer engine yield to
// goroutines"). Shorter busy polls (coll's 1 ns: ranks
// that outnumber the cores) and longer ones (the perf tools' 50 µs
// between two processes) keep sched_yield.
func (cd *ctxDriver) goYield() bool {
	return cd.busyPoll >= time.Microsecond && cd.busyPoll < unpolledSpin
}

// yieldGo yields to the process's other goroutines and, when none ran
// (runtime.Gosched came back within goYieldRan), the thread to the
// system's: then what a poll waits for is another thread (of this
// process, ready but without a core, or the peer process), which may
// need this core (kv bench GET over tcp0, one client, on a loaded host:
// pure runtime.Gosched spinning lost 10% against sched_yield). The
// thread's yield here is sys.Yield, as measured; Progress's other branch
// moved to sys.RawYield after it, for coll (not measured with the engine).
func yieldGo() {
	t := time.Now()
	runtime.Gosched()
	if time.Since(t) < goYieldRan {
		sys.Yield()
	}
}

// goYieldRan: a runtime.Gosched that took less ran no other goroutine.
const goYieldRan = 2 * time.Microsecond

// addPoller and removePoller keep the list Progress walks: the links whose
// connection is up (copy on write; Progress reads it without a lock).
func (cd *ctxDriver) addPoller(l *link) {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	var ls []*link
	if p := cd.pollers.Load(); p != nil {
		ls = append(ls, *p...)
	}
	ls = append(ls, l)
	cd.pollers.Store(&ls)
}

func (cd *ctxDriver) removePoller(l *link) {
	cd.mu.Lock()
	defer cd.mu.Unlock()
	p := cd.pollers.Load()
	if p == nil {
		return
	}
	ls := make([]*link, 0, len(*p))
	for _, x := range *p {
		if x != l {
			ls = append(ls, x)
		}
	}
	cd.pollers.Store(&ls)
}

// poll is one poller's attempt on the link (an application goroutine).
func (l *link) poll() (busy bool) {
	l.polled.Add(1)
	if l.appAsleep.Load() {
		l.appAsleep.Store(false)
	}
	if l.handover.Load() || !l.rmu.TryLock() {
		// The link goroutine is at work, or about to be (the end of the
		// link, say), or another poller is: nothing to do
		// here, and the one at work may need this CPU (2-rank AllReduce
		// 1 MiB over tcp in 256 KiB messages, which the link goroutine
		// reads, took 770-1200 µs while pollers kept the CPU).
		return false
	}
	if !l.rdone && l.perr == nil {
		busy = l.pump()
	}
	l.rmu.Unlock()
	return busy
}

// pump handles the frames that have arrived, reading what has arrived
// (without waiting), and writes what it owes. A payload goes straight
// into place as it arrives (payload.go); what has not arrived yet is left
// in l.pl for the next poll or the link goroutine. rmu is held.
func (l *link) pump() (busy bool) {
	var f frame
	start := l.progress.Load()
	reads := 0
	l.nb, l.drained = true, false
	defer func() { l.nb, l.drained = false, false }()
	for {
		if l.stall {
			l.kickLocked() // awaitOutput blocks: the link goroutine's
			return true
		}
		if l.owedFrames >= flushFrames || l.owedBytes >= flushBytes {
			l.flushOwed()
		}
		var err error
		switch {
		case l.pl.active:
			err = l.runPayload()
		case l.rend-l.rpos >= headerLen:
			var h header
			if h, err = parseHeader(l.rbuf[l.rpos:l.rend]); err != nil {
				err = l.protocolError(err)
				break
			}
			h.decode(&f)
			l.pollFrames.Add(1)
			err = l.handleFrame(&f)
		default:
			if reads == 2 || l.drained {
				// A read that left room in the buffer (this one's, or
				// the one that took the end of a payload: place) took
				// all there was: another would most likely find nothing
				// (a system call per message saved); the next poll
				// looks again.
				goto out
			}
			got, short := l.pollRead(headerLen)
			if !got {
				goto out
			}
			l.drained = short
			reads++
			continue
		}
		if err == errMore {
			break // the socket has no more for now
		}
		if err != nil {
			// The end of the link (a malformed frame, a read error): the
			// link goroutine's (it finishes a payload in progress first).
			l.perr = err
			l.kickLocked()
			return true
		}
	}
out:
	if !l.deferAck() {
		l.flushOwed()
	}
	return l.progress.Load() != start
}

// deferAck decides whether a poller may leave the ACK it owes for the
// next write instead of writing it alone (rmu held): when an ACK is all
// it owes, the ACK goes into the output queue, where the application's
// next post takes it along (PostSend's writev carries both, one system
// call instead of two: a ping-pong answers every message). Once only: the
// next poller writes it whatever happens (it finds the output queue not
// empty), and so does the lease keeper at its next look if nobody
// polled the link meanwhile (checkLease), or the reader once its lease
// ends. Once a post has taken it, the
// next ACK may wait again (a flag that stayed set until the next flush
// made every other ACK of a ping-pong go alone).
func (l *link) deferAck() bool {
	if !l.leased.Load() {
		return false // the reader waits for input and would not write it
	}
	r := l.resp
	if !r.Pending(true) || r.Pending(false) {
		return false // nothing owed, or more than an ACK
	}
	d := l.d
	d.mu.Lock()
	only := l.out.queuedLocked() == 0 && (l.req == nil || l.req.Unsent() == 0)
	d.mu.Unlock()
	if !only {
		return false
	}
	l.drainResponses(true)
	l.owedFrames, l.owedBytes = 0, 0
	return true
}

// pollRead is a poller's non-blocking read into the buffer, of want
// bytes at least if there is room (room); got is false when nothing came
// (an error or the end of the stream is left to the link goroutine, which
// the poller kicks), short when the read did not fill the room it had.
func (l *link) pollRead(want int) (got, short bool) {
	if l.rpos > 0 && len(l.rbuf)-l.rend < len(l.rbuf)/2 {
		// Room for what follows.
		copy(l.rbuf, l.rbuf[l.rpos:l.rend])
		l.rend -= l.rpos
		l.rpos = 0
	}
	if l.rend == len(l.rbuf) {
		return false, false
	}
	b := l.room(want)
	n, err := l.tryRead(b)
	if err != nil {
		if err != sys.ErrAgain {
			// The end of the stream or a broken connection: the link
			// goroutine's to handle, now (it sleeps leased while the
			// application polls, and a poll of the link renews the lease).
			l.kickLocked()
		}
		return false, false
	}
	l.rend += n
	l.owedBytes += n
	l.progress.Add(1)
	return true, n < len(b)
}

// kickLocked hands the read side to the link goroutine (rmu held): a
// poller leaves it work that it must do at once, which no input may
// announce (the output stall, the end of the link). The link goroutine is woken
// from either of its waits: a read deadline in the past ends a wait for
// input, rwake a sleep; pollers keep off until it has taken over.
func (l *link) kickLocked() {
	if l.kicked {
		return
	}
	l.kicked = true
	l.handover.Store(true)
	l.conn.SetReadDeadline(aLongTimeAgo)
	l.wakeReader()
}

var aLongTimeAgo = time.Unix(1, 0)

// idle is the link goroutine between frames with less than a header
// buffered (rmu held): it reads what is there, or else writes what it
// owes, busy-polls (Options.TCPBusyPoll) unless the application polls,
// and then lets go of rmu and waits until the socket is readable or a
// poller kicks it. It returns nil when there may be more to do.
func (l *link) idle() error {
	if l.rpos > 0 {
		copy(l.rbuf, l.rbuf[l.rpos:l.rend])
		l.rend -= l.rpos
		l.rpos = 0
	}
	// The read that took the end of the last payload took all there
	// was (place): the first look below would find nothing.
	drained := l.drained
	l.drained = false
	var n int
	var err error
	if l.busyPoll == 0 && !pollersOnly.Load() {
		// No pollers: the read side stays ours while we wait. A first
		// read only decides whether what is owed goes now (nothing
		// there) or coalesces with more (input there); owing nothing,
		// readWait's own first read does.
		err = sys.ErrAgain
		if !drained && l.owes() {
			n, err = l.tryRead(l.room(headerLen))
		}
		if err == sys.ErrAgain {
			l.flushOwed()
			n, err = l.readWait(l.room(headerLen))
		}
	} else {
		err = sys.ErrAgain
		if !drained {
			n, err = l.tryRead(l.room(headerLen))
		}
		if err == sys.ErrAgain {
			l.flushOwed()
			n, err = l.idleSpin()
		}
	}
	if err == nil {
		l.rend += n
		l.owedBytes += n
		l.progress.Add(1)
		return nil
	}
	if err != sys.ErrAgain {
		return err
	}
	l.rmu.Unlock()
	if err := l.await(); err != nil {
		return err
	}
	if l.kicked {
		l.kicked = false
		l.handover.Store(false)
		return l.conn.SetReadDeadline(time.Time{})
	}
	return nil
}

// readWait is the link goroutine's wait for input when busy polling is
// off (Options.TCPBusyPoll 0): no poller ever takes the read side then
// (Progress does nothing), so it waits with rmu held and reads in the
// same step: one read on the socket's readiness instead of a readiness
// peek, a return to the read loop and a read (an arriving message cost
// two peeks and a read more: the transfer engine, whose links do not busy
// poll, measured 10-15% more GETs of 256 KiB with one client). The read
// is made inside the RawConn callback, after the wait's readiness was
// reset, so that no arrival between the attempt and the wait is missed.
// It returns what tryRead would; never sys.ErrAgain.
func (l *link) readWait(b []byte) (int, error) {
	l.setLowat(false)
	l.tryBuf, l.tryN, l.tryErr = b, 0, nil
	err := l.raw.Read(l.readWaitFn)
	l.tryBuf = nil
	return l.tryResult(err)
}

// owes reports whether flushOwed may have something to write: responses
// the responder engine holds, responses queued and not yet taken into a
// batch, requests not yet transmitted. (A batch being written belongs to
// the busy token's holder, who writes it whole and looks for more; flush
// would leave it alone.)
func (l *link) owes() bool {
	if l.resp.Pending(true) {
		return true
	}
	d := l.d
	o := &l.out
	d.mu.Lock()
	owes := o.rTaken < o.rTail ||
		(l.req != nil && (l.req.Unsent() > 0 || l.posted < l.qp.SendTail()))
	d.mu.Unlock()
	return owes
}

// rawReadWait is the syscall.RawConn Read callback of readWait: false
// (wait for readiness) while a read would block.
func (l *link) rawReadWait(fd uintptr) bool {
	l.tryN, l.tryErr = sys.Read(int(fd), l.tryBuf)
	return l.tryErr != sys.ErrAgain
}

// idleSpin busy-polls for input between frames, unless the application
// polled since the reader was last idle or does meanwhile: then it is the
// one to find the input, and a second spinning thread only takes its CPU.
func (l *link) idleSpin() (int, error) {
	if l.busyPoll == 0 || l.appActive() {
		return 0, sys.ErrAgain
	}
	p := l.polled.Load()
	n, err := 0, error(sys.ErrAgain)
	if spinning.Add(1) <= maxSpinning {
		l.setLowat(true) // the spin finds the input: no thread need wake for it
		d := l.spinFor()
		n, err = l.spin(l.room(headerLen), &p, d, d != l.busyPoll)
	}
	spinning.Add(-1)
	return n, err
}

// spinFor is how long idleSpin polls: busyPoll, but at least
// unpolledSpin on a link the application has not polled for maxIdle when
// busyPoll is that short (the transfer engine's 1 µs, whose target side
// nobody polls): with several clients the next request comes within
// microseconds, and a reader that parks for it in the network poller is
// woken only when a processor is free of the pollers (rdmakit transfer
// bench, 256 KiB Reads, 8 threads in one process, 2 shared cores).
// Busy polls under a microsecond (coll's 1 ns: ranks that outnumber the
// cores need the CPU back at once) are kept as they are. The longer spin
// yields to the process's other goroutines (runtime.Gosched), as the
// engine's pollers do (goYield), not the thread to the system's
// (sched_yield): where the clients run in the same process (kv bench: 8
// clients and the store node) their goroutines get the processor without
// a switch of threads; a client in another process waits at most for
// NumCPU/2 such spins (maxSpinning) of 20 µs.
func (l *link) spinFor() time.Duration {
	if l.busyPoll >= unpolledSpin || l.busyPoll < time.Microsecond {
		return l.busyPoll
	}
	now := time.Since(l.epoch)
	if p := l.polled.Load(); p != l.idlePolled {
		l.idlePolled, l.idlePolledAt = p, now
		return l.busyPoll
	}
	if now-l.idlePolledAt < maxIdle {
		return l.busyPoll
	}
	return unpolledSpin
}

// unpolledSpin is spinFor's spin on a link nobody polls.
const unpolledSpin = 20 * time.Microsecond

// appActive reports whether the application polls this link's CQs: it
// did since the reader last looked, or within appLease of then, and has
// not gone to sleep in CQ.Wait since (Sleep).
func (l *link) appActive() bool {
	if pollersOnly.Load() {
		return true
	}
	if l.busyPoll == 0 || l.appAsleep.Load() {
		return false
	}
	if p := l.polled.Load(); p != l.lastPolled {
		l.lastPolled = p
		l.appSeen = time.Now()
		return true
	}
	return time.Since(l.appSeen) < appLease
}

// appLease is how long after the reader last saw the application poll it
// leaves the socket to the application's polls. A thread the operating
// system preempts polls nothing for a while, which must not look like an
// application that stopped; one that goes to sleep in CQ.Wait says so
// (Sleep); one that stops polling otherwise has its input read by the
// reader again later: the lease keeper looks at the leased links every
// appLease and ends the lease of one not polled since its previous look
// once the application has polled none of the context's CQs for
// stopAfter. While it polls some, a link it
// does not poll keeps its lease for up to maxIdle:
// with many links, each is polled now and then only (a collective over tcp
// waits for one peer at a time), and a reader that takes over reads
// every message with a wake-up of its own (8-rank AllReduce 8 B over tcp
// on a 2-core host: 1500-2100 µs and 310-350 thousand context switches
// per 510 calls when each link's lease ended 200-400 µs after its last
// poll, 420-520 µs and 60-80 thousand with 6.4 ms). An application that
// polls one CQ and expects another's links to make progress by
// themselves (it spins on memory for their writes) waits that long.
const (
	appLease = 200 * time.Microsecond
	maxIdle  = 32 * appLease
)

// stopAfter is how long the lease keeper's looks must find none of the
// context's CQs polled before it judges that the application stopped
// polling and ends the leases of the links not polled since its previous
// look. Not two looks (a look finding none since the one before): a
// process that was off the CPU for that long (ranks outnumbering the
// cores, each rank's process waiting its turn) could not poll, and did
// not stop. Judged by two looks, such a process's keeper ended the leases
// of readers whose application was still polling; each then took over
// and was woken by every message until the application's polls leased it
// again: 8-rank AllReduce 1 MiB over tcp on 2 cores took 11.4-21.7 ms
// against Open MPI's 4.3-5.4 ms, 4.96 ms when no look judged the
// application stopped (medians of 3 alternating launches,
// docs/benchmarks.md). Judging by the process's CPU time instead (it ran
// other work without polling) did not help there: the ranks' writer
// goroutines run while their pollers wait for a core. What a stopped
// application owes its peers (an ACK a poll left for its next post,
// deferAck) the keeper writes itself meanwhile (checkLease); input that
// comes for it waits until its next poll, CQ.Wait, or stopAfter.
const stopAfter = maxIdle / 2

// leaseKeeper (a goroutine per context with busy polling) ends the leases
// of readers whose application stopped polling their link (appLease). One
// timer for the context, not one per leased reader (a goroutine wake-up
// each); it ticks only while some reader is leased.
func (cd *ctxDriver) leaseKeeper() {
	defer cd.wg.Done()
	t := time.NewTimer(time.Hour)
	t.Stop()
	var active time.Time // the last look that saw a poll
	for {
		if cd.leasedN.Load() == 0 {
			select {
			case <-cd.leaseWake:
			case <-cd.done:
				return
			}
			active = time.Time{}
			continue
		}
		t.Reset(appLease)
		select {
		case <-t.C:
		case <-cd.done:
			t.Stop()
			return
		}
		if pollersOnly.Load() {
			continue
		}
		now := time.Now()
		p := cd.polls.Load()
		if p != cd.keeperPolls || active.IsZero() {
			active = now
		}
		cd.keeperPolls = p
		idle := now.Sub(active) >= stopAfter
		if ls := cd.pollers.Load(); ls != nil {
			for _, l := range *ls {
				l.checkLease(idle, now)
			}
		}
	}
}

// checkLease is the keeper's look at l at now (ctxIdle: the application
// has polled none of the context's CQs for stopAfter): a leased reader whose link has not
// been polled since the keeper's previous look is woken, its lease over,
// if the application stopped, or if the link has not been polled for
// maxIdle. (Time, not looks: a timer of 200 µs fires every millisecond or
// so on a busy host.) Output queued on such a link that stays leased (the
// ACK a poll left for the next post, deferAck) the keeper writes itself,
// so that the peer's completion does not wait for the lease to end.
func (l *link) checkLease(ctxIdle bool, now time.Time) {
	p := l.polled.Load()
	if p != l.keeperSeen || !l.leased.Load() {
		l.keeperSeen, l.keeperSince = p, now
		return
	}
	if !ctxIdle && now.Sub(l.keeperSince) < maxIdle {
		if l.outQueued() {
			l.flush()
		}
		return
	}
	l.keeperSince = now
	l.leaseOver.Store(true)
	l.wakeReader()
}

// outQueued reports whether responses are queued for the link that no
// batch has taken yet (any goroutine): what a flush would write. Those
// the writer is still sending are its own.
func (l *link) outQueued() bool {
	d := l.d
	d.mu.Lock()
	q := l.out.pendingResp()
	d.mu.Unlock()
	return q
}

// pollersOnly makes readers leave all input between frames to pollers
// (they wake for kicks and Close only). For tests.
var pollersOnly atomic.Bool

// await waits, without rmu, until there may be work for the link
// goroutine, and takes rmu again. While the application polls, it sleeps
// (until the lease keeper, Sleep or a kick wakes it) and leaves the
// socket alone: a reader waiting in the network poller would be woken by
// every message and would take the CPU from the very thread that polls.
// Otherwise it waits until the socket is readable.
func (l *link) await() error {
	for {
		if l.handover.Load() {
			l.rmu.Lock() // the kicking poller lets go at once; others keep off
			return nil
		}
		if l.appActive() {
			l.setLowat(true)
			cd := l.d.cd
			l.leaseOver.Store(false)
			l.leased.Store(true)
			if cd.leasedN.Add(1) == 1 {
				select {
				case cd.leaseWake <- struct{}{}:
				default:
				}
			}
			<-l.rwake
			cd.leasedN.Add(-1)
			l.leased.Store(false)
			if l.leaseOver.Swap(false) {
				// The keeper saw no poll of the link for a while: the
				// application is not active, whatever polled says.
				l.lastPolled = l.polled.Load()
				l.appSeen = time.Time{}
			}
		} else if err := l.waitInput(); err != nil && !os.IsTimeout(err) {
			l.rmu.Lock()
			return err // closed
		}
		if l.handover.Load() {
			continue
		}
		if l.rmu.TryLock() {
			return nil
		}
		// A poller has the read side: it reads what there is and does
		// not wait for us. While the application polls, sleep on; else
		// take over once the poller is done (idle then writes what it
		// may have left owed, deferAck) rather than wait for input.
		if !l.appActive() {
			l.rmu.Lock()
			return nil
		}
	}
}

// waitInput waits until the socket is readable (the reader, without
// rmu).
func (l *link) waitInput() error {
	l.setLowat(false)
	return l.raw.Read(l.waitFn)
}

// setLowat (the reader only) raises the socket's SO_RCVLOWAT while the
// reader leaves input to pollers, and lowers it again to 1 before the
// reader waits for input. Raised, arriving data does not make the socket
// readable, so it wakes no thread of this process: Go's network poller
// has every socket of the process in one epoll set, edge-triggered, and
// a thread of the runtime waits in epoll_wait whenever a processor is
// idle, so each message would otherwise wake a thread beside the one that
// polls (about 10 µs of a ping-pong's 20 on a 2-core host). Pollers read
// without waiting, which SO_RCVLOWAT does not affect; the end of the
// stream and errors still wake.
func (l *link) setLowat(high bool) {
	if high {
		l.setLowatN(math.MaxInt32)
	} else {
		l.setLowatN(1)
	}
}

// setLowatN sets SO_RCVLOWAT to n unless it is n already (the reader
// only). Every wait for input sets the value it needs first: 1 between
// frames, the rest of a payload chunk in the middle of one
// (readDirectPinned), the maximum while pollers read.
func (l *link) setLowatN(n int) {
	if l.lowat == n {
		return
	}
	l.lowat = n
	l.raw.Control(l.lowatFn)
}

func (l *link) rawLowat(fd uintptr) { sys.SetRcvLowat(int(fd), l.lowat) }

// Sleep is soft.Progresser: a waiter on cq is about to sleep in CQ.Wait,
// so progress is up to the readers again. It wakes those that leave the
// socket to the application's polls.
func (cd *ctxDriver) Sleep(cq *soft.CQ) {
	if cd.busyPoll == 0 {
		return
	}
	ls := cd.pollers.Load()
	if ls == nil {
		return
	}
	for _, l := range *ls {
		if s, r := l.qp.CQs(); s == cq || r == cq {
			l.appAsleep.Store(true)
			l.wakeReader()
		}
	}
}

// wakeReader wakes the reader from a sleep in await.
func (l *link) wakeReader() {
	select {
	case l.rwake <- struct{}{}:
	default:
	}
}

// rawWait is the syscall.RawConn Read callback of idle: true once a read
// would not block; it reads nothing.
func (l *link) rawWait(fd uintptr) bool { return sys.Readable(int(fd)) }
