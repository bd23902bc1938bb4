package coll

// Message passing between ranks, on top of RDMA writes. Everything here
// runs in the goroutine executing a collective.
//
// A message k (counted per channel and direction from 0) goes to FIFO
// slot k mod Slots: one write of the data into the slot, then one 8-byte
// write of the flag word (the counter flag(k), never 0, in the low half,
// the collective's signature in the high half). RC ordering makes the
// data visible before the flag. The receiver spins on the flag until it
// equals exactly what it expects (a partially written word can never
// compare equal), uses the data in place, and acknowledges consumed
// messages in batches by writing k+1 into the sender's credit word for
// slot k mod Slots. The sender may write message k only once the credit
// of slot k mod Slots reads k+1-Slots: the receiver is done with message
// k-Slots. A flag whose counter matches but whose signature does not is a
// mismatched collective.
//
// On synchronous endpoints (CapWriteOnPost: shm, where the initiator
// copies the data when posting) the flag of slot s is instead the slot's
// tail flag, the word right after its chunk, and a message is one write
// of two segments: the data, placed so that it ends at the tail flag, then
// the flag word. The endpoint copies the segments in order while posting,
// so the flag cannot show before the data: one work request per message
// instead of two. The tail flag only ever holds flags (older ones carry
// older counters), so leftovers of a longer message cannot pass for it.
// Devices that place a write's bytes in no guaranteed order (RDMA NICs;
// tcp delivers later) keep the separate flag write.
//
// Small messages on synchronous endpoints (shm, where a write is a copy
// done by PostSend) use the LL format instead, as NCCL's LL protocol: one
// write into LL slot j mod llSlots of a header word (flag(j) | signature)
// and one word per 4 data bytes (flag(j) | data). Each aligned 8-byte word
// is stored whole, so a word showing the expected flag holds its data:
// one write, one cache line or two, no separate flag to fetch. LL slots
// only ever hold LL words, so a stale word carries an older flag.
//
// Lanes. On synchronous endpoints a channel has two more rings of slots
// beside its chunk slots, each with its own message counter and credits
// (one credit word: the receiver writes its count of the lane's consumed
// messages there every half ring, and the sender looks at it only when
// the count it last read is used up): the LL ring
// (llSlots slots) for messages of up to llMax bytes, and the small-message
// ring (midSlots slots of midMax bytes and a tail flag, written as in the
// chunk slots) for larger ones smaller than a chunk. Their slots are
// small, so the rings are deep for little memory: a run of small
// collectives returns a credit every llSlots/2 or midSlots/2 calls and
// never waits for one, where the chunk slots would return one every
// Slots/2. A message's lane follows from its size (laneOf), so both ends
// agree; each lane counts its own messages (k below is that count). A
// wait that sees another lane's next message arrive while its own has not
// is a mismatch (the peer sent a message of another size), after a second
// look at its own: in matching calls the awaited message was posted
// first, so it shows by then.
//
// Work requests: writes to synchronous endpoints (CapWriteOnPost: shm) are
// complete when PostSend returns and are not signaled (errors still
// produce completions, which poll finds). On other endpoints (tcp, RDMA
// devices) every flag and credit write is signaled, so that completions
// free send queue slots in order; writes up to the channel's inline limit
// are posted inline, larger ones read their source later, which therefore
// stays untouched until the peer has seen the message (flag and credit
// words per slot, staging chunks).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// opState is the collective in progress.
type opState struct {
	ctx  context.Context
	call call
	sig  uint32
}

func (o *opState) desc() string { return o.call.String() }

// room makes sure n more work requests fit in q's send queue.
func (c *Comm) room(q *qpState, n uint64) error {
	if q.ep.sync {
		return nil
	}
	for q.posted+n-q.completed > q.depth {
		if err := c.waitPoll(q); err != nil {
			return err
		}
	}
	return nil
}

// poll reaps completions of ep (of each of its QPs where they have CQs
// of their own); a failed work request fails the communicator.
func (c *Comm) poll(ep *endpoint) (int, error) {
	if ep.scq != nil {
		return c.pollCQ(ep, ep.scq)
	}
	all := 0
	for _, q := range ep.qps {
		n, err := c.pollCQ(ep, q.cq)
		if err != nil {
			return 0, err
		}
		all += n
	}
	return all, nil
}

// pollCQ reaps the completions of cq, a send CQ of ep.
func (c *Comm) pollCQ(ep *endpoint, cq *verbs.CQ) (int, error) {
	if testHookPoll != nil && testHookPoll(c) {
		return 0, nil
	}
	n, err := cq.Poll(ep.wcs)
	if err != nil {
		return 0, c.fail(fmt.Errorf("%w: rank %d: %s completion queue: %v", ErrAborted, c.rank, ep.dev, err), true)
	}
	for i := 0; i < n; i++ {
		wc := &ep.wcs[i]
		qi := wc.WRID >> 48
		if wc.Status != verbs.StatusSuccess {
			peer := -1
			if qi < uint64(len(ep.qps)) {
				peer = ep.qps[qi].peer
			}
			if peer >= 0 && c.gone[peer].Load() {
				// It left, and its QP is gone: nothing more is owed
				// to it, and the write counts as done (waitPoll).
				if seq := wc.WRID & (1<<48 - 1); seq > ep.qps[qi].completed {
					ep.qps[qi].completed = seq
				}
				continue
			}
			err := fmt.Errorf("%w: rank %d: RDMA write to rank %d over %s failed: %w", ErrPeerLost, c.rank, peer, ep.dev, wc.Err())
			return 0, c.fail(err, true)
		}
		if qi < uint64(len(ep.qps)) {
			q := ep.qps[qi]
			seq := wc.WRID & (1<<48 - 1)
			if seq > q.completed {
				q.completed = seq
			}
		}
	}
	return n, nil
}

