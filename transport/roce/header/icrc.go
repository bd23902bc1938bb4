package header

// The invariant CRC of RoCEv2.
//
// The ICRC is the CRC-32 (IEEE 802.3 polynomial) of: eight bytes of 0xff
// (the InfiniBand LRH, masked), the IP header with its variant fields set
// to ones (IPv4: type of service, TTL and header checksum; IPv6: traffic
// class, flow label and hop limit), the UDP header with its checksum set
// to ones, the BTH with its reserved byte (FECN/BECN) set to ones, then
// the rest of the transport headers, the payload and the pad bytes. It
// travels after the pad as a little-endian 32-bit number.
//
// A receiver on a UDP socket does not see the IP header, so it rebuilds
// it from what it knows: addresses and ports from the socket, lengths
// from the datagram, DF set. The one IPv4 field it cannot know is the
// identification: a sender on an unconnected socket with DF set (as this
// package's users are) sends 0, but the Linux kernel's RoCE drivers put a
// counter there. Because the CRC is linear, CheckICRC solves for the
// identification that makes the CRC match; such a packet's check is
// 16 bits weaker than a full 32-bit one (it accepts a corrupted packet
// with probability 2^-16 instead of 2^-32). IPv6 has no such field.

import (
	"encoding/binary"
	"hash/crc32"
	"math/bits"
	"net/netip"
)

// Addrs is what the ICRC covers of the IP and UDP headers.
type Addrs struct {
	Src, Dst         netip.Addr // both IPv4 (or IPv4-mapped) or both IPv6
	SrcPort, DstPort uint16
	// ID is the IPv4 identification (0 from a DF-set unconnected socket).
	ID uint16
}

const (
	ipv4Len = 20
	ipv6Len = 40
	udpLen  = 8
	// pseudoMax is the longest masked prefix: LRH, IPv6, UDP, BTH.
	pseudoMax = 8 + ipv6Len + udpLen + BTHLen
)

// lrhSeed is the CRC of the eight 0xff bytes of the masked LRH.
var lrhSeed = crc32.Update(0, crc32.IEEETable, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})

// pseudo writes the masked IP, UDP and BTH headers for a UDP payload of
// n bytes whose BTH is bth into buf and returns them, and the offset of
// the IPv4 identification in them (-1 for IPv6).
func pseudo(buf *[pseudoMax]byte, a *Addrs, bth []byte, n int) ([]byte, int) {
	b := buf[:]
	var o int
	idOff := -1
	if a.Src.Is4() || a.Src.Is4In6() {
		h := b[:ipv4Len]
		h[0] = 0x45
		h[1] = 0xff // TOS
		binary.BigEndian.PutUint16(h[2:], uint16(ipv4Len+udpLen+n))
		binary.BigEndian.PutUint16(h[4:], a.ID)
		binary.BigEndian.PutUint16(h[6:], 0x4000) // DF
		h[8] = 0xff                               // TTL
		h[9] = 17                                 // UDP
		h[10], h[11] = 0xff, 0xff                 // checksum
		s, d := a.Src.Unmap().As4(), a.Dst.Unmap().As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		o = ipv4Len
		idOff = 4
	} else {
		h := b[:ipv6Len]
		h[0], h[1], h[2], h[3] = 0x6f, 0xff, 0xff, 0xff // version, TC and flow label masked
		binary.BigEndian.PutUint16(h[4:], uint16(udpLen+n))
		h[6] = 17   // next header
		h[7] = 0xff // hop limit
		s, d := a.Src.As16(), a.Dst.As16()
		copy(h[8:], s[:])
		copy(h[24:], d[:])
		o = ipv6Len
	}
	u := b[o : o+udpLen]
	binary.BigEndian.PutUint16(u[0:], a.SrcPort)
	binary.BigEndian.PutUint16(u[2:], a.DstPort)
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen+n))
	u[6], u[7] = 0xff, 0xff
	o += udpLen
	copy(b[o:o+BTHLen], bth[:BTHLen])
	b[o+bthResv8a] = 0xff
	o += BTHLen
	return b[:o], idOff
}

// Hasher computes and checks ICRCs without allocating: it holds the
// scratch space of the masked headers (the CRC code keeps what it is
// given on the heap). One per goroutine; the zero value is ready.
type Hasher struct {
	buf    [pseudoMax]byte
	bth    [BTHLen]byte
	solver idSolver // the last length's (solver.k == 0: none yet)
	// memo holds the last two packet shapes (a message's first packet,
	// with its RETH, is longer than the rest); old is the one to replace.
	memo [2]prefixMemo
	old  int
}

