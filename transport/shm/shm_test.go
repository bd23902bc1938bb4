package shm_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/conformance"
	_ "github.com/rdmakit/rdmakit/transport/shm"
)

func TestMain(m *testing.M) {
	conformance.ServePeerIfChild()
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) { conformance.Run(t, "shm0") }

func TestDeregInFlight(t *testing.T) { conformance.DeregInFlight(t, "shm0") }
