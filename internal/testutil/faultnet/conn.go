package faultnet

// One proxied connection. Goroutines: serve (dials the target, then pumps
// Up) and the Down pump it starts; kill runs on whichever goroutine ends
// the connection (a pump, a scheduled step, or a Proxy method's caller).

import (
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"sync"
	"time"
)

const (
	chunkSize   = 32 << 10
	dialTimeout = 5 * time.Second
)

// step is a Step bound to one connection and direction.
type step struct {
	after int64
	dir   int // index of the direction whose count triggers it
	s     Step
	trunc bool // a Truncate limit: reported as Truncated
}

type conn struct {
	p      *Proxy
	id     int
	client *net.TCPConn
	dead   chan struct{} // closed by kill
	once   sync.Once

	// Guarded by p.mu.
	target *net.TCPConn
	fwd    [2]int64
	steps  [2][]step // pending, sorted by after
	ended  [2]bool   // a direction's source ended and was half-closed
}

func (c *conn) isDead() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

func (c *conn) addStepLocked(s step) {
	q := append(c.steps[s.dir], s)
	sort.SliceStable(q, func(i, j int) bool { return q[i].after < q[j].after })
	c.steps[s.dir] = q
}

// kill ends the connection: both legs closed, with an RST if rst. dir and
// at describe the event (dir -1: a command).
func (c *conn) kill(rst bool, dir int, at int64) {
	c.killAs(rst, dir, at, 0)
}

func (c *conn) killAs(rst bool, dir int, at int64, why Action) {
	c.once.Do(func() {
		p := c.p
		p.mu.Lock()
		t := c.target
		if why == 0 {
			why = Drop
			if rst {
				why = Reset
			}
		}
		var d Dir
		if dir >= 0 {
			d = dirOf(dir)
		}
		close(c.dead)
		p.eventLocked(Event{Conn: c.id, Action: why, Dir: d, At: at})
		p.mu.Unlock()
		for _, x := range []*net.TCPConn{c.client, t} {
			if x == nil {
				continue
			}
			if rst {
				x.SetLinger(0)
			}
			x.Close()
		}
	})
}

// serve runs on the connection's goroutine: dial, then pump both ways.
func (c *conn) serve() {
	p := c.p
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	d := net.Dialer{}
	tc, err := d.DialContext(ctx, "tcp", p.target)
	cancel()
	if err != nil {
		c.killAs(true, -1, 0, DialFailed)
		return
	}
	t := tc.(*net.TCPConn)
	t.SetNoDelay(true)
	c.client.SetNoDelay(true)
	p.mu.Lock()
	if c.isDead() {
		p.mu.Unlock()
		t.Close()
		return
	}
	c.target = t
	p.eventLocked(Event{Conn: c.id, Action: Accepted})
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		c.pump(1, t, c.client)
	}()
	c.pump(0, c.client, t)
}

// pump forwards direction i from src to dst until either ends or the
// connection is killed.
func (c *conn) pump(i int, src, dst *net.TCPConn) {
	buf := make([]byte, chunkSize)
	for {
		if !c.fireDue(i) {
			return
		}
		n, err := src.Read(buf)
		data := buf[:n]
		if n > 0 && !c.sleep(i) {
			return
		}
		for len(data) > 0 {
			if !c.fireDue(i) || !c.waitFlow(i) {
				return
			}
			k := c.allowance(i, len(data))
			// Count the bytes before they can arrive, so that a test that
			// has read them sees them counted (Forwarded, and the base of
			// Truncate); take back what the write did not deliver.
			c.p.mu.Lock()
			c.fwd[i] += int64(k)
			c.p.mu.Unlock()
			w, werr := dst.Write(data[:k])
			if w < k {
				c.p.mu.Lock()
				c.fwd[i] -= int64(k - w)
				c.p.mu.Unlock()
			}
			if werr != nil {
				c.killAs(false, i, c.count(i), Broken)
				return
			}
			data = data[w:]
		}
		if err != nil {
			// Nothing, not even the end of the stream, passes a stall.
			if !c.fireDue(i) || !c.waitFlow(i) {
				return
			}
			if !errors.Is(err, io.EOF) {
				c.killAs(true, i, c.count(i), Broken) // pass a reset on
				return
			}
			c.p.mu.Lock()
			c.ended[i] = true
			both := c.ended[0] && c.ended[1]
			c.p.eventLocked(Event{Conn: c.id, Action: Ended, Dir: dirOf(i), At: c.fwd[i]})
			c.p.mu.Unlock()
			dst.CloseWrite()
			if both {
				c.killAs(false, i, c.count(i), Closed)
			}
			return
		}
	}
}

