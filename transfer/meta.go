package transfer

// Metadata: the table of nodes and segments, behind the Metadata
// interface. memTable is the embedded implementation; it has no
// goroutines (leases expire lazily, on every access) and is safe for
// concurrent use. The service that serves it to other nodes is
// metaserver.go, the client metaclient.go.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Endpoint is one device through which a node accepts connections: the
// device's name and its cm listener's address.
type Endpoint struct {
	Device string
	Addr   string
}

// NodeInfo describes a node in the metadata table.
type NodeInfo struct {
	Name string
	// Host identifies the host (kernel boot id and PID namespace): nodes
	// with the same Host can use the same-host device (shm0).
	Host      string
	Endpoints []Endpoint
}

// Region is a segment's memory as one device reaches it.
type Region struct {
	Device string
	Addr   uint64
	RKey   uint32
}

// SegmentDesc describes a segment in the metadata table.
type SegmentDesc struct {
	Name     string
	Node     string // the node holding the memory
	Size     uint64
	ReadOnly bool
	Regions  []Region
}

// Metadata is where nodes publish themselves and their segments. The
// embedded table (a node that serves it, or a client of another node's)
// is the one implementation in this package; an etcd one can satisfy the
// same interface. Every method is safe for concurrent use.
type Metadata interface {
	// PutNode registers a node with a lease of ttl (0: no expiry);
	// ErrExists while a node of that name holds a lease. A node whose
	// lease runs out disappears with its segments.
	PutNode(ctx context.Context, n NodeInfo, ttl time.Duration) error
	// Renew extends a node's lease; ErrNoNode if it already expired.
	Renew(ctx context.Context, node string) error
	// DeleteNode removes a node and its segments.
	DeleteNode(ctx context.Context, node string) error
	// GetNode returns a node (ErrNoNode).
	GetNode(ctx context.Context, node string) (NodeInfo, error)
	// PutSegment registers a segment of a registered node; ErrExists if
	// the name is taken.
	PutSegment(ctx context.Context, s SegmentDesc) error
	// DeleteSegment removes the segment if node holds it.
	DeleteSegment(ctx context.Context, node, name string) error
	// GetSegment returns a segment (ErrNoSegment).
	GetSegment(ctx context.Context, name string) (SegmentDesc, error)
	// Close releases the implementation's resources.
	Close() error
}

// memTable is the embedded metadata table.
type memTable struct {
	now func() time.Time

	// mu guards nodes, segs and count.
	mu    sync.Mutex
	nodes map[string]*nodeEntry
	segs  map[string]SegmentDesc
	count map[string]int // segments per node
}

// MaxSegmentsPerNode bounds the segments one node may hold in the embedded
// table (ErrTableFull beyond).
const MaxSegmentsPerNode = 4096

type nodeEntry struct {
	info    NodeInfo
	ttl     time.Duration
	expires time.Time // zero: never
}

func newMemTable() *memTable {
	return &memTable{now: time.Now, nodes: map[string]*nodeEntry{}, segs: map[string]SegmentDesc{}, count: map[string]int{}}
}

// expireLocked drops nodes whose lease ran out, with their segments.
func (t *memTable) expireLocked() {
	now := t.now()
	for name, e := range t.nodes {
		if !e.expires.IsZero() && now.After(e.expires) {
			t.deleteNodeLocked(name)
		}
	}
}

func (t *memTable) deleteNodeLocked(name string) {
	delete(t.nodes, name)
	for s, d := range t.segs {
		if d.Node == name {
			t.deleteSegLocked(s, d)
		}
	}
}

func (t *memTable) deleteSegLocked(name string, d SegmentDesc) {
	delete(t.segs, name)
	if t.count[d.Node]--; t.count[d.Node] <= 0 {
		delete(t.count, d.Node)
	}
}

// sameNode: b is a's record again (same name, host and endpoints).
func sameNode(a, b NodeInfo) bool {
	return a.Name == b.Name && a.Host == b.Host && slices.Equal(a.Endpoints, b.Endpoints)
}

// sameSegment: b is a's record again.
func sameSegment(a, b SegmentDesc) bool {
	return a.Name == b.Name && a.Node == b.Node && a.Size == b.Size && a.ReadOnly == b.ReadOnly && slices.Equal(a.Regions, b.Regions)
}

func (t *memTable) PutNode(_ context.Context, n NodeInfo, ttl time.Duration) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	if e, ok := t.nodes[n.Name]; ok {
		if sameNode(e.info, n) {
			// The caller's own record (a retry after a lost answer):
			// refresh it.
			e.ttl = ttl
			e.expires = time.Time{}
			if ttl > 0 {
				e.expires = t.now().Add(ttl)
			}
			return nil
		}
		// Live (expireLocked ran): a node restarting under its name waits
		// for its old lease to run out.
		return fmt.Errorf("%w: node %q", ErrExists, n.Name)
	}
	e := &nodeEntry{info: n, ttl: ttl}
	if ttl > 0 {
		e.expires = t.now().Add(ttl)
	}
	t.nodes[n.Name] = e
	return nil
}

func (t *memTable) Renew(_ context.Context, node string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	e, ok := t.nodes[node]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoNode, node)
	}
	if e.ttl > 0 {
		e.expires = t.now().Add(e.ttl)
	}
	return nil
}

func (t *memTable) DeleteNode(_ context.Context, node string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.deleteNodeLocked(node)
	return nil
}

func (t *memTable) GetNode(_ context.Context, node string) (NodeInfo, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	e, ok := t.nodes[node]
	if !ok {
		return NodeInfo{}, fmt.Errorf("%w: %q", ErrNoNode, node)
	}
	return e.info, nil
}

func (t *memTable) PutSegment(_ context.Context, s SegmentDesc) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	if _, ok := t.nodes[s.Node]; !ok {
		return fmt.Errorf("%w: %q (segment %q)", ErrNoNode, s.Node, s.Name)
	}
	if old, ok := t.segs[s.Name]; ok {
		if sameSegment(old, s) {
			return nil // the caller's own record (a retry after a lost answer)
		}
		return fmt.Errorf("%w: segment %q (on node %q)", ErrExists, s.Name, old.Node)
	}
	if t.count[s.Node] >= MaxSegmentsPerNode {
		return fmt.Errorf("%w: node %q holds %d segments", ErrTableFull, s.Node, MaxSegmentsPerNode)
	}
	t.segs[s.Name] = s
	t.count[s.Node]++
	return nil
}

func (t *memTable) DeleteSegment(_ context.Context, node, name string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d, ok := t.segs[name]; ok && d.Node == node {
		t.deleteSegLocked(name, d)
	}
	return nil
}

func (t *memTable) GetSegment(_ context.Context, name string) (SegmentDesc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked()
	d, ok := t.segs[name]
	if !ok {
		return SegmentDesc{}, fmt.Errorf("%w: %q", ErrNoSegment, name)
	}
	return d, nil
}

func (t *memTable) Close() error { return nil }
