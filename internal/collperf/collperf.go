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
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/coll"
	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/transport/roce"
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

// envChild marks the rank processes coll-perf --ranks starts (they take
// the launcher's command line, -t and -g included).
const envChild = "RDMAKIT_COLL_PERF_CHILD"

// Main runs coll-perf with args (those after the command name) and returns
// the exit status: 0 success, 1 failure (or wrong results), 2 usage,
// 128+N when ended by signal N.
// With --ranks N (or -t/-g, nccl-tests' threads and GPUs, which are ranks
// here) it runs this program again as N rank processes with the same
// command line, in the role "rdmakit" of internal/reexec (which
// cmd/rdmakit registers: a command line of rdmakit).
func Main(args []string) int {
	cmdline := append([]string{"coll-perf"}, args...) // for rank processes
	p, err := parseFlags(args)
	switch {
	case errors.Is(err, errHelp):
		printUsage(os.Stdout)
		return cli.ExitOK
	case errors.Is(err, errVersion):
		fmt.Println(cli.Version())
		return cli.ExitOK
	case err != nil:
		fmt.Fprintf(os.Stderr, "coll-perf: %v\n", err)
		return cli.ExitUsage
	}
	test := collTests[p.name]
	child := os.Getenv(envChild) != ""
	perProc := p.nThreads * p.nGpus

	launch, err := coll.DetectLaunch()
	switch {
	case errors.Is(err, coll.ErrNoLauncher):
		n := max(p.ranks, 1) * perProc
		for _, note := range p.notes {
			fmt.Fprintf(os.Stderr, "coll-perf: note: %s\n", note)
		}
		if n > 1 {
			if err := checkRanks(n, &p); err != nil {
				fmt.Fprintf(os.Stderr, "coll-perf: %v\n", err)
				return cli.ExitUsage
			}
			return collLaunchRanks(n, cmdline)
		}
		launch = coll.Launch{Launcher: "single", NRanks: 1, LocalRank: 0, Addr: "127.0.0.1:0"}
	case err != nil:
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return cli.ExitUsage
	case perProc > 1 && !child:
		fmt.Fprintf(os.Stderr, "coll-perf: -t %d -g %d: under a launcher (%s) every process is one rank; start more processes instead\n", p.nThreads, p.nGpus, launch.Launcher)
		return cli.ExitUsage
	case !child && launch.Rank == 0:
		for _, note := range p.notes {
			fmt.Fprintf(os.Stderr, "coll-perf: note: %s\n", note)
		}
	}
	sigs := cli.NotifySignals(context.Background())
	defer sigs.Stop()
	ctx := context.Context(sigs)
	c, err := coll.InitLaunch(ctx, launch, &p.opts)
	if err != nil {
		if st := sigs.Status(); st != 0 {
			return st
		}
		fmt.Fprintf(os.Stderr, "coll-perf: rank %d: %v\n", launch.Rank, err)
		return cli.ExitFailure
	}
	out := io.Writer(os.Stdout)
	if c.Rank() != 0 {
		out = io.Discard
	} else if p.cpuProfile != "" {
		f, err := os.Create(p.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			c.Abort("coll-perf failed")
			c.Close()
			return cli.ExitFailure
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	code := collRun(ctx, c, test, &p, out)
	if code != 0 {
		c.Abort("coll-perf failed")
	}
	c.Close()
	if st := sigs.Status(); st != 0 {
		return st
	}
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
		cmd := reexec.Command("rdmakit", cmdline, envChild+"=1",
			coll.EnvID+"="+id.String(), coll.EnvRank+"="+strconv.Itoa(i), coll.EnvNRanks+"="+strconv.Itoa(n))
		if _, set := os.LookupEnv(roce.EnvAddr); !set {
			// Over roce, each local rank binds the device's address on a
			// port of the system's choosing (4791 fits one process).
			cmd.Env = append(cmd.Env, roce.EnvAddr+"=:0")
		}
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
	// Signals are ours from before the first rank starts: a SIGTERM that
	// comes while the ranks start ends the run with 143 and takes them
	// down, instead of killing this process alone.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
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
	case sig := <-sigs:
		killAll()
		<-done
		if ss, ok := sig.(syscall.Signal); ok {
			return cli.SignalStatus(ss)
		}
		return cli.SignalStatus(syscall.SIGINT)
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

	// -J: nccl-tests' JSON (FILE.json) or rdmakit's CSV (FILE.csv), rank 0.
	var rep *jsonReport
	var repFile *os.File
	if p.outFile != "" && c.Rank() == 0 {
		switch ext := strings.ToLower(filepath.Ext(p.outFile)); ext {
		case ".json":
			f, name, err := createExclusive(p.outFile)
			if err != nil {
				fmt.Fprintf(out, "# skipping json output; %s not accessible\n", name)
				break
			}
			fmt.Fprintf(out, "# Writing JSON output to %s\n", name)
			repFile, rep = f, newJSONReport(p, os.Args, os.Environ(), time.Now())
			defer repFile.Close()
		case ".csv":
			p.csv = p.outFile
		default:
			fmt.Fprintf(out, "# skipping output file %s: -J writes FILE.json (nccl-tests' JSON) or FILE.csv\n", p.outFile)
		}
	}

	// Preamble, like nccl-tests'.
	prog := t.name + "_perf"
	step, stepKind := p.stepBytes, "bytes"
	if p.stepFactor > 1 {
		step, stepKind = p.stepFactor, "factor"
	}
	fmt.Fprintf(out, "# nccl-tests version rdmakit-%s nccl-headers=0 nccl-library=0\n", cli.VersionToken())
	fmt.Fprintf(out, "# Collective test starting: %s\n", prog)
	fmt.Fprintf(out, "# nThread %d nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d agg iters: %d validation: %d graph: %d unalign: 0\n",
		p.nThreads, p.nGpus, p.minBytes, p.maxBytes, step, stepKind, p.warmup, p.iters, p.aggIters, p.check, 0)
	if p.blocking != 0 {
		fmt.Fprintf(out, "# Blocking Enabled: wait for completion and barrier after each collective \n")
	}
	if p.parallelInit != 0 {
		fmt.Fprintf(out, "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n")
	}
	fmt.Fprintf(out, "#\n# Using devices\n")
	devs, err := collRankLines(ctx, c, out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "coll-perf:", err)
		return 1
	}
	if rep != nil {
		rep.Devices = devs
	}
	timeStr := "time"
	if p.cpuTime != 0 {
		timeStr = "cputime"
	}
	fmt.Fprintf(out, "#\n")
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "")
	// -S: a timestamp column (nccl-tests' writeResultHeader).
	tsLbl, tsPad, tsFmt := "", 0, ""
	if p.timestamps != 0 {
		tsLbl, tsPad, tsFmt = "timestamp", 19, "%Y-%m-%d %H:%M:%S"
	}
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "size", "count", "type", "redop", "root",
		timeStr, "algbw", "busbw", "#wrong", timeStr, "algbw", "busbw", "#wrong", tsPad, tsLbl)
	fmt.Fprintf(out, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s\n", "(B)", "(elements)", "", "", "",
		"(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", tsPad, tsFmt)

	var csv *os.File
	if p.csv != "" && c.Rank() == 0 {
		f, err := os.Create(p.csv)
		if err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf:", err)
			return 1
		}
		defer f.Close()
		csv = f
		fmt.Fprintf(csv, "collective,size,count,type,redop,root,oop_%s_us,oop_algbw_GBps,oop_busbw_GBps,oop_wrong,ip_%s_us,ip_algbw_GBps,ip_busbw_GBps,ip_wrong\n", timeStr, timeStr)
	}

	// failed counts the measurements with wrong elements (nccl-tests'
	// "Out of bounds values" counts them once per thread of every process:
	// here once per rank over -g).
	bw, bwN, failed := 0.0, 0, 0
	for cycle := 0; p.runCycles == 0 || cycle < p.runCycles; cycle++ {
		if ctx.Err() != nil {
			return 1
		}
		for _, dt := range types {
			for _, op := range ops {
				for _, root := range roots {
					// nccl-tests' warm-up: -w collectives out of place at
					// every size from -b to -e, doubling, before the sweep.
					for size := p.minBytes; p.warmup > 0 && size <= p.maxBytes; size *= 2 {
						sc, rc, pc := t.counts(size, dt.Size(), n)
						b := collBench{c: c, t: t, dt: dt, op: op, root: max(root, 0), send: send[:sc*dt.Size()], recv: recv[:rc*dt.Size()], param: pc}
						for k := 0; k < p.warmup; k++ {
							if err := b.run(ctx); err != nil {
								fmt.Fprintf(os.Stderr, "coll-perf: rank %d: warm-up: %s %s %s size %d: %v\n", c.Rank(), t.name, dt, op, size, err)
								return 1
							}
						}
						if size == 0 {
							break
						}
					}
					for size := p.minBytes; size <= p.maxBytes; {
						es := dt.Size()
						sc, rc, pc := t.counts(size, es, n)
						opName := "none"
						if t.reduce {
							opName = op.String()
						}
						fmt.Fprintf(out, "%12d  %12d  %8s  %6s  %6d", max(sc, rc)*es, pc, dt.NCCLName(), opName, root)
						var jr *jsonResult
						if rep != nil {
							rep.Results = append(rep.Results, jsonResult{Size: max(sc, rc) * es, Count: pc, Type: dt.NCCLName(),
								RedOp: opName, Root: fmt.Sprintf("%6d", root), ActualIters: p.iters})
							jr = &rep.Results[len(rep.Results)-1]
						}
						if csv != nil {
							fmt.Fprintf(csv, "%s,%d,%d,%s,%s,%d", t.name, max(sc, rc)*es, pc, dt.NCCLName(), opName, root)
						}
						for _, inPlace := range []bool{false, true} {
							b := collBench{c: c, t: t, dt: dt, op: op, root: max(root, 0), send: send[:sc*es], recv: recv[:rc*es], param: pc, inPlace: inPlace,
								agg: p.aggIters, blocking: p.blocking != 0}
							sec, err := b.time(ctx, 0, p.iters)
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
							wrongStr := "N/A"
							if p.check > 0 {
								wrongStr = strconv.FormatFloat(float64(wrong), 'g', -1, 64)
							}
							fmt.Fprintf(out, "  %7s  %6s  %6s  %6s", ncclFloatStr(sec*1e6, 7), ncclFloatStr(algbw, 6), ncclFloatStr(busbw, 6), wrongStr)
							if csv != nil {
								fmt.Fprintf(csv, ",%g,%g,%g,%s", sec*1e6, algbw, busbw, wrongStr)
							}
							if jr != nil {
								f := figures(p.cpuTime != 0, sec*1e6, algbw, busbw, p.check > 0, wrong)
								if inPlace {
									jr.InPlace = f
								} else {
									jr.OutOfPlace = f
								}
							}
							if wrong > 0 {
								failed++
							}
							bw += busbw
							bwN++
						}
						if p.timestamps != 0 {
							fmt.Fprintf(out, "%21s", time.Now().Format(jsonTimeFormat))
						}
						fmt.Fprintf(out, "\n")
						if csv != nil {
							fmt.Fprintf(csv, "\n")
						}
						if p.stepFactor > 1 {
							size *= p.stepFactor
						} else {
							size += p.stepBytes
						}
					}
				}
			}
		}
	}
	errs := failed * max(n/max(p.nGpus, 1), 1)
	status := "OK"
	if errs > 0 {
		status = "FAILED"
	}
	avg := bw / float64(max(bwN, 1))
	// NCCL_TESTS_MIN_BW, as nccl-tests: fail below 90% of it.
	minBW, bwStatus := -1.0, ""
	if v := os.Getenv("NCCL_TESTS_MIN_BW"); v != "" {
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			minBW, bwStatus = f, "OK"
			if avg < 0.9*minBW {
				bwStatus = "FAILED"
			}
		}
	}
	fmt.Fprintf(out, "# %-20s : %d %s\n", "Out of bounds values", errs, status)
	fmt.Fprintf(out, "# %-20s : %s %s\n", "Avg bus bandwidth", cFloatG(avg), bwStatus)
	fmt.Fprintf(out, "#\n")
	fmt.Fprintf(out, "# Collective test concluded: %s\n", prog)
	if rep != nil {
		rep.OutOfBounds = jsonCheck{Count: errs, Okay: errs == 0}
		rep.AvgBusBW = jsonAvgBW{Bandwidth: jsonFloat(avg), Okay: "unchecked"}
		if minBW >= 0 {
			rep.AvgBusBW.Okay = avg >= 0.9*minBW
		}
		if err := rep.write(repFile, time.Now()); err != nil {
			fmt.Fprintln(os.Stderr, "coll-perf: writing", p.outFile+":", err)
			return 1
		}
	}
	if errs > 0 || bwStatus == "FAILED" {
		return 1
	}
	return 0
}

