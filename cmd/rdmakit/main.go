// Command rdmakit is the RDMA toolbox: perftest-compatible benchmarks
// (perf), nccl-tests-compatible collective benchmarks (coll-perf), device
// listing (info) and more, on every rdmakit transport.
//
// Each subcommand lives in its own file and registers itself in init().
package main

import (
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"os"
	"sort"

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

func usage() {
	fmt.Fprintf(os.Stderr, "usage: rdmakit COMMAND [flags] [args]\n\ncommands:\n")
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(os.Stderr, "\nrun 'rdmakit COMMAND -h' for a command's flags\n")
}

// The children rdmakit starts of itself (perf --loopback's server,
// coll-perf --ranks's ranks) run in the role "rdmakit": a command line of
// this program (internal/reexec).
func init() { reexec.Register("rdmakit", run) }

func main() {
	reexec.Init()
	os.Exit(run(os.Args[1:]))
}

// run runs the command line args (without the program name) and returns
// the exit status.
func run(args []string) int {
	if len(args) < 1 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) < 1 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(os.Stderr, "rdmakit: unknown command %q\n", args[0])
		usage()
		return 2
	}
	return c.run(args[1:])
}
