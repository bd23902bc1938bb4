//go:build ibverbs

package ibverbs

import (
	"fmt"

	"github.com/rdmakit/rdmakit/verbs"
)

// SetGIDIndex makes a RoCE or InfiniBand queue pair send from the GID at
// index of its port (what NCCL_IB_GID_INDEX and perftest's -x choose):
// from then on the QP's Address advertises that GID and Modify(RTR) uses
// index as the source GID index, whatever the destination and
// RDMAKIT_IBV_GID_INDEX say. Call it after Modify(INIT), which fixes the
// port, and before handing Address to the peer. On iWARP queue pairs,
// which rdma_cm connects by IP address, it does nothing. It runs in the
// caller's goroutine; the QP must not be used concurrently.
func SetGIDIndex(vqp *verbs.QP, index int) error {
	q, ok := vqp.Driver().(*qp)
	if !ok {
		return fmt.Errorf("%w: SetGIDIndex of a queue pair of another transport", verbs.ErrInvalidArgument)
	}
	if q.iw != nil {
		return nil
	}
	table := q.d.portGIDs(int(q.port), true)
	for _, e := range table {
		if e.index == index {
			q.gidIndex = index + 1
			q.self.GID = e.gid
			q.addr = q.self.Encode()
			return nil
		}
	}
	return fmt.Errorf("%w: port %d of %s has no GID at index %d (%d GIDs; `rdmakit info -v -d %s` lists them)",
		verbs.ErrInvalidArgument, q.port, q.d.info.Name, index, len(table), q.d.info.Name)
}
