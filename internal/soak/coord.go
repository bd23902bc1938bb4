package soak

// The coordinator. Goroutines: Run works in its caller's goroutine and
// drives everything (faults, edge setup and teardown, verification); each
// peer process has one reader goroutine that turns its stdout into a
// channel of replies (proc.read) and one that copies its stderr to the log
// (exec's); a watchdog (time.AfterFunc) dumps every goroutine and kills
// the peers if the run overruns its bound, so nothing hangs.

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/sys"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/internal/testutil/faultnet"
)

// Config says what Run does.
type Config struct {
	Device   string        // tcp0 or shm0
	Peers    int           // ≥ 2
	Duration time.Duration // of the fault phase
	Seed     int64
	Faults   bool // kill, stall, and (tcp0) reset/drop connections
	// Sabotage flips one byte of a block in a target's memory before the
	// final check: the run must then report a violation (the suite's own
	// test that it can see corruption).
	Sabotage bool
	Logf     func(format string, args ...any)
	Stderr   io.Writer // the peers' stderr (default os.Stderr)
}

// Result is what a run saw.
type Result struct {
	Violations                     []string
	Epochs                         int // edge connections made
	Verified                       int // edge epochs whose target memory was checked
	Unverified                     int // edge epochs whose target was lost (killed) before the check
	SrcLost                        int // edge epochs whose initiator was killed (nothing to check against)
	Blocks                         int // blocks checked in target memory
	Writes, Reads, Atomics, Errors uint64
	Kills, Stalls, NetFaults       int
	Rotations                      int           // edges stopped cleanly, checked and reconnected
	Mark, End                      map[int]Stats // per peer that lived through the run
}

// Growth bounds between the mark and the end, per surviving process.
const (
	maxGoroutineGrowth = 8
	maxFDGrowth        = 8
	maxHeapGrowth      = 16 << 20
	callTimeout        = 45 * time.Second
)

type proc struct {
	idx   int
	inc   int // incarnation: bumped on every restart
	cmd   *exec.Cmd
	stdin io.WriteCloser
	rep   chan []byte
	dead  chan struct{}
}

type edgeState struct {
	id     int
	up     bool
	epoch  uint64
	srcInc int // incarnations of initiator and target at connect
	dstInc int
	proxy  *faultnet.Proxy
}

type coord struct {
	cfg   Config
	rng   *rand.Rand
	procs []*proc
	edges []*edgeState
	res   Result
	epoch uint64
	final bool // the last teardown: sabotage applies

	pmu  sync.Mutex    // guards procs' slots against the watchdog's reads
	done chan struct{} // closed when Run returns
}

// snapshot returns the current peers (for the watchdog's goroutine).
func (c *coord) snapshot() []*proc {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return append([]*proc(nil), c.procs...)
}

// Run runs a soak and returns what it saw; an error means the harness
// itself could not run (a peer could not start, a control call timed out).
func Run(cfg Config) (res *Result, err error) {
	if cfg.Peers < 2 {
		cfg.Peers = 2
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	c := &coord{cfg: cfg, rng: rand.New(rand.NewSource(cfg.Seed)), done: make(chan struct{})}
	defer close(c.done)
	c.procs = make([]*proc, cfg.Peers)
	bound := cfg.Duration + 3*time.Minute
	wd := time.AfterFunc(bound, func() {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		fmt.Fprintf(cfg.Stderr, "soak: watchdog: no end after %v; goroutines:\n%s\n", bound, buf[:n])
		for _, p := range c.snapshot() {
			if p != nil && p.cmd.Process != nil {
				p.cmd.Process.Signal(syscall.SIGQUIT)
			}
		}
		time.Sleep(2 * time.Second)
		for _, p := range c.snapshot() {
			if p != nil && p.cmd.Process != nil {
				p.cmd.Process.Kill()
			}
		}
		// Killing the peers unblocks every control call; if the
		// coordinator is stuck elsewhere, end the process loudly.
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			panic(fmt.Sprintf("soak: watchdog: run still going %v after its bound", 17*time.Second))
		}
	})
	defer wd.Stop()
	defer c.shutdown()
	for i := range c.procs {
		p, err := c.start(i, 0)
		if err != nil {
			return nil, err
		}
		c.pmu.Lock()
		c.procs[i] = p
		c.pmu.Unlock()
	}
	for i := 0; i < cfg.Peers; i++ {
		c.edges = append(c.edges, &edgeState{id: i})
	}
	// Warm up: connect, run, tear down (verifying); the mark is taken
	// with no edge connected, as is the end.
	if err := c.connectAll(); err != nil {
		return nil, err
	}
	time.Sleep(time.Second)
	if err := c.teardownAll(); err != nil {
		return nil, err
	}
	c.res.Mark = map[int]Stats{}
	for _, p := range c.procs {
		st, err := c.stats(p)
		if err != nil {
			return nil, err
		}
		c.res.Mark[p.idx] = *st
	}
	marked := make([]int, len(c.procs))
	for i, p := range c.procs {
		marked[i] = p.inc
	}
	if err := c.connectAll(); err != nil {
		return nil, err
	}
	end := time.Now().Add(cfg.Duration)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(50+c.rng.Intn(250)) * time.Millisecond)
		if cfg.Faults {
			if err := c.fault(); err != nil {
				return nil, err
			}
		}
		if err := c.repair(); err != nil {
			return nil, err
		}
	}
	c.final = true
	if err := c.teardownAll(); err != nil {
		return nil, err
	}
	c.res.End = map[int]Stats{}
	for i, p := range c.procs {
		if p.inc != marked[i] {
			delete(c.res.Mark, i)
			continue
		}
		m := c.res.Mark[i]
		var st *Stats
		// Goroutines of closed QPs and connections end asynchronously:
		// give them a moment before calling it growth.
		for try := 0; ; try++ {
			if st, err = c.stats(p); err != nil {
				return nil, err
			}
			if !grew(m, *st) || try == 20 {
				break
			}
			time.Sleep(150 * time.Millisecond)
		}
		c.res.End[i] = *st
		if grew(m, *st) {
			c.violate("peer %d grew from %+v to %+v (bounds: goroutines +%d, fds +%d, heap +%d)", i, m, *st, maxGoroutineGrowth, maxFDGrowth, maxHeapGrowth)
		}
	}
	return &c.res, nil
}

