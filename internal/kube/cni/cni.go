// Package cni is rdmakit's CNI plugin (CNI spec 1.0: ADD, DEL, CHECK,
// VERSION, over the stdin/environment protocol of the CNI library's
// skel). Chained after the network plugin that gave the pod its network
// device, it moves the RDMA device of that network device into the pod's
// network namespace on ADD and back to the host's on DEL. That needs the
// kernel's RDMA netns mode to be exclusive (in shared mode every
// namespace sees every RDMA device already) and a driver that can change
// namespace.
//
// Everything runs on the process's one goroutine (the runtime execs the
// plugin once per command); netlink requests into the pod's namespace go
// through a handle opened in it, so no thread changes namespace.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// Summary is the one-line description of rdmakit cni.
const Summary = "CNI plugin: move a pod's RDMA device into its network namespace"

// DefaultStateDir is where ADD records what it moved, for DEL.
const DefaultStateDir = "/var/lib/cni/rdmakit"

// NetConf is the plugin's configuration (stdin).
type NetConf struct {
	types.PluginConf
	// DeviceID is the PCI address of the pod's network function, as
	// Multus passes it from the device plugin's allocation.
	DeviceID string `json:"deviceID,omitempty"`
	// RdmaDevice names the RDMA device outright (mlx5_3, rxe0).
	RdmaDevice string `json:"rdmaDevice,omitempty"`
	// StateDir is where ADD's records are kept (default DefaultStateDir).
	StateDir string `json:"stateDir,omitempty"`
}

// state is what ADD recorded for DEL and CHECK.
type state struct {
	Device string `json:"device"`
	Netns  string `json:"netns"`
}

// Ops are the kernel operations of the plugin; the Linux ones use RDMA
// netlink. Tests replace them.
type Ops interface {
	// NetnsMode returns "exclusive" or "shared".
	NetnsMode() (string, error)
	// InNetns reports whether the RDMA device is visible in the
	// namespace at path ("" = the plugin's own).
	InNetns(dev, netnsPath string) (bool, error)
	// PCIOfLink returns the PCI address of the network device ifname in
	// the namespace at path ("" when it has none).
	PCIOfLink(ifname, netnsPath string) (string, error)
	// Move moves the RDMA device from the namespace at from to the one
	// at to ("" = the plugin's own).
	Move(dev, from, to string) error
}

// ErrNotSupported is returned where the kernel has no RDMA netlink.
var ErrNotSupported = errors.New("not supported on this system")

// Plugin is the CNI plugin: Ops and the /sys it reads.
type Plugin struct {
	Ops Ops
	FS  rdmafs.FS
}

func parse(data []byte) (*NetConf, error) {
	c := &NetConf{}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("rdmakit cni: config: %w", err)
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	// The configuration can come from a NetworkAttachmentDefinition that
	// namespace users write, while the plugin runs as root on the host:
	// nothing in it may name an arbitrary path.
	if err := checkStateDir(c.StateDir); err != nil {
		return nil, err
	}
	if c.DeviceID != "" && !pciAddr.MatchString(c.DeviceID) {
		return nil, fmt.Errorf("rdmakit cni: config: deviceID %q is not a PCI address (dddd:bb:dd.f)", c.DeviceID)
	}
	if c.RdmaDevice != "" && (!devName.MatchString(c.RdmaDevice) || c.RdmaDevice == "." || c.RdmaDevice == "..") {
		return nil, fmt.Errorf("rdmakit cni: config: rdmaDevice %q is not an RDMA device name", c.RdmaDevice)
	}
	return c, nil
}

