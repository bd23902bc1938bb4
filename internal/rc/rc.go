// Package rc holds the reliable-connected semantics that every rdmakit
// transport shares: the layout of a queue pair's control block in its
// context's arena, the encodings of receive work requests and completions in
// shared rings, and the responder-side checks (rkey, protection domain,
// access flags, bounds, receive-buffer length) that decide each operation's
// status.
//
// A Target is a view of one queue pair's responder state, built over an
// arena: the local one (transport/tcp runs the responder in its progress
// goroutine) or a peer's, mapped into this process (transport/shm runs the
// responder in the initiator, which is what makes its one-sided operations
// one-sided). The checks are therefore written once.
//
// Nothing here blocks or allocates. A Target may be used from any goroutine;
// concurrent use is safe because every shared word is accessed atomically.
package rc

import (
	"encoding/binary"
	"errors"

	"github.com/rdmakit/rdmakit/internal/keytab"
	"github.com/rdmakit/rdmakit/internal/ring"
	"github.com/rdmakit/rdmakit/internal/sys"
)

// Status values mirror ibv_wc_status; verbs.Status converts them.
type Status uint32

// Status codes (numeric values as in ibv_wc_status).
const (
	Success          Status = 0
	LocalLength      Status = 1
	LocalQPOperation Status = 2
	LocalProtection  Status = 4
	WRFlush          Status = 5
	BadResponse      Status = 7
	LocalAccess      Status = 8
	RemoteInvalidReq Status = 9
	RemoteAccess     Status = 10
	RemoteOperation  Status = 11
	RetryExceeded    Status = 12
	RNRRetryExceeded Status = 13
	RemoteAbort      Status = 16
	Fatal            Status = 19
	ResponseTimeout  Status = 20
	General          Status = 21
	// RNR is internal to transports: no receive is posted, retry later.
	RNR Status = 0x100
)

// Access bits (numeric values as in ibv_access_flags).
const (
	AccessLocalWrite   uint32 = 1
	AccessRemoteWrite  uint32 = 2
	AccessRemoteRead   uint32 = 4
	AccessRemoteAtomic uint32 = 8
)

// QP states (numeric values as in ibv_qp_state).
const (
	StateReset uint32 = 0
	StateInit  uint32 = 1
	StateRTR   uint32 = 2
	StateRTS   uint32 = 3
	StateSQD   uint32 = 4
	StateSQE   uint32 = 5
	StateError uint32 = 6
)

// Control block layout (QCBSize bytes, in the owner's arena).
const (
	QCBSize  = 128
	qcbMagic = 0x51434231 // "QCB1"
	qMagic   = 0
	qState   = 4
	qQPN     = 8
	qAccess  = 12
	qMinRNR  = 16
	qPD      = 20
	qRQOff   = 24
	qRQLen   = 32
	qCQOff   = 40
	qCQLen   = 48
	qKeysOff = 56
	qKeysLen = 64
	qDestQPN = 72
	qRecvSGE = 76
	qFlags   = 80
)

// Control block flags.
const qfSRQ uint32 = 1 // receives come from a shared receive queue

// QCB is the owner's handle on a control block.
type QCB struct{ b []byte }

// Layout describes where a queue pair's shared structures are in the arena.
type Layout struct {
	QPN, PD, MaxRecvSGE uint32
	SRQ                 bool   // RQOff/RQLen name a shared receive queue
	RQOff, RQLen        uint64 // the QP's receive queue or its SRQ
	CQOff, CQLen        uint64 // receive completion queue
	KeysOff, KeysLen    uint64 // the context's key table
}

// InitQCB lays out a control block in b (QCBSize bytes) in state RESET.
func InitQCB(b []byte, l Layout) QCB {
	sys.Store32(b, qState, StateReset)
	sys.Store32(b, qQPN, l.QPN)
	sys.Store32(b, qPD, l.PD)
	sys.Store32(b, qRecvSGE, l.MaxRecvSGE)
	if l.SRQ {
		sys.Store32(b, qFlags, qfSRQ)
	} else {
		sys.Store32(b, qFlags, 0)
	}
	sys.Store64(b, qRQOff, l.RQOff)
	sys.Store64(b, qRQLen, l.RQLen)
	sys.Store64(b, qCQOff, l.CQOff)
	sys.Store64(b, qCQLen, l.CQLen)
	sys.Store64(b, qKeysOff, l.KeysOff)
	sys.Store64(b, qKeysLen, l.KeysLen)
	sys.Store32(b, qMagic, qcbMagic)
	return QCB{b: b[:QCBSize]}
}

