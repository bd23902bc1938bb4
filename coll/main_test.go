package coll

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/reexec"
)

// The test binary doubles as a rank process: the parent test starts it
// in the role "coll-rank" (internal/reexec) with the scenario as its
// argument and the rank in coll's own launcher variables
// (RDMAKIT_COLL_ID, RDMAKIT_COLL_RANK, RDMAKIT_COLL_NRANKS).
func init() {
	reexec.Register("coll-rank", func(args []string) int { return childMain(args[0]) })
}

// Exit codes of a rank process.
const (
	exitOK       = 0
	exitFailed   = 1
	exitPeerLost = 3 // the collective failed because another rank died
)

func TestMain(m *testing.M) {
	reexec.Init()
	code := m.Run()
	if code == 0 {
		// Transports keep short-lived goroutines for a moment after
		// Close; give them time before looking for leaks.
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func childMain(scenarioName string) int {
	ctx := context.Background()
	c, err := InitFromEnv(ctx, &Options{Timeout: 30 * time.Second, BootstrapTimeout: 30 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return exitFailed
	}
	defer c.Close()
	switch scenarioName {
	case "matrix":
		sc := scenario{kinds: allKinds, types: []DataType{Uint8, Float16, Int32, Float64}, ops: []RedOp{Sum, Prod, Max, Avg},
			counts: []int{1, 3, 1001}, algos: []Algorithm{AlgoRing, AlgoTree, AlgoDirect}, roots: []int{0, 3}}
		if err := exercise(ctx, c, sc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return exitFailed
		}
		return exitOK
	case "bind":
		// RDMAKIT_COLL_BIND=core: this rank's process runs on one CPU
		// only (the parent compares the ranks' CPUs).
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return exitFailed
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
				fmt.Println("cpus", strings.TrimSpace(v))
			}
		}
		fmt.Println("gomaxprocs", runtime.GOMAXPROCS(0))
		buf, _ := c.Alloc(64)
		if err := c.AllReduce(ctx, buf, buf, Float32, Sum); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return exitFailed
		}
		return exitOK
	case "killloop":
		// All-reduce until something breaks; the parent kills one rank.
		buf, _ := c.Alloc(64 << 10)
		c.opts.Timeout, _ = time.ParseDuration(os.Getenv("KILL_TIMEOUT"))
		fmt.Println("ready")
		for i := 0; ; i++ {
			if err := c.AllReduce(ctx, buf, buf, Float32, Sum); err != nil {
				fmt.Fprintf(os.Stderr, "rank %d after %d all-reduces: %v\n", c.Rank(), i, err)
				if errors.Is(err, ErrPeerLost) || errors.Is(err, ErrAborted) || errors.Is(err, ErrTimeout) {
					return exitPeerLost
				}
				return exitFailed
			}
		}
	}
	fmt.Fprintln(os.Stderr, "unknown scenario", scenarioName)
	return exitFailed
}

type rankProc struct {
	cmd    *exec.Cmd
	out    syncBuffer
	stderr syncBuffer
	done   chan struct{}
}

// syncBuffer is a bytes.Buffer the exec copier writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// spawnRanks starts n rank processes running scenario; this process serves
// the rendezvous.
func spawnRanks(t *testing.T, n int, scenario string, env ...string) []*rankProc {
	t.Helper()
	id, err := GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	procs := make([]*rankProc, n)
	for r := range procs {
		p := &rankProc{done: make(chan struct{})}
		p.cmd = reexec.Command("coll-rank", []string{scenario}, append([]string{EnvID + "=" + id.String(),
			EnvRank + "=" + strconv.Itoa(r), EnvNRanks + "=" + strconv.Itoa(n)}, env...)...)
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.stderr
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.cmd.Wait(); close(p.done) }()
		procs[r] = p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			<-p.done
		}
	})
	return procs
}

func waitRanks(t *testing.T, procs []*rankProc, limit time.Duration) []int {
	t.Helper()
	codes := make([]int, len(procs))
	deadline := time.After(limit)
	for r, p := range procs {
		select {
		case <-p.done:
			codes[r] = p.cmd.ProcessState.ExitCode()
		case <-deadline:
			for q, p := range procs {
				t.Logf("rank %d stderr:\n%s", q, p.stderr.String())
			}
			t.Fatalf("rank %d still running after %v", r, limit)
		}
	}
	return codes
}

