package kv

// The master: which key lives where. It places values on holders (store
// nodes' pools), keeps versions and read leases, and evicts least
// recently used values under capacity. It does no I/O: the service
// (service.go) calls it under its lock, with the time of the call; expired
// leases, abandoned puts and silent holders are swept on every call.

import (
	"container/list"
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// holder is a store node's pool as the master sees it.
type holder struct {
	name    string
	session string // the joining store's random token: only it may beat or leave ("": the next to beat or join adopts it, after a failover)
	segment string
	alloc   *allocator
	ttl     time.Duration
	seen    time.Time
	entries int // replicas placed on it
}

// span is a range of a holder's pool.
type span struct {
	h        *holder
	off, len uint64
}

type replica struct {
	h   *holder
	off uint64 // the slot: the version header, then the value at off+valHdr
	// Of a put in progress: the headers its writer must set to 0 before
	// it writes the value (cache.go): ranges {off, len}; none unless it
	// overlaps dirty slots.
	clear []extent
}

// maxClears bounds the header ranges one replica's writer is given; a
// slot over more old slots than that is cleared whole.
const maxClears = 256

// valHdr is the room before each value in its holder's pool: the first 8
// bytes hold the version written there (little endian), 0 while a put
// writes a slot. A client that kept a value's location from an earlier
// Get reads the value, then the header, and trusts the value only if the
// header still holds the version it expects (docs/transfer.md, "Gets
// without the master").
const valHdr = allocAlign

// slot is the pool space a value of size bytes takes.
func slot(size uint64) uint64 { return size + valHdr }

// entry is one version of a key's value.
type entry struct {
	key     string
	ver     uint64 // unique for the store's life (a counter; see takeOver)
	tok     uint64 // random: names the put in progress to its commit or abort
	size    uint64
	reps    []replica
	visible bool   // committed and current
	dead    bool   // replaced or removed while leased: freed when the last lease goes
	readers int    // read leases held
	read    bool   // committed: clients may have its location (its slots go dirty when freed)
	cleared bool   // retired, and the client that retired it cleared its headers
	clearer uint64 // the lease of that client (0: none)
	// Of a put in progress: the parts of the dirty slots its slots
	// overlap that lie outside them, held (allocated) until it ends, and
	// those dirty slots (dirty again if it does not commit).
	holds []span
	dirt  []span
	// Of a put in progress: the key's version when it started, leased to
	// its writer, who clears its headers with the value's writes (so that
	// a commit that retires it needs no more writes).
	prev    *retired
	lru     *list.Element // visible entries only
	expires time.Time     // a put in progress is abandoned after this
}

type lease struct {
	e       *entry
	expires time.Time
}

// Location is where one replica of a value lives.
type Location struct {
	Segment string
	Offset  uint64
}

// maxHolders bounds the store nodes joined at once.
const maxHolders = 4096

// maxLeases bounds the read leases held at once (clients that never hand
// theirs back cost at most this until LeaseTTL frees them).
const maxLeases = 1 << 20

// master is the placement state. mu guards everything.
type master struct {
	leaseTTL time.Duration // read leases
	putTTL   time.Duration // puts in progress
	maxKeys  int           // entries, visible and in progress

	mu        sync.Mutex
	holders   map[string]*holder
	entries   map[string]*entry // key → visible version
	pending   map[uint64]*entry // put token → put in progress
	leases    map[uint64]*lease
	lru       *list.List    // of *entry, least recently used first
	next      uint64        // versions
	ids       *rand.ChaCha8 // lease ids and put tokens: unguessable, so that a client cannot release another's lease or end another's put
	lastSweep time.Time
	evictions uint64
	ha        *haMaster // nil: the table lives only here (ha.go)
}

func newMaster(leaseTTL, putTTL time.Duration) *master {
	var seed [32]byte
	crand.Read(seed[:]) // never fails (it panics where it cannot read)
	ids := rand.NewChaCha8(seed)
	return &master{
		leaseTTL: leaseTTL, putTTL: putTTL, maxKeys: 1 << 22,
		holders: map[string]*holder{}, entries: map[string]*entry{}, pending: map[uint64]*entry{},
		leases: map[uint64]*lease{}, lru: list.New(), ids: ids,
		// Versions start at a random point (in [2^32, 2^62)): a master that
		// restarts at the same address (without etcd, whose takeover starts
		// them past every earlier one: ha.go) does not hand out, at the
		// same places, the versions its predecessor did, which clients
		// that kept locations would take for the ones they read
		// (cache.go).
		next: 1<<32 + ids.Uint64()%(1<<62-1<<32),
	}
}

// sweep drops expired leases, abandoned puts and silent holders.
func (m *master) sweep(now time.Time) {
	if now.Sub(m.lastSweep) < 20*time.Millisecond {
		return
	}
	m.lastSweep = now
	for id, l := range m.leases {
		if now.After(l.expires) {
			m.endLease(id, true)
		}
	}
	for v, e := range m.pending {
		if now.After(e.expires) {
			delete(m.pending, v)
			m.journalPending(e, false)
			m.free(e)
		}
	}
	for name, h := range m.holders {
		if h.ttl > 0 && now.Sub(h.seen) > h.ttl {
			m.dropHolder(name)
		}
	}
}

// join registers a holder (again: a holder that re-joins with the same
// segment keeps its values). A name joined from another session is
// refused until that holder leaves or goes silent.
func (m *master) join(now time.Time, name, session, segment string, size uint64, ttl time.Duration) error {
	if h, ok := m.holders[name]; ok {
		if h.session != "" && h.session != session {
			return fmt.Errorf("%w: store node %q is joined from another session", errTaken, name)
		}
		h.session = session
		if h.segment == segment && h.alloc.size == size&^(allocAlign-1) {
			h.seen, h.ttl = now, ttl
			return nil
		}
		m.dropHolder(name)
	}
	if len(m.holders) >= maxHolders {
		return fmt.Errorf("%w: %d store nodes joined", ErrFull, maxHolders)
	}
	m.holders[name] = &holder{name: name, session: session, segment: segment, alloc: newAllocator(size), ttl: ttl, seen: now}
	m.journalHolder(name, segment, size)
	return nil
}

func (m *master) beat(now time.Time, name, session string) error {
	h, ok := m.holders[name]
	if !ok || h.session != "" && h.session != session {
		return fmt.Errorf("%w: holder %q not joined", ErrNoNodes, name)
	}
	h.session = session
	h.seen = now
	return nil
}

// leave drops a holder at the request of the session that joined it.
func (m *master) leave(name, session string) {
	if h, ok := m.holders[name]; ok && (h.session == "" || h.session == session) {
		m.dropHolder(name)
	}
}

// dropHolder forgets a holder and every replica on it; values left with
// no replica are gone.
func (m *master) dropHolder(name string) {
	h := m.holders[name]
	if h == nil {
		return
	}
	delete(m.holders, name)
	m.journalHolder(name, "", 0)
	drop := func(e *entry) bool {
		k := 0
		for _, r := range e.reps {
			if r.h != h {
				e.reps[k] = r
				k++
			}
		}
		e.reps = e.reps[:k]
		return k == 0 && e.size > 0
	}
	for key, e := range m.entries {
		n := len(e.reps)
		if drop(e) {
			m.unlink(e)
			delete(m.entries, key)
			m.journalEntry(e, false)
		} else if len(e.reps) != n {
			m.journalEntry(e, true)
		}
	}
	for v, e := range m.pending {
		n := len(e.reps)
		if drop(e) {
			delete(m.pending, v)
			m.journalPending(e, false)
		} else if len(e.reps) != n {
			m.journalPending(e, true)
		}
	}
}

// free gives an entry's space back.
func (m *master) free(e *entry) {
	for _, r := range e.reps {
		if m.holders[r.h.name] == r.h {
			r.h.alloc.release(r.off, slot(e.size))
			if e.read && !e.cleared {
				r.h.alloc.markDirty(r.off, slot(e.size))
			}
			r.h.entries--
		}
	}
	e.reps = nil
	m.endHolds(e, !e.read)
}

// endHolds frees what a put held while its writer cleared old headers;
// dirty: those slots are dirty again (the put did not commit: its writer
// may not have cleared them).
func (m *master) endHolds(e *entry, dirty bool) {
	for _, x := range e.holds {
		if m.holders[x.h.name] == x.h {
			x.h.alloc.release(x.off, x.len)
		}
	}
	if dirty {
		for _, x := range e.dirt {
			if m.holders[x.h.name] == x.h {
				x.h.alloc.markDirty(x.off, x.len)
			}
		}
	}
	e.holds, e.dirt = nil, nil
}

// place allocates a slot for a value of size bytes on h and works out
// which headers its writer clears first: its own, and those of the dirty
// slots it overlaps. Until the put ends, no other put may write anywhere
// in those slots (a reader that trusts one of their headers would see
// its bytes change): their parts outside this slot are held for it.
func (m *master) place(e *entry, h *holder, size uint64) bool {
	n := slot(size)
	off, ok := h.alloc.alloc(n)
	if !ok {
		return false
	}
	n = roundUp(n)
	// Its own header needs no clearing: a reader trusts a header only at
	// the start of a slot it read, and such a slot, freed, is dirty (then
	// cleared here) or was cleared by the client that retired it.
	r := replica{h: h, off: off}
	var outside []extent
	for _, d := range h.alloc.takeDirty(off, n) {
		e.dirt = append(e.dirt, span{h, d.off, d.len})
		// Dirty slots lie in free space: the parts outside this slot
		// are free.
		if d.off < off && h.alloc.reserve(d.off, off-d.off) {
			e.holds = append(e.holds, span{h, d.off, off - d.off})
		}
		if end := d.off + d.len; end > off+n && h.alloc.reserve(off+n, end-off-n) {
			e.holds = append(e.holds, span{h, off + n, end - off - n})
		}
		if d.off < off {
			outside = append(outside, extent{d.off, 8})
		} else {
			r.clear = append(r.clear, extent{d.off, 8})
		}
	}
	if len(r.clear) > maxClears {
		r.clear = append(r.clear[:0], extent{off, n})
	}
	r.clear = append(r.clear, outside...)
	e.reps = append(e.reps, r)
	return true
}

func (m *master) unlink(e *entry) {
	if e.lru != nil {
		m.lru.Remove(e.lru)
		e.lru = nil
	}
	e.visible = false
}

// retire takes a visible entry out of the table; its space is freed now,
// or when its last reader lets go.
func (m *master) retire(e *entry) {
	m.unlink(e)
	delete(m.entries, e.key)
	m.journalEntry(e, false)
	if e.readers > 0 {
		e.dead = true
		return
	}
	m.free(e)
}

// evictFor retires the least recently used value not being read that
// has a replica on one of the holders ok accepts; false if there is none.
func (m *master) evictFor(ok func(*holder) bool) bool {
	for el := m.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		if e.readers > 0 {
			continue
		}
		for _, r := range e.reps {
			if ok(r.h) {
				m.retire(e)
				m.evictions++
				return true
			}
		}
	}
	return false
}

