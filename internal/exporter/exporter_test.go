package exporter

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func host(name string) string { return filepath.Join("..", "rdmafs", "testdata", "hosts", name) }

func TestCollectorMLX5(t *testing.T) {
	c := NewCollector(host("mlx5-healthy"))
	want := `
# HELP rdma_hw_np_cnp_sent_total Driver counter np_cnp_sent (sysfs ports/N/hw_counters).
# TYPE rdma_hw_np_cnp_sent_total counter
rdma_hw_np_cnp_sent_total{device="mlx5_0",port="1"} 17
# HELP rdma_hw_rp_cnp_handled_total Driver counter rp_cnp_handled (sysfs ports/N/hw_counters).
# TYPE rdma_hw_rp_cnp_handled_total counter
rdma_hw_rp_cnp_handled_total{device="mlx5_0",port="1"} 5
# HELP rdma_port_xmit_data_total IBTA port counter port_xmit_data (sysfs ports/N/counters).
# TYPE rdma_port_xmit_data_total counter
rdma_port_xmit_data_total{device="mlx5_0",port="1"} 1.23456789e+08
# HELP rdma_port_state Port logical state as sysfs numbers it (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).
# TYPE rdma_port_state gauge
rdma_port_state{device="mlx5_0",port="1"} 4
# HELP rdma_port_rate_bits_per_second Port data rate (ports/N/rate).
# TYPE rdma_port_rate_bits_per_second gauge
rdma_port_rate_bits_per_second{device="mlx5_0",port="1"} 1e+11
# HELP rdma_port_info Port description; the value is 1.
# TYPE rdma_port_info gauge
rdma_port_info{device="mlx5_0",link_layer="Ethernet",netdev="eth0",phys_state="LinkUp",port="1",rate="100 Gb/sec (2X HDR)",state="ACTIVE"} 1
# HELP rdma_device_info RDMA device description; the value is 1.
# TYPE rdma_device_info gauge
rdma_device_info{device="mlx5_0",driver="mlx5_ib",fw_ver="28.39.1002",node_type="CA",numa_node="1",parent=""} 1
# HELP rdma_device_hw_num_system_events_total Device-wide driver counter num_system_events (sysfs DEV/hw_counters).
# TYPE rdma_device_hw_num_system_events_total counter
rdma_device_hw_num_system_events_total{device="mlx5_0"} 2
# HELP rdma_exporter_read_errors Counter files that could not be read or parsed in this scrape.
# TYPE rdma_exporter_read_errors gauge
rdma_exporter_read_errors 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"rdma_hw_np_cnp_sent_total", "rdma_hw_rp_cnp_handled_total", "rdma_port_xmit_data_total",
		"rdma_port_state", "rdma_port_rate_bits_per_second", "rdma_port_info", "rdma_device_info",
		"rdma_exporter_read_errors", "rdma_device_hw_num_system_events_total"); err != nil {
		t.Error(err)
	}
	// 8 port counters + 9 hw counters (lifespan is not one) + 4 port
	// gauges + device info + 1 device counter + read errors.
	if n := testutil.CollectAndCount(c); n != 8+9+4+1+1+1 {
		t.Errorf("%d metrics", n)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric == "rdma_port_rate_bits_per_second" {
			continue // bits are what link rates are quoted in
		}
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestCollectorSoftwareAndNone(t *testing.T) {
	want := `
# HELP rdma_hw_duplicate_request_total Driver counter duplicate_request (sysfs ports/N/hw_counters).
# TYPE rdma_hw_duplicate_request_total counter
rdma_hw_duplicate_request_total{device="rxe0",port="1"} 2
# HELP rdma_device_info RDMA device description; the value is 1.
# TYPE rdma_device_info gauge
rdma_device_info{device="rxe0",driver="rdma_rxe",fw_ver="0.0.0",node_type="CA",numa_node="-1",parent="eth0"} 1
`
	if err := testutil.CollectAndCompare(NewCollector(host("rxe")), strings.NewReader(want),
		"rdma_hw_duplicate_request_total", "rdma_device_info"); err != nil {
		t.Error(err)
	}
	// siw has no hw_counters: port counters and gauges only.
	if n := testutil.CollectAndCount(NewCollector(host("siw")), "rdma_port_state", "rdma_hw_duplicate_request_total"); n != 1 {
		t.Errorf("siw: %d", n)
	}
	// A host without RDMA: only the read-error gauge.
	if n := testutil.CollectAndCount(NewCollector(host("none"))); n != 1 {
		t.Errorf("no RDMA: %d metrics", n)
	}
	if err := testutil.CollectAndCompare(NewCollector(host("port-down")), strings.NewReader(`
# HELP rdma_port_state Port logical state as sysfs numbers it (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).
# TYPE rdma_port_state gauge
rdma_port_state{device="mlx5_0",port="1"} 1
`), "rdma_port_state"); err != nil {
		t.Error(err)
	}
}

func TestMetricName(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"rdma_port_", "port_xmit_data"}:           "rdma_port_xmit_data_total",
		{"rdma_port_", "VL15_dropped"}:             "rdma_port_vl15_dropped_total",
		{"rdma_hw_", "rx-write-requests"}:          "rdma_hw_rx_write_requests_total",
		{"rdma_hw_", "port_rcv_data"}:              "rdma_hw_port_rcv_data_total",
		{"rdma_hw_", "np_ecn_marked_roce_packets"}: "rdma_hw_np_ecn_marked_roce_packets_total",
	} {
		if got := MetricName(in[0], in[1]); got != want {
			t.Errorf("MetricName(%q, %q) = %q, want %q", in[0], in[1], got, want)
		}
	}
}

func TestHTTPScrape(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, host("mlx5-healthy"), "") }()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, line := range []string{
		`rdma_hw_np_cnp_sent_total{device="mlx5_0",port="1"} 17`,
		`rdma_port_rcv_packets_total{device="mlx5_0",port="1"} 4343`,
		`# TYPE rdma_hw_out_of_sequence_total counter`,
	} {
		if !bytes.Contains(body, []byte(line)) {
			t.Errorf("no %q in\n%s", line, body)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

func TestMain_(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"-h"}, &out, &errb); rc != 0 || !strings.Contains(out.String(), "usage: rdmakit exporter") {
		t.Errorf("help: %d", rc)
	}
	if rc := run([]string{"--nope"}, &out, &errb); rc != 2 {
		t.Errorf("usage: %d", rc)
	}
	if rc := run([]string{"--listen", "256.0.0.1:1"}, &out, &errb); rc != 1 {
		t.Errorf("bad address: %d", rc)
	}
}
