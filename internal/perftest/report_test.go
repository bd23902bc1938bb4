package perftest

import (
	"bytes"
	"image/png"
	"math"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

func cfgFor(t *testing.T, args ...string) *config {
	t.Helper()
	o, err := ParseArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.resolve(verbs.DeviceInfo{})
	if err != nil {
		t.Fatal(err)
	}
	c.mtu = verbs.MTU4096
	return c
}

// The lines are byte for byte what perftest's format strings print
// (perftest_parameters.h: REPORT_FMT, REPORT_FMT_EXT, REPORT_FMT_LAT,
// REPORT_FMT_LAT_DUR; RESULT_FMT*).
func TestReportLines(t *testing.T) {
	c := cfgFor(t, "write_bw")
	got := reportLine(c, result{kind: KindBW, size: 65536, iters: 5000, peak: 11200.5, bwAvg: 11150.25, rate: 0.178404})
	want := " 65536      5000             11200.50            11150.25\t\t     0.178404\n"
	if got != want {
		t.Errorf("bw line\n got %q\nwant %q", got, want)
	}
	cg := cfgFor(t, "write_bw", "--report_gbits")
	got = reportLine(cg, result{kind: KindBW, size: 2, iters: 5000, peak: 0.05, bwAvg: 0.04, rate: 2.5})
	want = " 2          5000           0.050000            0.040000            2.500000\n"
	if got != want {
		t.Errorf("gbits small line\n got %q\nwant %q", got, want)
	}
	cl := cfgFor(t, "write_lat")
	got = reportLine(cl, result{kind: KindLat, size: 2, iters: 1000, min: 0.33, max: 3.5, typical: 0.37, tAvg: 0.4, stdev: 0.05, p99: 1.25, p999: 3.5})
	want = " 2       1000          0.33           3.50         0.37     \t       0.40        \t0.05   \t\t1.25    \t\t3.50   \n"
	if got != want {
		t.Errorf("lat line\n got %q\nwant %q", got, want)
	}
	cd := cfgFor(t, "write_lat", "-D", "2")
	got = reportLine(cd, result{kind: KindLat, dur: true, size: 2, iters: 123, tAvg: 1.5, tps: 333333.33})
	want = " 2             123            1.50           333333.33\n"
	if got != want {
		t.Errorf("duration line\n got %q\nwant %q", got, want)
	}
	if columnHeader(c) != " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n" ||
		columnHeader(cg) != " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n" ||
		!strings.HasPrefix(columnHeader(cl), " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]") ||
		columnHeader(cd) != " #bytes        #iterations       t_avg[usec]    tps average\n" {
		t.Error("column headers differ from perftest's")
	}
}

func TestHeader(t *testing.T) {
	dev := verbs.DeviceInfo{Name: "shm0", Transport: "shm", Ports: []verbs.PortInfo{{LinkLayer: "Memory", ActiveMTU: verbs.MTU4096}}}
	var b bytes.Buffer
	printHeader(&b, cfgFor(t, "atomic_bw", "-A", "CMP_AND_SWAP"), dev, false)
	for _, s := range []string{
		resultLine + "                    Atomic CMP_AND_SWAP BW Test\n",
		" Dual-port       : OFF\t\tDevice         : shm0\n",
		" Number of qps   : 1\t\tTransport type : shm\n",
		" Connection type : RC\t\tUsing SRQ      : OFF\n",
		" TX depth        : 128\n", " CQ Moderation   : 100\n", " Mtu             : 4096[B]\n",
		" Link type       : Memory\n", " Outstand reads  : 16\n", " Data ex. method : Ethernet\n",
	} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("header lacks %q:\n%s", s, b.String())
		}
	}
	for _, m := range []struct {
		exCM, cmQPs bool
		want        string
	}{{true, true, " rdma_cm QPs\t : ON\n Data ex. method : rdma_cm\n"}, {true, false, " rdma_cm QPs\t : OFF\n Data ex. method : rdma_cm\n"}} {
		b.Reset()
		c := cfgFor(t, "write_bw")
		c.exCM, c.cmQPs = m.exCM, m.cmQPs // -R, -z with a perftest peer
		if printHeader(&b, c, dev, false); !strings.Contains(b.String(), m.want) {
			t.Errorf("-R/-z header lacks %q:\n%s", m.want, b.String())
		}
	}
	b.Reset()
	printHeader(&b, cfgFor(t, "send_lat"), dev, true)
	if s := b.String(); !strings.Contains(s, "Send Latency Test") || strings.Contains(s, "TX depth") || !strings.Contains(s, " RX depth        : 512\n") ||
		!strings.Contains(s, " Max inline data : 236[B]\n") || strings.Contains(s, "CQ Moderation") {
		t.Errorf("server send_lat header:\n%s", s)
	}
	c := cfgFor(t, "read_bw")
	q := qpInfo{qpn: 0xad9c5, psn: 0x12, outReads: 16, rkey: 0x1234abcd, vaddr: 0x7fbb8b907000}
	if got, want := addrLine(c, "local", q), " local address: LID 0000 QPN 0xad9c5 PSN 0x0012 OUT 0x10 RKey 0x1234abcd VAddr 0x007fbb8b907000\n"; got != want {
		t.Errorf("address line\n got %q\nwant %q", got, want)
	}
	if got := addrLine(cfgFor(t, "send_bw"), "remote", q); got != " remote address: LID 0000 QPN 0xad9c5 PSN 0x0012\n" {
		t.Errorf("send address line %q", got)
	}
}

