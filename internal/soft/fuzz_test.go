package soft

// FuzzPostSend drives a queue pair of a loopback software transport with
// random work requests (opcodes, flags, scatter/gather lists, keys,
// addresses) and state changes. Whatever the input, nothing panics and no
// lock stays held: after each input the QP still moves through
// ERROR → RESET → INIT → RTR → RTS and a valid work request still posts
// and completes.
//
// Goroutines: the fuzz function's, and a watchdog that fails the input
// if it does not finish in time (a lock left held blocks it).

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// loopTransport completes every published send entry at once, with the
// status local validation preset (Success otherwise), on the caller's
// goroutine, as shm does.
type loopTransport struct{}

func (loopTransport) Name() string { return "fuzz" }
func (loopTransport) Devices() ([]DeviceInfo, error) {
	return []DeviceInfo{{Name: "fuzz0", Transport: "fuzz", AtomicCap: driver.AtomicHCA}}, nil
}
func (loopTransport) Open(dev DeviceInfo, opts driver.Options, ctx *Context) (ContextTransport, error) {
	return loopCtx{}, nil
}

type loopCtx struct{}

func (loopCtx) CanRegister() bool                 { return true }
func (loopCtx) NewQP(qp *QP) (QPTransport, error) { return &loopQP{qp: qp}, nil }
func (loopCtx) Close() error                      { return nil }

type loopQP struct {
	qp *QP
	// mu serialises execution, as a transport runs entries in order.
	mu      sync.Mutex
	running bool
}

func (l *loopQP) Address() []byte { return []byte{1} }
func (l *loopQP) Modify(from, to QPState, attr *QPAttr) error {
	l.mu.Lock()
	l.running = to == QPRTS
	l.mu.Unlock()
	return nil
}
func (l *loopQP) PostSend() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.running && l.qp.SendHead() < l.qp.SendTail() {
		e := l.qp.SendEntry(l.qp.SendHead())
		if !l.qp.CompleteSend(e.Status) {
			l.running = false
		}
	}
}
func (l *loopQP) PostRecv()      {}
func (l *loopQP) Destroy() error { return nil }

type fuzzEnv struct {
	ctx   driver.Context
	pd    driver.PD
	cq    driver.CQ
	qp    driver.QP
	mr    driver.MR
	other driver.MR // of another PD
	wcs   []WorkCompletion
	sgl   []SGE
}

const fuzzMR = 1 << 16

