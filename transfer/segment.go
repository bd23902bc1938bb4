package transfer

// Segments: named memory published in the metadata table. Everything
// here runs on the caller's goroutine.

import (
	"context"
	"fmt"
	"os"

	"github.com/rdmakit/rdmakit/verbs"
)

// Access says what peers may do to a segment.
type Access uint8

const (
	ReadWrite Access = iota // peers read and write
	ReadOnly                // peers read; Writes are refused
)

func (a Access) String() string {
	if a == ReadOnly {
		return "read-only"
	}
	return "read-write"
}

// SegmentInfo is what OpenSegment tells about a segment.
type SegmentInfo struct {
	Name    string
	Node    string // the node holding it
	Size    uint64
	Access  Access
	Devices []string // the devices that reach it
}

// segment is a segment this node holds.
type segment struct {
	desc  SegmentDesc
	mr    *verbs.MR   // the memory (nil for a mapped file)
	regs  []*verbs.MR // registrations made for it, deregistered with it
	owned bool        // mr allocated for it (AllocSegment, file copy)
	file  *fileBacking
}

// fileBacking is a file segment's file.
type fileBacking struct {
	mapped   []byte // the file mapped shared (nil: copied into mr)
	f        *os.File
	copyBack []byte // the copy to write back (read-write, copied)
	leased   bool   // a lease guards the mapping (lease_linux.go)
}

func (s *segment) release() {
	for _, r := range s.regs {
		r.Dereg()
	}
	if fb := s.file; fb != nil {
		if fb.copyBack != nil {
			fb.f.WriteAt(fb.copyBack, 0)
		}
		if fb.mapped != nil {
			unmapFile(fb.mapped)
		}
		if fb.leased {
			unleaseFile(fb.f) // lets a truncating open proceed
		}
		fb.f.Close()
	}
	if s.owned && s.mr != nil {
		s.mr.Dereg()
	}
}

func (n *Node) validName(name string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("transfer: segment name must be 1 to 255 bytes")
	}
	return nil
}

// publish records the segment locally and in the metadata table; a name
// taken (here or on another node) is refused with ErrExists.
func (n *Node) publish(ctx context.Context, s *segment) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return ErrClosed
	}
	if _, dup := n.segs[s.desc.Name]; dup {
		n.mu.Unlock()
		return fmt.Errorf("%w: segment %q (on this node)", ErrExists, s.desc.Name)
	}
	n.segs[s.desc.Name] = s
	n.mu.Unlock()
	if err := n.meta.PutSegment(ctx, s.desc); err != nil {
		n.mu.Lock()
		delete(n.segs, s.desc.Name)
		n.mu.Unlock()
		return err
	}
	return nil
}

// RegisterSegment publishes mr as segment name, readable and writable by
// peers. mr should come from AllocMR (then every device reaches it); a
// caller's region is registered with the devices that can register caller
// memory (tcp0, not shm0). The caller keeps ownership of mr: unregister
// the segment before freeing it.
func (n *Node) RegisterSegment(ctx context.Context, name string, mr *verbs.MR) error {
	if err := n.validName(name); err != nil {
		return err
	}
	desc := SegmentDesc{Name: name, Node: n.cfg.Name, Size: uint64(mr.Len())}
	for _, d := range n.devs {
		x, err := n.regionFor(mr, d)
		if err != nil {
			continue
		}
		desc.Regions = append(desc.Regions, Region{Device: d.name, Addr: x.Addr(), RKey: x.RKey()})
	}
	if len(desc.Regions) == 0 {
		return fmt.Errorf("%w: no device of this node can serve the region", ErrNoDevice)
	}
	return n.publish(ctx, &segment{desc: desc, mr: mr})
}

// AllocSegment allocates size bytes (AllocMR) and publishes them as
// segment name. The memory is freed with the segment.
func (n *Node) AllocSegment(ctx context.Context, name string, size int) (*verbs.MR, error) {
	if err := n.validName(name); err != nil {
		return nil, err
	}
	mr, err := n.AllocMR(size)
	if err != nil {
		return nil, err
	}
	if err := n.RegisterSegment(ctx, name, mr); err != nil {
		n.FreeMR(mr)
		return nil, err
	}
	n.mu.Lock()
	if s := n.segs[name]; s != nil {
		s.owned = true
		m := n.mem[mr]
		delete(n.mem, mr)
		if m != nil {
			s.regs = m.extra
		}
	}
	n.mu.Unlock()
	return mr, nil
}

