package perftest

// perftest -R: its QPs are connected through rdma_cm (after an exchange of
// empty keys), then the usual key exchange follows without ctx_connect.
// cmConnect is set where the ibverbs transport is linked
// (pwire_cm_ibverbs.go); elsewhere a perftest -R peer is refused.

import (
	"context"
	"net"
)

// cmConnect connects every QP of e through rdma_cm: the server listens on
// local:port and accepts one connection per QP in order, the client dials
// peer:port for each QP in order. It returns what disconnects them.
var cmConnect func(ctx context.Context, e *endpoint, server bool, local, peer net.IP, port int) (func(), error)