func newFuzzEnv(t testing.TB) *fuzzEnv {
	c, err := NewDriver(loopTransport{}).Open(DeviceInfo{Name: "fuzz0", Transport: "fuzz", AtomicCap: driver.AtomicHCA},
		driver.Options{ArenaSize: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	e := &fuzzEnv{ctx: c, wcs: make([]WorkCompletion, 256), sgl: make([]SGE, MaxSGE+2)}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	e.pd, err = c.AllocPD()
	must(err)
	pd2, err := c.AllocPD()
	must(err)
	e.cq, err = c.CreateCQ(4096)
	must(err)
	e.qp, err = e.pd.CreateQP(driver.QPConfig{SendCQ: e.cq, RecvCQ: e.cq,
		Cap: driver.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}})
	must(err)
	e.mr, err = e.pd.AllocMR(fuzzMR, driver.AccessAll)
	must(err)
	e.other, err = pd2.AllocMR(4096, driver.AccessAll)
	must(err)
	return e
}

// up moves the QP from any state to RTS; every step must succeed.
func (e *fuzzEnv) up() error {
	for _, s := range []QPAttr{{State: QPError}, {State: QPReset}, {State: QPInit, AccessFlags: driver.AccessAll, Port: 1},
		{State: QPRTR, DestQPN: 2, MinRNRTimer: 1}, {State: QPRTS, Timeout: 14, RetryCount: 7, RNRRetry: 7}} {
		if err := e.qp.Modify(&s); err != nil {
			return err
		}
	}
	return nil
}

func (e *fuzzEnv) drain() {
	for {
		n, err := e.cq.Poll(e.wcs)
		if n == 0 || err != nil {
			return
		}
	}
}

var fuzzStates = [...]QPState{QPReset, QPInit, QPRTR, QPRTS, QPError, QPState(9)}

// run interprets data: each step is an opcode byte and arguments.
func (e *fuzzEnv) run(data []byte) {
	at := 0
	next := func() byte {
		if at >= len(data) {
			return 0
		}
		at++
		return data[at-1]
	}
	next32 := func() uint32 {
		var b [4]byte
		for i := range b {
			b[i] = next()
		}
		return binary.LittleEndian.Uint32(b[:])
	}
	base := e.mr.(*MR)
	addr0 := uint64(sys.Addr(base.Bytes()))
	for steps := 0; at < len(data) && steps < 64; steps++ {
		switch op := next() % 8; op {
		case 0, 1, 2, 3, 4: // a work request
			wr := SendWR{ID: uint64(steps), Opcode: driver.Opcode(next() % 10), Flags: driver.SendFlags(next() & 0x1f)}
			n := int(next() % 7)
			wr.SGL = e.sgl[:n]
			for i := range wr.SGL {
				k := next()
				sg := &wr.SGL[i]
				switch k % 5 {
				case 0:
					sg.LKey = base.LKey()
				case 1:
					sg.LKey = base.RKey()
				case 2:
					sg.LKey = e.other.LKey()
				case 3:
					sg.LKey = next32()
				}
				off := uint64(next()) << (k >> 5 % 8 * 2)
				sg.Addr = addr0 + off - uint64(next()%4)*uint64(k&1)*8
				sg.Length = uint32(next()) << (next() % 24)
			}
			wr.RemoteAddr = uint64(next32())
			wr.RKey = next32()
			wr.CompareAdd, wr.Swap = uint64(next()), uint64(next())
			e.qp.PostSend([]SendWR{wr})
		case 5: // a state change, valid or not
			s := fuzzStates[next()%uint8(len(fuzzStates))]
			e.qp.Modify(&QPAttr{State: s, AccessFlags: driver.Access(next()), MinRNRTimer: next() % 40,
				Timeout: next() % 40, RetryCount: next() % 10, RNRRetry: next() % 10})
		case 6:
			e.drain()
		case 7: // a batch of two
			e.qp.PostSend([]SendWR{{ID: 1, Opcode: driver.OpWrite, SGL: []SGE{{Addr: addr0, Length: 8, LKey: base.LKey()}}},
				{ID: 2, Opcode: driver.Opcode(next() % 10), Flags: driver.SendInline, SGL: []SGE{{Addr: addr0 + uint64(next()), Length: uint32(next()), LKey: next32()}}}})
		}
		e.qp.State()
	}
	e.drain()
}

// check: after any input the QP still works.
func (e *fuzzEnv) check(t *testing.T) {
	if err := e.up(); err != nil {
		t.Fatalf("QP does not come back up: %v", err)
	}
	e.drain()
	base := e.mr.(*MR)
	wr := SendWR{ID: 77, Opcode: driver.OpWrite, Flags: driver.SendSignaled,
		SGL: []SGE{{Addr: uint64(sys.Addr(base.Bytes())), Length: 8, LKey: base.LKey()}}}
	if err := e.qp.PostSend([]SendWR{wr}); err != nil {
		t.Fatalf("valid post refused: %v", err)
	}
	n, err := e.cq.Poll(e.wcs[:1])
	if err != nil || n != 1 || e.wcs[0].WRID != 77 || e.wcs[0].Status != StatusSuccess {
		t.Fatalf("valid post: %d completions %+v, %v", n, e.wcs[0], err)
	}
}

var (
	fuzzOnce sync.Once
	fuzzE    *fuzzEnv
)

func FuzzPostSend(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 8, 0})
	f.Add([]byte{0, 4, 1, 1, 0, 0, 0, 0, 8, 3, 0, 0, 0, 0, 5, 4, 0, 6})
	f.Add([]byte{5, 2, 7, 0, 0, 0, 0, 0, 3, 2, 2, 0, 1, 2, 3, 4, 5})
	f.Add([]byte{7, 4, 200, 255, 1, 2, 3, 4, 0, 5, 0xff, 2, 3, 9, 9, 9, 9, 0, 0})
	f.Add([]byte{1, 6, 2, 1, 0, 1, 0, 8, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOnce.Do(func() { fuzzE = newFuzzEnv(t) })
		e := fuzzE
		done := make(chan struct{})
		watchdog := time.AfterFunc(10*time.Second, func() {
			select {
			case <-done:
			default:
				panic("soft: an input left a lock held (the QP stopped responding)")
			}
		})
		defer watchdog.Stop()
		if err := e.up(); err != nil {
			t.Fatal(err)
		}
		e.run(data)
		e.check(t)
		close(done)
	})
}
