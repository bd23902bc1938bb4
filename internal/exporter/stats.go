package exporter

// The counters of rdmakit processes that opted in (internal/stats): the
// files they write to a directory, read at scrape time.

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmakit/rdmakit/internal/stats"
)

// StaleAfter is the age after which a process's file is left out (the
// process has ended or hangs; its counters stop being exported).
const StaleAfter = 2 * time.Minute

// maxStatsFile bounds what is read of one file.
const maxStatsFile = 1 << 20

// StatsCollector serves the files under Dir as rdmakit_transport_*_total
// with transport, device and process labels.
type StatsCollector struct {
	Dir string
	// Now is the clock (nil: time.Now); tests set it.
	Now func() time.Time
}

var (
	statsLabels = []string{"transport", "device", "process"}
	statsDescs  = []struct {
		desc *prometheus.Desc
		val  func(s *stats.Snapshot) uint64
	}{
		{prometheus.NewDesc("rdmakit_transport_tx_bytes_total", "Bytes of completed sends and WRITEs (rdmakit software transports, processes with RDMAKIT_STATS_DIR).", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.TxBytes }},
		{prometheus.NewDesc("rdmakit_transport_rx_bytes_total", "Bytes of completed receives and READs.", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.RxBytes }},
		{prometheus.NewDesc("rdmakit_transport_operations_total", "Completions polled.", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.Operations }},
		{prometheus.NewDesc("rdmakit_transport_retransmissions_total", "Go-back-N resumptions of transmission (after a NAK, RNR NAK or timeout).", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.Retransmissions }},
		{prometheus.NewDesc("rdmakit_transport_rnr_total", "RNR NAKs received (the peer had no receive posted).", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.RNR }},
		{prometheus.NewDesc("rdmakit_transport_errors_total", "Completions with an error status.", statsLabels, nil), func(s *stats.Snapshot) uint64 { return s.Errors }},
	}
	descStatsProcs = prometheus.NewDesc("rdmakit_stats_processes", "Processes whose counter files are fresh.", nil, nil)
	descStatsBad   = prometheus.NewDesc("rdmakit_stats_read_errors", "Counter files that could not be read or parsed in this scrape.", nil, nil)
)

// Describe sends nothing: the collector is unchecked.
func (c *StatsCollector) Describe(chan<- *prometheus.Desc) {}

// Collect reads every fresh file and sends its counters.
func (c *StatsCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*.json"))
	procs, bad := 0, 0
	seen := map[string]bool{}
	for _, path := range files {
		st, err := os.Stat(path)
		if err != nil || !st.Mode().IsRegular() || now().Sub(st.ModTime()) > StaleAfter {
			continue
		}
		f, err := readStats(path)
		if err != nil || f.Version != stats.FileVersion || f.Process == "" || seen[f.Process] {
			bad++
			continue
		}
		seen[f.Process] = true
		procs++
		dup := map[[2]string]bool{}
		for i := range f.Counters {
			s := &f.Counters[i]
			k := [2]string{s.Transport, s.Device}
			if dup[k] {
				continue
			}
			dup[k] = true
			for _, d := range statsDescs {
				ch <- prometheus.MustNewConstMetric(d.desc, prometheus.CounterValue, float64(d.val(s)), s.Transport, s.Device, f.Process)
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descStatsProcs, prometheus.GaugeValue, float64(procs))
	ch <- prometheus.MustNewConstMetric(descStatsBad, prometheus.GaugeValue, float64(bad))
}

func readStats(path string) (stats.File, error) {
	var f stats.File
	fd, err := os.Open(path)
	if err != nil {
		return f, err
	}
	defer fd.Close()
	b, err := io.ReadAll(io.LimitReader(fd, maxStatsFile+1))
	if err != nil {
		return f, err
	}
	if len(b) > maxStatsFile {
		return f, io.ErrShortBuffer
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	err = dec.Decode(&f)
	return f, err
}
