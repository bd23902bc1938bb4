// Package collperf is rdmakit coll-perf: nccl-tests-compatible
// collective benchmarks on rdmakit's coll package, over whatever devices
// coll chooses (shm, tcp, RDMA NICs; --transport forces one, --hca and
// --gid-index pick the RDMA device and GID). The flags, the table and the
// busbw factors follow
// nccl-tests (all_reduce_perf and friends): size, count, type, redop,
// root, then time/algbw/busbw/#wrong out of place and in place, closing
// with "# Avg bus bandwidth".
//
// Ranks come from the launcher environment (mpirun, torchrun-style,
// srun, Kubernetes indexed Jobs; see coll.DetectLaunch), or --ranks N
// starts N local rank processes (this program again, with the rank in the
// environment), serves their rendezvous and reaps them. Rank 0 prints.
//
// cmd/rdmakit registers Main as the coll-perf command, as it does
// internal/perftest's Run for perf.
//
// Goroutines: the launcher waits for its children in one goroutine each
// and forwards SIGINT/SIGTERM; a rank runs the benchmark in the goroutine
// calling Main (main's, in rdmakit).
package collperf

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/coll"
)

// Summary is the one-line description of the command.
const Summary = "nccl-tests-compatible collective benchmarks (all_reduce, all_gather, ...)"

// collTest describes one nccl-tests program.
type collTest struct {
	name   string // all_reduce ...
	reduce bool   // has a reduction operator
	rooted bool
	// counts returns nccl-tests' (sendcount, recvcount, paramcount) for a
	// size in bytes.
	counts func(size, es, n int) (int, int, int)
	// factor is busbw / algbw.
	factor func(n int) float64
	// algbytes is the byte count algbw is computed from.
	algbytes func(param, es, n int) float64
}

var collTests = map[string]collTest{
	"all_reduce": {name: "all_reduce", reduce: true,
		counts:   func(s, es, n int) (int, int, int) { c := s / es; return c, c, c },
		factor:   func(n int) float64 { return 2 * float64(n-1) / float64(n) },
		algbytes: func(p, es, n int) float64 { return float64(p * es) }},
	"all_gather": {name: "all_gather",
		counts:   func(s, es, n int) (int, int, int) { b := (s / es / n) &^ (max(1, 16/es) - 1); return b, b * n, b },
		factor:   func(n int) float64 { return float64(n-1) / float64(n) },
		algbytes: func(p, es, n int) float64 { return float64(p * es * n) }},
	"reduce_scatter": {name: "reduce_scatter", reduce: true,
		counts:   func(s, es, n int) (int, int, int) { b := (s / es / n) &^ (max(1, 16/es) - 1); return b * n, b, b },
		factor:   func(n int) float64 { return float64(n-1) / float64(n) },
		algbytes: func(p, es, n int) float64 { return float64(p * es * n) }},
	"alltoall": {name: "alltoall",
		counts:   func(s, es, n int) (int, int, int) { b := (s / es / n) &^ (max(1, 16/es) - 1); return b * n, b * n, b },
		factor:   func(n int) float64 { return float64(n-1) / float64(n) },
		algbytes: func(p, es, n int) float64 { return float64(p * es * n) }},
	"broadcast": {name: "broadcast", rooted: true,
		counts:   func(s, es, n int) (int, int, int) { c := s / es; return c, c, c },
		factor:   func(n int) float64 { return 1 },
		algbytes: func(p, es, n int) float64 { return float64(p * es) }},
	"reduce": {name: "reduce", reduce: true, rooted: true,
		counts:   func(s, es, n int) (int, int, int) { c := s / es; return c, c, c },
		factor:   func(n int) float64 { return 1 },
		algbytes: func(p, es, n int) float64 { return float64(p * es) }},
	"sendrecv": {name: "sendrecv", reduce: true,
		counts:   func(s, es, n int) (int, int, int) { c := s / es; return c, c, c },
		factor:   func(n int) float64 { return 1 },
		algbytes: func(p, es, n int) float64 { return float64(p * es) }},
}

var collAliases = map[string]string{
	"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
	"bcast": "broadcast", "all_to_all": "alltoall", "send_recv": "sendrecv",
}

