package cm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

var (
	secretA = []byte("0123456789abcdef0123456789abcdef")
	secretB = []byte("fedcba9876543210fedcba9876543210")
)

// handshakeErrors collects what a Listener reports.
func handshakeErrors() (chan error, func(error)) {
	ch := make(chan error, 100)
	return ch, func(err error) {
		select {
		case ch <- err:
		default:
		}
	}
}

func nextErr(t *testing.T, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the listener reported nothing")
		return nil
	}
}

// checkTraffic sends one message from d to a over the connected QPs.
func checkTraffic(t *testing.T, d, a *Conn) {
	t.Helper()
	rbuf, err := a.PD().AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer rbuf.Dereg()
	if err := a.QP().PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{rbuf.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	sbuf, err := d.PD().AllocMR(64, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sbuf.Dereg()
	copy(sbuf.Bytes(), "authenticated")
	if err := d.QP().PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{sbuf.SGE(0, 13)}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.RecvCQ()); wc.Err() != nil || string(rbuf.Bytes()[:wc.ByteLen]) != "authenticated" {
		t.Fatalf("receive: %v %q", wc.Err(), rbuf.Bytes()[:wc.ByteLen])
	}
}

func TestNoCredentialRefused(t *testing.T) {
	leakCheck(t)
	ctx := testCtx(t)
	if _, err := Listen(ctx, "127.0.0.1:0", ListenOptions{}); !errors.Is(err, ErrNoCredential) {
		t.Errorf("Listen with zero options: %v", err)
	}
	if _, err := Dial(ctx, "127.0.0.1:1", Options{}); !errors.Is(err, ErrNoCredential) {
		t.Errorf("Dial with zero options: %v", err)
	}
	pki := newPKI(t)
	// TLS that does not authenticate the peer is no credential.
	if _, err := Listen(ctx, "127.0.0.1:0", ListenOptions{Options: Options{TLS: pki.serverConfig(false)}}); !errors.Is(err, ErrNoCredential) {
		t.Errorf("Listen with TLS but no client certificates required: %v", err)
	}
	if _, err := Dial(ctx, "127.0.0.1:1", Options{TLS: &tls.Config{InsecureSkipVerify: true}}); !errors.Is(err, ErrNoCredential) {
		t.Errorf("Dial with TLS that does not verify: %v", err)
	}
	if _, err := Dial(ctx, "127.0.0.1:1", Options{Secret: []byte("short")}); !errors.Is(err, verbs.ErrInvalidArgument) {
		t.Errorf("Dial with a 5-byte secret: %v", err)
	}
}

func TestSecret(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		proved := make(chan bool, 1)
		l := listen(t, ListenOptions{Options: Options{Device: dev, Secret: secretA, PrivateData: []byte("hi")},
			Check: func(r *Request) error { proved <- r.SecretProved; return nil }})
		d, a := pair(t, l, Options{Device: dev, Secret: secretA, PrivateData: []byte("ho")})
		if !<-proved {
			t.Error("Request.SecretProved is false")
		}
		if string(d.RemotePrivateData()) != "hi" || string(a.RemotePrivateData()) != "ho" {
			t.Errorf("private data %q %q", d.RemotePrivateData(), a.RemotePrivateData())
		}
		checkTraffic(t, d, a)
	})
}

// A wrong secret, or a secret on one side only, is refused on both sides
// with ErrAuth.
func TestSecretRefused(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	for _, tc := range []struct {
		name             string
		listener, dialer Options
		dialerSays       string
		listenerSays     string
	}{
		{"wrong secret", Options{Secret: secretA}, Options{Secret: secretB},
			"listener's proof of the shared secret does not verify", "rejected by peer (authentication)"},
		{"listener only", Options{Secret: secretA}, Options{Insecure: true},
			"requires a shared secret", "requires a shared secret"},
		{"dialer only", Options{Insecure: true}, Options{Secret: secretA},
			"offers a shared secret; this listener has none", "offers a shared secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs, report := handshakeErrors()
			lo := tc.listener
			lo.Device = dev
			l := listen(t, ListenOptions{Options: lo, OnHandshakeError: report})
			do := tc.dialer
			do.Device = dev
			_, err := Dial(testCtx(t), l.Addr().String(), do)
			if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.dialerSays) {
				t.Errorf("Dial: %v", err)
			}
			if err := nextErr(t, hs); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), tc.listenerSays) {
				t.Errorf("listener: %v", err)
			}
		})
	}
}

