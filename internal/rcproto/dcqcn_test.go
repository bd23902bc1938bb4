package rcproto

import (
	"testing"
	"time"
)

func TestDCQCNCutAndRecover(t *testing.T) {
	cfg := DCQCNConfig{LineRate: 1e9}
	d := NewDCQCN(cfg, 0)
	if d.Limited() || d.Rate() != 1e9 {
		t.Fatal("not at line rate")
	}
	now := time.Duration(0)
	d.CNP(now)
	// alpha starts at 1: the first cut halves the rate.
	if r := d.Rate(); r != 0.5e9 || !d.Limited() {
		t.Fatalf("after the first CNP: %g", r)
	}
	a := d.Alpha()
	d.CNP(now)
	if r := d.Rate(); r > 0.5e9*(1-a/2)+1 || r < 0.5e9*(1-a/2)-1 {
		t.Fatalf("after the second CNP: %g, want %g", r, 0.5e9*(1-a/2))
	}
	cut := d.Rate()
	// Fast recovery: the first F-1 timer events halve the distance to
	// the target (the rate before the cut) each.
	now += 4 * DefaultDCQCN.RateTimer
	d.Advance(now)
	target := 0.5e9
	want := target - (target-cut)/16
	if r := d.Rate(); r < want-1 || r > want+1 {
		t.Fatalf("after fast recovery: %g, want %g", r, want)
	}
	// Additive and hyper increase bring it back to line rate eventually.
	for i := 0; i < 100000 && d.Limited(); i++ {
		now += DefaultDCQCN.RateTimer
		d.Sent(1<<20, now)
	}
	if d.Limited() || d.Rate() != 1e9 {
		t.Fatalf("not recovered: %g", d.Rate())
	}
	c := d.Counters()
	if c.CNPs != 2 || c.Cuts != 2 || c.Increases == 0 {
		t.Fatalf("counters %+v", c)
	}
}

func TestDCQCNAlphaDecays(t *testing.T) {
	d := NewDCQCN(DCQCNConfig{}, 0)
	d.CNP(0)
	a := d.Alpha()
	d.Advance(100 * DefaultDCQCN.AlphaPeriod)
	if d.Alpha() >= a {
		t.Fatalf("alpha %g did not decay from %g", d.Alpha(), a)
	}
	// A CNP after a long quiet period cuts less than the first.
	r := d.Rate()
	d.CNP(100 * DefaultDCQCN.AlphaPeriod)
	if d.Rate() < r*(1-a/2) {
		t.Fatalf("cut to %g from %g with decayed alpha", d.Rate(), r)
	}
	if d.Rate() < DefaultDCQCN.MinRate {
		t.Fatal("below the floor")
	}
}
