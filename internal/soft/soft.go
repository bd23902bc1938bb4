// Package soft is rdmakit's software verbs engine: it implements the
// objects of verbs/driver (protection domains, memory regions with their
// keys, completion queues, shared receive queues, the queue pair state
// machine and its send and receive queues) over a per-context arena, a key
// table and rings, all in shared memory. A software transport (shm, tcp)
// plugs into it by implementing Transport, ContextTransport and
// QPTransport: it is asked only to move data — execute send entries in
// order and complete them, serve requests as a responder through the QP's
// rc.Target — and NewDriver turns it into a verbs/driver.Driver.
//
// Goroutines and ordering: see qp.go.
package soft

import "github.com/rdmakit/rdmakit/verbs/driver"

// The value types of verbs/driver, by their short names.
type (
	Access         = driver.Access
	AddressHandle  = driver.AddressHandle
	DeviceInfo     = driver.DeviceInfo
	Opcode         = driver.Opcode
	QPAttr         = driver.QPAttr
	QPCap          = driver.QPCap
	QPState        = driver.QPState
	RecvWR         = driver.RecvWR
	SGE            = driver.SGE
	SendWR         = driver.SendWR
	SRQConfig      = driver.SRQConfig
	Status         = driver.Status
	WCOpcode       = driver.WCOpcode
	WCFlags        = driver.WCFlags
	WorkCompletion = driver.WorkCompletion
)

const (
	AccessLocalWrite      = driver.AccessLocalWrite
	OpWrite               = driver.OpWrite
	OpRead                = driver.OpRead
	OpCompareAndSwap      = driver.OpCompareAndSwap
	OpFetchAndAdd         = driver.OpFetchAndAdd
	SendInline            = driver.SendInline
	SendSignaled          = driver.SendSignaled
	AtomicNone            = driver.AtomicNone
	QPReset               = driver.QPReset
	QPInit                = driver.QPInit
	QPRTR                 = driver.QPRTR
	QPRTS                 = driver.QPRTS
	QPError               = driver.QPError
	StatusSuccess         = driver.StatusSuccess
	StatusWRFlush         = driver.StatusWRFlush
	StatusLocalProtection = driver.StatusLocalProtection
	MaxQPWR               = driver.MaxQPWR
	MaxInline             = driver.MaxInline
	MaxSGE                = driver.MaxSGE
	MaxMsgSize            = driver.MaxMsgSize
)

var (
	ErrNotSupported    = driver.ErrNotSupported
	ErrInvalidArgument = driver.ErrInvalidArgument
	ErrInvalidState    = driver.ErrInvalidState
	ErrQueueFull       = driver.ErrQueueFull
	ErrCQOverflow      = driver.ErrCQOverflow
	ErrClosed          = driver.ErrClosed
	ErrNoMemory        = driver.ErrNoMemory
	ErrBusy            = driver.ErrBusy
	postErr            = driver.PostErr
)

// Transport is a software transport: a named family of devices whose
// objects this engine implements.
type Transport interface {
	// Name is the transport's name ("shm", "tcp").
	Name() string
	// Devices lists the transport's devices.
	Devices() ([]DeviceInfo, error)
	// Open opens the device for ctx, whose arena and key table exist.
	Open(dev DeviceInfo, opts driver.Options, ctx *Context) (ContextTransport, error)
}

// ContextTransport is a transport's per-context state.
type ContextTransport interface {
	// CanRegister reports whether RegMR of caller memory is served.
	CanRegister() bool
	// NewQP is called for each new queue pair, in RESET.
	NewQP(qp *QP) (QPTransport, error)
	// Close releases transport resources; the engine has destroyed all
	// QPs.
	Close() error
}

// QPTransport is a transport's per-queue-pair state.
//
// Calls into a QPTransport never happen with engine locks held, so a
// transport may call back into the QP (SendEntry, CompleteSend, Fail) from
// any method.
type QPTransport interface {
	// Address returns what a peer needs in AddressHandle.Dest.
	Address() []byte
	// Modify applies a validated transition. Returning an error leaves the
	// QP in its old state. On a transition to ERROR or RESET the transport
	// must stop touching send entries before it returns. attr is nil when
	// the engine moves the QP to ERROR by itself (a peer recorded an error,
	// or a completion was lost to CQ overflow). The control block already
	// shows RTR/RTS when Modify is called for those transitions.
	Modify(from, to QPState, attr *QPAttr) error
	// PostSend says that send entries up to QP.SendTail are ready.
	PostSend()
	// PostRecv says that receives were posted.
	PostRecv()
	// Destroy releases the QP's transport resources.
	Destroy() error
}

// LockedExecutor is a QPTransport that executes send entries on the
// posting goroutine, under a lock of its own (shm). The engine then posts
// under that lock too (PostSend appends the work requests and calls
// RunLocked before unlocking) and uses it in place of its completion
// lock: the transport calls CompleteSend and Fail with it held, and must
// not hold it when the engine calls Modify, PostRecv or Destroy. One lock
// pair per post on the uncontended path instead of three.
type LockedExecutor interface {
	QPTransport
	// Lock and Unlock are the transport's execution lock.
	Lock()
	Unlock()
	// RunLocked executes the entries up to QP.SendTail, as PostSend
	// would; the lock is held.
	RunLocked()
}

// DirectExecutor is a LockedExecutor that can execute work requests
// straight from the caller's list, without queueing them, when nothing is
// queued ahead of them (shm: the shortest path from PostSend to the
// peer's memory). The engine calls PostDirect with the lock held, the QP
// in RTS and its send queue empty; the transport executes a prefix of wrs
// that it can complete with success right away, each checked as the
// engine checks it (QP.DirectLocal), and returns its length; the engine
// delivers their completions, in batches. The engine posts the rest (the
// first work request that needs the queue, waits, or fails, and those
// after it) the ordinary way, so every error is reported by one code
// path.
type DirectExecutor interface {
	LockedExecutor
	PostDirect(wrs []SendWR) int
}

// NewDriver makes a software transport a verbs/driver.Driver, for
// verbs.Register.
func NewDriver(t Transport) driver.Driver { return drv{t} }

type drv struct{ t Transport }

func (d drv) Name() string                   { return d.t.Name() }
func (d drv) Devices() ([]DeviceInfo, error) { return d.t.Devices() }
func (d drv) Open(dev DeviceInfo, opts driver.Options) (driver.Context, error) {
	return open(d.t, dev, opts)
}