type collPerfFlags struct {
	minBytes, maxBytes, stepBytes int
	stepFactor                    int
	iters, warmup, check, average int
	ops, types                    string
	root                          int
	ranks                         int
	timeout                       time.Duration
	opts                          coll.Options
}

// Main runs coll-perf with args (those after the command name) and returns
// the exit status: 0 success, 1 failure (or wrong results), 2 usage.
// With --ranks N it runs this program again as N rank processes with the
// same command line, in the role "rdmakit" of internal/reexec (which
// cmd/rdmakit registers: a command line of rdmakit).
func Main(args []string) int {
	cmdline := append([]string{"coll-perf"}, args...) // for rank processes
	fs := flag.NewFlagSet("coll-perf", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: rdmakit coll-perf all_reduce|all_gather|reduce_scatter|broadcast|reduce|alltoall|sendrecv [flags]\n\n")
		fmt.Fprintf(fs.Output(), "nccl-tests-compatible flags and output. Ranks come from mpirun, torchrun-style, srun or\nKubernetes environments, or from --ranks N (local processes).\n\n")
		fs.PrintDefaults()
	}
	var p collPerfFlags
	var minB, maxB, stepB, algo, chunk string
	fs.StringVar(&minB, "b", "32M", "minimum size in bytes (K, M, G suffixes)")
	fs.StringVar(&maxB, "e", "32M", "maximum size in bytes")
	fs.StringVar(&stepB, "i", "1M", "increment between sizes, when -f is 1")
	fs.IntVar(&p.stepFactor, "f", 1, "multiplication factor between sizes (1: add -i)")
	fs.IntVar(&p.iters, "n", 20, "timed iterations")
	fs.IntVar(&p.warmup, "w", 1, "warm-up iterations")
	fs.IntVar(&p.check, "c", 1, "check results (number of checks, 0: off)")
	fs.StringVar(&p.ops, "o", "sum", "reduction: sum, prod, min, max, avg or all")
	fs.StringVar(&p.types, "d", "float", "data type: int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float, double or all")
	fs.IntVar(&p.root, "r", 0, "root of broadcast and reduce (-1: every rank in turn)")
	fs.IntVar(&p.average, "a", 1, "time reported across ranks: 0 rank 0, 1 average, 2 minimum, 3 maximum")
	fs.IntVar(&p.ranks, "ranks", 0, "start this many local rank processes (when no launcher provides ranks)")
	fs.DurationVar(&p.timeout, "T", 0, "collective timeout (default: RDMAKIT_COLL_TIMEOUT or 5m)")
	fs.StringVar(&p.opts.Transport, "transport", "", "force the transport between all ranks: shm, tcp or ibverbs (default: RDMAKIT_COLL_TRANSPORT or auto)")
	fs.StringVar(&p.opts.HCA, "hca", "", "RDMA devices to use, as NCCL_IB_HCA: mlx5_0, mlx5_0:1, =mlx5_0, ^mlx5_1, lists (default: RDMAKIT_COLL_HCA, NCCL_IB_HCA or all)")
	fs.StringVar(&p.opts.GIDIndex, "gid-index", "", "RoCE GID index (default: RDMAKIT_COLL_GID_INDEX, NCCL_IB_GID_INDEX or auto)")
	fs.StringVar(&algo, "algo", "", "force the algorithm: ring or tree (default: RDMAKIT_COLL_ALGO or auto)")
	fs.IntVar(&p.opts.Channels, "channels", 0, "channels (QPs) per peer (default: RDMAKIT_COLL_CHANNELS or 2)")
	fs.StringVar(&chunk, "chunk", "", "pipeline chunk size in bytes (default: RDMAKIT_COLL_CHUNK or 256K)")
	var cpuProfile string
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write rank 0's CPU profile to this file")
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	}
	name = strings.TrimSuffix(strings.ToLower(name), "_perf")
	if a, ok := collAliases[name]; ok {
		name = a
	}
	test, ok := collTests[name]
	if !ok {
		fs.Usage()
		return 2
	}
	var err error
	for _, s := range []struct {
		v   *int
		str string
	}{{&p.minBytes, minB}, {&p.maxBytes, maxB}, {&p.stepBytes, stepB}} {
		if *s.v, err = coll.ParseSize(s.str); err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			return 2
		}
	}
	if chunk != "" {
		if p.opts.ChunkSize, err = coll.ParseSize(chunk); err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			return 2
		}
	}
	if p.opts.Algorithm, err = coll.ParseAlgorithm(algo); err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 2
	}
	p.opts.Timeout = p.timeout
	if _, err := p.opts.Resolve(); err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 2
	}
	if p.minBytes > p.maxBytes || p.iters < 1 || p.warmup < 0 || (p.stepFactor <= 1 && p.stepBytes <= 0) {
		fmt.Fprintln(os.Stderr, "coll-perf: bad size range or iteration counts")
		return 2
	}

	launch, err := coll.DetectLaunch()
	switch {
	case errors.Is(err, coll.ErrNoLauncher) && p.ranks > 1:
		return collLaunchRanks(p.ranks, cmdline)
	case errors.Is(err, coll.ErrNoLauncher):
		launch = coll.Launch{Launcher: "single", NRanks: 1, LocalRank: 0, Addr: "127.0.0.1:0"}
	case err != nil:
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := coll.InitLaunch(ctx, launch, &p.opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "coll-perf: rank %d: %v\n", launch.Rank, err)
		return 1
	}
	out := io.Writer(os.Stdout)
	if c.Rank() != 0 {
		out = io.Discard
	} else if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			c.Abort("coll-perf failed")
			c.Close()
			return 1
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	code := collRun(ctx, c, test, &p, out)
	if code != 0 {
		c.Abort("coll-perf failed")
	}
	c.Close()
	return code
}

