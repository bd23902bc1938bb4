package shm

import (
	"fmt"
	"runtime"

	"github.com/rdmakit/rdmakit/verbs"
)

// checkSystem says whether this operating system has what the transport
// needs: a memfd arena, another process's descriptors through
// /proc/PID/fd, and pidfds to watch peers. Only Linux has all three.
func checkSystem() error {
	if runtime.GOOS == "linux" {
		return nil
	}
	return fmt.Errorf("shm: %w: the shared-memory transport needs Linux (memfd, /proc/PID/fd, pidfd), not %s",
		verbs.ErrNotSupported, runtime.GOOS)
}