// drain waits until every write that reads the caller's memory after
// posting is complete, so that the buffers may change once the collective
// returns: on tcp, the messages larger than stageMax (see sendFrom).
// Inline writes (flags, credits, small messages) were copied when posted
// and the rest went out of staging chunks; their completions are reaped
// later, as they come.
//
// On tcp nothing is polled when nothing is needed: a poll reads the
// sockets and sends the acknowledgement this rank may owe for the last
// message, which the next collective's first write would carry along.
func (c *Comm) drain() error {
	for _, ep := range c.eps {
		if !ep.sleepWait {
			if _, err := c.poll(ep); err != nil {
				return err
			}
		}
		if ep.sync {
			continue
		}
		for _, q := range ep.qps {
			// A peer that left cleanly took all it needed of this call
			// (its notices come after the data): as settle, its last
			// writes' acknowledgements are not awaited.
			for q.completed < q.needed && !c.gone[q.peer].Load() {
				if err := c.waitPoll(q); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// settle waits until every write posted so far to a peer still here is
// complete (acknowledged by the peer, its data in place), for at most
// settleWait; it gives up early if the communicator fails.
func (c *Comm) settle() {
	deadline := time.Now().Add(min(settleWait, c.opts.Timeout))
	for _, ep := range c.eps {
		if ep.sync {
			continue
		}
		for _, q := range ep.qps {
			for q.completed < q.posted && !c.gone[q.peer].Load() && c.failed.Load() == nil {
				n, err := c.poll(ep)
				if err != nil || !time.Now().Before(deadline) {
					return
				}
				if n == 0 {
					time.Sleep(time.Microsecond) // see waitWord: lets the reader run
				}
			}
		}
	}
}

// settleWait bounds settle.
const settleWait = 5 * time.Second

// reserve waits for the credit to send the channel's next message in
// chunk slots; a message of another lane takes its own credit
// (reserveLane, when posted).
func (c *Comm) reserve(ch *channel) error { return c.waitCredit(ch, ch.sk, ch.slots, ch.acks) }

// reserveLane waits for the credit to send the next message of lane l:
// the receiver's count of consumed messages must reach l.sk+1-l.slots.
// The count last read (l.credit) answers without a look at the credit
// word for slots/2 messages at least, so the word's cache line crosses
// once per batch, not once per message.
func (c *Comm) reserveLane(ch *channel, l *lane) error {
	if l.sk < l.credit+l.slots {
		return nil
	}
	want := l.sk + 1 - l.slots
	if l.credit = sys.Load64(l.acks, 0); l.credit >= want {
		return nil
	}
	if err := c.waitWord(l.acks, 0, want, ch, laneNone); err != nil {
		return err
	}
	l.credit = sys.Load64(l.acks, 0)
	return nil
}

// waitCredit waits until message k of a ring of slots, whose credit
// words are acks, may be sent: the receiver has released message
// k - slots.
func (c *Comm) waitCredit(ch *channel, k, slots uint64, acks []byte) error {
	if k < slots {
		return nil
	}
	off := int(k%slots) * wordSize
	want := k + 1 - slots
	if sys.Load64(acks, off) == want {
		return nil
	}
	return c.waitWord(acks, off, want, ch, laneNone)
}

// stage returns the staging chunk for the channel's next message (made on
// first use); call reserve first.
func (c *Comm) stage(ch *channel) ([]byte, srcRef, error) {
	if ch.stage == nil {
		n := int(ch.slots) * ch.chunk
		mr, err := ch.q.ep.pd.AllocMR(n+wordSize, verbs.AccessLocalWrite)
		if err != nil {
			return nil, srcRef{}, c.fail(fmt.Errorf("%w: rank %d: staging memory: %v", ErrAborted, c.rank, err), true)
		}
		b := mr.Bytes()
		ch.stage = &region{buf: b[:n], addr: uintptr(mr.Addr()), flag: b[n : n+wordSize]}
		ch.stage.mrs[ch.q.ep.idx], ch.stage.keys[ch.q.ep.idx] = mr, mr.LKey()
	}
	i := int(ch.sk%ch.slots) * ch.chunk
	return ch.stage.buf[i : i+ch.chunk], srcRef{lkey: ch.stage.keys[ch.q.ep.idx], flag: ch.stage.flag}, nil
}

// flagOf is message k's flag counter: never 0 (fresh memory).
func flagOf(k uint64) uint32 { return uint32(k%0xffffffff) + 1 }

// laneOf is the lane of an n-byte message on ch; both ends decide alike
// (Options.Protocol and ChunkSize are the same on every rank).
func (c *Comm) laneOf(ch *channel, n int) laneID {
	switch {
	case !ch.q.ep.sync:
		return laneMain
	case n <= llMax && c.opts.Protocol != ProtoSimple:
		return laneLL
	case n <= midMax && n < ch.chunk:
		return laneMid
	}
	return laneMain
}

// srcRef names the memory a message comes from: its local key at the
// channel's endpoint and, in the same registered region, a word postTail
// may put the flag in (nil: the channel's flag words). A one-write message
// whose two segments are in one region costs the transport one key
// resolution (its QP caches one key), not two.
type srcRef struct {
	lkey uint32
	flag []byte
}

// post sends src (registered with lkey at its endpoint; may be empty) as
// the channel's next message. reserve must have succeeded. On tcp, src
// must be inline-sized or a staging chunk (see sendFrom): nothing waits
// for the write to finish reading it.
func (c *Comm) post(ch *channel, src []byte, sr srcRef) error {
	q := ch.q
	k := ch.sk
	slot := k % ch.slots
	switch c.laneOf(ch, len(src)) {
	case laneLL:
		return c.postLL(ch, src)
	case laneMid:
		l := &ch.lanes[laneMid]
		if err := c.reserveLane(ch, l); err != nil {
			return err
		}
		tail := l.remRx + (l.sk%l.slots)*uint64(l.stride) + midMax
		if err := c.postTail(ch, src, sr, uint64(flagOf(l.sk))|uint64(c.op.sig)<<32, tail); err != nil {
			return err
		}
		l.sk++
		return nil
	}
	if q.ep.sync {
		if err := c.postTail(ch, src, sr, uint64(flagOf(k))|uint64(c.op.sig)<<32, ch.remSlots+slot*uint64(ch.stride)+uint64(ch.chunk)); err != nil {
			return err
		}
		ch.sk++
		return nil
	}
	putWord(ch.flagSrc[slot*wordSize:], uint64(flagOf(k))|uint64(c.op.sig)<<32)
	wrs := ch.wr[:0]
	if ch.owing >= 0 {
		// The credits due to the peer go along (deferCredits).
		c.unowe(ch)
		wrs = c.appendAcks(ch, wrs, ch.acked, ch.rk, ch.slots, ch.ackSrc, ch.ackAddr, ch.remAcks)
		ch.acked = ch.rk
	}
	if len(src) > 0 {
		j := len(wrs)
		ch.sge[j] = verbs.SGE{Addr: uint64(sys.Addr(src)), Length: uint32(len(src)), LKey: sr.lkey}
		w := verbs.SendWR{ID: wrID(q, q.posted+uint64(j)+1), Opcode: verbs.OpWrite, SGL: ch.sge[j : j+1],
			RemoteAddr: ch.remSlots + slot*uint64(ch.stride), RKey: ch.remKey}
		if ch.dst != 0 {
			w.RemoteAddr, w.RKey = ch.dst, ch.dstKey // postDirect
		}
		if len(src) <= ch.inline {
			w.Flags = verbs.SendInline
		}
		wrs = append(wrs, w)
	}
	j := len(wrs)
	ch.sge[j] = verbs.SGE{Addr: ch.flagAddr + slot*wordSize, Length: wordSize, LKey: ch.srcKey}
	fw := verbs.SendWR{ID: wrID(q, q.posted+uint64(j)+1), Opcode: verbs.OpWrite, SGL: ch.sge[j : j+1],
		RemoteAddr: ch.remFlags + slot*wordSize, RKey: ch.remKey}
	if ch.inline >= wordSize {
		fw.Flags = verbs.SendInline
	}
	if !q.ep.sync {
		fw.Flags |= verbs.SendSignaled
	}
	wrs = append(wrs, fw)
	if err := c.postWRs(ch, wrs); err != nil {
		return err
	}
	ch.sk++
	return nil
}

// postWRs posts wrs on ch's QP once its send queue has room for them.
func (c *Comm) postWRs(ch *channel, wrs []verbs.SendWR) error {
	q := ch.q
	n := uint64(len(wrs))
	if err := c.room(q, n); err != nil {
		return err
	}
	renumber(q, wrs) // room may have posted credits on q (payCredits)
	if err := q.qp.PostSend(wrs); err != nil {
		return c.fail(fmt.Errorf("%w: rank %d: posting to rank %d: %v", ErrAborted, c.rank, ch.peer, err), true)
	}
	q.posted += n
	if q.ep.sync {
		q.completed = q.posted
	}
	return nil
}

// postTail writes a message on a write-on-post endpoint: src, ending at
// tail, the peer's address of its slot's tail flag, then the flag word
// there. The endpoint copies in order when posting, so the
// flag lands after the data. Where stores become visible in program order
// (storesInOrder) the two are two work requests of one PostSend, each of
// one segment, which the endpoint executes on its direct path; elsewhere
// one work request of two segments, whose copies the endpoint separates
// with the atomic operations of its key checks. The flag comes from src's
// own region when it has a spare word there (srcRef.flag), so that both
// resolve one local key.
func (c *Comm) postTail(ch *channel, src []byte, sr srcRef, fv, tail uint64) error {
	q := ch.q
	// The flag's word is copied while posting, so it is free again when
	// PostSend returns.
	flag := verbs.SGE{Addr: ch.flagAddr, Length: wordSize, LKey: ch.srcKey}
	if len(src) > 0 && sr.flag != nil {
		putWord(sr.flag, fv)
		flag = verbs.SGE{Addr: uint64(sys.Addr(sr.flag)), Length: wordSize, LKey: sr.lkey}
	} else {
		putWord(ch.flagSrc, fv)
	}
	wrs := ch.wr[:0]
	switch {
	case len(src) == 0:
		ch.sge[0] = flag
		wrs = append(wrs, verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.sge[:1], RemoteAddr: tail, RKey: ch.remKey})
	case storesInOrder:
		ch.sge[0] = verbs.SGE{Addr: uint64(sys.Addr(src)), Length: uint32(len(src)), LKey: sr.lkey}
		ch.sge[1] = flag
		wrs = append(wrs,
			verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.sge[:1], RemoteAddr: tail - uint64(len(src)), RKey: ch.remKey},
			verbs.SendWR{ID: wrID(q, q.posted+2), Opcode: verbs.OpWrite, SGL: ch.sge[1:2], RemoteAddr: tail, RKey: ch.remKey})
	default:
		ch.sge[0] = verbs.SGE{Addr: uint64(sys.Addr(src)), Length: uint32(len(src)), LKey: sr.lkey}
		ch.sge[1] = flag
		wrs = append(wrs, verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.sge[:2],
			RemoteAddr: tail - uint64(len(src)), RKey: ch.remKey})
	}
	if err := q.qp.PostSend(wrs); err != nil {
		return c.fail(fmt.Errorf("%w: rank %d: posting to rank %d: %v", ErrAborted, c.rank, ch.peer, err), true)
	}
	q.posted += uint64(len(wrs))
	q.completed = q.posted
	return nil
}

// storesInOrder: this CPU makes plain stores (and string copies, as a
// whole) visible to other cores in program order (x86's total store
// order), so a write-on-post endpoint that copies one work request after
// another needs nothing between them for the second to land after the
// first.
const storesInOrder = runtime.GOARCH == "amd64" || runtime.GOARCH == "386"

// tailOff is the offset in ch.fifo of slot's tail flag.
func (ch *channel) tailOff(slot int) int { return slot*ch.stride + ch.chunk }

// postLL packs src into LL words and writes them in one go, as the
// channel's next LL message.
func (c *Comm) postLL(ch *channel, src []byte) error {
	l := &ch.lanes[laneLL]
	if err := c.reserveLane(ch, l); err != nil {
		return err
	}
	q := ch.q
	j := l.sk
	f := uint64(flagOf(j))
	w := ch.llSrc
	putWord(w, f|uint64(c.op.sig)<<32)
	n := 1
	for ; len(src) >= 4; src = src[4:] {
		putWord(w[n*wordSize:], f|uint64(binary.LittleEndian.Uint32(src))<<32)
		n++
	}
	if len(src) > 0 {
		var d uint64
		for i, b := range src {
			d |= uint64(b) << (32 + 8*i)
		}
		putWord(w[n*wordSize:], f|d)
		n++
	}
	size := n * wordSize
	ch.llSGE[0] = verbs.SGE{Addr: ch.llAddr, Length: uint32(size), LKey: ch.srcKey}
	ch.llWR[0] = verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.llSGE[:],
		RemoteAddr: l.remRx + (j%l.slots)*llStride, RKey: ch.remKey}
	if size <= ch.inline {
		ch.llWR[0].Flags = verbs.SendInline
	}
	if err := q.qp.PostSend(ch.llWR[:]); err != nil {
		return c.fail(fmt.Errorf("%w: rank %d: posting to rank %d: %v", ErrAborted, c.rank, ch.peer, err), true)
	}
	q.posted++
	q.completed = q.posted // synchronous endpoint
	l.sk++
	return nil
}

