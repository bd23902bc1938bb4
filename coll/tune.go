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
	case kAllGather, kReduceScatter:
		if a == AlgoTree || a == AlgoHalving && c.nranks&(c.nranks-1) != 0 {
			return AlgoRing // no tree; halving for powers of two only
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
	halving := c.anyTCP && n >= halvingMinRanks && n&(n-1) == 0 && bytes <= halvingMaxBytes/n
	if halving && (kind == kAllGather || kind == kReduceScatter) {
		return AlgoHalving
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
	if kind == kAllReduce && halving && bytes <= halvingMaxAllReduce {
		return AlgoHalving
	}
	return AlgoRing
}

// Over tcp, from 4 ranks (a power of two), AllReduce above the tree's
// sizes, AllGather and ReduceScatter above the direct ones use the halving
// algorithms instead of the ring, up to halvingMaxBytes/n (the vector, the
// whole output, the whole input; AllReduce's vector at most
// halvingMaxAllReduce): 2 log₂ n (AllGather, ReduceScatter log₂ n)
// steps instead of 2(n−1) (n−1), the same bytes. Every ring step waits
// for the rank before it, and with ranks outnumbering cores that rank
// must first be scheduled. 2-core host, shared (load 5-15), µs,
// medians of 3 launches alternating ring / halving:
//
//	AllReduce      4 ranks 256 KiB 768 / 340, 1 MiB 2103 / 1384, 4 MiB 6277 / 5056,
//	               16 MiB 24738 / 28279 and 30824 / 27661 (two runs)
//	               8 ranks 256 KiB 3693 / 1067, 1 MiB 6708 / 4631,
//	               2 MiB 9311 / 9378, 4 MiB 16863 / 23688 and 18154 / 20884
//	AllGather      1 MiB output: 4 ranks 760 / 697, 8 ranks 3400 / 2209;
//	               16 MiB at 4 ranks 12247 / 11912
//	ReduceScatter  1 MiB input: 4 ranks 1196 / 1034, 8 ranks 3157 / 2174;
//	               16 MiB at 8 ranks 40874 / 43699
//
// Larger steps pipeline better in the ring (the halving steps exchange
// pairwise in lock step). At 2 ranks both have 2 steps and the ring's
// deeper pipeline wins (AllReduce 1 MiB 300 / 358); on shm the ring's
// steps cost little (and its direct writes save a copy).
const (
	halvingMinRanks = 4
	halvingMaxBytes = 16 << 20 // over the rank count: 4 MiB at 4 ranks, 2 MiB at 8
	// halvingMaxAllReduce caps AllReduce's halving further: with 256 KiB
	// chunks over tcp (coll/net.go tcpChunk) the ring's pipeline wins from
	// 4 MiB at 4 ranks too. Same host, A/B alternating, µs, auto (halving)
	// / ring: 4 ranks 4 MiB medians of 5 5164 / 4633, of 3 6026 / 4993;
	// 4 ranks 2 MiB 2181 / 2281; 8 ranks 2 MiB 6952 / 7984 (8 ranks 4 MiB
	// was the ring's already: 15909 / 17279 halving).
	halvingMaxAllReduce = 2 << 20
)
