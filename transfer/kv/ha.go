package kv

// The master's high availability, when the store's metadata is in etcd:
// every store node that runs a master campaigns for the role through an
// etcd election (one session lease each); the winner loads the table from
// etcd and writes every change of it through to etcd, each write a
// transaction that holds only while the winner's election key still
// exists with the revision it won with (a master that lost the role, even
// one that does not know it yet, cannot write). Clients find the master
// through the election's leader key and send a request again when the
// master they reached went or answers that it is not (or not yet) the
// master.
//
// What is in etcd, under <prefix>kv/: h/<name> a holder (segment, size),
// e/<hex key> a key's visible value (version, put token, size, replicas),
// p/<version> a put in progress (with its token, so that a commit sent
// again after a failover finds it), master/ the election. Read leases are not: see
// takeOver for what keeps reads whole across a failover.
//
// Goroutines: campaign (one per node that may be master) runs the
// election, the table's load and the session's keep-alive; watchMaster
// (one per node) follows the election; the journal is flushed by the rpc
// handler goroutine under the master's lock.

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"

	"github.com/rdmakit/rdmakit/transfer"
	"github.com/rdmakit/rdmakit/transfer/internal/rpc"
)

// errRetry: the node reached is not the master (any more, or not yet: it
// is loading the table or waiting for reads of the last master to end).
var errRetry = errors.New("kv: master moving (not the master, or starting)")

// errDeposed: a write of the table was refused: another node holds the
// master's role.
var errDeposed = errors.New("kv: no longer the master")

// haTxnOps bounds the operations of one etcd transaction (etcd's default
// limit is 128).
const haTxnOps = 64

// haMaster is the master's part of HA. The master's lock guards all but
// lastAck.
type haMaster struct {
	cli     *clientv3.Client
	pfx     string        // <prefix>kv/
	ttl     time.Duration // the session lease's
	active  bool          // this node won the election and loaded the table
	key     string        // the election key it won with
	rev     int64         // and its creation revision
	grace   time.Time     // no space handed out before (takeOver)
	deposed chan struct{} // a write was refused: give up the role
	ops     map[string]*string
	order   []string
	lastAck atomic.Int64 // unix nanoseconds of the last keep-alive answer
}

// serving reports whether this master may answer: it holds the role and
// its session lease was renewed recently enough that no other node can
// hold it yet (half the lease's TTL: the lease outlives that by the
// other half, far more than a round trip).
func (h *haMaster) serving(now time.Time) bool {
	return h.active && now.UnixNano()-h.lastAck.Load() < int64(h.ttl/2)
}

// record is a holder's or a value's row in etcd.
type record struct {
	Key  []byte   `json:"k,omitempty"`
	Ver  uint64   `json:"v,omitempty"`
	Tok  uint64   `json:"t,omitempty"`
	Size uint64   `json:"s"`
	Seg  string   `json:"g,omitempty"`
	Hold []string `json:"h,omitempty"`
	Offs []uint64 `json:"o,omitempty"`
}

func (m *master) journal(key string, val *string) {
	h := m.ha
	if h == nil || !h.active {
		return
	}
	if _, ok := h.ops[key]; !ok {
		h.order = append(h.order, key)
	}
	h.ops[key] = val
}

func entryRecord(e *entry) *string {
	r := record{Key: []byte(e.key), Ver: e.ver, Tok: e.tok, Size: e.size}
	for _, x := range e.reps {
		r.Hold = append(r.Hold, x.h.name)
		r.Offs = append(r.Offs, x.off)
	}
	b, _ := json.Marshal(r)
	v := string(b)
	return &v
}

func (m *master) journalEntry(e *entry, live bool) {
	if m.ha == nil {
		return
	}
	var v *string
	if live {
		v = entryRecord(e)
	}
	m.journal("e/"+hex.EncodeToString([]byte(e.key)), v)
}

