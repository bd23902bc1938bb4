// Package conformance is the one suite of RDMA semantics every rdmakit
// transport must pass. A transport's tests call Run with its device name;
// Run executes every case twice: with both queue pairs in the test process,
// and with the peer in a second OS process (the test binary re-executed as
// a peer that obeys commands on its stdin). Transport test packages must
// call ServePeerIfChild at the top of TestMain.
//
// A Peer is one side of the tests: a context with a fixed set of memory
// regions and any number of queue pairs. LocalPeer is the in-process
// implementation; remotePeer forwards the same calls to a child process as
// JSON lines, where a LocalPeer executes them.
package conformance

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Region describes a memory region of a peer.
type Region struct {
	Addr uint64
	RKey uint32
	LKey uint32
	Len  int
}

// QPInfo is what the other side needs to connect to a queue pair.
type QPInfo struct {
	Index int
	QPN   uint32
	PSN   uint32
	Addr  []byte
}

// QPOpts are the connection attributes a case wants.
type QPOpts struct {
	RNRRetry    uint8
	MinRNRTimer uint8
	Timeout     uint8
	RetryCount  uint8
	Access      verbs.Access // QP remote access flags; 0 means all
	CQSize      int
	SendWR      int
}

// WR is a work request in a form that crosses processes: local memory is
// named by region and offset.
type WR struct {
	ID         uint64
	Op         verbs.Opcode
	Signaled   bool
	Inline     bool
	Fence      bool
	Region     string
	Off        int
	Lens       []int  // one SGE per length, consecutive from Off
	LKey       uint32 // overrides the region's lkey when non-zero
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32
	CompareAdd uint64
	Swap       uint64
}

// WC is a completion that crosses processes.
type WC struct {
	ID      uint64
	Status  verbs.Status
	Opcode  verbs.WCOpcode
	ByteLen uint32
	Imm     uint32
	Flags   verbs.WCFlags
}

// Peer is one side of a conformance case.
type Peer interface {
	Regions() (map[string]Region, error)
	NewQP(o QPOpts) (QPInfo, error)
	Connect(idx int, remote QPInfo, o QPOpts) error
	CloseQP(idx int) error
	PostRecv(idx int, id uint64, region string, off int, lens []int) error
	PostSend(idx int, wrs []WR) error
	// Poll waits up to timeout for n completions of the QP's send (or
	// receive) CQ and returns what it got.
	Poll(idx int, recv bool, n int, timeout time.Duration) ([]WC, error)
	State(idx int) (verbs.QPState, error)
	Hash(region string, off, n int) (string, error)
	Fill(region string, off, n int, seed byte) error
	Read(region string, off, n int) ([]byte, error)
	// FetchAddLoop performs, on each QP of idxs concurrently, n
	// FetchAndAdd(1) on (addr, rkey), each awaited.
	FetchAddLoop(idxs []int, n int, addr uint64, rkey uint32) error
	Close() error
}

// Region sizes.
const (
	BigSize   = 64<<20 + 64<<10
	SmallSize = 4096
)

var regionSpecs = []struct {
	name   string
	size   int
	access verbs.Access
	dereg  bool
}{
	{"src", BigSize, verbs.AccessAll, false},
	{"rw", BigSize, verbs.AccessAll, false},
	{"ro", SmallSize, verbs.AccessLocalWrite | verbs.AccessRemoteRead, false},
	{"wo", SmallSize, verbs.AccessLocalWrite | verbs.AccessRemoteWrite, false},
	{"local", SmallSize, verbs.AccessLocalWrite, false},
	{"readonly", SmallSize, verbs.AccessRemoteRead, false},
	{"stale", SmallSize, verbs.AccessAll, true},
}

// LocalPeer implements Peer in this process.
type LocalPeer struct {
	ctx *verbs.Context
	pd  *verbs.PD

	// mu guards mrs, regions and qps.
	mu      sync.Mutex
	mrs     map[string]*verbs.MR
	regions map[string]Region
	qps     map[int]*lqp
	nextQP  int
}

type lqp struct {
	qp     *verbs.QP
	scq    *verbs.CQ
	rcq    *verbs.CQ
	psn    uint32
	sgl    []verbs.SGE
	wrs    []verbs.SendWR
	wcs    []verbs.WorkCompletion
	pollMu sync.Mutex
}

