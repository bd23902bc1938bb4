package exporter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/internal/stats"
)

// Summary is the one-line description of rdmakit exporter.
const Summary = "serve RDMA port and hardware counters as Prometheus metrics"

// DefaultListen is the address rdmakit exporter listens on by default.
const DefaultListen = ":9879"

const usage = `usage: rdmakit exporter [--listen ADDR] [--root DIR] [--stats-dir DIR]

Serves Prometheus metrics on http://ADDR/metrics: every RDMA device's port
counters (rdma_port_*_total), driver counters (rdma_hw_*_total), port
state, rate and link layer, read from /sys/class/infiniband at each
scrape. Runs until SIGINT or SIGTERM.

  --listen ADDR   address to listen on (default ` + DefaultListen + `)
  --root DIR      read /sys under DIR (a copy of another host's)
  --stats-dir DIR also serve the counters rdmakit processes write there
                  (those run with RDMAKIT_STATS_DIR=DIR): rdmakit_transport_*
                  (default: $RDMAKIT_STATS_DIR, else none)
`

// Handler returns the HTTP handler of the exporter: /metrics with the
// collector of the devices under root (and of the rdmakit processes'
// counter files in statsDir, unless it is ""), and a page at / that
// links to it.
func Handler(root, statsDir string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(root))
	if statsDir != "" {
		reg.MustRegister(&StatsCollector{Dir: statsDir})
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, "<html><body><h1>rdmakit exporter</h1><p><a href=\"/metrics\">metrics</a></p></body></html>\n")
	})
	return mux
}

// Serve serves Handler(root, statsDir) on ln until ctx is done, then
// shuts the server down (waiting up to 5 s for scrapes in progress).
func Serve(ctx context.Context, ln net.Listener, root, statsDir string) error {
	srv := &http.Server{Handler: Handler(root, statsDir), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// Main runs rdmakit exporter with the command line args.
func Main(args []string) int { return run(args, os.Stdout, os.Stderr) }

func run(args []string, stdout, stderr io.Writer) int {
	fl := flag.NewFlagSet("exporter", flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	listen := fl.String("listen", DefaultListen, "")
	root := fl.String("root", "", "")
	statsDir := fl.String("stats-dir", os.Getenv(stats.EnvDir), "")
	if err := fl.Parse(args); err != nil {
		if err == flag.ErrHelp {
			fmt.Fprint(stdout, usage)
			return cli.ExitOK
		}
		fmt.Fprintf(stderr, "rdmakit exporter: %v\n%s", err, usage)
		return cli.ExitUsage
	}
	if fl.NArg() > 0 {
		fmt.Fprintf(stderr, "rdmakit exporter: unexpected argument %q\n%s", fl.Arg(0), usage)
		return cli.ExitUsage
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "rdmakit exporter: %v\n", err)
		return cli.ExitFailure
	}
	fmt.Fprintf(stderr, "rdmakit exporter: serving http://%s/metrics\n", ln.Addr())
	sig := cli.NotifySignals(context.Background())
	defer sig.Stop()
	if err := Serve(sig, ln, *root, *statsDir); err != nil {
		fmt.Fprintf(stderr, "rdmakit exporter: %v\n", err)
		return cli.ExitFailure
	}
	return sig.Status()
}