// prefixMemo is the CRC register after the masked LRH, IP and UDP headers
// of the last packet shape a Hasher saw (addresses, ports, length), with
// the identification 0: a stream's packets share them, and CRC-32 is
// slow on short inputs (tens of ns for these bytes, as much as a third of
// a 4 KiB payload's). The identification's effect is added from idHi and
// idLo (the CRC is linear).
type prefixMemo struct {
	valid        bool
	v4           bool
	src, dst     netip.Addr
	sport, dport uint16
	n            int
	crc          uint32
}

// idTail is how many bytes of the IPv4 and UDP headers follow the
// identification.
const idTail = ipv4Len - 6 + udpLen

// idHi and idLo are the effects on the register of the identification's
// high and low byte followed by idTail bytes.
var idHi, idLo = func() (hi, lo [256]uint32) {
	var b [2 + idTail]byte
	zero := crc32.ChecksumIEEE(b[:])
	for v := range 256 {
		b[0], b[1] = byte(v), 0
		hi[v] = crc32.ChecksumIEEE(b[:]) ^ zero
		b[0], b[1] = 0, byte(v)
		lo[v] = crc32.ChecksumIEEE(b[:]) ^ zero
	}
	return hi, lo
}()

// prefix returns the register after the masked LRH, IP and UDP headers of
// a packet between a's addresses whose UDP payload is n bytes, then its
// masked BTH, bth.
func (h *Hasher) prefix(a *Addrs, bth []byte, n int) uint32 {
	m := &h.memo[0]
	if !m.matches(a, n) {
		m = &h.memo[1]
		if !m.matches(a, n) {
			m = &h.memo[h.old]
			aa := *a
			aa.ID = 0
			ps, idOff := pseudo(&h.buf, &aa, bth, n)
			*m = prefixMemo{valid: true, v4: idOff >= 0, src: a.Src, dst: a.Dst, sport: a.SrcPort, dport: a.DstPort, n: n,
				crc: crcUpdate(lrhSeed, ps[:len(ps)-BTHLen])}
			h.old ^= 1
		}
	}
	c := m.crc
	if m.v4 && a.ID != 0 {
		c ^= idHi[a.ID>>8] ^ idLo[a.ID&0xff]
	}
	copy(h.bth[:], bth[:BTHLen])
	h.bth[bthResv8a] = 0xff
	return crcBTH(c, &h.bth)
}

func (m *prefixMemo) matches(a *Addrs, n int) bool {
	return m.valid && m.n == n && m.sport == a.SrcPort && m.dport == a.DstPort && m.src == a.Src && m.dst == a.Dst
}

// v4 reports whether a is of IPv4 packets (with an identification).
func (h *Hasher) v4(a *Addrs) bool { return a.Src.Is4() || a.Src.Is4In6() }

// ICRC is Hasher.ICRC with a temporary Hasher.
func ICRC(a *Addrs, body []byte) uint32 { return new(Hasher).ICRC(a, body) }

// PutICRC is Hasher.PutICRC with a temporary Hasher.
func PutICRC(a *Addrs, pkt []byte) { new(Hasher).PutICRC(a, pkt) }

// CheckICRC is Hasher.CheckICRC with a temporary Hasher.
func CheckICRC(a *Addrs, pkt []byte) (id uint16, ok bool) { return new(Hasher).CheckICRC(a, pkt) }

// ICRC returns the ICRC of a packet whose UDP payload, without its ICRC,
// is body (which starts with the BTH).
func (h *Hasher) ICRC(a *Addrs, body []byte) uint32 {
	c := h.prefix(a, body, len(body)+ICRCLen)
	return crcUpdate(c, body[BTHLen:])
}

// ICRCParts is ICRC for a packet laid out in pieces: its UDP payload,
// without the ICRC, is hdr (which starts with the BTH), then the buffers
// of mid, then pad (as a sender gathers a payload from registered memory
// between headers and pad of its own).
func (h *Hasher) ICRCParts(a *Addrs, hdr []byte, mid [][]byte, pad []byte) uint32 {
	n := len(hdr) + len(pad) + ICRCLen
	for _, m := range mid {
		n += len(m)
	}
	c := h.prefix(a, hdr, n)
	c = crcUpdate(c, hdr[BTHLen:])
	for _, m := range mid {
		c = crcUpdate(c, m)
	}
	return crcUpdate(c, pad)
}