// putStart places a new version of key: replicas holders (distinct),
// chosen by free space, evicting where needed.
func (m *master) putStart(now time.Time, key string, size uint64, replicas int) (*entry, error) {
	if len(m.entries)+len(m.pending) >= m.maxKeys {
		return nil, fmt.Errorf("%w: %d keys", ErrFull, m.maxKeys)
	}
	if len(m.holders) < replicas {
		return nil, fmt.Errorf("%w: %d replicas wanted, %d store nodes", ErrNoNodes, replicas, len(m.holders))
	}
	m.next++
	e := &entry{key: key, ver: m.next, tok: m.newID(func(id uint64) bool { return m.pending[id] != nil }), size: size, expires: now.Add(m.putTTL)}
	if size > 0 {
		hs := make([]*holder, 0, len(m.holders))
		for _, h := range m.holders {
			if h.alloc.size >= roundUp(slot(size)) {
				hs = append(hs, h)
			}
		}
		if len(hs) < replicas {
			return nil, fmt.Errorf("%w: a %d-byte value fits %d store node(s), %d replicas wanted", ErrTooLarge, size, len(hs), replicas)
		}
		// Holders this master has heard from first: after a failover
		// the table's holders are taken on trust (session "") until they
		// beat, and one that went with the old master (killed, paused)
		// is still listed for its holder TTL while its transfer node is
		// gone, so a value placed there fails to be written ("no such
		// segment"). The others only where those have no room.
		sort.Slice(hs, func(i, j int) bool {
			if hi, hj := hs[i].session != "", hs[j].session != ""; hi != hj {
				return hi
			}
			fi, fj := hs[i].alloc.size-hs[i].alloc.used, hs[j].alloc.size-hs[j].alloc.used
			if fi != fj {
				return fi > fj
			}
			return hs[i].name < hs[j].name
		})
		chosen := func(h *holder) bool {
			for _, r := range e.reps {
				if r.h == h {
					return true
				}
			}
			return false
		}
		candidate := func(h *holder) bool { return h.alloc.size >= roundUp(slot(size)) && !chosen(h) }
		for len(e.reps) < replicas {
			placed := false
			for _, h := range hs {
				if chosen(h) {
					continue
				}
				if m.place(e, h, size) {
					h.entries++
					placed = true
					break
				}
			}
			// No room: evict the least recently used value on a holder
			// that could take this one, and try again.
			if !placed && !m.evictFor(candidate) {
				break
			}
		}
		if len(e.reps) < replicas {
			m.free(e)
			return nil, fmt.Errorf("%w: no room for %d bytes (values being read or written hold the rest)", ErrFull, size)
		}
	}
	if cur := m.entries[key]; cur != nil && len(cur.reps) > 0 && len(m.leases) < maxLeases {
		e.prev = &retired{ver: cur.ver, locs: cur.locations(), lease: m.lease(now, cur)}
	}
	m.pending[e.tok] = e
	m.journalPending(e, true)
	return e, nil
}

