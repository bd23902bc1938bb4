package roce

// Driver, devices and options.
//
// Goroutines: none here; see endpoint.go (one progress goroutine per
// device socket) and qp.go.

import (
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakit/rdmakit/internal/soft"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

const transportName = "roce"

// Environment variables.
const (
	// EnvIfaces lists the interfaces that get a device ("eth0,lo");
	// default: every interface that is up and has an address.
	EnvIfaces = "RDMAKIT_ROCE_IFACES"
	// EnvAddr is the address ("ip", "ip:port", or ":port" for the
	// device's address) a context's UDP socket binds; default: the
	// device's first IPv4 address (else its first global IPv6 one), port
	// 4791. Port 0 lets the system choose (rdmakit peers only: the port
	// travels in QP.Address). (Options.ListenAddr is the tcp transport's.)
	EnvAddr = "RDMAKIT_ROCE_ADDR"
	// EnvBusyPoll is how long a device's progress goroutine keeps trying
	// non-blocking receives after one that received something, before it
	// waits for the socket in the kernel (a Go duration: "50us"; "0"
	// turns it off); default DefaultBusyPoll. See endpoint.go (spin).
	EnvBusyPoll = "RDMAKIT_ROCE_BUSY_POLL"
)

// DefaultBusyPoll is the progress goroutine's busy polling when
// RDMAKIT_ROCE_BUSY_POLL is not set: the tcp transport's reader's default.
const DefaultBusyPoll = 50 * time.Microsecond

// busyPollFromEnv reads RDMAKIT_ROCE_BUSY_POLL: unset is the default; a
// value that is no duration from 0 to 1s is refused (the device does not
// open), as RDMAKIT_TCP_BUSY_POLL is.
func busyPollFromEnv() (time.Duration, error) {
	s := os.Getenv(EnvBusyPoll)
	if s == "" {
		return DefaultBusyPoll, nil
	}
	d, err := time.ParseDuration(s) // "0" too
	if err != nil || d < 0 || d > time.Second {
		return 0, fmt.Errorf("%w: %s=%q: want a duration from 0 (off) to 1s, such as 50us", verbs.ErrInvalidArgument, EnvBusyPoll, s)
	}
	return d, nil
}

func init() { verbs.Register(soft.NewDriver(driver{})) }

type driver struct{}

func (driver) Name() string { return transportName }

// iface is an interface that gets a device.
type iface struct {
	name  string
	mtu   int
	loop  bool
	addrs []netip.Addr
}

// ifaces lists the interfaces that get devices, in the system's order
// but loopback last (so that roce0 is a real network where there is one).
func ifaces() ([]iface, error) {
	all, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("roce: listing interfaces: %w", err)
	}
	var want map[string]bool
	if s := os.Getenv(EnvIfaces); s != "" {
		want = map[string]bool{}
		for _, n := range strings.Split(s, ",") {
			if n = strings.TrimSpace(n); n != "" {
				want[n] = true
			}
		}
	}
	var out []iface
	for _, ifc := range all {
		if ifc.Flags&net.FlagUp == 0 || (want != nil && !want[ifc.Name]) {
			continue
		}
		as, err := ifc.Addrs()
		if err != nil {
			continue
		}
		f := iface{name: ifc.Name, mtu: ifc.MTU, loop: ifc.Flags&net.FlagLoopback != 0}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					f.addrs = append(f.addrs, ip.Unmap())
				}
			}
		}
		if len(f.addrs) > 0 {
			out = append(out, f)
		}
	}
	slices.SortStableFunc(out, func(a, b iface) int {
		switch {
		case a.loop == b.loop:
			return 0
		case a.loop:
			return 1
		}
		return -1
	})
	return out, nil
}

// ibMTU is the largest InfiniBand MTU whose packets fit in an IP MTU
// (IPv6, UDP, BTH, RETH and ICRC headers counted).
func ibMTU(ipMTU int) verbs.MTU {
	const overhead = 40 + 8 + header.BTHLen + header.RETHLen + header.ImmDtLen + header.ICRCLen
	for m := verbs.MTU4096; m > verbs.MTU256; m-- {
		if m.Bytes()+overhead <= ipMTU {
			return m
		}
	}
	return verbs.MTU256
}

var nodeGUID = func() uint64 {
	h := fnv.New64a()
	name, _ := os.Hostname()
	io.WriteString(h, "rdmakit-roce/"+name)
	return h.Sum64()
}()

func deviceInfo(i int, f iface) verbs.DeviceInfo {
	mtu := ibMTU(f.mtu)
	var gids []net.IP
	for _, a := range f.addrs {
		b := a.As16() // IPv4 as IPv4-mapped: the RoCEv2 GID of an IPv4 address
		gids = append(gids, net.IP(b[:]))
	}
	return soft.Limits(verbs.DeviceInfo{
		Name:      "roce" + strconv.Itoa(i),
		Transport: transportName,
		NodeType:  "Software",
		NodeGUID:  nodeGUID + uint64(i),
		FWVersion: "rdmakit-roce 1 (RoCEv2 on " + f.name + ")",
		VendorID:  0,
		MaxMRSize: 1 << 40,
		AtomicCap: verbs.AtomicHCA,
		Caps: verbs.CapImmediate | verbs.CapAtomics | verbs.CapRNRRetry | verbs.CapSeparateKeys | verbs.CapSRQ |
			verbs.CapRemoteErrorCompletion | verbs.CapMultiSGERead | verbs.CapZeroLengthRead | verbs.CapRemoteAccessChecks |
			verbs.CapStrictStatus | verbs.CapRegisterCallerMemory | verbs.CapNetwork,
		Ports: []verbs.PortInfo{{
			Num:       1,
			State:     verbs.PortActive,
			MaxMTU:    mtu,
			ActiveMTU: mtu,
			LinkLayer: "Ethernet",
			GIDs:      gids,
			Addrs:     []string{f.name},
		}},
	})
}