// cFloatG formats v as C's printf %g: 6 significant digits, trailing
// zeros dropped, exponent form below 1e-4 and from 1e6 (two-digit
// exponent at least).
func cFloatG(v float64) string {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		switch {
		case math.IsNaN(v):
			return "nan"
		case math.IsInf(v, 1):
			return "inf"
		case math.IsInf(v, -1):
			return "-inf"
		}
		return "0"
	}
	exp := int(math.Floor(math.Log10(math.Abs(v))))
	// Rounding to 6 digits may carry into the next power of ten.
	if r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'e', 5, 64), 64); r != 0 {
		exp = int(math.Floor(math.Log10(math.Abs(r))))
	}
	if exp < -4 || exp >= 6 {
		s := strconv.FormatFloat(v, 'e', 5, 64)
		mant, e, _ := strings.Cut(s, "e")
		if strings.Contains(mant, ".") {
			mant = strings.TrimRight(strings.TrimRight(mant, "0"), ".")
		}
		sign := e[0]
		digits := strings.TrimLeft(e[1:], "0")
		for len(digits) < 2 {
			digits = "0" + digits
		}
		return mant + "e" + string(sign) + digits
	}
	s := strconv.FormatFloat(v, 'f', max(5-exp, 0), 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
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
func collRankLines(ctx context.Context, c *coll.Comm, out io.Writer) ([]jsonDevice, error) {
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
		return nil, err
	}
	var devices []jsonDevice
	str := func(b []byte) string { return strings.TrimRight(string(b), "\x00") }
	for r := 0; r < n; r++ {
		e := all[r*recLen : (r+1)*recLen]
		pid, host, dev, kind := binary.LittleEndian.Uint32(e), str(e[4:64]), str(e[64:160]), str(e[160:])
		fmt.Fprintf(out, "#  Rank %2d Group %2d Pid %6d on %10s device %s [%s] rdmakit coll\n", r, 0, pid, host, dev, kind)
		devices = append(devices, jsonDevice{Rank: r, Pid: int(pid), Hostname: host, Device: r, DeviceHex: kind, DeviceInfo: dev + " rdmakit coll"})
	}
	return devices, nil
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
