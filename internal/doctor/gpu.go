package doctor

// GPUs next to RDMA devices: NUMA placement from sysfs, the PCIe path
// from nvidia-smi topo -m where present, and the peer-memory module that
// GPUDirect RDMA needs.

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// gpu is an NVIDIA GPU's PCI function.
type gpu struct {
	addr string
	numa int
}

// gpus lists the NVIDIA GPUs (PCI vendor 0x10de, class 0x0300xx VGA or
// 0x0302xx 3D controller).
func (d *doc) gpus() []gpu {
	paths, _ := filepath.Glob(d.fs.Path("sys/bus/pci/devices/*"))
	var out []gpu
	for _, p := range paths {
		addr := filepath.Base(p)
		base := "sys/bus/pci/devices/" + addr
		vendor, _ := d.fs.ReadString(base + "/vendor")
		class, _ := d.fs.ReadString(base + "/class")
		if strings.ToLower(vendor) != "0x10de" || !(strings.HasPrefix(class, "0x0300") || strings.HasPrefix(class, "0x0302")) {
			continue
		}
		g := gpu{addr: addr, numa: -1}
		if s, err := d.fs.ReadString(base + "/numa_node"); err == nil {
			if v, err := strconv.Atoi(s); err == nil {
				g.numa = v
			}
		}
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	return out
}

// devNUMA is a device's NUMA node, a software device's from its netdev;
// -1 when unknown.
func (d *doc) devNUMA(dev rdmafs.Device) int {
	if dev.NUMANode >= 0 || dev.Parent == "" {
		return dev.NUMANode
	}
	if s, err := d.fs.ReadString("sys/class/net/" + dev.Parent + "/device/numa_node"); err == nil {
		if v, err := strconv.Atoi(s); err == nil {
			return v
		}
	}
	return -1
}

func checkGPU(d *doc) {
	gs := d.gpus()
	if len(gs) == 0 {
		d.add("gpu", Skip, "GPUs", "no NVIDIA GPU on the PCI bus", "")
		return
	}
	if len(d.devs) == 0 {
		d.add("gpu", Skip, fmt.Sprintf("%d GPU(s)", len(gs)), "no RDMA devices to pair them with", "")
		return
	}
	byNode := map[int][]string{}
	for _, dev := range d.devs {
		if n := d.devNUMA(dev); n >= 0 {
			byNode[n] = append(byNode[n], dev.Name)
		}
	}
	for _, g := range gs {
		subject := "NUMA node of GPU " + g.addr
		switch {
		case g.numa < 0:
			d.add("gpu", Skip, subject, "the firmware reports none", "")
		case len(byNode[g.numa]) > 0:
			d.add("gpu", Pass, subject, fmt.Sprintf("node %d, with RDMA device(s) %s", g.numa, strings.Join(byNode[g.numa], ", ")),
				"give its rank those: RDMAKIT_COLL_HCA / NCCL_IB_HCA="+strings.Join(byNode[g.numa], ","))
		default:
			d.add("gpu", Warn, subject, fmt.Sprintf("node %d has no RDMA device: its GPUDirect RDMA traffic crosses the socket interconnect", g.numa),
				"put a NIC on each socket with GPUs, or pin this GPU's rank to a GPU on a NIC's node")
		}
	}
	d.gpuTopo()
	mods, _ := d.fs.Modules()
	switch {
	case mods["nvidia_peermem"] || mods["nv_peer_mem"]:
		d.add("gpu", Pass, "GPUDirect RDMA peer memory", "nvidia_peermem loaded", "")
	default:
		d.add("gpu", Warn, "GPUDirect RDMA peer memory", "neither nvidia_peermem nor nv_peer_mem is loaded: RDMA devices cannot reach GPU memory except through dma-buf",
			"modprobe nvidia_peermem (or use dma-buf: kernel 5.12+ with the open GPU kernel modules)")
	}
}

// gpuTopo adds what nvidia-smi topo -m says of each GPU's nearest NIC.
func (d *doc) gpuTopo() {
	get := d.o.GPUTopo
	if get == nil {
		if !d.o.live() {
			return
		}
		if _, err := exec.LookPath("nvidia-smi"); err != nil {
			d.add("gpu", Skip, "GPU-NIC PCIe paths", "nvidia-smi is not installed", "")
			return
		}
		get = func() (string, error) {
			b, err := exec.Command("nvidia-smi", "topo", "-m").Output()
			return string(b), err
		}
	}
	s, err := get()
	if err != nil {
		d.add("gpu", Skip, "GPU-NIC PCIe paths", "nvidia-smi topo -m: "+err.Error(), "")
		return
	}
	for _, l := range parseTopo(s) {
		st, why := Pass, "GPUDirect RDMA takes the short path"
		switch l.rel {
		case "PHB", "NODE":
			st, why = Warn, "through the CPU's root complex: GPUDirect RDMA is slower (and NCCL leaves it off by default)"
		case "SYS":
			st, why = Warn, "across sockets: GPUDirect RDMA is slow or off"
		}
		fix := ""
		if st == Warn {
			fix = "pair each GPU with a NIC under the same PCIe switch (PIX/PXB) where the board has one"
		}
		d.add("gpu", st, fmt.Sprintf("PCIe path %s ↔ %s %s", l.gpu, l.nic, l.rel), why, fix)
	}
}

type topoLink struct{ gpu, nic, rel string }

// topoRank orders nvidia-smi's relations from nearest to farthest.
var topoRank = map[string]int{"PIX": 0, "PXB": 1, "PHB": 2, "NODE": 3, "SYS": 4}

// parseTopo reads nvidia-smi topo -m: for each GPU row, the nearest NIC
// column (named by the NIC legend, "NIC0: mlx5_0", where there is one).
// The header is the first line starting with GPU0; rows start with GPUn.
func parseTopo(s string) []topoLink {
	lines := strings.Split(s, "\n")
	hi := -1
	var header []string
	legend := map[string]string{}
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if hi < 0 && f[0] == "GPU0" {
			hi, header = i, f
			continue
		}
		if len(f) == 2 && strings.HasPrefix(f[0], "NIC") && strings.HasSuffix(f[0], ":") {
			legend[strings.TrimSuffix(f[0], ":")] = f[1]
		}
	}
	var nics []int
	for i, col := range header {
		if strings.HasPrefix(col, "NIC") || strings.HasPrefix(col, "mlx") {
			nics = append(nics, i)
		}
	}
	if len(nics) == 0 {
		return nil
	}
	var out []topoLink
	for i, line := range lines {
		f := strings.Fields(line)
		if i <= hi || len(f) <= nics[len(nics)-1]+1 || !strings.HasPrefix(f[0], "GPU") {
			continue
		}
		best, bestRank := -1, 99
		for _, c := range nics {
			if r, ok := topoRank[f[c+1]]; ok && r < bestRank {
				best, bestRank = c, r
			}
		}
		if best >= 0 {
			nic := header[best]
			if n, ok := legend[nic]; ok {
				nic = n
			}
			out = append(out, topoLink{gpu: f[0], nic: nic, rel: f[best+1]})
		}
	}
	return out
}
