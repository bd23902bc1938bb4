// Package soak is rdmakit's fault and soak suite: a coordinator (Run, in
// the test process) starts several peer processes (the "soak-peer" role of
// internal/reexec), connects them in a ring of directed edges (peer i's
// initiator QP → peer i+1's target QP), lets every initiator stream
// Writes of sequence-numbered, checksummed blocks, Reads that check them
// back and fetch-and-adds on a counter, and meanwhile kills, stops and
// restarts peers and (on tcp0) resets or drops the edges' connections
// through faultnet proxies. Every edge that breaks is torn down and
// verified, then connected again with fresh QPs; at the end every edge is
// verified and the peers that lived through the whole run must not have
// grown in goroutines, descriptors or heap.
//
// This file is the peer. Goroutines: the role's main goroutine reads
// commands (JSON lines) from stdin and answers each on stdout, in order;
// each connected initiator edge has one traffic goroutine (edge.run) that
// posts and polls its QP until told to stop or until its QP fails. The
// edge's state is guarded by edge.mu; the control goroutine only reads
// it under the lock or after the traffic goroutine has exited.
package soak

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"runtime"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
	"github.com/rdmakit/rdmakit/verbs"
)

// Role is the reexec role of a peer process.
const Role = "soak-peer"

func init() { reexec.Register(Role, peerMain) }

// Geometry of a target region: Slots blocks of BlockSize bytes, then an
// 8-byte counter for fetch-and-add.
const (
	Slots     = 64
	BlockSize = 4096
	Window    = 16 // work requests outstanding per edge at most
	regionLen = Slots*BlockSize + 8
)

// QP timing: a local ACK timeout of 4.096 µs × 2^17 ≈ 0.54 s, 7 retries:
// a stall shorter than a few seconds is survived, a dead peer is noticed.
const (
	qpTimeout = 17
	qpRetry   = 7
)