// SetState records the QP state for responders.
func (q QCB) SetState(s uint32) { sys.Store32(q.b, qState, s) }

// State returns the recorded QP state.
func (q QCB) State() uint32 { return sys.Load32(q.b, qState) }

// SetAccess records the QP's remote access flags.
func (q QCB) SetAccess(a uint32) { sys.Store32(q.b, qAccess, a) }

// SetMinRNR records the responder's min_rnr_timer (IB encoding).
func (q QCB) SetMinRNR(t uint8) { sys.Store32(q.b, qMinRNR, uint32(t)) }

// SetDestQPN records the connected peer's QP number.
func (q QCB) SetDestQPN(n uint32) { sys.Store32(q.b, qDestQPN, n) }

// ErrBadQCB means a control block could not be attached.
var ErrBadQCB = errors.New("rc: invalid queue pair control block")

// Target is a responder view of a queue pair.
type Target struct {
	arena []byte
	qcb   []byte
	keys  keytab.Table
	rq    ring.Ring
	cq    ring.Ring
	qpn   uint32
	pd    uint32
	// Ext resolves regions outside the arena (registered caller memory);
	// nil in peers, which cannot reach such memory.
	Ext func(index uint32) []byte
}

// Attach builds a Target for the control block at qcbOff in arena.
func Attach(arena []byte, qcbOff uint64) (*Target, error) {
	if qcbOff+QCBSize > uint64(len(arena)) {
		return nil, ErrBadQCB
	}
	q := arena[qcbOff : qcbOff+QCBSize]
	if sys.Load32(q, qMagic) != qcbMagic {
		return nil, ErrBadQCB
	}
	sub := func(off, n uint64) ([]byte, error) {
		if off+n > uint64(len(arena)) || off+n < off {
			return nil, ErrBadQCB
		}
		return arena[off : off+n], nil
	}
	t := &Target{arena: arena, qcb: q, qpn: sys.Load32(q, qQPN), pd: sys.Load32(q, qPD)}
	kb, err := sub(sys.Load64(q, qKeysOff), sys.Load64(q, qKeysLen))
	if err != nil {
		return nil, err
	}
	if t.keys, err = keytab.Attach(kb); err != nil {
		return nil, err
	}
	rb, err := sub(sys.Load64(q, qRQOff), sys.Load64(q, qRQLen))
	if err != nil {
		return nil, err
	}
	if t.rq, err = ring.Attach(rb); err != nil {
		return nil, err
	}
	cb, err := sub(sys.Load64(q, qCQOff), sys.Load64(q, qCQLen))
	if err != nil {
		return nil, err
	}
	if t.cq, err = ring.Attach(cb); err != nil {
		return nil, err
	}
	return t, nil
}

// UsesSRQ reports whether the target QP takes receives from an SRQ.
func (t *Target) UsesSRQ() bool { return sys.Load32(t.qcb, qFlags)&qfSRQ != 0 }

// QPN returns the target QP number.
func (t *Target) QPN() uint32 { return t.qpn }

// State returns the target QP's current state.
func (t *Target) State() uint32 { return sys.Load32(t.qcb, qState) }

// MinRNR returns the target's min_rnr_timer (IB encoding).
func (t *Target) MinRNR() uint8 { return uint8(sys.Load32(t.qcb, qMinRNR)) }

// DestQPN returns the QP number the target is connected to.
func (t *Target) DestQPN() uint32 { return sys.Load32(t.qcb, qDestQPN) }

// Accepting reports whether the target QP accepts requests (RTR or RTS).
func (t *Target) Accepting() bool {
	s := t.State()
	return s == StateRTR || s == StateRTS
}

