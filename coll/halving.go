package coll

// The halving algorithms (AlgoHalving), for rank counts where a ring's
// n−1 or 2(n−1) dependent steps cost more than the bytes (many ranks over
// tcp, ranks outnumbering cores: every step of a ring waits for the rank
// before it to be scheduled). They run in the calling goroutine, as the
// others in algo.go do.
//
// AllReduce (Rabenseifner's): a reduce-scatter by recursive halving (at
// each of log₂ p steps a rank swaps half of its current range with its
// partner and reduces the half it keeps) then an all-gather by recursive
// doubling (the steps in reverse, each rank sending its range and
// receiving its partner's): each rank sends 2(p−1)/p of the vector, as
// the ring does, in 2 log₂ p steps instead of 2(p−1). A rank count that
// is not a power of two is folded first as treeAllReduce does (the odd
// ones of the first 2·rem ranks hand their vector to the even neighbour
// and get the result back at the end).
//
// AllGather: recursive doubling over a power-of-two rank count (else the
// ring): at step m a rank sends the m blocks it has to its partner and
// receives the partner's m.
//
// Sources. A message on a transport whose writes read their source after
// posting (tcp) goes out of the caller's memory without a staging copy
// when that memory does not change before the peer has received it: the
// halves sent while halving are overwritten only by the doubling steps,
// whose data comes from the same partner after it received them (the
// first step's come from the caller's input, which the call does not
// change, and its partner is the last doubling step's). What the
// doubling steps send is final (output) data the caller may change once
// the call returns: the steps before the last send it straight and wait
// for the writes at the end (long done by then), the last through
// sendFrom.
//
// Direct writes. From hdDirectMin bytes of output (512 KiB) the doubling
// steps (AllGather's, and AllReduce's second half) write straight into
// the partner's output buffer, each piece followed by a notice, instead of
// through its FIFO: the receiver copies nothing (over tcp the transport
// reads the bytes from the socket into place), and the sender's pieces,
// final data, are waited for at the end. Each rank sends its output's
// address and key to its partners at the start of every call (see
// hdAnnounce below). 4 and 8 ranks over tcp, AllGather 1 MiB: see
// docs/benchmarks.md, "Halving over tcp: doubling steps into the
// partner's output".

// hdMaxSteps bounds log₂ of the rank count (ranks are an int32).
const hdMaxSteps = 32

// halvingAllReduce is Rabenseifner's AllReduce, described above.
func (c *Comm) halvingAllReduce(in, out mem, count int, dt DataType, op RedOp) error {
	r, es := c.rank, dt.Size()
	p2, rem, src := c.foldStart(in, out, count, es, true)
	nr := r - rem
	if r < 2*rem {
		if r%2 == 1 {
			// out is overwritten only by the result r-1 sends back,
			// after it received this.
			if err := c.sendAllHeld(r-1, out, count, es); err != nil {
				return err
			}
			return c.recvCopy(r-1, out, count, es)
		}
		if err := c.recvReduce(r+1, out, count, dt, op); err != nil {
			return err
		}
		nr = r / 2
	}
	var d hdDirect
	direct := c.hdDirect(count * es)
	if direct {
		if err := c.hdAnnounce(out, nr, rem, p2, 1); err != nil {
			return err
		}
	}
	align := max(1, 64/es)
	var lo, hi [hdMaxSteps]int
	l, h, k := 0, count, 0
	for mask := p2 >> 1; mask >= 1; mask >>= 1 {
		partner := coreRank(nr^mask, rem)
		if direct {
			// Its address comes before its data on the channel.
			if err := d.learn(c, k, partner); err != nil {
				return err
			}
		}
		mid := min(h, l+alignUp(ceilDiv(h-l, 2), align))
		sl, sh, kl, kh := mid, h, l, mid // send the upper half, keep the lower
		if nr&mask != 0 {
			sl, sh, kl, kh = l, mid, mid, h
		}
		if err := c.halvingStep(partner, src, out, sl, sh, kl, kh, dt, op); err != nil {
			return err
		}
		src = out
		lo[k], hi[k] = l, h
		k++
		l, h = kl, kh
	}
	c.finish(dt, op, out.at(l, h, es))
	for mask := 1; mask < p2; mask <<= 1 {
		k--
		partner := coreRank(nr^mask, rem)
		// The partner holds the rest of [lo[k], hi[k]).
		rl, rh := lo[k], l
		if l == lo[k] {
			rl, rh = h, hi[k]
		}
		if err := c.doublingStep(partner, out, l, h, rl, rh, es, mask<<1 < p2, d.addr[k], d.rkey[k]); err != nil {
			return err
		}
		l, h = lo[k], hi[k]
	}
	if r < 2*rem {
		return c.sendAll(r+1, out, count, es)
	}
	return nil
}

