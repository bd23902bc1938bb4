package rcproto

// A simulated network between a Requester and a Responder, driven by
// scripts (testdata/*.txt) and by the fuzz target. The simulation owns
// both engines and carries out their actions the way a transport would:
// it transmits what Next hands out, executes what the responder says to
// execute (a counter stands for the target's atomic word), completes work
// requests and checks that each completes exactly once, in order.
//
// Goroutines: the test's only.

import (
	"fmt"
	"strings"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
)

var statusNames = map[rc.Status]string{
	rc.Success: "SUCCESS", rc.WRFlush: "WR_FLUSH", rc.BadResponse: "BAD_RESPONSE",
	rc.RemoteInvalidReq: "REMOTE_INVALID_REQ", rc.RemoteAccess: "REMOTE_ACCESS",
	rc.RemoteOperation: "REMOTE_OP", rc.RetryExceeded: "RETRY_EXCEEDED",
	rc.RNRRetryExceeded: "RNR_RETRY_EXCEEDED", rc.LocalProtection: "LOCAL_PROTECTION",
	rc.LocalLength: "LOCAL_LENGTH",
}

func stName(s rc.Status) string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status(%d)", s)
}

// faults are the network's plans for one direction.
type faults struct {
	drop    int  // drop the next drop packets sent
	dup     int  // duplicate the next dup packets sent
	reorder bool // swap the next two packets delivered
	lossy   bool // random faults by rng (fuzz)
}

type simWR struct {
	op     Opcode
	len    uint32
	bad    bool // the responder refuses it (REMOTE_ACCESS)
	fence  bool
	done   bool
	status rc.Status
}

type sim struct {
	req     *Requester
	resp    *Responder
	cfg     Config
	rcfg    RespConfig
	minRNR  uint8
	now     time.Duration
	timerAt time.Duration

	reqQ, respQ   []Packet
	reqF, respF   faults
	wrs           []simWR // by WR number - cfg.FirstWR
	nextDone      uint64  // WR number expected to complete next
	recvs         int     // receives posted at the responder
	word          uint64  // the target's atomic word
	atomExec      map[uint64]int
	reads         map[uint64]int // READ executions per WR
	errored       bool
	quiet         bool
	log           strings.Builder
	err           error // first invariant violation
	rng           uint64
	packetsMoved  int
	maxQueue      int
	partialRead   map[uint64]uint32
	readDataBytes map[uint64]uint32
}

func newSim(cfg Config, rcfg RespConfig, minRNR uint8) *sim {
	if cfg.MaxWR == 0 {
		cfg.MaxWR = 64
	}
	return &sim{
		req: NewRequester(cfg), resp: NewResponder(rcfg), cfg: cfg, rcfg: rcfg, minRNR: minRNR,
		nextDone: cfg.FirstWR, atomExec: map[uint64]int{}, reads: map[uint64]int{},
		readDataBytes: map[uint64]uint32{},
	}
}

func (s *sim) logf(format string, args ...any) {
	if !s.quiet {
		fmt.Fprintf(&s.log, format+"\n", args...)
	}
}

func (s *sim) fault(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf(format, args...)
	}
	s.logf("VIOLATION: "+format, args...)
}

// apply carries out requester actions.
func (s *sim) apply(acts []Action) {
	place := false
	for _, a := range acts {
		switch a.Kind {
		case ActComplete:
			i := a.WR - s.cfg.FirstWR
			if a.WR != s.nextDone || i >= uint64(len(s.wrs)) || s.wrs[i].done {
				s.fault("completion of wr %d, expected %d", a.WR, s.nextDone)
				continue
			}
			w := &s.wrs[i]
			w.done, w.status = true, a.Status
			s.nextDone++
			if a.Status == rc.Success && w.op == OpRead && s.readDataBytes[a.WR] != w.len {
				s.fault("READ wr %d completed with %d of %d bytes", a.WR, s.readDataBytes[a.WR], w.len)
			}
			if w.op.IsAtomic() && a.Status == rc.Success {
				s.logf("complete wr=%d %s value=%d", a.WR, stName(a.Status), a.Value)
			} else {
				s.logf("complete wr=%d %s", a.WR, stName(a.Status))
			}
		case ActError:
			s.errored = true
			from := s.nextDone
			for ; s.nextDone-s.cfg.FirstWR < uint64(len(s.wrs)); s.nextDone++ {
				w := &s.wrs[s.nextDone-s.cfg.FirstWR]
				w.done, w.status = true, rc.WRFlush
			}
			if from < s.nextDone {
				s.logf("error %s: flush wr=%d..%d", stName(a.Status), from, s.nextDone-1)
			} else {
				s.logf("error %s", stName(a.Status))
			}
		case ActTimer:
			s.timerAt = a.Deadline
			if a.Deadline == 0 {
				s.logf("timer off")
			} else {
				s.logf("timer +%v", a.Deadline-s.now)
			}
		case ActReadData:
			if a.Off != s.readDataBytes[a.WR] {
				s.fault("READ wr %d: data at offset %d after %d bytes", a.WR, a.Off, s.readDataBytes[a.WR])
			}
			s.readDataBytes[a.WR] += a.Len
			s.logf("read-data wr=%d off=%d len=%d", a.WR, a.Off, a.Len)
			place = true
		}
	}
	if place {
		// The batch is the engine's buffer: done with it before the next call.
		s.apply(s.req.Placed(s.now))
	}
}

