// Package sys is rdmakit's one gateway to raw system calls and unsafe memory
// access. Every other package reaches the kernel or unsafe.Pointer through
// here, so the audit surface for memory safety is the files named
// *_unsafe.go in this directory. Two exceptions, also named *_unsafe.go:
// transport/ibverbs/cgo_unsafe.go, the cgo transport's gateway to C, and
// coll/internal/reduce/cast_unsafe.go, which views byte buffers as typed
// element slices for the reduction kernels.
//
// What lives here:
//
//   - memory: Memfd, MapShared, MapAnon, Unmap, PunchHole, ReplaceWithAnon,
//     PageSize, Addr;
//   - atomics on words inside byte slices (which may be shared with other
//     processes through a MAP_SHARED mapping): Load32, Store32, Add32,
//     CAS32, Load64, Store64, Add64, CAS64, CompareSwap64, FetchAdd64, and
//     StoreRelease64 (release order only: a plain store on amd64);
//   - the CPU (cpu_amd64.s, cpu_amd64_unsafe.go; cpu_other.go elsewhere and
//     in race builds): Copy (REP MOVSB for large in-cache copies), Ticks and
//     HasTicks (the invariant time-stamp counter);
//   - futexes and scheduling: FutexWait, FutexWake, Yield, RawYield;
//   - UDP (Linux; not supported elsewhere): UDPBatch (SendBatch,
//     RecvBatch: sendmmsg/recvmmsg with GSO and GRO; SendBatchRaw and
//     RecvBatchRaw, the same past the scheduler for non-blocking sockets),
//     SetUDPOptions, and a socket outside Go's network poller with its own
//     waits: ListenUDPFD, WaitFD, SendToFD, NewEvent, Signal, Drain;
//   - descriptors: Read, Read2 (one readv into two buffers), Writev (with
//     IOVecs, MaxIOV, ErrAgain): on Linux, for non-blocking descriptors
//     only (the tcp transport's sockets), raw system calls unless a
//     buffer lies in caller memory that a region registers
//     (NoteCallerMemory, IsCallerMemory: it may be a file mapping; see
//     rawmem.go); Close, Inode, DupNonblock, IsTerminal;
//   - peers and children: OpenPeerFd, PidfdOpen, ProcessExited,
//     ChildDiesWithParent, StartInNewProcessGroup, KillProcessGroup;
//   - limits and accounting: MemlockLimit (Unlimited), ProcessCPUTime;
//   - race-detector annotations of hand-offs through shared words:
//     RaceRelease, RaceAcquire (race_unsafe.go; empty without -race).
//
// Operating systems. The package builds everywhere rdmakit does, and every
// function exists on every system; the files are split by build tags:
//
//   - *_linux*.go (//go:build linux): the real thing, all of the above.
//   - *_otherunix*.go, term_bsd.go, writev_fallback.go, proc_unix.go,
//     read_unix.go (darwin and the BSDs): mappings (MapShared, MapAnon,
//     ReplaceWithAnon), descriptors, process groups and rlimits work;
//     Memfd, PunchHole, OpenPeerFd and PidfdOpen do not exist there;
//     ChildDiesWithParent does nothing (no PR_SET_PDEATHSIG).
//   - sys_windows.go: atomics, IsTerminal and ProcessCPUTime work; mappings,
//     descriptor I/O, process groups and MemlockLimit do not.
//   - futex_other.go (all but Linux): FutexWait naps briefly instead of
//     waiting on a futex, FutexWake does nothing; Yield is runtime.Gosched.
//
// A function with no equivalent on the running system returns an error
// wrapping ErrNotSupported (which also matches errors.ErrUnsupported) whose
// message names the call and the system, e.g. "sys: memfd_create is not
// supported on darwin". Callers that can do without translate it
// (internal/arena falls back from Memfd to MapAnon; internal/soft turns a
// missing arena into verbs.ErrNotSupported).
package sys
