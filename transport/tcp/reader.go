package tcp

// The reader: the loop of the link goroutine once connected. It parses
// frames from a buffer, runs the responder for requests and completes send
// entries for responses. Everything here runs on the link goroutine; it
// takes d.mu only to queue responses and to complete work requests, and
// never blocks on a write.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

func readFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

// readLoop parses and handles frames. Output the reader owes (ACKs,
// responses, requests its completions let go) is flushed when it would
// block for input, and at the latest every flushFrames frames or
// flushBytes bytes: a busy stream gets coalesced ACKs, an idle one gets
// them at once.
func (l *link) readLoop() error {
	var f frame
	for {
		if l.owedFrames >= flushFrames || l.owedBytes >= flushBytes {
			l.flushOwed()
		}
		if l.rend-l.rpos < headerLen {
			if err := l.fill(headerLen); err != nil {
				return err
			}
		}
		h, err := parseHeader(l.rbuf[l.rpos:l.rend])
		if err != nil {
			return l.protocolError(err)
		}
		h.decode(&f)
		l.rpos += headerLen
		l.owedFrames++
		if f.op == opReadReq {
			l.owedBytes += int(f.length) // we owe the data
		}
		if f.op.isRequest() {
			err = l.handleRequest(&f)
		} else {
			err = l.handleResponse(&f)
		}
		if err != nil {
			return err
		}
	}
}

func (l *link) flushOwed() {
	l.owedFrames, l.owedBytes = 0, 0
	l.flush()
}

// read reads into b what is there, or else flushes what is owed and waits.
func (l *link) read(b []byte) (int, error) {
	l.tryBuf, l.tryN, l.tryErr = b, 0, nil
	if err := l.raw.Read(l.readFn); err == nil && l.tryErr == nil && l.tryN > 0 {
		l.tryBuf = nil
		return l.tryN, nil
	}
	l.tryBuf = nil
	l.flushOwed()
	return l.conn.Read(b)
}