func (t *Target) memory(e *keytab.Entry, addr uint64, n int) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	if n < 0 {
		return nil, false // a Length past an int: a peer's table says anything
	}
	off := addr - e.VA
	if e.Handle == keytab.NoHandle {
		if t.Ext == nil {
			return nil, false
		}
		m := t.Ext(e.Index)
		if m == nil || !within(uint64(len(m)), off, uint64(n)) {
			return nil, false
		}
		return m[off : off+uint64(n)], true
	}
	if !within(uint64(len(t.arena)), e.Handle, 0) || !within(uint64(len(t.arena))-e.Handle, off, uint64(n)) {
		return nil, false
	}
	start := e.Handle + off
	return t.arena[start : start+uint64(n)], true
}

// within reports whether [off, off+n) lies in [0, size), without the
// sums wrapping around (the values come from a peer's key table).
func within(size, off, n uint64) bool {
	return off <= size && n <= size-off
}

func inBounds(e *keytab.Entry, addr uint64, n int) bool {
	end := addr + uint64(n)
	return addr >= e.VA && end >= addr && end <= e.VA+e.Length
}

// RemotePin resolves [addr, addr+n) of the region named by rkey for an
// operation that needs access (AccessRemoteWrite, AccessRemoteRead or
// AccessRemoteAtomic), with a lookup cache c (nil: none; not shared
// between goroutines). The QP must allow access; a zero-length operation
// needs no valid key. It also returns the key's pin: the memory
// may be touched only between t.Enter(pin) and t.Leave(pin), a bounded
// piece (ChunkSize) at a time, so that Dereg can guarantee that nothing
// touches it once it returns. A zero-length request gets the zero pin.
func (t *Target) RemotePin(c *keytab.Cache, rkey uint32, addr uint64, n int, access uint32) ([]byte, keytab.Pin, Status) {
	// The QP's access flags hold for every request, zero-length ones too
	// (as rxe enforces them); a zero-length request needs no valid key.
	if sys.Load32(t.qcb, qAccess)&access == 0 {
		return nil, keytab.Pin{}, RemoteAccess
	}
	if n == 0 {
		return nil, keytab.Pin{}, Success
	}
	var e *keytab.Entry
	var pin keytab.Pin
	var ok bool
	if c != nil {
		e, pin, ok = t.keys.LookupRef(rkey, c)
	} else {
		var v keytab.Entry
		v, pin, ok = t.keys.LookupPin(rkey, nil)
		e = &v
	}
	if !ok || e.Flags&keytab.FlagRemoteKey == 0 || e.PD != t.pd || e.Flags&access == 0 || !inBounds(e, addr, n) {
		return nil, keytab.Pin{}, RemoteAccess
	}
	m, ok := t.memory(e, addr, n)
	if !ok {
		return nil, keytab.Pin{}, RemoteAccess
	}
	return m, pin, Success
}

// ChunkSize bounds one touch of registered memory between two checks of
// its key (Enter): how long Dereg may wait for an operation in flight.
const ChunkSize = 256 << 10

// Enter starts a touch of memory resolved with pin; false means the key
// was deregistered meanwhile: the operation must not touch the memory
// and fails with RemoteAccess.
func (t *Target) Enter(pin keytab.Pin) bool { return t.keys.Enter(pin) }

// Leave ends a touch begun by a successful Enter.
func (t *Target) Leave(pin keytab.Pin) { t.keys.Leave(pin) }

// Keys returns the target's key table (for pins of its memory).
func (t *Target) Keys() keytab.Table { return t.keys }

// Valid reports whether pin's key is still registered (a hint).
func (t *Target) Valid(pin keytab.Pin) bool { return t.keys.Valid(pin) }

// LocalPins is the initiator's side of a copy: its own key table and the
// pins of its gather or scatter list, one per segment (a zero pin is not
// checked: inline data, a private copy). Local memory is touched under
// them as target memory is under the target's, so that a Dereg of a
// local region stops a work request in flight too.
//
// With Hold set (an executor that runs under its own lock), the pins are
// entered through it (keytab.EnterHeld): the region stays entered between
// touches and operations, and a Dereg releases it under that lock.
type LocalPins struct {
	Keys keytab.Table
	Pins []keytab.Pin
	Hold *keytab.Hold
}

