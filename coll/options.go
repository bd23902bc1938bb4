package coll

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Options tune a communicator. The zero value is ready to use: each zero
// field takes its value from the environment variable named in its
// comment, or else the default. A non-zero field wins over the
// environment.
type Options struct {
	// Timeout is how long a collective waits for any one message or
	// credit from a peer before failing with ErrTimeout (and aborting the
	// communicator). RDMAKIT_COLL_TIMEOUT (a Go duration or seconds);
	// default 5m. A context deadline shortens it.
	Timeout time.Duration
	// BootstrapTimeout bounds forming the communicator: reaching the
	// root, all ranks joining, connection setup, and the wait for all
	// ranks in Close. RDMAKIT_COLL_BOOTSTRAP_TIMEOUT; default 2m.
	BootstrapTimeout time.Duration
	// Algorithm forces an algorithm (see Algorithm) for AllReduce,
	// AllGather, ReduceScatter, Broadcast and Reduce. RDMAKIT_COLL_ALGO,
	// else NCCL_ALGO when it names one of ring, tree or direct (other
	// NCCL_ALGO values are ignored); default auto: the tuning table in
	// tune.go, by collective, size, rank count and transport.
	Algorithm Algorithm
	// Protocol forces the small-message protocol (see Protocol).
	// RDMAKIT_COLL_PROTO, else NCCL_PROTO when it names LL, LL128 or
	// Simple; default auto (LL where it applies).
	Protocol Protocol
	// TreeThreshold is the message size (bytes) below which auto picks
	// the tree algorithms. RDMAKIT_COLL_TREE_THRESHOLD; default 64 KiB.
	TreeThreshold int
	// Transport forces the transport between all ranks, even ranks of
	// one host: "shm" (same host only), "tcp", "roce" (software RoCEv2,
	// transport/roce; ranks of one host need their own address or port,
	// RDMAKIT_ROCE_ADDR=:0) or "ibverbs" (RDMA devices; the program must
	// be built with -tags ibverbs).
	// RDMAKIT_COLL_TRANSPORT; default "auto": the same-host device (shm0)
	// between ranks of one host, the best network device both ranks have
	// between hosts (an RDMA device with an active port, else tcp0). See
	// devices.go for the rules.
	Transport string
	// HCA restricts the RDMA devices (and ports) used, in NCCL_IB_HCA's
	// syntax: a comma list of name[:port], each a prefix of device names
	// unless the list starts with "="; a leading "^" excludes the listed
	// ones instead ("mlx5_0", "mlx5_0:1", "=mlx5_0", "^mlx5_1",
	// "^=mlx5_1,mlx5_4"). RDMAKIT_COLL_HCA, else NCCL_IB_HCA; default:
	// every RDMA device, the first usable one in the device list. A list
	// from Options or RDMAKIT_COLL_HCA that leaves no usable device is an
	// error when RDMA devices exist; one from NCCL_IB_HCA falls back to
	// tcp.
	HCA string
	// GIDIndex is the GID index RDMA queue pairs send from on RoCE (a
	// decimal number) or "auto". RDMAKIT_COLL_GID_INDEX, else
	// NCCL_IB_GID_INDEX; default "auto": the transport picks an
	// IPv4-mapped RoCE v2 GID matching the peer's (see transport/ibverbs).
	GIDIndex string
	// Channels is the number of QP pairs to each peer over which large
	// messages are striped (over tcp, each is its own TCP connection).
	// RDMAKIT_COLL_CHANNELS, else NCCL_SOCKET_NTHREADS ×
	// NCCL_NSOCKS_PERTHREAD when either is set (an unset one counts 1);
	// default 2, 1 when any two ranks talk over tcp (see tcpChannels); at
	// most 16.
	Channels int
	// ChunkSize is the size of one pipelined message (and of a slot of a
	// receive FIFO). RDMAKIT_COLL_CHUNK (bytes, K/M suffixes); default
	// 256 KiB (over tcp too: see tcpChunk).
	// Rounded to a multiple of 4 KiB.
	ChunkSize int
	// Slots is the depth of each receive FIFO (messages in flight per
	// channel). RDMAKIT_COLL_SLOTS; default 8, at least 4.
	Slots int

	// Bind pins each rank's process to a core: "core" binds the k-th rank
	// of a host (by rank) to the k-th CPU it may run on, as Open MPI does
	// by default when the ranks do not outnumber the cores (with more
	// ranks than cores, round robin: CPU k mod the CPUs, so that each CPU
	// has its share of the ranks); "none" leaves placement to the OS. It affects the whole process, every goroutine in it: a bound
	// process runs with GOMAXPROCS 1 (unless the GOMAXPROCS environment
	// variable is set), and NewComm spins 25 ms before it returns, so
	// that the Go runtime's monitor thread has slowed down by the first
	// collective (its wake-ups take the rank's CPU).
	// RDMAKIT_COLL_BIND; default none.
	Bind string

	// hcaLenient: HCA came from NCCL_IB_HCA, whose devices may be absent.
	hcaLenient bool
	// chunkSet, channelsSet: ChunkSize, Channels came from the caller or
	// the environment, not the default.
	chunkSet, channelsSet bool
}

