package kv

// Gets without the master. A client keeps, per key it read or wrote, the
// value's version, size and locations (locCache); the next Get of the key
// reads the value one-sided from there, then reads the 8-byte version
// header stored valHdr bytes before it (slot layout: master.go), and
// keeps the value only if the header still holds the version it expects.
// Otherwise (the value was replaced, removed, or its space reused; the
// holder left) it forgets the location and asks the master, which leases
// the value for the read as before.
//
// Why a matching header means a whole value: a version is written to a
// slot only by the put that owns it. A slot freed after clients could
// read it has its header set to 0 before any byte of it is written
// again: by the client that retired it (a commit or remove hands it the
// old locations under a lease it lets go only once its writes are done:
// clearHeaders), or else ("dirty" slots: evicted, or that client failed)
// by the first put placed over any part of it, which writes the value only
// once that clearing completed, while the master holds the rest of the
// old slot for it (writeSlots; master.place). The reader's header read
// starts after its value read completed; if it still finds the version,
// no clearing had happened when the header was read, so no byte of the
// slot had been written again while the value was read. As the retiring
// client clears before Put or Remove returns, a Get that starts after
// that does not find the old version: reads stay as fresh as through the
// master. A value evicted for room but not yet overwritten may still be
// read this way by a client that kept its location: it is a value a Put
// committed, whole.
//
// Over shm0 the two Reads go in one batch, the header's fenced after the
// value's on the same QP (transfer.Request.After; inOrder); elsewhere, and
// for values over one slice, in two batches. Over tcp0 the fenced Read is
// one more round trip through the transport: there a kept location is
// read speculatively instead, while the master is asked (speculate, below:
// the RPC and the Read overlap), and only while few Gets run at once in
// the process (getsNow); with more, every Get goes through the master as
// without a kept location.
//
// The cache is a map under a mutex, bounded by maxCached keys (one is
// dropped for each added beyond). Methods run on the caller's goroutine.

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/transfer"
)

// maxCached bounds the locations a client keeps.
const maxCached = 1 << 16

// maxTouches is the most keys read without the master that one request
// reports (service.go); a client keeps at most 4 times that to report.
const maxTouches = 256

// cachedLoc is what a client knows of one key's value.
type cachedLoc struct {
	ver  uint64
	size int
	locs []Location
	tr   string // the transport locs[0] is reached over (Store.transport)
	// read: learnt from a Get (the master's answer for a read), not
	// from this client's Put (see direct).
	read bool
}

type locCache struct {
	mu  sync.Mutex
	m   map[string]cachedLoc
	via map[string]string // segment → the transport this node reaches it over (Store.transport)
}

// transport returns the transport segment is reached over ("" if not
// known); the first call per segment asks the transfer node.
func (s *Store) transport(ctx context.Context, segment string) string {
	c := &s.cache
	c.mu.Lock()
	tr, ok := c.via[segment]
	c.mu.Unlock()
	if ok {
		return tr
	}
	tr, err := s.node.Transport(ctx, segment)
	if err != nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.via == nil || len(c.via) > maxCached {
		c.via = map[string]string{}
	}
	c.via[segment] = tr
	return tr
}

// validated reports whether a kept location is read without the master
// (checked by its header): everywhere but over tcp0, where it is read
// speculatively (speculate).
func (c cachedLoc) validated() bool { return c.tr != "tcp" }

// getsNow counts the GetMRBatch calls of this process in progress. Over
// tcp0 a Get reads a kept location speculatively only while at most
// maxTCPDirect are: with one Get at a time the RPC and the Read overlap
// on the two sides of the process (the master's goroutine and the
// transport's), but with many the process is busy anyway and a kept
// location gone stale (another client replaced the value) costs a Read
// for nothing: kv bench, 8 clients in one process, 1 MiB values, 2000
// Gets over 100 keys whose last Puts were spread over the clients, 2
// shared cores: GET 3.6k ops/s through the master, 2.7k speculating.
// (Reading with the header check instead, fenced after the value, cost
// more than the master's RPC there: 1 MiB, mean per Get, the RPC 0.57 ms
// and the value's Read 1.17 ms against 2.16 ms for both Reads fenced in
// one batch.)
var getsNow atomic.Int32