func (m *master) journalPending(e *entry, live bool) {
	if m.ha == nil {
		return
	}
	var v *string
	if live {
		v = entryRecord(e)
	}
	m.journal("p/"+strconv.FormatUint(e.ver, 10), v)
}

// journalHolder records a holder (segment "": gone).
func (m *master) journalHolder(name, segment string, size uint64) {
	if m.ha == nil {
		return
	}
	var v *string
	if segment != "" {
		b, _ := json.Marshal(record{Seg: segment, Size: size})
		s := string(b)
		v = &s
	}
	m.journal("h/"+name, v)
}

// flush writes the changes journaled by one request, fenced by the
// election key; on a refusal the master gives up the role. The caller
// holds the master's lock.
func (m *master) flush() error {
	h := m.ha
	if h == nil || len(h.order) == 0 {
		return nil
	}
	order, ops := h.order, h.ops
	h.order, h.ops = nil, map[string]*string{}
	ctx, cancel := context.WithTimeout(context.Background(), h.ttl)
	defer cancel()
	for len(order) > 0 {
		n := min(len(order), haTxnOps)
		var tops []clientv3.Op
		for _, k := range order[:n] {
			if v := ops[k]; v != nil {
				tops = append(tops, clientv3.OpPut(h.pfx+k, *v))
			} else {
				tops = append(tops, clientv3.OpDelete(h.pfx+k))
			}
		}
		order = order[n:]
		r, err := h.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.rev)).Then(tops...).Commit()
		if err == nil && !r.Succeeded {
			err = errDeposed
		}
		if err != nil {
			h.active = false
			select {
			case h.deposed <- struct{}{}:
			default:
			}
			return fmt.Errorf("%w: %w", errRetry, err)
		}
	}
	return nil
}

// takeOver loads the table from etcd into a master that just won the
// election. Read leases the last master gave are not in etcd; a reader
// stops trusting its read LeaseTTL*9/10 after it asked for the lease, so
// the new master hands out no space for LeaseTTL after it takes over: no
// value a reader of the last master may still be reading is overwritten.
// Versions restart above rev<<32 (rev grows with every election), so none
// is ever issued twice (a version names a slot's contents: see valHdr);
// lease ids and put tokens are random 64-bit numbers. A table with no holder is a new
// store's, with no read to wait for: its first master starts at once. The
// caller holds the master's lock.
func (m *master) takeOver(now time.Time, kvs []*kvRow, rev int64, holderTTL time.Duration) {
	m.holders, m.entries, m.pending, m.leases = map[string]*holder{}, map[string]*entry{}, map[uint64]*entry{}, map[uint64]*lease{}
	m.lru.Init()
	m.next = uint64(rev) << 32
	var recs []record
	var pend []bool
	for _, kv := range kvs {
		var r record
		if json.Unmarshal(kv.val, &r) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(kv.key, "h/"):
			name := kv.key[2:]
			m.holders[name] = &holder{name: name, segment: r.Seg, alloc: newAllocator(r.Size), ttl: holderTTL, seen: now}
		case strings.HasPrefix(kv.key, "e/"), strings.HasPrefix(kv.key, "p/"):
			recs = append(recs, r)
			pend = append(pend, kv.key[0] == 'p')
		}
	}
	idx := make([]int, len(recs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return recs[idx[a]].Ver < recs[idx[b]].Ver })
	for _, i := range idx {
		r := recs[i]
		m.next = max(m.next, r.Ver)
		e := &entry{key: string(r.Key), ver: r.Ver, tok: r.Tok, size: r.Size, expires: now.Add(m.putTTL)}
		for j, name := range r.Hold {
			h := m.holders[name]
			if h == nil || j >= len(r.Offs) || (r.Size > 0 && !h.alloc.reserve(r.Offs[j], slot(r.Size))) {
				continue
			}
			e.reps = append(e.reps, replica{h: h, off: r.Offs[j]})
			h.entries++
		}
		if len(e.reps) == 0 && r.Size > 0 {
			continue
		}
		if pend[i] {
			if e.tok != 0 && m.pending[e.tok] == nil {
				m.pending[e.tok] = e
			} else {
				m.free(e)
			}
			continue
		}
		if old := m.entries[e.key]; old != nil {
			m.unlink(old)
			m.free(old)
		}
		e.visible, e.read = true, true
		e.lru = m.lru.PushBack(e)
		m.entries[e.key] = e
	}
	if len(m.holders) > 0 {
		m.ha.grace = now.Add(m.leaseTTL)
	} else {
		m.ha.grace = time.Time{} // a new store: no read to wait for
	}
	m.ha.ops, m.ha.order = map[string]*string{}, nil
	m.ha.active = true
}

