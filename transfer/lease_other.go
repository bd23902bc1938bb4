//go:build !linux

package transfer

import (
	"errors"
	"os"
)

const canLease = false

func leaseFile(*os.File, bool) error { return errors.ErrUnsupported }
func leaseBroken(*os.File) bool      { return false }
func unleaseFile(*os.File)           {}

func (n *Node) watchLeases() {}
