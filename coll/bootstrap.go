package coll

// Bootstrap: forming a communicator over TCP and watching it afterwards.
//
// Goroutines. The root service (in the process that called GetUniqueID,
// or rank 0's under a launcher) runs one accept goroutine and one reader
// goroutine per connected rank; they share root.mu. Timers (join and
// setup-round timeouts) run as time.AfterFunc callbacks under root.mu
// too. A rank talks to the root over one TCP connection: synchronously,
// from the goroutine creating the communicator, during setup; then from
// the communicator's watcher goroutine (comm.go), which turns ABORT, LEFT,
// ALL-BYE and the connection's end into communicator state.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// rankInfo is what every rank learns about every other at join time.
type rankInfo struct {
	IP       string // the rank's address as the root saw its connection
	Host     string // host identity: kernel boot id and PID namespace
	Hostname string
	PID      int
}

// hostIdentity says which ranks can use shm0 with each other: the same
// kernel (boot id) and the same PID namespace (shm opens peers' memory
// through /proc/PID/fd).
var hostIdentity = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	id := string(bytes.TrimSpace(b))
	if err != nil || id == "" {
		id, _ = os.Hostname()
	}
	if ns, err := os.Readlink("/proc/self/ns/pid"); err == nil {
		id += "/" + ns
	}
	return id
})

func randNonce() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("coll: crypto/rand: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:])
}

// root is the rendezvous service. It forms one communicator and lives
// until every rank has left or its connection ended.
type root struct {
	ln           net.Listener
	nonce        uint64
	helloTimeout time.Duration
	done         chan struct{}

	// mu guards everything below.
	mu       sync.Mutex
	nranks   int // 0 until the first hello
	ranks    []*rootRank
	joined   int
	formed   bool
	failed   bool
	finished bool
	timeout  time.Duration // the smallest of ours and the ranks'
	round    uint32
	got      [][][]byte // by source: blobs by destination
	gotN     int
	roundT   *time.Timer
	joinT    *time.Timer
	joinBy   time.Time
	left     int // ranks that said bye or whose connection ended
}

type rootRank struct {
	fc    *frameConn
	info  rankInfo
	bye   bool
	ended bool
}

// startRoot listens on addr and serves one communicator.
func startRoot(addr string, nonce uint64, timeout time.Duration) (*root, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: root cannot listen on %s: %v", ErrBootstrap, addr, err)
	}
	r := &root{ln: ln, nonce: nonce, helloTimeout: timeout, timeout: timeout, done: make(chan struct{})}
	r.mu.Lock()
	r.joinBy = time.Now().Add(timeout)
	r.joinT = time.AfterFunc(timeout, r.joinTimeout)
	r.mu.Unlock()
	go r.accept()
	return r, nil
}

func (r *root) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go r.serve(newFrameConn(c, helloLimit)) // until the hello shows the nonce
	}
}

