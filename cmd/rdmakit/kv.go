package main

// rdmakit kv: the command line of the KV store (internal/transferbench's
// kv.go); it runs in main's goroutine.

import "github.com/rdmakit/rdmakit/internal/transferbench"

func init() { register("kv", transferbench.KVSummary, transferbench.KVMain) }
