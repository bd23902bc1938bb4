package cm

// No goroutines: encoding and decoding of handshake and control messages,
// framed by internal/frame. readMsg and writeMsg are called by whichever
// goroutine owns the connection at the time (Dial's caller, a Listener
// handshake goroutine, a Conn's reader and heartbeat goroutines under
// Conn.wmu); nextMsg by a Conn's reader goroutine with its own
// frame.Reader.

import (
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/verbs"
)

// Limits of the wire format.
const (
	// MaxPrivateData is the most private data a connect request or an
	// accept reply carries (as for an RC connection in RDMA CM).
	MaxPrivateData = 196
	// MaxRejectReason is the longest reject reason sent; longer reasons
	// are truncated (at a UTF-8 boundary).
	MaxRejectReason = 148
	// maxAddress bounds qp.Address() bytes.
	maxAddress = 1024
	// maxName bounds transport and device names.
	maxName = 64
	// maxFrame bounds the payload of a frame, read or written. The
	// largest message, a request, is 4+1+1+maxName+1+maxName+4+4+1+4+
	// 2+maxAddress+1+MaxPrivateData = 1371 bytes.
	maxFrame = 2048

	protoMagic   = 0x524b434d // "RKCM"
	protoVersion = 2          // 2: internal/frame header (uint32 payload length, then type)
)

// Message types.
const (
	msgRequest    = 1
	msgAccept     = 2
	msgReject     = 3
	msgReady      = 4
	msgHeartbeat  = 5
	msgDisconnect = 6
	// With a shared secret (auth.go).
	msgAuthHello     = 7
	msgAuthChallenge = 8
	msgProof         = 9
)

// Sizes of the authentication fields.
const (
	nonceLen = 32
	macLen   = 32 // HMAC-SHA256
)

// msg is any message; which fields are meaningful depends on typ.
type msg struct {
	typ uint8

	// Request: version, transport, device; request and accept: qpn, psn,
	// mtu, peerTimeoutMs, addr, priv.
	version       uint8
	transport     string
	device        string
	qpn           uint32
	psn           uint32
	mtu           verbs.MTU
	peerTimeoutMs uint32
	addr          []byte
	priv          []byte

	// Reject.
	code   RejectCode
	reason string

	// AuthHello: version, nonce; AuthChallenge: nonce, mac; Proof: mac.
	nonce []byte
	mac   []byte
}

// encode returns the frame (internal/frame: header, then the payload).
func (m *msg) encode() ([]byte, error) {
	b := make([]byte, frame.HeaderLen, frame.HeaderLen+64+len(m.addr)+len(m.priv)+len(m.transport)+len(m.device)+len(m.reason))
	switch m.typ {
	case msgRequest:
		if len(m.transport) > maxName || len(m.device) > maxName {
			return nil, fmt.Errorf("%w: transport or device name over %d bytes", ErrProtocol, maxName)
		}
		b = frame.AppendUint32(b, protoMagic)
		b = append(b, m.version)
		b = frame.AppendString8(b, m.transport)
		b = frame.AppendString8(b, m.device)
		fallthrough
	case msgAccept:
		if len(m.addr) > maxAddress {
			return nil, fmt.Errorf("%w: QP address of %d bytes (max %d)", ErrProtocol, len(m.addr), maxAddress)
		}
		if len(m.priv) > MaxPrivateData {
			return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrPrivateDataTooLong, len(m.priv), MaxPrivateData)
		}
		b = frame.AppendUint32(b, m.qpn)
		b = frame.AppendUint32(b, m.psn)
		b = append(b, uint8(m.mtu))
		b = frame.AppendUint32(b, m.peerTimeoutMs)
		b = frame.AppendBytes16(b, m.addr)
		b = frame.AppendBytes8(b, m.priv)
	case msgReject:
		b = append(b, uint8(m.code))
		b = frame.AppendString8(b, truncateReason(m.reason))
	case msgAuthHello:
		b = frame.AppendUint32(b, protoMagic)
		b = append(b, m.version)
		fallthrough
	case msgAuthChallenge:
		if len(m.nonce) != nonceLen {
			return nil, fmt.Errorf("%w: nonce of %d bytes", ErrProtocol, len(m.nonce))
		}
		b = append(b, m.nonce...)
		if m.typ == msgAuthHello {
			break
		}
		fallthrough
	case msgProof:
		if len(m.mac) != macLen {
			return nil, fmt.Errorf("%w: MAC of %d bytes", ErrProtocol, len(m.mac))
		}
		b = append(b, m.mac...)
	case msgReady, msgHeartbeat, msgDisconnect:
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrProtocol, m.typ)
	}
	if n := len(b) - frame.HeaderLen; n > maxFrame {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, &frame.SizeError{Size: uint64(n), Limit: maxFrame, Type: m.typ, Write: true})
	}
	frame.PutHeader(b, m.typ, len(b)-frame.HeaderLen)
	return b, nil
}