// serve handles one rank's connection: its hello, then its messages.
func (r *root) serve(fc *frameConn) {
	fc.c.SetReadDeadline(time.Now().Add(r.helloTimeout))
	typ, p, err := fc.read()
	if err != nil || typ != msgHello {
		if errors.Is(err, errFrame) {
			// An oversized frame, refused unread: say so before hanging up.
			fc.write(msgError, []byte("root: "+err.Error()))
		}
		fc.close()
		return
	}
	fc.c.SetReadDeadline(time.Time{})
	d := dec{b: p}
	magic, ver, nonce := d.u32(), d.u32(), d.u64()
	nranks, rank := int(d.u32()), int(d.u32())
	info := rankInfo{Host: d.str(), Hostname: d.str(), PID: int(d.u32())}
	clientTimeout := time.Duration(d.u64()) * time.Millisecond
	if h, _, err := net.SplitHostPort(fc.c.RemoteAddr().String()); err == nil {
		info.IP = h
	}
	reject := func(format string, args ...any) {
		fc.write(msgError, []byte(fmt.Sprintf(format, args...)))
		fc.close()
	}
	if d.err != nil || magic != bootMagic || ver != bootVer {
		reject("not an rdmakit coll bootstrap hello")
		return
	}
	if nonce != r.nonce {
		reject("unique id does not match this root's (a stale id, or another job's root)")
		return
	}
	r.mu.Lock()
	switch {
	case r.formed || r.failed:
		r.mu.Unlock()
		reject("communicator already formed or failed")
		return
	case nranks < 1 || nranks > MaxRanks || rank < 0 || rank >= nranks:
		r.mu.Unlock()
		reject("rank %d of %d is out of range (at most %d ranks)", rank, nranks, MaxRanks)
		return
	case r.nranks != 0 && nranks != r.nranks:
		r.mu.Unlock()
		reject("rank %d says %d ranks, others say %d", rank, nranks, r.nranks)
		return
	}
	if r.nranks == 0 {
		r.nranks = nranks
		r.ranks = make([]*rootRank, nranks)
	}
	if r.ranks[rank] != nil {
		r.mu.Unlock()
		reject("rank %d joined twice", rank)
		return
	}
	fc.setLimit(bootLimit(nranks)) // a member now: rank tables and setup rounds
	// Report missing ranks before the most impatient rank gives up.
	if dl := time.Now().Add(clientTimeout); clientTimeout > 0 && dl.Before(r.joinBy) {
		r.joinBy = dl
		r.joinT.Reset(time.Until(dl))
		r.timeout = min(r.timeout, clientTimeout)
	}
	me := &rootRank{fc: fc, info: info}
	r.ranks[rank] = me
	r.joined++
	if r.joined == r.nranks {
		r.formed = true
		r.joinT.Stop()
		r.ln.Close()
		var e enc
		e.u32(uint32(r.nranks))
		for _, rr := range r.ranks {
			e.str(rr.info.IP)
			e.str(rr.info.Host)
			e.str(rr.info.Hostname)
			e.u32(uint32(rr.info.PID))
		}
		for _, rr := range r.ranks {
			rr.fc.write(msgInfo, e)
		}
	}
	r.mu.Unlock()

	for {
		typ, p, err := fc.read()
		if err != nil {
			r.lost(rank, me, err)
			return
		}
		switch typ {
		case msgXchg:
			r.xchg(rank, p)
		case msgAbort:
			r.broadcast(msgAbort, p, rank)
		case msgBye:
			r.bye(rank, me)
		}
	}
}

func (r *root) joinTimeout() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.formed || r.failed {
		return
	}
	var missing []int
	for i, rr := range r.ranks {
		if rr == nil {
			missing = append(missing, i)
		}
	}
	msg := fmt.Sprintf("no rank joined within %v", r.timeout)
	if r.nranks > 0 {
		msg = fmt.Sprintf("ranks %s of %d did not join within %v", rankList(missing), r.nranks, r.timeout)
	}
	for _, rr := range r.ranks {
		if rr != nil {
			msg += fmt.Sprintf(" (joined: rank %d pid %d on %s", slices.Index(r.ranks, rr), rr.info.PID, rr.info.Hostname)
			break
		}
	}
	if strings.Contains(msg, "(joined") {
		msg += ", ...)"
	}
	r.failLocked(msg)
}

// failLocked ends the root: every connected rank gets msg as the reason.
func (r *root) failLocked(msg string) {
	r.failed = true
	r.ln.Close()
	for _, rr := range r.ranks {
		if rr != nil && !rr.ended {
			rr.fc.write(msgError, []byte(msg))
			rr.fc.close()
		}
	}
	r.finishLocked()
}

func (r *root) finishLocked() {
	if !r.finished {
		r.finished = true
		if r.roundT != nil {
			r.roundT.Stop()
		}
		close(r.done)
	}
}

