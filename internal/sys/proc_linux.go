//go:build linux

package sys

import (
	"os/exec"
	"syscall"
)

// ChildDiesWithParent asks the kernel to SIGKILL cmd's process when the
// thread that started it exits (PR_SET_PDEATHSIG), so that a crashed or
// killed parent leaves no orphans. Call it before cmd.Start. It is best
// effort: on systems without such a mechanism it does nothing, and callers
// still kill their children on a normal exit.
func ChildDiesWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
