package soft

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/arena"
	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/stats"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// keySlots is the key table capacity; two keys per region at most half
// load gives MaxMR regions.
const (
	keySlots = 16384
	// MaxMR is the number of live memory regions per context.
	MaxMR = keySlots / 4
)

// Context is an open software device.
type Context struct {
	info  DeviceInfo
	drv   ContextTransport
	arena *arena.Arena
	keys  keytab.Table
	// keysOff is where the key table lives in the arena.
	keysOff, keysLen int
	// stats counts completions when the process opted in (nil: not).
	stats *stats.Counters

	// mu guards everything below.
	mu     sync.Mutex
	mrs    []*MR // by keytab index; nil holes are reused
	qps    map[uint32]*QP
	cqs    map[*CQ]struct{}
	srqs   map[*SRQ]struct{}
	pds    map[*PD]struct{}
	closed bool
}

// open opens dev of transport t.
func open(t Transport, dev DeviceInfo, opts driver.Options) (*Context, error) {
	a, err := arena.New("rdmakit-"+dev.Name, int(opts.ArenaSize))
	if errors.Is(err, sys.ErrNotSupported) {
		// No arena on this operating system (Windows): no software device
		// can open here.
		return nil, fmt.Errorf("%s: %w: %w", dev.Name, driver.ErrNotSupported, err)
	}
	if err != nil {
		return nil, err
	}
	c := &Context{
		info:  dev,
		arena: a,
		qps:   map[uint32]*QP{},
		cqs:   map[*CQ]struct{}{},
		srqs:  map[*SRQ]struct{}{},
		pds:   map[*PD]struct{}{},
		stats: stats.For(dev.Transport, dev.Name),
	}
	c.keysLen = keytab.Size(keySlots)
	off, b, err := a.Alloc(c.keysLen)
	if err != nil {
		a.Close()
		return nil, err
	}
	c.keysOff = off
	c.keys = keytab.Init(b, keySlots)
	c.drv, err = t.Open(dev, opts, c)
	if err != nil {
		a.Close()
		return nil, err
	}
	return c, nil
}

// Stats returns the device's counters (internal/stats), nil unless the
// process opted in.
func (c *Context) Stats() *stats.Counters { return c.stats }

// Info returns the device's attributes (ibv_query_device).
func (c *Context) Info() DeviceInfo { return c.info }

// Transport returns the transport's context state.
func (c *Context) Transport() ContextTransport { return c.drv }

// Arena returns the context's arena memory, its memfd and inode (for
// transports that share it with peers).
func (c *Context) Arena() (mem []byte, fd int, ino uint64) {
	return c.arena.Mem, c.arena.Fd, c.arena.Ino
}

// allocShared carves control memory for queues out of the arena.
func (c *Context) allocShared(n int) (int, []byte, error) {
	off, b, err := c.arena.Alloc(n)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrNoMemory, err)
	}
	return off, b, nil
}

// Close destroys everything created from the context, unblocks waiters and
// releases the device.
func (c *Context) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	var qps []*QP
	for _, q := range c.qps {
		qps = append(qps, q)
	}
	var cqs []*CQ
	for q := range c.cqs {
		cqs = append(cqs, q)
	}
	var forget []func()
	for _, m := range c.mrs {
		if m != nil && m.forget != nil {
			forget = append(forget, m.forget)
		}
	}
	c.mu.Unlock()
	for _, q := range qps {
		q.destroy()
	}
	defer func() {
		for _, f := range forget {
			f() // the QPs that could touch the memory are gone
		}
	}()
	for _, q := range cqs {
		q.markClosed()
	}
	err := c.drv.Close()
	c.arena.Close()
	return err
}

func randUint32() uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("verbs: crypto/rand failed: " + err.Error())
	}
	return binary.LittleEndian.Uint32(b[:])
}

// PD is a protection domain: regions and queue pairs of different PDs
// cannot be used together.
type PD struct {
	ctx    *Context
	handle uint32
}

// AllocPD allocates a protection domain.
func (c *Context) AllocPD() (driver.PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	pd := &PD{ctx: c, handle: randUint32() | 1}
	c.pds[pd] = struct{}{}
	return pd, nil
}

// Context returns the PD's context.
func (pd *PD) Context() *Context { return pd.ctx }

// Close releases the PD. It fails with ErrBusy while regions or QPs use it.
func (pd *PD) Close() error {
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mrs {
		if m != nil && m.pd == pd {
			return fmt.Errorf("%w: PD still has memory regions", ErrBusy)
		}
	}
	for _, q := range c.qps {
		if q.pd == pd {
			return fmt.Errorf("%w: PD still has queue pairs", ErrBusy)
		}
	}
	delete(c.pds, pd)
	return nil
}

