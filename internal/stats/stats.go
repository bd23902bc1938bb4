// Package stats counts what rdmakit's software transports do, per
// transport and device, for processes that opt in: bytes, operations
// (completions), retransmissions, RNR NAKs and error completions.
//
// Opt-in: RDMAKIT_STATS_DIR=DIR in the environment (or Enable(DIR)). Such
// a process writes its counters to DIR/HOST-PID.json once a second (a
// write to a temporary file and a rename, so a reader never sees half a
// file); rdmakit exporter --stats-dir DIR serves every such file of the
// node as Prometheus metrics. A process that has not opted in gets nil
// from For, and every counting method on a nil *Counters returns at once:
// disabled counting costs one predictable branch and no memory.
//
// Goroutines: counting methods are atomic and may run on any goroutine;
// the writer runs on one goroutine of its own, started by the first For
// of an enabled process, for the life of the process.
package stats

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmakit/rdmakit/verbs/driver"
)

// EnvDir names the directory a process writes its counters to.
const EnvDir = "RDMAKIT_STATS_DIR"

// Interval is how often an enabled process writes its counters.
const Interval = time.Second

// Counters of one device of one transport in this process.
type Counters struct {
	transport, device string

	txBytes, rxBytes, ops, retransmissions, rnr, errors atomic.Uint64
}

// New returns counters that are not registered with the process (not
// written anywhere); For is what transports use.
func New(transport, device string) *Counters {
	return &Counters{transport: transport, device: device}
}

// Completions counts polled completions: each is an operation; an error
// status is an error; the byte length of receives and READs is received,
// of sends and WRITEs sent.
func (c *Counters) Completions(wcs []driver.WorkCompletion) {
	if c == nil {
		return
	}
	var tx, rx, errs uint64
	for i := range wcs {
		w := &wcs[i]
		if w.Status != driver.StatusSuccess {
			errs++
			continue
		}
		switch w.Opcode {
		case driver.WCRecv, driver.WCRecvWriteWithImm, driver.WCRead:
			rx += uint64(w.ByteLen)
		case driver.WCSend, driver.WCWrite:
			tx += uint64(w.ByteLen)
		}
	}
	c.ops.Add(uint64(len(wcs)))
	if tx != 0 {
		c.txBytes.Add(tx)
	}
	if rx != 0 {
		c.rxBytes.Add(rx)
	}
	if errs != 0 {
		c.errors.Add(errs)
	}
}

// Retransmit counts one resumption of transmission from an earlier packet
// (go-back-N after a NAK, an RNR NAK or a timeout).
func (c *Counters) Retransmit() {
	if c != nil {
		c.retransmissions.Add(1)
	}
}

// RNR counts one RNR NAK received (the peer had no receive posted).
func (c *Counters) RNR() {
	if c != nil {
		c.rnr.Add(1)
	}
}

// Snapshot is the value of one Counters at one time.
type Snapshot struct {
	Transport       string `json:"transport"`
	Device          string `json:"device"`
	TxBytes         uint64 `json:"tx_bytes"`
	RxBytes         uint64 `json:"rx_bytes"`
	Operations      uint64 `json:"operations"`
	Retransmissions uint64 `json:"retransmissions"`
	RNR             uint64 `json:"rnr"`
	Errors          uint64 `json:"errors"`
}

// Snapshot returns the counters' current values.
func (c *Counters) Snapshot() Snapshot {
	return Snapshot{Transport: c.transport, Device: c.device, TxBytes: c.txBytes.Load(), RxBytes: c.rxBytes.Load(),
		Operations: c.ops.Load(), Retransmissions: c.retransmissions.Load(), RNR: c.rnr.Load(), Errors: c.errors.Load()}
}

// File is what a process writes.
type File struct {
	Version  int        `json:"version"`
	Process  string     `json:"process"` // HOST-PID
	PID      int        `json:"pid"`
	Time     time.Time  `json:"time"`
	Counters []Snapshot `json:"counters"`
}

// FileVersion is File.Version of this build.
const FileVersion = 1

type key struct{ transport, device string }

var (
	// mu guards dir, all and started.
	mu      sync.Mutex
	dir     = os.Getenv(EnvDir)
	all     = map[key]*Counters{}
	started bool
)

// Enable makes the process count and write its counters to d (as
// RDMAKIT_STATS_DIR=d does). Devices opened before stay uncounted.
func Enable(d string) error {
	if d == "" {
		return fmt.Errorf("stats: empty directory")
	}
	mu.Lock()
	defer mu.Unlock()
	dir = d
	return nil
}

// Enabled reports whether the process counts.
func Enabled() bool {
	mu.Lock()
	defer mu.Unlock()
	return dir != ""
}

// For returns the counters of a transport's device, the same for every
// caller; nil when the process has not opted in.
func For(transport, device string) *Counters {
	mu.Lock()
	defer mu.Unlock()
	if dir == "" {
		return nil
	}
	k := key{transport, device}
	c := all[k]
	if c == nil {
		c = &Counters{transport: transport, device: device}
		all[k] = c
	}
	if !started {
		started = true
		go writer()
	}
	return c
}

// Snapshots returns every counter of the process, sorted.
func Snapshots() []Snapshot {
	mu.Lock()
	out := make([]Snapshot, 0, len(all))
	for _, c := range all {
		out = append(out, c.Snapshot())
	}
	mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Transport != out[j].Transport {
			return out[i].Transport < out[j].Transport
		}
		return out[i].Device < out[j].Device
	})
	return out
}

// ProcessName is the name of this process's file: HOST-PID.
func ProcessName() string {
	h, _ := os.Hostname()
	if h == "" {
		h = "host"
	}
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}

// WriteFile writes the process's counters to its file in d now.
func WriteFile(d string) error {
	f := File{Version: FileVersion, Process: ProcessName(), PID: os.Getpid(), Time: time.Now().UTC(), Counters: Snapshots()}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	path := filepath.Join(d, f.Process+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Flush writes the counters now if the process counts and has any (a
// process about to exit calls it, so that its last second is not lost).
func Flush() error {
	mu.Lock()
	d, n := dir, len(all)
	mu.Unlock()
	if d == "" || n == 0 {
		return nil
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return WriteFile(d)
}

// writer writes the counters every Interval; a directory that cannot be
// written to is retried (it may be mounted later) and reported once.
func writer() {
	reported := false
	for {
		time.Sleep(Interval)
		mu.Lock()
		d := dir
		mu.Unlock()
		if err := os.MkdirAll(d, 0o755); err == nil {
			err = WriteFile(d)
			if err != nil && !reported {
				fmt.Fprintf(os.Stderr, "rdmakit: %s=%s: %v (counters not written)\n", EnvDir, d, err)
				reported = true
			}
		}
	}
}