// Enter starts a touch of local segment i; false: deregistered.
func (lp LocalPins) Enter(i int) bool {
	if i >= len(lp.Pins) {
		return true
	}
	if lp.Hold != nil {
		return lp.Keys.EnterHeld(lp.Hold, lp.Pins[i])
	}
	return lp.Keys.EnterOpt(lp.Pins[i])
}

// Leave ends a touch of segment i begun by a successful Enter.
func (lp LocalPins) Leave(i int) {
	if i < len(lp.Pins) && lp.Hold == nil {
		lp.Keys.LeaveOpt(lp.Pins[i])
	}
}

// both enters the target pin and local segment i; it returns the status
// of the one that failed (RemoteAccess, LocalProtection).
func (t *Target) both(pin keytab.Pin, lp LocalPins, i int) Status {
	if !t.keys.Enter(pin) {
		return RemoteAccess
	}
	if !lp.Enter(i) {
		t.keys.Leave(pin)
		return LocalProtection
	}
	return Success
}

// CopyIn copies the gather list src (local memory of lp) into dst (target
// memory of pin) a chunk at a time, each under both keys' in-use counts;
// it returns RemoteAccess (LocalProtection), with the rest not copied,
// when the target's (a local) key is deregistered on the way.
func (t *Target) CopyIn(pin keytab.Pin, dst []byte, src [][]byte, lp LocalPins) Status {
	if len(src) == 1 && len(src[0]) <= ChunkSize {
		// One chunk from one segment (small writes): one touch.
		if st := t.both(pin, lp, 0); st != Success {
			return st
		}
		sys.Copy(dst, src[0])
		lp.Leave(0)
		t.keys.Leave(pin)
		return Success
	}
	d, p := [1][]byte{dst}, [1]keytab.Pin{pin}
	if recv, local := t.CopySGPinned(d[:], p[:], src, lp); recv != Success {
		return RemoteAccess
	} else {
		return local
	}
}

// CopyOut copies src (target memory of pin) into the scatter list dst
// (local memory of lp), as CopyIn.
func (t *Target) CopyOut(pin keytab.Pin, dst [][]byte, src []byte, lp LocalPins) Status {
	for i, d := range dst {
		for len(d) > 0 && len(src) > 0 {
			k := min(len(d), len(src), ChunkSize)
			if st := t.both(pin, lp, i); st != Success {
				return st
			}
			sys.Copy(d, src[:k])
			lp.Leave(i)
			t.keys.Leave(pin)
			d, src = d[k:], src[k:]
		}
	}
	return Success
}

// AtomicPin resolves the 8-byte word at addr for an atomic operation,
// with the key's pin (the atomic is one touch).
func (t *Target) AtomicPin(rkey uint32, addr uint64) ([]byte, keytab.Pin, Status) {
	return t.AtomicPinCached(nil, rkey, addr)
}

// AtomicPinCached is AtomicPin through the lookup cache c (see RemotePin).
func (t *Target) AtomicPinCached(c *keytab.Cache, rkey uint32, addr uint64) ([]byte, keytab.Pin, Status) {
	if addr&7 != 0 {
		return nil, keytab.Pin{}, RemoteInvalidReq
	}
	return t.RemotePin(c, rkey, addr, 8, AccessRemoteAtomic)
}

// LocalPin resolves a receive SGE (lkey, addr, n) of the target (receive
// buffers need local write access), with the key's pin (see RemotePin).
func (t *Target) LocalPin(lkey uint32, addr uint64, n int) ([]byte, keytab.Pin, Status) {
	if n == 0 {
		return nil, keytab.Pin{}, Success
	}
	e, pin, ok := t.keys.LookupPin(lkey, nil)
	if !ok || e.Flags&keytab.FlagRemoteKey != 0 || e.PD != t.pd || e.Flags&AccessLocalWrite == 0 || !inBounds(&e, addr, n) {
		return nil, keytab.Pin{}, LocalProtection
	}
	m, ok := t.memory(&e, addr, n)
	if !ok {
		return nil, keytab.Pin{}, LocalProtection
	}
	return m, pin, Success
}

