package main

import (
	"bufio"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/reexec"
)

func fixtureHost(name string) string {
	return filepath.Join("..", "..", "internal", "rdmafs", "testdata", "hosts", name)
}

func TestDoctor(t *testing.T) {
	out, errOut, code := rdmakit(t, "doctor", "--root", fixtureHost("mlx5-healthy"))
	if code != 0 || errOut != "" || !strings.Contains(out, "PASS  RoCE v2 GID index 3 (10.0.0.1) on mlx5_0/1") {
		t.Errorf("healthy host: exit %d, stderr %q\n%s", code, errOut, out)
	}
	out, _, code = rdmakit(t, "doctor", "--root", fixtureHost("no-rocev2"), "--json")
	if code != 1 || !strings.Contains(out, `"status": "FAIL"`) {
		t.Errorf("no RoCE v2 GID: exit %d\n%s", code, out)
	}
	// This host, whatever it has: a full report, exit 0 or 1.
	out, _, code = rdmakit(t, "doctor")
	if (code != 0 && code != 1) || !strings.Contains(out, "passed,") || !strings.Contains(out, "memlock limit") {
		t.Errorf("live: exit %d\n%s", code, out)
	}
	if _, _, code = rdmakit(t, "doctor", "extra"); code != 2 {
		t.Errorf("doctor extra: exit %d", code)
	}
}

func TestExporterSignal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server process")
	}
	cmd := reexec.Command("rdmakit", []string{"exporter", "--listen", "127.0.0.1:0", "--root", fixtureHost("rxe")})
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "serving http://") {
		t.Fatalf("first line %q: %v", line, err)
	}
	url := strings.TrimSpace(line[strings.Index(line, "http://"):])
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	c.CloseIdleConnections()
	if !strings.Contains(string(body), `rdma_hw_duplicate_request_total{device="rxe0",port="1"} 2`) {
		t.Errorf("scrape:\n%s", body)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("exporter ignored SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 143 {
		t.Errorf("exit %d after SIGTERM, want 143", code)
	}
}
