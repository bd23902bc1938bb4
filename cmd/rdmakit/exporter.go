package main

// rdmakit exporter: the command line of internal/exporter, which serves
// the RDMA devices' counters as Prometheus metrics.

import "github.com/rdmakit/rdmakit/internal/exporter"

func init() { register("exporter", exporter.Summary, exporter.Main) }
