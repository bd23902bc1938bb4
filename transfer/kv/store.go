package kv

// Store: a node of the store (a transfer.Node, a pool when it has
// Capacity, the master when it is the first) and the client calls.
// Goroutines: a store node with capacity runs a heartbeat (beats every
// third of the holder TTL, re-joins when the master forgot it); every
// Store runs a releaser that hands back read leases left over for 20 ms;
// the master's service runs rpc's. Calls run on the caller's goroutine:
// one request to the master, one transfer batch, and for a Put a second
// request (commit); a Get of a key whose location the client keeps is
// one transfer batch and no request (cache.go).

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/internal/rpc"
	"github.com/rdmakit/rdmakit/verbs"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// canLocal: the master serves same-host clients on an abstract Unix
// socket as well (Linux).
const canLocal = runtime.GOOS == "linux"

// Defaults of Config's zero fields.
const (
	DefaultMaxKeyLen   = 1024
	DefaultMaxValueLen = 256 << 20
	DefaultLeaseTTL    = 10 * time.Second
	DefaultPutTTL      = time.Minute
	DefaultHolderTTL   = 5 * time.Second
	DefaultMasterTTL   = 5 * time.Second
	// MaxReplicas bounds Config.Replicas.
	MaxReplicas = 8
)

// Config configures a store node. Every zero field takes the default
// documented on it.
type Config struct {
	// Addr is the master's address; empty: this node runs the master
	// (and the transfer metadata table), listening on ListenAddr. With
	// Transfer.MetadataAddr in etcd, empty means this node runs for
	// master through etcd (ha.go). An etcd URL ("etcd://...") finds the
	// master there, and again after a failover.
	Addr string
	// ListenAddr is where the master listens when Addr is empty (default
	// "127.0.0.1:0"; Store.Addr tells the port).
	ListenAddr string
	// Capacity is how many bytes of values this node holds for the store
	// (0: a client only). It is allocated at Open, registered memory.
	Capacity int64
	// Replicas is how many store nodes hold each value a Put writes
	// (default 1, at most MaxReplicas).
	Replicas int
	// Transfer configures the node's transfer engine (name, devices,
	// Secret or Insecure, ...). A MetadataAddr of etcd ("etcd://...")
	// with Addr empty puts the transfer metadata and the master's table
	// there and makes the node run for master; without it the master's
	// node serves the embedded table. On nodes opened with the master's
	// address Open sets MetadataAddr from the master. Its ArenaSize
	// defaults to Capacity + 256 MiB.
	Transfer transfer.Config

	// The master's settings (used by the node that runs it).

	// MaxKeyLen bounds keys (default DefaultMaxKeyLen, at most MaxKeyLen).
	MaxKeyLen int
	// MaxValueLen bounds values (default DefaultMaxValueLen).
	MaxValueLen int64
	// LeaseTTL is how long a reader may take to read a value before the
	// master may reuse its space (default DefaultLeaseTTL). A Get slower
	// than 9/10 of it is retried, then fails with ErrLeaseExpired.
	LeaseTTL time.Duration
	// PutTTL is how long a Put may take to write before the master takes
	// its space back (default DefaultPutTTL).
	PutTTL time.Duration
	// HolderTTL: a store node silent that long is dropped with its values
	// (default DefaultHolderTTL).
	HolderTTL time.Duration
	// MasterTTL is the TTL of the etcd session lease of a node that runs
	// for master (etcd metadata only; default DefaultMasterTTL, whole
	// seconds): a master gone for that long is replaced. A node that
	// finds the master through etcd waits that long for an answer before
	// it looks for the master again.
	MasterTTL time.Duration
}

