package cm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/verbs"

	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

func TestMain(m *testing.M) {
	reexec.Init()
	goleak.VerifyTestMain(m)
}

// devices returns the cm test devices that are linked in.
func devices(t *testing.T) []string {
	t.Helper()
	all, _ := verbs.Devices()
	var out []string
	for _, want := range []string{"tcp0", "shm0"} {
		for _, d := range all {
			if d.Name == want {
				out = append(out, want)
			}
		}
	}
	if len(out) == 0 {
		t.Skip("no transport linked")
	}
	return out
}

func hasDevice(name string) bool {
	all, _ := verbs.Devices()
	for _, d := range all {
		if d.Name == name {
			return true
		}
	}
	return false
}

func forEachDevice(t *testing.T, f func(t *testing.T, dev string)) {
	for _, dev := range devices(t) {
		t.Run(dev, func(t *testing.T) {
			leakCheck(t)
			f(t, dev)
		})
	}
}

// leakCheck checks, after the test and its cleanups, that the goroutines
// it started are gone.
func leakCheck(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func listen(t *testing.T, opts ListenOptions) *Listener {
	t.Helper()
	l, err := Listen(testCtx(t), "127.0.0.1:0", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// pair dials l and returns both ends.
func pair(t *testing.T, l *Listener, dopts Options) (dialer, acceptor *Conn) {
	t.Helper()
	ctx := testCtx(t)
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := l.Accept(ctx)
		ch <- res{c, err}
	}()
	d, err := Dial(ctx, l.Addr().String(), dopts)
	if err != nil {
		l.Close()
		<-ch
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		d.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { d.Close(); r.c.Close() })
	return d, r.c
}

func waitWC(t *testing.T, cq *verbs.CQ) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	n, err := cq.Wait(ctx, wc)
	if err != nil || n != 1 {
		t.Fatalf("waiting for a completion: n=%d err=%v", n, err)
	}
	return wc[0]
}

func TestConnectSendRecvWrite(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		// The dialer builds its QP in its own PD, so that it can register
		// memory before connecting and advertise it in the private data.
		vctx, err := verbs.Open(dev, verbs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer vctx.Close()
		pd, err := vctx.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		dmr, err := pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		priv := make([]byte, MaxPrivateData)
		for i := range priv {
			priv[i] = byte(i)
		}
		binary.LittleEndian.PutUint64(priv, dmr.Addr())
		binary.LittleEndian.PutUint32(priv[8:], dmr.RKey())

		var gotReq *Request
		l := listen(t, ListenOptions{
			Options: Options{Insecure: true, Device: dev, PrivateData: []byte("hello from listener")},
			Check: func(r *Request) error {
				gotReq = r
				return nil
			},
		})
		d, a := pair(t, l, Options{Insecure: true, PD: pd, PrivateData: priv})

		if gotReq.Transport != vctx.Info().Transport || gotReq.Device != dev || !bytes.Equal(gotReq.PrivateData, priv) ||
			gotReq.QPN != d.QP().Num() || !bytes.Equal(gotReq.Address, d.QP().Address()) {
			t.Errorf("request %+v does not describe the dialer", gotReq)
		}
		if !bytes.Equal(a.RemotePrivateData(), priv) || !bytes.Equal(d.LocalPrivateData(), priv) {
			t.Errorf("acceptor got private data %x", a.RemotePrivateData())
		}
		if string(d.RemotePrivateData()) != "hello from listener" || string(a.LocalPrivateData()) != "hello from listener" {
			t.Errorf("dialer got private data %q", d.RemotePrivateData())
		}
		if d.RemoteAddr().String() != l.Addr().String() || a.RemoteAddr().String() != d.LocalAddr().String() {
			t.Errorf("addresses: dialer remote %v (listener %v), acceptor remote %v (dialer local %v)", d.RemoteAddr(), l.Addr(), a.RemoteAddr(), d.LocalAddr())
		}
		if d.PD() != pd || d.Context() != vctx || a.PD() == nil || a.SendCQ() == nil || a.RecvCQ() == nil {
			t.Error("accessors do not return the connection's objects")
		}
		for _, c := range []*Conn{d, a} {
			if s := c.QP().State(); s != verbs.QPRTS {
				t.Errorf("QP in %s", s)
			}
			if c.Err() != nil {
				t.Errorf("Err = %v on a live connection", c.Err())
			}
		}
		qa, qd := a.QP().Attr(), d.QP().Attr()
		if qa.DestQPN != d.QP().Num() || qd.DestQPN != a.QP().Num() || qa.RQPSN != qd.SQPSN || qd.RQPSN != qa.SQPSN {
			t.Errorf("QPs not cross-connected: acceptor %+v, dialer %+v", qa, qd)
		}
		if qa.AH.GID == nil || !qa.AH.GID.Equal(net.IPv4(127, 0, 0, 1)) {
			t.Errorf("acceptor's GID %v, want the dialer's IP", qa.AH.GID)
		}

		// Send/Recv, dialer → acceptor.
		amr, err := a.PD().AllocMR(4096, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.QP().PostRecv([]verbs.RecvWR{{ID: 7, SGL: []verbs.SGE{amr.SGE(0, 4096)}}}); err != nil {
			t.Fatal(err)
		}
		copy(dmr.Bytes(), "ping")
		if err := d.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{dmr.SGE(0, 4)}}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, d.SendCQ()); wc.Err() != nil || wc.WRID != 1 {
			t.Fatalf("send completion %+v: %v", wc, wc.Err())
		}
		wc := waitWC(t, a.RecvCQ())
		if wc.Err() != nil || wc.WRID != 7 || wc.ByteLen != 4 || string(amr.Bytes()[:4]) != "ping" {
			t.Fatalf("receive completion %+v (%v), data %q", wc, wc.Err(), amr.Bytes()[:4])
		}

		// RDMA Write, acceptor → the region the dialer advertised.
		addr := binary.LittleEndian.Uint64(a.RemotePrivateData())
		rkey := binary.LittleEndian.Uint32(a.RemotePrivateData()[8:])
		msg := "written by the acceptor"
		copy(amr.Bytes()[100:], msg)
		err = a.QP().PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{amr.SGE(100, len(msg))}, RemoteAddr: addr + 1024, RKey: rkey}})
		if err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.SendCQ()); wc.Err() != nil || wc.WRID != 2 {
			t.Fatalf("write completion %+v: %v", wc, wc.Err())
		}
		if got := string(dmr.Bytes()[1024 : 1024+len(msg)]); got != msg {
			t.Fatalf("dialer's region holds %q after the write", got)
		}

		// Close leaves what the dialer passed in alone.
		amr.Dereg()
		if err := d.Close(); err != nil {
			t.Error(err)
		}
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if !errors.Is(d.Err(), ErrClosed) {
			t.Errorf("Err after Close = %v", d.Err())
		}
		if err := dmr.Dereg(); err != nil {
			t.Error(err)
		}
		if err := pd.Close(); err != nil {
			t.Errorf("closing the dialer's own PD after Conn.Close: %v", err)
		}
	})
}

