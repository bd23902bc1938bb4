// Package header is the RoCEv2 wire format: the InfiniBand transport
// headers that travel in a UDP datagram to port 4791 (BTH, RETH, AETH,
// AtomicETH, AtomicAckETH, ImmDt, IETH, DETH), the opcodes of the
// reliable connected and unreliable datagram services, padding, and the
// invariant CRC (ICRC) as RoCEv2 defines it over the masked IP, UDP and
// BTH fields (icrc.go).
//
// Headers are typed views over byte slices with offset constants and
// accessors: a view never copies and never allocates. Parse checks every
// length once, so the views of a parsed Packet cannot go out of range.
//
// Goroutines: none; everything here is a function of its arguments.
package header

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// UDPPort is the RoCEv2 UDP destination port.
const UDPPort = 4791

// Header lengths in bytes.
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	DETHLen         = 8
	ICRCLen         = 4
	// CNPReservedLen is the reserved block after the BTH of a congestion
	// notification packet.
	CNPReservedLen = 16
)

// DefaultPKey is the default partition key (full membership).
const DefaultPKey = 0xffff

// The general services interface (GSI) queue pair, which carries
// management datagrams (the communication manager's among them) as UD
// packets, and the Q_Key they carry.
const (
	GSIQP   = 1
	GSIQKey = 0x80010000
)

// Opcode is the BTH opcode: the transport service in the top three bits,
// the operation in the rest.
type Opcode uint8

// Opcodes of the reliable connected (RC) and unreliable datagram (UD)
// services, and the RoCEv2 congestion notification packet.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0a
	RCWriteOnlyImm       Opcode = 0x0b
	RCReadRequest        Opcode = 0x0c
	RCReadResponseFirst  Opcode = 0x0d
	RCReadResponseMiddle Opcode = 0x0e
	RCReadResponseLast   Opcode = 0x0f
	RCReadResponseOnly   Opcode = 0x10
	RCAcknowledge        Opcode = 0x11
	RCAtomicAcknowledge  Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInvalidate Opcode = 0x16
	RCSendOnlyInvalidate Opcode = 0x17
	UDSendOnly           Opcode = 0x64
	UDSendOnlyImm        Opcode = 0x65
	CNP                  Opcode = 0x81
)

// Which headers follow the BTH, in wire order.
type layout uint16

const (
	hasDETH layout = 1 << iota
	hasRETH
	hasAtomicETH
	hasAETH
	hasAtomicAckETH
	hasImmDt
	hasIETH
	hasPayload // data may follow the headers
	hasCNP     // the 16 reserved bytes of a CNP
	known
)

type opInfo struct {
	name   string
	layout layout
}

var ops = [256]opInfo{
	RCSendFirst:          {"RC_SEND_FIRST", hasPayload},
	RCSendMiddle:         {"RC_SEND_MIDDLE", hasPayload},
	RCSendLast:           {"RC_SEND_LAST", hasPayload},
	RCSendLastImm:        {"RC_SEND_LAST_WITH_IMMEDIATE", hasImmDt | hasPayload},
	RCSendOnly:           {"RC_SEND_ONLY", hasPayload},
	RCSendOnlyImm:        {"RC_SEND_ONLY_WITH_IMMEDIATE", hasImmDt | hasPayload},
	RCWriteFirst:         {"RC_RDMA_WRITE_FIRST", hasRETH | hasPayload},
	RCWriteMiddle:        {"RC_RDMA_WRITE_MIDDLE", hasPayload},
	RCWriteLast:          {"RC_RDMA_WRITE_LAST", hasPayload},
	RCWriteLastImm:       {"RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", hasImmDt | hasPayload},
	RCWriteOnly:          {"RC_RDMA_WRITE_ONLY", hasRETH | hasPayload},
	RCWriteOnlyImm:       {"RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", hasRETH | hasImmDt | hasPayload},
	RCReadRequest:        {"RC_RDMA_READ_REQUEST", hasRETH},
	RCReadResponseFirst:  {"RC_RDMA_READ_RESPONSE_FIRST", hasAETH | hasPayload},
	RCReadResponseMiddle: {"RC_RDMA_READ_RESPONSE_MIDDLE", hasPayload},
	RCReadResponseLast:   {"RC_RDMA_READ_RESPONSE_LAST", hasAETH | hasPayload},
	RCReadResponseOnly:   {"RC_RDMA_READ_RESPONSE_ONLY", hasAETH | hasPayload},
	RCAcknowledge:        {"RC_ACKNOWLEDGE", hasAETH},
	RCAtomicAcknowledge:  {"RC_ATOMIC_ACKNOWLEDGE", hasAETH | hasAtomicAckETH},
	RCCompareSwap:        {"RC_COMPARE_SWAP", hasAtomicETH},
	RCFetchAdd:           {"RC_FETCH_ADD", hasAtomicETH},
	RCSendLastInvalidate: {"RC_SEND_LAST_WITH_INVALIDATE", hasIETH | hasPayload},
	RCSendOnlyInvalidate: {"RC_SEND_ONLY_WITH_INVALIDATE", hasIETH | hasPayload},
	UDSendOnly:           {"UD_SEND_ONLY", hasDETH | hasPayload},
	UDSendOnlyImm:        {"UD_SEND_ONLY_WITH_IMMEDIATE", hasDETH | hasImmDt | hasPayload},
	CNP:                  {"CNP", hasCNP},
}

