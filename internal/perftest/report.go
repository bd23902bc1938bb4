package perftest

// Figures and their output, as perftest computes and prints them
// (print_report_bw, print_report_lat, ctx_print_test_info,
// ctx_print_pingpong_data; format strings from perftest_parameters.h and
// perftest_communication.h). Runs in the run's goroutine, after the timed
// loops.

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	"github.com/rdmakit/rdmakit/verbs"
)

// Output strings of perftest.
const (
	resultLine   = "---------------------------------------------------------------------------------------\n"
	resultFmtBW  = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n"
	resultFmtBWG = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
	resultFmtLat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	resultFmtDur = " #bytes        #iterations       t_avg[usec]    tps average\n"
	reportFmtBW  = " %-7d    %-10d       %-7.2f            %-7.2f\t\t     %-7.6f\n"
	reportFmtExt = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n"
	reportFmtLat = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	reportFmtDur = " %-7d       %d            %-7.2f        %-7.2f\n"
	noPeakWarn   = " WARNING: BW peak won't be measured in this run.\n"
	latTail      = 2 // perftest's LAT_MEASURE_TAIL: the largest samples dropped
)

// unitBytes is the bandwidth unit: MiB (perftest's "MB", 2^20 bytes) per
// second, or Gb (10^9 bits) per second.
func unitBytes(gbits bool) float64 {
	if gbits {
		return 125e6
	}
	return 1 << 20
}

// bwResult computes a bandwidth line from one side's loop, as
// print_report_bw: average over first post to last completion, peak over
// the best window from a post i to a signaled completion j ≥ i.
func bwResult(c *config, size int64, st bwStats) result {
	r := result{kind: KindBW, size: size, iters: st.n}
	unit := unitBytes(c.gbits)
	ns := float64(st.sampleEnd - st.sampleStart)
	if c.Duration == 0 && st.tposted != nil && len(st.tcompleted) > 0 {
		ns = float64(st.tcompleted[len(st.tcompleted)-1] - st.tposted[0])
	}
	if ns > 0 {
		r.bwAvg = float64(size) * float64(st.n) / (ns / 1e9) / unit
		r.rate = float64(st.n) / (ns / 1e9) / 1e6
	}
	if c.CPUUtil && c.Duration > 0 {
		r.cpu, r.hasCPU = st.cpu[1].utilSince(st.cpu[0]), true
	}
	if !c.noPeak && st.tposted != nil {
		if best := peakDelta(st.tposted, st.tcompleted, int64(c.cqMod)); best > 0 {
			r.peak = float64(size) / (float64(best) / 1e9) / unit
		}
	}
	return r
}

// peakDelta is perftest's peak search: the smallest time per operation,
// (tcompleted[j] - tposted[i]) / (j - i + 1) in integer nanoseconds, over
// every post i and every signaled completion j ≥ i (multiples of cqMod,
// and the last).
func peakDelta(tposted, tcompleted []int64, cqMod int64) int64 {
	n := int64(len(tposted))
	if n == 0 || int64(len(tcompleted)) != n {
		return 0
	}
	best := tcompleted[0] - tposted[0]
	for i := int64(0); i < n; i++ {
		j := (i+1+cqMod-1)/cqMod*cqMod - 1
		for ; j < n; j += cqMod {
			if t := (tcompleted[j] - tposted[i]) / (j - i + 1); t < best {
				best = t
			}
		}
		if n%cqMod != 0 {
			j = n - 1
			if t := (tcompleted[j] - tposted[i]) / (j - i + 1); t < best {
				best = t
			}
		}
	}
	return best
}

// addBW sums the two directions of a bidirectional run (perftest's
// print_full_bw_report with the remote report).
func addBW(a, b result) result {
	a.peak += b.peak
	a.bwAvg += b.bwAvg
	a.rate += b.rate
	return a
}

// latSamples turns post times into per-iteration times in microseconds,
// sorted, as print_report_lat: delta[i] = tposted[i+1] - tposted[i],
// halved for send and write (half a round trip).
func latSamples(c *config, tposted []int64) []float64 {
	d := latDeltas(c, tposted)
	sort.Float64s(d)
	return d
}

