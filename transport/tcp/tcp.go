package tcp

// Driver and per-context state.
//
// Goroutines: each Context runs one accept goroutine (acceptLoop) on its
// listener, and one short-lived handshake goroutine per accepted connection
// that reads the hello, finds the QP it names and hands the connection to
// that QP's link goroutine (or closes it). Everything else runs per queue
// pair (see link.go).

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

// Device and transport names.
const (
	transportName = "tcp"
	deviceName    = "tcp0"
)

// EnvAddr names the environment variable with the listen address of every
// context ("host:port"; default ":0", all interfaces, ephemeral port).
const EnvAddr = "RDMAKIT_TCP_ADDR"

const (
	// handshakeTimeout bounds reading and writing a hello, and how long an
	// accepted connection waits for its QP to reach RTR.
	handshakeTimeout = 5 * time.Second
)

// maxHandshakes bounds the accepted connections whose hello is not routed
// yet (each has a goroutine for up to handshakeTimeout): beyond it a new
// connection is closed at once, and a real dialer retries. A variable for
// tests.
var maxHandshakes = 1024

func init() { verbs.Register(soft.NewDriver(driver{})) }

type driver struct{}

func (driver) Name() string { return transportName }

func (driver) Devices() ([]verbs.DeviceInfo, error) { return []verbs.DeviceInfo{deviceInfo()}, nil }

func (driver) Open(dev verbs.DeviceInfo, opts vdriver.Options, ctx *soft.Context) (soft.ContextTransport, error) {
	if dev.Name != deviceName {
		return nil, fmt.Errorf("%w: %q is not a tcp device", verbs.ErrNoDevice, dev.Name)
	}
	cd, err := openContext(ctx, opts.ListenAddr)
	if err != nil {
		return nil, err
	}
	cd.busyPoll = max(opts.TCPBusyPoll, 0)
	if cd.busyPoll > 0 {
		cd.leaseWake = make(chan struct{}, 1)
		cd.wg.Add(1)
		go cd.leaseKeeper()
	}
	return cd, nil
}

func listenAddr() string {
	if a := os.Getenv(EnvAddr); a != "" {
		return a
	}
	return ":0"
}

var nodeGUID = func() uint64 {
	h := fnv.New64a()
	name, _ := os.Hostname()
	io.WriteString(h, "rdmakit-tcp/"+name)
	return h.Sum64()
}()

func deviceInfo() verbs.DeviceInfo {
	return soft.Limits(verbs.DeviceInfo{
		Name:      deviceName,
		Transport: transportName,
		NodeType:  "Software",
		NodeGUID:  nodeGUID,
		FWVersion: "rdmakit-tcp 1",
		MaxMRSize: 1 << 40,
		AtomicCap: verbs.AtomicHCA,
		Caps: verbs.CapImmediate | verbs.CapAtomics | verbs.CapRNRRetry | verbs.CapSeparateKeys | verbs.CapSRQ |
			verbs.CapRemoteErrorCompletion | verbs.CapMultiSGERead | verbs.CapZeroLengthRead | verbs.CapRemoteAccessChecks | verbs.CapStrictStatus |
			verbs.CapRegisterCallerMemory | verbs.CapNetwork,
		Ports: []verbs.PortInfo{{
			Num:       1,
			State:     verbs.PortActive,
			MaxMTU:    verbs.MTU4096,
			ActiveMTU: verbs.MTU4096,
			LinkLayer: "TCP",
			GIDs:      localIPs(),
			Addrs:     []string{listenAddr()},
		}},
	})
}

// localIPs lists the IPs of the host's interfaces (best effort).
func localIPs() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	return ips
}

// ListenAddr returns the address the tcp context ctx accepts connections
// on, or nil if ctx is not a tcp context.
func ListenAddr(ctx *verbs.Context) net.Addr {
	if sc, ok := ctx.Driver().(*soft.Context); ok {
		if cd, ok := sc.Transport().(*ctxDriver); ok {
			return cd.ln.Addr()
		}
	}
	return nil
}

// ctxDriver is the per-context state: the listener and the QP table.
type ctxDriver struct {
	ctx  *soft.Context
	ln   *net.TCPListener
	ip   net.IP // listen IP, unspecified for all interfaces
	port uint16
	done chan struct{} // closed by Close
	wg   sync.WaitGroup
	// busyPoll is how long a reader spins before it sleeps (0: never, and
	// no progress from polls); set once at Open.
	busyPoll time.Duration
	// pollers lists the links with a connection, for Progress (poll.go);
	// written under mu.
	pollers atomic.Pointer[[]*link]
	// leasedN counts the readers leased to pollers; leaseWake starts the
	// lease keeper's ticks (poll.go leaseKeeper).
	leasedN   atomic.Int32
	leaseWake chan struct{}
	// polls counts Progress calls; keeperPolls is it as the keeper last
	// saw it (the keeper's own).
	polls       atomic.Uint64
	keeperPolls uint64

	// mu guards qps, pending, handshakes, ready and closed.
	mu         sync.Mutex
	qps        map[uint32]*qpDriver
	pending    map[*net.TCPConn]struct{} // accepted, hello not read yet
	handshakes int                       // handshake goroutines running
	ready      chan struct{}             // closed and replaced when a QP reaches RTR
	closed     bool
}

