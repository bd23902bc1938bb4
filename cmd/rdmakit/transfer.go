package main

// rdmakit transfer: the command line of internal/transferbench (bench and
// target of the transfer engine); it runs in main's goroutine.

import "github.com/rdmakit/rdmakit/internal/transferbench"

func init() { register("transfer", transferbench.Summary, transferbench.Main) }
