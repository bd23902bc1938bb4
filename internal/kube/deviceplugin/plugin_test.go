package deviceplugin

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeKubelet serves the kubelet's Registration service on kubelet.sock
// in dir, as the kubelet does, and records the registrations.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir  string
	srv  *grpc.Server
	regs chan *pluginapi.RegisterRequest
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{dir: dir, regs: make(chan *pluginapi.RegisterRequest, 16)}
	ln, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k.srv = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go k.srv.Serve(ln) //nolint:errcheck
	return k
}

func (k *fakeKubelet) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.regs <- req
	return &pluginapi.Empty{}, nil
}

// restart does what a restarting kubelet does: stops, deletes every
// socket in the directory, and serves kubelet.sock anew.
func (k *fakeKubelet) restart(t *testing.T) *fakeKubelet {
	k.srv.Stop()
	ents, _ := os.ReadDir(k.dir)
	for _, e := range ents {
		os.Remove(filepath.Join(k.dir, e.Name()))
	}
	time.Sleep(20 * time.Millisecond)
	return startKubelet(t, k.dir)
}

func (k *fakeKubelet) registration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.regs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no registration within 10s")
		return nil
	}
}

// dial connects to a plugin's endpoint as the kubelet does.
func (k *fakeKubelet) dial(t *testing.T, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// copyHost copies a fixture host (symlinks included) to a temporary
// directory the test may change.
func copyHost(t *testing.T, name string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("cp", "-a", filepath.Join("..", "..", "rdmafs", "testdata", "hosts", name), dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	return dst
}

// shortDir is a temporary directory with a path short enough for unix
// sockets (108 bytes).
func shortDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type runner struct {
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	logs   []string
}

func startPlugin(t *testing.T, root, dir string, cfg string) *runner {
	t.Helper()
	c, err := ParseConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{cancel: cancel, done: make(chan error, 1)}
	go func() {
		r.done <- Run(ctx, Options{Root: root, Dir: dir, Config: c, Interval: 20 * time.Millisecond, Logf: func(f string, a ...any) {
			r.mu.Lock()
			r.logs = append(r.logs, f)
			r.mu.Unlock()
		}})
	}()
	t.Cleanup(func() {
		if r.cancel != nil {
			r.cancel()
			<-r.done
		}
	})
	return r
}

func (r *runner) stop(t *testing.T) {
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context's end")
	}
}

func recvUntil(t *testing.T, s pluginapi.DevicePlugin_ListAndWatchClient, pred func([]*pluginapi.Device) bool) []*pluginapi.Device {
	t.Helper()
	for range 100 {
		resp, err := s.Recv()
		if err != nil {
			t.Fatalf("ListAndWatch: %v", err)
		}
		if pred(resp.Devices) {
			return resp.Devices
		}
	}
	t.Fatal("ListAndWatch never sent the expected list")
	return nil
}

func healthOf(devs []*pluginapi.Device, id string) string {
	for _, d := range devs {
		if d.ID == id {
			return d.Health
		}
	}
	return "absent"
}

const testConfig = `{"configList":[
 {"resourceName":"vf","mode":"exclusive","selectors":{"vendors":["15b3"],"deviceIDs":["101e"]}},
 {"resourceName":"soft","rdmaHcaMax":3,"selectors":{"drivers":["rdma_rxe","siw"]}}
]}`

func TestPluginWithKubelet(t *testing.T) {
	root := copyHost(t, "cluster")
	dir := shortDir(t)
	k := startKubelet(t, dir)
	defer func() { k.srv.Stop() }()
	p := startPlugin(t, root, dir, testConfig)

	regs := map[string]*pluginapi.RegisterRequest{}
	for range 2 {
		r := k.registration(t)
		regs[r.ResourceName] = r
	}
	vfReg, softReg := regs["rdma/vf"], regs["rdma/soft"]
	if vfReg == nil || softReg == nil || vfReg.Version != pluginapi.Version || !vfReg.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registrations: %v", regs)
	}
	vf := k.dial(t, vfReg.Endpoint)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts, err := vf.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Fatalf("options: %v %v", opts, err)
	}
	law, err := vf.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	devs := recvUntil(t, law, func(d []*pluginapi.Device) bool { return len(d) == 2 })
	if devs[0].ID != "0000:03:00.2" || devs[1].ID != "0000:03:00.3" || devs[0].Health != pluginapi.Healthy ||
		devs[0].Topology == nil || devs[0].Topology.Nodes[0].ID != 0 {
		t.Fatalf("VF devices: %v", devs)
	}

	// Allocate: every char device of the VF, rdma_cm, the environment.
	ar, err := vf.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:03:00.3"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := ar.ContainerResponses[0]
	var paths []string
	for _, d := range cr.Devices {
		if d.HostPath != d.ContainerPath || d.Permissions != "rw" {
			t.Errorf("spec %v", d)
		}
		paths = append(paths, d.HostPath)
	}
	want := []string{"/dev/infiniband/uverbs3", "/dev/infiniband/umad3", "/dev/infiniband/issm3", "/dev/infiniband/rdma_cm"}
	if !slices.Equal(paths, want) {
		t.Errorf("device specs %v, want %v", paths, want)
	}
	if cr.Envs[EnvDevices] != "mlx5_3" || cr.Envs[EnvCollHCA] != "=mlx5_3" || cr.Envs[EnvNCCLHCA] != "=mlx5_3" || cr.Envs["PCIDEVICE_RDMA_VF"] != "0000:03:00.3" {
		t.Errorf("envs %v", cr.Envs)
	}
	if _, err := vf.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:99:00.0"}}}}); err == nil {
		t.Error("Allocate of an unknown ID succeeded")
	}
	pr, err := vf.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{"0000:03:00.2", "0000:03:00.3"}, MustIncludeDeviceIDs: []string{"0000:03:00.3"}, AllocationSize: 1}}})
	if err != nil || !slices.Equal(pr.ContainerResponses[0].DeviceIDs, []string{"0000:03:00.3"}) {
		t.Errorf("preferred: %v %v", pr, err)
	}
	if _, err := vf.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"0000:03:00.3"}}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}

	// Shared resource: rdmaHcaMax IDs; Allocate gives both soft devices.
	soft := k.dial(t, softReg.Endpoint)
	slaw, err := soft.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	sdevs := recvUntil(t, slaw, func(d []*pluginapi.Device) bool { return len(d) == 3 })
	if sdevs[2].ID != "shared-2" || sdevs[2].Health != pluginapi.Healthy {
		t.Errorf("shared: %v", sdevs)
	}
	sr, err := soft.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"shared-1"}}}})
	if err != nil || sr.ContainerResponses[0].Envs[EnvCollHCA] != "=rxe0,siw0" || len(sr.ContainerResponses[0].Devices) != 3 {
		t.Errorf("shared allocate: %v %v", sr, err)
	}

	// Health: mlx5_3's port goes down, then comes back.
	state := filepath.Join(root, "sys/class/infiniband/mlx5_3/ports/1/state")
	if err := os.WriteFile(state, []byte("1: DOWN\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, law, func(d []*pluginapi.Device) bool {
		return healthOf(d, "0000:03:00.3") == pluginapi.Unhealthy && healthOf(d, "0000:03:00.2") == pluginapi.Healthy
	})
	if err := os.WriteFile(state, []byte("4: ACTIVE\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, law, func(d []*pluginapi.Device) bool { return healthOf(d, "0000:03:00.3") == pluginapi.Healthy })
	// mlx5_3 moved into a pod's namespace (its sysfs class entry leaves
	// ours, its PCI function stays): still listed; its PCI function
	// removed too (hot-unplug): gone from the list.
	class, moved := filepath.Join(root, "sys/class/infiniband/mlx5_3"), filepath.Join(root, "mlx5_3.moved")
	if err := os.Rename(class, moved); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // five rescans
	alloc3 := func() error {
		_, err := vf.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:03:00.3"}}}})
		return err
	}
	if err := alloc3(); err != nil {
		t.Errorf("a device moved to another namespace was forgotten: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(root, "sys/bus/pci/devices/0000:03:00.3")); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, law, func(d []*pluginapi.Device) bool { return healthOf(d, "0000:03:00.3") == "absent" })
	if alloc3() == nil {
		t.Error("Allocate of a removed device succeeded")
	}
	if err := os.Rename(moved, class); err != nil {
		t.Fatal(err)
	}
	recvUntil(t, law, func(d []*pluginapi.Device) bool { return healthOf(d, "0000:03:00.3") == pluginapi.Healthy })
	// Both soft devices down: the shared IDs go unhealthy.
	for _, d := range []string{"rxe0", "siw0"} {
		os.WriteFile(filepath.Join(root, "sys/class/infiniband", d, "ports/1/state"), []byte("1: DOWN\n"), 0o644)
	}
	recvUntil(t, slaw, func(d []*pluginapi.Device) bool { return healthOf(d, "shared-0") == pluginapi.Unhealthy })
	if _, err := soft.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"shared-0"}}}}); err == nil {
		t.Error("shared Allocate with every device down succeeded")
	}
	cancel()

	// Kubelet restart: sockets deleted, kubelet.sock recreated; the
	// plugin re-registers both resources and serves again.
	k = k.restart(t)
	regs = map[string]*pluginapi.RegisterRequest{}
	for range 2 {
		r := k.registration(t)
		regs[r.ResourceName] = r
	}
	if regs["rdma/vf"] == nil || regs["rdma/soft"] == nil {
		t.Fatalf("re-registrations: %v", regs)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	law2, err := k.dial(t, regs["rdma/vf"].Endpoint).ListAndWatch(ctx2, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	recvUntil(t, law2, func(d []*pluginapi.Device) bool { return len(d) == 2 })
	cancel2()

	p.stop(t)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != "kubelet.sock" {
			t.Errorf("left behind after stop: %s", e.Name())
		}
	}
}

// A plugin started before the kubelet registers once kubelet.sock appears.
func TestPluginWaitsForKubelet(t *testing.T) {
	root := copyHost(t, "cluster")
	dir := shortDir(t)
	p := startPlugin(t, root, dir, testConfig)
	time.Sleep(50 * time.Millisecond)
	k := startKubelet(t, dir)
	defer k.srv.Stop()
	k.registration(t)
	k.registration(t)
	p.stop(t)
}

func TestRunRejects(t *testing.T) {
	if err := Run(context.Background(), Options{Dir: t.TempDir()}); err == nil {
		t.Error("empty config accepted")
	}
	c, _ := ParseConfig([]byte(testConfig))
	if err := Run(context.Background(), Options{Dir: filepath.Join(t.TempDir(), "absent"), Config: c}); err == nil {
		t.Error("missing plugin directory accepted")
	}
}
