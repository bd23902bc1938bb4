package main

// rdmakit ping on roce devices: the RDMA CM is transport/roce's (MADs
// over UD QP 1), so no cgo is needed. Registered after ibverbs' (file
// order): without --dev, an RDMA NIC that rdma_cm finds for the address
// comes first.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"

	"github.com/rdmakit/rdmakit/transport/roce"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	registerPingCM("roce", &pingCM{
		deviceFor: roceDeviceFor,
		dial: func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (io.Closer, error) {
			return roce.DialCM(ctx, qp, ip, port, nil)
		},
		listen: func(vctx *verbs.Context, ip net.IP, port uint16) (pingListener, error) {
			l, err := roce.ListenCM(vctx, ip, port, nil)
			if err != nil {
				return nil, err
			}
			return roceListener{l}, nil
		},
	})
}

// roceDeviceFor is the roce device with address ip (local) or with the
// address the system routes to ip from. Unless RDMAKIT_ROCE_ADDR says
// otherwise, the device's socket binds that address.
func roceDeviceFor(ip net.IP, local bool) (string, error) {
	want, ok := netip.AddrFromSlice(ip)
	if !ok {
		return "", fmt.Errorf("roce: address %v", ip)
	}
	want = want.Unmap()
	if !local {
		c, err := net.DialUDP("udp", nil, &net.UDPAddr{IP: ip, Port: 4791}) // sends nothing
		if err != nil {
			return "", fmt.Errorf("roce: no route to %s: %w", ip, err)
		}
		want = c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
		c.Close()
	}
	devs, err := verbs.Devices()
	if err != nil {
		return "", err
	}
	for _, d := range devs {
		if d.Transport != "roce" || len(d.Ports) == 0 {
			continue
		}
		for _, g := range d.Ports[0].GIDs {
			if a, ok := netip.AddrFromSlice(g); ok && a.Unmap() == want {
				if os.Getenv(roce.EnvAddr) == "" {
					os.Setenv(roce.EnvAddr, want.String())
				}
				return d.Name, nil
			}
		}
	}
	return "", fmt.Errorf("roce: no roce device has address %s", want)
}

type roceListener struct{ l *roce.CMListener }

func (r roceListener) Accept(ctx context.Context, qp *verbs.QP) (io.Closer, error) {
	return r.l.Accept(ctx, qp)
}

func (r roceListener) Close() error { return r.l.Close() }