// newID returns a random nonzero id that taken does not report taken (a
// counter would let a client work out the ids of others).
func (m *master) newID(taken func(uint64) bool) uint64 {
	id := m.ids.Uint64()
	for id == 0 || taken(id) {
		id = m.ids.Uint64()
	}
	return id
}

// retired is a version taken out of the table by a commit or a remove:
// where its headers are, for the client to clear (cache.go), and a lease
// that keeps its space from reuse until the client has cleared them and
// let go (else its writes could land in a new value's bytes).
type retired struct {
	ver   uint64
	lease uint64 // 0: none (a value with no bytes)
	locs  []Location
}

// retireLeased retires e, leased to the caller (see retired).
func (m *master) retireLeased(now time.Time, e *entry) *retired {
	r := &retired{ver: e.ver, locs: e.locations()}
	if len(e.reps) > 0 && len(m.leases) < maxLeases {
		r.lease = m.lease(now, e)
		e.clearer = r.lease
	} else {
		r.locs = nil
	}
	m.retire(e)
	return r
}

// putEnd commits (the version becomes the key's value, the old one
// retires) or aborts the put tok names. A commit returns the version it
// replaced (nil if none).
func (m *master) putEnd(now time.Time, tok uint64, commit bool) (*retired, error) {
	e, ok := m.pending[tok]
	if !ok {
		if commit && m.ha != nil {
			// A commit sent again after a failover: done if it landed.
			for _, v := range m.entries {
				if v.tok == tok {
					return nil, nil
				}
			}
		}
		return nil, fmt.Errorf("%w: put expired, ended, or its store node left", ErrNotFound)
	}
	delete(m.pending, tok)
	m.journalPending(e, false)
	if !commit {
		m.free(e)
		return nil, nil
	}
	m.endHolds(e, false)
	for i := range e.reps {
		e.reps[i].clear = nil
	}
	e.read = true
	var gone *retired
	if old := m.entries[e.key]; old != nil {
		if e.prev != nil && old.ver == e.prev.ver {
			// Its writer cleared its headers before it committed.
			old.cleared = true
			m.retire(old)
		} else {
			gone = m.retireLeased(now, old)
		}
	}
	e.visible = true
	e.lru = m.lru.PushBack(e)
	m.entries[e.key] = e
	m.journalEntry(e, true)
	return gone, nil
}

