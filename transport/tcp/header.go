package tcp

// Wire format of the frames exchanged on a QP's connection. Every frame is a
// fixed-size header, followed for WRITE, WRITE_IMM, SEND, SEND_IMM and
// READ_RESP by Length bytes of payload. All integers are big-endian. A
// READ_RESP with flagStatus set carries an 8-byte status trailer after its
// payload (trailerLen; a uint32 rc status, then 4 zero bytes): the status
// is decided after the data is sent, so that a READ whose region is
// deregistered while its data goes out fails with a remote access error
// (the rest of its data is sent as zeros, never read from the memory).
//
// The header is used as a typed view of a byte slice (header) with offset
// constants and accessors, in the style of gVisor's pkg/tcpip/header.
//
// Goroutines: none of its own. Requests are encoded by whoever holds a
// link's output token (output.go), responses by the reader, and frames are
// parsed by the reader only.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/verbs"
)

// Header field offsets and size.
const (
	hdrOpcode   = 0  // uint8: opcode
	hdrFlags    = 1  // uint8: flag bits (flagSolicited)
	hdrSyndrome = 2  // uint8: NAK reason (syn*); 0 otherwise
	hdrRNRTimer = 3  // uint8: RNR NAK: responder's min_rnr_timer; 0 otherwise
	hdrPSN      = 4  // uint32: packet sequence number (24 bits)
	hdrLength   = 8  // uint32: message length
	hdrRKey     = 12 // uint32: remote key
	hdrRAddr    = 16 // uint64: remote address
	hdrImm      = 24 // uint32: immediate data
	hdrReserved = 28 // uint32: zero
	hdrCompare  = 32 // uint64: compare / add operand; ATOMIC_RESP: prior value
	hdrSwap     = 40 // uint64: swap operand

	// headerLen is the size of every frame header.
	headerLen = 48
)

// opcode is a frame opcode.
type opcode uint8

// Request opcodes (requester → responder).
const (
	opWrite    opcode = 1 // + payload, written at RKey/RAddr
	opWriteImm opcode = 2 // + payload; consumes a receive for Imm
	opSend     opcode = 3 // + payload, scattered into a receive
	opSendImm  opcode = 4 // + payload, with Imm
	opReadReq  opcode = 5 // Length bytes at RKey/RAddr wanted back
	opCmpSwap  opcode = 6 // Compare, Swap at RKey/RAddr (8 bytes)
	opFetchAdd opcode = 7 // Compare is the addend

	// Response opcodes (responder → requester).
	opAck        opcode = 16 // every request up to and including PSN is done
	opNak        opcode = 17 // request PSN failed (Syndrome); earlier ones are done
	opReadResp   opcode = 18 // + payload: the data of READ_REQ PSN
	opAtomicResp opcode = 19 // Compare holds the prior value of the word
)

// opNames names the opcodes there are; the others have no name. An array
// indexed by the opcode byte, not a map: parseHeader looks every frame's
// opcode up (a map's hashing was 1% of a two-rank 8-byte AllReduce's CPU).
var opNames = [256]string{
	opWrite: "WRITE", opWriteImm: "WRITE_IMM", opSend: "SEND", opSendImm: "SEND_IMM",
	opReadReq: "READ_REQ", opCmpSwap: "CMP_SWAP", opFetchAdd: "FETCH_ADD",
	opAck: "ACK", opNak: "NAK", opReadResp: "READ_RESP", opAtomicResp: "ATOMIC_RESP",
}

// known reports whether o is an opcode of the protocol.
func (o opcode) known() bool { return opNames[o] != "" }

func (o opcode) String() string {
	if o.known() {
		return opNames[o]
	}
	return fmt.Sprintf("opcode(%#x)", uint8(o))
}

// isRequest reports whether o travels from requester to responder.
func (o opcode) isRequest() bool { return o >= opWrite && o <= opFetchAdd }

// hasPayload reports whether Length bytes follow the header.
func (o opcode) hasPayload() bool {
	return (o >= opWrite && o <= opSendImm) || o == opReadResp
}

// reqOpcodes maps verbs opcodes to request opcodes.
var reqOpcodes = [...]opcode{
	verbs.OpWrite:          opWrite,
	verbs.OpWriteWithImm:   opWriteImm,
	verbs.OpSend:           opSend,
	verbs.OpSendWithImm:    opSendImm,
	verbs.OpRead:           opReadReq,
	verbs.OpCompareAndSwap: opCmpSwap,
	verbs.OpFetchAndAdd:    opFetchAdd,
}

// Flag bits.
const (
	flagSolicited uint8 = 1 << 0
	flagStatus    uint8 = 1 << 1 // READ_RESP: a status trailer follows the payload
	knownFlags          = flagSolicited | flagStatus

	trailerLen = 8
)

// NAK syndromes.
const (
	synRNR          uint8 = 1 // no receive posted: retry after RNRTimer
	synSeqErr       uint8 = 2 // PSN out of sequence (SQPSN/RQPSN mismatch)
	synRemoteAccess uint8 = 3 // rkey, access or bounds violation
	synInvalidReq   uint8 = 4 // e.g. message longer than the receive
	synRemoteOp     uint8 = 5 // responder could not complete (bad receive buffer)
	maxSyndrome           = synRemoteOp
)

// errMalformed is wrapped by every header validation error.
var errMalformed = errors.New("tcp: malformed frame")

