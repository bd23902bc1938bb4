// Package rcproto is the InfiniBand reliable-connected (RC) protocol as
// two I/O-free state machines, in the style of etcd raft's RawNode: a
// Requester (the send side of a queue pair) and a Responder (its receive
// side). They own no sockets, timers, clocks or goroutines and touch no
// memory; the owner (a transport) feeds them inputs and carries out what
// they return:
//
//   - Requester inputs: Post (a new work request), Step (a response
//     packet), Tick (the time, at the deadline it was given), Connected,
//     Activity, PeerLost, Placed (READ data in place), Fail. Each returns
//     actions, in order: complete work request N with a status (and an
//     atomic's prior value), place READ data, (re)arm or disarm the one
//     timer, move the QP to ERROR and flush. Packets to transmit are
//     pulled with Next (Peek looks without taking) whenever the owner has
//     room, and Flushed tells when they left, which starts the ACK
//     timeout.
//   - Responder inputs: Step (a request packet) answers with a verdict,
//     Drop or Execute; an executed request is reported with Done
//     (success, RNR, or a remote error). Responses are pulled with
//     NextResponse.
//
// The action slice returned by a call is reused by the next call on the
// same engine: nothing allocates on the steady path.
//
// Requester: 24-bit PSNs (PSN, wrap-safe comparison); work requests of any
// length, segmented into FIRST/MIDDLE/LAST packets at Config.MTU (0: one
// packet per message, for a stream transport); an optional window of
// outstanding packets (AckReq on the packet that fills it); coalesced
// ACKs (one ACK completes every work request up to its PSN), and the
// implicit acknowledgement by a later NAK, READ or atomic response; a
// response missing before a later one (an ACK beyond a READ, a READ
// response beyond the one expected) is an implied NAK, acted on once per
// PSN until a timeout or a NAK goes back again; NAK sequence error
// and the ACK timeout (4.096 µs × 2^timeout) go back N to the PSN named
// (or the oldest unacknowledged), retry_cnt times; RNR NAK waits the
// responder's min_rnr_timer (RNRDuration, the IBTA table) and retries
// that request alone, up to rnr_retry times per request (7: forever;
// rnrRetryAllowed is the only place of that policy); max_rd_atomic bounds
// READs and atomics outstanding; a fatal NAK (remote access, invalid
// request, remote operation) completes with the matching status; on
// exhaustion the request completes with RetryExceeded or
// RNRRetryExceeded; every failure moves the QP to ERROR (ActError) and
// the owner flushes the rest with WRFlush. Work requests that failed
// local validation complete with their status, in order, unsent.
//
// Responder: executes requests in PSN order; a duplicate WRITE or SEND is
// acknowledged again, a duplicate READ is executed again (from the offset
// it names) when its PSN falls inside one of the last 256 READs and it
// asks for no more than that READ had left (others are dropped), a
// duplicate atomic is answered with its saved result (never executed
// twice); repeated READs and atomics are dropped while the READ and
// atomic responses queued, repeats included, reach max_dest_rd_atomic
// (255 when 0), so repeats cannot grow the queue; a PSN ahead of the one expected is NAKed (sequence
// error) once until the expected one comes; no receive posted gives an
// RNR NAK, and requests are dropped until the NAKed one comes again;
// remote access and invalid request errors are NAKed and move the
// responder to ERROR (everything after is dropped); max_dest_rd_atomic
// bounds the READs and atomics whose responses are not handed out yet,
// and one beyond is NAKed as an invalid request. Responses carry the
// message sequence number (MSN) of the AETH. ACKs coalesce in the
// response queue: NextResponse can keep back a trailing ACK until the
// owner is about to wait.
//
// Memory checks and execution stay with the owner: rc.Target resolves
// keys, access rights and bounds, and the engine only learns the outcome.
//
// Config.Reliable adapts the requester to a reliable ordered stream (TCP):
// nothing is retransmitted (the ACK timeout only bounds a stalled peer,
// with Activity telling of progress other than responses), a sequence
// error means the two sides disagree on the initial PSN, and a response
// that makes no sense fails with BadResponse instead of being ignored.
// RNR waits, timeouts, retry counting, completions and the loss of the
// peer are the same code for streams and datagrams.
//
// Tests: testdata/*.txt are scripts run by script_test.go against a
// simulated lossy, duplicating and reordering network (sim_test.go);
// FuzzEngines drives random event sequences through it, with a seed
// corpus in testdata/fuzz.
//
// Goroutines: none. Each engine is used by one goroutine at a time; the
// owner provides the locking (see Requester and Responder).
package rcproto