// get leases the key's value for reading.
func (m *master) get(now time.Time, key string) (*entry, uint64, error) {
	e, ok := m.entries[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	if len(m.leases) >= maxLeases {
		return nil, 0, fmt.Errorf("%w: %d reads in progress", ErrFull, maxLeases)
	}
	m.lru.MoveToBack(e.lru)
	return e, m.lease(now, e), nil
}

// lease takes a read lease on e.
func (m *master) lease(now time.Time, e *entry) uint64 {
	// A random id (not a counter): a release names a lease by its id
	// alone, from any connection, so an id another client could work out
	// would let it free a value still being read.
	id := m.newID(func(id uint64) bool { return m.leases[id] != nil })
	e.readers++
	m.leases[id] = &lease{e: e, expires: now.Add(m.leaseTTL)}
	return id
}

func (m *master) releaseLocked(id uint64) { m.endLease(id, false) }

// endLease ends a lease: handed back, or expired.
func (m *master) endLease(id uint64, expired bool) {
	l, ok := m.leases[id]
	if !ok {
		return
	}
	delete(m.leases, id)
	e := l.e
	if id == e.clearer && !expired {
		e.cleared = true // its headers are 0: not dirty when freed
	}
	e.readers--
	if e.dead && e.readers == 0 {
		m.free(e)
	}
}

// remove retires key's value and returns it (its headers are the
// remover's to clear).
func (m *master) remove(now time.Time, key string) (*retired, error) {
	e, ok := m.entries[key]
	if !ok {
		return nil, ErrNotFound
	}
	return m.retireLeased(now, e), nil
}

// KeyInfo is a key and its value's size, as List returns them.
type KeyInfo struct {
	Key  []byte
	Size uint64
}

// list returns, in byte order, the keys starting with prefix and after
// after, as many as fit in limit keys and budget bytes of answer (each
// key costing listCost), and whether keys were left out. Only the keys are
// copied and sorted; a KeyInfo is made only for those returned.
func (m *master) list(prefix, after string, limit, budget int) ([]KeyInfo, bool) {
	var keys []string
	for k := range m.entries {
		if strings.HasPrefix(k, prefix) && k > after {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []KeyInfo
	for _, k := range keys {
		if len(out) == limit || budget < listCost(k) {
			return out, true
		}
		budget -= listCost(k)
		out = append(out, KeyInfo{Key: []byte(k), Size: m.entries[k].size})
	}
	return out, false
}

// listCost is a key's share of a List answer: {key bytes16, size u64}.
func listCost(k string) int { return 2 + len(k) + 8 }

// NodeStats is one store node's share, as Stats returns it.
type NodeStats struct {
	Name     string
	Capacity uint64
	Used     uint64
	Values   int
}

// Stats describes the store.
type Stats struct {
	Keys      int
	Leases    int
	Evictions uint64
	Nodes     []NodeStats
}

func (m *master) stats() Stats {
	s := Stats{Keys: len(m.entries), Leases: len(m.leases), Evictions: m.evictions}
	for _, h := range m.holders {
		s.Nodes = append(s.Nodes, NodeStats{Name: h.name, Capacity: h.alloc.size, Used: h.alloc.used, Values: h.entries})
	}
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	return s
}

// locations returns where the value's replicas are (the value, after
// its header).
func (e *entry) locations() []Location {
	l := make([]Location, len(e.reps))
	for i, r := range e.reps {
		l[i] = Location{Segment: r.h.segment, Offset: r.off + valHdr}
	}
	return l
}
