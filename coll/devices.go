package coll

// Device selection: which verbs device this rank uses to reach each peer,
// decided by what devices declare (verbs.DeviceInfo.Caps), where the
// ranks are, and the options; never by device name. Everything here runs
// in the goroutine creating the communicator; the functions that decide
// are pure (a device list and the options in, a choice out) so that tests
// feed them fake device lists.
//
// Rules:
//
//   - Each rank offers every peer the same thing (setup round 0): its
//     same-host device (the first with CapSameHost and an active port:
//     shm0) and, per network transport, its best network device (CapNetwork
//     without CapSameHost, an active port; for RDMA transports the first
//     one in the device list that the HCA filter allows, at its first
//     active port the filter allows).
//   - A pair of ranks of one host (same kernel and PID namespace) uses the
//     same-host device. Any other pair uses the most preferred network
//     transport both offer on the same fabric (transport, link layer and
//     node type: RoCE does not talk to iWARP): RDMA ("ibverbs", present
//     when the binary is built with -tags ibverbs and a device has an
//     active port) before tcp, tcp before roce (software RoCEv2).
//   - A forced transport (Options.Transport, RDMAKIT_COLL_TRANSPORT) is
//     used between every pair, even ranks of one host; a rank without a
//     usable device of that transport makes forming the communicator fail
//     everywhere, naming it.
//   - An endpoint is synchronous (a write is in the peer's memory when
//     PostSend returns, so no completion is awaited before the flag) iff
//     its device declares CapWriteOnPost.
//
// Every rank sees every rank's offer, so every rank computes the whole
// matrix of choices alike (and with it whether all pairs are synchronous,
// which the algorithms must agree on).

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/verbs"
)

// rdmaTransport is the transport of libibverbs devices (RDMA NICs, rxe,
// siw); it is linked with -tags ibverbs.
const rdmaTransport = "ibverbs"

// roceTransport is rdmakit's software RoCEv2 stack (transport/roce,
// linked by roce.go).
const roceTransport = "roce"

// netPreference orders network transports, best first; transports not
// listed come after, by name. roce comes after tcp: it is a software
// stack no faster than tcp today (write latency about 1.6x tcp's on
// loopback, bandwidth about the same), so auto uses it only where tcp is
// missing; --transport roce forces it.
var netPreference = []string{rdmaTransport, "tcp", roceTransport}

func netRank(t string) int {
	if i := slices.Index(netPreference, t); i >= 0 {
		return i
	}
	return len(netPreference)
}

// devOffer is one device a rank can use.
type devOffer struct {
	Transport string
	Device    string
	Port      int
	// Fabric says which devices can connect to each other: transport,
	// link layer and node type.
	Fabric string
	MTU    verbs.MTU
	Caps   verbs.Capability
}

func (d *devOffer) String() string {
	if d == nil {
		return "none"
	}
	return fmt.Sprintf("%s port %d (%s)", d.Device, d.Port, d.Transport)
}

// offer is what a rank can use: its same-host device and its network
// devices, best transport first, one per transport.
type offer struct {
	same *devOffer
	net  []devOffer
	// why records, per network transport the rank has no device of, why
	// (for error messages).
	why map[string]string
}

func (o offer) netOf(transport string) *devOffer {
	for i := range o.net {
		if o.net[i].Transport == transport {
			return &o.net[i]
		}
	}
	return nil
}

// deviceOf returns the rank's device of a transport, same-host first.
func (o offer) deviceOf(transport string) *devOffer {
	if o.same != nil && o.same.Transport == transport {
		return o.same
	}
	return o.netOf(transport)
}

// hcaFilter is an RDMA device filter in NCCL_IB_HCA's syntax: a comma
// list of name[:port]; a leading ^ excludes the listed devices instead;
// a leading = (after ^, if any) makes names exact, else each is a prefix.
// Examples: "mlx5" (every port of every device whose name starts with
// mlx5), "=mlx5_0:1,mlx5_1:1", "^=mlx5_1", "^mlx5_3:2", "rxe_dum".
type hcaFilter struct {
	src     string
	exclude bool
	exact   bool
	list    []hcaEntry
}

type hcaEntry struct {
	name string
	port int // 0: every port
}

