package deviceplugin

import (
	"context"
	"os"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// TestRealDevices runs the plugin on this machine's own /sys and /dev
// against the fake kubelet: in the test VM (test/vm/guest/kube.sh sets
// RDMAKIT_DP_REAL=1) on its rxe and siw devices. Every selected device
// must be listed healthy and Allocate must name /dev nodes that exist.
func TestRealDevices(t *testing.T) {
	if os.Getenv("RDMAKIT_DP_REAL") != "1" {
		t.Skip("SKIP (loud): needs RDMA devices; test/vm/guest/kube.sh runs it with RDMAKIT_DP_REAL=1")
	}
	dir := shortDir(t)
	k := startKubelet(t, dir)
	defer k.srv.Stop()
	p := startPlugin(t, "", dir, `{"configList":[
		{"resourceName":"rxe","mode":"exclusive","selectors":{"drivers":["rdma_rxe"]}},
		{"resourceName":"siw","rdmaHcaMax":2,"selectors":{"drivers":["siw"]}}]}`)
	regs := map[string]*pluginapi.RegisterRequest{}
	for range 2 {
		r := k.registration(t)
		regs[r.ResourceName] = r
	}
	for _, name := range []string{"rdma/rxe", "rdma/siw"} {
		c := k.dial(t, regs[name].Endpoint)
		ctx, cancel := context.WithCancel(context.Background())
		law, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := law.Recv()
		if err != nil || len(resp.Devices) == 0 {
			t.Fatalf("%s: no devices: %v", name, err)
		}
		var ids []string
		for _, d := range resp.Devices {
			if d.Health != pluginapi.Healthy {
				t.Errorf("%s: %s %s", name, d.ID, d.Health)
			}
			ids = append(ids, d.ID)
		}
		ar, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids[:1]}}})
		if err != nil {
			t.Fatalf("%s: Allocate: %v", name, err)
		}
		cr := ar.ContainerResponses[0]
		var paths []string
		for _, s := range cr.Devices {
			if _, err := os.Stat(s.HostPath); err != nil {
				t.Errorf("%s: %s: %v", name, s.HostPath, err)
			}
			paths = append(paths, s.HostPath)
		}
		if !strings.Contains(strings.Join(paths, " "), "/dev/infiniband/uverbs") || cr.Envs[EnvDevices] == "" {
			t.Errorf("%s: Allocate gave %v %v", name, paths, cr.Envs)
		}
		t.Logf("%s: ids %v; allocate %s: devices %v env %s=%s", name, ids, ids[0], paths, EnvCollHCA, cr.Envs[EnvCollHCA])
		cancel()
	}
	p.stop(t)
}
