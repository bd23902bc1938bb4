package shm

// Goroutines. Application goroutines run PostSend, which executes send
// entries under qpDriver.mu in order (Writes, Reads and atomics posted to
// an empty send queue straight from the caller's list: PostDirect). One progress goroutine per context
// (started with the context, stopped by Close) retries entries parked by a
// receiver-not-ready condition when their RNR timer expires or a receive
// appears, watches peer processes (pidfd) and peers' error reports in the
// control blocks, and fails the affected queue pairs.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/arena"
	"os"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

// DeviceName is the one device of this transport.
const DeviceName = "shm0"

// Errors.
var (
	ErrAddress   = errors.New("shm: malformed peer address")
	ErrOtherHost = errors.New("shm: peer is on another host (shm connects queue pairs of one host only)")
	ErrPeerMap   = errors.New("shm: cannot map the peer's memory")
)

func init() { verbs.Register(soft.NewDriver(driver{})) }

type driver struct{}

func (driver) Name() string { return "shm" }

func (driver) Devices() ([]verbs.DeviceInfo, error) {
	return []verbs.DeviceInfo{soft.Limits(verbs.DeviceInfo{
		Name:      DeviceName,
		Transport: "shm",
		NodeType:  "Software",
		NodeGUID:  guid(),
		FWVersion: "rdmakit-shm",
		MaxMRSize: uint64(1) << 36,
		AtomicCap: verbs.AtomicGlob,
		Caps: verbs.CapImmediate | verbs.CapAtomics | verbs.CapRNRRetry | verbs.CapSeparateKeys | verbs.CapSRQ |
			verbs.CapRemoteErrorCompletion | verbs.CapMultiSGERead | verbs.CapZeroLengthRead | verbs.CapRemoteAccessChecks | verbs.CapStrictStatus |
			verbs.CapSameHost | verbs.CapWriteOnPost,
		Ports: []verbs.PortInfo{{
			Num: 1, State: verbs.PortActive, MaxMTU: verbs.MTU4096, ActiveMTU: verbs.MTU4096,
			LinkLayer: "Memory", Addrs: []string{fmt.Sprintf("host %s", bootID()[:8])},
		}},
	})}, nil
}

var bootOnce = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		h, _ := os.Hostname()
		return fmt.Sprintf("%-36s", h)
	}
	return fmt.Sprintf("%-36s", string(bytes.TrimSpace(b)))
})

func bootID() string { return bootOnce() }

func guid() uint64 {
	var g uint64
	for _, c := range []byte(bootID()) {
		g = g*131 + uint64(c)
	}
	return g
}

// Address layout (fixed 88 bytes, little endian):
//
//	0  magic  "SHM1"
//	4  pid    uint32
//	8  fd     uint32  the arena memfd in that process
//	12 qpn    uint32
//	16 size   uint64  arena size
//	24 ino    uint64  arena inode, proves the fd is the arena
//	32 qcb    uint64  control block offset
//	40 boot   [36]byte kernel boot id: same host
//	76 reserved
const addrLen = 88

type address struct {
	pid, fd, qpn uint32
	size, ino    uint64
	qcb          uint64
	boot         string
}

func (a *address) encode() []byte {
	b := make([]byte, addrLen)
	copy(b, "SHM1")
	le := binary.LittleEndian
	le.PutUint32(b[4:], a.pid)
	le.PutUint32(b[8:], a.fd)
	le.PutUint32(b[12:], a.qpn)
	le.PutUint64(b[16:], a.size)
	le.PutUint64(b[24:], a.ino)
	le.PutUint64(b[32:], a.qcb)
	copy(b[40:76], a.boot)
	return b
}

func parseAddress(b []byte) (address, error) {
	if len(b) != addrLen || string(b[:4]) != "SHM1" {
		return address{}, fmt.Errorf("%w (%d bytes)", ErrAddress, len(b))
	}
	le := binary.LittleEndian
	a := address{
		pid: le.Uint32(b[4:]), fd: le.Uint32(b[8:]), qpn: le.Uint32(b[12:]),
		size: le.Uint64(b[16:]), ino: le.Uint64(b[24:]), qcb: le.Uint64(b[32:]),
		boot: string(b[40:76]),
	}
	if a.qcb+rc.QCBSize > a.size || a.size == 0 {
		return address{}, fmt.Errorf("%w: control block outside arena", ErrAddress)
	}
	return a, nil
}

