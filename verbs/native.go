package verbs

import "context"

// NativeContext is implemented by a ContextDriver whose device implements
// the verbs objects itself — a real RNIC through libibverbs keeps keys,
// completion queues and queue pair state in hardware. verbs then delegates
// every object to the driver instead of running its own (arena-backed)
// implementation; memory from AllocMR still comes from the arena, so it is
// off-heap and page aligned, and is registered with the device.
type NativeContext interface {
	ContextDriver
	AllocPD() (NativePD, error)
	CreateCQ(cqe int) (NativeCQ, error)
}

// NativePD is a device protection domain.
type NativePD interface {
	RegMR(buf []byte, access Access) (NativeMR, error)
	CreateQP(cfg NativeQPConfig) (NativeQP, error)
	CreateSRQ(cfg SRQConfig) (NativeSRQ, error)
	Close() error
}

// NativeMR is a device memory registration.
type NativeMR interface {
	LKey() uint32
	RKey() uint32
	Dereg() error
}

// NativeCQ is a device completion queue.
type NativeCQ interface {
	// Poll is as CQ.Poll.
	Poll(wcs []WorkCompletion) (int, error)
	// Wait blocks until a completion may be available, ctx ends, or the CQ
	// is closed (ErrClosed); the caller then polls.
	Wait(ctx context.Context) error
	Cap() int
	Close() error
}

// NativeQPConfig is QPConfig with the device's objects.
type NativeQPConfig struct {
	SendCQ    NativeCQ
	RecvCQ    NativeCQ
	SRQ       NativeSRQ
	Cap       QPCap
	SignalAll bool
}

// NativeQP is a device queue pair.
type NativeQP interface {
	Num() uint32
	// Cap returns the capabilities the device granted.
	Cap() QPCap
	Modify(attr *QPAttr) error
	State() QPState
	PostSend(wrs []SendWR) error
	PostRecv(wrs []RecvWR) error
	// Address returns what the peer needs in AddressHandle.Dest (may be
	// nil when the GID and QP number say it all).
	Address() []byte
	Close() error
}

// NativeSRQ is a device shared receive queue.
type NativeSRQ interface {
	PostRecv(wrs []RecvWR) error
	Close() error
}
