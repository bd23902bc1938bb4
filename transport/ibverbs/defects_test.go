//go:build ibverbs

package ibverbs_test

// The defects themselves: each test turns the workaround off and shows the
// driver still misbehaves (PASS: the defect is there, so the workaround is
// needed) or skips where the device is sound. They never fail: a kernel
// that fixed a defect is good news. siw's NULL dereference on an empty
// first SGE is not shown this way: it panics the machine.

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/internal/conformance"
	"github.com/rdmakit/rdmakit/transport/ibverbs"
	"github.com/rdmakit/rdmakit/verbs"
)

func defectPair(t *testing.T, dev string) (p *conformance.Pair, a, b *conformance.End) {
	t.Helper()
	var err error
	ibverbs.WithoutWorkarounds(func() { p, err = conformance.NewPair(dev, 1<<16, 64) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, p.A, p.B
}

// TestDefectShortReadAcrossPage: without the split, short Reads across a
// page of their source.
func TestDefectShortReadAcrossPage(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			_, a, b := defectPair(t, d.Name)
			fill(b.MR.Bytes(), 11)
			src := b.MR.Bytes()
			// Two bytes before the page: the driver's first part is then
			// size-2 bytes long where it should be 2.
			wrong, n, lo, hi := 0, 0, 0, 0
			for size := 3; size <= 64; size++ {
				const before = 2
				roff, loff := 4*4096-before, 32768+(n%16)*128
				clear(a.MR.Bytes()[loff : loff+size])
				if err := a.QP.PostSend([]verbs.SendWR{{ID: uint64(n), Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
					SGL: []verbs.SGE{a.MR.SGE(loff, size)}, RemoteAddr: b.MR.Addr() + uint64(roff), RKey: b.MR.RKey()}}); err != nil {
					t.Fatal(err)
				}
				wc := pollN(t, a.SCQ, 1, 10*time.Second)[0]
				if wc.Status == verbs.StatusSuccess && string(a.MR.Bytes()[loff:loff+size]) != string(src[roff:roff+size]) {
					wrong++
					if lo == 0 {
						lo = size
					}
					hi = size
				}
				n++
			}
			if wrong == 0 {
				t.Skipf("%s returned the right bytes for all %d reads", d.Name, n)
			}
			t.Logf("defect present on %s: %d of %d page-crossing reads (3..64 bytes, 2 before the page) completed with success and wrong bytes, sizes %d..%d", d.Name, wrong, n, lo, hi)
		})
	}
}

// TestDefectZeroLengthReadAfterRead: without the refusal, zero-length Reads
// right behind a Read.
func TestDefectZeroLengthReadAfterRead(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			_, a, b := defectPair(t, d.Name)
			rd := func(id uint64, n int) verbs.SendWR {
				return verbs.SendWR{ID: id, Opcode: verbs.OpRead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(0, n)},
					RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}
			}
			for i := 0; i < 50; i++ {
				if err := a.QP.PostSend([]verbs.SendWR{rd(1, 4096), rd(2, 0)}); err != nil {
					t.Fatal(err)
				}
				for _, wc := range pollN(t, a.SCQ, 2, 20*time.Second) {
					if wc.Status != verbs.StatusSuccess {
						t.Logf("defect present on %s: round %d, read %d completed with %q; QP %s", d.Name, i, wc.WRID, wc.Status, a.QP.State())
						return
					}
				}
			}
			t.Skipf("%s completed 50 zero-length reads behind a read", d.Name)
		})
	}
}

// TestDefectRNRThenBadLKey: without the stall watch, a Send with a bad lkey
// behind a Send waiting out an RNR NAK.
func TestDefectRNRThenBadLKey(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			if !d.Caps.Has(verbs.CapRNRRetry) {
				t.Skip("no RNR retry on this device")
			}
			_, a, b := defectPair(t, d.Name)
			if err := a.QP.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)}}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			bad := a.MR.SGE(64, 64)
			bad.LKey ^= 0x5a5a00
			if err := a.QP.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{bad}}}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
			if err := b.QP.PostRecv([]verbs.RecvWR{{ID: 5, SGL: []verbs.SGE{b.MR.SGE(0, 256)}}}); err != nil {
				t.Fatal(err)
			}
			wcs := make([]verbs.WorkCompletion, 4)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			k, _ := a.SCQ.Wait(ctx, wcs)
			sa, sb := a.QP.State(), b.QP.State()
			// Unstick it for Close.
			a.QP.Modify(verbs.QPAttr{State: verbs.QPError})
			if k > 0 {
				t.Skipf("%s completed %+v", d.Name, wcs[:k])
			}
			t.Logf("defect present on %s: nothing completed in 5 s after the receive was posted; QPs %s and %s", d.Name, sa, sb)
		})
	}
}

// TestDefectRecvInError: without the workaround, a receive posted to a QP
// in ERROR.
func TestDefectRecvInError(t *testing.T) {
	for _, d := range devices(t) {
		t.Run(d.Name, func(t *testing.T) {
			if !d.Caps.Has(verbs.CapRemoteErrorCompletion) {
				t.Skip("iWARP: rdmakit's own flush path, not a workaround")
			}
			_, a, _ := defectPair(t, d.Name)
			if err := a.QP.Modify(verbs.QPAttr{State: verbs.QPError}); err != nil {
				t.Fatal(err)
			}
			if err := a.QP.PostRecv([]verbs.RecvWR{{ID: 20, SGL: []verbs.SGE{a.MR.SGE(0, 64)}}}); err != nil {
				t.Fatal(err)
			}
			wcs := make([]verbs.WorkCompletion, 4)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if k, _ := a.RCQ.Wait(ctx, wcs); k > 0 {
				t.Skipf("%s flushed it: %+v", d.Name, wcs[:k])
			}
			t.Logf("defect present on %s: a receive posted in ERROR not flushed within 2 s", d.Name)
		})
	}
}