// halvingStep sends src[sl, sh) to partner and reduces what it sends of
// [kl, kh) with src[kl, kh) into m, a piece at a time, up to
// piecesPerStep pieces ahead. The partner does the same with the halves
// swapped, so both ranges have as many pieces or one fewer. src is m, or
// at the first step the caller's input (foldStart), which stays unchanged
// until the partner has it: the partner sends the last doubling step's
// data, which the call waits for, after it received this.
func (c *Comm) halvingStep(partner int, src, m mem, sl, sh, kl, kh int, dt DataType, op RedOp) error {
	es := dt.Size()
	ce := c.chunkElems(es)
	ns, nk := ceilDiv(sh-sl, ce), ceilDiv(kh-kl, ce)
	ahead := c.piecesPerStep() - 1
	for j := 0; j < ns || j-ahead < nk; j++ {
		if j < ns {
			st := sl + j*ce
			// Unstaged: see the file's comment on sources.
			if err := c.sendHeld(c.ch(partner, j), src, src.at(st, min(st+ce, sh), es)); err != nil {
				return err
			}
		}
		if i := j - ahead; i >= 0 && i < nk {
			st := kl + i*ce
			if err := c.reduceFrom(c.ch(partner, i), src, m, st, min(st+ce, kh), dt, op); err != nil {
				return err
			}
		}
	}
	return nil
}

