package transferbench

// rdmakit kv: serve, put, get, rm, ls and bench of the KV store
// (transfer/kv). KVMain runs in its caller's goroutine; bench runs
// --clients workers, each with its own store handle (its own transfer
// node), and a progress goroutine on a terminal.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/kv"
)

// KVSummary is the one-line description of the kv command.
const KVSummary = "KV-cache store: serve, put, get, rm, ls, bench (redis-benchmark-style ops/s, GB/s, p50/p99)"

// EnvKVSecret is the environment variable with the store's shared secret
// in hex.
const EnvKVSecret = "RDMAKIT_KV_SECRET"

const kvUsage = `usage: rdmakit kv serve [--listen ADDR] [--addr MASTER] [--capacity BYTES]   (no --addr: runs the master)
       rdmakit kv serve --metadata etcd://HOST:2379,... [--listen ADDR] [--capacity BYTES]
                                              (every such node runs for master through etcd;
                                               a survivor takes over when the master goes)
       rdmakit kv put --addr MASTER KEY [VALUE]     (no VALUE: standard input)
       rdmakit kv get --addr MASTER KEY             (the value to standard output)
       rdmakit kv rm --addr MASTER KEY...
       rdmakit kv ls --addr MASTER [--prefix P] [--limit N]
       rdmakit kv bench [--addr MASTER] --size BYTES --clients N --ops N   (no --addr: starts a store here)

MASTER may be an etcd:// URL: the master elected there (and found again after a
failover). The secret is read from $` + EnvKVSecret + ` (hex, at least 16 bytes) or --secret-file;
--insecure runs without one. Flags:
`

type kvConfig struct {
	cmd       string
	addr      string
	listen    string
	metadata  string
	device    string
	capacity  int64
	replicas  int
	prefix    string
	limit     int
	size      int
	clients   int
	ops       int
	keys      int
	tests     string
	copyAPI   bool
	secret    []byte
	insecure  bool
	progress  bool
	secretArg string
}

var kvCommands = []string{"serve", "put", "get", "rm", "ls", "bench"}

// KVMain runs the kv command with args (after "kv") and returns the exit
// status.
func KVMain(args []string) int {
	st, err := os.Stdout.Stat()
	tty := err == nil && st.Mode()&os.ModeCharDevice != 0
	return kvRun(args, os.Stdin, os.Stdout, os.Stderr, tty)
}

