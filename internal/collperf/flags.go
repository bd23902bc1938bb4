package collperf

// The command line of coll-perf: nccl-tests' flags (common.cu's getopt
// table), short and long, with nccl-tests' defaults, plus rdmakit's own
// long flags. Parsed by internal/cli's getopt_long-style parser (shared
// with rdmakit perf): "-b 8", "-b8", "--minbytes 8", "--minbytes=8";
// every nccl-tests short flag but -h takes a value. rdmakit's long flags
// also take one dash ("-ranks 2"), as Go's flag package did.
// A positional argument other than the collective's name is an error.

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rdmakit/rdmakit/coll"
	"github.com/rdmakit/rdmakit/internal/cli"
)

// errHelp is returned by parseFlags for -h/--help.
var errHelp = errors.New("help requested")

// errVersion is returned by parseFlags for --version.
var errVersion = errors.New("version requested")

// usageError is a command-line mistake (exit status 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// collPerfFlags are a run's parameters, nccl-tests' defaults applied.
type collPerfFlags struct {
	name                          string // the collective (all_reduce, ...)
	minBytes, maxBytes, stepBytes int
	stepFactor                    int
	iters, warmup, aggIters       int
	runCycles                     int
	parallelInit, check, average  int
	blocking, streamNull          int
	cudaGraph, cpuTime            int
	nThreads, nGpus               int
	ops, types                    string
	root                          int
	ranks                         int
	timeout                       time.Duration
	csv                           string
	outFile                       string // -J: .json (nccl-tests) or .csv
	timestamps                    int
	cpuProfile                    string
	opts                          coll.Options
	// notes are one line each about flags that cannot apply here.
	notes []string
}

// defaultFlags are nccl-tests' defaults (common.cu).
func defaultFlags() collPerfFlags {
	return collPerfFlags{
		minBytes: 32 << 20, maxBytes: 32 << 20, stepBytes: 1 << 20, stepFactor: 1,
		iters: 20, warmup: 1, aggIters: 1, runCycles: 1, check: 1, average: 1,
		nThreads: 1, nGpus: 1, ops: "sum", types: "float",
	}
}

type collFlag struct {
	short byte
	long  []string
	// rdmakit marks rdmakit's own flags (not in nccl-tests), which also
	// take a single dash.
	rdmakit bool
	hasArg  bool
	help    string
	set     func(p *collPerfFlags, v string) error
}

func intFlag(name string, lo, hi int, dst func(p *collPerfFlags) *int) func(*collPerfFlags, string) error {
	return func(p *collPerfFlags, v string) error {
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			return usagef("%s: %q is not a number", name, v)
		}
		if n < int64(lo) || n > int64(hi) {
			return usagef("%s must be between %d and %d, not %d", name, lo, hi, n)
		}
		*dst(p) = int(n)
		return nil
	}
}

func sizeFlag(name string, dst func(p *collPerfFlags) *int) func(*collPerfFlags, string) error {
	return func(p *collPerfFlags, v string) error {
		n, err := coll.ParseSize(v)
		if err != nil {
			return usagef("invalid size specified for '%s': %q", name, v)
		}
		*dst(p) = n
		return nil
	}
}

// noteFlag accepts a number in [lo, hi] that changes nothing here, and
// leaves a one-line note when it is not nccl-tests' default def.
func noteFlag(text string, lo, hi, def int) func(*collPerfFlags, string) error {
	return func(p *collPerfFlags, v string) error {
		var n int
		if err := intFlag(text[:strings.Index(text, ")")+1], lo, hi, func(*collPerfFlags) *int { return &n })(p, v); err != nil {
			return err
		}
		if n != def {
			p.note(text)
		}
		return nil
	}
}

func (p *collPerfFlags) note(s string) {
	for _, n := range p.notes {
		if n == s {
			return
		}
	}
	p.notes = append(p.notes, s)
}

const maxInt = int(^uint(0) >> 1)

