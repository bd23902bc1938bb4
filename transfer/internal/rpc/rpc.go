// Package rpc is the request/answer service of the transfer engine's
// control plane: the metadata table (package transfer) and the KV store's
// master (package transfer/kv) each serve a Handler over it.
//
// Wire (frames of internal/frame, big-endian). The client opens with
// hello {magic u32, version u8, flags u8 (1: secret), nonce [32]}; with a
// secret the server answers challenge {nonce [32], mac [32]} and the client
// proof {mac [32]}, each HMAC-SHA256(secret, label | client nonce | server
// nonce), labels differing by role; then the server sends ok (or reject
// {reason}). After that each request is a frame {body} and each answer a
// frame {body}. With a secret every message after the handshake carries a
// 16-byte tag: HMAC-SHA256(session key, direction | sequence u64 | body)
// truncated, the session key HMAC(secret, "session" | both nonces), the
// sequence counting the messages of each direction from 0: a message
// altered, dropped, replayed or reordered on the connection fails the tag
// and closes the connection. Messages are not encrypted. A server reads
// handshake frames of at most 128 bytes, and holds at most MaxUnauth
// connections that have not authenticated yet (more are refused).
//
// Goroutines: a Server runs an accept loop and one goroutine per
// connection, answering that connection's requests in order; Close closes
// the listener and every connection and waits for them. A Client has none:
// Call runs on the caller's goroutine over a connection of its pool (one
// call per connection at a time; concurrent calls use several).
package rpc

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"net"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
)

// Errors.
var (
	// ErrAuth: the peer did not prove the secret, or refused ours.
	ErrAuth = errors.New("rpc: authentication failed")
	// ErrProtocol: a malformed or unexpected message.
	ErrProtocol = errors.New("rpc: protocol error")
	// ErrIntegrity: a message's tag did not verify.
	ErrIntegrity = errors.New("rpc: message integrity check failed")
	// ErrClosed: the client or server is closed.
	ErrClosed = errors.New("rpc: closed")
)

const (
	fHello     = 1
	fChallenge = 2
	fProof     = 3
	fOK        = 4
	fReject    = 5
	fRequest   = 6
	fAnswer    = 7

	tagLen = 16
	// MaxConns bounds a server's connections (each a goroutine); more are
	// refused at once.
	MaxConns = 1024
	// AuthTimeout drops a connection that has not authenticated.
	AuthTimeout = 10 * time.Second
	// IdleTimeout drops a connection silent that long (its client
	// redials on its next call).
	IdleTimeout = 2 * time.Minute
	// MaxUnauth bounds the connections that have not authenticated yet;
	// more are refused at once, so that connections which never
	// authenticate cannot fill MaxConns.
	MaxUnauth = 64
	// handshakeLimit is the largest handshake frame a server reads (a
	// hello is 38 bytes, a proof 32): a connection that has not
	// authenticated cannot make the server buffer a large frame.
	handshakeLimit = 128
	// maxIdle is how many idle connections a client keeps.
	maxIdle = 16
)

// sendTimeout bounds how long a server waits to write an answer: a
// client that never reads its answers is dropped after it (a variable for
// tests).
var sendTimeout = IdleTimeout

// Proto names a protocol: its magic, version and handshake label.
type Proto struct {
	Magic   uint32
	Version uint8
	Label   string // e.g. "rdmakit transfer v2"
	Limit   int    // the largest message body (frame.DefaultLimit if 0)
}

func (p Proto) limit() int {
	if p.Limit <= 0 {
		return frame.DefaultLimit
	}
	return p.Limit + tagLen
}

