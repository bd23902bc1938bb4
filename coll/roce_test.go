package coll

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/transport/roce"
	"github.com/rdmakit/rdmakit/verbs"
)

var devSoftRoCE = fakeDev("roce0", "roce", "Software", capsRoCE|verbs.CapSRQ, port(1, verbs.PortActive, "Ethernet"))

// TestPlanDevicesRoCE: auto never prefers software RoCEv2 to tcp (or to
// an RDMA NIC, or shm on one host) but uses it where it is all two ranks
// share; forced, it is used between every pair.
func TestPlanDevicesRoCE(t *testing.T) {
	// verbs.Devices lists roce before tcp.
	rc := []verbs.DeviceInfo{devSoftRoCE, devShm, devTCP}
	nic := []verbs.DeviceInfo{devSoftRoCE, devShm, devTCP, devMlx0}
	for _, tc := range []struct {
		name, mode, hosts string
		devs              [][]verbs.DeviceInfo
		want              [][]string
	}{
		{"auto, one host", "auto", "aa", [][]verbs.DeviceInfo{rc, rc}, [][]string{{"", "shm0"}, {"shm0", ""}}},
		{"auto, two hosts", "auto", "ab", [][]verbs.DeviceInfo{rc, rc}, [][]string{{"", "tcp0"}, {"tcp0", ""}}},
		{"auto, rdma nic", "auto", "ab", [][]verbs.DeviceInfo{nic, nic}, [][]string{{"", "mlx5_0"}, {"mlx5_0", ""}}},
		{"auto, roce only", "auto", "ab", [][]verbs.DeviceInfo{{devSoftRoCE}, {devSoftRoCE, devTCP}}, [][]string{{"", "roce0"}, {"roce0", ""}}},
		{"forced, one host", "roce", "aab", [][]verbs.DeviceInfo{rc, nic, rc},
			[][]string{{"", "roce0", "roce0"}, {"roce0", "", "roce0"}, {"roce0", "roce0", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			offers := make([]offer, len(tc.devs))
			hosts := make([]string, len(tc.devs))
			for r := range offers {
				offers[r] = localOffer(tc.devs[r], hcaFilter{})
				hosts[r] = tc.hosts[r : r+1]
			}
			for me := range offers {
				pl, err := planDevices(tc.mode, me, offers, hosts)
				if err != nil {
					t.Fatalf("rank %d: %v", me, err)
				}
				for p, d := range pl.devOf {
					name := ""
					if d != nil {
						name = d.Device
					}
					if name != tc.want[me][p] {
						t.Errorf("rank %d → %d: %q, want %q", me, p, name, tc.want[me][p])
					}
				}
			}
		})
	}
	if _, err := (Options{Transport: "roce"}).resolve(); err != nil {
		t.Errorf("Transport roce refused: %v", err)
	}
}

// TestCommRoCE: all-reduce and all-gather at 2 and 3 ranks over the
// loopback interface's roce device, each rank's context on its own port
// (RDMAKIT_ROCE_ADDR=:0), forced by RDMAKIT_COLL_TRANSPORT.
func TestCommRoCE(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SKIP (loud): transport/roce has devices on Linux only")
	}
	t.Setenv(roce.EnvIfaces, "lo")
	t.Setenv(roce.EnvAddr, ":0")
	t.Setenv(EnvTransport, "roce")
	ctx := context.Background()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			noErrors(t, runRanks(t, n, Options{}, func(c *Comm) error {
				for p := range n {
					if p != c.Rank() && c.Transport(p) != "roce0" {
						return fmt.Errorf("Transport(%d) = %q", p, c.Transport(p))
					}
				}
				for _, count := range []int{1, 1000, 300000} {
					for _, dt := range []DataType{Int32, Float32} {
						b := make([]byte, count*dt.Size())
						fill(dt, Sum, b, c.Rank(), 0)
						if err := c.AllReduce(ctx, b, b, dt, Sum); err != nil {
							return err
						}
						if err := diff(fmt.Sprintf("all-reduce %d %v", count, dt), dt, b, expect(dt, Sum, n, 0, count)); err != nil {
							return err
						}
					}
					send := make([]byte, count*4)
					fill(Int32, Sum, send, c.Rank(), 0)
					recv := make([]byte, n*len(send))
					if err := c.AllGather(ctx, send, recv, Int32); err != nil {
						return err
					}
					for r := range n {
						want := make([]byte, len(send))
						fill(Int32, Sum, want, r, 0)
						if err := diff(fmt.Sprintf("all-gather %d from rank %d", count, r), Int32, recv[r*len(send):(r+1)*len(send)], want); err != nil {
							return err
						}
					}
				}
				return nil
			}))
		})
	}
	t.Setenv(EnvTransport, "rocev3")
	if _, err := (Options{}).resolve(); err == nil || !strings.Contains(err.Error(), "auto, shm, tcp, roce or ibverbs") {
		t.Errorf("bad transport: %v", err)
	}
}