func TestPrivateDataTooLong(t *testing.T) {
	dev := devices(t)[0]
	long := make([]byte, MaxPrivateData+1)
	start := time.Now()
	_, err := Dial(testCtx(t), "127.0.0.1:1", Options{Insecure: true, Device: dev, PrivateData: long})
	if !errors.Is(err, ErrPrivateDataTooLong) || time.Since(start) > time.Second {
		t.Errorf("Dial with %d bytes of private data: %v", len(long), err)
	}
	if _, err := Listen(testCtx(t), "127.0.0.1:0", ListenOptions{Options: Options{Insecure: true, Device: dev, PrivateData: long}}); !errors.Is(err, ErrPrivateDataTooLong) {
		t.Errorf("Listen with %d bytes of private data: %v", len(long), err)
	}
	// A Check that replies with too much rejects the dialer.
	var hsErr error
	var mu sync.Mutex
	l := listen(t, ListenOptions{
		Options: Options{Insecure: true, Device: dev},
		Check: func(r *Request) error {
			r.ReplyPrivateData = long
			return nil
		},
		OnHandshakeError: func(err error) { mu.Lock(); hsErr = err; mu.Unlock() },
	})
	_, err = Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: dev})
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "private data") {
		t.Errorf("Dial to a listener replying with %d bytes: %v", len(long), err)
	}
	l.Close()
	mu.Lock()
	defer mu.Unlock()
	if !errors.Is(hsErr, ErrPrivateDataTooLong) {
		t.Errorf("listener reported %v", hsErr)
	}
}

