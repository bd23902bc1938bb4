//go:build ibverbs

package perftest

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/rdmakit/rdmakit/transport/ibverbs"
)

func init() { cmConnect = connectCM }

// cmAttempts is how often the client dials a QP while the perftest server
// sets up its listener after the handshake (perftest's own client tries
// 10 times, 100 ms apart).
const cmAttempts = 30

func connectCM(ctx context.Context, e *endpoint, server bool, local, peer net.IP, port int) (func(), error) {
	var conns []*ibverbs.CMConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	if server {
		l, err := ibverbs.ListenCM(e.ctx, local, uint16(port))
		if err != nil {
			return nil, err
		}
		defer l.Close()
		for i, qp := range e.qps {
			c, err := l.Accept(ctx, qp, nil)
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("accepting the rdma_cm connection of QP %d: %w", i, err)
			}
			conns = append(conns, c)
		}
		return closeAll, nil
	}
	for i, qp := range e.qps {
		var c *ibverbs.CMConn
		var err error
		for a := 0; a < cmAttempts; a++ {
			if c, err = ibverbs.DialCM(ctx, qp, peer, uint16(port), nil); err == nil || ctx.Err() != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("connecting QP %d through rdma_cm to %s:%d: %w", i, peer, port, err)
		}
		conns = append(conns, c)
	}
	return closeAll, nil
}
