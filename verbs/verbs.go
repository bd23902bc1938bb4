package verbs

// The objects are thin handles over one driver object each (verbs/driver),
// as database/sql's types wrap driver.Conn. What is the same for every
// device lives here: argument checks that do not depend on the device,
// which objects a context holds, ErrBusy while an object is still in use,
// and closing children before their parent on Context.Close.
//
// Concurrency: every method is safe for concurrent use. Context.mu guards
// the context's sets of objects and its closed flag; it is never held
// while a driver is called on the data path (PostSend, PostRecv, Poll,
// Wait), which goes straight to the driver object.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// Context is an open device.
type Context struct {
	d    driver.Context
	info DeviceInfo
	opts Options

	// mu guards the sets below and closed.
	mu     sync.Mutex
	pds    map[*PD]struct{}
	mrs    map[*MR]struct{}
	cqs    map[*CQ]struct{}
	qps    map[*QP]struct{}
	srqs   map[*SRQ]struct{}
	closed bool
}

// Open opens the device called name (as listed by Devices). The zero
// Options are the defaults; environment variables (RDMAKIT_ARENA_SIZE,
// RDMAKIT_TCP_ADDR, RDMAKIT_IBV_GID_INDEX) supply defaults for fields left
// at zero, and a malformed value is an error.
func Open(name string, opts Options) (*Context, error) {
	drv, info, err := findDevice(name)
	if err != nil {
		return nil, err
	}
	opts, err = opts.Resolve()
	if err != nil {
		return nil, fmt.Errorf("verbs: open %s: %w", name, err)
	}
	d, err := drv.Open(info, opts)
	if err != nil {
		return nil, fmt.Errorf("verbs: open %s: %w", name, err)
	}
	return &Context{
		d: d, info: info, opts: opts,
		pds: map[*PD]struct{}{}, mrs: map[*MR]struct{}{}, cqs: map[*CQ]struct{}{},
		qps: map[*QP]struct{}{}, srqs: map[*SRQ]struct{}{},
	}, nil
}

// Info returns the device's attributes (ibv_query_device).
func (c *Context) Info() DeviceInfo { return c.info }

// Options returns the options the context was opened with, defaults
// applied.
func (c *Context) Options() Options { return c.opts }

// Driver returns the driver's context, for transport-specific extensions.
func (c *Context) Driver() driver.Context { return c.d }

// add records an object in one of the context's sets unless it is closed.
func add[T comparable](c *Context, set map[T]struct{}, o T) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	set[o] = struct{}{}
	return nil
}

// drop removes o from set under the context's lock unless busy (called
// with the lock held) says it is still in use; gone reports whether it
// was there at all (closing twice is a no-op).
func drop[T comparable](c *Context, set map[T]struct{}, o T, busy func() error) (gone bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := set[o]; !ok {
		return false, nil
	}
	if busy != nil {
		if err := busy(); err != nil {
			return false, err
		}
	}
	delete(set, o)
	return true, nil
}

// Close destroys everything created from the context (queue pairs, shared
// receive queues, memory regions, completion queues, protection domains,
// in that order), unblocks waiters and releases the device.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	qps, srqs, mrs, cqs, pds := keys(c.qps), keys(c.srqs), keys(c.mrs), keys(c.cqs), keys(c.pds)
	clear(c.qps)
	clear(c.srqs)
	clear(c.mrs)
	clear(c.cqs)
	clear(c.pds)
	c.mu.Unlock()
	for _, q := range qps {
		q.d.Close()
	}
	for _, s := range srqs {
		s.d.Close()
	}
	for _, m := range mrs {
		m.d.Dereg()
	}
	for _, q := range cqs {
		q.d.Close()
	}
	for _, p := range pds {
		p.d.Close()
	}
	return c.d.Close()
}

func keys[T comparable](m map[T]struct{}) []T {
	s := make([]T, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	return s
}

func randUint32() uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("verbs: crypto/rand failed: " + err.Error())
	}
	return binary.LittleEndian.Uint32(b[:])
}

// RandomPSN returns a random 24-bit packet sequence number, for the initial
// PSN of a queue pair.
func RandomPSN() uint32 { return randUint32() & 0xffffff }

