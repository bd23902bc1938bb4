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
	"os/signal"
	"strings"
	"syscall"

	"github.com/rdmakit/rdmakit/internal/perftest"
)

func init() {
	register("perf", "perftest-compatible benchmarks: {send,write,read,atomic}_{bw,lat}", runPerf)
}

const perfUsage = `usage: rdmakit perf TEST [flags] [server-address]

TEST: send_bw send_lat write_bw write_lat read_bw read_lat atomic_bw atomic_lat
(ib_ prefix accepted). Without an address this side is the server, with one
the client; --loopback runs both on this host (server as a child process).

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
      --perftest-wire       speak perftest 4.5's own exchange: write_bw and send_bw
                            against ib_write_bw/ib_send_bw (ibverbs devices, RoCE;
                            the IPv4-mapped RoCE v2 GID: perftest's -x)
`

func runPerf(args []string) int {
	o, err := perftest.ParseArgs(args)
	if errors.Is(err, perftest.ErrHelp) {
		fmt.Print(perfUsage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit perf: %s\n", strings.TrimPrefix(err.Error(), perftest.ErrUsage.Error()+": "))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	env := perftest.Env{Progress: perftest.IsTerminal(os.Stderr)}
	if err := perftest.Run(ctx, o, env); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "rdmakit perf: interrupted")
			return 130
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
