package coll

// Goroutines. Collective calls run entirely in the caller's goroutine:
// they post RDMA writes and busy-poll memory and completion queues
// themselves; one call runs at a time per communicator (opMu). Each
// communicator has one watcher goroutine reading its bootstrap
// connection: it records aborts (failed), departures (gone) and the end of
// Close's rendezvous (allBye). The transports run their own goroutines
// (tcp: one reader per QP).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"

	_ "github.com/rdmakit/rdmakit/transport/shm" // shm0 between ranks of a host
	_ "github.com/rdmakit/rdmakit/transport/tcp" // tcp0 between hosts (ibverbs.go links RDMA devices)
)

// Comm is one rank's handle of a communicator. Its methods are safe for
// concurrent use, but collectives are executed one at a time, in call
// order; every rank must call the same collectives in the same order.
type Comm struct {
	rank, nranks int
	opts         Options
	infos        []rankInfo
	local        int  // ranks on this host, this one included
	allSync      bool // every pair of ranks talks over a synchronous endpoint (shm; decided in setup)
	anyTCP       bool // some pair of ranks talks over tcp (decided in setup)
	spinFor      time.Duration
	spinFirst    int  // polls before a wait looks at the clock (proto.go)
	yieldEach    bool // a wait yields the CPU at every poll between looks (oversubscribed; proto.go spinOversub)
	lookMask     int  // a long wait looks (clock, context, peers, yield) every lookMask+1 polls
	oneP         bool // GOMAXPROCS was 1 when the communicator was made, or bind made it 1 (see Comm.backoff)
	bound        bool // bind pinned the process to one CPU

	boot   *frameConn
	root   *root // served by this process for this communicator, or nil
	eps    []*endpoint
	peers  []*peer // by rank; nil for this rank
	allBye chan struct{}
	wdone  chan struct{}

	failed atomic.Pointer[error] // set once: the communicator's end
	gone   []atomic.Bool         // ranks that left cleanly
	closed atomic.Bool

	// opMu serialises collectives; it guards the fields below, which only
	// the goroutine inside a collective touches.
	opMu     sync.Mutex
	seq      uint32
	sendSeq  []uint32 // point-to-point messages sent to each rank
	recvSeq  []uint32 // and received from each
	op       opState
	bounceIn region
	bounceOu region
	// hdScratch holds halvingReduceScatter's partial sums.
	hdScratch region
	// foldIn and scratch serve foldRanks (direct.go).
	foldIn  [][]byte
	scratch []byte
	// owing are the channels whose credits wait for their next post or
	// the next wait (deferCredits in proto.go); capacity: every channel.
	owing []*channel
	// paidAlone counts the credit writes posted on their own (ack).
	paidAlone uint64

	// memMu guards regions.
	memMu   sync.Mutex
	regions []*region // sorted by address
	// hits are the last regions lookup found (send and receive buffers
	// of the same collective usually alternate between two).
	hits [2]atomic.Pointer[region]
	hitN atomic.Uint32
}

// procComms counts the communicators of this process, open or being
// made: with more than one (ranks as goroutines of one process), a wait
// lets the other goroutines run (Comm.backoff).
var procComms atomic.Int32

// region is memory registered with every endpoint of the communicator,
// writable by peers (direct writes, see algo.go).
type region struct {
	buf   []byte
	addr  uintptr
	mrs   [maxEndpoints]*verbs.MR
	keys  [maxEndpoints]uint32 // lkeys by endpoint
	flag  []byte               // a word past buf in the same memory region (srcRef)
	rkeys [maxEndpoints]uint32
}

// Rank returns this rank's index.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks.
func (c *Comm) Size() int { return c.nranks }

// LocalRanks returns how many ranks (this one included) share this host.
func (c *Comm) LocalRanks() int { return c.local }

// Transport returns the device used to reach rank r ("shm0", "tcp0",
// "mlx5_0"), or "" for this rank.
func (c *Comm) Transport(r int) string {
	if r < 0 || r >= c.nranks || c.peers[r] == nil {
		return ""
	}
	return c.peers[r].ep.dev
}

// Devices returns the devices this rank uses to reach its peers.
func (c *Comm) Devices() []string {
	var d []string
	for _, ep := range c.eps {
		d = append(d, ep.dev)
	}
	return d
}

// DeviceUse is a device this rank uses and the peers it reaches with it.
type DeviceUse struct {
	Device    string // "shm0", "tcp0", "mlx5_0", ...
	Transport string // "shm", "tcp", "ibverbs"
	Port      int
	// Sync: writes are in the peer's memory when posted
	// (verbs.CapWriteOnPost).
	Sync  bool
	Peers []int
}

