// Package keytab is the memory-key table of an rdmakit context: it maps a
// 32-bit lkey or rkey to the memory region it names. The table is laid out
// in a byte slice so that it can sit in the context's shared arena, where a
// peer process on the same host looks up rkeys without involving the owner
// (one-sided operations must not need the target's CPU).
//
// Writers (Insert, Remove) are the owning context only, serialised by the
// caller. Readers (Lookup) may be anywhere, in any process, lock-free: every
// slot is guarded by a sequence lock (odd while being written) and all words
// are accessed atomically. Open addressing with linear probing; removed
// slots become tombstones so probe chains stay intact for readers.
//
// Layout: a 64-byte header (magic uint32, capacity uint32) followed by
// capacity slots of 64 bytes:
//
//	0  seq    uint32  sequence lock
//	4  key    uint32
//	8  state  uint32  0 empty, 1 live, 2 tombstone
//	12 flags  uint32  access bits | FlagRemoteKey
//	16 va     uint64  address the region starts at (owner's address space)
//	24 length uint64
//	32 handle uint64  offset in the owner's arena, or NoHandle
//	40 index  uint32  owner-local region index
//	44 pd     uint32  protection domain handle
//	48 use    uint32  operations touching the region's memory right now
//
// Memory-registration guarantee: once Remove returns and Idle reports the
// slot idle, no operation touches the region's memory. An operation that
// resolved a key holds a Pin; around every bounded touch of the memory (a
// chunk copied, one non-blocking read or write) it calls Enter, which
// counts it in the slot's use word and then checks the slot's sequence
// word, and Leave. Remove bumps the sequence word before Idle reads the
// use word; with sequentially consistent atomics on both sides either the
// operation sees the removal (Enter fails: it aborts) or Remove's caller
// sees it in use (and waits for Leave). The use word is in the table, so
// this holds for operations of peer processes too. A tombstone still in
// use is not reused.
package keytab

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
)

const (
	magic      = 0x4b455953 // "KEYS"
	headerSize = 64
	slotSize   = 64

	stEmpty = 0
	stLive  = 1
	stTomb  = 2

	oSeq    = 0
	oKey    = 4
	oState  = 8
	oFlags  = 12
	oVA     = 16
	oLen    = 24
	oHandle = 32
	oIndex  = 40
	oPD     = 44
	oUse    = 48
)

// FlagRemoteKey marks an entry keyed by an rkey (otherwise an lkey).
const FlagRemoteKey uint32 = 1 << 16

// NoHandle is the Handle of a region that is not in the arena (registered
// caller memory): peers that map the arena cannot reach it.
const NoHandle = ^uint64(0)

// Errors.
var (
	ErrFull   = errors.New("keytab: table full")
	ErrBad    = errors.New("keytab: invalid table header")
	ErrExists = errors.New("keytab: key in use")
)

// Entry is one region as the table records it.
type Entry struct {
	Key    uint32
	Flags  uint32
	VA     uint64
	Length uint64
	Handle uint64
	Index  uint32
	PD     uint32
}

// Table is a view of a key table laid out in a byte slice.
type Table struct {
	b    []byte
	mask uint32
}

// Size returns the bytes needed for a table of capacity slots (a power of
// two; at most half of them should be live for short probes).
func Size(capacity int) int { return headerSize + capacity*slotSize }

// Init lays out an empty table in b.
func Init(b []byte, capacity int) Table {
	if capacity&(capacity-1) != 0 {
		panic("keytab: capacity must be a power of two")
	}
	sys.Store32(b, 4, uint32(capacity))
	sys.Store32(b, 0, magic)
	return Table{b: b[:Size(capacity)], mask: uint32(capacity - 1)}
}

// Attach returns a view of a table laid out in b by someone else.
func Attach(b []byte) (Table, error) {
	if len(b) < headerSize || sys.Load32(b, 0) != magic {
		return Table{}, ErrBad
	}
	c := int(sys.Load32(b, 4))
	if c == 0 || c&(c-1) != 0 || Size(c) > len(b) {
		return Table{}, ErrBad
	}
	return Table{b: b[:Size(c)], mask: uint32(c - 1)}, nil
}

// Cap returns the number of slots.
func (t Table) Cap() int { return int(t.mask + 1) }

func hash(k uint32) uint32 { return (k * 0x9E3779B1) ^ (k >> 16) }

func (t Table) slot(i uint32) int { return headerSize + int(i&t.mask)*slotSize }

// Pin names a key's slot as a lookup found it (see the package comment).
// The zero Pin is not valid: Enter fails.
type Pin struct {
	so  int
	seq uint32
}

// Zero reports whether p is the zero Pin (nothing to check).
func (p Pin) Zero() bool { return p.so == 0 }

