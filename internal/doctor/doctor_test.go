package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/internal/sys"
)

func host(name string) string { return filepath.Join("..", "rdmafs", "testdata", "hosts", name) }

// fixed returns Options for a fixture host with a memlock limit.
func fixed(name string, memlock uint64) Options {
	return Options{
		Root:    host(name),
		Memlock: func() (uint64, error) { return memlock, nil },
		Addrs: func(netdev string) ([]net.IP, error) {
			if netdev == "eth0" {
				return []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("fe80::ac0:ebff:fe00:1")}, nil
			}
			return nil, errors.New("no such netdev")
		},
		Ruleset: func() (string, error) { return "", nil },
	}
}

// status returns the one result of check (failing the test if there is
// not exactly one).
func one(t *testing.T, r *Report, check string) Result {
	t.Helper()
	res := r.Find(check)
	if len(res) != 1 {
		t.Fatalf("%s: %d results, want 1: %v", check, len(res), res)
	}
	return res[0]
}

func TestHealthyHosts(t *testing.T) {
	for _, c := range []struct {
		host string
		want map[string]Status
	}{
		{"mlx5-healthy", map[string]Status{"modules": Pass, "devices": Pass, "devnodes": Pass, "ports": Pass, "gids": Pass, "mtu": Pass,
			"memlock": Pass, "netns": Pass, "governor": Pass, "numa": Pass, "hugepages": Pass, "firewall": Pass}},
		{"rxe", map[string]Status{"modules": Pass, "devices": Pass, "devnodes": Pass, "ports": Pass, "gids": Pass, "mtu": Warn,
			"memlock": Pass, "numa": Pass, "firewall": Pass}},
		{"siw", map[string]Status{"modules": Pass, "devices": Pass, "devnodes": Pass, "ports": Pass, "gids": Skip, "mtu": Skip,
			"numa": Pass, "firewall": Skip}},
	} {
		t.Run(c.host, func(t *testing.T) {
			r := Run(fixed(c.host, sys.Unlimited))
			for check, want := range c.want {
				if got := one(t, r, check); got.Status != want {
					t.Errorf("%s: %v, want %v", check, got, want)
				}
			}
			if r.Worst() == Fail {
				var b bytes.Buffer
				r.WriteText(&b)
				t.Errorf("a healthy host fails:\n%s", b.String())
			}
		})
	}
	r := Run(fixed("mlx5-healthy", sys.Unlimited))
	g := one(t, r, "gids")
	if !strings.Contains(g.Subject, "index 3 (10.0.0.1)") || !strings.Contains(g.Fix, "NCCL_IB_GID_INDEX=3") {
		t.Errorf("GID index to use: %v", g)
	}
	if n := one(t, r, "numa"); !strings.Contains(n.Detail, "node 1") || !strings.Contains(n.Fix, "--cpunodebind=1") {
		t.Errorf("NUMA: %v", n)
	}
	if d := one(t, r, "devices"); !strings.Contains(d.Detail, "mlx5_0 (mlx5_ib, CA)") {
		t.Errorf("devices: %v", d)
	}
}

func TestFaults(t *testing.T) {
	for _, c := range []struct {
		host, check string
		want        Status
		says, fix   string
	}{
		{"module-missing", "modules", Fail, "ib_uverbs, rdma_ucm missing", "modprobe ib_uverbs"},
		{"port-down", "ports", Fail, "DOWN", "ip link set eth0 up"},
		{"no-rocev2", "gids", Fail, "no RoCE v2 GID on mlx5_0/1", "ip addr add"},
		{"mtu-mismatch", "mtu", Warn, "RoCE gets 2048", "mtu 4200"},
		{"none", "devices", Fail, "no RDMA devices", "rdma link add rxe0 type rxe netdev eth0"},
		{"no-devnodes", "devnodes", Fail, "/dev/infiniband/uverbs0, /dev/infiniband/rdma_cm missing", "--device=/dev/infiniband"},
		{"module-missing", "devnodes", Skip, "ib_uverbs has no node", ""},
		{"driver-missing", "modules", Fail, "RDMA-capable NICs without their RDMA driver: eth0", "modprobe mlx5_ib"},
		{"driver-missing", "devices", Fail, "eth0 can do RDMA", "modprobe mlx5_ib"},
		{"none", "modules", Fail, "no RDMA in this kernel", "modprobe rdma_rxe"},
	} {
		t.Run(c.host+"/"+c.check, func(t *testing.T) {
			r := Run(fixed(c.host, sys.Unlimited))
			got := one(t, r, c.check)
			if got.Status != c.want || !strings.Contains(got.String(), c.says) || !strings.Contains(got.Fix, c.fix) {
				t.Errorf("got %q\nwant %v saying %q, fix %q", got.String(), c.want, c.says, c.fix)
			}
			if c.want == Fail && r.Worst() != Fail {
				t.Error("Worst is not Fail")
			}
		})
	}
}

