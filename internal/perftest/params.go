package perftest

// Parameters: the tests, the user's options (zero value = perftest's
// defaults), the command-line parser, and the resolution of options into
// the effective configuration of a run (perftest's force_dependencies).
// Everything here runs in the caller's goroutine.

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/verbs"
)

// Verb is the operation a test measures.
type Verb int

// Verbs. The zero value is no verb, so that a zero Test is invalid.
const (
	VerbSend Verb = iota + 1
	VerbWrite
	VerbRead
	VerbAtomic
)

// Kind says whether a test measures bandwidth or latency.
type Kind int

// Kinds.
const (
	KindBW Kind = iota + 1
	KindLat
)

// Test is one of the eight perftest tests.
type Test struct {
	Verb Verb
	Kind Kind
}

var verbNames = map[Verb]string{VerbSend: "send", VerbWrite: "write", VerbRead: "read", VerbAtomic: "atomic"}

// perftest's testsStr, used in the header's title line.
var verbTitles = map[Verb]string{VerbSend: "Send", VerbWrite: "RDMA_Write", VerbRead: "RDMA_Read", VerbAtomic: "Atomic"}

// Tests lists the test names, in perftest's order.
var Tests = []string{"send_bw", "send_lat", "write_bw", "write_lat", "read_bw", "read_lat", "atomic_bw", "atomic_lat"}

// ParseTest parses a test name: send_bw ... atomic_lat, with or without
// perftest's "ib_" prefix.
func ParseTest(name string) (Test, error) {
	n := strings.TrimPrefix(name, "ib_")
	verb, kind, ok := strings.Cut(n, "_")
	if ok {
		var t Test
		for v, s := range verbNames {
			if s == verb {
				t.Verb = v
			}
		}
		switch kind {
		case "bw":
			t.Kind = KindBW
		case "lat":
			t.Kind = KindLat
		}
		if t.Valid() {
			return t, nil
		}
	}
	return Test{}, fmt.Errorf("unknown test %q (tests: %s)", name, strings.Join(Tests, ", "))
}

// Valid reports whether t names a test.
func (t Test) Valid() bool {
	return verbNames[t.Verb] != "" && (t.Kind == KindBW || t.Kind == KindLat)
}

func (t Test) String() string {
	if !t.Valid() {
		return "invalid-test"
	}
	if t.Kind == KindBW {
		return verbNames[t.Verb] + "_bw"
	}
	return verbNames[t.Verb] + "_lat"
}

// AtomicOp is the operation of the atomic tests (-A).
type AtomicOp int

// Atomic operations; the zero value is perftest's default, FETCH_AND_ADD.
const (
	FetchAndAdd AtomicOp = iota
	CmpAndSwap
)

func (a AtomicOp) String() string {
	if a == CmpAndSwap {
		return "CMP_AND_SWAP"
	}
	return "FETCH_AND_ADD"
}

