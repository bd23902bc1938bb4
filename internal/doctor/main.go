package doctor

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/internal/cli"
)

// DefaultPeerPort is the first TCP port of the peer tests (perftest's
// default port; the bandwidth test uses the next).
const DefaultPeerPort = 18515

// Summary is the one-line description of rdmakit doctor.
const Summary = "check this host for RDMA and say how to fix what is wrong"

const usage = `usage: rdmakit doctor [--json] [--root DIR] [--peer HOST[:PORT]] [--dev DEV]
       rdmakit doctor --serve-peer [--dev DEV] [--port PORT]

Checks kernel modules, RDMA devices and port states, RoCE v2 GIDs, MTUs,
the memlock limit, the RDMA netns mode, CPU governors, NUMA placement,
hugepages and the firewall; each result is PASS, WARN, FAIL or SKIP with
a one-line fix. Exit status 0 when nothing FAILs, 1 otherwise.

  --json               print the report as JSON
  --root DIR           read /sys and /proc under DIR (a copy of another host's)
  --peer HOST[:PORT]   also measure latency (send_lat, 64 B) and bandwidth
                       (write_bw, 1 MiB, 2 s) to HOST, which runs
                       rdmakit doctor --serve-peer, and compare with the link rate
  --dev DEV            the device for --peer and --serve-peer (default: perf's)
  --serve-peer         be the peer: serve those two tests again and again
                       until SIGINT or SIGTERM
  --port PORT          first of the two TCP ports of the peer tests
                       (default 18515; the second is PORT+1)
`

// Main runs rdmakit doctor with the command line args; o supplies what
// the command's build knows beyond files (Options.PortMTU), and --root
// sets o.Root.
func Main(args []string, o Options) int { return run(args, o, os.Stdout, os.Stderr) }

func run(args []string, o Options, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	asJSON := fl.Bool("json", false, "")
	root := fl.String("root", o.Root, "")
	peer := fl.String("peer", "", "")
	dev := fl.String("dev", "", "")
	serve := fl.Bool("serve-peer", false, "")
	port := fl.Int("port", DefaultPeerPort, "")
	if err := fl.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprint(stdout, usage)
			return cli.ExitOK
		}
		fmt.Fprintf(stderr, "rdmakit doctor: %v\n%s", err, usage)
		return cli.ExitUsage
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "rdmakit doctor: unexpected argument %q\n%s", fl.Arg(0), usage)
		return cli.ExitUsage
	}
	if *port < 1 || *port > 65534 {
		fmt.Fprintf(stderr, "rdmakit doctor: --port %d: want 1..65534\n", *port)
		return cli.ExitUsage
	}
	if *serve {
		if *peer != "" || *asJSON {
			fmt.Fprintf(stderr, "rdmakit doctor: --serve-peer takes only --dev and --port\n")
			return cli.ExitUsage
		}
		if o.ServePeer == nil {
			fmt.Fprintf(stderr, "rdmakit doctor: --serve-peer: not in this build\n")
			return cli.ExitFailure
		}
		return o.ServePeer(*dev, *port)
	}
	if *peer != "" {
		if _, _, err := net.SplitHostPort(*peer); err != nil {
			*peer = net.JoinHostPort(strings.Trim(*peer, "[]"), strconv.Itoa(*port))
		}
		o.PeerAddr, o.PeerDev = *peer, *dev
	}
	if *root != "" && *root != "/" {
		if st, err := os.Stat(*root); err != nil || !st.IsDir() {
			fmt.Fprintf(stderr, "rdmakit doctor: --root %s is not a directory\n", *root)
			return cli.ExitUsage
		}
	}
	o.Root = *root
	rep := Run(o)
	var err error
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rdmakit doctor: %v\n", err)
		return cli.ExitFailure
	}
	if rep.Worst() == Fail {
		return cli.ExitFailure
	}
	return cli.ExitOK
}
