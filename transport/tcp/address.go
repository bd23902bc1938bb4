package tcp

// QP addresses and connection hellos. Goroutines: none of its own; the
// link goroutine (dial side) and the context's handshake goroutine (accept
// side) encode and parse hellos.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// QP address (what QP.Address returns and a peer puts in
// AddressHandle.Dest), addrLen bytes:
//
//	0   version  uint8   addrVersion
//	1   reserved uint8   zero
//	2   port     uint16  the context's listen port
//	4   qpn      uint32  QP number
//	8   nonce    uint64  random, fixed for the QP's life
//	16  ip       [16]byte the listen IP in 16-byte form; all zeros when the
//	                      context listens on every interface (the peer then
//	                      uses AddressHandle.GID, else 127.0.0.1)
//
// All integers are big-endian.
const (
	addrLen     = 32
	addrVersion = 1
)

// qpAddr is a decoded QP address.
type qpAddr struct {
	ip    net.IP // 16 bytes; unspecified when the peer listens everywhere
	port  uint16
	qpn   uint32
	nonce uint64
}

var errBadAddress = errors.New("tcp: malformed QP address")

func (a *qpAddr) encode() []byte {
	b := make([]byte, addrLen)
	b[0] = addrVersion
	binary.BigEndian.PutUint16(b[2:], a.port)
	binary.BigEndian.PutUint32(b[4:], a.qpn)
	binary.BigEndian.PutUint64(b[8:], a.nonce)
	if ip := a.ip.To16(); ip != nil {
		copy(b[16:], ip)
	}
	return b
}

func decodeAddr(b []byte) (qpAddr, error) {
	if len(b) != addrLen {
		return qpAddr{}, fmt.Errorf("%w: %d bytes, want %d", errBadAddress, len(b), addrLen)
	}
	if b[0] != addrVersion || b[1] != 0 {
		return qpAddr{}, fmt.Errorf("%w: version %d", errBadAddress, b[0])
	}
	a := qpAddr{
		ip:    net.IP(append([]byte(nil), b[16:32]...)),
		port:  binary.BigEndian.Uint16(b[2:]),
		qpn:   binary.BigEndian.Uint32(b[4:]),
		nonce: binary.BigEndian.Uint64(b[8:]),
	}
	if a.port == 0 {
		return qpAddr{}, fmt.Errorf("%w: port 0", errBadAddress)
	}
	if a.qpn > 0xffffff {
		return qpAddr{}, fmt.Errorf("%w: QP number %#x beyond 24 bits", errBadAddress, a.qpn)
	}
	return a, nil
}

// dialIP picks the IP to reach a peer. With a GID in the address handle
// (cm and coll fill it with the address the peer's handshake came from)
// the data connection goes back there and nowhere else: an address that
// names another IP is refused, so that a request cannot make this side
// connect to a third host. Without one, the peer's listen IP, else the
// loopback address.
func dialIP(a qpAddr, gid net.IP) (net.IP, error) {
	if gid != nil && !gid.IsUnspecified() && (len(gid) == net.IPv4len || len(gid) == net.IPv6len) {
		if !a.ip.IsUnspecified() && !a.ip.Equal(gid) {
			return nil, fmt.Errorf("%w: the peer's address names %v, but its GID (where its handshake came from) is %v: refusing to connect to a third address",
				errBadAddress, a.ip, gid)
		}
		return gid, nil
	}
	if !a.ip.IsUnspecified() {
		return a.ip, nil
	}
	return net.IPv4(127, 0, 0, 1), nil
}

// Connection hello, helloLen bytes, sent by the dialing side first and
// answered by the accepting side with kind helloAccept. Big-endian:
//
//	0   magic     uint32  helloMagic
//	4   version   uint8   helloVersion
//	5   kind      uint8   helloConnect or helloAccept
//	6   reserved  uint16  zero
//	8   dstQPN    uint32  the QP the frame is for
//	12  srcQPN    uint32  the QP sending it
//	16  dstNonce  uint64  the nonce of dstQPN's address
//	24  srcNonce  uint64  the nonce of srcQPN's address
const (
	helloLen     = 32
	helloMagic   = 0x524b5443 // "RKTC"
	helloVersion = 1

	helloConnect = 1
	helloAccept  = 2
)

type hello struct {
	kind     uint8
	dstQPN   uint32
	srcQPN   uint32
	dstNonce uint64
	srcNonce uint64
}

var errBadHello = errors.New("tcp: malformed connection hello")

func (h *hello) encode(b []byte) {
	_ = b[helloLen-1]
	binary.BigEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	b[5] = h.kind
	binary.BigEndian.PutUint16(b[6:], 0)
	binary.BigEndian.PutUint32(b[8:], h.dstQPN)
	binary.BigEndian.PutUint32(b[12:], h.srcQPN)
	binary.BigEndian.PutUint64(b[16:], h.dstNonce)
	binary.BigEndian.PutUint64(b[24:], h.srcNonce)
}

func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return hello{}, fmt.Errorf("%w: %d bytes", errBadHello, len(b))
	}
	if m := binary.BigEndian.Uint32(b[0:]); m != helloMagic {
		return hello{}, fmt.Errorf("%w: magic %#x", errBadHello, m)
	}
	if b[4] != helloVersion {
		return hello{}, fmt.Errorf("%w: version %d, want %d", errBadHello, b[4], helloVersion)
	}
	h := hello{
		kind:     b[5],
		dstQPN:   binary.BigEndian.Uint32(b[8:]),
		srcQPN:   binary.BigEndian.Uint32(b[12:]),
		dstNonce: binary.BigEndian.Uint64(b[16:]),
		srcNonce: binary.BigEndian.Uint64(b[24:]),
	}
	if h.kind != helloConnect && h.kind != helloAccept {
		return hello{}, fmt.Errorf("%w: kind %d", errBadHello, h.kind)
	}
	return h, nil
}