func grew(m, e Stats) bool {
	return e.Goroutines > m.Goroutines+maxGoroutineGrowth || e.FDs > m.FDs+maxFDGrowth || e.HeapInuse > m.HeapInuse+maxHeapGrowth
}

func (c *coord) violate(f string, a ...any) {
	s := fmt.Sprintf(f, a...)
	c.cfg.Logf("VIOLATION: %s", s)
	c.res.Violations = append(c.res.Violations, s)
}

func (c *coord) start(i, inc int) (*proc, error) {
	cmd := reexec.Command(Role, []string{c.cfg.Device})
	cmd.Stderr = c.cfg.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{idx: i, inc: inc, cmd: cmd, stdin: in, rep: make(chan []byte, 4), dead: make(chan struct{})}
	go func() {
		defer close(p.dead)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			p.rep <- append([]byte(nil), sc.Bytes()...)
		}
	}()
	return p, nil
}

var errDead = errors.New("peer process is gone")

// call sends m to p and returns its answer.
func (c *coord) call(p *proc, m Msg) (*Msg, error) {
	b, _ := json.Marshal(m)
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		return nil, errDead
	}
	select {
	case line := <-p.rep:
		var r Msg
		if err := json.Unmarshal(line, &r); err != nil {
			return nil, fmt.Errorf("peer %d: bad answer %q: %v", p.idx, line, err)
		}
		if r.Err != "" {
			return &r, fmt.Errorf("peer %d %s: %s", p.idx, m.Op, r.Err)
		}
		return &r, nil
	case <-p.dead:
		return nil, errDead
	case <-time.After(callTimeout):
		return nil, fmt.Errorf("peer %d: no answer to %s within %v", p.idx, m.Op, callTimeout)
	}
}

func (c *coord) stats(p *proc) (*Stats, error) {
	r, err := c.call(p, Msg{Op: "stats"})
	if err != nil {
		return nil, err
	}
	return r.Stats, nil
}

func (c *coord) shutdown() {
	for _, e := range c.edges {
		if e.proxy != nil {
			e.proxy.Close()
		}
	}
	for _, p := range c.procs {
		if p == nil {
			continue
		}
		p.stdin.Write([]byte(`{"op":"exit"}` + "\n"))
		p.stdin.Close()
		select {
		case <-p.dead:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
		}
		p.cmd.Wait()
	}
}

func (c *coord) connectAll() error {
	for _, e := range c.edges {
		if err := c.connect(e); err != nil {
			return err
		}
	}
	return nil
}

func (c *coord) teardownAll() error {
	for _, e := range c.edges {
		if err := c.teardown(e); err != nil {
			return err
		}
	}
	return nil
}