// DeviceUses describes the devices this rank uses, in the order of
// Devices.
func (c *Comm) DeviceUses() []DeviceUse {
	var out []DeviceUse
	for _, ep := range c.eps {
		u := DeviceUse{Device: ep.dev, Transport: ep.off.Transport, Port: ep.off.Port, Sync: ep.sync}
		for r, p := range c.peers {
			if p != nil && p.ep == ep {
				u.Peers = append(u.Peers, r)
			}
		}
		out = append(out, u)
	}
	return out
}

// Options returns the options in effect (environment and defaults
// applied).
func (c *Comm) Options() Options { return c.opts }

func newComm(ctx context.Context, addr string, nonce uint64, nranks, rank int, o Options, r *root) (*Comm, error) {
	procComms.Add(1)
	fc, infos, err := joinRoot(ctx, addr, nonce, rank, nranks, o.BootstrapTimeout)
	if err != nil {
		procComms.Add(-1)
		return nil, err
	}
	c := &Comm{
		rank: rank, nranks: nranks, opts: o, infos: infos, boot: fc, root: r,
		peers: make([]*peer, nranks), gone: make([]atomic.Bool, nranks),
		sendSeq: make([]uint32, nranks), recvSeq: make([]uint32, nranks),
		allBye: make(chan struct{}), wdone: make(chan struct{}),
	}
	for _, in := range infos {
		if in.Host == infos[rank].Host {
			c.local++
		}
	}
	c.oneP = runtime.GOMAXPROCS(0) == 1
	c.spinFor, c.spinFirst, c.lookMask = 10*time.Microsecond, spinFirst, lookEvery-1
	if c.local > runtime.NumCPU() {
		// Oversubscribed: let the others run.
		c.spinFor, c.spinFirst, c.lookMask, c.yieldEach = 0, spinOversub, lookOversub-1, true
	}
	err = c.bind()
	if err == nil {
		err = c.setup(ctx)
	}
	if err != nil {
		// Tell the others at once rather than letting them time out.
		var e enc
		e.u32(uint32(rank))
		e.str("setup failed: " + err.Error())
		e.u32(0)
		fc.write(msgAbort, e)
		fc.close()
		c.freeAll()
		procComms.Add(-1)
		return nil, fmt.Errorf("%w: rank %d: %w", ErrBootstrap, rank, err)
	}
	for _, ep := range c.eps {
		if ep.sleepWait {
			// Progress over tcp needs this process's CPU (its polls read
			// the sockets, and its reader goroutines when nobody
			// polls): shm waits of a rank with tcp peers spin less.
			c.spinFor = min(c.spinFor, 5*time.Microsecond)
		}
	}
	if d, err := envDuration(EnvSpin, c.spinFor); err == nil {
		c.spinFor = d
	}
	if c.spinFor > 0 {
		c.yieldEach = false // asked to spin first (RDMAKIT_COLL_SPIN)
	}
	go c.watch()
	if c.bound {
		c.settleRuntime()
	}
	return c, nil
}

// bind pins the process to a core (Options.Bind "core"): the k-th rank of
// this host to the k-th CPU, round robin (k mod the CPUs) where the host's
// ranks outnumber its CPUs. Left to the OS, ranks that outnumber the cores
// and poll with yields often end up unevenly spread (three on one CPU, one
// on the other, for tens of milliseconds: every rank that runs a spinning
// or yielding loop looks busy and cache-hot to the load balancer), and a
// collective then waits for three scheduler rounds on one CPU instead of
// two on each; pinned round robin, each CPU has its share. 4 ranks on 2
// CPUs, AllReduce 8 B, µs per call, 15 alternating launches: unpinned
// 4.33-8.02 (median 6.57: the uneven spread in 10 of 15), pinned
// 3.92-4.16 in 12 of 15 (median 4.09); Open MPI sm 5.21 unpinned, 3.68
// pinned (--bind-to core:overload-allowed). docs/benchmarks.md, "Small
// collectives on shm with ranks outnumbering cores".
func (c *Comm) bind() error {
	if c.opts.Bind != "core" {
		return nil
	}
	k := 0 // ranks of this host before us
	for _, in := range c.infos[:c.rank] {
		if in.Host == c.infos[c.rank].Host {
			k++
		}
	}
	if _, err := sys.BindProcess(k); err != nil {
		return fmt.Errorf("%s=core: %w", EnvBind, err)
	}
	// One CPU, one P. The runtime lowers GOMAXPROCS to the new affinity
	// by itself, but only at its next check (up to a second later);
	// until then the threads of idle Ps wake up on this CPU to look for
	// work (netpoll, work stealing) and take it from the rank, which
	// stalls its peers too. An explicit GOMAXPROCS stays as it is.
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > 1 {
		runtime.GOMAXPROCS(1)
		c.oneP = true
	}
	c.bound = true
	return nil
}

