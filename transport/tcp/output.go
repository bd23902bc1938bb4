package tcp

// Output of a link: responses queued by the reader (from the responder
// engine) and the requests the requester engine hands out (Next), gathered
// into batches of buffers and written with one writev(2) each, without
// copying payloads.
//
// Who writes: one goroutine at a time holds the busy token (out.busy,
// under d.mu). flush takes it on the caller's goroutine (PostSend, the
// reader, the RNR timer) and writes without blocking; when the socket is
// full it hands the token, with the unfinished batch, to the writer
// goroutine, which waits for the socket and keeps writing until nothing is
// left. So the reader never blocks on a write (two readers blocked writing
// to each other would deadlock), PostSend never blocks, and in the steady
// state no goroutine is woken per operation.
//
// Write errors only mark the output broken: the reader finds out that the
// connection ended when it has read everything the peer sent before.

import (
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// response is a queued response frame.
type response struct {
	hdr  [headerLen]byte
	data []byte // READ_RESP payload, in target memory
	op   opcode
}

type output struct {
	// Guarded by d.mu.
	busy    bool // the token
	handoff bool // the writer goroutine holds the token
	broken  bool // a write failed; nothing more is written
	// resp is a ring of responses: [head, taken) are in the current batch,
	// [taken, tail) wait. It grows (doubling) when full.
	resp                 []response
	rHead, rTaken, rTail uint64
	waiting              bool // the reader waits for responses to leave (awaitOutput)

	// The batch: owned by the token holder.
	batch     [sys.MaxIOV][]byte
	bi, bn    int // batch[bi:bn] is still to write
	batchResp uint64
	iov       sys.IOVecs
	block     bool  // holder may wait for the socket
	werr      error // error of the last write
}

func (o *output) init() { o.resp = make([]response, 64) }

func (o *output) pendingResp() bool { return o.rTaken < o.rTail }

// queueLocked appends a response. An ACK replaces an ACK queued last
// and not yet taken into a batch (it acknowledges everything that one
// did), so a peer that does not read gets at most one ACK queued per
// other response.
func (l *link) queueLocked(f *frame, data []byte) {
	o := &l.out
	mask := uint64(len(o.resp) - 1)
	if f.op == opAck && o.rTail > o.rTaken {
		if r := &o.resp[(o.rTail-1)&mask]; r.op == opAck {
			header(r.hdr[:]).encode(f)
			return
		}
	}
	if o.rTail-o.rHead == uint64(len(o.resp)) {
		// Grow. Batches in flight keep pointing into the old array, whose
		// contents stay as they were.
		n := make([]response, 2*len(o.resp))
		for i := o.rHead; i < o.rTail; i++ {
			n[i&uint64(len(n)-1)] = o.resp[i&mask]
		}
		o.resp = n
		mask = uint64(len(n) - 1)
	}
	r := &o.resp[o.rTail&mask]
	header(r.hdr[:]).encode(f)
	r.data = data
	r.op = f.op
	if f.op == opReadResp || f.op == opAtomicResp {
		l.rdHeld.Add(1)
	}
	o.rTail++
}

// queuedLocked returns how many responses are queued or being written.
func (o *output) queuedLocked() int { return int(o.rTail - o.rHead) }

// canSendLocked reports whether requests may be transmitted (the engine
// decides which).
func (l *link) canSendLocked() bool {
	return l.req != nil && l.up && !l.detached && !l.stopped && !l.dead
}

// buildBatchLocked gathers queued responses, then requests, into the
// batch. It returns false when there is nothing to write.
func (l *link) buildBatchLocked() bool {
	o := &l.out
	n := 0
	mask := uint64(len(o.resp) - 1)
	for o.rTaken < o.rTail && n+2 <= len(o.batch) {
		r := &o.resp[o.rTaken&mask]
		o.batch[n] = r.hdr[:]
		n++
		if len(r.data) > 0 {
			o.batch[n] = r.data
			n++
		}
		if r.op == opReadResp || r.op == opAtomicResp {
			l.rdHeld.Add(-1)
		}
		o.rTaken++
		o.batchResp++
	}
	if l.canSendLocked() && l.postLocked() {
		qp := l.qp
		r := l.req
		p := &l.pkt2
		sent := false
		for r.Peek(p) {
			e := qp.SendEntry(p.WR)
			payload := e.WR.Opcode <= verbs.OpSendWithImm
			need := 1
			if payload {
				need += len(e.Local)
			}
			if n+need > len(o.batch) {
				break
			}
			r.Next(p)
			h := l.d.hdrs[p.WR%uint64(len(l.d.hdrs))][:]
			if p.WR >= l.encoded {
				encodeRequest(header(h), e, p.PSN)
				l.encoded = p.WR + 1
			}
			o.batch[n] = h
			n++
			if payload {
				for _, s := range e.Local {
					o.batch[n] = s
					n++
				}
			}
			sent = true
		}
		if sent {
			l.applyLocked(r.Flushed(l.now()))
		}
	}
	o.bi, o.bn = 0, n
	return n > 0
}

func encodeRequest(h header, e *soft.SendEntry, q psn) {
	f := frame{op: reqOpcodes[e.WR.Opcode], psn: q, length: uint32(e.Len)}
	if e.WR.Flags&verbs.SendSolicited != 0 {
		f.flags = flagSolicited
	}
	switch e.WR.Opcode {
	case verbs.OpWrite, verbs.OpWriteWithImm, verbs.OpRead:
		f.rkey, f.raddr = e.WR.RKey, e.WR.RemoteAddr
	case verbs.OpCompareAndSwap, verbs.OpFetchAndAdd:
		f.rkey, f.raddr = e.WR.RKey, e.WR.RemoteAddr
		f.length, f.compare, f.swap = 8, e.WR.CompareAdd, e.WR.Swap
	}
	if e.WR.Opcode.HasImm() {
		f.imm = e.WR.Imm
	}
	h.encode(&f)
}

// accountLocked releases the responses of a finished batch.
func (l *link) accountLocked() {
	o := &l.out
	if o.bi < o.bn {
		return
	}
	mask := uint64(len(o.resp) - 1)
	for ; o.batchResp > 0; o.batchResp-- {
		o.resp[o.rHead&mask].data = nil
		o.rHead++
	}
	if o.waiting {
		l.cond.Broadcast()
	}
}

// releaseLocked gives the token back.
func (l *link) releaseLocked() {
	l.out.busy = false
	l.out.handoff = false
	l.cond.Broadcast()
}

// brokenLocked records a failed write and drops the batch.
func (l *link) brokenLocked() {
	o := &l.out
	o.broken = true
	o.bi, o.bn = 0, 0
	l.accountLocked()
	for i := o.rTaken; i < o.rTail; i++ {
		o.resp[i&uint64(len(o.resp)-1)].data = nil
	}
	o.rTaken, o.rHead = o.rTail, o.rTail
	l.rdHeld.Store(0)
	l.cond.Broadcast()
}

// flush writes pending output from the calling goroutine without
// blocking; the writer goroutine takes over what the socket cannot take.
func (l *link) flush() {
	d := l.d
	o := &l.out
	d.mu.Lock()
	if o.busy || !l.up || l.stopped || o.broken {
		d.mu.Unlock()
		return
	}
	o.busy = true
	for {
		if o.bi == o.bn && !l.buildBatchLocked() {
			l.releaseLocked()
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		err := l.writeBatch(false)
		d.mu.Lock()
		l.accountLocked()
		if err != nil || l.stopped {
			if err != nil {
				l.brokenLocked()
			}
			l.releaseLocked()
			d.mu.Unlock()
			return
		}
		if o.bi < o.bn {
			o.handoff = true
			select {
			case l.wake <- struct{}{}:
			default:
			}
			d.mu.Unlock()
			return
		}
	}
}

// writer is the writer goroutine: it finishes output that flush handed
// over, waiting for the socket as needed.
func (l *link) writer() {
	defer l.wg.Done()
	d := l.d
	o := &l.out
	for {
		select {
		case <-l.wake:
		case <-l.stop:
			d.mu.Lock()
			if o.handoff {
				l.releaseLocked()
			}
			d.mu.Unlock()
			return
		}
		d.mu.Lock()
		if !o.handoff {
			d.mu.Unlock()
			continue
		}
		for !l.stopped && (o.bi < o.bn || l.buildBatchLocked()) {
			d.mu.Unlock()
			err := l.writeBatch(true)
			d.mu.Lock()
			l.accountLocked()
			if err != nil {
				l.brokenLocked()
				break
			}
		}
		l.releaseLocked()
		d.mu.Unlock()
	}
}

// writeBatch writes the batch; with block it waits for the socket until
// the batch is written or the connection fails.
func (l *link) writeBatch(block bool) error {
	o := &l.out
	o.block, o.werr = block, nil
	if err := l.raw.Write(l.writeFn); err != nil {
		return err
	}
	return o.werr
}

// rawWrite is the syscall.RawConn callback: false means "wait until the
// socket is writable and call again".
func (l *link) rawWrite(fd uintptr) bool {
	o := &l.out
	for o.bi < o.bn {
		n, err := sys.Writev(int(fd), o.batch[o.bi:o.bn], &o.iov)
		if err == sys.ErrAgain {
			return !o.block
		}
		if err != nil {
			o.werr = err
			return true
		}
		l.progress.Add(1)
		for n > 0 {
			b := o.batch[o.bi]
			if n < len(b) {
				o.batch[o.bi] = b[n:]
				break
			}
			n -= len(b)
			o.batch[o.bi] = nil
			o.bi++
		}
		for o.bi < o.bn && len(o.batch[o.bi]) == 0 {
			o.bi++
		}
	}
	return true
}