// connect makes a new epoch of edge e: fresh QPs on both ends, connected
// (through a faultnet proxy on tcp0 when faults are on), and starts traffic.
// A peer that dies meanwhile leaves the edge down, for repair.
func (c *coord) connect(e *edgeState) error {
	src, dst := c.procs[e.id], c.procs[(e.id+1)%len(c.procs)]
	c.epoch++
	ep := c.epoch
	t, err := c.call(dst, Msg{Op: "target", Edge: e.id})
	if err != nil {
		return c.tolerate(err)
	}
	s, err := c.call(src, Msg{Op: "init", Edge: e.id, Epoch: ep})
	if err != nil {
		c.call(dst, Msg{Op: "drop", Edge: e.id})
		return c.tolerate(err)
	}
	sAddr, tAddr := s.Addr, t.Addr
	if e.proxy != nil {
		e.proxy.Close()
		e.proxy = nil
	}
	if c.cfg.Device == "tcp0" && c.cfg.Faults && len(sAddr) == 32 && len(tAddr) == 32 {
		// The side with the smaller nonce dials (transport/tcp's address
		// layout); the other's address is rewritten to the proxy's.
		sn, tn := binary.BigEndian.Uint64(sAddr[8:]), binary.BigEndian.Uint64(tAddr[8:])
		sDials := sn < tn || (sn == tn && s.QPN < t.QPN)
		acc := tAddr
		if !sDials {
			acc = sAddr
		}
		px, err := faultnet.New(fmt.Sprintf("127.0.0.1:%d", binary.BigEndian.Uint16(acc[2:])))
		if err != nil {
			return err
		}
		e.proxy = px
		via := append([]byte(nil), acc...)
		binary.BigEndian.PutUint16(via[2:], uint16(px.Port()))
		copy(via[16:32], net.IPv4(127, 0, 0, 1).To16())
		if sDials {
			tAddr = via
		} else {
			sAddr = via
		}
	}
	if _, err := c.call(dst, Msg{Op: "connect", Edge: e.id, QPN: s.QPN, Addr: sAddr, PSN: s.PSN, Count: uint64(t.PSN)}); err != nil {
		c.abandon(e, src, dst)
		return c.tolerate(err)
	}
	if _, err := c.call(src, Msg{Op: "connect", Edge: e.id, QPN: t.QPN, Addr: tAddr, PSN: t.PSN, Count: uint64(s.PSN)}); err != nil {
		c.abandon(e, src, dst)
		return c.tolerate(err)
	}
	if _, err := c.call(src, Msg{Op: "start", Edge: e.id, RKey: t.RKey, RAddr: t.RAddr}); err != nil {
		c.abandon(e, src, dst)
		return c.tolerate(err)
	}
	e.up, e.epoch, e.srcInc, e.dstInc = true, ep, src.inc, dst.inc
	c.res.Epochs++
	return nil
}

// abandon undoes a half-made edge.
func (c *coord) abandon(e *edgeState, src, dst *proc) {
	c.call(src, Msg{Op: "stop", Edge: e.id})
	c.call(dst, Msg{Op: "drop", Edge: e.id})
}

// tolerate turns a dead peer's error into nil (repair will handle it) and
// keeps the others.
func (c *coord) tolerate(err error) error {
	if errors.Is(err, errDead) {
		return nil
	}
	// Failures to connect when a peer just died are expected (e.g. RTR
	// toward a vanished process); anything else is reported but the run
	// goes on.
	c.cfg.Logf("connect: %v", err)
	return nil
}

// teardown stops edge e's traffic, checks the initiator's report and the
// target's memory, and drops both ends.
func (c *coord) teardown(e *edgeState) error {
	if !e.up {
		return nil
	}
	e.up = false
	src, dst := c.procs[e.id], c.procs[(e.id+1)%len(c.procs)]
	srcAlive := src.inc == e.srcInc
	dstAlive := dst.inc == e.dstInc
	var rep *Report
	if srcAlive {
		r, err := c.call(src, Msg{Op: "stop", Edge: e.id})
		if err != nil && !errors.Is(err, errDead) {
			return err
		}
		if r != nil {
			rep = r.Report
		}
	}
	if e.proxy != nil {
		e.proxy.Close()
		e.proxy = nil
	}
	if rep != nil {
		c.res.Writes += rep.Writes
		c.res.Reads += rep.Reads
		c.res.Atomics += rep.Atomics
		c.res.Errors += rep.Errors
		for _, v := range rep.Violations {
			c.violate("edge %d epoch %d: %s", e.id, e.epoch, v)
		}
		if rep.Completed != rep.Posted {
			c.violate("edge %d epoch %d: %d work requests posted, %d completed", e.id, e.epoch, rep.Posted, rep.Completed)
		}
	}
	if dstAlive {
		if rep != nil {
			var slots []int
			for s := range rep.Expect {
				slots = append(slots, s)
			}
			sort.Ints(slots)
			if c.final && c.cfg.Sabotage && len(slots) > 0 {
				if _, err := c.call(dst, Msg{Op: "corrupt", Edge: e.id, Slots: slots[:1]}); err != nil {
					return err
				}
			}
			h, err := c.call(dst, Msg{Op: "hash", Edge: e.id, Slots: slots})
			if err != nil && !errors.Is(err, errDead) {
				return err
			}
			if h != nil {
				c.res.Verified++
				for i, s := range h.Slots {
					want := rep.Expect[s]
					c.res.Blocks++
					if h.Sums[i] != want.Sum {
						c.violate("edge %d epoch %d: slot %d holds checksum %08x, want %08x (seq %d, a Write that completed successfully)", e.id, e.epoch, s, h.Sums[i], want.Sum, want.Seq)
					}
				}
				if h.Count < rep.AtomicsOK || h.Count > rep.AtomicsOK+rep.AtomicsBad {
					c.violate("edge %d epoch %d: counter %d after %d successful and %d failed fetch-and-adds", e.id, e.epoch, h.Count, rep.AtomicsOK, rep.AtomicsBad)
				}
			} else {
				c.res.Unverified++
			}
		}
		if _, err := c.call(dst, Msg{Op: "drop", Edge: e.id}); err != nil && !errors.Is(err, errDead) {
			return err
		}
	} else if rep != nil {
		c.res.Unverified++
	}
	if rep == nil {
		c.res.SrcLost++
	}
	return nil
}