func TestMemlock(t *testing.T) {
	r := Run(fixed("mlx5-healthy", 64<<10))
	m := one(t, r, "memlock")
	want := "FAIL  memlock limit 64 KiB: RDMA registrations will fail above it — raise it: ulimit -l unlimited"
	if m.Status != Fail || !strings.HasPrefix(m.String(), want) {
		t.Errorf("got  %q\nwant %q...", m.String(), want)
	}
	if m := one(t, Run(fixed("none", 64<<10)), "memlock"); m.Status != Warn {
		t.Errorf("without RDMA devices a low limit only warns: %v", m)
	}
	if m := one(t, Run(fixed("mlx5-healthy", 16<<30)), "memlock"); m.Status != Warn || !strings.Contains(m.Subject, "16 GiB") {
		t.Errorf("a finite large limit warns: %v", m)
	}
	o := fixed("mlx5-healthy", 0)
	o.Memlock = nil
	if m := one(t, Run(o), "memlock"); m.Status != Skip {
		t.Errorf("another root's limit is unknowable: %v", m)
	}
}

func TestActiveMTU(t *testing.T) {
	o := fixed("rxe", sys.Unlimited)
	o.PortMTU = func(string, int) (int, error) { return 4096, nil }
	m := one(t, Run(o), "mtu")
	if m.Status != Fail || !strings.Contains(m.Subject, "active MTU 4096") || !strings.Contains(m.Fix, "mtu 4192") {
		t.Errorf("active MTU over the netdev's: %v", m)
	}
	o = fixed("mlx5-healthy", sys.Unlimited)
	o.PortMTU = func(string, int) (int, error) { return 1024, nil }
	if m := one(t, Run(o), "mtu"); m.Status != Warn || !strings.Contains(m.Detail, "did not follow") {
		t.Errorf("stale active MTU: %v", m)
	}
	o.PortMTU = func(string, int) (int, error) { return 4096, nil }
	if m := one(t, Run(o), "mtu"); m.Status != Pass {
		t.Errorf("matching MTUs: %v", m)
	}
	for mtu, want := range map[int]int{1500: 1024, 9000: 4096, 4200: 4096, 4191: 2048, 1100: 512, 300: 0} {
		if got := RoCEMTU(mtu); got != want {
			t.Errorf("RoCEMTU(%d) = %d, want %d", mtu, got, want)
		}
	}
}

func TestGIDMissingForAddress(t *testing.T) {
	o := fixed("mlx5-healthy", sys.Unlimited)
	o.Addrs = func(string) ([]net.IP, error) { return []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("10.0.0.2")}, nil }
	g := one(t, Run(o), "gids")
	if g.Status != Warn || !strings.Contains(g.Detail, "10.0.0.2 (eth0)") {
		t.Errorf("an address without its GID: %v", g)
	}
}

func TestNetnsAndFirewall(t *testing.T) {
	o := fixed("mlx5-healthy", sys.Unlimited)
	o.NetnsMode = func() (string, error) { return "exclusive", nil }
	if n := one(t, Run(o), "netns"); n.Status != Pass || !strings.Contains(n.Subject, "exclusive") {
		t.Errorf("netns: %v", n)
	}
	o.NetnsMode = func() (string, error) { return "", errors.New("no netlink") }
	if n := one(t, Run(o), "netns"); n.Status != Skip {
		t.Errorf("netns unknown: %v", n)
	}
	for rules, want := range map[string]Status{
		"": Pass,
		"-A INPUT -p udp -m udp --dport 4791 -j DROP":                                                        Fail,
		"table inet filter {\n chain input {\n  type filter hook input priority filter; policy drop;\n }\n}": Warn,
		"chain input {\n type filter hook input priority 0; policy drop;\n udp dport 4791 accept\n}":         Pass,
		"udp dport 4791 reject": Fail,
	} {
		st, detail := judgeRuleset(rules)
		if st != want {
			t.Errorf("ruleset %q: %v %s, want %v", rules, st, detail, want)
		}
	}
}

func TestMain_(t *testing.T) {
	var out, errb bytes.Buffer
	o := Options{Memlock: func() (uint64, error) { return sys.Unlimited, nil }}
	if rc := run([]string{"--root", host("mlx5-healthy"), "--json"}, o, &out, &errb); rc != 0 {
		t.Fatalf("rc %d: %s %s", rc, out.String(), errb.String())
	}
	var v struct {
		Results []struct{ Check, Status, Subject string }
		Summary map[string]int
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || len(v.Results) < 12 || v.Summary["fail"] != 0 {
		t.Fatalf("json: %v %+v", err, v)
	}
	out.Reset()
	if rc := run([]string{"--root", host("port-down")}, o, &out, &errb); rc != 1 || !strings.Contains(out.String(), "FAIL  port mlx5_0/1 DOWN") {
		t.Errorf("rc %d:\n%s", rc, out.String())
	}
	if rc := run([]string{"--bogus"}, o, &out, &errb); rc != 2 {
		t.Errorf("usage error: rc %d", rc)
	}
	if rc := run([]string{"--root", "/nonexistent/dir"}, o, &out, &errb); rc != 2 {
		t.Errorf("bad root: rc %d", rc)
	}
	out.Reset()
	if rc := run([]string{"-h"}, o, &out, &errb); rc != 0 || !strings.Contains(out.String(), "usage: rdmakit doctor") {
		t.Errorf("help: rc %d", rc)
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{64 << 10: "64 KiB", 8 << 20: "8 MiB", 3 << 29: "1.5 GiB", 100: "100 B"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// The running system: whatever it has, every check reports and nothing
// panics.
func TestLive(t *testing.T) {
	r := Run(Options{Ruleset: func() (string, error) { return "", nil }})
	if len(r.Results) < 12 {
		t.Errorf("%d results", len(r.Results))
	}
	var b bytes.Buffer
	r.WriteText(&b)
	t.Logf("\n%s", b.String())
}
