package rdmafs

import (
	"reflect"
	"testing"
)

func TestPCIOf(t *testing.T) {
	f := host("cluster")
	pf, ok := f.PCIOf("mlx5_0")
	if !ok || pf != (PCI{Addr: "0000:03:00.0", Vendor: "15b3", Device: "101d", Driver: "mlx5_core"}) || pf.VF() {
		t.Errorf("PF: %+v %v", pf, ok)
	}
	vf, ok := f.PCIOf("mlx5_3")
	if !ok || vf.Addr != "0000:03:00.3" || vf.PhysFn != "0000:03:00.0" || !vf.VF() || vf.Device != "101e" {
		t.Errorf("VF: %+v %v", vf, ok)
	}
	efa, ok := f.PCIOf("efa_0")
	if !ok || efa.Vendor != "1d0f" || efa.Driver != "efa" {
		t.Errorf("efa: %+v %v", efa, ok)
	}
	if p, ok := f.PCIOf("rxe0"); ok {
		t.Errorf("rxe0 has no PCI function: %+v", p)
	}
	if got := f.DevicesOfPCI("0000:03:00.2"); !reflect.DeepEqual(got, []string{"mlx5_2"}) {
		t.Errorf("DevicesOfPCI: %v", got)
	}
}

func TestCharDevsOf(t *testing.T) {
	f := host("cluster")
	c := f.CharDevsOf("mlx5_1")
	if !reflect.DeepEqual(c.All(), []string{"uverbs1", "umad1", "issm1"}) {
		t.Errorf("mlx5_1: %+v", c)
	}
	if c := f.CharDevsOf("rxe0"); !reflect.DeepEqual(c.All(), []string{"uverbs4"}) {
		t.Errorf("rxe0: %+v", c)
	}
	if c := host("none").CharDevsOf("x"); len(c.All()) != 0 {
		t.Errorf("none: %+v", c)
	}
}

func TestClusterNetdevs(t *testing.T) {
	f := host("cluster")
	for dev, want := range map[string][]string{"mlx5_0": {"eth0"}, "mlx5_2": {"eth0v0"}, "mlx5_1": {"ib0"}, "rxe0": {"eth1"}, "siw0": {"eth2"}, "efa_0": nil} {
		if got := f.Netdevs(dev, 1); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %v, want %v", dev, got, want)
		}
	}
}
