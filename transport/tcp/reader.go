package tcp

// The reader: the loop of the link goroutine once connected. It parses
// frames from a buffer, feeds requests to the responder engine (l.resp,
// this goroutine's alone) and executes what it says against the Target,
// and feeds responses to the requester engine (l.req, under d.mu) and
// carries out its actions. Everything here runs on the link goroutine; it
// takes d.mu only to queue responses and to step the requester, and never
// blocks on a write.

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

func readFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

// readLoop parses and handles frames. Output the reader owes (ACKs,
// responses, requests its completions let go) is flushed when it would
// block for input, and at the latest every flushFrames frames or
// flushBytes bytes: a busy stream gets coalesced ACKs, an idle one gets
// them at once. Between frames, with nothing buffered, it waits in idle,
// where pollers may take over (poll.go).
func (l *link) readLoop() error {
	var f frame
	for {
		if l.perr != nil {
			return l.perr
		}
		if l.stall {
			if err := l.awaitOutput(); err != nil {
				return err
			}
		}
		if l.owedFrames >= flushFrames || l.owedBytes >= flushBytes {
			l.flushOwed()
		}
		if l.pl.active {
			// A poller moved part of a payload: the rest is ours.
			if err := l.runPayload(); err != nil {
				return err
			}
			continue
		}
		if l.rend-l.rpos < headerLen {
			if err := l.idle(); err != nil {
				return err
			}
			continue
		}
		h, err := parseHeader(l.rbuf[l.rpos:l.rend])
		if err != nil {
			return l.protocolError(err)
		}
		h.decode(&f)
		if err := l.handleFrame(&f); err != nil {
			return err
		}
	}
}

// handleFrame handles the frame whose header (decoded into f) is next in
// the buffer.
func (l *link) handleFrame(f *frame) error {
	l.rpos += headerLen
	if f.op.hasPayload() && f.length >= capAfter {
		l.bigRun = capFrames
	} else if l.bigRun > 0 {
		l.bigRun--
	}
	l.owedFrames++
	if f.op == opReadReq {
		l.owedBytes += int(f.length) // we owe the data
	}
	if f.op.isRequest() {
		return l.handleRequest(f)
	}
	return l.handleResponse(f)
}

func (l *link) flushOwed() {
	l.owedFrames, l.owedBytes = 0, 0
	l.drainResponses(true)
	l.flush()
}

// drainResponses moves the responder engine's responses to the output
// queue; with acks false a trailing ACK stays in the engine, where later
// ones coalesce with it.
func (l *link) drainResponses(acks bool) {
	r := l.resp
	if !r.Pending(acks) {
		return
	}
	d := l.d
	p := &l.pkt
	d.mu.Lock()
	for r.NextResponse(p, acks) {
		f := frame{op: opcode(p.Op), psn: p.PSN, syndrome: uint8(p.Syn), rnrTimer: p.RNRTimer}
		var data []byte
		var pin keytab.Pin
		switch p.Op {
		case rcproto.OpReadResp:
			f.length = p.Len
			if p.Len > 0 {
				f.flags = flagStatus
			}
			data, l.rdMem = l.rdMem, nil
			pin, l.rdPin = l.rdPin, keytab.Pin{}
		case rcproto.OpAtomicResp:
			f.compare = p.Value
		}
		l.queueLocked(&f, data, pin)
	}
	if l.out.queuedLocked() >= maxQueuedResp {
		l.stall = true
	}
	d.mu.Unlock()
}

// awaitOutput stops reading requests while maxQueuedResp responses are
// queued: it waits until the peer has read half of them. A peer that
// reads nothing for timeout×(retry_cnt+1) (at least a second; the connect
// timeout when the QP's timeout is infinite) is disconnected rather than
// buffered: the link ends with errStalled, which fails outstanding work
// requests with RetryExceeded.
func (l *link) awaitOutput() error {
	l.flushOwed()
	a := l.qp.Config()
	limit := max(connectLimit(a.Timeout, a.RetryCount), minConnectTimeout)
	deadline := time.Now().Add(limit)
	d := l.d
	wake := time.AfterFunc(limit, func() {
		d.mu.Lock()
		l.cond.Broadcast()
		d.mu.Unlock()
	})
	defer wake.Stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	l.out.waiting = true
	defer func() { l.out.waiting = false }()
	for l.out.queuedLocked() >= maxQueuedResp/2 {
		if l.stopped || l.out.broken {
			return errStopped
		}
		if !time.Now().Before(deadline) {
			return errStalled
		}
		l.cond.Wait()
	}
	l.stall = false
	return nil
}