// Options are a run's parameters, as given on the command line. The zero
// value of every field means perftest's default for the test.
type Options struct {
	Test Test
	// Server is the server's host name or address; empty makes this side
	// the server.
	Server string
	// Port is the TCP port of the out-of-band exchange (-p, 18515).
	Port int
	// Device is the device to use (-d). Client default: shm0 with
	// Loopback, tcp0 otherwise. Server default: the client's choice.
	Device string
	// All runs every size from 2 bytes to 8 MiB (-a).
	All bool
	// Size is the message size in bytes (-s; 65536 for bw, 2 for lat, 8
	// for atomics).
	Size int64
	// Iters is the number of iterations (-n; 5000 for write_bw, 1000
	// otherwise).
	Iters int64
	// Duration runs for this many seconds instead of Iters (-D).
	Duration int
	// Histogram prints every sorted latency sample (-H).
	Histogram bool
	// QPs is the number of queue pairs (-q, 1).
	QPs int
	// Inline is the max inline size (-I). 0 means perftest's default
	// (220 for write_lat, 236 for send_lat, none otherwise); negative means
	// no inline data.
	Inline int
	// TxDepth is the send queue depth (-t; 128 for bw, 1 for lat).
	TxDepth int
	// RxDepth is the receive queue depth (-r; 512 for send tests).
	RxDepth int
	// CQMod signals every CQMod-th work request (-Q, 100; 1 above 8 KiB
	// unless given).
	CQMod int
	// Bidir runs a bandwidth test in both directions at once (-b).
	Bidir bool
	// Atomic is the atomic operation (-A).
	Atomic AtomicOp
	// MTU is the path MTU in bytes (-m; default the port's active MTU).
	MTU int
	// Conn is the connection type (-c); only "RC" (the default) exists.
	Conn string
	// ReportGbits reports bandwidth in Gb/sec instead of MiB/sec.
	ReportGbits bool
	// OutJSON, if set, is a file to write the results to as JSON.
	OutJSON string
	// Plot, if set, is a PNG file to draw the results into.
	Plot string
	// Loopback runs the server as a child process on this host and this
	// process as the client.
	Loopback bool
	// PerftestWire is accepted for earlier releases' --perftest-wire: a
	// perftest peer is now recognized by its first message (pwire_run.go).
	PerftestWire bool

	// Infinite (--run_infinitely) repeats a bandwidth test until the
	// client is interrupted (SIGINT, SIGTERM: ctx ends), printing one
	// result every Duration seconds (-D; default 5), with no warm-up or
	// cool-down margin; both sides then end cleanly and Run returns nil.
	Infinite bool

	// SL (-S) and TrafficClass (-T, --tclass) go into the QPs' address
	// handle (verbs.AddressHandle): the service level on InfiniBand, the
	// GRH traffic class (on RoCE v2 the IP ToS byte) on ibverbs devices;
	// software devices ignore them.
	SL           uint8
	TrafficClass uint8

	// GIDIndex is the source GID index (-x); it applies when SetGIDIndex
	// is true and becomes verbs.Options{GIDIndex, SetGIDIndex}.
	GIDIndex    int
	SetGIDIndex bool
	// IBPort is the device port (-i; 0 means perftest's default, 1).
	IBPort int
	// QPTimeout is the QP's local ACK timeout exponent (-u; perftest's
	// default 14 unless SetQPTimeout) and RetryCount its retry count
	// (--retry_count; 7 unless SetRetryCount): verbs.QPAttr's Timeout and
	// RetryCount at RTS, which the transport applies as it can.
	QPTimeout     int
	SetQPTimeout  bool
	RetryCount    int
	SetRetryCount bool
	// PostList posts work requests in lists of this many, the last one
	// signaled (-l; bandwidth tests; CQ moderation becomes the list
	// length, as in perftest).
	PostList int
	// Events waits for completions in the driver's blocking wait instead
	// of spinning (-e, perftest's completion events).
	Events bool
	// NoPeak skips the BW peak (-N), printed as 0.00 as perftest does.
	NoPeak bool
	// Unsorted prints every latency sample in the order measured (-U,
	// which implies -H).
	Unsorted bool
	// DualPort is perftest's -O (two ports of the device).
	DualPort bool
	// Output prints only one figure (--output): "bandwidth" (BW average),
	// "message_rate" (MsgRate) or "latency" (t_avg), with no header.
	Output string
	// ReportBoth prints the two directions of a bidirectional run
	// separately before their sum (--report-both).
	ReportBoth bool
	// SourceIP is the local address the client's exchange connection
	// comes from (--source_ip).
	SourceIP string
	// Version asks for the version (-V); ParseArgs returns ErrVersion.
	Version bool
	// OutReads is the number of outstanding RDMA Reads and atomics per QP
	// (-o; 0 means 16).
	OutReads int
	// Margin is the warm-up and cool-down around the measured window of a
	// -D run, in seconds (-f; 0 means a quarter of -D).
	Margin int

	// CPUUtil is --cpu_util: in duration mode (-D) the bandwidth line
	// ends with the host's CPU utilization over the measured window, as
	// perftest computes it from /proc/stat (user time over user plus idle
	// time).
	CPUUtil bool

	// RDMACM is -R: perftest's exchange over rdma_cm (rcm.go), where the
	// build and the device have rdma_cm.
	RDMACM bool
	// CommCM is -z: perftest's exchange over rdma_cm with the test QPs
	// connected by the exchanged keys (rcm.go), where the build and the
	// device have rdma_cm.
	CommCM bool

	// Notes are one line each about flags accepted for perftest
	// compatibility whose effect does not exist here; the CLI prints them
	// on stderr.
	Notes []string
}

// DefaultPort is perftest's default exchange port.
const DefaultPort = 18515

// Limits and defaults of perftest (perftest_parameters.h).
const (
	defSizeBW   = 65536
	defSizeLat  = 2
	defSizeAtom = 8
	defIters    = 1000
	defItersWB  = 5000
	defTxBW     = 128
	defTxLat    = 1
	defRxSend   = 512
	defCQMod    = 100
	minIter     = 5
	maxTx       = 15000
	maxRx       = 16384
	maxQPs      = 16384
	maxCQMod    = 1024
	maxInline   = 1024
	maxSizeAll  = 1 << 23 // -a runs 2 B ... 8 MiB
	// defInfinitePeriod is --run_infinitely's reporting period without -D
	// (perftest's default duration).
	defInfinitePeriod = 5
	maxMsgSize        = 1<<31 - 1
	cqModLimit        = 8192 // CQ moderation is disabled above this size
	noPeakIters       = 20000
	defInlineWr       = 220
	defInlineSnd      = 236
	outReads          = 16
)

// ErrUsage marks command-line mistakes (the CLI exits with status 2).
var ErrUsage = errors.New("usage")

// ErrHelp is returned by ParseArgs for -h/--help.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by ParseArgs for -V/--version.
var ErrVersion = errors.New("version requested")

// ErrNoGPU is returned (wrapped in ErrUsage) for perftest's GPU memory
// flags (--use_cuda and friends).
var ErrNoGPU = errors.New("no GPU support in this build")

func usageErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, a...))
}

type flagSpec struct {
	short  byte
	long   []string
	hasArg bool
	set    func(o *Options, v string) error
}

func intArg(name string, lo, hi int64, dst func(int64)) func(*Options, string) error {
	return func(_ *Options, v string) error {
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			return usageErr("%s: %q is not a number", name, v)
		}
		if n < lo || n > hi {
			return usageErr("%s must be between %d and %d, not %d", name, lo, hi, n)
		}
		dst(n)
		return nil
	}
}

// note returns a setter that records a one-line note about a flag that is
// accepted for compatibility but has no effect here.
func note(text string) func(*Options, string) error {
	return func(o *Options, _ string) error {
		for _, n := range o.Notes {
			if n == text {
				return nil
			}
		}
		o.Notes = append(o.Notes, text)
		return nil
	}
}

// appendNote adds text to notes unless it is there.
func appendNote(notes []string, text string) []string {
	for _, n := range notes {
		if n == text {
			return notes
		}
	}
	return append(notes, text)
}

// noteArg is note for a flag with a value, checked by check (nil: any).
func noteArg(text string, check func(string) error) func(*Options, string) error {
	n := note(text)
	return func(o *Options, v string) error {
		if check != nil {
			if err := check(v); err != nil {
				return err
			}
		}
		return n(o, v)
	}
}

func numIn(name string, lo, hi int64) func(string) error {
	return func(v string) error {
		n, err := strconv.ParseInt(v, 0, 64)
		if err != nil {
			return usageErr("%s: %q is not a number", name, v)
		}
		if n < lo || n > hi {
			return usageErr("%s must be between %d and %d, not %d", name, lo, hi, n)
		}
		return nil
	}
}

// unsupported are perftest flags rdmakit perf knows and refuses, with why.
var unsupported = map[string]string{
	"use-srq":           "a shared receive queue is not used by rdmakit perf's send tests",
	"reversed":          "the server never sends in rdmakit perf's one-way tests (use -b for both directions)",
	"write_with_imm":    "rdmakit perf's write tests use RDMA Write without immediate data",
	"mcg":               "multicast groups need UD queue pairs; rdmakit has RC only",
	"MGID":              "multicast groups need UD queue pairs; rdmakit has RC only",
	"limit_bw":          "rate limiting is not implemented",
	"limit_msgrate":     "rate limiting is not implemented",
	"rate_limit":        "rate limiting is not implemented",
	"burst_size":        "rate limiting is not implemented",
	"pkey_index":        "rdmakit devices have no partition keys",
	"use-null-mr":       "null memory regions are not implemented",
	"use_hugepages":     "huge pages are not used for perf's buffers",
	"use_old_post_send": "there is one post interface",
}

// unknownFlag explains the perftest flags rdmakit perf knows and refuses;
// nil for the others ("unknown flag").
func unknownFlag(name string, long bool) error {
	if !long {
		if l, ok := unsupportedShort[name[0]]; ok {
			return usageErr("-%s (--%s) is not supported by rdmakit perf: %s", name, l, unsupported[l])
		}
		return nil
	}
	if why := unsupported[name]; why != "" {
		return usageErr("--%s is not supported by rdmakit perf: %s", name, why)
	}
	for _, g := range gpuFlags {
		if g.name == name {
			return fmt.Errorf("%w: --%s: %w: rdmakit perf measures host memory only", ErrUsage, name, ErrNoGPU)
		}
	}
	return nil
}

// unsupportedShort are the short names of unsupported flags.
var unsupportedShort = map[byte]string{'g': "mcg", 'M': "MGID", 'w': "limit_bw", 'y': "limit_msgrate"}

// gpuFlags are perftest's GPU and accelerator memory flags.
var gpuFlags = []struct {
	name   string
	hasArg bool
}{
	{"use_cuda", true}, {"use_cuda_bus_id", true}, {"use_cuda_dmabuf", false}, {"use_data_direct", false},
	{"cuda_mem_type", true}, {"gpu_touch", true}, {"use_rocm", true}, {"use_rocm_dmabuf", false},
	{"use_neuron", true}, {"use_neuron_dmabuf", false}, {"use_hl", true}, {"use_mlu", true},
	{"use_mlu_dmabuf", false}, {"use_opencl", true}, {"opencl_platform_id", true}, {"use_gaudi", true},
}

