package main

import (
	"bufio"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/exporter"
	"github.com/rdmakit/rdmakit/internal/reexec"
)

// rdmakit device-plugin without a kubelet: serves its socket, waits for
// the kubelet, and on SIGTERM removes the socket and exits 143.
func TestDevicePluginSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "c.json")
	os.WriteFile(cfg, []byte(`{"configList":[{"resourceName":"soft","rdmaHcaMax":4,"selectors":{"drivers":["rdma_rxe"]}}]}`), 0o644)
	cmd := reexec.Command("rdmakit", []string{"device-plugin", "--config", cfg, "--plugin-dir", dir, "--root", fixtureHost("cluster")})
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := bufio.NewReader(stderr)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stderr ended: %v", err)
		}
		if strings.Contains(line, "no kubelet socket") {
			break
		}
	}
	sock := filepath.Join(dir, "rdmakit-rdma_soft.sock")
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("no plugin socket: %v", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("device-plugin ignored SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 143 {
		t.Errorf("exit %d after SIGTERM, want 143", code)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("socket left behind")
	}
}

// The runtime runs a CNI plugin by its type name, without arguments.
func TestCNIAlias(t *testing.T) {
	if cmd, ok := alias("rdmakit-cni"); !ok || cmd[0] != "cni" {
		t.Errorf("alias: %v %v", cmd, ok)
	}
	if _, _, code := rdmakit(t, "cni"); code != 2 {
		t.Errorf("cni without CNI_COMMAND: exit %d", code)
	}
}

// A perf run that opts in (RDMAKIT_STATS_DIR) writes its tcp0 counters;
// the exporter serves them.
func TestStatsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs perf for 2 s")
	}
	dir := t.TempDir()
	cmd := reexec.Command("rdmakit", []string{"perf", "send_bw", "--loopback", "-D", "2", "-d", "tcp0"})
	cmd.Env = append(cmd.Environ(), "RDMAKIT_STATS_DIR="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("perf: %v\n%s", err, out)
	}
	rec := httptest.NewRecorder()
	exporter.Handler(fixtureHost("none"), dir).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	found := false
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `rdmakit_transport_tx_bytes_total{device="tcp0"`) && !strings.HasSuffix(line, " 0") {
			found = true
		}
	}
	if !found || !strings.Contains(body, "rdmakit_stats_processes 2") {
		t.Errorf("no tcp0 bytes from the perf processes:\n%s", body)
	}
}

// doctor --serve-peer and doctor --peer over tcp0 on loopback.
func TestDoctorPeer(t *testing.T) {
	if testing.Short() {
		t.Skip("runs perf for about 3 s")
	}
	port := "28615"
	srv := reexec.Command("rdmakit", []string{"doctor", "--serve-peer", "--dev", "tcp0", "--port", port})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	out, errOut, code := rdmakit(t, "doctor", "--root", fixtureHost("none"), "--peer", "127.0.0.1", "--port", port, "--dev", "tcp0")
	if code != 1 || !strings.Contains(out, "PASS  peer 127.0.0.1:"+port+" over tcp0: latency ") {
		t.Errorf("doctor --peer: exit %d\n%s%s", code, out, errOut)
	}
	srv.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("--serve-peer ignored SIGTERM")
	}
	if c := srv.ProcessState.ExitCode(); c != 143 {
		t.Errorf("--serve-peer exit %d after SIGTERM", c)
	}
	// Nobody there: a FAIL naming what to run on the peer.
	out, _, _ = rdmakit(t, "doctor", "--root", fixtureHost("none"), "--peer", "127.0.0.1:1", "--dev", "tcp0")
	if !strings.Contains(out, "FAIL  peer 127.0.0.1:1") || !strings.Contains(out, "--serve-peer") {
		t.Errorf("no peer:\n%s", out)
	}
	if _, _, code := rdmakit(t, "doctor", "--serve-peer", "--peer", "x"); code != 2 {
		t.Errorf("--serve-peer --peer: exit %d", code)
	}
}
