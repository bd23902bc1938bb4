// Package arena provides the off-heap memory every rdmakit context allocates
// from: one sparse memfd per context, mapped once, carved into page-aligned
// spans. Because the whole arena is a single file, a peer process on the same
// host can map all of it once (transport/shm) and address any memory region
// or control structure in it by offset.
//
// Spans are never unmapped while the arena lives; freeing one punches a hole
// in the file, which returns the pages to the kernel while leaving the
// addresses valid (they read as zeros). This makes a late access by an
// in-flight operation harmless instead of a crash.
//
// Other systems than Linux have no memfd: there the arena is an anonymous
// mapping that only this process can address (see New).
//
// Concurrency: Alloc and Free may be called from any goroutine; mu guards the
// free list. Mem, Fd, Size and Ino are immutable after New.
package arena

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
)

// DefaultSize is the virtual size reserved per arena. It costs address space
// only; memory is charged as pages are touched. RDMAKIT_ARENA_SIZE (bytes)
// overrides it.
const DefaultSize = 64 << 30

// ErrExhausted means the arena has no free span large enough.
var ErrExhausted = errors.New("arena: out of memory (raise RDMAKIT_ARENA_SIZE)")

// Arena is one memfd-backed mapping with a span allocator (an anonymous
// mapping, Fd -1, where memfd does not exist).
type Arena struct {
	Mem  []byte
	Fd   int
	Size int
	Ino  uint64

	// mu guards free (sorted by offset, coalesced) and closed.
	mu     sync.Mutex
	free   []span
	closed bool
}

type span struct{ off, n int }

// New creates an arena of size bytes (rounded up to pages).
//
// Where memfd does not exist (systems other than Linux) the arena is an
// anonymous private mapping instead: Fd is -1 and Ino 0, so no other
// process can map it (transport/shm needs Linux), and Free releases a
// span's pages by mapping fresh zero pages over it. Where no mapping can
// be made at all (Windows) New returns an error wrapping
// sys.ErrNotSupported.
func New(name string, size int) (*Arena, error) {
	size = roundUp(size)
	fd, err := memfd(name, int64(size))
	if errors.Is(err, sys.ErrNotSupported) {
		mem, aerr := sys.MapAnon(size)
		if aerr != nil {
			return nil, fmt.Errorf("arena: %w", aerr)
		}
		return &Arena{Mem: mem, Fd: -1, Size: size, free: []span{{0, size}}}, nil
	}
	if err != nil {
		return nil, err
	}
	mem, err := MapShared(fd, size)
	if err != nil {
		sys.Close(fd)
		return nil, err
	}
	ino, err := sys.Inode(fd)
	if err != nil {
		sys.Unmap(mem)
		sys.Close(fd)
		return nil, err
	}
	return &Arena{Mem: mem, Fd: fd, Size: size, Ino: ino, free: []span{{0, size}}}, nil
}

// memfd is sys.Memfd; tests replace it to take the fallback path on Linux.
var memfd = sys.Memfd

func roundUp(n int) int {
	p := sys.PageSize
	return (n + p - 1) / p * p
}

// Alloc returns a zeroed, page-aligned span of at least n bytes and its
// offset in the arena.
func (a *Arena) Alloc(n int) (int, []byte, error) {
	if n <= 0 {
		n = 1
	}
	n = roundUp(n)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return 0, nil, errors.New("arena: closed")
	}
	for i, s := range a.free {
		if s.n < n {
			continue
		}
		off := s.off
		if s.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = span{s.off + n, s.n - n}
		}
		return off, a.Mem[off : off+n : off+n], nil
	}
	return 0, nil, fmt.Errorf("%w: %d bytes requested", ErrExhausted, n)
}

