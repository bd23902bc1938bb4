package main

// rdmakit info: every device of every linked transport, in the style of
// ibv_devinfo. Runs in main's goroutine.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"

	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	register("info", "list devices of every linked transport, like ibv_devinfo", runInfo)
}

const infoUsage = `usage: rdmakit info [-v] [-d DEV]

  -d, --ib-dev=DEV   show only device DEV
  -l, --list         print only the device names
  -v, --verbose      add device limits and the ports' GIDs and addresses
`

func runInfo(args []string) int {
	var dev string
	var verbose, list bool
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-v" || a == "--verbose":
			verbose = true
		case a == "-l" || a == "--list":
			list = true
		case a == "-h" || a == "--help":
			fmt.Print(infoUsage)
			return 0
		case a == "-d" || a == "--ib-dev":
			if i+1 >= len(args) {
				fmt.Fprintln(os.Stderr, "rdmakit info: -d needs a device name")
				return 2
			}
			i++
			dev = args[i]
		case strings.HasPrefix(a, "--ib-dev="):
			dev = strings.TrimPrefix(a, "--ib-dev=")
		case strings.HasPrefix(a, "-d") && len(a) > 2:
			dev = a[2:]
		default:
			fmt.Fprintf(os.Stderr, "rdmakit info: unknown argument %q (rdmakit info -h lists the flags)\n", a)
			return 2
		}
	}
	if err := printInfo(os.Stdout, dev, verbose, list); err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit info: %v\n", err)
		return 1
	}
	if ibverbsNote != nil && dev == "" {
		devs, _ := verbs.Devices()
		io.WriteString(os.Stderr, ibverbsNote(devs, ""))
	}
	return 0
}

// ibverbsNote, set in the ibverbs build, says what to do when libibverbs
// finds no device ("" when it finds one); sysRoot prefixes /sys.
var ibverbsNote func(devs []verbs.DeviceInfo, sysRoot string) string

// printInfo writes the device list; a transport that fails to list its
// devices is reported after the others.
func printInfo(w io.Writer, only string, verbose, list bool) error {
	devs, lerr := verbs.Devices()
	var shown []verbs.DeviceInfo
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
		if only == "" || d.Name == only {
			shown = append(shown, d)
		}
	}
	if only != "" && len(shown) == 0 {
		if len(names) == 0 {
			return fmt.Errorf("device %q wasn't found: no transport is linked", only)
		}
		return fmt.Errorf("device %q wasn't found (devices: %s)", only, strings.Join(names, ", "))
	}
	if len(devs) == 0 {
		if lerr != nil {
			return lerr
		}
		return errors.New("no devices found: no transport is linked")
	}
	var b strings.Builder
	if list {
		fmt.Fprintf(&b, "%d HCA%s found:\n", len(shown), plural(len(shown)))
		for _, d := range shown {
			fmt.Fprintf(&b, "\t%s\n", d.Name)
		}
		b.WriteString("\n")
	} else {
		for _, d := range shown {
			writeDevice(&b, d, verbose)
		}
	}
	io.WriteString(w, b.String())
	if lerr != nil {
		return lerr
	}
	return nil
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, (g>>32)&0xffff, (g>>16)&0xffff, g&0xffff)
}

func mtuString(m verbs.MTU) string {
	if n := m.Bytes(); n > 0 {
		return fmt.Sprintf("%d (%d)", n, m)
	}
	return fmt.Sprintf("invalid MTU (%d)", m)
}

var atomicNames = map[verbs.AtomicCap]string{verbs.AtomicNone: "ATOMIC_NONE", verbs.AtomicHCA: "ATOMIC_HCA", verbs.AtomicGlob: "ATOMIC_GLOB"}