// postDirect writes src straight into the peer's memory at raddr, then
// sends an empty message that tells the peer it is there. reserve must
// have succeeded. On endpoints that are not synchronous (tcp) both go in
// one PostSend (post, with ch.dst), and the collective waits for the data
// write at its end (drain).
func (c *Comm) postDirect(ch *channel, src []byte, sr srcRef, raddr uint64, rkey uint32) error {
	q := ch.q
	if !q.ep.sync {
		ch.dst, ch.dstKey = raddr, rkey
		err := c.post(ch, src, sr)
		ch.dst = 0
		if err == nil && len(src) > ch.inline {
			q.needed = q.posted - 1 // the data write; the flag is the last
		}
		return err
	}
	ch.sge[0] = verbs.SGE{Addr: uint64(sys.Addr(src)), Length: uint32(len(src)), LKey: sr.lkey}
	ch.wr[0] = verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.sge[0:1], RemoteAddr: raddr, RKey: rkey}
	if err := c.room(q, 1); err != nil {
		return err
	}
	if err := q.qp.PostSend(ch.wr[0:1]); err != nil {
		return c.fail(fmt.Errorf("%w: rank %d: posting to rank %d: %v", ErrAborted, c.rank, ch.peer, err), true)
	}
	q.posted++
	if q.ep.sync {
		q.completed = q.posted
	} else {
		q.needed = q.posted
	}
	return c.post(ch, nil, srcRef{})
}