func TestReject(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		errNotListed := errors.New("not on the guest list")
		hs := make(chan error, 10)
		l := listen(t, ListenOptions{
			Options: Options{Insecure: true, Device: dev},
			Check: func(r *Request) error {
				if string(r.PrivateData) == "long" {
					return errors.New(strings.Repeat("x", 500))
				}
				if string(r.PrivateData) != "password" {
					return fmt.Errorf("%w: %s", errNotListed, r.PrivateData)
				}
				return nil
			},
			OnHandshakeError: func(err error) { hs <- err },
		})
		_, err := Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: dev, PrivateData: []byte("guess")})
		var rej *RejectError
		if !errors.Is(err, ErrRejected) || !errors.As(err, &rej) || rej.Code != RejectApplication ||
			rej.Reason != "not on the guest list: guess" || !strings.Contains(err.Error(), "not on the guest list") {
			t.Fatalf("rejected Dial returned %v", err)
		}
		if errors.Is(err, ErrTransportMismatch) {
			t.Error("an application reject matches ErrTransportMismatch")
		}
		if got := <-hs; !errors.Is(got, errNotListed) || !errors.Is(got, ErrRejected) {
			t.Errorf("listener reported %v", got)
		}
		_, err = Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: dev, PrivateData: []byte("long")})
		if !errors.As(err, &rej) || rej.Reason != strings.Repeat("x", MaxRejectReason) {
			t.Errorf("long reason arrived as %v", err)
		}
		<-hs
		// The listener still accepts after rejecting.
		d, a := pair(t, l, Options{Insecure: true, Device: dev, PrivateData: []byte("password")})
		d.Close()
		a.Close()
	})
}

func TestTransportMismatch(t *testing.T) {
	if !hasDevice("tcp0") || !hasDevice("shm0") {
		t.Skip("needs tcp0 and shm0")
	}
	leakCheck(t)
	hs := make(chan error, 1)
	l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: "tcp0"}, OnHandshakeError: func(err error) { hs <- err }})
	_, err := Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: "shm0"})
	if !errors.Is(err, ErrRejected) || !errors.Is(err, ErrTransportMismatch) || !strings.Contains(err.Error(), `"shm"`) {
		t.Errorf("dialer: %v", err)
	}
	var he *HandshakeError
	if got := <-hs; !errors.Is(got, ErrTransportMismatch) || !errors.As(got, &he) || he.Request == nil || he.Request.Device != "shm0" {
		t.Errorf("listener: %v", got)
	}
	l.Close()
}

func TestDialNothingListening(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	start := time.Now()
	_, err = Dial(testCtx(t), addr, Options{Insecure: true, Device: dev})
	if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), addr) {
		t.Errorf("Dial with nothing listening: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Dial took %v to fail", d)
	}
	if _, err := Dial(testCtx(t), addr, Options{Insecure: true, Device: "nosuch0"}); err == nil {
		t.Error("Dial with an unknown device succeeded")
	}
	if _, err := Listen(testCtx(t), "127.0.0.1:0", ListenOptions{Options: Options{Insecure: true, Device: "nosuch0"}}); !errors.Is(err, verbs.ErrNoDevice) {
		t.Errorf("Listen on an unknown device: %v", err)
	}
}

func TestAcceptCancel(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev}})

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Accept with an expiring ctx: %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if _, err := l.Accept(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Accept with a cancelled ctx: %v", err)
	}
	time.AfterFunc(50*time.Millisecond, func() { l.Close() })
	if _, err := l.Accept(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("Accept on a closed listener: %v", err)
	}
}

