package transfer

// The metadata service over TCP: metaServer serves a memTable to other
// nodes, metaClient is their Metadata. Goroutines: the server runs an
// accept loop and one goroutine per connection, each answering its
// connection's requests in order; Close closes the listener and every
// connection and waits for them. The client has none: calls run on the
// caller's goroutine, one at a time per client (mu), and a context that
// ends expires the connection's deadline.
//
// Wire (frames of internal/frame): the client opens with hello {magic
// "RKTE", version 1, flags (1: secret), nonce [32]}; with a secret the
// server answers challenge {nonce [32], mac [32]} and the client proof
// {mac [32]}, each MAC HMAC-SHA256(secret, label | client nonce | server
// nonce), labels differing by role; then the server sends ok (or reject
// {reason}). After that each request is a frame {op, fields} and each
// answer a frame {code, message str16, fields}. The secret authenticates
// who connects; the messages after it are not MACed (run it on a trusted
// network, as the data path).

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
)

const (
	metaMagic   = 0x524b5445 // "RKTE"
	metaVersion = 1
	metaLimit   = 64 << 10
	// maxMetaConns bounds the service's connections (each a goroutine);
	// an unauthenticated one is dropped after authTimeout.
	maxMetaConns = 1024
	authTimeout  = 10 * time.Second

	fHello     = 1
	fChallenge = 2
	fProof     = 3
	fOK        = 4
	fReject    = 5
	fRequest   = 6
	fAnswer    = 7

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
)

func metaMAC(secret []byte, label string, nc, ns []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("rdmakit transfer v1 " + label))
	m.Write(nc)
	m.Write(ns)
	return m.Sum(nil)
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

