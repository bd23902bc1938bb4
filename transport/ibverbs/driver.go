//go:build ibverbs

package ibverbs

// Goroutines. Each open context runs two goroutines parked in the Go
// netpoller: one takes completion events from the context's completion
// channel and wakes the CQ's waiters; one takes asynchronous events (CQ
// overflow, QP fatal errors) and records them. A context that connects
// queue pairs through rdma_cm (iWARP) runs a third, for rdma_cm events. All
// of them stop when the context closes. Posting and polling run on the
// caller's goroutine: one cgo call each.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rdmakit/rdmakit/internal/arena"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

// Enabled reports whether the package was built with the ibverbs tag.
const Enabled = true

// TransportName is the name this transport registers with verbs.
const TransportName = "ibverbs"

func init() { verbs.Register(driver{}) }

type driver struct{}

func (driver) Name() string { return TransportName }

// Device attributes are cached per process: verbs lists devices on every
// Open, and probing the inline limit creates queue pairs.
var (
	infoMu    sync.Mutex
	infoCache = map[string]verbs.DeviceInfo{}
)

func (driver) Devices() ([]verbs.DeviceInfo, error) {
	names, err := deviceNames()
	if err != nil {
		if errors.Is(err, syscall.ENOSYS) || errors.Is(err, syscall.ENOENT) {
			return nil, nil // no RDMA in this kernel: no devices, not an error
		}
		return nil, fmt.Errorf("ibv_get_device_list: %w", err)
	}
	var out []verbs.DeviceInfo
	var firstErr error
	for _, n := range names {
		infoMu.Lock()
		di, ok := infoCache[n]
		infoMu.Unlock()
		if !ok {
			di, err = queryInfo(n)
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", n, err)
				}
				continue
			}
			infoMu.Lock()
			infoCache[n] = di
			infoMu.Unlock()
		} else {
			refreshPorts(&di)
		}
		out = append(out, di)
	}
	return out, firstErr
}

// refreshPorts re-reads port state and GIDs (addresses come and go).
func refreshPorts(di *verbs.DeviceInfo) {
	c, err := openDevice(di.Name)
	if err != nil {
		return
	}
	defer c.close()
	for i := range di.Ports {
		if p, err := portInfo(c, di.Name, di.Ports[i].Num); err == nil {
			di.Ports[i] = p
		}
	}
}

func queryInfo(name string) (verbs.DeviceInfo, error) {
	c, err := openDevice(name)
	if err != nil {
		return verbs.DeviceInfo{}, fmt.Errorf("ibv_open_device: %w", err)
	}
	defer c.close()
	a, err := c.queryDevice()
	if err != nil {
		return verbs.DeviceInfo{}, fmt.Errorf("ibv_query_device: %w", err)
	}
	di := verbs.DeviceInfo{
		Name: name, Transport: TransportName, NodeType: nodeTypeName(a.nodeType),
		NodeGUID: a.guid, FWVersion: a.fw, VendorID: a.vendor, MaxMRSize: a.maxMRSize,
		MaxQP: a.maxQP, MaxQPWR: a.maxQPWR, MaxSGE: a.maxSGE, MaxCQ: a.maxCQ, MaxCQE: a.maxCQE,
		MaxMR: a.maxMR, MaxPD: a.maxPD, MaxSRQ: a.maxSRQ, MaxSRQWR: a.maxSRQWR,
		AtomicCap: verbs.AtomicCap(a.atomicCap),
	}
	if di.FWVersion == "" {
		di.FWVersion = "-"
	}
	for p := 1; p <= a.ports; p++ {
		pi, err := portInfo(c, name, p)
		if err != nil {
			return di, fmt.Errorf("ibv_query_port %d: %w", p, err)
		}
		di.Ports = append(di.Ports, pi)
		if m := uint64(maxMsgOf(name, p)); m > di.MaxMsgSize {
			di.MaxMsgSize = m
		}
	}
	di.MaxInline = probeInline(c, a)
	di.Caps = deviceCaps(di, a.transportType == ibvTransportIWARP)
	extra := devExtra{maxSGERd: a.maxSGERd, maxRdAtom: a.maxRdAtom, maxInitRd: a.maxInitRd,
		iwarp: a.transportType == ibvTransportIWARP}
	extraMu.Lock()
	extras[name] = extra
	extraMu.Unlock()
	return di, nil
}

// devExtra holds attributes verbs.DeviceInfo has no field for.
type devExtra struct {
	maxSGERd, maxRdAtom, maxInitRd int
	iwarp                          bool
}

