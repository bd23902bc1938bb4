package driver

import (
	"fmt"
	"net"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// Access is a set of memory access rights (values as in ibv_access_flags).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = Access(rc.AccessLocalWrite)
	AccessRemoteWrite  Access = Access(rc.AccessRemoteWrite)
	AccessRemoteRead   Access = Access(rc.AccessRemoteRead)
	AccessRemoteAtomic Access = Access(rc.AccessRemoteAtomic)

	// AccessAll is every flag above.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

func (a Access) String() string {
	s := ""
	add := func(f Access, n string) {
		if a&f != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	add(AccessLocalWrite, "LOCAL_WRITE")
	add(AccessRemoteWrite, "REMOTE_WRITE")
	add(AccessRemoteRead, "REMOTE_READ")
	add(AccessRemoteAtomic, "REMOTE_ATOMIC")
	if s == "" {
		return "0"
	}
	return s
}

// Opcode is a send work request opcode (values as in ibv_wr_opcode).
type Opcode uint8

// Work request opcodes.
const (
	OpWrite          Opcode = 0
	OpWriteWithImm   Opcode = 1
	OpSend           Opcode = 2
	OpSendWithImm    Opcode = 3
	OpRead           Opcode = 4
	OpCompareAndSwap Opcode = 5
	OpFetchAndAdd    Opcode = 6
)

var opNames = [...]string{"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"}

func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", o)
}

// IsAtomic reports whether o is CompareAndSwap or FetchAndAdd.
func (o Opcode) IsAtomic() bool { return o == OpCompareAndSwap || o == OpFetchAndAdd }

// HasImm reports whether o carries immediate data.
func (o Opcode) HasImm() bool { return o == OpWriteWithImm || o == OpSendWithImm }

// SendFlags modify a send work request (values as in ibv_send_flags).
type SendFlags uint32

// Send flags.
const (
	SendFence     SendFlags = 1
	SendSignaled  SendFlags = 2
	SendSolicited SendFlags = 4
	SendInline    SendFlags = 8
)

// SGE is a scatter/gather element: Length bytes at Addr in the region
// whose lkey is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request.
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE
	// Imm is the immediate data of WriteWithImm and SendWithImm.
	Imm uint32
	// RemoteAddr and RKey name the target of Write, Read and atomics.
	RemoteAddr uint64
	RKey       uint32
	// CompareAdd is the compare operand of CompareAndSwap and the addend of
	// FetchAndAdd; Swap is the value CompareAndSwap stores.
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WCOpcode says what a completion completes (values as in ibv_wc_opcode).
type WCOpcode uint32

// Completion opcodes.
const (
	WCSend             WCOpcode = WCOpcode(rc.WCSend)
	WCWrite            WCOpcode = WCOpcode(rc.WCWrite)
	WCRead             WCOpcode = WCOpcode(rc.WCRead)
	WCCompareAndSwap   WCOpcode = WCOpcode(rc.WCCompSwap)
	WCFetchAndAdd      WCOpcode = WCOpcode(rc.WCFetchAdd)
	WCRecv             WCOpcode = WCOpcode(rc.WCRecv)
	WCRecvWriteWithImm WCOpcode = WCOpcode(rc.WCRecvWriteImm)
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCWrite:
		return "RDMA_WRITE"
	case WCRead:
		return "RDMA_READ"
	case WCCompareAndSwap:
		return "COMP_SWAP"
	case WCFetchAndAdd:
		return "FETCH_ADD"
	case WCRecv:
		return "RECV"
	case WCRecvWriteWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// WCFlags qualify a completion (values as in ibv_wc_flags).
type WCFlags uint32

// WCWithImm means Imm is valid.
const WCWithImm WCFlags = WCFlags(rc.WCWithImm)

// WorkCompletion is one completion queue entry.
type WorkCompletion struct {
	WRID    uint64
	Status  Status
	Opcode  WCOpcode
	ByteLen uint32
	Imm     uint32
	Flags   WCFlags
	QPNum   uint32
	SrcQP   uint32
}

// Err returns nil for a successful completion, or an error that matches
// its Status with errors.Is and carries the work request id.
func (wc *WorkCompletion) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, WRID: wc.WRID, QPNum: wc.QPNum, Opcode: wc.Opcode}
}

