package tcp

// Payload placement: moving a frame's payload from the socket into its
// destination (target memory of a WRITE, the receive buffers of a SEND,
// the local buffers of a READ), then finishing the frame (completions,
// the responder's answer). It runs on whoever holds the read side (rmu):
// the link goroutine, which reads until the payload is in place, or a
// poller (poll.go), which reads only what is there and leaves the rest in
// l.pl for the next holder of rmu. A payload thus needs no room in the
// link's buffer, whatever its size, and is copied once (socket to
// destination) whoever reads it: what the buffer already holds of it is
// copied from there, the rest is read straight into place.
//
// Memory rules: each piece (a copy from the buffer, one read) is moved
// under the region's in-use count (keytab EnterOpt), so a Dereg waits for
// the piece in progress and, between pieces (between polls, say), makes
// the rest fail: it is discarded, and the frame finishes as lost (WRITE:
// RemoteAccess; SEND: the receive completes with LocalProtection; READ:
// LocalProtection).

import (
	"encoding/binary"
	"errors"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// What finishes a payload once it is in place (or discarded).
const (
	finNone     uint8 = iota // nothing: bytes discarded
	finFail                  // the responder failed: failResponder
	finWrite                 // a WRITE: answer
	finWriteImm              // a WRITE_IMM: complete the receive, answer
	finSend                  // a SEND: complete the receive, answer
	finReadResp              // a READ_RESP: report placement to the requester
	finRecvFail              // a SEND its receive cannot take: recvFailed(st)
)

// payload is the frame whose payload is being moved (rmu's).
type payload struct {
	active bool
	fin    uint8
	f      frame
	segs   [][]byte     // destinations, in order
	pins   []keytab.Pin // their keys (zero: none)
	tab    keytab.Table
	si     int // segs[si][off:] is next
	off    int
	tail   []byte    // READ_RESP status trailer: read after segs, unpinned
	skip   int       // bytes to discard after segs and tail
	lost   bool      // a region went away: the rest was skipped
	st     rc.Status // finRecvFail's status
	got    int       // bytes placed in segs
	one    [1][]byte
	onePin [1]keytab.Pin
}

// errMore: a poller moved what there was of a payload; the rest is for the
// next holder of the read side.
var errMore = errors.New("tcp: payload incomplete")

// startSkip discards the next n bytes of the stream, then finishes with
// fin (finNone, finFail, or finRecvFail with st).
func (l *link) startSkip(n int, fin uint8, st rc.Status) error {
	p := &l.pl
	p.active, p.fin, p.st = true, fin, st
	p.segs, p.pins, p.si, p.off = nil, nil, 0, 0
	p.tail, p.skip, p.lost, p.got = nil, n, false, 0
	return l.runPayload()
}

// startPayload moves the payload of f into segs (under pins of tab) and
// finishes with fin.
func (l *link) startPayload(f *frame, fin uint8, segs [][]byte, pins []keytab.Pin, tab keytab.Table, tail []byte) error {
	p := &l.pl
	p.active, p.fin, p.f = true, fin, *f
	p.segs, p.pins, p.tab, p.si, p.off = segs, pins, tab, 0, 0
	p.tail, p.skip, p.lost, p.got = tail, 0, false, 0
	return l.runPayload()
}

// runPayload moves what it can of l.pl and finishes the frame once all
// of it has been moved. A poller gets errMore when the socket had no more
// for now (l.pl stays active); the link goroutine reads until done.
func (l *link) runPayload() error {
	if err := l.movePayload(); err != nil {
		return err // a poller's errMore, or the end of the link (run aborts the payload)
	}
	p := &l.pl
	p.active = false
	p.release()
	return l.finishPayload(p)
}

// release drops the payload's references to memory (destinations, pins,
// key table): none outlives the frame, and a region deregistered after it
// is not kept reachable from the link. finishPayload reads none of them.
func (p *payload) release() {
	p.segs, p.pins, p.tail, p.tab = nil, nil, nil, keytab.Table{}
	p.one, p.onePin = [1][]byte{}, [1]keytab.Pin{}
}

// abortPayload lets go of a payload the connection's end cut short: a
// receive it was going into is completed (flushed; no later flush finds
// it, it was taken from the queue), also when a region went away and the
// rest was being skipped (finishPayload would have completed it).
func (l *link) abortPayload() {
	p := &l.pl
	if !p.active {
		return
	}
	p.active = false
	p.release()
	if p.fin == finWriteImm || p.fin == finSend || p.fin == finRecvFail {
		clear(l.segs[:])
		l.lostRecv()
	}
}

// movePayload moves l.pl's bytes: nil once all are moved.
func (l *link) movePayload() error {
	p := &l.pl
	for p.si < len(p.segs) {
		seg := p.segs[p.si][p.off:]
		if len(seg) == 0 {
			p.si, p.off = p.si+1, 0
			continue
		}
		seg = seg[:min(len(seg), rc.ChunkSize)]
		pin := p.pins[p.si]
		// The payload's last bytes (a trailer, if any, follows in the
		// buffer): the read that takes them may take what follows too.
		last := p.si == len(p.segs)-1 && p.off+len(seg) == len(p.segs[p.si])
		k, err := l.place(seg, p.tab, pin, last)
		p.off += k
		p.got += k
		if err == errDeregistered {
			// The rest of this frame's payload (and trailer) is skipped.
			for i := p.si; i < len(p.segs); i++ {
				p.skip += len(p.segs[i])
			}
			p.skip -= p.off
			p.skip += len(p.tail)
			p.release()
			p.lost = true
			break
		}
		if err != nil {
			return err
		}
	}
	for len(p.tail) > 0 {
		k, err := l.place(p.tail, keytab.Table{}, keytab.Pin{}, false)
		p.tail = p.tail[k:]
		if err != nil {
			return err
		}
	}
	for p.skip > 0 {
		if l.rend > l.rpos {
			c := min(p.skip, l.rend-l.rpos)
			l.rpos += c
			p.skip -= c
			continue
		}
		if err := l.more(p.skip); err != nil {
			return err
		}
	}
	return nil
}

// place moves the next bytes of the stream into seg (at most one read),
// under pin: from the buffer if it holds any, else straight from the
// socket for a large seg, else through the buffer. It returns the bytes
// placed; errDeregistered when pin's region is gone.
//
// With last (seg ends the payload), the read straight from the socket
// takes what follows the payload too, into the (empty) buffer: one
// readv(2) into seg and the room for the next header (room: 1 KiB after
// a large payload), so that the next frame's header, a trailer, and the
// small frames behind them cost no read of their own. A readv that did
// not fill both took all there was (drained): the next look at the
// socket is left to the next poll, or to the reader's wait.
func (l *link) place(seg []byte, tab keytab.Table, pin keytab.Pin, last bool) (int, error) {
	if l.rend > l.rpos {
		if !tab.EnterOpt(pin) {
			return 0, errDeregistered
		}
		c := copy(seg, l.rbuf[l.rpos:l.rend])
		tab.LeaveOpt(pin)
		l.rpos += c
		return c, nil
	}
	if len(seg) < directRead {
		return 0, l.more(len(seg))
	}
	if l.owedBytes >= flushBytes {
		l.flushOwed() // a long payload: don't sit on what we owe
	}
	var after []byte
	if last {
		l.rpos, l.rend = 0, 0 // empty: the buffer was looked at above
		after = l.room(headerLen)
	}
	var k int
	var err error
	if l.nb {
		k, err = l.tryReadPinned(seg, after, tab, pin)
	} else {
		k, err = l.readDirectPinned(seg, after, tab, pin)
	}
	if k > 0 {
		l.owedBytes += k
		l.progress.Add(1)
		if k > len(seg) {
			l.rend += k - len(seg) // what followed the payload
			k = len(seg)
		}
		l.drained = k < len(seg) || l.rend < len(after)
		if l.nb && k < len(seg) && err == nil {
			// A read that did not fill seg took all there was: another
			// would most likely find nothing (a system call saved); the
			// next poll looks again.
			err = errMore
		}
	}
	return k, err
}

// more reads what has arrived into the buffer (want bytes are expected):
// the link goroutine waits for at least a byte, a poller gets errMore when
// nothing is there.
func (l *link) more(want int) error {
	if !l.nb {
		return l.fill(min(want, len(l.rbuf)))
	}
	if got, _ := l.pollRead(want); !got {
		return errMore
	}
	return nil
}

// tryReadPinned is a poller's non-blocking read into seg (and after it,
// after: place) under pin: errMore when nothing is there.
func (l *link) tryReadPinned(seg, after []byte, tab keytab.Table, pin keytab.Pin) (int, error) {
	if !tab.EnterOpt(pin) {
		return 0, errDeregistered
	}
	l.tryAfter = after
	n, err := l.tryRead(seg)
	l.tryAfter = nil
	tab.LeaveOpt(pin)
	if err == sys.ErrAgain {
		return 0, errMore
	}
	return n, err
}

// finishPayload finishes the frame whose payload was moved.
func (l *link) finishPayload(p *payload) error {
	t := l.t
	f := &p.f
	switch p.fin {
	case finFail:
		return l.failResponder()
	case finRecvFail:
		return l.recvFailed(p.st)
	case finWrite, finWriteImm:
		var res rcproto.Result
		switch {
		case p.lost:
			// Deregistered during the transfer: the WRITE fails with
			// RemoteAccess.
			if p.fin == finWriteImm {
				l.lostRecv()
			}
			res.Status = rc.RemoteAccess
		case p.fin == finWriteImm:
			t.Complete(&rc.WC{WRID: l.wqe.WRID, Opcode: rc.WCRecvWriteImm, ByteLen: f.length, Imm: f.imm,
				Flags: rc.WCWithImm, QPN: t.QPN(), SrcQP: l.peer.qpn})
		}
		return l.answer(res, 0)
	case finSend:
		clear(l.segs[:])
		if p.lost {
			// A receive buffer deregistered while the message went in.
			return l.recvFailed(rc.LocalProtection)
		}
		wc := rc.WC{WRID: l.wqe.WRID, Opcode: rc.WCRecv, ByteLen: f.length, QPN: t.QPN(), SrcQP: l.peer.qpn}
		if f.op == opSendImm {
			wc.Imm, wc.Flags = f.imm, rc.WCWithImm
		}
		t.Complete(&wc)
		return l.answer(rcproto.Result{}, 0)
	case finReadResp:
		return l.readPlaced(p)
	}
	return nil
}

// answer gives the responder engine the outcome of the request just
// handled and queues what it says; pay bytes of the request's payload are
// still in the stream, to be discarded.
func (l *link) answer(res rcproto.Result, pay int) error {
	r := l.resp
	r.Done(res)
	if r.Failed() {
		// A fatal NAK (remote access, invalid request): the IBTA moves
		// the responder to ERROR too.
		if pay == 0 {
			return l.failResponder()
		}
		return l.startSkip(pay, finFail, 0)
	}
	l.drainResponses(false)
	if pay == 0 {
		return nil
	}
	return l.startSkip(pay, finNone, 0)
}

// readPlaced reports a READ_RESP's placement (or its failure) to the
// requester engine.
func (l *link) readPlaced(p *payload) error {
	st := rc.Success
	switch {
	case p.lost:
		st = rc.LocalProtection
	case p.f.flags&flagStatus != 0:
		if s := rc.Status(binary.BigEndian.Uint32(l.trailer[:])); s != rc.Success {
			st = rc.RemoteAccess // the only status a trailer carries
		}
	}
	d := l.d
	d.mu.Lock()
	if l.detached || l.stopped {
		d.mu.Unlock()
		return errStopped
	}
	var ok bool
	if st != rc.Success {
		_, ok = l.applyLocked(l.req.PlaceFailed(st, l.now()))
	} else {
		_, ok = l.applyLocked(l.req.Placed(l.now()))
	}
	d.mu.Unlock()
	if !ok {
		return errStopped
	}
	return nil
}