func TestDialCancel(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)

	// A listener whose Check blocks: Dial waits for the reply until its
	// ctx ends.
	release := make(chan struct{})
	hs := make(chan error, 1)
	l := listen(t, ListenOptions{
		Options:          Options{Insecure: true, Device: dev},
		Check:            func(*Request) error { <-release; return nil },
		OnHandshakeError: func(err error) { hs <- err },
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Dial(ctx, l.Addr().String(), Options{Insecure: true, Device: dev})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 2*time.Second {
		t.Errorf("cancelled Dial: %v after %v", err, time.Since(start))
	}
	close(release)
	if err := <-hs; err == nil {
		t.Error("listener did not notice the dialer left")
	}

	// A TCP server that never answers, and HandshakeTimeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	start = time.Now()
	_, err = Dial(context.Background(), ln.Addr().String(), Options{Insecure: true, Device: dev, HandshakeTimeout: 100 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "handshake timeout") || time.Since(start) > 2*time.Second {
		t.Errorf("Dial to a silent server: %v after %v", err, time.Since(start))
	}
	ln.Close()
	wg.Wait()
}

// outstanding posts receives on c and a send the peer cannot take (it has
// no receive posted, and RNRRetry 7 retries forever), so that all of them
// are outstanding when the peer goes.
func outstanding(t *testing.T, c *Conn) *verbs.MR {
	t.Helper()
	mr, err := c.PD().AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	err = c.QP().PostRecv([]verbs.RecvWR{{ID: 100, SGL: []verbs.SGE{mr.SGE(0, 1024)}}, {ID: 101, SGL: []verbs.SGE{mr.SGE(1024, 1024)}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QP().PostSend([]verbs.SendWR{{ID: 200, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(2048, 16)}}}); err != nil {
		t.Fatal(err)
	}
	return mr
}

// checkFlushed waits for the completions of outstanding's work requests
// and checks that all failed.
func checkFlushed(t *testing.T, c *Conn) {
	t.Helper()
	for _, want := range []uint64{100, 101} {
		wc := waitWC(t, c.RecvCQ())
		if wc.WRID != want || wc.Status != verbs.StatusWRFlush {
			t.Errorf("receive completion %+v, want wr %d flushed", wc, want)
		}
	}
	wc := waitWC(t, c.SendCQ())
	if wc.WRID != 200 || wc.Status == verbs.StatusSuccess {
		t.Errorf("send completion %+v, want wr 200 failed", wc)
	}
}

func waitDone(t *testing.T, c *Conn, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	select {
	case <-c.Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("Done did not fire within %v", within)
		return 0
	}
}

func TestPeerLostAbrupt(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev, PeerTimeout: 2 * time.Second}})
		d, a := pair(t, l, Options{Insecure: true, Device: dev, PeerTimeout: 2 * time.Second})
		outstanding(t, d)
		// Reset the acceptor's control connection behind cm's back.
		a.ctl.(*net.TCPConn).SetLinger(0)
		a.ctl.Close()
		waitDone(t, d, time.Second)
		if err := d.Err(); !errors.Is(err, ErrPeerLost) {
			t.Errorf("Err = %v, want ErrPeerLost", err)
		}
		if s := d.QP().State(); s != verbs.QPError {
			t.Errorf("QP in %s after peer loss", s)
		}
		checkFlushed(t, d)
		waitDone(t, a, time.Second)
	})
}

func TestPeerLostHeartbeat(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		const pt = 400 * time.Millisecond
		l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev, PeerTimeout: pt}})
		d, a := pair(t, l, Options{Insecure: true, Device: dev, PeerTimeout: pt})
		outstanding(t, d)
		time.Sleep(2 * pt) // heartbeats keep it up
		if d.Err() != nil || a.Err() != nil {
			t.Fatalf("connection ended with heartbeats flowing: %v, %v", d.Err(), a.Err())
		}
		a.pauseHeartbeats.Store(true) // the acceptor hangs
		took := waitDone(t, d, pt+500*time.Millisecond)
		if err := d.Err(); !errors.Is(err, ErrPeerLost) || !strings.Contains(err.Error(), "no message") {
			t.Errorf("Err = %v after %v", err, took)
		}
		checkFlushed(t, d)
	})
}

