package cm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/rdmakit/rdmakit/internal/frame"
	"github.com/rdmakit/rdmakit/verbs"
)

func sampleMsgs() []*msg {
	return []*msg{
		{typ: msgRequest, version: protoVersion, transport: "tcp", device: "tcp0", qpn: 0x123456, psn: 0xabcdef, mtu: verbs.MTU4096,
			peerTimeoutMs: 5000, addr: []byte("127.0.0.1:4791"), priv: bytes.Repeat([]byte{0xa5}, MaxPrivateData)},
		{typ: msgRequest, version: protoVersion, transport: "shm", device: "shm0", qpn: 2, psn: 0, mtu: verbs.MTU256, peerTimeoutMs: 1},
		{typ: msgAccept, qpn: 0xffffff, psn: 1, mtu: verbs.MTU1024, peerTimeoutMs: 400, addr: []byte{1, 2, 3}, priv: []byte("hi")},
		{typ: msgReject, code: RejectApplication, reason: "go away"},
		{typ: msgReject, code: RejectTransport},
		{typ: msgReady},
		{typ: msgHeartbeat},
		{typ: msgDisconnect},
		{typ: msgAuthHello, version: protoVersion, nonce: bytes.Repeat([]byte{1}, nonceLen)},
		{typ: msgAuthChallenge, nonce: bytes.Repeat([]byte{2}, nonceLen), mac: bytes.Repeat([]byte{3}, macLen)},
		{typ: msgProof, mac: bytes.Repeat([]byte{4}, macLen)},
	}
}

func TestWireRoundTrip(t *testing.T) {
	for _, m := range sampleMsgs() {
		b, err := m.encode()
		if err != nil {
			t.Fatal(err)
		}
		got, err := readMsg(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("type %d: %v", m.typ, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("round trip of\n%+v\ngave\n%+v", m, got)
		}
		// Every truncation is an error, never a panic: of the payload, and
		// of the frame on the stream.
		p := b[frame.HeaderLen:]
		for i := range len(p) {
			if _, err := decodeMsg(m.typ, p[:i]); !errors.Is(err, ErrProtocol) {
				t.Errorf("type %d payload truncated to %d bytes: %v", m.typ, i, err)
			}
		}
		for i := range len(b) {
			if _, err := readMsg(bytes.NewReader(b[:i])); err == nil {
				t.Errorf("type %d frame truncated to %d bytes decoded", m.typ, i)
			}
		}
		if _, err := decodeMsg(m.typ, append(p[:len(p):len(p)], 0)); !errors.Is(err, ErrProtocol) || !errors.Is(err, frame.ErrTrailing) {
			t.Errorf("type %d with a trailing byte: %v", m.typ, err)
		}
	}
}

func TestWireLimits(t *testing.T) {
	m := &msg{typ: msgAccept, mtu: verbs.MTU4096, peerTimeoutMs: 1, priv: make([]byte, MaxPrivateData+1)}
	if _, err := m.encode(); !errors.Is(err, ErrPrivateDataTooLong) {
		t.Errorf("encoding %d bytes of private data: %v", len(m.priv), err)
	}
	// A hand-made frame with 197 bytes of private data is refused.
	m.priv = m.priv[:MaxPrivateData]
	b, _ := m.encode()
	b[len(b)-MaxPrivateData-1] = MaxPrivateData + 1
	b = append(b, 0)
	if _, err := decodeMsg(msgAccept, b[frame.HeaderLen:]); !errors.Is(err, ErrPrivateDataTooLong) {
		t.Errorf("decoding 197 bytes of private data: %v", err)
	}
	r := &msg{typ: msgReject, reason: strings.Repeat("é", 100)} // 200 bytes
	b, _ = r.encode()
	got, err := decodeMsg(msgReject, b[frame.HeaderLen:])
	if err != nil || len(got.reason) > MaxRejectReason || !strings.HasPrefix(r.reason, got.reason) || len(got.reason) != 148 {
		t.Errorf("long reason sent as %q (%v)", got.reason, err)
	}
	for _, bad := range [][]byte{
		{msgRequest, 'R', 'K', 'C', 'X'},
		{msgRequest, 'R', 'K', 'C', 'M', 9},
		{msgAccept, 0, 0, 0, 1, 0, 0, 0, 1, 9, 0, 0, 0, 1, 0, 0, 0}, // MTU 9
		{msgAccept, 0, 0, 0, 1, 0, 0, 0, 1, 5, 0, 0, 0, 0, 0, 0, 0}, // peer timeout 0
		{msgAccept, 1, 0, 0, 1, 0, 0, 0, 1, 5, 0, 0, 0, 1, 0, 0, 0}, // QPN > 24 bits
		{msgAuthHello, 'R', 'K', 'C', 'X'},
		{msgAuthHello, 'R', 'K', 'C', 'M', 9},
		{msgAuthHello, 'R', 'K', 'C', 'M', protoVersion, 1, 2, 3},
		{msgProof, 1, 2, 3},
		{99},
		{msgRequest},
		{msgReady, 0},
	} {
		if m, err := decodeMsg(bad[0], bad[1:]); !errors.Is(err, ErrProtocol) {
			t.Errorf("decoding %x: %+v, %v", bad, m, err)
		}
	}
	// Frames over maxFrame are refused, either way.
	_, err = readMsg(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff, msgRequest}))
	if !errors.Is(err, ErrProtocol) || !errors.Is(err, frame.ErrTooLarge) || !strings.Contains(err.Error(), "4294967295-byte frame exceeds the 2048-byte limit") {
		t.Errorf("oversized frame: %v", err)
	}
	_, err = readMsg(bytes.NewReader(append([]byte{0, 0, 8, 1, msgRequest}, make([]byte, maxFrame+1)...)))
	if !errors.Is(err, frame.ErrTooLarge) {
		t.Errorf("frame one byte over: %v", err)
	}
	if _, err := readMsg(bytes.NewReader([]byte{0, 0, 0, 0, msgRequest})); !errors.Is(err, ErrProtocol) {
		t.Errorf("empty request: %v", err)
	}
	if _, err := readMsg(bytes.NewReader([]byte{0, 0, 0})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut header: %v", err)
	}
}

// FuzzDecode feeds frames (length prefix included) to the parser: it must
// never panic, and whatever it accepts must encode back to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range sampleMsgs() {
		b, _ := m.encode()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := readMsg(bytes.NewReader(b))
		if err != nil {
			return
		}
		out, err := m.encode()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		n := frame.HeaderLen + int(binary.BigEndian.Uint32(b))
		if !bytes.Equal(out, b[:n]) {
			t.Fatalf("re-encoding %x gave %x", b[:n], out)
		}
	})
}
