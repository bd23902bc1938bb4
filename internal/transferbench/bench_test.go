package transferbench

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestBenchOutOfTheBox(t *testing.T) {
	for _, args := range [][]string{
		{"--device", "shm0", "--op", "read"},
		{"--device", "tcp0", "--op", "write", "--block-size", "1048576", "--batch-size", "4", "--threads", "2"},
	} {
		var out, errb bytes.Buffer
		code := run(append([]string{"bench", "--duration", "200ms"}, args...), &out, &errb)
		if code != 0 || !strings.Contains(out.String(), "GB/s") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out.String(), errb.String())
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"bench", "--op", "copy"}, {"bench", "--threads", "0"}, {"bench", "--bogus"}, {"target"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"bench", "-h"}, {"target", "--help"}} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 || !strings.Contains(out.String(), "-block-size") {
			t.Errorf("%q: exit %d, stdout %q", args, code, out.String())
		}
	}
}