func TestCFormats(t *testing.T) {
	for _, c := range []struct {
		v    uint64
		w    int
		want string
	}{{0, 4, "0000"}, {0x10, 4, "0x10"}, {0x12, 6, "0x0012"}, {0xad9c5, 6, "0xad9c5"}, {0x7fbb8b907000, 16, "0x007fbb8b907000"}} {
		if got := cAltHex(c.v, c.w); got != c.want {
			t.Errorf("cAltHex(%#x, %d) = %q, want %q", c.v, c.w, got, c.want)
		}
	}
	for v, want := range map[float64]string{0.37: "0.37", 1.5: "1.5", 1234567: "1.23457e+06", 0.00001: "1e-05", 100: "100", 12.3456789: "12.3457"} {
		if got := cFloatG(v); got != want {
			t.Errorf("cFloatG(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestPeak(t *testing.T) {
	// Four operations, signaled every 2: the best window is posts 2..3
	// completing at 3 in 10 ns per operation.
	tposted := []int64{0, 10, 100, 110}
	tcompleted := []int64{200, 200, 120, 120}
	if got := peakDelta(tposted, tcompleted, 2); got != 10 {
		t.Errorf("peakDelta = %d, want 10", got)
	}
	c := cfgFor(t, "write_bw", "-s", "1024", "-Q", "2")
	r := bwResult(c, 1024, bwStats{n: 4, tposted: tposted, tcompleted: tcompleted})
	// 4 × 1 KiB in 120 ns; peak 1 KiB per 10 ns.
	if want := 4 * 1024 / 120e-9 / (1 << 20); math.Abs(r.bwAvg-want) > 1e-6*want {
		t.Errorf("average %v, want %v", r.bwAvg, want)
	}
	if want := 1024 / 10e-9 / (1 << 20); math.Abs(r.peak-want) > 1e-6*want {
		t.Errorf("peak %v, want %v", r.peak, want)
	}
	if want := 4 / 120e-9 / 1e6; math.Abs(r.rate-want) > 1e-6*want {
		t.Errorf("rate %v, want %v", r.rate, want)
	}
}

func TestLatency(t *testing.T) {
	// 13 posts 1 µs apart, but one gap of 100 µs: 12 samples, the two
	// largest dropped.
	tposted := []int64{0}
	for i := 1; i < 13; i++ {
		gap := int64(2000) // 2 µs round trip = 1 µs one way
		if i == 6 {
			gap = 200000
		}
		if i == 9 {
			gap = 4000
		}
		tposted = append(tposted, tposted[i-1]+gap)
	}
	c := cfgFor(t, "write_lat")
	d := latSamples(c, tposted)
	if len(d) != 12 || d[0] != 1 || d[11] != 100 || d[10] != 2 {
		t.Fatalf("samples %v", d)
	}
	r := latResult(2, 13, d)
	// Kept: ten samples of 1 µs; t_max is delta[measure_cnt] = d[10].
	if r.min != 1 || r.typical != 1 || r.tAvg != 1 || r.stdev != 0 || r.max != 2 || r.p99 != 2 || r.p999 != 2 {
		t.Errorf("result %+v", r)
	}
	// read_lat: the full operation, not halved.
	if d := latSamples(cfgFor(t, "read_lat"), []int64{0, 3000}); d[0] != 3 {
		t.Errorf("read_lat sample %v, want 3", d)
	}
}

func TestPlot(t *testing.T) {
	var b bytes.Buffer
	s := []Series{
		{Name: "write_bw shm0", Points: []Point{{2, 10}, {1024, 3000}, {8 << 20, 40000}}},
		{Name: "write_bw tcp0", Points: []Point{{2, 1}, {1024, 300}, {8 << 20, 4000}}},
	}
	if err := Plot(&b, "RDMA_Write BW Test", "message size [bytes]", "BW average [MiB/sec]", s); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if r := img.Bounds(); r.Dx() != plotW || r.Dy() != plotH {
		t.Errorf("size %v", r)
	}
	colored := map[[3]uint32]int{}
	for y := 0; y < plotH; y++ {
		for x := 0; x < plotW; x++ {
			r, g, bb, _ := img.At(x, y).RGBA()
			colored[[3]uint32{r >> 8, g >> 8, bb >> 8}]++
		}
	}
	for _, p := range palette[:2] {
		if colored[[3]uint32{uint32(p.R), uint32(p.G), uint32(p.B)}] < 100 {
			t.Errorf("series color %v hardly drawn", p)
		}
	}
	if colored[[3]uint32{0, 0, 0}] < 1000 {
		t.Error("no axes or text")
	}
	// One point, and nothing at all, still draw.
	for _, s := range [][]Series{{{Name: "one", Points: []Point{{64, 5}}}}, nil} {
		if err := Plot(&bytes.Buffer{}, "t", "x", "y", s); err != nil {
			t.Error(err)
		}
	}
	if err := Plot(&bytes.Buffer{}, "t", "x", "y", []Series{{Points: []Point{{0, 1}}}}); err == nil {
		t.Error("x = 0 accepted on a log axis")
	}
}

func TestFont(t *testing.T) {
	for r, g := range font {
		for _, row := range g {
			if len(row) != 5 || strings.Trim(row, ".#") != "" {
				t.Errorf("glyph %q row %q", r, row)
			}
		}
	}
	for _, r := range "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.[]/()_-:%" {
		if _, ok := font[r]; !ok {
			t.Errorf("no glyph for %q", r)
		}
	}
}

// --cpu_util: perftest's figure from two /proc/stat readings, and its
// column on bandwidth lines in duration mode only.
func TestCPUUtil(t *testing.T) {
	a := parseCPUStat("cpu  100 5 50 900 10 0 1 0 0 0\n")
	b := parseCPUStat("cpu  130 5 60 970 10 0 1 0 0 0\n")
	if a != (cpuStat{100, 900}) || b != (cpuStat{130, 970}) {
		t.Fatalf("parse: %+v %+v", a, b)
	}
	if got := b.utilSince(a); got != 30 {
		t.Errorf("util %v, want 30 (30 user of 100 user+idle jiffies)", got)
	}
	if parseCPUStat("intr 1 2 3") != (cpuStat{}) || (cpuStat{}).utilSince(cpuStat{}) != 0 {
		t.Error("malformed or empty readings must give 0")
	}
	c := &config{Options: Options{Test: Test{Kind: KindBW}, CPUUtil: true, Duration: 2}}
	if h := columnHeader(c); !strings.HasSuffix(h, "MsgRate[Mpps]    CPU_Util[%]\n") {
		t.Errorf("header %q", h)
	}
	l := reportLine(c, result{kind: KindBW, size: 65536, iters: 10, peak: 1, bwAvg: 1, rate: 1, cpu: 12.5, hasCPU: true})
	if !strings.HasSuffix(l, "\t    12.50\n") || strings.Count(l, "\n") != 1 {
		t.Errorf("line %q", l)
	}
	c.Duration = 0
	if strings.Contains(columnHeader(c), "CPU") || reportLine(c, result{kind: KindBW, size: 1}) != reportFigures(c, result{kind: KindBW, size: 1}) {
		t.Error("CPU column without -D")
	}
	r, err := parseResult(result{kind: KindBW, size: 8, iters: 1, cpu: 7.25, hasCPU: true}.line())
	if err != nil || !r.hasCPU || r.cpu != 7.25 {
		t.Errorf("wire: %+v %v", r, err)
	}
}