// metaServer serves a memTable.
type metaServer struct {
	table    *memTable
	ln       net.Listener
	secret   []byte
	insecure bool
	wg       sync.WaitGroup

	// mu guards conns and closed.
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func startMetaServer(addr string, t *memTable, secret []byte, insecure bool) (*metaServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transfer: metadata service: %w", err)
	}
	s := &metaServer{table: t, ln: ln, secret: secret, insecure: insecure, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

func (s *metaServer) Addr() string { return s.ln.Addr().String() }

func (s *metaServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.conns) >= maxMetaConns {
			// A flood: refuse without a goroutine.
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *metaServer) Close() error {
	s.mu.Lock()
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *metaServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	r := frame.NewReader(bufio.NewReader(c), metaLimit)
	w := frame.NewWriter(c, metaLimit)
	c.SetDeadline(time.Now().Add(authTimeout))
	if !s.authenticate(r, w) {
		return
	}
	c.SetDeadline(time.Time{})
	ctx := context.Background()
	for {
		// A client that says nothing for metaIdle (dead, or done) gives
		// its slot back; a live one redials on its next call.
		c.SetReadDeadline(time.Now().Add(metaIdle))
		typ, p, err := r.Next()
		if err != nil || typ != fRequest {
			return
		}
		ans := s.handle(ctx, p)
		if w.WriteFrame(fAnswer, ans) != nil {
			return
		}
	}
}

// mustRand fills b from crypto/rand; a nonce that is not random would
// let a recorded handshake be replayed, so a failure is fatal.
func mustRand(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("transfer: crypto/rand failed: " + err.Error())
	}
}

// metaIdle is how long the metadata service keeps a connection that sends
// nothing: nodes renew their lease every LeaseTTL/3 (seconds), other
// clients reconnect when they call again.
const metaIdle = 2 * time.Minute

func (s *metaServer) authenticate(r *frame.Reader, w *frame.Writer) bool {
	reject := func(why string) bool {
		w.WriteFrame(fReject, frame.AppendString8(nil, why))
		return false
	}
	typ, p, err := r.Next()
	if err != nil || typ != fHello {
		return false
	}
	d := frame.NewDecoder(p)
	magic, ver, flags, nc := d.Uint32(), d.Uint8(), d.Uint8(), d.Bytes(32)
	if d.Finish() != nil || magic != metaMagic || ver != metaVersion {
		return reject("not an rdmakit transfer hello")
	}
	nc = append([]byte(nil), nc...)
	hasSecret := flags&1 != 0
	if hasSecret != (len(s.secret) > 0) {
		return reject("credentials differ (a secret on one side only)")
	}
	if !hasSecret {
		if !s.insecure {
			return reject("credential required")
		}
		return w.WriteFrame(fOK, nil) == nil
	}
	ns := make([]byte, 32)
	mustRand(ns)
	ch := append(append([]byte(nil), ns...), metaMAC(s.secret, "server", nc, ns)...)
	if w.WriteFrame(fChallenge, ch) != nil {
		return false
	}
	typ, p, err = r.Next()
	if err != nil || typ != fProof || len(p) != 32 {
		return false
	}
	if !hmac.Equal(p, metaMAC(s.secret, "client", nc, ns)) {
		return reject("wrong secret")
	}
	return w.WriteFrame(fOK, nil) == nil
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
type metaClient struct {
	addr   string
	secret []byte          // nil: unauthenticated (New has checked Config.Insecure)
	life   context.Context // ends at Close
	end    context.CancelFunc

	// mu serialises calls and guards conn, r, w, closed.
	mu     sync.Mutex
	conn   net.Conn
	r      *frame.Reader
	w      *frame.Writer
	closed bool
}

func (m *metaClient) dialLocked(ctx context.Context) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", m.addr)
	if err != nil {
		return fmt.Errorf("transfer: metadata service %s: %w", m.addr, err)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := frame.NewReader(bufio.NewReader(c), metaLimit)
	w := frame.NewWriter(c, metaLimit)
	if err := m.handshake(r, w); err != nil {
		c.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("transfer: metadata service %s: %w", m.addr, err)
	}
	c.SetDeadline(time.Time{})
	m.conn, m.r, m.w = c, r, w
	return nil
}

func (m *metaClient) handshake(r *frame.Reader, w *frame.Writer) error {
	nc := make([]byte, 32)
	mustRand(nc)
	flags := byte(0)
	if len(m.secret) > 0 {
		flags = 1
	}
	hello := append(append(frame.AppendUint32(nil, metaMagic), metaVersion, flags), nc...)
	if err := w.WriteFrame(fHello, hello); err != nil {
		return err
	}
	rejected := func(p []byte) error {
		d := frame.NewDecoder(p)
		return fmt.Errorf("%w: refused: %s", ErrAuth, d.String8())
	}
	typ, p, err := r.Next()
	if err != nil {
		return err
	}
	if typ == fReject {
		return rejected(p)
	}
	if len(m.secret) == 0 {
		if typ != fOK {
			return fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
		}
		return nil
	}
	if typ != fChallenge || len(p) != 64 {
		return fmt.Errorf("%w: expected a challenge", ErrProtocol)
	}
	ns := append([]byte(nil), p[:32]...)
	if !hmac.Equal(p[32:], metaMAC(m.secret, "server", nc, ns)) {
		return fmt.Errorf("%w: the metadata service did not prove the secret", ErrAuth)
	}
	if err := w.WriteFrame(fProof, metaMAC(m.secret, "client", nc, ns)); err != nil {
		return err
	}
	typ, p, err = r.Next()
	if err != nil {
		return err
	}
	if typ == fReject {
		return rejected(p)
	}
	if typ != fOK {
		return fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
	}
	return nil
}

// call sends one request and returns the answer's body. A broken
// connection is redialled once.
func (m *metaClient) call(ctx context.Context, req []byte) ([]byte, error) {
	// Close interrupts a call in progress.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.life, cancel)()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	for attempt := 0; ; attempt++ {
		if m.conn == nil {
			if err := m.dialLocked(ctx); err != nil {
				return nil, err
			}
		}
		body, err := m.roundTrip(ctx, req)
		var re remoteErr
		if err == nil || errors.As(err, &re) {
			return body, err
		}
		m.conn.Close()
		m.conn = nil
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if attempt == 1 {
			return nil, fmt.Errorf("transfer: metadata service %s: %w", m.addr, err)
		}
	}
}

func (m *metaClient) roundTrip(ctx context.Context, req []byte) ([]byte, error) {
	c := m.conn
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	defer c.SetDeadline(time.Time{})
	if err := m.w.WriteFrame(fRequest, req); err != nil {
		return nil, err
	}
	typ, p, err := m.r.Next()
	if err != nil {
		return nil, err
	}
	if typ != fAnswer {
		return nil, fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
	}
	d := frame.NewDecoder(p)
	code, msg := d.Uint8(), d.String16()
	if d.Err() != nil {
		return nil, fmt.Errorf("%w: malformed answer", ErrProtocol)
	}
	body := append([]byte(nil), d.Rest()...)
	switch code {
	case codeOK:
		return body, nil
	case codeNoNode:
		return nil, remoteErr{ErrNoNode, msg}
	case codeNoSeg:
		return nil, remoteErr{ErrNoSegment, msg}
	case codeExists:
		return nil, remoteErr{ErrExists, msg}
	}
	return nil, remoteErr{errors.New("metadata service"), msg}
}

// remoteErr is an error the metadata service answered: its message, and
// the matching sentinel. It is not a transport failure (no redial).
type remoteErr struct {
	kind error
	msg  string
}

func (e remoteErr) Error() string { return e.msg }
func (e remoteErr) Unwrap() error { return e.kind }

func newMetaClient(addr string, secret []byte) *metaClient {
	m := &metaClient{addr: addr, secret: secret}
	m.life, m.end = context.WithCancel(context.Background())
	return m
}

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

func (m *metaClient) Close() error {
	m.end()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.conn != nil {
		m.conn.Close()
		m.conn = nil
	}
	return nil
}