// header is a view of a frame header (headerLen bytes).
type header []byte

func (h header) opcode() opcode   { return opcode(h[hdrOpcode]) }
func (h header) flags() uint8     { return h[hdrFlags] }
func (h header) syndrome() uint8  { return h[hdrSyndrome] }
func (h header) rnrTimer() uint8  { return h[hdrRNRTimer] }
func (h header) psn() psn         { return psn(binary.BigEndian.Uint32(h[hdrPSN:])) }
func (h header) length() uint32   { return binary.BigEndian.Uint32(h[hdrLength:]) }
func (h header) rkey() uint32     { return binary.BigEndian.Uint32(h[hdrRKey:]) }
func (h header) raddr() uint64    { return binary.BigEndian.Uint64(h[hdrRAddr:]) }
func (h header) imm() uint32      { return binary.BigEndian.Uint32(h[hdrImm:]) }
func (h header) reserved() uint32 { return binary.BigEndian.Uint32(h[hdrReserved:]) }
func (h header) compare() uint64  { return binary.BigEndian.Uint64(h[hdrCompare:]) }
func (h header) swap() uint64     { return binary.BigEndian.Uint64(h[hdrSwap:]) }

// frame holds the decoded fields of a header.
type frame struct {
	op       opcode
	flags    uint8
	syndrome uint8
	rnrTimer uint8
	psn      psn
	length   uint32
	rkey     uint32
	raddr    uint64
	imm      uint32
	compare  uint64
	swap     uint64
}

// encode writes every field of f into h.
func (h header) encode(f *frame) {
	_ = h[headerLen-1]
	h[hdrOpcode] = uint8(f.op)
	h[hdrFlags] = f.flags
	h[hdrSyndrome] = f.syndrome
	h[hdrRNRTimer] = f.rnrTimer
	be := binary.BigEndian
	be.PutUint32(h[hdrPSN:], uint32(f.psn&psnMask))
	be.PutUint32(h[hdrLength:], f.length)
	be.PutUint32(h[hdrRKey:], f.rkey)
	be.PutUint64(h[hdrRAddr:], f.raddr)
	be.PutUint32(h[hdrImm:], f.imm)
	be.PutUint32(h[hdrReserved:], 0)
	be.PutUint64(h[hdrCompare:], f.compare)
	be.PutUint64(h[hdrSwap:], f.swap)
}

// decode reads every field of h into f.
func (h header) decode(f *frame) {
	_ = h[headerLen-1]
	*f = frame{
		op: h.opcode(), flags: h.flags(), syndrome: h.syndrome(), rnrTimer: h.rnrTimer(),
		psn: h.psn(), length: h.length(), rkey: h.rkey(), raddr: h.raddr(), imm: h.imm(),
		compare: h.compare(), swap: h.swap(),
	}
}

// parseHeader validates the header at the start of b and returns a view of
// it. It rejects short input, unknown opcodes and flags, non-zero reserved
// bits, PSNs beyond 24 bits, lengths beyond verbs.MaxMsgSize, and fields that
// make no sense for the opcode (a length on an ACK, a syndrome on a
// request, an atomic of other than 8 bytes). It never panics.
func parseHeader(b []byte) (header, error) {
	if len(b) < headerLen {
		return nil, fmt.Errorf("%w: %d bytes, header is %d", errMalformed, len(b), headerLen)
	}
	h := header(b[:headerLen:headerLen])
	op := h.opcode()
	if !op.known() {
		return nil, fmt.Errorf("%w: unknown opcode %#x", errMalformed, uint8(op))
	}
	if h.flags()&^knownFlags != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", errMalformed, h.flags())
	}
	if h.reserved() != 0 {
		return nil, fmt.Errorf("%w: reserved field %#x", errMalformed, h.reserved())
	}
	if uint32(h.psn())&^psnMask != 0 {
		return nil, fmt.Errorf("%w: PSN %#x beyond 24 bits", errMalformed, uint32(h.psn()))
	}
	n := h.length()
	if uint64(n) > verbs.MaxMsgSize {
		return nil, fmt.Errorf("%w: %s of %d bytes exceeds max_msg_sz %d", errMalformed, op, n, uint64(verbs.MaxMsgSize))
	}
	syn, rnr := h.syndrome(), h.rnrTimer()
	switch op {
	case opNak:
		if syn == 0 || syn > maxSyndrome {
			return nil, fmt.Errorf("%w: NAK syndrome %d", errMalformed, syn)
		}
		if rnr > 31 || (rnr != 0 && syn != synRNR) {
			return nil, fmt.Errorf("%w: NAK RNR timer %d", errMalformed, rnr)
		}
		if n != 0 {
			return nil, fmt.Errorf("%w: NAK with length %d", errMalformed, n)
		}
		return h, nil
	case opAck, opAtomicResp:
		if n != 0 {
			return nil, fmt.Errorf("%w: %s with length %d", errMalformed, op, n)
		}
	case opCmpSwap, opFetchAdd:
		if n != 8 {
			return nil, fmt.Errorf("%w: %s of %d bytes", errMalformed, op, n)
		}
	}
	if syn != 0 || rnr != 0 {
		return nil, fmt.Errorf("%w: %s with NAK fields", errMalformed, op)
	}
	return h, nil
}

// psn is a 24-bit packet sequence number on the wire; its arithmetic is
// rcproto's.
type psn = rcproto.PSN

const psnMask = rcproto.PSNMask