func kvRun(args []string, stdin io.Reader, stdout, stderr io.Writer, tty bool) int {
	help := len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help")
	if !help && (len(args) == 0 || !slices.Contains(kvCommands, args[0])) {
		fmt.Fprint(stderr, kvUsage)
		return cli.ExitUsage
	}
	c := kvConfig{cmd: args[0], progress: tty}
	fs := flag.NewFlagSet("kv "+c.cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", "", "the master's address, or etcd://... to find it there (serve: join it as a store node; bench: empty starts a store here)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:0", "serve: where the master listens")
	fs.StringVar(&c.metadata, "metadata", "", "serve: the metadata in etcd, etcd://host:2379,...[/prefix]: the node runs for master there, the master's table is kept there (default: the master's node serves the metadata, the table is in its memory)")
	fs.StringVar(&c.device, "device", "", "the device to use: shm0, tcp0, an RDMA NIC (default: chosen per peer)")
	fs.Int64Var(&c.capacity, "capacity", 1<<30, "serve/bench: bytes of values this node holds")
	fs.IntVar(&c.replicas, "replicas", 1, "put/bench: store nodes per value")
	fs.StringVar(&c.prefix, "prefix", "", "ls: only keys with this prefix")
	fs.IntVar(&c.limit, "limit", 1000, "ls: at most this many keys")
	fs.IntVar(&c.size, "size", 4096, "bench: value size in bytes")
	fs.IntVar(&c.clients, "clients", 1, "bench: concurrent clients, each its own node")
	fs.IntVar(&c.ops, "ops", 10000, "bench: operations per test, over all clients")
	fs.IntVar(&c.keys, "keys", 100, "bench: distinct keys")
	fs.StringVar(&c.tests, "tests", "put,get", "bench: put, get or both, in that order")
	fs.BoolVar(&c.copyAPI, "copy", false, "bench: Put/GetInto of []byte (one copy each way) instead of registered memory")
	fs.StringVar(&c.secretArg, "secret-file", "", "file holding the shared secret (raw bytes)")
	fs.BoolVar(&c.insecure, "insecure", false, "run without a secret (trusted networks only)")
	if help {
		fs.SetOutput(stdout)
		fmt.Fprint(stdout, kvUsage)
		fs.PrintDefaults()
		return cli.ExitOK
	}
	fs.Usage = func() {}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprint(stdout, kvUsage)
			fs.PrintDefaults()
			return cli.ExitOK
		}
		fmt.Fprintln(stderr, "(rdmakit kv -h lists the flags)")
		return cli.ExitUsage
	}
	rest := fs.Args()
	bad := func(why string) int {
		fmt.Fprintf(stderr, "kv %s: %s (see rdmakit kv -h)\n", c.cmd, why)
		return cli.ExitUsage
	}
	switch c.cmd {
	case "serve", "ls":
		if len(rest) > 0 {
			return bad("unexpected arguments")
		}
	case "put":
		if len(rest) < 1 || len(rest) > 2 {
			return bad("want KEY [VALUE]")
		}
	case "get":
		if len(rest) != 1 {
			return bad("want KEY")
		}
	case "rm":
		if len(rest) == 0 {
			return bad("want KEY...")
		}
	case "bench":
		if len(rest) > 0 || c.size < 0 || c.clients <= 0 || c.ops <= 0 || c.keys <= 0 {
			return bad("bad arguments")
		}
		for _, t := range strings.Split(c.tests, ",") {
			if t != "put" && t != "get" {
				return bad("--tests takes put and get")
			}
		}
	}
	if c.addr == "" && c.cmd != "serve" && c.cmd != "bench" {
		return bad("--addr is required")
	}
	if c.capacity < 0 || c.replicas <= 0 || c.limit < 0 {
		return bad("bad arguments")
	}
	if c.metadata != "" && (c.cmd != "serve" || c.addr != "" || !transfer.IsEtcdURL(c.metadata)) {
		return bad("--metadata takes an etcd:// URL, for the master (serve without --addr)")
	}
	secret, code := readSecret(EnvKVSecret, c.secretArg, c.insecure, c.cmd == "bench" && c.addr == "", stderr)
	if code != 0 {
		return code
	}
	c.secret = secret
	sig := cli.NotifySignals(context.Background())
	defer sig.Stop()
	var err error
	switch c.cmd {
	case "serve":
		err = kvServe(sig, c, stdout)
	case "bench":
		err = kvBench(sig, c, stdout, stderr)
	default:
		err = kvClient(sig, c, rest, stdin, stdout)
	}
	if s := sig.Status(); s != 0 {
		return s
	}
	if err != nil {
		msg := err.Error()
		if !strings.HasPrefix(msg, "kv:") {
			msg = "kv: " + msg
		}
		fmt.Fprintln(stderr, msg)
		return cli.ExitFailure
	}
	return cli.ExitOK
}

// readSecret reads the shared secret from file, else from $env (hex);
// with neither it runs insecure if asked, or makes a fresh one when both
// ends are this process's (ours). It returns a usage exit status on error.
func readSecret(env, file string, insecure, ours bool, stderr io.Writer) ([]byte, int) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return nil, cli.ExitUsage
		}
		return b, 0
	case os.Getenv(env) != "":
		b, err := hex.DecodeString(os.Getenv(env))
		if err != nil {
			fmt.Fprintf(stderr, "$%s: %v\n", env, err)
			return nil, cli.ExitUsage
		}
		return b, 0
	case insecure:
		return nil, 0
	case ours:
		b := make([]byte, 32)
		rand.Read(b)
		return b, 0
	}
	fmt.Fprintf(stderr, "no secret: set $%s or --secret-file, or --insecure\n", env)
	return nil, cli.ExitUsage
}