var (
	pciAddr = regexp.MustCompile(`^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)
	devName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// StateRootsEnv names extra directories (colon-separated) under which a
// configuration's stateDir may lie, besides /var/lib/cni and /run. It is
// read from the plugin's environment, which the container runtime sets,
// not from the configuration.
const StateRootsEnv = "RDMAKIT_CNI_STATE_ROOT"

// checkStateDir accepts an absolute, clean path under an allowed root.
func checkStateDir(dir string) error {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return fmt.Errorf("rdmakit cni: config: stateDir %q must be an absolute, clean path", dir)
	}
	roots := []string{"/var/lib/cni", "/run"}
	if env := os.Getenv(StateRootsEnv); env != "" {
		roots = append(roots, filepath.SplitList(env)...)
	}
	for _, r := range roots {
		if r = filepath.Clean(r); filepath.IsAbs(r) && (dir == r || strings.HasPrefix(dir, r+string(filepath.Separator))) {
			return nil
		}
	}
	return fmt.Errorf("rdmakit cni: config: stateDir %q is outside %s (more roots: %s in the plugin's environment)", dir, strings.Join(roots, ", "), StateRootsEnv)
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

func (c *NetConf) statePath(a *skel.CmdArgs) string {
	return filepath.Join(c.StateDir, unsafeName.ReplaceAllString(a.ContainerID+"-"+a.IfName, "_")+".json")
}

// Add moves the pod's RDMA device into its namespace and passes the
// previous plugin's result on.
func (p Plugin) Add(a *skel.CmdArgs) error {
	c, err := parse(a.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if c.RawPrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "rdmakit cni: no prevResult: chain it after the plugin that creates the pod's network device (plugins list of a .conflist, or a Multus NetworkAttachmentDefinition)", "")
	}
	if err := version.ParsePrevResult(&c.PluginConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, "rdmakit cni: prevResult: "+err.Error(), "")
	}
	if a.Netns == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "rdmakit cni: CNI_NETNS is empty", "")
	}
	mode, err := p.Ops.NetnsMode()
	if err != nil {
		return fmt.Errorf("rdmakit cni: reading the RDMA netns mode: %w (is ib_core loaded?)", err)
	}
	if mode != "exclusive" {
		return fmt.Errorf("rdmakit cni: the kernel's RDMA netns mode is %s: every network namespace sees every RDMA device, so none can be given to one pod; set it to exclusive on the host (rdma system set netns exclusive, or the module parameter ib_core netns_mode=0) or do not chain rdmakit cni", mode)
	}
	// A repeated ADD: the device recorded is already in the pod (its PCI
	// function may no longer show it in this namespace's sysfs).
	if b, err := os.ReadFile(c.statePath(a)); err == nil {
		var s state
		if json.Unmarshal(b, &s) == nil && s.Device != "" {
			if in, err := p.Ops.InNetns(s.Device, a.Netns); err == nil && in {
				return p.finish(c, a, s.Device)
			}
		}
	}
	dev, err := p.device(c, a)
	if err != nil {
		return err
	}
	if in, err := p.Ops.InNetns(dev, a.Netns); err == nil && in {
		// A repeated ADD: already there.
		return p.finish(c, a, dev)
	}
	in, err := p.Ops.InNetns(dev, "")
	if err != nil {
		return fmt.Errorf("rdmakit cni: listing this namespace's RDMA devices: %w", err)
	}
	if !in {
		return fmt.Errorf("rdmakit cni: RDMA device %s is neither in this namespace nor in the pod's (another pod has it?)", dev)
	}
	if err := p.Ops.Move(dev, "", a.Netns); err != nil {
		drv := "its driver"
		if d, derr := p.FS.Device(dev); derr == nil && d.Driver != "" {
			drv = "driver " + d.Driver
		}
		return fmt.Errorf("rdmakit cni: moving RDMA device %s into %s: %w (%s must support changing network namespace, which needs user-context disassociation: mlx5_ib does, rdma_rxe and siw do not)", dev, a.Netns, err, drv)
	}
	return p.finish(c, a, dev)
}

func (p Plugin) finish(c *NetConf, a *skel.CmdArgs, dev string) error {
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return fmt.Errorf("rdmakit cni: state: %w", err)
	}
	b, _ := json.Marshal(state{Device: dev, Netns: a.Netns})
	if err := os.WriteFile(c.statePath(a), b, 0o600); err != nil {
		return fmt.Errorf("rdmakit cni: state: %w", err)
	}
	res, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "rdmakit cni: prevResult: "+err.Error(), "")
	}
	return types.PrintResult(res, c.CNIVersion)
}

// device finds the RDMA device to move: rdmaDevice, else deviceID's, else
// the one of the pod's interface (its PCI function, else the RDMA device
// over a network device of that name).
func (p Plugin) device(c *NetConf, a *skel.CmdArgs) (string, error) {
	if c.RdmaDevice != "" {
		return c.RdmaDevice, nil
	}
	pci := c.DeviceID
	how := "deviceID " + pci
	if pci == "" {
		var err error
		pci, err = p.Ops.PCIOfLink(a.IfName, a.Netns)
		if err != nil {
			return "", fmt.Errorf("rdmakit cni: interface %s in %s: %w", a.IfName, a.Netns, err)
		}
		how = "interface " + a.IfName + " (PCI " + pci + ")"
	}
	if pci != "" {
		devs := p.FS.DevicesOfPCI(pci)
		if len(devs) == 0 {
			return "", fmt.Errorf("rdmakit cni: %s has no RDMA device (is its RDMA driver loaded?)", how)
		}
		return devs[0], nil
	}
	all, _ := p.FS.Devices()
	for _, d := range all {
		for _, port := range d.Ports {
			for _, n := range p.FS.Netdevs(d.Name, port.Num) {
				if n == a.IfName {
					return d.Name, nil
				}
			}
		}
	}
	return "", fmt.Errorf("rdmakit cni: no RDMA device for interface %s (no PCI function, no RDMA device over it): set deviceID or rdmaDevice in the configuration", a.IfName)
}

// Del moves the device back; nothing recorded, or the device or the
// namespace gone (the kernel returns a dead namespace's devices to the
// host's), is success.
func (p Plugin) Del(a *skel.CmdArgs) error {
	c, err := parse(a.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	path := c.statePath(a)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("rdmakit cni: state: %w", err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil || s.Device == "" {
		os.Remove(path)
		return nil
	}
	ns := s.Netns
	if a.Netns != "" {
		ns = a.Netns
	}
	// A namespace that cannot be opened is gone, and the kernel has
	// returned its RDMA devices to the host's.
	if in, err := p.Ops.InNetns(s.Device, ns); err == nil && in {
		if err := p.Ops.Move(s.Device, ns, ""); err != nil {
			return fmt.Errorf("rdmakit cni: moving RDMA device %s back from %s: %w", s.Device, ns, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("rdmakit cni: state: %w", err)
	}
	return nil
}

// Check verifies that the device ADD moved is in the pod's namespace.
func (p Plugin) Check(a *skel.CmdArgs) error {
	c, err := parse(a.StdinData)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, err.Error(), "")
	}
	if c.RawPrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "rdmakit cni: CHECK without prevResult", "")
	}
	b, err := os.ReadFile(c.statePath(a))
	if err != nil {
		return fmt.Errorf("rdmakit cni: no record of an ADD for container %s interface %s: %w", a.ContainerID, a.IfName, err)
	}
	var s state
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("rdmakit cni: state: %w", err)
	}
	in, err := p.Ops.InNetns(s.Device, a.Netns)
	if err != nil {
		return fmt.Errorf("rdmakit cni: %w", err)
	}
	if !in {
		return fmt.Errorf("rdmakit cni: RDMA device %s is not in the pod's namespace %s", s.Device, a.Netns)
	}
	return nil
}

// Main runs the plugin over the CNI protocol (CNI_COMMAND and the other
// CNI_ variables, the configuration on stdin, the result on stdout) and
// returns the exit status. Without CNI_COMMAND it prints usage.
func Main(args []string) int {
	if os.Getenv("CNI_COMMAND") == "" {
		w := os.Stderr
		code := 2
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			w, code = os.Stdout, 0
		}
		fmt.Fprint(w, usage)
		return code
	}
	p := Plugin{Ops: linuxOps{}, FS: rdmafs.FS{}}
	funcs := skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: func(*skel.CmdArgs) error { return nil }}
	if e := skel.PluginMainFuncsWithError(funcs, version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"), "rdmakit cni: "+Summary); e != nil {
		if err := e.Print(); err != nil {
			fmt.Fprintln(os.Stderr, strings.TrimSpace(e.Error()))
		}
		return 1
	}
	return 0
}

const usage = `usage: rdmakit cni (run by a container runtime as the CNI plugin "rdmakit-cni":
a symlink rdmakit-cni -> rdmakit in the CNI bin directory)

Chained after the plugin that gives the pod its network device, ADD moves
the RDMA device of that device into the pod's network namespace and DEL
moves it back. The kernel's RDMA netns mode must be exclusive
(rdma system set netns exclusive). Configuration keys besides the CNI
ones: deviceID (PCI address; Multus fills it in), rdmaDevice (an RDMA
device name), stateDir (default ` + DefaultStateDir + `).
`
