package soft

import (
	"testing"

	"github.com/rdmakit/rdmakit/verbs/driver"
)

// TestLimits: the engine's limits land on a device, and what the
// transport set stays.
func TestLimits(t *testing.T) {
	d := Limits(driver.DeviceInfo{Name: "x0", MaxMRSize: 1 << 36, AtomicCap: driver.AtomicGlob})
	if d.MaxQP != 1<<16 || d.MaxQPWR != driver.MaxQPWR || d.MaxSGE != driver.MaxSGE || d.MaxCQ != 1<<16 ||
		d.MaxCQE != 1<<20 || d.MaxMR != MaxMR || d.MaxPD != 1<<16 || d.MaxSRQ != 1<<16 || d.MaxSRQWR != driver.MaxQPWR ||
		d.MaxInline != driver.MaxInline || d.MaxMsgSize != driver.MaxMsgSize {
		t.Fatalf("limits: %+v", d)
	}
	if d.Name != "x0" || d.MaxMRSize != 1<<36 || d.AtomicCap != driver.AtomicGlob {
		t.Fatalf("the transport's fields changed: %+v", d)
	}
}