// A dialer that takes the listener's challenge on trust and proves a
// different secret is refused by the listener, which says why.
func TestSecretWrongDialerProof(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	hs, report := handshakeErrors()
	l := listen(t, ListenOptions{Options: Options{Device: dev, Secret: secretA}, OnHandshakeError: report})
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	s := &session{secret: secretB, nD: newNonce()}
	writeMsg(c, &msg{typ: msgAuthHello, version: protoVersion, nonce: s.nD})
	ch, err := readMsg(c)
	if err != nil || ch.typ != msgAuthChallenge {
		t.Fatalf("challenge: %+v %v", ch, err)
	}
	s.nL = ch.nonce
	p, _ := writeMsgRaw(c, &msg{typ: msgRequest, version: protoVersion, transport: "tcp", device: "tcp0", qpn: 1, mtu: verbs.MTU1024, peerTimeoutMs: 1000})
	writeMsg(c, &msg{typ: msgProof, mac: s.mac(labelRequest, p)})
	m, err := readMsg(c)
	if err != nil || m.typ != msgReject || m.code != RejectAuth || !strings.Contains(m.reason, "dialer's proof") {
		t.Errorf("reply to a wrong proof: %+v %v", m, err)
	}
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "dialer's proof of the shared secret does not verify") {
		t.Errorf("listener: %v", err)
	}
}

// recorder is a TCP proxy that records what the dialer sends.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	sent bytes.Buffer
	wg   sync.WaitGroup
}

func newRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			io.Copy(c, s)
			c.Close()
		}()
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			r.mu.Lock()
			r.sent.Write(buf[:n])
			r.mu.Unlock()
			if n > 0 {
				s.Write(buf[:n])
			}
			if err != nil {
				s.Close()
				return
			}
		}
	}()
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

