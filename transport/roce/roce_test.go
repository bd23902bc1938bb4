package roce

import (
	"os"
	"runtime"
	"testing"

	"github.com/rdmakit/rdmakit/internal/sys"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"go.uber.org/goleak"
)

// testDevice is the loopback interface's device (RDMAKIT_ROCE_IFACES=lo
// makes it the only one, roce0). Tests bind 127.0.0.1 on ports of the
// kernel's choice, so that concurrent test runs do not collide on 4791.
const testDevice = "roce0"

func TestMain(m *testing.M) {
	os.Setenv(EnvIfaces, "lo")
	if os.Getenv(EnvAddr) == "" {
		os.Setenv(EnvAddr, "127.0.0.1:0")
	}
	conformance.ServePeerIfChild()
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	needDevices(t)
	conformance.Run(t, testDevice)
}

// needDevices skips where the transport has no devices (systems other
// than Linux: no batched socket I/O).
func needDevices(t testing.TB) {
	if !sys.HasUDPBatch {
		t.Skipf("SKIP: roce has no devices on %s (it needs Linux's sendmmsg/recvmmsg)", runtime.GOOS)
	}
}