// Enter counts an operation as touching the pinned region's memory; it
// fails (counting nothing) if the key was removed since the lookup. Every
// successful Enter is followed by Leave once the touch is done; touches
// must be bounded in time.
func (t Table) Enter(p Pin) bool {
	if p.so == 0 {
		return false
	}
	sys.Add32(t.b, p.so+oUse, 1)
	if sys.Load32(t.b, p.so+oSeq) != p.seq {
		sys.Add32(t.b, p.so+oUse, ^uint32(0))
		return false
	}
	return true
}

// Leave ends a touch begun by a successful Enter.
func (t Table) Leave(p Pin) { sys.Add32(t.b, p.so+oUse, ^uint32(0)) }

// EnterOpt is Enter, except that the zero Pin (memory no key guards, such
// as a private copy of inline data) always succeeds.
func (t Table) EnterOpt(p Pin) bool { return p.so == 0 || t.Enter(p) }

// LeaveOpt ends a touch begun by a successful EnterOpt.
func (t Table) LeaveOpt(p Pin) {
	if p.so != 0 {
		t.Leave(p)
	}
}

// Hold keeps one pin entered across touches, for an executor that works
// on the same region op after op: a touch of the held pin costs one load
// (its sequence word) instead of two atomic adds. A Hold is used under a
// lock of its owner's (the executor's); Dereg, which must see it released
// before the memory goes, finds it by Holds (any goroutine) and releases
// it with ReleaseSlot under that lock.
type Hold struct {
	p    Pin
	slot atomic.Int64 // p.so, announced before the pin is entered
}

// EnterHeld is EnterOpt for a touch of p by h's owner: it enters p and
// keeps it entered (the touch's Leave is skipped), leaving the pin held
// before; a touch of the held pin only checks that its key is live, and
// releases it if not. False: the key was removed.
func (t Table) EnterHeld(h *Hold, p Pin) bool {
	if p.so == 0 {
		return true
	}
	if h.p == p {
		if sys.Load32(t.b, p.so+oSeq) == p.seq {
			return true
		}
		t.Release(h)
		return false
	}
	// The slot is announced first: a remover that bumps the sequence word
	// after Enter checked it then sees the announcement (sequentially
	// consistent atomics), and releases the hold.
	h.slot.Store(int64(p.so))
	if !t.Enter(p) {
		// Announcing the old slot again would leave a window in which
		// a remover of it saw no holder: let it go instead (the next
		// touch of it enters it again).
		t.Release(h)
		return false
	}
	if h.p.so != 0 {
		t.Leave(h.p)
	}
	h.p = p
	return true
}

// Release leaves the held pin, if any (under the owner's lock).
func (t Table) Release(h *Hold) {
	if h.p.so != 0 {
		t.Leave(h.p)
		h.p = Pin{}
	}
	h.slot.Store(0)
}

// Holds reports whether h may hold a pin on slot s (any goroutine).
func (h *Hold) Holds(s Slot) bool { return s != 0 && h.slot.Load() == int64(s) }

// ReleaseSlot releases h's pin if it is on slot s (under the owner's
// lock).
func (t Table) ReleaseSlot(h *Hold, s Slot) {
	if s != 0 && h.p.so == int(s) {
		t.Release(h)
	}
}

// Valid reports whether the pinned key is still live (a hint: only Enter
// decides).
func (t Table) Valid(p Pin) bool { return p.so != 0 && sys.Load32(t.b, p.so+oSeq) == p.seq }

// Slot identifies a removed key's slot for Idle.
type Slot int

