package perftest

// The perftest-wire codec (pwire_run.go): the messages of perftest
// 4.5's out-of-band Ethernet exchange (Debian 12's perftest 4.5-0.17,
// which announces itself as version "6.06"), built from the format
// definitions of perftest_parameters.h and perftest_communication.h:
//
//	version     16 bytes: the version string, NUL-padded (exchange_versions)
//	sys data    two 4-byte big-endian ints: cycle buffer, cache line size
//	            (check_sys_data, each its own exchange)
//	mtu         2 bytes: the port's MTU enum in decimal, NUL-terminated
//	            (check_mtu, for peers of version >= 5.31)
//	keys        108 bytes: KEY_PRINT_FMT_GID, NUL-terminated
//	            (ethernet_write_keys with a GID index, as on RoCE)
//	bw report   size, iters (8-byte big-endian integers), peak, average,
//	            message rate (8-byte big-endian doubles) (xchg_bw_reports,
//	            each field its own exchange, for peers of version >= 5.33)
//	done        5 bytes "done\0" after the closing handshake
//	            (ctx_close_connection)
//
// Every exchange is symmetric: the client writes first and then reads,
// the server reads first (ctx_xchg_data, ctx_hand_shake). Everything here
// is pure functions; parsePWKey never panics (FuzzParsePWKey).

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

const (
	// pwVersion is what this side announces: perftest 4.5-0.17's version.
	pwVersion = "6.06"
	// pwMarker follows the NUL of rdmakit's version message (greet).
	pwMarker = "rdmakit"
	// pwVersionLen is perftest's MAX_VERSION.
	pwVersionLen = 16
	// pwMinVersion is the oldest peer perftest 4.5-0.17 accepts
	// (check_version_compatibility).
	pwMinVersion = 5.70
	// pwKeyLen is KEY_MSG_SIZE_GID.
	pwKeyLen = 108
	// pwMTULen is the size of check_mtu's message for peers >= 5.31.
	pwMTULen = 2
	// pwCycleBuffer and pwCacheLine are this side's sys data (perftest's
	// defaults: the page size and the cache line size).
	pwCycleBuffer = 4096
	pwCacheLine   = 64
	// pwReportLen is the five fields of a bandwidth report.
	pwReportLen = 5 * 8
)

// pwDone is ctx_close_connection's final message.
var pwDone = []byte("done\x00")

// pwKey is one QP's key message (struct pingpong_dest's exchanged fields).
type pwKey struct {
	lid, outReads uint16
	qpn, psn      uint32 // 24 bits
	rkey          uint32
	vaddr         uint64
	gid           [16]byte
	srqn          uint32
}

// text is KEY_PRINT_FMT_GID:
// "%04x:%04x:%06x:%06x:%08x:%016llx:" then 16 times "%02x:" then "%08x:"
// (the last GID byte's separator and the SRQN's trailing colon included).
func (k pwKey) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x", k.lid, k.outReads, k.qpn&0xffffff, k.psn&0xffffff, k.rkey, k.vaddr)
	for _, g := range k.gid {
		fmt.Fprintf(&b, ":%02x", g)
	}
	fmt.Fprintf(&b, ":%08x:", k.srqn)
	return b.String()
}

// encode returns the 108-byte message (107 characters and a NUL).
func (k pwKey) encode() []byte {
	b := make([]byte, pwKeyLen)
	copy(b, k.text())
	return b
}

// pwKeyWidths are the hex digits of the key message's fields: LID, OUT,
// QPN, PSN, RKEY, VADDR, 16 GID bytes, SRQN.
var pwKeyWidths = []int{4, 4, 6, 6, 8, 16, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8}

