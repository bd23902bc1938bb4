package rcproto

// FuzzEngines drives a requester and a responder through random event
// sequences over the simulated network (sim_test.go) and checks the
// invariants: no panic; every posted work request completes exactly once
// and in order (sim.apply checks each completion); every atomic executes
// at most once at the responder; once the network heals and receives are
// posted, everything completes within bounded time; without an error
// every status is success.
//
// Goroutines: the test's only.

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/rc"
)

func FuzzEngines(f *testing.F) {
	f.Add([]byte{0, 10, 3, 2, 0, 0, 0, 1, 1, 2, 5, 5})
	f.Add([]byte{1, 12, 0x73, 0x12, 5, 1, 0, 9, 1, 20, 6, 2, 40, 7, 5, 13, 13, 13})
	f.Add([]byte{2, 8, 0x7f, 0x22, 200, 0x80 | 7, 2, 3, 3, 4, 0, 7, 1, 99, 8, 5, 12, 12, 4, 5, 13})
	f.Add([]byte{5, 9, 0x21, 0x31, 1, 0, 2, 1, 2, 2, 2, 3, 10, 11, 5, 6, 7, 5, 13, 13, 4, 5})
	f.Add([]byte{1, 5, 0x07, 0x05, 9, 0x90, 0, 254, 1, 30, 5, 2, 255, 5, 13})
	f.Add([]byte{0, 10, 0x3b, 0x11, 3, 0x41, 0, 4, 1, 5, 2, 6, 3, 20, 5, 4, 1, 5, 12, 9, 5, 13, 14, 0xee, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := fuzzSim(data)
		if s.err != nil {
			t.Fatalf("%v\n%s", s.err, s.log.String())
		}
	})
}

var fuzzOps = [...]Opcode{OpWrite, OpWriteImm, OpSend, OpSendImm, OpRead, OpCmpSwap, OpFetchAdd}

func fuzzSim(data []byte) *sim {
	at := 0
	next := func() byte {
		if at < len(data) {
			at++
			return data[at-1]
		}
		return 0
	}
	b0, b1, b2, b3, b4, b5 := next(), next(), next(), next(), next(), next()
	cfg := Config{
		MaxWR:      16,
		MTU:        [...]uint32{0, 64, 256}[b0%3],
		Window:     [...]int{0, 0, 2, 5}[(b0/3)%4],
		Timeout:    1 + b1%12,
		RetryCount: (b1 / 12) % 8,
		RNRRetry:   b2 % 8,
		FirstPSN:   PSN(PSNMask - uint32(b4)),
	}
	minRNR := (b2 / 8) % 32
	cfg.MaxRdAtomic = int(b3 % 5)
	rcfg := RespConfig{MTU: cfg.MTU, FirstPSN: cfg.FirstPSN}
	if d := int(b3/5) % 4; d != 0 {
		rcfg.MaxDestRdAtomic = d + cfg.MaxRdAtomic - 1 // 0: can fall short of max_rd
	}
	s := newSim(cfg, rcfg, minRNR)
	s.quiet = true
	s.rng = uint64(b5) + 1
	// A reliable stream loses, duplicates and reorders nothing: faults
	// are ignored then.
	reliable := b5&0xc0 == 0x40
	if reliable {
		s.cfg.Reliable = true
		s.req = NewRequester(s.cfg)
	} else if b5&0x80 != 0 {
		s.reqF.lossy, s.respF.lossy = true, true
	}
	s.apply(s.req.Connected(s.now))
	for at < len(data) && s.err == nil {
		switch op := next() % 16; op {
		case 0, 1, 2, 3:
			x := next()
			if s.req.Outstanding() >= cfg.MaxWR {
				break
			}
			kind := fuzzOps[x%7]
			n := uint32(x/7) * 37 % 700
			lerr := rc.Success
			if x == 254 {
				lerr = rc.LocalProtection
			}
			s.post(kind, n, x == 255, lerr, x%11 == 3)
		case 4:
			s.recvs += int(next() % 4)
		case 5:
			s.run()
		case 6, 7, 8, 9, 10, 11:
			if !reliable {
				s.fault1(op)
			}
		case 12:
			s.advance(time.Duration(next()) * 10 * time.Microsecond)
		case 13:
			s.advance(TimeoutDuration(cfg.Timeout))
		case 14:
			if next() == 0xee {
				s.apply(s.req.PeerLost(s.now))
			}
		case 15:
			s.run()
		}
	}
	// Heal the network; everything must complete.
	s.reqF, s.respF = faults{}, faults{}
	s.recvs += 1 << 20
	for i := 0; i < 10000 && s.err == nil && s.nextDone-cfg.FirstWR < uint64(len(s.wrs)); i++ {
		s.run()
		s.advance(time.Second)
	}
	if s.err != nil {
		return s
	}
	if s.nextDone-cfg.FirstWR != uint64(len(s.wrs)) {
		s.fault("%d of %d work requests completed after healing", s.nextDone-cfg.FirstWR, len(s.wrs))
	}
	sum := 0
	for _, n := range s.atomExec {
		sum += n
	}
	if uint64(sum) != s.word {
		s.fault("word %d after %d atomic executions", s.word, sum)
	}
	if !s.errored {
		for i, w := range s.wrs {
			if w.status != 0 {
				s.fault("wr %d: status %s without an error", i, stName(w.status))
			}
		}
	}
	return s
}

// fault1 plans one network fault.
func (s *sim) fault1(op byte) {
	switch op {
	case 6:
		s.reqF.drop++
	case 7:
		s.respF.drop++
	case 8:
		s.reqF.dup++
	case 9:
		s.respF.dup++
	case 10:
		s.reqF.reorder = true
	case 11:
		s.respF.reorder = true
	}
}