// QPState is a queue pair state (values as in ibv_qp_state).
type QPState uint32

// Queue pair states.
const (
	QPReset QPState = QPState(rc.StateReset)
	QPInit  QPState = QPState(rc.StateInit)
	QPRTR   QPState = QPState(rc.StateRTR)
	QPRTS   QPState = QPState(rc.StateRTS)
	QPError QPState = QPState(rc.StateError)
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPError:
		return "ERROR"
	}
	return fmt.Sprintf("QPState(%d)", uint32(s))
}

// MTU is a path MTU in the IB enumeration (1=256 ... 5=4096).
type MTU uint8

// MTUs.
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// QPCap are the capabilities of a queue pair. Zero fields take defaults:
// 128 send and receive work requests, 4 SGEs each way, 64 bytes inline.
type QPCap struct {
	MaxSendWR     int
	MaxRecvWR     int
	MaxSendSGE    int
	MaxRecvSGE    int
	MaxInlineData int
}

// AddressHandle says how to reach the remote QP. GID is its network address
// where the transport has one (cm fills it from the handshake connection);
// Dest is the transport-specific address the peer's QP.Address returned.
//
// SL (service level, InfiniBand) and TrafficClass (the GRH's traffic
// class; the IP header's DSCP and ECN bits on RoCE v2) are carried into
// the QP's address vector by transports that have one (ibverbs); software
// transports ignore them. Zero is the default, as in ibv_ah_attr.
type AddressHandle struct {
	GID          net.IP
	Dest         []byte
	SL           uint8
	TrafficClass uint8
}

// QPAttr are the attributes QP.Modify applies. Which fields matter depends
// on the transition, as with ibv_modify_qp:
//
//	→ INIT: AccessFlags (remote operations the QP accepts), Port
//	→ RTR:  PathMTU, DestQPN, RQPSN, AH, MinRNRTimer, MaxDestRdAtomic
//	→ RTS:  SQPSN, Timeout, RetryCount, RNRRetry, MaxRdAtomic
type QPAttr struct {
	State QPState

	AccessFlags Access
	Port        uint8

	PathMTU         MTU
	DestQPN         uint32
	RQPSN           uint32
	AH              AddressHandle
	MinRNRTimer     uint8
	MaxDestRdAtomic uint8

	SQPSN uint32
	// Timeout is the local ACK timeout, 4.096 µs × 2^Timeout (0: infinite).
	Timeout uint8
	// RetryCount is how often a timed-out request is retried (0..7).
	RetryCount uint8
	// RNRRetry is how often a receiver-not-ready NAK is retried (7: forever).
	RNRRetry    uint8
	MaxRdAtomic uint8
}

// TimeoutDuration decodes the IB local ACK timeout exponent (0: none).
func TimeoutDuration(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	if t > 31 {
		t = 31
	}
	return time.Duration(4096<<t) * time.Nanosecond
}

var rnrTable = [32]time.Duration{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
	122880, 163840, 245760, 327680, 491520,
}

// RNRTimerDuration decodes the IB min_rnr_timer encoding (0 is 655.36 ms,
// 1 is 0.01 ms, ..., 31 is 491.52 ms).
func RNRTimerDuration(t uint8) time.Duration {
	return rnrTable[t&31] * time.Microsecond
}

// AtomicCap says whether a device supports atomics (as ibv_atomic_cap).
type AtomicCap int

// Atomic capabilities.
const (
	AtomicNone AtomicCap = 0
	AtomicHCA  AtomicCap = 1
	AtomicGlob AtomicCap = 2
)

// PortState is the state of a device port (values as ibv_port_state).
type PortState int

// Port states.
const (
	PortDown   PortState = 1
	PortInit   PortState = 2
	PortArmed  PortState = 3
	PortActive PortState = 4
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	}
	return fmt.Sprintf("PortState(%d)", int(s))
}

