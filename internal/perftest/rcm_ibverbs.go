//go:build ibverbs

package perftest

// librdmacm (transport/ibverbs) as -R's and -z's RDMA CM on ibverbs
// devices (see rcm_link.go).

import (
	"context"
	"net"

	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	registerRCM("ibverbs", &rcmCM{
		deviceFor: ibverbs.DeviceForIP,
		dial: func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (rcmCMConn, error) {
			return ibverbs.DialCM(ctx, qp, ip, port, nil)
		},
		listen: func(vctx *verbs.Context, port uint16) (rcmListener, error) {
			l, err := ibverbs.ListenCM(vctx, net.IPv4zero, port)
			if err != nil {
				return nil, err
			}
			return ibvListener{l}, nil
		},
	}, true)
}

type ibvListener struct{ l *ibverbs.CMListener }

func (l ibvListener) Accept(ctx context.Context, qp *verbs.QP) (rcmCMConn, error) {
	return l.l.Accept(ctx, qp, nil)
}

func (l ibvListener) Close() error { return l.l.Close() }
