package transfer

// Metadata in etcd (Config.MetadataAddr "etcd://host:2379,host:2379[/prefix]"):
// nodes and segments are keys under a prefix, a node's and its segments'
// keys bound to one etcd lease of the node's TTL, so that a node that stops
// renewing disappears, with its segments, when etcd expires the lease.
// Goroutines: those of the etcd client (gRPC); calls run on the caller's
// goroutine, each bounded by etcdTimeout when its context has no deadline.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func nopLogger() *zap.Logger { return zap.NewNop() }

// etcdTimeout bounds each etcd call whose context has no deadline.
const etcdTimeout = 5 * time.Second

// DefaultEtcdPrefix is the key prefix of an etcd URL without a path.
const DefaultEtcdPrefix = "/rdmakit/transfer/"

// etcdMeta is Metadata in etcd.
type etcdMeta struct {
	cli       *clientv3.Client
	endpoints []string
	prefix    string

	// mu guards leases.
	mu     sync.Mutex
	leases map[string]clientv3.LeaseID // nodes put through this client
}

// IsEtcdURL reports whether a metadata address names etcd.
func IsEtcdURL(addr string) bool { return strings.HasPrefix(addr, "etcd://") }

// ParseEtcdURL splits an etcd URL ("etcd://host:port,host:port[/prefix]")
// into its endpoints and its key prefix (ending in "/"; DefaultEtcdPrefix
// when the URL has no path).
func ParseEtcdURL(url string) (endpoints []string, prefix string, err error) {
	if !IsEtcdURL(url) {
		return nil, "", fmt.Errorf("transfer: %q is not an etcd:// URL", url)
	}
	rest := strings.TrimPrefix(url, "etcd://")
	prefix = DefaultEtcdPrefix
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		prefix = strings.TrimSuffix(rest[i:], "/") + "/"
		rest = rest[:i]
	}
	for _, e := range strings.Split(rest, ",") {
		if e != "" {
			endpoints = append(endpoints, e)
		}
	}
	if len(endpoints) == 0 {
		return nil, "", fmt.Errorf("transfer: %q names no etcd endpoint", url)
	}
	return endpoints, prefix, nil
}

// OpenEtcd returns Metadata stored in the etcd cluster of url
// ("etcd://host:port,host:port[/prefix]"). It does not wait for etcd: the
// first call fails if it cannot be reached.
func OpenEtcd(url string) (Metadata, error) {
	eps, prefix, err := ParseEtcdURL(url)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: etcdTimeout, DialKeepAliveTime: 10 * time.Second,
		DialKeepAliveTimeout: 3 * time.Second, Logger: nopLogger()})
	if err != nil {
		return nil, fmt.Errorf("transfer: etcd %v: %w", eps, err)
	}
	return &etcdMeta{cli: cli, endpoints: eps, prefix: prefix, leases: map[string]clientv3.LeaseID{}}, nil
}

func (m *etcdMeta) nodeKey(name string) string { return m.prefix + "nodes/" + name }
func (m *etcdMeta) segKey(name string) string  { return m.prefix + "segments/" + name }

// bound gives ctx a deadline of etcdTimeout if it has none.
func bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, etcdTimeout)
}

// wrap says which etcd failed, and whether it looks unreachable.
func (m *etcdMeta) wrap(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("transfer: etcd %v: no answer within %v (unreachable?): %w", m.endpoints, etcdTimeout, err)
	}
	return fmt.Errorf("transfer: etcd %v: %w", m.endpoints, err)
}

func (m *etcdMeta) PutNode(ctx context.Context, n NodeInfo, ttl time.Duration) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	val, _ := json.Marshal(n)
	key := m.nodeKey(n.Name)
	var opts []clientv3.OpOption
	var lease clientv3.LeaseID
	if ttl > 0 {
		g, err := m.cli.Grant(ctx, max(1, int64((ttl+time.Second-1)/time.Second)))
		if err != nil {
			return m.wrap(err)
		}
		lease = g.ID
		opts = append(opts, clientv3.WithLease(lease))
	}
	r, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val), opts...)).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return m.wrap(err)
	}
	if !r.Succeeded {
		kvs := r.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || string(kvs[0].Value) != string(val) {
			if lease != 0 {
				m.cli.Revoke(ctx, lease)
			}
			return fmt.Errorf("%w: node %q", ErrExists, n.Name)
		}
		// Our own record (a retry after a lost answer): keep its lease.
		if lease != 0 {
			m.cli.Revoke(ctx, lease)
		}
		lease = clientv3.LeaseID(kvs[0].Lease)
	}
	m.mu.Lock()
	m.leases[n.Name] = lease
	m.mu.Unlock()
	return nil
}

func (m *etcdMeta) leaseOf(ctx context.Context, node string) (clientv3.LeaseID, error) {
	m.mu.Lock()
	l, ok := m.leases[node]
	m.mu.Unlock()
	if ok {
		return l, nil
	}
	r, err := m.cli.Get(ctx, m.nodeKey(node))
	if err != nil {
		return 0, m.wrap(err)
	}
	if len(r.Kvs) == 0 {
		return 0, fmt.Errorf("%w: %q", ErrNoNode, node)
	}
	return clientv3.LeaseID(r.Kvs[0].Lease), nil
}

