package collperf

// How many local ranks this host can run: --ranks (and -t × -g) starts
// one process per rank, so a count the host cannot hold is refused up
// front, with the reason, instead of starting hundreds of processes that
// fail one by one or time out.

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/internal/sys"
)

const (
	// ranksPerCPU: every rank polls for completions; beyond this many per
	// CPU the ranks mostly wait for a CPU and collectives time out
	// instead of being measured.
	ranksPerCPU = 8
	// rankOverhead is the memory a rank process needs besides its buffers
	// (Go runtime, transports' rings), a generous estimate.
	rankOverhead = 48 << 20
	// fdsPerPeer is the descriptors a rank holds per peer (the
	// connections of its channels, both directions) and fdsBase those it
	// holds anyway.
	fdsPerPeer = 8
	fdsBase    = 64
)

// hostLimits are what bounds the number of local ranks.
type hostLimits struct {
	cpus     int
	memAvail int64  // bytes; 0 if unknown
	nproc    uint64 // RLIMIT_NPROC soft limit; 0 if unknown or unlimited
	nofile   uint64 // RLIMIT_NOFILE soft limit; 0 if unknown or unlimited
}

func readHostLimits() hostLimits {
	h := hostLimits{cpus: runtime.NumCPU()}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
					h.memAvail = kb << 10
				}
			}
		}
		f.Close()
	}
	if nproc, nofile, err := sys.ProcessLimits(); err == nil {
		if nproc != sys.Unlimited {
			h.nproc = nproc
		}
		if nofile != sys.Unlimited {
			h.nofile = nofile
		}
	}
	return h
}

// rankBufferBytes is the memory one rank registers for the run: the send
// and receive buffers of the largest size, for the largest data type.
func rankBufferBytes(n int, p *collPerfFlags) int64 {
	t := collTests[p.name]
	es := 8 // the widest type; -d all includes it
	s, r, _ := t.counts(p.maxBytes, es, n)
	return int64(s+r) * int64(es)
}

// checkRanks returns an error saying why this host cannot run n local
// ranks, or nil.
func checkRanks(n int, p *collPerfFlags) error {
	return checkRanksOn(readHostLimits(), n, p)
}

func checkRanksOn(h hostLimits, n int, p *collPerfFlags) error {
	if lim := ranksPerCPU * max(h.cpus, 1); n > lim {
		return fmt.Errorf("%d local ranks on %d CPUs: each rank is a process that polls for completions, and beyond %d per CPU (%d here) collectives time out instead of being measured; use fewer ranks or a launcher across hosts (mpirun, srun, torchrun)",
			n, h.cpus, ranksPerCPU, lim)
	}
	if h.nproc > 0 && uint64(n) >= h.nproc {
		return fmt.Errorf("%d local ranks: the process limit (ulimit -u) is %d", n, h.nproc)
	}
	if need := uint64(fdsBase + fdsPerPeer*(n-1)); h.nofile > 0 && need > h.nofile {
		return fmt.Errorf("%d local ranks: each rank needs about %d file descriptors (connections to %d peers) and the limit (ulimit -n) is %d", n, need, n-1, h.nofile)
	}
	if h.memAvail > 0 {
		per := rankBufferBytes(n, p) + rankOverhead
		if need := per * int64(n); need > h.memAvail {
			return fmt.Errorf("%d local ranks with -e %d need about %d MiB (%d MiB each: buffers and runtime) and %d MiB are available; lower -e or the number of ranks",
				n, p.maxBytes, need>>20, per>>20, h.memAvail>>20)
		}
	}
	return nil
}