// flags returns the flag table for o (setters write into o).
func flags(o *Options) []flagSpec {
	return []flagSpec{
		{'a', []string{"all"}, false, func(o *Options, _ string) error { o.All = true; return nil }},
		{'s', []string{"size"}, true, func(o *Options, v string) error {
			n, err := parseSize(v)
			if err != nil {
				return err
			}
			o.Size = n
			return nil
		}},
		{'n', []string{"iters"}, true, intArg("-n (iterations)", minIter, 1<<32, func(n int64) { o.Iters = n })},
		{'D', []string{"duration"}, true, intArg("-D (duration)", 1, 1<<20, func(n int64) { o.Duration = int(n) })},
		{'H', []string{"report-histogrm", "report-histogram"}, false, func(o *Options, _ string) error { o.Histogram = true; return nil }},
		{'q', []string{"qp"}, true, intArg("-q (number of QPs)", 1, maxQPs, func(n int64) { o.QPs = int(n) })},
		{'I', []string{"inline_size"}, true, intArg("-I (inline size)", 0, maxInline, func(n int64) {
			o.Inline = int(n)
			if n == 0 {
				o.Inline = -1
			}
		})},
		{'t', []string{"tx-depth"}, true, intArg("-t (tx depth)", 1, maxTx, func(n int64) { o.TxDepth = int(n) })},
		{'r', []string{"rx-depth"}, true, intArg("-r (rx depth)", 1, maxRx, func(n int64) { o.RxDepth = int(n) })},
		{'Q', []string{"cq-mod"}, true, intArg("-Q (CQ moderation)", 1, maxCQMod, func(n int64) { o.CQMod = int(n) })},
		{'b', []string{"bidirectional"}, false, func(o *Options, _ string) error { o.Bidir = true; return nil }},
		{'A', []string{"atomic_type"}, true, func(o *Options, v string) error {
			switch v {
			case "CMP_AND_SWAP":
				o.Atomic = CmpAndSwap
			case "FETCH_AND_ADD":
				o.Atomic = FetchAndAdd
			default:
				return usageErr("invalid atomic type %q; choose CMP_AND_SWAP or FETCH_AND_ADD", v)
			}
			return nil
		}},
		{'p', []string{"port"}, true, intArg("-p (port)", 1, 65535, func(n int64) { o.Port = int(n) })},
		{'d', []string{"ib-dev"}, true, func(o *Options, v string) error {
			if v == "" {
				return usageErr("-d needs a device name (see rdmakit info)")
			}
			o.Device = v
			return nil
		}},
		{'m', []string{"mtu"}, true, func(o *Options, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || mtuEnum(n) == 0 {
				return usageErr("invalid MTU %q; choose 256, 512, 1024, 2048 or 4096", v)
			}
			o.MTU = n
			return nil
		}},
		{'F', []string{"CPU-freq"}, false, func(*Options, string) error { return nil }},
		{'c', []string{"connection"}, true, func(o *Options, v string) error {
			switch strings.ToUpper(v) {
			case "RC":
				o.Conn = "RC"
			case "UC", "UD", "XRC", "DC", "SRD", "RAWETH":
				return usageErr("connection type %s is not supported: rdmakit has RC queue pairs only (-c RC)", strings.ToUpper(v))
			default:
				return usageErr("invalid connection type %q; rdmakit supports RC only", v)
			}
			return nil
		}},
		{0, []string{"report_gbits"}, false, func(o *Options, _ string) error { o.ReportGbits = true; return nil }},
		{0, []string{"out_json", "out_json_file"}, true, func(o *Options, v string) error { o.OutJSON = v; return nil }},
		{0, []string{"plot"}, true, func(o *Options, v string) error { o.Plot = v; return nil }},
		{0, []string{"loopback"}, false, func(o *Options, _ string) error { o.Loopback = true; return nil }},
		{0, []string{"perftest-wire"}, false, func(o *Options, _ string) error { o.PerftestWire = true; return nil }},
		{'h', []string{"help"}, false, func(*Options, string) error { return ErrHelp }},
		{'V', []string{"version"}, false, func(o *Options, _ string) error { o.Version = true; return nil }},
		{'x', []string{"gid-index"}, true, intArg("-x (GID index)", 0, 255, func(n int64) { o.GIDIndex, o.SetGIDIndex = int(n), true })},
		{'i', []string{"ib-port"}, true, intArg("-i (IB port)", 1, 254, func(n int64) { o.IBPort = int(n) })},
		{'N', []string{"noPeak"}, false, func(o *Options, _ string) error { o.NoPeak = true; return nil }},
		{'U', []string{"report-unsorted"}, false, func(o *Options, _ string) error { o.Unsorted, o.Histogram = true, true; return nil }},
		{'O', []string{"dualport"}, false, func(o *Options, _ string) error { o.DualPort = true; return nil }},
		{0, []string{"output"}, true, func(o *Options, v string) error {
			switch v {
			case "bandwidth", "message_rate", "latency":
				o.Output = v
				return nil
			}
			return usageErr("invalid --output %q; choose bandwidth, message_rate or latency", v)
		}},
		{0, []string{"report-both"}, false, func(o *Options, _ string) error { o.ReportBoth = true; return nil }},
		{'j', []string{"source_ip"}, true, func(o *Options, v string) error {
			if net.ParseIP(v) == nil {
				return usageErr("--source_ip %q is not an IP address", v)
			}
			o.SourceIP = v
			return nil
		}},
		{'o', []string{"outs"}, true, intArg("-o (outstanding reads)", 1, 16, func(n int64) { o.OutReads = int(n) })},
		{'f', []string{"margin"}, true, intArg("-f (margin)", 1, 1<<20, func(n int64) { o.Margin = int(n) })},
		{'C', []string{"report-cycles"}, false, note("-C (report cycles): times are measured with Go's monotonic clock and reported in usec")},
		{'R', []string{"rdma_cm"}, false, func(o *Options, v string) error {
			o.RDMACM = true
			return note("-R (rdma_cm): with a roce device (-d roceN: rdmakit's own RDMA CM), or an ibverbs device in a build with -tags ibverbs, the exchange and the QPs' connections go through rdma_cm on -p, as perftest's -R (a client falls back to rdmakit's TCP exchange when no rdma_cm server answers); otherwise rdmakit's TCP exchange on -p connects the QPs")(o, v)
		}},
		{'z', []string{"comm_rdma_cm"}, false, func(o *Options, v string) error {
			o.CommCM = true
			return note("-z (comm_rdma_cm): with a roce device (-d roceN: rdmakit's own RDMA CM), or an ibverbs device in a build with -tags ibverbs, the exchange goes through rdma_cm on -p and the QPs are connected with the exchanged keys, as perftest's -z (a client falls back to rdmakit's TCP exchange when no rdma_cm server answers); otherwise rdmakit's TCP exchange on -p connects the QPs")(o, v)
		}},
		{'e', []string{"events"}, false, func(o *Options, _ string) error { o.Events = true; return nil }},
		{'l', []string{"post_list"}, true, intArg("-l (post list)", 1, maxTx, func(n int64) { o.PostList = int(n) })},
		{'u', []string{"qp-timeout"}, true, intArg("-u (QP timeout)", 0, 31, func(n int64) { o.QPTimeout, o.SetQPTimeout = int(n), true })},
		{'S', []string{"sl"}, true, intArg("-S (service level)", 0, 15, func(n int64) { o.SL = uint8(n) })},
		{'T', []string{"tos"}, true, intArg("-T (type of service)", 0, 255, func(n int64) { o.TrafficClass = uint8(n) })},
		{0, []string{"tclass"}, true, intArg("--tclass (traffic class)", 0, 255, func(n int64) { o.TrafficClass = uint8(n) })},
		{'W', []string{"report-counters"}, true, noteArg("-W (report counters): rdmakit devices have no performance counters to report", nil)},
		{0, []string{"retry_count"}, true, intArg("--retry_count", 0, 7, func(n int64) { o.RetryCount, o.SetRetryCount = int(n), true })},
		{0, []string{"mr_per_qp"}, false, note("--mr_per_qp: rdmakit always registers one memory region per QP")},
		{0, []string{"cpu_util"}, false, func(o *Options, _ string) error { o.CPUUtil = true; return nil }},
		{0, []string{"perform_warm_up"}, false, note("--perform_warm_up: bandwidth tests always warm up (-t signaled operations per QP), as documented in docs/perf.md")},
		{0, []string{"run_infinitely"}, false, func(o *Options, _ string) error { o.Infinite = true; return nil }},
	}
}