// PD is a protection domain: regions and queue pairs of different PDs
// cannot be used together.
type PD struct {
	ctx *Context
	d   driver.PD
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (*PD, error) {
	d, err := c.d.AllocPD()
	if err != nil {
		return nil, err
	}
	pd := &PD{ctx: c, d: d}
	if err := add(c, c.pds, pd); err != nil {
		d.Close()
		return nil, err
	}
	return pd, nil
}

// Context returns the PD's context.
func (pd *PD) Context() *Context { return pd.ctx }

// Driver returns the driver's PD, for transport-specific extensions.
func (pd *PD) Driver() driver.PD { return pd.d }

// Close releases the PD. It fails with ErrBusy while regions, queue pairs
// or shared receive queues use it.
func (pd *PD) Close() error {
	c := pd.ctx
	ok, err := drop(c, c.pds, pd, func() error {
		for m := range c.mrs {
			if m.pd == pd {
				return fmt.Errorf("%w: PD still has memory regions", ErrBusy)
			}
		}
		for q := range c.qps {
			if q.pd == pd {
				return fmt.Errorf("%w: PD still has queue pairs", ErrBusy)
			}
		}
		for s := range c.srqs {
			if s.pd == pd {
				return fmt.Errorf("%w: PD still has shared receive queues", ErrBusy)
			}
		}
		return nil
	})
	if !ok {
		return err
	}
	return pd.d.Close()
}

// MR is a registered memory region.
type MR struct {
	pd     *PD
	d      driver.MR
	buf    []byte
	access Access
	lkey   uint32
	rkey   uint32
}

func checkAccess(access Access) error {
	if access&^AccessAll != 0 {
		return fmt.Errorf("%w: unknown access flags %#x", ErrInvalidArgument, uint32(access))
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return fmt.Errorf("%w: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE too", ErrInvalidArgument)
	}
	return nil
}

// AllocMR allocates size bytes of off-heap memory and registers them with
// access. The memory is zeroed, page aligned, and reachable by every
// transport, including peer processes on the same host.
func (pd *PD) AllocMR(size int, access Access) (*MR, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: negative size", ErrInvalidArgument)
	}
	if m := pd.ctx.info.MaxMRSize; m != 0 && uint64(size) > m {
		return nil, fmt.Errorf("%w: %d bytes exceeds the device's max_mr_size %d", ErrInvalidArgument, size, m)
	}
	if err := checkAccess(access); err != nil {
		return nil, err
	}
	d, err := pd.d.AllocMR(size, access)
	if err != nil {
		return nil, err
	}
	return pd.track(d, access)
}

// RegMR registers caller memory. The memory must stay referenced and must
// not be reused until Dereg. Devices that cannot reach caller memory
// (shm: peers map only the context's arena; DeviceInfo.Caps lacks
// CapRegisterCallerMemory) return ErrNotSupported; use AllocMR. Memory
// that AllocMR returned may be registered again with other access.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if err := checkAccess(access); err != nil {
		return nil, err
	}
	d, err := pd.d.RegMR(buf, access)
	if err != nil {
		return nil, err
	}
	return pd.track(d, access)
}

func (pd *PD) track(d driver.MR, access Access) (*MR, error) {
	mr := &MR{pd: pd, d: d, buf: d.Bytes(), access: access, lkey: d.LKey(), rkey: d.RKey()}
	if err := add(pd.ctx, pd.ctx.mrs, mr); err != nil {
		d.Dereg()
		return nil, err
	}
	return mr, nil
}

// Bytes returns the region's memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// Addr returns the address of the region's first byte, as used in SGE.Addr
// and SendWR.RemoteAddr.
func (mr *MR) Addr() uint64 { return uint64(sys.Addr(mr.buf)) }

// Len returns the region's length.
func (mr *MR) Len() int { return len(mr.buf) }

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Access returns the access flags.
func (mr *MR) Access() Access { return mr.access }

// SGE returns an SGE for n bytes at offset off of the region.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Dereg deregisters the region: from the moment it returns, its keys
// resolve nowhere and work requests that use them fail. Requests racing
// with Dereg (posted before it returned) may still complete: an
// operation that already resolved its key finishes. Memory from AllocMR
// is released.
func (mr *MR) Dereg() error {
	if ok, _ := drop(mr.pd.ctx, mr.pd.ctx.mrs, mr, nil); !ok {
		return fmt.Errorf("%w: region already deregistered", ErrInvalidArgument)
	}
	return mr.d.Dereg()
}

// CQ is a completion queue. Any goroutine may Poll or Wait; completions
// are handed out once each.
type CQ struct {
	ctx *Context
	d   driver.CQ
}

