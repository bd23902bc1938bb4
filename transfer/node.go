package transfer

// The node: devices, segments, metadata registration. Goroutines: per
// device, one accept loop of its cm listener and one goroutine per
// accepted connection that closes it when its peer goes (or the node
// closes); one lease goroutine that renews the node's lease (and
// re-registers after an expiry); one janitor that closes idle and dead
// peer connections (conn.go). Close stops them all and waits.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/cm"
	"github.com/rdmakit/rdmakit/verbs"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// Defaults of Config's zero fields.
const (
	DefaultQPsPerPeer = 4
	DefaultSliceSize  = 1 << 20
	// DefaultSameHostSliceSize is the same-host device's default slice.
	DefaultSameHostSliceSize = 16 << 20
	DefaultQueueDepth        = 32
	DefaultLeaseTTL          = 10 * time.Second
	DefaultPeerTimeout       = 5 * time.Second
	DefaultIdleTimeout       = time.Minute
)

// Config configures a node. Every zero field takes the default documented
// on it.
type Config struct {
	// Name names the node in the metadata table (default host name and
	// process id, and a count for the second node of a process on).
	Name string
	// ListenAddr is the address of the node's services: the embedded
	// metadata service listens on it when MetadataAddr is empty, and the
	// devices' cm listeners on its host with ports chosen by the system
	// (default "127.0.0.1:0").
	ListenAddr string
	// MetadataAddr is the address of another node's metadata service, or
	// an etcd cluster ("etcd://host:2379,host:2379[/prefix]", keys under
	// DefaultEtcdPrefix without a prefix); empty: this node serves the
	// embedded table on ListenAddr.
	MetadataAddr string
	// Metadata, if set, replaces both: the node publishes to it (an etcd
	// implementation, a shared table in tests). The node does not close it.
	Metadata Metadata
	// Devices are the verbs devices the node opens (default: chosen by
	// capability: the first same-host device (shm0), every network
	// device of the ibverbs transport (RDMA NICs) when linked, then tcp0;
	// those that fail to open are skipped; roce devices only when named
	// here, see autoNetwork). Peers on this host (same kernel boot id and
	// PID namespace) are reached by the same-host device, others by the
	// first network device both have. A device named here that cannot be
	// opened fails New.
	Devices []string
	// Secret authenticates everything the node accepts and dials: cm
	// connections (cm.Options.Secret) and the metadata service. At least
	// cm.MinSecretLen bytes, the same on every node.
	Secret []byte
	// Insecure allows nodes without a Secret (tests, trusted networks).
	Insecure bool
	// QPsPerPeer is how many QPs connect this node to each peer node over
	// a device (default DefaultQPsPerPeer); slices spread over them.
	QPsPerPeer int
	// SliceSize is the largest piece of a request one work request moves
	// (default DefaultSliceSize, 1 MiB, over network devices, and
	// DefaultSameHostSliceSize, 16 MiB, over the same-host device, whose
	// copies run on the poster's thread: larger copies go faster there
	// and more QPs add no parallelism).
	SliceSize int
	// Rails is the most devices one request's slices spread over
	// (multi-rail). 0: every network device both nodes have for a node on
	// another host, the same-host device alone for one on this host; n:
	// up to n devices, the preferred first (for a node on this host the
	// same-host device, then network devices).
	Rails int
	// QueueDepth is the number of slices in flight per QP (default
	// DefaultQueueDepth).
	QueueDepth int
	// LeaseTTL is the node's lease in the metadata table: it renews it
	// every third of it, and a node that stops renewing disappears with
	// its segments after LeaseTTL (default DefaultLeaseTTL).
	LeaseTTL time.Duration
	// PeerTimeout is cm's peer timeout on the node's connections: a peer
	// silent that long is lost and its requests fail (default
	// DefaultPeerTimeout).
	PeerTimeout time.Duration
	// IdleTimeout closes connections to a peer unused that long (default
	// DefaultIdleTimeout).
	IdleTimeout time.Duration
	// ArenaSize is passed to verbs.Options of each device (0: verbs'
	// default).
	ArenaSize int64
	// TCPBusyPoll is passed to verbs.Options.TCPBusyPoll of a tcp device:
	// how long each QP's reader polls its socket before it sleeps; any
	// busy polling also lets the application's polls of a QP's CQ read
	// its socket (Batch.Wait's). 0: RDMAKIT_TCP_BUSY_POLL if set, else
	// DefaultTCPBusyPoll (unlike verbs' default); negative: off.
	TCPBusyPoll time.Duration
}

