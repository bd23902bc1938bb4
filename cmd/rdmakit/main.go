// Command rdmakit is the RDMA toolbox: perftest-compatible benchmarks
// (perf), nccl-tests-compatible collective benchmarks (coll-perf), device
// listing (info) and more, on every rdmakit transport.
//
// Each subcommand lives in its own file and registers itself in init().
//
// The binary also answers to the names of the programs it replaces:
// `rdmakit ib_write_bw ...` is `rdmakit perf write_bw ...` and
// `rdmakit all_reduce_perf ...` is `rdmakit coll-perf all_reduce ...`;
// invoked under such a name (a symlink ib_write_bw -> rdmakit), it runs
// that program (argv[0] dispatch).
//
// Exit status, in every subcommand: 0 success (and help, which goes to
// stdout), 1 a runtime failure, 2 a usage error, 128+N killed by signal N
// (130 for SIGINT, 143 for SIGTERM).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/collperf"
	"github.com/rdmakit/rdmakit/internal/perftest"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/internal/stats"

	_ "github.com/rdmakit/rdmakit/transport/shm"
)

// command is one subcommand. run gets the arguments after the subcommand
// name and returns the process exit status.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

func register(name, summary string, run func(args []string) int) {
	if _, dup := commands[name]; dup {
		panic("rdmakit: command registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func usage(w *os.File) {
	fmt.Fprintf(w, "usage: rdmakit COMMAND [flags] [args]\n\ncommands:\n")
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-12s %s\n", "help", "print a command's help: rdmakit help COMMAND")
	fmt.Fprintf(w, `
aliases (also as the program name, e.g. a symlink ib_write_bw -> rdmakit):
  ib_{send,write,read,atomic}_{bw,lat}          rdmakit perf TEST
  {all_reduce,all_gather,reduce_scatter,alltoall,broadcast,reduce,sendrecv}_perf
                                                rdmakit coll-perf COLLECTIVE

flags: -h, --help (this text); --version
run 'rdmakit help COMMAND' or 'rdmakit COMMAND -h' for a command's flags
`)
}

// version returns the version line.
func version() string { return cli.Version() }

// The children rdmakit starts of itself (perf --loopback's server,
// coll-perf --ranks's ranks) run in the role "rdmakit": a command line of
// this program (internal/reexec). They are always started with an
// explicit command, so the role does no argv[0] dispatch.
func init() { reexec.Register("rdmakit", run) }

func main() {
	reexec.Init()
	stop := startProfile()
	code := runAs(os.Args[0], os.Args[1:])
	stop()
	if err := stats.Flush(); err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit: %s: %v (last counters not written)\n", stats.EnvDir, err)
	}
	os.Exit(code)
}

// runAs runs the command line args of a program invoked as argv0: under
// the name of a perftest or nccl-tests binary it is that program,
// otherwise rdmakit.
func runAs(argv0 string, args []string) int {
	if cmd, ok := alias(filepath.Base(argv0)); ok {
		return run(append(cmd, args...))
	}
	return run(args)
}

// alias maps the name of a perftest or nccl-tests program to the rdmakit
// command line that runs it: ib_write_bw -> perf write_bw,
// all_reduce_perf -> coll-perf all_reduce.
func alias(name string) ([]string, bool) {
	if name == "rdmakit-cni" {
		return []string{"cni"}, true
	}
	if strings.HasPrefix(name, "ib_") {
		if _, err := perftest.ParseTest(name); err == nil {
			return []string{"perf", name}, true
		}
	}
	if strings.HasSuffix(name, "_perf") && collperf.IsCollective(strings.TrimSuffix(name, "_perf")) {
		return []string{"coll-perf", strings.TrimSuffix(name, "_perf")}, true
	}
	return nil, false
}

// hasVersion reports whether args ask for the version (--version before
// any "--").
func hasVersion(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--version" {
			return true
		}
	}
	return false
}

// run runs the command line args (without the program name) and returns
// the exit status.
func run(args []string) int {
	if len(args) < 1 {
		usage(os.Stderr)
		return 2
	}
	switch args[0] {
	case "-h", "--help":
		usage(os.Stdout)
		return 0
	case "--version", "version":
		fmt.Println(version())
		return 0
	case "help":
		if len(args) == 1 {
			usage(os.Stdout)
			return 0
		}
		name := args[1]
		if cmd, ok := alias(name); ok {
			name = cmd[0]
		}
		c, ok := commands[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "rdmakit help: unknown command %q\n", args[1])
			usage(os.Stderr)
			return 2
		}
		return c.run([]string{"-h"})
	}
	if cmd, ok := alias(args[0]); ok {
		args = append(cmd, args[1:]...)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "rdmakit: unknown command %q\n", args[0])
		usage(os.Stderr)
		return 2
	}
	if hasVersion(args[1:]) {
		fmt.Println(version())
		return 0
	}
	return c.run(args[1:])
}