// RegisterFileSegment publishes the file at path as segment name, so
// that peers read (and, unless readOnly, write) it with one-sided
// operations served from this node's memory.
//
// Devices that register caller memory (tcp0, RDMA NICs) serve the file
// mapped shared: reads come from the page cache, writes go to it. A
// device that cannot (shm0, whose peers map the node's arena) serves a
// copy of the file in the node's arena, taken now (the arena is a memfd
// its peers map; caller memory cannot be registered there). A read-only
// file segment is offered both ways. A read-write one is offered through
// the mapping only when some device maps it (a copy beside it would not be
// coherent); on a node with shm0 alone it is the copy, written back to the
// file when the segment is unregistered or the node closes.
func (n *Node) RegisterFileSegment(ctx context.Context, name, path string, readOnly bool) (err error) {
	if err := n.validName(name); err != nil {
		return err
	}
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return fmt.Errorf("transfer: file segment: %w", err)
	}
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		f.Close()
		return fmt.Errorf("transfer: file segment %s: empty or unreadable (%v)", path, err)
	}
	size := int(st.Size())
	s := &segment{desc: SegmentDesc{Name: name, Node: n.cfg.Name, Size: uint64(size), ReadOnly: readOnly}, file: &fileBacking{f: f}}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	acc := verbs.AccessRemoteRead
	if !readOnly {
		acc |= verbs.AccessLocalWrite | verbs.AccessRemoteWrite
	}
	// A mapping is served only under a lease (where leases exist): a
	// file shrunk under it would raise SIGBUS in the serving goroutine.
	mapOK := canMap
	for _, d := range n.devs {
		if !mapOK || !d.canReg {
			continue
		}
		if canLease {
			if err := leaseFile(f, !readOnly); err != nil {
				if !readOnly {
					return fmt.Errorf("transfer: file segment %s: cannot lease the file against truncation (open elsewhere?): %w", path, err)
				}
				mapOK = false // a read-only file is served as a copy
				break
			}
			s.file.leased = true
			if st, err := f.Stat(); err != nil || st.Size() < int64(size) {
				return fmt.Errorf("transfer: file segment %s: shrank while being registered", path)
			}
			n.watchLeases()
		}
		break
	}
	mapAny := false
	for _, d := range n.devs {
		mapAny = mapAny || (d.canReg && mapOK)
	}
	for _, d := range n.devs {
		var x *verbs.MR
		switch {
		case d.canReg && mapOK:
			if s.file.mapped == nil {
				m, err := mapFile(f, size, !readOnly)
				if err != nil {
					return fmt.Errorf("transfer: mapping %s: %w", path, err)
				}
				s.file.mapped = m
			}
			if x, err = d.pd.RegMR(s.file.mapped, acc); err != nil {
				return fmt.Errorf("transfer: registering %s with %s: %w", path, d.name, err)
			}
			s.regs = append(s.regs, x)
		case mapAny && !readOnly:
			// A copy beside the mapping would not be coherent with it:
			// peers reach a read-write file through the mapping only.
			continue
		case s.mr != nil:
			// The copy lives in another device's arena.
			if !d.canReg {
				continue
			}
			if x, err = d.pd.RegMR(s.mr.Bytes(), acc); err != nil {
				return fmt.Errorf("transfer: registering %s's copy with %s: %w", path, d.name, err)
			}
			s.regs = append(s.regs, x)
		default:
			if s.mr, err = d.pd.AllocMR(size, acc|verbs.AccessLocalWrite); err != nil {
				return fmt.Errorf("transfer: file segment copy: %w", err)
			}
			s.owned = true
			if _, err := f.ReadAt(s.mr.Bytes(), 0); err != nil {
				return fmt.Errorf("transfer: reading %s: %w", path, err)
			}
			if !readOnly {
				s.file.copyBack = s.mr.Bytes()
			}
			x = s.mr
		}
		s.desc.Regions = append(s.desc.Regions, Region{Device: d.name, Addr: x.Addr(), RKey: x.RKey()})
	}
	if len(s.desc.Regions) == 0 {
		return fmt.Errorf("%w: no device of this node can serve file %s", ErrNoDevice, path)
	}
	return n.publish(ctx, s)
}

// UnregisterSegment removes a segment of this node from the table and
// releases what the node made for it (its registrations; AllocSegment's
// memory; a file segment's mapping, after writing a copy back). Requests
// in flight to it fail.
func (n *Node) UnregisterSegment(ctx context.Context, name string) error {
	n.mu.Lock()
	s, ok := n.segs[name]
	delete(n.segs, name)
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q (not held by this node)", ErrNoSegment, name)
	}
	err := n.meta.DeleteSegment(ctx, n.cfg.Name, name)
	s.release()
	return err
}

// OpenSegment looks a segment up in the metadata table.
func (n *Node) OpenSegment(ctx context.Context, name string) (SegmentInfo, error) {
	d, err := n.lookup(ctx, name, true)
	if err != nil {
		return SegmentInfo{}, err
	}
	info := SegmentInfo{Name: d.Name, Node: d.Node, Size: d.Size}
	if d.ReadOnly {
		info.Access = ReadOnly
	}
	for _, r := range d.Regions {
		info.Devices = append(info.Devices, r.Device)
	}
	return info, nil
}

// lookup returns a segment's description, from the cache unless fresh.
func (n *Node) lookup(ctx context.Context, name string, fresh bool) (SegmentDesc, error) {
	if !fresh {
		n.mu.Lock()
		d, ok := n.segCache[name]
		n.mu.Unlock()
		if ok {
			return d, nil
		}
	}
	d, err := n.meta.GetSegment(ctx, name)
	n.mu.Lock()
	if err != nil {
		delete(n.segCache, name)
	} else {
		n.segCache[name] = d
	}
	n.mu.Unlock()
	return d, err
}

// forget drops cached descriptions of segments on node (after a failure).
func (n *Node) forget(node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for k, d := range n.segCache {
		if d.Node == node {
			delete(n.segCache, k)
		}
	}
	delete(n.nodeInfo, node)
}