func (driver) Devices() ([]verbs.DeviceInfo, error) {
	if !sys.HasUDPBatch {
		return nil, nil
	}
	fs, err := ifaces()
	if err != nil {
		return nil, err
	}
	out := make([]verbs.DeviceInfo, len(fs))
	for i, f := range fs {
		out[i] = deviceInfo(i, f)
	}
	return out, nil
}

func (driver) Open(dev verbs.DeviceInfo, opts vdriver.Options, ctx *soft.Context) (soft.ContextTransport, error) {
	if !sys.HasUDPBatch {
		return nil, fmt.Errorf("%w: roce needs Linux", verbs.ErrNotSupported)
	}
	if len(dev.Ports) == 0 || len(dev.Ports[0].GIDs) == 0 {
		return nil, fmt.Errorf("%w: %q has no address", verbs.ErrNoDevice, dev.Name)
	}
	bind, err := bindAddr(os.Getenv(EnvAddr), dev)
	if err != nil {
		return nil, err
	}
	ep, err := acquire(bind, dev.Ports[0].ActiveMTU)
	if err != nil {
		return nil, err
	}
	return &ctxDriver{ep: ep, ctx: ctx}, nil
}

// bindAddr is where a context of dev binds: s (RDMAKIT_ROCE_ADDR) if
// set, else the device's first IPv4 (else global IPv6) address; port 4791
// unless given. ":port" is the device's address with that port (":0":
// one the system chooses, so that several rdmakit programs share an
// address; only rdmakit peers reach it).
func bindAddr(s string, dev verbs.DeviceInfo) (netip.AddrPort, error) {
	const src = EnvAddr
	if p, ok := strings.CutPrefix(s, ":"); ok && !strings.HasPrefix(p, ":") {
		port, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%w: %s=%q: want ip, ip:port or :port", verbs.ErrInvalidArgument, src, s)
		}
		ap, err := bindAddr("", dev)
		return netip.AddrPortFrom(ap.Addr(), uint16(port)), err
	}
	if s == "" {
		var v6 netip.Addr
		for _, g := range dev.Ports[0].GIDs {
			a, _ := netip.AddrFromSlice(g)
			a = a.Unmap()
			if a.Is4() {
				return netip.AddrPortFrom(a, header.UDPPort), nil
			}
			if !v6.IsValid() && !a.IsLinkLocalUnicast() {
				v6 = a
			}
		}
		if !v6.IsValid() {
			return netip.AddrPort{}, fmt.Errorf("%w: %s has no IPv4 or global IPv6 address", verbs.ErrNoDevice, dev.Name)
		}
		return netip.AddrPortFrom(v6, header.UDPPort), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%w: %s=%q: want ip, ip:port or :port", verbs.ErrInvalidArgument, src, s)
		}
		ap = netip.AddrPortFrom(a, header.UDPPort)
	}
	if ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("%w: %s=%q: roce binds one address (the ICRC covers it), not a wildcard", verbs.ErrInvalidArgument, src, s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// ctxDriver is a context's view of its device's endpoint.
type ctxDriver struct {
	ep  *endpoint
	ctx *soft.Context
}

func (cd *ctxDriver) CanRegister() bool { return true }

func (cd *ctxDriver) NewQP(qp *soft.QP) (soft.QPTransport, error) {
	return newQPDriver(cd.ep, qp, cd.ctx.Stats()), nil
}

func (cd *ctxDriver) Close() error { return cd.ep.release() }

// Progress lets a goroutine polling an empty CQ step the endpoint
// (soft.Progresser). A poll that received nothing yields the CPU: a
// spinning poller's iterations are system calls now (~1 µs, not ~10 ns),
// and on a machine with more runnable threads than cores the thread it
// waits for (the peer's, in a ping-pong on one host) would otherwise get
// the core only when the poller's loop yields, every few hundred
// iterations. The yield is raw (sys.RawYield: the scheduler is not told):
// with as many spinning pollers as Ps, goroutines of this process (the
// progress goroutine holding stepMu, timer callbacks) then run only when
// the runtime preempts a poller (about every 10 ms); work is delayed, not
// lost, since the pollers step the endpoint themselves.
func (cd *ctxDriver) Progress(*soft.CQ) {
	if !cd.ep.Progress() {
		sys.RawYield()
	}
}

// Sleep: a waiter on the CQ is going to sleep; the progress goroutine
// does the work meanwhile (soft.Progresser), waiting for the socket from
// now on rather than for the pollers to stop.
func (cd *ctxDriver) Sleep(*soft.CQ) {
	cd.ep.sleeping.Store(true)
	cd.ep.wake()
}

func ctxOf(ctx *verbs.Context) *ctxDriver {
	if sc, ok := ctx.Driver().(*soft.Context); ok {
		if cd, ok := sc.Transport().(*ctxDriver); ok {
			return cd
		}
	}
	return nil
}

// LocalAddr returns the UDP address the roce context ctx sends from and
// receives on, or an invalid AddrPort if ctx is not a roce context.
func LocalAddr(ctx *verbs.Context) netip.AddrPort {
	if cd := ctxOf(ctx); cd != nil {
		return cd.ep.local
	}
	return netip.AddrPort{}
}
