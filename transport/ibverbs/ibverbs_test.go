//go:build ibverbs

package ibverbs_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

func TestMain(m *testing.M) {
	conformance.ServePeerIfChild()
	goleak.VerifyTestMain(m)
}

// devices returns the ibverbs devices to test: RDMAKIT_IBV_DEVICES
// (comma-separated) or all of them.
func devices(t testing.TB) []verbs.DeviceInfo {
	all, err := verbs.Devices()
	if err != nil {
		t.Logf("listing devices: %v", err)
	}
	var out []verbs.DeviceInfo
	want := os.Getenv("RDMAKIT_IBV_DEVICES")
	for _, d := range all {
		if d.Transport != ibverbs.TransportName {
			continue
		}
		if want != "" && !strings.Contains(","+want+",", ","+d.Name+",") {
			continue
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		t.Skip(ibverbs.NoDeviceHint)
	}
	return out
}

func TestDevices(t *testing.T) {
	for _, d := range devices(t) {
		t.Logf("%s: node %s, fw %s, max_qp %d, max_qp_wr %d, max_sge %d, max_cqe %d, max_inline %d, atomic_cap %d, max_mr_size %#x",
			d.Name, d.NodeType, d.FWVersion, d.MaxQP, d.MaxQPWR, d.MaxSGE, d.MaxCQE, d.MaxInline, d.AtomicCap, d.MaxMRSize)
		if len(d.Ports) == 0 {
			t.Errorf("%s: no ports", d.Name)
		}
		for _, p := range d.Ports {
			t.Logf("  port %d: %s, %s, active MTU %d, GIDs %v, addrs %v", p.Num, p.State, p.LinkLayer, p.ActiveMTU.Bytes(), p.GIDs, p.Addrs)
			if p.State != verbs.PortActive {
				t.Errorf("%s port %d is %s", d.Name, p.Num, p.State)
			}
		}
	}
}

func TestConformance(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) { conformance.Run(t, d.Name) })
	}
}

// TestAliasKeepsMemoryReserved: AllocMR memory registered twice is not
// handed out again while the alias's keys live.
func TestAliasKeepsMemoryReserved(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) { conformance.AliasKeepsMemoryReserved(t, d.Name) })
	}
}

// TestNoAllocs checks that PostSend and Poll allocate nothing.
func TestNoAllocs(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			p, err := conformance.NewPair(d.Name, 1<<16, 64)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			a := p.A
			wr := []verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: p.B.MR.Addr(), RKey: p.B.MR.RKey()}}
			wcs := make([]verbs.WorkCompletion, 16)
			allocs := testing.AllocsPerRun(200, func() {
				if err := a.QP.PostSend(wr); err != nil {
					t.Fatal(err)
				}
				for n := 0; n == 0; {
					n, err = a.SCQ.Poll(wcs)
					if err != nil {
						t.Fatal(err)
					}
				}
			})
			if allocs != 0 {
				t.Fatalf("%.1f allocations per PostSend+Poll, want 0", allocs)
			}
		})
	}
}

// TestBadInput checks the errors that tell users what to do.
func TestBadInput(t *testing.T) {
	if _, err := verbs.Open("no-such-ibverbs-device", verbs.Options{}); err == nil {
		t.Fatal("opening a missing device succeeded")
	}
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			ctx, err := verbs.Open(d.Name, verbs.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer ctx.Close()
			pd, _ := ctx.AllocPD()
			cq, _ := ctx.CreateCQ(16)
			qp, err := pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: cq})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { qp.Close(); cq.Close(); pd.Close() }()
			if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, Port: 1, AccessFlags: verbs.AccessRemoteWrite}); err != nil {
				t.Fatal(err)
			}
			err = qp.Modify(verbs.QPAttr{State: verbs.QPRTR, DestQPN: 5})
			if err == nil || !strings.Contains(err.Error(), "Address") {
				t.Fatalf("RTR without a peer address: %v", err)
			}
			// A blocking wait honours its context.
			c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			wcs := make([]verbs.WorkCompletion, 1)
			if _, err := cq.Wait(c, wcs); err != context.DeadlineExceeded {
				t.Fatalf("Wait on an idle CQ: %v, want deadline exceeded", err)
			}
		})
	}
}

func BenchmarkPollEmpty(b *testing.B) {
	d := devices(b)[0]
	ctx, err := verbs.Open(d.Name, verbs.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Close()
	cq, _ := ctx.CreateCQ(64)
	defer cq.Close()
	wcs := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	for b.Loop() {
		cq.Poll(wcs)
	}
}

// BenchmarkWrite8 is one signaled 8-byte RDMA Write per PostSend, polled.
func BenchmarkWrite8(b *testing.B) { benchWrite(b, 1) }

// BenchmarkWrite8Batch16 posts 16 writes per PostSend (one chain, one
// cgo call), the last signaled.
func BenchmarkWrite8Batch16(b *testing.B) { benchWrite(b, 16) }

func benchWrite(b *testing.B, batch int) {
	d := devices(b)[0]
	p, err := conformance.NewPair(d.Name, 1<<16, 64)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	a := p.A
	wrs := make([]verbs.SendWR, batch)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(8*i, 8)},
			RemoteAddr: p.B.MR.Addr() + uint64(8*i), RKey: p.B.MR.RKey()}
	}
	wrs[batch-1].Flags = verbs.SendSignaled
	wcs := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	for b.Loop() {
		if err := a.QP.PostSend(wrs); err != nil {
			b.Fatal(err)
		}
		for n := 0; n == 0; {
			n, err = a.SCQ.Poll(wcs)
			if err != nil {
				b.Fatal(err)
			}
			if n > 0 && wcs[0].Status != verbs.StatusSuccess {
				b.Fatal(wcs[0].Err())
			}
		}
	}
	b.ReportMetric(float64(batch), "wr/op")
}