type kvRow struct {
	key string
	val []byte
}

// etcdClient opens a client on the etcd of a metadata URL and returns it
// with the store's key prefix.
func etcdClient(url string) (*clientv3.Client, string, error) {
	eps, prefix, err := transfer.ParseEtcdURL(url)
	if err != nil {
		return nil, "", err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, "", fmt.Errorf("kv: etcd %v: %w", eps, err)
	}
	return cli, prefix + "kv/", nil
}

// campaign runs for master until ctx ends: it wins the election, takes
// over, and serves until its session ends or a write is refused; then it
// runs again. addr is what clients dial ("tcp addr\nlocal socket").
func (s *service) campaign(ctx context.Context, addr string) {
	m, h := s.m, s.m.ha
	ttlSec := max(1, int((h.ttl+time.Second-1)/time.Second))
	for ctx.Err() == nil {
		if err := s.term(ctx, addr, ttlSec); err != nil && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		m.mu.Lock()
		h.active = false
		m.mu.Unlock()
	}
}

// term is one run for master: from the session's start to its end.
func (s *service) term(ctx context.Context, addr string, ttlSec int) error {
	m, h := s.m, s.m.ha
	g, err := h.cli.Grant(ctx, int64(ttlSec))
	if err != nil {
		return err
	}
	h.lastAck.Store(time.Now().UnixNano())
	kctx, kcancel := context.WithCancel(ctx)
	defer kcancel()
	acks, err := h.cli.KeepAlive(kctx, g.ID)
	if err != nil {
		return err
	}
	go func() {
		for range acks {
			h.lastAck.Store(time.Now().UnixNano())
		}
	}()
	sess, err := concurrency.NewSession(h.cli, concurrency.WithLease(g.ID))
	if err != nil {
		return err
	}
	defer func() {
		// Close revokes the lease: the election key goes at once.
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		h.cli.Revoke(cctx, g.ID)
		cancel()
		sess.Close()
	}()
	el := concurrency.NewElection(sess, h.pfx+"master")
	if err := el.Campaign(ctx, addr); err != nil {
		return err
	}
	rows, err := h.cli.Get(ctx, h.pfx, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var kvs []*kvRow
	for _, kv := range rows.Kvs {
		kvs = append(kvs, &kvRow{key: strings.TrimPrefix(string(kv.Key), h.pfx), val: kv.Value})
	}
	m.mu.Lock()
	h.key, h.rev = el.Key(), el.Rev()
	select {
	case <-h.deposed:
	default:
	}
	m.takeOver(time.Now(), kvs, el.Rev(), s.holderTTL)
	if h := m.holders[s.self]; h != nil && s.self != "" {
		h.session = s.selfSession // this process's own store node is alive (putStart prefers such holders)
	}
	m.mu.Unlock()
	select {
	case <-ctx.Done():
		m.mu.Lock()
		h.active = false
		m.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		el.Resign(rctx)
		cancel()
		return nil
	case <-sess.Done():
	case <-h.deposed:
	}
	return nil
}

// leader returns the master's address from the election ("" if none).
func leader(ctx context.Context, cli *clientv3.Client, pfx string) (string, error) {
	r, err := cli.Get(ctx, pfx+"master/", append(clientv3.WithFirstCreate(), clientv3.WithPrefix())...)
	if err != nil {
		return "", err
	}
	if len(r.Kvs) == 0 {
		return "", nil
	}
	return string(r.Kvs[0].Value), nil
}

// openHA opens a store node whose master is found (and, with Config.Addr
// empty, run for) through etcd.
func (s *Store) openHA(ctx context.Context, tc transfer.Config) (err error) {
	cfg := s.cfg
	url := tc.MetadataAddr
	if transfer.IsEtcdURL(cfg.Addr) {
		url = cfg.Addr
	}
	tc.MetadataAddr, tc.Metadata = url, nil
	if s.etcd, s.etcdPfx, err = etcdClient(url); err != nil {
		return err
	}
	if cfg.Addr == "" {
		if tc, err = s.masterListen(tc); err != nil {
			return err
		}
	}
	if s.node, err = transfer.New(ctx, tc); err != nil {
		return err
	}
	if cfg.Addr == "" {
		m := newMaster(cfg.LeaseTTL, cfg.PutTTL)
		m.ha = &haMaster{cli: s.etcd, pfx: s.etcdPfx, ttl: cfg.MasterTTL, deposed: make(chan struct{}, 1), ops: map[string]*string{}}
		if err := s.serveMaster(m, url, tc); err != nil {
			return err
		}
		addr := s.srv.Addr() + "\n" + s.svc.local
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.svc.campaign(s.ctx, addr)
		}()
	}
	if err := s.findMaster(ctx, nil, 0); err != nil {
		return err
	}
	s.wg.Add(1)
	go s.watchMaster()
	return s.info(ctx)
}

