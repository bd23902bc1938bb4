// Package transferbench is rdmakit transfer: "bench", a throughput
// benchmark of the transfer engine after Mooncake's transfer_engine_bench
// (--block-size, --batch-size, --threads, --duration, --op, --device;
// prints GB/s), and "target", a node that serves a segment for benches on
// other hosts. cmd/rdmakit registers Main as the transfer command.
//
// Goroutines: Main runs in its caller's; bench runs --threads workers,
// each submitting one batch at a time and waiting for it, and waits for
// them.
package transferbench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/transfer"
)

// Summary is the one-line description of the command.
const Summary = "transfer engine: bench (Mooncake transfer_engine_bench-style GB/s) and target"

// EnvSecret is the environment variable with the shared secret in hex.
const EnvSecret = "RDMAKIT_TRANSFER_SECRET"

const usage = `usage: rdmakit transfer bench [flags]    (initiator; with no --metadata it starts a target on this host)
       rdmakit transfer target [flags]   (serves segment --segment of --buffer-size bytes)

The secret is read from $` + EnvSecret + ` (hex, at least 16 bytes) or --secret-file;
--insecure runs without one. Flags:
`

type config struct {
	mode      string
	metadata  string
	listen    string
	segment   string
	device    string
	op        string
	blockSize int
	batchSize int
	threads   int
	duration  time.Duration
	bufSize   int
	sliceSize int
	qps       int
	secret    []byte
	insecure  bool
}

// Main runs the command with args (after "transfer") and returns the exit
// status.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	help := len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
	if !help && (len(args) == 0 || (args[0] != "bench" && args[0] != "target")) {
		fmt.Fprint(stderr, usage)
		return cli.ExitUsage
	}
	c := config{mode: args[0]}
	fs := flag.NewFlagSet("transfer "+c.mode, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	defer func() {
		if help {
			fs.SetOutput(stdout)
			fmt.Fprint(stdout, usage)
			fs.PrintDefaults()
		}
	}()
	fs.StringVar(&c.metadata, "metadata", "", "metadata address of the target node (bench; empty: start a target here)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "the node's listen address (target: where its metadata service listens)")
	fs.StringVar(&c.segment, "segment", "bench", "the target's segment name")
	fs.StringVar(&c.device, "device", "", "the device to use: shm0, tcp0, roceN (software RoCEv2), an RDMA NIC (default: chosen per peer)")
	fs.StringVar(&c.op, "op", "read", "read or write")
	fs.IntVar(&c.blockSize, "block-size", 65536, "bytes per request")
	fs.IntVar(&c.batchSize, "batch-size", 128, "requests per batch")
	fs.IntVar(&c.threads, "threads", 4, "concurrent submitting threads")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "how long to run")
	fs.IntVar(&c.sliceSize, "slice-size", 0, "bytes per work request (default the engine's, 1 MiB)")
	fs.IntVar(&c.qps, "qps", 0, "QPs per peer and device (default the engine's, 4)")
	fs.IntVar(&c.bufSize, "buffer-size", 0, "the target segment's size (default: threads × batch-size × block-size, at least 1 MiB)")
	secretFile := fs.String("secret-file", "", "file holding the shared secret (raw bytes)")
	fs.BoolVar(&c.insecure, "insecure", false, "run without a secret (trusted networks only)")
	if help {
		return cli.ExitOK
	}
	fs.Usage = func() {}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			help = true
			return cli.ExitOK
		}
		fmt.Fprintln(stderr, "(rdmakit transfer -h lists the flags)")
		return cli.ExitUsage
	}
	if fs.NArg() > 0 || (c.op != "read" && c.op != "write") || c.blockSize <= 0 || c.batchSize <= 0 || c.threads <= 0 || c.duration <= 0 {
		fmt.Fprintln(stderr, "transfer: bad arguments (see rdmakit transfer -h)")
		return cli.ExitUsage
	}
	if c.bufSize == 0 {
		c.bufSize = max(c.threads*c.batchSize*c.blockSize, 1<<20)
	}
	secret, code := readSecret(EnvSecret, *secretFile, c.insecure, c.mode == "bench" && c.metadata == "", stderr)
	if code != 0 {
		return code
	}
	c.secret = secret
	sig := cli.NotifySignals(context.Background())
	defer sig.Stop()
	var err error
	if c.mode == "target" {
		err = target(sig, c, stdout)
	} else {
		err = bench(sig, c, stdout)
	}
	if s := sig.Status(); s != 0 {
		return s
	}
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "transfer:") {
			msg = "transfer: " + msg
		}
		fmt.Fprintln(stderr, msg)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

