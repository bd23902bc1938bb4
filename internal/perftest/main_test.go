package perftest

import (
	"bytes"
	"context"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

// The test binary acts as `rdmakit perf` in the role "rdmakit" (a server
// for the loopback and dead-server tests), as cmd/rdmakit does.
func init() { reexec.Register("rdmakit", childMain) }

func TestMain(m *testing.M) {
	reexec.Init()
	os.Exit(m.Run())
}

func childMain(args []string) int {
	if len(args) > 0 && args[0] == "perf" {
		args = args[1:]
	}
	o, err := ParseArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := Run(context.Background(), o, Env{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childCommand runs the test binary as `rdmakit perf ARGS`, marked with
// marker in its environment so that tests can look for leftovers.
func childCommand(marker string) func(args []string) *exec.Cmd {
	return func(args []string) *exec.Cmd {
		return reexec.Command("rdmakit", args, "RDMAKIT_PERFTEST_MARKER="+marker)
	}
}

// leftovers returns the PIDs of processes whose environment has marker.
func leftovers(marker string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' || e.Name() == fmt.Sprint(os.Getpid()) {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err == nil && bytes.Contains(b, []byte("RDMAKIT_PERFTEST_MARKER="+marker+"\x00")) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type pairResult struct {
	serverOut, clientOut string
	serverErr, clientErr error
}

// runPair runs a server and a client in this process over 127.0.0.1.
// args are ParseArgs arguments; the client gets the server's address.
func runPair(t *testing.T, serverArgs, clientArgs []string) pairResult {
	t.Helper()
	so, err := ParseArgs(serverArgs)
	if err != nil {
		t.Fatalf("server args %q: %v", serverArgs, err)
	}
	co, err := ParseArgs(clientArgs)
	if err != nil {
		t.Fatalf("client args %q: %v", clientArgs, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	co.Server = "127.0.0.1"
	co.Port = ln.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var sout, cout syncBuffer
	var r pairResult
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.serverErr = Run(ctx, so, Env{Stdout: &sout, Stderr: &sout, Listener: ln})
	}()
	r.clientErr = Run(ctx, co, Env{Stdout: &cout, Stderr: &cout})
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Errorf("server did not finish after the client")
	}
	r.serverOut, r.clientOut = sout.String(), cout.String()
	if ctx.Err() != nil {
		t.Fatalf("run timed out: client %v, server %v", r.clientErr, r.serverErr)
	}
	return r
}

// resultLines returns the report lines after the column header.
func resultLines(out string) []string {
	lines := strings.Split(out, "\n")
	var res []string
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, " #bytes"):
			in = true
		case strings.HasPrefix(l, "----"):
			in = false
		case in && strings.TrimSpace(l) != "" && !strings.HasPrefix(l, "#"):
			if l[0] == ' ' {
				res = append(res, l)
			}
		}
	}
	return res
}