func (c *conn) count(i int) int64 {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.fwd[i]
}

// allowance is how much of n bytes may be written before the next step.
func (c *conn) allowance(i, n int) int {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if q := c.steps[i]; len(q) > 0 {
		if left := q[0].after - c.fwd[i]; left < int64(n) {
			return int(max(left, 1)) // a step due now fired in fireDue
		}
	}
	return n
}

// fireDue applies the steps of direction i whose byte count is reached;
// false when the connection is dead or the proxy closed.
func (c *conn) fireDue(i int) bool {
	p := c.p
	for {
		p.mu.Lock()
		if p.closed || c.isDead() {
			p.mu.Unlock()
			return false
		}
		q := c.steps[i]
		if len(q) == 0 || q[0].after > c.fwd[i] {
			p.mu.Unlock()
			return true
		}
		s := q[0]
		c.steps[i] = q[1:]
		at := c.fwd[i]
		p.mu.Unlock()
		if s.trunc {
			c.killAs(false, i, at, Truncated)
			return false
		}
		p.apply(c, s.s, i, at)
	}
}

// waitFlow waits while direction i is stalled; false when the connection
// is dead or the proxy closed.
func (c *conn) waitFlow(i int) bool {
	p := c.p
	for {
		p.mu.Lock()
		if p.closed || c.isDead() {
			p.mu.Unlock()
			return false
		}
		if p.stalled&dirOf(i) == 0 {
			p.mu.Unlock()
			return true
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-c.dead:
		case <-p.done:
		}
	}
}

// sleep applies direction i's delay to a chunk; false when the connection
// died meanwhile.
func (c *conn) sleep(i int) bool {
	p := c.p
	p.mu.Lock()
	d := p.delay[i]
	p.mu.Unlock()
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.dead:
		return false
	case <-p.done:
		return false
	}
}

// apply performs an action: proxy-wide for Stall, Resume, SetDelay and
// Refuse; on connection c (every open one if c is nil) for Reset and Drop.
// dir and at describe where a scheduled step fired (dir -1: a command).
func (p *Proxy) apply(c *conn, s Step, dir int, at int64) {
	id := -1
	if c != nil {
		id = c.id
	}
	d := s.Dir
	if d == 0 {
		d = Both
	}
	switch s.Action {
	case Stall, Resume, SetDelay:
		p.mu.Lock()
		switch s.Action {
		case Stall:
			p.stalled |= d
		case Resume:
			p.stalled &^= d
		case SetDelay:
			for i := 0; i < 2; i++ {
				if d&dirOf(i) != 0 {
					p.delay[i] = s.Delay
				}
			}
		}
		e := Event{Conn: id, Action: s.Action, Dir: d, At: at}
		if dir >= 0 {
			e.Dir = dirOf(dir)
		}
		p.eventLocked(e)
		p.broadcastLocked()
		p.mu.Unlock()
	case Refuse:
		p.Refuse(RefuseReset)
	case Reset, Drop:
		if c != nil {
			c.kill(s.Action == Reset, dir, at)
		} else {
			p.endAll(s.Action == Reset)
		}
	}
}