func (c Config) withDefaults() Config {
	if c.ListenAddr == "" {
		c.ListenAddr = "127.0.0.1:0"
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.MaxKeyLen <= 0 || c.MaxKeyLen > MaxKeyLen {
		c.MaxKeyLen = min(max(c.MaxKeyLen, DefaultMaxKeyLen), MaxKeyLen)
	}
	if c.MaxValueLen <= 0 {
		c.MaxValueLen = DefaultMaxValueLen
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.PutTTL <= 0 {
		c.PutTTL = DefaultPutTTL
	}
	if c.HolderTTL <= 0 {
		c.HolderTTL = DefaultHolderTTL
	}
	if c.MasterTTL <= 0 {
		c.MasterTTL = DefaultMasterTTL
	}
	if c.Transfer.ArenaSize == 0 {
		c.Transfer.ArenaSize = c.Capacity + 256<<20
	}
	return c
}

// Buf is a range of registered memory: a value's source or destination
// without a copy. The MR comes from Store.AllocMR (or, on tcp0, any
// region the node can register).
type Buf struct {
	MR     *verbs.MR
	Offset int
	Len    int
}

// Store is a handle on the store: a store node, and its client. All
// methods are safe for concurrent use.
type Store struct {
	cfg  Config
	node *transfer.Node
	srv  *rpc.Server // the master's service, on the node that runs it
	svc  *service

	// With the metadata in etcd: where to find the master.
	etcd    *clientv3.Client
	etcdPfx string

	// clMu guards cl and old.
	clMu sync.Mutex
	cl   *rpc.Client   // to the master
	old  []*rpc.Client // to masters before a failover (closed at Close)

	// From the master.
	leaseTTL, putTTL, holderTTL time.Duration
	maxKey                      int
	maxValue                    uint64

	metaAddr string       // the transfer metadata address (from the master)
	sizeHint atomic.Int64 // the largest value GetBatch has seen

	pool    *verbs.MR // this node's share (Capacity)
	segName string
	session string // random: the master lets only it beat or leave as this node

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// relMu guards released and touched.
	relMu    sync.Mutex
	released []uint64 // leases to hand back
	touched  [][]byte // keys read without the master (cache.go), for its LRU

	cache    locCache      // the locations of values read or written (cache.go)
	specKept atomic.Uint64 // speculative reads kept (cache.go; for tests)
	stale    atomic.Int32  // how often kept locations Gets learnt were stale (noteStale)

	// stMu guards staging.
	stMu    sync.Mutex
	staging map[int][]*verbs.MR // free staging regions by size class
	closed  bool
}

// Open starts a store node: the first one (Config.Addr empty) runs the
// master; others join it.
func Open(ctx context.Context, cfg Config) (_ *Store, err error) {
	cfg = cfg.withDefaults()
	if cfg.Replicas > MaxReplicas {
		return nil, fmt.Errorf("kv: Replicas %d over %d", cfg.Replicas, MaxReplicas)
	}
	if cfg.Capacity < 0 {
		return nil, fmt.Errorf("kv: negative Capacity")
	}
	tc := cfg.Transfer
	if len(tc.Secret) == 0 && !tc.Insecure {
		return nil, transfer.ErrNoCredential
	}
	var token [16]byte
	rand.Read(token[:])
	s := &Store{cfg: cfg, staging: map[int][]*verbs.MR{}, session: string(token[:])}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if transfer.IsEtcdURL(cfg.Addr) || cfg.Addr == "" && transfer.IsEtcdURL(tc.MetadataAddr) {
		if err := s.openHA(ctx, tc); err != nil {
			return nil, err
		}
	} else if cfg.Addr == "" {
		// The transfer metadata: this node's embedded table; clients
		// learn its address from the master.
		tc.MetadataAddr, tc.Metadata = "", nil
		if tc, err = s.masterListen(tc); err != nil {
			return nil, err
		}
		if s.node, err = transfer.New(ctx, tc); err != nil {
			return nil, err
		}
		if err := s.serveMaster(newMaster(cfg.LeaseTTL, cfg.PutTTL), s.node.Addr(), tc); err != nil {
			return nil, err
		}
		s.cl = rpc.NewClient(s.srv.Addr(), kvProto, tc.Secret)
		if err := s.info(ctx); err != nil {
			return nil, err
		}
	} else {
		s.cl = rpc.NewClient(cfg.Addr, kvProto, tc.Secret)
		if err := s.info(ctx); err != nil {
			return nil, err
		}
		tc.MetadataAddr = s.metaAddr
		if s.node, err = transfer.New(ctx, tc); err != nil {
			return nil, err
		}
	}
	if cfg.Capacity > 0 {
		s.segName = "kv/" + s.node.Name()
		if s.pool, err = s.node.AllocSegment(ctx, s.segName, int(cfg.Capacity)); err != nil {
			return nil, err
		}
		if err := s.join(ctx); err != nil {
			return nil, err
		}
		s.wg.Add(1)
		go s.heartbeat()
	}
	s.wg.Add(1)
	go s.releaser()
	return s, nil
}

// masterListen gives the transfer node of a node that runs (or may run)
// the master the host of ListenAddr, unless it has a listen address.
func (s *Store) masterListen(tc transfer.Config) (transfer.Config, error) {
	host, _, err := net.SplitHostPort(s.cfg.ListenAddr)
	if err != nil {
		return tc, fmt.Errorf("kv: ListenAddr %q: %w", s.cfg.ListenAddr, err)
	}
	if tc.ListenAddr == "" {
		tc.ListenAddr = net.JoinHostPort(host, "0")
	}
	return tc, nil
}

// serveMaster starts the master's service on ListenAddr (and, on Linux,
// an abstract Unix socket); meta is the transfer metadata address it
// tells clients.
func (s *Store) serveMaster(m *master, meta string, tc transfer.Config) (err error) {
	cfg := s.cfg
	s.svc = &service{m: m, metadata: meta, maxKey: cfg.MaxKeyLen, maxValue: uint64(cfg.MaxValueLen), maxRepl: MaxReplicas,
		leaseTTL: cfg.LeaseTTL, putTTL: cfg.PutTTL, holderTTL: cfg.HolderTTL, selfSession: s.session}
	if cfg.Capacity > 0 {
		s.svc.self = s.node.Name()
	}
	if s.srv, err = rpc.Listen(cfg.ListenAddr, kvProto, tc.Secret, tc.Insecure && len(tc.Secret) == 0, s.svc.handle); err != nil {
		return fmt.Errorf("kv: master: %w", err)
	}
	if canLocal {
		if s.svc.local, err = s.srv.ServeLocal(); err != nil {
			return fmt.Errorf("kv: master: %w", err)
		}
	}
	return nil
}

// info asks the master for the metadata address and its limits.
func (s *Store) info(ctx context.Context) error {
	d, err := s.call(ctx, []byte{opInfo})
	if err != nil {
		return err
	}
	meta, local := d.String16(), d.String8()
	lt, pt, ht, mk, mv := d.Uint32(), d.Uint32(), d.Uint32(), d.Uint32(), d.Uint64()
	if d.Finish() != nil {
		return fmt.Errorf("%w: malformed info", rpc.ErrProtocol)
	}
	ms := func(v uint32) time.Duration { return time.Duration(v) * time.Millisecond }
	s.leaseTTL, s.putTTL, s.holderTTL, s.maxKey, s.maxValue = ms(lt), ms(pt), ms(ht), int(mk), mv
	s.metaAddr = meta
	if local != "" {
		s.client().SetLocal(local)
	}
	return nil
}

func (s *Store) join(ctx context.Context) error {
	req := frame.AppendString8([]byte{opJoin, 0, 0}, s.node.Name())
	req = frame.AppendString8(req, s.segName)
	req = frame.AppendUint64(req, uint64(s.pool.Len()))
	_, err := s.call(ctx, frame.AppendString8(req, s.session))
	return err
}

func (s *Store) heartbeat() {
	defer s.wg.Done()
	t := time.NewTicker(s.holderTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.ctx, s.holderTTL/3)
		_, err := s.call(ctx, frame.AppendString8(frame.AppendString8([]byte{opBeat, 0, 0}, s.node.Name()), s.session))
		if errors.Is(err, ErrNoNodes) {
			// The master forgot us (it restarted, or we were silent) and
			// with us where the old values' headers are: clear the pool
			// (front to back, each header before its value) so that no
			// client trusts an old location once new values land here.
			clear(s.pool.Bytes())
			s.join(ctx)
		}
		cancel()
	}
}

// releaser hands back leases (and reports keys read) that no request
// carried within 20 ms.
func (s *Store) releaser() {
	defer s.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.relMu.Lock()
		n := len(s.released) + len(s.touched)
		s.relMu.Unlock()
		if n > 0 {
			ctx, cancel := context.WithTimeout(s.ctx, time.Second)
			s.call(ctx, []byte{opRelease})
			cancel()
		}
	}
}

