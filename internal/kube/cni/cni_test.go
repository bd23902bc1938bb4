package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// The test binary doubles as the plugin: with RDMAKIT_CNI_CHILD=1 it runs
// Main over the real CNI protocol (environment, stdin, stdout).
func TestMain(m *testing.M) {
	// The tests' state directories are temporary ones.
	os.Setenv(StateRootsEnv, os.TempDir())
	if os.Getenv("RDMAKIT_CNI_CHILD") == "1" {
		os.Exit(Main(nil))
	}
	os.Exit(m.Run())
}

// fakeOps keeps where each RDMA device is ("" = the host's namespace).
type fakeOps struct {
	mode    string
	where   map[string]string
	pci     map[string]string // ifname -> PCI address
	moveErr error
	moves   int
}

func (f *fakeOps) NetnsMode() (string, error) { return f.mode, nil }
func (f *fakeOps) InNetns(dev, ns string) (bool, error) {
	w, ok := f.where[dev]
	return ok && w == ns, nil
}
func (f *fakeOps) PCIOfLink(ifname, _ string) (string, error) { return f.pci[ifname], nil }
func (f *fakeOps) Move(dev, from, to string) error {
	if f.moveErr != nil {
		return f.moveErr
	}
	if f.where[dev] != from {
		return errors.New("not there")
	}
	f.moves++
	f.where[dev] = to
	return nil
}

const prev = `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"net1","sandbox":"/run/netns/pod"}],"ips":[{"address":"10.1.0.5/24","interface":0}]}`

func conf(t *testing.T, extra string) []byte {
	return []byte(`{"cniVersion":"1.0.0","name":"rdma","type":"rdmakit-cni","stateDir":"` + t.TempDir() + `"` + extra + `}`)
}

func cluster() rdmafs.FS {
	return rdmafs.FS{Root: filepath.Join("..", "..", "rdmafs", "testdata", "hosts", "cluster")}
}

// quiet runs f with stdout (where PrintResult writes) discarded.
func quiet(t *testing.T, f func() error) error {
	t.Helper()
	old := os.Stdout
	null, _ := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	os.Stdout = null
	defer func() { os.Stdout = old; null.Close() }()
	return f()
}

func TestAddDelFake(t *testing.T) {
	ops := &fakeOps{mode: "exclusive", where: map[string]string{"mlx5_3": "", "rxe0": ""}, pci: map[string]string{"net1": "0000:03:00.3"}}
	p := Plugin{Ops: ops, FS: cluster()}
	a := &skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/pod", IfName: "net1", StdinData: conf(t, ","+prev)}
	// The device of net1 is found by its PCI function.
	if err := quiet(t, func() error { return p.Add(a) }); err != nil {
		t.Fatal(err)
	}
	if ops.where["mlx5_3"] != "/run/netns/pod" {
		t.Fatalf("not moved: %v", ops.where)
	}
	// ADD again: already there, no second move, even when net1's PCI
	// function no longer leads to it.
	ops.pci["net1"] = ""
	if err := quiet(t, func() error { return p.Add(a) }); err != nil || ops.moves != 1 {
		t.Fatalf("repeated ADD: %v, %d moves", err, ops.moves)
	}
	ops.pci["net1"] = "0000:03:00.3"
	if err := p.Check(a); err != nil {
		t.Fatal(err)
	}
	// DEL moves it back; DEL again is success.
	a.Netns = ""
	if err := p.Del(a); err != nil || ops.where["mlx5_3"] != "" {
		t.Fatalf("DEL: %v %v", err, ops.where)
	}
	if err := p.Del(a); err != nil || ops.moves != 2 {
		t.Fatalf("second DEL: %v, %d moves", err, ops.moves)
	}
	a.Netns = "/run/netns/pod"
	if err := p.Check(a); err == nil || !strings.Contains(err.Error(), "no record") {
		t.Errorf("CHECK after DEL: %v", err)
	}
}