// NewLocalPeer opens device and registers the standard regions.
func NewLocalPeer(device string) (*LocalPeer, error) {
	ctx, err := verbs.Open(device, verbs.Options{})
	if err != nil {
		return nil, err
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	p := &LocalPeer{ctx: ctx, pd: pd, mrs: map[string]*verbs.MR{}, regions: map[string]Region{}, qps: map[int]*lqp{}}
	for _, s := range regionSpecs {
		mr, err := pd.AllocMR(s.size, s.access)
		if err != nil {
			ctx.Close()
			return nil, fmt.Errorf("region %s: %w", s.name, err)
		}
		p.regions[s.name] = Region{Addr: mr.Addr(), RKey: mr.RKey(), LKey: mr.LKey(), Len: mr.Len()}
		if s.dereg {
			if err := mr.Dereg(); err != nil {
				return nil, err
			}
			continue
		}
		p.mrs[s.name] = mr
	}
	return p, nil
}

// Context returns the peer's verbs context.
func (p *LocalPeer) Context() *verbs.Context { return p.ctx }

// QP returns a queue pair by index.
func (p *LocalPeer) QP(idx int) *verbs.QP {
	p.mu.Lock()
	defer p.mu.Unlock()
	if q := p.qps[idx]; q != nil {
		return q.qp
	}
	return nil
}

// MR returns a region by name.
func (p *LocalPeer) MR(name string) *verbs.MR {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mrs[name]
}

func (p *LocalPeer) Regions() (map[string]Region, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := make(map[string]Region, len(p.regions))
	for k, v := range p.regions {
		m[k] = v
	}
	return m, nil
}

func (p *LocalPeer) NewQP(o QPOpts) (QPInfo, error) {
	cqs := o.CQSize
	if cqs == 0 {
		cqs = 4096
	}
	scq, err := p.ctx.CreateCQ(cqs)
	if err != nil {
		return QPInfo{}, err
	}
	rcq, err := p.ctx.CreateCQ(cqs)
	if err != nil {
		return QPInfo{}, err
	}
	swr := o.SendWR
	if swr == 0 {
		swr = 1024
	}
	qp, err := p.pd.CreateQP(verbs.QPConfig{SendCQ: scq, RecvCQ: rcq,
		Cap: verbs.QPCap{MaxSendWR: swr, MaxRecvWR: 1024, MaxSendSGE: 8, MaxRecvSGE: 8, MaxInlineData: 256}})
	if err != nil {
		return QPInfo{}, err
	}
	acc := o.Access
	if acc == 0 {
		acc = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: acc, Port: 1}); err != nil {
		return QPInfo{}, err
	}
	q := &lqp{qp: qp, scq: scq, rcq: rcq, psn: verbs.RandomPSN(), wcs: make([]verbs.WorkCompletion, 64)}
	p.mu.Lock()
	idx := p.nextQP
	p.nextQP++
	p.qps[idx] = q
	p.mu.Unlock()
	return QPInfo{Index: idx, QPN: qp.Num(), PSN: q.psn, Addr: qp.Address()}, nil
}

func (p *LocalPeer) get(idx int) (*lqp, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.qps[idx]
	if q == nil {
		return nil, fmt.Errorf("no QP %d", idx)
	}
	return q, nil
}

func (p *LocalPeer) Connect(idx int, r QPInfo, o QPOpts) error {
	q, err := p.get(idx)
	if err != nil {
		return err
	}
	if err := q.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: verbs.MTU4096, DestQPN: r.QPN, RQPSN: r.PSN,
		AH: verbs.AddressHandle{Dest: r.Addr}, MinRNRTimer: o.MinRNRTimer, MaxDestRdAtomic: 16}); err != nil {
		return err
	}
	return q.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: q.psn, Timeout: o.Timeout, RetryCount: o.RetryCount,
		RNRRetry: o.RNRRetry, MaxRdAtomic: 16})
}

func (p *LocalPeer) CloseQP(idx int) error {
	q, err := p.get(idx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.qps, idx)
	p.mu.Unlock()
	q.qp.Close()
	q.scq.Close()
	q.rcq.Close()
	return nil
}

func (p *LocalPeer) sges(region string, off int, lens []int, lkey uint32) ([]verbs.SGE, error) {
	p.mu.Lock()
	r, ok := p.regions[region]
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("no region %q", region)
	}
	if lkey == 0 {
		lkey = r.LKey
	}
	sgl := make([]verbs.SGE, len(lens))
	a := r.Addr + uint64(off)
	for i, n := range lens {
		sgl[i] = verbs.SGE{Addr: a, Length: uint32(n), LKey: lkey}
		a += uint64(n)
	}
	return sgl, nil
}