// TestMultiProcess runs a lean matrix with 4 and 5 rank processes (more
// ranks than cores: it exercises the yielding waits too).
func TestMultiProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process matrix in -short mode")
	}
	for _, n := range []int{4, 5} {
		t.Run(fmt.Sprintf("n%d", n), func(t *testing.T) {
			procs := spawnRanks(t, n, "matrix", EnvChunk+"=8192", EnvSlots+"=4")
			for r, code := range waitRanks(t, procs, 90*time.Second) {
				if code != exitOK {
					t.Errorf("rank %d exited %d:\n%s", r, code, procs[r].stderr.String())
				}
			}
		})
	}
}

// TestBindCore: with RDMAKIT_COLL_BIND=core two rank processes (no more
// than the CPUs here) end up on one CPU each, different ones.
func TestBindCore(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding to cores is Linux only (sched_setaffinity)")
	}
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs to tell two ranks' CPUs apart")
	}
	testBind(t, 2)
}

// TestBindCoreOversubscribed: with more ranks than CPUs each rank is still
// pinned to one CPU, round robin (k mod the CPUs): every CPU gets ranks.
// (Before, nothing was pinned, and the OS often left three of four
// polling ranks on one CPU of two.)
func TestBindCoreOversubscribed(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("binding to cores is Linux only (sched_setaffinity)")
	}
	n := runtime.NumCPU() + 1
	if n > 9 {
		t.Skipf("%d CPUs: %d rank processes would be too many for a unit test", n-1, n)
	}
	testBind(t, n)
}

// testBind starts n ranks with RDMAKIT_COLL_BIND=core and checks that
// each runs on one CPU with one P, and that they cover min(n, CPUs)
// CPUs.
func testBind(t *testing.T, n int) {
	procs := spawnRanks(t, n, "bind", EnvBind+"=core")
	seen := map[string]int{}
	for r, code := range waitRanks(t, procs, 60*time.Second) {
		if code != exitOK {
			t.Fatalf("rank %d exited %d:\n%s", r, code, procs[r].stderr.String())
		}
		var cpus, procsN string
		for _, l := range strings.Split(procs[r].out.String(), "\n") {
			if v, ok := strings.CutPrefix(l, "cpus "); ok {
				cpus = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(l, "gomaxprocs "); ok {
				procsN = strings.TrimSpace(v)
			}
		}
		if _, err := strconv.Atoi(cpus); err != nil {
			t.Errorf("rank %d may run on CPUs %q, want one", r, cpus)
		}
		// One CPU, one P (unless GOMAXPROCS is set: then it stays).
		if os.Getenv("GOMAXPROCS") == "" && procsN != "1" {
			t.Errorf("rank %d runs with GOMAXPROCS %q on one CPU, want 1", r, procsN)
		}
		t.Logf("rank %d: CPUs %s, GOMAXPROCS %s", r, cpus, procsN)
		seen[cpus]++
	}
	if want := min(n, runtime.NumCPU()); len(seen) != want {
		t.Errorf("%d ranks on %d CPUs, want %d: %v", n, len(seen), want, seen)
	}
	for cpu, k := range seen {
		if k > (n+len(seen)-1)/len(seen) {
			t.Errorf("%d of %d ranks on CPU %s: not round robin (%v)", k, n, cpu, seen)
		}
	}
}

// TestKilledRank kills one rank process in the middle of a stream of
// all-reduces: every other rank must fail with an error, promptly.
func TestKilledRank(t *testing.T) {
	const n = 3
	procs := spawnRanks(t, n, "killloop", "KILL_TIMEOUT=20s")
	// Wait until they all run.
	deadline := time.Now().Add(30 * time.Second)
	for r := 0; r < n; r++ {
		for !strings.Contains(procs[r].out.String(), "ready") {
			if time.Now().After(deadline) {
				t.Fatalf("rank %d never got ready: %s", r, procs[r].stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	procs[1].cmd.Process.Kill()
	<-procs[1].done
	for _, r := range []int{0, 2} {
		select {
		case <-procs[r].done:
		case <-time.After(15 * time.Second):
			t.Fatalf("rank %d did not notice rank 1's death within 15s", r)
		}
		if code := procs[r].cmd.ProcessState.ExitCode(); code != exitPeerLost {
			t.Errorf("rank %d exited %d, want %d:\n%s", r, code, exitPeerLost, procs[r].stderr.String())
		}
	}
	t.Logf("others failed %v after the kill: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(procs[0].stderr.String()))
}