// call sends req (its op byte first; released leases are inserted after
// it) and returns a decoder on the answer's fields, or the master's error.
func (s *Store) call(ctx context.Context, req []byte) (*frame.Decoder, error) {
	s.relMu.Lock()
	rel := s.released
	if len(rel) > maxReleases {
		rel = rel[:maxReleases]
	}
	s.released = s.released[len(rel):]
	touched := s.touched
	if len(touched) > maxTouches {
		touched = touched[:maxTouches]
	}
	s.touched = s.touched[len(touched):]
	s.relMu.Unlock()
	// req[1:3] is the release count for requests built with room for it.
	msg := make([]byte, 0, len(req)+8*len(rel)+4)
	msg = append(msg, req[0])
	msg = frame.AppendUint16(msg, uint16(len(rel)))
	for _, id := range rel {
		msg = frame.AppendUint64(msg, id)
	}
	msg = frame.AppendUint16(msg, uint16(len(touched)))
	for _, k := range touched {
		msg = frame.AppendBytes16(msg, k)
	}
	if len(req) > 1 {
		msg = append(msg, req[3:]...)
	}
	start := time.Now()
	for try := 0; ; try++ {
		cl := s.client()
		actx, acancel := ctx, context.CancelFunc(func() {})
		if s.etcd != nil {
			// A master that went silent (paused, cut off) is looked
			// for again after MasterTTL.
			actx, acancel = context.WithTimeout(ctx, s.cfg.MasterTTL)
		}
		p, err := cl.Call(actx, msg)
		acancel()
		if err == nil {
			d := frame.NewDecoder(p)
			if err = decodeErr(&d); err == nil {
				if d.Err() != nil {
					return nil, fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
				}
				return &d, nil
			}
			if !errors.Is(err, errRetry) {
				return nil, err
			}
		} else {
			if errors.Is(err, rpc.ErrClosed) {
				return nil, ErrClosed
			}
			err = fmt.Errorf("kv: master %s: %w", cl.Addr(), err)
		}
		// The master went or is not the master: find it again through
		// etcd and send the request again (every request is safe to
		// send twice; see docs/transfer.md).
		retry := errors.Is(err, errRetry)
		if s.etcd == nil && !retry || ctx.Err() != nil || time.Since(start) > s.failoverBound() {
			return nil, err
		}
		if s.etcd == nil {
			// A master reached by its address, taking over: wait.
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(min(10*time.Millisecond<<min(try, 5), 200*time.Millisecond)):
			}
			continue
		}
		if rerr := s.findMaster(ctx, cl, try); rerr != nil {
			return nil, fmt.Errorf("%w (finding the master again: %w)", err, rerr)
		}
	}
}

// touch reports a key read without the master on the next request.
func (s *Store) touch(key []byte) {
	s.relMu.Lock()
	if len(s.touched) < 4*maxTouches {
		s.touched = append(s.touched, append([]byte(nil), key...))
	}
	s.relMu.Unlock()
}

func (s *Store) release(ids ...uint64) {
	s.relMu.Lock()
	s.released = append(s.released, ids...)
	s.relMu.Unlock()
}

// Addr returns the master's address (what other nodes pass as
// Config.Addr).
func (s *Store) Addr() string { return s.client().Addr() }

func (s *Store) client() *rpc.Client {
	s.clMu.Lock()
	defer s.clMu.Unlock()
	return s.cl
}

// Node returns the store node's transfer engine node.
func (s *Store) Node() *transfer.Node { return s.node }

// AllocMR allocates registered memory for the zero-copy calls (GetMR,
// PutMR); Close frees it.
func (s *Store) AllocMR(size int) (*verbs.MR, error) { return s.node.AllocMR(size) }

// Close leaves the store (this node's values are gone; on the master's
// node, the whole store is) and frees the node.
func (s *Store) Close() error {
	s.stMu.Lock()
	if s.closed {
		s.stMu.Unlock()
		return nil
	}
	s.closed = true
	s.stMu.Unlock()
	if s.pool != nil && s.client() != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.call(ctx, frame.AppendString8(frame.AppendString8([]byte{opLeave, 0, 0}, s.node.Name()), s.session))
		cancel()
	}
	s.cancel()
	s.wg.Wait()
	s.clMu.Lock()
	if s.cl != nil {
		s.cl.Close()
	}
	for _, c := range s.old {
		c.Close()
	}
	s.clMu.Unlock()
	if s.etcd != nil {
		s.etcd.Close()
	}
	if s.srv != nil {
		s.srv.Close()
	}
	if s.node != nil {
		s.node.Close() // frees the pool and staging memory
	}
	return nil
}