// sendSmall sends a few bytes from anywhere (copied at post).
func (c *Comm) sendSmall(ch *channel, b []byte) error {
	if err := c.reserve(ch); err != nil {
		return err
	}
	if c.laneOf(ch, len(b)) == laneLL {
		return c.postLL(ch, b)
	}
	if ch.q.ep.sync || len(b) <= ch.inline {
		n := copy(ch.llSrc, b)                                   // the copy is taken when posting
		return c.post(ch, ch.llSrc[:n], srcRef{lkey: ch.srcKey}) // flag words: same region
	}
	buf, key, err := c.stage(ch) // read later: a chunk of its own
	if err != nil {
		return err
	}
	return c.post(ch, buf[:copy(buf, b)], key)
}

// send is reserve + post.
func (c *Comm) send(ch *channel, src []byte, sr srcRef) error {
	if err := c.reserve(ch); err != nil {
		return err
	}
	return c.post(ch, src, sr)
}

// recv waits for the channel's next message, of n bytes, and returns it
// in place in the FIFO. Call release when done with it.
func (c *Comm) recv(ch *channel, n int) ([]byte, error) {
	lid := c.laneOf(ch, n)
	ch.pend = lid
	switch lid {
	case laneLL:
		return c.recvLL(ch, n)
	case laneMid:
		l := &ch.lanes[laneMid]
		want := uint64(flagOf(l.rk)) | uint64(c.op.sig)<<32
		t := int(l.rk%l.slots)*l.stride + midMax
		if sys.Load64(l.rx, t) != want {
			if err := c.waitWord(l.rx, t, want, ch, laneMid); err != nil {
				return nil, err
			}
		}
		return l.rx[t-n : t], nil
	}
	k := ch.rk
	slot := int(k % ch.slots)
	want := uint64(flagOf(k)) | uint64(c.op.sig)<<32
	if ch.q.ep.sync {
		// One write: the data ends at the tail flag (postTail).
		t := ch.tailOff(slot)
		if sys.Load64(ch.fifo, t) != want {
			if err := c.waitWord(ch.fifo, t, want, ch, laneMain); err != nil {
				return nil, err
			}
		}
		return ch.fifo[t-n : t], nil
	}
	if sys.Load64(ch.flags, slot*wordSize) != want {
		if err := c.waitWord(ch.flags, slot*wordSize, want, ch, laneMain); err != nil {
			return nil, err
		}
	}
	o := slot * ch.stride
	return ch.fifo[o : o+n], nil
}

