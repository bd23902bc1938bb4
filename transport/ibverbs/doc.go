// Package ibverbs is rdmakit's transport over the Linux RDMA stack:
// libibverbs and librdmacm through cgo, so any verbs device works —
// InfiniBand and RoCE HCAs, iWARP RNICs, and the kernel's software devices
// Soft-RoCE (rdma_rxe) and soft-iWARP (siw).
//
// It is built only with the build tag ibverbs (and cgo, and rdma-core's
// development files: apt-get install libibverbs-dev librdmacm-dev):
//
//	go build -tags ibverbs ./...
//
// Without the tag the package is empty and registers nothing, so the
// default build stays pure Go. With it, importing the package registers
// transport "ibverbs", whose devices are every device ibv_get_device_list
// returns:
//
//	import _ "github.com/rdmakit/rdmakit/transport/ibverbs"
//
// The device implements the verbs objects itself (verbs.NativeContext):
// protection domains, memory regions (ibv_reg_mr on the memory verbs
// passes: AllocMR memory from the context arena, or caller memory with
// RegMR), completion queues with a completion channel for blocking Wait,
// RC queue pairs, shared receive queues. A C shim (shim.c) calls each verb
// the way rdma-core's headers do, avoiding the compat symbols
// (ibv_query_port's exported symbol fills an old, shorter struct).
//
// Performance: PostSend writes the whole batch into C memory preallocated
// per queue pair and posts it as one linked ibv_send_wr chain: one cgo call
// per PostSend however many work requests it carries. Poll is one cgo call
// (ibv_poll_cq of up to 256 completions into a preallocated array).
// Neither allocates. BenchmarkCgoCall measures the fixed cost of the cgo
// crossing. On rxe and siw ibv_post_send is a system call in which the
// kernel moves the data, and the Go scheduler treats a cgo call as one: a
// program with GOMAXPROCS 1 (pinned to one CPU) has the P of every post
// that lasts 20 µs taken and handed to a new thread. Keep GOMAXPROCS at 2
// or more (one P idle) where posts are long; rdmakit perf does. Posting
// many work requests in one PostSend pays the crossing and the doorbell
// once (rdmakit perf's bandwidth loop posts all the room the send queue
// has). On rxe, the lkey check of the stall watch below looks the region
// up in a copy-on-write table and keeps the QP's last hit.
//
// Addresses: QP.Address returns an encoded Address (GID, port, MTU, QP
// number, and for iWARP the rdma_cm listener's IP and port). The peer puts
// it in AddressHandle.Dest; AddressHandle.GID may instead carry the peer's
// GID or IP. For RoCE v2 the source GID index is chosen to match the
// destination: an IPv4-mapped GID for an IPv4 peer (RDMAKIT_IBV_GID_INDEX
// overrides).
//
// iWARP (siw, Chelsio, ...) has no out-of-band connection setup; RTR and RTS
// drive an rdma_cm connection instead, with the same QP (see cm.go for how
// this maps onto rdmakit's model). iWARP also has no atomics on siw
// (AtomicCap NONE: atomics return verbs.ErrNotSupported), no immediate data
// and RDMA Read into one SGE only, which this transport reports as
// ErrNotSupported at post time.
//
// Driver defects: Linux 6.1's siw and rxe have defects a user of this
// transport would hit; the transport recognises the driver (vendor id) and
// works around them where that costs a correct program nothing, else
// leaves the capability out (quirks.go; docs/architecture.md has the
// table):
//
//   - every device: zero-length SGEs are dropped before posting (siw 6.1
//     panics on a Write whose first SGE is empty and whose next is not);
//   - siw: a Read of up to 64 bytes whose remote range crosses a 4 KiB
//     boundary is posted as two Reads (siw 6.1 returns wrong bytes for one
//     of up to 32 bytes), completing once for the caller;
//   - siw: a zero-length Read is refused (ErrNotSupported; no
//     CapZeroLengthRead): siw 6.1 can answer one queued behind another
//     transmission with stale bytes and end the connection;
//   - rxe: a work request whose lkey or range will fail locally is
//     watched; if its QP completes nothing for 2 s (rxe 6.1 stalls when it
//     follows a Send waiting out an RNR NAK) the QP is moved to ERROR and
//     the work request completes with LocalProtection;
//   - rxe: a receive posted to a QP known to be in ERROR completes with
//     WRFlush at once (rxe 6.1 flushes it only at the next state change).
//
// GPU memory: RegDmabufMR registers a dma-buf (a CUDA allocation exported
// with cuMemGetHandleForAddressRange) for GPUDirect RDMA. It is UNTESTED:
// it compiles and is documented, but has never run, for want of a GPU and
// an RDMA NIC with dma-buf support (rxe and siw have none).
//
// Errors say what to do: no device (create one with `rdma link add`),
// memory that cannot be pinned (raise `ulimit -l`), rdma_cm addresses that
// do not resolve.
//
// Tests run on real rxe and siw devices in a QEMU guest: test/vm/ci.sh.
package ibverbs
