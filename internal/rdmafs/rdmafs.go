// Package rdmafs reads what the Linux kernel says about RDMA devices in
// sysfs and procfs: devices and ports (/sys/class/infiniband), GID tables
// with their types and network devices, port counters and hardware
// counters, the network devices' MTUs, kernel modules, CPU frequency
// governors, NUMA nodes and hugepages.
//
// Every path is taken relative to FS.Root, so the same code reads the
// running system (Root "/" or "") and a fixture tree copied from one (a
// test's testdata directory). It reads files only; it needs no privilege
// and no RDMA library. rdmakit doctor and rdmakit exporter are built on it.
package rdmafs

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// ClassDir is where the kernel lists RDMA devices.
const ClassDir = "sys/class/infiniband"

// FS reads a system's RDMA state under Root.
type FS struct {
	// Root is the directory that stands for "/"; "" means "/".
	Root string
}

// Path returns the path of the absolute system path p under the root.
func (f FS) Path(p string) string {
	root := f.Root
	if root == "" {
		root = "/"
	}
	return filepath.Join(root, filepath.FromSlash(strings.TrimPrefix(p, "/")))
}

// ReadString returns the trimmed content of the system file p.
func (f FS) ReadString(p string) (string, error) {
	b, err := os.ReadFile(f.Path(p))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadUint returns the unsigned integer in the system file p.
func (f FS) ReadUint(p string) (uint64, error) {
	s, err := f.ReadString(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p, err)
	}
	return v, nil
}

// Exists reports whether the system path p exists.
func (f FS) Exists(p string) bool {
	_, err := os.Lstat(f.Path(p))
	return err == nil
}

