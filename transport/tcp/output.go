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
	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// response is a queued response frame.
type response struct {
	hdr  [headerLen]byte
	data []byte     // READ_RESP payload, in target memory
	pin  keytab.Pin // data's key: checked before each write of it
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
	batch [sys.MaxIOV][]byte
	kinds [sys.MaxIOV]uint8      // seg*: what each buffer of batch is
	pins  [sys.MaxIOV]keytab.Pin // segData, segTrailer: the READ's key
	// rPhase and rOff: how much of response rTaken is in batches so far
	// (0: nothing, 1: the header and rOff bytes of data, 2: all data).
	rPhase    int
	rOff      int
	bi, bn    int // batch[bi:bn] is still to write
	batchResp uint64
	iov       sys.IOVecs
	block     bool  // holder may wait for the socket
	werr      error // error of the last write
}

func (o *output) init() { o.resp = make([]response, 64) }

// Kinds of batch buffers.
const (
	segPlain   uint8 = iota // written as is
	segData                 // READ data in target memory: written under its pin
	segTrailer              // READ_RESP status trailer, not decided yet
	segEntered              // segData inside Enter during one writev
	segLocal                // request payload in local memory: written under its pin
	segLocalIn              // segLocal inside Enter during one writev
)

var (
	// zeroChunk replaces READ data whose region was deregistered while it
	// went out: the stream must carry the promised bytes, never the
	// memory's.
	zeroChunk = make([]byte, rc.ChunkSize)
	// The READ_RESP status trailers (see header.go).
	trailerOK  [trailerLen]byte
	trailerBad = [trailerLen]byte{3: byte(rc.RemoteAccess)}
)

func (o *output) pendingResp() bool { return o.rTaken < o.rTail }

// queueLocked appends a response. An ACK replaces an ACK queued last
// and not yet taken into a batch (it acknowledges everything that one
// did), so a peer that does not read gets at most one ACK queued per
// other response.
func (l *link) queueLocked(f *frame, data []byte, pin keytab.Pin) {
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
	r.data, r.pin = data, pin
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
	for o.rTaken < o.rTail && n < len(o.batch) {
		r := &o.resp[o.rTaken&mask]
		switch o.rPhase {
		case 0: // the header
			if len(r.data) > 0 && !l.t.Valid(r.pin) {
				// Deregistered before its data went out: the READ fails
				// with a remote access error instead, and this QP goes to
				// ERROR.
				header(r.hdr[:]).encode(&frame{op: opNak, syndrome: synRemoteAccess, psn: header(r.hdr[:]).psn()})
				r.data, r.pin = nil, keytab.Pin{}
				l.t.Fail(!l.d.srq)
			}
			o.batch[n], o.kinds[n] = r.hdr[:], segPlain
			n++
			o.rPhase, o.rOff = 1, 0
		case 1: // READ data, a chunk per buffer (each written under its pin)
			for o.rOff < len(r.data) && n < len(o.batch) {
				k := min(len(r.data)-o.rOff, rc.ChunkSize)
				o.batch[n], o.pins[n], o.kinds[n] = r.data[o.rOff:o.rOff+k], r.pin, segData
				n++
				o.rOff += k
			}
			if o.rOff == len(r.data) {
				o.rPhase = 2
			}
		case 2: // the status trailer, decided when it is written
			if header(r.hdr[:]).flags()&flagStatus != 0 {
				o.batch[n], o.pins[n], o.kinds[n] = trailerOK[:], r.pin, segTrailer
				n++
			}
			o.rPhase = 0
			if r.op == opReadResp || r.op == opAtomicResp {
				l.rdHeld.Add(-1)
			}
			o.rTaken++
			o.batchResp++
		}
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
			o.batch[n], o.kinds[n] = h, segPlain
			n++
			if payload {
				for i, s := range e.Local {
					o.batch[n], o.kinds[n], o.pins[n] = s, segLocal, e.Pins[i]
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

// leaveBatch ends the touches rawWrite began for batch[i:j].
func (l *link) leaveBatch(i, j int) {
	o := &l.out
	for ; i < j; i++ {
		switch o.kinds[i] {
		case segEntered:
			l.t.Leave(o.pins[i])
			o.kinds[i] = segData
		case segLocalIn:
			l.ltab.LeaveOpt(o.pins[i])
			o.kinds[i] = segLocal
		}
	}
}

// localLostLocked ends the connection when a request's local memory was
// deregistered while it went out: the oldest work request fails with
// LocalProtection when the reader exits.
func (l *link) localLostLocked(err error) {
	if err != errLocalDereg {
		return
	}
	if l.failSt == verbs.StatusSuccess {
		l.failSt = verbs.StatusLocalProtection
	}
	l.failQP = true
	if l.conn != nil {
		l.conn.Close()
	}
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
		o.resp[o.rHead&mask].pin = keytab.Pin{}
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
	o.rPhase, o.rOff = 0, 0
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
				l.localLostLocked(err)
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
				l.localLostLocked(err)
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
		// Target memory is written under its key's in-use count (one
		// non-blocking writev is a bounded touch): a Dereg waits for it,
		// and data of a region deregistered meanwhile is never sent:
		// zeros go in its place, and the READ's trailer says
		// RemoteAccess.
		t := l.t
		for i := o.bi; i < o.bn; i++ {
			switch o.kinds[i] {
			case segLocal:
				// A request's payload: a local region deregistered while
				// it goes out cuts the stream (the request cannot be
				// finished) and fails the work request.
				if !l.ltab.EnterOpt(o.pins[i]) {
					l.leaveBatch(o.bi, i)
					o.werr = errLocalDereg
					return true
				}
				o.kinds[i] = segLocalIn
			case segData:
				if t.Enter(o.pins[i]) {
					o.kinds[i] = segEntered
				} else {
					o.batch[i], o.kinds[i] = zeroChunk[:len(o.batch[i])], segPlain
				}
			case segTrailer:
				// Decided anew on every pass until a byte of it is
				// written: data before it in this batch that a short
				// writev leaves for a later pass may be replaced by zeros
				// there, and then the trailer must say so.
				if len(o.batch[i]) < trailerLen {
					break // partly written: what was decided stands
				}
				if t.Valid(o.pins[i]) {
					o.batch[i] = trailerOK[:]
				} else {
					o.batch[i] = trailerBad[:]
					o.kinds[i] = segPlain // final
					t.Fail(!l.d.srq)      // the responder NAKed: its QP goes to ERROR
				}
			}
		}
		n, err := sys.Writev(int(fd), o.batch[o.bi:o.bn], &o.iov)
		l.leaveBatch(o.bi, o.bn)
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
