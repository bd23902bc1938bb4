package perftest

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

func TestParseTest(t *testing.T) {
	for _, n := range Tests {
		for _, name := range []string{n, "ib_" + n} {
			tt, err := ParseTest(name)
			if err != nil || tt.String() != n {
				t.Errorf("ParseTest(%q) = %v, %v", name, tt, err)
			}
		}
	}
	for _, bad := range []string{"", "write", "write_bandwidth", "ib_", "rdma_bw", "_bw", "write_bw_lat"} {
		if _, err := ParseTest(bad); err == nil {
			t.Errorf("ParseTest(%q) succeeded", bad)
		}
	}
}

func TestParseArgsForms(t *testing.T) {
	want := Options{Test: Test{VerbWrite, KindBW}, Size: 64, Iters: 10, All: false, Server: "host", Device: "shm0"}
	for _, args := range [][]string{
		{"write_bw", "-s", "64", "-n", "10", "-d", "shm0", "host"},
		{"write_bw", "-s64", "-n10", "-dshm0", "host"},
		{"--size=64", "ib_write_bw", "--iters", "10", "host", "--ib-dev=shm0"},
		{"write_bw", "-F", "-s", "64", "--iters=10", "-d", "shm0", "--", "host"},
	} {
		o, err := ParseArgs(args)
		if err != nil {
			t.Errorf("%q: %v", args, err)
			continue
		}
		if !reflect.DeepEqual(o, want) {
			t.Errorf("%q: got %+v, want %+v", args, o, want)
		}
	}
	o, err := ParseArgs([]string{"send_bw", "-ab", "-q", "4", "-t", "64", "-r", "256", "-Q", "8", "-I", "0", "-m", "1024", "-c", "rc", "--report_gbits", "--out_json", "x.json", "--plot=y.png", "--loopback", "-s", "4K"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.All || !o.Bidir || o.QPs != 4 || o.TxDepth != 64 || o.RxDepth != 256 || o.CQMod != 8 || o.Inline != -1 ||
		o.MTU != 1024 || o.Conn != "RC" || !o.ReportGbits || o.OutJSON != "x.json" || o.Plot != "y.png" || !o.Loopback || o.Size != 4096 {
		t.Errorf("got %+v", o)
	}
	if _, err := ParseArgs([]string{"-h"}); !errors.Is(err, ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestParseArgsErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"write_bw", "--bogus"}, "unknown flag --bogus"},
		{[]string{"write_bw", "-Y"}, "unknown flag -Y"},
		{[]string{"write_bw", "--use_cuda=0"}, "no GPU support in this build"},
		{[]string{"write_bw", "--use_rocm", "0"}, "no GPU support in this build"},
		{[]string{"write_lat", "--run_infinitely"}, "only available in bandwidth tests"},
		{[]string{"write_bw", "--output=latency"}, "--output=latency is for latency tests"},
		{[]string{"write_lat", "--output=bandwidth"}, "for bandwidth tests"},
		{[]string{"write_bw", "--output=x"}, "invalid --output"},
		{[]string{"write_bw", "--report-both"}, "add -b"},
		{[]string{"write_bw", "-U"}, "-U (unsorted report) is only available in latency tests"},
		{[]string{"write_bw", "-x", "300"}, "-x (GID index)"},
		{[]string{"write_bw", "-i", "0"}, "-i (IB port)"},
		{[]string{"write_bw", "-S", "16"}, "-S (service level)"},
		{[]string{"write_bw", "--source_ip", "nope", "h"}, "not an IP address"},
		{[]string{"write_bw", "--source_ip", "127.0.0.1"}, "--source_ip is for the client"},
		{[]string{"send_bw", "--use-srq"}, "--use-srq is not supported by rdmakit perf: a shared receive queue"},
		{[]string{"write_bw", "--reversed"}, "--reversed is not supported"},
		{[]string{"write_bw", "-g"}, "-g (--mcg) is not supported by rdmakit perf: multicast"},
		{[]string{"write_bw", "-o", "4"}, "-o (outstanding reads) is for the read and atomic tests"},
		{[]string{"read_bw", "-o", "32"}, "-o (outstanding reads) must be between 1 and 16"},
		{[]string{"write_bw", "-f", "2"}, "needs -D longer than twice the margin"},
		{[]string{"write_bw", "-D", "4", "-f", "2"}, "needs -D longer than twice the margin"},
		{[]string{}, "missing TEST"},
		{[]string{"write_foo"}, "unknown test"},
		{[]string{"write_bw", "a", "b"}, "unexpected argument"},
		{[]string{"write_bw", "-s"}, "needs a value"},
		{[]string{"write_bw", "-s", "x"}, "invalid message size"},
		{[]string{"write_bw", "-s", "0"}, "invalid message size"},
		{[]string{"write_bw", "-s", "3G"}, "too large"},
		{[]string{"write_bw", "-n", "2"}, "-n (iterations) must be between 5"},
		{[]string{"write_bw", "-t", "0"}, "-t (tx depth)"},
		{[]string{"write_bw", "-Q", "2000"}, "-Q (CQ moderation)"},
		{[]string{"write_bw", "-p", "70000"}, "-p (port)"},
		{[]string{"write_bw", "-I", "2048"}, "-I (inline size)"},
		{[]string{"write_bw", "-m", "1500"}, "invalid MTU"},
		{[]string{"write_bw", "-c", "UD"}, "connection type UD is not supported"},
		{[]string{"write_bw", "-c", "XYZ"}, "invalid connection type"},
		{[]string{"write_bw", "-A", "CMP_AND_SWAP"}, "-A is for the atomic tests"},
		{[]string{"atomic_bw", "-A", "SWAP"}, "invalid atomic type"},
		{[]string{"write_lat", "-b"}, "only available in bandwidth tests"},
		{[]string{"write_bw", "-H"}, "only available in latency tests"},
		{[]string{"send_lat", "-q", "2"}, "multiple QPs"},
		{[]string{"read_bw", "-I", "64"}, "inline data is not available"},
		{[]string{"atomic_bw", "-r", "4"}, "rx depth can only be 1"},
		{[]string{"atomic_lat", "-s", "16"}, "cannot be changed for atomic tests"},
		{[]string{"atomic_bw", "-a"}, "cannot be changed for atomic tests"},
		{[]string{"write_bw", "-a", "-D", "2"}, "cannot be combined with -a"},
		{[]string{"write_bw", "--loopback", "host"}, "--loopback starts its own server"},
		{[]string{"write_bw", "--report_gbits=1"}, "takes no value"},
	}
	for _, c := range cases {
		_, err := ParseArgs(c.args)
		if err == nil || !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want a one-line usage error with %q", c.args, err, c.want)
		}
	}
}