func (p *LocalPeer) PostRecv(idx int, id uint64, region string, off int, lens []int) error {
	q, err := p.get(idx)
	if err != nil {
		return err
	}
	sgl, err := p.sges(region, off, lens, 0)
	if err != nil {
		return err
	}
	return q.qp.PostRecv([]verbs.RecvWR{{ID: id, SGL: sgl}})
}

func (p *LocalPeer) PostSend(idx int, wrs []WR) error {
	q, err := p.get(idx)
	if err != nil {
		return err
	}
	out := make([]verbs.SendWR, len(wrs))
	for i, w := range wrs {
		sgl, err := p.sges(w.Region, w.Off, w.Lens, w.LKey)
		if err != nil {
			return err
		}
		f := verbs.SendFlags(0)
		if w.Signaled {
			f |= verbs.SendSignaled
		}
		if w.Fence {
			f |= verbs.SendFence
		}
		if w.Inline {
			f |= verbs.SendInline
		}
		out[i] = verbs.SendWR{ID: w.ID, Opcode: w.Op, Flags: f, SGL: sgl, Imm: w.Imm, RemoteAddr: w.RemoteAddr,
			RKey: w.RKey, CompareAdd: w.CompareAdd, Swap: w.Swap}
	}
	return q.qp.PostSend(out)
}

func (p *LocalPeer) Poll(idx int, recv bool, n int, timeout time.Duration) ([]WC, error) {
	q, err := p.get(idx)
	if err != nil {
		return nil, err
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	cq := q.scq
	if recv {
		cq = q.rcq
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []WC
	for len(out) < n {
		k, err := cq.Wait(ctx, q.wcs[:min(len(q.wcs), n-len(out))])
		for _, w := range q.wcs[:k] {
			out = append(out, WC{ID: w.WRID, Status: w.Status, Opcode: w.Opcode, ByteLen: w.ByteLen, Imm: w.Imm, Flags: w.Flags})
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return out, nil
			}
			return out, err
		}
	}
	return out, nil
}

func (p *LocalPeer) State(idx int) (verbs.QPState, error) {
	q, err := p.get(idx)
	if err != nil {
		return 0, err
	}
	return q.qp.State(), nil
}

func (p *LocalPeer) mem(region string, off, n int) ([]byte, error) {
	mr := p.MR(region)
	if mr == nil {
		return nil, fmt.Errorf("no live region %q", region)
	}
	if off < 0 || n < 0 || off+n > mr.Len() {
		return nil, fmt.Errorf("region %q: %d+%d out of range", region, off, n)
	}
	return mr.Bytes()[off : off+n], nil
}

func (p *LocalPeer) Hash(region string, off, n int) (string, error) {
	b, err := p.mem(region, off, n)
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

func (p *LocalPeer) Fill(region string, off, n int, seed byte) error {
	b, err := p.mem(region, off, n)
	if err != nil {
		return err
	}
	Pattern(b, seed)
	return nil
}

// Pattern fills b with a sequence determined by seed.
func Pattern(b []byte, seed byte) {
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x = x*1103515245 + 12345
		b[i] = byte(x >> 16)
	}
}

func (p *LocalPeer) Read(region string, off, n int) ([]byte, error) {
	b, err := p.mem(region, off, n)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), b...), nil
}

func (p *LocalPeer) FetchAddLoop(idxs []int, n int, addr uint64, rkey uint32) error {
	errs := make(chan error, len(idxs))
	for _, idx := range idxs {
		go func() { errs <- p.fetchAdd(idx, n, addr, rkey) }()
	}
	var first error
	for range idxs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (p *LocalPeer) fetchAdd(idx int, n int, addr uint64, rkey uint32) error {
	for i := 0; i < n; i++ {
		if err := p.PostSend(idx, []WR{{ID: uint64(i), Op: verbs.OpFetchAndAdd, Signaled: true, Region: "src",
			Off: 8 * (idx % 512), Lens: []int{8}, RemoteAddr: addr, RKey: rkey, CompareAdd: 1}}); err != nil {
			return err
		}
		wcs, err := p.Poll(idx, false, 1, 10*time.Second)
		if err != nil {
			return err
		}
		if len(wcs) != 1 || wcs[0].Status != verbs.StatusSuccess {
			return fmt.Errorf("fetch-and-add %d: %+v", i, wcs)
		}
	}
	return nil
}

func (p *LocalPeer) Close() error {
	p.mu.Lock()
	idx := make([]int, 0, len(p.qps))
	for i := range p.qps {
		idx = append(idx, i)
	}
	p.mu.Unlock()
	for _, i := range idx {
		p.CloseQP(i)
	}
	return p.ctx.Close()
}