func init() {
	for i := range ops {
		if ops[i].name != "" {
			ops[i].layout |= known
		}
	}
}

func (o Opcode) String() string {
	if ops[o].name != "" {
		return ops[o].name
	}
	return fmt.Sprintf("Opcode(%#x)", uint8(o))
}

// Known reports whether o is an opcode this package parses.
func (o Opcode) Known() bool { return ops[o].layout&known != 0 }

// HasPayload reports whether packets with opcode o may carry data.
func (o Opcode) HasPayload() bool { return ops[o].layout&hasPayload != 0 }

// HasRETH, HasImmDt, HasAETH, ... report which headers follow the BTH.
func (o Opcode) HasRETH() bool { return ops[o].layout&hasRETH != 0 }

// HasImmDt reports whether an ImmDt header follows.
func (o Opcode) HasImmDt() bool { return ops[o].layout&hasImmDt != 0 }

// HasAETH reports whether an AETH follows.
func (o Opcode) HasAETH() bool { return ops[o].layout&hasAETH != 0 }

// HeadersLen is the length of the BTH and the headers that follow it for
// opcode o (0 for an unknown opcode).
func (o Opcode) HeadersLen() int {
	l := ops[o].layout
	if l&known == 0 {
		return 0
	}
	n := BTHLen
	if l&hasDETH != 0 {
		n += DETHLen
	}
	if l&hasRETH != 0 {
		n += RETHLen
	}
	if l&hasAtomicETH != 0 {
		n += AtomicETHLen
	}
	if l&hasAETH != 0 {
		n += AETHLen
	}
	if l&hasAtomicAckETH != 0 {
		n += AtomicAckETHLen
	}
	if l&hasImmDt != 0 {
		n += ImmDtLen
	}
	if l&hasIETH != 0 {
		n += IETHLen
	}
	if l&hasCNP != 0 {
		n += CNPReservedLen
	}
	return n
}

// BTH is the base transport header.
type BTH []byte

// BTH field offsets and bits.
const (
	bthOpcode = 0
	bthFlags  = 1 // SE(0x80) M(0x40) PadCnt(0x30) TVer(0x0f)
	bthPKey   = 2
	bthResv8a = 4 // FECN(0x80) BECN(0x40) in InfiniBand; masked from the ICRC
	bthDestQP = 5
	bthAckReq = 8 // AckReq(0x80)
	bthPSN    = 9

	flagSE     = 0x80
	flagMig    = 0x40
	padShift   = 4
	flagAckReq = 0x80
	flagFECN   = 0x80
	flagBECN   = 0x40
)

// Opcode returns the opcode.
func (b BTH) Opcode() Opcode { return Opcode(b[bthOpcode]) }

// Solicited returns the solicited event bit.
func (b BTH) Solicited() bool { return b[bthFlags]&flagSE != 0 }

// MigReq returns the migration request bit.
func (b BTH) MigReq() bool { return b[bthFlags]&flagMig != 0 }

// PadCount returns the pad count (0..3).
func (b BTH) PadCount() int { return int(b[bthFlags]>>padShift) & 3 }