func TestResolveDefaults(t *testing.T) {
	cases := []struct {
		args                  []string
		size, iters           int64
		tx, rx, cqMod, inline int
		noPeak                bool
	}{
		{[]string{"write_bw"}, 65536, 5000, 128, 1, 1, 0, false}, // CQ moderation off above 8 KiB
		{[]string{"write_bw", "-s", "4096"}, 4096, 5000, 128, 1, 100, 0, false},
		{[]string{"write_bw", "-s", "65536", "-Q", "16"}, 65536, 5000, 128, 1, 16, 0, false},
		{[]string{"send_bw"}, 65536, 1000, 128, 512, 1, 0, false},
		{[]string{"send_bw", "-n", "100", "-s", "8"}, 8, 100, 100, 100, 100, 0, false},
		{[]string{"read_bw", "-s", "8"}, 8, 1000, 128, 1, 100, 0, false},
		{[]string{"atomic_bw"}, 8, 1000, 128, 1, 100, 0, false},
		{[]string{"write_lat"}, 2, 1000, 1, 1, 1, 220, false},
		{[]string{"send_lat"}, 2, 1000, 1, 512, 1, 236, false},
		{[]string{"send_lat", "-I", "0"}, 2, 1000, 1, 512, 1, 0, false},
		{[]string{"read_lat"}, 2, 1000, 1, 1, 1, 0, false},
		{[]string{"atomic_lat"}, 8, 1000, 1, 1, 1, 0, false},
		{[]string{"write_bw", "-n", "30000", "-s", "8"}, 8, 30000, 128, 1, 100, 0, true},
		{[]string{"write_bw", "-D", "3"}, 65536, 0, 128, 1, 1, 0, true},
		{[]string{"write_bw", "-a"}, 8 << 20, 5000, 128, 1, 100, 0, false},
	}
	for _, c := range cases {
		o, err := ParseArgs(c.args)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		cfg, err := o.resolve(verbs.DeviceInfo{})
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		if cfg.maxSize != c.size || cfg.iters != c.iters || cfg.tx != c.tx || cfg.rx != c.rx || cfg.cqMod != c.cqMod || cfg.inline != c.inline || cfg.noPeak != c.noPeak {
			t.Errorf("%q: size %d iters %d tx %d rx %d cqmod %d inline %d nopeak %v; want %d %d %d %d %d %d %v", c.args,
				cfg.maxSize, cfg.iters, cfg.tx, cfg.rx, cfg.cqMod, cfg.inline, cfg.noPeak,
				c.size, c.iters, c.tx, c.rx, c.cqMod, c.inline, c.noPeak)
		}
	}
	o, _ := ParseArgs([]string{"write_bw", "-a"})
	cfg, _ := o.resolve(verbs.DeviceInfo{})
	if len(cfg.sizes) != 23 || cfg.sizes[0] != 2 || cfg.sizes[22] != 8<<20 {
		t.Errorf("-a sizes %v", cfg.sizes)
	}
	o, _ = ParseArgs([]string{"write_bw", "-D", "8"})
	if cfg, _ = o.resolve(verbs.DeviceInfo{}); cfg.margin != 2 {
		t.Errorf("-D 8: margin %d, want 2", cfg.margin)
	}
}