// recvLL waits for the channel's next LL message and unpacks it into
// ch.llBuf.
func (c *Comm) recvLL(ch *channel, n int) ([]byte, error) {
	l := &ch.lanes[laneLL]
	f := flagOf(l.rk)
	at := int(l.rk%l.slots) * llStride
	w := l.rx[at : at+llSlot]
	if want := uint64(f) | uint64(c.op.sig)<<32; sys.Load64(w, 0) != want {
		if err := c.waitWord(w, 0, want, ch, laneLL); err != nil {
			return nil, err
		}
	}
	out := ch.llBuf[:n]
	o := 0
	for i := 1; o < n; i++ {
		v := sys.Load64(w, i*wordSize)
		for uint32(v) != f {
			// Words of one write land together; this is a few
			// nanoseconds at most, but never spin forever.
			if err := c.waitLow(w, i*wordSize, f, ch.peer); err != nil {
				return nil, err
			}
			v = sys.Load64(w, i*wordSize)
		}
		if n-o >= 4 {
			binary.LittleEndian.PutUint32(out[o:], uint32(v>>32))
			o += 4
			continue
		}
		for d := uint32(v >> 32); o < n; o, d = o+1, d>>8 {
			out[o] = byte(d)
		}
	}
	return out, nil
}

// otherArrived says whether the next message of a lane other than the
// awaited one (laneMain or another) has arrived on ch: on write-on-post
// endpoints, where there are lanes. See "Lanes" above.
func (c *Comm) otherArrived(ch *channel, awaited laneID) bool {
	if !ch.q.ep.sync {
		return false
	}
	if awaited != laneMain {
		k := ch.rk
		if uint32(sys.Load64(ch.fifo, ch.tailOff(int(k%ch.slots)))) == flagOf(k) {
			return true
		}
	}
	for i := range ch.lanes {
		l := &ch.lanes[i]
		if laneID(i) == awaited {
			continue
		}
		off := int(l.rk%l.slots) * l.stride // the LL header
		if laneID(i) == laneMid {
			off += midMax // the tail flag
		}
		if uint32(sys.Load64(l.rx, off)) == flagOf(l.rk) {
			return true
		}
	}
	return false
}

// relaxSink keeps relax's work from being optimised away.
var relaxSink uint32

// relax spends some nanoseconds between two polls of a word a peer is
// about to write, as a PAUSE would: polling it back to back keeps
// stealing the cache line from the writer (and, on SMT siblings, the
// core), which delays the very write we wait for.
func relax() {
	x := relaxSink
	for j := 0; j < relaxIters; j++ {
		x = x*2654435761 + 1
	}
	if x == 0 {
		relaxSink = x
	}
}

const relaxIters = 8

// waitLow waits for the low half of a word to read f.
func (c *Comm) waitLow(mem []byte, off int, f uint32, peer int) error {
	for i := 0; i < c.spinFirst; i++ {
		if uint32(sys.Load64(mem, off)) == f {
			return nil
		}
	}
	start := time.Now()
	deadline := start.Add(c.opts.Timeout)
	for i := 1; uint32(sys.Load64(mem, off)) != f; i++ {
		if i&255 == 0 {
			if err := c.checkWait(peer, c.op.ctx.Done(), start, deadline); err != nil {
				return c.stop(err, peer, uint32(sys.Load64(mem, off)) == f)
			}
			c.backoff(start)
		}
	}
	return nil
}

// release consumes the channel's current message (the one recv returned)
// and, every ackBatch messages (half a lane's ring), returns the
// credits.
func (c *Comm) release(ch *channel) error {
	if ch.pend != laneMain {
		l := &ch.lanes[ch.pend]
		ch.pend = laneMain
		l.rk++
		if l.rk-l.acked < l.slots/2 {
			return nil
		}
		return c.ackLane(ch, l)
	}
	ch.rk++
	if ch.rk-ch.acked < ch.ackBatch {
		return nil
	}
	if !ch.q.ep.sync {
		if ch.owing < 0 {
			ch.owing = len(c.owing)
			c.owing = append(c.owing, ch)
		}
		return nil
	}
	err := c.ack(ch, ch.acked, ch.rk, ch.slots, ch.ackSrc, ch.ackAddr, ch.remAcks)
	if err == nil {
		ch.acked = ch.rk
	}
	return err
}

// Deferred credits. On endpoints that are not synchronous (tcp, RDMA
// devices) a credit write is a message of its own: over tcp a system
// call and a frame the peer must read (one in four calls of a 2-rank
// 8 B AllReduce, about a microsecond each). So release only notes the
// credits due (Comm.owing) and they go out with the channel's next
// message, in the same PostSend (post), or, if a wait comes first, at
// the start of that wait (payCredits): a rank never blocks in this
// communicator with credits unpaid, so the deadlock argument of algo.go
// holds as if they had been written at release. Between calls up to
// Slots-ackBatch credits may stay owed until the rank's next call on the
// communicator: a peer that runs ahead into its next call can send
// ackBatch messages to this rank, not Slots, before it waits for it
// (collectives are made to wait for every rank's call; see doc.go).

// unowe takes ch off Comm.owing.
func (c *Comm) unowe(ch *channel) {
	i, last := ch.owing, len(c.owing)-1
	c.owing[i] = c.owing[last]
	c.owing[i].owing = i
	c.owing[last] = nil
	c.owing = c.owing[:last]
	ch.owing = -1
}

// payCredits writes every credit due (a wait is about to start).
func (c *Comm) payCredits() error {
	for len(c.owing) > 0 {
		ch := c.owing[len(c.owing)-1]
		c.unowe(ch) // before ack, whose room may wait and so come here
		if err := c.ack(ch, ch.acked, ch.rk, ch.slots, ch.ackSrc, ch.ackAddr, ch.remAcks); err != nil {
			return err
		}
		ch.acked = ch.rk
	}
	return nil
}

