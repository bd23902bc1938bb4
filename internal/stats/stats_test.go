package stats

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdmakit/rdmakit/verbs/driver"
)

func TestCompletions(t *testing.T) {
	c := &Counters{transport: "tcp", device: "tcp0"}
	c.Completions([]driver.WorkCompletion{
		{Opcode: driver.WCSend, ByteLen: 100},
		{Opcode: driver.WCWrite, ByteLen: 50},
		{Opcode: driver.WCRecv, ByteLen: 7},
		{Opcode: driver.WCRead, ByteLen: 3},
		{Opcode: driver.WCRecvWriteWithImm, ByteLen: 1},
		{Opcode: driver.WCFetchAndAdd, ByteLen: 8},
		{Opcode: driver.WCSend, ByteLen: 1000, Status: driver.StatusRNRRetryExceeded},
	})
	c.Retransmit()
	c.RNR()
	got := c.Snapshot()
	want := Snapshot{Transport: "tcp", Device: "tcp0", TxBytes: 150, RxBytes: 11, Operations: 7, Retransmissions: 1, RNR: 1, Errors: 1}
	if got != want {
		t.Errorf("%+v, want %+v", got, want)
	}
}

// Disabled counting is a nil receiver: no panic, nothing counted, and
// neither path allocates.
func TestNilAndAllocs(t *testing.T) {
	var c *Counters
	wcs := []driver.WorkCompletion{{Opcode: driver.WCSend, ByteLen: 1}}
	if n := testing.AllocsPerRun(100, func() { c.Completions(wcs); c.Retransmit(); c.RNR() }); n != 0 {
		t.Errorf("disabled: %v allocs", n)
	}
	on := &Counters{}
	if n := testing.AllocsPerRun(100, func() { on.Completions(wcs); on.Retransmit(); on.RNR() }); n != 0 {
		t.Errorf("enabled: %v allocs", n)
	}
}

func TestForAndWriteFile(t *testing.T) {
	if For("tcp", "tcp0") != nil && os.Getenv(EnvDir) == "" {
		t.Fatal("For counts without opting in")
	}
	tmp := t.TempDir()
	// Enable, count, and write the file as the writer would.
	mu.Lock()
	saved, savedStarted := dir, started
	started = true // no background writer in the test
	mu.Unlock()
	if err := Enable(tmp); err != nil {
		t.Fatal(err)
	}
	defer func() {
		mu.Lock()
		dir, started = saved, savedStarted
		delete(all, key{"tcp", "tcp0"})
		mu.Unlock()
	}()
	c := For("tcp", "tcp0")
	if c == nil || For("tcp", "tcp0") != c {
		t.Fatal("For: not one Counters per device")
	}
	c.Completions([]driver.WorkCompletion{{Opcode: driver.WCSend, ByteLen: 4096}})
	// Flush (what a process calls as it exits) writes the file now.
	if err := Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(tmp, ProcessName()+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil || f.Version != FileVersion || f.PID != os.Getpid() || len(f.Counters) != 1 || f.Counters[0].TxBytes != 4096 {
		t.Errorf("file %s: %v", b, err)
	}
	if Enable("") == nil {
		t.Error("Enable accepted an empty directory")
	}
}