func TestResolveDeviceLimits(t *testing.T) {
	dev := verbs.DeviceInfo{Name: "small0", MaxMsgSize: 1 << 16, MaxInline: 64, MaxQPWR: 1024, MaxQP: 8, MaxCQE: 1 << 16,
		MaxMRSize: 1 << 20, AtomicCap: verbs.AtomicNone,
		Ports: []verbs.PortInfo{{ActiveMTU: verbs.MTU1024}}}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"write_bw", "-s", "131072"}, "message size 131072 exceeds the limit of device small0 (65536 bytes)"},
		{[]string{"write_lat", "-I", "128"}, "-I 128 exceeds device small0's max inline data (64 bytes)"},
		{[]string{"write_bw", "-t", "2000", "-s", "8"}, "max_qp_wr (1024)"},
		{[]string{"write_bw", "-q", "9", "-s", "8"}, "max_qp (8)"},
		{[]string{"write_bw", "-m", "2048", "-s", "8"}, "-m 2048 exceeds device small0's active MTU (1024)"},
		{[]string{"atomic_bw"}, "does not support atomics"},
	}
	for _, c := range cases {
		o, err := ParseArgs(c.args)
		if err != nil {
			t.Fatalf("%q: %v", c.args, err)
		}
		_, err = o.resolve(dev)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.args, err, c.want)
		}
	}
	// The default inline size is clamped silently, the MTU defaults to the
	// port's.
	o, _ := ParseArgs([]string{"send_lat"})
	cfg, err := o.resolve(dev)
	if err != nil || cfg.inline != 64 || cfg.mtu != verbs.MTU1024 {
		t.Errorf("send_lat on small0: %+v %v", cfg, err)
	}
}

func TestArgsRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		{"write_bw"},
		{"atomic_lat", "-A", "CMP_AND_SWAP", "-n", "77"},
		{"send_bw", "-a", "-b", "-q", "3", "-t", "32", "-r", "64", "-Q", "4", "-I", "0", "-m", "2048", "-c", "RC", "--report_gbits", "-d", "tcp0"},
		{"write_lat", "-s", "100", "-H", "-I", "100", "-D", "3"},
	} {
		o, err := ParseArgs(append(args, "--loopback", "--plot", "a.png", "--out_json", "b.json", "-p", "9999"))
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseArgs(o.Args())
		if err != nil {
			t.Fatalf("%q → %q: %v", args, o.Args(), err)
		}
		o.Loopback, o.Plot, o.OutJSON, o.Port = false, "", "", 0
		if !reflect.DeepEqual(o, back) {
			t.Errorf("%q → %q → %+v, want %+v", args, o.Args(), back, o)
		}
	}
}