// ackLane returns the credits of lane l: its count of consumed messages,
// one word written into the sender's credit word (lanes are on
// write-on-post endpoints only: the word is copied when posted).
func (c *Comm) ackLane(ch *channel, l *lane) error {
	putWord(l.ackSrc, l.rk)
	q := ch.q
	ch.sge[0] = verbs.SGE{Addr: l.ackAddr, Length: wordSize, LKey: ch.srcKey}
	ch.wr[0] = verbs.SendWR{ID: wrID(q, q.posted+1), Opcode: verbs.OpWrite, SGL: ch.sge[:1],
		RemoteAddr: l.remAcks, RKey: ch.remAckK}
	if wordSize <= ch.inline {
		ch.wr[0].Flags = verbs.SendInline
	}
	if err := c.postWRs(ch, ch.wr[:1]); err != nil {
		return err
	}
	l.acked = l.rk
	return nil
}

// ack writes the credit words of messages [from, to) of a ring of slots
// into the sender: from src (registered at srcAddr) to its words at rem.
func (c *Comm) ack(ch *channel, from, to, slots uint64, src []byte, srcAddr, rem uint64) error {
	if err := c.postWRs(ch, c.appendAcks(ch, ch.wr[:0], from, to, slots, src, srcAddr, rem)); err != nil {
		return err
	}
	c.paidAlone++
	return nil
}

// renumber gives wrs, to be posted on q next, the IDs that follow
// q.posted.
func renumber(q *qpState, wrs []verbs.SendWR) {
	for j := range wrs {
		wrs[j].ID = wrID(q, q.posted+uint64(j)+1)
	}
}

// appendAcks appends to wrs, which are to be posted on ch's QP next,
// the writes of the credit words of messages [from, to) of a ring of
// slots (at most two: the run may wrap), from src (registered at
// srcAddr) to the sender's words at rem.
func (c *Comm) appendAcks(ch *channel, wrs []verbs.SendWR, from, to, slots uint64, src []byte, srcAddr, rem uint64) []verbs.SendWR {
	for i := from; i < to; i++ {
		putWord(src[(i%slots)*wordSize:], i+1)
	}
	q := ch.q
	for i := from; i < to; {
		s := i % slots
		m := min(to-i, slots-s) // contiguous run of slots
		j := len(wrs)
		ch.sge[j] = verbs.SGE{Addr: srcAddr + s*wordSize, Length: uint32(m * wordSize), LKey: ch.srcKey}
		w := verbs.SendWR{ID: wrID(q, q.posted+uint64(j)+1), Opcode: verbs.OpWrite, SGL: ch.sge[j : j+1],
			RemoteAddr: rem + s*wordSize, RKey: ch.remAckK}
		if int(m*wordSize) <= ch.inline {
			w.Flags = verbs.SendInline
		}
		if !q.ep.sync {
			w.Flags |= verbs.SendSignaled
		}
		wrs = append(wrs, w)
		i += m
	}
	return wrs
}

// spinFirst is how many times a wait polls before it looks at anything
// else (clock, context, peers): most waits in a collective end within a
// microsecond, and each look costs more than a poll. After it, a wait
// looks every lookEvery polls, polling on (with runtime.Gosched when
// other goroutines need it, see backoff) until Comm.spinFor (10 µs), then
// yielding the core (sched_yield) at each look. Both are short because a
// spinning rank may share its core with the rank it waits for (on a busy
// host the scheduler puts both ranks on the core left free): every poll
// until the yield is time that rank cannot run. 2-rank AllReduce on shm
// on a host at load 5-7, time µs in three runs (Open MPI sm: 0.14 at 8 B,
// 0.76 at 4 KiB): 2048 polls and 50 µs: 8 B 63, 0.26, 63; 4 KiB 26, 64,
// 64. 256 polls and 10 µs: 8 B 0.25, 0.25, 0.59; 4 KiB 15, 1.8, 1.1.
// Yielding at once (64 polls, 0 µs) cost 2 µs at 8 B.
//
// With more ranks on the host than cores the rank waited for is most
// likely not running, so the wait yields (sched_yield) at once, at every
// poll, and looks at the clock and the rest every lookOversub-th poll
// (Comm.yieldEach; Comm.spinFor is 0), as Open MPI's sm transport does
// when oversubscribed. 4 ranks on a 2-CPU host, pinned round robin
// (Options.Bind), AllReduce 8 B, µs per call, medians of 15 alternating
// launches: 16 polls with pauses first, then a yield every 16th poll
// 4.03; a yield at every poll, a look every 16th 3.61 (every 64th 3.65);
// Open MPI sm 3.65 (docs/benchmarks.md, "Small collectives on shm with
// ranks outnumbering cores"). Before, on 2 CPUs of an idle 16-core host
// (taskset), unpinned, time µs in three runs, AllReduce 8 B, AllGather
// 4 KiB, ReduceScatter 64 KiB: 64/256 polls before the first yield / between
// yields 12.9, 11.8, 7.9; 12.8, 9.4, 14.8; 48, 38, 36. 16/16: 7.0, 6.9,
// 7.3; 13.3, 13.2, 9.1; 23, 25, 30. 4/4: 10.1, 7.4, 8.1; 11.6, 8.6, 8.8;
// 33, 32, 31, and AllGather 1 MiB 310 µs against 180-260 with 16/16. (On
// the 2-core host itself, 2048 polls: AllGather 4 KiB 43-318 µs, 64
// polls 33-63 µs.)
const (
	spinFirst   = 256
	spinOversub = 0
	lookEvery   = 256
	lookOversub = 16
)