// Replayed and reflected proofs fail: the nonces are fresh on both sides
// and each role's MAC has its own label.
func TestSecretReplay(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	hs, report := handshakeErrors()
	l := listen(t, ListenOptions{Options: Options{Device: dev, Secret: secretA}, OnHandshakeError: report})

	// Record what a legitimate dialer sends up to its ready.
	rec := newRecorder(t, l.Addr().String())
	accepted := make(chan *Conn, 1)
	go func() {
		c, _ := l.Accept(testCtx(t))
		accepted <- c
	}()
	d, err := Dial(testCtx(t), rec.ln.Addr().String(), Options{Device: dev, Secret: secretA})
	if err != nil {
		t.Fatal(err)
	}
	a := <-accepted
	rec.mu.Lock()
	recorded := append([]byte(nil), rec.sent.Bytes()...)
	rec.mu.Unlock()
	d.Close()
	a.Close()

	// 1. Replay the dialer's bytes (hello, request, proof, ready) to the
	// listener: its fresh nonce makes the request's proof fail.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write(recorded)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if m, err := readMsg(c); err != nil || m.typ != msgAuthChallenge {
		t.Fatalf("challenge: %+v %v", m, err)
	}
	if m, err := readMsg(c); err != nil || m.typ != msgReject || m.code != RejectAuth {
		t.Errorf("reply to a replayed request: %+v %v", m, err)
	}
	c.Close()
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "dialer's proof") {
		t.Errorf("listener on a replayed request: %v", err)
	}

	// 2. Reflect the listener's challenge MAC back as the dialer's proof.
	c, err = net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	writeMsg(c, &msg{typ: msgAuthHello, version: protoVersion, nonce: newNonce()})
	ch, err := readMsg(c)
	if err != nil || ch.typ != msgAuthChallenge {
		t.Fatalf("challenge: %+v %v", ch, err)
	}
	writeMsg(c, &msg{typ: msgRequest, version: protoVersion, transport: "tcp", device: "tcp0", qpn: 1, mtu: verbs.MTU1024, peerTimeoutMs: 1000})
	writeMsg(c, &msg{typ: msgProof, mac: ch.mac})
	if m, err := readMsg(c); err != nil || m.typ != msgReject || m.code != RejectAuth {
		t.Errorf("reply to a reflected proof: %+v %v", m, err)
	}
	c.Close()
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) {
		t.Errorf("listener on a reflected proof: %v", err)
	}

	// 3. A fake listener relays a challenge the real one issued (for
	// another dialer's nonce) to a new dialer: the dialer refuses it and
	// discloses nothing about its QP.
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	got := make(chan []byte, 1)
	go func() {
		fc, err := fake.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer fc.Close()
		fc.SetDeadline(time.Now().Add(10 * time.Second))
		readMsg(fc) // the dialer's hello
		writeMsg(fc, &msg{typ: msgAuthChallenge, nonce: ch.nonce, mac: ch.mac})
		rest, _ := io.ReadAll(fc)
		got <- rest
	}()
	_, err = Dial(testCtx(t), fake.Addr().String(), Options{Device: dev, Secret: secretA})
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "listener's proof") {
		t.Errorf("Dial to a relayed challenge: %v", err)
	}
	if m, err := readMsg(bytes.NewReader(<-got)); err != nil || m.typ != msgReject || m.code != RejectAuth {
		t.Errorf("the dialer sent %+v (%v) after a relayed challenge, want only a reject", m, err)
	}
}

// pki is a test certificate authority with a server and a client
// certificate.
type pki struct {
	pool           *x509.CertPool
	server, client tls.Certificate
	ca             *x509.Certificate
	caKey          *ecdsa.PrivateKey
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rdmakit test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(der)
	p := &pki{pool: x509.NewCertPool(), ca: ca, caKey: caKey}
	p.pool.AddCert(ca)
	p.server = p.issue(t, "server", x509.ExtKeyUsageServerAuth)
	p.client = p.issue(t, "client", x509.ExtKeyUsageClientAuth)
	return p
}

var serial int64 = 10

func (p *pki) issue(t *testing.T, cn string, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (p *pki) serverConfig(mutual bool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{p.server}}
	if mutual {
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = p.pool
	}
	return c
}

func (p *pki) clientConfig(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: p.pool}
	if withCert {
		c.Certificates = []tls.Certificate{p.client}
	}
	return c
}

func TestTLS(t *testing.T) {
	forEachDevice(t, func(t *testing.T, dev string) {
		p := newPKI(t)
		// Server authentication only: the listener says Insecure, since
		// TLS alone does not tell it who the dialer is.
		l := listen(t, ListenOptions{Options: Options{Device: dev, TLS: p.serverConfig(false), Insecure: true}})
		d, a := pair(t, l, Options{Device: dev, TLS: p.clientConfig(false)})
		if d.TLS() == nil || a.TLS() == nil || !d.TLS().HandshakeComplete {
			t.Fatal("the control connection is not TLS")
		}
		checkTraffic(t, d, a)
		// Heartbeats and the disconnect travel over TLS too.
		d.Close()
		waitDone(t, a, 5*time.Second)
		if !errors.Is(a.Err(), ErrPeerClosed) {
			t.Errorf("acceptor: %v", a.Err())
		}
	})
}