var collFlags = []collFlag{
	{'t', []string{"nthreads"}, false, true, "ranks per process (nccl-tests: threads); with --ranks or alone, local ranks = -t × -g", intFlag("-t (nthreads)", 1, 1024, func(p *collPerfFlags) *int { return &p.nThreads })},
	{'g', []string{"ngpus"}, false, true, "ranks per thread (nccl-tests: GPUs per thread); GPUs here are ranks", intFlag("-g (ngpus)", 1, 1024, func(p *collPerfFlags) *int { return &p.nGpus })},
	{'b', []string{"minbytes"}, false, true, "minimum size in bytes (K, M, G suffixes; default 32M)", sizeFlag("minbytes", func(p *collPerfFlags) *int { return &p.minBytes })},
	{'e', []string{"maxbytes"}, false, true, "maximum size in bytes (default 32M)", sizeFlag("maxbytes", func(p *collPerfFlags) *int { return &p.maxBytes })},
	{'i', []string{"stepbytes"}, false, true, "increment between sizes when -f is 1 (default 1M)", sizeFlag("stepbytes", func(p *collPerfFlags) *int { return &p.stepBytes })},
	{'f', []string{"stepfactor"}, false, true, "multiplication factor between sizes (default 1: add -i)", intFlag("-f (stepfactor)", 0, 1<<20, func(p *collPerfFlags) *int { return &p.stepFactor })},
	{'n', []string{"iters"}, false, true, "timed iterations (default 20)", intFlag("-n (iters)", 1, maxInt, func(p *collPerfFlags) *int { return &p.iters })},
	{'m', []string{"agg_iters"}, false, true, "collectives per timed iteration (default 1); time is per collective", intFlag("-m (agg_iters)", 1, 1<<20, func(p *collPerfFlags) *int { return &p.aggIters })},
	{'w', []string{"warmup_iters"}, false, true, "warm-up iterations at each size, doubling from -b to -e, before the sweep (default 1)", intFlag("-w (warmup_iters)", 0, maxInt, func(p *collPerfFlags) *int { return &p.warmup })},
	{'N', []string{"run_cycles"}, false, true, "run the whole sweep this many times (default 1; 0: until interrupted)", intFlag("-N (run_cycles)", 0, maxInt, func(p *collPerfFlags) *int { return &p.runCycles })},
	{'p', []string{"parallel_init"}, false, true, "0/1: ranks always initialize in parallel here (1 prints nccl-tests' line)", intFlag("-p (parallel_init)", 0, 1, func(p *collPerfFlags) *int { return &p.parallelInit })},
	{'c', []string{"check"}, false, true, "check results this many times per size (default 1; 0: off)", intFlag("-c (check)", 0, maxInt, func(p *collPerfFlags) *int { return &p.check })},
	{'o', []string{"op"}, false, true, "reduction: sum, prod, min, max, avg or all (default sum)", func(p *collPerfFlags, v string) error {
		if v != "all" {
			if _, err := coll.ParseRedOp(v); err != nil {
				return usagef("-o: %v", err)
			}
		}
		p.ops = v
		return nil
	}},
	{'d', []string{"datatype"}, false, true, "type: int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double or all (default float)", func(p *collPerfFlags, v string) error {
		if v != "all" {
			if _, err := coll.ParseDataType(v); err != nil {
				return usagef("-d: %v", err)
			}
		}
		p.types = v
		return nil
	}},
	{'r', []string{"root"}, false, true, "root of broadcast and reduce (default 0; -1: every rank in turn)", intFlag("-r (root)", -1, maxInt, func(p *collPerfFlags) *int { return &p.root })},
	{'z', []string{"blocking"}, false, true, "0/1: 1 waits and barriers after each collective", intFlag("-z (blocking)", 0, 3, func(p *collPerfFlags) *int { return &p.blocking })},
	{'y', []string{"stream_null"}, false, true, "0/1: CUDA's null stream; accepted, there are no streams here", intFlag("-y (stream_null)", 0, 1, func(p *collPerfFlags) *int { return &p.streamNull })},
	{'T', []string{"timeout"}, false, true, "timeout of each collective in seconds (0: RDMAKIT_COLL_TIMEOUT or 5m)", func(p *collPerfFlags, v string) error {
		n, err := strconv.ParseInt(v, 0, 64)
		if err == nil && n >= 0 {
			p.timeout = time.Duration(n) * time.Second
			return nil
		}
		d, derr := time.ParseDuration(v)
		if derr != nil || d < 0 {
			return usagef("-T (timeout): %q is not a number of seconds", v)
		}
		p.timeout = d
		return nil
	}},
	{'G', []string{"cudagraph"}, false, true, "CUDA graph launches; accepted, no effect (no CUDA)", intFlag("-G (cudagraph)", 0, maxInt, func(p *collPerfFlags) *int { return &p.cudaGraph })},
	{'C', []string{"report_cputime"}, false, true, "0/1: 1 labels the time column cputime (times are host wall-clock either way)", intFlag("-C (report_cputime)", 0, 1, func(p *collPerfFlags) *int { return &p.cpuTime })},
	{'a', []string{"average"}, false, true, "time reported across ranks: 0 rank 0, 1 average (default), 2 minimum, 3 maximum", intFlag("-a (average)", 0, 3, func(p *collPerfFlags) *int { return &p.average })},
	{'J', []string{"output_file"}, false, true, "also write the results to FILE.json in nccl-tests' JSON (rank 0; FILE.csv: rdmakit's CSV)", func(p *collPerfFlags, v string) error {
		if v == "" {
			return usagef("-J needs a file name")
		}
		p.outFile = v
		return nil
	}},
	{'S', []string{"report_timestamps"}, false, true, "0/1: 1 ends each result line with the time it was measured", intFlag("-S (report_timestamps)", 0, 1, func(p *collPerfFlags) *int { return &p.timestamps })},
	{'F', []string{"csv"}, true, true, "also write the results to this CSV file (rank 0; rdmakit's columns, not an nccl-tests flag)", func(p *collPerfFlags, v string) error {
		if v == "" {
			return usagef("-F needs a file name")
		}
		p.csv = v
		return nil
	}},
	{'R', []string{"local_register"}, false, true, "0/1/2: buffer registration; accepted, buffers are always registered here", noteFlag("-R (local_register): coll-perf's buffers are always registered with the communicator", 0, 2, 0)},
	{'x', []string{"cta_policy"}, false, true, "CUDA CTA policy; accepted, no effect (no CUDA)", noteFlag("-x (cta_policy): no CUDA here, no effect", -1, maxInt, -1)},
	{'D', []string{"device_implementation"}, false, true, "device API implementation; accepted, 0 only (no CUDA)", noteFlag("-D (device_implementation): no CUDA device API here; the host implementation runs", 0, maxInt, 0)},
	{'V', []string{"device_cta_count"}, false, true, "device API CTAs; accepted, no effect (no CUDA)", noteFlag("-V (device_cta_count): no CUDA here, no effect", 1, 127, 16)},
	{'M', []string{"memory"}, false, true, "0/1: GPU memory report; accepted, no effect (no GPU memory)", noteFlag("-M (memory): there is no GPU memory to report", 0, 1, 0)},
	{'u', []string{"unalign"}, false, true, "misalign the buffers by this many elements; accepted, 0 only here", noteFlag("-u (unalign): buffers stay aligned here (the header says unalign: 0)", 0, maxInt, 0)},
	{'I', []string{"per_iter_timing"}, false, true, "0/1: per-iteration timing columns; accepted, not reported here", noteFlag("-I (per_iter_timing): per-iteration columns are not reported", 0, 1, 0)},
	{'K', []string{"per_iter_skip"}, false, true, "samples -I skips; accepted, no effect", noteFlag("-K (per_iter_skip): applies to -I, which is not reported", 0, maxInt, 0)},
	{'h', []string{"help"}, false, false, "print this help", func(*collPerfFlags, string) error { return errHelp }},
	{0, []string{"version"}, false, false, "print the version", func(*collPerfFlags, string) error { return errVersion }},
	{0, []string{"ranks"}, true, true, "start this many local rank processes (when no launcher provides ranks)", intFlag("--ranks", 1, maxInt, func(p *collPerfFlags) *int { return &p.ranks })},
	{0, []string{"transport"}, true, true, "force the transport between all ranks: shm, tcp, roce or ibverbs (default: RDMAKIT_COLL_TRANSPORT or auto)", func(p *collPerfFlags, v string) error { p.opts.Transport = v; return nil }},
	{0, []string{"hca"}, true, true, "RDMA devices, as NCCL_IB_HCA: mlx5_0, mlx5_0:1, =mlx5_0, ^mlx5_1, lists", func(p *collPerfFlags, v string) error { p.opts.HCA = v; return nil }},
	{0, []string{"gid-index"}, true, true, "RoCE GID index (default: RDMAKIT_COLL_GID_INDEX, NCCL_IB_GID_INDEX or auto)", func(p *collPerfFlags, v string) error { p.opts.GIDIndex = v; return nil }},
	{0, []string{"algo"}, true, true, "force the algorithm: ring, tree, direct or halving (default: RDMAKIT_COLL_ALGO or auto)", func(p *collPerfFlags, v string) error {
		a, err := coll.ParseAlgorithm(v)
		if err != nil {
			return usagef("--algo: %v", err)
		}
		p.opts.Algorithm = a
		return nil
	}},
	{0, []string{"channels"}, true, true, "channels (QPs) per peer (default: RDMAKIT_COLL_CHANNELS, or 2; 1 when some pair of ranks talks over tcp)", intFlag("--channels", 0, 64, func(p *collPerfFlags) *int { return &p.opts.Channels })},
	{0, []string{"chunk"}, true, true, "pipeline chunk size in bytes (default: RDMAKIT_COLL_CHUNK, or 256K)", sizeFlag("chunk", func(p *collPerfFlags) *int { return &p.opts.ChunkSize })},
	{0, []string{"cpuprofile"}, true, true, "write rank 0's CPU profile to this file", func(p *collPerfFlags, v string) error { p.cpuProfile = v; return nil }},
}

