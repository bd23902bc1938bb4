// Package ibcm is the InfiniBand communication manager (CM) as RDMA CM
// peers speak it over RoCE: the CM's management datagrams (MADs) as typed
// views over 256-byte buffers with offset constants (this file), the
// RDMA CM's private-data header (cma.go), and an I/O-free state machine
// for connections in both roles, with response timeouts and retries
// (engine.go). transport/roce carries the MADs in UD packets to and from
// queue pair 1 (the GSI QP) and applies what the engine decides to RC
// queue pairs.
//
// Field positions are those of the IBTA specification, volume 1,
// chapter 12 (REQ, MRA, REJ, REP, RTU, DREQ, DREP): offsets below are
// from the start of the MAD (a 24-byte common header, then the message);
// bit fields are numbered from the most significant bit of their byte.
//
// Goroutines: none; the views are functions of their buffers and the
// engine is driven by its caller (one goroutine at a time).
package ibcm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// MAD layout.
const (
	// MADLen is the length of every CM MAD.
	MADLen = 256
	// HeaderLen is the common MAD header's length; messages follow it.
	HeaderLen = 24

	BaseVersion  = 1
	ClassCM      = 0x07 // management class: communication management
	ClassVersion = 2
	MethodSend   = 0x03

	offBaseVersion  = 0
	offClass        = 1
	offClassVersion = 2
	offMethod       = 3
	offStatus       = 4
	offTID          = 8
	offAttrID       = 16
	offAttrMod      = 20
)

// AttrID is a CM message's attribute ID: which message it is.
type AttrID uint16

// CM attribute IDs.
const (
	AttrREQ  AttrID = 0x0010
	AttrMRA  AttrID = 0x0011
	AttrREJ  AttrID = 0x0012
	AttrREP  AttrID = 0x0013
	AttrRTU  AttrID = 0x0014
	AttrDREQ AttrID = 0x0015
	AttrDREP AttrID = 0x0016
)

func (a AttrID) String() string {
	switch a {
	case AttrREQ:
		return "REQ"
	case AttrMRA:
		return "MRA"
	case AttrREJ:
		return "REJ"
	case AttrREP:
		return "REP"
	case AttrRTU:
		return "RTU"
	case AttrDREQ:
		return "DREQ"
	case AttrDREP:
		return "DREP"
	}
	return fmt.Sprintf("attribute %#04x", uint16(a))
}

// Errors of Parse, each wrapped with the detail.
var (
	ErrTruncated = errors.New("ibcm: MAD truncated")
	ErrNotCM     = errors.New("ibcm: not a CM MAD")
	ErrAttr      = errors.New("ibcm: unsupported CM message")
)

// MAD is a CM MAD: a view of MADLen bytes.
type MAD []byte

// Parse checks that b is a CM MAD this package reads (length, base and
// class version, class, method Send, one of the messages above) and
// returns the view of its first MADLen bytes (a UD payload may be padded
// past them).
func Parse(b []byte) (MAD, error) {
	if len(b) < MADLen {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrTruncated, len(b), MADLen)
	}
	m := MAD(b[:MADLen:MADLen])
	if m[offBaseVersion] != BaseVersion || m[offClass] != ClassCM || m[offClassVersion] != ClassVersion {
		return nil, fmt.Errorf("%w: base version %d, class %#02x version %d (want %d, %#02x, %d)", ErrNotCM,
			m[offBaseVersion], m[offClass], m[offClassVersion], BaseVersion, ClassCM, ClassVersion)
	}
	if m.Method() != MethodSend {
		return nil, fmt.Errorf("%w: method %#02x", ErrAttr, m.Method())
	}
	switch m.Attr() {
	case AttrREQ, AttrMRA, AttrREJ, AttrREP, AttrRTU, AttrDREQ, AttrDREP:
		return m, nil
	}
	return nil, fmt.Errorf("%w: %v", ErrAttr, m.Attr())
}

// Init clears m (MADLen bytes) and writes a CM header for attr with
// transaction ID tid.
func (m MAD) Init(attr AttrID, tid uint64) {
	clear(m[:MADLen])
	m[offBaseVersion], m[offClass], m[offClassVersion], m[offMethod] = BaseVersion, ClassCM, ClassVersion, MethodSend
	binary.BigEndian.PutUint64(m[offTID:], tid)
	binary.BigEndian.PutUint16(m[offAttrID:], uint16(attr))
}