// waitWord spins until the word at off of mem equals want (laneNone: a
// credit word, which only grows, reaches want). Flags whose
// counter half matches but signature half does not are a mismatch, and so
// is the next message of a lane other than awaited arriving while want
// still does not show (otherArrived; laneNone: want is no message flag):
// the sender's message has another size. It
// gives up on the communicator's failure, the peer's departure, the
// context's end or the timeout, and backs off from spinning to yielding
// the CPU when the wait is long.
func (c *Comm) waitWord(mem []byte, off int, want uint64, ch *channel, awaited laneID) error {
	if len(c.owing) > 0 {
		if err := c.payCredits(); err != nil {
			return err
		}
	}
	flag := awaited != laneNone
	if ch.q.ep.sleepWait {
		return c.waitWordPolling(mem, off, want, ch, flag)
	}
	peer := ch.peer
	for i := 0; i < c.spinFirst; i++ {
		v := sys.Load64(mem, off)
		if v == want || !flag && v > want {
			return nil
		}
		if flag && uint32(v) == uint32(want) {
			break // the slow path looks into it
		}
		relax()
	}
	start, deadline, done := c.waitLimits()
	for i := 1; ; i++ {
		v := sys.Load64(mem, off)
		if v == want || !flag && v > want {
			return nil
		}
		if flag && uint32(v) == uint32(want) {
			if err := c.checkSignature(mem, off, want, peer); err != nil {
				return err
			}
			continue
		}
		if i&c.lookMask != 0 {
			if c.yieldEach {
				osYield()
			}
			continue
		}
		if err := c.checkWait(peer, done, start, deadline); err != nil {
			v := sys.Load64(mem, off)
			return c.stop(err, peer, v == want || !flag && v > want)
		}
		if flag && c.otherArrived(ch, awaited) && sys.Load64(mem, off) != want {
			return c.fail(fmt.Errorf("%w: rank %d in %s: rank %d sent a message of another size",
				ErrMismatch, c.rank, c.op.desc(), peer), true)
		}
		if i&4095 == 0 {
			for _, ep := range c.eps {
				if _, err := c.poll(ep); err != nil {
					return err
				}
			}
		}
		c.backoff(start)
	}
}

// waitLimits starts a wait of the current call: its start, the deadline
// (the call's timeout or its context's deadline, the earlier), and the
// context's done channel.
func (c *Comm) waitLimits() (start, deadline time.Time, done <-chan struct{}) {
	ctx := c.op.ctx
	start = time.Now()
	deadline = start.Add(c.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return start, deadline, ctx.Done()
}

// checkSignature is a wait's look at a word whose counter is the one
// wanted but whose signature is not: it re-reads it after a moment, in
// case the word was caught being written, and fails the communicator
// with ErrMismatch if the message still belongs to a different call.
func (c *Comm) checkSignature(mem []byte, off int, want uint64, peer int) error {
	time.Sleep(time.Millisecond)
	if v := sys.Load64(mem, off); v != want && uint32(v) == uint32(want) {
		return c.fail(fmt.Errorf("%w: rank %d in %s: the message from rank %d belongs to a different call (signature %08x, want %08x)",
			ErrMismatch, c.rank, c.op.desc(), peer, uint32(v>>32), uint32(want>>32)), true)
	}
	return nil
}

// waitWordPolling is waitWord for a word a tcp peer writes: the write
// lands when this process reads it from the socket. Each look that finds
// the word unchanged polls the channel's completion queue, and the poll
// of an empty queue reads the channel's socket on this goroutine and
// handles what arrived (the transport's progress, transport/tcp poll.go):
// no reader goroutine is woken per message, and a poll that reads nothing
// yields the CPU, which the peer rank may need. The completions it reaps
// free send queue room as they come. Every 16th look polls all of the
// endpoint's queues (pollAllEvery).
func (c *Comm) waitWordPolling(mem []byte, off int, want uint64, ch *channel, flag bool) error {
	peer := ch.peer
	var lim waitClock
	for i := 1; ; i++ {
		v := sys.Load64(mem, off)
		if v == want {
			return nil
		}
		if flag && uint32(v) == uint32(want) {
			if err := c.checkSignature(mem, off, want, peer); err != nil {
				return err
			}
			continue
		}
		if err := c.pollWait(ch.q, i, peer, &lim); err != nil {
			return c.stop(err, peer, sys.Load64(mem, off) == want)
		}
	}
}

// pollWait is one look of a wait that polls q's completion queue (on tcp:
// reads its socket), the i-th: every pollAllEvery looks it checks whether
// to stop (checkWait) and polls the other QPs of the endpoint too, so
// that what they owe their peers goes out (an acknowledgement a poll left
// for the next write, transport/tcp poll.go deferAck), and what arrived on
// them is taken in.
func (c *Comm) pollWait(q *qpState, i, peer int, lim *waitClock) error {
	if i%pollAllEvery == 0 {
		lim.start(c)
		if err := c.checkWait(peer, lim.done, lim.t0, lim.deadline); err != nil {
			if err == errGone {
				// What the peer sent before leaving may still be in
				// the socket: take it in before the caller's last look.
				if _, perr := c.poll(q.ep); perr != nil {
					return perr
				}
			}
			return err
		}
		// (Only sleepWait endpoints wait here, and their QPs have CQs of
		// their own: poll goes through each.)
		_, err := c.poll(q.ep)
		return err
	}
	_, err := c.pollCQ(q.ep, q.cq)
	return err
}

const pollAllEvery = 16

// waitClock holds a polling wait's limits (waitLimits), taken at its
// first look rather than when it starts: most waits of a rank over tcp end
// within a few polls, and time.Now at the start of each was 1% of a
// two-rank 8-byte AllReduce's CPU. The limits run from pollAllEvery polls
// into the wait, microseconds late.
type waitClock struct {
	t0, deadline time.Time // t0 zero: not taken yet
	done         <-chan struct{}
}

func (w *waitClock) start(c *Comm) {
	if w.t0.IsZero() {
		w.t0, w.deadline, w.done = c.waitLimits()
	}
}

// waitPoll waits until q has completions to reap (on endpoints with one
// send CQ: any QP of the endpoint), and reaps them.
//
// The peer's departure does not end this wait: a peer that said bye
// received what it needed, but the acknowledgements that complete our
// writes travel on the data connection, apart from the bye, and may come
// after it (a tcp peer's poll leaves an ACK for its reader to send within
// transport/tcp appLease). The peer's transport keeps acknowledging
// until every rank has said bye (Close), and once it is torn down our
// writes to it complete in error, which pollCQ counts as done for a peer
// that left. The call's timeout and context bound the wait as ever, and
// so does ackAfterBye from when the departure was seen: then the
// communicator fails with ErrPeerLost, as it did at once before.
func (c *Comm) waitPoll(q *qpState) error {
	if len(c.owing) > 0 {
		if err := c.payCredits(); err != nil {
			return err
		}
	}
	if testHookAckWait != nil {
		testHookAckWait(c, q.peer)
	}
	ep := q.ep
	var lim waitClock
	if !ep.sleepWait {
		lim.start(c) // backoff needs it at once
	}
	was := q.completed
	var left time.Time // when the peer's departure was seen
	gone := func(err error) error {
		if err != errGone {
			return err
		}
		if left.IsZero() {
			left = time.Now()
		} else if time.Since(left) > ackAfterBye {
			return c.stop(errGone, q.peer, q.completed != was)
		}
		return nil
	}
	for i := 1; ; i++ {
		if ep.sleepWait {
			// The poll reads the socket, and yields when idle
			// (waitWordPolling).
			if err := gone(c.pollWait(q, i, q.peer, &lim)); err != nil {
				return err
			}
			if q.completed != was {
				return nil
			}
			continue
		}
		n, err := c.pollCQ(ep, q.cq)
		if n > 0 || err != nil {
			return err
		}
		if i&15 == 0 {
			if err := gone(c.checkWait(q.peer, lim.done, lim.t0, lim.deadline)); err != nil {
				return err
			}
		}
		c.backoff(lim.t0)
	}
}

// ackAfterBye bounds how long waitPoll waits for completions once the
// peer has said bye: it acknowledges at once or within the tcp transport's
// lease (transport/tcp appLease, 200 µs), so this is for a peer whose
// transport stopped first (a variable for tests).
var ackAfterBye = settleWait

// checkWait reports why waiting must stop, if it must: errGone if peer
// has left, which the waiter hands to stop after one more look.
func (c *Comm) checkWait(peer int, done <-chan struct{}, start, deadline time.Time) error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	if testHookCheckWait != nil {
		testHookCheckWait(c, peer)
	}
	if now := time.Now(); now.After(deadline) {
		who := "any peer"
		if peer >= 0 {
			who = fmt.Sprintf("rank %d", peer)
		}
		return c.fail(fmt.Errorf("%w: rank %d in %s: nothing from %s for %v", ErrTimeout, c.rank, c.op.desc(), who, now.Sub(start).Round(time.Millisecond)), true)
	}
	if done != nil {
		select {
		case <-done:
			return c.fail(fmt.Errorf("%w: rank %d in %s: %w", ErrAborted, c.rank, c.op.desc(), c.op.ctx.Err()), true)
		default:
		}
	}
	if peer >= 0 && c.gone[peer].Load() {
		return errGone // after the deadline and the context: waitPoll goes on
	}
	return nil
}

