// Package cm connects rdmakit queue pairs the way sockets connect: a
// Listener accepts, Dial connects, and each side gets a *Conn whose QP is
// in RTS, in the spirit of RDMA CM (librdmacm).
//
//	secret := ...                    // ≥ 16 random bytes both sides hold
//	l, err := cm.Listen(ctx, ":7471", cm.ListenOptions{Options: cm.Options{Secret: secret}})
//	c, err := l.Accept(ctx)
//
//	c, err := cm.Dial(ctx, "server:7471", cm.Options{Secret: secret, PrivateData: hello})
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
// # Authentication
//
// A connected QP gives the peer remote access to the connection's PD (by
// default read, write and atomics on memory registered for them), so cm
// refuses to listen or dial without a credential: Options with neither
// Secret nor TLS that authenticates the peer fail with ErrNoCredential
// unless Insecure is set. Credentials:
//
//   - Options.Secret: a shared secret (at least MinSecretLen random
//     bytes). Before anything else, the dialer sends a fresh 32-byte nonce,
//     the listener answers with its own and an HMAC-SHA256 proof over
//     both; only if that verifies does the dialer send its request, with
//     its own proof over both nonces and the request; the listener's
//     accept carries a proof too. Proofs are compared in constant time,
//     the secret never travels, each role's MAC has its own label, and
//     the nonces are fresh on both sides, so a recorded, reflected or
//     relayed proof does not verify. The proofs cover the QP data, so
//     nobody without the secret can alter it.
//   - Options.TLS: the control connection runs over crypto/tls. A dialer
//     verifies the listener's certificate (RootCAs; ServerName defaults to
//     the dialed host); a listener authenticates dialers with mutual TLS
//     (ClientAuth tls.RequireAndVerifyClientCert, ClientCAs), and
//     ListenOptions.Check sees the verified chains in Request.TLS. With
//     both Secret and TLS, the secret's proofs are bound to the TLS
//     session (its exported keying material): a party with a valid
//     certificate but without the secret cannot relay the exchange
//     between two sessions.
//
// Both sides must agree: a secret on one side only, TLS on one side only,
// a wrong secret, a missing or untrusted certificate all fail with an
// error matching ErrAuth on the dialer (a *RejectError with RejectAuth
// when the listener refused) and are reported to
// ListenOptions.OnHandshakeError on the listener.
//
// What this binds on the data path. The QP data exchanged in the
// handshake is what connects the data path: for tcp0, QP.Address holds
// the QP's listen port, number and a 64-bit random nonce, and the data
// connection's hello must name both QPs and both nonces to be routed to
// the QP (transport/tcp, doc.go); the data connection goes to the IP the
// handshake came from (the GID). The data connection itself is plain TCP,
// neither authenticated nor encrypted by the transport. So:
//
//   - With TLS, the nonces travel only inside the encrypted handshake; a
//     party that cannot see the data connection's traffic can reach the QP
//     only by guessing 64 bits of nonce (and the QPN), before the real
//     peer connects (a QP accepts one data connection).
//   - With a secret and no TLS, the QP data is authenticated but not
//     secret: an eavesdropper learns the nonces and can race the real
//     peer to the data connection, or answer from the handshake's IP.
//   - An on-path attacker (one who can read and inject the data
//     connection's packets) can read and alter data-path traffic and
//     hijack the data connection whatever cm does: cm authenticates who
//     connects, not the bytes of the data path. On untrusted networks,
//     run the data path over a protected network (IPsec, WireGuard, a
//     fabric) as with RDMA hardware. See docs/security.md.
//
// shm0 connects only processes of the same user on one host; its data
// path maps the peer's whole context (docs/security.md).
//
// # Floods
//
// A Listener bounds what unauthenticated dialers can hold: at most
// ListenOptions.MaxHandshakes handshakes in progress
// (DefaultMaxHandshakes) and MaxHandshakesPerSource from one IP
// (DefaultMaxHandshakesPerSource); the accept loop refuses a connection
// beyond either at once, without a goroutine. A dialer has RequestTimeout
// (DefaultRequestTimeout) to complete TLS, the secret exchange and its
// request, and HandshakeTimeout for the whole handshake. No verbs object
// exists for a request before it is authenticated and passed Check, and
// by default a Listener opens one verbs context at Listen for all its
// connections (ListenOptions.Sharing: ShareContext, with a PD per
// connection; SharePD; or ContextPerConnection as before), so requests
// never open contexts and verbs.Open elsewhere in the process is not
// starved by a flood.
//
// # Handshake
//
// The handshake runs over a TCP connection to the listener's address (TLS
// first, and the secret exchange, when configured):
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
//	7 AuthHello   magic uint32 "RKCM", version uint8 (2), nonce [32]
//	8 AuthChallenge nonce [32], mac [32]
//	9 Proof       mac [32] (after a Request or an Accept)
//
// With a secret the exchange is AuthHello, AuthChallenge (MAC over
// "rdmakit cm v2 listener challenge", nD, nL and the TLS binding), Request
// and Proof (label "... dialer request", then the Request's payload),
// Accept and Proof (label "... listener accept", the Accept's payload),
// Ready; each MAC is HMAC-SHA256 keyed with the secret over the label, the
// dialer's and the listener's nonces, a uint16 length and the TLS exported
// keying material ("EXPORTER-rdmakit-cm-v2", 32 bytes; empty without
// TLS), and the payload. Without a secret the exchange starts at the
// Request, as before.
//
// A dialer that cannot complete after an Accept (or an AuthChallenge)
// sends a Reject too.
package cm

// Goroutines: this file has no code. Dial runs on its caller (dial.go); a
// Listener runs an accept loop and one goroutine per handshake, at most
// MaxHandshakes (listen.go); authentication runs on those (auth.go);
// each Conn runs a reader and a heartbeat goroutine (conn.go). Close of a
// Conn or Listener waits for all of its goroutines.