// Msg is a control message, both ways.
type Msg struct {
	Op    string `json:"op"`
	Edge  int    `json:"edge,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	Err   string `json:"err,omitempty"`

	// QP data (target, init, connect).
	QPN   uint32 `json:"qpn,omitempty"`
	Addr  []byte `json:"addr,omitempty"`
	PSN   uint32 `json:"psn,omitempty"`
	RKey  uint32 `json:"rkey,omitempty"`
	RAddr uint64 `json:"raddr,omitempty"`

	Failed bool     `json:"failed,omitempty"`
	Report *Report  `json:"report,omitempty"`
	Slots  []int    `json:"slots,omitempty"`
	Sums   []uint32 `json:"sums,omitempty"`
	Count  uint64   `json:"count,omitempty"`
	Stats  *Stats   `json:"stats,omitempty"`
}

// Report is what an initiator knows when its edge stops.
type Report struct {
	Posted     uint64            `json:"posted"`
	Completed  uint64            `json:"completed"`
	Errors     uint64            `json:"errors"`
	FirstError string            `json:"first_error,omitempty"`
	Writes     uint64            `json:"writes"`
	Reads      uint64            `json:"reads"`
	Atomics    uint64            `json:"atomics"`
	AtomicsOK  uint64            `json:"atomics_ok"`
	AtomicsBad uint64            `json:"atomics_failed"` // completed with an error: may or may not have executed
	Missing    uint64            `json:"missing"`        // posted, never completed
	Violations []string          `json:"violations,omitempty"`
	Expect     map[int]SlotState `json:"expect"` // slot → the last Write posted there, if it succeeded
}

// SlotState is a block the target must hold.
type SlotState struct {
	Seq uint64 `json:"seq"`
	Sum uint32 `json:"sum"`
}

// Stats are a process's resources.
type Stats struct {
	Goroutines int    `json:"goroutines"`
	FDs        int    `json:"fds"`
	HeapInuse  uint64 `json:"heap_inuse"`
}

type peer struct {
	ctx  *verbs.Context
	pd   *verbs.PD
	out  *edge           // this peer's initiator edge, nil if none
	in   map[int]*target // target edges by edge number
	name string
}

type target struct {
	cq *verbs.CQ
	qp *verbs.QP
	mr *verbs.MR
}

type edge struct {
	id    int
	epoch uint64
	cq    *verbs.CQ
	qp    *verbs.QP
	mr    *verbs.MR // Window read buffers of BlockSize, then Window write blocks, then Window atomic results
	rkey  uint32
	raddr uint64

	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	failed bool
	rep    Report
}

func peerMain(args []string) int {
	dev := "tcp0"
	if len(args) > 0 {
		dev = args[0]
	}
	opts := verbs.Options{ArenaSize: 1 << 30}
	if dev == "tcp0" {
		opts.ListenAddr = "127.0.0.1:0"
	}
	ctx, err := verbs.Open(dev, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak-peer:", err)
		return 1
	}
	pd, err := ctx.AllocPD()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak-peer:", err)
		return 1
	}
	p := &peer{ctx: ctx, pd: pd, in: map[int]*target{}, name: fmt.Sprintf("peer[%d]", os.Getpid())}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<24)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var m Msg
		if err := json.Unmarshal(in.Bytes(), &m); err != nil {
			fmt.Fprintln(os.Stderr, "soak-peer: bad command:", err)
			return 1
		}
		if m.Op == "exit" {
			break
		}
		r := p.handle(&m)
		r.Op = m.Op
		if err := enc.Encode(r); err != nil {
			return 1
		}
	}
	if p.out != nil {
		p.stopEdge()
	}
	for id := range p.in {
		p.dropTarget(id)
	}
	ctx.Close()
	return 0
}

func (p *peer) handle(m *Msg) (r Msg) {
	fail := func(err error) Msg { return Msg{Err: err.Error()} }
	switch m.Op {
	case "target":
		if _, ok := p.in[m.Edge]; ok {
			p.dropTarget(m.Edge)
		}
		cq, err := p.ctx.CreateCQ(64)
		if err != nil {
			return fail(err)
		}
		qp, err := p.pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			cq.Close()
			return fail(err)
		}
		mr, err := p.pd.AllocMR(regionLen, verbs.AccessAll)
		if err != nil {
			qp.Close()
			cq.Close()
			return fail(err)
		}
		t := &target{cq: cq, qp: qp, mr: mr}
		p.in[m.Edge] = t
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic}); err != nil {
			return fail(err)
		}
		return Msg{QPN: qp.Num(), Addr: qp.Address(), PSN: verbs.RandomPSN(), RKey: mr.RKey(), RAddr: mr.Addr()}
	case "init":
		if p.out != nil {
			p.stopEdge()
		}
		cq, err := p.ctx.CreateCQ(4 * Window)
		if err != nil {
			return fail(err)
		}
		qp, err := p.pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: Window, MaxRecvWR: 4}})
		if err != nil {
			cq.Close()
			return fail(err)
		}
		mr, err := p.pd.AllocMR(3*Window*BlockSize, verbs.AccessLocalWrite)
		if err != nil {
			qp.Close()
			cq.Close()
			return fail(err)
		}
		p.out = &edge{id: m.Edge, epoch: m.Epoch, cq: cq, qp: qp, mr: mr, stop: make(chan struct{}), done: make(chan struct{})}
		p.out.rep.Expect = map[int]SlotState{}
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit}); err != nil {
			return fail(err)
		}
		return Msg{QPN: qp.Num(), Addr: qp.Address(), PSN: verbs.RandomPSN()}
	case "connect":
		// m carries the remote side's data; m.Epoch the local PSN chosen before.
		var qp *verbs.QP
		if t, ok := p.in[m.Edge]; ok && (p.out == nil || p.out.id != m.Edge) {
			qp = t.qp
		} else if p.out != nil && p.out.id == m.Edge {
			qp = p.out.qp
		} else {
			return fail(fmt.Errorf("no edge %d", m.Edge))
		}
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: m.QPN, RQPSN: m.PSN, AH: verbs.AddressHandle{Dest: m.Addr}, MinRNRTimer: 1, MaxDestRdAtomic: 4}); err != nil {
			return fail(err)
		}
		if err := qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: uint32(m.Count), Timeout: qpTimeout, RetryCount: qpRetry, RNRRetry: 7, MaxRdAtomic: 4}); err != nil {
			return fail(err)
		}
		return Msg{}
	case "start":
		e := p.out
		if e == nil || e.id != m.Edge {
			return fail(fmt.Errorf("no initiator edge %d", m.Edge))
		}
		e.rkey, e.raddr = m.RKey, m.RAddr
		go e.run()
		return Msg{}
	case "status":
		e := p.out
		if e == nil || e.id != m.Edge {
			return Msg{Failed: true}
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		return Msg{Failed: e.failed}
	case "stop":
		if p.out == nil || p.out.id != m.Edge {
			return fail(fmt.Errorf("no initiator edge %d", m.Edge))
		}
		rep := p.stopEdge()
		return Msg{Report: &rep}
	case "hash":
		t, ok := p.in[m.Edge]
		if !ok {
			return fail(fmt.Errorf("no target edge %d", m.Edge))
		}
		b := t.mr.Bytes()
		r := Msg{Count: binary.LittleEndian.Uint64(b[Slots*BlockSize:])}
		for _, s := range m.Slots {
			r.Slots = append(r.Slots, s)
			r.Sums = append(r.Sums, crc32.ChecksumIEEE(b[s*BlockSize:(s+1)*BlockSize]))
		}
		return r
	case "corrupt":
		t, ok := p.in[m.Edge]
		if !ok {
			return fail(fmt.Errorf("no target edge %d", m.Edge))
		}
		for _, s := range m.Slots {
			t.mr.Bytes()[s*BlockSize+BlockSize/2] ^= 0x40
		}
		return Msg{}
	case "drop":
		p.dropTarget(m.Edge)
		return Msg{}
	case "stats":
		return Msg{Stats: measure()}
	}
	return fail(fmt.Errorf("unknown op %q", m.Op))
}

func (p *peer) dropTarget(id int) {
	t, ok := p.in[id]
	if !ok {
		return
	}
	delete(p.in, id)
	t.qp.Close()
	t.mr.Dereg()
	t.cq.Close()
}

// stopEdge stops the traffic goroutine (it drains what is outstanding,
// bounded), closes the edge's objects and returns its report.
func (p *peer) stopEdge() Report {
	e := p.out
	p.out = nil
	close(e.stop)
	select {
	case <-e.done:
	case <-time.After(30 * time.Second):
		// The goroutine is stuck in the verbs layer: report, leak it.
		e.mu.Lock()
		rep := e.rep
		e.mu.Unlock()
		rep.Violations = append(rep.Violations, "traffic goroutine did not stop within 30s")
		return rep
	}
	e.qp.Close()
	e.mr.Dereg()
	e.cq.Close()
	return e.rep
}

// block fills b with the block of seq on this edge epoch and returns its checksum.
func fillBlock(b []byte, epoch, seq uint64) uint32 {
	binary.LittleEndian.PutUint64(b[0:], seq)
	binary.LittleEndian.PutUint64(b[8:], epoch)
	x := epoch*0x9e3779b97f4a7c15 ^ seq*0xbf58476d1ce4e5b9 | 1
	for i := 16; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return crc32.ChecksumIEEE(b)
}

type pending struct {
	op   byte // 'w', 'r', 'a'
	slot int
	seq  uint64 // Write: its seq; Read: the seq expected at slot
	sum  uint32
	buf  int // buffer index
}

// run is the edge's traffic goroutine.
func (e *edge) run() {
	defer close(e.done)
	out := map[uint64]*pending{}
	lastPosted := map[int]uint64{} // slot → seq of the last Write posted there
	lastOK := map[int]SlotState{}  // slot → last Write there that completed successfully
	var nextID, seq uint64
	var atomicsOK uint64
	wcs := make([]verbs.WorkCompletion, Window)
	buf := e.mr.Bytes()
	stopping := false
	deadline := time.Time{}
	rep := &e.rep
	viol := func(f string, a ...any) {
		e.mu.Lock()
		rep.Violations = append(rep.Violations, fmt.Sprintf(f, a...))
		e.mu.Unlock()
	}
	bufFree := make([]bool, Window)
	for i := range bufFree {
		bufFree[i] = true
	}
	for {
		select {
		case <-e.stop:
			if !stopping {
				stopping = true
				deadline = time.Now().Add(20 * time.Second)
			}
		default:
		}
		e.mu.Lock()
		failed := e.failed
		e.mu.Unlock()
		// Post while there is room and nothing failed.
		for !stopping && !failed && len(out) < Window {
			b := -1
			for i, f := range bufFree {
				if f {
					b = i
					break
				}
			}
			if b < 0 {
				break
			}
			nextID++
			id := nextID
			var wr verbs.SendWR
			var pd *pending
			switch {
			case id%8 == 3 && seq > Slots:
				// Read back a slot whose last Write completed and whose next
				// Write cannot be posted before this Read completes.
				slot := int((seq - Slots/2) % Slots)
				st, ok := lastOK[slot]
				if !ok || lastPosted[slot] != st.Seq {
					nextID--
					goto write
				}
				pd = &pending{op: 'r', slot: slot, seq: st.Seq, sum: st.Sum, buf: b}
				wr = verbs.SendWR{ID: id, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{e.mr.SGE(b*BlockSize, BlockSize)}, RemoteAddr: e.raddr + uint64(slot*BlockSize), RKey: e.rkey}
			case id%8 == 6:
				pd = &pending{op: 'a', buf: b}
				wr = verbs.SendWR{ID: id, Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{e.mr.SGE((2*Window+b)*BlockSize, 8)}, RemoteAddr: e.raddr + Slots*BlockSize, RKey: e.rkey, CompareAdd: 1}
			default:
				goto write
			}
			goto post
		write:
			nextID++
			id = nextID
			seq++
			{
				slot := int(seq % Slots)
				off := (Window + b) * BlockSize
				sum := fillBlock(buf[off:off+BlockSize], e.epoch, seq)
				pd = &pending{op: 'w', slot: slot, seq: seq, sum: sum, buf: b}
				lastPosted[slot] = seq
				wr = verbs.SendWR{ID: id, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{e.mr.SGE(off, BlockSize)}, RemoteAddr: e.raddr + uint64(slot*BlockSize), RKey: e.rkey}
			}
		post:
			if err := e.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				// Refused at post (the QP went to ERROR): nothing was posted.
				if pd.op == 'w' {
					delete(lastPosted, pd.slot)
					if st, ok := lastOK[pd.slot]; ok {
						lastPosted[pd.slot] = st.Seq
					}
				}
				e.mu.Lock()
				e.failed = true
				if rep.FirstError == "" {
					rep.FirstError = "post: " + err.Error()
				}
				e.mu.Unlock()
				failed = true
				break
			}
			bufFree[b] = false
			out[id] = pd
			e.mu.Lock()
			rep.Posted++
			switch pd.op {
			case 'w':
				rep.Writes++
			case 'r':
				rep.Reads++
			case 'a':
				rep.Atomics++
			}
			e.mu.Unlock()
		}
		if (stopping || failed) && len(out) == 0 {
			break
		}
		if stopping && time.Now().After(deadline) {
			e.mu.Lock()
			rep.Missing = uint64(len(out))
			rep.Violations = append(rep.Violations, fmt.Sprintf("%d work requests never completed (20s after stop)", len(out)))
			e.mu.Unlock()
			break
		}
		wctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		n, err := e.cq.Wait(wctx, wcs)
		cancel()
		if err != nil && wctx.Err() == nil {
			viol("poll: %v", err)
			e.mu.Lock()
			e.failed = true
			e.mu.Unlock()
		}
		for _, wc := range wcs[:n] {
			pd, ok := out[wc.WRID]
			if !ok {
				viol("completion for work request %d that is not outstanding (duplicate or unknown), status %v", wc.WRID, wc.Status)
				continue
			}
			delete(out, wc.WRID)
			bufFree[pd.buf] = true
			e.mu.Lock()
			rep.Completed++
			if wc.Status != verbs.StatusSuccess {
				rep.Errors++
				if rep.FirstError == "" {
					rep.FirstError = wc.Status.String()
				}
				e.failed = true
				if pd.op == 'a' {
					rep.AtomicsBad++
				}
				e.mu.Unlock()
				continue
			}
			e.mu.Unlock()
			switch pd.op {
			case 'w':
				lastOK[pd.slot] = SlotState{Seq: pd.seq, Sum: pd.sum}
			case 'r':
				b := buf[pd.buf*BlockSize : (pd.buf+1)*BlockSize]
				if got := crc32.ChecksumIEEE(b); got != pd.sum {
					viol("read of slot %d: checksum %08x, want %08x (seq %d, got seq %d)", pd.slot, got, pd.sum, pd.seq, binary.LittleEndian.Uint64(b))
				}
			case 'a':
				off := (2*Window + pd.buf) * BlockSize
				old := binary.LittleEndian.Uint64(buf[off:])
				if old != atomicsOK {
					viol("fetch-and-add returned %d, want %d", old, atomicsOK)
				}
				atomicsOK++
			}
		}
	}
	e.mu.Lock()
	rep.AtomicsOK = atomicsOK
	for slot, st := range lastOK {
		if lastPosted[slot] == st.Seq {
			rep.Expect[slot] = st
		}
	}
	e.mu.Unlock()
}

func measure() *Stats {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	fds := -1
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		fds = len(ents)
	}
	return &Stats{Goroutines: runtime.NumGoroutine(), FDs: fds, HeapInuse: ms.HeapInuse}
}
