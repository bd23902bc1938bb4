package verbs_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"time"

	"github.com/rdmakit/rdmakit/cm"
	"github.com/rdmakit/rdmakit/verbs"

	_ "github.com/rdmakit/rdmakit/transport/shm" // link the transports you want
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

// The README's first program: two queue pairs connected with package cm
// on tcp0 over loopback. The server tells the client where its memory
// region is (address and rkey, in the connection's private data); the
// client writes into it with RDMA Write, then sends a message, which
// tells the server the data is there (RC delivers in order).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Server: a device, a protection domain, a region the peer may write.
	// Zero Options are the documented defaults; this program needs little
	// memory, so it reserves 1 GiB of address space instead of 64 GiB.
	sctx, err := verbs.Open("tcp0", verbs.Options{ArenaSize: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer sctx.Close()
	spd, _ := sctx.AllocPD()
	target, _ := spd.AllocMR(1<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	inbox, _ := spd.AllocMR(64, verbs.AccessLocalWrite)

	// Both sides prove a shared secret (cm refuses to run without a
	// credential; TLS is the other kind). A real program reads it from
	// its configuration: 16 random bytes at least.
	secret := []byte("example secret, 32 bytes long!!!")

	// The region's address and rkey go to the client with the accept.
	var where [12]byte
	binary.BigEndian.PutUint64(where[0:], target.Addr())
	binary.BigEndian.PutUint32(where[8:], target.RKey())
	l, err := cm.Listen(ctx, "127.0.0.1:0", cm.ListenOptions{Options: cm.Options{PD: spd, PrivateData: where[:], Secret: secret}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		accepted <- c
	}()

	// Client: its own device context, PD and source buffer.
	cctx, err := verbs.Open("tcp0", verbs.Options{ArenaSize: 1 << 30})
	if err != nil {
		log.Fatal(err)
	}
	defer cctx.Close()
	cpd, _ := cctx.AllocPD()
	mr, _ := cpd.AllocMR(4096, verbs.AccessLocalWrite)
	client, err := cm.Dial(ctx, l.Addr().String(), cm.Options{PD: cpd, Secret: secret})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	server := <-accepted
	defer server.Close()

	// The server posts a receive for the client's message.
	server.QP().PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{inbox.SGE(0, 64)}}})

	// The client writes 4096 bytes into the server's region, then sends.
	raddr := binary.BigEndian.Uint64(client.RemotePrivateData()[0:])
	rkey := binary.BigEndian.Uint32(client.RemotePrivateData()[8:])
	copy(mr.Bytes(), "hello, remote memory")
	n := copy(mr.Bytes()[2048:], "done")
	qp := client.QP()
	qp.PostSend([]verbs.SendWR{
		{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{mr.SGE(0, 4096)}, RemoteAddr: raddr, RKey: rkey},
		{ID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{mr.SGE(2048, n)}},
	})
	wcs := make([]verbs.WorkCompletion, 2)
	for got := 0; got < 2; {
		k, err := client.SendCQ().Wait(ctx, wcs[got:])
		if err != nil {
			log.Fatal(err)
		}
		got += k
	}
	fmt.Println("client:", wcs[0].Opcode, wcs[0].Err(), wcs[1].Opcode, wcs[1].Err())

	// The server's receive completes; the write landed before it.
	if _, err := server.RecvCQ().Wait(ctx, wcs[:1]); err != nil || wcs[0].Err() != nil {
		log.Fatal(err, wcs[0].Err())
	}
	fmt.Printf("server: received %q; region holds %q\n", inbox.Bytes()[:wcs[0].ByteLen], target.Bytes()[:20])
	// Output:
	// client: RDMA_WRITE <nil> SEND <nil>
	// server: received "done"; region holds "hello, remote memory"
}

// pair is two connected queue pairs (package cm on tcp0 over loopback),
// each with a 4 KiB region the other may write, read and use for atomics.
type pair struct {
	a, b     *cm.Conn
	amr, bmr *verbs.MR
	actx     *verbs.Context
	bctx     *verbs.Context
}

func (p *pair) Close() { p.a.Close(); p.b.Close(); p.actx.Close(); p.bctx.Close() }

// connect makes a pair; the examples below use it.
func connect(ctx context.Context) *pair {
	var err error
	p := &pair{}
	if p.actx, err = verbs.Open("tcp0", verbs.Options{ArenaSize: 1 << 30}); err != nil {
		log.Fatal(err)
	}
	if p.bctx, err = verbs.Open("tcp0", verbs.Options{ArenaSize: 1 << 30}); err != nil {
		log.Fatal(err)
	}
	apd, _ := p.actx.AllocPD()
	bpd, _ := p.bctx.AllocPD()
	l, err := cm.Listen(ctx, "127.0.0.1:0", cm.ListenOptions{Options: cm.Options{PD: bpd, Secret: exampleSecret}})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			log.Fatal(err)
		}
		accepted <- c
	}()
	if p.a, err = cm.Dial(ctx, l.Addr().String(), cm.Options{PD: apd, Secret: exampleSecret}); err != nil {
		log.Fatal(err)
	}
	p.b = <-accepted
	a, b := p.a, p.b
	const all = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if p.amr, err = a.PD().AllocMR(4096, all); err != nil {
		log.Fatal(err)
	}
	if p.bmr, err = b.PD().AllocMR(4096, all); err != nil {
		log.Fatal(err)
	}
	return p
}