// stage returns a registered region of at least n bytes.
func (s *Store) stage(n int) (*verbs.MR, error) {
	class := max(16, bits.Len(uint(n-1))) // 64 KiB at least
	s.stMu.Lock()
	if s.closed {
		s.stMu.Unlock()
		return nil, ErrClosed
	}
	if l := s.staging[class]; len(l) > 0 {
		mr := l[len(l)-1]
		s.staging[class] = l[:len(l)-1]
		s.stMu.Unlock()
		return mr, nil
	}
	s.stMu.Unlock()
	return s.node.AllocMR(1 << class)
}

func (s *Store) unstage(mr *verbs.MR) {
	class := bits.Len(uint(mr.Len() - 1))
	s.stMu.Lock()
	defer s.stMu.Unlock()
	if !s.closed && len(s.staging[class]) < 16 {
		s.staging[class] = append(s.staging[class], mr)
		return
	}
	if !s.closed {
		s.node.FreeMR(mr)
	}
}

func (s *Store) checkKeys(keys [][]byte) error {
	if len(keys) > MaxBatch {
		return fmt.Errorf("kv: %d keys in a batch (at most %d)", len(keys), MaxBatch)
	}
	for i, k := range keys {
		if len(k) == 0 || len(k) > s.maxKey {
			return &KeyError{Index: i, Key: k, Err: fmt.Errorf("%w: key of %d bytes (1 to %d)", ErrTooLarge, len(k), s.maxKey)}
		}
	}
	return nil
}

func appendKeys(req []byte, keys [][]byte) []byte {
	req = frame.AppendUint16(req, uint16(len(keys)))
	for _, k := range keys {
		req = frame.AppendBytes16(req, k)
	}
	return req
}

// PutMRBatch stores values from registered memory: values[i] under
// keys[i]. Each value is written one-sided into space the master placed
// on replicas store nodes and becomes visible when all are written; a
// failed one leaves the key's old value (if any). It returns nil or the
// failures as *KeyError (errors.Join).
func (s *Store) PutMRBatch(ctx context.Context, keys [][]byte, values []Buf) error {
	if len(keys) != len(values) {
		return fmt.Errorf("kv: %d keys, %d values", len(keys), len(values))
	}
	if err := s.checkKeys(keys); err != nil {
		return err
	}
	req := []byte{opPut, 0, 0, byte(s.cfg.Replicas)}
	req = frame.AppendUint16(req, uint16(len(keys)))
	for i, k := range keys {
		v := values[i]
		if v.Len < 0 || uint64(v.Len) > s.maxValue {
			return &KeyError{Index: i, Key: k, Err: fmt.Errorf("%w: value of %d bytes (at most %d)", ErrTooLarge, v.Len, s.maxValue)}
		}
		if v.Len > 0 && (v.MR == nil || v.Offset < 0 || v.Offset > v.MR.Len() || v.Len > v.MR.Len()-v.Offset) {
			return &KeyError{Index: i, Key: k, Err: fmt.Errorf("%w: value range outside its region", transfer.ErrBounds)}
		}
		req = frame.AppendBytes16(req, k)
		req = frame.AppendUint64(req, uint64(v.Len))
	}
	start := time.Now()
	d, err := s.call(ctx, req)
	if err != nil {
		return err
	}
	errs := make([]error, len(keys))
	vers := make([]uint64, len(keys))
	toks := make([]uint64, len(keys))
	locs := make([][]Location, len(keys))
	clears := make([][][]extent, len(keys))
	prev := make([][]Location, len(keys)) // the current versions' (see writeSlots)
	var prevLeases []uint64
	for i := range keys {
		s.cache.drop(keys[i])
		if errs[i] = decodeErr(d); errs[i] != nil {
			continue
		}
		vers[i], toks[i] = d.Uint64(), d.Uint64()
		locs[i] = decodeLocs(d)
		clears[i] = decodeClears(d, len(locs[i]))
		if d.Uint8() == 1 {
			prev[i], prevLeases = decodeRetired(d, nil, prevLeases)
		}
	}
	if d.Finish() != nil {
		return fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
	}
	wctx, cancel := context.WithDeadline(ctx, start.Add(s.writeWithin(prev)))
	defer cancel()
	failed := s.writeSlots(wctx, keys, values, vers, locs, clears, prev, errs)
	// Done with the current versions (their releases go with the commit).
	s.release(prevLeases...)
	end := []byte{opPutEnd, 0, 0, 0, 0}
	n := 0
	for i := range keys {
		if toks[i] == 0 {
			continue
		}
		commit := byte(1)
		if failed[i] != nil {
			commit = 0
			errs[i] = failed[i]
		}
		end = append(end, commit)
		end = frame.AppendUint64(end, toks[i])
		n++
	}
	if n == 0 {
		return keyErrors(keys, errs)
	}
	end[3], end[4] = byte(n>>8), byte(n)
	// The commit must reach the master even when ctx has ended: an abort
	// or commit left unsent holds the space for PutTTL.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ccancel()
	d, err = s.call(cctx, end)
	if err != nil {
		return err
	}
	var old []Location
	var leases []uint64
	for i := range keys {
		if toks[i] == 0 {
			continue
		}
		err := decodeErr(d)
		if err != nil {
			if errs[i] == nil {
				errs[i] = err
			}
			continue
		}
		if d.Uint8() == 1 {
			old, leases = decodeRetired(d, old, leases)
		}
		if errs[i] == nil && len(locs[i]) > 0 {
			if tr := s.transport(cctx, locs[i][0].Segment); tr != "" {
				s.cache.put(keys[i], cachedLoc{ver: vers[i], size: values[i].Len, locs: locs[i], tr: tr})
			}
		}
	}
	if d.Finish() != nil {
		return fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
	}
	// The versions replaced: gone for the clients that kept their
	// locations before this returns (cache.go).
	s.clearHeaders(cctx, old, leases)
	return keyErrors(keys, errs)
}

