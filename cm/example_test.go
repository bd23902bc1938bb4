package cm_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/rdmakit/rdmakit/cm"
	"github.com/rdmakit/rdmakit/verbs"

	_ "github.com/rdmakit/rdmakit/transport/shm"
	_ "github.com/rdmakit/rdmakit/transport/tcp"
)

// A listener and a dialer connect, exchange private data, and the dialer
// sends a message to the acceptor.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// Both sides prove they hold this secret (in a real program: random
	// bytes from a file or a secret store, not a literal).
	secret := []byte("an example secret of 32 bytes...")

	l, err := cm.Listen(ctx, "127.0.0.1:0", cm.ListenOptions{
		// Other options zero: device tcp0, default QP caps, CQs, timeouts.
		Options: cm.Options{Secret: secret, PrivateData: []byte("welcome")},
		Check: func(r *cm.Request) error {
			if string(r.PrivateData) != "hello" {
				return fmt.Errorf("unknown client")
			}
			return nil
		},
	})
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

	d, err := cm.Dial(ctx, l.Addr().String(), cm.Options{Secret: secret, PrivateData: []byte("hello")})
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()
	a := <-accepted
	defer a.Close()
	fmt.Printf("dialer got %q, acceptor got %q\n", d.RemotePrivateData(), a.RemotePrivateData())

	// The acceptor posts a receive, the dialer sends.
	rbuf, _ := a.PD().AllocMR(64, verbs.AccessLocalWrite)
	a.QP().PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rbuf.SGE(0, 64)}}})
	sbuf, _ := d.PD().AllocMR(64, 0)
	n := copy(sbuf.Bytes(), "ping")
	d.QP().PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{sbuf.SGE(0, n)}}})

	wc := make([]verbs.WorkCompletion, 1)
	if _, err := a.RecvCQ().Wait(ctx, wc); err != nil || wc[0].Err() != nil {
		log.Fatal(err, wc[0].Err())
	}
	fmt.Printf("acceptor received %q\n", rbuf.Bytes()[:wc[0].ByteLen])

	// The dialer leaves; the acceptor notices.
	d.Close()
	<-a.Done()
	fmt.Println("acceptor sees the peer closed:", errors.Is(a.Err(), cm.ErrPeerClosed))
	// Output:
	// dialer got "welcome", acceptor got "hello"
	// acceptor received "ping"
	// acceptor sees the peer closed: true
}
