package verbs

import (
	"fmt"
	"sort"
	"sync"
)

// Driver is implemented by a transport and registered with Register. It is
// the transport-facing side of this package; applications never call it.
type Driver interface {
	// Name is the transport's name ("shm", "tcp", ...).
	Name() string
	// Devices lists the transport's devices.
	Devices() ([]DeviceInfo, error)
	// Open opens the device for ctx, whose arena and key table exist.
	Open(dev DeviceInfo, ctx *Context) (ContextDriver, error)
}

// ContextDriver is a transport's per-context state.
type ContextDriver interface {
	// CanRegister reports whether RegMR of caller memory is served.
	CanRegister() bool
	// NewQP is called for each new queue pair, in RESET.
	NewQP(qp *QP) (QPDriver, error)
	// Close releases transport resources; verbs has destroyed all QPs.
	Close() error
}

// QPDriver is a transport's per-queue-pair state.
//
// Calls into a QPDriver never happen with verbs locks held, so a driver may
// call back into the QP (SendEntry, CompleteSend, Fail) from any method.
type QPDriver interface {
	// Address returns what a peer needs in AddressHandle.Dest.
	Address() []byte
	// Modify applies a validated transition. Returning an error leaves the
	// QP in its old state. On a transition to ERROR or RESET the driver
	// must stop touching send entries before it returns. attr is nil when
	// verbs moves the QP to ERROR by itself (a peer recorded an error, or a
	// completion was lost to CQ overflow). The control block already shows
	// RTR/RTS when Modify is called for those transitions.
	Modify(from, to QPState, attr *QPAttr) error
	// PostSend says that send entries up to QP.SendTail are ready.
	PostSend()
	// PostRecv says that receives were posted.
	PostRecv()
	// Destroy releases the QP's transport resources.
	Destroy() error
}

var (
	// regMu guards drivers.
	regMu   sync.RWMutex
	drivers = map[string]Driver{}
)

// Register makes a transport available. It panics if the name is taken.
func Register(d Driver) {
	regMu.Lock()
	defer regMu.Unlock()
	if _, dup := drivers[d.Name()]; dup {
		panic("verbs: Register called twice for transport " + d.Name())
	}
	drivers[d.Name()] = d
}

// Transports returns the names of registered transports, sorted.
func Transports() []string {
	regMu.RLock()
	defer regMu.RUnlock()
	var n []string
	for k := range drivers {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Devices lists every device of every registered transport. A transport
// that fails to list its devices is reported in the error, the others are
// still returned.
func Devices() ([]DeviceInfo, error) {
	var all []DeviceInfo
	var firstErr error
	for _, name := range Transports() {
		regMu.RLock()
		d := drivers[name]
		regMu.RUnlock()
		devs, err := d.Devices()
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("verbs: listing %s devices: %w", name, err)
		}
		all = append(all, devs...)
	}
	return all, firstErr
}

func findDevice(name string) (Driver, DeviceInfo, error) {
	devs, _ := Devices()
	for _, d := range devs {
		if d.Name == name {
			regMu.RLock()
			drv := drivers[d.Transport]
			regMu.RUnlock()
			return drv, d, nil
		}
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return nil, DeviceInfo{}, fmt.Errorf("%w %q: no transport is linked (import rdmakit/transport/shm or tcp)", ErrNoDevice, name)
	}
	return nil, DeviceInfo{}, fmt.Errorf("%w %q (devices: %v)", ErrNoDevice, name, names)
}
