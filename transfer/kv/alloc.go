package kv

// The master's space allocator: first fit over a sorted list of free
// extents, coalescing on free. No goroutines; the master's lock guards it.

import "sort"

// allocAlign aligns every allocation (a cache line).
const allocAlign = 64

type extent struct{ off, len uint64 }

// allocator hands out ranges of one holder's pool.
type allocator struct {
	size uint64
	free []extent // sorted by off, never adjacent
	used uint64
	// dirty: slots of values that clients may have read, freed, whose
	// version headers are not cleared yet (cache.go); sorted by off,
	// disjoint, each inside free space.
	dirty []extent
}

// markDirty records a freed slot whose header a reader may still trust.
func (a *allocator) markDirty(off, n uint64) {
	i := sort.Search(len(a.dirty), func(i int) bool { return a.dirty[i].off > off })
	a.dirty = append(a.dirty, extent{})
	copy(a.dirty[i+1:], a.dirty[i:])
	a.dirty[i] = extent{off, roundUp(n)}
}

// takeDirty removes and returns the dirty slots that overlap n bytes at
// off (just allocated): their headers must be cleared before any of
// those bytes is written.
func (a *allocator) takeDirty(off, n uint64) []extent {
	n = roundUp(n)
	i := sort.Search(len(a.dirty), func(i int) bool { return a.dirty[i].off+a.dirty[i].len > off })
	j := i
	for j < len(a.dirty) && a.dirty[j].off < off+n {
		j++
	}
	if i == j {
		return nil
	}
	out := append([]extent(nil), a.dirty[i:j]...)
	a.dirty = append(a.dirty[:i], a.dirty[j:]...)
	return out
}

func newAllocator(size uint64) *allocator {
	size &^= allocAlign - 1
	a := &allocator{size: size}
	if size > 0 {
		a.free = []extent{{0, size}}
	}
	return a
}

func roundUp(n uint64) uint64 { return (n + allocAlign - 1) &^ (allocAlign - 1) }

// alloc returns the offset of n bytes (n > 0), or false.
func (a *allocator) alloc(n uint64) (uint64, bool) {
	n = roundUp(n)
	for i, e := range a.free {
		if e.len < n {
			continue
		}
		off := e.off
		if e.len == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = extent{e.off + n, e.len - n}
		}
		a.used += n
		return off, true
	}
	return 0, false
}

// release gives back n bytes at off (as allocated).
func (a *allocator) release(off, n uint64) {
	n = roundUp(n)
	a.used -= n
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	// Merge with the previous and next extents where adjacent.
	prev := i > 0 && a.free[i-1].off+a.free[i-1].len == off
	next := i < len(a.free) && off+n == a.free[i].off
	switch {
	case prev && next:
		a.free[i-1].len += n + a.free[i].len
		a.free = append(a.free[:i], a.free[i+1:]...)
	case prev:
		a.free[i-1].len += n
	case next:
		a.free[i] = extent{off, n + a.free[i].len}
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
}

// largest returns the largest free extent's length.
func (a *allocator) largest() uint64 {
	var m uint64
	for _, e := range a.free {
		m = max(m, e.len)
	}
	return m
}

// reserve takes n bytes at off (as alloc would have placed them) out of
// the free list; false if any of them is not free.
func (a *allocator) reserve(off, n uint64) bool {
	n = roundUp(n)
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off+a.free[i].len > off })
	if i == len(a.free) || a.free[i].off > off || a.free[i].off+a.free[i].len < off+n {
		return false
	}
	e := a.free[i]
	var parts []extent
	if e.off < off {
		parts = append(parts, extent{e.off, off - e.off})
	}
	if end := off + n; end < e.off+e.len {
		parts = append(parts, extent{end, e.off + e.len - end})
	}
	a.free = append(a.free[:i], append(parts, a.free[i+1:]...)...)
	a.used += n
	return true
}