func parseHCAFilter(s string) (hcaFilter, error) {
	f := hcaFilter{src: s}
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "^") {
		f.exclude, s = true, strings.TrimSpace(s[1:])
	}
	if strings.HasPrefix(s, "=") {
		f.exact, s = true, strings.TrimSpace(s[1:])
	}
	for _, tok := range strings.Split(s, ",") {
		tok = strings.TrimSpace(tok)
		if tok == "" {
			continue
		}
		e := hcaEntry{name: tok}
		if i := strings.LastIndexByte(tok, ':'); i >= 0 {
			p, err := strconv.Atoi(tok[i+1:])
			if err != nil || p < 1 || p > 255 || i == 0 {
				return hcaFilter{}, fmt.Errorf("%w: HCA %q: want name or name:port", ErrInvalidArgument, tok)
			}
			e.name, e.port = tok[:i], p
		}
		f.list = append(f.list, e)
	}
	if (f.exclude || f.exact) && len(f.list) == 0 {
		return hcaFilter{}, fmt.Errorf("%w: HCA list %q names no device", ErrInvalidArgument, f.src)
	}
	return f, nil
}

// set reports whether the filter restricts anything.
func (f hcaFilter) set() bool { return len(f.list) > 0 }

// allows reports whether port of dev may be used.
func (f hcaFilter) allows(dev string, port int) bool {
	if len(f.list) == 0 {
		return true
	}
	hit := false
	for _, e := range f.list {
		match := dev == e.name || (!f.exact && strings.HasPrefix(dev, e.name))
		if match && (e.port == 0 || e.port == port) {
			hit = true
			break
		}
	}
	return hit != f.exclude
}

func fabricOf(d *verbs.DeviceInfo, p *verbs.PortInfo) string {
	return d.Transport + "/" + p.LinkLayer + "/" + d.NodeType
}

// localOffer picks this rank's devices from a device list (see the rules
// at the top of the file). The HCA filter applies to RDMA devices.
func localOffer(devs []verbs.DeviceInfo, hca hcaFilter) offer {
	o := offer{why: map[string]string{}}
	seen := map[string]bool{}
	for i := range devs {
		d := &devs[i]
		same := d.Caps.Has(verbs.CapSameHost)
		if !same && !d.Caps.Has(verbs.CapNetwork) {
			continue
		}
		if same && o.same != nil {
			continue
		}
		if !same && seen[d.Transport] {
			continue
		}
		filtered := !same && d.Transport == rdmaTransport
		var port *verbs.PortInfo
		inactive, excluded := false, false
		for j := range d.Ports {
			p := &d.Ports[j]
			if filtered && !hca.allows(d.Name, p.Num) {
				excluded = true
				continue
			}
			if p.State != verbs.PortActive {
				inactive = true
				continue
			}
			port = p
			break
		}
		if port == nil {
			if !same && o.why[d.Transport] == "" {
				switch {
				case inactive:
					o.why[d.Transport] = fmt.Sprintf("%s has no active port", d.Name)
				case excluded:
					o.why[d.Transport] = fmt.Sprintf("%s is excluded by the HCA list %q", d.Name, hca.src)
				}
			}
			continue
		}
		off := devOffer{Transport: d.Transport, Device: d.Name, Port: port.Num, Fabric: fabricOf(d, port),
			MTU: port.ActiveMTU, Caps: d.Caps}
		if same {
			o.same = &off
			continue
		}
		seen[d.Transport] = true
		delete(o.why, d.Transport)
		o.net = append(o.net, off)
	}
	slices.SortStableFunc(o.net, func(a, b devOffer) int {
		if ra, rb := netRank(a.Transport), netRank(b.Transport); ra != rb {
			return ra - rb
		}
		return strings.Compare(a.Transport, b.Transport)
	})
	return o
}

// pairTransport decides the transport between ranks a and b (offers oa
// and ob; sameHost when they share a host) under mode ("auto" or a
// transport name). Symmetric: both ranks of a pair get the same answer.
func pairTransport(mode string, sameHost bool, a int, oa offer, b int, ob offer) (string, error) {
	if mode == "auto" {
		if sameHost && oa.same != nil && ob.same != nil && oa.same.Transport == ob.same.Transport {
			return oa.same.Transport, nil
		}
		// Network: the most preferred transport both have on one fabric.
		// Both offers are sorted alike, so scanning either is symmetric.
		for _, da := range oa.net {
			if db := ob.netOf(da.Transport); db != nil && db.Fabric == da.Fabric {
				return da.Transport, nil
			}
		}
		return "", fmt.Errorf("%w: ranks %d and %d have no transport in common (rank %d: %s; rank %d: %s)",
			ErrInvalidArgument, a, b, a, oa.describe(), b, ob.describe())
	}
	da, db := oa.deviceOf(mode), ob.deviceOf(mode)
	for _, x := range []struct {
		r int
		d *devOffer
		o offer
	}{{a, da, oa}, {b, db, ob}} {
		if x.d == nil {
			why := x.o.why[mode]
			if why == "" {
				why = "no such device"
				if mode == rdmaTransport && !slices.Contains(verbs.Transports(), rdmaTransport) {
					why = "this program was built without -tags ibverbs"
				}
			}
			return "", fmt.Errorf("%w: %s=%s, but rank %d has no usable %s device (%s)", ErrInvalidArgument, EnvTransport, mode, x.r, mode, why)
		}
	}
	if da.Caps.Has(verbs.CapSameHost) && !sameHost {
		return "", fmt.Errorf("%w: %s=%s, but ranks %d and %d are on different hosts", ErrInvalidArgument, EnvTransport, mode, a, b)
	}
	if da.Fabric != db.Fabric {
		return "", fmt.Errorf("%w: rank %d's %s (%s) cannot connect to rank %d's %s (%s)", ErrInvalidArgument,
			a, da.Device, da.Fabric, b, db.Device, db.Fabric)
	}
	return mode, nil
}