// TVer returns the transport header version (0).
func (b BTH) TVer() uint8 { return b[bthFlags] & 0x0f }

// PKey returns the partition key.
func (b BTH) PKey() uint16 { return binary.BigEndian.Uint16(b[bthPKey:]) }

// BECN returns the backward explicit congestion notification bit.
func (b BTH) BECN() bool { return b[bthResv8a]&flagBECN != 0 }

// DestQP returns the 24-bit destination queue pair number.
func (b BTH) DestQP() uint32 { return binary.BigEndian.Uint32(b[bthResv8a:]) & 0xffffff }

// AckReq returns the acknowledge request bit.
func (b BTH) AckReq() bool { return b[bthAckReq]&flagAckReq != 0 }

// PSN returns the 24-bit packet sequence number.
func (b BTH) PSN() uint32 { return binary.BigEndian.Uint32(b[bthAckReq:]) & 0xffffff }

// BTHFields are the fields of a BTH to encode.
type BTHFields struct {
	Opcode    Opcode
	Solicited bool
	MigReq    bool
	PadCount  int
	PKey      uint16
	BECN      bool
	DestQP    uint32
	AckReq    bool
	PSN       uint32
}

// Encode writes f into b.
func (b BTH) Encode(f *BTHFields) {
	b[bthOpcode] = byte(f.Opcode)
	fl := byte(f.PadCount&3) << padShift
	if f.Solicited {
		fl |= flagSE
	}
	if f.MigReq {
		fl |= flagMig
	}
	b[bthFlags] = fl
	binary.BigEndian.PutUint16(b[bthPKey:], f.PKey)
	binary.BigEndian.PutUint32(b[bthResv8a:], f.DestQP&0xffffff)
	if f.BECN {
		b[bthResv8a] |= flagBECN
	}
	binary.BigEndian.PutUint32(b[bthAckReq:], f.PSN&0xffffff)
	if f.AckReq {
		b[bthAckReq] |= flagAckReq
	}
}

// RETH is the RDMA extended transport header.
type RETH []byte

const (
	rethVA     = 0
	rethRKey   = 8
	rethDMALen = 12
)

// VA returns the remote virtual address.
func (r RETH) VA() uint64 { return binary.BigEndian.Uint64(r[rethVA:]) }

// RKey returns the remote key.
func (r RETH) RKey() uint32 { return binary.BigEndian.Uint32(r[rethRKey:]) }

// DMALen returns the length of the whole transfer.
func (r RETH) DMALen() uint32 { return binary.BigEndian.Uint32(r[rethDMALen:]) }

// Encode writes the fields.
func (r RETH) Encode(va uint64, rkey, dmaLen uint32) {
	binary.BigEndian.PutUint64(r[rethVA:], va)
	binary.BigEndian.PutUint32(r[rethRKey:], rkey)
	binary.BigEndian.PutUint32(r[rethDMALen:], dmaLen)
}

// AETH is the ACK extended transport header: a syndrome and the
// responder's message sequence number.
type AETH []byte

// Syndrome kinds (the top bits of the AETH syndrome).
const (
	SynACK    = 0x00
	SynRNRNAK = 0x20
	SynNAK    = 0x60
	synKind   = 0x60
	synValue  = 0x1f
)

// NAK codes (the low five bits of a NAK syndrome).
const (
	NAKSeqErr       = 0
	NAKInvalidReq   = 1
	NAKRemoteAccess = 2
	NAKRemoteOp     = 3
	NAKInvalidRDReq = 4
)

// CreditsUnlimited is the credit count of an ACK from a responder that
// does not do end-to-end flow control.
const CreditsUnlimited = 0x1f

// Syndrome returns the raw syndrome byte.
func (a AETH) Syndrome() uint8 { return a[0] }

// Kind returns SynACK, SynRNRNAK or SynNAK (or 0x40, reserved).
func (a AETH) Kind() uint8 { return a[0] & synKind }

// Value returns the low five bits: credits, RNR timer, or NAK code.
func (a AETH) Value() uint8 { return a[0] & synValue }

// MSN returns the 24-bit message sequence number.
func (a AETH) MSN() uint32 { return binary.BigEndian.Uint32(a) & 0xffffff }