// oneSlice is a length every request of one slice fits in (what
// transfer.Request.After needs): the engine's slice size, at least
// transfer.DefaultSliceSize unless configured.
func (s *Store) oneSlice() int {
	if n := s.cfg.Transfer.SliceSize; n > 0 {
		return n
	}
	return transfer.DefaultSliceSize
}

// writeWithin is how long after a put began its writes may still land:
// well before the master may take the new slots back (putTTL), and,
// where the batch clears the current versions' headers (prev), before
// this put's read lease on them runs out (LeaseTTL): a clear that landed
// after it could zero part of another value written there meanwhile.
func (s *Store) writeWithin(prev [][]Location) time.Duration {
	within := s.putTTL / 2
	for _, p := range prev {
		if len(p) > 0 {
			return min(within, s.leaseTTL*9/10)
		}
	}
	return within
}

// writeSlots writes each value and its version header into the slots the
// master placed it in: first the ranges the master named set to 0 (the
// headers of dirty slots it overlaps, if any), and only once that is done
// the values and the versions (cache.go says why), and the headers of the
// key's current version (prev) set to 0. It returns per key the first
// failure.
func (s *Store) writeSlots(ctx context.Context, keys [][]byte, values []Buf, vers []uint64, locs [][]Location, clears [][][]extent, prev [][]Location, errs []error) []error {
	fail := func(err error) []error {
		failed := make([]error, len(keys))
		for i := range failed {
			failed[i] = err
		}
		return failed
	}
	widest := uint64(8)
	for _, c := range clears {
		for _, rs := range c {
			for _, r := range rs {
				widest = max(widest, r.len)
			}
		}
	}
	zero, err := s.stage(int(min(widest, 1<<20)))
	if err != nil {
		return fail(err)
	}
	defer s.unstage(zero)
	clear(zero.Bytes()[:min(widest, 1<<20)])
	hdr, err := s.stage(8 * len(keys))
	if err != nil {
		return fail(err)
	}
	defer s.unstage(hdr)
	b := hdr.Bytes()
	var clr, reqs []transfer.Request
	var cown, owner []int
	for i := range keys {
		if errs[i] != nil {
			continue
		}
		if values[i].Len > 0 {
			binary.LittleEndian.PutUint64(b[8*i:], vers[i])
		}
		for j, l := range locs[i] {
			h, ok := headerOf(l)
			if !ok || j >= len(clears[i]) || values[i].Len == 0 {
				continue
			}
			for _, r := range clears[i][j] {
				for off := uint64(0); off < r.len; off += uint64(zero.Len()) {
					clr = append(clr, transfer.Request{Op: transfer.Write, Local: zero, Segment: l.Segment,
						Offset: r.off + off, Length: int(min(r.len-off, uint64(zero.Len())))})
					cown = append(cown, i)
				}
			}
			reqs = append(reqs, transfer.Request{Op: transfer.Write, Local: values[i].MR, LocalOffset: values[i].Offset,
				Segment: l.Segment, Offset: l.Offset, Length: values[i].Len})
			h.Op, h.Local, h.LocalOffset = transfer.Write, hdr, 8*i
			reqs = append(reqs, h)
			owner = append(owner, i, i)
		}
		// The current version's headers, with the writes: a client that
		// kept its location asks the master from now on, which still
		// answers that version until the commit (and then the commit
		// has nothing left to clear).
		for _, l := range prev[i] {
			if h, ok := headerOf(l); ok {
				h.Op, h.Local = transfer.Write, zero
				reqs = append(reqs, h)
				owner = append(owner, i)
			}
		}
	}
	failed := s.move(ctx, clr, cown, errs)
	k := 0
	for j := range reqs {
		if failed[owner[j]] == nil {
			reqs[k], owner[k] = reqs[j], owner[j]
			// The headers go on the QP of the write before them (fenced:
			// for writes, no wait) where they can: one QP to complete
			// instead of several.
			reqs[k].After = k > 0 && reqs[k].Length == 8 && reqs[k-1].Segment == reqs[k].Segment && reqs[k-1].Length <= s.oneSlice()
			k++
		}
	}
	for i, f := range s.move(ctx, reqs[:k], owner[:k], errs) {
		if f != nil && failed[i] == nil {
			failed[i] = f
		}
	}
	return failed
}

// move runs a batch of transfer requests, each for key owner[k], and
// returns per key the first failure (indexed like errs; entries already
// set in errs are left alone).
func (s *Store) move(ctx context.Context, reqs []transfer.Request, owner []int, errs []error) []error {
	failed := make([]error, len(errs))
	if len(reqs) == 0 {
		return failed
	}
	b, err := s.node.Submit(ctx, reqs)
	if err != nil {
		// Submit refuses a whole batch for one bad request (a segment
		// whose node left): submit per segment, so that the others move.
		bySeg := map[string][]int{}
		for k, r := range reqs {
			bySeg[r.Segment] = append(bySeg[r.Segment], k)
		}
		if len(bySeg) == 1 {
			for _, i := range owner {
				failed[i] = err
			}
			return failed
		}
		for _, ks := range bySeg {
			sub := make([]transfer.Request, len(ks))
			own := make([]int, len(ks))
			for j, k := range ks {
				sub[j], own[j] = reqs[k], owner[k]
			}
			for i, f := range s.move(ctx, sub, own, errs) {
				if f != nil && failed[i] == nil {
					failed[i] = f
				}
			}
		}
		return failed
	}
	if err := b.Wait(context.WithoutCancel(ctx)); err != nil {
		for k := range reqs {
			if st, cause := b.Status(k); st != transfer.Completed && failed[owner[k]] == nil {
				failed[owner[k]] = fmt.Errorf("%w: %s", cause, st)
			}
		}
	}
	return failed
}