func (c kvConfig) store(addr string, capacity int64, name string) kv.Config {
	cfg := kv.Config{Addr: addr, ListenAddr: c.listen, Capacity: capacity, Replicas: c.replicas,
		Transfer: transfer.Config{Name: name, Secret: c.secret, Insecure: c.insecure, MetadataAddr: c.metadata}}
	if c.device != "" {
		cfg.Transfer.Devices = []string{c.device}
	}
	return cfg
}

func kvServe(ctx context.Context, c kvConfig, stdout io.Writer) error {
	s, err := kv.Open(ctx, c.store(c.addr, c.capacity, ""))
	if err != nil {
		return err
	}
	defer s.Close()
	role := "store node of master"
	switch {
	case c.addr == "" && c.metadata != "":
		role = "store node (running for master through etcd), master now"
	case c.addr == "":
		role = "master (and store node) at"
	}
	fmt.Fprintf(stdout, "kv: %s %s, node %s, %d bytes, devices %v\n", role, s.Addr(), s.Node().Name(), c.capacity, s.Node().Devices())
	<-ctx.Done()
	return nil
}

func kvClient(ctx context.Context, c kvConfig, args []string, stdin io.Reader, stdout io.Writer) error {
	s, err := kv.Open(ctx, c.store(c.addr, 0, ""))
	if err != nil {
		return err
	}
	defer s.Close()
	switch c.cmd {
	case "put":
		var v []byte
		if len(args) == 2 {
			v = []byte(args[1])
		} else if v, err = io.ReadAll(io.LimitReader(stdin, kv.DefaultMaxValueLen+1)); err != nil {
			return err
		}
		return s.Put(ctx, []byte(args[0]), v)
	case "get":
		v, err := s.Get(ctx, []byte(args[0]))
		if err != nil {
			return fmt.Errorf("get %q: %w", args[0], err)
		}
		_, err = stdout.Write(v)
		return err
	case "rm":
		keys := make([][]byte, len(args))
		for i, a := range args {
			keys[i] = []byte(a)
		}
		return s.RemoveBatch(ctx, keys)
	}
	keys, err := s.List(ctx, []byte(c.prefix), c.limit)
	if err != nil {
		return err
	}
	for _, k := range keys {
		fmt.Fprintf(stdout, "%q\t%d\n", k.Key, k.Size)
	}
	return nil
}

func kvBench(ctx context.Context, c kvConfig, stdout, stderr io.Writer) error {
	addr := c.addr
	if addr == "" {
		// A store node of our own, holding every key (and room for the
		// versions being replaced).
		capacity := max(c.capacity, int64(c.keys+2*c.clients)*int64(c.size+64)+1<<20)
		srv, err := kv.Open(ctx, c.store("", capacity, fmt.Sprintf("kv-store-%d", os.Getpid())))
		if err != nil {
			return err
		}
		defer srv.Close()
		addr = srv.Addr()
	}
	clients := make([]*kv.Store, c.clients)
	bufs := make([]kv.Buf, c.clients)
	defer func() {
		for _, s := range clients {
			if s != nil {
				s.Close()
			}
		}
	}()
	for i := range clients {
		s, err := kv.Open(ctx, c.store(addr, 0, fmt.Sprintf("kv-bench-%d-%d", os.Getpid(), i)))
		if err != nil {
			return err
		}
		clients[i] = s
		mr, err := s.AllocMR(max(c.size, 1))
		if err != nil {
			return err
		}
		b := mr.Bytes()
		for j := range b {
			b[j] = byte(j*7 + i)
		}
		bufs[i] = kv.Buf{MR: mr, Len: c.size}
	}
	keys := make([][]byte, c.keys)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("key:%012d", i))
	}
	fmt.Fprintf(stdout, "kv bench: %d clients, %d ops per test, %d-byte values, %d keys, devices %v, %s\n",
		c.clients, c.ops, c.size, c.keys, clients[0].Node().Devices(), map[bool]string{true: "[]byte API (copies)", false: "registered memory (zero-copy)"}[c.copyAPI])
	tests := strings.Split(c.tests, ",")
	if slices.Contains(tests, "get") && !slices.Contains(tests, "put") {
		// Get needs the keys.
		for _, k := range keys {
			if err := clients[0].PutMR(ctx, k, bufs[0]); err != nil {
				return err
			}
		}
	}
	for _, t := range tests {
		if err := kvBenchOne(ctx, c, t, clients, bufs, keys, stdout, stderr); err != nil {
			return err
		}
	}
	return nil
}