// wait waits for one completion on cq and fails on an error status.
func wait(ctx context.Context, cq *verbs.CQ) verbs.WorkCompletion {
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := cq.Wait(ctx, wc); err != nil {
		log.Fatal(err)
	}
	if err := wc[0].Err(); err != nil {
		log.Fatal(err)
	}
	return wc[0]
}

// RDMA Write: copy local memory into the peer's region; the peer's CPU
// takes no part and sees no completion.
func ExampleQP_PostSend_write() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := connect(ctx)
	defer p.Close()

	n := copy(p.amr.Bytes(), "written by a")
	err := p.a.QP().PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.amr.SGE(0, n)}, RemoteAddr: p.bmr.Addr(), RKey: p.bmr.RKey()}})
	if err != nil {
		log.Fatal(err)
	}
	wc := wait(ctx, p.a.SendCQ())
	fmt.Println(wc.Opcode, wc.WRID)
	fmt.Printf("%q\n", p.bmr.Bytes()[:n])
	// Output:
	// RDMA_WRITE 1
	// "written by a"
}

// RDMA Read: fetch the peer's memory into a local region.
func ExampleQP_PostSend_read() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := connect(ctx)
	defer p.Close()

	n := copy(p.bmr.Bytes(), "b's data")
	err := p.a.QP().PostSend([]verbs.SendWR{{ID: 7, Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.amr.SGE(0, n)}, RemoteAddr: p.bmr.Addr(), RKey: p.bmr.RKey()}})
	if err != nil {
		log.Fatal(err)
	}
	wc := wait(ctx, p.a.SendCQ())
	fmt.Println(wc.Opcode, wc.ByteLen)
	fmt.Printf("%q\n", p.amr.Bytes()[:n])
	// Output:
	// RDMA_READ 8
	// "b's data"
}

// Send and Receive: the receiver posts a buffer first; the message lands
// in it and completes on the receiver's CQ with its length.
func ExampleQP_PostRecv() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := connect(ctx)
	defer p.Close()

	if err := p.b.QP().PostRecv([]verbs.RecvWR{{ID: 42, SGL: []verbs.SGE{p.bmr.SGE(0, 4096)}}}); err != nil {
		log.Fatal(err)
	}
	n := copy(p.amr.Bytes(), "a message")
	if err := p.a.QP().PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{p.amr.SGE(0, n)}}}); err != nil {
		log.Fatal(err)
	}
	wc := wait(ctx, p.b.RecvCQ())
	fmt.Println(wc.Opcode, wc.WRID, wc.ByteLen)
	fmt.Printf("%q\n", p.bmr.Bytes()[:wc.ByteLen])
	// Output:
	// RECV 42 9
	// "a message"
}

// Atomics: Fetch-and-Add and Compare-and-Swap on an 8-byte word of the
// peer's region; the old value comes back into the local buffer.
func ExampleQP_PostSend_atomics() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := connect(ctx)
	defer p.Close()

	counter := p.bmr.Bytes()[:8]
	binary.NativeEndian.PutUint64(counter, 100)
	qp := p.a.QP()
	if err := qp.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpFetchAndAdd, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.amr.SGE(0, 8)}, RemoteAddr: p.bmr.Addr(), RKey: p.bmr.RKey(), CompareAdd: 5}}); err != nil {
		log.Fatal(err)
	}
	wait(ctx, p.a.SendCQ())
	fmt.Println("fetch-and-add: old", binary.NativeEndian.Uint64(p.amr.Bytes()), "new", binary.NativeEndian.Uint64(counter))

	if err := qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpCompareAndSwap, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.amr.SGE(8, 8)}, RemoteAddr: p.bmr.Addr(), RKey: p.bmr.RKey(), CompareAdd: 105, Swap: 7}}); err != nil {
		log.Fatal(err)
	}
	wait(ctx, p.a.SendCQ())
	fmt.Println("compare-and-swap: old", binary.NativeEndian.Uint64(p.amr.Bytes()[8:]), "new", binary.NativeEndian.Uint64(counter))
	// Output:
	// fetch-and-add: old 100 new 105
	// compare-and-swap: old 105 new 7
}

// Immediate data: RDMA Write with Immediate writes like a Write and also
// consumes a receive at the peer, whose completion carries the 32-bit
// value (Send with Immediate carries it with a message).
func ExampleQP_PostSend_immediate() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := connect(ctx)
	defer p.Close()

	// The receive gets no data (a Write with Immediate puts its data at
	// RemoteAddr), so it needs no buffer.
	if err := p.b.QP().PostRecv([]verbs.RecvWR{{ID: 9}}); err != nil {
		log.Fatal(err)
	}
	n := copy(p.amr.Bytes(), "payload")
	if err := p.a.QP().PostSend([]verbs.SendWR{{Opcode: verbs.OpWriteWithImm, Imm: 0xC0FFEE,
		SGL: []verbs.SGE{p.amr.SGE(0, n)}, RemoteAddr: p.bmr.Addr(), RKey: p.bmr.RKey()}}); err != nil {
		log.Fatal(err)
	}
	wc := wait(ctx, p.b.RecvCQ())
	fmt.Printf("%v imm=%#x len=%d %q\n", wc.Opcode, wc.Imm, wc.ByteLen, p.bmr.Bytes()[:n])
	// Output:
	// RECV_RDMA_WITH_IMM imm=0xc0ffee len=7 "payload"
}

// exampleSecret is the shared secret the examples' pairs prove to each
// other (cm requires a credential).
var exampleSecret = []byte("example secret, 32 bytes long!!!")
