package perftest

// transport/roce's own RDMA CM (MADs over UD QP 1) as -R's and -z's on
// roce devices (see rcm_link.go): rdmakit perf -d roce0 -R speaks to
// perftest -R on rxe or a RoCE NIC.

import (
	"context"
	"fmt"
	"net"

	"github.com/rdmakit/rdmakit/transport/roce"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	registerRCM("roce", &rcmCM{
		deviceFor: func(ip net.IP, local bool) (string, error) {
			return "", fmt.Errorf("roce: give the device (-d roceN) for -R or -z")
		},
		dial: func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (rcmCMConn, error) {
			c, err := roce.DialCM(ctx, qp, ip, port, nil)
			if err != nil {
				return nil, err
			}
			return roceCMConn{c}, nil
		},
		listen: func(vctx *verbs.Context, port uint16) (rcmListener, error) {
			l, err := roce.ListenCM(vctx, nil, port, nil)
			if err != nil {
				return nil, err
			}
			return roceListener{l}, nil
		},
		keepQPConns: true,
	}, false)
}

type roceCMConn struct{ *roce.CMConn }

func (c roceCMConn) Disconnected() bool {
	select {
	case <-c.CMConn.Disconnected():
		return true
	default:
		return false
	}
}

type roceListener struct{ l *roce.CMListener }

func (l roceListener) Accept(ctx context.Context, qp *verbs.QP) (rcmCMConn, error) {
	c, err := l.l.Accept(ctx, qp)
	if err != nil {
		return nil, err
	}
	return roceCMConn{c}, nil
}

func (l roceListener) Close() error { return l.l.Close() }
