package coll

import "errors"

// Errors. Failures of a collective wrap one of these with %w, so callers
// test them with errors.Is.
var (
	// ErrInvalidArgument: buffer sizes, types, ranks or options that
	// cannot work. The communicator stays usable.
	ErrInvalidArgument = errors.New("coll: invalid argument")
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("coll: communicator closed")
	// ErrAborted: an earlier error (this rank's or another's) ended the
	// communicator; every later call fails with it. Create a new one.
	ErrAborted = errors.New("coll: communicator aborted")
	// ErrTimeout: a collective made no progress within the communicator's
	// timeout (Options.Timeout) or the context's deadline.
	ErrTimeout = errors.New("coll: timed out")
	// ErrPeerLost: another rank's process died, closed the communicator or
	// its connection broke.
	ErrPeerLost = errors.New("coll: peer rank lost")
	// ErrMismatch: ranks called different collectives, or the same with
	// different counts, types, operators, roots or algorithms.
	ErrMismatch = errors.New("coll: mismatched collective calls across ranks")
	// ErrBootstrap: the communicator could not be formed (rendezvous,
	// missing ranks, connection setup).
	ErrBootstrap = errors.New("coll: bootstrap failed")
	// ErrNoLauncher: InitFromEnv found no launcher environment.
	ErrNoLauncher = errors.New("coll: no launcher environment (torchrun, mpirun, srun, Kubernetes indexed Job or RDMAKIT_COLL_RANK)")
)
