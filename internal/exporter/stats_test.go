package exporter

import (
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStatsCollector(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, age time.Duration) {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		os.Chtimes(p, at, at)
	}
	write("node1-10.json", `{"version":1,"process":"node1-10","pid":10,"counters":[
		{"transport":"tcp","device":"tcp0","tx_bytes":4096,"rx_bytes":1,"operations":2,"retransmissions":3,"rnr":4,"errors":5},
		{"transport":"shm","device":"shm0","tx_bytes":7}]}`, 0)
	write("node1-11.json", `{"version":1,"process":"node1-11","counters":[{"transport":"tcp","device":"tcp0","tx_bytes":999}]}`, time.Hour)
	write("node1-12.json", `{"version":1,"process":"node1-12",`, 0)
	write("node1-13.json", `{"version":2,"process":"node1-13"}`, 0)
	write("notes.txt", `not a counter file`, 0)
	srv := httptest.NewServer(Handler(host("none"), dir))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, want := range []string{
		`rdmakit_transport_tx_bytes_total{device="tcp0",process="node1-10",transport="tcp"} 4096`,
		`rdmakit_transport_rx_bytes_total{device="tcp0",process="node1-10",transport="tcp"} 1`,
		`rdmakit_transport_operations_total{device="tcp0",process="node1-10",transport="tcp"} 2`,
		`rdmakit_transport_retransmissions_total{device="tcp0",process="node1-10",transport="tcp"} 3`,
		`rdmakit_transport_rnr_total{device="tcp0",process="node1-10",transport="tcp"} 4`,
		`rdmakit_transport_errors_total{device="tcp0",process="node1-10",transport="tcp"} 5`,
		`rdmakit_transport_tx_bytes_total{device="shm0",process="node1-10",transport="shm"} 7`,
		"rdmakit_stats_processes 1",
		"rdmakit_stats_read_errors 2",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, "node1-11") {
		t.Error("a stale file was exported")
	}
}
