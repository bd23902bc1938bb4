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
package keytab

import (
	"errors"

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
	if c.so != 0 && c.key == key && sys.Load32(t.b, c.so+oSeq) == c.seq {
		return c.e, true
	}
	e, so, seq, ok := t.lookup(key)
	if ok {
		*c = Cache{key: key, seq: seq, so: so, e: e}
	}
	return e, ok
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
		if st := sys.Load32(t.b, so+oState); st == stLive {
			continue
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
func (t Table) Remove(key uint32) bool {
	h := hash(key)
	for i := uint32(0); i <= t.mask; i++ {
		so := t.slot(h + i)
		st := sys.Load32(t.b, so+oState)
		if st == stEmpty {
			return false
		}
		if st != stLive || sys.Load32(t.b, so+oKey) != key {
			continue
		}
		seq := sys.Load32(t.b, so+oSeq)
		sys.Store32(t.b, so+oSeq, seq+1)
		sys.Store32(t.b, so+oState, stTomb)
		sys.Store32(t.b, so+oKey, 0)
		sys.Store32(t.b, so+oSeq, seq+2)
		return true
	}
	return false
}