func (m MAD) Method() uint8   { return m[offMethod] }
func (m MAD) Status() uint16  { return binary.BigEndian.Uint16(m[offStatus:]) }
func (m MAD) TID() uint64     { return binary.BigEndian.Uint64(m[offTID:]) }
func (m MAD) Attr() AttrID    { return AttrID(binary.BigEndian.Uint16(m[offAttrID:])) }
func (m MAD) AttrMod() uint32 { return binary.BigEndian.Uint32(m[offAttrMod:]) }

// Every message starts with the sender's and the receiver's comm IDs
// (an MRA's, REJ's, REP's, RTU's, DREQ's and DREP's; a REQ has only the
// first).
const (
	offLocalCommID  = HeaderLen + 0
	offRemoteCommID = HeaderLen + 4
)

// LocalCommID is the sender's communication ID.
func (m MAD) LocalCommID() uint32 { return m.u32(offLocalCommID) }

// RemoteCommID is the receiver's communication ID (0 in a REQ).
func (m MAD) RemoteCommID() uint32 {
	if m.Attr() == AttrREQ {
		return 0
	}
	return m.u32(offRemoteCommID)
}

func (m MAD) SetCommIDs(local, remote uint32) {
	m.put32(offLocalCommID, local)
	if m.Attr() != AttrREQ {
		m.put32(offRemoteCommID, remote)
	}
}

func (m MAD) u32(off int) uint32      { return binary.BigEndian.Uint32(m[off:]) }
func (m MAD) put32(off int, v uint32) { binary.BigEndian.PutUint32(m[off:], v) }
func (m MAD) u24(off int) uint32      { return m.u32(off) >> 8 }

// put24 writes the top 24 bits of the word at off, keeping its low byte.
func (m MAD) put24(off int, v uint32) {
	m.put32(off, v<<8|uint32(m[off+3]))
}

// hi returns the top n bits of byte off; lo the bits below them.
func (m MAD) hi(off, n int) uint8 { return m[off] >> (8 - n) }
func (m MAD) setHi(off, n int, v uint8) {
	mask := byte(0xff) << (8 - n)
	m[off] = m[off]&^mask | (v<<(8-n))&mask
}

// bits returns n bits of byte off starting at bit `at` (0: the most
// significant).
func (m MAD) bits(off, at, n int) uint8 { return (m[off] >> (8 - at - n)) & (1<<n - 1) }
func (m MAD) setBits(off, at, n int, v uint8) {
	sh := 8 - at - n
	mask := byte(1<<n-1) << sh
	m[off] = m[off]&^mask | (v<<sh)&mask
}

func (m MAD) gid(off int) netip.Addr { return netip.AddrFrom16([16]byte(m[off : off+16])) }

// REQ fields (IBTA table 106), as offsets into the MAD.
const (
	reqServiceID   = HeaderLen + 8
	reqCAGUID      = HeaderLen + 16
	reqQKey        = HeaderLen + 28
	reqQPN         = HeaderLen + 32 // 24 bits, then responder resources
	reqRespRes     = HeaderLen + 35
	reqInitDepth   = HeaderLen + 39
	reqByte43      = HeaderLen + 43 // remote CM response timeout (5), transport service type (2), end-to-end flow control (1)
	reqPSN         = HeaderLen + 44 // 24 bits
	reqByte47      = HeaderLen + 47 // local CM response timeout (5), retry count (3)
	reqPKey        = HeaderLen + 48
	reqByte50      = HeaderLen + 50 // path MTU (4), RDC exists (1), RNR retry count (3)
	reqByte51      = HeaderLen + 51 // max CM retries (4), SRQ (1), extended transport type (3)
	reqLocalLID    = HeaderLen + 52
	reqRemoteLID   = HeaderLen + 54
	reqLocalGID    = HeaderLen + 56
	reqRemoteGID   = HeaderLen + 72
	reqFlowLabel   = HeaderLen + 88 // 20 bits; packet rate in the low 6 bits of byte 91
	reqRate        = HeaderLen + 91
	reqTClass      = HeaderLen + 92
	reqHopLimit    = HeaderLen + 93
	reqByte94      = HeaderLen + 94 // SL (4), subnet local (1)
	reqAckTimeout  = HeaderLen + 95 // 5 bits
	reqPrivateData = HeaderLen + 140
	// ReqPrivateLen is the REQ's private data length.
	ReqPrivateLen = MADLen - reqPrivateData
)

