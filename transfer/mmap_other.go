//go:build !unix

package transfer

// Without mmap, file segments are served from a copy in the arena on
// every device (see RegisterFileSegment).

import (
	"errors"
	"os"
)

const canMap = false

func mapFile(*os.File, int, bool) ([]byte, error) { return nil, errors.New("no mmap") }

func unmapFile([]byte) {}
