package verbs

import (
	"fmt"
	"sort"
	"sync"

	"github.com/rdmakit/rdmakit/verbs/driver"
)

var (
	// regMu guards drivers.
	regMu   sync.RWMutex
	drivers = map[string]driver.Driver{}
)

// Register makes a transport available; transports call it from their
// init function. It panics if the name is taken.
func Register(d driver.Driver) {
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

func findDevice(name string) (driver.Driver, DeviceInfo, error) {
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