// writeDevice prints one device as ibv_devinfo does (tabs and all).
func writeDevice(b *strings.Builder, d verbs.DeviceInfo, verbose bool) {
	fmt.Fprintf(b, "hca_id:\t%s\n", d.Name)
	fmt.Fprintf(b, "\ttransport:\t\t\t%s\n", d.Transport)
	fmt.Fprintf(b, "\tnode_type:\t\t\t%s\n", d.NodeType)
	if d.FWVersion != "" {
		fmt.Fprintf(b, "\tfw_ver:\t\t\t\t%s\n", d.FWVersion)
	}
	fmt.Fprintf(b, "\tnode_guid:\t\t\t%s\n", guidString(d.NodeGUID))
	fmt.Fprintf(b, "\tsys_image_guid:\t\t\t%s\n", guidString(d.NodeGUID))
	fmt.Fprintf(b, "\tvendor_id:\t\t\t0x%04x\n", d.VendorID)
	fmt.Fprintf(b, "\tvendor:\t\t\t\trdmakit (%s transport)\n", d.Transport)
	fmt.Fprintf(b, "\tphys_port_cnt:\t\t\t%d\n", len(d.Ports))
	if verbose {
		fmt.Fprintf(b, "\tmax_mr_size:\t\t\t0x%x\n", d.MaxMRSize)
		fmt.Fprintf(b, "\tmax_qp:\t\t\t\t%d\n", d.MaxQP)
		fmt.Fprintf(b, "\tmax_qp_wr:\t\t\t%d\n", d.MaxQPWR)
		fmt.Fprintf(b, "\tmax_sge:\t\t\t%d\n", d.MaxSGE)
		fmt.Fprintf(b, "\tmax_cq:\t\t\t\t%d\n", d.MaxCQ)
		fmt.Fprintf(b, "\tmax_cqe:\t\t\t%d\n", d.MaxCQE)
		fmt.Fprintf(b, "\tmax_mr:\t\t\t\t%d\n", d.MaxMR)
		fmt.Fprintf(b, "\tmax_pd:\t\t\t\t%d\n", d.MaxPD)
		fmt.Fprintf(b, "\tatomic_cap:\t\t\t%s (%d)\n", atomicNames[d.AtomicCap], d.AtomicCap)
		fmt.Fprintf(b, "\tmax_srq:\t\t\t%d\n", d.MaxSRQ)
		if d.MaxSRQ > 0 {
			fmt.Fprintf(b, "\tmax_srq_wr:\t\t\t%d\n", d.MaxSRQWR)
			fmt.Fprintf(b, "\tmax_srq_sge:\t\t\t%d\n", d.MaxSGE)
		}
		fmt.Fprintf(b, "\tmax_inline_data:\t\t%d\n", d.MaxInline)
		fmt.Fprintf(b, "\tmax_msg_sz:\t\t\t0x%x\n", d.MaxMsgSize)
	}
	for _, p := range d.Ports {
		fmt.Fprintf(b, "\t\tport:\t%d\n", p.Num)
		fmt.Fprintf(b, "\t\t\tstate:\t\t\t%s (%d)\n", p.State, p.State)
		fmt.Fprintf(b, "\t\t\tmax_mtu:\t\t%s\n", mtuString(p.MaxMTU))
		fmt.Fprintf(b, "\t\t\tactive_mtu:\t\t%s\n", mtuString(p.ActiveMTU))
		fmt.Fprintf(b, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
		if verbose {
			fmt.Fprintf(b, "\t\t\tmax_msg_sz:\t\t0x%x\n", d.MaxMsgSize)
			fmt.Fprintf(b, "\t\t\tgid_tbl_len:\t\t%d\n", len(p.GIDs))
			for i, g := range p.GIDs {
				fmt.Fprintf(b, "\t\t\tGID[%3d]:\t\t%s\n", i, gidString(g))
			}
			for i, a := range p.Addrs {
				fmt.Fprintf(b, "\t\t\tADDR[%3d]:\t\t%s\n", i, a)
			}
		}
		b.WriteString("\n")
	}
}

// gidString prints an IP as a GID (the 16-byte form in 8 groups), with
// the address itself after it.
func gidString(ip net.IP) string {
	ip16 := ip.To16()
	if ip16 == nil {
		return ip.String()
	}
	var g []string
	for i := 0; i < 16; i += 2 {
		g = append(g, fmt.Sprintf("%02x%02x", ip16[i], ip16[i+1]))
	}
	return strings.Join(g, ":") + ", " + ip.String()
}
