// Package cli holds the rules every rdmakit command line follows: exit
// statuses (0 success, 1 runtime failure, 2 usage error, 128+N for a run
// ended by signal N) and the signal handling that produces the last.
package cli

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"sync"
	"syscall"
)

// Exit statuses.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// Signals is a context canceled by the first SIGINT or SIGTERM, and the
// signal that canceled it.
type Signals struct {
	context.Context
	cancel context.CancelFunc
	ch     chan os.Signal
	mu     sync.Mutex
	sig    syscall.Signal
	done   chan struct{}
}

// NotifySignals returns a context canceled by SIGINT or SIGTERM; call Stop
// when done. Status gives the exit status for the signal received.
func NotifySignals(parent context.Context) *Signals {
	ctx, cancel := context.WithCancel(parent)
	s := &Signals{Context: ctx, cancel: cancel, ch: make(chan os.Signal, 1), done: make(chan struct{})}
	signal.Notify(s.ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-s.ch:
			s.mu.Lock()
			if ss, ok := sig.(syscall.Signal); ok {
				s.sig = ss
			}
			s.mu.Unlock()
			cancel()
		case <-s.done:
		}
	}()
	return s
}

// Stop stops delivering signals to s (a later signal has its default
// effect) and releases the context.
func (s *Signals) Stop() {
	signal.Stop(s.ch)
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.cancel()
}

// Signal returns the signal received, or 0.
func (s *Signals) Signal() syscall.Signal {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sig
}

// Status returns 128 + the signal received (130 for SIGINT, 143 for
// SIGTERM), or 0 if none was.
func (s *Signals) Status() int {
	if sig := s.Signal(); sig != 0 {
		return SignalStatus(sig)
	}
	return 0
}

// SignalStatus is the shell's exit status for a process ended by sig.
func SignalStatus(sig syscall.Signal) int { return 128 + int(sig) }

// Version returns the version line of rdmakit: the module version (or
// "devel"), the VCS revision when the build recorded one, the Go release
// and the platform.
func Version() string {
	return "rdmakit " + VersionToken() + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// VersionToken is the version without spaces: v1.2.3, devel, or
// devel+0123456789ab(-dirty).
func VersionToken() string {
	v, rev, dirty := "devel", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += "+" + rev
		if dirty {
			v += "-dirty"
		}
	}
	return v
}
