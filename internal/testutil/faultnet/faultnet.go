// Package faultnet is a test double for TCP paths: a proxy on 127.0.0.1
// that forwards every connection it accepts to a fixed target address and
// injects faults into it, on command or by a scripted schedule:
//
//   - Stall: stop forwarding one or both directions; the connections stay
//     open and nothing (not even the end of a stream) goes through until
//     Resume.
//   - Truncate: forward n more bytes in a direction, then close both legs.
//   - Reset: close both legs with SO_LINGER 0, so both ends see an RST.
//   - Drop: close both legs at once (FIN), discarding what is in flight.
//     Drop and Truncate close plainly; Linux then sends an RST instead of
//     a FIN on a leg whose socket still holds unread data, so a peer may
//     see a reset there too.
//   - Delay: sleep before forwarding each chunk read in a direction.
//   - Refuse: new connections are reset as soon as they are accepted
//     (RefuseReset), or the listener is closed so that dials get
//     ECONNREFUSED (RefuseClosed, reopened on the same port by RefuseNone).
//
// A schedule (Schedule) fires an action when a connection has forwarded an
// exact number of bytes in a direction: chunks are split at that byte, so
// where a fault hits the stream does not depend on how reads happen to
// return data. Everything is bounded: Close closes the listener and every
// connection, wakes every wait and returns once every goroutine the proxy
// started has exited.
//
// Goroutines: one accept goroutine per open listener (acceptLoop); per
// accepted connection one goroutine (serve) that dials the target and then
// pumps client→target (Up) itself, and one more that pumps target→client
// (Down). The methods of Proxy run on the caller's goroutine; scheduled
// actions run on the pump goroutine that reached the byte count. All state
// is guarded by Proxy.mu; changes of stall state and delays are broadcast
// by closing and replacing Proxy.changed.
package faultnet

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// Dir selects directions of a proxied connection.
type Dir uint8

const (
	// Up is client → target: the bytes of whoever dialed the proxy.
	Up Dir = 1 << iota
	// Down is target → client.
	Down
	// Both is Up and Down.
	Both = Up | Down
)

