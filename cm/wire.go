package cm

// No goroutines: encoding and decoding of handshake and control messages.
// readMsg and writeMsg are called by whichever goroutine owns the
// connection at the time (Dial's caller, a Listener handshake goroutine, a
// Conn's reader and heartbeat goroutines under Conn.wmu).

import (
	"encoding/binary"
	"fmt"
	"io"
	"unicode/utf8"

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
	// maxFrame bounds the length field of a frame.
	maxFrame = 2048

	protoMagic   = 0x524b434d // "RKCM"
	protoVersion = 1
)

// Message types.
const (
	msgRequest    = 1
	msgAccept     = 2
	msgReject     = 3
	msgReady      = 4
	msgHeartbeat  = 5
	msgDisconnect = 6
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
}

// encode returns the frame: a big-endian uint16 length of what follows,
// the type byte, and the body.
func (m *msg) encode() ([]byte, error) {
	b := make([]byte, 2, 64+len(m.addr)+len(m.priv)+len(m.transport)+len(m.device)+len(m.reason))
	b = append(b, m.typ)
	switch m.typ {
	case msgRequest:
		if len(m.transport) > maxName || len(m.device) > maxName {
			return nil, fmt.Errorf("%w: transport or device name over %d bytes", ErrProtocol, maxName)
		}
		b = binary.BigEndian.AppendUint32(b, protoMagic)
		b = append(b, m.version)
		b = append(b, uint8(len(m.transport)))
		b = append(b, m.transport...)
		b = append(b, uint8(len(m.device)))
		b = append(b, m.device...)
		fallthrough
	case msgAccept:
		if len(m.addr) > maxAddress {
			return nil, fmt.Errorf("%w: QP address of %d bytes (max %d)", ErrProtocol, len(m.addr), maxAddress)
		}
		if len(m.priv) > MaxPrivateData {
			return nil, fmt.Errorf("%w: %d bytes (max %d)", ErrPrivateDataTooLong, len(m.priv), MaxPrivateData)
		}
		b = binary.BigEndian.AppendUint32(b, m.qpn)
		b = binary.BigEndian.AppendUint32(b, m.psn)
		b = append(b, uint8(m.mtu))
		b = binary.BigEndian.AppendUint32(b, m.peerTimeoutMs)
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.addr)))
		b = append(b, m.addr...)
		b = append(b, uint8(len(m.priv)))
		b = append(b, m.priv...)
	case msgReject:
		r := truncateReason(m.reason)
		b = append(b, uint8(m.code), uint8(len(r)))
		b = append(b, r...)
	case msgReady, msgHeartbeat, msgDisconnect:
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrProtocol, m.typ)
	}
	if len(b)-2 > maxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes", ErrProtocol, len(b)-2)
	}
	binary.BigEndian.PutUint16(b, uint16(len(b)-2))
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

// decoder reads fields off a body; the first short read sets bad.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) take(n int) []byte {
	if d.bad || n > len(d.b) {
		d.bad = true
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

// bytes copies n bytes (so a message never aliases a read buffer).
func (d *decoder) bytes(n int) []byte {
	v := d.take(n)
	if v == nil || n == 0 {
		return nil
	}
	return append([]byte(nil), v...)
}

// decodeMsg parses a frame body (type byte and fields, without the length).
// It never panics; anything malformed is an ErrProtocol error.
func decodeMsg(body []byte) (*msg, error) {
	d := &decoder{b: body}
	m := &msg{typ: d.u8()}
	if d.bad {
		return nil, fmt.Errorf("%w: empty message", ErrProtocol)
	}
	switch m.typ {
	case msgRequest:
		if magic := d.u32(); d.bad || magic != protoMagic {
			return nil, fmt.Errorf("%w: not an rdmakit cm request (bad magic)", ErrProtocol)
		}
		m.version = d.u8()
		if !d.bad && m.version != protoVersion {
			return nil, fmt.Errorf("%w: protocol version %d (this side speaks %d)", ErrProtocol, m.version, protoVersion)
		}
		m.transport = string(d.take(int(d.u8())))
		m.device = string(d.take(int(d.u8())))
		if len(m.transport) > maxName || len(m.device) > maxName {
			return nil, fmt.Errorf("%w: transport or device name over %d bytes", ErrProtocol, maxName)
		}
		fallthrough
	case msgAccept:
		m.qpn = d.u32()
		m.psn = d.u32()
		m.mtu = verbs.MTU(d.u8())
		m.peerTimeoutMs = d.u32()
		m.addr = d.bytes(int(d.u16()))
		m.priv = d.bytes(int(d.u8()))
		if d.bad {
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
		m.code = RejectCode(d.u8())
		m.reason = string(d.take(int(d.u8())))
		if !d.bad && len(m.reason) > MaxRejectReason {
			return nil, fmt.Errorf("%w: reject reason of %d bytes (max %d)", ErrProtocol, len(m.reason), MaxRejectReason)
		}
	case msgReady, msgHeartbeat, msgDisconnect:
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrProtocol, m.typ)
	}
	if d.bad {
		return nil, fmt.Errorf("%w: truncated message (type %d)", ErrProtocol, m.typ)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after message type %d", ErrProtocol, len(d.b), m.typ)
	}
	return m, nil
}

// readMsg reads one frame from r.
func readMsg(r io.Reader) (*msg, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint16(hdr[:]))
	if n == 0 || n > maxFrame {
		return nil, fmt.Errorf("%w: frame length %d", ErrProtocol, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeMsg(body)
}

// writeMsg encodes m and writes it to w.
func writeMsg(w io.Writer, m *msg) error {
	b, err := m.encode()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