func nodeConfig(c config, name string) transfer.Config {
	cfg := transfer.Config{Name: name, ListenAddr: c.listen, Secret: c.secret, Insecure: c.insecure, SliceSize: c.sliceSize, QPsPerPeer: c.qps}
	if c.device != "" {
		cfg.Devices = []string{c.device}
	}
	return cfg
}

// startTarget starts a node serving the metadata table and the segment.
func startTarget(ctx context.Context, c config) (*transfer.Node, error) {
	n, err := transfer.New(ctx, nodeConfig(c, fmt.Sprintf("target-%d", os.Getpid())))
	if err != nil {
		return nil, err
	}
	mr, err := n.AllocSegment(ctx, c.segment, c.bufSize)
	if err != nil {
		n.Close()
		return nil, err
	}
	b := mr.Bytes()
	for i := range b {
		b[i] = byte(i)
	}
	return n, nil
}

func target(ctx context.Context, c config, stdout io.Writer) error {
	n, err := startTarget(ctx, c)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Fprintf(stdout, "target: segment %q (%d bytes) on %v; metadata at %s\n", c.segment, c.bufSize, n.Devices(), n.Addr())
	<-ctx.Done()
	return nil
}

func bench(ctx context.Context, c config, stdout io.Writer) error {
	if c.metadata == "" {
		t, err := startTarget(ctx, c)
		if err != nil {
			return err
		}
		defer t.Close()
		c.metadata = t.Addr()
	}
	cfg := nodeConfig(c, fmt.Sprintf("initiator-%d", os.Getpid()))
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.MetadataAddr = c.metadata
	n, err := transfer.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	seg, err := n.OpenSegment(ctx, c.segment)
	if err != nil {
		return err
	}
	per := c.batchSize * c.blockSize
	buf, err := n.AllocMR(c.threads * per)
	if err != nil {
		return err
	}
	op := transfer.Read
	if c.op == "write" {
		op = transfer.Write
	}
	blocks := int(seg.Size) / c.blockSize
	if blocks == 0 {
		return fmt.Errorf("segment %q (%d bytes) is smaller than a block", c.segment, seg.Size)
	}
	fmt.Fprintf(stdout, "transfer bench: %s, block %d B, batch %d, %d threads, %v, segment %q (%d bytes on %s, devices %v)\n",
		c.op, c.blockSize, c.batchSize, c.threads, c.duration, c.segment, seg.Size, seg.Node, seg.Devices)
	var bytes atomic.Int64
	var batches atomic.Int64
	stop := time.Now().Add(c.duration)
	var wg sync.WaitGroup
	errs := make(chan error, c.threads)
	start := time.Now()
	for th := 0; th < c.threads; th++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]transfer.Request, c.batchSize)
			next := th * c.batchSize
			for time.Now().Before(stop) && ctx.Err() == nil {
				for i := range reqs {
					reqs[i] = transfer.Request{Op: op, Local: buf, LocalOffset: th*per + i*c.blockSize,
						Segment: c.segment, Offset: uint64(next%blocks) * uint64(c.blockSize), Length: c.blockSize}
					next++
				}
				b, err := n.Submit(ctx, reqs)
				if err == nil {
					err = b.Wait(ctx)
				}
				if err != nil {
					if ctx.Err() == nil {
						errs <- err
					}
					return
				}
				bytes.Add(int64(per))
				batches.Add(1)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Test completed: duration %.2f s, batch count %d, throughput %.2f GB/s\n",
		el.Seconds(), batches.Load(), float64(bytes.Load())/el.Seconds()/1e9)
	return nil
}
