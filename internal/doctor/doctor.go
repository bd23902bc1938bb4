// Package doctor checks a host for RDMA and says what to do about each
// problem: kernel modules, devices, their /dev nodes and port states, the RoCE v2 GID table,
// MTUs, the memlock limit, the RDMA network namespace mode, CPU frequency
// governors, NUMA placement of the NICs, hugepages and the firewall. Each
// check ends PASS, WARN, FAIL or SKIP (not applicable, or not knowable
// without privilege) with a one-line fix.
//
// Files are read under Options.Root (internal/rdmafs), so a test or a
// support engineer can run every check against a copy of another host's
// /sys and /proc; what files cannot tell (the live memlock limit, the
// netns mode from netlink, interface addresses, the ports' active MTU,
// the firewall ruleset) comes through Options' functions, which default
// to the running system when Root is "/".
package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// Status is a check's verdict.
type Status int

// Verdicts, in increasing severity; SKIP means not applicable or not
// knowable here.
const (
	Skip Status = iota
	Pass
	Warn
	Fail
)

func (s Status) String() string {
	switch s {
	case Pass:
		return "PASS"
	case Warn:
		return "WARN"
	case Fail:
		return "FAIL"
	}
	return "SKIP"
}

// MarshalText writes the status as PASS, WARN, FAIL or SKIP.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads PASS, WARN, FAIL or SKIP.
func (s *Status) UnmarshalText(b []byte) error {
	for _, x := range []Status{Skip, Pass, Warn, Fail} {
		if string(b) == x.String() {
			*s = x
			return nil
		}
	}
	return fmt.Errorf("doctor: unknown status %q", b)
}

// Result is what one check found about one thing (a module set, a port,
// a device).
type Result struct {
	// Check is the check's identifier: modules, devices, devnodes, ports, gids,
	// mtu, memlock, netns, governor, numa, gpu, qos, hugepages, firewall, peer.
	Check  string `json:"check"`
	Status Status `json:"status"`
	// Subject is what was checked, with its value: "memlock limit 64 KiB".
	Subject string `json:"subject"`
	// Detail says what it means.
	Detail string `json:"detail"`
	// Fix says what to do; empty where nothing needs doing.
	Fix string `json:"fix,omitempty"`
}

// String is the one-line human form:
//
//	FAIL  memlock limit 64 KiB: RDMA registrations will fail above it — raise it: ulimit -l unlimited
func (r Result) String() string {
	s := fmt.Sprintf("%-4s  %s", r.Status, r.Subject)
	if r.Detail != "" {
		s += ": " + r.Detail
	}
	if r.Fix != "" {
		s += " — " + r.Fix
	}
	return s
}

// Report is every result of a run, in check order.
type Report struct {
	Root    string   `json:"root"`
	Results []Result `json:"results"`
}

// Worst is the most severe status of the report (Skip for an empty one).
func (r *Report) Worst() Status {
	w := Skip
	for _, x := range r.Results {
		if x.Status > w {
			w = x.Status
		}
	}
	return w
}

// Count returns how many results have status s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, x := range r.Results {
		if x.Status == s {
			n++
		}
	}
	return n
}

// Find returns the results of one check.
func (r *Report) Find(check string) []Result {
	var out []Result
	for _, x := range r.Results {
		if x.Check == check {
			out = append(out, x)
		}
	}
	return out
}

// WriteText writes one line per result and a summary line.
func (r *Report) WriteText(w io.Writer) error {
	for _, x := range r.Results {
		if _, err := fmt.Fprintln(w, x.String()); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "\n%d passed, %d warnings, %d failed, %d skipped\n",
		r.Count(Pass), r.Count(Warn), r.Count(Fail), r.Count(Skip))
	return err
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.SetEscapeHTML(false)
	return e.Encode(struct {
		*Report
		Summary map[string]int `json:"summary"`
	}{r, map[string]int{"pass": r.Count(Pass), "warn": r.Count(Warn), "fail": r.Count(Fail), "skip": r.Count(Skip)}})
}