// settleRuntime runs on this CPU, without sleeping, for runtimeSettle,
// at the end of making a communicator whose process bind pinned. When a
// Go process wakes from idle (the bootstrap's network waits), the
// runtime's monitor thread (sysmon) polls every 20 µs (about 85 µs with
// the kernel's timer slack) for some 50 rounds, then doubles its sleep up
// to 10 ms. On a pinned rank each of those wake-ups takes the rank's CPU
// for 10-25 µs (2-core KVM guest), and the peer waits as long: a 2-rank
// 8 B AllReduce launch of 2000 calls right after start took 0.25-0.48 µs
// a call where the steady state is 0.18. Spinning through that phase
// here leaves the monitor asleep for milliseconds at a time by the first
// collective: 0.18 µs from the first call (docs/benchmarks.md, "short
// launches"). Other goroutines may run meanwhile (Gosched).
func (c *Comm) settleRuntime() {
	for end := time.Now().Add(runtimeSettle); time.Now().Before(end); {
		for i := 0; i < 1000; i++ {
			relax()
		}
		runtime.Gosched()
	}
}

// runtimeSettle is how long settleRuntime spins: the monitor's 50 short
// rounds (~4 ms) and its doublings up to sleeps of ~5 ms.
const runtimeSettle = 25 * time.Millisecond

// watch reads the bootstrap connection until it ends.
func (c *Comm) watch() {
	defer close(c.wdone)
	byeSeen := false
	for {
		typ, p, err := c.boot.read()
		if err != nil {
			if !c.closed.Load() {
				c.fail(fmt.Errorf("%w: connection to the bootstrap root (rank 0's process) lost: %v", ErrPeerLost, err), false)
			}
			if !byeSeen {
				close(c.allBye)
			}
			return
		}
		d := dec{b: p}
		switch typ {
		case msgAbort:
			rk := int(d.u32())
			reason := d.str()
			kind := ErrAborted
			if k := int(d.u32()); d.err == nil && k < len(abortKinds) {
				kind = abortKinds[k]
			}
			var err error = fmt.Errorf("%w: rank %d failed: %s", ErrAborted, rk, reason)
			if kind != ErrAborted {
				err = fmt.Errorf("%w (%w): rank %d failed: %s", ErrAborted, kind, rk, reason)
			}
			c.fail(err, false)
		case msgLeft:
			if rk := int(d.u32()); rk >= 0 && rk < c.nranks {
				c.gone[rk].Store(true)
			}
		case msgAllBye:
			if !byeSeen {
				byeSeen = true
				close(c.allBye)
			}
		case msgError:
			c.fail(fmt.Errorf("%w: root: %s", ErrAborted, p), false)
		}
	}
}

// abortKinds are the causes an ABORT message can name, so that other
// ranks' errors match the same sentinel (index on the wire).
var abortKinds = []error{ErrAborted, ErrPeerLost, ErrTimeout, ErrMismatch}

func abortKind(err error) uint32 {
	for i := len(abortKinds) - 1; i > 0; i-- {
		if errors.Is(err, abortKinds[i]) {
			return uint32(i)
		}
	}
	return 0
}

// fail ends the communicator with err (the first error wins) and, when it
// is this rank's own error, tells the other ranks through the root.
func (c *Comm) fail(err error, tell bool) error {
	if c.failed.CompareAndSwap(nil, &err) && tell {
		var e enc
		e.u32(uint32(c.rank))
		e.str(err.Error())
		e.u32(abortKind(err))
		c.boot.write(msgAbort, e)
	}
	return *c.failed.Load()
}

// Err returns the error that ended the communicator, or nil.
func (c *Comm) Err() error {
	if p := c.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Abort ends the communicator now: other ranks' collectives fail with
// ErrAborted instead of waiting for this one. Close must still be called.
func (c *Comm) Abort(reason string) {
	c.fail(fmt.Errorf("%w: rank %d aborted: %s", ErrAborted, c.rank, reason), true)
}

// Close leaves the communicator and releases its resources. Close is
// collective: it waits (up to the bootstrap timeout) for the other ranks
// to close too, so that none loses a peer it still talks to; a failed
// communicator closes at once.
func (c *Comm) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	defer procComms.Add(-1)
	c.opMu.Lock()
	defer c.opMu.Unlock()
	if c.Err() == nil {
		// Everything we wrote lands before our bye can reach anyone: a
		// peer still waiting for our last messages gets them, rather
		// than seeing us gone first (the bye travels on another
		// connection and would overtake data queued on tcp).
		c.settle()
	}
	c.boot.write(msgBye, nil)
	if c.Err() == nil {
		select {
		case <-c.allBye:
		case <-time.After(c.opts.BootstrapTimeout):
		}
	}
	c.boot.close()
	<-c.wdone
	c.freeAll()
	if c.root != nil {
		select {
		case <-c.root.done:
		case <-time.After(time.Second):
			c.root.close()
		}
	}
	return nil
}