// MR is a registered memory region.
type MR struct {
	pd     *PD
	buf    []byte
	access Access
	lkey   uint32
	rkey   uint32
	index  uint32
	// arenaOff is the offset in the arena, or -1 for caller memory.
	arenaOff int
	// alloc is the AllocMR allocation the memory belongs to (nil for
	// caller memory); it is freed when its last registration goes.
	alloc *allocation
	// forget takes caller memory off internal/sys's list of memory that
	// raw reads and writes avoid (it may be a file mapping); nil for
	// arena memory.
	forget func()
}

// allocation is memory AllocMR took from the arena. Every region
// registered on (part of) it holds a reference: the memory returns to the
// arena only when the last one is deregistered, so no key of an alias can
// reach memory that a later AllocMR hands out. Guarded by Context.mu.
type allocation struct {
	off, n int
	refs   int
}

func (a *allocation) contains(off, n int) bool { return off >= a.off && off+n <= a.off+a.n }

// AllocMR allocates size bytes of off-heap memory (from the context's
// arena) and registers them with access. The memory is zeroed, page
// aligned, and reachable by every transport, including peer processes.
func (pd *PD) AllocMR(size int, access Access) (driver.MR, error) {
	if size < 0 {
		return nil, fmt.Errorf("%w: negative size", ErrInvalidArgument)
	}
	off, b, err := pd.ctx.allocShared(size)
	if err != nil {
		return nil, err
	}
	mr, err := pd.register(b[:size:size], off, &allocation{off: off, n: size}, access)
	if err != nil {
		pd.ctx.arena.Free(off, size)
		return nil, err
	}
	return mr, nil
}

// RegMR registers caller memory. The memory must stay referenced and must
// not be reused until DeregMR. Transports that cannot reach caller memory
// (shm: peers map only the arena) return ErrNotSupported; use AllocMR.
// Memory that AllocMR returned may be registered again with other access.
func (pd *PD) RegMR(buf []byte, access Access) (driver.MR, error) {
	off := pd.ctx.arena.Offset(buf)
	if off < 0 && !pd.ctx.drv.CanRegister() {
		return nil, fmt.Errorf("%w: %s cannot reach caller memory; allocate it with AllocMR", ErrNotSupported, pd.ctx.info.Transport)
	}
	mr, err := pd.register(buf, off, nil, access)
	if err != nil {
		return nil, err
	}
	if off < 0 {
		mr.forget = sys.NoteCallerMemory(buf)
	}
	return mr, nil
}

func (pd *PD) register(buf []byte, arenaOff int, alloc *allocation, access Access) (*MR, error) {
	c := pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if arenaOff >= 0 && alloc == nil {
		// Arena memory registered again: it must lie in an allocation that
		// a live region holds, which this registration then holds too.
		for _, m := range c.mrs {
			if m != nil && m.alloc != nil && m.alloc.contains(arenaOff, len(buf)) {
				alloc = m.alloc
				break
			}
		}
		if alloc == nil {
			return nil, fmt.Errorf("%w: %d bytes of the context's memory that no live region holds (deregistered or never allocated)", ErrInvalidArgument, len(buf))
		}
	}
	idx := -1
	for i, m := range c.mrs {
		if m == nil {
			idx = i
			break
		}
	}
	live := 0
	for _, m := range c.mrs {
		if m != nil {
			live++
		}
	}
	if live >= MaxMR {
		return nil, fmt.Errorf("%w: %d memory regions (max_mr)", ErrNoMemory, MaxMR)
	}
	if idx < 0 {
		idx = len(c.mrs)
		c.mrs = append(c.mrs, nil)
	}
	mr := &MR{pd: pd, buf: buf, access: access, index: uint32(idx), arenaOff: arenaOff, alloc: alloc}
	if alloc != nil {
		alloc.refs++
	}
	handle := keytab.NoHandle
	if arenaOff >= 0 {
		handle = uint64(arenaOff)
	}
	e := keytab.Entry{Flags: uint32(access), VA: uint64(sys.Addr(buf)), Length: uint64(len(buf)), Handle: handle, Index: uint32(idx), PD: pd.handle}
	for {
		e.Key = randUint32()
		if c.keys.Insert(e) == nil {
			break
		}
	}
	mr.lkey = e.Key
	e.Flags |= keytab.FlagRemoteKey
	for {
		e.Key = randUint32()
		if c.keys.Insert(e) == nil {
			break
		}
	}
	mr.rkey = e.Key
	c.mrs[idx] = mr
	return mr, nil
}