// parseSize parses -s: a number with an optional K or M suffix (as
// perftest) or G.
func parseSize(v string) (int64, error) {
	mult := int64(1)
	s := v
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "G"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(s, 0, 64)
	if err != nil || n < 1 || n > (1<<40)/mult {
		return 0, usageErr("invalid message size %q (-s takes bytes, optionally with K, M or G)", v)
	}
	return n * mult, nil
}

// ParseArgs parses the arguments of `rdmakit perf` (after the subcommand):
// TEST, flags, and an optional server address, in any order, with
// perftest's short and long flag names ("-s 64", "-s64", "--size=64",
// "--size 64"; boolean short flags may be bundled, "-aF"), by internal/cli.Getopt.
func ParseArgs(args []string) (Options, error) {
	var o Options
	g := cli.Getopt{Usagef: usageErr, Unknown: unknownFlag, Hint: "rdmakit perf -h lists the flags"}
	for _, sp := range flags(&o) {
		arg := cli.NoArg
		if sp.hasArg {
			arg = cli.RequiredArg
		}
		g.Flags = append(g.Flags, cli.Flag{Short: sp.short, Long: sp.long, Arg: arg,
			Set: func(v string, _ bool) error { return sp.set(&o, v) }})
	}
	pos, err := g.Parse(args)
	if err != nil {
		return o, err
	}
	if o.Version {
		return o, ErrVersion
	}
	if len(pos) == 0 {
		return o, usageErr("missing TEST (one of %s)", strings.Join(Tests, ", "))
	}
	t, err := ParseTest(pos[0])
	if err != nil {
		return o, fmt.Errorf("%w: %w", ErrUsage, err)
	}
	o.Test = t
	if len(pos) > 2 {
		return o, usageErr("unexpected argument %q (usage: rdmakit perf TEST [flags] [server-address])", pos[2])
	}
	if len(pos) == 2 {
		o.Server = pos[1]
	}
	if o.Loopback && o.Server != "" {
		return o, usageErr("--loopback starts its own server; drop the server address %q", o.Server)
	}
	return o, o.check()
}

