package collperf

import (
	"bytes"
	"context"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/coll"
)

// The test binary acts as rdmakit coll-perf (and as its rank processes)
// in the role "rdmakit", as cmd/rdmakit does.
func init() {
	reexec.Register("rdmakit", func(args []string) int {
		if len(args) > 0 && args[0] == "coll-perf" {
			args = args[1:]
		}
		return Main(args)
	})
}

func TestMain(m *testing.M) {
	reexec.Init()
	os.Exit(m.Run())
}

func collPerf(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := reexec.Command("rdmakit", append([]string{"coll-perf"}, args...))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("coll-perf %q hung", args)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// rows checks the table of a coll-perf output and returns its rows.
func rows(t *testing.T, out string) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 13 {
			t.Errorf("row %q has %d fields", l, len(f))
			continue
		}
		if f[8] != "0" || f[12] != "0" {
			t.Errorf("wrong elements: %q", l)
		}
		n++
	}
	for _, want := range []string{"# Out of bounds values : 0 OK", "# Avg bus bandwidth    : ", "# Collective test concluded: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	return n
}

// TestRunGoroutineRanks runs every test in one process, ranks as
// goroutines with their own communicators.
func TestRunGoroutineRanks(t *testing.T) {
	for _, name := range []string{"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"} {
		t.Run(name, func(t *testing.T) {
			id, err := coll.GetUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			const n = 3
			p := defaultFlags()
			p.minBytes, p.maxBytes, p.stepFactor, p.iters, p.warmup, p.root = 1024, 64<<10, 8, 2, 1, -1
			opts := coll.Options{Timeout: 20 * time.Second, BootstrapTimeout: 20 * time.Second, Transport: "shm"}
			var wg sync.WaitGroup
			codes := make([]int, n)
			var out bytes.Buffer
			for r := 0; r < n; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := coll.NewComm(context.Background(), id, n, r, &opts)
					if err != nil {
						t.Error(err)
						codes[r] = -1
						return
					}
					defer c.Close()
					w := &bytes.Buffer{}
					if r == 0 {
						w = &out
					}
					codes[r] = collRun(context.Background(), c, collTests[name], &p, w)
				}()
			}
			wg.Wait()
			for r, code := range codes {
				if code != 0 {
					t.Errorf("rank %d: exit %d", r, code)
				}
			}
			roots := 1
			if collTests[name].rooted {
				roots = n
			}
			if got := rows(t, out.String()); got != 3*roots {
				t.Errorf("%d rows, want %d:\n%s", got, 3*roots, out.String())
			}
			if !strings.Contains(out.String(), "#  Rank  2 Group  0 Pid ") || !strings.Contains(out.String(), " device shm0 [shm port 1] rdmakit coll\n") {
				t.Errorf("rank lines:\n%s", out.String())
			}
		})
	}
}

func TestMainRanks(t *testing.T) {
	out, errOut, code := collPerf(t, "all_reduce", "-b", "8", "-e", "64K", "-f", "64", "-n", "2", "--ranks", "2", "--transport", "tcp")
	if code != 0 {
		t.Fatalf("exit %d:\n%s\n%s", code, out, errOut)
	}
	if got := rows(t, out); got != 3 {
		t.Errorf("%d rows, want 3:\n%s", got, out)
	}
	if !strings.Contains(out, " device tcp0 [tcp port 1] rdmakit coll\n") {
		t.Errorf("rank lines:\n%s", out)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{"all_reduce_nope"},
		{"all_reduce", "-b", "2M", "-e", "1M"},
		{"all_reduce", "--transport", "carrier-pigeon"},
		{"all_reduce", "--gid-index", "x"},
		{"all_reduce", "--hca", "mlx5_0:x"},
	} {
		if _, errOut, code := collPerf(t, args...); code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errOut)
		}
	}
}

func TestForcedIBVerbsWithoutDevice(t *testing.T) {
	// No RDMA device here (or no ibverbs transport linked): forcing it
	// fails every rank with a reason.
	_, errOut, code := collPerf(t, "all_reduce", "-b", "8", "-e", "8", "-n", "1", "--ranks", "2", "--transport", "ibverbs", "--hca", "=nosuch_dev")
	if code != 1 || !strings.Contains(errOut, "ibverbs") {
		t.Errorf("exit %d, stderr:\n%s", code, errOut)
	}
}

func TestNCCLFloat(t *testing.T) {
	for _, tc := range []struct {
		v     float64
		width int
		want  string
	}{{12.3456, 7, "  12.35"}, {123456.7, 7, " 123457"}, {0.001, 6, "  0.00"}, {1234.5, 6, "1234.5"}, {12345678, 7, "1.2e+07"}} {
		if got := ncclFloatStr(tc.v, tc.width); got != tc.want {
			t.Errorf("%v/%d: %q want %q", tc.v, tc.width, got, tc.want)
		}
	}
}
