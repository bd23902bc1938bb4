package ibcm

// The RDMA CM's private-data header: the first 36 bytes of a REQ's
// private data when the connection is made by IP address (rdma_cm's TCP
// port space). A listener learns from it which IP address and port the
// requester connected from and to; the listening port itself is in the
// REQ's service ID.

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

const (
	// CMAHeaderLen is the header's length.
	CMAHeaderLen = 36
	// CMAVersion is the header version.
	CMAVersion = 0x00
	// PortSpaceTCP is rdma_cm's TCP port space: service ID =
	// PortSpaceTCP<<16 | port.
	PortSpaceTCP = 0x0106

	cmaVersion = 0
	cmaIPVer   = 1 // IP version in the top 4 bits
	cmaPort    = 2
	cmaSrc     = 4
	cmaDst     = 20
)

// ServiceID is the service ID of rdma_cm's TCP port space for port.
func ServiceID(port uint16) uint64 { return PortSpaceTCP<<16 | uint64(port) }

// PortOf returns the port of a TCP-port-space service ID.
func PortOf(sid uint64) (uint16, bool) {
	return uint16(sid), sid>>16 == PortSpaceTCP
}

// CMAHeader is a view of the header.
type CMAHeader []byte

// ParseCMAHeader checks the header at the start of a REQ's private data.
func ParseCMAHeader(b []byte) (CMAHeader, error) {
	if len(b) < CMAHeaderLen {
		return nil, fmt.Errorf("%w: RDMA CM header of %d bytes", ErrTruncated, len(b))
	}
	h := CMAHeader(b[:CMAHeaderLen:CMAHeaderLen])
	if h[cmaVersion] != CMAVersion {
		return nil, fmt.Errorf("%w: RDMA CM header version %d", ErrAttr, h[cmaVersion])
	}
	if v := h.IPVersion(); v != 4 && v != 6 {
		return nil, fmt.Errorf("%w: RDMA CM header IP version %d", ErrAttr, v)
	}
	return h, nil
}

// IPVersion is 4 or 6.
func (h CMAHeader) IPVersion() int { return int(h[cmaIPVer] >> 4) }

// Port is the requester's port.
func (h CMAHeader) Port() uint16 { return binary.BigEndian.Uint16(h[cmaPort:]) }

// Src is the requester's address; Dst the listener's.
func (h CMAHeader) Src() netip.Addr { return h.addr(cmaSrc) }
func (h CMAHeader) Dst() netip.Addr { return h.addr(cmaDst) }

func (h CMAHeader) addr(off int) netip.Addr {
	if h.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(h[off+12 : off+16]))
	}
	return netip.AddrFrom16([16]byte(h[off : off+16]))
}

// Encode writes a header for a connection from src (port) to dst, both
// of one family.
func (h CMAHeader) Encode(src netip.Addr, port uint16, dst netip.Addr) {
	clear(h[:CMAHeaderLen])
	h[cmaVersion] = CMAVersion
	src, dst = src.Unmap(), dst.Unmap()
	if src.Is4() {
		h[cmaIPVer] = 4 << 4
		s, d := src.As4(), dst.As4()
		copy(h[cmaSrc+12:], s[:])
		copy(h[cmaDst+12:], d[:])
	} else {
		h[cmaIPVer] = 6 << 4
		s, d := src.As16(), dst.As16()
		copy(h[cmaSrc:], s[:])
		copy(h[cmaDst:], d[:])
	}
	binary.BigEndian.PutUint16(h[cmaPort:], port)
}
