package roce

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

func TestBusyPollFromEnv(t *testing.T) {
	for _, c := range []struct {
		env  string
		want time.Duration
	}{
		{"", DefaultBusyPoll},
		{"0", 0},
		{"0s", 0},
		{"20us", 20 * time.Microsecond},
		{"1ms", time.Millisecond},
		{"1s", time.Second},
	} {
		t.Setenv(EnvBusyPoll, c.env)
		if got, err := busyPollFromEnv(); got != c.want || err != nil {
			t.Errorf("%s=%q: %v, %v; want %v", EnvBusyPoll, c.env, got, err, c.want)
		}
	}
	// Refused, and the device does not open: a typo is not the default.
	for _, env := range []string{"5s", "-1us", "fast", "50"} {
		t.Setenv(EnvBusyPoll, env)
		if got, err := busyPollFromEnv(); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("%s=%q: %v, %v; want ErrInvalidArgument", EnvBusyPoll, env, got, err)
		}
		if _, err := newEndpoint(netip.MustParseAddrPort("127.0.0.1:0"), verbs.MTU1024); !errors.Is(err, verbs.ErrInvalidArgument) {
			t.Errorf("%s=%q: endpoint opened (%v)", EnvBusyPoll, env, err)
		}
	}
}

// Writes land intact with the progress goroutine's busy polling off, on
// (the default) and long, the requester's side waiting on its CQ (no
// poller: the progress goroutines receive everything).
func TestBusyPollWrites(t *testing.T) {
	for _, bp := range []string{"0", "", "2ms"} {
		t.Run("busypoll="+bp, func(t *testing.T) {
			t.Setenv(EnvBusyPoll, bp)
			a, b := pair(t, 4<<20, verbs.MTU4096)
			want, _ := busyPollFromEnv()
			for _, s := range []*side{a, b} {
				if got := ctxOf(s.ctx).ep.busyPoll; got != want {
					t.Fatalf("endpoint busyPoll %v, want %v", got, want)
				}
			}
			fill(a.mr.Bytes(), 11)
			const msg = 64 << 10
			for i := 0; i < (4<<20)/msg; i++ {
				a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{a.mr.SGE(i*msg, msg)}, RemoteAddr: b.mr.Addr() + uint64(i*msg), RKey: b.mr.RKey()})
			}
			a.wait(a.scq, (4<<20)/msg, 20*time.Second)
			sameBytes(t, "written", b.mr.Bytes(), a.mr.Bytes())
		})
	}
}

// A progress goroutine that spins gives up once goroutines polled CQs
// busyPolls times since the traffic started flowing (base), even when
// those polls came before this spin began (the progress goroutine spins
// again after every batch it receives): here with an hour of busy
// polling and nothing arriving. (It used to count from the spin's start
// only, and so kept spinning beside pollers that received everything.)
func TestSpinYieldsToPollers(t *testing.T) {
	a, _ := pair(t, 1<<16, verbs.MTU1024)
	ep := ctxOf(a.ctx).ep
	old := maxSpinning.Swap(1 << 20) // not turned away by the progress goroutine's spin
	defer maxSpinning.Store(old)
	base := ep.polls.Load()
	for i := 0; i < busyPolls; i++ {
		ep.polls.Add(1)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ep.spin(base, time.Hour)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("spin went on with goroutines polling")
	}
}