// truncateReason cuts s to MaxRejectReason bytes at a rune boundary.
func truncateReason(s string) string {
	if len(s) <= MaxRejectReason {
		return s
	}
	s = s[:MaxRejectReason]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// clone copies b (so that a message never aliases a read buffer); empty
// is nil.
func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// decodeMsg parses the payload of a frame of type typ. It never panics;
// anything malformed is an ErrProtocol error.
func decodeMsg(typ byte, p []byte) (*msg, error) {
	d := frame.NewDecoder(p)
	m := &msg{typ: typ}
	switch m.typ {
	case msgRequest:
		if magic := d.Uint32(); d.Err() != nil || magic != protoMagic {
			return nil, fmt.Errorf("%w: not an rdmakit cm request (bad magic)", ErrProtocol)
		}
		m.version = d.Uint8()
		if d.Err() == nil && m.version != protoVersion {
			return nil, fmt.Errorf("%w: protocol version %d (this side speaks %d)", ErrProtocol, m.version, protoVersion)
		}
		m.transport = d.String8()
		m.device = d.String8()
		if len(m.transport) > maxName || len(m.device) > maxName {
			return nil, fmt.Errorf("%w: transport or device name over %d bytes", ErrProtocol, maxName)
		}
		fallthrough
	case msgAccept:
		m.qpn = d.Uint32()
		m.psn = d.Uint32()
		m.mtu = verbs.MTU(d.Uint8())
		m.peerTimeoutMs = d.Uint32()
		m.addr = clone(d.Bytes16())
		m.priv = clone(d.Bytes8())
		if d.Err() != nil {
			break
		}
		if m.mtu.Bytes() == 0 {
			return nil, fmt.Errorf("%w: invalid path MTU %d", ErrProtocol, m.mtu)
		}
		if m.psn > 0xffffff || m.qpn > 0xffffff {
			return nil, fmt.Errorf("%w: QPN %#x or PSN %#x beyond 24 bits", ErrProtocol, m.qpn, m.psn)
		}
		if m.peerTimeoutMs == 0 {
			return nil, fmt.Errorf("%w: zero peer timeout", ErrProtocol)
		}
		if len(m.addr) > maxAddress {
			return nil, fmt.Errorf("%w: QP address of %d bytes (max %d)", ErrProtocol, len(m.addr), maxAddress)
		}
		if len(m.priv) > MaxPrivateData {
			return nil, fmt.Errorf("%w: %w: %d bytes (max %d)", ErrProtocol, ErrPrivateDataTooLong, len(m.priv), MaxPrivateData)
		}
	case msgReject:
		m.code = RejectCode(d.Uint8())
		m.reason = d.String8()
		if d.Err() == nil && len(m.reason) > MaxRejectReason {
			return nil, fmt.Errorf("%w: reject reason of %d bytes (max %d)", ErrProtocol, len(m.reason), MaxRejectReason)
		}
	case msgAuthHello:
		if magic := d.Uint32(); d.Err() != nil || magic != protoMagic {
			return nil, fmt.Errorf("%w: not an rdmakit cm hello (bad magic)", ErrProtocol)
		}
		m.version = d.Uint8()
		if d.Err() == nil && m.version != protoVersion {
			return nil, fmt.Errorf("%w: protocol version %d (this side speaks %d)", ErrProtocol, m.version, protoVersion)
		}
		m.nonce = clone(d.Bytes(nonceLen))
	case msgAuthChallenge:
		m.nonce = clone(d.Bytes(nonceLen))
		m.mac = clone(d.Bytes(macLen))
	case msgProof:
		m.mac = clone(d.Bytes(macLen))
	case msgReady, msgHeartbeat, msgDisconnect:
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrProtocol, m.typ)
	}
	if err := d.Finish(); err != nil {
		return nil, fmt.Errorf("%w: message type %d: %w", ErrProtocol, m.typ, err)
	}
	return m, nil
}

// readMsg reads one message from r. The frame.Reader it uses reads
// nothing past the frame, so handshakes can call it message by message.
func readMsg(r io.Reader) (*msg, error) {
	return nextMsg(frame.NewReader(r, maxFrame))
}

// readMsgRaw is readMsg that also returns a copy of the frame's payload
// (what a proof covers).
func readMsgRaw(r io.Reader) (*msg, []byte, error) {
	m, p, err := nextMsgPayload(frame.NewReader(r, maxFrame))
	if err != nil {
		return nil, nil, err
	}
	return m, append([]byte(nil), p...), nil
}

// nextMsg reads one message from fr. A frame over maxFrame is an
// ErrProtocol error, refused before anything is allocated for it; the end
// of the stream inside a frame matches io.ErrUnexpectedEOF.
func nextMsg(fr *frame.Reader) (*msg, error) {
	m, _, err := nextMsgPayload(fr)
	return m, err
}

// nextMsgPayload is nextMsg that also returns the payload (valid until
// fr's next read).
func nextMsgPayload(fr *frame.Reader) (*msg, []byte, error) {
	typ, p, err := fr.Next()
	if err != nil {
		if errors.Is(err, frame.ErrTooLarge) {
			return nil, nil, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return nil, nil, err
	}
	m, err := decodeMsg(typ, p)
	if err != nil {
		return nil, nil, err
	}
	return m, p, nil
}

// writeMsg encodes m and writes it to w in one Write.
func writeMsg(w io.Writer, m *msg) error {
	_, err := writeMsgRaw(w, m)
	return err
}

// writeMsgRaw is writeMsg that also returns the frame's payload.
func writeMsgRaw(w io.Writer, m *msg) ([]byte, error) {
	b, err := m.encode()
	if err != nil {
		return nil, err
	}
	_, err = w.Write(b)
	return b[frame.HeaderLen:], err
}
