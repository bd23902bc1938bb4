package deviceplugin

import (
	"fmt"
	"slices"
	"strings"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// Device is an RDMA device as the plugin sees it.
type Device struct {
	Name   string // RDMA device name: mlx5_0, rxe0
	Driver string // RDMA driver module: mlx5_ib, rdma_rxe, siw, efa
	// PCI is the device's PCI function (Addr "" for software devices).
	PCI       rdmafs.PCI
	NUMANode  int      // -1: unknown or none
	LinkLayer string   // of port 1, lower case: ethernet, infiniband, unspecified
	Netdevs   []string // network devices of its ports
	Ports     []rdmafs.Port
	Chars     rdmafs.CharDevs
	// RdmaCM: /dev/infiniband/rdma_cm exists (one node for all devices).
	RdmaCM bool
	// Healthy: every port ACTIVE and the uverbs node present in /dev.
	Healthy bool
	// Why says what is wrong when it is not healthy.
	Why string
}

// ID is the device's kubelet device ID in exclusive mode: the PCI address
// (stable across renames), else the RDMA device name.
func (d Device) ID() string {
	if d.PCI.Addr != "" {
		return d.PCI.Addr
	}
	return d.Name
}

// Discover lists the RDMA devices under fs with what the plugin needs of
// each: PCI identity, NUMA node, link layer, netdevs, character devices
// (those present under fs's /dev/infiniband) and health.
func Discover(fs rdmafs.FS) ([]Device, error) {
	devs, err := fs.Devices()
	if err != nil {
		return nil, fmt.Errorf("discover: %w", err)
	}
	out := make([]Device, 0, len(devs))
	for _, rd := range devs {
		d := Device{Name: rd.Name, Driver: rd.Driver, NUMANode: rd.NUMANode, Ports: rd.Ports, Healthy: true,
			RdmaCM: present(fs, "rdma_cm") != ""}
		d.PCI, _ = fs.PCIOf(rd.Name)
		if len(rd.Ports) > 0 {
			d.LinkLayer = strings.ToLower(rd.Ports[0].LinkLayer)
		}
		if d.LinkLayer == "" {
			d.LinkLayer = "unspecified"
		}
		for _, p := range rd.Ports {
			for _, n := range fs.Netdevs(rd.Name, p.Num) {
				if !slices.Contains(d.Netdevs, n) {
					d.Netdevs = append(d.Netdevs, n)
				}
			}
			if p.State != "ACTIVE" && d.Healthy {
				d.Healthy, d.Why = false, fmt.Sprintf("port %d is %s (%s)", p.Num, p.State, p.PhysState)
			}
		}
		if len(rd.Ports) == 0 {
			d.Healthy, d.Why = false, "no ports"
		}
		if d.NUMANode < 0 && len(d.Netdevs) > 0 { // software devices: their netdev's node
			if v, err := fs.ReadString("sys/class/net/" + d.Netdevs[0] + "/device/numa_node"); err == nil {
				var n int
				if _, err := fmt.Sscan(v, &n); err == nil && n >= 0 {
					d.NUMANode = n
				}
			}
		}
		c := fs.CharDevsOf(rd.Name)
		d.Chars = rdmafs.CharDevs{Uverbs: present(fs, c.Uverbs)}
		for _, n := range c.Umad {
			if present(fs, n) != "" {
				d.Chars.Umad = append(d.Chars.Umad, n)
			}
		}
		for _, n := range c.Issm {
			if present(fs, n) != "" {
				d.Chars.Issm = append(d.Chars.Issm, n)
			}
		}
		if d.Chars.Uverbs == "" && d.Healthy {
			d.Healthy, d.Why = false, "no /dev/infiniband/uverbs node (is ib_uverbs loaded?)"
		}
		out = append(out, d)
	}
	return out, nil
}

// present returns node when /dev/infiniband/node exists under fs.
func present(fs rdmafs.FS, node string) string {
	if node != "" && fs.Exists("dev/infiniband/"+node) {
		return node
	}
	return ""
}

// Selects reports whether the selectors choose d.
func (s Selectors) Selects(d Device) bool {
	match := func(list []string, pred func(string) bool) bool {
		if len(list) == 0 {
			return true
		}
		return slices.ContainsFunc(list, pred)
	}
	return match(s.Vendors, func(v string) bool { return v == d.PCI.Vendor }) &&
		match(s.DeviceIDs, func(v string) bool { return v == d.PCI.Device }) &&
		match(s.Drivers, func(v string) bool { return v == d.PCI.Driver || v == d.Driver }) &&
		match(s.IfNames, func(v string) bool { return v == d.Name || slices.Contains(d.Netdevs, v) }) &&
		match(s.LinkTypes, func(v string) bool { return v == d.LinkLayer })
}
