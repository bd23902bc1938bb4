// Command rdmakit is the RDMA toolbox: perftest-compatible benchmarks
// (perf), nccl-tests-compatible collective benchmarks (coll-perf), device
// listing (info) and more, on every rdmakit transport.
//
// Each subcommand lives in its own file and registers itself in init().
package main

import (
	"fmt"
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

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "rdmakit: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(c.run(os.Args[2:]))
}