// Encode writes a syndrome and an MSN.
func (a AETH) Encode(syndrome uint8, msn uint32) {
	binary.BigEndian.PutUint32(a, msn&0xffffff)
	a[0] = syndrome
}

// AtomicETH is the atomic extended transport header.
type AtomicETH []byte

const (
	atomVA      = 0
	atomRKey    = 8
	atomSwapAdd = 12
	atomCompare = 20
)

// VA returns the remote address of the 8-byte word.
func (a AtomicETH) VA() uint64 { return binary.BigEndian.Uint64(a[atomVA:]) }

// RKey returns the remote key.
func (a AtomicETH) RKey() uint32 { return binary.BigEndian.Uint32(a[atomRKey:]) }

// SwapAdd returns the swap value (compare-swap) or the addend (fetch-add).
func (a AtomicETH) SwapAdd() uint64 { return binary.BigEndian.Uint64(a[atomSwapAdd:]) }

// Compare returns the compare value (compare-swap).
func (a AtomicETH) Compare() uint64 { return binary.BigEndian.Uint64(a[atomCompare:]) }

// Encode writes the fields.
func (a AtomicETH) Encode(va uint64, rkey uint32, swapAdd, compare uint64) {
	binary.BigEndian.PutUint64(a[atomVA:], va)
	binary.BigEndian.PutUint32(a[atomRKey:], rkey)
	binary.BigEndian.PutUint64(a[atomSwapAdd:], swapAdd)
	binary.BigEndian.PutUint64(a[atomCompare:], compare)
}

// AtomicAckETH carries the original value of an atomic's target word.
type AtomicAckETH []byte

// Orig returns the original value.
func (a AtomicAckETH) Orig() uint64 { return binary.BigEndian.Uint64(a) }

// Encode writes the original value.
func (a AtomicAckETH) Encode(v uint64) { binary.BigEndian.PutUint64(a, v) }

// ImmDt is the immediate data header.
type ImmDt []byte

// Imm returns the immediate data as the sender's verbs gave it: the four
// bytes in wire order read as a big-endian number.
func (i ImmDt) Imm() uint32 { return binary.BigEndian.Uint32(i) }

// Encode writes the immediate data.
func (i ImmDt) Encode(v uint32) { binary.BigEndian.PutUint32(i, v) }

// IETH is the invalidate extended transport header (an rkey).
type IETH []byte

// RKey returns the key to invalidate.
func (i IETH) RKey() uint32 { return binary.BigEndian.Uint32(i) }

// Encode writes the key.
func (i IETH) Encode(rkey uint32) { binary.BigEndian.PutUint32(i, rkey) }

// DETH is the datagram extended transport header.
type DETH []byte

// QKey returns the queue key.
func (d DETH) QKey() uint32 { return binary.BigEndian.Uint32(d) }

// SrcQP returns the 24-bit source queue pair number.
func (d DETH) SrcQP() uint32 { return binary.BigEndian.Uint32(d[4:]) & 0xffffff }

// Encode writes the fields.
func (d DETH) Encode(qkey, srcQP uint32) {
	binary.BigEndian.PutUint32(d, qkey)
	binary.BigEndian.PutUint32(d[4:], srcQP&0xffffff)
}

// Errors of Parse; each is wrapped with the detail.
var (
	ErrTruncated = errors.New("roce header: packet truncated")
	ErrOpcode    = errors.New("roce header: unknown opcode")
	ErrMalformed = errors.New("roce header: malformed packet")
)

// Packet is a parsed RoCEv2 UDP payload: views into the buffer it was
// parsed from. Views absent for the opcode are nil.
type Packet struct {
	BTH          BTH
	DETH         DETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	// Payload is the data, without padding.
	Payload []byte
	// ICRC is the four ICRC bytes at the end.
	ICRC []byte
	// Body is everything the ICRC covers after the pseudo header: the
	// whole UDP payload but the ICRC.
	Body []byte
}

// Opcode returns the packet's opcode.
func (p *Packet) Opcode() Opcode { return p.BTH.Opcode() }