func (d Dir) String() string {
	switch d {
	case Up:
		return "up"
	case Down:
		return "down"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Dir(%d)", uint8(d))
}

// index of a single direction: 0 Up, 1 Down.
func (d Dir) index() int {
	if d == Down {
		return 1
	}
	return 0
}

func dirOf(i int) Dir { return Dir(1 << i) }

// Action is a fault (or the end of one); also the kind of an Event.
type Action uint8

const (
	Stall    Action = iota + 1 // stop forwarding in Step.Dir
	Resume                     // forward again in Step.Dir
	Reset                      // RST both legs of the connection
	Drop                       // close both legs of the connection (FIN)
	SetDelay                   // per-chunk delay Step.Delay in Step.Dir (0: none)
	Refuse                     // refuse new connections (RefuseReset)

	// Event kinds only.
	Accepted   // a connection was accepted and its target dialed
	Refused    // a connection was refused (reset on accept)
	DialFailed // the target could not be dialed; the client was reset
	Truncated  // a truncation limit was reached; the connection was closed
	Ended      // a direction's source ended (EOF), forwarded as a half-close
	Broken     // a read or write failed; the connection was closed
	Closed     // both directions ended, or the proxy closed: the connection was closed
)

var actionNames = map[Action]string{
	Stall: "stall", Resume: "resume", Reset: "reset", Drop: "drop", SetDelay: "delay", Refuse: "refuse",
	Accepted: "accepted", Refused: "refused", DialFailed: "dial-failed", Truncated: "truncated",
	Ended: "ended", Broken: "broken", Closed: "closed",
}

func (a Action) String() string {
	if s, ok := actionNames[a]; ok {
		return s
	}
	return fmt.Sprintf("Action(%d)", uint8(a))
}

// RefuseMode says how new connections are refused.
type RefuseMode uint8

const (
	RefuseNone   RefuseMode = iota // accept and proxy
	RefuseReset                    // accept, then reset at once
	RefuseClosed                   // no listener: the dial gets ECONNREFUSED
)

// Step is one scripted action: when connection Conn (in accept order, from
// 0; -1 for every connection) has forwarded exactly After bytes in
// direction On (Up or Down), Action is applied. Stall, Resume and SetDelay
// change the proxy-wide state for directions Dir (Both if zero); Reset and
// Drop end that connection; Refuse refuses later connections (reset).
type Step struct {
	Conn   int
	On     Dir
	After  int64
	Action Action
	Dir    Dir
	Delay  time.Duration
}

// Event records something the proxy did. Conn is -1 for proxy-wide
// commands; At is the byte count in Dir when a per-connection event fired.
type Event struct {
	Time   time.Time
	Conn   int
	Action Action
	Dir    Dir
	At     int64
}

func (e Event) String() string {
	if e.Dir == 0 {
		return fmt.Sprintf("conn %d %s", e.Conn, e.Action)
	}
	return fmt.Sprintf("conn %d %s %s at %d", e.Conn, e.Action, e.Dir, e.At)
}

// Proxy is a faulty TCP forwarder. Create it with New; Close it.
type Proxy struct {
	target string
	addr   *net.TCPAddr
	ctx    context.Context // cancelled by Close: aborts target dials
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu      sync.Mutex
	ln      *net.TCPListener // nil while RefuseClosed
	closed  bool
	refuse  RefuseMode
	stalled Dir
	delay   [2]time.Duration
	changed chan struct{} // closed and replaced when stalled or delay change
	script  []Step
	conns   []*conn // every connection, in accept order
	events  []Event
	evch    chan struct{} // closed and replaced on each event
}

// New listens on 127.0.0.1 (an ephemeral port) and forwards to target
// ("host:port", which should be on loopback too).
func New(target string) (*Proxy, error) {
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		target:  target,
		addr:    ln.Addr().(*net.TCPAddr),
		done:    make(chan struct{}),
		ln:      ln,
		changed: make(chan struct{}),
		evch:    make(chan struct{}),
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.acceptLoop(ln)
	return p, nil
}

// Addr is the proxy's listen address (127.0.0.1:port).
func (p *Proxy) Addr() *net.TCPAddr { return p.addr }

// Port is the proxy's listen port.
func (p *Proxy) Port() int { return p.addr.Port }

// Close stops the proxy: the listener and every connection are closed
// (plainly: a stalled direction's peer sees the close now), and Close
// returns once every goroutine of the proxy has exited. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	close(p.done)
	p.cancel()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	conns := append([]*conn(nil), p.conns...)
	p.broadcastLocked()
	p.mu.Unlock()
	for _, c := range conns {
		c.killAs(false, -1, 0, Closed)
	}
	p.wg.Wait()
	return nil
}

func (p *Proxy) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) eventLocked(e Event) {
	e.Time = time.Now()
	p.events = append(p.events, e)
	close(p.evch)
	p.evch = make(chan struct{})
}

// Stall stops forwarding in directions d on every connection, current and
// future, until Resume. Bytes read already are held, not lost.
func (p *Proxy) Stall(d Dir) { p.apply(nil, Step{Action: Stall, Dir: d}, -1, 0) }

// Resume forwards again in directions d.
func (p *Proxy) Resume(d Dir) { p.apply(nil, Step{Action: Resume, Dir: d}, -1, 0) }

// Delay makes every connection sleep delay before forwarding each chunk it
// reads in directions d (0 removes the delay).
func (p *Proxy) Delay(d Dir, delay time.Duration) {
	p.apply(nil, Step{Action: SetDelay, Dir: d, Delay: delay}, -1, 0)
}

// Reset resets both legs of every open connection.
func (p *Proxy) Reset() { p.endAll(true) }

// Drop closes both legs of every open connection at once.
func (p *Proxy) Drop() { p.endAll(false) }

func (p *Proxy) endAll(rst bool) {
	p.mu.Lock()
	conns := append([]*conn(nil), p.conns...)
	p.mu.Unlock()
	for _, c := range conns {
		c.kill(rst, -1, 0)
	}
}

