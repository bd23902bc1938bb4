package main

// RDMAKIT_CPUPROFILE=FILE writes a CPU profile of the whole command to
// FILE (go tool pprof reads it): how to see where a benchmark's time goes
// on a machine where only the binary is at hand, such as the test VM.

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startProfile starts the CPU profile RDMAKIT_CPUPROFILE asks for and
// returns what stops it.
func startProfile() (stop func()) {
	path := os.Getenv("RDMAKIT_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err == nil {
		err = pprof.StartCPUProfile(f)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit: RDMAKIT_CPUPROFILE: %v\n", err)
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
