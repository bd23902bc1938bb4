//go:build !ibverbs

package coll

import (
	"fmt"

	"github.com/rdmakit/rdmakit/verbs"
)

// setGIDIndex is unreachable without RDMA devices.
func setGIDIndex(*verbs.QP, int) error {
	return fmt.Errorf("%w: GID index without -tags ibverbs", ErrInvalidArgument)
}
