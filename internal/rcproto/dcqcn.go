package rcproto

// DCQCN: the rate control of a RoCEv2 sender (the reaction point), as
// the DCQCN paper (Zhu et al., "Congestion Control for Large-Scale RDMA
// Deployments", SIGCOMM 2015) defines it, with its parameters
// configurable. I/O-free like the engines: the owner tells it of CNPs,
// bytes sent and the time, and paces its packets at Rate.
//
// On a congestion notification packet (CNP): the target rate becomes the
// current rate, the current rate is cut by alpha/2, alpha moves towards 1
// by G, and the increase counters restart. Without CNPs, alpha decays
// by (1-G) every AlphaPeriod; every RateTimer and every ByteCounter bytes
// sent is an increase event: while both counts are below F the current
// rate recovers halfway to the target (fast recovery); once one of them
// reaches F the target grows by AI (additive increase), once both do by
// i×HAI (hyper increase, i the events beyond F), and the current rate
// moves halfway to the target. The rate never exceeds LineRate or goes
// below MinRate.
//
// Goroutines: none; the owner serialises calls.

import "time"

// DCQCNConfig are the DCQCN parameters; zero fields take the paper's
// values (DefaultDCQCN).
type DCQCNConfig struct {
	LineRate    float64       // bytes/s the sender may send at most (default 12.5e9: 100 Gb/s)
	MinRate     float64       // bytes/s floor (default 1e6)
	G           float64       // alpha gain (1/256)
	AlphaPeriod time.Duration // alpha decay period K (55 µs)
	RateTimer   time.Duration // rate increase timer T (55 µs)
	ByteCounter int64         // rate increase byte counter B (10 MiB)
	F           int           // fast recovery steps (5)
	AI          float64       // additive increase, bytes/s (40 Mb/s)
	HAI         float64       // hyper increase, bytes/s (100 Mb/s)
}

// DefaultDCQCN are the paper's parameters on a 100 Gb/s link.
var DefaultDCQCN = DCQCNConfig{
	LineRate: 12.5e9, MinRate: 1e6, G: 1.0 / 256, AlphaPeriod: 55 * time.Microsecond,
	RateTimer: 55 * time.Microsecond, ByteCounter: 10 << 20, F: 5, AI: 40e6 / 8, HAI: 100e6 / 8,
}

func (c DCQCNConfig) withDefaults() DCQCNConfig {
	d := DefaultDCQCN
	setPositive(&d.LineRate, c.LineRate)
	setPositive(&d.MinRate, c.MinRate)
	setPositive(&d.G, c.G)
	setPositive(&d.AlphaPeriod, c.AlphaPeriod)
	setPositive(&d.RateTimer, c.RateTimer)
	setPositive(&d.ByteCounter, c.ByteCounter)
	setPositive(&d.F, c.F)
	setPositive(&d.AI, c.AI)
	setPositive(&d.HAI, c.HAI)
	return d
}

// setPositive sets *dst to v when v is given (positive).
func setPositive[T int | int64 | float64 | time.Duration](dst *T, v T) {
	if v > 0 {
		*dst = v
	}
}

// DCQCNCounters count what the rate control saw and did.
type DCQCNCounters struct {
	CNPs      uint64 // CNPs handled
	Cuts      uint64 // rate cuts (one per CNP)
	Increases uint64 // rate increase events
}

// DCQCN is one sender's rate control state.
type DCQCN struct {
	cfg      DCQCNConfig
	rc, rt   float64 // current and target rate, bytes/s
	alpha    float64
	alphaAt  time.Duration // next alpha decay
	timerAt  time.Duration // next timer increase event
	bytes    int64         // bytes since the last byte-counter event
	t, bc    int           // increase events counted since the last cut
	limited  bool          // a CNP came: the rate is below line rate
	counters DCQCNCounters
}

// NewDCQCN starts at line rate.
func NewDCQCN(cfg DCQCNConfig, now time.Duration) *DCQCN {
	c := cfg.withDefaults()
	return &DCQCN{cfg: c, rc: c.LineRate, rt: c.LineRate, alpha: 1, alphaAt: now + c.AlphaPeriod, timerAt: now + c.RateTimer}
}

// Rate returns the current rate in bytes/s.
func (d *DCQCN) Rate() float64 { return d.rc }

// Alpha returns the congestion estimate.
func (d *DCQCN) Alpha() float64 { return d.alpha }

// Limited reports whether the rate is below line rate (pacing needed).
func (d *DCQCN) Limited() bool { return d.limited }

// Counters returns the counters.
func (d *DCQCN) Counters() DCQCNCounters { return d.counters }

// CNP handles a congestion notification at now.
func (d *DCQCN) CNP(now time.Duration) {
	d.Advance(now)
	d.counters.CNPs++
	d.counters.Cuts++
	d.rt = d.rc
	d.rc = max(d.rc*(1-d.alpha/2), d.cfg.MinRate)
	d.alpha = (1-d.cfg.G)*d.alpha + d.cfg.G
	d.alphaAt = now + d.cfg.AlphaPeriod
	d.timerAt = now + d.cfg.RateTimer
	d.bytes, d.t, d.bc = 0, 0, 0
	d.limited = true
}

// Sent counts n bytes sent at now (the byte counter).
func (d *DCQCN) Sent(n int, now time.Duration) {
	d.Advance(now)
	if !d.limited {
		return
	}
	d.bytes += int64(n)
	for d.bytes >= d.cfg.ByteCounter {
		d.bytes -= d.cfg.ByteCounter
		d.bc++
		d.increase()
	}
}

// Advance runs the timers up to now.
func (d *DCQCN) Advance(now time.Duration) {
	for d.alphaAt <= now {
		d.alpha *= 1 - d.cfg.G
		d.alphaAt += d.cfg.AlphaPeriod
		if now-d.alphaAt > 1024*d.cfg.AlphaPeriod {
			// Long idle: catch up without iterating forever.
			d.alphaAt = now
		}
	}
	for d.timerAt <= now {
		d.timerAt += d.cfg.RateTimer
		if d.limited {
			d.t++
			d.increase()
		}
		if now-d.timerAt > 1024*d.cfg.RateTimer {
			d.timerAt = now + d.cfg.RateTimer
			if d.limited {
				d.rc, d.rt, d.limited = d.cfg.LineRate, d.cfg.LineRate, false
			}
		}
	}
}

// increase is one rate increase event.
func (d *DCQCN) increase() {
	d.counters.Increases++
	f := d.cfg.F
	switch {
	case d.t >= f && d.bc >= f:
		d.rt += float64(min(d.t, d.bc)-f+1) * d.cfg.HAI
	case d.t >= f || d.bc >= f:
		d.rt += d.cfg.AI
	}
	d.rt = min(d.rt, d.cfg.LineRate)
	d.rc = min((d.rt+d.rc)/2, d.cfg.LineRate)
	if d.rc >= d.cfg.LineRate*0.999 {
		d.rc, d.rt, d.limited = d.cfg.LineRate, d.cfg.LineRate, false
	}
}
