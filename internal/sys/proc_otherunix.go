//go:build unix && !linux

package sys

import "os/exec"

// ChildDiesWithParent would have cmd's process killed when this process
// exits. Only Linux has that (PR_SET_PDEATHSIG); here it does nothing, and
// callers still kill their children on a normal exit.
func ChildDiesWithParent(cmd *exec.Cmd) {}