// PortInfo describes a device port.
type PortInfo struct {
	Num       int
	State     PortState
	MaxMTU    MTU
	ActiveMTU MTU
	LinkLayer string // "InfiniBand", "Ethernet", "Memory", "TCP"
	GIDs      []net.IP
	Addrs     []string // transport addresses, where meaningful
}

// DeviceInfo describes a device as Devices lists it.
type DeviceInfo struct {
	Name       string
	Transport  string
	NodeType   string // "CA", "RNIC", "Software"
	NodeGUID   uint64
	FWVersion  string
	VendorID   uint32
	MaxMRSize  uint64
	MaxQP      int
	MaxQPWR    int
	MaxSGE     int
	MaxCQ      int
	MaxCQE     int
	MaxMR      int
	MaxPD      int
	MaxSRQ     int
	MaxSRQWR   int
	MaxInline  int
	AtomicCap  AtomicCap
	MaxMsgSize uint64
	Ports      []PortInfo
	// Caps is what the device declares it can do.
	Caps Capability
}

// Capability is one thing a device declares it can do, where devices
// legitimately differ. Consumers (the conformance suite, coll, tools)
// decide by capability, never by device name, node type or vendor.
type Capability uint64

// Capabilities.
const (
	// CapImmediate: WriteWithImm and SendWithImm (not on iWARP).
	CapImmediate Capability = 1 << iota
	// CapAtomics: CompareAndSwap and FetchAndAdd.
	CapAtomics
	// CapRNRRetry: a Send that finds no receive draws a receiver-not-ready
	// NAK and is retried (IB, RoCE, software transports); without it the
	// connection is terminated (iWARP).
	CapRNRRetry
	// CapSeparateKeys: lkey and rkey differ, so an lkey used as an rkey
	// is refused.
	CapSeparateKeys
	// CapRegisterCallerMemory: RegMR of memory the caller allocated (the
	// Go heap, mmap); without it only AllocMR memory can be registered.
	CapRegisterCallerMemory
	// CapSameHost: the device reaches queue pairs on the same host only.
	CapSameHost
	// CapSRQ: shared receive queues.
	CapSRQ
	// CapRemoteErrorCompletion: a remote error (access, invalid request)
	// completes the failing work request with that status, in order;
	// without it (iWARP) the connection is terminated and the QP goes to
	// ERROR, the status being the device's choice.
	CapRemoteErrorCompletion
	// CapMultiSGERead: RDMA Read scatters into more than one local SGE.
	CapMultiSGERead
	// CapZeroLengthRead: a zero-length RDMA Read, with or without an SGE
	// (iWARP takes exactly one SGE; siw in Linux 6.1 can answer a
	// zero-length Read with stale bytes and end the connection, so
	// transport/ibverbs refuses one there).
	CapZeroLengthRead
	// CapRemoteAccessChecks: the responder enforces REMOTE_READ on the
	// region and the QP's remote access flags (siw in Linux 6.1 does not).
	CapRemoteAccessChecks
	// CapStrictStatus: the device completes every error with the one
	// status rdmakit documents, taking none of the leeway the IBA leaves
	// to implementations (rdmakit's own transports).
	CapStrictStatus
	// CapWriteOnPost: a Write's data is in the remote memory by the time
	// PostSend returns (shm: the initiator copies it), so the initiator
	// need not wait for its completion before signalling the peer.
	CapWriteOnPost
	// CapNetwork: the device reaches other hosts.
	CapNetwork
)

var capNames = [...]string{"immediate", "atomics", "rnr-retry", "separate-keys", "register-caller-memory",
	"same-host", "srq", "remote-error-completion", "multi-sge-read", "zero-length-read",
	"remote-access-checks", "strict-status", "write-on-post", "network"}

// Has reports whether c holds every capability of want.
func (c Capability) Has(want Capability) bool { return c&want == want }

func (c Capability) String() string {
	s := ""
	for i, n := range capNames {
		if c&(1<<i) != 0 {
			if s != "" {
				s += ","
			}
			s += n
		}
	}
	if s == "" {
		return "none"
	}
	return s
}
