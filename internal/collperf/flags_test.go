package collperf

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// Every nccl-tests flag, short and long, lands where it should.
func TestParseFlagsNCCLTests(t *testing.T) {
	short := []string{"all_reduce", "-t", "1", "-g", "2", "-b", "8", "-e", "128M", "-i", "4K", "-f", "2", "-n", "7", "-m", "3",
		"-w", "0", "-N", "4", "-p", "1", "-c", "0", "-o", "max", "-d", "int32", "-r", "1", "-z", "1", "-y", "1", "-T", "30",
		"-G", "2", "-C", "1", "-a", "2", "-J", "out.json", "-S", "1", "-R", "1", "-x", "0", "-D", "0", "-V", "16", "-M", "1",
		"-u", "0", "-I", "1", "-K", "2"}
	long := []string{"--nthreads=1", "--ngpus", "2", "--minbytes=8", "--maxbytes", "128M", "--stepbytes=4K", "--stepfactor", "2",
		"--iters=7", "--agg_iters=3", "--warmup_iters=0", "--run_cycles=4", "--parallel_init=1", "--check=0", "--op=max",
		"--datatype=int32", "--root=1", "--blocking=1", "--stream_null=1", "--timeout=30", "--cudagraph=2",
		"--report_cputime=1", "--average=2", "--output_file=out.json", "--report_timestamps=1", "--local_register=1",
		"--cta_policy=0", "--device_implementation=0", "--device_cta_count=16", "--memory=1", "--unalign=0",
		"--per_iter_timing=1", "--per_iter_skip=2", "all_reduce"}
	glued := []string{"all_reduce_perf", "-t1", "-g2", "-b8", "-e128M", "-i4K", "-f2", "-n7", "-m3", "-w0", "-N4", "-p1", "-c0",
		"-omax", "-dint32", "-r1", "-z1", "-y1", "-T30", "-G2", "-C1", "-a2", "-Jout.json", "-S1", "-R1", "-x0", "-D0", "-V16",
		"-M1", "-u0", "-I1", "-K2"}
	for _, args := range [][]string{short, long, glued} {
		p, err := parseFlags(args)
		if err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		if p.name != "all_reduce" || p.nThreads != 1 || p.nGpus != 2 || p.minBytes != 8 || p.maxBytes != 128<<20 || p.stepBytes != 4096 ||
			p.stepFactor != 2 || p.iters != 7 || p.aggIters != 3 || p.warmup != 0 || p.runCycles != 4 || p.parallelInit != 1 ||
			p.check != 0 || p.ops != "max" || p.types != "int32" || p.root != 1 || p.blocking != 1 || p.streamNull != 1 ||
			p.timeout != 30*time.Second || p.opts.Timeout != 30*time.Second || p.cudaGraph != 2 || p.cpuTime != 1 ||
			p.average != 2 || p.outFile != "out.json" || p.timestamps != 1 || p.csv != "" {
			t.Errorf("%q: parsed %+v", args, p)
		}
		// -G, -y, -R, -x, -M, -I and -K (off their defaults) cannot apply: one
		// note each, one line (-x 0 too: its default is -1); -D, -V and -u at
		// their defaults say nothing.
		want := map[string]bool{"-G": true, "-y": true, "-R": true, "-x": true, "-M": true, "-I": true, "-K": true}
		for _, n := range p.notes {
			f, _, _ := strings.Cut(n, " ")
			if !want[f] || strings.Contains(n, "\n") {
				t.Errorf("%q: note %q: want one line about one of -G -y -R -x -M -I -K", args, n)
			}
			delete(want, f)
		}
		if len(want) != 0 {
			t.Errorf("%q: no note for %v (notes %q)", args, want, p.notes)
		}
	}
}

