package coll

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Fake device lists, with the capabilities the transports declare.
var (
	capsShm  = verbs.CapImmediate | verbs.CapAtomics | verbs.CapSameHost | verbs.CapWriteOnPost
	capsTCP  = verbs.CapImmediate | verbs.CapAtomics | verbs.CapRegisterCallerMemory | verbs.CapNetwork
	capsRoCE = verbs.CapImmediate | verbs.CapAtomics | verbs.CapRegisterCallerMemory | verbs.CapNetwork | verbs.CapRNRRetry
	capsIW   = verbs.CapRegisterCallerMemory | verbs.CapNetwork
)

func port(n int, st verbs.PortState, ll string) verbs.PortInfo {
	return verbs.PortInfo{Num: n, State: st, ActiveMTU: verbs.MTU1024, LinkLayer: ll}
}

func fakeDev(name, transport, node string, caps verbs.Capability, ports ...verbs.PortInfo) verbs.DeviceInfo {
	return verbs.DeviceInfo{Name: name, Transport: transport, NodeType: node, Caps: caps, Ports: ports}
}

var (
	devShm  = fakeDev("shm0", "shm", "Software", capsShm, port(1, verbs.PortActive, "Memory"))
	devTCP  = fakeDev("tcp0", "tcp", "Software", capsTCP, port(1, verbs.PortActive, "TCP"))
	devMlx0 = fakeDev("mlx5_0", "ibverbs", "CA", capsRoCE, port(1, verbs.PortActive, "Ethernet"))
	devMlx1 = fakeDev("mlx5_1", "ibverbs", "CA", capsRoCE, port(1, verbs.PortDown, "Ethernet"), port(2, verbs.PortActive, "Ethernet"))
	devMlx2 = fakeDev("mlx5_10", "ibverbs", "CA", capsRoCE, port(1, verbs.PortActive, "Ethernet"))
	devSiw  = fakeDev("siw_dum", "ibverbs", "RNIC", capsIW, port(1, verbs.PortActive, "Ethernet"))
	devDown = fakeDev("mlx5_9", "ibverbs", "CA", capsRoCE, port(1, verbs.PortDown, "Ethernet"))
)

func TestParseHCAFilter(t *testing.T) {
	type probe struct {
		dev  string
		port int
		ok   bool
	}
	for _, tc := range []struct {
		spec   string
		probes []probe
	}{
		{"", []probe{{"mlx5_0", 1, true}, {"anything", 7, true}}},
		{"mlx5_0", []probe{{"mlx5_0", 1, true}, {"mlx5_0", 2, true}, {"mlx5_01", 1, true}, {"mlx5_1", 1, false}}},
		{"mlx5", []probe{{"mlx5_0", 1, true}, {"mlx5_10", 2, true}, {"mlx4_0", 1, false}}},
		{"mlx5_0:1", []probe{{"mlx5_0", 1, true}, {"mlx5_0", 2, false}, {"mlx5_1", 1, false}}},
		{"=mlx5_0", []probe{{"mlx5_0", 1, true}, {"mlx5_0", 2, true}, {"mlx5_01", 1, false}}},
		{"=mlx5_0:1,mlx5_1:1", []probe{{"mlx5_0", 1, true}, {"mlx5_1", 1, true}, {"mlx5_1", 2, false}, {"mlx5_10", 1, false}}},
		{"^mlx5_1", []probe{{"mlx5_0", 1, true}, {"mlx5_1", 1, false}, {"mlx5_10", 1, false}, {"rxe0", 1, true}}},
		{"^=mlx5_1", []probe{{"mlx5_1", 1, false}, {"mlx5_10", 1, true}}},
		{"^=mlx5_1,mlx5_4", []probe{{"mlx5_1", 1, false}, {"mlx5_4", 2, false}, {"mlx5_0", 1, true}}},
		{"^mlx5_0:2", []probe{{"mlx5_0", 1, true}, {"mlx5_0", 2, false}}},
		{" rxe_dum , siw_dum:1 ", []probe{{"rxe_dum", 1, true}, {"siw_dum", 1, true}, {"siw_dum", 2, false}, {"mlx5_0", 1, false}}},
	} {
		f, err := parseHCAFilter(tc.spec)
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		for _, p := range tc.probes {
			if got := f.allows(p.dev, p.port); got != p.ok {
				t.Errorf("%q allows %s:%d = %v, want %v", tc.spec, p.dev, p.port, got, p.ok)
			}
		}
	}
	for _, bad := range []string{"mlx5_0:x", "mlx5_0:0", ":1", "^", "=", "^=", "mlx5_0:300"} {
		if _, err := parseHCAFilter(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%q: err %v, want ErrInvalidArgument", bad, err)
		}
	}
}

