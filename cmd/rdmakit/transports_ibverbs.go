//go:build ibverbs

package main

// Built with -tags ibverbs, rdmakit also drives libibverbs devices (RNICs,
// rxe, siw), and rdmakit info says what to do when libibverbs finds none.

import (
	"os"
	"strings"

	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() { ibverbsNote = noIBVerbsDevice }

// noIBVerbsDevice returns, when devs holds no device of the ibverbs
// transport, what the user can do about it (read from sysRoot: which RDMA
// modules are loaded); "" when there is one.
func noIBVerbsDevice(devs []verbs.DeviceInfo, sysRoot string) string {
	for _, d := range devs {
		if d.Transport == ibverbs.TransportName {
			return ""
		}
	}
	var loaded, missing []string
	for _, m := range []string{"ib_core", "ib_uverbs", "rdma_rxe", "siw"} {
		if _, err := os.Stat(sysRoot + "/sys/module/" + m); err == nil {
			loaded = append(loaded, m)
		} else {
			missing = append(missing, m)
		}
	}
	var b strings.Builder
	b.WriteString("ibverbs: libibverbs finds no RDMA device.\n")
	if len(loaded) == 0 {
		b.WriteString("  No RDMA kernel module is loaded (ib_core, ib_uverbs, rdma_rxe, siw).\n")
	} else {
		b.WriteString("  Loaded: " + strings.Join(loaded, ", ") + "; not loaded: " + strings.Join(missing, ", ") + ".\n")
	}
	b.WriteString("  With an RDMA NIC: load its driver (e.g. modprobe mlx5_ib) and ib_uverbs; `rdma link` lists the devices.\n" +
		"  Without one, create a software device on a network interface (as root):\n" +
		"    modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0    # Soft-RoCE\n" +
		"    modprobe siw && rdma link add siw0 type siw netdev eth0         # soft-iWARP\n" +
		"  Or use rdmakit's software transports listed above: shm0 (processes on one host), tcp0 (any network).\n" +
		"  rdmakit doctor checks the whole setup.\n")
	return b.String()
}
