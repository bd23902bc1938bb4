package perftest

// Called by the run's goroutine from its spin loops (watch.go).

import "github.com/rdmakit/rdmakit/internal/sys"

// osYield gives the CPU to another runnable thread, if any (sched_yield).
// A spinning loop calls it now and then so that the threads it waits for
// (the peer process, or this process's transport goroutines) run promptly
// on a machine with fewer cores than spinners.
func osYield() { sys.Yield() }