func keyErrors(keys [][]byte, errs []error) error {
	var all []error
	for i, err := range errs {
		if err != nil {
			all = append(all, &KeyError{Index: i, Key: keys[i], Err: err})
		}
	}
	return errors.Join(all...)
}

// GetMRBatch reads the values of keys into registered memory, one-sided
// from a store node holding each; it returns each value's length. A key
// absent fails with ErrNotFound, a destination too small with ErrBuffer.
// A value being read is neither evicted nor overwritten under the reader:
// the result is the value as some Put committed it, whole.
//
// Only the first sizes[i] bytes of dsts[i] are defined on return. The
// rest of the destination, and all of it for a key that failed (not
// found, ErrBuffer, any error), may have been written: a Get may read a
// value it knew of into the destination before it learns the key's
// current value is smaller, replaced or gone (speculate, cache.go).
func (s *Store) GetMRBatch(ctx context.Context, keys [][]byte, dsts []Buf) ([]int, error) {
	if len(keys) != len(dsts) {
		return nil, fmt.Errorf("kv: %d keys, %d destinations", len(keys), len(dsts))
	}
	if err := s.checkKeys(keys); err != nil {
		return nil, err
	}
	for i, b := range dsts {
		if b.Len < 0 || (b.Len > 0 && (b.MR == nil || b.Offset < 0 || b.Offset > b.MR.Len() || b.Len > b.MR.Len()-b.Offset)) {
			return nil, &KeyError{Index: i, Key: keys[i], Err: fmt.Errorf("%w: destination range outside its region", transfer.ErrBounds)}
		}
	}
	getsNow.Add(1)
	defer getsNow.Add(-1)
	sizes := make([]int, len(keys))
	errs := make([]error, len(keys))
	pending := make([]bool, len(keys))
	for i := range pending {
		pending[i] = true
	}
	// The keys whose locations this client keeps: one-sided, no master
	// (cache.go), or read while the master is asked (speculate).
	var one [1]cachedLoc
	kept := one[:]
	if len(keys) > 1 {
		kept = make([]cachedLoc, len(keys))
	}
	// (With the master's table in etcd, a new master does not know which
	// freed slots' headers are still to clear: no such reads.)
	cached := s.etcd == nil && s.cache.lookup(keys, dsts, kept)
	if cached {
		s.getCached(ctx, keys, dsts, pending, sizes, kept)
	}
	if !slices.Contains(pending, true) {
		return sizes, nil
	}
	// The reads of an attempt end within 9/10 of the lease counted from
	// before its request to the master (getOnce); the speculative ones
	// start before that request and share its bound.
	start := time.Now()
	rctx, cancel := context.WithDeadline(ctx, start.Add(s.leaseTTL*9/10))
	defer cancel()
	var sp *spec
	if cached {
		sp = s.speculate(rctx, keys, dsts, pending, kept)
		if testSpeculated != nil && sp != nil {
			testSpeculated(sp)
		}
	}
	for attempt := 0; ; attempt++ {
		if attempt > 0 { // (at most 2 more)
			start = time.Now()
			var cancel context.CancelFunc
			rctx, cancel = context.WithDeadline(ctx, start.Add(s.leaseTTL*9/10))
			defer cancel()
		}
		expired := s.getOnce(ctx, rctx, start, keys, dsts, pending, sizes, errs, sp, kept)
		if sp != nil {
			s.specKept.Add(uint64(sp.kept))
			sp = nil
		}
		if !expired || attempt == 2 || ctx.Err() != nil || !slices.Contains(pending, true) {
			break
		}
	}
	return sizes, keyErrors(keys, errs)
}

// testSpeculated, if set (by tests only), runs in GetMRBatch between
// speculate and the master's answer.
var testSpeculated func(*spec)

// getOnce reads the keys still pending, but for those read by sp (if not
// nil) as the master's answer allows (speculate); it reports whether some
// read outlasted its lease (those stay pending, with ErrLeaseExpired).
// rctx ends at start plus 9/10 of the lease, start being before anything
// of this attempt was asked or read; kept is the locations the client
// kept when the Get began (lookup).
func (s *Store) getOnce(ctx, rctx context.Context, start time.Time, keys [][]byte, dsts []Buf, pending []bool, sizes []int, errs []error, sp *spec, kept []cachedLoc) bool {
	var idx []int
	req := []byte{opGet, 0, 0}
	var ks [][]byte
	for i := range keys {
		if pending[i] {
			errs[i] = nil
			idx = append(idx, i)
			ks = append(ks, keys[i])
		}
	}
	req = appendKeys(req, ks)
	d, err := s.call(ctx, req)
	// The speculative reads end before anything else is read into their
	// destinations, or the call returns.
	sp.wait(ctx)
	if err != nil {
		for _, i := range idx {
			errs[i], pending[i] = err, false
		}
		return false
	}
	var leases []uint64
	locs := make([][]Location, len(keys))
	vers := make([]uint64, len(keys))
	for _, i := range idx {
		if errs[i] = decodeErr(d); errs[i] != nil {
			pending[i] = false
			if kept[i].ver != 0 {
				s.noteStale(kept[i], 0, 0, nil) // (gone)
			}
			continue
		}
		size, id := d.Uint64(), d.Uint64()
		vers[i] = d.Uint64()
		locs[i] = decodeLocs(d)
		leases = append(leases, id)
		sizes[i] = int(size)
		if kept[i].ver != 0 {
			s.noteStale(kept[i], vers[i], sizes[i], locs[i])
		}
		if size > uint64(dsts[i].Len) {
			errs[i], pending[i] = fmt.Errorf("%w: value of %d bytes, destination of %d", ErrBuffer, size, dsts[i].Len), false
		}
	}
	defer s.release(leases...)
	if d.Finish() != nil {
		for _, i := range idx {
			errs[i], pending[i] = fmt.Errorf("%w: malformed answer", rpc.ErrProtocol), false
		}
		return false
	}
	sp.settle(pending, errs, vers, sizes, locs)
	deadline := start.Add(s.leaseTTL * 9 / 10)
	// Read each from its first replica; what fails is read again from
	// the next.
	for r := 0; r < MaxReplicas; r++ {
		var reqs []transfer.Request
		var owner []int
		for _, i := range idx {
			if !pending[i] || errs[i] != nil && r == 0 || r >= len(locs[i]) {
				continue
			}
			if sizes[i] == 0 {
				pending[i] = false
				continue
			}
			reqs = append(reqs, transfer.Request{Op: transfer.Read, Local: dsts[i].MR, LocalOffset: dsts[i].Offset,
				Segment: locs[i][r].Segment, Offset: locs[i][r].Offset, Length: sizes[i]})
			owner = append(owner, i)
		}
		if len(reqs) == 0 {
			break
		}
		failed := s.move(rctx, reqs, owner, errs)
		for _, i := range owner {
			errs[i] = failed[i]
			if failed[i] == nil || r+1 >= len(locs[i]) {
				pending[i] = false
			}
		}
	}
	expired := false
	if time.Now().After(deadline) {
		// The space may have been reused under a read this slow: none of
		// this round's reads is trusted.
		for _, i := range idx {
			if errs[i] == nil && locs[i] != nil {
				errs[i], pending[i], expired = ErrLeaseExpired, true, true
			}
		}
	}
	for _, i := range idx {
		if errs[i] != nil || pending[i] || len(locs[i]) == 0 {
			continue
		}
		if k := kept[i]; k.read && k.ver == vers[i] && k.locs[0] == locs[i][0] {
			continue // kept already
		}
		if tr := s.transport(ctx, locs[i][0].Segment); tr != "" {
			s.cache.put(keys[i], cachedLoc{ver: vers[i], size: sizes[i], locs: locs[i], tr: tr, read: true})
		}
	}
	return expired
}