// Datagrams that no QP takes (malformed here; bad ICRC or unknown QP
// alike) do not count as received: anyone who can reach the port could
// otherwise keep the progress goroutine busy polling with a datagram
// every busyPoll.
func TestJunkIsNotTraffic(t *testing.T) {
	ep, c := heldEndpoint(t)
	before := ep.stats.rxMalformed.Load()
	if _, err := c.Write([]byte("junk")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ep.stats.rxMalformed.Load() == before; {
		if time.Now().After(deadline) {
			t.Fatal("the junk datagram never arrived")
		}
		ep.step(ep.fd)
		if ep.didStep {
			t.Fatal("a step that received only junk reported traffic")
		}
	}
}

// A receive error that persists (here: the descriptor is no socket) does
// not keep the device stepping: steps gives up after maxRecvErrors
// failures in a row and marks the socket broken, which the progress
// goroutine then retries every idleWait instead of waiting on it (a socket
// in error is always readable).
func TestRecvErrorDoesNotSpin(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	ep := &endpoint{fd: int(r.Fd())}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ep.steps()
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		ep.closed.Store(true) // let the goroutine end
		<-done
		t.Fatal("steps kept stepping on a receive error that persists")
	}
	if !ep.recvBroken.Load() || ep.recvErrs != maxRecvErrors {
		t.Fatalf("after steps: broken %v, %d errors in a row; want true, %d", ep.recvBroken.Load(), ep.recvErrs, maxRecvErrors)
	}
}

// A receive batch of large datagrams (GRO runs of a bulk transfer) makes
// the next receive ask for only as many as rxBudget holds, so that a
// batch is still in the core's cache when step reads it; small datagrams
// bring back whole batches.
func TestReceiveBatchFitsBudget(t *testing.T) {
	for _, c := range []struct{ largest, want int }{
		{0, sys.MaxBatch}, {40, sys.MaxBatch}, {4 << 10, sys.MaxBatch}, {16 << 10, 32},
		{64 << 10, 8}, {1 << 20, 8},
	} {
		if got := rxSlotsFor(c.largest); got != c.want {
			t.Errorf("rxSlotsFor(%d) = %d, want %d", c.largest, got, c.want)
		}
	}
	ep, c := heldEndpoint(t)
	// Junk datagrams (every byte zero: no QP takes them) are received
	// like any; a loopback send has queued its datagram (or dropped it,
	// the socket full) when it returns.
	send := func(n, size int) {
		t.Helper()
		b := make([]byte, size)
		for range n {
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	seen := func() uint64 {
		s := &ep.stats
		return s.rxMalformed.Load() + s.rxUnknownQP.Load() + s.rxBadICRC.Load()
	}
	step := func() (asked, took int) {
		asked = ep.rxSlots
		if asked == 0 {
			asked = sys.MaxBatch
		}
		before := seen()
		ep.step(ep.fd)
		return asked, int(seen() - before)
	}
	const large = 60000
	send(1, large)
	if _, took := step(); took != 1 {
		t.Fatalf("a step took %d datagrams, want the 1 sent", took)
	}
	if want := rxBudget / large; ep.rxSlots != want {
		t.Fatalf("after a datagram of %d bytes the next receive asks for %d, want %d", large, ep.rxSlots, want)
	}
	send(12, large)
	if asked, took := step(); took > asked || asked != rxBudget/large {
		t.Fatalf("a step asked for %d datagrams and took %d", asked, took)
	}
	for {
		if _, took := step(); took == 0 {
			break
		}
	}
	// An empty receive changes nothing; one of small datagrams brings
	// back whole batches.
	if ep.rxSlots != rxBudget/large {
		t.Fatalf("after an empty receive the next asks for %d datagrams, want still %d", ep.rxSlots, rxBudget/large)
	}
	send(4, 64)
	if _, took := step(); took != 4 {
		t.Fatalf("a step took %d of 4 small datagrams", took)
	}
	if ep.rxSlots != sys.MaxBatch {
		t.Fatalf("after small datagrams the next receive asks for %d, want %d", ep.rxSlots, sys.MaxBatch)
	}
}

// heldEndpoint returns the endpoint of a QP pair's first side with its
// stepMu held until the test ends (the progress goroutine and pollers
// stay off: the test steps it), and a UDP socket connected to it.
func heldEndpoint(t *testing.T) (*endpoint, net.Conn) {
	t.Helper()
	a, _ := pair(t, 1<<16, verbs.MTU1024)
	ep := ctxOf(a.ctx).ep
	ep.stepMu.Lock()
	t.Cleanup(ep.stepMu.Unlock)
	c, err := net.Dial("udp", ep.local.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return ep, c
}