// collLaunchRanks runs n copies of this program as ranks of one communicator
// whose rendezvous this process serves. Rank 0's output is ours; every
// rank's errors go to our stderr. Children die with us (where the system
// allows) and are killed if one of them fails.
func collLaunchRanks(n int, cmdline []string) int {
	id, err := coll.GetUniqueID()
	if err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 1
	}
	cmds := make([]*exec.Cmd, n)
	for i := range cmds {
		cmd := reexec.Command("rdmakit", cmdline,
			coll.EnvID+"="+id.String(), coll.EnvRank+"="+strconv.Itoa(i), coll.EnvNRanks+"="+strconv.Itoa(n))
		if i == 0 {
			cmd.Stdout = os.Stdout
		}
		cmd.Stderr = os.Stderr
		cmds[i] = cmd
	}
	killAll := func() {
		for _, cmd := range cmds {
			if cmd.Process != nil {
				cmd.Process.Kill()
			}
		}
	}
	for i, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "coll-perf: starting rank %d: %v\n", i, err)
			killAll()
			for _, c := range cmds[:i] {
				c.Wait()
			}
			return 1
		}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	codes := make([]int, n)
	failed := make(chan int, n)
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd.Wait()
			codes[i] = cmd.ProcessState.ExitCode()
			if codes[i] != 0 {
				failed <- i
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-sigs:
		killAll()
		<-done
		return 130
	case i := <-failed:
		// The others notice the failure through the communicator; give
		// them a moment to report it, then make sure they are gone.
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			fmt.Fprintf(os.Stderr, "coll-perf: rank %d failed; stopping the others\n", i)
			killAll()
			<-done
		}
	}
	for _, code := range codes {
		if code != 0 {
			return 1
		}
	}
	return 0
}