// xchg collects one rank's blobs of the current setup round and, once all
// ranks have sent theirs, hands every rank the blobs addressed to it.
func (r *root) xchg(rank int, p []byte) {
	d := dec{b: bytes.Clone(p)} // the blobs outlive the read buffer
	round := d.u32()
	n := int(d.u32())
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.formed || r.failed {
		return
	}
	if d.err != nil || n != r.nranks || round != r.round || (r.got != nil && r.got[rank] != nil) {
		r.failLocked(fmt.Sprintf("rank %d sent a bad setup message (round %d, want %d)", rank, round, r.round))
		return
	}
	blobs := make([][]byte, n)
	for i := range blobs {
		blobs[i] = d.bytes()
	}
	if d.err != nil {
		r.failLocked(fmt.Sprintf("rank %d sent a malformed setup message", rank))
		return
	}
	if r.got == nil {
		r.got = make([][][]byte, r.nranks)
		r.roundT = time.AfterFunc(r.timeout, func() { r.roundTimeout(round) })
	}
	r.got[rank] = blobs
	r.gotN++
	if r.gotN < r.nranks {
		return
	}
	r.roundT.Stop()
	for dst, rr := range r.ranks {
		var e enc
		e.u32(round)
		e.u32(uint32(r.nranks))
		for src := range r.ranks {
			e.bytes(r.got[src][dst])
		}
		rr.fc.write(msgXchgR, e)
	}
	r.got, r.gotN = nil, 0
	r.round++
}

func (r *root) roundTimeout(round uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failed || r.round != round || r.got == nil {
		return
	}
	var missing []int
	for i, g := range r.got {
		if g == nil {
			missing = append(missing, i)
		}
	}
	r.failLocked(fmt.Sprintf("ranks %s of %d did not reach setup step %d within %v", rankList(missing), r.nranks, round, r.timeout))
}

// broadcast sends a message to every connected rank but one.
func (r *root) broadcast(typ byte, p []byte, except int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.broadcastLocked(typ, p, except)
}

func (r *root) broadcastLocked(typ byte, p []byte, except int) {
	for i, rr := range r.ranks {
		if i != except && rr != nil && !rr.ended {
			rr.fc.write(typ, p)
		}
	}
}

func (r *root) bye(rank int, me *rootRank) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if me.bye {
		return
	}
	me.bye = true
	r.left++
	var e enc
	e.u32(uint32(rank))
	r.broadcastLocked(msgLeft, e, rank)
	r.checkAllLeftLocked()
}

// lost handles the end of a rank's connection.
func (r *root) lost(rank int, me *rootRank, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	me.ended = true
	me.fc.close()
	if !r.formed {
		if !r.failed && r.ranks[rank] == me {
			r.ranks[rank] = nil // it may join again before the timeout
			r.joined--
		}
		return
	}
	if !me.bye {
		me.bye = true
		r.left++
		var e enc
		e.u32(uint32(rank))
		e.str(fmt.Sprintf("rank %d (pid %d on %s) lost: bootstrap connection ended (%v)", rank, me.info.PID, me.info.Hostname, err))
		e.u32(1) // abortKinds: ErrPeerLost
		r.broadcastLocked(msgAbort, e, rank)
	}
	r.checkAllLeftLocked()
}

func (r *root) checkAllLeftLocked() {
	if r.left < r.nranks {
		return
	}
	r.broadcastLocked(msgAllBye, nil, -1)
	ended := true
	for _, rr := range r.ranks {
		ended = ended && rr.ended
	}
	if ended {
		r.finishLocked()
	}
}

// close stops the root at once (tests, failed setup in this process).
func (r *root) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.finished {
		r.failLocked("root shut down")
	}
}

func rankList(rs []int) string {
	sort.Ints(rs)
	var b strings.Builder
	b.WriteByte('[')
	for i, v := range rs {
		if i > 0 {
			b.WriteByte(' ')
		}
		if i == 16 {
			fmt.Fprintf(&b, "... (%d in all)", len(rs))
			break
		}
		fmt.Fprint(&b, v)
	}
	b.WriteByte(']')
	return b.String()
}

// joinRoot connects to the root (retrying until the deadline: the root's
// process may start later), introduces this rank and waits for the table
// of all ranks.
// MaxRanks bounds a communicator's size: the root sizes its tables by the
// rank count a member announces, so the count must be bounded before it
// is believed (2^20 ranks: tables of a few MiB).
const MaxRanks = 1 << 20