func TestMutualTLS(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	p := newPKI(t)
	hs, report := handshakeErrors()
	var peer string
	l := listen(t, ListenOptions{Options: Options{Device: dev, TLS: p.serverConfig(true)}, OnHandshakeError: report,
		Check: func(r *Request) error {
			if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
				return errors.New("no verified client certificate")
			}
			peer = r.TLS.PeerCertificates[0].Subject.CommonName
			return nil
		}})
	d, a := pair(t, l, Options{Device: dev, TLS: p.clientConfig(true)})
	if peer != "client" {
		t.Errorf("Check saw client %q", peer)
	}
	checkTraffic(t, d, a)

	// No client certificate.
	_, err := Dial(testCtx(t), l.Addr().String(), Options{Device: dev, TLS: p.clientConfig(false)})
	if !errors.Is(err, ErrAuth) {
		t.Errorf("Dial without a client certificate: %v", err)
	}
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) {
		t.Errorf("listener: %v", err)
	}
	// A client certificate from another CA.
	other := newPKI(t)
	cfg := p.clientConfig(false)
	cfg.Certificates = []tls.Certificate{other.client}
	if _, err := Dial(testCtx(t), l.Addr().String(), Options{Device: dev, TLS: cfg}); !errors.Is(err, ErrAuth) {
		t.Errorf("Dial with an untrusted client certificate: %v", err)
	}
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) {
		t.Errorf("listener: %v", err)
	}
	// A server certificate the dialer does not trust.
	if _, err := Dial(testCtx(t), l.Addr().String(), Options{Device: dev, TLS: other.clientConfig(true)}); !errors.Is(err, ErrAuth) {
		t.Errorf("Dial to an untrusted listener: %v", err)
	}
	nextErr(t, hs)
	// A dialer without TLS.
	if _, err := Dial(testCtx(t), l.Addr().String(), Options{Device: dev, Insecure: true}); !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "requires TLS") {
		t.Errorf("plain Dial to a TLS listener: %v", err)
	}
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) {
		t.Errorf("listener: %v", err)
	}
	// A TLS dialer to a plain listener.
	pl := listen(t, ListenOptions{Options: Options{Device: dev, Insecure: true}})
	if _, err := Dial(testCtx(t), pl.Addr().String(), Options{Device: dev, TLS: p.clientConfig(true)}); !errors.Is(err, ErrAuth) {
		t.Errorf("TLS Dial to a plain listener: %v", err)
	}
}

// With TLS and a secret, the proofs are bound to the TLS session: an
// insider with a certificate from the same CA but without the secret
// cannot relay the exchange between two TLS sessions.
func TestSecretBoundToTLS(t *testing.T) {
	dev := devices(t)[0]
	leakCheck(t)
	p := newPKI(t)
	hs, report := handshakeErrors()
	l := listen(t, ListenOptions{Options: Options{Device: dev, TLS: p.serverConfig(false), Secret: secretA}, OnHandshakeError: report})
	d, a := pair(t, l, Options{Device: dev, TLS: p.clientConfig(false), Secret: secretA})
	checkTraffic(t, d, a)

	// The relay terminates the dialer's TLS with its own (valid)
	// certificate and opens a second TLS session to the listener.
	mitm, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{p.issue(t, "mallory", x509.ExtKeyUsageServerAuth)}})
	if err != nil {
		t.Fatal(err)
	}
	defer mitm.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := mitm.Accept()
		if err != nil {
			return
		}
		s, err := tls.Dial("tcp", l.Addr().String(), p.clientConfig(false))
		if err != nil {
			c.Close()
			return
		}
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
		io.Copy(c, s)
		c.Close()
	}()
	_, err = Dial(testCtx(t), mitm.Addr().String(), Options{Device: dev, TLS: p.clientConfig(false), Secret: secretA})
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "listener's proof") {
		t.Errorf("Dial through a relay: %v", err)
	}
	if err := nextErr(t, hs); !errors.Is(err, ErrAuth) {
		t.Errorf("listener: %v", err)
	}
}