// parsePWKey decodes a key message: exactly the fields of
// KEY_PRINT_FMT_GID with their widths, then NULs to the end.
func parsePWKey(b []byte) (pwKey, error) {
	if len(b) != pwKeyLen {
		return pwKey{}, malformed("perftest key message of %d bytes, want %d", len(b), pwKeyLen)
	}
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	if n == len(b) {
		return pwKey{}, malformed("perftest key message without its NUL")
	}
	for _, c := range b[n:] {
		if c != 0 {
			return pwKey{}, malformed("perftest key message: bytes after the NUL")
		}
	}
	s := string(b[:n])
	if !strings.HasSuffix(s, ":") {
		return pwKey{}, malformed("perftest key %.120q: want a trailing ':'", s)
	}
	parts := strings.Split(s[:len(s)-1], ":")
	if len(parts) != len(pwKeyWidths) {
		return pwKey{}, malformed("perftest key %.120q: %d fields, want %d", s, len(parts), len(pwKeyWidths))
	}
	var v [23]uint64
	for i, p := range parts {
		if len(p) != pwKeyWidths[i] {
			return pwKey{}, malformed("perftest key field %d %.20q: want %d hex digits", i, p, pwKeyWidths[i])
		}
		x, err := strconv.ParseUint(p, 16, 64)
		if err != nil {
			return pwKey{}, malformed("perftest key field %d %.20q: not hex", i, p)
		}
		v[i] = x
	}
	k := pwKey{lid: uint16(v[0]), outReads: uint16(v[1]), qpn: uint32(v[2]), psn: uint32(v[3]),
		rkey: uint32(v[4]), vaddr: v[5], srqn: uint32(v[22])}
	for i := range k.gid {
		k.gid[i] = byte(v[6+i])
	}
	return k, nil
}

// encodePWVersion is exchange_versions' message.
func encodePWVersion(v string) []byte {
	b := make([]byte, pwVersionLen)
	copy(b[:pwVersionLen-1], v)
	return b
}

// parsePWVersion reads the peer's version string and its numeric value
// (as perftest's atof: the leading decimal number, 0 if none).
func parsePWVersion(b []byte) (string, float64) {
	n := 0
	for n < len(b) && b[n] != 0 {
		n++
	}
	s := string(b[:n])
	end := 0
	dot := false
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' && !dot) {
		if s[end] == '.' {
			dot = true
		}
		end++
	}
	f, err := strconv.ParseFloat(strings.TrimSuffix(s[:end], "."), 64)
	if err != nil {
		return s, 0
	}
	return s, f
}

func encodePWInt(v int32) []byte {
	return binary.BigEndian.AppendUint32(nil, uint32(v))
}

func parsePWInt(b []byte) int32 { return int32(binary.BigEndian.Uint32(b)) }

// encodePWMTU is check_mtu's message: the MTU enum in decimal and a NUL.
func encodePWMTU(m int) []byte {
	b := make([]byte, pwMTULen)
	copy(b[:pwMTULen-1], strconv.Itoa(m))
	return b
}

// parsePWMTU reads check_mtu's message (strtol: the leading digits); 0
// where it holds no valid MTU enum (1..5).
func parsePWMTU(b []byte) int {
	n := 0
	for n < len(b) && b[n] >= '0' && b[n] <= '9' {
		n++
	}
	m, err := strconv.Atoi(string(b[:n]))
	if err != nil || m < 1 || m > 5 {
		return 0
	}
	return m
}

// pwReport is struct bw_report_data's exchanged fields.
type pwReport struct {
	size, iters           uint64
	peak, avg, msgRateAvg float64
}

// encode returns the five fields in the order xchg_bw_reports sends
// them, each 8 bytes big-endian.
func (r pwReport) encode() []byte {
	b := make([]byte, 0, pwReportLen)
	b = binary.BigEndian.AppendUint64(b, r.size)
	b = binary.BigEndian.AppendUint64(b, r.iters)
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.peak))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.avg))
	b = binary.BigEndian.AppendUint64(b, math.Float64bits(r.msgRateAvg))
	return b
}

func parsePWReport(b []byte) (pwReport, error) {
	if len(b) != pwReportLen {
		return pwReport{}, malformed("perftest bandwidth report of %d bytes, want %d", len(b), pwReportLen)
	}
	r := pwReport{size: binary.BigEndian.Uint64(b), iters: binary.BigEndian.Uint64(b[8:]),
		peak:       math.Float64frombits(binary.BigEndian.Uint64(b[16:])),
		avg:        math.Float64frombits(binary.BigEndian.Uint64(b[24:])),
		msgRateAvg: math.Float64frombits(binary.BigEndian.Uint64(b[32:]))}
	return r, nil
}

