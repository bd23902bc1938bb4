// Package verbs is rdmakit's RDMA API: the Verbs programming model of
// InfiniBand, RoCE and iWARP, in Go, over whichever transports are linked
// into the program.
//
// The objects and their order of creation follow libibverbs:
//
//	Devices / Open            a device of some transport → *Context
//	Context.AllocPD           protection domain
//	PD.AllocMR / PD.RegMR     memory region with lkey, rkey and access flags
//	Context.CreateCQ          completion queue (Poll, or Wait with a context)
//	PD.CreateSRQ              shared receive queue
//	PD.CreateQP               reliable-connected queue pair
//	QP.Modify                 RESET → INIT → RTR → RTS (→ ERROR)
//	QP.PostSend / PostRecv    batches of work requests
//
// Transports register themselves with Register, like database/sql drivers:
// import _ "github.com/rdmakit/rdmakit/transport/shm" (or tcp) to link one.
// Most programs do not drive QPs by hand: package cm connects them.
//
// Semantics are those of an RC queue pair on real hardware and are pinned by
// one conformance suite (internal/conformance) run on every transport: RC
// ordering, immediate data consuming a receive, RNR retry, access and
// bounds violations that complete with RemoteAccess at the requester, move
// the QP to ERROR, leave the target untouched and flush later work requests
// with WRFlush, atomics on aligned 8-byte words.
//
// Memory: AllocMR returns off-heap memory from the context's arena (a sparse
// memfd mapping) that every transport can serve, including peers in other
// processes on the same host. RegMR registers caller memory where the
// transport can reach it (tcp can; shm cannot, and says so).
//
// Keys: lkeys and rkeys are drawn from crypto/rand (32 bits), are unique
// among live regions of a context, and stop resolving the moment DeregMR
// returns. An operation that had already resolved its key finishes.
//
// Concurrency: all methods are safe for concurrent use. Post and Poll
// allocate nothing.
package verbs