// latDeltas is latSamples unsorted: in the order measured (-U).
func latDeltas(c *config, tposted []int64) []float64 {
	if len(tposted) < 2 {
		return nil
	}
	div := 1e3
	if c.rttShift {
		div = 2e3
	}
	d := make([]float64, len(tposted)-1)
	for i := range d {
		d[i] = float64(tposted[i+1]-tposted[i]) / div
	}
	return d
}

// outputValue is the one figure --output prints, as perftest's "%lf\n":
// BW average (in the report's unit), MsgRate, or t_avg.
func outputValue(c *config, r result) string {
	switch c.Output {
	case "bandwidth":
		return fmt.Sprintf("%f\n", r.bwAvg)
	case "message_rate":
		return fmt.Sprintf("%f\n", r.rate)
	}
	return fmt.Sprintf("%f\n", r.tAvg)
}

// latResult computes a latency line from sorted samples: the latTail
// largest are dropped; t_typical is the median of the rest, t_max the
// largest kept-plus-one sample (perftest's delta[measure_cnt]), the
// percentiles delta[ceil(n·p)]. The standard deviation is computed in
// floating point (perftest truncates each deviation to whole
// microseconds, which zeroes it below 1 usec).
func latResult(size, iters int64, d []float64) result {
	r := result{kind: KindLat, size: size, iters: iters}
	n := len(d) - latTail
	if n < 1 {
		return r
	}
	var median float64
	if (n-1)%2 != 0 {
		median = (d[n/2] + d[n/2-1]) / 2
	} else {
		median = d[n/2]
	}
	var sum float64
	for _, v := range d[:n] {
		sum += v
	}
	avg := sum / float64(n)
	var ss float64
	for _, v := range d[:n] {
		ss += (avg - v) * (avg - v)
	}
	r.min, r.max, r.typical, r.tAvg = d[0], d[n], median, avg
	r.stdev = math.Sqrt(ss / float64(n))
	r.p99 = d[min(int(math.Ceil(float64(n)*0.99)), len(d)-1)]
	r.p999 = d[min(int(math.Ceil(float64(n)*0.999)), len(d)-1)]
	return r
}

// durLatResult is print_report_lat_duration: the average over the sample
// window and transactions per second.
func durLatResult(c *config, size int64, st latStats) result {
	r := result{kind: KindLat, dur: true, size: size, iters: st.n}
	ns := float64(st.sampleEnd - st.sampleStart)
	if st.n > 0 && ns > 0 {
		rtt := 1.0
		if c.rttShift {
			rtt = 2
		}
		r.tAvg = ns / 1e3 / rtt / float64(st.n)
		r.tps = float64(st.n) / (ns / 1e9)
	}
	return r
}

// reportLine formats one result as perftest prints it.
func reportLine(c *config, r result) string {
	l := reportFigures(c, r)
	if r.kind == KindBW && cpuColumn(c) {
		// perftest's REPORT_EXT_CPU_UTIL in place of the newline; a peer
		// that measured nothing (perftest's report carries no CPU) shows 0.
		l = strings.TrimSuffix(l, "\n") + fmt.Sprintf("\t    %-3.2f\n", r.cpu)
	}
	return l
}

// cpuColumn reports whether bandwidth lines carry CPU_Util[%]: perftest
// measures it only in duration mode.
func cpuColumn(c *config) bool { return c.CPUUtil && c.Duration > 0 }

func reportFigures(c *config, r result) string {
	switch {
	case r.kind == KindBW && c.gbits && r.bwAvg < 0.1:
		return fmt.Sprintf(reportFmtExt, r.size, r.iters, r.peak, r.bwAvg, r.rate)
	case r.kind == KindBW:
		return fmt.Sprintf(reportFmtBW, r.size, r.iters, r.peak, r.bwAvg, r.rate)
	case r.dur:
		return fmt.Sprintf(reportFmtDur, r.size, r.iters, r.tAvg, r.tps)
	default:
		return fmt.Sprintf(reportFmtLat, r.size, r.iters, r.min, r.max, r.typical, r.tAvg, r.stdev, r.p99, r.p999)
	}
}

// columnHeader is the line before the results.
func columnHeader(c *config) string {
	h := columnNames(c)
	if c.Test.Kind == KindBW && cpuColumn(c) {
		h = strings.TrimSuffix(h, "\n") + "    CPU_Util[%]\n"
	}
	return h
}