func kvBenchOne(ctx context.Context, c kvConfig, test string, clients []*kv.Store, bufs []kv.Buf, keys [][]byte, stdout, stderr io.Writer) error {
	var next, done, misses atomic.Int64
	lat := make([][]time.Duration, len(clients))
	var wg sync.WaitGroup
	errs := make(chan error, len(clients))
	stopProgress := make(chan struct{})
	var pwg sync.WaitGroup
	if c.progress {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.NewTicker(200 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stopProgress:
					fmt.Fprintf(stderr, "\r%60s\r", "")
					return
				case <-t.C:
					d := done.Load()
					w := int(40 * d / int64(c.ops))
					fmt.Fprintf(stderr, "\r%s [%-40s] %3d%%", strings.ToUpper(test), strings.Repeat("#", w), 100*d/int64(c.ops))
				}
			}
		}()
	}
	start := time.Now()
	for i, s := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := make([]time.Duration, 0, c.ops/len(clients)+1)
			val := make([]byte, c.size)
			copy(val, bufs[i].MR.Bytes())
			for ctx.Err() == nil {
				k := next.Add(1) - 1
				if k >= int64(c.ops) {
					break
				}
				key := keys[k%int64(len(keys))]
				t0 := time.Now()
				var err error
				switch {
				case test == "put" && c.copyAPI:
					err = s.Put(ctx, key, val)
				case test == "put":
					err = s.PutMR(ctx, key, bufs[i])
				case c.copyAPI:
					var n int
					n, err = s.GetInto(ctx, key, val)
					if err == nil && n != c.size {
						err = fmt.Errorf("value of %d bytes, want %d", n, c.size)
					}
				default:
					var n int
					n, err = s.GetMR(ctx, key, bufs[i])
					if err == nil && n != c.size {
						err = fmt.Errorf("value of %d bytes, want %d", n, c.size)
					}
				}
				if errors.Is(err, kv.ErrNotFound) {
					// Evicted (the keys outgrow the store): a miss.
					misses.Add(1)
					err = nil
				}
				if err != nil {
					errs <- fmt.Errorf("%s %q: %w", test, key, err)
					return
				}
				l = append(l, time.Since(t0))
				done.Add(1)
			}
			lat[i] = l
		}()
	}
	wg.Wait()
	el := time.Since(start)
	close(stopProgress)
	pwg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e6
	}
	ops := float64(len(all)) / el.Seconds()
	miss := ""
	if m := misses.Load(); m > 0 {
		miss = fmt.Sprintf(", %d misses (evicted: the keys outgrow the store)", m)
	}
	fmt.Fprintf(stdout, "%s: %.1f ops/s, %.2f GB/s, p50 %.3f ms, p99 %.3f ms%s\n",
		strings.ToUpper(test), ops, float64(int64(len(all))-misses.Load())*float64(c.size)/el.Seconds()/1e9, pct(0.50), pct(0.99), miss)
	return nil
}