func (o offer) describe() string {
	var s []string
	if o.same != nil {
		s = append(s, o.same.Device)
	}
	for i := range o.net {
		s = append(s, o.net[i].Device+" ["+o.net[i].Fabric+"]")
	}
	if len(s) == 0 {
		return "no devices"
	}
	return strings.Join(s, ", ")
}

// encode writes the offer for the other ranks.
func (o offer) encode(e *enc) {
	put := func(d *devOffer) {
		e.str(d.Transport)
		e.str(d.Device)
		e.u32(uint32(d.Port))
		e.str(d.Fabric)
		e.u32(uint32(d.MTU))
		e.u64(uint64(d.Caps))
	}
	if o.same != nil {
		e.u32(1)
		put(o.same)
	} else {
		e.u32(0)
	}
	e.u32(uint32(len(o.net)))
	for i := range o.net {
		put(&o.net[i])
	}
	e.u32(uint32(len(o.why)))
	for _, t := range sortedKeys(o.why) {
		e.str(t)
		e.str(o.why[t])
	}
}

func decodeOffer(d *dec) (offer, error) {
	get := func() devOffer {
		return devOffer{Transport: d.str(), Device: d.str(), Port: int(d.u32()), Fabric: d.str(),
			MTU: verbs.MTU(d.u32()), Caps: verbs.Capability(d.u64())}
	}
	o := offer{why: map[string]string{}}
	if d.u32() == 1 {
		s := get()
		o.same = &s
	}
	n := int(d.u32())
	if n > 64 {
		return o, errFrame
	}
	for i := 0; i < n && d.err == nil; i++ {
		o.net = append(o.net, get())
	}
	n = int(d.u32())
	if n > 64 {
		return o, errFrame
	}
	for i := 0; i < n && d.err == nil; i++ {
		t := d.str()
		o.why[t] = d.str()
	}
	return o, d.err
}

func sortedKeys(m map[string]string) []string {
	k := make([]string, 0, len(m))
	for s := range m {
		k = append(k, s)
	}
	slices.Sort(k)
	return k
}

// devicePlan is the outcome of selection for one rank.
type devicePlan struct {
	// devOf is the device this rank uses for each peer (nil for itself).
	devOf []*devOffer
	// allSync says whether every pair of ranks (not only this rank's)
	// talks over synchronous devices.
	allSync bool
	// anyTCP says whether some pair of ranks talks over tcp (a transport
	// that is neither synchronous nor RDMA), decided alike everywhere.
	anyTCP bool
}

// planDevices decides, from every rank's offer, the devices of rank me.
func planDevices(mode string, me int, offers []offer, hosts []string) (devicePlan, error) {
	n := len(offers)
	pl := devicePlan{devOf: make([]*devOffer, n), allSync: true}
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			t, err := pairTransport(mode, hosts[a] == hosts[b], a, offers[a], b, offers[b])
			if err != nil {
				if a == me || b == me {
					return pl, err
				}
				pl.allSync = false // their problem, reported by them
				continue
			}
			da, db := offers[a].deviceOf(t), offers[b].deviceOf(t)
			if !da.Caps.Has(verbs.CapWriteOnPost) || !db.Caps.Has(verbs.CapWriteOnPost) {
				pl.allSync = false
				if t != rdmaTransport {
					pl.anyTCP = true
				}
			}
			if a == me {
				pl.devOf[b] = da
			} else if b == me {
				pl.devOf[a] = db
			}
		}
	}
	return pl, nil
}