func TestCloseAndDisconnect(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev}})
		d, a := pair(t, l, Options{Insecure: true, Device: dev})
		outstanding(t, a)
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		waitDone(t, a, time.Second)
		if !errors.Is(a.Err(), ErrPeerClosed) {
			t.Errorf("peer sees %v after Close", a.Err())
		}
		checkFlushed(t, a)
		if err := d.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}

		// Disconnect keeps the objects so flushes can be polled.
		d, a = pair(t, l, Options{Insecure: true, Device: dev})
		outstanding(t, d)
		if err := d.Disconnect(); err != nil {
			t.Fatal(err)
		}
		checkFlushed(t, d)
		waitDone(t, a, time.Second)
		if !errors.Is(a.Err(), ErrPeerClosed) || !errors.Is(d.Err(), ErrClosed) {
			t.Errorf("after Disconnect: dialer %v, acceptor %v", d.Err(), a.Err())
		}
		if err := a.Disconnect(); !errors.Is(err, ErrPeerClosed) {
			t.Errorf("Disconnect after the peer left: %v", err)
		}
		d.Close()
		a.Close()
	})
}

func TestListenerCloseDropsQueued(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	l, err := Listen(testCtx(t), "127.0.0.1:0", ListenOptions{Options: Options{Insecure: true, Device: dev}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	l.Close()
	waitDone(t, d, time.Second)
	if !errors.Is(d.Err(), ErrPeerClosed) {
		t.Errorf("dialer of a never-accepted connection sees %v", d.Err())
	}
}

func TestGarbage(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	hs := make(chan error, 10)
	l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev}, OnHandshakeError: func(err error) { hs <- err }})
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.0\r\n\r\n"),
		{0, 0, 0, 4, msgRequest, 1, 2, 3, 4},
		{0, 0, 0, 0, msgReady},
	} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write(junk)
		m, err := readMsg(bufio.NewReader(c))
		c.Close()
		if err != nil || m.typ != msgReject || m.code != RejectProtocol {
			t.Errorf("reply to %q: %+v, %v", junk, m, err)
		}
		if err := <-hs; !errors.Is(err, ErrProtocol) {
			t.Errorf("listener reported %v", err)
		}
	}
	d, a := pair(t, l, Options{Insecure: true, Device: dev})
	d.Close()
	a.Close()
}

// The helper process listens, accepts one connection and waits to be killed.

// The helper process (role "cm-listener"): a listener on the device
// args[0] that prints its address and accepts one connection, then waits
// to be killed.
func init() { reexec.Register("cm-listener", helperProcess) }

func helperProcess(args []string) int {
	dev := args[0]
	l, err := Listen(context.Background(), "127.0.0.1:0", ListenOptions{Options: Options{Insecure: true, Device: dev, PeerTimeout: 10 * time.Second}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println(l.Addr())
	c, err := l.Accept(context.Background())
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("accepted", c.QP().Num())
	select {}
}

func TestPeerProcessKilled(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		cmd := reexec.Command("cm-listener", []string{dev})
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Wait()
		defer cmd.Process.Kill()
		lines := bufio.NewScanner(out)
		if !lines.Scan() {
			t.Fatal("helper printed nothing")
		}
		addr := lines.Text()
		const pt = 3 * time.Second
		d, err := Dial(testCtx(t), addr, Options{Insecure: true, Device: dev, PeerTimeout: pt})
		if err != nil {
			t.Fatalf("dial %q: %v", addr, err)
		}
		defer d.Close()
		if !lines.Scan() || !strings.HasPrefix(lines.Text(), "accepted") {
			t.Fatalf("helper: %q", lines.Text())
		}
		outstanding(t, d)
		cmd.Process.Kill()
		waitDone(t, d, pt)
		if err := d.Err(); !errors.Is(err, ErrPeerLost) {
			t.Errorf("Err = %v", err)
		}
		checkFlushed(t, d)
	})
}