// direct reports whether a Get may now read a location it kept before the
// master answers: while few Gets of the process run at once (getsNow),
// always; with more, only a location a Get learnt, and only while those
// have mostly been current (s.stale). With 8 clients that each Put a
// share of 100 keys and then Get them all, most locations a client's Puts
// left are stale (another client put the key since): read speculatively,
// each costs a Read for nothing. Those a Get learnt stay current as long
// as nobody writes the key, and where writers are busy (stale counts how
// often they were not) Gets go through the master first again. kv bench
// --tests get (locations from Gets), tcp0, 8 clients, 256 KiB, 2 shared
// cores, alternating 4 runs each (2026-11-30): GET 9.0k-9.7k ops/s
// without speculation, 10.4k-12.5k with it.
func (s *Store) direct(c cachedLoc) bool {
	return c.tr != "tcp" || getsNow.Load() <= maxTCPDirect() || c.read && s.stale.Load() < staleBlock
}

// The staleness count of a client's locations learnt by Gets over tcp0
// (Store.stale): each the master's answer shows stale adds staleMiss,
// each it shows current takes one off (at least 0, at most staleMax);
// speculation with many Gets in progress stops at staleBlock. So it runs
// while at most about one in staleMiss+1 such locations is stale, and a
// run of stale ones stops it until some staleMax current ones were seen
// (Gets through the master still compare what they kept).
const (
	staleMiss  = 8
	staleBlock = 2 * staleMiss
	staleMax   = 64
)

// noteStale counts whether a location a Get learnt (kept, over tcp0) was
// still current by the master's answer: version ver at locs, size.
func (s *Store) noteStale(kept cachedLoc, ver uint64, size int, locs []Location) {
	if !kept.read || kept.tr != "tcp" {
		return
	}
	current := kept.ver == ver && kept.size == size && slices.Contains(locs, kept.locs[0])
	for {
		old := s.stale.Load()
		n := old - 1
		if !current {
			n = old + staleMiss
		}
		n = min(max(n, 0), staleMax)
		if n == old || s.stale.CompareAndSwap(old, n) {
			return
		}
	}
}

// maxTCPDirect is GOMAXPROCS-1, at least 1 (as many as Batch.Wait lets
// poll their completion queues themselves).
func maxTCPDirect() int32 { return int32(max(1, runtime.GOMAXPROCS(0)-1)) }

// inOrder reports whether the transport named keeps a fenced Read after a
// Read (verbs.SendFence): software ones (shm0 runs a QP's requests in
// order; tcp0's requester holds the fenced request until the Reads before
// it completed). siw (Linux 6.1) never sends a READ fenced after a READ.
func inOrder(transport string) bool { return transport == "shm" || transport == "tcp" }

func (c *locCache) get(key []byte) (cachedLoc, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[string(key)]
	return v, ok
}