// DefaultTCPBusyPoll is the engine's busy polling over tcp: next to none
// by the readers (a few attempts), but on, so that a Wait's polls read
// the answer from the socket themselves (Batch.Wait: the only Wait of a
// process polls for as long as its transfer takes). The engine's
// processes have several sockets (a QP per peer and Config.QPsPerPeer,
// the metadata and the KV master's connections) and its waiters sleep
// when several wait: a reader that spins keeps a Go processor from the
// network poller, so the socket that has the answer is read only once the
// spin ends (2 cores: an 8-byte Read batch took 110-160 µs with 50µs
// polling, 21-27 µs without; a KV Get of 8 B 190 µs against 40 µs). The
// transport spins 20 µs on links nobody polls (the target side of
// one-sided Reads), where the next request of several clients is near.
const DefaultTCPBusyPoll = time.Microsecond

// busyPoll is the verbs.Options.TCPBusyPoll of the node's devices.
func (c Config) busyPoll() time.Duration {
	switch {
	case c.TCPBusyPoll > 0:
		return c.TCPBusyPoll
	case c.TCPBusyPoll < 0:
		return -1
	case os.Getenv(driver.EnvBusyPoll) != "":
		return 0 // verbs reads it
	}
	return DefaultTCPBusyPoll
}

// nodeSeq counts the nodes of this process given a default name.
var nodeSeq atomic.Int32

func (c Config) withDefaults() Config {
	if c.Name == "" {
		h, _ := os.Hostname()
		c.Name = fmt.Sprintf("%s-%d", h, os.Getpid())
		if k := nodeSeq.Add(1); k > 1 {
			c.Name += fmt.Sprintf("-%d", k) // another node of this process
		}
	}
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.QPsPerPeer <= 0 {
		c.QPsPerPeer = DefaultQPsPerPeer
	}
	if c.QueueDepth <= 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	return c
}

// device is one opened verbs device with the node's PD and cm listener.
type device struct {
	name     string
	sameHost bool // CapSameHost: reaches this host only
	canReg   bool // CapRegisterCallerMemory
	ctx      *verbs.Context
	pd       *verbs.PD
	ln       *cm.Listener
	posted   atomic.Int64 // slices posted over it (tests)
}

// Node is a transfer engine node. All methods are safe for concurrent use.
type Node struct {
	cfg     Config
	host    string
	devs    []*device
	meta    Metadata
	ownMeta bool
	srv     *metaServer
	rr      atomic.Uint32
	info    NodeInfo
	// registered: the node's record is in the table (set by New before
	// anything else can see the node).
	registered bool

	ctx       context.Context // ends at Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	leaseOnce sync.Once // starts the lease watcher (lease_linux.go)

	// mu guards everything below.
	mu       sync.Mutex
	closed   bool
	segs     map[string]*segment
	mem      map[*verbs.MR]*localMem // regions this node knows, by the caller's MR
	peers    map[peerKey]*peer
	accepted map[*cm.Conn]struct{}
	segCache map[string]SegmentDesc
	nodeInfo map[string]NodeInfo
}

// localMem is a region of memory as each device knows it.
type localMem struct {
	owned bool                  // allocated by the node (AllocMR): freed with it
	byDev map[*device]*verbs.MR // per device
	extra []*verbs.MR           // registrations the node made (deregistered with it)
}

