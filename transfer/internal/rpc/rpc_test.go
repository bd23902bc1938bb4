package rpc

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/frame"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	secret = []byte("0123456789abcdef0123456789abcdef")
	proto  = Proto{Magic: 0x54455354, Version: 1, Label: "rpc test", Limit: 1 << 16}
)

func echo(_ context.Context, req []byte) []byte { return append([]byte("re:"), req...) }

func TestCall(t *testing.T) {
	s, err := Listen("127.0.0.1:0", proto, secret, false, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	local, err := s.ServeLocal()
	if err != nil {
		t.Fatal(err)
	}
	for _, loc := range []string{"", local, "@nowhere-at-all"} {
		c := NewClient(s.Addr(), proto, secret)
		c.SetLocal(loc)
		for i := 0; i < 3; i++ {
			got, err := c.Call(context.Background(), []byte("x"))
			if err != nil || string(got) != "re:x" {
				t.Fatalf("%q: %q %v", loc, got, err)
			}
		}
		c.Close()
	}
	// Wrong secret, no secret, wrong protocol.
	for _, c := range []*Client{NewClient(s.Addr(), proto, []byte("another secret, 32 bytes long...")), NewClient(s.Addr(), proto, nil),
		NewClient(s.Addr(), Proto{Magic: 1, Version: 1, Label: "x"}, secret)} {
		if _, err := c.Call(context.Background(), []byte("x")); err == nil {
			t.Fatal("accepted")
		}
		c.Close()
	}
	c := NewClient(s.Addr(), proto, secret)
	c.Close()
	if _, err := c.Call(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("closed client: %v", err)
	}
}

// pair returns both ends of an authenticated connection.
func pair(t *testing.T) (cl, sv *conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	s := &Server{proto: proto, secret: secret}
	c := &Client{proto: proto, secret: secret}
	cl, sv = newConn(a, proto, true), newConn(b, proto, false)
	ok := make(chan bool)
	go func() { ok <- s.authenticate(sv) }()
	if err := c.handshake(cl); err != nil {
		t.Fatal(err)
	}
	if !<-ok {
		t.Fatal("server refused")
	}
	return cl, sv
}

// TestIntegrity: a message altered, replayed or unsigned after the
// handshake fails its tag.
func TestIntegrity(t *testing.T) {
	cl, sv := pair(t)
	go cl.send(fRequest, []byte("hello"))
	if _, p, err := sv.recv(); err != nil || string(p) != "hello" {
		t.Fatalf("%q %v", p, err)
	}
	// Altered: a tagged message with a byte flipped.
	cl2, sv2 := pair(t)
	body := []byte("pay 10")
	tagged := append(append([]byte(nil), body...), cl2.tag(0, 0, body)...)
	tagged[4] = '9'
	go cl2.w.WriteFrame(fRequest, tagged)
	if _, _, err := sv2.recv(); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("altered: %v", err)
	}
	// Replayed: the same tagged message twice.
	cl3, sv3 := pair(t)
	msg := append(append([]byte(nil), body...), cl3.tag(0, 0, body)...)
	go func() { cl3.w.WriteFrame(fRequest, msg); cl3.w.WriteFrame(fRequest, msg) }()
	if _, _, err := sv3.recv(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sv3.recv(); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("replayed: %v", err)
	}
	// Unsigned.
	cl4, sv4 := pair(t)
	go cl4.w.WriteFrame(fRequest, make([]byte, 40))
	if _, _, err := sv4.recv(); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("unsigned: %v", err)
	}
}

// TestCloseInterrupts: Close of a client ends a call waiting for its
// answer.
func TestCloseInterrupts(t *testing.T) {
	s, err := Listen("127.0.0.1:0", proto, secret, false, func(ctx context.Context, _ []byte) []byte {
		<-ctx.Done() // answers only when the server closes
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := NewClient(s.Addr(), proto, secret)
	done := make(chan error)
	go func() { _, err := c.Call(context.Background(), []byte("x")); done <- err }()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("call: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not interrupt the call")
	}
}

// rawFrame dials addr and writes a frame of type typ with size zero
// bytes (in the background).
func rawFrame(t *testing.T, addr string, typ byte, size int) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	msg := frame.AppendFrame(nil, typ, make([]byte, size))
	go nc.Write(msg)
	return nc
}

// TestHandshakeLimit: a connection that has not authenticated cannot make
// the server read a large frame; its hello header is refused at once.
func TestHandshakeLimit(t *testing.T) {
	s, err := Listen("127.0.0.1:0", proto, secret, false, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc := rawFrame(t, s.Addr(), fHello, 60000) // under the message limit
	nc.SetDeadline(time.Now().Add(time.Minute))
	typ, p, err := frame.NewReader(nc, 0).Next()
	if err == nil {
		t.Fatalf("the server read a 60000-byte hello and answered frame %d %q", typ, p)
	}
}

// TestUnauthCap: connections that never authenticate hold at most
// MaxUnauth places; past that new connections are refused, and once they
// go a client is served again.
func TestUnauthCap(t *testing.T) {
	s, err := Listen("127.0.0.1:0", proto, secret, false, echo)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var idle []net.Conn
	for range MaxUnauth {
		nc, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, nc)
	}
	c := NewClient(s.Addr(), proto, secret)
	defer c.Close()
	if _, err := c.Call(context.Background(), []byte("x")); err == nil {
		t.Fatalf("served with %d connections not authenticated", MaxUnauth)
	}
	for _, nc := range idle {
		nc.Close()
	}
	for {
		s.mu.Lock()
		n := s.unauth
		s.mu.Unlock()
		if n == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got, err := c.Call(context.Background(), []byte("x")); err != nil || string(got) != "re:x" {
		t.Fatalf("after: %q %v", got, err)
	}
}

// TestSendTimeout: a client that sends requests and never reads the
// answers is dropped once an answer waits sendTimeout to be written.
func TestSendTimeout(t *testing.T) {
	sendTimeout = 100 * time.Millisecond
	defer func() { sendTimeout = IdleTimeout }()
	big := make([]byte, 60000)
	s, err := Listen("127.0.0.1:0", proto, nil, true, func(context.Context, []byte) []byte { return big })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	nc, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hello := append(append(frame.AppendUint32(nil, proto.Magic), proto.Version, 0), make([]byte, 32)...)
	var msg []byte
	msg = frame.AppendFrame(msg, fHello, hello)
	for range 2000 { // 120 MB of answers: more than the socket buffers hold
		msg = frame.AppendFrame(msg, fRequest, nil)
	}
	if _, err := nc.Write(msg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a client that reads no answer still holds its connection after 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