// check validates the device-independent combinations (perftest's parser
// errors).
func (o *Options) check() error {
	t := o.Test
	if !t.Valid() {
		return usageErr("no test chosen")
	}
	if o.Infinite {
		switch {
		case t.Kind != KindBW:
			return usageErr("--run_infinitely is only available in bandwidth tests")
		case o.All:
			return usageErr("--run_infinitely runs one size: drop -a")
		case o.Bidir:
			return usageErr("--run_infinitely runs one direction: drop -b")
		case o.Loopback:
			return usageErr("--run_infinitely: start the server and the client separately (no --loopback)")
		case o.Margin != 0:
			return usageErr("--run_infinitely measures every period whole: drop -f")
		}
	}
	if o.Bidir && t.Kind == KindLat {
		return usageErr("-b (bidirectional) is only available in bandwidth tests")
	}
	if o.Histogram && t.Kind == KindBW {
		if o.Unsorted {
			return usageErr("-U (unsorted report) is only available in latency tests")
		}
		return usageErr("-H (histogram) is only available in latency tests")
	}
	switch {
	case o.Output == "latency" && t.Kind == KindBW:
		return usageErr("--output=latency is for latency tests; use bandwidth or message_rate")
	case (o.Output == "bandwidth" || o.Output == "message_rate") && t.Kind == KindLat:
		return usageErr("--output=%s is for bandwidth tests; use latency", o.Output)
	}
	if o.CPUUtil && (o.Duration == 0 || t.Kind != KindBW) {
		o.Notes = appendNote(o.Notes, "--cpu_util: CPU utilization is measured only in bandwidth tests with -D (duration), as perftest's")
	}
	if o.ReportBoth && !o.Bidir {
		return usageErr("--report-both reports the two directions of a bidirectional run: add -b")
	}
	if o.Events && t.Verb == VerbWrite && t.Kind == KindLat {
		o.Notes = appendNote(o.Notes, "-e (events): write_lat waits for the peer's data in memory, not for completions, so -e changes nothing there")
	}
	if o.PostList > 1 && t.Kind == KindLat {
		return usageErr("-l (post list) is only available in bandwidth tests")
	}
	if o.PostList > 1 && o.Iters != 0 && o.Iters%int64(o.PostList) != 0 {
		return usageErr("-n %d: the number of iterations must be a multiple of the post list (-l %d)", o.Iters, o.PostList)
	}
	if o.PostList > 1 && o.CQMod != 0 && o.CQMod != o.PostList {
		return usageErr("-Q %d: with a post list the CQ moderation is the list length (-l %d); drop -Q", o.CQMod, o.PostList)
	}
	if o.OutReads != 0 && t.Verb != VerbRead && t.Verb != VerbAtomic {
		return usageErr("-o (outstanding reads) is for the read and atomic tests")
	}
	if o.Margin != 0 && (o.Duration == 0 || 2*o.Margin >= o.Duration) {
		return usageErr("-f (margin) %d needs -D longer than twice the margin", o.Margin)
	}
	if o.SourceIP != "" && o.Server == "" && !o.Loopback {
		return usageErr("--source_ip is for the client (give the server's address too)")
	}
	if o.QPs > 1 && t.Kind == KindLat {
		return usageErr("-q: multiple QPs are only available in bandwidth tests")
	}
	if o.Atomic != FetchAndAdd && t.Verb != VerbAtomic {
		return usageErr("-A is for the atomic tests; you are running %s", t)
	}
	if o.Inline != 0 && (t.Verb == VerbRead || t.Verb == VerbAtomic) {
		return usageErr("-I: inline data is not available with RDMA Read or atomics")
	}
	if o.RxDepth > 1 && (t.Verb == VerbRead || t.Verb == VerbAtomic) {
		return usageErr("-r: with RDMA Read or atomics the rx depth can only be 1")
	}
	if t.Verb == VerbAtomic && (o.All || (o.Size != 0 && o.Size != defSizeAtom)) {
		return usageErr("message size cannot be changed for atomic tests (always 8 bytes): drop -s/-a")
	}
	if o.Duration > 0 && o.All {
		return usageErr("-D (duration) cannot be combined with -a (all sizes)")
	}
	if o.Duration < 0 || o.Iters < 0 || o.Size < 0 || o.QPs < 0 || o.TxDepth < 0 || o.RxDepth < 0 || o.CQMod < 0 {
		return usageErr("negative -D, -n, -s, -q, -t, -r or -Q")
	}
	if o.Size > maxMsgSize {
		return usageErr("message size %d is too large: perftest allows 1 to %d bytes", o.Size, maxMsgSize)
	}
	if o.Port < 0 || o.Port > 65535 {
		return usageErr("-p %d: not a TCP port", o.Port)
	}
	return nil
}