// nccl-tests' defaults (common.cu).
func TestParseFlagsDefaults(t *testing.T) {
	p, err := parseFlags([]string{"broadcast"})
	if err != nil {
		t.Fatal(err)
	}
	if p.minBytes != 32<<20 || p.maxBytes != 32<<20 || p.stepBytes != 1<<20 || p.stepFactor != 1 || p.iters != 20 ||
		p.warmup != 1 || p.aggIters != 1 || p.runCycles != 1 || p.check != 1 || p.average != 1 || p.root != 0 ||
		p.ops != "sum" || p.types != "float" || p.nThreads != 1 || p.nGpus != 1 || p.blocking != 0 || p.timeout != 0 ||
		p.cudaGraph != 0 || p.cpuTime != 0 || p.csv != "" || p.outFile != "" || p.timestamps != 0 || len(p.notes) != 0 {
		t.Errorf("defaults: %+v", p)
	}
	// rdmakit's own long flags, with two dashes or one.
	for _, args := range [][]string{
		{"all_gather", "--ranks", "3", "--transport", "tcp", "--algo=ring", "--channels", "4", "--chunk", "64K"},
		{"all_gather", "-ranks", "3", "-transport=tcp", "-algo", "ring", "-channels", "4", "-chunk", "64K"},
	} {
		p, err := parseFlags(args)
		if err != nil || p.ranks != 3 || p.opts.Transport != "tcp" || p.opts.Channels != 4 || p.opts.ChunkSize != 64<<10 {
			t.Errorf("%q: %+v, %v", args, p, err)
		}
	}
	if p, err := parseFlags([]string{"reduce", "-T", "90s"}); err != nil || p.timeout != 90*time.Second {
		t.Errorf("-T 90s: %v %v", p.timeout, err)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"all_reduce", "-b", "8", "stray"}, `unexpected argument "stray"`},
		{[]string{"all_reduce", "-b", "8", "-e", "64", "100"}, `unexpected argument "100"`},
		{[]string{"all_reduc"}, `unknown collective "all_reduc"`},
		{[]string{"-b", "8"}, "missing the collective"},
		{[]string{"all_reduce", "-q", "1"}, "unknown flag -q"},
		{[]string{"all_reduce", "-V", "200"}, "-V (device_cta_count) must be between 1 and 127"},
		{[]string{"all_reduce", "--bogus"}, "unknown flag --bogus"},
		{[]string{"all_reduce", "-b"}, "flag -b needs a value"},
		{[]string{"all_reduce", "-b", "2M", "-e", "1M"}, "invalid sizes for 'minbytes' and 'maxbytes'"},
		{[]string{"all_reduce", "-b", "lots"}, "invalid size specified for 'minbytes'"},
		{[]string{"all_reduce", "-o", "xor"}, "-o:"},
		{[]string{"all_reduce", "-d", "complex"}, "-d:"},
		{[]string{"all_reduce", "-a", "4"}, "-a (average) must be between 0 and 3"},
		{[]string{"all_reduce", "-n", "x"}, `-n (iters): "x" is not a number`},
		{[]string{"all_reduce", "-T", "soon"}, "-T (timeout)"},
		{[]string{"all_reduce", "--help=1"}, "takes no value"},
	} {
		_, err := parseFlags(c.args)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want a one-line usage error with %q", c.args, err, c.want)
		}
	}
	if _, err := parseFlags([]string{"all_reduce", "-h"}); !errors.Is(err, errHelp) {
		t.Errorf("-h: %v", err)
	}
	if _, err := parseFlags([]string{"--version"}); !errors.Is(err, errVersion) {
		t.Errorf("--version: %v", err)
	}
}

func TestIsCollective(t *testing.T) {
	for _, n := range []string{"all_reduce", "all_reduce_perf", "allreduce", "alltoall", "sendrecv_perf", "bcast"} {
		if !IsCollective(n) {
			t.Errorf("%s is a collective", n)
		}
	}
	for _, n := range []string{"", "perf", "all_reduce_perf_perf", "hypercube_perf"} {
		if IsCollective(n) {
			t.Errorf("%s is no collective", n)
		}
	}
}

// C's %g, as nccl-tests prints "# Avg bus bandwidth".
func TestCFloatG(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 1.10475: "1.10475", 1.104749: "1.10475", 12.5: "12.5", 100: "100", 123456.7: "123457",
		999999.5: "1e+06", 1234567: "1.23457e+06", 0.0001: "0.0001", 0.0000123: "1.23e-05", 0.0353722123: "0.0353722",
		-2.5: "-2.5", 1e21: "1e+21",
	} {
		if got := cFloatG(v); got != want {
			t.Errorf("%%g of %v: %q, want %q", v, got, want)
		}
	}
}

func TestCheckRanks(t *testing.T) {
	p, _ := parseFlags([]string{"all_reduce", "-e", "1M"})
	h := hostLimits{cpus: 2, memAvail: 8 << 30, nproc: 10000, nofile: 1024}
	if err := checkRanksOn(h, 4, &p); err != nil {
		t.Errorf("4 ranks on 2 CPUs: %v", err)
	}
	for _, c := range []struct {
		h    hostLimits
		n    int
		e    string
		want string
	}{
		{h, 1000, "1M", "1000 local ranks on 2 CPUs"},
		{hostLimits{cpus: 64, nproc: 50}, 60, "1M", "process limit (ulimit -u) is 50"},
		{hostLimits{cpus: 64, nofile: 256}, 100, "1M", "file descriptors"},
		{hostLimits{cpus: 64, memAvail: 1 << 30}, 8, "1G", "MiB are available"},
	} {
		p, _ := parseFlags([]string{"all_reduce", "-e", c.e})
		if err := checkRanksOn(c.h, c.n, &p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d ranks on %+v: %v, want %q", c.n, c.h, err, c.want)
		}
	}
}
