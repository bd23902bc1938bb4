package kv

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/transfer"
	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func TestMain(m *testing.M) {
	reexec.Init()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// tcfg is the transfer configuration of tests in which no node dies:
// leases and peer timeouts of 10 s. With 1 s, a loaded host (CI runs every
// package's tests at once on 2 cores, and -race) stalled live nodes past
// them: "no message from ... for 1s" (peer lost) and "no such segment"
// failed TestConcurrentSameKeys and TestCachedGetValidated.
func tcfg(dev string) transfer.Config {
	return transfer.Config{Secret: secret, Devices: []string{dev}, LeaseTTL: 10 * time.Second, PeerTimeout: 10 * time.Second}
}

// dying is the transfer configuration of tests that kill or stop nodes and
// wait until the others notice: 1 s leases and peer timeouts, so that a
// dead node's segments and connections go within the tests' deadlines.
func dying(dev string) transfer.Config {
	c := tcfg(dev)
	c.LeaseTTL, c.PeerTimeout = time.Second, time.Second
	return c
}

// cluster starts a master with capacity and k-1 more store nodes, all in
// this process.
func cluster(t *testing.T, dev string, k int, capacity int64, mod func(*Config)) []*Store {
	t.Helper()
	ctx := context.Background()
	var ss []*Store
	for i := 0; i < k; i++ {
		c := Config{Capacity: capacity, Transfer: tcfg(dev)}
		c.Transfer.Name = fmt.Sprintf("n%d", i)
		if i > 0 {
			c.Addr = ss[0].Addr()
		}
		if mod != nil {
			mod(&c)
		}
		s, err := Open(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	t.Cleanup(func() {
		for i := len(ss) - 1; i >= 0; i-- {
			ss[i].Close()
		}
	})
	return ss
}

func client(t *testing.T, dev, addr string) *Store {
	t.Helper()
	c := Config{Addr: addr, Transfer: tcfg(dev)}
	s, err := Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// value returns a self-checking value: 8 bytes of stamp, then bytes that
// depend on the stamp and their offset.
func value(stamp uint64, n int) []byte {
	b := make([]byte, n)
	fillValue(b, stamp)
	return b
}

func fillValue(b []byte, stamp uint64) {
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, stamp)
	}
	for i := 8; i < len(b); i++ {
		b[i] = byte(stamp*31 + uint64(i)*7 + uint64(i>>8))
	}
}

// checkValue reports whether b is whole: every byte agrees with its stamp.
func checkValue(b []byte) bool {
	if len(b) < 8 {
		return true
	}
	stamp := binary.LittleEndian.Uint64(b)
	for i := 8; i < len(b); i++ {
		if b[i] != byte(stamp*31+uint64(i)*7+uint64(i>>8)) {
			return false
		}
	}
	return true
}

func TestPutGetBasics(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			ctx := context.Background()
			ss := cluster(t, dev, 3, 16<<20, nil)
			c := client(t, dev, ss[0].Addr())
			for i, size := range []int{0, 1, 100, 4096, 1 << 20, 3<<20 + 5} {
				key := []byte(fmt.Sprintf("key-%d", i))
				v := value(uint64(i), size)
				if err := c.Put(ctx, key, v); err != nil {
					t.Fatalf("put %d: %v", size, err)
				}
				// Read from another store node than the writer.
				got, err := ss[i%3].Get(ctx, key)
				if err != nil || !bytes.Equal(got, v) {
					t.Fatalf("get %d: %v (%d bytes)", size, err, len(got))
				}
				if ok, err := c.Exists(ctx, key); !ok || err != nil {
					t.Fatalf("exists: %v %v", ok, err)
				}
			}
			// Overwrite, zero-copy read into registered memory.
			mr, err := c.AllocMR(4 << 20)
			if err != nil {
				t.Fatal(err)
			}
			v := value(99, 2<<20)
			if err := c.Put(ctx, []byte("key-1"), v); err != nil {
				t.Fatal(err)
			}
			n, err := c.GetMR(ctx, []byte("key-1"), Buf{MR: mr, Offset: 4096, Len: 3 << 20})
			if err != nil || n != len(v) || !bytes.Equal(mr.Bytes()[4096:4096+n], v) {
				t.Fatalf("GetMR: %d %v", n, err)
			}
			if _, err := c.GetMR(ctx, []byte("key-1"), Buf{MR: mr, Len: 1 << 20}); !errors.Is(err, ErrBuffer) {
				t.Fatalf("small destination: %v", err)
			}
			// Zero-copy put.
			fillValue(mr.Bytes()[:1<<20], 7)
			if err := c.PutMR(ctx, []byte("zc"), Buf{MR: mr, Len: 1 << 20}); err != nil {
				t.Fatal(err)
			}
			if got, err := ss[1].Get(ctx, []byte("zc")); err != nil || !checkValue(got) || len(got) != 1<<20 {
				t.Fatalf("zc: %v", err)
			}
			// Remove, not found.
			if err := c.Remove(ctx, []byte("key-1")); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Get(ctx, []byte("key-1")); !errors.Is(err, ErrNotFound) {
				t.Fatalf("get removed: %v", err)
			}
			if err := c.Remove(ctx, []byte("key-1")); !errors.Is(err, ErrNotFound) {
				t.Fatalf("remove removed: %v", err)
			}
			if ok, err := c.Exists(ctx, []byte("nope")); ok || err != nil {
				t.Fatalf("exists nope: %v %v", ok, err)
			}
			keys, err := c.List(ctx, []byte("key-"), 100)
			if err != nil || len(keys) != 5 {
				t.Fatalf("list: %v %v", keys, err)
			}
			// Batches.
			var ks, vs [][]byte
			for i := 0; i < 20; i++ {
				ks = append(ks, []byte(fmt.Sprintf("b%02d", i)))
				vs = append(vs, value(uint64(i+1000), 1000*i+1))
			}
			if err := c.PutBatch(ctx, ks, vs); err != nil {
				t.Fatal(err)
			}
			got, err := ss[2].GetBatch(ctx, append(ks, []byte("missing")))
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Index != 20 || !errors.Is(err, ErrNotFound) {
				t.Fatalf("batch get: %v", err)
			}
			for i := range ks {
				if !bytes.Equal(got[i], vs[i]) {
					t.Fatalf("batch value %d", i)
				}
			}
			ex, err := c.ExistsBatch(ctx, [][]byte{ks[0], []byte("missing")})
			if err != nil || !ex[0] || ex[1] {
				t.Fatalf("exists batch %v %v", ex, err)
			}
			if err := c.RemoveBatch(ctx, ks); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "tcp0", 1, 1<<20, func(c *Config) { c.MaxKeyLen = 16; c.MaxValueLen = 512 << 10 })
	s := ss[0]
	if err := s.Put(ctx, nil, []byte("x")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("empty key: %v", err)
	}
	if err := s.Put(ctx, bytes.Repeat([]byte("k"), 17), []byte("x")); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("long key: %v", err)
	}
	if err := s.Put(ctx, []byte("k"), make([]byte, 512<<10+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("large value: %v", err)
	}
	if _, err := s.Get(ctx, []byte("k")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := s.Get(ctx, bytes.Repeat([]byte("k"), 17)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("long key get: %v", err)
	}
	if _, err := s.ExistsBatch(ctx, make([][]byte, MaxBatch+1)); err == nil {
		t.Fatal("oversized batch accepted")
	}
	// Replicas more than store nodes.
	c, err := Open(ctx, Config{Addr: s.Addr(), Replicas: 2, Transfer: tcfg("tcp0")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(ctx, []byte("k"), []byte("v")); !errors.Is(err, ErrNoNodes) {
		t.Fatalf("2 replicas on 1 node: %v", err)
	}
	// A client without the secret is refused.
	if _, err := Open(ctx, Config{Addr: s.Addr(), Transfer: transfer.Config{Devices: []string{"tcp0"}, Insecure: true}}); err == nil {
		t.Fatal("insecure client accepted")
	}
}

// TestEviction: values beyond capacity evict the least recently used;
// the recently read survive; the store keeps serving.
func TestEviction(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "shm0", 2, 1<<20, nil)
	c := ss[1]
	const size = 100 << 10 // 10 fit per node, 20 in all
	for i := 0; i < 60; i++ {
		if err := c.Put(ctx, []byte(fmt.Sprint(i)), value(uint64(i), size)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if i >= 1 {
			// Keep key 0 hot.
			if _, err := c.Get(ctx, []byte("0")); err != nil {
				t.Fatalf("hot key evicted at %d: %v", i, err)
			}
		}
	}
	st, err := c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Evictions < 30 || st.Keys > 20 || len(st.Nodes) != 2 {
		t.Fatalf("stats %+v", st)
	}
	for _, n := range st.Nodes {
		if n.Used > n.Capacity {
			t.Fatalf("node over capacity: %+v", n)
		}
	}
	if got, err := c.Get(ctx, []byte("59")); err != nil || !checkValue(got) {
		t.Fatalf("newest: %v", err)
	}
	if _, err := c.Get(ctx, []byte("1")); !errors.Is(err, ErrNotFound) {
		t.Fatalf("oldest: %v", err)
	}
}

// TestFullWhileRead: the master refuses a put that only evicting a value
// being read would fit (ErrFull), and frees the old version once the
// reader lets go.
func TestFullWhileRead(t *testing.T) {
	m := newMaster(time.Minute, time.Minute)
	now := time.Now()
	m.join(now, "h", "s1", "seg", slot(1<<20), 0)
	e, err := m.putStart(now, "a", 1<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.putEnd(now, e.tok, true); err != nil {
		t.Fatal(err)
	}
	_, lease, err := m.get(now, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.putStart(now, "b", 1<<20, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("put over a leased value: %v", err)
	}
	// A new version of a: no room either, the old one is being read.
	if _, err := m.putStart(now, "a", 512<<10, 1); !errors.Is(err, ErrFull) {
		t.Fatalf("new version: %v", err)
	}
	// Remove while read: gone from the table, space held until release
	// (the reader's, and the remover's while it clears the headers).
	gone, err := m.remove(now, "a")
	if err != nil {
		t.Fatal(err)
	}
	if gone.lease == 0 || len(gone.locs) != 1 {
		t.Fatalf("remove gave no lease or location: %+v", gone)
	}
	if _, _, err := m.get(now, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if m.holders["h"].alloc.used == 0 {
		t.Fatal("space of a value being read freed")
	}
	m.releaseLocked(lease)
	if m.holders["h"].alloc.used == 0 {
		t.Fatal("space freed before the remover cleared its headers")
	}
	m.releaseLocked(gone.lease)
	if m.holders["h"].alloc.used != 0 {
		t.Fatal("space not freed after the last reader")
	}
	// An expired lease frees too.
	e, _ = m.putStart(now, "c", 1<<20, 1)
	m.putEnd(now, e.tok, true)
	m.get(now, "c")
	m.remove(now, "c")
	m.sweep(now.Add(2 * time.Minute))
	if m.holders["h"].alloc.used != 0 {
		t.Fatal("expired lease kept the space")
	}
	// An abandoned put is taken back after PutTTL.
	if _, err := m.putStart(now, "d", 1000, 1); err != nil {
		t.Fatal(err)
	}
	m.lastSweep = time.Time{}
	m.sweep(now.Add(2 * time.Minute))
	if m.holders["h"].alloc.used != 0 || len(m.pending) != 0 {
		t.Fatal("abandoned put kept")
	}
}

func TestAllocator(t *testing.T) {
	a := newAllocator(1 << 20)
	r := rand.New(rand.NewPCG(1, 2))
	type al struct{ off, n uint64 }
	var live []al
	for i := 0; i < 5000; i++ {
		if len(live) > 0 && r.IntN(2) == 0 {
			k := r.IntN(len(live))
			a.release(live[k].off, live[k].n)
			live = append(live[:k], live[k+1:]...)
			continue
		}
		n := uint64(r.IntN(50000) + 1)
		off, ok := a.alloc(n)
		if !ok {
			continue
		}
		for _, x := range live {
			if off < x.off+roundUp(x.n) && x.off < off+roundUp(n) {
				t.Fatalf("overlap %v %v", x, al{off, n})
			}
		}
		if off+n > a.size {
			t.Fatal("beyond the pool")
		}
		live = append(live, al{off, n})
	}
	for _, x := range live {
		a.release(x.off, x.n)
	}
	if a.used != 0 || len(a.free) != 1 || a.free[0] != (extent{0, 1 << 20}) {
		t.Fatalf("not coalesced: %v used %d", a.free, a.used)
	}
}

// TestConcurrentSameKeys: writers, readers and removers on the same few
// keys; every value read is whole (one Put's bytes, never a mix).
// Over tcp0 as well (Gets there read kept locations while they ask the
// master, speculate).
func TestConcurrentSameKeys(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) { testConcurrentSameKeys(t, dev) })
	}
}

func testConcurrentSameKeys(t *testing.T, dev string) {
	ctx := context.Background()
	// Nothing dies here: tcfg's long leases and peer timeouts.
	ss := cluster(t, dev, 3, 4<<20, nil)
	clients := []*Store{ss[1], ss[2], client(t, dev, ss[0].Addr())}
	keys := [][]byte{[]byte("k0"), []byte("k1"), []byte("k2")}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(f string, a ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(f, a...))
		mu.Unlock()
	}
	stop := time.Now().Add(2 * time.Second)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := 0; time.Now().Before(stop); i++ {
				k := keys[r.IntN(len(keys))]
				switch r.IntN(5) {
				case 0, 1:
					v := value(uint64(w)<<32|uint64(i), 8+r.IntN(600<<10))
					if err := c.Put(ctx, k, v); err != nil && !errors.Is(err, ErrFull) {
						fail("put: %v", err)
					}
				case 2:
					if err := c.Remove(ctx, k); err != nil && !errors.Is(err, ErrNotFound) {
						fail("remove: %v", err)
					}
				default:
					got, err := c.Get(ctx, k)
					if err != nil && !errors.Is(err, ErrNotFound) {
						fail("get: %v", err)
					} else if err == nil && !checkValue(got) {
						fail("torn value of %d bytes", len(got))
					}
				}
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %v", len(failures), failures[:min(5, len(failures))])
	}
}

func TestBlockKeys(t *testing.T) {
	a := BlockKeys(nil, []uint32{1, 2, 3, 4, 5, 6, 7}, 2)
	b := BlockKeys(nil, []uint32{1, 2, 3, 4, 9, 9}, 2)
	if len(a) != 3 || len(b) != 3 {
		t.Fatal(len(a), len(b))
	}
	if !bytes.Equal(a[0], b[0]) || !bytes.Equal(a[1], b[1]) || bytes.Equal(a[2], b[2]) {
		t.Fatal("prefix sharing wrong")
	}
	c := BlockKeys(nil, []uint32{3, 4, 1, 2}, 2)
	if bytes.Equal(c[1], a[1]) {
		t.Fatal("order ignored")
	}
	// Extending a sequence from its last key gives the same keys.
	d := BlockKeys(a[1], []uint32{5, 6}, 2)
	if !bytes.Equal(d[0], a[2]) {
		t.Fatal("extension differs")
	}
}

// TestStoreFull: through the client, a Put that only evicting a value
// being read would fit fails with ErrFull (the value read is intact), a
// value larger than any store node with ErrTooLarge; the store keeps
// serving.
func TestStoreFull(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "shm0", 1, 1<<20, nil)
	c := client(t, "shm0", ss[0].Addr())
	v := value(1, 900<<10)
	if err := c.Put(ctx, []byte("big"), v); err != nil {
		t.Fatal(err)
	}
	// A reader holds a lease on "big" (as a Get in progress does).
	m := ss[0].svc.m
	m.mu.Lock()
	_, lease, err := m.get(time.Now(), "big")
	m.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, []byte("other"), value(2, 512<<10)); !errors.Is(err, ErrFull) {
		t.Fatalf("put over a value being read: %v", err)
	}
	if err := c.Put(ctx, []byte("huge"), make([]byte, 2<<20)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("larger than the store node: %v", err)
	}
	if got, err := c.Get(ctx, []byte("big")); err != nil || !bytes.Equal(got, v) {
		t.Fatalf("value read: %v", err)
	}
	m.mu.Lock()
	m.releaseLocked(lease)
	m.mu.Unlock()
	// Now "big" may be evicted for the new value.
	if err := c.Put(ctx, []byte("other"), value(2, 512<<10)); err != nil {
		t.Fatal(err)
	}
}

// TestLeaseIDs: a client cannot release another client's read lease by
// working out its id from its own (ids are not a counter).
func TestLeaseIDs(t *testing.T) {
	m := newMaster(time.Minute, time.Minute)
	now := time.Now()
	m.join(now, "h", "s1", "seg", 1<<20, 0)
	for _, k := range []string{"a", "b"} {
		e, err := m.putStart(now, k, 4096, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.putEnd(now, e.tok, true); err != nil {
			t.Fatal(err)
		}
	}
	a, _, err := m.get(now, "a") // client A's read
	if err != nil {
		t.Fatal(err)
	}
	_, mine, err := m.get(now, "b") // client B's
	if err != nil {
		t.Fatal(err)
	}
	// B releases every id near its own, and the ids of the versions.
	for d := uint64(1); d <= 1<<16; d++ {
		if mine-d != 0 {
			m.releaseLocked(mine - d)
		}
		m.releaseLocked(mine + d)
		m.releaseLocked(d)
	}
	if a.readers != 1 {
		t.Fatalf("A's lease released by B: %d readers", a.readers)
	}
}

// TestListBounded: a List answer stays under the message limit however
// long the keys, and the rest comes in the next pages.
func TestListBounded(t *testing.T) {
	s := &service{m: newMaster(time.Minute, time.Minute), maxKey: MaxKeyLen, maxValue: 1 << 20, maxRepl: MaxReplicas}
	m := s.m
	now := time.Now()
	m.join(now, "h", "s1", "seg", 1<<20, 0)
	const n = 1100 // 1100 keys of 4 KiB: more than one message holds
	for i := range n {
		key := fmt.Sprintf("%04d%s", i, strings.Repeat("k", MaxKeyLen-4))
		e, err := m.putStart(now, key, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		m.putEnd(now, e.tok, true)
	}
	var got []string
	var after []byte
	for page := 0; ; page++ {
		req := frame.AppendUint32(frame.AppendBytes16([]byte{opList, 0, 0, 0, 0}, nil), 100000)
		ans := s.handle(context.Background(), frame.AppendBytes16(req, after))
		if len(ans) > kvProto.Limit {
			t.Fatalf("a %d-byte answer (the limit is %d)", len(ans), kvProto.Limit)
		}
		d := frame.NewDecoder(ans)
		if err := decodeErr(&d); err != nil {
			t.Fatal(err)
		}
		k := int(d.Uint32())
		for range k {
			got = append(got, string(d.Bytes16()))
			d.Uint64()
		}
		more := d.Uint8() == 1
		if err := d.Finish(); err != nil || page > 3 {
			t.Fatalf("page %d: %v", page, err)
		}
		if !more {
			break
		}
		after = []byte(got[len(got)-1])
	}
	if len(got) != n || !slices.IsSorted(got) || got[0][:4] != "0000" {
		t.Fatalf("%d keys listed of %d", len(got), n)
	}
}

// TestListPages: Store.List gathers a list longer than one answer holds.
func TestListPages(t *testing.T) {
	ctx := context.Background()
	ss := cluster(t, "shm0", 1, 1<<20, func(c *Config) { c.MaxKeyLen = MaxKeyLen })
	const n = 1100
	var keys, vals [][]byte
	for i := range n {
		keys = append(keys, []byte(fmt.Sprintf("%04d%s", i, strings.Repeat("k", MaxKeyLen-4))))
		vals = append(vals, nil)
	}
	for i := 0; i < n; i += 500 {
		j := min(i+500, n)
		if err := ss[0].PutBatch(ctx, keys[i:j], vals[i:j]); err != nil {
			t.Fatal(err)
		}
	}
	for _, limit := range []int{0, 5, 1050, 100000} {
		got, err := ss[0].List(ctx, nil, limit)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != min(limit, n) {
			t.Fatalf("limit %d: %d keys", limit, len(got))
		}
		for i, k := range got {
			if !bytes.Equal(k.Key, keys[i]) {
				t.Fatalf("limit %d: key %d is %.8q", limit, i, k.Key)
			}
		}
	}
}

// TestHolderSessions: a store node's name belongs to the session that
// joined it (another cannot make it leave or take it over), the holders
// are bounded.
func TestHolderSessions(t *testing.T) {
	s := &service{m: newMaster(time.Minute, time.Minute), maxKey: 64, maxValue: 1 << 20, maxRepl: MaxReplicas, holderTTL: time.Minute}
	call := func(op byte, fields ...string) error {
		req := []byte{op, 0, 0, 0, 0}
		for i, f := range fields {
			req = frame.AppendString8(req, f)
			if op == opJoin && i == 1 {
				req = frame.AppendUint64(req, 1<<20)
			}
		}
		d := frame.NewDecoder(s.handle(context.Background(), req))
		return decodeErr(&d)
	}
	if err := call(opJoin, "a", "seg-a", "session-a"); err != nil {
		t.Fatal(err)
	}
	// Another session: no leave, no re-join, no heartbeat under a's name.
	call(opLeave, "a", "session-b")
	if err := call(opJoin, "a", "seg-b", "session-b"); err == nil {
		t.Fatal("a joined again from another session")
	}
	if err := call(opBeat, "a", "session-b"); err == nil {
		t.Fatal("a beat from another session")
	}
	if h := s.m.holders["a"]; h == nil || h.segment != "seg-a" {
		t.Fatalf("holder a taken over: %+v", h)
	}
	if err := call(opBeat, "a", "session-a"); err != nil {
		t.Fatal(err)
	}
	call(opLeave, "a", "session-a")
	if s.m.holders["a"] != nil {
		t.Fatal("a's own leave ignored")
	}
	// The cap.
	var err error
	for i := 0; err == nil && i <= maxHolders; i++ {
		err = call(opJoin, fmt.Sprint(i), "seg", "s")
	}
	if !errors.Is(err, ErrFull) || len(s.m.holders) != maxHolders {
		t.Fatalf("%d holders: %v", len(s.m.holders), err)
	}
}

// TestPlaceHeardFirst: after a failover the new master takes the table's
// holders on trust until they beat; it places values on those it has
// heard from first, though another has more room, so that a put does not
// go to a node that died or stopped with the old master (TestPausedMaster
// failed so: "no such segment kv/pa"). The others only where those have
// no room.
func TestPlaceHeardFirst(t *testing.T) {
	now := time.Now()
	row := func(name, seg string, size uint64) *kvRow {
		b, _ := json.Marshal(record{Seg: seg, Size: size})
		return &kvRow{key: "h/" + name, val: b}
	}
	m := newMaster(time.Minute, time.Minute)
	m.ha = &haMaster{}
	m.takeOver(now, []*kvRow{row("gone", "kv/gone", 4<<20), row("live", "kv/live", 1<<20)}, 1, time.Minute)
	if e, err := m.putStart(now, "k0", 4096, 1); err != nil || e.reps[0].h.name != "gone" {
		t.Fatalf("none heard from: %v, want it on the roomiest", err)
	}
	if err := m.beat(now, "live", "s"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		e, err := m.putStart(now, fmt.Sprint("k", i+1), 100<<10, 1)
		if err != nil || e.reps[0].h.name != "live" {
			t.Fatalf("put %d: %v, not on the holder that beat", i, err)
		}
	}
	// live has no room left for 700 KiB: the other takes it.
	if e, err := m.putStart(now, "big", 700<<10, 1); err != nil || e.reps[0].h.name != "gone" {
		t.Fatalf("a value the heard holder has no room for: %v", err)
	}
}
