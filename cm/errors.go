package cm

// No goroutines: error values and types only.

import (
	"errors"
	"fmt"
	"net"
)

// Errors returned by this package. Errors from Dial, Accept and Conn.Err
// wrap one of them (use errors.Is), with detail in the message.
var (
	// ErrRejected: the listener refused the connection. The error is a
	// *RejectError carrying the listener's reason.
	ErrRejected = errors.New("cm: connection rejected")
	// ErrTransportMismatch: dialer and listener use different transports
	// (for example shm and tcp). A *RejectError with this code matches
	// both ErrRejected and ErrTransportMismatch.
	ErrTransportMismatch = errors.New("cm: transport mismatch")
	// ErrPrivateDataTooLong: private data beyond MaxPrivateData bytes.
	ErrPrivateDataTooLong = errors.New("cm: private data too long")
	// ErrPeerLost: the peer vanished: its control connection ended without
	// a disconnect (process died, connection reset) or it sent no heartbeat
	// within PeerTimeout.
	ErrPeerLost = errors.New("cm: peer lost")
	// ErrPeerClosed: the peer closed (or disconnected) its Conn.
	ErrPeerClosed = errors.New("cm: peer closed the connection")
	// ErrClosed: this side closed the Conn or Listener.
	ErrClosed = errors.New("cm: closed")
	// ErrListenerClosed is the reason sent to dialers whose handshake a
	// Listener.Close cut short.
	ErrListenerClosed = errors.New("listener closed")
	// ErrProtocol: the peer sent something that is not this protocol.
	ErrProtocol = errors.New("cm: protocol error")
	// ErrAuth: authentication failed: the peer did not prove the shared
	// secret (wrong secret, replayed or relayed proof), one side requires
	// a credential the other does not offer, or the TLS handshake failed
	// (certificate not trusted, no client certificate under mutual TLS,
	// one side not speaking TLS). A reject with RejectAuth matches it.
	ErrAuth = errors.New("cm: authentication failed")
	// ErrNoCredential: Listen or Dial was given neither a credential
	// (Options.Secret, or Options.TLS that authenticates the peer) nor
	// Options.Insecure.
	ErrNoCredential = errors.New("cm: no credential configured (set Options.Secret or Options.TLS, or Options.Insecure to connect unauthenticated)")
)

// RejectCode says why a connection was rejected.
type RejectCode uint8

// Reject codes (carried on the wire).
const (
	// RejectApplication: the listener's Check returned an error.
	RejectApplication RejectCode = 1
	// RejectTransport: dialer and listener use different transports.
	RejectTransport RejectCode = 2
	// RejectProtocol: malformed message or unsupported protocol version.
	RejectProtocol RejectCode = 3
	// RejectResources: the peer could not create or connect its QP.
	RejectResources RejectCode = 4
	// RejectBusy: the listener has Backlog connections pending.
	RejectBusy RejectCode = 5
	// RejectInvalid: invalid parameters (private data length and the like).
	RejectInvalid RejectCode = 6
	// RejectAuth: authentication failed or the two sides disagree on it
	// (one requires a shared secret or TLS the other does not use).
	RejectAuth RejectCode = 7
)

func (c RejectCode) String() string {
	switch c {
	case RejectApplication:
		return "application"
	case RejectTransport:
		return "transport mismatch"
	case RejectProtocol:
		return "protocol"
	case RejectResources:
		return "resources"
	case RejectBusy:
		return "busy"
	case RejectInvalid:
		return "invalid"
	case RejectAuth:
		return "authentication"
	}
	return fmt.Sprintf("code %d", uint8(c))
}

// RejectError is what Dial returns when the listener rejects the request,
// and what a Listener reports (through ListenOptions.OnHandshakeError) when
// the dialer aborts after the listener's reply. It matches ErrRejected,
// ErrTransportMismatch when Code is RejectTransport and ErrAuth when Code
// is RejectAuth.
type RejectError struct {
	Code RejectCode
	// Reason is the rejecting side's explanation (at most MaxRejectReason
	// bytes; longer reasons are truncated before they are sent).
	Reason string
	// ByPeer is true when the peer rejected, false when this side did.
	ByPeer bool
	// Err is the local cause when this side rejected (the error Check
	// returned, for instance); it is not sent. Nil for peer rejects.
	Err error
}

func (e *RejectError) Error() string {
	who := "rejected by peer"
	if !e.ByPeer {
		who = "rejected locally"
	}
	return fmt.Sprintf("connection %s (%s): %s", who, e.Code, e.Reason)
}

// Is matches ErrRejected, ErrTransportMismatch for RejectTransport and
// ErrAuth for RejectAuth.
func (e *RejectError) Is(target error) bool {
	return target == ErrRejected ||
		(target == ErrTransportMismatch && e.Code == RejectTransport) ||
		(target == ErrAuth && e.Code == RejectAuth)
}

// Unwrap returns the local cause, if any.
func (e *RejectError) Unwrap() error { return e.Err }

// HandshakeError describes a connection attempt that a Listener did not
// complete; it is passed to ListenOptions.OnHandshakeError.
type HandshakeError struct {
	// Remote is the dialer's address on the handshake connection.
	Remote net.Addr
	// Request is the dialer's request, or nil if none was read.
	Request *Request
	// Err is the cause: a *RejectError (matching ErrRejected and maybe
	// ErrTransportMismatch), an ErrProtocol error, a network or verbs error.
	Err error
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("cm: handshake with %v failed: %v", e.Remote, e.Err)
}

func (e *HandshakeError) Unwrap() error { return e.Err }
