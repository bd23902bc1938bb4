package doctor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/internal/sys"
)

// tree writes files (path → content) under a temporary root.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestInfiniBandAndHost(t *testing.T) {
	ib := "sys/class/infiniband/mlx5_0/"
	root := tree(t, map[string]string{
		"proc/modules":                                         "ib_core 1 1 - Live 0\nib_uverbs 1 1 - Live 0\nrdma_ucm 1 1 - Live 0\nmlx5_ib 1 1 - Live 0\nnf_tables 1 1 - Live 0",
		ib + "node_type":                                       "1: CA",
		ib + "device/numa_node":                                "-1",
		ib + "ports/1/state":                                   "2: INIT",
		ib + "ports/1/phys_state":                              "5: LinkUp",
		ib + "ports/1/link_layer":                              "InfiniBand",
		ib + "ports/1/gids/0":                                  "fe80:0000:0000:0000:0ac0:ebff:fe00:0001",
		"sys/devices/system/node/node0/cpulist":                "0",
		"sys/devices/system/node/node1/cpulist":                "1",
		"sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": "powersave",
		"sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": "performance",
	})
	r := Run(Options{Root: root, Memlock: func() (uint64, error) { return sys.Unlimited, nil }})
	if p := one(t, r, "ports"); p.Status != Fail || !strings.Contains(p.Fix, "opensm") {
		t.Errorf("IB port in INIT: %v", p)
	}
	for _, c := range []string{"gids", "mtu", "firewall"} {
		if x := one(t, r, c); x.Status != Skip {
			t.Errorf("%s on InfiniBand: %v", c, x)
		}
	}
	if g := one(t, r, "governor"); g.Status != Warn || !strings.Contains(g.Subject, "powersave on 1 CPU(s)") {
		t.Errorf("governor: %v", g)
	}
	if n := one(t, r, "numa"); n.Status != Warn {
		t.Errorf("unknown NUMA node on a two-node host: %v", n)
	}
	if h := one(t, r, "hugepages"); h.Status != Skip {
		t.Errorf("no meminfo: %v", h)
	}
	if m := one(t, r, "netns"); m.Status != Skip {
		t.Errorf("no netns_mode parameter: %v", m)
	}
}

func TestFirewallNeedsRoot(t *testing.T) {
	// A packet filter is loaded under a fixture root and no Ruleset is
	// given: the rules cannot be read, so SKIP with how to check.
	o := fixed("mlx5-healthy", sys.Unlimited)
	o.Root = tree(t, nil)
	src := host("mlx5-healthy")
	if err := os.CopyFS(o.Root, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.Root, "proc/net/ip_tables_names"), []byte("filter\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	o.Ruleset = nil
	if f := one(t, Run(o), "firewall"); f.Status != Skip || !strings.Contains(f.Fix, "nft list ruleset") {
		t.Errorf("firewall: %v", f)
	}
	o.Ruleset = func() (string, error) { return "-A INPUT -p udp --dport 4791 -j DROP", nil }
	if f := one(t, Run(o), "firewall"); f.Status != Fail || !strings.Contains(f.Fix, "udp dport 4791 accept") {
		t.Errorf("firewall: %v", f)
	}
}

func TestLinkLocalOnly(t *testing.T) {
	o := fixed("link-local", sys.Unlimited)
	o.Addrs = nil
	if g := one(t, Run(o), "gids"); g.Status != Warn || !strings.Contains(g.Subject, "link-local") {
		t.Errorf("link-local only: %v", g)
	}
}

func TestStatusJSON(t *testing.T) {
	for _, s := range []Status{Skip, Pass, Warn, Fail} {
		b, _ := json.Marshal(s)
		var back Status
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("%v: %s %v %v", s, b, back, err)
		}
	}
	var s Status
	if json.Unmarshal([]byte(`"MAYBE"`), &s) == nil {
		t.Error("MAYBE accepted")
	}
}
