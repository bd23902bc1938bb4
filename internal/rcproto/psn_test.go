package rcproto

// Goroutines: the test's only.

import (
	"testing"
	"time"
)

func TestPSNArithmetic(t *testing.T) {
	for _, c := range []struct {
		p, q PSN
		d    int32
	}{
		{5, 3, 2}, {3, 5, -2}, {0, PSNMask, 1}, {PSNMask, 0, -1}, {1 << 22, 0, 1 << 22}, {0, 1 << 22, -(1 << 22)},
		{1<<23 - 1, 0, 1<<23 - 1}, {2, PSNMask - 1, 4},
	} {
		if got := c.p.Sub(c.q); got != c.d {
			t.Errorf("%#x - %#x = %d, want %d", c.p, c.q, got, c.d)
		}
		if c.q.Add(uint32(c.d)&PSNMask) != c.p {
			t.Errorf("%#x + %d != %#x", c.q, c.d, c.p)
		}
		if (c.d < 0) != c.p.Before(c.q) || (c.d > 0) != c.p.After(c.q) {
			t.Errorf("%#x vs %#x: Before/After disagree with %d", c.p, c.q, c.d)
		}
	}
	if !PSN(PSNMask).Before(0) || PSN(0).Before(PSNMask) {
		t.Error("Before does not wrap")
	}
	if PSN(PSNMask).Add(2) != 1 {
		t.Error("Add does not wrap")
	}
	if !PSN(1).InRange(PSNMask, 3) || PSN(3).InRange(PSNMask, 3) || PSN(PSNMask-1).InRange(PSNMask, 3) {
		t.Error("InRange does not wrap")
	}
}

func TestTimerTables(t *testing.T) {
	if TimeoutDuration(0) != 0 || TimeoutDuration(1) != 8192*time.Nanosecond || TimeoutDuration(14) != 67108864*time.Nanosecond {
		t.Error("TimeoutDuration")
	}
	if RNRDuration(0) != 655360*time.Microsecond || RNRDuration(1) != 10*time.Microsecond || RNRDuration(31) != 491520*time.Microsecond {
		t.Error("RNRDuration")
	}
	for used := 0; used < 100; used++ {
		if !rnrRetryAllowed(RNRInfinite, used) {
			t.Fatal("rnr_retry 7 is not infinite")
		}
	}
	if rnrRetryAllowed(0, 0) || !rnrRetryAllowed(3, 2) || rnrRetryAllowed(3, 3) {
		t.Error("rnrRetryAllowed")
	}
}

// The steady path allocates nothing: post, transmit, execute, respond,
// complete, for every operation.
func TestEnginesAllocs(t *testing.T) {
	for _, mtu := range []uint32{0, 1024} {
		req := NewRequester(Config{MaxWR: 64, Timeout: 14, RetryCount: 7, RNRRetry: 7, MTU: mtu})
		resp := NewResponder(RespConfig{MTU: mtu})
		req.Connected(1)
		now := time.Duration(1)
		var p, q Packet
		ops := []WR{{Op: OpWrite, Len: 4096}, {Op: OpRead, Len: 3000}, {Op: OpFetchAdd}, {Op: OpSend, Len: 8}}
		run := func() {
			for _, w := range ops {
				req.Post(w, now)
			}
			for req.Next(&p) {
				if resp.Step(&p) == Execute {
					resp.Done(Result{})
				}
			}
			req.Flushed(now)
			for resp.NextResponse(&q, true) {
				place := false
				for _, a := range req.Step(&q, now) {
					place = place || a.Kind == ActReadData
				}
				if place {
					req.Placed(now)
				}
			}
			now += time.Microsecond
			if req.Outstanding() != 0 {
				t.Fatalf("mtu %d: %d outstanding", mtu, req.Outstanding())
			}
		}
		run()
		if n := testing.AllocsPerRun(1000, run); n != 0 {
			t.Errorf("mtu %d: %.1f allocations per round", mtu, n)
		}
	}
}