// hostIdentity says which nodes can use the same-host device with each
// other: the same kernel (boot id) and PID namespace, as coll decides.
var hostIdentity = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	id := string(bytes.TrimSpace(b))
	if err != nil || id == "" {
		id, _ = os.Hostname()
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		id += "/" + ns
	}
	return id
})

// autoNetwork lists the transports whose network devices autoDevices
// picks, best first: RDMA NICs (libibverbs), then tcp. Other network
// transports are opened only when Config.Devices names them: roce is a
// software RDMA stack that, on one kernel's UDP stack, is no faster than
// tcp0 today (loopback write latency about 1.6x tcp0's, bandwidth about
// the same), and it would bind UDP port 4791 on every interface and add
// a rail over the same NIC as tcp0.
var autoNetwork = []string{"ibverbs", "tcp"}

// autoDevices picks devices by capability: the first same-host device,
// then the network devices of autoNetwork's transports in its order
// (each transport's in the system's order).
func autoDevices() []string {
	infos, _ := verbs.Devices()
	var same []string
	byNet := make([][]string, len(autoNetwork))
	for _, d := range infos {
		switch {
		case d.Caps.Has(verbs.CapSameHost):
			if len(same) == 0 {
				same = append(same, d.Name)
			}
		case d.Caps.Has(verbs.CapNetwork):
			if i := slices.Index(autoNetwork, d.Transport); i >= 0 {
				byNet[i] = append(byNet[i], d.Name)
			}
		}
	}
	return slices.Concat(append([][]string{same}, byNet...)...)
}

