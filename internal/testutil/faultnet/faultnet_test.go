package faultnet

// Unit tests of the proxy. Goroutines: the test's; a target listener's
// accept goroutine (target); whatever the proxy runs (goleak checks that
// Close ends all of it).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// target is a loopback listener whose accepted connections the test reads.
type target struct {
	ln    *net.TCPListener
	conns chan *net.TCPConn
	done  chan struct{}
}

func newTarget(t *testing.T) *target {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tg := &target{ln: ln, conns: make(chan *net.TCPConn, 16), done: make(chan struct{})}
	go func() {
		defer close(tg.done)
		for {
			c, err := ln.AcceptTCP()
			if err != nil {
				return
			}
			tg.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-tg.done
		for {
			select {
			case c := <-tg.conns:
				c.Close()
			default:
				return
			}
		}
	})
	return tg
}

func (tg *target) accept(t *testing.T) *net.TCPConn {
	t.Helper()
	select {
	case c := <-tg.conns:
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("target: no connection")
		return nil
	}
}

// newProxy starts a proxy to tg; the test fails (the binary panics, with
// stacks) if it is still running 20 s later.
func newProxy(t *testing.T, tg *target) *Proxy {
	t.Helper()
	name := t.Name()
	hang := time.AfterFunc(20*time.Second, func() { panic(name + ": hang") })
	t.Cleanup(func() { hang.Stop() })
	p, err := New(tg.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) *net.TCPConn {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialReset dials p and returns the error that the dial or the first read
// ends with: the kernel completes the handshake before the proxy resets
// the connection, and the reset may come before connect returns.
func dialReset(t *testing.T, p *Proxy) error {
	t.Helper()
	c, err := net.DialTCP("tcp", nil, p.Addr())
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = readEnd(t, c)
	return err
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// readN reads exactly n bytes within 5 s.
func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading %d bytes: %v", n, err)
	}
	c.SetReadDeadline(time.Time{})
	return b
}

// readEnd reads until the stream ends, within 5 s; it returns the bytes
// and the error that ended it (nil for EOF).
func readEnd(t *testing.T, c net.Conn) ([]byte, error) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("stream did not end (%d bytes read)", len(b))
	}
	return b, err
}

// silent checks that nothing arrives on c for d.
func silent(t *testing.T, c net.Conn, d time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	n, err := c.Read(b[:])
	var ne net.Error
	if n > 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes, %v; want nothing", n, err)
	}
	c.SetReadDeadline(time.Time{})
}

func write(t *testing.T, c net.Conn, b []byte) {
	t.Helper()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

func TestForward(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	c := dial(t, p)
	s := tg.accept(t)
	if err := p.WaitConns(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	up, down := seq(100000), seq(3000)
	go c.Write(up)
	if got := readN(t, s, len(up)); !bytes.Equal(got, up) {
		t.Fatal("up: data differs")
	}
	write(t, s, down)
	if got := readN(t, c, len(down)); !bytes.Equal(got, down) {
		t.Fatal("down: data differs")
	}
	if u, d := p.Forwarded(0, Up), p.Forwarded(0, Down); u != int64(len(up)) || d != int64(len(down)) {
		t.Fatalf("forwarded %d up, %d down", u, d)
	}
	// A half-close passes, and the other direction still works.
	c.CloseWrite()
	if b, err := readEnd(t, s); len(b) != 0 || err != nil {
		t.Fatalf("after half-close: %d bytes, %v", len(b), err)
	}
	write(t, s, []byte("x"))
	readN(t, c, 1)
	s.CloseWrite()
	if b, err := readEnd(t, c); len(b) != 0 || err != nil {
		t.Fatalf("after both half-closes: %d bytes, %v", len(b), err)
	}
	if p.Conns() != 1 {
		t.Fatalf("%d connections", p.Conns())
	}
}

func TestStallResume(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	c := dial(t, p)
	s := tg.accept(t)
	p.Stall(Up)
	write(t, c, []byte("hello"))
	silent(t, s, 50*time.Millisecond)
	// The other direction still flows.
	write(t, s, []byte("down"))
	readN(t, c, 4)
	// Nothing passes a stall, not even the end of the stream.
	c.CloseWrite()
	silent(t, s, 50*time.Millisecond)
	p.Resume(Up)
	if b, err := readEnd(t, s); string(b) != "hello" || err != nil {
		t.Fatalf("after resume: %q, %v", b, err)
	}
}

func TestTruncate(t *testing.T) {
	for _, d := range []Dir{Up, Down} {
		t.Run(d.String(), func(t *testing.T) {
			tg := newTarget(t)
			p := newProxy(t, tg)
			c := dial(t, p)
			s := tg.accept(t)
			src, dst := net.Conn(c), net.Conn(s)
			if d == Down {
				src, dst = s, c
			}
			write(t, src, []byte("0123456789"))
			readN(t, dst, 10)
			p.Truncate(d, 7)
			go src.Write(seq(50000))
			b, _ := readEnd(t, dst)
			if len(b) != 7 || !bytes.Equal(b, seq(7)) {
				t.Fatalf("got %d bytes after truncation to 7", len(b))
			}
			if _, err := readEnd(t, src); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("other end: %v", err)
			}
			if n := p.Forwarded(0, d); n != 17 {
				t.Fatalf("forwarded %d", n)
			}
			if _, err := p.Wait(ctxT(t), func(e Event) bool { return e.Action == Truncated && e.At == 17 }); err != nil {
				t.Fatalf("no truncation event: %v", p.Events())
			}
		})
	}
	// Truncating to 0 closes at once.
	tg := newTarget(t)
	p := newProxy(t, tg)
	c := dial(t, p)
	s := tg.accept(t)
	if err := p.WaitConns(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	p.Truncate(Both, 0)
	if b, _ := readEnd(t, s); len(b) != 0 {
		t.Fatal("data after truncation to 0")
	}
	if b, _ := readEnd(t, c); len(b) != 0 {
		t.Fatal("data after truncation to 0")
	}
}

func TestResetAndDrop(t *testing.T) {
	for _, rst := range []bool{true, false} {
		tg := newTarget(t)
		p := newProxy(t, tg)
		c := dial(t, p)
		s := tg.accept(t)
		write(t, c, []byte("abc"))
		readN(t, s, 3)
		if rst {
			p.Reset()
		} else {
			p.Drop()
		}
		for _, x := range []net.Conn{c, s} {
			_, err := readEnd(t, x)
			if rst != errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("reset %v: read ends with %v", rst, err)
			}
		}
	}
}

func TestDelay(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	c := dial(t, p)
	s := tg.accept(t)
	const d = 40 * time.Millisecond
	p.Delay(Both, d)
	start := time.Now()
	write(t, c, []byte("ping"))
	readN(t, s, 4)
	write(t, s, []byte("pong"))
	readN(t, c, 4)
	if el := time.Since(start); el < 2*d {
		t.Fatalf("round trip %v with %v each way", el, d)
	}
	p.Delay(Both, 0)
	start = time.Now()
	write(t, c, []byte("ping"))
	readN(t, s, 4)
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("no delay, yet %v", el)
	}
}

