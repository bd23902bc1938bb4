//go:build ibverbs

package coll

// Built with -tags ibverbs, coll links transport/ibverbs: its devices
// (RDMA NICs, rxe, siw) become network devices that device selection
// prefers over tcp (see devices.go). Runs in the caller's goroutine.

import (
	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

// setGIDIndex makes an RDMA queue pair send from a given GID index.
func setGIDIndex(qp *verbs.QP, index int) error { return ibverbs.SetGIDIndex(qp, index) }
