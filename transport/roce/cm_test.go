package roce_test

import (
	"context"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/cm"
	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"

	_ "github.com/rdmakit/rdmakit/transport/roce"
)

// TestCM: package cm's handshake (over TCP) connects roce queue pairs;
// a Write and a Send then travel as RoCEv2.
func TestCM(t *testing.T) {
	if !sys.HasUDPBatch {
		t.Skip("SKIP: roce needs Linux")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	opts := cm.Options{Device: "roce0", Insecure: true}
	l, err := cm.Listen(ctx, "127.0.0.1:0", cm.ListenOptions{Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	d, err := cm.Dial(ctx, l.Addr().String(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a := <-accepted
	if a == nil {
		t.FailNow()
	}
	defer a.Close()
	if d.QP().Context().Info().Transport != "roce" {
		t.Fatalf("transport %q", d.QP().Context().Info().Transport)
	}
	rbuf, err := a.PD().AllocMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	a.QP().PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rbuf.SGE(0, 64)}}})
	sbuf, _ := d.PD().AllocMR(1<<20, 0)
	for i := range sbuf.Bytes() {
		sbuf.Bytes()[i] = byte(i * 7)
	}
	if err := d.QP().PostSend([]verbs.SendWR{
		{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{sbuf.SGE(0, 1<<20)}, RemoteAddr: rbuf.Addr(), RKey: rbuf.RKey()},
		{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{sbuf.SGE(0, 64)}},
	}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := a.RecvCQ().Wait(ctx, wc); err != nil || wc[0].Err() != nil {
		t.Fatal(err, wc[0].Err())
	}
	for i := 64; i < 1<<20; i++ {
		if rbuf.Bytes()[i] != byte(i*7) {
			t.Fatalf("byte %d", i)
		}
	}
}