// Args returns command-line arguments that reproduce o's test parameters:
// the test and every flag both sides must agree on or that shapes the
// server's side (used to start the loopback server). Local-only flags
// (--out_json, --plot, --loopback, -p, the address) are left out.
func (o Options) Args() []string {
	a := []string{o.Test.String()}
	add := func(f string, v any) { a = append(a, f, fmt.Sprint(v)) }
	if o.Device != "" {
		add("-d", o.Device)
	}
	if o.All {
		a = append(a, "-a")
	}
	if o.Size != 0 {
		add("-s", o.Size)
	}
	if o.Iters != 0 {
		add("-n", o.Iters)
	}
	if o.Duration != 0 {
		add("-D", o.Duration)
	}
	if o.QPs != 0 {
		add("-q", o.QPs)
	}
	if o.Inline != 0 {
		add("-I", max(o.Inline, 0))
	}
	if o.TxDepth != 0 {
		add("-t", o.TxDepth)
	}
	if o.RxDepth != 0 {
		add("-r", o.RxDepth)
	}
	if o.CQMod != 0 {
		add("-Q", o.CQMod)
	}
	if o.Bidir {
		a = append(a, "-b")
	}
	if o.Test.Verb == VerbAtomic {
		add("-A", o.Atomic)
	}
	if o.MTU != 0 {
		add("-m", o.MTU)
	}
	if o.Conn != "" {
		add("-c", o.Conn)
	}
	if o.ReportGbits {
		a = append(a, "--report_gbits")
	}
	if o.Histogram {
		a = append(a, "-H")
	}
	if o.SetGIDIndex {
		add("-x", o.GIDIndex)
	}
	if o.IBPort != 0 {
		add("-i", o.IBPort)
	}
	if o.NoPeak {
		a = append(a, "-N")
	}
	if o.Events {
		a = append(a, "-e")
	}
	if o.PostList != 0 {
		add("-l", o.PostList)
	}
	if o.SetQPTimeout {
		add("-u", o.QPTimeout)
	}
	if o.SetRetryCount {
		add("--retry_count", o.RetryCount)
	}
	if o.OutReads != 0 {
		add("-o", o.OutReads)
	}
	if o.Margin != 0 {
		add("-f", o.Margin)
	}
	return a
}

