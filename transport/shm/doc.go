// Package shm is rdmakit's shared-memory transport: RDMA between queue pairs
// on the same host, in one process or across processes.
//
// Every verbs context allocates its memory regions, queues and control
// blocks from one arena, a sparse memfd mapping. At RTR a queue pair maps
// its peer's whole arena once (through /proc/PID/fd, so the peer takes no
// part) and from then on executes its work requests itself, in the posting
// goroutine:
//
//   - RDMA Write and Read are one copy between the two mappings;
//   - atomics are CPU atomics on the shared word;
//   - Send copies straight into the receive buffer the peer posted (its
//     receive queue is a lock-free ring in its arena) and pushes the receive
//     completion into the peer's completion queue ring, waking a waiter by
//     futex.
//
// The target's CPU takes no part in any of this. The peer's rkeys, access
// flags and bounds are checked against its key table, which it publishes in
// the same arena, before every access (internal/rc).
//
// Import it for its side effect of registering device "shm0":
//
//	import _ "github.com/rdmakit/rdmakit/transport/shm"
//
// Limits: peers must be on the same host, run as the same user and see each
// other's /proc (same PID namespace); RegMR of caller memory is not
// supported (use PD.AllocMR), because peers map only the arena.
//
// Operating systems: Linux only. Elsewhere (darwin, Windows, ...) the
// package still builds and registers, and device "shm0" is still listed by
// verbs.Devices, so that a program sees the same device list everywhere;
// but opening it fails with an error wrapping verbs.ErrNotSupported that
// names the system (on Windows the arena fails first, with the same
// sentinel). Programs that pick a device should skip one whose Open
// returns verbs.ErrNotSupported.
package shm