// rawRead is the syscall.RawConn callback of read: one attempt, no wait.
func (l *link) rawRead(fd uintptr) bool {
	l.tryN, l.tryErr = sys.Read(int(fd), l.tryBuf)
	return true
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

// fill reads until at least n bytes are buffered.
func (l *link) fill(n int) error {
	if l.rpos > 0 {
		copy(l.rbuf, l.rbuf[l.rpos:l.rend])
		l.rend -= l.rpos
		l.rpos = 0
	}
	for l.rend < n {
		k, err := l.read(l.rbuf[l.rend:])
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

// readInto reads the next n bytes of the stream into the scatter list dst
// (at least n bytes long): what is buffered is copied, large remainders are
// read from the socket straight into place.
func (l *link) readInto(dst [][]byte, n int) error {
	for _, seg := range dst {
		if n == 0 {
			break
		}
		if len(seg) > n {
			seg = seg[:n]
		}
		n -= len(seg)
		for len(seg) > 0 {
			if l.rend > l.rpos {
				c := copy(seg, l.rbuf[l.rpos:l.rend])
				l.rpos += c
				seg = seg[c:]
				continue
			}
			if len(seg) >= directRead {
				if l.owedBytes >= flushBytes {
					l.flushOwed() // a long payload: don't sit on what we owe
				}
				k, err := l.read(seg)
				if k > 0 {
					seg = seg[k:]
					l.owedBytes += k
					l.progress.Add(1)
				}
				if err != nil && len(seg) > 0 {
					return err
				}
				continue
			}
			if err := l.fill(1); err != nil {
				return err
			}
		}
	}
	if n != 0 {
		return fmt.Errorf("%w: %d bytes beyond the scatter list", errProtocol, n)
	}
	return nil
}

// discard skips the next n bytes of the stream.
func (l *link) discard(n int) error {
	for n > 0 {
		if l.rend > l.rpos {
			c := min(n, l.rend-l.rpos)
			l.rpos += c
			n -= c
			continue
		}
		if err := l.fill(1); err != nil {
			return err
		}
	}
	return nil
}

// handleRequest is the responder.
//
// Requests are executed in PSN order. After an RNR NAK, requests are
// dropped until the NAKed PSN comes again (the requester goes back to it).
// After a fatal NAK everything is dropped: the requester's QP goes to ERROR
// and closes the connection. A request reaching a QP that is no longer in
// RTR/RTS is dropped too; the connection is closed with the transition, so
// the requester fails with RetryExceeded.
func (l *link) handleRequest(f *frame) error {
	n := int(f.length)
	pay := 0
	if f.op.hasPayload() {
		pay = n
	}
	if l.dropAll {
		return l.discard(pay)
	}
	if f.psn != l.epsn {
		if l.rnrWait {
			return l.discard(pay)
		}
		// The two sides disagree on the PSN (SQPSN vs RQPSN).
		l.nak(f.psn, synSeqErr, 0)
		l.dropAll = true
		return l.discard(pay)
	}
	l.rnrWait = false
	t := l.t
	if !t.Accepting() {
		l.dropAll = true
		return l.discard(pay)
	}
	switch f.op {
	case opWrite, opWriteImm:
		m, st := t.RemoteCached(&l.keys, f.rkey, f.raddr, n, rc.AccessRemoteWrite)
		if st != rc.Success {
			return l.nakFatal(f.psn, st)
		}
		if f.op == opWriteImm && !t.PopRecv(&l.wqe) {
			l.rnrNak(f.psn)
			return l.discard(pay)
		}
		l.one[0] = m
		err := l.readInto(l.one[:], n)
		l.one[0] = nil
		if err != nil {
			return err
		}
		if f.op == opWriteImm {
			t.Complete(&rc.WC{WRID: l.wqe.WRID, Opcode: rc.WCRecvWriteImm, ByteLen: f.length, Imm: f.imm,
				Flags: rc.WCWithImm, QPN: t.QPN(), SrcQP: l.peer.qpn})
		}
		l.ack(f.psn)
	case opSend, opSendImm:
		if !t.PopRecv(&l.wqe) {
			l.rnrNak(f.psn)
			return l.discard(pay)
		}
		k, st := t.ScatterRecv(&l.wqe, n, l.segs[:])
		if st != rc.Success {
			if err := l.discard(pay); err != nil {
				return err
			}
			return l.recvFailed(f.psn, st)
		}
		err := l.readInto(l.segs[:k], n)
		clear(l.segs[:k])
		if err != nil {
			return err
		}
		wc := rc.WC{WRID: l.wqe.WRID, Opcode: rc.WCRecv, ByteLen: f.length, QPN: t.QPN(), SrcQP: l.peer.qpn}
		if f.op == opSendImm {
			wc.Imm, wc.Flags = f.imm, rc.WCWithImm
		}
		t.Complete(&wc)
		l.ack(f.psn)
	case opReadReq:
		m, st := t.RemoteCached(&l.keys, f.rkey, f.raddr, n, rc.AccessRemoteRead)
		if st != rc.Success {
			return l.nakFatal(f.psn, st)
		}
		l.respond(&frame{op: opReadResp, psn: f.psn, length: f.length}, m)
	case opCmpSwap, opFetchAdd:
		m, st := t.Atomic(f.rkey, f.raddr)
		if st != rc.Success {
			return l.nakFatal(f.psn, st)
		}
		var old uint64
		if f.op == opCmpSwap {
			old = sys.CompareSwap64(m, 0, f.compare, f.swap)
		} else {
			old = sys.FetchAdd64(m, 0, f.compare)
		}
		l.respond(&frame{op: opAtomicResp, psn: f.psn, compare: old}, nil)
	}
	l.epsn = l.epsn.add(1)
	return nil
}

func (l *link) ack(q psn) { l.respond(&frame{op: opAck, psn: q}, nil) }

func (l *link) nak(q psn, syn, timer uint8) {
	l.respond(&frame{op: opNak, psn: q, syndrome: syn, rnrTimer: timer}, nil)
}

// rnrNak tells the requester to retry q after our min_rnr_timer.
func (l *link) rnrNak(q psn) {
	l.nak(q, synRNR, l.t.MinRNR())
	l.rnrWait = true
}

// nakFatal refuses request q (access or bounds violation, invalid
// request): the requester completes it with the matching status and its
// QP goes to ERROR; so does ours, as the IBTA requires of a responder that
// sends these NAKs, and its receives are flushed.
func (l *link) nakFatal(q psn, st rc.Status) error {
	syn := synRemoteAccess
	switch st {
	case rc.RemoteInvalidReq:
		syn = synInvalidReq
	case rc.RemoteOperation:
		syn = synRemoteOp
	}
	return l.failResponder(q, syn)
}

// recvFailed handles a receive that cannot take a message: the receive
// completes with st (LocalLength or LocalProtection), the receiving QP
// goes to ERROR, the requester is NAKed, and the connection is closed in
// order so that the NAK reaches it.
func (l *link) recvFailed(q psn, st rc.Status) error {
	t := l.t
	t.Complete(&rc.WC{WRID: l.wqe.WRID, Status: st, Opcode: rc.WCRecv, QPN: t.QPN(), SrcQP: l.peer.qpn})
	syn := synRemoteOp
	if st == rc.LocalLength {
		syn = synInvalidReq
	}
	return l.failResponder(q, syn)
}

// failResponder moves our QP to ERROR after a fatal responder error (its
// receives flushed), NAKs request q with syn, and closes the connection
// in order so that the NAK reaches the requester.
func (l *link) failResponder(q psn, syn uint8) error {
	t := l.t
	d := l.d
	d.mu.Lock()
	l.detached = true
	l.lingering = true
	t.Fail(!d.srq)
	l.qp.Fail()
	l.queueLocked(&frame{op: opNak, psn: q, syndrome: syn}, nil)
	d.mu.Unlock()
	l.linger()
	return errStopped
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

// handleResponse is the requester's completion side.
func (l *link) handleResponse(f *frame) error {
	d := l.d
	qp := l.qp
	d.mu.Lock()
	if l.detached || l.stopped {
		d.mu.Unlock()
		return errStopped
	}
	if !l.rts {
		d.mu.Unlock()
		return l.protocolError(fmt.Errorf("%w: %s before RTS", errProtocol, f.op))
	}
	head := qp.SendHead()
	dist := f.psn.sub(l.psnOf(head))
	if dist < 0 || head+uint64(dist) >= l.next {
		d.mu.Unlock()
		return l.protocolError(fmt.Errorf("%w: %s for PSN %#x, outstanding from %#x", errProtocol, f.op, uint32(f.psn), uint32(l.psnOf(head))))
	}
	seq := head + uint64(dist)
	last := seq // entries before last are implicitly acknowledged
	if f.op == opAck {
		last = seq + 1
	}
	for qp.SendHead() < last {
		if e := qp.SendEntry(qp.SendHead()); e.WR.Opcode == verbs.OpRead || e.WR.Opcode.IsAtomic() {
			d.mu.Unlock()
			return l.protocolError(fmt.Errorf("%w: %s acknowledged without its response", errProtocol, e.WR.Opcode))
		}
		if !l.completeLocked() {
			d.mu.Unlock()
			return errStopped
		}
	}
	e := qp.SendEntry(seq)
	switch f.op {
	case opNak:
		if f.syndrome != synRNR {
			l.failHeadLocked(nakStatus(f.syndrome))
			d.mu.Unlock()
			return errStopped
		}
		if seq != l.rnrSeq {
			l.rnrSeq, l.rnrCount = seq, 0
		}
		if r := d.rnrRetry; r != 7 && l.rnrCount >= int(r) {
			l.failHeadLocked(verbs.StatusRNRRetryExceeded)
			d.mu.Unlock()
			return errStopped
		}
		l.rnrCount++
		l.next = seq // go back: the responder dropped everything after
		l.paused, l.probe, l.probeSeq = true, true, seq
		l.rnr.Reset(verbs.RNRTimerDuration(f.rnrTimer))
	case opReadResp:
		if e.WR.Opcode != verbs.OpRead || int(f.length) != e.Len {
			d.mu.Unlock()
			return l.protocolError(fmt.Errorf("%w: READ_RESP of %d bytes for %s of %d", errProtocol, f.length, e.WR.Opcode, e.Len))
		}
		d.mu.Unlock()
		// Only this goroutine completes entries, and a transition that
		// flushes them waits for it: e stays ours while we read.
		if err := l.readInto(e.Local, e.Len); err != nil {
			return err
		}
		d.mu.Lock()
		if l.detached || l.stopped || !l.completeLocked() {
			d.mu.Unlock()
			return errStopped
		}
	case opAtomicResp:
		if !e.WR.Opcode.IsAtomic() {
			d.mu.Unlock()
			return l.protocolError(fmt.Errorf("%w: ATOMIC_RESP for %s", errProtocol, e.WR.Opcode))
		}
		if len(e.Local) == 1 && len(e.Local[0]) == 8 {
			binary.LittleEndian.PutUint64(e.Local[0], f.compare)
		}
		if !l.completeLocked() {
			d.mu.Unlock()
			return errStopped
		}
	}
	ok := l.advanceLocked()
	d.mu.Unlock()
	if !ok {
		return errStopped
	}
	return nil
}