func mtuEnum(n int) verbs.MTU {
	for m := verbs.MTU256; m <= verbs.MTU4096; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

// config is the effective configuration of one side of a run: Options
// with perftest's defaults and dependencies applied, checked against the
// device.
type config struct {
	Options
	sizes    []int64
	outReads int   // outstanding reads and atomics per QP (-o)
	iters    int64 // per QP; 0 in duration mode
	qps      int
	tx, rx   int
	cqMod    int
	inline   int
	noPeak   bool
	margin   int // seconds of warm-up and cool-down around the sample (-D)
	mtu      verbs.MTU
	port     int
	maxSize  int64
	gbits    bool
	rttShift bool // latency is half a round trip (send, write)
	// minHalf is the least size of each half of a QP's region (perftest's
	// cycle buffer, when the peer is perftest); 0: maxSize decides.
	minHalf int64
	// exCM and cmQPs are what the header says of the exchange: over
	// rdma_cm (-R, -z talking to perftest) and the test QPs connected by
	// rdma_cm (-R).
	exCM, cmQPs bool
}

// resolve applies perftest's defaults and dependencies to o. dev is the
// device the run uses; a zero DeviceInfo skips the device's limits.
func (o Options) resolve(dev verbs.DeviceInfo) (*config, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	t := o.Test
	c := &config{Options: o}
	c.port = o.Port
	if c.port == 0 {
		c.port = DefaultPort
	}
	c.qps = max(o.QPs, 1)
	c.outReads = outReads
	if o.OutReads > 0 {
		c.outReads = o.OutReads
	}
	c.gbits = o.ReportGbits
	c.rttShift = t.Verb == VerbSend || t.Verb == VerbWrite

	size := o.Size
	if size == 0 {
		switch {
		case t.Verb == VerbAtomic:
			size = defSizeAtom
		case t.Kind == KindBW:
			size = defSizeBW
		default:
			size = defSizeLat
		}
	}
	if o.All {
		for s := int64(2); s <= maxSizeAll; s *= 2 {
			c.sizes = append(c.sizes, s)
		}
		c.maxSize = maxSizeAll
	} else {
		c.sizes = []int64{size}
		c.maxSize = size
	}

	c.iters = o.Iters
	if c.iters == 0 {
		c.iters = defIters
		if t.Kind == KindBW && t.Verb == VerbWrite {
			c.iters = defItersWB
		}
	}
	if o.Infinite && c.Duration == 0 {
		c.Duration = defInfinitePeriod
	}
	if c.Duration > 0 {
		c.iters = 0
		c.noPeak = true
		c.margin = c.Duration / 4
		if o.Margin > 0 {
			c.margin = o.Margin
		}
		if o.Infinite {
			c.margin = 0
		}
	}

	c.tx = o.TxDepth
	if c.tx == 0 {
		c.tx = defTxBW
		if t.Kind == KindLat {
			c.tx = defTxLat
		}
	}
	c.rx = 1
	if t.Verb == VerbSend {
		c.rx = o.RxDepth
		if c.rx == 0 {
			c.rx = defRxSend
		}
	}
	if c.iters > 0 {
		c.tx = int(min(int64(c.tx), c.iters))
		if t.Verb == VerbSend {
			c.rx = int(min(int64(c.rx), c.iters))
		}
	}
	c.cqMod = o.CQMod
	if c.cqMod == 0 {
		c.cqMod = defCQMod
		if !o.All && size > cqModLimit {
			c.cqMod = 1
		}
	}
	if o.PostList > 1 {
		// perftest: "CQ moderation will be the size of the post list".
		if c.tx < o.PostList {
			return nil, usageErr("-l %d needs a tx depth of at least %d (-t %d)", o.PostList, o.PostList, c.tx)
		}
		if c.iters%int64(o.PostList) != 0 {
			return nil, usageErr("the number of iterations (%d) must be a multiple of the post list (-l %d); give -n", c.iters, o.PostList)
		}
		c.cqMod = o.PostList
	}
	c.cqMod = min(c.cqMod, c.tx)
	if t.Kind == KindBW && c.iters > noPeakIters || o.NoPeak {
		c.noPeak = true
	}

	switch {
	case o.Inline < 0:
		c.inline = 0
	case o.Inline > 0:
		c.inline = o.Inline
	case t.Kind == KindLat && t.Verb == VerbWrite:
		c.inline = defInlineWr
	case t.Kind == KindLat && t.Verb == VerbSend:
		c.inline = defInlineSnd
	}

	if dev.Name == "" {
		return c, nil
	}
	// The device's limits.
	lim := min(uint64(maxMsgSize), dev.MaxMsgSize)
	if dev.MaxMsgSize == 0 {
		lim = maxMsgSize
	}
	if uint64(c.maxSize) > lim {
		return nil, usageErr("message size %d exceeds the limit of device %s (%d bytes); use a smaller -s", c.maxSize, dev.Name, lim)
	}
	if dev.MaxInline > 0 && c.inline > dev.MaxInline {
		if o.Inline > 0 {
			return nil, usageErr("-I %d exceeds device %s's max inline data (%d bytes)", o.Inline, dev.Name, dev.MaxInline)
		}
		c.inline = dev.MaxInline
	}
	if dev.MaxQPWR > 0 && (c.tx > dev.MaxQPWR || c.rx > dev.MaxQPWR) {
		return nil, usageErr("-t %d / -r %d exceed device %s's max_qp_wr (%d)", c.tx, c.rx, dev.Name, dev.MaxQPWR)
	}
	if dev.MaxQP > 0 && c.qps > dev.MaxQP {
		return nil, usageErr("-q %d exceeds device %s's max_qp (%d)", c.qps, dev.Name, dev.MaxQP)
	}
	if dev.MaxCQE > 0 && (c.tx*c.qps > dev.MaxCQE || c.rx*c.qps > dev.MaxCQE) {
		return nil, usageErr("-q %d × -t %d / -r %d completions exceed device %s's max_cqe (%d)", c.qps, c.tx, c.rx, dev.Name, dev.MaxCQE)
	}
	if dev.MaxMRSize > 0 && uint64(2*roundUp(c.maxSize)) > dev.MaxMRSize {
		return nil, usageErr("message size %d needs a %d-byte region, beyond device %s's max_mr_size (%d)", c.maxSize, 2*roundUp(c.maxSize), dev.Name, dev.MaxMRSize)
	}
	if t.Verb == VerbAtomic && dev.AtomicCap == verbs.AtomicNone {
		return nil, usageErr("device %s does not support atomics", dev.Name)
	}
	nports := max(len(dev.Ports), 1)
	if o.IBPort > nports {
		return nil, usageErr("-i %d: device %s has %d port(s)", o.IBPort, dev.Name, nports)
	}
	if o.DualPort {
		// Even on a two-port RNIC: QPs spread over two ports are not
		// implemented, and a silent single-port run would mislead.
		return nil, usageErr("-O (dual-port): spreading the QPs over two ports is not implemented; rdmakit perf runs them on one port (-i; %s has %d)", dev.Name, nports)
	}
	port := max(o.IBPort, 1) - 1
	active := verbs.MTU4096
	if len(dev.Ports) > port && dev.Ports[port].ActiveMTU != 0 {
		active = dev.Ports[port].ActiveMTU
	}
	c.mtu = active
	if o.MTU != 0 {
		m := mtuEnum(o.MTU)
		if m > active {
			return nil, usageErr("-m %d exceeds device %s's active MTU (%d)", o.MTU, dev.Name, active.Bytes())
		}
		c.mtu = m
	}
	return c, nil
}

// roundUp rounds n up to a multiple of 64 (a cache line).
func roundUp(n int64) int64 { return (n + 63) &^ 63 }
