package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// softwareHint is the way out for a host without RDMA hardware.
const softwareHint = "or use rdmakit's software transports (tcp0, shm0), which need no kernel module, device or privilege"

func checkModules(d *doc) {
	mods, ok := d.fs.Modules()
	if !ok {
		d.add("modules", Skip, "kernel modules", "neither /proc/modules nor /sys/module can be read", "")
		return
	}
	var missing []string
	for _, m := range []string{"ib_core", "ib_uverbs", "rdma_ucm"} {
		if !mods[m] {
			missing = append(missing, m)
		}
	}
	// A device's driver is there (it registered the device, as a module
	// or built in); an RDMA-capable NIC without its RDMA driver is not.
	drivers := map[string]bool{}
	var drvList []string
	for _, dev := range d.devs {
		if dev.Driver != "" && !drivers[dev.Driver] {
			drivers[dev.Driver] = true
			drvList = append(drvList, dev.Driver)
		}
	}
	sort.Strings(drvList)
	capable := d.fs.CapableNetdevs()
	var nics []string
	for nd := range capable {
		nics = append(nics, nd)
	}
	sort.Strings(nics)
	var missingDrv []string
	for _, nd := range nics {
		ib := capable[nd]
		if !mods[ib] && !drivers[ib] {
			missing = append(missing, ib)
			missingDrv = append(missingDrv, nd+" ("+ib+")")
			drivers[ib] = true
		}
	}
	switch {
	case len(missingDrv) > 0:
		d.add("modules", Fail, "kernel modules "+strings.Join(missing, ", ")+" missing",
			"RDMA-capable NICs without their RDMA driver: "+strings.Join(missingDrv, ", "),
			"modprobe "+strings.Join(missing, " && modprobe ")+" (and list them in /etc/modules-load.d/rdma.conf; rdma-core's rdma-load-modules does it at boot)")
	case len(missing) == 0:
		d.add("modules", Pass, "kernel modules", "ib_core, ib_uverbs, rdma_ucm"+listPrefix(", ", drvList)+" loaded", "")
	case !mods["ib_core"] && len(d.devs) == 0:
		d.add("modules", Fail, "kernel modules", "no RDMA in this kernel ("+strings.Join(missing, ", ")+" not loaded)",
			"load Soft-RoCE: modprobe rdma_rxe && modprobe rdma_ucm (brings ib_core and ib_uverbs), "+softwareHint)
	default:
		st, why := Fail, "user-space verbs cannot open a device"
		if len(missing) == 1 && missing[0] == "rdma_ucm" {
			why = "rdma_cm (rping, rdmakit ping, iWARP connections) is unavailable"
			st = Warn
			for _, dev := range d.devs {
				if iwarp(dev) {
					st, why = Fail, "iWARP devices ("+dev.Name+") connect only through rdma_cm"
				}
			}
		}
		d.add("modules", st, "kernel modules "+strings.Join(missing, ", ")+" missing", why,
			"modprobe "+strings.Join(missing, " && modprobe ")+" (and list them in /etc/modules-load.d/rdma.conf)")
	}
}

func listPrefix(prefix string, xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	return prefix + strings.Join(xs, ", ")
}

