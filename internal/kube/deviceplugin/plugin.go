package deviceplugin

// The manager: Run's goroutine starts a gRPC server per resource on a
// socket in the kubelet's device-plugin directory, registers it with the
// kubelet, rescans the devices every interval, and restarts and
// re-registers when the kubelet restarts (it deletes the plugins' sockets
// and creates its own socket anew: seen through fsnotify and, as a
// fallback, at every rescan).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// DefaultInterval is the rescan period when the configuration sets none.
const DefaultInterval = 5 * time.Second

// Options configure Run. The zero value serves nothing: Config needs at
// least one resource.
type Options struct {
	// Root is where /sys and /dev are read ("" = "/"); tests point it at
	// a fixture tree.
	Root string
	// Dir is the kubelet's device-plugin directory (default
	// /var/lib/kubelet/device-plugins/), holding kubelet.sock.
	Dir    string
	Config Config
	// Interval is the rescan period (default: the configuration's
	// periodicUpdateInterval, else DefaultInterval).
	Interval time.Duration
	// Logf logs what happens (nil: nothing).
	Logf func(format string, args ...any)
}

type manager struct {
	o       Options
	fs      rdmafs.FS
	kubelet string // kubelet.sock path
	plugins []*plugin
	// known are the PCI devices seen, by PCI address: a device the CNI
	// moved into a pod's network namespace (exclusive RDMA netns mode)
	// leaves this namespace's sysfs but is still there and allocated.
	known map[string]Device
}

// plugin is one resource's server generation.
type plugin struct {
	r          *resource
	sock       string
	srv        *grpc.Server
	stop       chan struct{}
	registered bool
	waiting    bool // "no kubelet socket" was logged since the last registration
}

var sockUnsafe = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// Run serves the configured resources until ctx is done, then stops the
// servers and removes their sockets. It returns an error only when it
// cannot start (bad options, unreadable sysfs, a socket it cannot bind);
// a kubelet that is absent or refuses registration is logged and retried.
func Run(ctx context.Context, o Options) error {
	if err := o.Config.Validate(); err != nil {
		return err
	}
	if o.Dir == "" {
		o.Dir = pluginapi.DevicePluginPath
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("device-plugin directory %s: not a directory (mount the kubelet's /var/lib/kubelet/device-plugins there)", dir)
	}
	if o.Interval <= 0 {
		o.Interval = time.Duration(o.Config.PeriodicUpdateInterval) * time.Second
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	m := &manager{o: o, fs: rdmafs.FS{Root: o.Root}, kubelet: filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket))}
	for _, rc := range o.Config.ConfigList {
		m.plugins = append(m.plugins, &plugin{r: newResource(rc), sock: filepath.Join(dir, "rdmakit-"+sockUnsafe.ReplaceAllString(rc.FullName(), "_")+".sock")})
	}
	if err := m.rescan(); err != nil {
		return err
	}
	defer m.stopAll()
	for _, p := range m.plugins {
		if err := m.start(p); err != nil {
			return err
		}
		m.register(p)
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		o.Logf("fsnotify: %v; watching %s by polling every %v", err, dir, o.Interval)
	} else {
		defer w.Close()
		if err := w.Add(dir); err != nil {
			o.Logf("fsnotify %s: %v; polling every %v", dir, err, o.Interval)
		} else {
			events, errs = w.Events, w.Errors
		}
	}
	tick := time.NewTicker(o.Interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			o.Logf("stopping")
			return nil
		case ev := <-events:
			switch {
			case ev.Name == m.kubelet && ev.Has(fsnotify.Create):
				o.Logf("kubelet socket created: re-registering")
				for _, p := range m.plugins {
					p.registered = false
				}
				m.heal()
			case ev.Has(fsnotify.Remove) && m.ours(ev.Name):
				m.heal()
			}
		case err := <-errs:
			o.Logf("fsnotify: %v", err)
		case <-tick.C:
			if err := m.rescan(); err != nil {
				o.Logf("%v", err)
			}
			m.heal()
		}
	}
}

func (m *manager) ours(path string) bool {
	for _, p := range m.plugins {
		if p.sock == path {
			return true
		}
	}
	return false
}