// Free returns the span at off of n bytes (as passed to Alloc) to the arena
// and releases its pages.
func (a *Arena) Free(off, n int) {
	if n <= 0 {
		n = 1
	}
	n = roundUp(n)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	if a.Fd >= 0 {
		_ = sys.PunchHole(a.Fd, int64(off), int64(n))
	} else if err := sys.ReplaceWithAnon(a.Mem[off : off+n]); err != nil {
		// The span's pages could not be released; zero them so that
		// Alloc's promise holds.
		clear(a.Mem[off : off+n])
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// Coalesce with neighbours.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
}

// Offset returns the offset of b within the arena, or -1 if b is not in it.
func (a *Arena) Offset(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	base := sys.Addr(a.Mem)
	p := sys.Addr(b)
	if p < base || p+uintptr(len(b)) > base+uintptr(a.Size) {
		return -1
	}
	return int(p - base)
}

// Close unmaps the arena and closes its file.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	// Goroutines may still be polling a completion queue or copying into
	// a region of this arena when it closes (a misuse, but not one that
	// should kill the process). Swap the file's pages for anonymous zero
	// pages now, so the memory goes back at once, and unmap the spans in
	// use only after a grace period. The free spans — nearly all of the
	// reservation — are unmapped at once: nobody can be using them, and
	// holding a closed arena's whole address range for the grace period
	// let a few thousand Open/Close cycles exhaust the address space.
	err := sys.ReplaceWithAnon(a.Mem)
	if a.Fd >= 0 {
		sys.Close(a.Fd)
	}
	if err != nil {
		return sys.Unmap(a.Mem)
	}
	var used [][]byte
	at := 0
	for _, f := range a.free {
		if f.off > at {
			used = append(used, a.Mem[at:f.off])
		}
		sys.Unmap(a.Mem[f.off : f.off+f.n])
		at = f.off + f.n
	}
	if at < a.Size {
		used = append(used, a.Mem[at:a.Size])
	}
	a.free = nil
	quarantine(used)
	return nil
}

// Closed arenas' spans in use wait out closeGrace in a process-wide FIFO;
// quarantineMu guards it.
var (
	quarantineMu sync.Mutex
	quarantined  []*held
)

// held is one closed arena's spans in use and when they may go.
type held struct {
	spans [][]byte
	at    time.Time
	once  sync.Once
}

func (h *held) release() {
	h.once.Do(func() {
		for _, u := range h.spans {
			sys.Unmap(u)
		}
	})
}

// quarantine keeps spans mapped for closeGrace, then unmaps them.
func quarantine(spans [][]byte) {
	h := &held{spans: spans, at: time.Now().Add(closeGrace)}
	quarantineMu.Lock()
	quarantined = append(quarantined, h)
	quarantineMu.Unlock()
	time.AfterFunc(closeGrace, func() {
		h.release()
		quarantineMu.Lock()
		for i, x := range quarantined {
			if x == h {
				quarantined = append(quarantined[:i], quarantined[i+1:]...)
				break
			}
		}
		quarantineMu.Unlock()
	})
}

// MapShared maps size bytes of fd shared (sys.MapShared). When the
// address space is taken by closed arenas still in their grace period
// (their spans in use fragment it), it waits for the oldest to go and tries
// again, rather than fail because of contexts already closed; at most one
// grace period.
func MapShared(fd, size int) ([]byte, error) {
	mem, err := sys.MapShared(fd, size)
	for err != nil && errors.Is(err, syscall.ENOMEM) && releaseOldest() {
		mem, err = sys.MapShared(fd, size)
	}
	return mem, err
}

// releaseOldest waits until the oldest quarantined arena's grace period
// ends and unmaps its spans; false when none is left.
func releaseOldest() bool {
	quarantineMu.Lock()
	if len(quarantined) == 0 {
		quarantineMu.Unlock()
		return false
	}
	h := quarantined[0]
	quarantined = quarantined[1:]
	quarantineMu.Unlock()
	time.Sleep(time.Until(h.at))
	h.release()
	return true
}

// closeGrace is how long a closed arena's addresses stay mapped.
const closeGrace = 5 * time.Second
