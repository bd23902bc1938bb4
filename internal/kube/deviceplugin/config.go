// Package deviceplugin is rdmakit's Kubernetes device plugin: it
// advertises the host's RDMA devices to the kubelet as extended resources
// (rdma/<name>) over the kubelet device-plugin API v1beta1 and hands a
// container every character device it needs when the kubelet allocates
// them.
//
// The configuration is the JSON that users of the RDMA shared-device
// plugin already write (a configList of resources with resourceName,
// resourcePrefix, rdmaHcaMax and selectors), plus one field of ours,
// "mode": "shared" (the default: up to rdmaHcaMax pods share every
// selected device) or "exclusive" (one device, PF or VF, per allocation).
//
// Goroutines: Run's goroutine owns the plugin servers (start, register,
// restart when the kubelet restarts, rescan); gRPC serves each server's
// calls on its own goroutines, which read the resource under its mutex.
package deviceplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("device-plugin config")

// Modes of a resource.
const (
	Shared    = "shared"
	Exclusive = "exclusive"
)

// DefaultPrefix is the resource prefix when a resource names none.
const DefaultPrefix = "rdma"

// MaxShared bounds rdmaHcaMax (the kubelet keeps one entry per device ID).
const MaxShared = 10000

// Config is the device plugin's configuration file.
type Config struct {
	// PeriodicUpdateInterval is how often, in seconds, the devices are
	// rescanned for health and hot-plug (0: the default, 5 s).
	PeriodicUpdateInterval int              `json:"periodicUpdateInterval,omitempty"`
	ConfigList             []ResourceConfig `json:"configList"`
}

// ResourceConfig is one extended resource.
type ResourceConfig struct {
	ResourceName   string `json:"resourceName"`
	ResourcePrefix string `json:"resourcePrefix,omitempty"`
	// RdmaHcaMax is how many pods may share the resource's devices
	// (shared mode; required there, 1..MaxShared).
	RdmaHcaMax int `json:"rdmaHcaMax,omitempty"`
	// Mode is Shared (default) or Exclusive.
	Mode string `json:"mode,omitempty"`
	// Devices is the older form of Selectors.IfNames.
	Devices   []string  `json:"devices,omitempty"`
	Selectors Selectors `json:"selectors"`
}

// Selectors choose devices; a device is selected when it matches every
// non-empty list (each list: any of its entries). Empty selectors select
// every device.
type Selectors struct {
	Vendors   []string `json:"vendors,omitempty"`   // PCI vendor IDs, hex: "15b3"
	DeviceIDs []string `json:"deviceIDs,omitempty"` // PCI device IDs, hex: "101e"
	// Drivers: the PCI driver (mlx5_core, efa) or the RDMA driver module
	// (mlx5_ib, rdma_rxe, siw).
	Drivers []string `json:"drivers,omitempty"`
	// IfNames: network devices of the RDMA device's ports; or, ours, the
	// RDMA device names themselves (mlx5_0, rxe0).
	IfNames []string `json:"ifNames,omitempty"`
	// LinkTypes: "ether" (Ethernet: RoCE, iWARP), "infiniband", or
	// "unspecified" (devices such as EFA).
	LinkTypes []string `json:"linkTypes,omitempty"`
}

// FullName is the resource's name as pods request it: prefix/name.
func (r ResourceConfig) FullName() string {
	p := r.ResourcePrefix
	if p == "" {
		p = DefaultPrefix
	}
	return p + "/" + r.ResourceName
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	prefixRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	hexRE    = regexp.MustCompile(`^[0-9a-fA-F]{4}$`)
)

