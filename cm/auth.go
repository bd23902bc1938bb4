package cm

// No goroutines: the credential checks of Options, the shared-secret
// proofs and the TLS wrapping of a handshake connection. They run on the
// goroutine that runs the handshake (Dial's caller, a Listener's handshake
// goroutine).
//
// The shared-secret exchange (doc.go, "Authentication"):
//
//	dialer                                     listener
//	AuthHello {magic, version, nD}      ───►
//	                                    ◄───   AuthChallenge {nL, MAC_L(nD, nL)}
//	verify MAC_L
//	Request, Proof {MAC_D(nD, nL, Request)} ─► verify MAC_D
//	                                    ◄───   Accept, Proof {MAC_A(nD, nL, Accept)}
//	verify MAC_A
//	Ready                               ───►
//
// Each MAC is HMAC-SHA256 keyed with the secret over a label naming its
// role, both nonces, the TLS channel binding (the connection's exported
// keying material; empty without TLS) and the payload it vouches for. The
// labels differ by role, so a MAC one side produces is never a valid proof
// for the other; the nonces are fresh per connection (32 bytes from
// crypto/rand on each side), so a recorded proof never verifies again.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/rdmakit/rdmakit/verbs"
)

// MinSecretLen is the shortest Options.Secret accepted. The secret should
// be random bytes (not a password): a recorded handshake without TLS lets
// an eavesdropper test guesses offline.
const MinSecretLen = 16

// MAC labels, one per role.
const (
	labelChallenge = "rdmakit cm v2 listener challenge"
	labelRequest   = "rdmakit cm v2 dialer request"
	labelAccept    = "rdmakit cm v2 listener accept"
	// exporterLabel names the TLS keying material the MACs are bound to.
	exporterLabel = "EXPORTER-rdmakit-cm-v2"
)

// checkCredentials refuses Options that neither authenticate the peer nor
// say Insecure. listener says which side: a listener authenticates
// dialers with the secret or with client certificates (mutual TLS); a
// dialer authenticates the listener with the secret or by verifying its
// certificate.
func (o *Options) checkCredentials(listener bool) error {
	if o.Secret != nil && len(o.Secret) < MinSecretLen {
		return fmt.Errorf("cm: %w: Secret of %d bytes (at least %d)", verbs.ErrInvalidArgument, len(o.Secret), MinSecretLen)
	}
	if o.TLS != nil {
		if listener && len(o.TLS.Certificates) == 0 && o.TLS.GetCertificate == nil && o.TLS.GetConfigForClient == nil {
			return fmt.Errorf("cm: %w: the listener's TLS config has no certificate", verbs.ErrInvalidArgument)
		}
		if o.TLS.MaxVersion != 0 && o.TLS.MaxVersion < tls.VersionTLS12 {
			return fmt.Errorf("cm: %w: TLS below 1.2", verbs.ErrInvalidArgument)
		}
	}
	if o.Insecure || o.Secret != nil {
		return nil
	}
	if o.TLS != nil {
		if listener && o.TLS.ClientAuth == tls.RequireAndVerifyClientCert {
			return nil
		}
		if !listener && !o.TLS.InsecureSkipVerify {
			return nil
		}
	}
	if listener {
		return fmt.Errorf("%w; a listener's TLS authenticates dialers only with ClientAuth tls.RequireAndVerifyClientCert", ErrNoCredential)
	}
	return fmt.Errorf("%w; a dialer's TLS authenticates the listener only without InsecureSkipVerify", ErrNoCredential)
}

// tlsConfig returns the TLS config to use (nil without TLS): a clone of
// Options.TLS with at least TLS 1.2 and, for a dialer, ServerName taken
// from addr's host when unset.
func (o *Options) tlsConfig(addr string) *tls.Config {
	if o.TLS == nil {
		return nil
	}
	c := o.TLS.Clone()
	if c.MinVersion < tls.VersionTLS12 {
		c.MinVersion = tls.VersionTLS12
	}
	if addr != "" && c.ServerName == "" {
		if host, _, err := net.SplitHostPort(addr); err == nil {
			c.ServerName = host
		}
	}
	return c
}

// tlsError classifies an error of a TLS handshake (handshake says it came
// from Handshake itself): a refusal by either side (certificate not
// trusted or missing, an alert from the peer, a peer not speaking TLS)
// matches ErrAuth; timeouts and the connection's end stay what they are.
func tlsError(err error, handshake bool) error {
	if err == nil || errors.Is(err, ErrAuth) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" {
		// An alert from the peer; under TLS 1.3 a server's refusal of the
		// client certificate arrives after the client's Handshake returned.
		return fmt.Errorf("%w: TLS: %w", ErrAuth, err)
	}
	if !handshake {
		return err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
		return err
	}
	return fmt.Errorf("%w: TLS: %w", ErrAuth, err)
}

// session is one connection's shared-secret exchange: the secret, the
// dialer's and the listener's nonces and the TLS channel binding.
type session struct {
	secret, nD, nL, cb []byte
}

// mac is HMAC-SHA256(secret, label ‖ nD ‖ nL ‖ len(cb) ‖ cb ‖ payload).
// No label is a prefix of another and the nonces have a fixed length, so
// a MAC made for one role never verifies for another.
func (s *session) mac(label string, payload []byte) []byte {
	h := hmac.New(sha256.New, s.secret)
	h.Write([]byte(label))
	h.Write(s.nD)
	h.Write(s.nL)
	var n [2]byte
	binary.BigEndian.PutUint16(n[:], uint16(len(s.cb)))
	h.Write(n[:])
	h.Write(s.cb)
	h.Write(payload)
	return h.Sum(nil)
}

// verifyProof compares in constant time.
func verifyProof(got, want []byte) bool { return hmac.Equal(got, want) }

func newNonce() []byte {
	b := make([]byte, nonceLen)
	if _, err := rand.Read(b); err != nil {
		panic("cm: crypto/rand failed: " + err.Error())
	}
	return b
}

// channelBinding is the TLS connection's exported keying material, or nil
// for a plain connection.
func channelBinding(c net.Conn) ([]byte, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil
	}
	st := tc.ConnectionState()
	cb, err := st.ExportKeyingMaterial(exporterLabel, nil, 32)
	if err != nil {
		return nil, fmt.Errorf("%w: TLS channel binding: %w", ErrAuth, err)
	}
	return cb, nil
}
