package doctor

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/rdmakit/rdmakit/internal/cli"
)

// Summary is the one-line description of rdmakit doctor.
const Summary = "check this host for RDMA and say how to fix what is wrong"

const usage = `usage: rdmakit doctor [--json] [--root DIR]

Checks kernel modules, RDMA devices and port states, RoCE v2 GIDs, MTUs,
the memlock limit, the RDMA netns mode, CPU governors, NUMA placement,
hugepages and the firewall; each result is PASS, WARN, FAIL or SKIP with
a one-line fix. Exit status 0 when nothing FAILs, 1 otherwise.

  --json       print the report as JSON
  --root DIR   read /sys and /proc under DIR (a copy of another host's)
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
