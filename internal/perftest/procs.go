package perftest

// Called by the run's goroutine before the endpoint opens.

import (
	"runtime"

	"github.com/rdmakit/rdmakit/verbs"
)

// minProcsCgo is the GOMAXPROCS a run on a cgo device (transport/ibverbs)
// keeps at least.
//
// Why: a cgo call counts as a system call to the Go scheduler, and on
// Soft-RoCE and soft-iWARP ibv_post_send is one (the provider rings the
// doorbell with a write(2), and the kernel moves the data before it
// returns). When no other P is idle, the runtime's monitor thread takes
// the P of a call that has lasted 20 µs and starts another thread to
// look for work; the call then returns to an extra wakeup and a lock.
// Pinned to one CPU (taskset -c N, as perftest is usually run) GOMAXPROCS
// defaults to 1 and that happens to every long post: in the QEMU guest it
// cost rdmakit perf a quarter of its write_bw on rxe. With one more P,
// idle, the monitor leaves a call alone for 10 ms. The idle P costs
// nothing: the run's goroutine is the only one that runs.
const minProcsCgo = 2

// tuneProcs raises GOMAXPROCS to minProcsCgo for devices of the ibverbs
// transport; it never lowers it.
func tuneProcs(dev verbs.DeviceInfo) {
	if dev.Transport == "ibverbs" && runtime.GOMAXPROCS(0) < minProcsCgo {
		runtime.GOMAXPROCS(minProcsCgo)
	}
}