// Peer arenas, shared by every queue pair of the process that talks to the
// same peer context.
var (
	// peersMu guards peers.
	peersMu sync.Mutex
	peers   = map[peerKey]*peer{}
)

type peerKey struct {
	pid int
	ino uint64
}

type peer struct {
	key   peerKey
	mem   []byte
	pidfd int // -1 for this process
	refs  int
}

func acquirePeer(a address) (*peer, error) {
	k := peerKey{int(a.pid), a.ino}
	peersMu.Lock()
	defer peersMu.Unlock()
	if p := peers[k]; p != nil {
		p.refs++
		return p, nil
	}
	// Peers in this process are mapped the same way, through the memfd: the
	// mapping then outlives the other context's Close.
	p := &peer{key: k, pidfd: -1, refs: 1}
	fd, err := sys.OpenPeerFd(int(a.pid), int(a.fd))
	if err != nil {
		return nil, fmt.Errorf("%w: %v (peers must run as the same user in the same PID namespace)", ErrPeerMap, err)
	}
	defer sys.Close(fd)
	if ino, err := sys.Inode(fd); err != nil || ino != a.ino {
		return nil, fmt.Errorf("%w: fd %d of process %d is not its arena", ErrPeerMap, a.fd, a.pid)
	}
	mem, err := arena.MapShared(fd, int(a.size))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPeerMap, err)
	}
	if int(a.pid) != os.Getpid() {
		pfd, err := sys.PidfdOpen(int(a.pid))
		if err != nil {
			sys.Unmap(mem)
			return nil, fmt.Errorf("%w: pidfd_open(%d): %v", ErrPeerMap, a.pid, err)
		}
		p.pidfd = pfd
	}
	p.mem = mem
	peers[k] = p
	return p, nil
}

func releasePeer(p *peer) {
	peersMu.Lock()
	defer peersMu.Unlock()
	p.refs--
	if p.refs > 0 {
		return
	}
	delete(peers, p.key)
	// In-flight copies by other goroutines finished under their QP locks
	// before the QPs released the peer.
	sys.Unmap(p.mem)
	if p.pidfd >= 0 {
		sys.Close(p.pidfd)
	}
}

func (p *peer) dead() bool { return p.pidfd >= 0 && sys.ProcessExited(p.pidfd) }

type ctxDriver struct {
	ctx  *soft.Context
	stop chan struct{}
	done chan struct{}
	kick chan struct{}

	// mu guards qps.
	mu  sync.Mutex
	qps map[*qpDriver]struct{}
}

func (driver) Open(dev verbs.DeviceInfo, opts vdriver.Options, ctx *soft.Context) (soft.ContextTransport, error) {
	if err := checkSystem(); err != nil {
		return nil, err
	}
	c := &ctxDriver{ctx: ctx, stop: make(chan struct{}), done: make(chan struct{}),
		kick: make(chan struct{}, 1), qps: map[*qpDriver]struct{}{}}
	ctxsMu.Lock()
	ctxs[c] = struct{}{}
	ctxsMu.Unlock()
	go c.progress()
	return c, nil
}

func (c *ctxDriver) CanRegister() bool { return false }

func (c *ctxDriver) Close() error {
	ctxsMu.Lock()
	delete(ctxs, c)
	ctxsMu.Unlock()
	close(c.stop)
	<-c.done
	return nil
}

func (c *ctxDriver) NewQP(qp *soft.QP) (soft.QPTransport, error) {
	mem, fd, ino := c.ctx.Arena()
	d := &qpDriver{c: c, qp: qp}
	d.addr = (&address{
		pid: uint32(os.Getpid()), fd: uint32(fd), qpn: qp.Num(), size: uint64(len(mem)), ino: ino,
		qcb: uint64(qp.ControlOffset()), boot: bootID(),
	}).encode()
	c.mu.Lock()
	c.qps[d] = struct{}{}
	c.mu.Unlock()
	return d, nil
}

// progressTick bounds how late a dead peer or a peer's error report is
// noticed.
const progressTick = 5 * time.Millisecond

func (c *ctxDriver) progress() {
	defer close(c.done)
	t := time.NewTimer(progressTick)
	defer t.Stop()
	var qps []*qpDriver
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		case <-c.kick:
		}
		c.mu.Lock()
		qps = qps[:0]
		for d := range c.qps {
			qps = append(qps, d)
		}
		c.mu.Unlock()
		next := progressTick
		now := time.Now()
		for _, d := range qps {
			if w := d.poll(now); w > 0 && w < next {
				next = w
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

func (c *ctxDriver) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}
