package roce

// Rate control hooks of the requester (guarded by qpDriver.mu).

import "time"

type dcqcn struct{}

func (c *dcqcn) init(now time.Duration)               {}
func (c *dcqcn) allow(now time.Duration) bool         { return true }
func (c *dcqcn) sent(n int, now time.Duration)        {}
func (c *dcqcn) wait(now time.Duration) time.Duration { return 0 }
func (c *dcqcn) acked(now time.Duration)              {}
func (c *dcqcn) cnp(now time.Duration)                {}

// armPacer calls flush again after wait (rate-limited sending).
func (d *qpDriver) armPacer(wait time.Duration) {}