// doublingStep sends m[sl, sh) (final data) to partner and receives
// m[rl, rh) from it, a piece at a time, up to piecesPerStep pieces ahead.
//
// waited sends straight from m, and the collective waits for those writes
// at its end (sendWaited): the steps before the last, whose writes the
// partner has long taken in by then; the last one's go through sendFrom
// (staged, so that the call ends without a round trip; sending those
// straight too measured no faster: 8 ranks over tcp, AllReduce 1 MiB 4346
// against 4243 µs, AllGather 2662 / 2617, medians of 3 at load 15).
//
// With raddr (not 0) the pieces go straight into the partner's output, at
// raddr (its m's address, rkey its key) plus their offset, each followed
// by an empty message that says it is there (postDirect), and what the
// partner sends lands in m the same way: nothing is copied out of a FIFO
// slot, and the collective waits for the writes at its end.
func (c *Comm) doublingStep(partner int, m mem, sl, sh, rl, rh, es int, waited bool, raddr uint64, rkey uint32) error {
	ce := c.chunkElems(es)
	ns, nr := ceilDiv(sh-sl, ce), ceilDiv(rh-rl, ce)
	ahead := c.piecesPerStep() - 1
	for j := 0; j < ns || j-ahead < nr; j++ {
		if j < ns {
			st := sl + j*ce
			var err error
			if raddr != 0 {
				err = c.forward(c.ch(partner, j), m, m.at(st, min(st+ce, sh), es), raddr, rkey, st*es)
			} else if waited {
				err = c.sendWaited(c.ch(partner, j), m, m.at(st, min(st+ce, sh), es))
			} else {
				err = c.sendFrom(c.ch(partner, j), m, m.at(st, min(st+ce, sh), es))
			}
			if err != nil {
				return err
			}
		}
		if i := j - ahead; i >= 0 && i < nr {
			st := rl + i*ce
			var err error
			if raddr != 0 {
				err = c.arrive(c.ch(partner, i), nil, true)
			} else {
				err = c.copyIn(c.ch(partner, i), m, st, min(st+ce, rh), es)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// sendAllHeld sends m[0:count) to dst piece by piece straight from m
// (sendHeld: the caller knows m stays unchanged until dst has received
// it); sendAll is the staged form.
func (c *Comm) sendAllHeld(dst int, m mem, count, es int) error {
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		if err := c.sendHeld(c.ch(dst, p), m, m.at(st, min(st+ce, count), es)); err != nil {
			return err
		}
	}
	return nil
}

// halvingAllGather is recursive doubling over a power-of-two rank count
// (the caller checks): at step mask, rank r sends its mask blocks,
// starting at block r &^ (mask−1), to r ^ mask and receives as many.
func (c *Comm) halvingAllGather(in, out mem, count, es int) error {
	r := c.rank
	if &in.b[0] != &out.b[r*count*es] {
		copy(out.at(r*count, (r+1)*count, es), in.b[:count*es])
	}
	// The first step goes through the FIFO: writing it directly would
	// have to wait for the partner's address, that is for the partner to
	// have started the call, where through the FIFO the data goes as soon
	// as this rank starts (with ranks outnumbering cores the partner may
	// not run for a while). Later partners' addresses came before their
	// first step's data, which this rank has by then.
	direct := c.hdDirect(len(out.b))
	if direct {
		if err := c.hdAnnounce(out, r, 0, c.nranks, 2); err != nil {
			return err
		}
	}
	var d hdDirect
	for k, mask := 0, 1; mask < c.nranks; k, mask = k+1, mask<<1 {
		partner := r ^ mask
		if direct && mask > 1 {
			if err := d.learn(c, k, partner); err != nil {
				return err
			}
		}
		mine, theirs := (r&^(mask-1))*count, (partner&^(mask-1))*count
		if err := c.doublingStep(partner, out, mine, mine+mask*count, theirs, theirs+mask*count, es, mask<<1 < c.nranks, d.addr[k], d.rkey[k]); err != nil {
			return err
		}
	}
	return nil
}

// Direct writes. From hdDirectMin bytes (of the output) the doubling
// steps write final data straight into the partner's output buffer
// (doublingStep), as the ring does on shm (algo.go, directOut): over tcp
// the transport then places the bytes there as it reads them from the
// socket, one copy on each side instead of a copy out of a FIFO slot
// besides. Every rank tells each of its partners where its output is with
// a small message at the start of the call (hdAnnounce: it is the call's
// first message to that partner on channel 0), and takes each partner's
// before its first exchange with it (hdDirect.learn); AllGather's first
// step, which nothing precedes, is not direct (see halvingAllGather). The address is
// learnt anew in every call and a partner writes only before the notice
// this rank waits for, so nothing is written into the buffer once the
// call has returned (it may be freed or changed then). The output is
// always registered memory: the caller's, or the output bounce buffer
// when the caller's is not (ops.go, output).
//
// 512 KiB: below it the copy saved is small and the addresses cost more
// (4 and 8 ranks over tcp, AllGather 256 KiB, A/B medians: 225 / 269 µs,
// 1066 / 1369; 512 KiB 403 / 359, 2707 / 2452; docs/benchmarks.md).
var hdDirectMin = 512 << 10

// hdDirect says whether a halving collective with an n-byte output
// writes directly; every rank decides alike.
func (c *Comm) hdDirect(n int) bool { return n >= hdDirectMin }

// hdAnnounce sends out's address and key to the partners of the doubling
// steps from mask from on, over a power-of-two core of p2 ranks (this rank
// being core member nr; rem as coreRank's).
func (c *Comm) hdAnnounce(out mem, nr, rem, p2, from int) error {
	if testHookHDDirect != nil {
		testHookHDDirect(c)
	}
	for mask := from; mask < p2; mask <<= 1 {
		if err := c.announceOut(out, coreRank(nr^mask, rem)); err != nil {
			return err
		}
	}
	return nil
}

// testHookHDDirect, when set (tests), runs when a halving collective
// takes the direct path.
var testHookHDDirect func(c *Comm)

// hdDirect holds the partners' output addresses and keys, by step (from
// the step with partner nr^1); zero where not learnt.
type hdDirect struct {
	addr [hdMaxSteps]uint64
	rkey [hdMaxSteps]uint32
}

// learn receives the address partner sent with hdAnnounce into entry k
// (the caller's index of the step with that partner).
func (d *hdDirect) learn(c *Comm, k, partner int) (err error) {
	d.addr[k], d.rkey[k], err = c.learnOut(partner)
	return err
}

// halvingReduceScatter is recursive halving over a power-of-two rank
// count (the caller checks): at step mask (n/2 down to 1) rank r keeps
// the half of its current range of blocks that holds block r, sends the
// other half to r ^ mask and adds what the partner sends for the kept
// half. The partial sums live in the scratch region (n/2 blocks); the
// first step sends from in, the last leaves block r in out.
func (c *Comm) halvingReduceScatter(in, out mem, count int, dt DataType, op RedOp) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	w, err := c.bounce(&c.hdScratch, n/2*count*es)
	if err != nil {
		return err
	}
	l, h := 0, n // blocks
	base := 0    // the block at w's start
	for mask := n >> 1; mask >= 1; mask >>= 1 {
		partner := r ^ mask
		mid := l + (h-l)/2
		sl, sh, kl, kh := mid, h, l, mid
		if r&mask != 0 {
			sl, sh, kl, kh = l, mid, mid, h
		}
		hs := halvingSides{partner: partner, dt: dt, op: op}
		// What goes out: in's blocks at the first step (waited for at
		// the end: the caller may change in after), then partial sums
		// in w (waited for too: the next call writes w again), the last
		// step's single block through sendFrom.
		if mask == n>>1 {
			hs.src, hs.sst, hs.waited = in, sl*count, true
			base = kl
		} else {
			hs.src, hs.sst, hs.waited = w, (sl-base)*count, mask > 1
		}
		hs.ns = (sh - sl) * count
		// What comes in is added to ours (in's blocks at the first step,
		// the partial sums after) into w, or at the last step into out.
		hs.nk = (kh - kl) * count
		if mask == n>>1 {
			hs.a, hs.ast = in, kl*count
		} else {
			hs.a, hs.ast = w, (kl-base)*count
		}
		hs.dst, hs.dst0 = w, (kl-base)*count
		if mask == 1 {
			hs.dst, hs.dst0 = out, 0
		}
		if err := c.halvingSides(&hs); err != nil {
			return err
		}
		l, h = kl, kh
	}
	c.finish(dt, op, out.b[:count*es])
	return nil
}

// halvingSides is one exchange of halvingReduceScatter: ns elements of
// src from sst go to partner; nk elements come from it, and dst[dst0:] =
// a[ast:] ⊕ them.
type halvingSides struct {
	partner   int
	dt        DataType
	op        RedOp
	src       mem
	sst, ns   int
	waited    bool
	a, dst    mem
	ast, dst0 int
	nk        int
}

// halvingSides runs hs a piece at a time, up to piecesPerStep pieces
// ahead (the partner sends as many as it receives: no credit cycle).
func (c *Comm) halvingSides(hs *halvingSides) error {
	es := hs.dt.Size()
	ce := c.chunkElems(es)
	np, nk := ceilDiv(hs.ns, ce), ceilDiv(hs.nk, ce)
	ahead := c.piecesPerStep() - 1
	for j := 0; j < np || j-ahead < nk; j++ {
		if j < np {
			st := hs.sst + j*ce
			b := hs.src.at(st, min(st+ce, hs.sst+hs.ns), es)
			ch := c.ch(hs.partner, j)
			var err error
			if hs.waited {
				err = c.sendWaited(ch, hs.src, b)
			} else {
				err = c.sendFrom(ch, hs.src, b)
			}
			if err != nil {
				return err
			}
		}
		if i := j - ahead; i >= 0 && i < nk {
			e := min(ce, hs.nk-i*ce)
			ch := c.ch(hs.partner, i)
			slot, err := c.recv(ch, e*es)
			if err != nil {
				return err
			}
			apply(hs.dt, hs.op, hs.dst.at(hs.dst0+i*ce, hs.dst0+i*ce+e, es), slot, hs.a.at(hs.ast+i*ce, hs.ast+i*ce+e, es))
			if err := c.release(ch); err != nil {
				return err
			}
		}
	}
	return nil
}
