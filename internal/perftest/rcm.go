package perftest

// perftest's -R and -z: the whole exchange over rdma_cm. The exchange runs on
// its own rdma_cm connection, whose QP carries each message as one Send
// (perftest posts one receive of pwKeyBinLen bytes at a time); the test
// QPs are then, with -R, connected through rdma_cm as well, one connection
// each to the server's port; with -z they are regular QPs, connected with
// the exchanged keys as on TCP. rcm_link.go is the exchange's
// connection, on the RDMA CM of the device's transport: librdmacm's
// (rcm_ibverbs.go, build tag ibverbs) or transport/roce's own
// (rcm_roce.go, with -d roceN); without one, -R and -z keep rdmakit's TCP
// exchange (see params.go).
//
// In pwire_run.go's sequence, -R changes three things: before the first
// key exchange come a handshake, the test QPs' rdma_cm connections and
// another handshake (perftest's create_rdma_cm_connection; the keys in
// those two handshakes are not yet filled in and are ignored); the key
// messages are binary (pwKey.encodeBin); "connect" only records the
// peer's keys (rdma_cm moved the QPs to RTS), and the close has no "done".
// -z changes only the second and the last: binary keys, no "done".

import (
	"context"
	"net"

	"github.com/rdmakit/rdmakit/verbs"
)

// rcmLink is the -R or -z exchange connection: a net.Conn whose every
// Write of at most rcmMaxMsg bytes is one message, and (-R) the rdma_cm
// side of the test QPs.
type rcmLink interface {
	net.Conn
	// cmQPs reports whether the test QPs connect through rdma_cm (-R)
	// rather than with the exchanged keys (-z).
	cmQPs() bool
	// dataListen (server) listens on the exchange's port for the test
	// QPs' connections, on vctx's device.
	dataListen(vctx *verbs.Context) error
	// connectQP connects test QP qp: the server accepts the next request,
	// the client connects to the server's port (retrying while the server
	// is not yet listening).
	connectQP(ctx context.Context, qp *verbs.QP) error
	// device is the verbs device of the exchange's QP.
	device() string
}

// rcmMaxMsg is the largest message a link sends at once.
const rcmMaxMsg = 4096

// rcmDial connects the exchange to a -R server; rcmAccept listens on port
// and accepts one client (printing nothing). Both are nil without rdma_cm
// support in the build. dev is the verbs device for the exchange's QP;
// cmQPs is -R (the link's cmQPs).
var (
	rcmDial   func(ctx context.Context, dev string, ip net.IP, port uint16, cmQPs bool) (rcmLink, error)
	rcmAccept func(ctx context.Context, dev string, port uint16, cmQPs bool) (rcmLink, error)
)

// rcmDevice reports whether this run speaks -R or -z over rdma_cm, and on
// which device ("" for a client without -d: the one rdma_cm routes the
// server's address through): -R or -z given, rdma_cm in the build, and -d
// a device whose transport has an RDMA CM (ibverbs with -tags ibverbs,
// roce always); without -d, an ibverbs device (a server: the first one).
func rcmDevice(o Options) (string, bool) {
	if !(o.RDMACM || o.CommCM) || rcmDial == nil {
		return "", false
	}
	if o.Device != "" {
		d, err := findDevice(o.Device)
		return d.Name, err == nil && rcmCMs[d.Transport] != nil
	}
	if rcmFirst != "ibverbs" {
		return "", false
	}
	if o.Server != "" {
		return "", true
	}
	devs, _ := verbs.Devices()
	for _, d := range devs {
		if d.Transport == "ibverbs" {
			return d.Name, true
		}
	}
	return "", false
}
