package ibverbs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// Address is what a peer needs to connect to one of this transport's queue
// pairs: QP.Address returns it encoded, and the peer passes those bytes back
// as AddressHandle.Dest when it moves its own QP to RTR.
//
// Layout (48 bytes, little endian unless noted):
//
//	0  magic   "RKIB"
//	4  version 1
//	5  flags   bit 0: iWARP — connect through rdma_cm to IP:CMPort
//	6  port    device port number
//	7  mtu     the port's active MTU (IB enumeration)
//	8  lid     uint16 (InfiniBand; 0 on RoCE and iWARP)
//	10 cmport  uint16, big endian: the QP's rdma_cm listener (iWARP)
//	12 qpn     uint32
//	16 gid     [16]byte: the GID the QP sends from (RoCE v2: IPv4-mapped or IPv6)
//	32 ip      [16]byte: the IP address rdma_cm listens on (iWARP), IPv4-mapped for IPv4
//
// AddressHandle.Dest may instead carry a bare 16-byte GID, and
// AddressHandle.GID a GID or an IP address (IPv4 becomes ::ffff:a.b.c.d).
type Address struct {
	IWARP  bool
	Port   uint8
	MTU    uint8
	LID    uint16
	CMPort uint16
	QPN    uint32
	GID    [16]byte
	IP     net.IP
}

// AddressLen is the length of an encoded Address.
const AddressLen = 48

var addrMagic = []byte("RKIB")

// ErrAddress reports a malformed peer address.
var ErrAddress = errors.New("ibverbs: malformed peer address (AddressHandle.Dest must be the peer QP's Address(), a 16-byte GID, or empty with AddressHandle.GID set)")

// Encode returns the 48-byte form.
func (a *Address) Encode() []byte {
	b := make([]byte, AddressLen)
	copy(b, addrMagic)
	b[4] = 1
	if a.IWARP {
		b[5] |= 1
	}
	b[6] = a.Port
	b[7] = a.MTU
	binary.LittleEndian.PutUint16(b[8:], a.LID)
	binary.BigEndian.PutUint16(b[10:], a.CMPort)
	binary.LittleEndian.PutUint32(b[12:], a.QPN)
	copy(b[16:32], a.GID[:])
	if ip := a.IP.To16(); ip != nil {
		copy(b[32:48], ip)
	}
	return b
}

// ParseAddress decodes an encoded Address.
func ParseAddress(b []byte) (Address, error) {
	if len(b) != AddressLen || !bytes.Equal(b[:4], addrMagic) {
		return Address{}, fmt.Errorf("%w (%d bytes)", ErrAddress, len(b))
	}
	if b[4] != 1 {
		return Address{}, fmt.Errorf("%w: version %d", ErrAddress, b[4])
	}
	a := Address{
		IWARP: b[5]&1 != 0, Port: b[6], MTU: b[7],
		LID:    binary.LittleEndian.Uint16(b[8:]),
		CMPort: binary.BigEndian.Uint16(b[10:]),
		QPN:    binary.LittleEndian.Uint32(b[12:]),
	}
	copy(a.GID[:], b[16:32])
	ip := make(net.IP, 16)
	copy(ip, b[32:48])
	if !ip.IsUnspecified() {
		a.IP = ip
	}
	return a, nil
}

// GIDFromIP returns the RoCE v2 GID of an IP address: IPv4 addresses are
// IPv4-mapped (::ffff:a.b.c.d), IPv6 addresses and 16-byte GIDs are taken
// as they are.
func GIDFromIP(ip net.IP) ([16]byte, bool) {
	var g [16]byte
	if len(ip) == 16 {
		copy(g[:], ip)
		return g, true
	}
	if v4 := ip.To4(); v4 != nil {
		copy(g[:], net.IPv4(v4[0], v4[1], v4[2], v4[3]).To16())
		return g, true
	}
	return g, false
}

// isV4Mapped reports whether a GID is an IPv4-mapped address.
func isV4Mapped(g [16]byte) bool {
	return bytes.Equal(g[:10], make([]byte, 10)) && g[10] == 0xff && g[11] == 0xff
}

// gidEntry is a row of a port's GID table.
type gidEntry struct {
	gid     [16]byte
	index   int
	typ     int // 0 IB/RoCE v1, 1 RoCE v1, 2 RoCE v2 (IBV_GID_TYPE_*), 0xff unknown
	ifindex int
}

const (
	gidTypeIB      = 0
	gidTypeRoCEv1  = 1
	gidTypeRoCEv2  = 2
	gidTypeUnknown = 0xff
)

// pickSGID chooses the local GID index to send from to reach dgid: for an
// IPv4-mapped destination an IPv4-mapped RoCE v2 GID (the same address if
// the destination is on this device), for an IPv6 destination a RoCE v2
// IPv6 GID (link-local for link-local), else the first entry.
func pickSGID(table []gidEntry, dgid [16]byte) (gidEntry, bool) {
	if len(table) == 0 {
		return gidEntry{}, false
	}
	v2 := func(e gidEntry) bool { return e.typ == gidTypeRoCEv2 || e.typ == gidTypeUnknown }
	var best *gidEntry
	score := -1
	dstLL := dgid[0] == 0xfe && dgid[1]&0xc0 == 0x80
	for i := range table {
		e := &table[i]
		s := 0
		if isV4Mapped(dgid) {
			if !isV4Mapped(e.gid) {
				continue
			}
			s = 1
			if v2(*e) {
				s += 2
			}
			if e.gid == dgid {
				s += 4
			} else if bytes.Equal(e.gid[12:15], dgid[12:15]) {
				s++ // same /24: likely the same subnet
			}
		} else {
			if isV4Mapped(e.gid) {
				continue
			}
			s = 1
			if v2(*e) {
				s += 2
			}
			ll := e.gid[0] == 0xfe && e.gid[1]&0xc0 == 0x80
			if ll == dstLL {
				s++
			}
			if e.gid == dgid {
				s += 4
			}
		}
		if s > score {
			score, best = s, e
		}
	}
	if best == nil {
		return table[0], true
	}
	return *best, true
}

// primaryGID is the GID a QP advertises: an IPv4-mapped RoCE v2 GID if the
// port has one (what RoCE peers and perftest -x use), else the first.
func primaryGID(table []gidEntry) (gidEntry, bool) {
	if len(table) == 0 {
		return gidEntry{}, false
	}
	for _, e := range table {
		if isV4Mapped(e.gid) && (e.typ == gidTypeRoCEv2 || e.typ == gidTypeUnknown) {
			return e, true
		}
	}
	for _, e := range table {
		if e.typ == gidTypeRoCEv2 {
			return e, true
		}
	}
	return table[0], true
}