// PopRecv takes the oldest posted receive of the target into w.
func (t *Target) PopRecv(w *RecvWQE) bool {
	var buf [RecvWQEMax]byte
	if !t.rq.TryPop(buf[:t.rq.Payload()]) {
		return false
	}
	w.decode(buf[:t.rq.Payload()])
	return true
}

// HasRecv reports whether a receive is posted (a hint; PopRecv decides).
func (t *Target) HasRecv() bool { return !t.rq.Empty() }

// Complete pushes a completion to the target's receive CQ and wakes its
// waiters. It returns false if the CQ overflowed (the flag is then set).
func (t *Target) Complete(wc *WC) bool {
	var buf [WCSize]byte
	wc.Encode(buf[:])
	if !t.cq.TryPush(buf[:]) {
		// The completion is lost: the CQ reports overflow, and the QP that
		// lost it cannot go on as if nothing happened.
		t.cq.SetFlag(ring.FlagOverflow)
		sys.Store32(t.qcb, qState, StateError)
		t.cq.Notify()
		return false
	}
	t.cq.Notify()
	return true
}

// MaxSGE bounds scatter/gather lists everywhere in rdmakit.
const MaxSGE = 32

// SGE is one scatter/gather element in wire form.
type SGE struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// RecvWQE is a posted receive as stored in a receive ring.
type RecvWQE struct {
	WRID uint64
	N    int
	SGL  [MaxSGE]SGE
}

// RecvWQEMax is the largest encoded receive WQE.
const RecvWQEMax = 16 + MaxSGE*16

// RecvWQESize is the ring payload for receives of up to nsge elements.
func RecvWQESize(nsge int) int { return 16 + nsge*16 }

// Encode writes w into b (RecvWQESize(w.N) bytes).
func (w *RecvWQE) Encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], w.WRID)
	le.PutUint32(b[8:], uint32(w.N))
	for i := 0; i < w.N; i++ {
		o := 16 + i*16
		le.PutUint64(b[o:], w.SGL[i].Addr)
		le.PutUint32(b[o+8:], w.SGL[i].Len)
		le.PutUint32(b[o+12:], w.SGL[i].LKey)
	}
}

func (w *RecvWQE) decode(b []byte) {
	le := binary.LittleEndian
	w.WRID = le.Uint64(b[0:])
	n := int(le.Uint32(b[8:]))
	if max := (len(b) - 16) / 16; n > max {
		n = max // a corrupt entry cannot make us read past the slot
	}
	w.N = n
	for i := 0; i < n; i++ {
		o := 16 + i*16
		w.SGL[i] = SGE{Addr: le.Uint64(b[o:]), Len: le.Uint32(b[o+8:]), LKey: le.Uint32(b[o+12:])}
	}
}

// Decode is exported for the owner's own flush path.
func (w *RecvWQE) Decode(b []byte) { w.decode(b) }

// Total returns the sum of SGE lengths.
func (w *RecvWQE) Total() uint64 {
	var s uint64
	for i := 0; i < w.N; i++ {
		s += uint64(w.SGL[i].Len)
	}
	return s
}

// WC is a completion as stored in a completion ring.
type WC struct {
	WRID    uint64
	Status  Status
	Opcode  uint32
	ByteLen uint32
	Imm     uint32
	QPN     uint32
	SrcQP   uint32
	Flags   uint32
}

// WCSize is the ring payload of a completion.
const WCSize = 40

// WC opcodes and flags (numeric values as in ibv_wc_opcode / ibv_wc_flags).
const (
	WCSend         uint32 = 0
	WCWrite        uint32 = 1
	WCRead         uint32 = 2
	WCCompSwap     uint32 = 3
	WCFetchAdd     uint32 = 4
	WCRecv         uint32 = 128
	WCRecvWriteImm uint32 = 129
	WCWithImm      uint32 = 1 << 1
)

// Encode writes wc into b (WCSize bytes).
func (wc *WC) Encode(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], wc.WRID)
	le.PutUint32(b[8:], uint32(wc.Status))
	le.PutUint32(b[12:], wc.Opcode)
	le.PutUint32(b[16:], wc.ByteLen)
	le.PutUint32(b[20:], wc.Imm)
	le.PutUint32(b[24:], wc.QPN)
	le.PutUint32(b[28:], wc.SrcQP)
	le.PutUint32(b[32:], wc.Flags)
}

