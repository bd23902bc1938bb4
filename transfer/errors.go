package transfer

// Errors. No goroutines here.

import (
	"errors"
	"fmt"
)

// Sentinel errors; the errors the engine returns match them with errors.Is.
var (
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("transfer: node closed")
	// ErrNoSegment: no segment of that name is registered (or its node's
	// lease ran out).
	ErrNoSegment = errors.New("transfer: no such segment")
	// ErrNoNode: no node of that name is registered.
	ErrNoNode = errors.New("transfer: no such node")
	// ErrExists: the name is taken.
	ErrExists = errors.New("transfer: name already registered")
	// ErrAfter: a Request with After set cannot follow the one before it
	// (another segment, more than one slice, or none before it).
	ErrAfter = errors.New("transfer: request cannot be ordered after the one before it")
	// ErrBounds: a request reaches outside its segment or its local region.
	ErrBounds = errors.New("transfer: out of bounds")
	// ErrReadOnly: a Write to a read-only segment.
	ErrReadOnly = errors.New("transfer: segment is read-only")
	// ErrNoDevice: no device of this node reaches the segment's node.
	ErrNoDevice = errors.New("transfer: no common device")
	// ErrAuth: the metadata service's peer did not prove the secret.
	ErrAuth = errors.New("transfer: authentication failed")
	// ErrNoCredential: Config has neither Secret nor Insecure.
	ErrNoCredential = errors.New("transfer: no credential (set Config.Secret, or Insecure)")
	// ErrProtocol: a malformed metadata message.
	ErrProtocol = errors.New("transfer: protocol error")
	// ErrPeerLost: the segment's node cannot be reached: connecting to it
	// failed, or the connection went away.
	ErrPeerLost = errors.New("transfer: peer lost")
	// ErrTableFull: a node holds MaxSegmentsPerNode segments already.
	ErrTableFull = errors.New("transfer: metadata table full for this node")
	// ErrTransfer: a request of a batch did not complete (see RequestError).
	ErrTransfer = errors.New("transfer: request failed")
)

// RequestError says which request of a batch failed and why. It matches
// ErrTransfer and its cause.
type RequestError struct {
	Index   int    // the request's index in the batch
	Segment string // its segment
	Status  Status // Failed, Timeout or Canceled
	Err     error  // the cause
}

func (e *RequestError) Error() string {
	return fmt.Sprintf("transfer: request %d (segment %q) %s: %v", e.Index, e.Segment, e.Status, e.Err)
}

// Unwrap returns ErrTransfer and the cause.
func (e *RequestError) Unwrap() []error { return []error{ErrTransfer, e.Err} }
