package cm

// Goroutines. An established Conn runs two goroutines until it ends:
//
//   - reader: reads control messages from the peer with a read deadline of
//     PeerTimeout, renewed by every message (heartbeats included); EOF, a
//     reset, a missed deadline or a disconnect message ends the Conn
//     (shutdown with ErrPeerLost or ErrPeerClosed).
//   - heartbeat: writes a heartbeat every interval (a quarter of the smaller
//     PeerTimeout of the two sides) until the Conn ends.
//
// Application goroutines call the accessors, Done, Err, Disconnect and
// Close in any number. shutdown runs at most once per Conn (whoever sets err
// first): it moves the QP to ERROR, which flushes outstanding work
// requests, ends the control connection (at once, or after a short drain
// when this side disconnects, see shutdown), which stops both goroutines,
// and closes done. Close additionally waits for both goroutines and then
// destroys the verbs objects cm created. The reader closes the control
// connection when it exits.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/verbs"
)

// Conn is a connected queue pair and the control connection that watches
// its peer.
type Conn struct {
	res         *resources
	localPriv   []byte
	remotePriv  []byte
	peerTimeout time.Duration // how long the peer may stay silent
	interval    time.Duration // how often this side sends heartbeats

	done chan struct{}
	wg   sync.WaitGroup

	// pauseHeartbeats stops heartbeats without closing anything (tests).
	pauseHeartbeats atomic.Bool

	// wmu serialises writes to ctl once the handshake is over (heartbeats
	// and the disconnect); the reader alone reads it.
	wmu sync.Mutex
	ctl net.Conn
	fr  *frame.Reader // ctl's frames, for the reader goroutine

	// sdMu is held for the whole of shutdown, so that Close cannot destroy
	// the QP while another goroutine is moving it to ERROR.
	sdMu sync.Mutex

	// mu guards err and closed (and orders the reader's deadline renewal
	// before or after err is set).
	mu     sync.Mutex
	err    error
	closed bool // Close has run (resources destroyed or being destroyed)
}

func newConn(res *resources, ctl net.Conn, o *Options, peer *msg) *Conn {
	pt := o.peerTimeout()
	peerPT := time.Duration(peer.peerTimeoutMs) * time.Millisecond
	iv := min(pt, peerPT) / 4
	if iv < time.Millisecond/4 {
		iv = time.Millisecond / 4
	}
	return &Conn{
		res:         res,
		ctl:         ctl,
		fr:          frame.NewReader(ctl, maxFrame),
		localPriv:   append([]byte(nil), o.PrivateData...),
		remotePriv:  peer.priv,
		peerTimeout: pt,
		interval:    iv,
		done:        make(chan struct{}),
	}
}

// start launches the reader and heartbeat goroutines.
func (c *Conn) start() {
	c.wg.Add(2)
	go c.reader()
	go c.heartbeat()
}

func (c *Conn) reader() {
	defer c.wg.Done()
	defer c.ctl.Close()
	for {
		c.mu.Lock()
		ending := c.err != nil
		if !ending {
			c.ctl.SetReadDeadline(time.Now().Add(c.peerTimeout))
		}
		c.mu.Unlock()
		m, err := nextMsg(c.fr)
		if err != nil {
			if c.Err() != nil {
				return // drained after this side's disconnect, or already ended
			}
			if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
				c.shutdown(fmt.Errorf("%w: no message from %v for %v", ErrPeerLost, c.ctl.RemoteAddr(), c.peerTimeout), false)
			} else {
				c.shutdown(fmt.Errorf("%w: control connection to %v: %v", ErrPeerLost, c.ctl.RemoteAddr(), err), false)
			}
			return
		}
		if ending {
			continue // draining until the peer closes
		}
		switch m.typ {
		case msgHeartbeat:
		case msgDisconnect:
			c.shutdown(fmt.Errorf("%w (%v)", ErrPeerClosed, c.ctl.RemoteAddr()), false)
			return
		default:
			c.shutdown(fmt.Errorf("%w: %w: unexpected message type %d on the control connection", ErrPeerLost, ErrProtocol, m.typ), false)
			return
		}
	}
}

func (c *Conn) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		if c.pauseHeartbeats.Load() {
			continue
		}
		c.wmu.Lock()
		c.ctl.SetWriteDeadline(time.Now().Add(c.peerTimeout))
		err := writeMsg(c.ctl, &msg{typ: msgHeartbeat})
		c.wmu.Unlock()
		if err != nil {
			c.shutdown(fmt.Errorf("%w: control connection to %v: %v", ErrPeerLost, c.ctl.RemoteAddr(), err), false)
			return
		}
	}
}