func collRun(ctx context.Context, c *coll.Comm, t collTest, p *collPerfFlags, out io.Writer) int {
	n := c.Size()
	types := []coll.DataType{}
	if p.types == "all" {
		types = coll.DataTypes
	} else {
		dt, err := coll.ParseDataType(p.types)
		if err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			return 2
		}
		types = append(types, dt)
	}
	ops := []coll.RedOp{coll.Sum}
	if t.reduce {
		if p.ops == "all" {
			ops = coll.RedOps
		} else {
			op, err := coll.ParseRedOp(p.ops)
			if err != nil {
				fmt.Fprintln(os.Stderr, "coll-perf:", err)
				return 2
			}
			ops = []coll.RedOp{op}
		}
	}
	roots := []int{-1}
	if t.rooted {
		roots = []int{p.root}
		if p.root == -1 {
			roots = roots[:0]
			for r := 0; r < n; r++ {
				roots = append(roots, r)
			}
		} else if p.root < 0 || p.root >= n {
			fmt.Fprintf(os.Stderr, "coll-perf: root %d of %d ranks\n", p.root, n)
			return 2
		}
	}
	// Buffers for the largest size, registered with the communicator.
	maxSend, maxRecv := 0, 0
	for _, dt := range types {
		s, r, _ := t.counts(p.maxBytes, dt.Size(), n)
		maxSend, maxRecv = max(maxSend, s*dt.Size()), max(maxRecv, r*dt.Size())
	}
	send, err1 := c.Alloc(max(maxSend, 8))
	recv, err2 := c.Alloc(max(maxRecv, 8))
	scratch, err3 := c.Alloc(64 * n)
	if err := errors.Join(err1, err2, err3); err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 1
	}

	// Preamble, like nccl-tests'.
	prog := t.name + "_perf"
	step, stepKind := p.stepBytes, "bytes"
	if p.stepFactor > 1 {
		step, stepKind = p.stepFactor, "factor"
	}
	fmt.Fprintf(out, "# rdmakit coll-perf (nccl-tests format)\n")
	fmt.Fprintf(out, "# Collective test starting: %s\n", prog)
	fmt.Fprintf(out, "# nThread 1 nGpus 1 minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0 unalign: 0\n",
		p.minBytes, p.maxBytes, step, stepKind, p.warmup, p.iters, p.check)
	fmt.Fprintf(out, "#\n# Using devices\n")
	if err := collRankLines(ctx, c, out); err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 1
	}
	fmt.Fprintf(out, "#\n")
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size", "count", "type", "redop", "root",
		"time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong")
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)", "(elements)", "", "", "",
		"(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")

	bw, bwN, wrongTotal := 0.0, 0, int64(0)
	for _, dt := range types {
		for _, op := range ops {
			for _, root := range roots {
				for size := p.minBytes; size <= p.maxBytes; {
					es := dt.Size()
					sc, rc, pc := t.counts(size, es, n)
					opName := "none"
					if t.reduce {
						opName = op.String()
					}
					fmt.Fprintf(out, "%12d  %12d  %8s  %6s  %6d", max(sc, rc)*es, pc, dt.NCCLName(), opName, root)
					for _, inPlace := range []bool{false, true} {
						b := collBench{c: c, t: t, dt: dt, op: op, root: max(root, 0), send: send[:sc*es], recv: recv[:rc*es], param: pc, inPlace: inPlace}
						sec, err := b.time(ctx, p.warmup, p.iters)
						if err == nil {
							sec, err = collAggregate(ctx, c, scratch, sec, p.average)
						}
						var wrong int64
						for k := 0; err == nil && k < p.check; k++ {
							var w int64
							if w, err = b.verify(ctx); err == nil {
								w, err = collSumAll(ctx, c, scratch, w)
							}
							wrong += w
						}
						if err != nil {
							fmt.Fprintf(out, "\n")
							fmt.Fprintf(os.Stderr, "coll-perf: rank %d: %s %s %s size %d: %v\n", c.Rank(), t.name, dt, op, size, err)
							return 1
						}
						algbw := t.algbytes(pc, es, n) / 1e9 / sec
						busbw := algbw * t.factor(n)
						if pc == 0 {
							algbw, busbw = 0, 0
						}
						if p.check > 0 {
							fmt.Fprintf(out, "  %7s  %6s  %6s  %6s", ncclFloatStr(sec*1e6, 7), ncclFloatStr(algbw, 6), ncclFloatStr(busbw, 6), strconv.FormatFloat(float64(wrong), 'g', -1, 64))
						} else {
							fmt.Fprintf(out, "  %7s  %6s  %6s    N/A", ncclFloatStr(sec*1e6, 7), ncclFloatStr(algbw, 6), ncclFloatStr(busbw, 6))
						}
						wrongTotal += wrong
						bw += busbw
						bwN++
					}
					fmt.Fprintf(out, "\n")
					if p.stepFactor > 1 {
						size *= p.stepFactor
					} else {
						size += p.stepBytes
					}
				}
			}
		}
	}
	errs := 0
	if wrongTotal > 0 {
		errs = 1
	}
	status := "OK"
	if errs > 0 {
		status = "FAILED"
	}
	fmt.Fprintf(out, "# %-20s : %d %s\n", "Out of bounds values", errs, status)
	fmt.Fprintf(out, "# %-20s : %g \n", "Avg bus bandwidth", bw/float64(max(bwN, 1)))
	fmt.Fprintf(out, "#\n")
	fmt.Fprintf(out, "# Collective test concluded: %s\n", prog)
	if errs > 0 {
		return 1
	}
	return 0
}