func mac(secret []byte, label string, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// mustRand fills b from crypto/rand; a nonce that is not random would let
// a recorded handshake be replayed, so a failure is fatal.
func mustRand(b []byte) {
	if _, err := rand.Read(b); err != nil {
		panic("rpc: crypto/rand failed: " + err.Error())
	}
}

// conn is an authenticated connection: frames with tags and sequences.
type conn struct {
	c          net.Conn
	r          *frame.Reader
	w          *frame.Writer
	h          hash.Hash // nil: no secret
	sendDir    byte
	sendSeq    uint64
	recvSeq    uint64
	buf        []byte
	sum        []byte
	hdr        [9]byte
	lastActive time.Time
}

func (c *conn) tag(dir byte, seq uint64, body []byte) []byte {
	c.h.Reset()
	c.hdr[0] = dir
	binary.BigEndian.PutUint64(c.hdr[1:], seq)
	c.h.Write(c.hdr[:])
	c.h.Write(body)
	c.sum = c.h.Sum(c.sum[:0])
	return c.sum[:tagLen]
}

func (c *conn) send(typ byte, body []byte) error {
	if c.h == nil {
		return c.w.WriteFrame(typ, body)
	}
	c.buf = append(append(c.buf[:0], body...), c.tag(c.sendDir, c.sendSeq, body)...)
	c.sendSeq++
	return c.w.WriteFrame(typ, c.buf)
}

// recv returns the next message's type and body (valid until the next
// recv).
func (c *conn) recv() (byte, []byte, error) {
	typ, p, err := c.r.Next()
	if err != nil || c.h == nil {
		return typ, p, err
	}
	if len(p) < tagLen {
		return 0, nil, ErrIntegrity
	}
	body, t := p[:len(p)-tagLen], p[len(p)-tagLen:]
	if !hmac.Equal(t, c.tag(c.sendDir^1, c.recvSeq, body)) {
		return 0, nil, ErrIntegrity
	}
	c.recvSeq++
	return typ, body, nil
}

func newConn(c net.Conn, p Proto, client bool) *conn {
	x := &conn{c: c, r: frame.NewReader(bufio.NewReader(c), p.limit()), w: frame.NewWriter(c, p.limit())}
	if !client {
		x.sendDir = 1
	}
	return x
}

func (c *conn) keyed(secret []byte, label string, nc, ns []byte) {
	c.h = hmac.New(sha256.New, mac(secret, label+" session", nc, ns))
}

// Handler answers one request body with an answer body. It runs on the
// connection's goroutine; the body is valid only during the call.
type Handler func(ctx context.Context, req []byte) []byte

// Server serves a Handler.
type Server struct {
	proto    Proto
	handle   Handler
	ln       net.Listener
	secret   []byte
	insecure bool
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup

	// mu guards conns, unauth, extra and closed.
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	unauth int            // connections of conns not authenticated yet
	extra  []net.Listener // ServeLocal's
	closed bool
}

// Listen starts a server on addr. With no secret, clients without one are
// accepted only when insecure.
func Listen(addr string, p Proto, secret []byte, insecure bool, h Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return Serve(ln, p, secret, insecure, h), nil
}

// Serve serves on ln (the server closes it).
func Serve(ln net.Listener, p Proto, secret []byte, insecure bool, h Handler) *Server {
	s := &Server{proto: p, handle: h, ln: ln, secret: secret, insecure: insecure, conns: map[net.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// ServeLocal serves on a Unix socket as well, under a random abstract name
// (Linux; this network namespace), and returns the name: clients on this
// host reach the service through it at less cost than through TCP.
func (s *Server) ServeLocal() (string, error) {
	var nonce [12]byte
	mustRand(nonce[:])
	name := fmt.Sprintf("@rdmakit-%x", nonce)
	ln, err := net.Listen("unix", name)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return "", ErrClosed
	}
	s.extra = append(s.extra, ln)
	s.wg.Add(1)
	s.mu.Unlock()
	go s.acceptFrom(ln)
	return name, nil
}

func (s *Server) acceptLoop() { s.acceptFrom(s.ln) }

func (s *Server) acceptFrom(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		if len(s.conns) >= MaxConns || s.unauth >= MaxUnauth {
			// A flood: refuse without a goroutine.
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.unauth++
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	err := s.ln.Close()
	for _, ln := range s.extra {
		ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	return err
}

func (s *Server) serve(nc net.Conn) {
	defer s.wg.Done()
	authed := false
	defer func() {
		s.mu.Lock()
		delete(s.conns, nc)
		if !authed {
			s.unauth--
		}
		s.mu.Unlock()
		nc.Close()
	}()
	c := newConn(nc, s.proto, false)
	c.r.SetLimit(handshakeLimit)
	nc.SetDeadline(time.Now().Add(AuthTimeout))
	if !s.authenticate(c) {
		return
	}
	c.r.SetLimit(s.proto.limit())
	s.mu.Lock()
	s.unauth--
	authed = true
	s.mu.Unlock()
	nc.SetDeadline(time.Time{})
	for {
		nc.SetReadDeadline(time.Now().Add(IdleTimeout))
		typ, p, err := c.recv()
		if err != nil || typ != fRequest {
			return
		}
		ans := s.handle(s.ctx, p)
		nc.SetWriteDeadline(time.Now().Add(sendTimeout))
		if c.send(fAnswer, ans) != nil {
			return
		}
	}
}

func (s *Server) authenticate(c *conn) bool {
	reject := func(why string) bool {
		c.w.WriteFrame(fReject, frame.AppendString8(nil, why))
		return false
	}
	typ, p, err := c.r.Next()
	if err != nil || typ != fHello {
		return false
	}
	d := frame.NewDecoder(p)
	magic, ver, flags, nonce := d.Uint32(), d.Uint8(), d.Uint8(), d.Bytes(32)
	if d.Finish() != nil || magic != s.proto.Magic {
		return reject("not a " + s.proto.Label + " hello")
	}
	if ver != s.proto.Version {
		return reject(fmt.Sprintf("version %d, this service speaks %d", ver, s.proto.Version))
	}
	nc := append([]byte(nil), nonce...)
	hasSecret := flags&1 != 0
	if hasSecret != (len(s.secret) > 0) {
		return reject("credentials differ (a secret on one side only)")
	}
	if !hasSecret {
		if !s.insecure {
			return reject("credential required")
		}
		return c.w.WriteFrame(fOK, nil) == nil
	}
	ns := make([]byte, 32)
	mustRand(ns)
	ch := append(append([]byte(nil), ns...), mac(s.secret, s.proto.Label+" server", nc, ns)...)
	if c.w.WriteFrame(fChallenge, ch) != nil {
		return false
	}
	typ, p, err = c.r.Next()
	if err != nil || typ != fProof || len(p) != 32 {
		return false
	}
	if !hmac.Equal(p, mac(s.secret, s.proto.Label+" client", nc, ns)) {
		return reject("wrong secret")
	}
	c.keyed(s.secret, s.proto.Label, nc, ns)
	return c.w.WriteFrame(fOK, nil) == nil
}

// Client calls a Server.
type Client struct {
	addr   string
	proto  Proto
	secret []byte          // nil: unauthenticated (the caller decided)
	life   context.Context // ends at Close
	end    context.CancelFunc

	// mu guards idle, busy, local and closed.
	mu     sync.Mutex
	idle   []*conn
	busy   map[*conn]struct{} // connections of calls in progress
	local  string             // a Unix socket to try first (SetLocal)
	closed bool
}

// SetLocal makes the client dial the server's Unix socket (ServeLocal's
// name) first, and TCP when that fails (another host or namespace).
func (cl *Client) SetLocal(name string) {
	cl.mu.Lock()
	cl.local = name
	cl.mu.Unlock()
}

// NewClient returns a client of the server at addr; it connects on the
// first call.
func NewClient(addr string, p Proto, secret []byte) *Client {
	c := &Client{addr: addr, proto: p, secret: secret, busy: map[*conn]struct{}{}}
	c.life, c.end = context.WithCancel(context.Background())
	return c
}

// Addr returns the server's address.
func (cl *Client) Addr() string { return cl.addr }

func (cl *Client) dial(ctx context.Context) (*conn, error) {
	var d net.Dialer
	cl.mu.Lock()
	local := cl.local
	cl.mu.Unlock()
	var nc net.Conn
	var err error
	if local != "" {
		if nc, err = d.DialContext(ctx, "unix", local); err != nil {
			cl.SetLocal("") // not this host: TCP from now on
		}
	}
	if nc == nil {
		if nc, err = d.DialContext(ctx, "tcp", cl.addr); err != nil {
			return nil, err
		}
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	nc.SetDeadline(time.Now().Add(AuthTimeout))
	c := newConn(nc, cl.proto, true)
	if err := cl.handshake(c); err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

func (cl *Client) handshake(c *conn) error {
	nc := make([]byte, 32)
	mustRand(nc)
	flags := byte(0)
	if len(cl.secret) > 0 {
		flags = 1
	}
	hello := append(append(frame.AppendUint32(nil, cl.proto.Magic), cl.proto.Version, flags), nc...)
	if err := c.w.WriteFrame(fHello, hello); err != nil {
		return err
	}
	rejected := func(p []byte) error {
		d := frame.NewDecoder(p)
		return fmt.Errorf("%w: refused: %s", ErrAuth, d.String8())
	}
	typ, p, err := c.r.Next()
	if err != nil {
		return err
	}
	if typ == fReject {
		return rejected(p)
	}
	if len(cl.secret) == 0 {
		if typ != fOK {
			return fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
		}
		return nil
	}
	if typ != fChallenge || len(p) != 64 {
		return fmt.Errorf("%w: expected a challenge", ErrProtocol)
	}
	ns := append([]byte(nil), p[:32]...)
	if !hmac.Equal(p[32:], mac(cl.secret, cl.proto.Label+" server", nc, ns)) {
		return fmt.Errorf("%w: the service did not prove the secret", ErrAuth)
	}
	if err := c.w.WriteFrame(fProof, mac(cl.secret, cl.proto.Label+" client", nc, ns)); err != nil {
		return err
	}
	typ, p, err = c.r.Next()
	if err != nil {
		return err
	}
	if typ == fReject {
		return rejected(p)
	}
	if typ != fOK {
		return fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
	}
	c.keyed(cl.secret, cl.proto.Label, nc, ns)
	return nil
}

// Call sends req and returns the answer's body (the caller's to keep). A
// connection that fails before the answer is redialled once and the
// request sent again: handlers must make requests safe to repeat.
func (cl *Client) Call(ctx context.Context, req []byte) ([]byte, error) {
	for attempt := 0; ; attempt++ {
		c, err := cl.get(ctx)
		if err != nil {
			if errors.Is(err, ErrClosed) || ctx.Err() != nil {
				return nil, err
			}
			return nil, fmt.Errorf("rpc: service %s: %w", cl.addr, err)
		}
		body, err := cl.roundTrip(ctx, c, req)
		if err == nil {
			cl.put(c)
			return body, nil
		}
		cl.drop(c)
		if cl.life.Err() != nil {
			return nil, ErrClosed
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if attempt == 1 || errors.Is(err, ErrIntegrity) {
			return nil, fmt.Errorf("rpc: service %s: %w", cl.addr, err)
		}
	}
}

func (cl *Client) get(ctx context.Context) (*conn, error) {
	cl.mu.Lock()
	if cl.closed {
		cl.mu.Unlock()
		return nil, ErrClosed
	}
	for len(cl.idle) > 0 {
		c := cl.idle[len(cl.idle)-1]
		cl.idle = cl.idle[:len(cl.idle)-1]
		if time.Since(c.lastActive) < IdleTimeout/2 {
			cl.busy[c] = struct{}{}
			cl.mu.Unlock()
			return c, nil
		}
		c.c.Close() // the server may drop it any moment
	}
	cl.mu.Unlock()
	c, err := cl.dial(ctx)
	if err != nil {
		return nil, err
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		c.c.Close()
		return nil, ErrClosed
	}
	cl.busy[c] = struct{}{}
	return c, nil
}

// drop closes a connection that failed.
func (cl *Client) drop(c *conn) {
	cl.mu.Lock()
	delete(cl.busy, c)
	cl.mu.Unlock()
	c.c.Close()
}

func (cl *Client) put(c *conn) {
	c.lastActive = time.Now()
	cl.mu.Lock()
	defer cl.mu.Unlock()
	delete(cl.busy, c)
	if cl.closed || len(cl.idle) >= maxIdle {
		c.c.Close()
		return
	}
	cl.idle = append(cl.idle, c)
}

func (cl *Client) roundTrip(ctx context.Context, c *conn, req []byte) ([]byte, error) {
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { c.c.SetDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	// A bound on a call whose context has none (a silent server); the
	// next call on the connection sets it again.
	c.c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := c.send(fRequest, req); err != nil {
		return nil, err
	}
	typ, p, err := c.recv()
	if err != nil {
		return nil, err
	}
	if typ != fAnswer {
		return nil, fmt.Errorf("%w: unexpected frame %d", ErrProtocol, typ)
	}
	return append([]byte(nil), p...), nil
}

// Close closes the client's connections and interrupts calls in progress.
func (cl *Client) Close() error {
	cl.end()
	cl.mu.Lock()
	defer cl.mu.Unlock()
	cl.closed = true
	for _, c := range cl.idle {
		c.c.Close()
	}
	cl.idle = nil
	for c := range cl.busy {
		c.c.Close() // interrupts the call on it
	}
	return nil
}