// Parse parses a UDP payload b. It checks the opcode, the transport
// version, the lengths of every header, the pad count, and that a packet
// without payload has none; not the ICRC (see CheckICRC).
func Parse(p *Packet, b []byte) error {
	*p = Packet{}
	if len(b) < BTHLen+ICRCLen {
		return fmt.Errorf("%w: %d bytes", ErrTruncated, len(b))
	}
	bth := BTH(b[:BTHLen])
	op := bth.Opcode()
	l := ops[op].layout
	if l&known == 0 {
		return fmt.Errorf("%w: %#x", ErrOpcode, uint8(op))
	}
	if bth.TVer() != 0 {
		return fmt.Errorf("%w: transport version %d", ErrMalformed, bth.TVer())
	}
	hl := op.HeadersLen()
	if len(b) < hl+ICRCLen {
		return fmt.Errorf("%w: %s needs %d bytes, have %d", ErrTruncated, op, hl+ICRCLen, len(b))
	}
	p.BTH = bth
	off := p.views(b, l)
	end := len(b) - ICRCLen
	rest := end - off
	pad := bth.PadCount()
	if l&hasPayload == 0 {
		if rest != 0 || pad != 0 {
			return fmt.Errorf("%w: %s with %d bytes of payload and pad %d", ErrMalformed, op, rest, pad)
		}
	} else {
		if rest%4 != 0 {
			return fmt.Errorf("%w: payload and pad of %d bytes, not a multiple of 4", ErrMalformed, rest)
		}
		if pad > rest {
			return fmt.Errorf("%w: pad %d beyond %d bytes of payload", ErrMalformed, pad, rest)
		}
		p.Payload = b[off : end-pad : end-pad]
	}
	p.Body = b[:end:end]
	p.ICRC = b[end:len(b):len(b)]
	return nil
}

// PadCount is the padding a payload of n bytes needs.
func PadCount(n int) int { return -n & 3 }

// Len returns the UDP payload length of a packet with opcode op and n
// bytes of data: headers, data, pad and ICRC.
func Len(op Opcode, n int) int { return op.HeadersLen() + n + PadCount(n) + ICRCLen }

// Build lays out a packet with opcode op and n bytes of data in buf
// (at least Len(op, n) bytes) and points p's views at it: the caller
// fills the BTH fields (its opcode and pad count are set already; Encode
// overwrites them, so set BTHFields.PadCount to PadCount(n)), the other
// headers and p.Payload, then calls PutICRC(addrs, buf[:Len(op, n)]).
// The pad bytes are zeroed.
func Build(p *Packet, buf []byte, op Opcode, n int) int {
	*p = Packet{}
	l := ops[op].layout
	total := Len(op, n)
	b := buf[:total:total]
	p.BTH = BTH(b[:BTHLen])
	b[bthOpcode] = byte(op)
	b[bthFlags] = byte(PadCount(n)) << padShift
	off := p.views(b, l)
	if l&hasCNP != 0 {
		clear(b[off-CNPReservedLen : off])
	}
	p.Payload = b[off : off+n : off+n]
	clear(b[off+n : total-ICRCLen])
	p.Body = b[: total-ICRCLen : total-ICRCLen]
	p.ICRC = b[total-ICRCLen:]
	return total
}

// views points p's extension headers into b, after the BTH and in wire
// order, as layout l has them, and returns where they end (a CNP's
// reserved bytes included). b holds at least l's headers.
func (p *Packet) views(b []byte, l layout) int {
	off := BTHLen
	take := func(n int) []byte {
		v := b[off : off+n : off+n]
		off += n
		return v
	}
	if l&hasDETH != 0 {
		p.DETH = DETH(take(DETHLen))
	}
	if l&hasRETH != 0 {
		p.RETH = RETH(take(RETHLen))
	}
	if l&hasAtomicETH != 0 {
		p.AtomicETH = AtomicETH(take(AtomicETHLen))
	}
	if l&hasAETH != 0 {
		p.AETH = AETH(take(AETHLen))
	}
	if l&hasAtomicAckETH != 0 {
		p.AtomicAckETH = AtomicAckETH(take(AtomicAckETHLen))
	}
	if l&hasImmDt != 0 {
		p.ImmDt = ImmDt(take(ImmDtLen))
	}
	if l&hasIETH != 0 {
		p.IETH = IETH(take(IETHLen))
	}
	if l&hasCNP != 0 {
		off += CNPReservedLen
	}
	return off
}
