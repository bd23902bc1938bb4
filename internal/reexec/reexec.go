// Package reexec starts the running program again in a named role. Test
// binaries use it for their helper processes (conformance peers, rank
// processes, perf servers, a peer to kill) and the tools for their own
// children (rdmakit perf --loopback, coll-perf --ranks), so the rules live
// in one place: the role travels in the environment, a test binary's child
// is told to run no tests should it not know its role, and children die
// with their parent where the system allows.
//
// A program registers its roles (Register, from init or before Init) and
// calls Init first thing in main or TestMain; Command makes the child.
package reexec

import (
	"fmt"
	"github.com/rdmakit/rdmakit/internal/sys"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
)

// EnvRole carries the role to the child.
const EnvRole = "RDMAKIT_REEXEC_ROLE"

// noTests is passed to a test binary's child, ahead of the role's
// arguments, so that it runs no tests if it never reaches Init.
const noTests = "-test.run=^$"

var (
	// mu guards roles.
	mu    sync.Mutex
	roles = map[string]func(args []string) int{}
)

// Register names a role and the function that runs it: it gets the
// arguments Command was given and returns the exit status. It panics if
// the role is taken.
func Register(role string, main func(args []string) int) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := roles[role]; dup {
		panic("reexec: role " + role + " registered twice")
	}
	roles[role] = main
}

// Role returns the role this process was started in, or "".
func Role() string { return os.Getenv(EnvRole) }

// Init runs this process's role, if Command started it in one, and exits
// with the role's status; in any other process it returns at once. A role
// that is not registered is an error (exit status 2).
func Init() {
	role := Role()
	if role == "" {
		return
	}
	mu.Lock()
	main, ok := roles[role]
	var known []string
	for r := range roles {
		known = append(known, r)
	}
	mu.Unlock()
	if !ok {
		sort.Strings(known)
		fmt.Fprintf(os.Stderr, "reexec: this program has no role %q (roles: %s)\n", role, strings.Join(known, ", "))
		os.Exit(2)
	}
	args := os.Args[1:]
	if len(args) > 0 && args[0] == noTests {
		args = args[1:]
	}
	// The role's own children must not inherit it.
	os.Unsetenv(EnvRole)
	os.Exit(main(args))
}

// Executable returns the path of the running program.
func Executable() string {
	if exe, err := os.Executable(); err == nil {
		return exe
	}
	return os.Args[0]
}

// Command returns a command that runs this program in role with args,
// its environment this process's plus env. The child dies with this
// process where the system can arrange it (Linux: PR_SET_PDEATHSIG).
func Command(role string, args []string, env ...string) *exec.Cmd {
	if testing.Testing() {
		args = append([]string{noTests}, args...)
	}
	cmd := exec.Command(Executable(), args...)
	cmd.Env = append(append(os.Environ(), EnvRole+"="+role), env...)
	sys.ChildDiesWithParent(cmd)
	return cmd
}