// watchMaster points the client at the master each time the election
// changes, so that requests with short deadlines (heartbeats) do not
// spend them on a master that went.
func (s *Store) watchMaster() {
	defer s.wg.Done()
	for range s.etcd.Watch(s.ctx, s.etcdPfx+"master/", clientv3.WithPrefix()) {
		ctx, cancel := context.WithTimeout(s.ctx, s.failoverBound())
		s.findMaster(ctx, nil, 0)
		cancel()
	}
}

// failoverBound is how long a request keeps looking for a master: the
// session lease of a dead one to expire, an election, and the new
// master's wait for the last one's reads.
func (s *Store) failoverBound() time.Duration {
	return 2*s.cfg.MasterTTL + s.cfg.LeaseTTL + 10*time.Second
}

// findMaster waits (within failoverBound) for the election's leader and
// points the client at it when it is not cur.
func (s *Store) findMaster(ctx context.Context, cur *rpc.Client, try int) error {
	ctx, cancel := context.WithTimeout(ctx, s.failoverBound())
	defer cancel()
	for ; ; try++ {
		if cur != nil || try > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("kv: no master in etcd: %w", ctx.Err())
			case <-s.ctx.Done():
				return ErrClosed
			case <-time.After(min(10*time.Millisecond<<min(try, 5), 200*time.Millisecond)):
			}
		}
		v, err := leader(ctx, s.etcd, s.etcdPfx)
		if err != nil || v == "" {
			if ctx.Err() != nil {
				return fmt.Errorf("kv: no master in etcd: %w", errors.Join(err, ctx.Err()))
			}
			continue
		}
		addr, local, _ := strings.Cut(v, "\n")
		s.clMu.Lock()
		if s.cl == nil || s.cl.Addr() != addr {
			if s.cl != nil {
				s.old = append(s.old, s.cl)
			}
			s.cl = rpc.NewClient(addr, kvProto, s.cfg.Transfer.Secret)
			if local != "" && canLocal {
				s.cl.SetLocal(local)
			}
		}
		s.clMu.Unlock()
		return nil
	}
}
