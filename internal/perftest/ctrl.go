package perftest

// The control connection: the out-of-band TCP connection between client
// and server.
//
// Goroutines: one reader goroutine per connection (started by newCtrl,
// ended by close or the peer hanging up) reads and parses lines and hands
// them to the run's goroutine through a channel; when the connection ends
// it sets the dead flag, which the timed loops poll. The run's goroutine
// does all the writing.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Timeouts of the exchange.
const (
	// stepTimeout bounds waiting for the peer's answer during setup and
	// between sizes.
	stepTimeout  = 15 * time.Second
	writeTimeout = 10 * time.Second
	// dialTimeout bounds connecting to the server.
	dialTimeout = 5 * time.Second
)

// errPeerGone is wrapped by errors reporting a peer that hung up.
var errPeerGone = errors.New("hung up")

// errNotRdmakit is returned when the peer speaks something else (perftest
// sends NUL-padded binary version strings first).
var errNotRdmakit = errors.New("peer does not speak the rdmakit perf exchange (is it a perftest binary? see docs/perf.md)")

// PeerError is an ERR message from the peer: the peer's one-line reason.
type PeerError struct {
	Peer string // "server" or "client"
	Text string
}

func (e *PeerError) Error() string { return e.Peer + ": " + e.Text }

type ctrl struct {
	conn net.Conn
	peer string // "server" or "client", for messages
	in   chan line
	quit chan struct{} // closed by close: the reader stops delivering
	dead atomic.Bool
	once sync.Once

	// mu guards err and peerErr.
	mu      sync.Mutex
	err     error  // why reading stopped
	peerErr string // text of an ERR received, if any
}

func newCtrl(c net.Conn, peer string) *ctrl {
	k := &ctrl{conn: c, peer: peer, in: make(chan line, 16), quit: make(chan struct{})}
	go k.read()
	return k
}

// read is the reader goroutine.
func (k *ctrl) read() {
	defer close(k.in)
	buf := make([]byte, 0, maxLine)
	chunk := make([]byte, 1024)
	for {
		if i := bytes.IndexByte(buf, '\n'); i >= 0 {
			l, err := parseLine(buf[:i])
			if err != nil {
				k.stop(err)
				return
			}
			buf = append(buf[:0], buf[i+1:]...)
			if l.kind == kindErr {
				k.mu.Lock()
				k.peerErr = l.text
				k.mu.Unlock()
			}
			select {
			case k.in <- l:
			case <-k.quit:
				return
			}
			continue
		}
		if len(buf) >= maxLine {
			k.stop(malformed("line longer than %d bytes", maxLine))
			return
		}
		n, err := k.conn.Read(chunk[:min(len(chunk), maxLine-len(buf))])
		if bytes.IndexByte(chunk[:n], 0) >= 0 {
			k.stop(errNotRdmakit)
			return
		}
		buf = append(buf, chunk[:n]...)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("connection closed")
			}
			k.stop(err)
			return
		}
	}
}

func (k *ctrl) stop(err error) {
	k.mu.Lock()
	if k.err == nil {
		k.err = err
	}
	k.mu.Unlock()
	k.dead.Store(true)
}

// gone returns the error that explains a dead connection: the peer's ERR
// text if it sent one, else what ended the connection.
func (k *ctrl) gone() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.peerErr != "" {
		return &PeerError{Peer: k.peer, Text: k.peerErr}
	}
	if errors.Is(k.err, errMalformed) || errors.Is(k.err, errNotRdmakit) {
		return fmt.Errorf("%s: %w", k.peer, k.err)
	}
	return fmt.Errorf("%s %w (%w)", k.peer, errPeerGone, k.err)
}

// goneReason is why the peer is gone, without naming the peer.
func (k *ctrl) goneReason() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.peerErr != "" {
		return &PeerError{Peer: k.peer, Text: k.peerErr}
	}
	return fmt.Errorf("%w: %w", errPeerGone, k.err)
}

func (k *ctrl) send(l line) error {
	k.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := k.conn.Write(l.encode()); err != nil {
		if k.dead.Load() {
			return k.gone()
		}
		return fmt.Errorf("sending to %s: %w", k.peer, err)
	}
	return nil
}

// sendErr tells the peer why this side gives up (best effort).
func (k *ctrl) sendErr(err error) {
	k.conn.SetWriteDeadline(time.Now().Add(time.Second))
	k.conn.Write(errLine(err.Error()).encode())
}

// recv waits for the next message, which must be of kind want. An ERR
// from the peer is returned as *PeerError. timeout 0 waits as long as the
// connection lives.
func (k *ctrl) recv(ctx context.Context, want string, timeout time.Duration) (line, error) {
	return k.recvAny(ctx, timeout, want)
}

// recvAny is recv for a message of any of the kinds in want.
func (k *ctrl) recvAny(ctx context.Context, timeout time.Duration, want ...string) (line, error) {
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case l, ok := <-k.in:
		if !ok {
			return line{}, k.gone()
		}
		if l.kind == kindErr {
			return line{}, &PeerError{Peer: k.peer, Text: l.text}
		}
		for _, w := range want {
			if l.kind == w {
				return l, nil
			}
		}
		return line{}, fmt.Errorf("%s sent %s where %s was expected (%w)", k.peer, l.kind, strings.Join(want, " or "), errMalformed)
	case <-tc:
		return line{}, fmt.Errorf("%s did not answer within %v (waiting for %s)", k.peer, timeout, strings.Join(want, " or "))
	case <-ctx.Done():
		return line{}, ctx.Err()
	}
}

// close closes the connection; the reader goroutine ends.
func (k *ctrl) close() {
	k.once.Do(func() {
		close(k.quit)
		k.conn.Close()
	})
}
