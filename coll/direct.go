package coll

// The direct algorithms (AlgoDirect): every rank sends its part straight
// to every rank that needs it, then takes what the others sent. One step
// instead of the ring's n−1 (or 2(n−1)) or recursive doubling's log₂ n,
// for the same bytes (AllGather, ReduceScatter) or n−1 times the vector
// (AllReduce): the choice for small messages among more than two ranks,
// where a step's fixed cost (a flag write, a poll, a wake-up) dominates.
// Like the others they run in the goroutine calling the collective.
//
// Deadlock freedom: a piece (at most one chunk) goes to every peer before
// any is received, over the channel the piece number picks, so a rank is
// at most one piece ahead of any peer: two unconsumed messages per
// channel, within the Slots-ackBatch+1 a sender may run ahead (in each
// lane: the LL and small-message rings allow more, proto.go).
//
// Reductions fold the ranks' values in rank order (x₀ ⊕ x₁ ⊕ … ⊕ xₙ₋₁) on
// every rank, so that AllReduce leaves the same bits everywhere, as the
// ring and recursive doubling do.

// directAllGather: each piece of our block goes to every peer; the
// peers' pieces land in their blocks.
func (c *Comm) directAllGather(in, out mem, count, es int) error {
	n, r := c.nranks, c.rank
	own := &in.b[0] != &out.b[r*count*es] // our block still to copy
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		for i := 1; i < n; i++ {
			if err := c.sendFrom(c.ch((r+i)%n, p), in, in.at(st, en, es)); err != nil {
				return err
			}
		}
		if own {
			// Once our first pieces are on their way: the copy overlaps
			// with theirs in flight.
			copy(out.at(r*count, (r+1)*count, es), in.b[:count*es])
			own = false
		}
		for i := 1; i < n; i++ {
			j := (r - i + n) % n
			if err := c.arrive(c.ch(j, p), out.at(j*count+st, j*count+en, es), false); err != nil {
				return err
			}
		}
	}
	return nil
}

// directReduceScatter: block j of our input goes to rank j; block r is
// folded from every rank's block r.
func (c *Comm) directReduceScatter(in, out mem, count int, dt DataType, op RedOp) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		for i := 1; i < n; i++ {
			j := (r + i) % n
			if err := c.sendFrom(c.ch(j, p), in, in.at(j*count+st, j*count+en, es)); err != nil {
				return err
			}
		}
		if err := c.foldRanks(p, in.at(r*count+st, r*count+en, es), out.at(st, en, es), dt, op); err != nil {
			return err
		}
	}
	return nil
}

// directAllReduce: the whole vector goes to every peer (from a staging
// copy on tcp: the output may be the input, and is written next); every
// rank folds all of them.
func (c *Comm) directAllReduce(in, out mem, count int, dt DataType, op RedOp) error {
	n, r, es := c.nranks, c.rank, dt.Size()
	ce := c.chunkElems(es)
	for p, st := 0, 0; st < count; p, st = p+1, st+ce {
		en := min(st+ce, count)
		x := in.at(st, en, es)
		for i := 1; i < n; i++ {
			if err := c.sendCopy(c.ch((r+i)%n, p), in, x); err != nil {
				return err
			}
		}
		if err := c.foldRanks(p, x, out.at(st, en, es), dt, op); err != nil {
			return err
		}
	}
	return nil
}

// foldRanks receives piece p from every peer and stores the reduction of
// all ranks' values, in rank order, into acc (our own value is mine,
// which may be acc itself).
func (c *Comm) foldRanks(p int, mine, acc []byte, dt DataType, op RedOp) error {
	n, r := c.nranks, c.rank
	if cap(c.foldIn) < n {
		c.foldIn = make([][]byte, n)
	}
	xs := c.foldIn[:n]
	defer clear(xs)
	for j := 0; j < n; j++ {
		if j == r {
			xs[j] = mine
			continue
		}
		slot, err := c.recv(c.ch(j, p), len(acc))
		if err != nil {
			return err
		}
		xs[j] = slot
	}
	if r >= 2 && sameStart(mine, acc) {
		// acc is written by the first fold, before our value's turn.
		if len(c.scratch) < len(acc) {
			c.scratch = make([]byte, max(len(acc), 2*len(c.scratch)))
		}
		xs[r] = c.scratch[:copy(c.scratch, mine)]
	}
	apply(dt, op, acc, xs[0], xs[1])
	for j := 2; j < n; j++ {
		apply(dt, op, acc, acc, xs[j])
	}
	c.finish(dt, op, acc)
	for j := 0; j < n; j++ {
		if j != r {
			if err := c.release(c.ch(j, p)); err != nil {
				return err
			}
		}
	}
	return nil
}