// REQ is a connection request.
type REQ struct{ MAD }

func (r REQ) ServiceID() uint64             { return binary.BigEndian.Uint64(r.MAD[reqServiceID:]) }
func (r REQ) SetServiceID(v uint64)         { binary.BigEndian.PutUint64(r.MAD[reqServiceID:], v) }
func (r REQ) CAGUID() uint64                { return binary.BigEndian.Uint64(r.MAD[reqCAGUID:]) }
func (r REQ) SetCAGUID(v uint64)            { binary.BigEndian.PutUint64(r.MAD[reqCAGUID:], v) }
func (r REQ) QKey() uint32                  { return r.u32(reqQKey) }
func (r REQ) QPN() uint32                   { return r.u24(reqQPN) }
func (r REQ) SetQPN(v uint32)               { r.put24(reqQPN, v) }
func (r REQ) ResponderResources() uint8     { return r.MAD[reqRespRes] }
func (r REQ) SetResponderResources(v uint8) { r.MAD[reqRespRes] = v }
func (r REQ) InitiatorDepth() uint8         { return r.MAD[reqInitDepth] }
func (r REQ) SetInitiatorDepth(v uint8)     { r.MAD[reqInitDepth] = v }
func (r REQ) RemoteCMTimeout() uint8        { return r.hi(reqByte43, 5) }
func (r REQ) SetRemoteCMTimeout(v uint8)    { r.setHi(reqByte43, 5, v) }
func (r REQ) TransportType() uint8          { return r.bits(reqByte43, 5, 2) }
func (r REQ) SetTransportType(v uint8)      { r.setBits(reqByte43, 5, 2, v) }
func (r REQ) FlowControl() bool             { return r.bits(reqByte43, 7, 1) != 0 }
func (r REQ) SetFlowControl(v bool)         { r.setBits(reqByte43, 7, 1, b2u(v)) }
func (r REQ) PSN() uint32                   { return r.u24(reqPSN) }
func (r REQ) SetPSN(v uint32)               { r.put24(reqPSN, v) }
func (r REQ) LocalCMTimeout() uint8         { return r.hi(reqByte47, 5) }
func (r REQ) SetLocalCMTimeout(v uint8)     { r.setHi(reqByte47, 5, v) }
func (r REQ) RetryCount() uint8             { return r.bits(reqByte47, 5, 3) }
func (r REQ) SetRetryCount(v uint8)         { r.setBits(reqByte47, 5, 3, v) }
func (r REQ) PKey() uint16                  { return binary.BigEndian.Uint16(r.MAD[reqPKey:]) }
func (r REQ) SetPKey(v uint16)              { binary.BigEndian.PutUint16(r.MAD[reqPKey:], v) }
func (r REQ) PathMTU() uint8                { return r.hi(reqByte50, 4) }
func (r REQ) SetPathMTU(v uint8)            { r.setHi(reqByte50, 4, v) }
func (r REQ) RNRRetryCount() uint8          { return r.bits(reqByte50, 5, 3) }
func (r REQ) SetRNRRetryCount(v uint8)      { r.setBits(reqByte50, 5, 3, v) }
func (r REQ) MaxCMRetries() uint8           { return r.hi(reqByte51, 4) }
func (r REQ) SetMaxCMRetries(v uint8)       { r.setHi(reqByte51, 4, v) }
func (r REQ) SRQ() bool                     { return r.bits(reqByte51, 4, 1) != 0 }
func (r REQ) LocalLID() uint16              { return binary.BigEndian.Uint16(r.MAD[reqLocalLID:]) }
func (r REQ) SetLIDs(local, remote uint16) {
	binary.BigEndian.PutUint16(r.MAD[reqLocalLID:], local)
	binary.BigEndian.PutUint16(r.MAD[reqRemoteLID:], remote)
}
func (r REQ) RemoteLID() uint16     { return binary.BigEndian.Uint16(r.MAD[reqRemoteLID:]) }
func (r REQ) LocalGID() netip.Addr  { return r.gid(reqLocalGID) }
func (r REQ) RemoteGID() netip.Addr { return r.gid(reqRemoteGID) }
func (r REQ) SetGIDs(local, remote netip.Addr) {
	putGID(r.MAD[reqLocalGID:], local)
	putGID(r.MAD[reqRemoteGID:], remote)
}
func (r REQ) FlowLabel() uint32     { return r.u32(reqFlowLabel) >> 12 }
func (r REQ) PacketRate() uint8     { return r.MAD[reqRate] & 0x3f }
func (r REQ) SetPacketRate(v uint8) { r.MAD[reqRate] = r.MAD[reqRate]&0xc0 | v&0x3f }
func (r REQ) TrafficClass() uint8   { return r.MAD[reqTClass] }
func (r REQ) HopLimit() uint8       { return r.MAD[reqHopLimit] }
func (r REQ) SetHopLimit(v uint8)   { r.MAD[reqHopLimit] = v }
func (r REQ) SL() uint8             { return r.hi(reqByte94, 4) }
func (r REQ) SubnetLocal() bool     { return r.bits(reqByte94, 4, 1) != 0 }
func (r REQ) AckTimeout() uint8     { return r.hi(reqAckTimeout, 5) }
func (r REQ) SetAckTimeout(v uint8) { r.setHi(reqAckTimeout, 5, v) }
func (r REQ) PrivateData() []byte   { return r.MAD[reqPrivateData:MADLen] }

