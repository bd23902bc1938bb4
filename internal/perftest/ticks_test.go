package perftest

import (
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
)

// Counter stamps become ns since the loop's epoch, in order, within the
// loop's duration; unwritten stamps (a loop that stopped early) stay 0.
func TestTicksToNs(t *testing.T) {
	if !sys.HasTicks {
		t.Skip("no invariant time-stamp counter here: the latency loops read the clock")
	}
	l := &latLoop{ticks: true, epoch: time.Now(), tposted: make([]int64, 4)}
	l.tick0 = sys.Ticks()
	for i := range 3 {
		time.Sleep(time.Millisecond)
		l.tposted[i] = sys.Ticks()
	}
	time.Sleep(time.Millisecond)
	if err := l.ticksToNs(); err != nil {
		t.Fatal(err)
	}
	end := l.now()
	prev := int64(0)
	for i, v := range l.tposted[:3] {
		if v <= prev || v > end {
			t.Fatalf("stamp %d: %d ns (previous %d, loop %d ns)", i, v, prev, end)
		}
		if d := time.Duration(v - prev); d < 900*time.Microsecond {
			t.Fatalf("stamps %d and %d only %v apart, slept 1 ms", i-1, i, d)
		}
		prev = v
	}
	if l.tposted[3] != 0 {
		t.Fatalf("unwritten stamp became %d", l.tposted[3])
	}
}
