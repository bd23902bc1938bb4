package coll

import (
	"errors"
	"strings"
	"testing"
)

func TestDetectLaunch(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Launch
		err  string
	}{
		{"none", map[string]string{}, Launch{}, "no launcher"},
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
			Launch{Launcher: "torchrun", Rank: 3, NRanks: 8, LocalRank: 1, Addr: "node0:29500"}, ""},
		{"openmpi", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
			"OMPI_COMM_WORLD_LOCAL_SIZE": "2", EnvAddr: "10.0.0.1:7000"},
			Launch{Launcher: "openmpi", Rank: 1, NRanks: 4, LocalRank: 1, Addr: "10.0.0.1:7000"}, ""},
		{"openmpi without address", map[string]string{"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
			Launch{}, "RDMAKIT_COLL_ADDR"},
		{"openmpi one host", map[string]string{"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", EnvPort: "7100"},
			Launch{Launcher: "openmpi", Rank: 0, NRanks: 2, LocalRank: -1, Addr: "127.0.0.1:7100"}, ""},
		{"slurm", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[07-10,12],cpu1"},
			Launch{Launcher: "slurm", Rank: 5, NRanks: 16, LocalRank: 1, Addr: "gpu07:29517"}, ""},
		{"kubernetes", map[string]string{"JOB_COMPLETION_INDEX": "2", "WORLD_SIZE": "4", EnvAddr: "job-0.svc"},
			Launch{Launcher: "kubernetes", Rank: 2, NRanks: 4, LocalRank: -1, Addr: "job-0.svc:29517"}, ""},
		{"kubernetes without size", map[string]string{"JOB_COMPLETION_INDEX": "2"}, Launch{}, "WORLD_SIZE"},
		{"explicit wins", map[string]string{EnvRank: "1", EnvNRanks: "2", "RANK": "7", "WORLD_SIZE": "9", EnvAddr: "h:1"},
			Launch{Launcher: "rdmakit", Rank: 1, NRanks: 2, LocalRank: -1, Addr: "h:1"}, ""},
		{"bad rank", map[string]string{"RANK": "x", "WORLD_SIZE": "2"}, Launch{}, "not a non-negative integer"},
		{"rank beyond size", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, Launch{}, "rank 2 of 2"},
		{"id", map[string]string{EnvRank: "0", EnvNRanks: "3", EnvID: "rkc1:00000000000000ff@127.0.0.1:5000"},
			Launch{Launcher: "rdmakit", Rank: 0, NRanks: 3, LocalRank: -1, Addr: "127.0.0.1:5000", ID: "rkc1:00000000000000ff@127.0.0.1:5000"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := detectLaunch(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	if _, err := detectLaunch(func(string) string { return "" }); !errors.Is(err, ErrNoLauncher) {
		t.Errorf("empty environment: %v", err)
	}
}

func TestFirstSlurmNode(t *testing.T) {
	for in, want := range map[string]string{"a": "a", "a,b": "a", "n[1-4]": "n1", "gpu[007,009-010]x": "gpu007", "x1-[2-3]": "x1-2"} {
		if got := firstSlurmNode(in); got != want {
			t.Errorf("%q: %q want %q", in, got, want)
		}
	}
}

func TestUniqueID(t *testing.T) {
	id := makeID("10.1.2.3:4567", 0xdeadbeef)
	s := id.String()
	back, err := ParseUniqueID(s)
	if err != nil || back != id || back.Addr() != "10.1.2.3:4567" {
		t.Fatalf("%s → %v, %v", s, back, err)
	}
	for _, bad := range []string{"", "rkc1:", "rkc1:zz@a:1", "xyz:0000000000000001@a:1"} {
		if _, err := ParseUniqueID(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestParse(t *testing.T) {
	for s, want := range map[string]DataType{"float": Float32, "ncclFloat16": Float16, "half": Float16, "bf16": BFloat16, "char": Int8, "double": Float64, "uint64": Uint64} {
		if got, err := ParseDataType(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	for s, want := range map[string]RedOp{"sum": Sum, "ncclProd": Prod, "MAX": Max, "avg": Avg} {
		if got, err := ParseRedOp(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	for s, want := range map[string]int{"8": 8, "1K": 1024, "64M": 64 << 20, "2g": 2 << 30} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("%q: %v %v", s, got, err)
		}
	}
	if _, err := ParseAlgorithm("ring"); err != nil {
		t.Error(err)
	}
	if _, err := ParseAlgorithm("nvls"); err == nil {
		t.Error("nvls accepted")
	}
}

func TestOptionsEnv(t *testing.T) {
	t.Setenv(EnvAlgo, "tree")
	t.Setenv(EnvChunk, "64K")
	t.Setenv(EnvTimeout, "3")
	o, err := Options{Channels: 3}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if o.Algorithm != AlgoTree || o.ChunkSize != 64<<10 || o.Timeout.Seconds() != 3 || o.Channels != 3 || o.Transport != "auto" {
		t.Errorf("%+v", o)
	}
	t.Setenv(EnvTransport, "ib")
	if _, err := (Options{}).resolve(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad transport: %v", err)
	}
}

func TestAlgoProtoEnv(t *testing.T) {
	for _, k := range []string{EnvAlgo, EnvProto, EnvNCCLAlgo, EnvNCCLProto} {
		t.Setenv(k, "")
	}
	for _, c := range []struct {
		algo, proto, ncclAlgo, ncclProto string
		want                             Algorithm
		wantP                            Protocol
		bad                              bool
	}{
		{want: AlgoAuto, wantP: ProtoAuto},
		{algo: "direct", proto: "simple", want: AlgoDirect, wantP: ProtoSimple},
		{ncclAlgo: "Ring", ncclProto: "LL", want: AlgoRing, wantP: ProtoLL},
		{ncclAlgo: "Tree,Ring", ncclProto: "^LL128", want: AlgoAuto, wantP: ProtoAuto}, // NCCL lists: auto
		{algo: "tree", ncclAlgo: "ring", want: AlgoTree},                               // ours wins
		{algo: "Halving", want: AlgoHalving},
		{algo: "rabenseifner", want: AlgoHalving},
		{algo: "nvls", bad: true},
		{proto: "fast", bad: true},
	} {
		t.Setenv(EnvAlgo, c.algo)
		t.Setenv(EnvProto, c.proto)
		t.Setenv(EnvNCCLAlgo, c.ncclAlgo)
		t.Setenv(EnvNCCLProto, c.ncclProto)
		o, err := Options{}.resolve()
		if c.bad {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%+v: %v", c, err)
			}
			continue
		}
		if err != nil || o.Algorithm != c.want || o.Protocol != c.wantP {
			t.Errorf("%+v: %v %v %v", c, o.Algorithm, o.Protocol, err)
		}
	}
}

// TestTuning pins the auto choices of the tuning table.
func TestTuning(t *testing.T) {
	for _, c := range []struct {
		kind   byte
		n      int
		bytes  int
		forced Algorithm
		want   Algorithm
		tcp    bool // some pair talks over tcp
	}{
		{kAllReduce, 2, 8, AlgoAuto, AlgoTree, false},
		{kAllReduce, 4, 8, AlgoAuto, AlgoDirect, false},
		{kAllReduce, 8, 4 << 10, AlgoAuto, AlgoDirect, false},
		{kAllReduce, 8, 8 << 10, AlgoAuto, AlgoTree, false},
		{kAllReduce, 4, 1 << 20, AlgoAuto, AlgoRing, false},
		{kAllGather, 2, 4 << 10, AlgoAuto, AlgoRing, false},
		{kAllGather, 4, 4 << 10, AlgoAuto, AlgoDirect, false},
		{kAllGather, 4, 1 << 20, AlgoAuto, AlgoRing, false},
		{kReduceScatter, 8, 64 << 10, AlgoAuto, AlgoDirect, false},
		{kReduceScatter, 3, 4 << 10, AlgoTree, AlgoRing, false},
		{kBroadcast, 4, 8, AlgoDirect, AlgoTree, false},
		{kAllReduce, 2, 1 << 20, AlgoDirect, AlgoDirect, false},
		{kAllReduce, 8, 8, AlgoAuto, AlgoTree, true},
		{kAllReduce, 4, 4 << 10, AlgoAuto, AlgoTree, true},
		{kAllReduce, 8, 8, AlgoDirect, AlgoDirect, true},
		{kAllGather, 4, 4 << 10, AlgoAuto, AlgoDirect, true},
		{kAllReduce, 4, 64 << 10, AlgoAuto, AlgoTree, true},
		{kAllReduce, 4, 1 << 20, AlgoAuto, AlgoHalving, true},
		{kAllReduce, 8, 1 << 20, AlgoAuto, AlgoHalving, true},
		{kAllReduce, 8, 16 << 20, AlgoAuto, AlgoRing, true},
		{kAllReduce, 4, 2 << 20, AlgoAuto, AlgoHalving, true},
		{kAllReduce, 4, 4 << 20, AlgoAuto, AlgoRing, true}, // halvingMaxAllReduce
		{kAllReduce, 8, 2 << 20, AlgoAuto, AlgoHalving, true},
		{kAllReduce, 6, 1 << 20, AlgoAuto, AlgoRing, true},  // not a power of two
		{kAllReduce, 2, 1 << 20, AlgoAuto, AlgoRing, true},  // two steps either way
		{kAllReduce, 8, 1 << 20, AlgoAuto, AlgoRing, false}, // shm
		{kAllGather, 8, 1 << 20, AlgoAuto, AlgoHalving, true},
		{kAllGather, 8, 1 << 20, AlgoAuto, AlgoRing, false},
		{kAllGather, 6, 1 << 20, AlgoAuto, AlgoRing, true},
		{kAllGather, 8, 4 << 20, AlgoAuto, AlgoRing, true},
		{kReduceScatter, 8, 1 << 20, AlgoAuto, AlgoHalving, true},
		{kReduceScatter, 4, 4 << 20, AlgoAuto, AlgoHalving, true},
		{kReduceScatter, 8, 16 << 20, AlgoAuto, AlgoRing, true},
		{kReduceScatter, 8, 1 << 20, AlgoAuto, AlgoRing, false},
		{kAllGather, 6, 1 << 20, AlgoHalving, AlgoRing, true}, // forced, not a power of two
		{kReduceScatter, 8, 1 << 20, AlgoHalving, AlgoHalving, true},
		{kReduceScatter, 6, 1 << 20, AlgoHalving, AlgoRing, true},
		{kBroadcast, 8, 1 << 20, AlgoHalving, AlgoTree, true},
		{kAllReduce, 6, 1 << 20, AlgoHalving, AlgoHalving, true},
	} {
		o, _ := Options{Algorithm: c.forced}.resolve()
		cm := &Comm{nranks: c.n, opts: o, anyTCP: c.tcp}
		if got := cm.pickAlgo(c.kind, c.bytes); got != c.want {
			t.Errorf("%s, %d ranks, %d bytes, forced %s, tcp %v: %s, want %s", kindNames[c.kind], c.n, c.bytes, c.forced, c.tcp, got, c.want)
		}
	}
}

func TestNCCLSocketChannels(t *testing.T) {
	t.Setenv(EnvChannels, "")
	for _, c := range []struct {
		threads, socks string
		want           int
		bad            bool
	}{
		{want: defaultChannels},
		{threads: "2", socks: "4", want: 8},
		{socks: "3", want: 3},
		{threads: "8", socks: "4", want: maxChannels}, // capped
		{threads: "0", bad: true},
		{socks: "x", bad: true},
	} {
		t.Setenv(EnvNCCLSocketThreads, c.threads)
		t.Setenv(EnvNCCLNSocks, c.socks)
		o, err := Options{}.resolve()
		if c.bad {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%+v: %v", c, err)
			}
			continue
		}
		if err != nil || o.Channels != c.want {
			t.Errorf("%+v: channels %d, %v", c, o.Channels, err)
		}
	}
	// RDMAKIT_COLL_CHANNELS wins.
	t.Setenv(EnvNCCLSocketThreads, "4")
	t.Setenv(EnvChannels, "1")
	if o, err := (Options{}).resolve(); err != nil || o.Channels != 1 {
		t.Errorf("RDMAKIT_COLL_CHANNELS=1 with NCCL_SOCKET_NTHREADS=4: %d, %v", o.Channels, err)
	}
}

func TestBindOption(t *testing.T) {
	t.Setenv(EnvBind, "")
	if o, err := (Options{}).resolve(); err != nil || o.Bind != "none" {
		t.Errorf("default: %q, %v", o.Bind, err)
	}
	t.Setenv(EnvBind, "Core")
	if o, err := (Options{}).resolve(); err != nil || o.Bind != "core" {
		t.Errorf("RDMAKIT_COLL_BIND=Core: %q, %v", o.Bind, err)
	}
	t.Setenv(EnvBind, "socket")
	if _, err := (Options{}).resolve(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("RDMAKIT_COLL_BIND=socket: %v", err)
	}
}
