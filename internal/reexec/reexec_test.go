package reexec

import (
	"os"
	"strings"
	"testing"
)

func init() {
	Register("echo", func(args []string) int {
		os.Stdout.WriteString(strings.Join(args, ",") + "|" + os.Getenv("EXTRA") + "|" + os.Getenv(EnvRole))
		return 3
	})
}

func TestMain(m *testing.M) {
	Init()
	os.Exit(m.Run())
}

func TestCommand(t *testing.T) {
	out, err := Command("echo", []string{"a", "b c"}, "EXTRA=x").Output()
	if code := exitCode(err); code != 3 {
		t.Fatalf("exit %d (%v), want 3", code, err)
	}
	// The role's arguments arrive without the test binary's guard, its
	// environment with the extra variables, and the role is not inherited.
	if string(out) != "a,b c|x|" {
		t.Fatalf("child printed %q", out)
	}
}

func TestUnknownRole(t *testing.T) {
	out, err := Command("nobody", nil).CombinedOutput()
	if code := exitCode(err); code != 2 || !strings.Contains(string(out), `no role "nobody"`) || !strings.Contains(string(out), "echo") {
		t.Fatalf("exit %d: %s", code, out)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(interface{ ExitCode() int }); ok {
		return e.ExitCode()
	}
	return -1
}