func mustHCA(t *testing.T, s string) hcaFilter {
	t.Helper()
	f, err := parseHCAFilter(s)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestLocalOffer(t *testing.T) {
	for _, tc := range []struct {
		name string
		devs []verbs.DeviceInfo
		hca  string
		same string
		net  []string // device:port, best transport first
		why  string   // substring of why ibverbs is missing
	}{
		{"software only", []verbs.DeviceInfo{devShm, devTCP}, "", "shm0", []string{"tcp0:1"}, ""},
		{"rdma preferred, listing order", []verbs.DeviceInfo{devTCP, devShm, devMlx0, devMlx2}, "", "shm0", []string{"mlx5_0:1", "tcp0:1"}, ""},
		{"inactive ports skipped", []verbs.DeviceInfo{devShm, devTCP, devDown, devMlx1}, "", "shm0", []string{"mlx5_1:2", "tcp0:1"}, ""},
		{"only inactive", []verbs.DeviceInfo{devShm, devTCP, devDown}, "", "shm0", []string{"tcp0:1"}, "no active port"},
		{"hca exact", []verbs.DeviceInfo{devShm, devTCP, devMlx0, devMlx2}, "=mlx5_10", "shm0", []string{"mlx5_10:1", "tcp0:1"}, ""},
		{"hca prefix", []verbs.DeviceInfo{devShm, devTCP, devSiw, devMlx0}, "mlx5", "shm0", []string{"mlx5_0:1", "tcp0:1"}, ""},
		{"hca exclude", []verbs.DeviceInfo{devShm, devTCP, devMlx0, devSiw}, "^mlx5_0", "shm0", []string{"siw_dum:1", "tcp0:1"}, ""},
		{"hca port", []verbs.DeviceInfo{devShm, devTCP, devMlx1}, "mlx5_1:1", "shm0", []string{"tcp0:1"}, "no active port"},
		{"hca excludes all", []verbs.DeviceInfo{devShm, devTCP, devMlx0}, "^mlx5", "shm0", []string{"tcp0:1"}, "excluded by the HCA list"},
		{"hca spares tcp", []verbs.DeviceInfo{devShm, devTCP}, "=rxe_dum", "shm0", []string{"tcp0:1"}, ""},
		{"no devices", nil, "", "", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := localOffer(tc.devs, mustHCA(t, tc.hca))
			same := ""
			if o.same != nil {
				same = o.same.Device
			}
			var net []string
			for _, d := range o.net {
				net = append(net, d.Device+":"+string(rune('0'+d.Port)))
			}
			if same != tc.same || strings.Join(net, " ") != strings.Join(tc.net, " ") {
				t.Errorf("offer same %q net %v, want %q %v", same, net, tc.same, tc.net)
			}
			if !strings.Contains(o.why["ibverbs"], tc.why) || (tc.why == "" && o.why["ibverbs"] != "") {
				t.Errorf("why %q, want %q", o.why["ibverbs"], tc.why)
			}
		})
	}
}