// repair tears down and reconnects every edge that failed or lost a peer,
// restarting dead peers first.
func (c *coord) repair() error {
	for i, p := range c.procs {
		select {
		case <-p.dead:
			p.cmd.Wait()
			np, err := c.start(i, p.inc+1)
			if err != nil {
				return err
			}
			c.pmu.Lock()
			c.procs[i] = np
			c.pmu.Unlock()
		default:
		}
	}
	for _, e := range c.edges {
		src, dst := c.procs[e.id], c.procs[(e.id+1)%len(c.procs)]
		broken := !e.up || src.inc != e.srcInc || dst.inc != e.dstInc
		if !broken {
			r, err := c.call(src, Msg{Op: "status", Edge: e.id})
			if err != nil && !errors.Is(err, errDead) {
				return err
			}
			broken = err != nil || r.Failed
		}
		if broken {
			if err := c.teardown(e); err != nil {
				return err
			}
			if err := c.connect(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// fault injects one fault, chosen by the seeded generator. Peer 0 is
// never killed, so at least one process lives through the whole run.
func (c *coord) fault() error {
	n := len(c.procs)
	kinds := []string{"kill", "stall", "rotate", "rotate"}
	if c.cfg.Device == "tcp0" {
		kinds = []string{"kill", "stall", "net", "rotate"}
	}
	switch kinds[c.rng.Intn(len(kinds))] {
	case "kill":
		v := 1 + c.rng.Intn(n-1)
		p := c.procs[v]
		c.cfg.Logf("kill peer %d", v)
		p.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-p.dead:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("peer %d did not die of SIGKILL", v)
		}
		c.res.Kills++
	case "stall":
		v := c.rng.Intn(n)
		d := time.Duration(20+c.rng.Intn(300)) * time.Millisecond
		if c.cfg.Duration >= time.Minute && c.rng.Intn(10) == 0 {
			// Now and then (long runs only) a stall past the QPs' retry
			// budget (≈ 4.3 s): its edges must fail with error
			// completions, not hang or lose anything.
			d = 6 * time.Second
		}
		c.cfg.Logf("stall peer %d for %v", v, d)
		p := c.procs[v]
		sys.StopProcess(p.cmd.Process.Pid)
		time.Sleep(d)
		sys.ContinueProcess(p.cmd.Process.Pid)
		c.res.Stalls++
	case "rotate":
		// A clean stop in mid-traffic: everything in flight must complete
		// (successfully, as nothing failed), the target is checked, and
		// the edge is connected again with fresh QPs.
		e := c.edges[c.rng.Intn(len(c.edges))]
		c.cfg.Logf("rotate edge %d", e.id)
		if err := c.teardown(e); err != nil {
			return err
		}
		c.res.Rotations++
	case "net":
		e := c.edges[c.rng.Intn(len(c.edges))]
		if e.proxy == nil {
			return nil
		}
		switch c.rng.Intn(3) {
		case 0:
			c.cfg.Logf("reset edge %d", e.id)
			e.proxy.Reset()
		case 1:
			c.cfg.Logf("drop edge %d", e.id)
			e.proxy.Drop()
		default:
			c.cfg.Logf("stall edge %d's connection briefly", e.id)
			e.proxy.Stall(faultnet.Both)
			time.Sleep(time.Duration(10+c.rng.Intn(200)) * time.Millisecond)
			e.proxy.Resume(faultnet.Both)
		}
		c.res.NetFaults++
	}
	return nil
}