// pwAddrGID returns the GID and LID in a QP address of a transport that
// perftest can talk to: transport/ibverbs (its documented 48-byte layout:
// "RKIB", version 1, ..., LID at 8 little endian, GID at 16) or
// transport/roce (24 bytes: version 1, ..., the IP at 8, IPv4 mapped,
// which is the RoCEv2 GID; no LID).
func pwAddrGID(a []byte) (gid [16]byte, lid uint16, ok bool) {
	switch {
	case len(a) == 48 && string(a[:4]) == "RKIB" && a[4] == 1:
		copy(gid[:], a[16:32])
		return gid, binary.LittleEndian.Uint16(a[8:]), true
	case len(a) == 24 && a[0] == 1:
		copy(gid[:], a[8:24])
		return gid, 0, gid != [16]byte{}
	}
	return gid, 0, false
}

// With -R perftest carries its key message as the binary struct
// pingpong_dest (x86-64 layout, the integers big endian): LID, outstanding
// reads, QPN, PSN, rkey (4 bytes each), 4 bytes of padding, the virtual
// address (8), the GID (16), SRQN and GID index (4 each).
const (
	pwBinLID      = 0
	pwBinOutReads = 4
	pwBinQPN      = 8
	pwBinPSN      = 12
	pwBinRKey     = 16
	pwBinVAddr    = 24
	pwBinGID      = 32
	pwBinSRQN     = 48
	pwBinGIDIndex = 52
	// pwKeyBinLen is sizeof(struct pingpong_dest), also the size of the
	// receive perftest posts for every message of its -R exchange.
	pwKeyBinLen = 56
)

func (k pwKey) encodeBin() []byte {
	b := make([]byte, pwKeyBinLen)
	binary.BigEndian.PutUint32(b[pwBinLID:], uint32(k.lid))
	binary.BigEndian.PutUint32(b[pwBinOutReads:], uint32(k.outReads))
	binary.BigEndian.PutUint32(b[pwBinQPN:], k.qpn)
	binary.BigEndian.PutUint32(b[pwBinPSN:], k.psn)
	binary.BigEndian.PutUint32(b[pwBinRKey:], k.rkey)
	binary.BigEndian.PutUint64(b[pwBinVAddr:], k.vaddr)
	copy(b[pwBinGID:], k.gid[:])
	binary.BigEndian.PutUint32(b[pwBinSRQN:], k.srqn)
	return b
}

// parsePWKeyBin decodes the binary key message; the GID index (this
// side's business) is ignored.
func parsePWKeyBin(b []byte) (pwKey, error) {
	if len(b) != pwKeyBinLen {
		return pwKey{}, malformed("perftest -R key message of %d bytes, want %d", len(b), pwKeyBinLen)
	}
	lid, out := binary.BigEndian.Uint32(b[pwBinLID:]), binary.BigEndian.Uint32(b[pwBinOutReads:])
	qpn, psn := binary.BigEndian.Uint32(b[pwBinQPN:]), binary.BigEndian.Uint32(b[pwBinPSN:])
	if lid > 0xffff || out > 0xffff || qpn > 0xffffff {
		return pwKey{}, malformed("perftest -R key message: LID %#x, outstanding reads %d, QPN %#x out of range", lid, out, qpn)
	}
	k := pwKey{lid: uint16(lid), outReads: uint16(out), qpn: qpn, psn: psn & 0xffffff,
		rkey: binary.BigEndian.Uint32(b[pwBinRKey:]), vaddr: binary.BigEndian.Uint64(b[pwBinVAddr:]),
		srqn: binary.BigEndian.Uint32(b[pwBinSRQN:])}
	copy(k.gid[:], b[pwBinGID:pwBinGID+16])
	return k, nil
}
