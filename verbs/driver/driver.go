// Package driver is what a transport implements to appear as devices in
// package verbs, as database/sql/driver is for database/sql. Applications
// never import it; they use package verbs, whose objects are thin handles
// over the objects a driver returns.
//
// A transport implements Driver and registers it with verbs.Register from
// its init function. verbs finds the device by name, calls Driver.Open with
// the application's Options, and from then on calls the Context, PD, MR,
// CQ, QP and SRQ of this package. rdmakit's software transports (shm, tcp)
// do not implement these objects themselves: they plug into the software
// verbs engine (internal/soft), which implements this package over an
// arena, a key table and rings and asks the transport only to move data.
// A device that implements the objects itself (an RNIC through libibverbs)
// implements this package directly.
//
// The value types (work requests, completions, attributes, statuses,
// errors) live here so that both sides share them; package verbs re-exports
// every one of them under the same name.
//
// Concurrency: verbs calls every method from any goroutine, concurrently;
// implementations synchronize themselves. verbs does the bookkeeping that
// is the same for every device (which objects a context holds, ErrBusy for
// a PD, CQ or SRQ still in use, closing children before their parent), so
// a driver object is closed only after every object that uses it.
package driver

import (
	"context"
	"fmt"
)

// Driver is a transport: a named family of devices.
type Driver interface {
	// Name is the transport's name ("shm", "tcp", "ibverbs", ...).
	Name() string
	// Devices lists the transport's devices.
	Devices() ([]DeviceInfo, error)
	// Open opens one of them. opts are the caller's, with defaults (and
	// the environment's overrides) already applied by Options.Resolve.
	Open(dev DeviceInfo, opts Options) (Context, error)
}

// Context is an open device.
type Context interface {
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least cqe
	// completions (verbs has checked cqe against DeviceInfo.MaxCQE).
	CreateCQ(cqe int) (CQ, error)
	// Close releases the device. verbs has closed every object of the
	// context before; a driver may still find some (a racing creation)
	// and must release them.
	Close() error
}

// PD is a protection domain.
type PD interface {
	// AllocMR allocates size bytes of zeroed, page-aligned memory that
	// the device can serve and registers it (verbs has checked size).
	AllocMR(size int, access Access) (MR, error)
	// RegMR registers caller memory; ErrNotSupported where the device
	// cannot reach it (DeviceInfo.Caps lacks CapRegisterCallerMemory)
	// unless buf is memory this device allocated.
	RegMR(buf []byte, access Access) (MR, error)
	// CreateQP creates an RC queue pair in RESET. verbs has applied the
	// default capabilities and checked them against the limits here.
	CreateQP(cfg QPConfig) (QP, error)
	CreateSRQ(cfg SRQConfig) (SRQ, error)
	Close() error
}

// MR is a memory registration.
type MR interface {
	// Bytes is the registered memory.
	Bytes() []byte
	LKey() uint32
	RKey() uint32
	// Dereg removes the registration: once it returns no operation of
	// this context or of a peer reads or writes the memory through it.
	Dereg() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs without blocking or
	// allocating. After an overflow it returns what is left, then
	// ErrCQOverflow; after Close, ErrClosed.
	Poll(wcs []WorkCompletion) (int, error)
	// Wait blocks until at least one completion is available and polls
	// it, as Poll; it returns ctx's error when ctx ends first, ErrClosed
	// when the CQ is closed. verbs has spun on Poll for a while before.
	Wait(ctx context.Context, wcs []WorkCompletion) (int, error)
	// Cap is the number of completions the CQ holds.
	Cap() int
	// Close destroys the CQ and wakes waiters (ErrClosed).
	Close() error
}

// QPConfig configures a queue pair. The CQs and SRQ are this driver's
// own, created from the same context.
type QPConfig struct {
	SendCQ    CQ
	RecvCQ    CQ
	SRQ       SRQ // nil: the QP has its own receive queue
	Cap       QPCap
	SignalAll bool
}

// QP is a reliable-connected queue pair.
type QP interface {
	// Num is the QP number.
	Num() uint32
	// Cap is what the device granted, at least what was asked.
	Cap() QPCap
	// Address is what a peer needs in AddressHandle.Dest (may be empty
	// when the GID and the QP number say it all).
	Address() []byte
	// Modify applies a transition (CheckModify has accepted attr).
	Modify(attr *QPAttr) error
	// State is the current state; an error seen by the device is visible
	// here before its completion can be polled.
	State() QPState
	// Attr is the attributes applied so far, with the current state.
	Attr() QPAttr
	PostSend(wrs []SendWR) error
	PostRecv(wrs []RecvWR) error
	// Close destroys the QP; outstanding work requests are dropped.
	Close() error
}

// SRQ is a shared receive queue.
type SRQ interface {
	PostRecv(wrs []RecvWR) error
	Close() error
}

// SRQConfig configures a shared receive queue. Zero fields take defaults:
// 1024 work requests, 4 SGEs.
type SRQConfig struct {
	MaxWR  int
	MaxSGE int
}

// PostErr returns a *PostError for work request i: err (a sentinel of this
// package) with a formatted detail.
func PostErr(i int, err error, format string, args ...any) error {
	return &PostError{Index: i, Err: fmt.Errorf("%w: "+format, append([]any{err}, args...)...)}
}
