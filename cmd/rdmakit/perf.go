package main

// rdmakit perf: perftest's eight tests on any rdmakit device. The
// machinery is internal/perftest; this file is the command line. It runs
// in main's goroutine; SIGINT/SIGTERM cancel the run (the loopback server
// child is killed and reaped).

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/perftest"
)

func init() {
	register("perf", "perftest-compatible benchmarks: {send,write,read,atomic}_{bw,lat}", runPerf)
}

const perfUsage = `usage: rdmakit perf TEST [flags] [server-address]

TEST: send_bw send_lat write_bw write_lat read_bw read_lat atomic_bw atomic_lat
(ib_ prefix accepted). Without an address this side is the server, with one
the client; --loopback runs both on this host (server as a child process).

Against perftest's binaries (ib_write_bw ... ib_atomic_lat, either role):
nothing to add. rdmakit recognizes perftest's exchange on the connection and
speaks it, for all eight tests, -s, -a, -q, -n (RC, iterations, one
direction; ibverbs devices (build with -tags ibverbs) or roce devices
(-d roce0); on RoCE give perftest the IPv4-mapped GID's index with -x).
With a perftest peer, -b, -D and --run_infinitely are refused, and a
write/read/atomic_bw server checks the client's message size. perftest's
-R (its exchange and QP connections over rdma_cm) is spoken when both
sides give -R (ibverbs devices; siw needs it), and -z (its exchange over
rdma_cm, QPs connected with the exchanged keys) when both give -z
(ibverbs devices). (--perftest-wire
of earlier releases is accepted and not needed.)

  -a, --all                 all sizes from 2 B to 8 MiB
  -s, --size=N              message size (default 65536 bw, 2 lat, 8 atomic; K/M suffix)
  -n, --iters=N             iterations (default 5000 write_bw, 1000 otherwise)
  -D, --duration=S          run for S seconds instead of -n
  -H, --report-histogrm     print every sorted latency sample (lat)
  -q, --qp=N                number of QPs (bw, default 1)
  -I, --inline_size=N       max inline size (default 220 write_lat, 236 send_lat, 0 otherwise)
  -t, --tx-depth=N          send queue depth (default 128 bw, 1 lat)
  -r, --rx-depth=N          receive queue depth (default 512, send tests)
  -Q, --cq-mod=N            signal every N-th work request (default 100; 1 above 8 KiB)
  -b, --bidirectional       both directions at once (bw)
  -A, --atomic_type=T       CMP_AND_SWAP or FETCH_AND_ADD (default)
  -p, --port=N              exchange port (default 18515)
  -d, --ib-dev=DEV          device (rdmakit info); client default shm0 with --loopback, else tcp0
  -m, --mtu=N               path MTU (256..4096; default the port's active MTU)
  -c, --connection=RC       connection type (RC only)
  -F, --CPU-freq            accepted for perftest compatibility (no effect)
      --report_gbits        report Gb/sec instead of MiB/sec
      --out_json=FILE       write the results as JSON
      --plot=FILE.png       draw the results against message size
      --loopback            run server and client on this host
  -x, --gid-index=N         source GID index (verbs.Options.GIDIndex; RoCE ports)
  -i, --ib-port=N           device port (default 1)
  -u, --qp-timeout=N        QP local ACK timeout exponent (default 14)
      --retry_count=N       QP retry count (default 7)
  -N, --noPeak              do not measure BW peak (printed as 0.00)
  -U, --report-unsorted     print every latency sample in the order measured (implies -H)
  -O, --dualport            dual-port mode: refused, rdmakit devices have one port
  -e, --events              sleep in the driver for completions instead of polling
  -o, --outs=N              outstanding reads and atomics per QP (read, atomic; default 16)
  -f, --margin=S            warm-up and cool-down of a -D run (default -D/4)
      --run_infinitely      bw: run until interrupted, one result every -D seconds
                            (default 5); SIGINT/SIGTERM on the client end both sides, exit 0
  -l, --post_list=N         post lists of N work requests, the last signaled (bw; -Q becomes N)
      --output=WHAT         print only bandwidth, message_rate or latency (t_avg), no header
      --report-both         with -b, print each direction's result before the sum
  -j, --source_ip=IP        the client's exchange connection comes from IP
  -S, --sl=N                service level of the QPs' address (0..15; ibverbs devices)
  -T, --tos=N               traffic class of the QPs' address, the IP ToS byte on
                            RoCE v2 (0..255; ibverbs devices; perftest: with -R only)
      --tclass=N            the same as -T
  -V, --version             print the version

Accepted for perftest compatibility, with a one-line note on stderr saying
why they change nothing here: -R/--rdma_cm and -z/--comm_rdma_cm (except
as above),
-W/--report-counters, -C/--report-cycles, --mr_per_qp,
--perform_warm_up. --cpu_util adds perftest's CPU_Util[%] column with -D.
--use_cuda and the other GPU memory flags are refused: this build has no
GPU support. Refused with the reason: -O (one port),
--use-srq, --reversed, --write_with_imm, multicast and rate limits.
Exit status: 0 success (also --run_infinitely ended by SIGINT/SIGTERM),
1 failure, 2 usage error, 128+N on signal N. (perftest exits 1 for all of
these, -h and --version included.)

Also installed as ib_send_bw ... ib_atomic_lat: 'rdmakit ib_write_bw ...' or
a symlink named ib_write_bw runs 'rdmakit perf write_bw ...'.
`

func runPerf(args []string) int {
	o, err := perftest.ParseArgs(args)
	if errors.Is(err, perftest.ErrHelp) {
		fmt.Print(perfUsage)
		return 0
	}
	if errors.Is(err, perftest.ErrVersion) {
		fmt.Println(version())
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit perf: %s\n", strings.TrimPrefix(err.Error(), perftest.ErrUsage.Error()+": "))
		return 2
	}
	for _, n := range o.Notes {
		fmt.Fprintf(os.Stderr, "rdmakit perf: note: %s\n", n)
	}
	sigs := cli.NotifySignals(context.Background())
	defer sigs.Stop()
	ctx := context.Context(sigs)
	env := perftest.Env{Progress: perftest.IsTerminal(os.Stderr)}
	if err := perftest.Run(ctx, o, env); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "rdmakit perf: interrupted (%v)\n", sigs.Signal())
			return sigs.Status()
		}
		msg := strings.TrimPrefix(err.Error(), perftest.ErrUsage.Error()+": ")
		fmt.Fprintf(os.Stderr, "rdmakit perf: %s\n", msg)
		if errors.Is(err, perftest.ErrUsage) {
			return 2
		}
		return 1
	}
	return 0
}