// freeAll frees verbs resources (no collective may be running).
func (c *Comm) freeAll() {
	c.memMu.Lock()
	c.regions = nil
	c.hits[0].Store(nil)
	c.hits[1].Store(nil)
	c.memMu.Unlock()
	for _, ep := range c.eps {
		ep.ctx.Close() // destroys QPs, CQs and regions
	}
	c.eps = nil
}

// Alloc returns n bytes of memory registered with every transport of the
// communicator (zeroed, page aligned, off the Go heap). Collectives on it
// run without staging copies. Free it with Free before Close; Close
// releases what is left.
func (c *Comm) Alloc(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("%w: negative size", ErrInvalidArgument)
	}
	if c.closed.Load() {
		return nil, ErrClosed
	}
	rg, err := c.newRegion(max(n, 1))
	if err != nil {
		return nil, err
	}
	c.memMu.Lock()
	i := sort.Search(len(c.regions), func(i int) bool { return c.regions[i].addr >= rg.addr })
	c.regions = append(c.regions, nil)
	copy(c.regions[i+1:], c.regions[i:])
	c.regions[i] = rg
	c.memMu.Unlock()
	return rg.buf[:n:n], nil
}

// Free releases memory from Alloc.
func (c *Comm) Free(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	addr := sys.Addr(b[:1])
	c.memMu.Lock()
	i := sort.Search(len(c.regions), func(i int) bool { return c.regions[i].addr >= addr })
	if i == len(c.regions) || c.regions[i].addr != addr {
		c.memMu.Unlock()
		return fmt.Errorf("%w: Free of memory not from Alloc", ErrInvalidArgument)
	}
	rg := c.regions[i]
	c.regions = append(c.regions[:i], c.regions[i+1:]...)
	c.hits[0].Store(nil)
	c.hits[1].Store(nil)
	c.memMu.Unlock()
	c.freeRegion(rg)
	return nil
}

// newRegion allocates memory in the first endpoint and registers it with
// the others (only the first can lack CapRegisterCallerMemory, as shm
// does: setup orders them so).
func (c *Comm) newRegion(n int) (*region, error) {
	if len(c.eps) == 0 {
		// A single rank has no endpoints: plain memory does.
		b := make([]byte, n)
		return &region{buf: b, addr: sys.Addr(b)}, nil
	}
	const access = verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	fo := alignUp(n, wordSize) // the flag word (srcRef), after buf
	mr, err := c.eps[0].pd.AllocMR(fo+wordSize, access)
	if err != nil {
		return nil, fmt.Errorf("coll: allocating %d bytes: %w", n, err)
	}
	all := mr.Bytes()
	rg := &region{buf: all[:n], addr: uintptr(mr.Addr()), flag: all[fo : fo+wordSize]}
	rg.mrs[0], rg.keys[0], rg.rkeys[0] = mr, mr.LKey(), mr.RKey()
	for i := 1; i < len(c.eps); i++ {
		m, err := c.eps[i].pd.RegMR(all, access)
		if err != nil {
			c.freeRegion(rg)
			return nil, fmt.Errorf("coll: registering %d bytes with %s: %w", n, c.eps[i].dev, err)
		}
		rg.mrs[i], rg.keys[i], rg.rkeys[i] = m, m.LKey(), m.RKey()
	}
	return rg, nil
}

func (c *Comm) freeRegion(rg *region) {
	for i := len(rg.mrs) - 1; i >= 0; i-- {
		if rg.mrs[i] != nil {
			rg.mrs[i].Dereg()
		}
	}
}

// lookup finds the registered region holding all of b.
func (c *Comm) lookup(b []byte) *region {
	if len(b) == 0 {
		return nil
	}
	addr := sys.Addr(b)
	end := addr + uintptr(len(b))
	for i := range c.hits {
		if rg := c.hits[i].Load(); rg != nil && addr >= rg.addr && end <= rg.addr+uintptr(len(rg.buf)) {
			return rg
		}
	}
	c.memMu.Lock()
	defer c.memMu.Unlock()
	i := sort.Search(len(c.regions), func(i int) bool { return c.regions[i].addr > addr }) - 1
	if i < 0 {
		return nil
	}
	rg := c.regions[i]
	if end <= rg.addr+uintptr(len(rg.buf)) {
		c.hits[c.hitN.Add(1)%2].Store(rg)
		return rg
	}
	return nil
}

// String describes the communicator.
func (c *Comm) String() string {
	return fmt.Sprintf("coll.Comm(rank %d of %d, pid %d)", c.rank, c.nranks, os.Getpid())
}