// Put stores value under key (copied into registered memory, then
// written one-sided to the store nodes the master chose).
func (s *Store) Put(ctx context.Context, key, value []byte) error {
	return s.PutBatch(ctx, [][]byte{key}, [][]byte{value})
}

// PutBatch stores values[i] under keys[i] (see PutMRBatch).
func (s *Store) PutBatch(ctx context.Context, keys, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("kv: %d keys, %d values", len(keys), len(values))
	}
	total := 0
	for i, v := range values {
		if uint64(len(v)) > s.maxValue {
			return &KeyError{Index: i, Key: keys[i], Err: fmt.Errorf("%w: value of %d bytes (at most %d)", ErrTooLarge, len(v), s.maxValue)}
		}
		total += len(v)
	}
	mr, err := s.stage(max(total, 1))
	if err != nil {
		return err
	}
	defer s.unstage(mr)
	bufs := make([]Buf, len(values))
	off := 0
	for i, v := range values {
		copy(mr.Bytes()[off:], v)
		bufs[i] = Buf{MR: mr, Offset: off, Len: len(v)}
		off += len(v)
	}
	return s.PutMRBatch(ctx, keys, bufs)
}

// PutMR stores value (registered memory) under key, without a copy.
func (s *Store) PutMR(ctx context.Context, key []byte, value Buf) error {
	return s.PutMRBatch(ctx, [][]byte{key}, []Buf{value})
}

// GetMR reads key's value into dst without a copy and returns its length.
// dst beyond that length, and all of it on an error, is unspecified on
// return (GetMRBatch).
func (s *Store) GetMR(ctx context.Context, key []byte, dst Buf) (int, error) {
	n, err := s.GetMRBatch(ctx, [][]byte{key}, []Buf{dst})
	if err != nil {
		return 0, unwrapOne(err)
	}
	return n[0], nil
}

// Get returns key's value (ErrNotFound if none).
func (s *Store) Get(ctx context.Context, key []byte) ([]byte, error) {
	vs, err := s.GetBatch(ctx, [][]byte{key})
	if err != nil {
		return nil, unwrapOne(err)
	}
	return vs[0], nil
}

// GetInto reads key's value into dst (one copy, through registered
// staging memory) and returns its length; ErrBuffer when dst is too small.
func (s *Store) GetInto(ctx context.Context, key, dst []byte) (int, error) {
	mr, err := s.stage(max(len(dst), 1))
	if err != nil {
		return 0, err
	}
	defer s.unstage(mr)
	n, err := s.GetMRBatch(ctx, [][]byte{key}, []Buf{{MR: mr, Len: len(dst)}})
	if err != nil {
		if n != nil {
			return n[0], unwrapOne(err)
		}
		return 0, err
	}
	return copy(dst, mr.Bytes()[:n[0]]), nil
}