// Busy polling (Options.TCPBusyPoll): a reader with nothing to read keeps
// trying non-blocking reads for up to busyPoll before it parks in the
// network poller, so that a message arriving soon after the last one is
// handled without a thread wake-up (tens of microseconds on a busy host,
// more than the whole round trip). Every empty attempt is followed by a
// sched_yield, which lets other runnable threads (the application's
// spinning poller, the peer process) have the core: on a host with fewer
// cores than spinners, yielding less often measured slower (2-core host:
// send_lat 8 B 23 µs yielding every attempt, 29 µs every 8th, 45 µs every
// 64th). The clock is read every clockEvery attempts.
const clockEvery = 8

// read reads into b what is there, or else flushes what is owed, polls
// for up to busyPoll, and waits. It is the reader's read in the middle of
// a frame (idle is the one between frames).
func (l *link) read(b []byte) (int, error) {
	if n, err := l.tryRead(b); err != sys.ErrAgain {
		return n, err
	}
	l.flushOwed()
	if l.busyPoll > 0 {
		n, err, ok := 0, sys.ErrAgain, spinning.Add(1) <= maxSpinning
		if ok {
			n, err = l.spin(b, nil, l.busyPoll, false)
		}
		spinning.Add(-1)
		if err != sys.ErrAgain {
			return n, err
		}
	}
	l.setLowat(false)
	return l.conn.Read(b)
}

// spinning counts the readers of this process busy-polling now; at most
// maxSpinning do (one per two CPUs, at least one), the others sleep at
// once: a process with many connections (a collective over tcp has one
// per peer and channel) would otherwise keep more threads spinning than
// there are cores, starving the ones with work (8 ranks on 2 cores,
// AllReduce 1 MiB over tcp: 41 ms with every reader spinning, 10-13 ms
// with none). A spinning reader also holds a Go processor, and Go's
// network poller runs only on an idle one: while the other processors
// are busy too (a goroutine spinning on a CQ, another reader), input on
// any other socket of the process (another QP, an RPC connection) waits
// for the spin to end. The transfer engine, whose processes have several
// sockets and whose waiters sleep, turns it off for that reason (an
// 8-byte Read between two nodes of one process: 110-160 µs with 50 µs of
// polling, about 25 µs without, 2 cores).
var (
	spinning    atomic.Int32
	maxSpinning = int32(max(1, runtime.NumCPU()/2))
)

// spin polls for up to d, or until the application polls (polled
// moves; with polled nil it is not watched), yielding after every empty
// attempt: the thread (sys.Yield), or with goYield the goroutine first
// (yieldGo; idleSpin's spin on a link nobody polls). It returns
// what tryRead returned last: sys.ErrAgain when it read nothing.
func (l *link) spin(b []byte, polled *uint64, d time.Duration, goYield bool) (int, error) {
	deadline := time.Now().Add(d)
	for i := 1; ; i++ {
		if n, err := l.tryRead(b); err != sys.ErrAgain {
			return n, err
		}
		if polled != nil && l.polled.Load() != *polled {
			return 0, sys.ErrAgain
		}
		if i%clockEvery == 0 && !time.Now().Before(deadline) {
			return 0, sys.ErrAgain
		}
		if goYield {
			yieldGo()
		} else {
			sys.Yield()
		}
	}
}

// tryRead is one non-blocking read into b (len(b) > 0): sys.ErrAgain when
// nothing is there, io.EOF at the end of the stream. It goes through the
// connection's Control, not its Read: a reader parked in Read (idle)
// holds the descriptor's read lock, and a poller must not wait for it.
func (l *link) tryRead(b []byte) (int, error) {
	l.tryBuf, l.tryN, l.tryErr, l.drained = b, 0, nil, false
	err := l.raw.Control(l.readFn)
	l.tryBuf = nil
	return l.tryResult(err)
}

