package deviceplugin

// One extended resource served to the kubelet: the DevicePlugin gRPC
// service. gRPC runs each call on its own goroutine; the selected devices
// are guarded by mu and replaced by the manager's rescans (setDevices),
// which wake the ListAndWatch streams.

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Environment variables Allocate sets in the container.
const (
	// EnvDevices lists the RDMA devices the container got: "mlx5_2,mlx5_3".
	EnvDevices = "RDMAKIT_RDMA_DEVICES"
	// EnvCollHCA and EnvNCCLHCA select exactly those devices in rdmakit's
	// collectives and in NCCL-style consumers ("=mlx5_2,mlx5_3").
	EnvCollHCA = "RDMAKIT_COLL_HCA"
	EnvNCCLHCA = "NCCL_IB_HCA"
)

// DevDir is where the kernel's RDMA character devices live.
const DevDir = "/dev/infiniband"

type resource struct {
	cfg ResourceConfig

	mu      sync.Mutex
	devs    []Device      // selected devices, in discovery order
	changed chan struct{} // closed and replaced when devs change
}

func newResource(cfg ResourceConfig) *resource {
	return &resource{cfg: cfg, changed: make(chan struct{})}
}

// setDevices selects from all and wakes ListAndWatch when the selection
// or its health changed. It returns whether anything changed.
func (r *resource) setDevices(all []Device) bool {
	var sel []Device
	for _, d := range all {
		if r.cfg.Selectors.Selects(d) {
			sel = append(sel, d)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.EqualFunc(sel, r.devs, func(a, b Device) bool {
		return a.Name == b.Name && a.Healthy == b.Healthy && a.NUMANode == b.NUMANode && slices.Equal(a.Chars.All(), b.Chars.All())
	}) && r.devs != nil {
		return false
	}
	if sel == nil {
		sel = []Device{}
	}
	r.devs = sel
	close(r.changed)
	r.changed = make(chan struct{})
	return true
}

// snapshot returns the selected devices and the channel that is closed
// at their next change.
func (r *resource) snapshot() ([]Device, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.devs, r.changed
}

func health(ok bool) string {
	if ok {
		return pluginapi.Healthy
	}
	return pluginapi.Unhealthy
}

func topology(numa int) *pluginapi.TopologyInfo {
	if numa < 0 {
		return nil
	}
	return &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(numa)}}}
}

// sharedID is the kubelet device ID of the i-th share of a shared resource.
func sharedID(i int) string { return fmt.Sprintf("shared-%d", i) }

// kubeDevices is the list ListAndWatch sends. Shared: rdmaHcaMax IDs,
// healthy while any selected device is healthy, on the NUMA nodes of the
// selected devices; none when nothing is selected. Exclusive: one ID per
// selected device.
func (r *resource) kubeDevices(devs []Device) []*pluginapi.Device {
	var out []*pluginapi.Device
	if r.cfg.Mode == Exclusive {
		for _, d := range devs {
			out = append(out, &pluginapi.Device{ID: d.ID(), Health: health(d.Healthy), Topology: topology(d.NUMANode)})
		}
		return out
	}
	if len(devs) == 0 {
		return nil
	}
	ok := false
	var topo *pluginapi.TopologyInfo
	var nodes []int
	for _, d := range devs {
		ok = ok || d.Healthy
		if d.NUMANode >= 0 && !slices.Contains(nodes, d.NUMANode) {
			nodes = append(nodes, d.NUMANode)
		}
	}
	if len(nodes) > 0 {
		sort.Ints(nodes)
		topo = &pluginapi.TopologyInfo{}
		for _, n := range nodes {
			topo.Nodes = append(topo.Nodes, &pluginapi.NUMANode{ID: int64(n)})
		}
	}
	for i := range r.cfg.RdmaHcaMax {
		out = append(out, &pluginapi.Device{ID: sharedID(i), Health: health(ok), Topology: topo})
	}
	return out
}

// server is the DevicePlugin service of one resource; stop ends its
// ListAndWatch streams when the manager replaces the server.
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	r    *resource
	stop <-chan struct{}
}

