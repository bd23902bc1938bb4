// Package coll provides NCCL-style collective communication over rdmakit's
// verbs: a communicator of N ranks (processes, or goroutines) and
// AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll,
// Send/Recv and Barrier on int8 … float64, float16 and bfloat16 with sum,
// prod, min, max and avg.
//
// # Forming a communicator
//
// As with ncclGetUniqueId / ncclCommInitRank: one process calls
// GetUniqueID, which starts a rendezvous root and returns an id naming it;
// the id is handed to every rank (UniqueID.String / ParseUniqueID), and
// each rank calls NewComm(ctx, id, nranks, rank, opts).
//
// Under a launcher, InitFromEnv reads the rank and size from the
// environment (see DetectLaunch): torchrun-style launchers (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK plus RDMAKIT_COLL_ADDR=host:port of
// rank 0, passed with mpirun -x), MPICH/Hydra (PMI_RANK/PMI_SIZE), Slurm's
// srun (SLURM_PROCID, SLURM_NTASKS; rendezvous on the step's first node)
// and Kubernetes indexed Jobs (JOB_COMPLETION_INDEX with WORLD_SIZE).
// Rank 0 serves the rendezvous on the address's port.
//
// Bootstrap runs over TCP: every rank connects to the root, which hands
// out the table of ranks, relays the connection data of each pair of
// ranks, and stays connected to all of them for the communicator's life.
// If ranks are missing, every rank that did join fails with ErrBootstrap
// naming them, within the bootstrap timeout.
//
// # Transports and topology
//
// Ranks exchange their host identity (kernel boot id and PID namespace)
// at bootstrap, then what devices they have, and choose devices by what
// the devices declare (verbs.DeviceInfo.Caps) and where the ranks are,
// never by name (devices.go):
//
//   - ranks of one host talk over the same-host device (CapSameHost:
//     shm0, transport/shm: one-sided writes are copies into the peer's
//     mapped memory);
//   - ranks of different hosts over the best network device both have
//     (CapNetwork, an active port, the same fabric): an RDMA device
//     (transport "ibverbs": RoCE or InfiniBand HCAs, iWARP RNICs, rxe,
//     siw; linked when the program is built with -tags ibverbs), else
//     tcp0 (transport/tcp), with the peer's IP address as the bootstrap
//     saw it.
//
// RDMAKIT_COLL_TRANSPORT=shm|tcp|roce|ibverbs (or Options.Transport)
// forces one transport between every pair, ranks of one host included:
// ibverbs then runs collectives over the RDMA device even within a host.
// roce (software RoCEv2, transport/roce) is never preferred to tcp by
// auto; forced, ranks of one host in separate processes need their own
// address or port (RDMAKIT_ROCE_ADDR=:0).
// RDMAKIT_COLL_HCA (or NCCL_IB_HCA, in its syntax: "mlx5_0", "mlx5_0:1",
// "=mlx5_0", "^mlx5_1", comma lists) picks RDMA devices and ports; the
// first usable one in the device list is used. RDMAKIT_COLL_GID_INDEX (or
// NCCL_IB_GID_INDEX) sets the RoCE GID index; by default transport/ibverbs
// picks an IPv4-mapped RoCE v2 GID. Comm.DeviceUses says what was chosen.
//
// RDMA queue pairs are connected from the peer's QP address (GID, QP
// number, PSN; on iWARP the rdma_cm listener, which transport/ibverbs
// connects through rdma_cm behind RTR/RTS) relayed by the root, with the
// smaller of both ports' active MTUs, an ACK timeout of 4.096 µs × 2^18
// (about 1 s) and 7 retries, as NCCL's defaults. coll uses RDMA Write only (no immediate data, atomics or
// Reads), so iWARP devices run every collective. Memory peers write into
// is registered with LOCAL_WRITE|REMOTE_WRITE.
//
// # How data moves
//
// Each pair of ranks is connected by Channels reliable-connected QPs. A
// rank sends a message by an RDMA write of the data into a slot of the
// receiver's FIFO followed by an 8-byte write of a flag word; the receiver
// busy-polls the flag, uses the data in place, and returns credits by
// writing into the sender's memory (see proto.go); on devices that are
// not write-on-post (tcp, RDMA NICs) the credits ride with its next
// message to that peer, in the same post, or go when it next waits,
// whichever comes first. So, as with NCCL, a collective or Send may wait
// until the peers have made their matching calls: a program must not
// block one rank elsewhere (another communicator, its own barrier) while
// counting on a peer's call on this communicator to finish. Large messages are cut
// into chunks, pipelined through the FIFOs and striped over the channels.
// The flag carries a signature of the call (collective, count, type,
// operator, root, algorithm, sequence number), so ranks that call
// different collectives fail with ErrMismatch instead of exchanging
// garbage.
//
// AllReduce uses a ring (reduce-scatter then all-gather, bandwidth-
// optimal), recursive doubling (log₂ N steps, for small messages), a
// direct exchange (one step: every rank sends its vector to every other
// and folds them in rank order; small messages among three or more
// ranks) or halving (Rabenseifner's: a reduce-scatter by recursive
// halving, then an all-gather by recursive doubling, the ring's bytes in
// 2 log₂ N steps); AllGather and ReduceScatter the ring, the direct
// exchange or, for a power-of-two N, recursive doubling (AllGather) and
// halving (ReduceScatter); Broadcast and Reduce a pipelined chain or a
// binomial tree; AllToAll pairwise exchange. The choice follows a small
// tuning table by collective, rank count and size (tune.go;
// Options.TreeThreshold moves the tree/ring cross-over; over tcp from 4
// ranks, a power of two, halving replaces the ring up to 16 MiB/N, for
// AllReduce up to 2 MiB)
// unless RDMAKIT_COLL_ALGO=ring|tree|direct|halving (else NCCL_ALGO) or
// Options.Algorithm forces it.
//
// Writes to a device with CapWriteOnPost (shm) are done when posted, so
// small messages travel in the LL format (data and flags in one write;
// RDMAKIT_COLL_PROTO=Simple or NCCL_PROTO=Simple turns it off) and the
// others are one PostSend too (the data, then its flag word); on other
// devices the flag write follows the data on the same QP and completions
// are reaped to free the send queue. Writes up to the QP's inline limit
// are posted inline.
//
// On shm each channel has, beside its chunk slots, two deep rings of small
// slots with credits of their own: 64 LL slots (messages of up to 128
// bytes) and 32 slots of 4 KiB (larger messages smaller than a chunk).
// Small collectives called back to back then return credits every 32 or
// 16 messages instead of every Slots/2, as one word (the count of
// messages consumed) that the sender reads once per batch, and never wait
// for one, for about 150 KiB per channel (RDMAKIT_COLL_SLOTS sizes the
// chunk slots only). A 2-rank 8-byte AllReduce then moves one cache line
// each way per call (the LL message) and 1/32 of one for credits.
//
// Collectives run in the calling goroutine and allocate nothing per call
// once warm. They wait for shm and RDMA peers by spinning (yielding the
// CPU as waits grow, at every poll when ranks outnumber cores) and
// for tcp peers by polling the channel's completion queue: a poll of an
// empty one reads the channel's socket on the waiting goroutine (tcp0's
// progress from polls) and yields the CPU when nothing came, so that no
// message wakes a reader goroutine.
//
// # Buffers
//
// Buffers are byte slices holding a whole number of elements. Memory from
// Comm.Alloc is registered with every transport and used in place; any
// other memory is staged through registered bounce buffers (one copy in,
// one copy out). Slice and Bytes convert between []byte and typed slices;
// F16 and BF16 hold half-precision values. In place is supported as in
// NCCL: the same buffer for AllReduce, Broadcast, Reduce and AllToAll; for
// AllGather send is recv's block Rank(), for ReduceScatter recv is send's
// block Rank().
//
// # Errors
//
// A collective that cannot complete returns an error wrapping one of the
// sentinel errors: ErrTimeout (a peer made no progress within
// Options.Timeout or the context's deadline), ErrPeerLost (a peer process
// died, or closed the communicator), ErrMismatch, ErrAborted (another rank
// failed, or Abort was called; wrapping the cause when known). After such
// an error the communicator is finished everywhere: the failing rank tells
// the others through the root, so they fail at once instead of waiting for
// their timeout. Invalid arguments (ErrInvalidArgument) leave it usable.
//
// # Environment
//
//	RDMAKIT_COLL_ID              unique id of a root already running (launchers)
//	RDMAKIT_COLL_RANK, _NRANKS   rank and size, winning over other launchers' variables
//	RDMAKIT_COLL_ADDR, _PORT     rendezvous address (rank 0 listens there)
//	RDMAKIT_COLL_TIMEOUT         stall timeout of a collective (default 5m)
//	RDMAKIT_COLL_BOOTSTRAP_TIMEOUT  forming the communicator, and Close (default 2m)
//	RDMAKIT_COLL_ALGO            ring | tree | direct | halving | auto (NCCL_ALGO is read too)
//	RDMAKIT_COLL_PROTO           LL | Simple | auto (NCCL_PROTO is read too)
//	RDMAKIT_COLL_TREE_THRESHOLD  bytes below which auto picks tree (default 64K)
//	RDMAKIT_COLL_TRANSPORT       shm | tcp | roce | ibverbs | auto
//	RDMAKIT_COLL_HCA             RDMA devices[:port] (NCCL_IB_HCA syntax; NCCL_IB_HCA is read too)
//	RDMAKIT_COLL_GID_INDEX       RoCE GID index | auto (NCCL_IB_GID_INDEX is read too)
//	RDMAKIT_COLL_CHANNELS        QPs per peer (default 2, 1 with tcp; else NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD)
//	RDMAKIT_COLL_CHUNK           pipeline chunk bytes (default 256K)
//	RDMAKIT_COLL_SLOTS           FIFO depth in chunks (default 8; shm's small-message rings are apart)
//	RDMAKIT_COLL_SPIN            how long a wait spins before yielding (default 10µs; 0 oversubscribed)
//	RDMAKIT_COLL_BIND            core: pin the k-th rank of a host to the k-th CPU (GOMAXPROCS 1) | none (default)
//
// # Goroutines
//
// Collectives run in the caller's goroutine, one at a time per
// communicator. Each communicator has a watcher goroutine on its bootstrap
// connection; the process serving the rendezvous runs the root's
// goroutines (one per rank); the transports run their own (ibverbs: a
// completion-event and an async-event goroutine per device context, and
// an rdma_cm one on iWARP).
package coll