// tryResult is the outcome of a read made in a RawConn callback (tryN,
// tryErr), err the RawConn call's own.
func (l *link) tryResult(err error) (int, error) {
	switch {
	case err != nil:
		return 0, err
	case l.tryErr != nil:
		return 0, l.tryErr
	case l.tryN == 0:
		return 0, io.EOF
	}
	return l.tryN, nil
}

// rawRead is the syscall.RawConn Control callback of tryRead (a readv
// into tryBuf and tryAfter when tryAfter is set: tryReadPinned).
func (l *link) rawRead(fd uintptr) {
	l.tryN, l.tryErr = sys.Read2(int(fd), l.tryBuf, l.tryAfter)
}

// readDirectPinned is one read from the socket straight into seg under
// pin: a non-blocking attempt; if nothing is there, what is owed is
// flushed and the reader waits for input with no buffer given to the
// kernel, checking the key again before each attempt. It does not
// busy-poll: in the middle of a large payload the sender is streaming, and
// a spinning reader only takes CPU from it (tcp0 write_bw 1 MiB and
// read_bw 64 KiB measured 0.6-0.7x with the spin on a 2-core host); one
// wake-up is cheap against a large read. It waits for all of seg, not
// for a byte (SO_RCVLOWAT len(seg), which the kernel caps by the receive
// buffer; the end of the stream and errors still wake): the rest of a
// payload is on its way, and a reader woken for each part that arrives
// costs a wake-up and a read each (tcp0 RDMA Read 256 KiB: 3 or 4 waits
// per Read, each a thread wake-up on a 2-core host).
//
// What follows seg in the stream goes into after, if anything is there
// once seg is (place); the count returned includes it.
func (l *link) readDirectPinned(seg, after []byte, tab keytab.Table, pin keytab.Pin) (int, error) {
	l.tryBuf, l.tryAfter, l.ptab, l.pin = seg, after, tab, pin
	defer func() { l.tryBuf, l.tryAfter, l.ptab, l.pin = nil, nil, keytab.Table{}, keytab.Pin{} }()
	for wait := false; ; wait = true {
		l.tryN, l.tryErr, l.pinWait, l.pinLost = 0, nil, wait, false
		if err := l.raw.Read(l.readPinFn); err != nil {
			return 0, err
		}
		switch {
		case l.pinLost:
			return 0, errDeregistered
		case l.tryErr == sys.ErrAgain:
			l.flushOwed()
			if l.lowat == 1 || l.lowat > len(seg) {
				// Any mark up to len(seg) is safe (that much is still to
				// come); one set for an earlier part of the payload
				// stays, a system call saved per partial read.
				l.setLowatN(len(seg))
			}
			continue
		case l.tryErr != nil:
			return 0, l.tryErr
		case l.tryN == 0:
			return 0, io.EOF
		}
		return l.tryN, nil
	}
}

// rawReadPinned is the syscall.RawConn callback of readDirectPinned.
func (l *link) rawReadPinned(fd uintptr) bool {
	if !l.ptab.EnterOpt(l.pin) {
		l.pinLost = true
		return true
	}
	l.tryN, l.tryErr = sys.Read2(int(fd), l.tryBuf, l.tryAfter)
	l.ptab.LeaveOpt(l.pin)
	return !(l.pinWait && l.tryErr == sys.ErrAgain)
}

// protocolError fails the QP: the peer sent something that makes no sense.
func (l *link) protocolError(err error) error {
	d := l.d
	d.mu.Lock()
	if l.failSt == verbs.StatusSuccess {
		l.failSt = verbs.StatusBadResponse
	}
	l.failQP = true
	d.mu.Unlock()
	return err
}

// room is where the next read into the buffer goes, when want bytes from
// rpos on are needed: the free end of the buffer; but within capFrames
// frames of a large payload (bigRun), only up to capRead bytes from rpos
// on (or want, if more). The next frame's payload is then likely
// large too, and what of it a read puts into the buffer is copied once
// more, while the rest of it goes straight into place (payload.go): a
// capped read takes the next header (and the ACKs before it) and little
// of the payload. (tcp0 RDMA Read of 256 KiB: the read that found the
// header took 64 KiB of the payload with it.)
func (l *link) room(want int) []byte {
	b := l.rbuf[l.rend:]
	if l.bigRun > 0 {
		if c := l.rpos + max(want, capRead) - l.rend; c > 0 && c < len(b) {
			b = b[:c]
		}
	}
	return b
}

