// Package ring is a bounded multi-producer multi-consumer queue of
// fixed-size slots laid out in a byte slice, so that it can live in memory
// shared between processes (a MAP_SHARED memfd mapping). It is the carrier
// of completion queues and receive queues on every rdmakit transport.
//
// The algorithm is Dmitry Vyukov's bounded MPMC queue: each slot carries a
// sequence number; producers claim a position by CAS on the tail and publish
// by storing seq=pos+1; consumers claim by CAS on the head and release by
// storing seq=pos+capacity. It is lock-free and needs nothing but atomic
// operations on the shared words, which work across processes.
//
// Blocking: a consumer that finds the ring empty may Wait; producers call
// Notify after pushing. Both use a futex word in the header, so a waiter in
// one process is woken by a producer in another.
//
// Layout (all offsets in bytes, header is 256 bytes):
//
//	0   magic    uint32
//	4   slot     uint32  slot size including the 8-byte sequence word
//	8   capacity uint32  power of two
//	12  flags    uint32  FlagOverflow, ...
//	64  tail     uint64  (own cache line)
//	128 head     uint64  (own cache line)
//	192 event    uint32  futex word, bumped by Notify
//	196 waiters  uint32  number of blocked waiters
//	256 slots
package ring

import (
	"errors"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
)

const (
	magic      = 0x52494e47 // "RING"
	offMagic   = 0
	offSlot    = 4
	offCap     = 8
	offFlags   = 12
	offTail    = 64
	offHead    = 128
	offEvent   = 192
	offWaiters = 196
	headerSize = 256
)

// Flags stored in the ring header.
const (
	// FlagOverflow is set by a producer that found the ring full.
	FlagOverflow uint32 = 1 << 0
	// FlagClosed is set when the owner closes the ring; waiters return.
	FlagClosed uint32 = 1 << 1
)

// ErrBadRing means a byte slice does not hold a valid ring.
var ErrBadRing = errors.New("ring: invalid ring header")

// Ring is a view of a ring laid out in b. Copying a Ring copies the view.
type Ring struct {
	b    []byte
	slot int
	mask uint64
}

// Size returns the bytes needed for a ring of capacity entries of payload
// bytes each. capacity is rounded up to a power of two.
func Size(capacity, payload int) int {
	c := roundPow2(capacity)
	return headerSize + c*slotSize(payload)
}

func slotSize(payload int) int { return (8 + payload + 7) &^ 7 }

func roundPow2(n int) int {
	c := 1
	for c < n {
		c <<= 1
	}
	return c
}

// Init lays out an empty ring in b and returns a view of it.
func Init(b []byte, capacity, payload int) Ring {
	c := roundPow2(capacity)
	s := slotSize(payload)
	for i := 0; i < c; i++ {
		sys.Store64(b, headerSize+i*s, uint64(i))
	}
	sys.Store32(b, offSlot, uint32(s))
	sys.Store32(b, offCap, uint32(c))
	sys.Store64(b, offTail, 0)
	sys.Store64(b, offHead, 0)
	sys.Store32(b, offFlags, 0)
	sys.Store32(b, offMagic, magic)
	return Ring{b: b[:headerSize+c*s], slot: s, mask: uint64(c - 1)}
}

// Attach returns a view of the ring already laid out in b (possibly by
// another process), checking that the header is consistent with len(b).
func Attach(b []byte) (Ring, error) {
	if len(b) < headerSize || sys.Load32(b, offMagic) != magic {
		return Ring{}, ErrBadRing
	}
	s := int(sys.Load32(b, offSlot))
	c := int(sys.Load32(b, offCap))
	if s < 16 || s%8 != 0 || c == 0 || c&(c-1) != 0 || headerSize+c*s > len(b) {
		return Ring{}, ErrBadRing
	}
	return Ring{b: b[:headerSize+c*s], slot: s, mask: uint64(c - 1)}, nil
}

// Valid reports whether r is a usable view.
func (r Ring) Valid() bool { return r.b != nil }

// Cap returns the capacity in entries.
func (r Ring) Cap() int { return int(r.mask + 1) }

// Payload returns the payload bytes per slot.
func (r Ring) Payload() int { return r.slot - 8 }

// Len returns an instantaneous count of queued entries.
func (r Ring) Len() int {
	t := sys.Load64(r.b, offTail)
	h := sys.Load64(r.b, offHead)
	if t < h {
		return 0
	}
	return int(t - h)
}

// TryPush copies src (at most Payload bytes) into a free slot. It returns
// false when the ring is full.
func (r Ring) TryPush(src []byte) bool {
	pos, slot, ok := r.Reserve()
	if ok {
		copy(slot, src)
		r.Publish(pos)
	}
	return ok
}

// Reserve claims the next free slot for a producer and returns its
// position and payload (Payload bytes, to be filled in place), or ok
// false when the ring is full. Publish(pos) hands the slot to consumers;
// until then consumers wait at it (so publish soon, and without fail).
func (r Ring) Reserve() (pos uint64, payload []byte, ok bool) {
	pos, so, ok := r.take(offTail, 0)
	if !ok {
		return 0, nil, false
	}
	return pos, r.b[so+8 : so+r.slot], true
}