func TestSharedResources(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		vctx, err := verbs.Open(dev, verbs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer vctx.Close()
		pd, _ := vctx.AllocPD()
		scq, _ := vctx.CreateCQ(64)
		rcq, _ := vctx.CreateCQ(64)
		l := listen(t, ListenOptions{Options: Options{Insecure: true, PD: pd, SendCQ: scq, RecvCQ: rcq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8}}})
		d1, a1 := pair(t, l, Options{Insecure: true, Device: dev})
		d2, a2 := pair(t, l, Options{Insecure: true, Device: dev})
		if a1.PD() != pd || a2.PD() != pd || a1.RecvCQ() != rcq || a2.SendCQ() != scq || a1.Context() != vctx {
			t.Fatal("accepted connections do not use the listener's PD and CQs")
		}
		if d1.PD() == d2.PD() || d1.RecvCQ() == d2.RecvCQ() {
			t.Fatal("dialers without a PD share objects")
		}
		// Both acceptors receive into the shared CQ.
		mr, _ := pd.AllocMR(4096, verbs.AccessLocalWrite)
		for i, a := range []*Conn{a1, a2} {
			a.QP().PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{mr.SGE(i*64, 64)}}})
		}
		for _, d := range []*Conn{d1, d2} {
			smr, _ := d.PD().AllocMR(64, 0)
			d.QP().PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{smr.SGE(0, 8)}}})
		}
		qpns := map[uint32]bool{}
		for range 2 {
			wc := waitWC(t, rcq)
			if wc.Err() != nil {
				t.Fatal(wc.Err())
			}
			qpns[wc.QPNum] = true
		}
		if !qpns[a1.QP().Num()] || !qpns[a2.QP().Num()] {
			t.Errorf("completions from QPs %v", qpns)
		}
		for _, c := range []*Conn{d1, a1, d2, a2} {
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
		mr.Dereg()
		if err := scq.Close(); err != nil {
			t.Error(err)
		}
		if err := rcq.Close(); err != nil {
			t.Error(err)
		}
		if err := pd.Close(); err != nil {
			t.Error(err)
		}
	})
}

func TestListenerCloseDuringHandshake(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	entered := make(chan struct{})
	release := make(chan struct{})
	l, err := Listen(testCtx(t), "127.0.0.1:0", ListenOptions{
		Options: Options{Insecure: true, Device: dev},
		Check:   func(*Request) error { close(entered); <-release; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	dialed := make(chan error, 1)
	go func() {
		_, err := Dial(testCtx(t), l.Addr().String(), Options{Insecure: true, Device: dev})
		dialed <- err
	}()
	<-entered
	closed := make(chan struct{})
	go func() { l.Close(); close(closed) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	<-closed
	err = <-dialed
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Code != RejectBusy || rej.Reason != ErrListenerClosed.Error() {
		t.Errorf("Dial cut short by Listener.Close: %v", err)
	}
}

// A dialer that claims a 256 MiB request is rejected at once, with the
// reason, and the listener allocates nothing for it.
func TestListenerRefusesHugeFrame(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	hs := make(chan error, 1)
	l := listen(t, ListenOptions{Options: Options{Insecure: true, Device: dev}, OnHandshakeError: func(err error) { hs <- err }})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := ms.TotalAlloc
	if _, err := c.Write([]byte{0x10, 0, 0, 0, msgRequest}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply, err := io.ReadAll(c)
	runtime.ReadMemStats(&ms)
	grew := ms.TotalAlloc - before
	if err != nil {
		t.Errorf("the listener kept the connection open: %v", err)
	}
	const want = "268435456-byte frame exceeds the 2048-byte limit"
	if !bytes.Contains(reply, []byte(want)) {
		t.Errorf("reject %q does not say why", reply)
	}
	if err := <-hs; !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), want) {
		t.Errorf("listener reported %v", err)
	}
	if grew > 16<<20 {
		t.Errorf("the listener allocated %d bytes because a dialer claimed a 256 MiB frame", grew)
	}
}