// gidIndex returns the GID index, or -1 for auto.
func (o Options) gidIndex() (int, error) {
	if o.GIDIndex == "auto" || o.GIDIndex == "" {
		return -1, nil
	}
	v, err := strconv.Atoi(o.GIDIndex)
	if err != nil || v < 0 || v > 255 {
		return 0, fmt.Errorf("%w: GID index %q (0..255 or auto)", ErrInvalidArgument, o.GIDIndex)
	}
	return v, nil
}

const (
	defaultTimeout          = 5 * time.Minute
	defaultBootstrapTimeout = 2 * time.Minute
	defaultTreeThreshold    = 64 << 10
	defaultChannels         = 2
	defaultChunk            = 256 << 10
	defaultSlots            = 8
	maxChannels             = 16
)

// Environment variables read by Options and InitFromEnv.
const (
	EnvTimeout          = "RDMAKIT_COLL_TIMEOUT"
	EnvBootstrapTimeout = "RDMAKIT_COLL_BOOTSTRAP_TIMEOUT"
	EnvAlgo             = "RDMAKIT_COLL_ALGO"
	EnvProto            = "RDMAKIT_COLL_PROTO"
	EnvNCCLAlgo         = "NCCL_ALGO"
	EnvNCCLProto        = "NCCL_PROTO"
	EnvTreeThreshold    = "RDMAKIT_COLL_TREE_THRESHOLD"
	EnvTransport        = "RDMAKIT_COLL_TRANSPORT"
	EnvChannels         = "RDMAKIT_COLL_CHANNELS"
	EnvChunk            = "RDMAKIT_COLL_CHUNK"
	EnvSlots            = "RDMAKIT_COLL_SLOTS"
	// EnvHCA and EnvGIDIndex select the RDMA device and GID index;
	// NCCL's variables are read when they are not set.
	EnvHCA      = "RDMAKIT_COLL_HCA"
	EnvGIDIndex = "RDMAKIT_COLL_GID_INDEX"
	EnvNCCLHCA  = "NCCL_IB_HCA"
	// NCCL's socket-transport knobs; their product gives Channels when
	// EnvChannels is not set.
	EnvNCCLSocketThreads = "NCCL_SOCKET_NTHREADS"
	EnvNCCLNSocks        = "NCCL_NSOCKS_PERTHREAD"
	EnvNCCLGIDIndex      = "NCCL_IB_GID_INDEX"
	// EnvSpin is how long a wait spins before it starts yielding the CPU
	// (default 10µs, 5µs with tcp peers, 0 with more ranks than cores).
	EnvSpin = "RDMAKIT_COLL_SPIN"
	// EnvBind pins ranks to cores (Options.Bind).
	EnvBind = "RDMAKIT_COLL_BIND"
)

// Resolve returns the options as a communicator would use them: zero
// fields filled from the environment and defaults. An error (wrapping
// ErrInvalidArgument) names the first invalid setting.
func (o Options) Resolve() (Options, error) { return o.resolve() }