// names returns the sorted entry names of the system directory p.
func (f FS) names(p string) ([]string, error) {
	ents, err := os.ReadDir(f.Path(p))
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

// Device is an RDMA device as sysfs shows it.
type Device struct {
	Name     string
	NodeType string // "CA", "RNIC", ... (the text after "N: " in node_type)
	FWVer    string
	// Driver is the kernel module that registered the device: mlx5_ib,
	// rdma_rxe, siw, ... ("" when sysfs does not tell).
	Driver string
	// Parent is the network device a software device (rxe, siw) runs
	// over, from its "parent" attribute ("" for hardware).
	Parent string
	// NUMANode is the NUMA node of the device's PCI function, -1 when the
	// firmware does not say or the device has none (software devices).
	NUMANode int
	Ports    []Port
}

// Port is one port of a device.
type Port struct {
	Num       int
	State     string // "ACTIVE", "DOWN", "INIT", "ARMED" (from "4: ACTIVE")
	StateNum  int
	PhysState string // "LinkUp", "Disabled", "Polling", ...
	PhysNum   int
	Rate      string  // "100 Gb/sec (4X EDR)"
	RateBits  float64 // bits per second parsed from Rate; 0 if unknown
	LinkLayer string  // "Ethernet" or "InfiniBand"
}

// ibDriverOf maps a PCI network driver to the RDMA driver module that
// binds next to it.
var ibDriverOf = map[string]string{
	"mlx5_core": "mlx5_ib",
	"mlx4_core": "mlx4_ib",
	"bnxt_en":   "bnxt_re",
	"ice":       "irdma",
	"i40e":      "irdma",
	"qede":      "qedr",
	"cxgb4":     "iw_cxgb4",
	"hns3":      "hns_roce_hw_v2",
	"ena":       "efa",
	"vmxnet3":   "vmw_pvrdma",
	"erdma":     "erdma",
	"mana":      "mana_ib",
}

// driverOf names the RDMA driver module of device name.
func (f FS) driverOf(name string) string {
	base := ClassDir + "/" + name
	if l, err := os.Readlink(f.Path(base + "/device/driver")); err == nil {
		d := filepath.Base(l)
		if ib, ok := ibDriverOf[d]; ok {
			return ib
		}
		return d
	}
	switch {
	case strings.HasPrefix(name, "rxe"):
		return "rdma_rxe"
	case strings.HasPrefix(name, "siw"):
		return "siw"
	}
	for prefix, mod := range map[string]string{"mlx5_": "mlx5_ib", "mlx4_": "mlx4_ib", "bnxt_re": "bnxt_re", "irdma": "irdma", "efa": "efa", "qedr": "qedr", "hns_": "hns_roce_hw_v2"} {
		if strings.HasPrefix(name, prefix) {
			return mod
		}
	}
	return ""
}

// Devices lists the RDMA devices, sorted by name. A system without RDMA
// (no class directory) has none and no error.
func (f FS) Devices() ([]Device, error) {
	names, err := f.names(ClassDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, n := range names {
		d, err := f.Device(n)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// Device reads one device.
func (f FS) Device(name string) (Device, error) {
	base := ClassDir + "/" + name
	if !f.Exists(base) {
		return Device{}, fmt.Errorf("rdmafs: no RDMA device %q: %w", name, fs.ErrNotExist)
	}
	d := Device{Name: name, Driver: f.driverOf(name), NUMANode: -1}
	if s, err := f.ReadString(base + "/node_type"); err == nil {
		_, d.NodeType = splitNum(s)
	}
	d.FWVer, _ = f.ReadString(base + "/fw_ver")
	d.Parent, _ = f.ReadString(base + "/parent")
	if s, err := f.ReadString(base + "/device/numa_node"); err == nil {
		if v, err := strconv.Atoi(s); err == nil {
			d.NUMANode = v
		}
	}
	ports, err := f.names(base + "/ports")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Device{}, err
	}
	for _, p := range ports {
		num, err := strconv.Atoi(p)
		if err != nil {
			continue
		}
		d.Ports = append(d.Ports, f.port(name, num))
	}
	sort.Slice(d.Ports, func(i, j int) bool { return d.Ports[i].Num < d.Ports[j].Num })
	return d, nil
}

func (f FS) port(dev string, num int) Port {
	base := fmt.Sprintf("%s/%s/ports/%d", ClassDir, dev, num)
	p := Port{Num: num}
	if s, err := f.ReadString(base + "/state"); err == nil {
		p.StateNum, p.State = splitNum(s)
	}
	if s, err := f.ReadString(base + "/phys_state"); err == nil {
		p.PhysNum, p.PhysState = splitNum(s)
	}
	p.Rate, _ = f.ReadString(base + "/rate")
	p.RateBits = ParseRate(p.Rate)
	p.LinkLayer, _ = f.ReadString(base + "/link_layer")
	return p
}

// splitNum splits sysfs's "4: ACTIVE" into 4 and "ACTIVE".
func splitNum(s string) (int, string) {
	num, text, ok := strings.Cut(s, ":")
	if !ok {
		return -1, strings.TrimSpace(s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil {
		n = -1
	}
	return n, strings.TrimSpace(text)
}

// ParseRate returns the bits per second of a sysfs port rate such as
// "100 Gb/sec (4X EDR)" or "2.5 Gb/sec (1X SDR)"; 0 if it is not one.
func ParseRate(s string) float64 {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	switch f[1] {
	case "Gb/sec":
		return v * 1e9
	case "Mb/sec":
		return v * 1e6
	}
	return 0
}

// GID is one populated entry of a port's GID table.
type GID struct {
	Index int
	GID   net.IP
	// Type is "RoCE v2", "IB/RoCE v1", or "" where the kernel has no
	// gid_attrs (InfiniBand, iWARP, older kernels).
	Type string
	// Netdev is the network device the entry belongs to (RoCE).
	Netdev string
}

// RoCEv2 reports whether the entry is a RoCE v2 GID.
func (g GID) RoCEv2() bool { return g.Type == "RoCE v2" }

// IPv4 returns the IPv4 address of an IPv4-mapped GID, or nil.
func (g GID) IPv4() net.IP {
	if v4 := g.GID.To4(); v4 != nil && !g.GID.IsUnspecified() {
		return v4
	}
	return nil
}

// GIDs returns the populated entries of the GID table of a port, in index
// order; all-zero entries are left out.
func (f FS) GIDs(dev string, port int) ([]GID, error) {
	base := fmt.Sprintf("%s/%s/ports/%d", ClassDir, dev, port)
	names, err := f.names(base + "/gids")
	if err != nil {
		return nil, err
	}
	var out []GID
	for _, n := range names {
		idx, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		s, err := f.ReadString(base + "/gids/" + n)
		if err != nil {
			continue
		}
		ip := net.ParseIP(s)
		if ip == nil || ip.Equal(net.IPv6zero) {
			continue
		}
		g := GID{Index: idx, GID: ip}
		// An unpopulated entry's type reads as EINVAL; a populated one
		// has a type on every kernel with gid_attrs.
		g.Type, _ = f.ReadString(base + "/gid_attrs/types/" + n)
		g.Netdev, _ = f.ReadString(base + "/gid_attrs/ndevs/" + n)
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out, nil
}

// Netdevs returns the network devices under a port: those its GID
// entries name, else a software device's parent, else the PCI function's
// net/ directory.
func (f FS) Netdevs(dev string, port int) []string {
	seen := map[string]bool{}
	var out []string
	add := func(n string) {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	gids, _ := f.GIDs(dev, port)
	for _, g := range gids {
		add(g.Netdev)
	}
	if len(out) == 0 {
		p, _ := f.ReadString(ClassDir + "/" + dev + "/parent")
		add(p)
	}
	if len(out) == 0 {
		names, _ := f.names(ClassDir + "/" + dev + "/device/net")
		for _, n := range names {
			add(n)
		}
	}
	return out
}

// NetdevMTU returns the MTU of a network device.
func (f FS) NetdevMTU(netdev string) (int, error) {
	v, err := f.ReadUint("sys/class/net/" + netdev + "/mtu")
	return int(v), err
}

// Counters returns the counters of a port: kind is "counters" (the IBTA
// port counters) or "hw_counters" (the driver's). A counter that cannot
// be read or parsed is left out and counted in unreadable.
func (f FS) Counters(dev string, port int, kind string) (vals map[string]uint64, unreadable int, err error) {
	return f.counters(fmt.Sprintf("%s/%s/ports/%d/%s", ClassDir, dev, port, kind))
}

// DeviceCounters returns the device-wide driver counters
// (/sys/class/infiniband/DEV/hw_counters, which some drivers have besides
// the ports'), as Counters does.
func (f FS) DeviceCounters(dev string) (vals map[string]uint64, unreadable int, err error) {
	return f.counters(ClassDir + "/" + dev + "/hw_counters")
}

func (f FS) counters(dir string) (vals map[string]uint64, unreadable int, err error) {
	names, err := f.names(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	vals = make(map[string]uint64, len(names))
	for _, n := range names {
		if n == "lifespan" { // hw_counters' refresh period in ms, not a counter
			continue
		}
		v, err := f.ReadUint(dir + "/" + n)
		if err != nil {
			unreadable++
			continue
		}
		vals[n] = v
	}
	return vals, unreadable, nil
}

// Modules returns the kernel modules present: those /proc/modules lists
// (loaded) and those /sys/module has (loaded or built in). ok is false
// when neither could be read.
func (f FS) Modules() (mods map[string]bool, ok bool) {
	mods = map[string]bool{}
	if s, err := f.ReadString("proc/modules"); err == nil {
		ok = true
		for _, line := range strings.Split(s, "\n") {
			if fs := strings.Fields(line); len(fs) > 0 {
				mods[fs[0]] = true
			}
		}
	}
	if names, err := f.names("sys/module"); err == nil {
		ok = true
		for _, n := range names {
			mods[n] = true
		}
	}
	return mods, ok
}

// Uverbs returns the name of the user-space verbs node of an RDMA device
// ("uverbs0": /dev/infiniband/uverbs0), from /sys/class/infiniband_verbs.
// ok is false when ib_uverbs has no node for it (not loaded, or the
// class directory is absent).
func (f FS) Uverbs(dev string) (name string, ok bool) {
	names, _ := f.names("sys/class/infiniband_verbs")
	for _, n := range names {
		if !strings.HasPrefix(n, "uverbs") {
			continue
		}
		if ib, err := f.ReadString("sys/class/infiniband_verbs/" + n + "/ibdev"); err == nil && ib == dev {
			return n, true
		}
	}
	return "", false
}

// CapableNetdevs returns the network devices whose PCI driver has an RDMA
// driver beside it (eth0 on mlx5_core: mlx5_ib), as netdev → RDMA driver
// module, from /sys/class/net/*/device/driver.
func (f FS) CapableNetdevs() map[string]string {
	out := map[string]string{}
	names, _ := f.names("sys/class/net")
	for _, n := range names {
		l, err := os.Readlink(f.Path("sys/class/net/" + n + "/device/driver"))
		if err != nil {
			continue
		}
		if ib, ok := ibDriverOf[filepath.Base(l)]; ok {
			out[n] = ib
		}
	}
	return out
}
