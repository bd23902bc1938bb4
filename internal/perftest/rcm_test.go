package perftest

import (
	"context"
	"net"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// fakeLink is an rcmLink over one end of a net.Pipe.
type fakeLink struct {
	net.Conn
	qps bool
}

func (fakeLink) dataListen(*verbs.Context) error            { return nil }
func (fakeLink) connectQP(context.Context, *verbs.QP) error { return nil }
func (fakeLink) device() string                             { return "fake0" }
func (l fakeLink) cmQPs() bool                              { return l.qps }

// -z is the exchange over rdma_cm without -R's rdma_cm QPs: the flag
// selects the rdma_cm exchange, and the session skips -R's
// create_rdma_cm_connection handshakes.
func TestCommCM(t *testing.T) {
	o, err := ParseArgs([]string{"write_bw", "-z", "10.0.0.1"})
	if err != nil || !o.CommCM || o.RDMACM {
		t.Fatalf("-z: CommCM %v RDMACM %v, %v", o.CommCM, o.RDMACM, err)
	}
	if o, err := ParseArgs([]string{"write_bw", "--comm_rdma_cm", "-R"}); err != nil || !o.CommCM || !o.RDMACM {
		t.Fatalf("--comm_rdma_cm -R: CommCM %v RDMACM %v, %v", o.CommCM, o.RDMACM, err)
	}

	saved, savedFirst := rcmDial, rcmFirst
	t.Cleanup(func() { rcmDial, rcmFirst = saved, savedFirst })
	rcmFirst = "ibverbs" // as in a build with -tags ibverbs
	rcmDial = func(context.Context, string, net.IP, uint16, bool) (rcmLink, error) { return nil, nil }
	if _, ok := rcmDevice(o); !ok {
		t.Error("a -z client without -d does not use rdma_cm")
	}
	if _, ok := rcmDevice(Options{Server: "10.0.0.1"}); ok {
		t.Error("a client without -R or -z uses rdma_cm")
	}
	rcmDial = nil
	if _, ok := rcmDevice(o); ok {
		t.Error("-z uses rdma_cm in a build without it")
	}

	// With -z the session exchanges nothing before the keys: the
	// session has no exchange (p) to do -R's handshakes on.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	s := &pwSession{session: &session{}, link: fakeLink{Conn: a}}
	if err := s.rcmPre(); err != nil {
		t.Errorf("-z: rcmPre: %v", err)
	}
}
