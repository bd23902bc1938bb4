package kv

// Errors. No goroutines here.

import (
	"errors"
	"fmt"
)

// Sentinel errors; the store's errors match them with errors.Is (transfer
// errors, such as transfer.ErrPeerLost, pass through wrapped).
var (
	// ErrNotFound: no value under the key.
	ErrNotFound = errors.New("kv: key not found")
	// ErrFull: the store has no room for the value, even after evicting
	// every value not being read or written.
	ErrFull = errors.New("kv: store full")
	// ErrTooLarge: a key or value over the store's limits (or larger than
	// any store node's capacity).
	ErrTooLarge = errors.New("kv: key or value too large")
	// ErrNoNodes: fewer store nodes than the replicas wanted.
	ErrNoNodes = errors.New("kv: not enough store nodes")
	// ErrBuffer: the destination is too small for the value.
	ErrBuffer = errors.New("kv: destination too small")
	// ErrClosed: the store handle is closed.
	ErrClosed = errors.New("kv: closed")
	// ErrLeaseExpired: a read outlasted its lease (the value may have been
	// replaced under it), and retries did too.
	ErrLeaseExpired = errors.New("kv: read lease expired before the read finished")
)

// errTaken: a store node name joined from another session (another
// process holds it until it leaves or goes silent).
var errTaken = errors.New("kv: store node name in use")

// KeyError says which key of a batch failed and why; it matches the cause.
type KeyError struct {
	Index int
	Key   []byte
	Err   error
}

func (e *KeyError) Error() string {
	return fmt.Sprintf("kv: key %d (%q): %v", e.Index, shortKey(e.Key), e.Err)
}

// Unwrap returns the cause.
func (e *KeyError) Unwrap() error { return e.Err }

func shortKey(k []byte) string {
	if len(k) > 40 {
		return string(k[:40]) + "..."
	}
	return string(k)
}