func openContext(ctx *soft.Context, addr string) (*ctxDriver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen on %s (Options.ListenAddr, %s): %w", addr, EnvAddr, err)
	}
	ta := ln.Addr().(*net.TCPAddr)
	cd := &ctxDriver{
		ctx:     ctx,
		ln:      ln.(*net.TCPListener),
		ip:      ta.IP,
		port:    uint16(ta.Port),
		done:    make(chan struct{}),
		qps:     map[uint32]*qpDriver{},
		pending: map[*net.TCPConn]struct{}{},
		ready:   make(chan struct{}),
	}
	cd.wg.Add(1)
	go cd.acceptLoop()
	return cd, nil
}

func (cd *ctxDriver) CanRegister() bool { return true }

func (cd *ctxDriver) NewQP(qp *soft.QP) (soft.QPTransport, error) {
	d := newQPDriver(cd, qp)
	cd.mu.Lock()
	defer cd.mu.Unlock()
	if cd.closed {
		return nil, verbs.ErrClosed
	}
	cd.qps[d.num] = d
	return d, nil
}

func (cd *ctxDriver) removeQP(d *qpDriver) {
	cd.mu.Lock()
	if cd.qps[d.num] == d {
		delete(cd.qps, d.num)
	}
	cd.mu.Unlock()
}

// notifyReady wakes handshakes waiting for a QP to reach RTR.
func (cd *ctxDriver) notifyReady() {
	cd.mu.Lock()
	close(cd.ready)
	cd.ready = make(chan struct{})
	cd.mu.Unlock()
}

// Close stops the accept goroutine and pending handshakes. verbs has
// destroyed every QP before.
func (cd *ctxDriver) Close() error {
	cd.mu.Lock()
	if cd.closed {
		cd.mu.Unlock()
		return nil
	}
	cd.closed = true
	close(cd.done)
	for c := range cd.pending {
		c.Close()
	}
	cd.mu.Unlock()
	err := cd.ln.Close()
	cd.wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("tcp: closing listener: %w", err)
	}
	return nil
}

func (cd *ctxDriver) acceptLoop() {
	defer cd.wg.Done()
	for {
		c, err := cd.ln.AcceptTCP()
		if err != nil {
			select {
			case <-cd.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like: back off.
			select {
			case <-cd.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		cd.mu.Lock()
		if cd.closed {
			cd.mu.Unlock()
			c.Close()
			return
		}
		if cd.handshakes >= maxHandshakes {
			// Connections that send no hello, or name a QP that never
			// takes them, must not pile up goroutines.
			cd.mu.Unlock()
			c.Close()
			continue
		}
		cd.pending[c] = struct{}{}
		cd.handshakes++
		cd.wg.Add(1)
		cd.mu.Unlock()
		go cd.handshake(c)
	}
}

// handshake reads the hello of an accepted connection and hands the
// connection to the QP it names. A QP not yet in RTR is waited for, up to
// handshakeTimeout (the dialer retries after that).
func (cd *ctxDriver) handshake(c *net.TCPConn) {
	defer cd.wg.Done()
	defer func() {
		cd.mu.Lock()
		cd.handshakes--
		cd.mu.Unlock()
	}()
	handed := false
	defer func() {
		if !handed {
			c.Close()
		}
	}()
	deadline := time.Now().Add(handshakeTimeout)
	c.SetDeadline(deadline)
	var b [helloLen]byte
	_, err := io.ReadFull(c, b[:])
	cd.mu.Lock()
	delete(cd.pending, c)
	cd.mu.Unlock()
	if err != nil {
		return
	}
	h, err := parseHello(b[:])
	if err != nil || h.kind != helloConnect {
		return
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		cd.mu.Lock()
		d := cd.qps[h.dstQPN]
		ready := cd.ready
		closed := cd.closed
		cd.mu.Unlock()
		if d == nil || closed {
			return
		}
		switch d.offer(c, &h) {
		case offerTaken:
			handed = true
			return
		case offerRejected:
			return
		}
		select {
		case <-ready:
		case <-cd.done:
			return
		case <-timer.C:
			return
		}
	}
}

func randUint64() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("tcp: crypto/rand failed: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}