// rescan rediscovers the devices and hands them to every resource.
func (m *manager) rescan() error {
	devs, err := Discover(m.fs)
	if err != nil {
		return err
	}
	devs = m.keepMoved(devs)
	for _, p := range m.plugins {
		if p.r.setDevices(devs) {
			sel, _ := p.r.snapshot()
			for _, d := range sel {
				if d.Healthy {
					m.o.Logf("%s: %s (%s) healthy", p.r.cfg.FullName(), d.Name, d.ID())
				} else {
					m.o.Logf("%s: %s (%s) unhealthy: %s", p.r.cfg.FullName(), d.Name, d.ID(), d.Why)
				}
			}
			if len(sel) == 0 {
				m.o.Logf("%s: no device matches the selectors", p.r.cfg.FullName())
			}
		}
	}
	return nil
}

// keepMoved adds to devs the PCI devices seen before that are gone from
// sysfs's RDMA class while their PCI function remains: moved to another
// network namespace (a pod's, by rdmakit cni). They keep their last
// health; a PCI function that is gone too is forgotten.
func (m *manager) keepMoved(devs []Device) []Device {
	if m.known == nil {
		m.known = map[string]Device{}
	}
	here := map[string]bool{}
	for _, d := range devs {
		if d.PCI.Addr != "" {
			here[d.PCI.Addr] = true
			m.known[d.PCI.Addr] = d
		}
	}
	for addr, d := range m.known {
		switch {
		case here[addr]:
		case m.fs.Exists("sys/bus/pci/devices/" + addr):
			devs = append(devs, d)
		default:
			delete(m.known, addr)
		}
	}
	sort.SliceStable(devs, func(i, j int) bool { return devs[i].Name < devs[j].Name })
	return devs
}

// heal restarts the servers whose socket is gone and registers those the
// current kubelet does not know.
func (m *manager) heal() {
	for _, p := range m.plugins {
		if _, err := os.Lstat(p.sock); err != nil {
			m.o.Logf("%s: socket %s gone (kubelet restart?): restarting", p.r.cfg.FullName(), p.sock)
			m.stop(p)
			if err := m.start(p); err != nil {
				m.o.Logf("%s: %v", p.r.cfg.FullName(), err)
				continue
			}
		}
		if !p.registered {
			m.register(p)
		}
	}
}

func (m *manager) start(p *plugin) error {
	if err := os.Remove(p.sock); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: %w", p.r.cfg.FullName(), err)
	}
	ln, err := net.Listen("unix", p.sock)
	if err != nil {
		return fmt.Errorf("%s: %w", p.r.cfg.FullName(), err)
	}
	// The kubelet deletes the sockets when it restarts; closing this
	// listener must not unlink the next generation's socket of that name.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	p.stop = make(chan struct{})
	p.srv = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.srv, &server{r: p.r, stop: p.stop})
	go p.srv.Serve(ln) //nolint:errcheck // ends with Stop
	p.registered = false
	return nil
}

func (m *manager) stop(p *plugin) {
	if p.srv == nil {
		return
	}
	close(p.stop)
	p.srv.Stop()
	p.srv = nil
}

func (m *manager) stopAll() {
	for _, p := range m.plugins {
		m.stop(p)
		os.Remove(p.sock)
	}
}

// register tells the kubelet about p's server.
func (m *manager) register(p *plugin) {
	if _, err := os.Lstat(m.kubelet); err != nil {
		if !p.waiting {
			m.o.Logf("%s: no kubelet socket %s yet: will register when it appears", p.r.cfg.FullName(), m.kubelet)
			p.waiting = true
		}
		return
	}
	conn, err := grpc.NewClient("unix://"+m.kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		m.o.Logf("%s: %v", p.r.cfg.FullName(), err)
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.sock),
		ResourceName: p.r.cfg.FullName(),
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		m.o.Logf("%s: registering with the kubelet: %v (retrying every %v)", p.r.cfg.FullName(), err, m.o.Interval)
		return
	}
	p.registered, p.waiting = true, false
	m.o.Logf("%s: registered with the kubelet (%s)", p.r.cfg.FullName(), filepath.Base(p.sock))
}