func TestOfferWire(t *testing.T) {
	o := localOffer([]verbs.DeviceInfo{devShm, devTCP, devDown, devMlx1}, hcaFilter{})
	o.why["x"] = "because"
	var e enc
	o.encode(&e)
	got, err := decodeOffer(&dec{b: e})
	if err != nil {
		t.Fatal(err)
	}
	if *got.same != *o.same || len(got.net) != 2 || got.net[0] != o.net[0] || got.net[1] != o.net[1] || got.why["x"] != "because" {
		t.Errorf("round trip: %+v, want %+v", got, o)
	}
	if _, err := decodeOffer(&dec{b: e[:len(e)-3]}); err == nil {
		t.Error("truncated offer decoded")
	}
}

func TestPlanDevices(t *testing.T) {
	sw := []verbs.DeviceInfo{devShm, devTCP}
	roce := []verbs.DeviceInfo{devShm, devTCP, devMlx0}
	roce2 := []verbs.DeviceInfo{devShm, devMlx2, devTCP}
	iw := []verbs.DeviceInfo{devShm, devTCP, devSiw}
	for _, tc := range []struct {
		name    string
		mode    string
		devs    [][]verbs.DeviceInfo
		hosts   string // host of each rank, one letter each
		want    [][]string
		allSync bool
		err     string
	}{
		{"one host: shm", "auto", [][]verbs.DeviceInfo{roce, roce, roce}, "aaa",
			[][]string{{"", "shm0", "shm0"}, {"shm0", "", "shm0"}, {"shm0", "shm0", ""}}, true, ""},
		{"two hosts: rdma between, shm within", "auto", [][]verbs.DeviceInfo{roce, roce, roce2}, "aab",
			[][]string{{"", "shm0", "mlx5_0"}, {"shm0", "", "mlx5_0"}, {"mlx5_10", "mlx5_10", ""}}, false, ""},
		{"tcp where a host lacks rdma", "auto", [][]verbs.DeviceInfo{roce, sw, roce}, "abc",
			[][]string{{"", "tcp0", "mlx5_0"}, {"tcp0", "", "tcp0"}, {"mlx5_0", "tcp0", ""}}, false, ""},
		{"tcp between fabrics (RoCE, iWARP)", "auto", [][]verbs.DeviceInfo{roce, iw}, "ab",
			[][]string{{"", "tcp0"}, {"tcp0", ""}}, false, ""},
		{"iwarp both sides", "auto", [][]verbs.DeviceInfo{iw, iw}, "ab",
			[][]string{{"", "siw_dum"}, {"siw_dum", ""}}, false, ""},
		{"forced ibverbs on one host", "ibverbs", [][]verbs.DeviceInfo{roce, roce}, "aa",
			[][]string{{"", "mlx5_0"}, {"mlx5_0", ""}}, false, ""},
		{"forced tcp", "tcp", [][]verbs.DeviceInfo{roce, roce}, "aa",
			[][]string{{"", "tcp0"}, {"tcp0", ""}}, false, ""},
		{"forced ibverbs, a rank without", "ibverbs", [][]verbs.DeviceInfo{roce, sw}, "aa", nil, false,
			"rank 1 has no usable ibverbs device"},
		{"forced ibverbs, fabrics differ", "ibverbs", [][]verbs.DeviceInfo{roce, iw}, "ab", nil, false,
			"cannot connect"},
		{"forced shm across hosts", "shm", [][]verbs.DeviceInfo{sw, sw}, "ab", nil, false, "different hosts"},
		{"nothing in common", "auto", [][]verbs.DeviceInfo{{devShm}, {devShm}}, "ab", nil, false, "no transport in common"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.devs)
			offers := make([]offer, n)
			hosts := make([]string, n)
			for r := range offers {
				offers[r] = localOffer(tc.devs[r], hcaFilter{})
				hosts[r] = tc.hosts[r : r+1]
			}
			for me := 0; me < n; me++ {
				pl, err := planDevices(tc.mode, me, offers, hosts)
				if tc.err != "" {
					if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.err) {
						t.Errorf("rank %d: err %v, want %q", me, err, tc.err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("rank %d: %v", me, err)
				}
				for p, d := range pl.devOf {
					name := ""
					if d != nil {
						name = d.Device
					}
					if name != tc.want[me][p] {
						t.Errorf("rank %d → %d: %q, want %q", me, p, name, tc.want[me][p])
					}
				}
				if pl.allSync != tc.allSync {
					t.Errorf("rank %d: allSync %v, want %v", me, pl.allSync, tc.allSync)
				}
			}
		})
	}
}

