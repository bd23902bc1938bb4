package main

// rdmakit doctor: the command line of internal/doctor. What the files
// under /sys cannot tell, the port's active MTU, comes from the linked
// transports (verbs.Devices; built with -tags ibverbs, the RNICs').

import (
	"errors"
	"sync"

	"github.com/rdmakit/rdmakit/internal/doctor"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	register("doctor", doctor.Summary, func(args []string) int {
		return doctor.Main(args, doctor.Options{PortMTU: verbsPortMTU})
	})
}

// verbsDevices lists the linked transports' devices once (opening an
// ibverbs device to query it is not free).
var verbsDevices = sync.OnceValue(func() []verbs.DeviceInfo {
	devs, _ := verbs.Devices()
	return devs
})

// verbsPortMTU returns the active MTU of an RDMA device's port as the
// linked ibverbs transport reports it.
func verbsPortMTU(dev string, port int) (int, error) {
	for _, d := range verbsDevices() {
		if d.Name != dev || d.Transport != "ibverbs" {
			continue
		}
		for _, p := range d.Ports {
			if p.Num == port && p.ActiveMTU.Bytes() > 0 {
				return p.ActiveMTU.Bytes(), nil
			}
		}
	}
	return 0, errors.New("no ibverbs port " + dev)
}