// resolve fills zero fields from the environment and defaults.
func (o Options) resolve() (Options, error) {
	var err error
	if o.Timeout == 0 {
		if o.Timeout, err = envDuration(EnvTimeout, defaultTimeout); err != nil {
			return o, err
		}
	}
	if o.BootstrapTimeout == 0 {
		if o.BootstrapTimeout, err = envDuration(EnvBootstrapTimeout, defaultBootstrapTimeout); err != nil {
			return o, err
		}
	}
	if o.Algorithm == AlgoAuto {
		if s := os.Getenv(EnvAlgo); s != "" {
			if o.Algorithm, err = ParseAlgorithm(s); err != nil {
				return o, fmt.Errorf("%s: %w", EnvAlgo, err)
			}
		} else if a, err := ParseAlgorithm(os.Getenv(EnvNCCLAlgo)); err == nil {
			o.Algorithm = a // NCCL's lists and GPU-only names: auto
		}
	}
	if o.Algorithm > AlgoHalving {
		return o, fmt.Errorf("%w: algorithm %d", ErrInvalidArgument, o.Algorithm)
	}
	if o.Protocol == ProtoAuto {
		if s := os.Getenv(EnvProto); s != "" {
			if o.Protocol, err = ParseProtocol(s); err != nil {
				return o, fmt.Errorf("%s: %w", EnvProto, err)
			}
		} else if p, err := ParseProtocol(os.Getenv(EnvNCCLProto)); err == nil {
			o.Protocol = p
		}
	}
	if o.Protocol > ProtoSimple {
		return o, fmt.Errorf("%w: protocol %d", ErrInvalidArgument, o.Protocol)
	}
	if o.Transport == "" {
		o.Transport = strings.ToLower(os.Getenv(EnvTransport))
	}
	switch o.Transport {
	case "", "auto":
		o.Transport = "auto"
	case "shm", "tcp", roceTransport, rdmaTransport:
	default:
		return o, fmt.Errorf("%w: transport %q (auto, shm, tcp, roce or ibverbs)", ErrInvalidArgument, o.Transport)
	}
	if o.Bind == "" {
		o.Bind = strings.ToLower(strings.TrimSpace(os.Getenv(EnvBind)))
	}
	switch o.Bind {
	case "", "none":
		o.Bind = "none"
	case "core":
	default:
		return o, fmt.Errorf("%w: bind %q (core or none)", ErrInvalidArgument, o.Bind)
	}
	if o.HCA == "" {
		if o.HCA = os.Getenv(EnvHCA); o.HCA == "" {
			if s := os.Getenv(EnvNCCLHCA); s != "" {
				o.HCA, o.hcaLenient = s, true
			}
		}
	}
	if _, err := parseHCAFilter(o.HCA); err != nil {
		return o, fmt.Errorf("HCA list: %w", err)
	}
	if o.GIDIndex == "" {
		if o.GIDIndex = os.Getenv(EnvGIDIndex); o.GIDIndex == "" {
			o.GIDIndex = os.Getenv(EnvNCCLGIDIndex)
		}
	}
	if o.GIDIndex = strings.ToLower(strings.TrimSpace(o.GIDIndex)); o.GIDIndex == "" || o.GIDIndex == "-1" {
		o.GIDIndex = "auto"
	}
	if _, err := o.gidIndex(); err != nil {
		return o, err
	}
	if o.Channels == 0 && os.Getenv(EnvChannels) == "" {
		if o.Channels, err = ncclSockets(); err != nil {
			return o, err
		}
	}
	o.channelsSet = o.Channels != 0 || os.Getenv(EnvChannels) != ""
	o.chunkSet = o.ChunkSize != 0 || os.Getenv(EnvChunk) != ""
	for _, f := range []struct {
		v   *int
		env string
		def int
		min int
	}{
		{&o.TreeThreshold, EnvTreeThreshold, defaultTreeThreshold, 0},
		{&o.Channels, EnvChannels, defaultChannels, 1},
		{&o.ChunkSize, EnvChunk, defaultChunk, 4096},
		{&o.Slots, EnvSlots, defaultSlots, 4},
	} {
		if *f.v == 0 {
			if *f.v, err = envSize(f.env, f.def); err != nil {
				return o, err
			}
		}
		if *f.v < f.min {
			return o, fmt.Errorf("%w: %s %d below %d", ErrInvalidArgument, f.env, *f.v, f.min)
		}
	}
	o.Channels = min(o.Channels, maxChannels)
	o.ChunkSize = (o.ChunkSize + 4095) &^ 4095
	if o.ChunkSize > 64<<20 || o.Slots > 256 {
		return o, fmt.Errorf("%w: chunk %d bytes × %d slots is too large", ErrInvalidArgument, o.ChunkSize, o.Slots)
	}
	return o, nil
}

// ncclSockets is NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD, or 0 when
// neither is set.
func ncclSockets() (int, error) {
	n, set := 1, false
	for _, name := range []string{EnvNCCLSocketThreads, EnvNCCLNSocks} {
		s := os.Getenv(name)
		if s == "" {
			continue
		}
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 1 || v > maxChannels {
			return 0, fmt.Errorf("%w: %s=%q: want 1..%d", ErrInvalidArgument, name, s, maxChannels)
		}
		n, set = n*v, true
	}
	if !set {
		return 0, nil
	}
	return n, nil
}

func envDuration(name string, def time.Duration) (time.Duration, error) {
	s := os.Getenv(name)
	if s == "" {
		return def, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return d, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil && f >= 0 {
		return time.Duration(f * float64(time.Second)), nil
	}
	return 0, fmt.Errorf("%w: %s=%q is not a duration", ErrInvalidArgument, name, s)
}

func envSize(name string, def int) (int, error) {
	s := os.Getenv(name)
	if s == "" {
		return def, nil
	}
	v, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// ParseSize parses a byte count with an optional K, M or G suffix (powers
// of 1024), as nccl-tests' -b and -e do.
func ParseSize(s string) (int, error) {
	t := strings.TrimSpace(s)
	mul := 1
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'k', 'K':
			mul, t = 1<<10, t[:n-1]
		case 'm', 'M':
			mul, t = 1<<20, t[:n-1]
		case 'g', 'G':
			mul, t = 1<<30, t[:n-1]
		}
	}
	v, err := strconv.ParseInt(t, 0, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%w: size %q", ErrInvalidArgument, s)
	}
	return int(v) * mul, nil
}
