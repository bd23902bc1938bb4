package transfer

// The metadata service over TCP (transfer/internal/rpc: secret handshake,
// every message tagged): metaServer serves a memTable to other nodes,
// metaClient is their Metadata. Goroutines: those of rpc.Server (an accept
// loop, one per connection); the client has none (calls run on the
// caller's goroutine over a pool of connections).
//
// Requests are {op u8, fields}, answers {code u8, message str16, fields}
// (docs/transfer.md).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/transfer/internal/rpc"
)

// metaProto is the metadata service's protocol.
var metaProto = rpc.Proto{Magic: 0x524b5445 /* "RKTE" */, Version: 2, Label: "rdmakit transfer v2", Limit: 64 << 10}

const (
	opPutNode = 1
	opRenew   = 2
	opDelNode = 3
	opGetNode = 4
	opPutSeg  = 5
	opDelSeg  = 6
	opGetSeg  = 7

	codeOK       = 0
	codeNoNode   = 1
	codeNoSeg    = 2
	codeExists   = 3
	codeInternal = 4
	codeFull     = 5
)

// metaServer serves a memTable.
type metaServer struct {
	*rpc.Server
	table *memTable
}

func startMetaServer(addr string, t *memTable, secret []byte, insecure bool) (*metaServer, error) {
	s := &metaServer{table: t}
	srv, err := rpc.Listen(addr, metaProto, secret, insecure, s.handle)
	if err != nil {
		return nil, fmt.Errorf("transfer: metadata service: %w", err)
	}
	s.Server = srv
	return s, nil
}

func appendNode(b []byte, n NodeInfo) []byte {
	b = frame.AppendString8(b, n.Name)
	b = frame.AppendString16(b, n.Host)
	b = append(b, byte(len(n.Endpoints)))
	for _, e := range n.Endpoints {
		b = frame.AppendString8(b, e.Device)
		b = frame.AppendString8(b, e.Addr)
	}
	return b
}

func decodeNode(d *frame.Decoder) NodeInfo {
	n := NodeInfo{Name: d.String8(), Host: d.String16()}
	k := int(d.Uint8())
	for i := 0; i < k && d.Err() == nil; i++ {
		n.Endpoints = append(n.Endpoints, Endpoint{Device: d.String8(), Addr: d.String8()})
	}
	return n
}

func appendSeg(b []byte, s SegmentDesc) []byte {
	b = frame.AppendString8(b, s.Name)
	b = frame.AppendString8(b, s.Node)
	b = frame.AppendUint64(b, s.Size)
	ro := byte(0)
	if s.ReadOnly {
		ro = 1
	}
	b = append(b, ro, byte(len(s.Regions)))
	for _, r := range s.Regions {
		b = frame.AppendString8(b, r.Device)
		b = frame.AppendUint64(b, r.Addr)
		b = frame.AppendUint32(b, r.RKey)
	}
	return b
}

func decodeSeg(d *frame.Decoder) SegmentDesc {
	s := SegmentDesc{Name: d.String8(), Node: d.String8(), Size: d.Uint64(), ReadOnly: d.Uint8() == 1}
	k := int(d.Uint8())
	for i := 0; i < k && d.Err() == nil; i++ {
		s.Regions = append(s.Regions, Region{Device: d.String8(), Addr: d.Uint64(), RKey: d.Uint32()})
	}
	return s
}

func answer(err error, body []byte) []byte {
	code := byte(codeOK)
	msg := ""
	switch {
	case err == nil:
	case errors.Is(err, ErrNoNode):
		code = codeNoNode
	case errors.Is(err, ErrNoSegment):
		code = codeNoSeg
	case errors.Is(err, ErrExists):
		code = codeExists
	case errors.Is(err, ErrTableFull):
		code = codeFull
	default:
		code = codeInternal
	}
	if err != nil {
		msg = err.Error()
		body = nil
	}
	return append(frame.AppendString16([]byte{code}, msg), body...)
}