// errGone is checkWait's report that the awaited peer has left (closed
// the communicator). What a peer writes lands before it says bye (Close
// settles first) and before its departure can be seen here, so the waiter
// looks once more at what it waits for (a preemption between its last look
// and checkWait can hide a message that came with the bye) and only then
// gives up, through stop.
var errGone = errors.New("coll: peer left")

// stop is the error a wait ends with after checkWait's err and one more
// look, which found what the wait was for (arrived) or not: errGone
// becomes nil if it had arrived, else the communicator's failure.
func (c *Comm) stop(err error, peer int, arrived bool) error {
	if err == errGone && arrived {
		return nil
	}
	if err == errGone {
		return c.fail(fmt.Errorf("%w: rank %d in %s: rank %d closed the communicator", ErrPeerLost, c.rank, c.op.desc(), peer), true)
	}
	return err
}

// testHookCheckWait, when set (tests), runs at the start of every
// checkWait.
var testHookCheckWait func(c *Comm, peer int)

// testHookAckWait, when set (tests), runs at the start of every waitPoll
// (a wait for the completions of writes to peer); testHookPoll, when set,
// runs before every poll of a completion queue, which finds nothing when
// it returns true.
var (
	testHookAckWait func(c *Comm, peer int)
	testHookPoll    func(c *Comm) bool
)

// backoff gives the CPU away as a wait grows: other goroutines first,
// other processes after spinFor, short sleeps after a millisecond.
//
// Other goroutines only when this process has other ranks (or one P):
// runtime.Gosched also wakes an idle P's thread to look for work, a
// context switch per call that, with ranks outnumbering the cores, takes
// the core from the rank being waited for (4 ranks on 2 cores, AllGather
// 4 KiB: 20-30 µs with it, ~10 µs without). The process's other
// goroutines still run on the other Ps.
func (c *Comm) backoff(start time.Time) {
	gosched := c.oneP || procComms.Load() > 1
	switch d := time.Since(start); {
	case d < c.spinFor:
		if gosched {
			runtime.Gosched()
		}
	case d < time.Millisecond:
		if gosched {
			runtime.Gosched()
		}
		osYield()
	default:
		time.Sleep(20 * time.Microsecond)
	}
}
