package coll

import "syscall"

// osYield gives the CPU to another runnable thread (sched_yield), for
// ranks that outnumber the cores while they wait for each other.
func osYield() { syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