// CreateCQ creates a completion queue with room for at least cqe entries.
func (c *Context) CreateCQ(cqe int) (*CQ, error) {
	if cqe <= 0 {
		return nil, fmt.Errorf("%w: cqe must be positive", ErrInvalidArgument)
	}
	if c.info.MaxCQE > 0 && cqe > c.info.MaxCQE {
		return nil, fmt.Errorf("%w: cqe %d exceeds the device's max_cqe %d", ErrInvalidArgument, cqe, c.info.MaxCQE)
	}
	d, err := c.d.CreateCQ(cqe)
	if err != nil {
		return nil, err
	}
	cq := &CQ{ctx: c, d: d}
	if err := add(c, c.cqs, cq); err != nil {
		d.Close()
		return nil, err
	}
	return cq, nil
}

// Driver returns the driver's CQ, for transport-specific extensions.
func (cq *CQ) Driver() driver.CQ { return cq.d }

// Cap returns the number of entries the CQ holds.
func (cq *CQ) Cap() int { return cq.d.Cap() }

// Poll moves up to len(wcs) completions into wcs and returns how many. It
// never blocks and never allocates. Once the CQ has overflowed, Poll
// returns what is left and then ErrCQOverflow.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) { return cq.d.Poll(wcs) }

// spinFor is how long Wait polls before it sleeps: waking a sleeping thread
// costs tens of microseconds, far more than most completions take.
const spinFor = 50 * time.Microsecond

// Wait blocks until at least one completion is available, then behaves
// like Poll. It returns ctx's error if ctx ends first and ErrClosed if the
// CQ or its context is closed. It allocates nothing unless ctx can be
// cancelled and the wait outlasts the initial spin.
func (cq *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	if n, err := cq.d.Poll(wcs); n > 0 || err != nil {
		return n, err
	}
	start := time.Now()
	for i := 0; ; i++ {
		if n, err := cq.d.Poll(wcs); n > 0 || err != nil {
			return n, err
		}
		if i&63 == 63 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			if time.Since(start) > spinFor {
				break
			}
			runtime.Gosched()
		}
	}
	return cq.d.Wait(ctx, wcs)
}

// Close destroys the CQ and wakes its waiters, which return ErrClosed. It
// fails with ErrBusy while queue pairs use it.
func (cq *CQ) Close() error {
	c := cq.ctx
	ok, err := drop(c, c.cqs, cq, func() error {
		for q := range c.qps {
			if q.sendCQ == cq || q.recvCQ == cq {
				return fmt.Errorf("%w: CQ still used by QP %#x", ErrBusy, q.num)
			}
		}
		return nil
	})
	if !ok {
		return err
	}
	return cq.d.Close()
}

// SRQ is a shared receive queue: queue pairs created with it take their
// receives from it instead of from their own receive queue.
type SRQ struct {
	pd     *PD
	d      driver.SRQ
	maxSGE int
}

// CreateSRQ creates a shared receive queue. Zero fields of cfg take
// defaults: 1024 work requests, 4 SGEs.
func (pd *PD) CreateSRQ(cfg SRQConfig) (*SRQ, error) {
	if cfg.MaxWR == 0 {
		cfg.MaxWR = 1024
	}
	if cfg.MaxSGE == 0 {
		cfg.MaxSGE = 4
	}
	if cfg.MaxWR < 0 || cfg.MaxSGE < 0 || cfg.MaxSGE > MaxSGE {
		return nil, fmt.Errorf("%w: SRQ max_wr %d, max_sge %d (max %d)", ErrInvalidArgument, cfg.MaxWR, cfg.MaxSGE, MaxSGE)
	}
	d, err := pd.d.CreateSRQ(cfg)
	if err != nil {
		return nil, err
	}
	s := &SRQ{pd: pd, d: d, maxSGE: cfg.MaxSGE}
	if err := add(pd.ctx, pd.ctx.srqs, s); err != nil {
		d.Close()
		return nil, err
	}
	return s, nil
}

// PostRecv posts receives to the SRQ.
func (s *SRQ) PostRecv(wrs []RecvWR) error { return s.d.PostRecv(wrs) }

// Close destroys the SRQ; it fails with ErrBusy while queue pairs use it.
func (s *SRQ) Close() error {
	c := s.pd.ctx
	ok, err := drop(c, c.srqs, s, func() error {
		for q := range c.qps {
			if q.srq == s {
				return fmt.Errorf("%w: SRQ still used by QP %#x", ErrBusy, q.num)
			}
		}
		return nil
	})
	if !ok {
		return err
	}
	return s.d.Close()
}

// QPConfig configures a queue pair (ibv_qp_init_attr). The type is always
// reliable connected (RC).
type QPConfig struct {
	SendCQ *CQ
	RecvCQ *CQ
	// SRQ, if set, supplies receives instead of the QP's own queue.
	SRQ *SRQ
	// Cap: zero fields take defaults (128 work requests each way, 4 SGEs
	// each way, 64 bytes inline).
	Cap QPCap
	// SignalAll makes every send work request generate a completion.
	SignalAll bool
}