// fill reads until at least n bytes are buffered.
func (l *link) fill(n int) error {
	if l.rpos > 0 {
		copy(l.rbuf, l.rbuf[l.rpos:l.rend])
		l.rend -= l.rpos
		l.rpos = 0
	}
	for l.rend < n {
		k, err := l.read(l.room(n))
		if k > 0 {
			l.rend += k
			l.owedBytes += k
			l.progress.Add(1)
		}
		if err != nil && l.rend < n {
			return err
		}
	}
	return nil
}

// handleRequest feeds a request to the responder engine and executes it
// if the engine says so: it decides sequence (in order, duplicates, RNR
// waits) and which NAK answers a failure; the Target checks keys, access
// and bounds, and the payload goes into place (payload.go).
//
// A request reaching a QP that is no longer in RTR/RTS is dropped, and so
// is everything after; the connection is closed with the transition, so
// the requester fails with RetryExceeded.
func (l *link) handleRequest(f *frame) error {
	n := int(f.length)
	pay := 0
	if f.op.hasPayload() {
		pay = n
	}
	if l.dropAll {
		return l.startSkip(pay, finNone, 0)
	}
	r := l.resp
	p := &l.pkt
	*p = rcproto.Packet{Op: rcproto.Opcode(f.op), Seg: rcproto.SegOnly, PSN: f.psn, Len: f.length}
	r.Hold(int(l.rdHeld.Load()))
	if r.Step(p) == rcproto.Drop {
		if r.Failed() {
			// The engine NAKed it as fatal by itself (an invalid request:
			// beyond max_dest_rd_atomic, out of order within a message).
			return l.startSkip(pay, finFail, 0)
		}
		l.drainResponses(false)
		return l.startSkip(pay, finNone, 0)
	}
	t := l.t
	if !t.Accepting() {
		l.dropAll = true
		return l.startSkip(pay, finNone, 0)
	}
	var res rcproto.Result
	switch f.op {
	case opWrite, opWriteImm:
		m, pin, st := t.RemotePin(&l.keys, f.rkey, f.raddr, n, rc.AccessRemoteWrite)
		if st != rc.Success {
			res.Status = st
			break
		}
		if f.op == opWriteImm && !t.PopRecv(&l.wqe) {
			res.Status, res.RNRTimer = rc.RNR, t.MinRNR()
			break
		}
		fin := finWrite
		if f.op == opWriteImm {
			fin = finWriteImm
		}
		pl := &l.pl
		pl.one[0], pl.onePin[0] = m, pin
		return l.startPayload(f, fin, pl.one[:], pl.onePin[:], t.Keys(), nil)
	case opSend, opSendImm:
		if !t.PopRecv(&l.wqe) {
			res.Status, res.RNRTimer = rc.RNR, t.MinRNR()
			break
		}
		k, st := t.ScatterRecvPin(&l.wqe, n, l.segs[:], l.rpins[:])
		if st != rc.Success {
			return l.startSkip(pay, finRecvFail, st)
		}
		return l.startPayload(f, finSend, l.segs[:k], l.rpins[:k], t.Keys(), nil)
	case opReadReq:
		m, pin, st := t.RemotePin(&l.keys, f.rkey, f.raddr, n, rc.AccessRemoteRead)
		res.Status = st
		l.rdMem, l.rdPin = m, pin
	case opCmpSwap, opFetchAdd:
		m, pin, st := t.AtomicPin(f.rkey, f.raddr)
		if st != rc.Success {
			res.Status = st
			break
		}
		if !t.Enter(pin) {
			res.Status = rc.RemoteAccess
			break
		}
		if f.op == opCmpSwap {
			res.Value = sys.CompareSwap64(m, 0, f.compare, f.swap)
		} else {
			res.Value = sys.FetchAdd64(m, 0, f.compare)
		}
		t.Leave(pin)
	}
	return l.answer(res, pay)
}

// lostRecv completes the receive a message was going into when the
// connection broke mid-payload: it was taken from the queue, so no flush
// will find it, and its data is incomplete.
func (l *link) lostRecv() {
	t := l.t
	t.Complete(&rc.WC{WRID: l.wqe.WRID, Status: rc.WRFlush, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: l.peer.qpn})
}