func columnNames(c *config) string {
	switch {
	case c.Test.Kind == KindBW && c.gbits:
		return resultFmtBWG
	case c.Test.Kind == KindBW:
		return resultFmtBW
	case c.Duration > 0:
		return resultFmtDur
	default:
		return resultFmtLat
	}
}

// histogram prints -H: every kept sample, sorted, then the column header
// again (perftest's r_flag->histogram).
func histogram(w io.Writer, c *config, d []float64) {
	fmt.Fprintf(w, "#, usec\n")
	n := len(d) - latTail
	for i := 0; i < n; i++ {
		fmt.Fprintf(w, "%d, %s\n", i+1, cFloatG(d[i]))
	}
	fmt.Fprint(w, resultLine+columnHeader(c))
}

// cFloatG formats like C's %g (6 significant digits, no trailing zeros).
func cFloatG(v float64) string {
	s := fmt.Sprintf("%.6g", v)
	if strings.ContainsAny(s, "e") {
		mant, exp, _ := strings.Cut(s, "e")
		if strings.Contains(mant, ".") {
			mant = strings.TrimRight(strings.TrimRight(mant, "0"), ".")
		}
		return mant + "e" + exp
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// title is the test's name line, e.g. "RDMA_Write BW Test".
func title(c *config) string {
	s := verbTitles[c.Test.Verb] + " "
	if c.Test.Verb == VerbAtomic {
		s += c.Atomic.String() + " "
	}
	if c.Test.Kind == KindBW {
		if c.Bidir {
			s += "Bidirectional "
		}
		s += "BW "
	} else {
		s += "Latency "
	}
	return s + "Test"
}

// printHeader prints perftest's test information block.
func printHeader(w io.Writer, c *config, dev verbs.DeviceInfo, server bool) {
	var b strings.Builder
	b.WriteString(resultLine)
	b.WriteString("                    " + title(c) + "\n")
	fmt.Fprintf(&b, " Dual-port       : %s\t\tDevice         : %s\n", "OFF", dev.Name)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : %s\n", c.qps, dev.Transport)
	fmt.Fprintf(&b, " Connection type : %s\t\tUsing SRQ      : %s\n", "RC", "OFF")
	if !server || c.Bidir {
		fmt.Fprintf(&b, " TX depth        : %d\n", c.tx)
	}
	if c.Test.Verb == VerbSend && (server || c.Bidir) {
		fmt.Fprintf(&b, " RX depth        : %d\n", c.rx)
	}
	if c.Test.Kind == KindBW {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", c.cqMod)
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", c.mtu.Bytes())
	link := "Unknown"
	if len(dev.Ports) > 0 && dev.Ports[0].LinkLayer != "" {
		link = dev.Ports[0].LinkLayer
	}
	fmt.Fprintf(&b, " Link type       : %s\n", link)
	if c.Test.Verb != VerbRead && c.Test.Verb != VerbAtomic {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", c.inline)
	} else {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", c.outReads)
	}
	qps, ex := "OFF", "Ethernet"
	if c.cmQPs {
		qps = "ON"
	}
	if c.exCM {
		ex = "rdma_cm"
	}
	fmt.Fprintf(&b, " rdma_cm QPs\t : %s\n", qps)
	fmt.Fprintf(&b, " Data ex. method : %s\n", ex)
	b.WriteString(resultLine)
	io.WriteString(w, b.String())
}

// cAltHex formats v as C's "%#0Nx": zero-padded to width N including the
// "0x" prefix, which C leaves out for zero.
func cAltHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return "0x" + fmt.Sprintf("%0*x", max(width-2, 1), v)
}

// addrLine is ctx_print_pingpong_data: " local address: LID ... QPN ...
// PSN ..." and, for Read (OUT) and Write (RKey, VAddr), more.
func addrLine(c *config, side string, q qpInfo) string {
	s := fmt.Sprintf(" %s address: LID %s QPN %s PSN %s", side, cAltHex(uint64(q.lid), 4), cAltHex(uint64(q.qpn), 6), cAltHex(uint64(q.psn), 6))
	switch c.Test.Verb {
	case VerbRead:
		s += " OUT " + cAltHex(uint64(q.outReads), 4)
		fallthrough
	case VerbWrite:
		s += " RKey " + cAltHex(uint64(q.rkey), 8) + " VAddr " + cAltHex(q.vaddr, 16)
	}
	return s + "\n"
}