func checkDevices(d *doc) {
	if d.devErr != nil {
		d.add("devices", Fail, "RDMA devices", "cannot list /sys/class/infiniband: "+d.devErr.Error(), "")
		return
	}
	if len(d.devs) == 0 {
		if capable := d.fs.CapableNetdevs(); len(capable) > 0 {
			var nds, mods []string
			seen := map[string]bool{}
			for nd, ib := range capable {
				nds = append(nds, nd)
				if !seen[ib] {
					seen[ib] = true
					mods = append(mods, ib)
				}
			}
			sort.Strings(nds)
			sort.Strings(mods)
			d.add("devices", Fail, "no RDMA devices", "/sys/class/infiniband is empty, but "+strings.Join(nds, ", ")+" can do RDMA",
				"load the NIC's RDMA driver: modprobe "+strings.Join(mods, " && modprobe "))
			return
		}
		nd := d.defaultNetdev()
		d.add("devices", Fail, "no RDMA devices", "/sys/class/infiniband is empty or absent",
			"add a Soft-RoCE device: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev "+nd+
				" (or soft-iWARP: modprobe siw && rdma link add siw0 type siw netdev "+nd+"), "+softwareHint)
		return
	}
	var parts []string
	for _, dev := range d.devs {
		desc := dev.Driver
		if dev.NodeType != "" {
			desc = strings.TrimPrefix(desc+", "+dev.NodeType, ", ")
		}
		if dev.Parent != "" {
			desc += " over " + dev.Parent
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", dev.Name, desc))
	}
	d.add("devices", Pass, fmt.Sprintf("%d RDMA device(s)", len(d.devs)), strings.Join(parts, ", "), "")
}

// checkDevnodes looks for each device's /dev/infiniband/uverbsN (and
// rdma_cm): present in sysfs but absent here is a container started
// without the device nodes.
func checkDevnodes(d *doc) {
	if len(d.devs) == 0 {
		d.add("devnodes", Skip, "/dev/infiniband", "no RDMA devices", "")
		return
	}
	var missing, have []string
	for _, dev := range d.devs {
		n, ok := d.fs.Uverbs(dev.Name)
		if !ok {
			d.add("devnodes", Skip, "/dev/infiniband of "+dev.Name, "ib_uverbs has no node for it (see the modules check)", "")
			continue
		}
		p := "/dev/infiniband/" + n
		if d.fs.Exists(p) {
			have = append(have, p+" ("+dev.Name+")")
		} else {
			missing = append(missing, p)
		}
	}
	cm := "/dev/infiniband/rdma_cm"
	if mods, _ := d.fs.Modules(); mods["rdma_ucm"] && !d.fs.Exists(cm) {
		missing = append(missing, cm)
	}
	switch {
	case len(missing) > 0:
		d.add("devnodes", Fail, strings.Join(missing, ", ")+" missing", "the kernel has the devices but this (container's) /dev does not: verbs cannot open them",
			"give the container the nodes: --device=/dev/infiniband (docker) or an RDMA device plugin (Kubernetes); on a host, check udev (rdma-core's rules)")
	case len(have) > 0:
		d.add("devnodes", Pass, "/dev/infiniband", strings.Join(have, ", "), "")
	}
}

func checkPorts(d *doc) {
	if len(d.devs) == 0 {
		d.add("ports", Skip, "port states", "no RDMA devices", "")
		return
	}
	for _, dev := range d.devs {
		if len(dev.Ports) == 0 {
			d.add("ports", Fail, dev.Name+" has no ports", "the driver registered no port", "reload the driver: modprobe -r "+dev.Driver+" && modprobe "+dev.Driver)
			continue
		}
		for _, p := range dev.Ports {
			subject := fmt.Sprintf("port %s %s", portName(dev, p), p.State)
			info := strings.TrimPrefix(strings.Join(nonEmpty(p.PhysState, p.Rate, p.LinkLayer), ", "), ", ")
			nds := d.fs.Netdevs(dev.Name, p.Num)
			if len(nds) > 0 {
				info += ", netdev " + strings.Join(nds, ",")
			}
			if p.State == "ACTIVE" {
				d.add("ports", Pass, subject, info, "")
				continue
			}
			nd := "NETDEV"
			if len(nds) > 0 {
				nd = nds[0]
			}
			var fix string
			switch {
			case p.LinkLayer == "InfiniBand" && (p.State == "INIT" || p.State == "ARMED"):
				fix = "the link is up but no subnet manager configured the port: run opensm on one host of the fabric (or enable the switch's SM)"
			case p.PhysState == "Disabled":
				fix = "bring the link up: ip link set " + nd + " up"
			case p.PhysState == "Polling":
				fix = "no link partner: check the cable, transceiver and switch port (ethtool " + nd + ")"
			default:
				fix = "bring the link up: ip link set " + nd + " up, and check the cable and switch port (ethtool " + nd + ")"
			}
			d.add("ports", Fail, subject, info+": the port cannot carry traffic", fix)
		}
	}
}

func nonEmpty(xs ...string) []string {
	var out []string
	for _, x := range xs {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

// addrsOf returns the IP addresses of netdev and whether they are known.
func (d *doc) addrsOf(netdev string) ([]net.IP, bool) {
	f := d.o.Addrs
	if f == nil {
		if !d.o.live() {
			return nil, false
		}
		f = liveAddrs
	}
	ips, err := f(netdev)
	if err != nil {
		return nil, false
	}
	return ips, true
}

func liveAddrs(netdev string) ([]net.IP, error) {
	ifc, err := net.InterfaceByName(netdev)
	if err != nil {
		return nil, err
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return nil, err
	}
	var out []net.IP
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			out = append(out, ipn.IP)
		}
	}
	return out, nil
}

func checkGIDs(d *doc) {
	if len(d.devs) == 0 {
		d.add("gids", Skip, "GID tables", "no RDMA devices", "")
		return
	}
	for _, dev := range d.devs {
		for _, p := range dev.Ports {
			name := portName(dev, p)
			switch {
			case iwarp(dev):
				d.add("gids", Skip, "GIDs of "+name, "iWARP connects by IP address through rdma_cm; no GID index to choose", "")
				continue
			case p.LinkLayer == "InfiniBand":
				d.add("gids", Skip, "GIDs of "+name, "InfiniBand: GID index 0 (the port GUID) unless your fabric routes between subnets", "")
				continue
			}
			gids, err := d.fs.GIDs(dev.Name, p.Num)
			if err != nil {
				d.add("gids", Fail, "GID table of "+name, "cannot be read: "+err.Error(), "")
				continue
			}
			nds := d.fs.Netdevs(dev.Name, p.Num)
			nd := "NETDEV"
			if len(nds) > 0 {
				nd = nds[0]
			}
			var v2 []rdmafs.GID
			for _, g := range gids {
				if g.RoCEv2() {
					v2 = append(v2, g)
				}
			}
			if len(v2) == 0 {
				d.add("gids", Fail, "no RoCE v2 GID on "+name,
					fmt.Sprintf("%d GID(s), none RoCE v2: RoCE v2 (routable, what NCCL, UCX and rdmakit use) has no source address", len(gids)),
					"give "+nd+" an IP address (ip addr add ADDR/PREFIX dev "+nd+"; the kernel adds a RoCE v2 GID for each) and check the types: grep . /sys/class/infiniband/"+dev.Name+fmt.Sprintf("/ports/%d/gid_attrs/types/*", p.Num))
				continue
			}
			// Every IPv4 address of the netdev should have its RoCE v2 GID.
			var missing []string
			if len(nds) > 0 {
				for _, n := range nds {
					ips, known := d.addrsOf(n)
					if !known {
						continue
					}
					for _, ip := range ips {
						if ip.To4() == nil {
							continue
						}
						found := false
						for _, g := range v2 {
							if g.GID.Equal(ip) {
								found = true
							}
						}
						if !found {
							missing = append(missing, ip.String()+" ("+n+")")
						}
					}
				}
			}
			best := v2[0]
			for _, g := range v2 {
				if g.IPv4() != nil {
					best = g
					break
				}
			}
			var listed []string
			for _, g := range v2 {
				addr := g.GID.String()
				if v4 := g.IPv4(); v4 != nil {
					addr = v4.String()
				}
				listed = append(listed, fmt.Sprintf("%d=%s", g.Index, addr))
			}
			use := fmt.Sprintf("NCCL_IB_GID_INDEX=%d, perftest -x %d, RDMAKIT_IBV_GID_INDEX=%d", best.Index, best.Index, best.Index)
			if len(missing) > 0 {
				d.add("gids", Warn, "RoCE v2 GIDs of "+name+" incomplete",
					"no RoCE v2 GID for "+strings.Join(missing, ", ")+" (have "+strings.Join(listed, ", ")+")",
					"the address was added after the device or the netdev is not the port's: re-add the address or the device (rdma link delete/add for rxe)")
				continue
			}
			addr := best.GID.String()
			if v4 := best.IPv4(); v4 != nil {
				addr = v4.String()
			}
			if best.GID.IsLinkLocalUnicast() {
				d.add("gids", Warn, fmt.Sprintf("only a link-local RoCE v2 GID (index %d) on %s", best.Index, name),
					"no routable address: peers beyond this link cannot be reached",
					"give "+nd+" an IP address (ip addr add ADDR/PREFIX dev "+nd+"); the kernel adds its RoCE v2 GID")
				continue
			}
			d.add("gids", Pass, fmt.Sprintf("RoCE v2 GID index %d (%s) on %s", best.Index, addr, name),
				"RoCE v2 GIDs "+strings.Join(listed, ", "), "use it: "+use)
		}
	}
}

// RoCEMTU is the largest IB MTU (256 ... 4096 bytes) that a RoCE port
// over a network device of MTU netdevMTU can use: what mlx5 and the
// other drivers derive (the netdev MTU less 96 bytes of GRH, UDP, BTH and
// extended headers and ICRC). 0 if even 256 does not fit.
func RoCEMTU(netdevMTU int) int {
	avail := netdevMTU - 96
	for m := 4096; m >= 256; m /= 2 {
		if avail >= m {
			return m
		}
	}
	return 0
}

func checkMTU(d *doc) {
	for _, dev := range d.devs {
		for _, p := range dev.Ports {
			name := portName(dev, p)
			if iwarp(dev) || p.LinkLayer == "InfiniBand" {
				d.add("mtu", Skip, "MTU of "+name, "not RoCE: the RDMA MTU does not follow the netdev's", "")
				continue
			}
			nds := d.fs.Netdevs(dev.Name, p.Num)
			if len(nds) == 0 {
				d.add("mtu", Skip, "MTU of "+name, "no network device found under the port", "")
				continue
			}
			nd := nds[0]
			mtu, err := d.fs.NetdevMTU(nd)
			if err != nil {
				d.add("mtu", Skip, "MTU of "+name, "cannot read the MTU of "+nd+": "+err.Error(), "")
				continue
			}
			fits := RoCEMTU(mtu)
			subject := fmt.Sprintf("%s MTU %d (%s)", nd, mtu, name)
			if d.o.PortMTU != nil {
				if active, err := d.o.PortMTU(dev.Name, p.Num); err == nil && active > 0 {
					subject = fmt.Sprintf("%s MTU %d, %s active MTU %d", nd, mtu, name, active)
					switch {
					case active > fits:
						d.add("mtu", Fail, subject, fmt.Sprintf("RDMA packets of %d bytes do not fit frames of %d: they are dropped", active, mtu),
							fmt.Sprintf("raise the netdev MTU: ip link set %s mtu %d (here, on the switch and on every peer), or set the QPs' path MTU to %d", nd, active+96, fits))
						continue
					case active < fits:
						d.add("mtu", Warn, subject, fmt.Sprintf("the netdev carries %d-byte RDMA MTU but the port uses %d (it did not follow an MTU change)", fits, active),
							"re-create the device (rdma link delete/add for rxe and siw) or reload its driver")
						continue
					}
				}
			}
			switch {
			case fits < 1024:
				d.add("mtu", Fail, subject, fmt.Sprintf("RoCE gets an MTU of only %d bytes", fits),
					"raise it: ip link set "+nd+" mtu 1500 or more (9000 with jumbo frames on the switch)")
			case fits < 4096 && mtu >= 4096:
				d.add("mtu", Warn, subject, fmt.Sprintf("RoCE gets %d; %d bytes more would give 4096", fits, 4096+96-mtu),
					"ip link set "+nd+" mtu 4200 (or 9000), the same on every peer and the switch")
			case fits < 4096:
				d.add("mtu", Warn, subject, fmt.Sprintf("RoCE gets an MTU of %d bytes; jumbo frames give 4096 and more bandwidth per packet", fits),
					"if the switch allows: ip link set "+nd+" mtu 9000 on every host of the fabric")
			default:
				d.add("mtu", Pass, subject, fmt.Sprintf("RoCE MTU %d", fits), "")
			}
		}
	}
	if len(d.devs) == 0 {
		d.add("mtu", Skip, "MTU", "no RDMA devices", "")
	}
}

// memlockFloor is the limit under which the memlock check fails: a
// collective or a benchmark registers more than this.
const memlockFloor = 64 << 20

func checkMemlock(d *doc) {
	f := d.o.Memlock
	if f == nil {
		if !d.o.live() {
			d.add("memlock", Skip, "memlock limit", "the limit is a process's, not readable under --root "+d.o.Root, "")
			return
		}
		f = sys.MemlockLimit
	}
	v, err := f()
	if err != nil {
		if errors.Is(err, sys.ErrNotSupported) {
			d.add("memlock", Skip, "memlock limit", err.Error(), "")
		} else {
			d.add("memlock", Warn, "memlock limit", "cannot read it: "+err.Error(), "")
		}
		return
	}
	const fix = "raise it: ulimit -l unlimited (or LimitMEMLOCK=infinity in the unit, memlock unlimited in /etc/security/limits.conf, --ulimit memlock=-1 for docker)"
	switch {
	case v == sys.Unlimited:
		d.add("memlock", Pass, "memlock limit unlimited", "registrations are limited only by memory", "")
	case v < memlockFloor:
		st := Fail
		detail := "RDMA registrations will fail above it"
		if len(d.devs) == 0 {
			st, detail = Warn, detail+" (once an RDMA device is used; rdmakit's software transports do not pin)"
		}
		d.add("memlock", st, "memlock limit "+FormatBytes(v), detail, fix)
	default:
		d.add("memlock", Warn, "memlock limit "+FormatBytes(v), "registrations above it fail with ENOMEM", fix)
	}
}

func checkNetns(d *doc) {
	f := d.o.NetnsMode
	if f == nil {
		if mods, ok := d.fs.Modules(); ok && !mods["ib_core"] {
			d.add("netns", Skip, "RDMA netns mode", "ib_core is not loaded", "")
			return
		}
		if d.o.live() {
			f = netlinkNetnsMode
		} else {
			f = func() (string, error) {
				s, err := d.fs.ReadString("sys/module/ib_core/parameters/netns_mode")
				if err != nil {
					return "", err
				}
				switch s {
				case "Y", "1":
					return "shared", nil
				case "N", "0":
					return "exclusive", nil
				}
				return "", fmt.Errorf("netns_mode %q", s)
			}
		}
	}
	mode, err := f()
	if err != nil {
		d.add("netns", Skip, "RDMA netns mode", "unknown: "+err.Error(), "")
		return
	}
	switch mode {
	case "shared":
		d.add("netns", Pass, "RDMA netns mode shared", "every network namespace sees every RDMA device (right for hosts; containers get devices through the device plugin's /dev/infiniband)",
			"for per-pod device isolation (SR-IOV CNI with RDMA): rdma system set netns exclusive (or ib_core netns_mode=0 at load)")
	case "exclusive":
		d.add("netns", Pass, "RDMA netns mode exclusive", "a device is visible only in the namespace it is assigned to (rdma dev set DEV netns NS)", "")
	default:
		d.add("netns", Warn, "RDMA netns mode "+mode, "unknown mode", "")
	}
}

func checkGovernor(d *doc) {
	cpus, _ := filepath.Glob(d.fs.Path("sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"))
	if len(cpus) == 0 {
		d.add("governor", Skip, "CPU frequency governor", "no cpufreq (a VM, or the firmware controls frequency)", "")
		return
	}
	count := map[string]int{}
	for _, p := range cpus {
		b, err := os.ReadFile(p)
		if err == nil {
			count[strings.TrimSpace(string(b))]++
		}
	}
	var kinds []string
	for g, n := range count {
		kinds = append(kinds, fmt.Sprintf("%s on %d CPU(s)", g, n))
	}
	sort.Strings(kinds)
	if len(count) == 1 && count["performance"] > 0 {
		d.add("governor", Pass, "CPU governor performance", fmt.Sprintf("on all %d CPUs", len(cpus)), "")
		return
	}
	d.add("governor", Warn, "CPU governor "+strings.Join(kinds, ", "), "polling completion queues and latency tests lose to frequency scaling",
		"cpupower frequency-set -g performance (or tuned-adm profile network-latency)")
}

func checkNUMA(d *doc) {
	nodes, _ := filepath.Glob(d.fs.Path("sys/devices/system/node/node[0-9]*"))
	if len(d.devs) == 0 {
		d.add("numa", Skip, "NUMA placement", "no RDMA devices", "")
		return
	}
	for _, dev := range d.devs {
		node := dev.NUMANode
		via := ""
		if node < 0 && dev.Parent != "" {
			if s, err := d.fs.ReadString("sys/class/net/" + dev.Parent + "/device/numa_node"); err == nil {
				if v, err := strconv.Atoi(s); err == nil {
					node, via = v, " (its netdev "+dev.Parent+")"
				}
			}
		}
		switch {
		case node >= 0:
			cpus, _ := d.fs.ReadString(fmt.Sprintf("sys/devices/system/node/node%d/cpulist", node))
			detail := "NUMA node " + strconv.Itoa(node) + via
			if cpus != "" {
				detail += ", CPUs " + cpus
			}
			fix := ""
			if len(nodes) > 1 {
				fix = fmt.Sprintf("run its processes there: numactl --cpunodebind=%d --membind=%d", node, node)
			}
			d.add("numa", Pass, "NUMA node of "+dev.Name, detail, fix)
		case dev.Parent != "":
			d.add("numa", Skip, "NUMA node of "+dev.Name, "a software device over "+dev.Parent+", which reports no NUMA node", "")
		case len(nodes) > 1:
			d.add("numa", Warn, "NUMA node of "+dev.Name+" unknown", fmt.Sprintf("%d NUMA nodes but the firmware reports none for the device", len(nodes)),
				"find the socket from the PCI slot (lspci -vv) and pin with numactl; enable ACPI SRAT/NUMA in the BIOS")
		default:
			d.add("numa", Pass, "NUMA node of "+dev.Name, "one NUMA node: nothing to pin", "")
		}
	}
}

func checkHugepages(d *doc) {
	s, err := d.fs.ReadString("proc/meminfo")
	if err != nil {
		d.add("hugepages", Skip, "hugepages", "/proc/meminfo cannot be read", "")
		return
	}
	kv := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			kv[k] = strings.TrimSpace(v)
		}
	}
	thp := ""
	if t, err := d.fs.ReadString("sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		if i, j := strings.Index(t, "["), strings.Index(t, "]"); i >= 0 && j > i {
			thp = t[i+1 : j]
		}
	}
	detail := fmt.Sprintf("%s reserved of %s, %s free", orZero(kv["HugePages_Total"]), orZero(kv["Hugepagesize"]), orZero(kv["HugePages_Free"]))
	if thp != "" {
		detail += "; transparent hugepages " + thp
	}
	detail += " (rdmakit does not need them; fewer pages to pin make large registrations faster)"
	d.add("hugepages", Pass, "hugepages", detail, "")
}

func orZero(s string) string {
	if s == "" {
		return "0"
	}
	return s
}
