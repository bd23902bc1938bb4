package tcp

import (
	"testing"
	"time"
)

// TestGoYield: only the transfer engine's busy polls (1 µs up to the
// passive spin's 20 µs) yield to goroutines first; coll's 1 ns and the
// default 50 µs keep sched_yield (their ranks and peers are processes).
func TestGoYield(t *testing.T) {
	for _, c := range []struct {
		busy time.Duration
		want bool
	}{
		{0, false}, {time.Nanosecond, false}, {time.Microsecond, true},
		{10 * time.Microsecond, true}, {unpolledSpin, false}, {50 * time.Microsecond, false},
	} {
		cd := &ctxDriver{busyPoll: c.busy}
		if got := cd.goYield(); got != c.want {
			t.Errorf("busy poll %v: goYield %v, want %v", c.busy, got, c.want)
		}
	}
	// yieldGo returns (alone, it yields the thread as well).
	done := make(chan struct{})
	go func() {
		for range 1000 {
			yieldGo()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("yieldGo did not return")
	}
}