var (
	extraMu sync.Mutex
	extras  = map[string]devExtra{}
)

// maxMsgs records each port's max_msg_sz (PortInfo has no field for it).
var maxMsgs sync.Map // "dev/port" -> uint32

func nodeTypeName(t int) string {
	switch t {
	case ibvNodeCA:
		return "CA"
	case ibvNodeRNIC:
		return "RNIC"
	}
	return fmt.Sprintf("node type %d", t)
}

func linkLayerName(l int) string {
	switch l {
	case ibvLinkIB:
		return "InfiniBand"
	case ibvLinkEth:
		return "Ethernet"
	}
	return "InfiniBand"
}

func portInfo(c *cCtx, dev string, port int) (verbs.PortInfo, error) {
	pa, err := c.queryPort(port)
	if err != nil {
		return verbs.PortInfo{}, err
	}
	pi := verbs.PortInfo{Num: port, State: verbs.PortState(pa.state), MaxMTU: verbs.MTU(pa.maxMTU),
		ActiveMTU: verbs.MTU(pa.activeMTU), LinkLayer: linkLayerName(pa.linkLayer)}
	maxMsgs.Store(fmt.Sprintf("%s/%d", dev, port), pa.maxMsgSz)
	for _, g := range c.queryGIDs(port, pa.gidTblLen) {
		pi.GIDs = append(pi.GIDs, net.IP(append([]byte(nil), g.gid[:]...)))
	}
	for _, ip := range netdevAddrs(dev, port, c) {
		pi.Addrs = append(pi.Addrs, ip.String())
	}
	return pi, nil
}

// maxMsg is the port's max_msg_sz as recorded by portInfo.
func maxMsgOf(dev string, port int) uint32 {
	if v, ok := maxMsgs.Load(fmt.Sprintf("%s/%d", dev, port)); ok {
		return v.(uint32)
	}
	return 1 << 31
}

// netdevAddrs returns the IP addresses of the network device under a
// port: from the GID table's ifindex where the kernel reports it, else
// from sysfs (gid_attrs/ndevs).
func netdevAddrs(dev string, port int, c *cCtx) []net.IP {
	var ifs []*net.Interface
	seen := map[int]bool{}
	for _, g := range c.queryGIDs(port, 1024) {
		if g.ifindex > 0 && !seen[g.ifindex] {
			seen[g.ifindex] = true
			if ifc, err := net.InterfaceByIndex(g.ifindex); err == nil {
				ifs = append(ifs, ifc)
			}
		}
	}
	if len(ifs) == 0 {
		for _, n := range netdevNames(dev, port) {
			if ifc, err := net.InterfaceByName(n); err == nil {
				ifs = append(ifs, ifc)
			}
		}
	}
	if len(ifs) == 0 {
		// iWARP (siw) GIDs are the netdev's MAC address, zero padded.
		all, _ := net.Interfaces()
		for _, g := range c.queryGIDs(port, 16) {
			for i := range all {
				hw := all[i].HardwareAddr
				if len(hw) == 6 && string(hw) == string(g.gid[:6]) && isZero(g.gid[6:]) {
					ifs = append(ifs, &all[i])
				}
			}
		}
	}
	var v4, v6 []net.IP
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			if ipn.IP.To4() != nil {
				v4 = append(v4, ipn.IP.To4())
			} else {
				v6 = append(v6, ipn.IP)
			}
		}
	}
	return append(v4, v6...)
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func netdevNames(dev string, port int) []string {
	var out []string
	base := fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/gid_attrs/ndevs", dev, port)
	ents, _ := os.ReadDir(base)
	seen := map[string]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(base, e.Name()))
		n := strings.TrimSpace(string(b))
		if err == nil && n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		// Older kernels: the parent netdev link.
		if ents, err := os.ReadDir(fmt.Sprintf("/sys/class/infiniband/%s/device/net", dev)); err == nil {
			for _, e := range ents {
				out = append(out, e.Name())
			}
		}
	}
	return out
}

