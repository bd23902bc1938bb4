package main

// RDMAKIT_CPUPROFILE=FILE writes a CPU profile of the whole command to
// FILE (go tool pprof reads it), and RDMAKIT_TRACE=FILE an execution
// trace (go tool trace reads it; -pprof=sched shows where goroutines
// waited to run): how to see where a benchmark's time goes on a machine
// where only the binary is at hand, such as the test VM. A server child
// of --loopback inherits the environment: set them per process.

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// startProfile starts the CPU profile and the execution trace that
// RDMAKIT_CPUPROFILE and RDMAKIT_TRACE ask for and returns what stops
// them.
func startProfile() (stop func()) {
	var stops []func()
	if path := os.Getenv("RDMAKIT_CPUPROFILE"); path != "" {
		stops = startOne("RDMAKIT_CPUPROFILE", path, pprof.StartCPUProfile, pprof.StopCPUProfile, stops)
	}
	if path := os.Getenv("RDMAKIT_TRACE"); path != "" {
		stops = startOne("RDMAKIT_TRACE", path, trace.Start, trace.Stop, stops)
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// startOne creates path, starts a profile writing to it and adds what
// stops it to stops; a failure is reported and leaves stops as it was.
func startOne(env, path string, start func(w io.Writer) error, stop func(), stops []func()) []func() {
	f, err := os.Create(path)
	if err == nil {
		if err = start(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit: %s: %v\n", env, err)
		return stops
	}
	return append(stops, func() {
		stop()
		f.Close()
	})
}