// Bytes returns the region's memory.
func (mr *MR) Bytes() []byte { return mr.buf }

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key.
func (mr *MR) RKey() uint32 { return mr.rkey }

// deregWait bounds how long Dereg waits for operations in flight to
// finish their current touch of the memory (one chunk, rc.ChunkSize):
// only an operation stuck mid-touch (a peer process stopped or killed
// there) takes longer, and then the memory stays reserved.
const deregWait = 2 * time.Second

// Dereg deregisters the region: from the moment it returns, its keys
// resolve nowhere and no operation touches its memory, including
// operations that resolved a key before (they touch memory a chunk at a
// time, each under the key table's in-use count, and Dereg waits for the
// chunk in progress). Requests on its keys that start after Dereg
// returned fail (RemoteAccess for a remote key); requests racing with it
// may still complete: an executor that holds the region entered (the
// direct path's rc.RemoteHold and LocalMemo) serves later requests of the
// same call on the same key from what it remembered, and Dereg returns
// only once it let go. Memory from AllocMR is released, unless an
// operation is stuck mid-chunk past deregWait: then it stays reserved for
// good, so that no later AllocMR hands it out.
func (mr *MR) Dereg() error {
	c := mr.pd.ctx
	c.mu.Lock()
	if int(mr.index) >= len(c.mrs) || c.mrs[mr.index] != mr {
		c.mu.Unlock()
		return fmt.Errorf("%w: region already deregistered", ErrInvalidArgument)
	}
	ls := c.keys.RemoveSlot(mr.lkey)
	rs := c.keys.RemoveSlot(mr.rkey)
	c.mrs[mr.index] = nil
	forget := mr.forget
	var free *allocation
	if a := mr.alloc; a != nil {
		a.refs--
		if a.refs == 0 && !c.closed {
			// No live region holds it now, so no registration can take
			// it again; it returns to the arena once idle.
			free = a
		}
	}
	// Executors that keep the lkey's region entered between operations
	// (rc.LocalPins) let it go now; their next touch would fail anyway.
	var holders []*QP
	for _, q := range c.qps {
		if q.hold.Holds(ls) { // only an executor's hold is ever set (qp.xl is written after the QP is listed)
			holders = append(holders, q)
		}
	}
	c.mu.Unlock()
	for _, q := range holders {
		q.releaseHold(ls)
	}
	// One deadline for both keys: Dereg waits at most deregWait.
	deadline := time.Now().Add(deregWait)
	idle := c.keys.Idle(ls, deregWait)
	idle = c.keys.Idle(rs, max(time.Until(deadline), 0)) && idle
	if free != nil && idle {
		c.arena.Free(free.off, free.n)
	}
	if forget != nil && idle {
		forget() // nothing touches it any more
	}
	return nil
}

// registeredAt returns the n bytes at addr if a live region of the
// context holds them (whatever its PD and key): inline data is found by
// address, not by key. A scan, for the rare inline SGE with a stale key.
func (c *Context) registeredAt(addr uint64, n int) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.mrs {
		if m == nil {
			continue
		}
		va := uint64(sys.Addr(m.buf))
		if addr >= va && addr+uint64(n) >= addr && addr+uint64(n) <= va+uint64(len(m.buf)) {
			return m.buf[addr-va : addr-va+uint64(n)], true
		}
	}
	return nil, n == 0
}

// extMemory resolves a caller-memory region by index (for local targets).
func (c *Context) extMemory(index uint32) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if int(index) < len(c.mrs) && c.mrs[index] != nil {
		return c.mrs[index].buf
	}
	return nil
}

// Limits fills in the limits every software device has because the soft
// engine sets them (queue pairs, work requests, scatter/gather entries,
// CQs, MRs, PDs, SRQs, inline data and message size) and returns d; the
// transport sets the rest (region size, atomic scope, capabilities).
func Limits(d driver.DeviceInfo) driver.DeviceInfo {
	d.MaxQP, d.MaxQPWR, d.MaxSGE = 1<<16, driver.MaxQPWR, driver.MaxSGE
	d.MaxCQ, d.MaxCQE, d.MaxMR, d.MaxPD = 1<<16, 1<<20, MaxMR, 1<<16
	d.MaxSRQ, d.MaxSRQWR = 1<<16, driver.MaxQPWR
	d.MaxInline, d.MaxMsgSize = driver.MaxInline, driver.MaxMsgSize
	return d
}