// take is Reserve (off offTail, a free slot's sequence lag 0) and Claim
// (offHead, a published slot's lag 1): it moves the counter at off past
// the slot whose sequence is its position plus lag and returns that
// position and the slot's offset, or ok false when the ring is full
// (empty) there. A slot ahead of the counter means another producer
// (consumer) moved on; a counter that did not move then means the slot
// is inconsistent (a corrupted ring): give up.
func (r Ring) take(off int, lag uint64) (pos uint64, so int, ok bool) {
	pos = sys.Load64(r.b, off)
	for {
		so = headerSize + int(pos&r.mask)*r.slot
		seq := sys.Load64(r.b, so)
		switch d := int64(seq - (pos + lag)); {
		case d == 0:
			if sys.CAS64(r.b, off, pos, pos+1) {
				return pos, so, true
			}
			pos = sys.Load64(r.b, off)
		case d < 0:
			return 0, 0, false
		default:
			np := sys.Load64(r.b, off)
			if np == pos {
				return 0, 0, false
			}
			pos = np
		}
	}
}

// Publish makes the slot Reserve returned at pos visible to consumers.
func (r Ring) Publish(pos uint64) {
	raceRelease()
	sys.Store64(r.b, headerSize+int(pos&r.mask)*r.slot, pos+1)
}

// TryPop copies the oldest entry into dst (at most Payload bytes) and
// returns true, or returns false when the ring is empty.
func (r Ring) TryPop(dst []byte) bool {
	pos, slot, ok := r.Claim()
	if ok {
		copy(dst, slot)
		r.Release(pos)
	}
	return ok
}

// Claim takes the oldest entry for a consumer and returns its position
// and payload (to be read in place), or ok false when the ring is empty.
// Release(pos) gives the slot back to producers; until then they find
// the ring full at it (so release soon, and without fail).
func (r Ring) Claim() (pos uint64, payload []byte, ok bool) {
	pos, so, ok := r.take(offHead, 1)
	if !ok {
		return 0, nil, false
	}
	raceAcquire()
	return pos, r.b[so+8 : so+r.slot], true
}

// Release gives the slot Claim returned at pos back to producers. A
// release store is enough: the payload was read before it, and nobody
// sleeps waiting for a free slot.
func (r Ring) Release(pos uint64) {
	sys.StoreRelease64(r.b, headerSize+int(pos&r.mask)*r.slot, pos+r.mask+1)
}

// Empty reports whether no published entry is waiting.
func (r Ring) Empty() bool {
	pos := sys.Load64(r.b, offHead)
	so := headerSize + int(pos&r.mask)*r.slot
	return sys.Load64(r.b, so) != pos+1
}

// SetFlag sets bits in the header flags.
func (r Ring) SetFlag(f uint32) {
	for {
		old := sys.Load32(r.b, offFlags)
		if old&f == f || sys.CAS32(r.b, offFlags, old, old|f) {
			return
		}
	}
}

// ClearFlag clears bits in the header flags.
func (r Ring) ClearFlag(f uint32) {
	for {
		old := sys.Load32(r.b, offFlags)
		if old&f == 0 || sys.CAS32(r.b, offFlags, old, old&^f) {
			return
		}
	}
}

// Flags returns the header flags.
func (r Ring) Flags() uint32 { return sys.Load32(r.b, offFlags) }

// Notify wakes waiters after a push (or a flag set). It costs one load
// when nobody waits: the event word moves only for waiters. That is
// enough because every access is sequentially consistent: a waiter counts
// itself in waiters before it re-checks the ring, and a producer publishes
// its entry before it reads waiters, so either the waiter sees the entry
// (and does not sleep) or the producer sees the waiter (and bumps the
// event word, which fails or ends the waiter's futex wait).
func (r Ring) Notify() {
	if sys.Load32(r.b, offWaiters) != 0 {
		sys.Add32(r.b, offEvent, 1)
		sys.FutexWake(r.b, offEvent, 1<<30)
	}
}

// Kick wakes waiters for a reason other than a push (a cancelled wait):
// unlike Notify it always moves the event word, so a waiter that read it
// before the kick does not sleep.
func (r Ring) Kick() {
	sys.Add32(r.b, offEvent, 1)
	if sys.Load32(r.b, offWaiters) != 0 {
		sys.FutexWake(r.b, offEvent, 1<<30)
	}
}

// Wait blocks until the ring is probably non-empty, the ring is closed, or
// d elapses. Callers re-check with TryPop.
func (r Ring) Wait(d time.Duration) {
	ev := sys.Load32(r.b, offEvent)
	if !r.Empty() || r.Flags()&FlagClosed != 0 {
		return
	}
	sys.Add32(r.b, offWaiters, 1)
	if r.Empty() && r.Flags()&FlagClosed == 0 {
		sys.FutexWait(r.b, offEvent, ev, d)
	}
	sys.Add32(r.b, offWaiters, ^uint32(0))
}
