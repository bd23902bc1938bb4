package coll

import "github.com/rdmakit/rdmakit/internal/sys"

// osYield gives the CPU to another runnable thread (sched_yield), for
// ranks that outnumber the cores while they wait for each other.
func osYield() { sys.RawYield() }
