// The value types applications use are defined in verbs/driver, so that
// transports share them; verbs gives them their public names here.

package verbs

import "github.com/rdmakit/rdmakit/verbs/driver"

// Value types shared with transports (see verbs/driver for their documentation).
type (
	Access         = driver.Access
	AddressHandle  = driver.AddressHandle
	AtomicCap      = driver.AtomicCap
	Capability     = driver.Capability
	DeviceInfo     = driver.DeviceInfo
	MTU            = driver.MTU
	Opcode         = driver.Opcode
	Options        = driver.Options
	PortInfo       = driver.PortInfo
	PortState      = driver.PortState
	PostError      = driver.PostError
	QPAttr         = driver.QPAttr
	QPCap          = driver.QPCap
	QPState        = driver.QPState
	RecvWR         = driver.RecvWR
	SGE            = driver.SGE
	SRQConfig      = driver.SRQConfig
	SendFlags      = driver.SendFlags
	SendWR         = driver.SendWR
	Status         = driver.Status
	WCError        = driver.WCError
	WCFlags        = driver.WCFlags
	WCOpcode       = driver.WCOpcode
	WorkCompletion = driver.WorkCompletion
)

// Constants (see verbs/driver).
const (
	AccessAll                = driver.AccessAll
	AccessLocalWrite         = driver.AccessLocalWrite
	AccessRemoteAtomic       = driver.AccessRemoteAtomic
	AccessRemoteRead         = driver.AccessRemoteRead
	AccessRemoteWrite        = driver.AccessRemoteWrite
	AtomicGlob               = driver.AtomicGlob
	AtomicHCA                = driver.AtomicHCA
	AtomicNone               = driver.AtomicNone
	CapAtomics               = driver.CapAtomics
	CapImmediate             = driver.CapImmediate
	CapMultiSGERead          = driver.CapMultiSGERead
	CapNetwork               = driver.CapNetwork
	CapRNRRetry              = driver.CapRNRRetry
	CapRegisterCallerMemory  = driver.CapRegisterCallerMemory
	CapRemoteAccessChecks    = driver.CapRemoteAccessChecks
	CapRemoteErrorCompletion = driver.CapRemoteErrorCompletion
	CapSRQ                   = driver.CapSRQ
	CapSameHost              = driver.CapSameHost
	CapSeparateKeys          = driver.CapSeparateKeys
	CapStrictStatus          = driver.CapStrictStatus
	CapWriteOnPost           = driver.CapWriteOnPost
	CapZeroLengthRead        = driver.CapZeroLengthRead
	DefaultQPWR              = driver.DefaultQPWR
	MTU1024                  = driver.MTU1024
	MTU2048                  = driver.MTU2048
	MTU256                   = driver.MTU256
	MTU4096                  = driver.MTU4096
	MTU512                   = driver.MTU512
	MaxInline                = driver.MaxInline
	MaxMsgSize               = driver.MaxMsgSize
	MaxQPWR                  = driver.MaxQPWR
	MaxSGE                   = driver.MaxSGE
	OpCompareAndSwap         = driver.OpCompareAndSwap
	OpFetchAndAdd            = driver.OpFetchAndAdd
	OpRead                   = driver.OpRead
	OpSend                   = driver.OpSend
	OpSendWithImm            = driver.OpSendWithImm
	OpWrite                  = driver.OpWrite
	OpWriteWithImm           = driver.OpWriteWithImm
	PortActive               = driver.PortActive
	PortArmed                = driver.PortArmed
	PortDown                 = driver.PortDown
	PortInit                 = driver.PortInit
	QPError                  = driver.QPError
	QPInit                   = driver.QPInit
	QPRTR                    = driver.QPRTR
	QPRTS                    = driver.QPRTS
	QPReset                  = driver.QPReset
	SendFence                = driver.SendFence
	SendInline               = driver.SendInline
	SendSignaled             = driver.SendSignaled
	SendSolicited            = driver.SendSolicited
	StatusBadResponse        = driver.StatusBadResponse
	StatusFatal              = driver.StatusFatal
	StatusGeneral            = driver.StatusGeneral
	StatusLocalAccess        = driver.StatusLocalAccess
	StatusLocalLength        = driver.StatusLocalLength
	StatusLocalProtection    = driver.StatusLocalProtection
	StatusLocalQPOperation   = driver.StatusLocalQPOperation
	StatusRNRRetryExceeded   = driver.StatusRNRRetryExceeded
	StatusRemoteAbort        = driver.StatusRemoteAbort
	StatusRemoteAccess       = driver.StatusRemoteAccess
	StatusRemoteInvalidReq   = driver.StatusRemoteInvalidReq
	StatusRemoteOperation    = driver.StatusRemoteOperation
	StatusResponseTimeout    = driver.StatusResponseTimeout
	StatusRetryExceeded      = driver.StatusRetryExceeded
	StatusSuccess            = driver.StatusSuccess
	StatusWRFlush            = driver.StatusWRFlush
	WCCompareAndSwap         = driver.WCCompareAndSwap
	WCFetchAndAdd            = driver.WCFetchAndAdd
	WCRead                   = driver.WCRead
	WCRecv                   = driver.WCRecv
	WCRecvWriteWithImm       = driver.WCRecvWriteWithImm
	WCSend                   = driver.WCSend
	WCWithImm                = driver.WCWithImm
	WCWrite                  = driver.WCWrite
)

// Errors returned by verbs calls, as opposed to completion statuses; match them with errors.Is.
var (
	ErrBusy            = driver.ErrBusy
	ErrCQOverflow      = driver.ErrCQOverflow
	ErrClosed          = driver.ErrClosed
	ErrInvalidArgument = driver.ErrInvalidArgument
	ErrInvalidState    = driver.ErrInvalidState
	ErrNoDevice        = driver.ErrNoDevice
	ErrNoMemory        = driver.ErrNoMemory
	ErrNotSupported    = driver.ErrNotSupported
	ErrQueueFull       = driver.ErrQueueFull
)

// Attribute decoding and size parsing (see verbs/driver).
var (
	ParseSize        = driver.ParseSize
	RNRTimerDuration = driver.RNRTimerDuration
	TimeoutDuration  = driver.TimeoutDuration
)
