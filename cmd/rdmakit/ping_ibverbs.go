//go:build ibverbs

package main

import (
	"context"
	"io"
	"net"

	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	registerPingCM("ibverbs", &pingCM{
		deviceFor: ibverbs.DeviceForIP,
		dial: func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (io.Closer, error) {
			return ibverbs.DialCM(ctx, qp, ip, port, nil)
		},
		listen: func(vctx *verbs.Context, ip net.IP, port uint16) (pingListener, error) {
			l, err := ibverbs.ListenCM(vctx, ip, port)
			if err != nil {
				return nil, err
			}
			return cmListener{l}, nil
		},
	})
}

type cmListener struct{ l *ibverbs.CMListener }

func (c cmListener) Accept(ctx context.Context, qp *verbs.QP) (io.Closer, error) {
	return c.l.Accept(ctx, qp, nil)
}

func (c cmListener) Close() error { return c.l.Close() }