// Scheduled steps fire at an exact byte, whatever the chunks.
func TestSchedule(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	p.Schedule(Step{Conn: 0, On: Up, After: 1000, Action: Stall, Dir: Up},
		Step{Conn: 1, On: Down, After: 5, Action: Reset})
	c := dial(t, p)
	s := tg.accept(t)
	write(t, c, seq(5000))
	if got := readN(t, s, 1000); !bytes.Equal(got, seq(1000)) {
		t.Fatal("data differs")
	}
	silent(t, s, 50*time.Millisecond)
	p.Resume(Up)
	if got := readN(t, s, 4000); !bytes.Equal(got, seq(5000)[1000:]) {
		t.Fatal("data differs after resume")
	}
	// The second connection is reset after 5 bytes down.
	c2 := dial(t, p)
	s2 := tg.accept(t)
	go s2.Write(seq(100))
	b, err := readEnd(t, c2)
	if !bytes.Equal(b, seq(5)) || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("second connection: %d bytes, %v", len(b), err)
	}
	e, err := p.Wait(ctxT(t), func(e Event) bool { return e.Action == Reset })
	if err != nil || e.Conn != 1 || e.At != 5 || e.Dir != Down {
		t.Fatalf("reset event %v, %v", e, err)
	}
	// The first is untouched.
	write(t, c, []byte("z"))
	readN(t, s, 1)
}

func TestRefuse(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	if err := p.Refuse(RefuseReset); err != nil {
		t.Fatal(err)
	}
	if err := dialReset(t, p); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("refused connection: %v", err)
	}
	if err := p.Refuse(RefuseClosed); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTCP("tcp", nil, p.Addr()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial with the listener closed: %v", err)
	}
	if err := p.Refuse(RefuseNone); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	s := tg.accept(t)
	write(t, c, []byte("ok"))
	readN(t, s, 2)
	if p.Conns() != 1 {
		t.Fatalf("%d connections, want 1 (refused ones do not count)", p.Conns())
	}
}

func TestDialFailed(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	tg.ln.Close()
	if err := dialReset(t, p); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("target down: %v", err)
	}
	if _, err := p.Wait(ctxT(t), func(e Event) bool { return e.Action == DialFailed }); err != nil {
		t.Fatal(err)
	}
}

// Close returns promptly however stuck the connections are, and every
// goroutine is gone (goleak in TestMain).
func TestCloseUnblocks(t *testing.T) {
	tg := newTarget(t)
	p := newProxy(t, tg)
	p.Delay(Down, time.Hour)
	c1 := dial(t, p)
	s1 := tg.accept(t)
	write(t, s1, []byte("x")) // held in a delay
	p.Stall(Up)
	c2 := dial(t, p)
	tg.accept(t)
	write(t, c2, seq(1<<20)) // held by the stall, socket buffers fill
	_ = c1
	if err := p.WaitConns(ctxT(t), 2); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.Close()
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("Close took %v", el)
	}
	p.Close()
	if _, err := p.Wait(context.Background(), func(Event) bool { return false }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Wait after Close: %v", err)
	}
}