// QP is a reliable-connected queue pair.
type QP struct {
	ctx    *Context
	pd     *PD
	d      driver.QP
	sendCQ *CQ
	recvCQ *CQ
	srq    *SRQ
	num    uint32
}

// CreateQP creates an RC queue pair in RESET.
func (pd *PD) CreateQP(cfg QPConfig) (*QP, error) {
	c := pd.ctx
	if cfg.SendCQ == nil || cfg.RecvCQ == nil {
		return nil, fmt.Errorf("%w: a QP needs a send CQ and a receive CQ", ErrInvalidArgument)
	}
	if cfg.SendCQ.ctx != c || cfg.RecvCQ.ctx != c || (cfg.SRQ != nil && cfg.SRQ.pd.ctx != c) {
		return nil, fmt.Errorf("%w: CQs and SRQ must belong to the QP's context", ErrInvalidArgument)
	}
	cp := driver.DefaultQPCap(cfg.Cap)
	if cp.MaxSendWR < 0 || cp.MaxSendWR > MaxQPWR || cp.MaxRecvWR < 0 || cp.MaxRecvWR > MaxQPWR ||
		cp.MaxSendSGE < 0 || cp.MaxSendSGE > MaxSGE || cp.MaxRecvSGE < 0 || cp.MaxRecvSGE > MaxSGE ||
		cp.MaxInlineData < 0 || cp.MaxInlineData > MaxInline {
		return nil, fmt.Errorf("%w: QP caps %+v beyond limits (wr %d, sge %d, inline %d)", ErrInvalidArgument, cp, MaxQPWR, MaxSGE, MaxInline)
	}
	dc := driver.QPConfig{SendCQ: cfg.SendCQ.d, RecvCQ: cfg.RecvCQ.d, Cap: cp, SignalAll: cfg.SignalAll}
	if cfg.SRQ != nil {
		dc.SRQ = cfg.SRQ.d
		dc.Cap.MaxRecvWR, dc.Cap.MaxRecvSGE = 0, cfg.SRQ.maxSGE
	}
	d, err := pd.d.CreateQP(dc)
	if err != nil {
		return nil, err
	}
	qp := &QP{ctx: c, pd: pd, d: d, sendCQ: cfg.SendCQ, recvCQ: cfg.RecvCQ, srq: cfg.SRQ, num: d.Num()}
	if err := add(c, c.qps, qp); err != nil {
		d.Close()
		return nil, err
	}
	return qp, nil
}

// Driver returns the driver's QP, for transport-specific extensions.
func (qp *QP) Driver() driver.QP { return qp.d }

// Num returns the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// Cap returns the QP's capabilities (as granted, which may exceed those
// requested).
func (qp *QP) Cap() QPCap { return qp.d.Cap() }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// Context returns the QP's context.
func (qp *QP) Context() *Context { return qp.ctx }

// Address returns the transport address a peer puts in AddressHandle.Dest.
func (qp *QP) Address() []byte { return qp.d.Address() }

// State returns the current state. An error the device saw is visible here
// before its completion can be polled.
func (qp *QP) State() QPState { return qp.d.State() }

// Attr returns the attributes applied so far and the current state.
func (qp *QP) Attr() QPAttr { return qp.d.Attr() }

// Modify moves the QP to attr.State, applying the attributes of that
// transition (see QPAttr). Invalid transitions return ErrInvalidState.
func (qp *QP) Modify(attr QPAttr) error { return qp.d.Modify(&attr) }

// PostSend posts a batch of send work requests. Local validation errors
// (state, opcode, SGE count, inline size, atomic alignment, full queue)
// stop the batch and are returned as a *PostError; work requests before it
// were posted. Errors found while executing arrive as completions.
func (qp *QP) PostSend(wrs []SendWR) error { return qp.d.PostSend(wrs) }

// PostRecv posts a batch of receive work requests. A QP with an SRQ takes
// its receives from the SRQ and refuses PostRecv.
func (qp *QP) PostRecv(wrs []RecvWR) error {
	if qp.srq != nil {
		return driver.PostErr(0, ErrInvalidArgument, "QP %#x uses an SRQ; post receives to the SRQ", qp.num)
	}
	return qp.d.PostRecv(wrs)
}

// Close destroys the QP. Outstanding work requests are dropped without
// completions, as with ibv_destroy_qp.
func (qp *QP) Close() error {
	if ok, _ := drop(qp.ctx, qp.ctx.qps, qp, nil); !ok {
		return nil
	}
	return qp.d.Close()
}