// REP fields (IBTA table 110).
const (
	repQKey        = HeaderLen + 8
	repQPN         = HeaderLen + 12
	repEECN        = HeaderLen + 16
	repPSN         = HeaderLen + 20
	repRespRes     = HeaderLen + 24
	repInitDepth   = HeaderLen + 25
	repByte26      = HeaderLen + 26 // target ACK delay (5), failover accepted (2), end-to-end flow control (1)
	repByte27      = HeaderLen + 27 // RNR retry count (3), SRQ (1)
	repCAGUID      = HeaderLen + 28
	repPrivateData = HeaderLen + 36
	// RepPrivateLen is the REP's private data length.
	RepPrivateLen = MADLen - repPrivateData
)

// REP is a connection reply.
type REP struct{ MAD }

func (r REP) QPN() uint32                   { return r.u24(repQPN) }
func (r REP) SetQPN(v uint32)               { r.put24(repQPN, v) }
func (r REP) PSN() uint32                   { return r.u24(repPSN) }
func (r REP) SetPSN(v uint32)               { r.put24(repPSN, v) }
func (r REP) ResponderResources() uint8     { return r.MAD[repRespRes] }
func (r REP) SetResponderResources(v uint8) { r.MAD[repRespRes] = v }
func (r REP) InitiatorDepth() uint8         { return r.MAD[repInitDepth] }
func (r REP) SetInitiatorDepth(v uint8)     { r.MAD[repInitDepth] = v }
func (r REP) TargetAckDelay() uint8         { return r.hi(repByte26, 5) }
func (r REP) SetTargetAckDelay(v uint8)     { r.setHi(repByte26, 5, v) }
func (r REP) FlowControl() bool             { return r.bits(repByte26, 7, 1) != 0 }
func (r REP) SetFlowControl(v bool)         { r.setBits(repByte26, 7, 1, b2u(v)) }
func (r REP) RNRRetryCount() uint8          { return r.hi(repByte27, 3) }
func (r REP) SetRNRRetryCount(v uint8)      { r.setHi(repByte27, 3, v) }
func (r REP) SRQ() bool                     { return r.bits(repByte27, 3, 1) != 0 }
func (r REP) SetSRQ(v bool)                 { r.setBits(repByte27, 3, 1, b2u(v)) }
func (r REP) CAGUID() uint64                { return binary.BigEndian.Uint64(r.MAD[repCAGUID:]) }
func (r REP) SetCAGUID(v uint64)            { binary.BigEndian.PutUint64(r.MAD[repCAGUID:], v) }
func (r REP) PrivateData() []byte           { return r.MAD[repPrivateData:MADLen] }