// put keeps a location (a value with no bytes has no header: not kept;
// nor one whose transport is not known).
func (c *locCache) put(key []byte, v cachedLoc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v.size == 0 || len(v.locs) == 0 || v.ver == 0 || v.tr == "" {
		delete(c.m, string(key))
		return
	}
	if c.m == nil {
		c.m = map[string]cachedLoc{}
	}
	if _, ok := c.m[string(key)]; !ok && len(c.m) >= maxCached {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[string(key)] = v
}

func (c *locCache) drop(key []byte) {
	c.mu.Lock()
	delete(c.m, string(key))
	c.mu.Unlock()
}

// headerOf returns the request range of the version header of the value
// at l (false for an offset no slot has).
func headerOf(l Location) (transfer.Request, bool) {
	if l.Offset < valHdr {
		return transfer.Request{}, false
	}
	return transfer.Request{Segment: l.Segment, Offset: l.Offset - valHdr, Length: 8}, true
}

// decodeRetired reads a retired version (service.go), adding its
// locations and lease to locs and leases.
func decodeRetired(d *frame.Decoder, locs []Location, leases []uint64) ([]Location, []uint64) {
	d.Uint64()
	if id := d.Uint64(); id != 0 {
		leases = append(leases, id)
	}
	return append(locs, decodeLocs(d)...), leases
}

// clearHeaders sets the version headers of locs to 0, returns when the
// writes are done, and then hands back the leases that kept the space from
// reuse meanwhile (which tells the master the headers are clear). When a
// write fails the leases are left to expire: the master then treats the
// space as dirty (master.go).
func (s *Store) clearHeaders(ctx context.Context, locs []Location, leases []uint64) {
	if len(locs) == 0 {
		s.release(leases...)
		return
	}
	zero, err := s.stage(8)
	if err != nil {
		return // (the leases expire)
	}
	defer s.unstage(zero)
	clear(zero.Bytes()[:8])
	var reqs []transfer.Request
	var owner []int
	for _, l := range locs {
		if r, ok := headerOf(l); ok {
			r.Op, r.Local = transfer.Write, zero
			reqs = append(reqs, r)
			owner = append(owner, 0)
		}
	}
	if s.move(ctx, reqs, owner, make([]error, 1))[0] == nil {
		s.release(leases...)
	}
}

// lookup fills kept[i] with the location kept for keys[i] where one is
// kept that fits dsts[i] (else leaves it zero) and reports whether any is.
func (c *locCache) lookup(keys [][]byte, dsts []Buf, kept []cachedLoc) bool {
	any := false
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, k := range keys {
		v, ok := c.m[string(k)]
		if !ok || v.size > dsts[i].Len {
			continue
		}
		if _, ok := headerOf(v.locs[0]); !ok {
			delete(c.m, string(k))
			continue
		}
		kept[i], any = v, true
	}
	return any
}

// getCached reads the pending keys whose locations this client keeps
// (kept, from lookup) and are validated, as the file header says; those
// read and validated are done (pending false), the others are left
// pending (their locations forgotten).
func (s *Store) getCached(ctx context.Context, keys [][]byte, dsts []Buf, pending []bool, sizes []int, kept []cachedLoc) {
	var idx []int
	var cl []cachedLoc
	for i, c := range kept {
		if !pending[i] || c.ver == 0 || !c.validated() {
			continue // (over tcp0: read while the master is asked, speculate)
		}
		idx = append(idx, i)
		cl = append(cl, c)
	}
	if len(idx) == 0 {
		return
	}
	hdr, err := s.stage(8 * len(idx))
	if err != nil {
		return
	}
	defer s.unstage(hdr)
	// Each value and then its header in one batch, the header read
	// fenced after the value's (transfer.Request.After); where the engine
	// cannot order them so (a value over one slice), the headers in a
	// second batch.
	var reqs []transfer.Request
	var owner []int
	for j, i := range idx {
		c := cl[j]
		h, _ := headerOf(c.locs[0])
		h.Op, h.Local, h.LocalOffset, h.After = transfer.Read, hdr, 8*j, true
		reqs = append(reqs, transfer.Request{Op: transfer.Read, Local: dsts[i].MR, LocalOffset: dsts[i].Offset,
			Segment: c.locs[0].Segment, Offset: c.locs[0].Offset, Length: c.size}, h)
		owner = append(owner, i, i)
	}
	errs := make([]error, len(keys))
	var failed []error
	// Fenced in one batch only over the transports that order them.
	fenced := !slices.ContainsFunc(cl, func(c cachedLoc) bool {
		return c.size > s.oneSlice() || !inOrder(c.tr)
	})
	if fenced {
		failed = s.move(ctx, reqs, owner, errs)
	}
	if !fenced || slices.ContainsFunc(failed, func(err error) bool { return errors.Is(err, transfer.ErrAfter) }) {
		var data, hdrs []transfer.Request
		var down, hown []int
		for k := 0; k < len(reqs); k += 2 {
			r := reqs[k+1]
			r.After = false
			data, hdrs = append(data, reqs[k]), append(hdrs, r)
			down, hown = append(down, owner[k]), append(hown, owner[k])
		}
		failed = s.move(ctx, data, down, errs)
		k := 0
		for j := range hdrs {
			if failed[hown[j]] == nil {
				hdrs[k], hown[k] = hdrs[j], hown[j]
				k++
			}
		}
		// The headers, read only after the values' reads completed.
		for i, f := range s.move(ctx, hdrs[:k], hown[:k], errs) {
			if f != nil && failed[i] == nil {
				failed[i] = f
			}
		}
	}
	b := hdr.Bytes()
	for j, i := range idx {
		if failed[i] != nil || binary.LittleEndian.Uint64(b[8*j:]) != cl[j].ver {
			// Forgotten here too: speculate would read it again, and the
			// master's answer must be kept afresh.
			s.cache.drop(keys[i])
			kept[i] = cachedLoc{}
			continue
		}
		sizes[i], pending[i] = cl[j].size, false
		s.touch(keys[i])
	}
}

// A speculative Get: the keys getCached left pending whose locations this
// client keeps are read from there while the master is asked (its RPC and
// the Reads overlap), and a read is kept only if the master's answer
// names the same version, at the location read, with the same size.
// Otherwise the key is read again from where the answer says, as without
// a kept location.
//
// Why that is whole: versions are unique for the store's life, and a
// location is kept only once the master answered or committed its
// version (a Get or this client's Put returned), so the read started
// after that version was committed to that slot. The master's answer
// says the version was still the key's value when it was given, and the
// slot of a key's value is neither freed nor written while it is (a put
// writes only into space the master placed it in, never into a current
// version's slot); from then on the answer's read lease keeps it, as for
// any Get through the master (the read must end within 9/10 of the lease,
// counted from before the request, or the Get is tried again). So no byte
// of the slot was written while it was read. And the value is the one
// current when the master answered, during the Get: as fresh as without
// the speculation.
//
// It serves tcp0 (validated), where the header's Read, fenced after the
// value's, is one more round trip through the transport: a Get takes the
// longer of the master's RPC and the Read instead of the sum of two
// round trips. kv bench GET over tcp0, one client, 256 KiB, 2 shared
// cores, old and new builds alternating, five runs each (2026-11-30):
// 10.7k (9.8k-11.2k) ops/s and p50 84 µs with the header check, 12.3k
// (11.8k-12.7k) and 74 µs speculating. With the store node in the
// same process, as kv bench runs it: the master's goroutine answers on
// one core while the transport's move the value on the other.

// spec is the speculative reads of one Get call.
type spec struct {
	b    *transfer.Batch // nil: none
	idx  []int           // the keys read, in request order
	cl   []cachedLoc
	kept int // reads kept (settle)
}

// speculate starts reading the pending keys whose locations this client
// keeps (into their destinations); wait must be called before those are
// used again. Each read writes the kept size, c.size bytes, whatever the
// master then answers: where the key turns out to be gone, failed, or
// smaller, the destination beyond the size returned holds those bytes
// (unspecified to the caller: GetMRBatch).
func (s *Store) speculate(ctx context.Context, keys [][]byte, dsts []Buf, pending []bool, kept []cachedLoc) *spec {
	var sp *spec
	var reqs []transfer.Request
	for i, c := range kept {
		if !pending[i] || c.ver == 0 || !s.direct(c) {
			continue
		}
		if sp == nil {
			sp = &spec{}
		}
		sp.idx = append(sp.idx, i)
		sp.cl = append(sp.cl, c)
		reqs = append(reqs, transfer.Request{Op: transfer.Read, Local: dsts[i].MR, LocalOffset: dsts[i].Offset,
			Segment: c.locs[0].Segment, Offset: c.locs[0].Offset, Length: c.size})
	}
	if len(reqs) == 0 {
		return nil
	}
	// Posting waits for send queue room: ctx bounds it as the Get's own
	// reads are (getOnce), not the caller's context, which may have no
	// end.
	b, err := s.node.Submit(ctx, reqs)
	if err != nil {
		return nil // (a segment gone: the master will say where)
	}
	sp.b = b
	return sp
}

// wait waits until the speculative reads are done (their destinations are
// no longer written).
func (sp *spec) wait(ctx context.Context) {
	if sp != nil && sp.b != nil {
		sp.b.Wait(context.WithoutCancel(ctx))
	}
}

// settle marks done (pending false) the keys whose speculative read
// completed and matches the master's answer: version vers[i], size
// sizes[i], the location read among locs[i]. Call it after wait.
func (sp *spec) settle(pending []bool, errs []error, vers []uint64, sizes []int, locs [][]Location) {
	if sp == nil || sp.b == nil {
		return
	}
	for j, i := range sp.idx {
		c := sp.cl[j]
		if st, _ := sp.b.Status(j); st != transfer.Completed || !pending[i] || errs[i] != nil ||
			vers[i] != c.ver || sizes[i] != c.size || !slices.Contains(locs[i], c.locs[0]) {
			continue
		}
		pending[i] = false
		sp.kept++
	}
}