// probeInline finds the largest max_inline_data the device grants, by
// creating queue pairs (providers refuse larger requests with EINVAL).
func probeInline(c *cCtx, a devAttr) int {
	pd, err := c.allocPD()
	if err != nil {
		return 0
	}
	defer pd.dealloc()
	if err := c.startEventsOnce(); err != nil {
		return 0
	}
	cq, err := c.createCQ(4, 0)
	if err != nil {
		return 0
	}
	defer cq.destroy()
	try := func(n int) bool {
		cp := verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: n}
		q, err := pd.createQP(cq, cq, nil, 0, false, &cp)
		if err != nil {
			return false
		}
		q.destroy()
		return true
	}
	lo, hi := 0, verbs.MaxInline
	if try(hi) {
		return hi
	}
	for lo < hi-1 {
		m := (lo + hi) / 2
		if try(m) {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// ---------------------------------------------------------------- context

type ctxDriver struct {
	opts  verbs.Options
	arena *arena.Arena // memory for AllocMR
	info  verbs.DeviceInfo
	extra devExtra
	c     *cCtx
	iwarp bool

	// mu guards the maps, gids, cm and allocs.
	mu     sync.Mutex
	allocs []*allocation
	cqs    map[uint64]*cq
	qps    map[uint64]*qp
	qpNums map[uint32]*qp
	gids   map[int][]gidEntry
	cm     *cmMux

	// quirks are the driver defects worked around (quirks.go); fixQPs
	// counts QPs whose completions need rewriting; lkeys is the table of
	// registered regions rxe's stall watch checks work requests against.
	quirks quirk
	fixQPs atomic.Int32
	lkeyMu sync.Mutex
	lkeys  atomic.Pointer[map[uint32]lkeyRange]

	nextID   atomic.Uint64
	closed   atomic.Bool
	files    []*os.File
	wg       sync.WaitGroup
	openInfo verbs.DeviceInfo
}

func (driver) Open(dev verbs.DeviceInfo, opts verbs.Options) (vdriver.Context, error) {
	c, err := openDevice(dev.Name)
	if err != nil {
		return nil, fmt.Errorf("ibv_open_device(%s): %v: %w", dev.Name, err, verbs.ErrNoDevice)
	}
	if err := c.startEventsOnce(); err != nil {
		c.close()
		return nil, err
	}
	a, err := arena.New("rdmakit-"+dev.Name, int(opts.ArenaSize))
	if err != nil {
		c.close()
		return nil, err
	}
	extraMu.Lock()
	ex := extras[dev.Name]
	extraMu.Unlock()
	d := &ctxDriver{opts: opts, arena: a, info: dev, extra: ex, c: c, iwarp: ex.iwarp,
		cqs: map[uint64]*cq{}, qps: map[uint64]*qp{}, qpNums: map[uint32]*qp{}, gids: map[int][]gidEntry{},
		quirks: quirksOf(dev.VendorID) &^ quirksOff}
	d.lkeys.Store(&map[uint32]lkeyRange{})
	for _, p := range dev.Ports {
		pa, err := c.queryPort(p.Num)
		if err == nil {
			d.gids[p.Num] = c.queryGIDs(p.Num, pa.gidTblLen)
		}
	}
	if err := d.startLoop(c.compFd(), d.onCQEvent); err != nil {
		d.Close()
		return nil, err
	}
	if err := d.startLoop(c.asyncFd(), d.onAsyncEvent); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// startEventsOnce creates the completion channel if it does not exist.
func (c *cCtx) startEventsOnce() error {
	if c.ch != nil {
		return nil
	}
	return c.startEvents()
}

// startLoop runs drain, on a goroutine parked in the netpoller, whenever
// fd is readable, until the context closes. fd is dup'ed so that closing
// the Go file does not close the library's descriptor.
func (d *ctxDriver) startLoop(fd int, drain func()) error {
	nfd, err := sys.DupNonblock(fd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(nfd), "ibverbs-events")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	d.mu.Lock()
	d.files = append(d.files, f)
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		rc.Read(func(uintptr) bool {
			if d.closed.Load() {
				return true
			}
			drain()
			return false // wait for the next readiness
		})
	}()
	return nil
}

func (d *ctxDriver) newID() uint64 { return d.nextID.Add(1) }

func (d *ctxDriver) onCQEvent() {
	for {
		id, ok := d.c.cqEvent()
		if !ok {
			return
		}
		d.mu.Lock()
		q := d.cqs[id]
		d.mu.Unlock()
		if q != nil {
			q.event()
		}
	}
}

func (d *ctxDriver) onAsyncEvent() {
	for {
		typ, obj, ok := d.c.asyncEvent()
		if !ok {
			return
		}
		switch typ {
		case ibvEventCQErr:
			d.mu.Lock()
			q := d.cqs[obj]
			d.mu.Unlock()
			if q != nil {
				q.overflow()
			}
		default:
			d.mu.Lock()
			q := d.qps[obj]
			d.mu.Unlock()
			if q != nil {
				q.asyncEvent(typ)
			}
		}
	}
}

// markError records that a QP completed a work request with an error: an
// RC QP is in ERROR from then on.
func (d *ctxDriver) markError(num uint32) {
	d.mu.Lock()
	q := d.qpNums[num]
	d.mu.Unlock()
	if q != nil {
		q.enterError()
	}
}

func (d *ctxDriver) CanRegister() bool { return true }

// Close stops the event goroutines and closes the device. verbs has
// destroyed every object made from the context.
func (d *ctxDriver) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.mu.Lock()
	files := d.files
	d.files = nil
	cm := d.cm
	d.cm = nil
	d.mu.Unlock()
	for _, f := range files {
		f.Close()
	}
	d.wg.Wait()
	if cm != nil {
		cm.close()
	}
	d.c.close()
	d.arena.Close()
	return nil
}

// portGIDs returns the port's GID table, re-read when refresh is set.
func (d *ctxDriver) portGIDs(port int, refresh bool) []gidEntry {
	d.mu.Lock()
	g, ok := d.gids[port]
	d.mu.Unlock()
	if ok && !refresh {
		return g
	}
	pa, err := d.c.queryPort(port)
	if err != nil {
		return g
	}
	g = d.c.queryGIDs(port, pa.gidTblLen)
	d.mu.Lock()
	d.gids[port] = g
	d.mu.Unlock()
	return g
}

func (d *ctxDriver) port(n int) (verbs.PortInfo, bool) {
	for _, p := range d.info.Ports {
		if p.Num == n {
			return p, true
		}
	}
	return verbs.PortInfo{}, false
}

// ---------------------------------------------------------------- PD, MR

type pdT struct {
	d *ctxDriver
	c *cPD
}

func (d *ctxDriver) AllocPD() (vdriver.PD, error) {
	c, err := d.c.allocPD()
	if err != nil {
		return nil, wrap("ibv_alloc_pd", err)
	}
	return &pdT{d: d, c: c}, nil
}

func (p *pdT) Close() error {
	if err := p.c.dealloc(); err != nil {
		return wrap("ibv_dealloc_pd", err)
	}
	return nil
}

type mr struct {
	d          *ctxDriver
	c          *cMR
	buf        []byte
	lkey, rkey uint32
	alloc      *allocation // non-nil: buf lies in AllocMR memory
}

// allocation is memory AllocMR took from the arena; every registration on
// it holds a reference, and it returns to the arena with the last one, so
// the device never keeps a key to memory that is handed out again.
// Guarded by ctxDriver.mu.
type allocation struct {
	off, n, refs int
}

// AllocMR registers memory from the context's arena: off-heap, page
// aligned, zeroed.
func (p *pdT) AllocMR(size int, access verbs.Access) (vdriver.MR, error) {
	off, b, err := p.d.arena.Alloc(size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", verbs.ErrNoMemory, err)
	}
	m, err := p.reg(b[:size:size], access)
	if err != nil {
		p.d.arena.Free(off, size)
		return nil, err
	}
	a := &allocation{off: off, n: size, refs: 1}
	m.alloc = a
	p.d.mu.Lock()
	p.d.allocs = append(p.d.allocs, a)
	p.d.mu.Unlock()
	return m, nil
}

func (p *pdT) RegMR(buf []byte, access verbs.Access) (vdriver.MR, error) {
	var a *allocation
	if off := p.d.arena.Offset(buf); off >= 0 {
		p.d.mu.Lock()
		for _, x := range p.d.allocs {
			if off >= x.off && off+len(buf) <= x.off+x.n {
				a = x
				a.refs++ // held while registering, so it cannot go
				break
			}
		}
		p.d.mu.Unlock()
		if a == nil {
			return nil, fmt.Errorf("%w: %d bytes of the context's memory that no live region holds (deregistered or never allocated)", verbs.ErrInvalidArgument, len(buf))
		}
	}
	m, err := p.reg(buf, access)
	if err != nil {
		if a != nil {
			p.d.release(a)
		}
		return nil, err
	}
	m.alloc = a
	return m, nil
}

// release drops a reference to an allocation, freeing it with the last.
func (d *ctxDriver) release(a *allocation) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a.refs--
	if a.refs > 0 {
		return
	}
	for i, x := range d.allocs {
		if x == a {
			d.allocs = append(d.allocs[:i], d.allocs[i+1:]...)
			break
		}
	}
	d.arena.Free(a.off, a.n)
}