// REJ fields (IBTA table 108).
const (
	rejByte8    = HeaderLen + 8  // message rejected (2)
	rejInfoLen  = HeaderLen + 9  // rejected info length (7)
	rejReason   = HeaderLen + 10 // 16 bits
	rejARI      = HeaderLen + 12 // 72 bytes
	rejPrivate  = HeaderLen + 84
	rejARIMax   = rejPrivate - rejARI
	mraByte8    = HeaderLen + 8 // message MRAed (2)
	mraTimeout  = HeaderLen + 9 // service timeout (5)
	dreqQPN     = HeaderLen + 8 // 24 bits
	rtuPrivate  = HeaderLen + 8
	drepPrivate = HeaderLen + 8
)

// Which message an MRA or REJ answers.
const (
	MsgREQ   = 0
	MsgREP   = 1
	MsgOther = 2
)

// Reason is a REJ's reason code (IBTA table 109).
type Reason uint16

// Reject reasons used here.
const (
	RejNoQP              Reason = 1
	RejNoResources       Reason = 3
	RejTimeout           Reason = 4
	RejUnsupported       Reason = 5
	RejInvalidCommID     Reason = 6
	RejInvalidServiceID  Reason = 8
	RejInvalidTransport  Reason = 9
	RejStaleConn         Reason = 10
	RejInvalidGID        Reason = 12
	RejInvalidMTU        Reason = 26
	RejConsumerDefined   Reason = 28
	RejInvalidClassVersn Reason = 31
)

func (r Reason) String() string {
	switch r {
	case RejNoQP:
		return "no QP"
	case RejNoResources:
		return "no resources"
	case RejTimeout:
		return "timeout"
	case RejUnsupported:
		return "unsupported request"
	case RejInvalidCommID:
		return "invalid comm ID"
	case RejInvalidServiceID:
		return "invalid service ID (nobody listens on that port)"
	case RejInvalidTransport:
		return "invalid transport type"
	case RejStaleConn:
		return "stale connection"
	case RejInvalidGID:
		return "invalid GID"
	case RejInvalidMTU:
		return "invalid MTU"
	case RejConsumerDefined:
		return "rejected by the peer application"
	case RejInvalidClassVersn:
		return "invalid class version"
	}
	return fmt.Sprintf("reason %d", uint16(r))
}

// REJ is a reject.
type REJ struct{ MAD }

func (r REJ) Rejected() uint8     { return r.hi(rejByte8, 2) }
func (r REJ) SetRejected(v uint8) { r.setHi(rejByte8, 2, v) }
func (r REJ) Reason() Reason      { return Reason(binary.BigEndian.Uint16(r.MAD[rejReason:])) }
func (r REJ) SetReason(v Reason)  { binary.BigEndian.PutUint16(r.MAD[rejReason:], uint16(v)) }
func (r REJ) PrivateData() []byte { return r.MAD[rejPrivate:MADLen] }
func (r REJ) SetARI(ari []byte) int {
	n := copy(r.MAD[rejARI:rejARI+rejARIMax], ari)
	r.setHi(rejInfoLen, 7, uint8(n))
	return n
}

// ARI returns the additional rejection information (its length checked
// against the field's room).
func (r REJ) ARI() []byte {
	n := min(int(r.hi(rejInfoLen, 7)), rejARIMax)
	return r.MAD[rejARI : rejARI+n]
}

// MRA is a message receipt acknowledgement: the sender needs more time.
type MRA struct{ MAD }

func (r MRA) MRAed() uint8              { return r.hi(mraByte8, 2) }
func (r MRA) SetMRAed(v uint8)          { r.setHi(mraByte8, 2, v) }
func (r MRA) ServiceTimeout() uint8     { return r.hi(mraTimeout, 5) }
func (r MRA) SetServiceTimeout(v uint8) { r.setHi(mraTimeout, 5, v) }
func (r DREQ) RemoteQPN() uint32        { return r.u24(dreqQPN) }
func (r DREQ) SetRemoteQPN(v uint32)    { r.put24(dreqQPN, v) }

// DREQ is a disconnect request.
type DREQ struct{ MAD }

func putGID(b []byte, a netip.Addr) {
	g := a.As16() // an IPv4 address as IPv4-mapped: its RoCEv2 GID
	copy(b, g[:])
}

func b2u(v bool) uint8 {
	if v {
		return 1
	}
	return 0
}
