package sys

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Memory a raw read or write must not touch. Read, Read2 and Writev (on
// Linux) are raw system calls: the Go scheduler is not told, so the
// calling goroutine keeps its processor for the whole call and a
// stop-the-world waits for it. That is right for memory rdmakit allocated
// itself (heap buffers, a context's arena), which the kernel copies to or
// from at once. Memory a caller registered (RegMR) may be a file mapping
// whose pages the call would first read from disk: I/O that touches it
// goes through the ordinary system-call path, where the runtime hands the
// processor on after 20 µs. NoteCallerMemory lists such memory while it
// is registered; rawOK looks it up (a load and, while any is listed, a
// binary search per buffer: a store node registers many regions).

type span struct{ lo, hi uintptr }

type spanSet struct {
	mu    sync.Mutex                // guards spans
	spans map[span]int              // listed spans, with how many times each is listed
	list  atomic.Pointer[spanIndex] // spans' keys for readers, replaced whole
}

// spanIndex is a set of spans sorted by start, with maxHi[i] the
// farthest end among the first i+1 (spans may overlap).
type spanIndex struct {
	s     []span
	maxHi []uintptr
}

var callerMem spanSet

// NoteCallerMemory lists b as memory that raw reads and writes avoid
// until forget is called (later calls of forget do nothing).
func NoteCallerMemory(b []byte) (forget func()) {
	if len(b) == 0 {
		return func() {}
	}
	s := span{Addr(b), Addr(b) + uintptr(len(b))}
	callerMem.add(s, 1)
	var once sync.Once
	return func() { once.Do(func() { callerMem.add(s, -1) }) }
}

func (m *spanSet) add(s span, d int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.spans == nil {
		m.spans = map[span]int{}
	}
	if m.spans[s] += d; m.spans[s] <= 0 {
		delete(m.spans, s)
	}
	x := &spanIndex{s: make([]span, 0, len(m.spans))}
	for k := range m.spans {
		x.s = append(x.s, k)
	}
	sort.Slice(x.s, func(i, j int) bool { return x.s[i].lo < x.s[j].lo })
	x.maxHi = make([]uintptr, len(x.s))
	for i, v := range x.s {
		x.maxHi[i] = v.hi
		if i > 0 {
			x.maxHi[i] = max(v.hi, x.maxHi[i-1])
		}
	}
	m.list.Store(x)
}

// rawOK reports whether a raw system call may read or write b: no listed
// caller memory overlaps it.
func rawOK(b []byte) bool {
	x := callerMem.list.Load()
	if x == nil || len(x.s) == 0 || len(b) == 0 {
		return true
	}
	lo, hi := Addr(b), Addr(b)+uintptr(len(b))
	// The spans that start before b ends: b overlaps one of them iff the
	// farthest of their ends lies past b's start.
	i, j := 0, len(x.s) // the first span starting at or past hi, by bisection
	for i < j {
		h := int(uint(i+j) >> 1)
		if x.s[h].lo < hi {
			i = h + 1
		} else {
			j = h
		}
	}
	return i == 0 || x.maxHi[i-1] <= lo
}

// IsCallerMemory reports whether b overlaps memory NoteCallerMemory
// listed (so that raw reads and writes avoid it).
func IsCallerMemory(b []byte) bool { return !rawOK(b) }
