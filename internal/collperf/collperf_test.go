package collperf

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/coll"
	"github.com/rdmakit/rdmakit/internal/reexec"
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

// TestJSONOutput: -J FILE.json writes nccl-tests' JSON report (file
// version 3: config, devices, one record per size with out_of_place and
// in_place figures, the summary); an existing file is kept and FILE.json.0
// written instead, as nccl-tests does.
func TestJSONOutput(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	os.WriteFile(path, []byte("keep"), 0o644)
	out, errOut, code := collPerf(t, "all_reduce", "--ranks", "2", "-b", "1K", "-e", "4K", "-f", "2", "-n", "2", "-J", path, "-S", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "# Writing JSON output to "+path+".0\n") || !strings.Contains(out, "timestamp\n") {
		t.Errorf("output:\n%s", out)
	}
	if b, _ := os.ReadFile(path); string(b) != "keep" {
		t.Errorf("existing file overwritten: %q", b)
	}
	b, err := os.ReadFile(path + ".0")
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Version int `json:"version"`
		Config  struct {
			MinimumBytes int  `json:"minimum_bytes"`
			StepFactor   *int `json:"step_factor"`
			WarmupIters  int  `json:"warmup_iters"`
		} `json:"config"`
		Devices []struct {
			Rank int `json:"rank"`
		} `json:"devices"`
		Results []struct {
			Size       int                `json:"size"`
			Root       string             `json:"root"`
			OutOfPlace map[string]float64 `json:"out_of_place"`
			InPlace    map[string]float64 `json:"in_place"`
		} `json:"results"`
		OutOfBounds struct {
			Count int  `json:"count"`
			Okay  bool `json:"okay"`
		} `json:"out_of_bounds"`
		AvgBusBW struct {
			Bandwidth float64 `json:"bandwidth"`
			Okay      string  `json:"okay"`
		} `json:"average_bus_bandwidth"`
		EndTime string `json:"end_time"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if r.Version != 3 || r.Config.MinimumBytes != 1024 || r.Config.StepFactor == nil || *r.Config.StepFactor != 2 ||
		r.Config.WarmupIters != 1 || len(r.Devices) != 2 || len(r.Results) != 3 || !r.OutOfBounds.Okay ||
		r.AvgBusBW.Okay != "unchecked" || r.AvgBusBW.Bandwidth <= 0 || r.EndTime == "" {
		t.Errorf("report %+v", r)
	}
	for i, res := range r.Results {
		if res.Size != 1024<<i || res.Root != "    -1" || res.OutOfPlace["time"] <= 0 || res.InPlace["bus_bw"] <= 0 {
			t.Errorf("result %d: %+v", i, res)
		}
		if _, ok := res.OutOfPlace["nwrong"]; !ok {
			t.Errorf("result %d: no nwrong", i)
		}
	}
}