// Options say where to look. The zero value checks the running system.
type Options struct {
	// Root is the directory standing for "/" when reading /sys and
	// /proc; "" means "/", the running system.
	Root string
	// Memlock returns the RLIMIT_MEMLOCK in bytes (sys.Unlimited for
	// none). Nil: the limit of this process (internal/sys.MemlockLimit).
	Memlock func() (uint64, error)
	// NetnsMode returns the RDMA subsystem's network namespace mode,
	// "shared" or "exclusive". Nil: asked over RDMA netlink (as `rdma
	// system` does) when Root is "/"; under another root, ib_core's
	// netns_mode module parameter (the boot-time mode).
	NetnsMode func() (string, error)
	// Addrs returns the IP addresses of a network device. Nil: the live
	// interface's when Root is "/"; unknown under another root (the GID
	// check then judges the table alone).
	Addrs func(netdev string) ([]net.IP, error)
	// PortMTU returns a port's active MTU in bytes as the device reports
	// it (ibv_query_port; sysfs does not show it), or an error if
	// unknown. Nil: unknown; the MTU check derives the RoCE MTU from the
	// network device's MTU, as the drivers do.
	PortMTU func(dev string, port int) (int, error)
	// Ruleset returns the packet filter's rules as text (nft list
	// ruleset or iptables-save). Nil: run those tools when Root is "/"
	// and this process is root; otherwise the firewall check is SKIP.
	Ruleset func() (string, error)
	// GPUTopo returns the text of nvidia-smi topo -m. Nil: run it when
	// Root is "/" and it is installed.
	GPUTopo func() (string, error)
	// PFC returns the priorities with PFC on for a network device. Nil:
	// dcb pfc show on the live host (iproute2), unknown under --root.
	PFC func(netdev string) ([]int, error)
	// PeerAddr, when set, runs the peer check: Peer measures latency and
	// bandwidth to the host there (HOST or HOST:PORT, rdmakit doctor
	// --peer) over device PeerDev ("" = the default device).
	PeerAddr, PeerDev string
	Peer              func(addr, dev string) (PeerResult, error)
	// ServePeer serves the peer side (rdmakit doctor --serve-peer) on
	// device dev and ports port, port+1 until a signal; it returns the
	// exit status.
	ServePeer func(dev string, port int) int
}

// PeerResult is what a peer check measured.
type PeerResult struct {
	Device    string  // the local device used
	LatencyUs float64 // typical one-way latency of a 64-byte send
	BitsPerS  float64 // WRITE bandwidth
	// LinkBits is the device port's rate (0: unknown, e.g. tcp0).
	LinkBits float64
}

func (o *Options) live() bool { return o.Root == "" || o.Root == "/" }

// Run runs every check and returns the report.
func Run(o Options) *Report {
	d := &doc{o: o, fs: rdmafs.FS{Root: o.Root}}
	d.rep.Root = o.Root
	if d.rep.Root == "" {
		d.rep.Root = "/"
	}
	d.devs, d.devErr = d.fs.Devices()
	for _, c := range checks {
		c(d)
	}
	return &d.rep
}

// doc is one run's state.
type doc struct {
	o      Options
	fs     rdmafs.FS
	devs   []rdmafs.Device
	devErr error
	rep    Report
}

func (d *doc) add(check string, st Status, subject, detail, fix string) {
	d.rep.Results = append(d.rep.Results, Result{Check: check, Status: st, Subject: subject, Detail: detail, Fix: fix})
}

var checks = []func(*doc){
	checkModules, checkDevices, checkDevnodes, checkPorts, checkGIDs, checkMTU, checkMemlock,
	checkNetns, checkGovernor, checkNUMA, checkGPU, checkQoS, checkHugepages, checkFirewall, checkPeer,
}

// defaultNetdev is the network device of the default route
// (/proc/net/route), or "eth0" when there is none.
func (d *doc) defaultNetdev() string {
	s, err := d.fs.ReadString("proc/net/route")
	if err == nil {
		for _, line := range strings.Split(s, "\n")[1:] {
			f := strings.Fields(line)
			if len(f) > 2 && f[1] == "00000000" {
				return f[0]
			}
		}
	}
	return "eth0"
}

// iwarp reports whether a device is iWARP (node type RNIC), which
// connects through rdma_cm by IP address and has no RoCE GIDs.
func iwarp(dev rdmafs.Device) bool { return dev.NodeType == "RNIC" }

func portName(dev rdmafs.Device, p rdmafs.Port) string { return fmt.Sprintf("%s/%d", dev.Name, p.Num) }

// FormatBytes writes a size in binary units: 64 KiB, 8 MiB, 1.5 GiB.
func FormatBytes(n uint64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v := float64(n)
	i := 0
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %s", int64(v), units[i])
	}
	return fmt.Sprintf("%.1f %s", v, units[i])
}