func joinRoot(ctx context.Context, addr string, nonce uint64, rank, nranks int, timeout time.Duration) (*frameConn, []rankInfo, error) {
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var c net.Conn
	var lastErr error
	for wait := 20 * time.Millisecond; ; wait = min(wait*2, 500*time.Millisecond) {
		dctx, cancel := context.WithDeadline(ctx, deadline)
		var dl net.Dialer
		c, lastErr = dl.DialContext(dctx, "tcp", addr)
		cancel()
		if lastErr == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%w: rank %d: %w", ErrBootstrap, rank, ctx.Err())
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, nil, fmt.Errorf("%w: rank %d cannot reach the root at %s within %v: %v", ErrBootstrap, rank, addr, timeout, lastErr)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	fc := newFrameConn(c, bootLimit(nranks))
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	var e enc
	e.u32(bootMagic)
	e.u32(bootVer)
	e.u64(nonce)
	e.u32(uint32(nranks))
	e.u32(uint32(rank))
	e.str(hostIdentity())
	host, _ := os.Hostname()
	e.str(host)
	e.u32(uint32(os.Getpid()))
	e.u64(uint64(timeout.Milliseconds()))
	if err := fc.write(msgHello, e); err != nil {
		fc.close()
		return nil, nil, fmt.Errorf("%w: rank %d: hello to root %s: %v", ErrBootstrap, rank, addr, err)
	}
	c.SetReadDeadline(deadline.Add(time.Second)) // the root reports its own timeout first
	typ, p, err := fc.read()
	if err != nil {
		fc.close()
		if ctx.Err() != nil {
			return nil, nil, fmt.Errorf("%w: rank %d: %w", ErrBootstrap, rank, ctx.Err())
		}
		return nil, nil, fmt.Errorf("%w: rank %d: waiting for all ranks at root %s: %v", ErrBootstrap, rank, addr, err)
	}
	if typ == msgError {
		fc.close()
		return nil, nil, fmt.Errorf("%w: rank %d: root %s: %s", ErrBootstrap, rank, addr, p)
	}
	d := dec{b: p}
	if typ != msgInfo || int(d.u32()) != nranks {
		fc.close()
		return nil, nil, fmt.Errorf("%w: rank %d: unexpected answer from root %s", ErrBootstrap, rank, addr)
	}
	infos := make([]rankInfo, nranks)
	for i := range infos {
		infos[i] = rankInfo{IP: d.str(), Host: d.str(), Hostname: d.str(), PID: int(d.u32())}
	}
	if d.err != nil {
		fc.close()
		return nil, nil, fmt.Errorf("%w: rank %d: malformed rank table from root", ErrBootstrap, rank)
	}
	c.SetReadDeadline(time.Time{})
	return fc, infos, nil
}

// exchange runs one setup round: blobs[i] goes to rank i; the result holds
// what every rank addressed to this one. It is synchronous: the watcher
// goroutine is not running yet.
func exchange(ctx context.Context, fc *frameConn, round int, blobs [][]byte, deadline time.Time) ([][]byte, error) {
	var e enc
	e.u32(uint32(round))
	e.u32(uint32(len(blobs)))
	for _, b := range blobs {
		e.bytes(b)
	}
	if err := fc.write(msgXchg, e); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { fc.c.SetReadDeadline(time.Now()) })
	defer stop()
	fc.c.SetReadDeadline(deadline.Add(time.Second))
	defer fc.c.SetReadDeadline(time.Time{})
	for {
		typ, p, err := fc.read()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("setup step %d: %v", round, err)
		}
		d := dec{b: p}
		switch typ {
		case msgError:
			return nil, errors.New(string(p))
		case msgAbort:
			rk := d.u32()
			return nil, fmt.Errorf("rank %d failed: %s", rk, d.str())
		case msgXchgR:
			if int(d.u32()) != round || int(d.u32()) != len(blobs) {
				return nil, errFrame
			}
			d.b = bytes.Clone(d.b) // the blobs outlive the read buffer
			out := make([][]byte, len(blobs))
			for i := range out {
				out[i] = d.bytes()
			}
			if d.err != nil {
				return nil, d.err
			}
			return out, nil
		}
	}
}
