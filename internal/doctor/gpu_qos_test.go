package doctor

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/internal/sys"
)

const topoM = `	GPU0	GPU1	NIC0	NIC1	CPU Affinity	NUMA Affinity	GPU NUMA ID
GPU0	 X 	NV12	PIX	SYS	0-23	0		N/A
GPU1	NV12	 X 	SYS	NODE	24-47	1		N/A
NIC0	PIX	SYS	 X 	SYS
NIC1	SYS	NODE	SYS	 X

Legend:

  X    = Self
  PIX  = Connection traversing at most a single PCIe bridge

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
`

func TestParseTopo(t *testing.T) {
	got := parseTopo(topoM)
	want := []topoLink{{"GPU0", "mlx5_0", "PIX"}, {"GPU1", "mlx5_1", "NODE"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
	if parseTopo("no GPUs here") != nil {
		t.Error("garbage parsed")
	}
}

// gpuHost: mlx5_0 on node 0; GPUs on nodes 0 and 1.
func gpuHost(t *testing.T, extra map[string]string) string {
	files := map[string]string{
		"proc/modules":                                          "ib_core 1 1 - Live 0\nib_uverbs 1 1 - Live 0\nrdma_ucm 1 1 - Live 0\nmlx5_ib 1 1 - Live 0",
		"sys/class/infiniband/mlx5_0/node_type":                 "1: CA",
		"sys/class/infiniband/mlx5_0/device/numa_node":          "0",
		"sys/class/infiniband/mlx5_0/ports/1/state":             "4: ACTIVE",
		"sys/class/infiniband/mlx5_0/ports/1/link_layer":        "Ethernet",
		"sys/class/infiniband/mlx5_0/ports/1/gids/0":            "fe80:0000:0000:0000:0ac0:ebff:fe00:0001",
		"sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0": "eth0",
		"sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/0": "RoCE v2",
		"sys/bus/pci/devices/0000:3b:00.0/vendor":               "0x10de",
		"sys/bus/pci/devices/0000:3b:00.0/class":                "0x030200",
		"sys/bus/pci/devices/0000:3b:00.0/numa_node":            "0",
		"sys/bus/pci/devices/0000:d8:00.0/vendor":               "0x10de",
		"sys/bus/pci/devices/0000:d8:00.0/class":                "0x030000",
		"sys/bus/pci/devices/0000:d8:00.0/numa_node":            "1",
		"sys/bus/pci/devices/0000:00:1f.0/vendor":               "0x8086",
		"sys/bus/pci/devices/0000:00:1f.0/class":                "0x060100",
	}
	for k, v := range extra {
		files[k] = v
	}
	return tree(t, files)
}

func TestGPU(t *testing.T) {
	root := gpuHost(t, nil)
	r := Run(Options{Root: root, Memlock: func() (uint64, error) { return sys.Unlimited, nil }, GPUTopo: func() (string, error) { return topoM, nil }})
	res := r.Find("gpu")
	var got []string
	for _, x := range res {
		got = append(got, x.Status.String()+" "+x.Subject)
	}
	want := []string{
		"PASS NUMA node of GPU 0000:3b:00.0",
		"WARN NUMA node of GPU 0000:d8:00.0",
		"PASS PCIe path GPU0 ↔ mlx5_0 PIX",
		"WARN PCIe path GPU1 ↔ mlx5_1 NODE",
		"WARN GPUDirect RDMA peer memory",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("gpu results:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(res[0].Fix, "NCCL_IB_HCA=mlx5_0") {
		t.Errorf("GPU on the NIC's node: %v", res[0])
	}
	// With nvidia_peermem loaded; no GPUs at all.
	root = gpuHost(t, map[string]string{"sys/module/nvidia_peermem/refcnt": "1"})
	r = Run(Options{Root: root, GPUTopo: func() (string, error) { return "", errors.New("no devices were found") }})
	last := r.Find("gpu")
	if l := last[len(last)-1]; l.Status != Pass || !strings.Contains(l.Detail, "nvidia_peermem") {
		t.Errorf("peer memory: %v", l)
	}
	if x := r.Find("gpu")[2]; x.Status != Skip || !strings.Contains(x.Detail, "no devices were found") {
		t.Errorf("nvidia-smi failing: %v", x)
	}
	if x := one(t, Run(Options{Root: tree(t, map[string]string{"proc/modules": "ext4 1 1 - Live 0"})}), "gpu"); x.Status != Skip {
		t.Errorf("no GPU: %v", x)
	}
}

func TestQoS(t *testing.T) {
	ecn := func(np, rp string) map[string]string {
		m := map[string]string{"sys/class/infiniband/mlx5_0/tc/1/traffic_class": "Global tclass=106"}
		for p := range 8 {
			v := func(s string) string {
				if strings.ContainsRune(s, rune('0'+p)) {
					return "1"
				}
				return "0"
			}
			m["sys/class/net/eth0/ecn/roce_np/enable/"+string(rune('0'+p))] = v(np)
			m["sys/class/net/eth0/ecn/roce_rp/enable/"+string(rune('0'+p))] = v(rp)
		}
		return m
	}
	pfc := func(on []int, err error) func(string) ([]int, error) {
		return func(nd string) ([]int, error) {
			if nd != "eth0" {
				t.Errorf("PFC asked of %s", nd)
			}
			return on, err
		}
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		pfc   func(string) ([]int, error)
		want  []string
	}{
		{"good", ecn("3", "3"), pfc([]int{3}, nil), []string{"PASS ECN on eth0 (mlx5_0/1)", "PASS PFC on eth0", "PASS RoCE traffic class of mlx5_0: 106 (DSCP 26)"}},
		{"ecn and pfc off", ecn("", "3"), pfc(nil, nil), []string{"WARN ECN on eth0 (mlx5_0/1) off", "WARN PFC on eth0 off", "PASS RoCE traffic class of mlx5_0: 106 (DSCP 26)"}},
		{"nothing exposed", nil, nil, []string{"SKIP ECN on eth0 (mlx5_0/1)", "SKIP PFC on eth0"}},
		{"dcb fails", nil, pfc(nil, errors.New("dcb: no such device")), []string{"SKIP ECN on eth0 (mlx5_0/1)", "SKIP PFC on eth0"}},
	} {
		r := Run(Options{Root: gpuHost(t, c.files), PFC: c.pfc})
		var got []string
		for _, x := range r.Find("qos") {
			got = append(got, x.Status.String()+" "+x.Subject)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	// Software devices have no lossless Ethernet to check.
	if x := one(t, Run(Options{Root: "../rdmafs/testdata/hosts/rxe"}), "qos"); x.Status != Skip {
		t.Errorf("rxe: %v", x)
	}
}

func TestParseDCBPFC(t *testing.T) {
	on, err := parseDCBPFC("pfc-cap 8 macsec-bypass off delay 0\nprio-pfc 0:off 1:off 2:off 3:on 4:off 5:on 6:off 7:off\n")
	if err != nil || !reflect.DeepEqual(on, []int{3, 5}) {
		t.Errorf("%v %v", on, err)
	}
	if _, err := parseDCBPFC("Error: no such device"); err == nil {
		t.Error("garbage parsed")
	}
}

func TestPeer(t *testing.T) {
	root := "../rdmafs/testdata/hosts/none"
	if r := Run(Options{Root: root}); len(r.Find("peer")) != 0 {
		t.Error("peer check without --peer")
	}
	for _, c := range []struct {
		res  PeerResult
		err  error
		want Status
		text string
	}{
		{PeerResult{Device: "mlx5_0", LatencyUs: 2.1, BitsPerS: 90e9, LinkBits: 100e9}, nil, Pass, "90% of the link rate 100 Gb/s"},
		{PeerResult{Device: "mlx5_0", LatencyUs: 2.1, BitsPerS: 30e9, LinkBits: 100e9}, nil, Warn, "30% of the link rate 100 Gb/s: below 70%"},
		{PeerResult{Device: "tcp0", LatencyUs: 30, BitsPerS: 5e9}, nil, Pass, "link rate unknown"},
		{PeerResult{}, errors.New("connection refused"), Fail, "connection refused"},
	} {
		r := Run(Options{Root: root, PeerAddr: "10.0.0.2:18515", PeerDev: "mlx5_0", Peer: func(addr, dev string) (PeerResult, error) {
			if addr != "10.0.0.2:18515" || dev != "mlx5_0" {
				t.Errorf("Peer(%q, %q)", addr, dev)
			}
			return c.res, c.err
		}})
		if x := one(t, r, "peer"); x.Status != c.want || !strings.Contains(x.String(), c.text) {
			t.Errorf("%+v: %v", c.res, x)
		}
	}
}
