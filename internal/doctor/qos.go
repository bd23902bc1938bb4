package doctor

// Lossless RoCE settings of hardware RoCE ports: ECN (DCQCN) per
// priority from the driver's sysfs (mlx5: /sys/class/net/N/ecn/roce_np
// and roce_rp), PFC per priority (dcb pfc show on the live host, or
// Options.PFC), and the RoCE traffic class (mlx5:
// /sys/class/infiniband/DEV/tc/1/traffic_class) with its DSCP.

import (
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// ecnPrios returns the priorities with ECN on in dir/enable/0..7; ok is
// false when the driver has no such directory.
func (d *doc) ecnPrios(dir string) (prios []int, ok bool) {
	for p := range 8 {
		s, err := d.fs.ReadString(fmt.Sprintf("%s/enable/%d", dir, p))
		if err != nil {
			continue
		}
		ok = true
		if s == "1" {
			prios = append(prios, p)
		}
	}
	return prios, ok
}

func intsString(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

// parseDCBPFC reads `dcb pfc show dev N`: "prio-pfc 0:off 1:off 2:off 3:on ...".
func parseDCBPFC(s string) ([]int, error) {
	i := strings.Index(s, "prio-pfc")
	if i < 0 {
		return nil, fmt.Errorf("no prio-pfc in %q", strings.TrimSpace(s))
	}
	var on []int
	for _, f := range strings.Fields(s[i+len("prio-pfc"):]) {
		p, v, ok := strings.Cut(f, ":")
		if !ok {
			break
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			break
		}
		if v == "on" {
			on = append(on, n)
		}
	}
	return on, nil
}

var tclassRE = regexp.MustCompile(`tclass=(\d+)`)

func checkQoS(d *doc) {
	any := false
	for _, dev := range d.devs {
		if dev.Parent != "" || iwarp(dev) {
			continue // software devices and iWARP: no lossless Ethernet to set up
		}
		for _, p := range dev.Ports {
			if p.LinkLayer != "Ethernet" {
				continue
			}
			for _, nd := range d.fs.Netdevs(dev.Name, p.Num) {
				any = true
				d.qosPort(dev.Name, portNameNum(dev.Name, p.Num), nd)
			}
		}
	}
	if !any {
		d.add("qos", Skip, "ECN / PFC / DSCP", "no hardware RoCE port", "")
	}
}

func portNameNum(dev string, port int) string { return fmt.Sprintf("%s/%d", dev, port) }

func (d *doc) qosPort(dev, port, nd string) {
	np, okNP := d.ecnPrios("sys/class/net/" + nd + "/ecn/roce_np")
	rp, okRP := d.ecnPrios("sys/class/net/" + nd + "/ecn/roce_rp")
	switch {
	case !okNP && !okRP:
		d.add("qos", Skip, "ECN on "+nd+" ("+port+")", "the driver exposes no ECN settings in sysfs", "")
	case len(np) == 0 || len(rp) == 0:
		d.add("qos", Warn, "ECN on "+nd+" ("+port+") off", fmt.Sprintf("notification point on priorities [%s], reaction point on [%s]: without both, congestion is not signalled back (DCQCN) and RoCE loses throughput under load", intsString(np), intsString(rp)),
			"enable it on the RoCE priority (e.g. 3): echo 1 > /sys/class/net/"+nd+"/ecn/roce_np/enable/3; echo 1 > /sys/class/net/"+nd+"/ecn/roce_rp/enable/3; and ECN marking on the switch")
	default:
		d.add("qos", Pass, "ECN on "+nd+" ("+port+")", fmt.Sprintf("DCQCN notification point on priorities %s, reaction point on %s", intsString(np), intsString(rp)), "")
	}
	get := d.o.PFC
	if get == nil && d.o.live() {
		if _, err := exec.LookPath("dcb"); err == nil {
			get = func(nd string) ([]int, error) {
				b, err := exec.Command("dcb", "pfc", "show", "dev", nd).CombinedOutput()
				if err != nil {
					return nil, fmt.Errorf("dcb pfc show dev %s: %v: %s", nd, err, strings.TrimSpace(string(b)))
				}
				return parseDCBPFC(string(b))
			}
		}
	}
	if get == nil {
		d.add("qos", Skip, "PFC on "+nd, "read with dcb pfc show dev "+nd+" (iproute2) on the live host", "")
	} else if on, err := get(nd); err != nil {
		d.add("qos", Skip, "PFC on "+nd, err.Error(), "")
	} else if len(on) == 0 {
		d.add("qos", Warn, "PFC on "+nd+" off", "no priority is lossless: RoCE relies on ECN and retransmission alone (fine for NICs built for lossy RoCE, slow for others)",
			"dcb pfc set dev "+nd+" prio-pfc 3:on (and the same priority lossless on the switch)")
	} else {
		d.add("qos", Pass, "PFC on "+nd, "lossless priorities "+intsString(on), "")
	}
	if s, err := d.fs.ReadString("sys/class/infiniband/" + dev + "/tc/1/traffic_class"); err == nil {
		tc := 0
		if m := tclassRE.FindStringSubmatch(s); m != nil {
			tc, _ = strconv.Atoi(m[1])
		}
		d.add("qos", Pass, fmt.Sprintf("RoCE traffic class of %s: %d (DSCP %d)", dev, tc, tc>>2),
			"the switch must map this DSCP to the lossless priority", "")
	}
}