func (p *pdT) reg(buf []byte, access verbs.Access) (*mr, error) {
	c, err := p.c.regMR(buf, access)
	if err != nil {
		return nil, regError(len(buf), err)
	}
	l, r := c.keys()
	if len(buf) > 0 {
		p.d.addLKey(l, lkeyRange{addr: uint64(addrOf(buf)), n: uint64(len(buf)), pd: p})
	}
	return &mr{d: p.d, c: c, buf: buf, lkey: l, rkey: r}, nil
}

func (m *mr) Bytes() []byte { return m.buf }
func (m *mr) LKey() uint32  { return m.lkey }
func (m *mr) RKey() uint32  { return m.rkey }
func (m *mr) Dereg() error {
	if err := m.c.dereg(); err != nil {
		return wrap("ibv_dereg_mr", err)
	}
	m.d.dropLKey(m.lkey)
	if m.alloc != nil {
		m.d.release(m.alloc)
	}
	return nil
}

// ---------------------------------------------------------------- SRQ

type srq struct {
	c  *cSRQ
	mu sync.Mutex
	wq *cWQ
}

func (p *pdT) CreateSRQ(cfg verbs.SRQConfig) (vdriver.SRQ, error) {
	c, w, s, err := p.c.createSRQ(cfg.MaxWR, cfg.MaxSGE)
	if err != nil {
		return nil, wrap(fmt.Sprintf("ibv_create_srq(max_wr %d, max_sge %d)", cfg.MaxWR, cfg.MaxSGE), err)
	}
	return &srq{c: c, wq: newWQ(c.ptr(), w, s, false)}, nil
}

