//go:build ibverbs

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// TestInfoNoIBVerbsDevice: the ibverbs build's rdmakit info says when
// libibverbs finds no device and what to do. On a host without RDMA (CI)
// it runs against the real libibverbs; with a device it checks only that
// nothing is said.
func TestInfoNoIBVerbsDevice(t *testing.T) {
	devs, _ := verbs.Devices()
	note := ibverbsNote(devs, "")
	has := false
	for _, d := range devs {
		has = has || d.Transport == "ibverbs"
	}
	if has {
		if note != "" {
			t.Errorf("a device is there, yet: %s", note)
		}
	} else {
		for _, want := range []string{"libibverbs finds no RDMA device", "rdma link add rxe0 type rxe", "type siw", "tcp0", "shm0"} {
			if !strings.Contains(note, want) {
				t.Errorf("note lacks %q:\n%s", want, note)
			}
		}
	}
	// Which modules are loaded, read from a fixture /sys.
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "sys/module/ib_core"), 0o755)
	note = ibverbsNote(nil, root)
	if !strings.Contains(note, "Loaded: ib_core; not loaded: ib_uverbs, rdma_rxe, siw") {
		t.Errorf("modules:\n%s", note)
	}
	if note = ibverbsNote(nil, t.TempDir()); !strings.Contains(note, "No RDMA kernel module is loaded") {
		t.Errorf("no modules:\n%s", note)
	}
}