// Truncate lets every open connection forward n more bytes in directions
// d, then closes both of its legs (at once when n is 0).
func (p *Proxy) Truncate(d Dir, n int64) {
	if d == 0 {
		d = Both
	}
	p.mu.Lock()
	var now []*conn
	for _, c := range p.conns {
		if c.isDead() {
			continue
		}
		for i := 0; i < 2; i++ {
			if d&dirOf(i) == 0 {
				continue
			}
			if n <= 0 {
				now = append(now, c)
				continue
			}
			c.addStepLocked(step{after: c.fwd[i] + n, dir: i, s: Step{Action: Drop}, trunc: true})
		}
	}
	p.mu.Unlock()
	for _, c := range now {
		c.kill(false, -1, 0)
	}
}

// Refuse sets how new connections are treated. RefuseClosed closes the
// listener; RefuseNone or RefuseReset after it listen again on the same
// port (an error if that fails).
func (p *Proxy) Refuse(m RefuseMode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return net.ErrClosed
	}
	p.refuse = m
	p.eventLocked(Event{Conn: -1, Action: Refuse, At: int64(m)})
	if m == RefuseClosed {
		if p.ln != nil {
			p.ln.Close()
			p.ln = nil
		}
		return nil
	}
	if p.ln == nil {
		ln, err := net.ListenTCP("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("faultnet: listening again on %v: %w", p.addr, err)
		}
		p.ln = ln
		p.wg.Add(1)
		go p.acceptLoop(ln)
	}
	return nil
}

// Schedule adds scripted steps (see Step). Steps for connections that are
// open already count from the bytes they have forwarded so far: a step
// whose After is reached already fires at the next chunk in its direction.
func (p *Proxy) Schedule(steps ...Step) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range steps {
		p.script = append(p.script, s)
		for _, c := range p.conns {
			if (s.Conn < 0 || s.Conn == c.id) && !c.isDead() {
				c.addStepLocked(step{after: s.After, dir: s.On.index(), s: s})
			}
		}
	}
}

// Conns is the number of connections accepted so far (refused ones not
// counted).
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Forwarded is how many bytes connection id has forwarded in direction d
// (Up or Down).
func (p *Proxy) Forwarded(id int, d Dir) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id < 0 || id >= len(p.conns) {
		return 0
	}
	return p.conns[id].fwd[d.index()]
}

// Events returns what happened so far, in order.
func (p *Proxy) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Event(nil), p.events...)
}

// Wait returns the first event (from the start) that match accepts, waiting
// for it until ctx is done or the proxy closed.
func (p *Proxy) Wait(ctx context.Context, match func(Event) bool) (Event, error) {
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.events); seen++ {
			if match(p.events[seen]) {
				e := p.events[seen]
				p.mu.Unlock()
				return e, nil
			}
		}
		ch := p.evch
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		case <-p.done:
			return Event{}, net.ErrClosed
		}
	}
}

// WaitConns waits until n connections have been accepted and their
// targets dialed.
func (p *Proxy) WaitConns(ctx context.Context, n int) error {
	k := 0
	_, err := p.Wait(ctx, func(e Event) bool {
		if e.Action == Accepted {
			k++
		}
		return k >= n
	})
	return err
}

// acceptLoop runs on its own goroutine for one listener.
func (p *Proxy) acceptLoop(ln *net.TCPListener) {
	defer p.wg.Done()
	for {
		cc, err := ln.AcceptTCP()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return // listener closed (Close or RefuseClosed)
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			cc.Close()
			return
		}
		if p.refuse != RefuseNone {
			p.eventLocked(Event{Conn: -1, Action: Refused})
			p.mu.Unlock()
			cc.SetLinger(0)
			cc.Close()
			continue
		}
		c := &conn{p: p, id: len(p.conns), client: cc, dead: make(chan struct{})}
		for _, s := range p.script {
			if s.Conn < 0 || s.Conn == c.id {
				c.addStepLocked(step{after: s.After, dir: s.On.index(), s: s})
			}
		}
		p.conns = append(p.conns, c)
		p.wg.Add(1)
		p.mu.Unlock()
		go c.serve()
	}
}