// Decode reads wc from b.
func (wc *WC) Decode(b []byte) {
	le := binary.LittleEndian
	wc.WRID = le.Uint64(b[0:])
	wc.Status = Status(le.Uint32(b[8:]))
	wc.Opcode = le.Uint32(b[12:])
	wc.ByteLen = le.Uint32(b[16:])
	wc.Imm = le.Uint32(b[20:])
	wc.QPN = le.Uint32(b[24:])
	wc.SrcQP = le.Uint32(b[28:])
	wc.Flags = le.Uint32(b[32:])
}

// ScatterRecvPin resolves the receive w for an incoming message of n bytes
// into segs (len >= w.N), records each segment's pin in pins (len >= w.N;
// nil: none) for CopySGPinned, and returns how many segments are used. A
// message longer than the receive gives LocalLength; a bad receive SGE
// gives LocalProtection.
func (t *Target) ScatterRecvPin(w *RecvWQE, n int, segs [][]byte, pins []keytab.Pin) (int, Status) {
	if uint64(n) > w.Total() {
		return 0, LocalLength
	}
	used := 0
	left := n
	for i := 0; i < w.N && left > 0; i++ {
		sg := w.SGL[i]
		take := int(sg.Len)
		if take > left {
			take = left
		}
		m, pin, st := t.LocalPin(sg.LKey, sg.Addr, int(sg.Len))
		if st != Success {
			return 0, st
		}
		segs[used] = m[:take]
		if pins != nil {
			pins[used] = pin
		}
		used++
		left -= take
	}
	return used, Success
}

// Fail moves the target QP to ERROR from the responder side after a
// receive-side error, and flushes its remaining receives with WRFlush
// completions, so that nothing posted is lost. Receives of a shared receive
// queue belong to the other QPs too and are never flushed.
func (t *Target) Fail(flushRQ bool) {
	sys.Store32(t.qcb, qState, StateError)
	if !flushRQ || t.UsesSRQ() {
		return
	}
	var w RecvWQE
	for t.PopRecv(&w) {
		t.Complete(&WC{WRID: w.WRID, Status: WRFlush, Opcode: WCRecv, QPN: t.qpn})
	}
}

// CopySGPinned is CopySG from local memory (lp) into target memory whose
// segments are pinned by pins: a chunk (ChunkSize at most) at a time,
// each under both keys' in-use counts. When a receive segment's key is
// deregistered on the way it returns recv LocalProtection (the receive's
// error), when a local one is local LocalProtection (the requester's),
// with the rest not copied.
func (t *Target) CopySGPinned(dst [][]byte, pins []keytab.Pin, src [][]byte, lp LocalPins) (recv, local Status) {
	di, doff := 0, 0
	for i, s := range src {
		for len(s) > 0 {
			for di < len(dst) && doff == len(dst[di]) {
				di, doff = di+1, 0
			}
			if di == len(dst) {
				return Success, Success
			}
			k := min(len(s), len(dst[di])-doff, ChunkSize)
			if !t.keys.Enter(pins[di]) {
				return LocalProtection, Success
			}
			if !lp.Enter(i) {
				t.keys.Leave(pins[di])
				return Success, LocalProtection
			}
			sys.Copy(dst[di][doff:], s[:k])
			lp.Leave(i)
			t.keys.Leave(pins[di])
			doff += k
			s = s[k:]
		}
	}
	return Success, Success
}

// CopySG copies from the gather list src into the scatter list dst, as a
// byte stream, and returns the bytes copied.
func CopySG(dst, src [][]byte) int {
	n := 0
	di, doff := 0, 0
	for _, s := range src {
		for len(s) > 0 {
			for di < len(dst) && doff == len(dst[di]) {
				di, doff = di+1, 0
			}
			if di == len(dst) {
				return n
			}
			c := copy(dst[di][doff:], s)
			doff += c
			s = s[c:]
			n += c
		}
	}
	return n
}
