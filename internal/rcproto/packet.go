package rcproto

// Packets, actions and the IBTA timer encodings shared by the requester
// and the responder.
//
// Goroutines: none; these are values.

import (
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// Opcode is a packet's operation. The numeric values are those of
// transport/tcp's frame opcodes, so that a stream transport can convert
// by a cast; the segment position travels separately (Seg).
type Opcode uint8

// Request opcodes (requester → responder).
const (
	OpWrite    Opcode = 1
	OpWriteImm Opcode = 2
	OpSend     Opcode = 3
	OpSendImm  Opcode = 4
	OpRead     Opcode = 5 // READ request
	OpCmpSwap  Opcode = 6
	OpFetchAdd Opcode = 7

	// Response opcodes (responder → requester).
	OpAck        Opcode = 16
	OpNak        Opcode = 17
	OpReadResp   Opcode = 18
	OpAtomicResp Opcode = 19
)

var opNames = [...]string{
	OpWrite: "WRITE", OpWriteImm: "WRITE_IMM", OpSend: "SEND", OpSendImm: "SEND_IMM",
	OpRead: "READ", OpCmpSwap: "CMP_SWAP", OpFetchAdd: "FETCH_ADD",
	OpAck: "ACK", OpNak: "NAK", OpReadResp: "READ_RESP", OpAtomicResp: "ATOMIC_RESP",
}

func (o Opcode) String() string {
	if int(o) < len(opNames) && opNames[o] != "" {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// IsRequest reports whether o travels from requester to responder.
func (o Opcode) IsRequest() bool { return o >= OpWrite && o <= OpFetchAdd }

// IsAtomic reports whether o is an atomic request.
func (o Opcode) IsAtomic() bool { return o == OpCmpSwap || o == OpFetchAdd }

// isReadLike reports whether o needs a response with data: READ and the
// atomics, which max_rd_atomic / max_dest_rd_atomic bound.
func (o Opcode) isReadLike() bool { return o == OpRead || o.IsAtomic() }

// isWriteLike reports whether o carries payload from the requester.
func (o Opcode) isWriteLike() bool { return o >= OpWrite && o <= OpSendImm }

// Seg is a packet's position in its message: FIRST, MIDDLE (no bits),
// LAST or ONLY (both bits).
type Seg uint8

// Segment bits.
const (
	SegFirst Seg = 1 << 0
	SegLast  Seg = 1 << 1
	SegOnly      = SegFirst | SegLast
)

func (s Seg) String() string {
	switch s {
	case SegOnly:
		return "ONLY"
	case SegFirst:
		return "FIRST"
	case SegLast:
		return "LAST"
	}
	return "MIDDLE"
}

// Syndrome is the reason of a NAK.
type Syndrome uint8

// NAK syndromes (values as transport/tcp's wire format).
const (
	SynRNR          Syndrome = 1 // no receive posted: retry after RNRTimer
	SynSeqErr       Syndrome = 2 // PSN sequence error: the NAK's PSN is the one expected
	SynRemoteAccess Syndrome = 3 // rkey, access or bounds violation
	SynInvalidReq   Syndrome = 4 // e.g. message longer than the receive
	SynRemoteOp     Syndrome = 5 // responder could not complete (bad receive buffer)
)

var synNames = [...]string{"0", "RNR", "SEQ_ERR", "REMOTE_ACCESS", "INVALID_REQ", "REMOTE_OP"}

func (s Syndrome) String() string {
	if int(s) < len(synNames) {
		return synNames[s]
	}
	return fmt.Sprintf("Syndrome(%d)", uint8(s))
}

// nakStatus is the requester's completion status for a fatal NAK.
func nakStatus(s Syndrome) rc.Status {
	switch s {
	case SynRemoteAccess:
		return rc.RemoteAccess
	case SynInvalidReq:
		return rc.RemoteInvalidReq
	case SynRemoteOp:
		return rc.RemoteOperation
	}
	return rc.BadResponse
}

// synOf is the NAK syndrome for a responder status.
func synOf(st rc.Status) Syndrome {
	switch st {
	case rc.RemoteInvalidReq:
		return SynInvalidReq
	case rc.RemoteOperation:
		return SynRemoteOp
	}
	return SynRemoteAccess
}

// Packet is the protocol content of a packet, independent of any byte
// format: what the engines read and produce. Fields that only the owner
// needs (rkey, remote address, immediate, atomic operands, payload) stay
// with the owner, which knows them from its work request or its wire
// header.
type Packet struct {
	Op       Opcode
	Seg      Seg
	Syn      Syndrome // NAK only
	RNRTimer uint8    // RNR NAK only: the responder's min_rnr_timer (IB encoding)
	PSN      PSN
	// AckReq asks the responder to acknowledge this packet even if it
	// does not end a message (the requester's window is full).
	AckReq bool
	// Off is the offset of this packet's data in its message. For a READ
	// request it is where the requested data starts (non-zero when a
	// partially answered read is requested again).
	Off uint32
	// Len is the packet's data length: payload of WRITE/SEND packets and
	// READ_RESP packets; for a READ request, the bytes wanted from Off; 8
	// for atomics.
	Len uint32
	// MSN is the responder's message sequence number (the AETH's): how
	// many messages it has completed, modulo 2^24; set on every response.
	MSN uint32
	// Value is the prior value of the target word (ATOMIC_RESP).
	Value uint64
	// WR is the requester's work request a request packet belongs to (set
	// by Requester.Next; not on the wire).
	WR uint64
	// Ref is the owner's tag for the data of a READ_RESP (set from
	// Result.Ref by Responder.Done; not on the wire).
	Ref uint64
}

func (p *Packet) String() string {
	switch {
	case p.Op == OpNak:
		s := fmt.Sprintf("NAK %s psn=%d msn=%d", p.Syn, p.PSN, p.MSN)
		if p.Syn == SynRNR {
			s += fmt.Sprintf(" timer=%d", p.RNRTimer)
		}
		return s
	case p.Op == OpAck:
		return fmt.Sprintf("ACK psn=%d msn=%d", p.PSN, p.MSN)
	case p.Op == OpAtomicResp:
		return fmt.Sprintf("ATOMIC_RESP psn=%d value=%d", p.PSN, p.Value)
	case p.Op.IsAtomic():
		return fmt.Sprintf("%s psn=%d", p.Op, p.PSN)
	}
	s := fmt.Sprintf("%s_%s psn=%d off=%d len=%d", p.Op, p.Seg, p.PSN, p.Off, p.Len)
	if p.AckReq {
		s += " ackreq"
	}
	return s
}

// ActionKind says what an Action asks of the owner.
type ActionKind uint8

const (
	// ActComplete: complete the oldest outstanding work request (WR) with
	// Status; for an atomic, Value is the prior value of the target word,
	// to be stored in the work request's local buffer first. A status
	// other than success is followed by ActError.
	ActComplete ActionKind = iota + 1
	// ActReadData: place the payload of the READ_RESP just stepped at
	// offset Off (Len bytes) of WR's local buffer, then call
	// Requester.Placed (after the rest of the batch: the next call reuses
	// its buffer).
	ActReadData
	// ActTimer: (re)arm the owner's one timer to call Tick at Deadline
	// (on the owner's monotonic clock); Deadline 0 disarms it.
	ActTimer
	// ActError: move the QP to ERROR and flush every outstanding work
	// request with WRFlush (Status says why, for the owner's logs).
	ActError
)

var actNames = [...]string{"?", "complete", "read-data", "timer", "error"}

func (k ActionKind) String() string {
	if int(k) < len(actNames) {
		return actNames[k]
	}
	return "?"
}

// Action is one thing an engine asks its owner to do, in order.
type Action struct {
	Kind     ActionKind
	WR       uint64
	Status   rc.Status
	Value    uint64
	Off, Len uint32
	Deadline time.Duration
}

// TimeoutDuration decodes the IB local ACK timeout: 4.096 µs × 2^t; 0 is
// infinite (returned as 0).
func TimeoutDuration(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	if t > 31 {
		t = 31
	}
	return time.Duration(4096<<t) * time.Nanosecond
}

// rnrTable is the IBTA min_rnr_timer encoding, in microseconds.
var rnrTable = [32]time.Duration{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
	122880, 163840, 245760, 327680, 491520,
}

// RNRDuration decodes the IB min_rnr_timer encoding (0 is 655.36 ms, 1 is
// 0.01 ms, ..., 31 is 491.52 ms).
func RNRDuration(t uint8) time.Duration { return rnrTable[t&31] * time.Microsecond }

// RNRInfinite is the rnr_retry value that retries forever.
const RNRInfinite = 7

// rnrRetryAllowed is the one place of the RNR retry policy: whether a
// request that already got used RNR NAKs may be retried once more under
// rnr_retry limit (7: forever).
func rnrRetryAllowed(limit uint8, used int) bool {
	return limit == RNRInfinite || used < int(limit)
}