// ncclFloatStr formats like nccl-tests' getFloatStr: as many decimals as the
// width allows.
func ncclFloatStr(v float64, width int) string {
	power := 0
	for val := uint64(1); v >= float64(val) && power < 20; val *= 10 {
		power++
	}
	switch {
	case power < width-2:
		return fmt.Sprintf("%*.2f", width, v)
	case power < width-1:
		return fmt.Sprintf("%*.1f", width, v)
	case power < width+1:
		return fmt.Sprintf("%*.0f", width, v)
	case width >= 7:
		return fmt.Sprintf("%*.1e", width, v)
	}
	return fmt.Sprintf("%*.0e", width, v)
}

// collRankLines prints one "#  Rank" line per rank (pid, host, the
// devices it reaches its peers with and their transports), gathered to
// rank 0, e.g.
//
//	#  Rank  0 Group  0 Pid   1234 on     host-a device rxe_dum [ibverbs port 1] rdmakit coll
func collRankLines(ctx context.Context, c *coll.Comm, out io.Writer) error {
	const recLen = 256
	n := c.Size()
	host, _ := os.Hostname()
	var names, kinds []string
	for _, u := range c.DeviceUses() {
		names = append(names, u.Device)
		kinds = append(kinds, fmt.Sprintf("%s port %d", u.Transport, u.Port))
	}
	devs, kind := strings.Join(names, "+"), strings.Join(kinds, ", ")
	if devs == "" {
		devs, kind = "self", "no peers"
	}
	rec := make([]byte, recLen)
	binary.LittleEndian.PutUint32(rec, uint32(os.Getpid()))
	copy(rec[4:64], host)
	copy(rec[64:160], devs)
	copy(rec[160:recLen-1], kind)
	all := make([]byte, recLen*n)
	if err := c.AllGather(ctx, rec, all, coll.Uint8); err != nil {
		return err
	}
	str := func(b []byte) string { return strings.TrimRight(string(b), "\x00") }
	for r := 0; r < n; r++ {
		e := all[r*recLen : (r+1)*recLen]
		fmt.Fprintf(out, "#  Rank %2d Group %2d Pid %6d on %10s device %s [%s] rdmakit coll\n", r, 0,
			binary.LittleEndian.Uint32(e), str(e[4:64]), str(e[64:160]), str(e[160:]))
	}
	return nil
}

// collAggregate combines a per-rank time as nccl-tests' -a says.
func collAggregate(ctx context.Context, c *coll.Comm, scratch []byte, sec float64, mode int) (float64, error) {
	b := scratch[:8]
	binary.LittleEndian.PutUint64(b, math.Float64bits(sec))
	var err error
	switch mode {
	case 0:
		err = c.Broadcast(ctx, b, b, coll.Float64, 0)
	case 2:
		err = c.AllReduce(ctx, b, b, coll.Float64, coll.Min)
	case 3:
		err = c.AllReduce(ctx, b, b, coll.Float64, coll.Max)
	default:
		err = c.AllReduce(ctx, b, b, coll.Float64, coll.Avg)
	}
	return math.Float64frombits(binary.LittleEndian.Uint64(b)), err
}

func collSumAll(ctx context.Context, c *coll.Comm, scratch []byte, v int64) (int64, error) {
	b := scratch[:8]
	binary.LittleEndian.PutUint64(b, uint64(v))
	err := c.AllReduce(ctx, b, b, coll.Int64, coll.Sum)
	return int64(binary.LittleEndian.Uint64(b)), err
}