func (s *metaServer) handle(ctx context.Context, p []byte) []byte {
	d := frame.NewDecoder(p)
	op := d.Uint8()
	bad := func() []byte { return answer(fmt.Errorf("%w: malformed request", ErrProtocol), nil) }
	t := s.table
	switch op {
	case opPutNode:
		n := decodeNode(&d)
		ttl := time.Duration(d.Uint32()) * time.Millisecond
		if d.Finish() != nil {
			return bad()
		}
		return answer(t.PutNode(ctx, n, ttl), nil)
	case opRenew, opDelNode, opGetNode, opGetSeg:
		name := d.String8()
		if d.Finish() != nil {
			return bad()
		}
		switch op {
		case opRenew:
			return answer(t.Renew(ctx, name), nil)
		case opDelNode:
			return answer(t.DeleteNode(ctx, name), nil)
		case opGetNode:
			n, err := t.GetNode(ctx, name)
			return answer(err, appendNode(nil, n))
		default:
			sd, err := t.GetSegment(ctx, name)
			return answer(err, appendSeg(nil, sd))
		}
	case opPutSeg:
		sd := decodeSeg(&d)
		if d.Finish() != nil {
			return bad()
		}
		return answer(t.PutSegment(ctx, sd), nil)
	case opDelSeg:
		node, name := d.String8(), d.String8()
		if d.Finish() != nil {
			return bad()
		}
		return answer(t.DeleteSegment(ctx, node, name), nil)
	}
	return bad()
}

// metaClient is Metadata served by another node.
type metaClient struct{ c *rpc.Client }

func newMetaClient(addr string, secret []byte) *metaClient {
	return &metaClient{c: rpc.NewClient(addr, metaProto, secret)}
}

// call sends one request and returns the answer's body; the service's
// errors match their sentinels.
func (m *metaClient) call(ctx context.Context, req []byte) ([]byte, error) {
	p, err := m.c.Call(ctx, req)
	if err != nil {
		switch {
		case errors.Is(err, rpc.ErrClosed):
			return nil, ErrClosed
		case errors.Is(err, rpc.ErrAuth):
			return nil, fmt.Errorf("%w: metadata service %s: %w", ErrAuth, m.c.Addr(), err)
		}
		return nil, fmt.Errorf("transfer: metadata service %s: %w", m.c.Addr(), err)
	}
	d := frame.NewDecoder(p)
	code, msg := d.Uint8(), d.String16()
	if d.Err() != nil {
		return nil, fmt.Errorf("%w: malformed answer", ErrProtocol)
	}
	switch code {
	case codeOK:
		return d.Rest(), nil
	case codeNoNode:
		return nil, remoteErr{ErrNoNode, msg}
	case codeNoSeg:
		return nil, remoteErr{ErrNoSegment, msg}
	case codeExists:
		return nil, remoteErr{ErrExists, msg}
	case codeFull:
		return nil, remoteErr{ErrTableFull, msg}
	}
	return nil, remoteErr{errors.New("metadata service"), msg}
}

// remoteErr is an error the metadata service answered: its message, and
// the matching sentinel.
type remoteErr struct {
	kind error
	msg  string
}

func (e remoteErr) Error() string { return e.msg }
func (e remoteErr) Unwrap() error { return e.kind }

func (m *metaClient) PutNode(ctx context.Context, n NodeInfo, ttl time.Duration) error {
	_, err := m.call(ctx, frame.AppendUint32(appendNode([]byte{opPutNode}, n), uint32(ttl/time.Millisecond)))
	return err
}

func (m *metaClient) Renew(ctx context.Context, node string) error {
	_, err := m.call(ctx, frame.AppendString8([]byte{opRenew}, node))
	return err
}

func (m *metaClient) DeleteNode(ctx context.Context, node string) error {
	_, err := m.call(ctx, frame.AppendString8([]byte{opDelNode}, node))
	return err
}

func (m *metaClient) GetNode(ctx context.Context, node string) (NodeInfo, error) {
	b, err := m.call(ctx, frame.AppendString8([]byte{opGetNode}, node))
	if err != nil {
		return NodeInfo{}, err
	}
	d := frame.NewDecoder(b)
	n := decodeNode(&d)
	if d.Finish() != nil {
		return NodeInfo{}, fmt.Errorf("%w: malformed node", ErrProtocol)
	}
	return n, nil
}

func (m *metaClient) PutSegment(ctx context.Context, s SegmentDesc) error {
	_, err := m.call(ctx, appendSeg([]byte{opPutSeg}, s))
	return err
}

func (m *metaClient) DeleteSegment(ctx context.Context, node, name string) error {
	_, err := m.call(ctx, frame.AppendString8(frame.AppendString8([]byte{opDelSeg}, node), name))
	return err
}

func (m *metaClient) GetSegment(ctx context.Context, name string) (SegmentDesc, error) {
	b, err := m.call(ctx, frame.AppendString8([]byte{opGetSeg}, name))
	if err != nil {
		return SegmentDesc{}, err
	}
	d := frame.NewDecoder(b)
	s := decodeSeg(&d)
	if d.Finish() != nil {
		return SegmentDesc{}, fmt.Errorf("%w: malformed segment", ErrProtocol)
	}
	return s, nil
}

func (m *metaClient) Close() error { return m.c.Close() }
