package coll

// Algorithm choice (Options.Algorithm auto): a small tuning table by
// collective, rank count and size, then the tree/ring size rule. Every
// rank decides alike from the same inputs; the choice is part of the call
// signature, so ranks that disagree (different RDMAKIT_COLL_ALGO) fail
// with ErrMismatch instead of exchanging garbage.

// tuneRow picks algo for a collective of kind among at least minRanks
// ranks when its size measure is at most maxBytes.
type tuneRow struct {
	kind     byte
	minRanks int
	maxBytes int
	measure  tuneMeasure
	algo     Algorithm
	notTCP   bool // not when some pair of ranks talks over tcp
}

// tuneMeasure is the size a row compares: what each rank sends in all.
type tuneMeasure uint8

const (
	// perPeers: the vector times n−1 (a direct AllReduce sends the whole
	// vector to every peer).
	perPeers tuneMeasure = iota
	// perBlock: one rank's block (AllGather's input, ReduceScatter's
	// output), which a direct exchange sends to each peer once.
	perBlock
)

// tuning is the table, first match wins. Direct exchanges replace the
// ring's n−1 steps (recursive doubling's log₂ n) by one: below these
// sizes the steps' fixed costs (flag write, poll, wake-up of a waiting
// rank, and with more ranks than cores a scheduler round per step)
// outweigh the extra bytes. With two ranks every algorithm has one step
// (AllGather, ReduceScatter) or the tree already is one exchange.
//
// Over tcp a message costs more than the bytes it saves (system calls,
// frames, acknowledgements; with ranks outnumbering cores, a scheduler
// round for each), so AllReduce keeps recursive doubling's log₂ n
// exchanges there: 8 ranks over tcp on a 2-core host, µs, medians of 4
// launches, direct against tree: 8 B 1785 / 288, 4 KiB 1423 / 475.
var tuning = []tuneRow{
	{kind: kAllReduce, minRanks: 3, maxBytes: 32 << 10, measure: perPeers, algo: AlgoDirect, notTCP: true},
	{kind: kAllGather, minRanks: 3, maxBytes: 64 << 10, measure: perBlock, algo: AlgoDirect},
	{kind: kReduceScatter, minRanks: 3, maxBytes: 64 << 10, measure: perBlock, algo: AlgoDirect},
}

// pickAlgo chooses the algorithm of a collective of kind moving bytes
// (the vector of AllReduce, Broadcast and Reduce; the whole output of
// AllGather, the whole input of ReduceScatter).
func (c *Comm) pickAlgo(kind byte, bytes int) Algorithm {
	a := c.opts.Algorithm
	switch kind {
	case kAllGather:
		if a == AlgoTree || a == AlgoHalving && c.nranks&(c.nranks-1) != 0 {
			return AlgoRing // no tree; recursive doubling for powers of two only
		}
	case kReduceScatter:
		if a == AlgoTree || a == AlgoHalving {
			return AlgoRing // no tree or halving form
		}
	case kBroadcast, kReduce:
		if a == AlgoDirect || a == AlgoHalving {
			return AlgoTree // no direct or halving form
		}
	}
	if a != AlgoAuto {
		return a
	}
	n := c.nranks
	for _, t := range tuning {
		if t.kind != kind || n < t.minRanks || t.notTCP && c.anyTCP {
			continue
		}
		m := bytes * (n - 1)
		if t.measure == perBlock {
			m = bytes / n
		}
		if m <= t.maxBytes {
			return t.algo
		}
	}
	if kind == kAllGather || kind == kReduceScatter {
		return AlgoRing
	}
	// The tree takes about log₂ n steps, the ring 2(n−1) (all-reduce) or
	// n−1, so the size up to which the tree wins grows with n/log₂ n.
	// TreeThreshold is the cross-over at two ranks.
	steps := 1
	for 1<<steps < n {
		steps++
	}
	if bytes <= c.opts.TreeThreshold*(n-1)/steps {
		return AlgoTree
	}
	return AlgoRing
}