func (s *srq) PostRecv(wrs []verbs.RecvWR) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return postRecvChunks(s.wq, wrs, true)
}

func (s *srq) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.c.destroy(); err != nil {
		return wrap("ibv_destroy_srq", err)
	}
	s.wq.free()
	return nil
}

// postRecvChunks posts wrs in chains of at most the queue's preallocated
// size.
func postRecvChunks(w *cWQ, wrs []verbs.RecvWR, isSRQ bool) error {
	done := 0
	for done < len(wrs) {
		n := min(len(wrs)-done, w.maxWR())
		for i := 0; i < n; i++ {
			wr := &wrs[done+i]
			if len(wr.SGL) > w.sge {
				if i > 0 {
					if bad, e := w.postRecv(i, isSRQ); e != 0 {
						return &verbs.PostError{Index: done + bad, Err: recvErr(e)}
					}
				}
				return &verbs.PostError{Index: done + i, Err: fmt.Errorf("%w: %d SGEs, max_recv_sge is %d", verbs.ErrInvalidArgument, len(wr.SGL), w.sge)}
			}
			w.setRecv(i, wr)
		}
		if bad, e := w.postRecv(n, isSRQ); e != 0 {
			return &verbs.PostError{Index: done + bad, Err: recvErr(e)}
		}
		done += n
	}
	return nil
}

func recvErr(e syscall.Errno) error {
	if e == syscall.ENOMEM {
		return fmt.Errorf("%w: ibv_post_recv: receive queue full", verbs.ErrQueueFull)
	}
	return fmt.Errorf("ibv_post_recv: %v: %w", e, mapErrno(e))
}

// siwVendorID is soft-iWARP's vendor id ("bmt").
const siwVendorID = 0x626d74

// deviceCaps declares what a device can do. The driver knows its devices:
// iWARP has no immediate data, no RNR retry, terminates the connection on
// a remote error and reads into one SGE; siw (Linux 6.1) does not check
// remote read access or a QP's remote access flags, uses one key for
// local and remote access and cannot be trusted with a zero-length Read
// (quirks.go); rxe shares keys too.
func deviceCaps(di verbs.DeviceInfo, iwarp bool) verbs.Capability {
	c := verbs.CapRegisterCallerMemory | verbs.CapSRQ | verbs.CapNetwork | verbs.CapZeroLengthRead | verbs.CapRemoteAccessChecks
	if di.AtomicCap != verbs.AtomicNone {
		c |= verbs.CapAtomics
	}
	if iwarp {
		if di.VendorID == siwVendorID {
			c &^= verbs.CapRemoteAccessChecks
		}
		c &^= verbs.CapZeroLengthRead
		return c
	}
	c |= verbs.CapImmediate | verbs.CapRNRRetry | verbs.CapRemoteErrorCompletion | verbs.CapMultiSGERead
	// No CapSeparateKeys: rxe, siw and mlx5 hand out one key for both.
	return c
}
