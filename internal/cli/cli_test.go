package cli

import (
	"context"
	"os"
	"regexp"
	"syscall"
	"testing"
	"time"
)

func TestSignals(t *testing.T) {
	if SignalStatus(syscall.SIGINT) != 130 || SignalStatus(syscall.SIGTERM) != 143 {
		t.Fatal("128+N")
	}
	s := NotifySignals(context.Background())
	defer s.Stop()
	if s.Status() != 0 {
		t.Fatal("status before any signal")
	}
	p, _ := os.FindProcess(os.Getpid())
	p.Signal(syscall.SIGTERM)
	select {
	case <-s.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("SIGTERM did not cancel the context")
	}
	if s.Signal() != syscall.SIGTERM || s.Status() != 143 {
		t.Errorf("signal %v status %d", s.Signal(), s.Status())
	}
}

func TestVersion(t *testing.T) {
	if !regexp.MustCompile(`^rdmakit \S+ go\S+ \w+/\w+$`).MatchString(Version()) {
		t.Errorf("Version() = %q", Version())
	}
	if tok := VersionToken(); tok == "" || regexp.MustCompile(`\s`).MatchString(tok) {
		t.Errorf("VersionToken() = %q", tok)
	}
}
