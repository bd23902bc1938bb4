// Package exporter is rdmakit exporter: Prometheus metrics of every RDMA
// device on the host, read from sysfs at scrape time.
//
// For each port of each device (/sys/class/infiniband/DEV/ports/N):
//
//   - rdma_port_<name>_total: the IBTA port counters (counters/*), e.g.
//     rdma_port_xmit_data_total (in units of 4 bytes, as the kernel
//     counts), rdma_port_rcv_packets_total, rdma_port_symbol_error_total,
//     rdma_port_link_downed_total; a leading "port_" of the sysfs name is
//     dropped;
//   - rdma_hw_<name>_total: the driver's counters (hw_counters/*), e.g.
//     rdma_hw_rnr_nak_retry_err_total, rdma_hw_local_ack_timeout_err_total,
//     rdma_hw_out_of_sequence_total, rdma_hw_np_cnp_sent_total,
//     rdma_hw_rp_cnp_handled_total, rdma_hw_np_ecn_marked_roce_packets_total,
//     rdma_hw_duplicate_request_total;
//   - rdma_port_state and rdma_port_physical_state: the numeric states
//     (4 ACTIVE; 5 LinkUp), rdma_port_rate_bits_per_second, and
//     rdma_port_info (1, with state, phys_state, link_layer, rate and
//     netdev labels);
//
// all with device and port labels; rdma_device_hw_<name>_total, the
// device-wide driver counters some drivers have (DEV/hw_counters), with
// a device label; and rdma_device_info (1, with driver,
// node_type, fw_ver, parent and numa_node labels) per device, and
// rdma_exporter_read_errors, the files of the last scrape that could not
// be read. Names are the sysfs names in lower case with anything but
// [a-z0-9_] turned into '_'.
package exporter

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmakit/rdmakit/internal/rdmafs"
)

// Collector is a prometheus.Collector that reads the RDMA devices under
// a root at every Collect. It declares no descriptors (an "unchecked"
// collector), since the counters are whatever the drivers expose.
type Collector struct {
	fs rdmafs.FS
}

// NewCollector returns a collector of the devices under root ("" or "/":
// the running system).
func NewCollector(root string) *Collector { return &Collector{fs: rdmafs.FS{Root: root}} }

// Describe sends nothing: the collector is unchecked.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

var (
	portLabels  = []string{"device", "port"}
	descState   = prometheus.NewDesc("rdma_port_state", "Port logical state as sysfs numbers it (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER).", portLabels, nil)
	descPhys    = prometheus.NewDesc("rdma_port_physical_state", "Port physical state as sysfs numbers it (2 Polling, 3 Disabled, 5 LinkUp, ...).", portLabels, nil)
	descRate    = prometheus.NewDesc("rdma_port_rate_bits_per_second", "Port data rate (ports/N/rate).", portLabels, nil)
	descInfo    = prometheus.NewDesc("rdma_port_info", "Port description; the value is 1.", append(portLabels, "state", "phys_state", "link_layer", "rate", "netdev"), nil)
	descDevInfo = prometheus.NewDesc("rdma_device_info", "RDMA device description; the value is 1.", []string{"device", "driver", "node_type", "fw_ver", "parent", "numa_node"}, nil)
	descErrors  = prometheus.NewDesc("rdma_exporter_read_errors", "Counter files that could not be read or parsed in this scrape.", nil, nil)
)

var unsafeChars = regexp.MustCompile(`[^a-z0-9_]+`)

// MetricName returns the metric name of a sysfs counter: prefix plus the
// sanitized name plus _total. Port counters (prefix "rdma_port_") lose a
// leading "port_".
func MetricName(prefix, name string) string {
	n := unsafeChars.ReplaceAllString(strings.ToLower(name), "_")
	if prefix == "rdma_port_" {
		n = strings.TrimPrefix(n, "port_")
	}
	return prefix + strings.Trim(n, "_") + "_total"
}

// Collect reads every device and port and sends their metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	devs, err := c.fs.Devices()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descDevInfo, fmt.Errorf("listing RDMA devices: %w", err))
		return
	}
	errs := 0
	for _, d := range devs {
		ch <- prometheus.MustNewConstMetric(descDevInfo, prometheus.GaugeValue, 1,
			d.Name, d.Driver, d.NodeType, d.FWVer, d.Parent, strconv.Itoa(d.NUMANode))
		vals, bad, err := c.fs.DeviceCounters(d.Name)
		errs += bad
		if err != nil {
			errs++
		}
		for name, v := range vals {
			desc := prometheus.NewDesc(MetricName("rdma_device_hw_", name), fmt.Sprintf("Device-wide driver counter %s (sysfs DEV/hw_counters).", name), []string{"device"}, nil)
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), d.Name)
		}
		for _, p := range d.Ports {
			port := strconv.Itoa(p.Num)
			ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, float64(p.StateNum), d.Name, port)
			ch <- prometheus.MustNewConstMetric(descPhys, prometheus.GaugeValue, float64(p.PhysNum), d.Name, port)
			ch <- prometheus.MustNewConstMetric(descRate, prometheus.GaugeValue, p.RateBits, d.Name, port)
			ch <- prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1, d.Name, port,
				p.State, p.PhysState, p.LinkLayer, p.Rate, strings.Join(c.fs.Netdevs(d.Name, p.Num), ","))
			for _, k := range []struct{ dir, prefix, help string }{
				{"counters", "rdma_port_", "IBTA port counter %s (sysfs ports/N/counters)."},
				{"hw_counters", "rdma_hw_", "Driver counter %s (sysfs ports/N/hw_counters)."},
			} {
				vals, bad, err := c.fs.Counters(d.Name, p.Num, k.dir)
				errs += bad
				if err != nil {
					errs++
					continue
				}
				for name, v := range vals {
					desc := prometheus.NewDesc(MetricName(k.prefix, name), fmt.Sprintf(k.help, name), portLabels, nil)
					ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), d.Name, port)
				}
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(descErrors, prometheus.GaugeValue, float64(errs))
}
