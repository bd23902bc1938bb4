package perftest

// Loopback mode: the server runs as a child process on this host and this
// process is the client. The parent opens the listening socket on a free
// loopback port and hands it to the child (no race for the port), then
// connects to it. The child is always reaped: it dies with the parent
// (PDEATHSIG), it is killed when the client fails or ctx ends, and it is
// waited for.
//
// Goroutines: the caller's runs the client; os/exec's goroutines copy the
// child's output into bounded buffers; one goroutine waits for the child.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/rdmakit/rdmakit/internal/reexec"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
)

// roceAddrEnv is transport/roce's RDMAKIT_ROCE_ADDR (where a roce
// context binds; ":0": the device's address, a port the system chooses).
const roceAddrEnv = "RDMAKIT_ROCE_ADDR"

// childGrace is how long the server child may take to exit after the
// client finished (it exits right after DONE).
const childGrace = 5 * time.Second

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.b))
}

// defaultServerCommand runs this program as `rdmakit perf ARGS` (the role
// "rdmakit" of internal/reexec, which cmd/rdmakit registers).
func defaultServerCommand(args []string) *exec.Cmd {
	return reexec.Command("rdmakit", append([]string{"perf"}, args...))
}

func runLoopback(ctx context.Context, o Options, env Env) error {
	if o.Device == "" {
		o.Device = "shm0"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("loopback: cannot listen on 127.0.0.1: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	lf, err := ln.(*net.TCPListener).File()
	ln.Close()
	if err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	mk := env.ServerCommand
	if mk == nil {
		mk = defaultServerCommand
	}
	cmd := mk(o.Args())
	stdout := &tailBuffer{max: 64 << 10}
	stderr := &tailBuffer{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.ExtraFiles = []*os.File{lf}
	cmd.Env = append(cmd.Environ(), fmt.Sprintf("%s=%d", ListenFDEnv, 3))
	if _, set := os.LookupEnv(roceAddrEnv); !set {
		// Both processes would bind the device's address at port 4791;
		// the server takes a port the system chooses (its QPs' addresses
		// carry it to the client).
		cmd.Env = append(cmd.Env, roceAddrEnv+"=:0")
	}
	sys.ChildDiesWithParent(cmd)
	sys.StartInNewProcessGroup(cmd)
	err = cmd.Start()
	lf.Close()
	if err != nil {
		return fmt.Errorf("loopback: starting the server: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	kill := func() {
		sys.KillProcessGroup(cmd.Process.Pid)
		cmd.Process.Kill()
	}

	c := o
	c.Loopback = false
	c.Server = "127.0.0.1"
	c.Port = port
	cerr := runClient(ctx, c, env)

	var werr error
	if cerr == nil {
		select {
		case werr = <-exited:
		case <-time.After(childGrace):
			kill()
			<-exited
			return fmt.Errorf("loopback: the server did not exit within %v after the test; killed it", childGrace)
		}
	} else {
		// Give the server a moment to report why (it got our ERR or saw us
		// hang up), then make sure it is gone.
		select {
		case werr = <-exited:
		case <-time.After(200 * time.Millisecond):
			kill()
			werr = <-exited
		}
	}
	if cerr != nil {
		var pe *PeerError
		if !errors.As(cerr, &pe) && ctx.Err() == nil {
			if msg := lastLine(stderr.String()); msg != "" && werr != nil && !strings.Contains(cerr.Error(), msg) {
				return fmt.Errorf("%w (server: %s)", cerr, msg)
			}
		}
		return cerr
	}
	if werr != nil {
		return fmt.Errorf("loopback: the server failed: %w: %s", werr, lastLine(stderr.String()))
	}
	return nil
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
