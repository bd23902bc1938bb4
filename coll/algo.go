package coll

// The algorithms. Each runs in the goroutine calling the collective (no
// other goroutine takes part), moves messages of at
// most one chunk, and interleaves channels piece by piece. Ranges are in
// elements; mem.at turns them into bytes.
//
// Deadlock freedom: a sender may run Slots-ackBatch+1 messages ahead of
// its receiver's acknowledgements (ackBatch is Slots/2, so at least
// Slots/2+1). The ring algorithms send at most Slots/2 pieces per channel
// ahead of what they receive, so a ring of ranks blocked on credits would
// need more than that in flight: it cannot happen. Every other pattern
// sends at most one ahead, or along acyclic paths.

import (
	"encoding/binary"

	"github.com/rdmakit/rdmakit/coll/internal/reduce"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// directMin is the message size from which the ring algorithms write
// final data straight into the next rank's output buffer (when every pair
// of ranks is on shm): the receiver then only waits for a notification
// instead of copying the data out of its FIFO. Smaller messages do not
// repay the extra exchange of addresses.
const directMin = 128 << 10

// stageMax is the largest message sendFrom copies into staging on tcp.
const stageMax = 64 << 10

// direct says whether a collective of n bytes uses direct writes; every
// rank decides alike.
func (c *Comm) direct(n int) bool { return c.allSync && c.nranks > 1 && n >= directMin }

// directAR is direct for the ring AllReduce of an n-byte vector: also
// where some pair of ranks is not on shm, from ringDirectNet.
func (c *Comm) directAR(n int) bool {
	if c.allSync || c.nranks < 2 || n < ringDirectNet {
		return c.direct(n)
	}
	if testHookRingDirect != nil {
		testHookRingDirect(c)
	}
	return true
}

// ringDirectNet is directMin for the ring AllReduce where some pair of
// ranks is not on shm (tcp, RDMA devices): from it the final values go
// straight into the next rank's output too, as the halving algorithms'
// doubling steps do over tcp (halving.go, hdDirectMin): the transport
// reads the payload from the socket into the output, and the copy out of
// a FIFO slot (half the vector per rank at 2 ranks) is saved, for one
// more small message a call (the address). Large only: 2 ranks over tcp
// on the shared 2-core host (load 12-16), CPU of both ranks per call
// (perf stat, 2 s windows), FIFO against direct, 3-4 alternating
// launches: 64 MiB 87-98 against 75-80 ms; 16 MiB 20.8-21.4 against
// 19.4-23.1; 4 MiB 4.9-5.5 against 3.1-5.8; 1 MiB 0.75-0.93 against
// 0.65-0.93; 256 KiB 0.21-0.32 against 0.24-0.34. With ringARPieces,
// time, medians of 7: 64 MiB 50000 against 43300 µs. Only the AllReduce:
// the ring AllGather writing directly over tcp measured slower (4 ranks
// 16 MiB 34400 against 24300 µs, 2 ranks 64 MiB 32300 against 30600,
// medians of 5), and the 4-rank AllReduce at 16 MiB did not move (55700
// / 54500). docs/benchmarks.md, "coll over tcp: small calls at 4 ranks,
// large calls at 2".
var ringDirectNet = 16 << 20

// testHookRingDirect, when set (tests), runs when an AllReduce whose
// ranks are not all on shm decides on direct writes (Comm.directAR).
var testHookRingDirect func(c *Comm)

// directOut tells rank prev where this rank's output buffer is (this
// call's first message to prev) and learns where next's is (next's first
// message to us).
func (c *Comm) directOut(out mem, next, prev int) (uint64, uint32, error) {
	if err := c.announceOut(out, prev); err != nil {
		return 0, 0, err
	}
	return c.learnOut(next)
}

// announceOut sends rank to where out is: its address and its key on
// the endpoint of rank's channel 0 (a small message on that channel).
func (c *Comm) announceOut(out mem, rank int) error {
	var b [outAddrLen]byte
	ch := c.peers[rank].ch[0]
	binary.LittleEndian.PutUint64(b[:], uint64(sys.Addr(out.b)))
	binary.LittleEndian.PutUint32(b[8:], out.rg.rkeys[ch.q.ep.idx])
	return c.sendSmall(ch, b[:])
}

// learnOut receives where rank's output is (its announceOut).
func (c *Comm) learnOut(rank int) (uint64, uint32, error) {
	ch := c.peers[rank].ch[0]
	m, err := c.recv(ch, outAddrLen)
	if err != nil {
		return 0, 0, err
	}
	addr, rkey := binary.LittleEndian.Uint64(m), binary.LittleEndian.Uint32(m[8:])
	return addr, rkey, c.release(ch)
}

// outAddrLen is announceOut's message: an address and a key.
const outAddrLen = 12

// forward sends o (part of m, at element offset off of the output) to ch:
// into the peer's output at raddr when direct, else through its FIFO.
func (c *Comm) forward(ch *channel, m mem, o []byte, raddr uint64, rkey uint32, off int) error {
	if raddr == 0 {
		return c.sendFrom(ch, m, o)
	}
	if err := c.reserve(ch); err != nil {
		return err
	}
	return c.postDirect(ch, o, m.key(ch.q.ep), raddr+uint64(off), rkey)
}

// arrive waits for a message of n bytes on ch and stores it at o; with
// direct writes the data is already there and only the notice comes.
func (c *Comm) arrive(ch *channel, o []byte, direct bool) error {
	if direct {
		if _, err := c.recv(ch, 0); err != nil {
			return err
		}
		return c.release(ch)
	}
	slot, err := c.recv(ch, len(o))
	if err != nil {
		return err
	}
	copy(o, slot)
	return c.release(ch)
}

// mem is a buffer registered with every endpoint (a part of rg).
type mem struct {
	b  []byte
	rg *region
}

func (m mem) at(st, en, es int) []byte { return m.b[st*es : en*es] }
func (m mem) key(ep *endpoint) srcRef  { return srcRef{lkey: m.rg.keys[ep.idx], flag: m.rg.flag} }
func (m mem) sub(off, n int) mem       { return mem{b: m.b[off : off+n], rg: m.rg} }
func ceilDiv(a, b int) int             { return (a + b - 1) / b }
func mod(a, n int) int                 { return ((a % n) + n) % n }
func alignUp(a, b int) int             { return ceilDiv(a, b) * b }
func (c *Comm) chunkElems(es int) int  { return c.opts.ChunkSize / es }
func (c *Comm) piecesPerStep() int     { return max(1, c.opts.Slots/2) }

// channelsFor is how many channels a ring step of the given size uses:
// each carries at least minChannelBytes (more messages of less data
// only add per-message costs), at most Options.Channels.
func (c *Comm) channelsFor(stepBytes int) int {
	return max(1, min(c.opts.Channels, stepBytes/minChannelBytes))
}

// minChannelBytes is the least a ring step puts on one channel.
const minChannelBytes = 64 << 10

func (c *Comm) ch(rank, i int) *channel { return c.peers[rank].ch[i%c.opts.Channels] }
func apply(dt DataType, op RedOp, d, a, b []byte) {
	reduce.Apply(reduce.Type(dt), op.kernel(), d, a, b)
}

// finish applies avg's division (once, to final values).
func (c *Comm) finish(dt DataType, op RedOp, b []byte) {
	if op == Avg && c.nranks > 1 {
		reduce.Div(reduce.Type(dt), b, b, c.nranks)
	}
}

// sendFrom sends b (a part of m) on ch.
//
// On an asynchronous endpoint (tcp) a write reads its source some time
// after posting. Messages up to stageMax are first copied into the
// channel's staging chunk for the message, so the collective need not
// wait for their acknowledgements (a round trip) before it returns; the
// chunk is reused once the credit for the message Slots later arrives,
// which means this one was delivered. Larger ones go from the caller's
// memory, and the collective waits for them at its end (drain): the copy
// would cost more than the one round trip.
func (c *Comm) sendFrom(ch *channel, m mem, b []byte) error {
	if ch.q.ep.sync || len(b) <= ch.inline {
		return c.send(ch, b, m.key(ch.q.ep))
	}
	if len(b) > stageMax {
		return c.sendWaited(ch, m, b)
	}
	if err := c.reserve(ch); err != nil {
		return err
	}
	buf, key, err := c.stage(ch)
	if err != nil {
		return err
	}
	return c.post(ch, buf[:copy(buf, b)], key)
}

// sendWaited sends b (a part of m) on ch straight from m, and the
// collective waits for the write at its end (drain): m must stay
// unchanged until then, and the caller may change it after.
func (c *Comm) sendWaited(ch *channel, m mem, b []byte) error {
	if err := c.send(ch, b, m.key(ch.q.ep)); err != nil {
		return err
	}
	if !ch.q.ep.sync && len(b) > ch.inline {
		ch.q.needed = ch.q.posted - 1 // the data write; the flag is inline
	}
	return nil
}

// sendHeld sends b (a part of m) on ch straight from m, never staged: the
// caller knows that m keeps b until the peer has taken the message in (on
// tcp a write reads its source some time after posting, see sendFrom).
func (c *Comm) sendHeld(ch *channel, m mem, b []byte) error {
	return c.send(ch, b, m.key(ch.q.ep))
}

// ringAllReduce: reduce-scatter then all-gather around the ring. At step s
// (0 ≤ s ≤ 2n-2) rank r handles block (r-s) mod n: steps 1..n-1 add the
// received partial to its input, step n-1 yields the final value, later
// steps pass final values on.
func (c *Comm) ringAllReduce(in, out mem, count int, dt DataType, op RedOp) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	next, prev := (r+1)%n, (r-1+n)%n
	var raddr uint64
	var rkey uint32
	direct := c.directAR(count * es)
	if direct {
		var err error
		if raddr, rkey, err = c.directOut(out, next, prev); err != nil {
			return err
		}
	}
	C, P, ce := c.channelsFor(count*es/n), c.ringARPieces(), c.chunkElems(es)
	align := max(1, 64/es)
	roundE := n * C * P * ce
	for off := 0; off < count; off += roundE {
		rn := min(roundE, count-off)
		bs := alignUp(ceilDiv(rn, n*C), align)
		for s := 0; s <= 2*n-2; s++ {
			b := mod(r-s, n)
			for p := 0; p < P; p++ {
				for ci := 0; ci < C; ci++ {
					base := off + (ci*n+b)*bs
					st := base + p*ce
					en := min(base+min((p+1)*ce, bs), off+rn)
					if st >= en {
						continue
					}
					nc, pc := c.peers[next].ch[ci], c.peers[prev].ch[ci]
					if s == 0 {
						// Unstaged: in's block is overwritten (in place)
						// or the call returns only once the final values
						// of this block came back round, after next
						// took it in.
						if err := c.sendHeld(nc, in, in.at(st, en, es)); err != nil {
							return err
						}
						continue
					}
					o := out.at(st, en, es)
					if s < n-1 {
						// A partial sum: as at step 0, it is overwritten
						// only by the block's final values.
						slot, err := c.recv(pc, (en-st)*es)
						if err != nil {
							return err
						}
						apply(dt, op, o, slot, in.at(st, en, es))
						if err := c.release(pc); err != nil {
							return err
						}
						if err := c.sendHeld(nc, out, o); err != nil {
							return err
						}
						continue
					}
					if s == n-1 {
						slot, err := c.recv(pc, (en-st)*es)
						if err != nil {
							return err
						}
						apply(dt, op, o, slot, in.at(st, en, es))
						c.finish(dt, op, o)
						if err := c.release(pc); err != nil {
							return err
						}
					} else if err := c.arrive(pc, o, direct); err != nil {
						return err
					}
					if s < 2*n-2 {
						ra := uint64(0)
						if direct && s >= n-1 {
							ra = raddr // final values go straight to next's output
						}
						if err := c.forward(nc, out, o, ra, rkey, st*es); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// ringARPieces is the ring AllReduce's pieces per step. With two ranks a
// round sends 2P messages on each channel (P of the input, P of final
// values), and at P = Slots/2 that is the whole FIFO: the next round's
// first pieces wait for the credits of the last round's final values,
// which the peer returns only once it has taken all of them in (every
// ackBatch messages; over tcp a credit is a message, and it may wait for
// the peer's next wait, proto.go "Deferred credits"), so rounds do not
// overlap. Over tcp the pair's ring therefore takes half as many pieces
// per step: a round fills half the FIFO. 2 ranks over tcp on the shared
// 2-core host (load 14-15), µs, medians of 6 alternating launches,
// Slots/2 against Slots/4 pieces (direct writes in both): 64 MiB 49683 /
// 34848, 16 MiB 11214 / 8315, 4 MiB 3183 / 2106; 1 MiB is one round of
// two pieces either way.
// At 4 ranks (6P messages a round) fewer pieces lost: 4 MiB 9470 /
// 11900 (docs/benchmarks.md, "coll over tcp: small calls at 4 ranks,
// large calls at 2"). On shm a credit is a word written at once.
func (c *Comm) ringARPieces() int {
	P := c.piecesPerStep()
	if c.nranks == 2 && !c.allSync {
		P = max(1, P/2)
	}
	return P
}

// treeAllReduce: recursive doubling. With n not a power of two, the first
// 2·rem ranks pair up first (odd ranks hand their data to the even
// neighbour and get the result back at the end).
func (c *Comm) treeAllReduce(in, out mem, count int, dt DataType, op RedOp) error {
	r, es := c.rank, dt.Size()
	p2, rem, src := c.foldStart(in, out, count, es, false)
	nr := r - rem
	if r < 2*rem {
		if r%2 == 1 {
			if err := c.sendAll(r-1, out, count, es); err != nil {
				return err
			}
			nr = -1
		} else {
			if err := c.recvReduce(r+1, out, count, dt, op); err != nil {
				return err
			}
			nr = r / 2
		}
	}
	if nr >= 0 {
		for mask := 1; mask < p2; mask <<= 1 {
			if err := c.exchangeReduce(coreRank(nr^mask, rem), src, out, count, dt, op); err != nil {
				return err
			}
			src = out
		}
		c.finish(dt, op, out.b[:count*es])
	}
	if r < 2*rem {
		if r%2 == 0 {
			return c.sendAll(r+1, out, count, es)
		}
		return c.recvCopy(r-1, out, count, es)
	}
	return nil
}

// foldStart begins an AllReduce over n ranks that runs on the largest
// power of two p2 ≤ n of them (the core) and returns p2 and rem = n − p2.
// The first 2·rem ranks pair up first, odd ranks handing their data to the
// even neighbour; the core's member v is rank coreRank(v, rem).
//
// src is where the core's first exchange takes this rank's vector from.
// With fromIn, when n is a power of two, it is in itself: that exchange
// reduces in and what arrives into out, and sends from in, with no copy
// of the whole vector into out first (the halving AllReduce: the copy was
// a tenth of a rank's CPU at 4 ranks over tcp, 1 MiB). Otherwise it is
// out, into which in is copied here (unless in place). The tree keeps the
// copy: at its sizes (up to about 100 KiB) the copy costs little, and
// reducing from a third buffer measured no faster (2 ranks over tcp,
// 64 KiB: 27.4 µs with the copy, 28.5 without, medians of 9 alternating).
func (c *Comm) foldStart(in, out mem, count, es int, fromIn bool) (p2, rem int, src mem) {
	p2 = 1
	for p2*2 <= c.nranks {
		p2 *= 2
	}
	rem = c.nranks - p2
	if fromIn && rem == 0 && p2 > 1 {
		return p2, 0, in
	}
	if &in.b[0] != &out.b[0] {
		copy(out.b[:count*es], in.b[:count*es])
	}
	return p2, rem, out
}

// coreRank is the rank of member v of foldStart's power-of-two core.
func coreRank(v, rem int) int {
	if v < rem {
		return v * 2
	}
	return v + rem
}

// sendAll sends m[0:count) to rank dst, piece by piece over the channels.
func (c *Comm) sendAll(dst int, m mem, count, es int) error {
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		if err := c.sendFrom(c.ch(dst, p), m, m.at(st, min(st+ce, count), es)); err != nil {
			return err
		}
	}
	return nil
}

// recvCopy receives count elements from src into m.
func (c *Comm) recvCopy(src int, m mem, count, es int) error {
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		if err := c.copyIn(c.ch(src, p), m, st, min(st+ce, count), es); err != nil {
			return err
		}
	}
	return nil
}

// copyIn receives ch's next message, elements [st, en) of the peer's
// data, into the same elements of m (reduceIn's twin).
func (c *Comm) copyIn(ch *channel, m mem, st, en, es int) error {
	slot, err := c.recv(ch, (en-st)*es)
	if err != nil {
		return err
	}
	copy(m.at(st, en, es), slot)
	return c.release(ch)
}

// recvReduce receives count elements from src and reduces them into m.
func (c *Comm) recvReduce(src int, m mem, count int, dt DataType, op RedOp) error {
	es := dt.Size()
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		if err := c.reduceIn(c.ch(src, p), m, st, min(st+ce, count), dt, op); err != nil {
			return err
		}
	}
	return nil
}

// reduceIn receives ch's next message, elements [st, en) of the peer's
// data, and reduces it into the same elements of m.
func (c *Comm) reduceIn(ch *channel, m mem, st, en int, dt DataType, op RedOp) error {
	return c.reduceFrom(ch, m, m, st, en, dt, op)
}

// reduceFrom is reduceIn with the local operand taken from a: the same
// elements of m become a's ⊕ the peer's (a may be m).
func (c *Comm) reduceFrom(ch *channel, a, m mem, st, en int, dt DataType, op RedOp) error {
	es := dt.Size()
	slot, err := c.recv(ch, (en-st)*es)
	if err != nil {
		return err
	}
	apply(dt, op, m.at(st, en, es), slot, a.at(st, en, es))
	return c.release(ch)
}

// sendCopy sends o (part of m) as ch's next message, taken at once: on a
// transport whose writes read their source later (tcp) it goes out from a
// staging copy, so m may change as soon as sendCopy returns.
func (c *Comm) sendCopy(ch *channel, m mem, o []byte) error {
	if err := c.reserve(ch); err != nil {
		return err
	}
	src, key := o, m.key(ch.q.ep)
	if !ch.q.ep.sync && len(o) > ch.inline {
		buf, k, err := c.stage(ch)
		if err != nil {
			return err
		}
		src, key = buf[:copy(buf, o)], k
	}
	return c.post(ch, src, key)
}

// exchangeReduce sends src (m itself, or the vector m is to hold: the
// first exchange's, see foldStart) to partner and reduces: m = theirs ⊕
// src.
// Each piece goes out before the partner's arrives; on a transport whose
// writes finish later (tcp) it goes out from a staging copy, since m is
// overwritten right after.
func (c *Comm) exchangeReduce(partner int, src, m mem, count int, dt DataType, op RedOp) error {
	es := dt.Size()
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		ch := c.ch(partner, p)
		if err := c.sendCopy(ch, src, src.at(st, en, es)); err != nil {
			return err
		}
		if err := c.reduceFrom(ch, src, m, st, en, dt, op); err != nil {
			return err
		}
	}
	return nil
}

// ringAllGather: step s (0..n-1) handles block (r-s) mod n: step 0 sends
// our own, later steps store the received block and pass it on.
func (c *Comm) ringAllGather(in, out mem, count, es int) error {
	n, r := c.nranks, c.rank
	next, prev := (r+1)%n, (r-1+n)%n
	own := &in.b[0] != &out.b[r*count*es] // our block still to copy
	var raddr uint64
	var rkey uint32
	direct := c.direct(n * count * es)
	if direct {
		var err error
		if raddr, rkey, err = c.directOut(out, next, prev); err != nil {
			return err
		}
	}
	C, P, ce := c.channelsFor(count*es), c.piecesPerStep(), c.chunkElems(es)
	align := max(1, 64/es)
	roundE := C * P * ce
	for off := 0; off < count; off += roundE {
		rn := min(roundE, count-off)
		bs := alignUp(ceilDiv(rn, C), align)
		for s := 0; s < n; s++ {
			b := mod(r-s, n)
			if s == 1 && own {
				// Our own block, once our first pieces are on their way:
				// the copy overlaps with theirs in flight.
				copy(out.at(r*count, (r+1)*count, es), in.b[:count*es])
				own = false
			}
			for p := 0; p < P; p++ {
				for ci := 0; ci < C; ci++ {
					base := off + ci*bs
					st := base + p*ce
					en := min(base+min((p+1)*ce, bs), off+rn)
					if st >= en {
						continue
					}
					nc, pc := c.peers[next].ch[ci], c.peers[prev].ch[ci]
					if s == 0 {
						if err := c.forward(nc, in, in.at(st, en, es), raddr, rkey, (b*count+st)*es); err != nil {
							return err
						}
						continue
					}
					o := out.at(b*count+st, b*count+en, es)
					if err := c.arrive(pc, o, direct); err != nil {
						return err
					}
					if s < n-1 {
						if err := c.forward(nc, out, o, raddr, rkey, (b*count+st)*es); err != nil {
							return err
						}
					}
				}
			}
		}
	}
	return nil
}

// ringReduceScatter: step s (0..n-1) handles block (r-s-1) mod n; partial
// sums travel in staging chunks, the last step (block r) lands in out.
func (c *Comm) ringReduceScatter(in, out mem, count int, dt DataType, op RedOp) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	next, prev := (r+1)%n, (r-1+n)%n
	C, P, ce := c.channelsFor(count*es), c.piecesPerStep(), c.chunkElems(es)
	align := max(1, 64/es)
	roundE := C * P * ce
	for off := 0; off < count; off += roundE {
		rn := min(roundE, count-off)
		bs := alignUp(ceilDiv(rn, C), align)
		for s := 0; s < n; s++ {
			b := mod(r-s-1, n)
			for p := 0; p < P; p++ {
				for ci := 0; ci < C; ci++ {
					base := off + ci*bs
					st := base + p*ce
					en := min(base+min((p+1)*ce, bs), off+rn)
					if st >= en {
						continue
					}
					nc, pc := c.peers[next].ch[ci], c.peers[prev].ch[ci]
					x := in.at(b*count+st, b*count+en, es)
					if s == 0 {
						if err := c.sendFrom(nc, in, x); err != nil {
							return err
						}
						continue
					}
					slot, err := c.recv(pc, (en-st)*es)
					if err != nil {
						return err
					}
					if s == n-1 {
						o := out.at(st, en, es)
						apply(dt, op, o, slot, x)
						c.finish(dt, op, o)
						if err := c.release(pc); err != nil {
							return err
						}
						continue
					}
					if err := c.reserve(nc); err != nil {
						return err
					}
					buf, key, err := c.stage(nc)
					if err != nil {
						return err
					}
					o := buf[:len(x)]
					apply(dt, op, o, slot, x)
					if err := c.release(pc); err != nil {
						return err
					}
					if err := c.post(nc, o, key); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// chainBroadcast pipelines the data along root, root+1, ..., root-1.
func (c *Comm) chainBroadcast(in, out mem, count, es, root int) error {
	n, r := c.nranks, c.rank
	q := mod(r-root, n)
	next, prev := (r+1)%n, (r-1+n)%n
	// Direct writes along the chain: each rank but the root tells its
	// predecessor where its output is, and the last one has no successor.
	var raddr uint64
	var rkey uint32
	direct := c.direct(count * es)
	if direct {
		var err error
		if q > 0 {
			var b [12]byte
			pc := c.peers[prev].ch[0]
			binary.LittleEndian.PutUint64(b[:], uint64(sys.Addr(out.b)))
			binary.LittleEndian.PutUint32(b[8:], out.rg.rkeys[pc.q.ep.idx])
			if err = c.sendSmall(pc, b[:]); err != nil {
				return err
			}
		}
		if q < n-1 {
			nc := c.peers[next].ch[0]
			m, err := c.recv(nc, 12)
			if err != nil {
				return err
			}
			raddr, rkey = binary.LittleEndian.Uint64(m), binary.LittleEndian.Uint32(m[8:])
			if err := c.release(nc); err != nil {
				return err
			}
		}
	}
	src := out
	if q == 0 {
		src = in
		if &in.b[0] != &out.b[0] {
			copy(out.b[:count*es], in.b[:count*es])
		}
	}
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		o := src.at(st, en, es)
		if q > 0 {
			if err := c.arrive(c.ch(prev, p), o, direct); err != nil {
				return err
			}
		}
		if q < n-1 {
			if err := c.forward(c.ch(next, p), src, o, raddr, rkey, st*es); err != nil {
				return err
			}
		}
	}
	return nil
}

// chainReduce pipelines partial results along root+1, ..., root.
func (c *Comm) chainReduce(in, out mem, count int, dt DataType, op RedOp, root int) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	q := mod(r-root-1, n)
	next, prev := (r+1)%n, (r-1+n)%n
	if q == 0 {
		return c.sendAll(next, in, count, es)
	}
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		pc := c.ch(prev, p)
		slot, err := c.recv(pc, (en-st)*es)
		if err != nil {
			return err
		}
		x := in.at(st, en, es)
		if q == n-1 {
			o := out.at(st, en, es)
			apply(dt, op, o, slot, x)
			c.finish(dt, op, o)
			if err := c.release(pc); err != nil {
				return err
			}
			continue
		}
		nc := c.ch(next, p)
		if err := c.reserve(nc); err != nil {
			return err
		}
		buf, key, err := c.stage(nc)
		if err != nil {
			return err
		}
		o := buf[:len(x)]
		apply(dt, op, o, slot, x)
		if err := c.release(pc); err != nil {
			return err
		}
		if err := c.post(nc, o, key); err != nil {
			return err
		}
	}
	return nil
}

// binomial returns the parent (-1 for the root) and the children, largest
// subtree first, of relative rank q in a binomial tree of n ranks, mapped
// back to real ranks around root. kids is reused.
func binomial(q, n, root int, kids []int) (int, []int) {
	parent := -1
	lim := 1
	for lim < n {
		lim <<= 1
	}
	if q != 0 {
		low := q & -q
		parent = (q - low + root) % n
		lim = low
	}
	kids = kids[:0]
	for m := lim >> 1; m >= 1; m >>= 1 {
		if q+m < n {
			kids = append(kids, (q+m+root)%n)
		}
	}
	return parent, kids
}

// treeBroadcast sends each piece down a binomial tree.
func (c *Comm) treeBroadcast(in, out mem, count, es, root int) error {
	var kb [64]int
	q := mod(c.rank-root, c.nranks)
	parent, kids := binomial(q, c.nranks, root, kb[:0])
	src := out
	if parent < 0 {
		src = in
		if &in.b[0] != &out.b[0] {
			copy(out.b[:count*es], in.b[:count*es])
		}
	}
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		if parent >= 0 {
			pc := c.ch(parent, p)
			slot, err := c.recv(pc, (en-st)*es)
			if err != nil {
				return err
			}
			copy(out.at(st, en, es), slot)
			if err := c.release(pc); err != nil {
				return err
			}
		}
		for _, k := range kids {
			if err := c.sendFrom(c.ch(k, p), src, src.at(st, en, es)); err != nil {
				return err
			}
		}
	}
	return nil
}

// treeReduce reduces each piece up a binomial tree, children smallest
// subtree first (the order is fixed, so results are reproducible).
func (c *Comm) treeReduce(in, out mem, count int, dt DataType, op RedOp, root int) error {
	es := dt.Size()
	var kb [64]int
	q := mod(c.rank-root, c.nranks)
	parent, kids := binomial(q, c.nranks, root, kb[:0])
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		x := in.at(st, en, es)
		if parent >= 0 && len(kids) == 0 {
			if err := c.sendFrom(c.ch(parent, p), in, x); err != nil {
				return err
			}
			continue
		}
		var acc []byte
		var key srcRef
		var pc *channel
		if parent >= 0 {
			pc = c.ch(parent, p)
			if err := c.reserve(pc); err != nil {
				return err
			}
			buf, k, err := c.stage(pc)
			if err != nil {
				return err
			}
			acc, key = buf[:len(x)], k
		} else {
			acc = out.at(st, en, es)
		}
		cur := x
		for i := len(kids) - 1; i >= 0; i-- {
			kc := c.ch(kids[i], p)
			slot, err := c.recv(kc, len(x))
			if err != nil {
				return err
			}
			apply(dt, op, acc, slot, cur)
			cur = acc
			if err := c.release(kc); err != nil {
				return err
			}
		}
		if parent < 0 {
			if len(kids) == 0 {
				copy(acc, x)
			}
			c.finish(dt, op, acc)
			continue
		}
		if err := c.post(pc, acc, key); err != nil {
			return err
		}
	}
	return nil
}

// allToAll exchanges blocks pairwise: at step s, send to r+s, receive
// from r-s.
func (c *Comm) allToAll(in, out mem, count, es int) error {
	n, r := c.nranks, c.rank
	copy(out.at(r*count, (r+1)*count, es), in.at(r*count, (r+1)*count, es))
	ce := c.chunkElems(es)
	for s := 1; s < n; s++ {
		dst, src := (r+s)%n, (r-s+n)%n
		for p, st := 0, 0; st < count; p, st = p+1, st+ce {
			en := min(st+ce, count)
			if err := c.sendFrom(c.ch(dst, p), in, in.at(dst*count+st, dst*count+en, es)); err != nil {
				return err
			}
			ch := c.ch(src, p)
			slot, err := c.recv(ch, (en-st)*es)
			if err != nil {
				return err
			}
			copy(out.at(src*count+st, src*count+en, es), slot)
			if err := c.release(ch); err != nil {
				return err
			}
		}
	}
	return nil
}

// sendRecv sends scount elements of in to dst and receives rcount into out
// from src (either may be -1), interleaving pieces.
func (c *Comm) sendRecv(in mem, scount, dst int, out mem, rcount, src, es int, ssig, rsig uint32) error {
	ce := c.chunkElems(es)
	if dst < 0 {
		scount = 0
	}
	if src < 0 {
		rcount = 0
	}
	for p, st := 0, 0; st < scount || st < rcount; p, st = p+1, st+ce {
		if st < scount {
			c.op.sig = ssig
			if err := c.sendFrom(c.ch(dst, p), in, in.at(st, min(st+ce, scount), es)); err != nil {
				return err
			}
		}
		if st < rcount {
			en := min(st+ce, rcount)
			ch := c.ch(src, p)
			c.op.sig = rsig
			slot, err := c.recv(ch, (en-st)*es)
			if err != nil {
				return err
			}
			copy(out.at(st, en, es), slot)
			if err := c.release(ch); err != nil {
				return err
			}
		}
	}
	return nil
}

// barrier: dissemination, log2(n) rounds of empty messages.
func (c *Comm) barrier() error {
	n, r := c.nranks, c.rank
	for k := 1; k < n; k <<= 1 {
		if err := c.send(c.peers[(r+k)%n].ch[0], nil, srcRef{}); err != nil {
			return err
		}
		ch := c.peers[(r-k+n)%n].ch[0]
		if _, err := c.recv(ch, 0); err != nil {
			return err
		}
		if err := c.release(ch); err != nil {
			return err
		}
	}
	return nil
}