// PutICRC computes the ICRC of pkt (a whole UDP payload: the last four
// bytes are the ICRC's) and stores it there.
func (h *Hasher) PutICRC(a *Addrs, pkt []byte) {
	n := len(pkt) - ICRCLen
	binary.LittleEndian.PutUint32(pkt[n:], h.ICRC(a, pkt[:n]))
}

// CheckICRC reports whether the ICRC at the end of pkt (a whole UDP
// payload, at least BTHLen+ICRCLen bytes) is right for a packet between
// a's addresses and ports. For IPv4, a.ID is ignored: the identification
// that makes the ICRC match, if any, is returned (see the file comment).
func (h *Hasher) CheckICRC(a *Addrs, pkt []byte) (id uint16, ok bool) {
	if len(pkt) < BTHLen+ICRCLen {
		return 0, false
	}
	n := len(pkt) - ICRCLen
	want := binary.LittleEndian.Uint32(pkt[n:])
	aa := *a
	aa.ID = 0
	c := h.prefix(&aa, pkt, len(pkt))
	c = crcUpdate(c, pkt[BTHLen:n])
	if c == want {
		return 0, true
	}
	if !h.v4(a) {
		return 0, false
	}
	// The identification's bytes are followed by m more bytes.
	m := uint64(idTail + n)
	if h.solver.k == 0 || h.solver.m != m {
		h.solver.build(m)
	}
	return h.solver.solve(c ^ want)
}

// GF(2) polynomial arithmetic modulo the CRC-32 polynomial, in the
// reflected bit order of the CRC register (bit 31 is x^0).
const poly = 0xedb88320

func multmodp(a, b uint32) uint32 {
	m := uint32(1) << 31
	var p uint32
	for {
		if a&m != 0 {
			p ^= b
			if a&(m-1) == 0 {
				break
			}
		}
		m >>= 1
		if b&1 != 0 {
			b = b>>1 ^ poly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2n[k] is x^(2^k) modulo the polynomial.
var x2n = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multmodp(p, p)
	}
	return t
}()

// xpow8 returns x^(8n): the effect of n zero bytes on the CRC register.
func xpow8(n uint64) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 3; n != 0; k++ {
		if n&1 != 0 {
			p = multmodp(x2n[k&31], p)
		}
		n >>= 1
	}
	return p
}

// idEffect[i] is the CRC register after the two bytes of an
// identification with only bit i set, from a zero register.
var idEffect = func() (t [16]uint32) {
	zero := crc32.ChecksumIEEE([]byte{0, 0})
	for i := range t {
		v := uint16(1) << i
		t[i] = crc32.ChecksumIEEE([]byte{byte(v >> 8), byte(v)}) ^ zero
	}
	return t
}()

// idSolver finds the 16-bit identification whose effect on the CRC,
// followed by m bytes, is a given difference: a basis of the sixteen
// bits' effects, reduced (Gaussian elimination over GF(2)). Building one
// costs a few hundred multiplications; a Hasher keeps the last one, since
// the packets of a stream have the same length.
type idSolver struct {
	m     uint64
	k     int
	basis [16]uint32
	tag   [16]uint16
	pivot [16]uint32
}

func (s *idSolver) build(m uint64) {
	s.m, s.k = m, 0
	shift := xpow8(m)
	for i := range idEffect {
		v, t := multmodp(shift, idEffect[i]), uint16(1)<<i
		for j := 0; j < s.k; j++ {
			if v&s.pivot[j] != 0 {
				v, t = v^s.basis[j], t^s.tag[j]
			}
		}
		if v == 0 {
			continue // cannot happen: CRC-32 detects every 16-bit burst
		}
		s.basis[s.k], s.tag[s.k], s.pivot[s.k] = v, t, uint32(1)<<(bits.Len32(v)-1)
		s.k++
	}
}

func (s *idSolver) solve(d uint32) (uint16, bool) {
	var x uint16
	for j := 0; j < s.k; j++ {
		if d&s.pivot[j] != 0 {
			d, x = d^s.basis[j], x^s.tag[j]
		}
	}
	return x, d == 0
}