// lingerMax bounds how long a disconnecting side waits for the peer to
// close its end, after sending the disconnect.
const lingerMax = time.Second

// shutdown ends the connection with cause err, once: the QP goes to ERROR
// (flushing outstanding work requests), the control connection closes and
// Done fires. It reports whether this call did it.
//
// With notify (this side disconnects) the peer is sent a disconnect, the
// write half is shut, and the reader drains what the peer still sends until
// the peer closes (or lingerMax passes) before it closes the connection:
// closing a socket with unread data would reset it, and the peer might
// then lose the disconnect and see ErrPeerLost instead of ErrPeerClosed.
// Without notify the connection is closed at once.
func (c *Conn) shutdown(err error, notify bool) bool {
	c.sdMu.Lock()
	defer c.sdMu.Unlock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return false
	}
	c.err = err
	if notify {
		c.ctl.SetReadDeadline(time.Now().Add(min(c.peerTimeout, lingerMax)))
	}
	c.mu.Unlock()
	if notify {
		c.wmu.Lock()
		c.ctl.SetWriteDeadline(time.Now().Add(lingerMax))
		writeMsg(c.ctl, &msg{typ: msgDisconnect})
		c.wmu.Unlock()
		if tc, ok := c.ctl.(interface{ CloseWrite() error }); ok {
			tc.CloseWrite()
		} else {
			c.ctl.Close()
		}
	} else {
		c.ctl.Close()
	}
	c.res.qp.Modify(verbs.QPAttr{State: verbs.QPError})
	close(c.done)
	return true
}

// Context returns the verbs context of the QP.
func (c *Conn) Context() *verbs.Context { return c.res.ctx }

// PD returns the protection domain of the QP (Options.PD, or the one cm
// allocated).
func (c *Conn) PD() *verbs.PD { return c.res.pd }

// QP returns the connected queue pair, in RTS once Dial or Accept returned.
func (c *Conn) QP() *verbs.QP { return c.res.qp }

// SendCQ returns the QP's send completion queue.
func (c *Conn) SendCQ() *verbs.CQ { return c.res.sendCQ }

// RecvCQ returns the QP's receive completion queue.
func (c *Conn) RecvCQ() *verbs.CQ { return c.res.recvCQ }

// LocalPrivateData returns the private data this side sent.
func (c *Conn) LocalPrivateData() []byte { return c.localPriv }

// RemotePrivateData returns the private data the peer sent.
func (c *Conn) RemotePrivateData() []byte { return c.remotePriv }

// LocalAddr returns this side's address of the control connection.
func (c *Conn) LocalAddr() net.Addr { return c.ctl.LocalAddr() }

// RemoteAddr returns the peer's address of the control connection.
func (c *Conn) RemoteAddr() net.Addr { return c.ctl.RemoteAddr() }

// Done is closed when the connection ends: the peer was lost or closed, or
// this side called Disconnect or Close. By then the QP is in ERROR and its
// outstanding work requests are completing with WRFlush (or, after Close,
// were dropped).
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is up, then why it ended: an error
// matching ErrPeerLost (peer process gone, connection reset, no heartbeat
// within PeerTimeout), ErrPeerClosed (the peer called Close or Disconnect)
// or ErrClosed (this side did).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Disconnect ends the connection but keeps the verbs objects: the peer is
// told, the QP moves to ERROR and outstanding work requests complete with
// WRFlush, which the application may then poll before Close. It returns
// the reason the connection had already ended, if it had.
func (c *Conn) Disconnect() error {
	if !c.shutdown(ErrClosed, true) {
		if err := c.Err(); err != ErrClosed {
			return err
		}
	}
	return nil
}

// Close ends the connection (telling the peer, unless it has gone), waits
// for cm's goroutines, and destroys what cm created: the QP always, CQs,
// PD and context unless they were given in Options. Outstanding work
// requests are dropped without completions, as with ibv_destroy_qp; use
// Disconnect first to see them flushed. Close is idempotent.
//
// When cm opened the context (Options.PD nil), Close closes it, which
// releases every memory region in it and unmaps its memory: stop waiting
// on the Conn's CQs and using its regions' Bytes before calling Close.
func (c *Conn) Close() error {
	c.shutdown(ErrClosed, true)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
	return c.res.close()
}

// TLS returns the control connection's TLS state (the peer's verified
// certificates), or nil when it does not use TLS.
func (c *Conn) TLS() *tls.ConnectionState {
	tc, ok := c.ctl.(*tls.Conn)
	if !ok {
		return nil
	}
	st := tc.ConnectionState()
	return &st
}
