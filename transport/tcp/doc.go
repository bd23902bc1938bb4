// Package tcp is rdmakit's TCP transport: reliable-connected queue pairs
// whose operations travel over one TCP connection per QP, so that two
// processes on different hosts (or network namespaces) can use the verbs
// API with nothing but IP between them. Import it for its side effect:
//
//	import _ "github.com/rdmakit/rdmakit/transport/tcp"
//
// It registers transport "tcp" with one device, "tcp0". Each opened
// Context listens on RDMAKIT_TCP_ADDR (default ":0": every interface, an
// ephemeral port); ListenAddr tells where. Memory registered with RegMR is
// served as well as AllocMR memory: the responder runs in this process.
//
// # Connecting
//
// QP.Address is 32 bytes: version, listen port, QP number, a random nonce
// and the listen IP (zero when listening on every interface; the peer then
// dials AddressHandle.GID, which package cm fills from its handshake
// connection, or 127.0.0.1 when that is empty too). On the transition to
// RTR the side with the smaller nonce dials the other's listener and sends
// a hello naming both QPs and nonces; the accepting context routes the
// connection to the QP it names if that QP is in RTR/RTS and expects
// exactly that peer (a QP not yet in RTR is waited for, a few seconds), and
// answers with a hello of its own. Modify never waits for the peer: work
// requests posted before the connection is up wait in the send queue and
// go out when it is. If they wait longer than timeout×(retry_cnt+1) (at
// least a second; five when Timeout is 0) they fail with
// StatusRetryExceeded. A QP cannot be connected to itself.
//
// # Protocol
//
// The protocol is internal/rcproto's RC engine (a requester and a
// responder state machine) in its reliable-stream setting: one packet per
// message, nothing retransmitted but after an RNR NAK. This package only
// frames its packets, moves the data and runs its timer.
//
// Frames are a 48-byte header (see header.go) and, for WRITE, WRITE_IMM,
// SEND, SEND_IMM and READ_RESP, a payload. Requests carry 24-bit PSNs
// starting at the requester's SQPSN, which must equal the responder's
// RQPSN. Responses come in PSN order: ACK acknowledges every request up to
// its PSN (the responder coalesces them), NAK fails one (RNR, access,
// invalid request, remote operation) and implicitly acknowledges those
// before, READ_RESP and ATOMIC_RESP carry data and implicitly acknowledge
// those before too. A malformed frame closes
// the connection and fails the QP (BadResponse for the oldest work
// request, if any).
//
// Semantics are those of the conformance suite: the responder checks keys,
// protection domains, access flags and bounds through internal/rc and
// refuses with a NAK that completes the requester's work request with
// RemoteAccess and moves its QP to ERROR; target memory is untouched.
// Sends without a posted receive get an RNR NAK; the requester waits the
// responder's min_rnr_timer and retransmits from that request (go-back-N;
// the responder drops everything else meanwhile), first that request alone
// and the rest once it completes, up to rnr_retry times (7: forever). A
// receive too small (or with a bad SGE) completes with LocalLength (or
// LocalProtection), moves the receiving QP to ERROR, and the requester
// gets RemoteInvalidReq (or RemoteOperation). Atomics are CPU atomics on
// the target word. The end of the connection (the peer QP destroyed, its
// process gone, a reset) fails the oldest outstanding work request with
// RetryExceeded, as does a silent peer after timeout×(retry_cnt+1) without
// progress (never when Timeout is 0). A QP that leaves RTR/RTS closes its
// connection; a request that reaches a QP no longer in RTR/RTS is dropped,
// and its requester sees the connection end. MaxRdAtomic bounds the
// READs and atomics the requester has outstanding, MaxDestRdAtomic those
// the responder serves at once (0 means 16 for both): a READ or atomic
// beyond it, counting responses still queued for a peer that does not
// read them, is NAKed as an invalid request. Responses queued for the
// peer are bounded too (maxQueuedResp, ACKs coalesced): when the peer
// does not read them, the reader stops reading its requests, and a peer
// that still has not read after timeout×(retry_cnt+1) (at least a
// second) is disconnected: outstanding work requests fail with
// RetryExceeded. PathMTU is accepted and ignored (a stream has no MTU).
// Accepted connections whose hello is not routed yet are bounded
// (maxHandshakes); beyond that a new one is closed at once.
//
// Memory is moved under the keys' in-use counts (keytab.Pin), a chunk at a
// time (rc.ChunkSize: one non-blocking read, one writev, one copy), so that
// once Dereg returns no operation touches the region: a WRITE or SEND
// payload is read from the socket straight into target memory only
// through non-blocking reads, each under the key, and the rest of a
// payload whose region went away is discarded (RemoteAccess; a receive
// buffer: the receive completes with LocalProtection, the SEND with
// RemoteOperation); READ_RESP data is written under the key, replaced by
// zeros once it is gone, and its status trailer then says RemoteAccess.
// The requester's own buffers likewise (LocalProtection).
//
// Copies: a payload is copied once on each side, by the kernel. The
// sender's writev gathers headers and the application's (or, for
// READ_RESP, the target's) memory; the receiver reads payloads straight
// into the destination (payload.go) whoever reads them, the reader or a
// poller, across as many reads and polls as it takes (a poller that finds
// part of a payload moves that part and leaves the rest, in l.pl, to the
// next poll or the reader; a Dereg in between makes the rest be
// discarded). Only headers, small payloads (under 8 KiB) and the few
// bytes a read takes beyond a header go through the link's buffer: after
// a payload of 32 KiB or more, reads into the buffer take at most 1 KiB
// for the next few frames, so that the next large payload is not read
// into the buffer along with its header. The read that takes the last
// bytes of a payload straight into place takes what follows it too (one
// readv into place and into the buffer: a trailer, the next header, the
// small frames behind it), and when it did not fill both, the next look
// at the socket is left for later (the socket had no more). In the
// middle of a payload the
// reader waits with SO_RCVLOWAT set to the rest of the chunk it reads,
// so that it wakes once for the chunk rather than for every part of it.
//
// # Goroutines and performance
//
// Per context: one accept goroutine, and a short-lived one per incoming
// connection until its hello is routed. Per connected QP: the link
// goroutine, which connects and then reads (it is the responder, and
// completes send work requests), and an idle writer goroutine that takes
// over when the socket is full. One timer (time.AfterFunc) calls the
// requester engine at the deadline it asks for: the RNR wait, the ACK
// timeout (which here only bounds a stalled peer: bytes moved count as
// progress), the connect timeout.
//
// PostSend writes new requests from the caller's goroutine with one
// non-blocking writev of headers and the application's buffers (no copy),
// unless several requests are already in flight: then the reader sends
// them after the next response, many per writev. The reader reads large
// payloads straight into their destination, and writes the responses it
// owes when it would otherwise wait for input (or after 32 frames or 4 MiB
// of a busy stream), so ACKs coalesce under load and go out at once
// otherwise. Nothing allocates per operation in the steady state, and no
// goroutine is woken per operation besides the reader. TCP_NODELAY is set.
//
// Progress from polls (poll.go). With busy polling on (Options.TCPBusyPoll,
// RDMAKIT_TCP_BUSY_POLL; on by default), an application goroutine that
// polls an empty CQ (CQ.Poll, or CQ.Wait before it sleeps) does the
// reader's work itself: it reads what has arrived on the sockets of the
// QPs completing into that CQ (non-blocking), handles every whole frame,
// produces the completions, and writes what that owes; the completion is
// in the same Poll's result. Meanwhile the reader sleeps and the socket's
// SO_RCVLOWAT is raised, so that arriving data wakes no thread of the
// process: one busy thread per process does all the work. The context's
// lease keeper wakes the reader when the application has stopped polling
// the link: 200-400 µs after its last poll when it polls no CQ of the
// context either, up to 6.4 ms while it polls others (a process with many
// links polls each now and then only); it wakes at once when the
// application sleeps in CQ.Wait. The read side has one owner at a time (a
// mutex the reader gives up only between frames, and pollers take with
// TryLock); a poller hands over to the reader what it must not do (the
// output stall, the end of the link); a payload it has only part of it
// leaves for the next poll (or the reader, when nobody polls). An ACK a poller owes waits for the application's next post,
// which carries it in its writev, or for the next poll or the reader's
// next look, whichever is first. A poll that reads nothing yields the CPU
// (sched_yield), as the reader's busy poll does: on a host with more busy
// threads than cores
// the thread it waits for may need it. With busy polls from 1 µs to 20 µs
// (the transfer engine's) it yields to the process's other goroutines
// first (runtime.Gosched), and the thread only when none ran (goYield,
// yieldGo): there what a poll waits for is most often a goroutine of its
// own process (a store node and its clients in one process, the
// engine's waiters).
//
// When nobody polls, the reader busy-polls its socket for up to
// TCPBusyPoll (SO_RCVLOWAT raised too) and then parks in Go's network
// poller; for 20 µs instead where TCPBusyPoll is shorter, but at least
// 1 µs (the transfer engine's 1 µs; not coll's 1 ns), and the link has not been polled for 6.4 ms (the passive
// side of one-sided transfers, whose next request from several clients
// comes within microseconds; that spin yields as the engine's polls do).
// With busy polling off (TCPBusyPoll 0: no poller ever runs) the
// reader keeps the read side while it waits and reads in the wait itself
// (one RawConn Read whose callback reads into its buffer): a message
// arriving at an idle link costs a read that finds nothing, a park and
// the read that gets it; the first read that only decides whether owed
// ACKs go now is skipped when nothing is owed. An application that waits for completions by spinning on
// memory alone (never polling a CQ) gets the reader's service; one that
// polls and then turns to memory may wait up to about 3.2 ms for the next
// message (a process off the CPU must not look like one that stopped
// polling; what it owes its peer goes within two 200 µs looks), and one
// that keeps polling a CQ other than the link's up to 6.4 ms.
// The nonces in the addresses double as a weak credential: a connection is
// only routed to a QP by a hello that names both QP numbers and both
// nonces. The transport does not encrypt or authenticate beyond that.
package tcp