func (m *etcdMeta) Renew(ctx context.Context, node string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	l, err := m.leaseOf(ctx, node)
	if err != nil {
		return err
	}
	if l == 0 {
		return nil
	}
	if _, err := m.cli.KeepAliveOnce(ctx, l); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			m.mu.Lock()
			delete(m.leases, node)
			m.mu.Unlock()
			return fmt.Errorf("%w: %q (lease expired)", ErrNoNode, node)
		}
		return m.wrap(err)
	}
	return nil
}

func (m *etcdMeta) DeleteNode(ctx context.Context, node string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	l, err := m.leaseOf(ctx, node)
	if errors.Is(err, ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.leases, node)
	m.mu.Unlock()
	if l != 0 {
		// The node's keys and its segments' go with the lease.
		if _, err := m.cli.Revoke(ctx, l); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return m.wrap(err)
		}
		return nil
	}
	r, err := m.cli.Get(ctx, m.prefix+"segments/", clientv3.WithPrefix())
	if err != nil {
		return m.wrap(err)
	}
	ops := []clientv3.Op{clientv3.OpDelete(m.nodeKey(node))}
	for _, kv := range r.Kvs {
		var d SegmentDesc
		if json.Unmarshal(kv.Value, &d) == nil && d.Node == node {
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
	}
	if _, err := m.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return m.wrap(err)
	}
	return nil
}

func (m *etcdMeta) GetNode(ctx context.Context, node string) (NodeInfo, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	r, err := m.cli.Get(ctx, m.nodeKey(node))
	if err != nil {
		return NodeInfo{}, m.wrap(err)
	}
	if len(r.Kvs) == 0 {
		return NodeInfo{}, fmt.Errorf("%w: %q", ErrNoNode, node)
	}
	var n NodeInfo
	if err := json.Unmarshal(r.Kvs[0].Value, &n); err != nil {
		return NodeInfo{}, fmt.Errorf("%w: node %q in etcd: %v", ErrProtocol, node, err)
	}
	return n, nil
}

func (m *etcdMeta) PutSegment(ctx context.Context, s SegmentDesc) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	l, err := m.leaseOf(ctx, s.Node)
	if err != nil {
		return err
	}
	val, _ := json.Marshal(s)
	key, nk := m.segKey(s.Name), m.nodeKey(s.Node)
	var opts []clientv3.OpOption
	if l != 0 {
		opts = append(opts, clientv3.WithLease(l))
	}
	r, err := m.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.CreateRevision(nk), ">", 0)).
		Then(clientv3.OpPut(key, string(val), opts...)).
		Else(clientv3.OpGet(key), clientv3.OpGet(nk)).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return fmt.Errorf("%w: %q (lease expired; segment %q)", ErrNoNode, s.Node, s.Name)
		}
		return m.wrap(err)
	}
	if r.Succeeded {
		return nil
	}
	if len(r.Responses[1].GetResponseRange().Kvs) == 0 {
		return fmt.Errorf("%w: %q (segment %q)", ErrNoNode, s.Node, s.Name)
	}
	kvs := r.Responses[0].GetResponseRange().Kvs
	if len(kvs) > 0 && string(kvs[0].Value) == string(val) {
		return nil // our own record (a retry after a lost answer)
	}
	var old SegmentDesc
	if len(kvs) > 0 {
		json.Unmarshal(kvs[0].Value, &old)
	}
	return fmt.Errorf("%w: segment %q (on node %q)", ErrExists, s.Name, old.Node)
}

func (m *etcdMeta) DeleteSegment(ctx context.Context, node, name string) error {
	ctx, cancel := bound(ctx)
	defer cancel()
	key := m.segKey(name)
	r, err := m.cli.Get(ctx, key)
	if err != nil {
		return m.wrap(err)
	}
	if len(r.Kvs) == 0 {
		return nil
	}
	var d SegmentDesc
	if json.Unmarshal(r.Kvs[0].Value, &d) != nil || d.Node != node {
		return nil
	}
	// Only that version: a segment of that name registered since stays.
	_, err = m.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", r.Kvs[0].ModRevision)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return m.wrap(err)
	}
	return nil
}

func (m *etcdMeta) GetSegment(ctx context.Context, name string) (SegmentDesc, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	r, err := m.cli.Get(ctx, m.segKey(name))
	if err != nil {
		return SegmentDesc{}, m.wrap(err)
	}
	if len(r.Kvs) == 0 {
		return SegmentDesc{}, fmt.Errorf("%w: %q", ErrNoSegment, name)
	}
	var d SegmentDesc
	if err := json.Unmarshal(r.Kvs[0].Value, &d); err != nil {
		return SegmentDesc{}, fmt.Errorf("%w: segment %q in etcd: %v", ErrProtocol, name, err)
	}
	return d, nil
}

func (m *etcdMeta) Close() error { return m.cli.Close() }