// New starts a node: it opens its devices, listens for connections,
// starts or reaches the metadata service and registers itself.
func New(ctx context.Context, cfg Config) (_ *Node, err error) {
	cfg = cfg.withDefaults()
	if len(cfg.Secret) == 0 && !cfg.Insecure {
		return nil, ErrNoCredential
	}
	if len(cfg.Secret) > 0 && len(cfg.Secret) < cm.MinSecretLen {
		return nil, fmt.Errorf("transfer: Secret shorter than %d bytes", cm.MinSecretLen)
	}
	host, _, err := net.SplitHostPort(cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("transfer: ListenAddr %q: %w", cfg.ListenAddr, err)
	}
	n := &Node{
		cfg: cfg, host: hostIdentity(),
		segs: map[string]*segment{}, mem: map[*verbs.MR]*localMem{}, peers: map[peerKey]*peer{},
		accepted: map[*cm.Conn]struct{}{}, segCache: map[string]SegmentDesc{}, nodeInfo: map[string]NodeInfo{},
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	names := cfg.Devices
	if len(names) == 0 {
		names = autoDevices()
	}
	infos, _ := verbs.Devices()
	var openErrs []error
	for _, name := range names {
		d := &device{name: name}
		for _, in := range infos {
			if in.Name == name {
				d.sameHost = in.Caps.Has(verbs.CapSameHost)
				d.canReg = in.Caps.Has(verbs.CapRegisterCallerMemory)
			}
		}
		if d.ctx, err = verbs.Open(name, verbs.Options{ArenaSize: cfg.ArenaSize, TCPBusyPoll: cfg.busyPoll()}); err != nil {
			if len(cfg.Devices) > 0 {
				return nil, fmt.Errorf("transfer: device %s: %w", name, err)
			}
			openErrs = append(openErrs, err)
			continue
		}
		if d.pd, err = d.ctx.AllocPD(); err == nil {
			d.ln, err = cm.Listen(n.ctx, net.JoinHostPort(host, "0"), cm.ListenOptions{Options: n.cmOptions(d),
				// Every node of this host dials from the same address.
				MaxHandshakes: 256, MaxHandshakesPerSource: 128, Backlog: 1024})
		}
		if err != nil {
			if d.pd != nil {
				d.pd.Close()
			}
			d.ctx.Close()
			if len(cfg.Devices) > 0 {
				return nil, fmt.Errorf("transfer: device %s: %w", name, err)
			}
			openErrs = append(openErrs, err)
			continue
		}
		n.devs = append(n.devs, d)
		n.info.Endpoints = append(n.info.Endpoints, Endpoint{Device: name, Addr: d.ln.Addr().String()})
		n.wg.Add(1)
		go n.acceptLoop(d)
	}
	if len(n.devs) == 0 {
		return nil, fmt.Errorf("%w: no device opened (%v)", ErrNoDevice, errors.Join(openErrs...))
	}
	n.info.Name, n.info.Host = cfg.Name, n.host
	ttl := cfg.LeaseTTL
	switch {
	case cfg.Metadata != nil:
		n.meta = cfg.Metadata
	case cfg.MetadataAddr == "":
		t := newMemTable()
		if n.srv, err = startMetaServer(cfg.ListenAddr, t, cfg.Secret, cfg.Insecure); err != nil {
			return nil, err
		}
		n.meta, n.ownMeta, ttl = t, true, 0 // the table's own node does not expire
	case IsEtcdURL(cfg.MetadataAddr):
		if n.meta, err = OpenEtcd(cfg.MetadataAddr); err != nil {
			return nil, err
		}
		n.ownMeta = true
	default:
		n.meta, n.ownMeta = newMetaClient(cfg.MetadataAddr, cfg.Secret), true
	}
	if err := n.meta.PutNode(ctx, n.info, ttl); err != nil {
		return nil, err
	}
	n.registered = true
	if ttl > 0 {
		n.wg.Add(1)
		go n.leaseLoop()
	}
	n.wg.Add(1)
	go n.janitor()
	return n, nil
}

func (n *Node) cmOptions(d *device) cm.Options {
	return cm.Options{
		Secret: n.cfg.Secret, Insecure: n.cfg.Insecure && len(n.cfg.Secret) == 0, PD: d.pd,
		// One send slot per engine slot: a slot is free again once its
		// completion is polled (a verbs guarantee).
		Cap:         verbs.QPCap{MaxSendWR: n.cfg.QueueDepth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1},
		SignalAll:   true,
		PeerTimeout: n.cfg.PeerTimeout,
	}
}

// sliceSize returns the slice size over device d.
func (n *Node) sliceSize(d *device) int {
	switch {
	case n.cfg.SliceSize > 0:
		return n.cfg.SliceSize
	case d.sameHost:
		return DefaultSameHostSliceSize
	}
	return DefaultSliceSize
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Addr returns the address of the node's metadata service ("" when it
// uses another's).
func (n *Node) Addr() string {
	if n.srv == nil {
		return ""
	}
	return n.srv.Addr()
}

// Devices returns the names of the devices the node opened.
func (n *Node) Devices() []string {
	var s []string
	for _, d := range n.devs {
		s = append(s, d.name)
	}
	return s
}

func (n *Node) acceptLoop(d *device) {
	defer n.wg.Done()
	for {
		c, err := d.ln.Accept(n.ctx)
		if err != nil {
			return
		}
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			c.Close()
			return
		}
		n.accepted[c] = struct{}{}
		n.wg.Add(1)
		n.mu.Unlock()
		go func() {
			defer n.wg.Done()
			select {
			case <-c.Done():
			case <-n.ctx.Done():
			}
			c.Close()
			n.mu.Lock()
			delete(n.accepted, c)
			n.mu.Unlock()
		}()
	}
}

// leaseLoop renews the node's lease; after an expiry (the service lost
// it) it registers the node and its segments again.
func (n *Node) leaseLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.LeaseTTL/3)
		err := n.meta.Renew(ctx, n.cfg.Name)
		if errors.Is(err, ErrNoNode) {
			if n.meta.PutNode(ctx, n.info, n.cfg.LeaseTTL) == nil {
				n.mu.Lock()
				var descs []SegmentDesc
				for _, s := range n.segs {
					descs = append(descs, s.desc)
				}
				n.mu.Unlock()
				for _, d := range descs {
					n.meta.PutSegment(ctx, d)
				}
			}
		}
		cancel()
	}
}