// recvFailed handles a receive that cannot take a message: the receive
// completes with st (LocalLength or LocalProtection), the receiving QP
// goes to ERROR, the requester is NAKed (invalid request or remote
// operation error), and the connection is closed in order so that the
// NAK reaches it.
func (l *link) recvFailed(st rc.Status) error {
	t := l.t
	t.Complete(&rc.WC{WRID: l.wqe.WRID, Status: st, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: l.peer.qpn})
	res := rcproto.Result{Status: rc.RemoteOperation}
	if st == rc.LocalLength {
		res.Status = rc.RemoteInvalidReq
	}
	l.resp.Done(res)
	return l.failResponder()
}

// failResponder sends what the responder engine owes (the fatal NAK last)
// and moves our QP to ERROR with its receives flushed; the link goroutine
// then closes the connection in order (errLinger, linger) so that the NAK
// reaches the requester.
func (l *link) failResponder() error {
	t := l.t
	d := l.d
	l.drainResponses(true)
	d.mu.Lock()
	l.detached = true
	l.lingering = true
	t.Fail(!d.srq)
	l.qp.Fail()
	d.mu.Unlock()
	return errLinger // the link goroutine lingers (run)
}

// linger writes what is queued, half-closes the connection and waits
// (bounded) for the peer to close its side, so that no reset destroys
// the last frames.
func (l *link) linger() {
	d := l.d
	deadline := time.Now().Add(lingerTimeout)
	l.conn.SetWriteDeadline(deadline)
	l.flush()
	d.mu.Lock()
	for (l.out.busy || l.out.pendingResp()) && !l.out.broken && !l.stopped {
		l.cond.Wait()
	}
	d.mu.Unlock()
	l.conn.CloseWrite()
	l.conn.SetReadDeadline(deadline)
	for {
		l.rpos, l.rend = 0, 0
		if err := l.fill(1); err != nil {
			break
		}
	}
	d.mu.Lock()
	l.lingering = false
	l.stopLocked()
	d.mu.Unlock()
}

// handleResponse feeds a response to the requester engine and carries out
// its actions; READ data goes straight into the work request's buffer
// (payload.go).
func (l *link) handleResponse(f *frame) error {
	d := l.d
	pay := 0
	if f.op.hasPayload() {
		pay = int(f.length)
	}
	trailer := f.op == opReadResp && f.flags&flagStatus != 0
	if trailer {
		pay += trailerLen
	}
	d.mu.Lock()
	if l.detached || l.stopped {
		d.mu.Unlock()
		return errStopped
	}
	if l.req == nil {
		d.mu.Unlock()
		return l.protocolError(fmt.Errorf("%w: %s before RTS", errProtocol, f.op))
	}
	p := rcproto.Packet{Op: rcproto.Opcode(f.op), Seg: rcproto.SegOnly, PSN: f.psn, Syn: rcproto.Syndrome(f.syndrome),
		RNRTimer: f.rnrTimer, Len: f.length, Value: f.compare}
	// Entries posted meanwhile first: the engine knows only what it was given.
	if !l.postLocked() {
		d.mu.Unlock()
		return errStopped
	}
	now := l.now()
	place, ok := l.applyLocked(l.req.Step(&p, now))
	if !ok {
		d.mu.Unlock()
		return errStopped
	}
	if place.Kind == 0 {
		d.mu.Unlock()
		return l.startSkip(pay, finNone, 0)
	}
	// Only the read side's holder completes entries, and a transition
	// that flushes them waits for the link goroutine to exit: the entry
	// stays ours while its data comes in, over several polls if need be.
	e := l.qp.SendEntry(place.WR)
	d.mu.Unlock()
	if int(place.Off)+int(place.Len) != e.Len || int(f.length) != int(place.Len) {
		return l.protocolError(fmt.Errorf("%w: READ_RESP of %d bytes for a READ of %d", errProtocol, f.length, e.Len))
	}
	// The local buffer is written under its key's in-use count, as
	// target memory is: deregistered on the way, the rest of the data is
	// discarded and the READ fails with LocalProtection.
	var tail []byte
	if trailer {
		tail = l.trailer[:]
	}
	return l.startPayload(f, finReadResp, e.Local, e.Pins, l.ltab, tail)
}