// ParseConfig decodes and checks a configuration. Unknown fields are
// errors (a misspelt selector would otherwise select every device).
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if dec.More() {
		return Config{}, fmt.Errorf("%w: data after the JSON object", ErrConfig)
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// Validate checks c and fills in the defaults (prefix, mode, the legacy
// devices list as ifNames, lower-case IDs and link types).
func (c *Config) Validate() error {
	if c.PeriodicUpdateInterval < 0 || c.PeriodicUpdateInterval > 3600 {
		return fmt.Errorf("%w: periodicUpdateInterval %d: want 0..3600 seconds", ErrConfig, c.PeriodicUpdateInterval)
	}
	if len(c.ConfigList) == 0 {
		return fmt.Errorf("%w: configList is empty: name at least one resource", ErrConfig)
	}
	seen := map[string]bool{}
	for i := range c.ConfigList {
		r := &c.ConfigList[i]
		where := fmt.Sprintf("configList[%d]", i)
		if r.ResourceName == "" {
			return fmt.Errorf("%w: %s: resourceName is missing", ErrConfig, where)
		}
		where += " (" + r.ResourceName + ")"
		if !nameRE.MatchString(r.ResourceName) {
			return fmt.Errorf("%w: %s: resourceName %q: want letters, digits, '-', '_', '.', at most 63, alphanumeric at both ends", ErrConfig, where, r.ResourceName)
		}
		if r.ResourcePrefix == "" {
			r.ResourcePrefix = DefaultPrefix
		}
		if len(r.ResourcePrefix) > 253 || !prefixRE.MatchString(r.ResourcePrefix) {
			return fmt.Errorf("%w: %s: resourcePrefix %q is not a DNS subdomain (lower case, e.g. rdma or example.com)", ErrConfig, where, r.ResourcePrefix)
		}
		if seen[r.FullName()] {
			return fmt.Errorf("%w: %s: resource %s is configured twice", ErrConfig, where, r.FullName())
		}
		seen[r.FullName()] = true
		switch strings.ToLower(r.Mode) {
		case "", Shared:
			r.Mode = Shared
			if r.RdmaHcaMax < 1 || r.RdmaHcaMax > MaxShared {
				return fmt.Errorf("%w: %s: rdmaHcaMax %d: shared mode needs 1..%d (how many pods share the devices)", ErrConfig, where, r.RdmaHcaMax, MaxShared)
			}
		case Exclusive:
			r.Mode = Exclusive
			if r.RdmaHcaMax != 0 {
				return fmt.Errorf("%w: %s: rdmaHcaMax is for shared mode; exclusive mode gives each device to one pod", ErrConfig, where)
			}
		default:
			return fmt.Errorf("%w: %s: mode %q: want shared or exclusive", ErrConfig, where, r.Mode)
		}
		s := &r.Selectors
		s.IfNames = append(s.IfNames, r.Devices...)
		r.Devices = nil
		for _, list := range []struct {
			name string
			v    []string
		}{{"vendors", s.Vendors}, {"deviceIDs", s.DeviceIDs}} {
			for j, v := range list.v {
				v = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(v)), "0x")
				if !hexRE.MatchString(v) {
					return fmt.Errorf("%w: %s: selectors.%s %q: want a 4-digit hex PCI ID such as 15b3", ErrConfig, where, list.name, list.v[j])
				}
				list.v[j] = v
			}
		}
		for j, v := range s.LinkTypes {
			lt, ok := linkTypeOf[strings.ToLower(strings.TrimSpace(v))]
			if !ok {
				return fmt.Errorf("%w: %s: selectors.linkTypes %q: want ether, infiniband or unspecified", ErrConfig, where, v)
			}
			s.LinkTypes[j] = lt
		}
		for _, l := range [][]string{s.Drivers, s.IfNames} {
			for _, v := range l {
				if strings.TrimSpace(v) == "" {
					return fmt.Errorf("%w: %s: an empty driver or interface name", ErrConfig, where)
				}
			}
		}
	}
	return nil
}

// linkTypeOf maps the accepted spellings of a link type to the one the
// selectors compare (the port's link_layer, lower case).
var linkTypeOf = map[string]string{
	"ether": "ethernet", "ethernet": "ethernet", "eth": "ethernet", "roce": "ethernet",
	"infiniband": "infiniband", "ib": "infiniband",
	"unspecified": "unspecified",
}