// Idle waits until no operation touches the memory of the key removed
// from slot (Remove's result), for at most within; it reports whether
// that happened. A false return means an operation is stuck mid-touch (a
// peer process stopped or died there): the caller must keep the memory
// reserved, never hand it out again.
func (t Table) Idle(s Slot, within time.Duration) bool {
	if s == 0 {
		return true
	}
	var deadline time.Time
	for i := 0; sys.Load32(t.b, int(s)+oUse) != 0; i++ {
		switch {
		case i < 64:
			runtime.Gosched()
		case i == 64:
			deadline = time.Now().Add(within)
			fallthrough
		default:
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return true
}

// Cache remembers one lookup; LookupCached revalidates it with a single
// load of the slot's sequence word, which any change to the slot bumps.
// A Cache must not be used by two goroutines at once.
type Cache struct {
	key uint32
	seq uint32
	so  int
	e   Entry
}

// LookupCached is Lookup through c.
func (t Table) LookupCached(key uint32, c *Cache) (Entry, bool) {
	e, _, ok := t.LookupPin(key, c)
	return e, ok
}

// LookupPin is LookupCached that also returns the key's Pin (c may be
// nil: no cache).
func (t Table) LookupPin(key uint32, c *Cache) (Entry, Pin, bool) {
	if c != nil {
		e, p, ok := t.LookupRef(key, c)
		if !ok {
			return Entry{}, Pin{}, false
		}
		return *e, p, true
	}
	e, so, seq, ok := t.lookup(key)
	return e, Pin{so: so, seq: seq}, ok
}

// LookupRef is LookupPin through c (which it needs), returning the
// cached entry by reference: valid until the next lookup through c, not
// to be modified. The hot paths use it: a 40-byte Entry returned by value
// is copied through the stack in overlapping pieces that the CPU cannot
// forward to the loads that follow (store-forwarding stalls measured at
// a third of a cached lookup's time).
func (t Table) LookupRef(key uint32, c *Cache) (*Entry, Pin, bool) {
	if c.so != 0 && c.key == key && sys.Load32(t.b, c.so+oSeq) == c.seq {
		return &c.e, Pin{so: c.so, seq: c.seq}, true
	}
	return t.lookupInto(key, c)
}

func (t Table) lookupInto(key uint32, c *Cache) (*Entry, Pin, bool) {
	e, so, seq, ok := t.lookup(key)
	if !ok {
		return nil, Pin{}, false
	}
	*c = Cache{key: key, seq: seq, so: so, e: e}
	return &c.e, Pin{so: so, seq: seq}, true
}

// Lookup finds the live entry for key.
func (t Table) Lookup(key uint32) (Entry, bool) {
	e, _, _, ok := t.lookup(key)
	return e, ok
}

func (t Table) lookup(key uint32) (Entry, int, uint32, bool) {
	if key == 0 || t.b == nil {
		return Entry{}, 0, 0, false
	}
	h := hash(key)
	for i := uint32(0); i <= t.mask; i++ {
		so := t.slot(h + i)
		for {
			s1 := sys.Load32(t.b, so+oSeq)
			if s1&1 != 0 {
				continue // being written; the writer finishes in a few stores
			}
			st := sys.Load32(t.b, so+oState)
			if st == stEmpty {
				return Entry{}, 0, 0, false
			}
			if st != stLive || sys.Load32(t.b, so+oKey) != key {
				if sys.Load32(t.b, so+oSeq) != s1 {
					continue
				}
				break
			}
			e := Entry{
				Key:    key,
				Flags:  sys.Load32(t.b, so+oFlags),
				VA:     sys.Load64(t.b, so+oVA),
				Length: sys.Load64(t.b, so+oLen),
				Handle: sys.Load64(t.b, so+oHandle),
				Index:  sys.Load32(t.b, so+oIndex),
				PD:     sys.Load32(t.b, so+oPD),
			}
			if sys.Load32(t.b, so+oSeq) != s1 {
				continue
			}
			return e, so, s1, true
		}
	}
	return Entry{}, 0, 0, false
}

// Insert adds e. The caller serialises writers.
func (t Table) Insert(e Entry) error {
	if e.Key == 0 {
		return ErrExists
	}
	if _, ok := t.Lookup(e.Key); ok {
		return ErrExists
	}
	h := hash(e.Key)
	for i := uint32(0); i <= t.mask; i++ {
		so := t.slot(h + i)
		if st := sys.Load32(t.b, so+oState); st == stLive || sys.Load32(t.b, so+oUse) != 0 {
			continue // live, or a removed key's memory still being touched
		}
		seq := sys.Load32(t.b, so+oSeq)
		sys.Store32(t.b, so+oSeq, seq+1)
		sys.Store32(t.b, so+oKey, e.Key)
		sys.Store32(t.b, so+oFlags, e.Flags)
		sys.Store64(t.b, so+oVA, e.VA)
		sys.Store64(t.b, so+oLen, e.Length)
		sys.Store64(t.b, so+oHandle, e.Handle)
		sys.Store32(t.b, so+oIndex, e.Index)
		sys.Store32(t.b, so+oPD, e.PD)
		sys.Store32(t.b, so+oState, stLive)
		sys.Store32(t.b, so+oSeq, seq+2)
		return nil
	}
	return ErrFull
}

// Remove deletes key; after it returns no reader finds the key.
func (t Table) Remove(key uint32) bool { return t.RemoveSlot(key) != 0 }

// RemoveSlot is Remove returning the key's slot (0: not found), for Idle.
func (t Table) RemoveSlot(key uint32) Slot {
	h := hash(key)
	for i := uint32(0); i <= t.mask; i++ {
		so := t.slot(h + i)
		st := sys.Load32(t.b, so+oState)
		if st == stEmpty {
			return 0
		}
		if st != stLive || sys.Load32(t.b, so+oKey) != key {
			continue
		}
		seq := sys.Load32(t.b, so+oSeq)
		sys.Store32(t.b, so+oSeq, seq+1)
		sys.Store32(t.b, so+oState, stTomb)
		sys.Store32(t.b, so+oKey, 0)
		sys.Store32(t.b, so+oSeq, seq+2)
		return Slot(so)
	}
	return 0
}
