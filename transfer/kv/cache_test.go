package kv

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestCachedGetValidated: a client that read a key keeps its location
// and reads it again without the master (over tcp0: while it asks the
// master, speculate); once the value is replaced, removed, or evicted and
// its space reused by values laid out differently, such a read must not
// return the bytes now there (the header check, or over tcp0 the check
// against the master's answer; with either removed this test fails).
func TestCachedGetValidated(t *testing.T) {
	// shm0 and tcp0, default slices: over shm0 the header Read fenced
	// after the value's in one batch; shm0 with 64 KiB slices: the values
	// are over one slice, two batches (as over RDMA devices); tcp0 with
	// 64 KiB slices: speculative reads of several slices.
	for _, c := range []struct {
		dev   string
		slice int
	}{{"shm0", 0}, {"tcp0", 0}, {"shm0", 64 << 10}, {"tcp0", 64 << 10}} {
		t.Run(fmt.Sprint(c.dev, "-slice", c.slice), func(t *testing.T) { testCachedGetValidated(t, c.dev, c.slice) })
	}
}

func testCachedGetValidated(t *testing.T, dev string, slice int) {
	ctx := context.Background()
	ss := cluster(t, dev, 1, 1<<20, func(c *Config) { c.Transfer.SliceSize = slice })
	open := func() *Store {
		tc := tcfg(dev)
		tc.SliceSize = slice
		s, err := Open(ctx, Config{Addr: ss[0].Addr(), Transfer: tc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	c1, c2 := open(), open()
	a := value(1, 300<<10)
	if err := c2.Put(ctx, []byte("a"), a); err != nil {
		t.Fatal(err)
	}
	get := func(k string) ([]byte, error) { return c1.Get(ctx, []byte(k)) }
	if v, err := get("a"); err != nil || !bytes.Equal(v, a) {
		t.Fatalf("first get: %v", err)
	}
	if _, ok := c1.cache.get([]byte("a")); !ok {
		t.Fatal("location not kept after a get")
	}
	before, _ := c1.Stats(ctx)
	spec := c1.specKept.Load()
	for i := 0; i < 20; i++ {
		if v, err := get("a"); err != nil || !bytes.Equal(v, a) {
			t.Fatalf("cached get: %v", err)
		}
	}
	if dev == "tcp0" {
		if n := c1.specKept.Load() - spec; n != 20 {
			t.Fatalf("%d of 20 gets kept their speculative reads", n)
		}
	} else if after, _ := c1.Stats(ctx); after.Leases != before.Leases {
		t.Fatalf("cached gets took leases: %d then %d", before.Leases, after.Leases)
	}
	// Replaced by another client: the new value at once.
	b := value(2, 200<<10)
	if err := c2.Put(ctx, []byte("a"), b); err != nil {
		t.Fatal(err)
	}
	if v, err := get("a"); err != nil || !bytes.Equal(v, b) {
		t.Fatalf("get after a replace: %d bytes, %v (stale or torn)", len(v), err)
	}
	// Removed by another client: gone at once.
	if err := c2.Remove(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if v, err := get("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after a remove: %d bytes, %v", len(v), err)
	}
	// Evicted, and its space reused by values that straddle its slot.
	if err := c2.Put(ctx, []byte("a"), a); err != nil {
		t.Fatal(err)
	}
	if v, err := get("a"); err != nil || !bytes.Equal(v, a) {
		t.Fatalf("get: %v", err)
	}
	c1.Exists(ctx, []byte("x")) // c1's request carries its touch of a now, not during the fills
	for i := 0; i < 100; i++ {
		if err := c2.Put(ctx, []byte(fmt.Sprint("fill", i)), value(uint64(10+i), 70<<10+i*64+8)); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _ := c2.Exists(ctx, []byte("a")); ok {
		t.Fatal("a not evicted")
	}
	v, err := get("a")
	if err == nil && !bytes.Equal(v, a) {
		t.Fatalf("get of an evicted key whose space was reused: %d other bytes", len(v))
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
}

// TestCachedGetTCPPolicy: over tcp0 a client keeps the locations of
// values of every size, reads none of them with the header check, reads
// those a Get learnt speculatively, and those its own Put left only while
// at most maxTCPDirect Gets of the process are in progress.
func TestCachedGetTCPPolicy(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "tcp0", 1, 4<<20, nil)
	c := client(t, "tcp0", ss[0].Addr())
	small, big := value(1, 4<<10), value(2, 1<<20)
	for k, v := range map[string][]byte{"small": small, "big": big} {
		if err := ss[0].Put(ctx, []byte(k), v); err != nil {
			t.Fatal(err)
		}
		if got, err := c.Get(ctx, []byte(k)); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s: %v", k, err)
		}
		l, ok := c.cache.get([]byte(k))
		if !ok {
			t.Fatalf("%s: location not kept", k)
		}
		if l.validated() || !l.read {
			t.Fatalf("%s: kept %+v: read with the header check over tcp0, or not marked as learnt by a Get", k, l)
		}
		spec := c.specKept.Load()
		if got, err := c.Get(ctx, []byte(k)); err != nil || !bytes.Equal(got, v) {
			t.Fatalf("get %s again: %v", k, err)
		}
		if c.specKept.Load() != spec+1 {
			t.Fatalf("%s: the speculative read not kept", k)
		}
	}
	// As if called in a Get while maxTCPDirect others are in progress.
	getsNow.Add(maxTCPDirect() + 1)
	defer getsNow.Add(-maxTCPDirect() - 1)
	// A location a Get learnt: still read speculatively.
	spec := c.specKept.Load()
	if got, err := c.Get(ctx, []byte("small")); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("get: %v", err)
	}
	if c.specKept.Load() != spec+1 {
		t.Fatalf("%d Gets in progress: a location a Get learnt not read speculatively", getsNow.Load())
	}
	// One this client's Put left: through the master then, still whole,
	// and the location then kept as learnt by a Get.
	if err := c.Put(ctx, []byte("small"), big[:len(small)]); err != nil {
		t.Fatal(err)
	}
	if l, ok := c.cache.get([]byte("small")); !ok || l.read {
		t.Fatalf("after a Put: kept %+v, %v", l, ok)
	}
	spec = c.specKept.Load()
	if got, err := c.Get(ctx, []byte("small")); err != nil || !bytes.Equal(got, big[:len(small)]) {
		t.Fatalf("get through the master: %v", err)
	}
	if c.specKept.Load() != spec {
		t.Fatalf("%d Gets in progress: a location a Put left read speculatively", getsNow.Load())
	}
	if l, ok := c.cache.get([]byte("small")); !ok || !l.read {
		t.Fatalf("after a Get: kept %+v, %v", l, ok)
	}
	// Locations Gets learnt found stale often: through the master, and
	// each found current there counts down.
	c.stale.Store(staleBlock)
	spec = c.specKept.Load()
	if got, err := c.Get(ctx, []byte("small")); err != nil || !bytes.Equal(got, big[:len(small)]) {
		t.Fatalf("get through the master: %v", err)
	}
	if c.specKept.Load() != spec {
		t.Fatal("read speculatively with the locations Gets learnt often stale")
	}
	if n := c.stale.Load(); n != staleBlock-1 {
		t.Fatalf("staleness %d after a current location, want %d", n, staleBlock-1)
	}
	// Another client replaces the value: the kept location is stale, the
	// Get returns the new value and counts it.
	c.stale.Store(0)
	if err := ss[0].Put(ctx, []byte("small"), small); err != nil {
		t.Fatal(err)
	}
	spec = c.specKept.Load()
	if got, err := c.Get(ctx, []byte("small")); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("get after another client's put: %v", err)
	}
	if c.specKept.Load() != spec {
		t.Fatal("a stale speculative read kept")
	}
	if n := c.stale.Load(); n != staleMiss {
		t.Fatalf("staleness %d after a stale location, want %d", n, staleMiss)
	}
}

// TestPutTokens: a client cannot commit or abort another client's put in
// progress by working out its name from its own (put tokens are random,
// not the version counter).
func TestPutTokens(t *testing.T) {
	m := newMaster(time.Minute, time.Minute)
	now := time.Now()
	m.join(now, "h", "s1", "seg", 1<<20, 0)
	a, err := m.putStart(now, "a", 4096, 1) // client A's put
	if err != nil {
		t.Fatal(err)
	}
	mine, err := m.putStart(now, "b", 4096, 1) // client B's
	if err != nil {
		t.Fatal(err)
	}
	// B aborts every name near its own token and version, and the small
	// numbers.
	for d := uint64(1); d <= 1<<16; d++ {
		for _, g := range []uint64{mine.tok - d, mine.tok + d, mine.ver - d, mine.ver + d, mine.ver, d} {
			if g != mine.tok {
				m.putEnd(now, g, false)
			}
		}
	}
	if _, err := m.putEnd(now, a.tok, true); err != nil {
		t.Fatalf("A's put ended by B: %v", err)
	}
	if _, err := m.putEnd(now, mine.tok, true); err != nil {
		t.Fatal(err)
	}
}

// TestDirtyHeld: a put placed over part of a freed slot that clients may
// still trust holds the rest of that slot until it ends (no other put
// writes there before its writer cleared the old header), clears the old
// header first, and leaves the slot dirty again when it aborts.
func TestDirtyHeld(t *testing.T) {
	m := newMaster(time.Minute, time.Minute)
	now := time.Now()
	m.join(now, "h", "s1", "seg", 1<<20, 0)
	d, _ := m.putStart(now, "d", 600<<10, 1)
	m.putEnd(now, d.tok, true)
	gone, _ := m.remove(now, "d")
	m.endLease(gone.lease, true) // the remover never cleared: dirty
	w, err := m.putStart(now, "w", 100<<10, 1)
	if err != nil {
		t.Fatal(err)
	}
	if w.reps[0].off != 0 || len(w.reps[0].clear) != 1 || w.reps[0].clear[0] != (extent{0, 8}) {
		t.Fatalf("w placed at %d, clears %v", w.reps[0].off, w.reps[0].clear)
	}
	end := roundUp(slot(600 << 10))
	y, err := m.putStart(now, "y", 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	if y.reps[0].off < end {
		t.Fatalf("y placed at %d, inside the dirty slot (to %d) w is clearing", y.reps[0].off, end)
	}
	m.putEnd(now, w.tok, false) // aborted: its clears may not have landed
	z, _ := m.putStart(now, "z", 1000, 1)
	if z.reps[0].off != 0 || len(z.holds) == 0 || len(z.dirt) != 1 {
		t.Fatalf("z at %d, holds %v: the old slot not dirty again", z.reps[0].off, z.holds)
	}
	// Cleared by its remover: not dirty.
	m2 := newMaster(time.Minute, time.Minute)
	m2.join(now, "h", "s1", "seg", 1<<20, 0)
	d, _ = m2.putStart(now, "d", 600<<10, 1)
	m2.putEnd(now, d.tok, true)
	gone, _ = m2.remove(now, "d")
	m2.releaseLocked(gone.lease)
	if len(m2.holders["h"].alloc.dirty) != 0 {
		t.Fatalf("a cleared slot dirty: %v", m2.holders["h"].alloc.dirty)
	}
	if e, _ := m2.putStart(now, "e", 1000, 1); len(e.reps[0].clear) != 0 || len(e.holds) != 0 {
		t.Fatalf("a put over clean space has clears %v, holds %v", e.reps[0].clear, e.holds)
	}
}

// A put's writes stop before its read lease on the version it replaces
// runs out when they clear that version's headers (a late clear would
// land in space the master may have handed to another value), and
// before half the put's own TTL otherwise.
func TestWriteWithin(t *testing.T) {
	s := &Store{leaseTTL: 10 * time.Second, putTTL: 60 * time.Second}
	if got := s.writeWithin(make([][]Location, 3)); got != 30*time.Second {
		t.Fatalf("nothing to clear: %v, want 30s", got)
	}
	prev := make([][]Location, 3)
	prev[1] = []Location{{}}
	if got := s.writeWithin(prev); got != 9*time.Second {
		t.Fatalf("headers to clear: %v, want 9s (within the 10s lease)", got)
	}
}

// TestSpeculativeGetVersion: over tcp0 a speculative read is kept only if
// the master's answer names the version this client kept, not merely the
// same location and size. c1 keeps (v1, L, S) for a key; after its
// speculative read of L completed and before the master answers, c2
// replaces the key with v2 elsewhere (L is freed) and then with v3, of
// the same S bytes, placed at L again. The answer names L and S as
// before, only the version differs: c1 must return v3, not the v1 bytes
// it read (with the version comparison in settle removed, this fails).
func TestSpeculativeGetVersion(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "tcp0", 1, 1<<20, nil)
	c1, c2 := client(t, "tcp0", ss[0].Addr()), client(t, "tcp0", ss[0].Addr())
	key := []byte("k")
	const size = 100 << 10
	v1, v2, v3 := value(1, size), value(2, size+4096), value(3, size)
	if err := c2.Put(ctx, key, v1); err != nil {
		t.Fatal(err)
	}
	if got, err := c1.Get(ctx, key); err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("first get: %v", err)
	}
	l1, ok := c1.cache.get(key)
	if !ok {
		t.Fatal("location not kept after a get")
	}
	// c1's request hands back its read lease of v1 now (else v1's slot
	// stays held until c1's next call, after c2's puts).
	if _, err := c1.Exists(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	var hookErr error
	started := false
	testSpeculated = func(sp *spec) {
		testSpeculated = nil // once
		started = sp.b != nil
		sp.wait(ctx) // the read of v1 completed before anything is written at L
		for _, v := range [][]byte{v2, v3} {
			if hookErr = c2.Put(ctx, key, v); hookErr != nil {
				return
			}
		}
	}
	t.Cleanup(func() { testSpeculated = nil })
	spec := c1.specKept.Load()
	got, err := c1.Get(ctx, key)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if !started {
		t.Fatal("no speculative read started")
	}
	// The scenario holds: v3 is at L with v1's size, under another version.
	l3, ok := c2.cache.get(key)
	if !ok {
		t.Fatal("writer kept no location")
	}
	if l3.locs[0] != l1.locs[0] || l3.size != l1.size || l3.ver == l1.ver {
		t.Fatalf("v3 not placed over v1's slot: v1 %+v, v3 %+v", l1, l3)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, v3) {
		stamp := uint64(0)
		if len(got) >= 8 {
			stamp = binary.LittleEndian.Uint64(got)
		}
		t.Fatalf("got %d bytes stamped %d, want v3 (a speculative read of a replaced version kept)", len(got), stamp)
	}
	if n := c1.specKept.Load() - spec; n != 0 {
		t.Fatalf("%d speculative reads kept", n)
	}
}