func TestAddErrors(t *testing.T) {
	base := &skel.CmdArgs{ContainerID: "c1", Netns: "/run/netns/pod", IfName: "net1"}
	for _, c := range []struct {
		name  string
		ops   *fakeOps
		extra string
		want  string
	}{
		{"no prevResult", &fakeOps{mode: "exclusive"}, "", "no prevResult: chain it after"},
		{"shared mode", &fakeOps{mode: "shared"}, "," + prev, "RDMA netns mode is shared"},
		{"no device", &fakeOps{mode: "exclusive", where: map[string]string{}}, "," + prev, "no RDMA device for interface net1"},
		{"PCI without RDMA", &fakeOps{mode: "exclusive"}, `,"deviceID":"0000:07:00.0",` + prev, "deviceID 0000:07:00.0 has no RDMA device"},
		{"driver cannot move", &fakeOps{mode: "exclusive", where: map[string]string{"rxe0": ""}, moveErr: syscall.EOPNOTSUPP},
			`,"rdmaDevice":"rxe0",` + prev, "driver rdma_rxe must support changing network namespace"},
		{"taken", &fakeOps{mode: "exclusive", where: map[string]string{"rxe0": "/run/netns/other"}},
			`,"rdmaDevice":"rxe0",` + prev, "neither in this namespace nor in the pod's"},
		{"bad json", &fakeOps{mode: "exclusive"}, `,}`, "config"},
	} {
		a := *base
		a.StdinData = conf(t, c.extra)
		err := quiet(t, func() error { return Plugin{Ops: c.ops, FS: cluster()}.Add(&a) })
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// A software netdev: the RDMA device over a netdev of the pod
// interface's name.
func TestDeviceByNetdev(t *testing.T) {
	ops := &fakeOps{mode: "exclusive", where: map[string]string{"rxe0": ""}, pci: map[string]string{}}
	a := &skel.CmdArgs{ContainerID: "c2", Netns: "/run/netns/pod", IfName: "eth1", StdinData: conf(t, ","+prev)}
	if err := quiet(t, func() error { return Plugin{Ops: ops, FS: cluster()}.Add(a) }); err != nil || ops.where["rxe0"] != "/run/netns/pod" {
		t.Fatalf("%v %v", err, ops.where)
	}
}

// plugin runs the test binary as the plugin with the CNI environment.
func plugin(t *testing.T, cmd, netns string, stdin []byte) (stdout string, code int) {
	t.Helper()
	c := exec.Command(os.Args[0])
	c.Env = append(os.Environ(), "RDMAKIT_CNI_CHILD=1", "CNI_COMMAND="+cmd, "CNI_CONTAINERID=ctr1", "CNI_NETNS="+netns,
		"CNI_IFNAME=net1", "CNI_PATH=/opt/cni/bin")
	c.Stdin = bytes.NewReader(stdin)
	var out bytes.Buffer
	c.Stdout = &out
	c.Stderr = os.Stderr
	err := c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

func TestProtocolVersion(t *testing.T) {
	out, code := plugin(t, "VERSION", "", []byte(`{"cniVersion":"1.0.0"}`))
	var v struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || !strings.Contains(strings.Join(v.SupportedVersions, " "), "1.0.0") {
		t.Fatalf("VERSION: %d %s", code, out)
	}
}

func TestProtocolErrors(t *testing.T) {
	// ADD without prevResult: a CNI error object on stdout, exit 1.
	out, code := plugin(t, "ADD", "/run/netns/x", conf(t, ""))
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if code != 1 || json.Unmarshal([]byte(out), &e) != nil || e.Code != 7 || !strings.Contains(e.Msg, "no prevResult") {
		t.Fatalf("ADD without prevResult: %d %s", code, out)
	}
	// DEL with nothing recorded succeeds (idempotent), twice.
	for range 2 {
		if out, code := plugin(t, "DEL", "", conf(t, "")); code != 0 {
			t.Fatalf("DEL: %d %s", code, out)
		}
	}
	// An unknown command.
	if _, code := plugin(t, "FROB", "", conf(t, "")); code == 0 {
		t.Error("FROB succeeded")
	}
}

// ADD against a network namespace the test creates (root only): with
// RDMA netlink, the mode is checked and a device moved or refused; on a
// kernel without RDMA the error says so.
func TestProtocolNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP (loud): creating network namespaces needs root")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("SKIP (loud): no ip(8) to create a network namespace")
	}
	name := "rdmakit-cni-test"
	if out, err := exec.Command(ip, "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("SKIP (loud): ip netns add: %v %s", err, out)
	}
	defer exec.Command(ip, "netns", "del", name).Run()
	ns := "/run/netns/" + name
	if _, err := os.Stat(ns); err != nil {
		ns = "/var/run/netns/" + name
	}
	stdin := conf(t, ","+strings.Replace(prev, "/run/netns/pod", ns, 1))
	out, code := plugin(t, "ADD", ns, stdin)
	_, rdma := os.Stat("/sys/class/infiniband")
	switch {
	case rdma != nil:
		// No RDMA in this kernel: the mode cannot be read, and the error says why.
		if code != 1 || !strings.Contains(out, "RDMA netns mode") {
			t.Fatalf("ADD without RDMA: %d %s", code, out)
		}
	case code == 0:
		t.Logf("ADD moved a device: %s", out)
	default:
		t.Logf("ADD refused: %s", out)
	}
	if out, code := plugin(t, "DEL", ns, stdin); code != 0 {
		t.Fatalf("DEL: %d %s", code, out)
	}
}

// A configuration may come from users of a namespace (Multus): it cannot
// name arbitrary host paths for the plugin, which runs as root, to write.
func TestConfRejectsPaths(t *testing.T) {
	for _, extra := range []string{
		`"stateDir":"/etc"`,
		`"stateDir":"var/lib/cni/x"`,
		`"stateDir":"/var/lib/cni/../../etc"`,
		`"stateDir":"/var/lib/cnix"`,
		`"deviceID":"../../../../etc"`,
		`"deviceID":"0000:03:00.0/../.."`,
		`"rdmaDevice":"../mlx5_0"`,
		`"rdmaDevice":".."`,
	} {
		data := []byte(`{"cniVersion":"1.0.0","name":"rdma","type":"rdmakit-cni",` + extra + `}`)
		if _, err := parse(data); err == nil {
			t.Errorf("%s: accepted", extra)
		}
	}
	for _, extra := range []string{`"stateDir":"/var/lib/cni/rdmakit"`, `"stateDir":"/run/rdmakit"`, `"deviceID":"0000:03:00.1"`, `"rdmaDevice":"mlx5_3"`} {
		data := []byte(`{"cniVersion":"1.0.0","name":"rdma","type":"rdmakit-cni",` + extra + `}`)
		if _, err := parse(data); err != nil {
			t.Errorf("%s: %v", extra, err)
		}
	}
}
