// Package cm connects rdmakit queue pairs the way sockets connect: a
// Listener accepts, Dial connects, and each side gets a *Conn whose QP is
// in RTS, in the spirit of RDMA CM (librdmacm).
//
//	l, err := cm.Listen(ctx, ":7471", cm.ListenOptions{})   // device tcp0
//	c, err := l.Accept(ctx)
//
//	c, err := cm.Dial(ctx, "server:7471", cm.Options{PrivateData: hello})
//	c.QP().PostSend(...)
//	<-c.Done()                  // peer lost or closed; c.Err() says which
//	c.Close()
//
// The transport is chosen by device name (Options.Device, default "tcp0"),
// or by passing a verbs.PD to build the QP in; the program must link the
// transport (import _ "github.com/rdmakit/rdmakit/transport/tcp", or shm).
// Both sides must use the same transport, or the listener rejects the
// request (ErrTransportMismatch, seen on both sides).
//
// # Handshake
//
// The handshake runs over a TCP connection to the listener's address:
//
//	dialer                                   listener
//	QP → INIT
//	Request {QPN, PSN, address, MTU,  ───►   ListenOptions.Check(*Request)
//	         transport, device, private}     QP → INIT → RTR
//	                                  ◄───   Accept {QPN, PSN, address, MTU,
//	                                                 private}  or Reject {reason}
//	QP → RTR → RTS
//	Ready                             ───►   QP → RTS; Accept returns the Conn
//
// PSNs are random (verbs.RandomPSN). Each side's AddressHandle has the
// peer's IP as seen on the handshake connection as GID and the peer's
// QP.Address() as Dest. The path MTU is the smaller of the two offers.
// Private data is limited to MaxPrivateData (196) bytes each way, reject
// reasons to MaxRejectReason (148) bytes, as in RDMA CM for RC.
//
// Handshakes run on the listener's goroutines, concurrently, and Accept
// hands out established connections (up to ListenOptions.Backlog wait).
// Failed attempts (rejects, mismatches, garbage) never surface from Accept;
// ListenOptions.OnHandshakeError sees them.
//
// # Peer loss
//
// After the handshake the TCP connection stays open as a control channel.
// Each side sends a heartbeat every quarter of the smaller PeerTimeout of
// the two. When the peer goes away (connection closed or reset, e.g. its
// process died, or silence for PeerTimeout) or disconnects, cm moves the QP
// to ERROR, so outstanding work requests complete with WRFlush, closes
// Done, and Err returns an error matching ErrPeerLost or ErrPeerClosed.
// Close destroys what cm created (QP, and the CQs, PD and context unless
// given in Options) and tells the peer; Disconnect tells the peer and
// flushes without destroying anything.
//
// # Wire format
//
// Every message is a frame (internal/frame): a big-endian uint32 length of
// the payload (0 to 2048; a larger claim is refused before anything is
// read or allocated for it), a type byte, and the payload: the fields
// below (integers big-endian; str8 and bytes8 are a uint8 length and that
// many bytes, bytes16 a uint16 length). Decoding is strict: short or
// trailing bytes, out-of-range values and unknown types are errors
// (ErrProtocol), never panics.
//
//	1 Request     magic uint32 "RKCM", version uint8 (2), transport str8,
//	              device str8, then the Accept fields
//	2 Accept      QPN uint32 (24 bits), PSN uint32 (24 bits), MTU uint8
//	              (1..5), PeerTimeout uint32 ms (> 0), address bytes16
//	              (≤ 1024), private data bytes8 (≤ 196)
//	3 Reject      code uint8 (RejectCode), reason str8 (≤ 148)
//	4 Ready       (empty)
//	5 Heartbeat   (empty)
//	6 Disconnect  (empty)
//
// A dialer that cannot complete after an Accept sends a Reject too.
package cm

// Goroutines: this file has no code. Dial runs on its caller (dial.go); a
// Listener runs an accept loop and one goroutine per handshake (listen.go);
// each Conn runs a reader and a heartbeat goroutine (conn.go). Close of a
// Conn or Listener waits for all of its goroutines.
