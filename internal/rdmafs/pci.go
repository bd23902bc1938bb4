package rdmafs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// PCI is the PCI function under an RDMA device.
type PCI struct {
	// Addr is the function's address, "0000:03:00.1".
	Addr string
	// Vendor and Device are the PCI IDs in lower-case hex without 0x:
	// "15b3", "101d".
	Vendor, Device string
	// Driver is the PCI driver bound to the function (mlx5_core, efa, ...).
	Driver string
	// PhysFn is the address of the physical function of a virtual
	// function (SR-IOV VF), "" for a physical function.
	PhysFn string
}

// VF reports whether the function is an SR-IOV virtual function.
func (p PCI) VF() bool { return p.PhysFn != "" }

// PCIOf returns the PCI function of an RDMA device; ok is false for a
// device without one (rxe, siw) or when sysfs does not say. It reads
// device/uevent (PCI_SLOT_NAME, PCI_ID, DRIVER) with device/vendor,
// device/device and the device symlink as fallbacks, and device/physfn
// for a VF.
func (f FS) PCIOf(dev string) (p PCI, ok bool) {
	base := ClassDir + "/" + dev + "/device"
	if s, err := f.ReadString(base + "/uevent"); err == nil {
		for _, line := range strings.Split(s, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
			switch k {
			case "PCI_SLOT_NAME":
				p.Addr = v
			case "PCI_ID":
				ven, d, _ := strings.Cut(v, ":")
				p.Vendor, p.Device = strings.ToLower(ven), strings.ToLower(d)
			case "DRIVER":
				p.Driver = v
			}
		}
	}
	if p.Addr == "" {
		if l, err := os.Readlink(f.Path(base)); err == nil && looksPCI(filepath.Base(l)) {
			p.Addr = filepath.Base(l)
		}
	}
	if p.Addr == "" {
		return PCI{}, false
	}
	if p.Vendor == "" {
		p.Vendor = hexID(f, base+"/vendor")
		p.Device = hexID(f, base+"/device")
	}
	if p.Driver == "" {
		if l, err := os.Readlink(f.Path(base + "/driver")); err == nil {
			p.Driver = filepath.Base(l)
		}
	}
	if l, err := os.Readlink(f.Path(base + "/physfn")); err == nil {
		p.PhysFn = filepath.Base(l)
	}
	return p, true
}

func hexID(f FS, p string) string {
	s, err := f.ReadString(p)
	if err != nil {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X"))
}

// looksPCI reports whether s has the shape of a PCI address,
// dddd:bb:dd.f.
func looksPCI(s string) bool {
	return len(s) == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.'
}

// DevicesOfPCI returns the RDMA devices of a PCI function, from
// /sys/bus/pci/devices/ADDR/infiniband (several only on odd hardware).
func (f FS) DevicesOfPCI(addr string) []string {
	names, _ := f.names("sys/bus/pci/devices/" + addr + "/infiniband")
	return names
}

// CharDevs are the character devices of one RDMA device, as names under
// /dev/infiniband.
type CharDevs struct {
	Uverbs string   // "uverbs0", "" when ib_uverbs has none
	Umad   []string // "umad0", one per port (ib_umad; InfiniBand and RoCE)
	Issm   []string // "issm0", one per port (ib_umad)
}

// All returns every node name, uverbs first.
func (c CharDevs) All() []string {
	var out []string
	if c.Uverbs != "" {
		out = append(out, c.Uverbs)
	}
	out = append(out, c.Umad...)
	return append(out, c.Issm...)
}

// CharDevsOf returns the character devices the kernel made for an RDMA
// device: its uverbs node (/sys/class/infiniband_verbs) and its umad and
// issm nodes (/sys/class/infiniband_mad/{umad,issm}N/ibdev).
func (f FS) CharDevsOf(dev string) CharDevs {
	var c CharDevs
	c.Uverbs, _ = f.Uverbs(dev)
	names, err := f.names("sys/class/infiniband_mad")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return c
	}
	for _, n := range names {
		if ib, err := f.ReadString("sys/class/infiniband_mad/" + n + "/ibdev"); err != nil || ib != dev {
			continue
		}
		switch {
		case strings.HasPrefix(n, "umad"):
			c.Umad = append(c.Umad, n)
		case strings.HasPrefix(n, "issm"):
			c.Issm = append(c.Issm, n)
		}
	}
	byNum := func(s []string) {
		sort.Slice(s, func(i, j int) bool { return nodeNum(s[i]) < nodeNum(s[j]) })
	}
	byNum(c.Umad)
	byNum(c.Issm)
	return c
}

func nodeNum(s string) int {
	i := strings.IndexAny(s, "0123456789")
	if i < 0 {
		return -1
	}
	n, _ := strconv.Atoi(s[i:])
	return n
}
