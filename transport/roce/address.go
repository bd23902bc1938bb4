package roce

// QP addresses: what QP.Address returns and AddressHandle.Dest carries.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/rdmakit/rdmakit/transport/roce/header"
)

const (
	addrVersion = 1
	addrLen     = 24
)

// encodeAddr encodes a QP's address: version, reserved, UDP port, QP
// number, IP (16 bytes, IPv4 mapped).
func encodeAddr(ap netip.AddrPort, qpn uint32) []byte {
	b := make([]byte, addrLen)
	b[0] = addrVersion
	binary.BigEndian.PutUint16(b[2:], ap.Port())
	binary.BigEndian.PutUint32(b[4:], qpn)
	ip := ap.Addr().As16()
	copy(b[8:], ip[:])
	return b
}

var errAddr = errors.New("not a roce QP address")

func decodeAddr(b []byte) (netip.AddrPort, uint32, error) {
	if len(b) != addrLen || b[0] != addrVersion {
		return netip.AddrPort{}, 0, fmt.Errorf("%w (%d bytes)", errAddr, len(b))
	}
	port := binary.BigEndian.Uint16(b[2:])
	qpn := binary.BigEndian.Uint32(b[4:])
	ip := netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	if port == 0 || qpn > 0xffffff || !ip.IsValid() || ip.IsUnspecified() {
		return netip.AddrPort{}, 0, fmt.Errorf("%w: %s:%d QP %#x", errAddr, ip, port, qpn)
	}
	return netip.AddrPortFrom(ip, port), qpn, nil
}

// peerFromGID is the peer of a QP given only a GID (a RoCEv2 peer that
// is not rdmakit: the kernel's rxe, a RoCE NIC): UDP port 4791.
func peerFromGID(gid net.IP) (netip.AddrPort, error) {
	a, ok := netip.AddrFromSlice(gid)
	if !ok || a.Unmap().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("no AddressHandle.Dest and no usable AddressHandle.GID (%v)", gid)
	}
	return netip.AddrPortFrom(a.Unmap(), header.UDPPort), nil
}