// collectiveNames lists the collectives, sorted.
func collectiveNames() []string {
	var n []string
	for k := range collTests {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// canonical returns the collective a name means (all_reduce,
// all_reduce_perf, allreduce, ...), or "".
func canonical(name string) string {
	n := strings.TrimSuffix(strings.ToLower(name), "_perf")
	if a, ok := collAliases[n]; ok {
		n = a
	}
	if _, ok := collTests[n]; ok {
		return n
	}
	return ""
}

// IsCollective reports whether name names a collective of coll-perf
// (all_reduce, allreduce, ...; with or without nccl-tests' "_perf").
func IsCollective(name string) bool { return canonical(name) != "" }

// parseFlags parses coll-perf's arguments: the collective (first
// positional argument) and flags, in any order.
func parseFlags(args []string) (collPerfFlags, error) {
	p := defaultFlags()
	g := cli.Getopt{Usagef: usagef, Hint: "coll-perf -h lists the flags"}
	for k := range collFlags {
		f := &collFlags[k]
		arg := cli.NoArg
		if f.hasArg {
			arg = cli.RequiredArg
		}
		g.Flags = append(g.Flags, cli.Flag{Short: f.short, Long: f.long, Arg: arg, SingleDash: f.rdmakit,
			Set: func(v string, _ bool) error { return f.set(&p, v) }})
	}
	pos, err := g.Parse(args)
	if err != nil {
		return p, err
	}
	if len(pos) == 0 {
		return p, usagef("missing the collective (one of %s)", strings.Join(collectiveNames(), ", "))
	}
	if p.name = canonical(pos[0]); p.name == "" {
		return p, usagef("unknown collective %q (collectives: %s)", pos[0], strings.Join(collectiveNames(), ", "))
	}
	if len(pos) > 1 {
		return p, usagef("unexpected argument %q: coll-perf takes one collective and flags (a value with a space belongs to the flag before it)", pos[1])
	}
	if p.minBytes > p.maxBytes {
		return p, usagef("invalid sizes for 'minbytes' and 'maxbytes': %d > %d", p.minBytes, p.maxBytes)
	}
	if p.stepFactor <= 1 && p.stepBytes <= 0 {
		return p, usagef("-i (stepbytes) must be positive when -f (stepfactor) is 1")
	}
	p.opts.Timeout = p.timeout
	if _, err := p.opts.Resolve(); err != nil {
		return p, usagef("%v", err)
	}
	if p.cudaGraph > 0 {
		p.note("-G (CUDA graphs): no GPUs, so no graphs; collectives are called directly")
	}
	if p.streamNull > 0 {
		p.note("-y (stream_null): no CUDA streams here; no effect")
	}
	return p, nil
}

// printUsage writes the help text.
func printUsage(w io.Writer) {
	fmt.Fprintf(w, `usage: rdmakit coll-perf COLLECTIVE [flags]
       rdmakit COLLECTIVE_perf [flags]     (or a symlink named e.g. all_reduce_perf)

COLLECTIVE: %s
nccl-tests' flags, defaults and output. Ranks come from mpirun, torchrun-style,
srun or Kubernetes environments, or from --ranks N (local processes). Where
nccl-tests says GPU, read rank: -g and -t multiply the number of local ranks.

`, strings.Join(collectiveNames(), " "))
	for _, f := range collFlags {
		var names []string
		if f.short != 0 {
			names = append(names, "-"+string(f.short))
		}
		for _, l := range f.long {
			names = append(names, "--"+l)
		}
		arg := ""
		if f.hasArg {
			arg = " V"
		}
		fmt.Fprintf(w, "  %-28s %s\n", strings.Join(names, ", ")+arg, f.help)
	}
	fmt.Fprintf(w, "\nExit status: 0 success, 1 failure or wrong results, 2 usage error, 128+N on signal N.\n")
}
