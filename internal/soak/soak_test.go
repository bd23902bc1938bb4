package soak

// TestSoak runs the soak on tcp0 and shm0 (the coordinator in the test's
// goroutine, the peers as re-executed test binaries); test/soak.sh runs it
// for as long as asked.

import (
	"flag"
	"os"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

var (
	flagDuration = flag.Duration("soak.duration", 0, "fault phase per device (default 12s; 4s with -short)")
	flagPeers    = flag.Int("soak.peers", 3, "peer processes")
	flagDevices  = flag.String("soak.device", "tcp0,shm0", "devices, comma-separated")
	flagSeed     = flag.Int64("soak.seed", 1, "seed of the fault schedule (0: time-based)")
)

func TestMain(m *testing.M) {
	reexec.Init()
	os.Exit(m.Run())
}

func TestSoak(t *testing.T) {
	d := *flagDuration
	if d == 0 {
		d = 12 * time.Second
		if testing.Short() {
			d = 4 * time.Second
		}
	}
	seed := *flagSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	for _, dev := range splitComma(*flagDevices) {
		t.Run(dev, func(t *testing.T) {
			t.Logf("seed %d, %d peers, %v", seed, *flagPeers, d)
			res, err := Run(Config{Device: dev, Peers: *flagPeers, Duration: d, Seed: seed, Faults: true, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("epochs %d (verified %d, target lost %d, initiator lost %d), blocks checked %d; writes %d, reads %d, atomics %d, error completions %d; kills %d, stalls %d, network faults %d, rotations %d",
				res.Epochs, res.Verified, res.Unverified, res.SrcLost, res.Blocks, res.Writes, res.Reads, res.Atomics, res.Errors, res.Kills, res.Stalls, res.NetFaults, res.Rotations)
			for i, m := range res.Mark {
				t.Logf("peer %d: mark %+v end %+v", i, m, res.End[i])
			}
			if res.Writes == 0 || res.Blocks == 0 {
				t.Errorf("no traffic checked")
			}
			for _, v := range res.Violations {
				t.Error(v)
			}
		})
	}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// TestSoakSeesCorruption checks the checker: one flipped byte in a
// target's memory must be reported.
func TestSoakSeesCorruption(t *testing.T) {
	for _, dev := range splitComma(*flagDevices) {
		t.Run(dev, func(t *testing.T) {
			res, err := Run(Config{Device: dev, Peers: 2, Duration: 300 * time.Millisecond, Seed: 1, Sabotage: true, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Violations) == 0 {
				t.Fatal("a corrupted block went unnoticed")
			}
			t.Logf("reported as it should: %s", res.Violations[0])
		})
	}
}