// Close unregisters the node and its segments, fails what is in flight
// (requests fail with ErrClosed or ErrPeerLost), closes connections and
// devices, and waits for the node's goroutines.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	peers := n.peers
	n.peers = map[peerKey]*peer{}
	n.mu.Unlock()

	if n.registered {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		n.meta.DeleteNode(ctx, n.cfg.Name)
		cancel()
	}
	n.cancel() // stops dials in progress, the node's loops, accepted connections
	for _, p := range peers {
		p.close()
	}
	for _, d := range n.devs {
		d.ln.Close()
	}
	n.wg.Wait()
	if n.srv != nil {
		n.srv.Close()
	}
	if n.ownMeta && n.meta != nil {
		n.meta.Close()
	}
	n.mu.Lock()
	segs := n.segs
	n.segs = map[string]*segment{}
	mems := n.mem
	n.mem = map[*verbs.MR]*localMem{}
	n.mu.Unlock()
	for _, s := range segs {
		s.release()
	}
	for mr, m := range mems {
		for _, x := range m.extra {
			x.Dereg()
		}
		if m.owned {
			mr.Dereg()
		}
	}
	for _, d := range n.devs {
		d.pd.Close()
		d.ctx.Close()
	}
	return nil
}

// AllocMR allocates size bytes of registered memory that every device of
// the node can use, as a local buffer of requests or as a segment
// (RegisterSegment). It comes from the first device's arena (the
// same-host device's, memfd-backed, when the node has one) and is
// registered with the other devices that can register caller memory. The
// node frees it at Close, or FreeMR.
func (n *Node) AllocMR(size int) (*verbs.MR, error) {
	const acc = verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	first := n.devs[0]
	mr, err := first.pd.AllocMR(size, acc)
	if err != nil {
		return nil, err
	}
	m := &localMem{owned: true, byDev: map[*device]*verbs.MR{first: mr}}
	for _, d := range n.devs[1:] {
		if !d.canReg {
			continue
		}
		x, err := d.pd.RegMR(mr.Bytes(), acc)
		if err != nil {
			continue
		}
		m.byDev[d] = x
		m.extra = append(m.extra, x)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		for _, x := range m.extra {
			x.Dereg()
		}
		mr.Dereg()
		return nil, ErrClosed
	}
	n.mem[mr] = m
	return mr, nil
}

// FreeMR frees memory from AllocMR, or forgets the node's registrations
// of a caller's region; the region must be in no segment and no request.
func (n *Node) FreeMR(mr *verbs.MR) error {
	n.mu.Lock()
	m, ok := n.mem[mr]
	delete(n.mem, mr)
	n.mu.Unlock()
	if !ok {
		return nil
	}
	for _, x := range m.extra {
		x.Dereg()
	}
	if m.owned {
		return mr.Dereg()
	}
	return nil
}

// regionFor returns mr as device d knows it: the node's own regions are
// registered everywhere they can be; a caller's region is registered with
// d on first use (when d registers caller memory) and remembered until
// FreeMR or Close.
func (n *Node) regionFor(mr *verbs.MR, d *device) (*verbs.MR, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.mem[mr]
	if m == nil {
		m = &localMem{byDev: map[*device]*verbs.MR{}}
		n.mem[mr] = m
	}
	if x := m.byDev[d]; x != nil {
		return x, nil
	}
	if !d.canReg {
		return nil, fmt.Errorf("%w: region not allocated by this node (Node.AllocMR) and %s cannot register caller memory", ErrNoDevice, d.name)
	}
	x, err := d.pd.RegMR(mr.Bytes(), verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	if err != nil {
		return nil, fmt.Errorf("transfer: registering a region with %s: %w", d.name, err)
	}
	m.byDev[d] = x
	m.extra = append(m.extra, x)
	return x, nil
}