func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (s *server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devs, changed := s.r.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.r.kubeDevices(devs)}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-s.stop:
			return nil
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation prefers, after the must-include devices, the
// available devices on the NUMA nodes those are on, then the rest in
// order (shared IDs are interchangeable).
func (s *server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	devs, _ := s.r.snapshot()
	numa := map[string]int{}
	for _, d := range devs {
		numa[d.ID()] = d.NUMANode
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.ContainerRequests {
		size := int(c.AllocationSize)
		if size < 0 || size > len(c.AvailableDeviceIDs) {
			return nil, status.Errorf(codes.InvalidArgument, "allocation size %d with %d devices available", size, len(c.AvailableDeviceIDs))
		}
		pick := slices.Clone(c.MustIncludeDeviceIDs)
		nodes := map[int]bool{}
		for _, id := range pick {
			if n, ok := numa[id]; ok {
				nodes[n] = true
			}
		}
		rest := slices.DeleteFunc(slices.Clone(c.AvailableDeviceIDs), func(id string) bool { return slices.Contains(pick, id) })
		sort.SliceStable(rest, func(i, j int) bool {
			return nodes[numa[rest[i]]] && !nodes[numa[rest[j]]]
		})
		for _, id := range rest {
			if len(pick) >= size {
				break
			}
			pick = append(pick, id)
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: pick})
	}
	return resp, nil
}

// PreStartContainer has nothing to prepare (the options do not ask the
// kubelet to call it); it answers for kubelets that call it anyway.
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Allocate gives each container the character devices of its devices
// (uverbs, umad, issm) and rdma_cm, and the environment naming them.
func (s *server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	devs, _ := s.r.snapshot()
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		got, err := s.r.pick(devs, c.DevicesIds)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, s.r.containerResponse(got))
	}
	return resp, nil
}

// pick returns the devices behind the kubelet's IDs.
func (r *resource) pick(devs []Device, ids []string) ([]Device, error) {
	if len(ids) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: an allocation without device IDs", r.cfg.FullName())
	}
	if r.cfg.Mode == Shared {
		for _, id := range ids {
			var i int
			if _, err := fmt.Sscanf(id, "shared-%d", &i); err != nil || i < 0 || i >= r.cfg.RdmaHcaMax || sharedID(i) != id {
				return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device ID %q", r.cfg.FullName(), id)
			}
		}
		var got []Device
		for _, d := range devs {
			if d.Healthy {
				got = append(got, d)
			}
		}
		if len(got) == 0 {
			return nil, status.Errorf(codes.Unavailable, "%s: no healthy device among %d selected", r.cfg.FullName(), len(devs))
		}
		return got, nil
	}
	var got []Device
	for _, id := range ids {
		i := slices.IndexFunc(devs, func(d Device) bool { return d.ID() == id })
		if i < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device ID %q", r.cfg.FullName(), id)
		}
		got = append(got, devs[i])
	}
	return got, nil
}

var envUnsafe = regexp.MustCompile(`[^A-Z0-9_]`)

func (r *resource) containerResponse(devs []Device) *pluginapi.ContainerAllocateResponse {
	spec := func(node string) *pluginapi.DeviceSpec {
		p := DevDir + "/" + node
		return &pluginapi.DeviceSpec{ContainerPath: p, HostPath: p, Permissions: "rw"}
	}
	out := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	var names, pcis []string
	for _, d := range devs {
		names = append(names, d.Name)
		if d.PCI.Addr != "" {
			pcis = append(pcis, d.PCI.Addr)
		}
		for _, n := range d.Chars.All() {
			out.Devices = append(out.Devices, spec(n))
		}
	}
	if len(devs) > 0 && devs[0].RdmaCM {
		out.Devices = append(out.Devices, spec("rdma_cm"))
	}
	list := strings.Join(names, ",")
	out.Envs[EnvDevices] = list
	out.Envs[EnvCollHCA] = "=" + list
	out.Envs[EnvNCCLHCA] = "=" + list
	if len(pcis) > 0 && r.cfg.Mode == Exclusive {
		// The SR-IOV device plugin's variable, which CNI and
		// applications read for the PCI functions.
		key := "PCIDEVICE_" + envUnsafe.ReplaceAllString(strings.ToUpper(r.cfg.FullName()), "_")
		out.Envs[key] = strings.Join(pcis, ",")
	}
	return out
}
