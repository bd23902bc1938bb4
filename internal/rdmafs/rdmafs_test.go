package rdmafs

import (
	"path/filepath"
	"testing"
)

func host(name string) FS { return FS{Root: filepath.Join("testdata", "hosts", name)} }

func TestDevices(t *testing.T) {
	devs, err := host("mlx5-healthy").Devices()
	if err != nil || len(devs) != 1 {
		t.Fatalf("%v %v", devs, err)
	}
	d := devs[0]
	if d.Name != "mlx5_0" || d.Driver != "mlx5_ib" || d.NodeType != "CA" || d.NUMANode != 1 || d.FWVer != "28.39.1002" {
		t.Errorf("%+v", d)
	}
	p := d.Ports[0]
	if p.Num != 1 || p.State != "ACTIVE" || p.StateNum != 4 || p.PhysState != "LinkUp" || p.PhysNum != 5 ||
		p.LinkLayer != "Ethernet" || p.RateBits != 100e9 {
		t.Errorf("%+v", p)
	}
	rxe, _ := host("rxe").Devices()
	if rxe[0].Driver != "rdma_rxe" || rxe[0].Parent != "eth0" || rxe[0].NUMANode != -1 {
		t.Errorf("%+v", rxe[0])
	}
	none, err := host("none").Devices()
	if err != nil || len(none) != 0 {
		t.Errorf("no RDMA: %v %v", none, err)
	}
}

func TestGIDs(t *testing.T) {
	f := host("mlx5-healthy")
	gids, err := f.GIDs("mlx5_0", 1)
	if err != nil || len(gids) != 4 {
		t.Fatalf("%v %v", gids, err)
	}
	g := gids[3]
	if g.Index != 3 || !g.RoCEv2() || g.IPv4().String() != "10.0.0.1" || g.Netdev != "eth0" {
		t.Errorf("%+v", g)
	}
	if gids[0].IPv4() != nil || gids[0].RoCEv2() {
		t.Errorf("%+v", gids[0])
	}
	if nd := f.Netdevs("mlx5_0", 1); len(nd) != 1 || nd[0] != "eth0" {
		t.Errorf("netdevs %v", nd)
	}
	if nd := host("siw").Netdevs("siw0", 1); len(nd) != 1 || nd[0] != "eth0" {
		t.Errorf("siw netdevs (parent) %v", nd)
	}
	if mtu, err := f.NetdevMTU("eth0"); mtu != 9000 || err != nil {
		t.Errorf("mtu %d %v", mtu, err)
	}
}

func TestCounters(t *testing.T) {
	f := host("mlx5-healthy")
	c, bad, err := f.Counters("mlx5_0", 1, "hw_counters")
	if err != nil || bad != 0 || c["np_cnp_sent"] != 17 || c["out_of_sequence"] != 3 {
		t.Errorf("%v %d %v", c, bad, err)
	}
	if _, ok := c["lifespan"]; ok {
		t.Error("lifespan is not a counter")
	}
	c, _, _ = f.Counters("mlx5_0", 1, "counters")
	if c["port_xmit_data"] != 123456789 {
		t.Errorf("%v", c)
	}
	if c, _, err := host("siw").Counters("siw0", 1, "hw_counters"); c != nil || err != nil {
		t.Errorf("absent hw_counters: %v %v", c, err)
	}
}

func TestModulesAndRate(t *testing.T) {
	m, ok := host("module-missing").Modules()
	if !ok || !m["ib_core"] || m["ib_uverbs"] {
		t.Errorf("%v %v", m, ok)
	}
	for s, want := range map[string]float64{"100 Gb/sec (4X EDR)": 100e9, "2.5 Gb/sec (1X SDR)": 2.5e9, "": 0, "fast": 0} {
		if got := ParseRate(s); got != want {
			t.Errorf("ParseRate(%q) = %v", s, got)
		}
	}
}

func TestCapableNetdevs(t *testing.T) {
	if c := host("driver-missing").CapableNetdevs(); len(c) != 1 || c["eth0"] != "mlx5_ib" {
		t.Errorf("%v", c)
	}
	if c := host("rxe").CapableNetdevs(); len(c) != 0 {
		t.Errorf("%v", c)
	}
}