// perftest's flags beyond the basic ones: those with an effect set their
// option, those without one leave a one-line note, -V asks for the
// version.
func TestParseArgsDropIn(t *testing.T) {
	o, err := ParseArgs([]string{"ib_write_bw", "-x", "3", "-i", "1", "-N", "-b", "--report-both", "--output=bandwidth", "--source_ip", "127.0.0.1", "10.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	if !o.SetGIDIndex || o.GIDIndex != 3 || o.IBPort != 1 || !o.NoPeak || !o.ReportBoth || o.Output != "bandwidth" || o.SourceIP != "127.0.0.1" || o.Server != "10.0.0.1" || len(o.Notes) != 0 {
		t.Errorf("parsed %+v", o)
	}
	o, err = ParseArgs([]string{"write_lat", "-U", "--output", "latency"})
	if err != nil || !o.Unsorted || !o.Histogram || o.Output != "latency" {
		t.Errorf("-U: %+v, %v", o, err)
	}
	noted := []string{"-R", "-z", "-S", "1", "-T", "32", "-W", "rx_bytes",
		"--mr_per_qp", "--cpu_util", "--perform_warm_up", "--rdma_cm", "-e"}
	o, err = ParseArgs(append([]string{"send_bw"}, noted...))
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Notes) != 6 || !o.Events || o.SL != 1 || o.TrafficClass != 32 {
		t.Errorf("%d notes, want one per distinct flag without effect (6), -e, -S 1, -T 32 set (%v %d %d):\n%s", len(o.Notes), o.Events, o.SL, o.TrafficClass, strings.Join(o.Notes, "\n"))
	}
	if o, err := ParseArgs([]string{"write_bw", "--tclass=96"}); err != nil || o.TrafficClass != 96 {
		t.Errorf("--tclass: %+v, %v", o, err)
	}
	if _, err := ParseArgs([]string{"write_bw", "-T", "256"}); err == nil {
		t.Error("-T 256 accepted")
	}
	if o, err := ParseArgs([]string{"write_lat", "--events"}); err != nil || !o.Events || len(o.Notes) != 1 || !strings.Contains(o.Notes[0], "write_lat waits") {
		t.Errorf("write_lat -e: %+v, %v", o, err)
	}
	for _, n := range o.Notes {
		if strings.Contains(n, "\n") || !strings.HasPrefix(n, "-") {
			t.Errorf("note %q: want one line naming the flag", n)
		}
	}
	for _, v := range [][]string{{"-V"}, {"write_bw", "--version"}} {
		if _, err := ParseArgs(v); !errors.Is(err, ErrVersion) {
			t.Errorf("%q: %v, want ErrVersion", v, err)
		}
	}
	o, err = ParseArgs([]string{"read_lat", "-o", "4", "-D", "5", "-f", "1", "-C"})
	if err != nil || o.OutReads != 4 || o.Margin != 1 || len(o.Notes) != 1 {
		t.Errorf("-o -f -C: %+v, %v", o, err)
	}
	if c, err := o.resolve(verbs.DeviceInfo{}); err != nil || c.outReads != 4 || c.margin != 1 {
		t.Errorf("-o 4 -f 1: outReads %d margin %d, %v", c.outReads, c.margin, err)
	}
	if o, err := ParseArgs([]string{"read_bw", "-u", "0", "--retry_count=3"}); err != nil || !o.SetQPTimeout || o.QPTimeout != 0 || !o.SetRetryCount || o.RetryCount != 3 || len(o.Notes) != 0 {
		t.Errorf("-u 0 --retry_count 3: %+v, %v", o, err)
	}
	if c, err := (Options{Test: Test{VerbWrite, KindBW}, PostList: 8}).resolve(verbs.DeviceInfo{}); err != nil || c.cqMod != 8 {
		t.Errorf("-l 8: cqMod %v, %v", c, err)
	}
	for _, bad := range [][]string{{"write_lat", "-l", "4"}, {"write_bw", "-l", "8", "-n", "100"}, {"write_bw", "-l", "8", "-Q", "4"}, {"write_bw", "-l", "64", "-t", "32"}, {"write_bw", "-l", "3"}} {
		o, err := ParseArgs(bad)
		if err == nil {
			_, err = o.resolve(verbs.DeviceInfo{})
		}
		if !errors.Is(err, ErrUsage) {
			t.Errorf("%q: %v, want a usage error", bad, err)
		}
	}
	// Flags that change a run's effective configuration.
	c, err := Options{Test: Test{VerbWrite, KindBW}, NoPeak: true}.resolve(verbs.DeviceInfo{})
	if err != nil || !c.noPeak {
		t.Errorf("-N: noPeak %v, %v", c != nil && c.noPeak, err)
	}
	dev := verbs.DeviceInfo{Name: "x0", Ports: []verbs.PortInfo{{ActiveMTU: verbs.MTU1024}}}
	if _, err := (Options{Test: Test{VerbWrite, KindBW}, IBPort: 2}).resolve(dev); err == nil || !strings.Contains(err.Error(), "has 1 port") {
		t.Errorf("-i 2 on a one-port device: %v", err)
	}
	if _, err := (Options{Test: Test{VerbWrite, KindBW}, DualPort: true}).resolve(dev); err == nil || !strings.Contains(err.Error(), "two ports") {
		t.Errorf("-O on a one-port device: %v", err)
	}
	a := strings.Join(Options{Test: Test{VerbWrite, KindBW}, SetGIDIndex: true, GIDIndex: 0, IBPort: 1, NoPeak: true}.Args(), " ")
	if a != "write_bw -x 0 -i 1 -N" {
		t.Errorf("Args: %q", a)
	}
}

func TestOutputValue(t *testing.T) {
	r := result{bwAvg: 1234.5, rate: 0.25, tAvg: 1.5}
	for out, want := range map[string]string{"bandwidth": "1234.500000\n", "message_rate": "0.250000\n", "latency": "1.500000\n"} {
		if got := outputValue(&config{Options: Options{Output: out}}, r); got != want {
			t.Errorf("--output=%s: %q, want %q", out, got, want)
		}
	}
}