func (s *sim) post(op Opcode, n uint32, bad bool, lerr rc.Status, fence bool) {
	s.wrs = append(s.wrs, simWR{op: op, len: n, bad: bad, fence: fence})
	if op.IsAtomic() {
		s.wrs[len(s.wrs)-1].len = 8
	}
	s.apply(s.req.Post(WR{Op: op, Len: n, Err: lerr, Fence: fence}, s.now))
}

// checkFence checks that a fenced WR goes out only once every READ and
// atomic posted before it has completed.
func (s *sim) checkFence(wr uint64) {
	i := wr - s.cfg.FirstWR
	if i >= uint64(len(s.wrs)) || !s.wrs[i].fence {
		return
	}
	for j := uint64(0); j < i; j++ {
		if w := &s.wrs[j]; w.op.isReadLike() && !w.done {
			s.fault("fenced wr %d transmitted while wr %d (%v) is outstanding", wr, j+s.cfg.FirstWR, w.op)
			return
		}
	}
}

// send puts a packet on the wire in one direction, under that
// direction's faults.
func (s *sim) send(q *[]Packet, f *faults, p Packet, dir string) {
	if f.drop > 0 || (f.lossy && s.rand(8) == 0) {
		if f.drop > 0 {
			f.drop--
		}
		s.logf("%s %v (dropped)", dir, &p)
		return
	}
	*q = append(*q, p)
	if f.dup > 0 || (f.lossy && s.rand(16) == 0) {
		if f.dup > 0 {
			f.dup--
		}
		*q = append(*q, p)
		s.logf("%s %v (duplicated)", dir, &p)
		return
	}
	s.logf("%s %v", dir, &p)
}

func (s *sim) rand(n uint64) uint64 {
	s.rng = s.rng*6364136223846793005 + 1442695040888963407
	return (s.rng >> 33) % n
}

// take removes the packet to deliver next from q.
func (s *sim) take(q *[]Packet, f *faults) Packet {
	if len(*q) >= 2 && (f.reorder || (f.lossy && s.rand(8) == 0)) {
		f.reorder = false
		(*q)[0], (*q)[1] = (*q)[1], (*q)[0]
		s.logf("(reordered)")
	}
	p := (*q)[0]
	*q = (*q)[1:]
	return p
}

// execute plays the owner of the responder for one request packet.
func (s *sim) execute(p *Packet) {
	v := s.resp.Step(p)
	if v == Drop {
		s.logf("  dropped by responder")
		return
	}
	var w *simWR
	if i := p.WR - s.cfg.FirstWR; i < uint64(len(s.wrs)) {
		w = &s.wrs[i]
	}
	res := Result{}
	switch {
	case w != nil && w.bad:
		res.Status = rc.RemoteAccess
	case p.Seg&SegFirst != 0 && (p.Op == OpSend || p.Op == OpSendImm || p.Op == OpWriteImm):
		if s.recvs == 0 {
			res.Status, res.RNRTimer = rc.RNR, s.minRNR
		} else {
			s.recvs--
		}
	case p.Op == OpRead:
		s.reads[p.WR]++
		res.Ref = p.WR
	case p.Op.IsAtomic():
		s.atomExec[p.WR]++
		if s.atomExec[p.WR] > 1 {
			s.fault("atomic wr %d executed %d times", p.WR, s.atomExec[p.WR])
		}
		res.Value = s.word
		s.word++
	}
	s.resp.Done(res)
}

// run moves packets until nothing moves.
func (s *sim) run() {
	for rounds := 0; rounds < 10000; rounds++ {
		moved := false
		var p Packet
		sent := false
		for s.req.Next(&p) {
			s.checkFence(p.WR)
			s.send(&s.reqQ, &s.reqF, p, "req ")
			moved, sent = true, true
			s.packetsMoved++
		}
		if sent {
			s.apply(s.req.Flushed(s.now))
		}
		for len(s.reqQ) > 0 {
			p := s.take(&s.reqQ, &s.reqF)
			s.logf("  -> %v", &p)
			s.execute(&p)
			moved = true
		}
		for s.resp.NextResponse(&p, true) {
			s.send(&s.respQ, &s.respF, p, "resp")
			moved = true
			s.packetsMoved++
		}
		for len(s.respQ) > 0 {
			p := s.take(&s.respQ, &s.respF)
			s.logf("  <- %v", &p)
			s.apply(s.req.Step(&p, s.now))
			moved = true
		}
		if !moved {
			return
		}
	}
	s.fault("network does not settle")
}

// advance moves time by d, firing the timer on the way.
func (s *sim) advance(d time.Duration) {
	end := s.now + d
	for s.timerAt != 0 && s.timerAt <= end && s.err == nil {
		s.now = s.timerAt
		s.logf("@%v tick", s.now)
		s.apply(s.req.Tick(s.now))
		s.run()
	}
	s.now = end
}

func (s *sim) state() string {
	r, q := s.req, s.resp
	return fmt.Sprintf("requester: head=%d tail=%d una=%d sent=%d rd_out=%d failed=%v\nresponder: epsn=%d rd_out=%d failed=%v\nrecvs=%d word=%d",
		r.head, r.tail, r.una, r.sent, r.rdOut, r.failed, q.epsn, q.rdOut, q.failed, s.recvs, s.word)
}