func TestOptionsDeviceEnv(t *testing.T) {
	t.Setenv(EnvNCCLHCA, "^=mlx5_1")
	t.Setenv(EnvNCCLGIDIndex, "3")
	o, err := Options{}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if o.HCA != "^=mlx5_1" || !o.hcaLenient || o.GIDIndex != "3" {
		t.Errorf("NCCL variables: %+v", o)
	}
	t.Setenv(EnvHCA, "rxe_dum:1")
	t.Setenv(EnvGIDIndex, "1")
	t.Setenv(EnvTransport, "IBVERBS")
	if o, err = (Options{}).resolve(); err != nil {
		t.Fatal(err)
	}
	if o.HCA != "rxe_dum:1" || o.hcaLenient || o.GIDIndex != "1" || o.Transport != "ibverbs" {
		t.Errorf("rdmakit variables win: %+v", o)
	}
	if o, err = (Options{HCA: "=siw_dum", GIDIndex: "auto", Transport: "tcp"}).resolve(); err != nil || o.HCA != "=siw_dum" || o.GIDIndex != "auto" || o.Transport != "tcp" {
		t.Errorf("fields win: %+v %v", o, err)
	}
	if i, _ := o.gidIndex(); i != -1 {
		t.Errorf("auto GID index %d", i)
	}
	for _, bad := range []Options{{GIDIndex: "256"}, {GIDIndex: "one"}, {HCA: "mlx5_0:"}, {Transport: "rdma"}} {
		if _, err := bad.resolve(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: err %v", bad, err)
		}
	}
}

func TestCommDeviceUses(t *testing.T) {
	for _, tc := range []struct {
		transport, dev, tr string
		sync               bool
	}{{"", "shm0", "shm", true}, {"tcp", "tcp0", "tcp", false}} {
		noErrors(t, runRanks(t, 3, Options{Transport: tc.transport}, func(c *Comm) error {
			u := c.DeviceUses()
			if len(u) != 1 || u[0].Device != tc.dev || u[0].Transport != tc.tr || u[0].Sync != tc.sync || len(u[0].Peers) != 2 || u[0].Port != 1 {
				return fmt.Errorf("transport %q: uses %+v", tc.transport, u)
			}
			if c.allSync != tc.sync {
				return fmt.Errorf("transport %q: allSync %v", tc.transport, c.allSync)
			}
			for _, p := range u[0].Peers {
				if c.Transport(p) != tc.dev {
					return fmt.Errorf("Transport(%d) = %q", p, c.Transport(p))
				}
			}
			return nil
		}))
	}
}

func TestCommForcedRDMAUnavailable(t *testing.T) {
	if slices.Contains(verbs.Transports(), rdmaTransport) {
		devs, _ := verbs.Devices()
		for _, d := range devs {
			if d.Transport == rdmaTransport {
				t.Skip("this host has RDMA devices")
			}
		}
	}
	errs := runRanks(t, 2, Options{Transport: "ibverbs", BootstrapTimeout: 10 * time.Second}, func(c *Comm) error { return nil })
	for r, err := range errs {
		if !errors.Is(err, ErrBootstrap) || !strings.Contains(err.Error(), "no usable ibverbs device") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
