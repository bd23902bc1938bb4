package perftest

// One side's verbs resources: device context, PD, CQs, queue pairs and one
// memory region per QP, and connecting the QPs to the peer's. Runs in the
// run's goroutine.
//
// Each QP's region has two halves of maxSize bytes (rounded to a cache
// line): the first is the source of this side's Writes and Sends, the
// target of the peer's Reads and this side's atomic results; the second
// receives the peer's Writes and Sends, this side's Reads, and holds the
// word the peer's atomics work on. Against perftest (pwire_run.go) the
// halves are at least perftest's cycle buffer long, this side advertises
// its second half, and the peer's advertised address is the target of
// every operation (flat).

import (
	"fmt"
	"net"

	"github.com/rdmakit/rdmakit/verbs"
)

type endpoint struct {
	cfg    *config
	ctx    *verbs.Context
	dev    verbs.DeviceInfo
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qps    []*verbs.QP
	mrs    []*verbs.MR
	psns   []uint32
	half   int64
	remote []qpInfo
	// flat: the peer's advertised address is where its buffer for this
	// side's operations starts (perftest's layout), not its region's start.
	flat bool
}

func openEndpoint(cfg *config, dev verbs.DeviceInfo) (_ *endpoint, err error) {
	e := &endpoint{cfg: cfg, dev: dev, half: roundUp(max(cfg.maxSize, cfg.minHalf))}
	e.ctx, err = verbs.Open(dev.Name, verbs.Options{GIDIndex: cfg.GIDIndex, SetGIDIndex: cfg.SetGIDIndex})
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", dev.Name, err)
	}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return nil, fmt.Errorf("allocating a PD on %s: %w", dev.Name, err)
	}
	// Every send work request may be signaled (warm-up), at most tx per QP
	// outstanding; at most rx receives per QP are posted.
	if e.scq, err = e.ctx.CreateCQ(cfg.tx*cfg.qps + 1); err != nil {
		return nil, fmt.Errorf("creating the send CQ: %w", err)
	}
	if e.rcq, err = e.ctx.CreateCQ(cfg.rx*cfg.qps + 1); err != nil {
		return nil, fmt.Errorf("creating the receive CQ: %w", err)
	}
	inline := cfg.inline
	if inline == 0 {
		inline = 1
	}
	for i := 0; i < cfg.qps; i++ {
		qp, err := e.pd.CreateQP(verbs.QPConfig{SendCQ: e.scq, RecvCQ: e.rcq, Cap: verbs.QPCap{
			MaxSendWR: cfg.tx, MaxRecvWR: cfg.rx, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: inline,
		}})
		if err != nil {
			return nil, fmt.Errorf("creating QP %d: %w", i, err)
		}
		e.qps = append(e.qps, qp)
		mr, err := e.pd.AllocMR(int(2*e.half), verbs.AccessAll)
		if err != nil {
			return nil, fmt.Errorf("allocating a %d-byte region: %w", 2*e.half, err)
		}
		e.mrs = append(e.mrs, mr)
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, Port: uint8(max(cfg.IBPort, 1)),
			AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
			return nil, fmt.Errorf("QP %d to INIT: %w", i, err)
		}
		e.psns = append(e.psns, verbs.RandomPSN())
	}
	return e, nil
}

// local returns what the peer needs of QP i.
func (e *endpoint) local(i int) qpInfo {
	q := qpInfo{qpn: e.qps[i].Num(), psn: e.psns[i], rkey: e.mrs[i].RKey(), vaddr: e.mrs[i].Addr(),
		idx: i, addr: e.qps[i].Address()}
	if e.cfg.Test.Verb == VerbRead || e.cfg.Test.Verb == VerbAtomic {
		q.outReads = uint16(e.cfg.outReads)
	}
	return q
}

// connect moves every QP to RTS, connected to the peer's QP of the same
// index. peerIP is the peer's address as seen on the control connection
// (the tcp transport dials it).
func (e *endpoint) connect(remote []qpInfo, peerIP net.IP) error {
	if len(remote) != len(e.qps) {
		return fmt.Errorf("peer sent %d QPs, want %d", len(remote), len(e.qps))
	}
	e.remote = remote
	for i, qp := range e.qps {
		r := remote[i]
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: e.cfg.mtu, DestQPN: r.qpn, RQPSN: r.psn,
			AH: verbs.AddressHandle{GID: peerIP, Dest: r.addr, SL: e.cfg.SL, TrafficClass: e.cfg.TrafficClass}, MinRNRTimer: 1, MaxDestRdAtomic: uint8(e.cfg.outReads)}); err != nil {
			return fmt.Errorf("QP %d to RTR: %w", i, err)
		}
	}
	timeout, retry := uint8(14), uint8(7) // perftest's defaults
	if e.cfg.SetQPTimeout {
		timeout = uint8(e.cfg.QPTimeout)
	}
	if e.cfg.SetRetryCount {
		retry = uint8(e.cfg.RetryCount)
	}
	for i, qp := range e.qps {
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: e.psns[i], Timeout: timeout, RetryCount: retry,
			RNRRetry: 7, MaxRdAtomic: uint8(e.cfg.outReads)}); err != nil {
			return fmt.Errorf("QP %d to RTS: %w", i, err)
		}
	}
	return nil
}

// close releases everything (closing the context destroys the rest).
func (e *endpoint) close() {
	if e.ctx != nil {
		e.ctx.Close()
	}
}

// refill keeps a QP's receive queue stocked: receives consumed are posted
// again in batches (one PostRecv per batch), never beyond limit in all.
// Batching matters: every PostRecv is a call into the transport (shm wakes
// its progress goroutines on each), and perftest's one-by-one reposting
// would charge that to every message.
type refill struct {
	qp      *verbs.QP
	wrs     []verbs.RecvWR // batch identical receives
	limit   int64          // receives to post in all; 0: no limit
	posted  int64
	pending int64 // consumed, not yet reposted
}

// newRefill prepares receives of size bytes into the second half of QP
// q's region, reposted in batches of a quarter of the receive depth.
func newRefill(e *endpoint, q int, size, limit int64) *refill {
	batch := max(1, e.cfg.rx/4)
	r := &refill{qp: e.qps[q], wrs: make([]verbs.RecvWR, batch), limit: limit}
	for i := range r.wrs {
		r.wrs[i] = verbs.RecvWR{ID: uint64(q), SGL: []verbs.SGE{e.mrs[q].SGE(int(e.half), int(size))}}
	}
	return r
}

// fill posts the initial receives: the receive depth, at most limit.
func (r *refill) fill(depth int) error {
	r.pending = int64(depth)
	return r.flush()
}

// consumed records that a receive completed, and reposts a batch when one
// has gathered.
func (r *refill) consumed() error {
	r.pending++
	if r.pending < int64(len(r.wrs)) {
		return nil
	}
	return r.flush()
}

func (r *refill) flush() error {
	for r.pending > 0 {
		n := min(r.pending, int64(len(r.wrs)))
		if r.limit > 0 {
			n = min(n, r.limit-r.posted)
		}
		if n <= 0 {
			r.pending = 0
			return nil
		}
		if err := r.qp.PostRecv(r.wrs[:n]); err != nil {
			return fmt.Errorf("posting receives: %w", err)
		}
		r.posted += n
		r.pending -= n
	}
	return nil
}
