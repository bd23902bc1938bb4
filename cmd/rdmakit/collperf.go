package main

// rdmakit coll-perf: the command line of internal/collperf, which holds
// the benchmark; it runs in main's goroutine.

import "github.com/rdmakit/rdmakit/internal/collperf"

func init() { register("coll-perf", collperf.Summary, collperf.Main) }