// GetBatch returns the values of keys (nil for those that failed, with
// their *KeyError in the joined error).
func (s *Store) GetBatch(ctx context.Context, keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	// Sizes are known only from the master: read into staging regions
	// large enough for the common case, again for the larger ones.
	guess := max(64<<10, int(s.sizeHint.Load()))
	mr, err := s.stage(guess * max(1, min(len(keys), 16)))
	if err != nil {
		return nil, err
	}
	defer func() { s.unstage(mr) }()
	per := mr.Len() / max(1, len(keys))
	dsts := make([]Buf, len(keys))
	for i := range keys {
		dsts[i] = Buf{MR: mr, Offset: i * per, Len: per}
	}
	sizes, err := s.GetMRBatch(ctx, keys, dsts)
	var big []int
	errs := make([]error, len(keys))
	if err != nil {
		joined, ok := err.(interface{ Unwrap() []error })
		if !ok {
			return nil, err
		}
		for _, e := range joined.Unwrap() {
			var ke *KeyError
			if !errors.As(e, &ke) {
				return nil, err
			}
			errs[ke.Index] = ke.Err
			if errors.Is(ke.Err, ErrBuffer) {
				big = append(big, ke.Index)
				errs[ke.Index] = nil
				if h := int64(sizes[ke.Index]); h > s.sizeHint.Load() && uint64(h) <= s.maxValue {
					s.sizeHint.Store(h)
				}
			}
		}
	}
	for i := range keys {
		if errs[i] == nil && !contains(big, i) {
			out[i] = append([]byte(nil), mr.Bytes()[dsts[i].Offset:dsts[i].Offset+sizes[i]]...)
		}
	}
	for _, i := range big {
		// Read again into a region of the size the master told (the
		// value may have changed meanwhile: then again).
		for try := 0; try < 3; try++ {
			m2, err := s.stage(max(sizes[i], 1))
			if err != nil {
				errs[i] = err
				break
			}
			n, err := s.GetMRBatch(ctx, keys[i:i+1], []Buf{{MR: m2, Len: m2.Len()}})
			if n == nil {
				s.unstage(m2)
				errs[i] = err
				break
			}
			if err == nil {
				out[i] = append([]byte(nil), m2.Bytes()[:n[0]]...)
			}
			s.unstage(m2)
			sizes[i], errs[i] = n[0], unwrapOne(err)
			if !errors.Is(errs[i], ErrBuffer) {
				break
			}
		}
	}
	return out, keyErrors(keys, errs)
}

func contains(l []int, x int) bool {
	for _, y := range l {
		if y == x {
			return true
		}
	}
	return false
}

// unwrapOne returns the cause of a one-key batch's failure.
func unwrapOne(err error) error {
	var ke *KeyError
	if errors.As(err, &ke) {
		return ke.Err
	}
	return err
}

// ExistsBatch reports which keys have a value.
func (s *Store) ExistsBatch(ctx context.Context, keys [][]byte) ([]bool, error) {
	if err := s.checkKeys(keys); err != nil {
		return nil, err
	}
	d, err := s.call(ctx, appendKeys([]byte{opExists, 0, 0}, keys))
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(keys))
	for i := range keys {
		out[i] = decodeErr(d) == nil
	}
	if d.Finish() != nil {
		return nil, fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
	}
	return out, nil
}

// Exists reports whether key has a value.
func (s *Store) Exists(ctx context.Context, key []byte) (bool, error) {
	r, err := s.ExistsBatch(ctx, [][]byte{key})
	if err != nil {
		return false, err
	}
	return r[0], nil
}

// RemoveBatch removes keys (ErrNotFound for those absent). A value being
// read is freed when its readers are done.
func (s *Store) RemoveBatch(ctx context.Context, keys [][]byte) error {
	if err := s.checkKeys(keys); err != nil {
		return err
	}
	for _, k := range keys {
		s.cache.drop(k)
	}
	d, err := s.call(ctx, appendKeys([]byte{opRemove, 0, 0}, keys))
	if err != nil {
		return err
	}
	errs := make([]error, len(keys))
	var old []Location
	var leases []uint64
	for i := range keys {
		if errs[i] = decodeErr(d); errs[i] == nil {
			old, leases = decodeRetired(d, old, leases)
		}
	}
	if d.Finish() != nil {
		return fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
	}
	// Gone for the clients that kept their locations (cache.go).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	s.clearHeaders(cctx, old, leases)
	return keyErrors(keys, errs)
}

// Remove removes key (ErrNotFound if absent).
func (s *Store) Remove(ctx context.Context, key []byte) error {
	return unwrapOne(s.RemoveBatch(ctx, [][]byte{key}))
}

// List returns up to limit keys starting with prefix, in byte order. A
// long list takes several requests (each answer is bounded), so it is not
// one snapshot: keys put or removed meanwhile may be missed or listed.
func (s *Store) List(ctx context.Context, prefix []byte, limit int) ([]KeyInfo, error) {
	if len(prefix) > MaxKeyLen || limit < 0 {
		return nil, fmt.Errorf("%w: prefix of %d bytes", ErrTooLarge, len(prefix))
	}
	var out []KeyInfo
	var after []byte
	for limit > 0 {
		req := frame.AppendBytes16([]byte{opList, 0, 0}, prefix)
		req = frame.AppendUint32(req, uint32(min(limit-len(out), maxListKeys)))
		d, err := s.call(ctx, frame.AppendBytes16(req, after))
		if err != nil {
			return nil, err
		}
		n := int(d.Uint32())
		if n > limit-len(out) {
			return nil, fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
		}
		for i := 0; i < n && d.Err() == nil; i++ {
			k := append([]byte(nil), d.Bytes16()...)
			out = append(out, KeyInfo{Key: k, Size: d.Uint64()})
		}
		more := d.Uint8() == 1
		if d.Finish() != nil || more && n == 0 {
			return nil, fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
		}
		if !more || len(out) >= limit {
			return out, nil
		}
		after = out[len(out)-1].Key
	}
	return nil, nil
}

// Stats returns the master's view: keys, leases, evictions, store nodes.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	d, err := s.call(ctx, []byte{opStats})
	if err != nil {
		return Stats{}, err
	}
	st := Stats{Keys: int(d.Uint32()), Leases: int(d.Uint32()), Evictions: d.Uint64()}
	n := int(d.Uint32())
	for i := 0; i < n && d.Err() == nil; i++ {
		st.Nodes = append(st.Nodes, NodeStats{Name: d.String8(), Capacity: d.Uint64(), Used: d.Uint64(), Values: int(d.Uint32())})
	}
	if d.Finish() != nil {
		return Stats{}, fmt.Errorf("%w: malformed answer", rpc.ErrProtocol)
	}
	return st, nil
}
