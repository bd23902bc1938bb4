package deviceplugin

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sort"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// Summary is the one-line description of rdmakit device-plugin.
const Summary = "Kubernetes device plugin: advertise RDMA devices to the kubelet"

// DefaultConfig is where the DaemonSet mounts the configuration.
const DefaultConfig = "/etc/rdmakit/device-plugin.json"

const usage = `usage: rdmakit device-plugin [--config FILE] [--plugin-dir DIR] [--root DIR] [--interval D] [--check]

Advertises this host's RDMA devices to the kubelet (device-plugin API
v1beta1) as the extended resources the configuration names, hands each
container its /dev/infiniband nodes (uverbs, umad, issm, rdma_cm) and
RDMAKIT_RDMA_DEVICES, RDMAKIT_COLL_HCA and NCCL_IB_HCA, and marks devices
unhealthy while a port is down. Re-registers when the kubelet restarts;
stops on SIGTERM or SIGINT.

  --config FILE      JSON configuration (default ` + DefaultConfig + `)
  --plugin-dir DIR   the kubelet's device-plugin directory
                     (default /var/lib/kubelet/device-plugins)
  --root DIR         read /sys and /dev under DIR
  --interval D       rescan period (default: the config's
                     periodicUpdateInterval, else 5s)
  --check            print what each resource would select and exit
`

// Main runs rdmakit device-plugin with the command line args.
func Main(args []string) int { return run(args, os.Stdout, os.Stderr) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("device-plugin", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	cfgPath := fl.String("config", DefaultConfig, "")
	dir := fl.String("plugin-dir", "", "")
	root := fl.String("root", "", "")
	interval := fl.Duration("interval", 0, "")
	check := fl.Bool("check", false, "")
	if err := fl.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprint(stdout, usage)
			return cli.ExitOK
		}
		fmt.Fprintf(stderr, "rdmakit device-plugin: %v\n%s", err, usage)
		return cli.ExitUsage
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "rdmakit device-plugin: unexpected argument %q\n%s", fl.Arg(0), usage)
		return cli.ExitUsage
	}
	if *interval < 0 {
		fmt.Fprintf(stderr, "rdmakit device-plugin: --interval %v is negative\n", *interval)
		return cli.ExitUsage
	}
	data, err := os.ReadFile(*cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "rdmakit device-plugin: %v\n", err)
		return cli.ExitUsage
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		fmt.Fprintf(stderr, "rdmakit device-plugin: %s: %v\n", *cfgPath, err)
		return cli.ExitUsage
	}
	lg := log.New(stderr, "rdmakit device-plugin: ", log.LstdFlags)
	if *check {
		return report(stdout, stderr, *root, cfg)
	}
	sig := cli.NotifySignals(context.Background())
	defer sig.Stop()
	err = Run(sig, Options{Root: *root, Dir: *dir, Config: cfg, Interval: *interval, Logf: lg.Printf})
	if err != nil {
		lg.Printf("%v", err)
		return cli.ExitFailure
	}
	// A clean stop on SIGTERM (a DaemonSet pod's deletion) exits 143,
	// the CLI's rule for every command.
	return sig.Status()
}

// report prints each resource's selection and allocation (--check).
func report(stdout, stderr io.Writer, root string, cfg Config) int {
	devs, err := Discover(rdmafs.FS{Root: root})
	if err != nil {
		fmt.Fprintf(stderr, "rdmakit device-plugin: %v\n", err)
		return cli.ExitFailure
	}
	for _, d := range devs {
		state := "healthy"
		if !d.Healthy {
			state = "unhealthy: " + d.Why
		}
		fmt.Fprintf(stdout, "device %s driver=%s pci=%s vendor=%s device=%s pcidriver=%s vf=%v numa=%d link=%s netdevs=%v chardevs=%v rdma_cm=%v %s\n",
			d.Name, d.Driver, d.PCI.Addr, d.PCI.Vendor, d.PCI.Device, d.PCI.Driver, d.PCI.VF(), d.NUMANode, d.LinkLayer, d.Netdevs, d.Chars.All(), d.RdmaCM, state)
	}
	for _, rc := range cfg.ConfigList {
		r := newResource(rc)
		r.setDevices(devs)
		sel, _ := r.snapshot()
		kd := r.kubeDevices(sel)
		fmt.Fprintf(stdout, "resource %s mode=%s devices=%d", rc.FullName(), rc.Mode, len(kd))
		for _, d := range sel {
			fmt.Fprintf(stdout, " %s", d.Name)
		}
		fmt.Fprintln(stdout)
		if len(kd) == 0 {
			continue
		}
		ids := []string{kd[0].ID}
		got, err := r.pick(sel, ids)
		if err != nil {
			fmt.Fprintf(stdout, "  allocate %v: %v\n", ids, err)
			continue
		}
		resp := r.containerResponse(got)
		for _, s := range resp.Devices {
			fmt.Fprintf(stdout, "  allocate %s: device %s\n", ids[0], s.HostPath)
		}
		for _, k := range sortedKeys(resp.Envs) {
			fmt.Fprintf(stdout, "  allocate %s: env %s=%s\n", ids[0], k, resp.Envs[k])
		}
	}
	return cli.ExitOK
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
