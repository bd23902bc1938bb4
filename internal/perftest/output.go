package perftest

// Output besides perftest's text report: the progress bar of -a sweeps,
// --out_json and --plot. Runs in the run's goroutine.

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	return sys.IsTerminal(f.Fd())
}

// progress draws "[#####.....] 12/23  4096 B" on stderr during a sweep.
type progress struct {
	w     io.Writer
	sizes []int64
	shown bool
}

func newProgress(env Env, c *config) *progress {
	if !env.Progress || len(c.sizes) < 2 {
		return &progress{}
	}
	p := &progress{w: env.Stderr, sizes: c.sizes}
	p.update(0)
	return p
}

// update shows that done sizes of the sweep are finished.
func (p *progress) update(done int) {
	if p.w == nil || done >= len(p.sizes) {
		return
	}
	const width = 30
	n := done * width / len(p.sizes)
	fmt.Fprintf(p.w, "\r[%s%s] %d/%d sizes, running %s B ", strings.Repeat("#", n), strings.Repeat(".", width-n),
		done, len(p.sizes), sizeLabel(p.sizes[done]))
	p.shown = true
}

// clear erases the bar so report lines print cleanly.
func (p *progress) clear() {
	if p.w != nil && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// sizeLabel is a short size: 8, 4K, 1M.
func sizeLabel(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dG", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return fmt.Sprint(n)
}

// jsonDoc is the --out_json document: perftest's test_info, and one
// results object per size with perftest's JSON names.
type jsonDoc struct {
	TestInfo map[string]any   `json:"test_info"`
	Results  []map[string]any `json:"results"`
}

func testInfo(c *config, dev verbs.DeviceInfo) map[string]any {
	m := map[string]any{
		"test":            strings.ReplaceAll(title(c), " ", "_"),
		"rdmakit_test":    c.Test.String(),
		"Dual_port":       "OFF",
		"Device":          dev.Name,
		"Number_of_qps":   c.qps,
		"Transport_type":  dev.Transport,
		"Connection_type": "RC",
		"Using_SRQ":       "OFF",
		"TX_depth":        c.tx,
		"Mtu":             c.mtu.Bytes(),
		"Data_ex_method":  "Ethernet",
		"rdma_cm_QPs":     "OFF",
		"iterations":      c.iters,
		"duration":        c.Duration,
		"all_sizes":       c.All,
		"bidirectional":   c.Bidir,
		"report_unit":     "MiB/sec",
	}
	if c.gbits {
		m["report_unit"] = "Gb/sec"
	}
	if c.Test.Verb == VerbSend {
		m["RX_depth"] = c.rx
	}
	if c.Test.Kind == KindBW {
		m["CQ_Moderation"] = c.cqMod
	}
	if len(dev.Ports) > 0 {
		m["Link_type"] = dev.Ports[0].LinkLayer
	}
	if c.Test.Verb == VerbRead || c.Test.Verb == VerbAtomic {
		m["Outstand_reads"] = c.outReads
	} else {
		m["Max_inline_data"] = c.inline
	}
	if c.Test.Verb == VerbAtomic {
		m["atomic_type"] = c.Atomic.String()
	}
	return m
}

func resultJSON(r result) map[string]any {
	m := map[string]any{"MsgSize": r.size, "n_iterations": r.iters}
	switch {
	case r.kind == KindBW:
		m["BW_peak"], m["BW_average"], m["MsgRate"] = r.peak, r.bwAvg, r.rate
	case r.dur:
		m["t_avg"], m["tps_average"] = r.tAvg, r.tps
	default:
		m["t_min"], m["t_max"], m["t_typical"], m["t_avg"] = r.min, r.max, r.typical, r.tAvg
		m["t_stdev"], m["percentile_99"], m["percentile_99.9"] = r.stdev, r.p99, r.p999
	}
	return m
}

func writeJSON(path string, c *config, dev verbs.DeviceInfo, res []result) error {
	doc := jsonDoc{TestInfo: testInfo(c, dev), Results: []map[string]any{}}
	for _, r := range res {
		doc.Results = append(doc.Results, resultJSON(r))
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("--out_json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("--out_json: %w", err)
	}
	return nil
}

func plotResults(path string, c *config, dev verbs.DeviceInfo, res []result) error {
	s := Series{Name: c.Test.String() + " " + dev.Name}
	for _, r := range res {
		y := r.bwAvg
		if r.kind == KindLat {
			y = r.typical
			if r.dur {
				y = r.tAvg
			}
		}
		s.Points = append(s.Points, Point{X: float64(r.size), Y: y})
	}
	ylabel := "BW average [MiB/sec]"
	if c.gbits {
		ylabel = "BW average [Gb/sec]"
	}
	if c.Test.Kind == KindLat {
		ylabel = "t_typical [usec]"
		if c.Duration > 0 {
			ylabel = "t_avg [usec]"
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	if err := Plot(f, title(c)+" on "+dev.Name, "message size [bytes]", ylabel, []Series{s}); err != nil {
		f.Close()
		return fmt.Errorf("--plot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}
