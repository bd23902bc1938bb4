package tcp

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

func TestHeaderRoundTrip(t *testing.T) {
	in := frame{op: opCmpSwap, flags: flagSolicited, psn: 0xfffffe, length: 8, rkey: 0xdeadbeef,
		raddr: 0x0102030405060708, imm: 0x0a0b0c0d, compare: 1<<63 | 5, swap: 42}
	b := make([]byte, headerLen)
	header(b).encode(&in)
	h, err := parseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	var out frame
	h.decode(&out)
	if out != in {
		t.Fatalf("round trip: %+v became %+v", in, out)
	}
	for _, f := range []frame{
		{op: opNak, syndrome: synRNR, rnrTimer: 31},
		{op: opAck, psn: 7},
		{op: opReadResp, length: verbs.MaxMsgSize},
		{op: opWrite, length: 0},
	} {
		header(b).encode(&f)
		if _, err := parseHeader(b); err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
	}
}

func TestHeaderRejects(t *testing.T) {
	for name, f := range map[string]frame{
		"opcode-0":         {op: 0},
		"opcode-8":         {op: 8},
		"opcode-255":       {op: 255},
		"flags":            {op: opWrite, flags: 0x80},
		"length":           {op: opWrite, length: verbs.MaxMsgSize + 1},
		"read-length":      {op: opReadReq, length: 0xffffffff},
		"ack-length":       {op: opAck, length: 1},
		"atomic-length":    {op: opFetchAdd, length: 16},
		"nak-syndrome-0":   {op: opNak},
		"nak-syndrome-99":  {op: opNak, syndrome: 99},
		"nak-timer":        {op: opNak, syndrome: synRNR, rnrTimer: 32},
		"nak-timer-no-rnr": {op: opNak, syndrome: synRemoteAccess, rnrTimer: 3},
		"nak-length":       {op: opNak, syndrome: synRNR, length: 4},
		"syndrome-on-ack":  {op: opAck, syndrome: 1},
	} {
		b := make([]byte, headerLen)
		header(b).encode(&f)
		if _, err := parseHeader(b); !errors.Is(err, errMalformed) {
			t.Errorf("%s: parseHeader = %v, want a malformed-frame error", name, err)
		}
	}
	b := make([]byte, headerLen)
	header(b).encode(&frame{op: opAck})
	b[hdrPSN] = 1 // PSN beyond 24 bits
	if _, err := parseHeader(b); err == nil {
		t.Error("32-bit PSN accepted")
	}
	b[hdrPSN] = 0
	b[hdrReserved+3] = 1
	if _, err := parseHeader(b); err == nil {
		t.Error("reserved bits accepted")
	}
	if _, err := parseHeader(b[:headerLen-1]); err == nil {
		t.Error("short header accepted")
	}
}

func TestPSNArithmetic(t *testing.T) {
	for _, c := range []struct {
		p, q psn
		d    int32
	}{
		{5, 3, 2}, {3, 5, -2}, {0, psnMask, 1}, {psnMask, 0, -1}, {1 << 22, 0, 1 << 22}, {0, 1 << 22, -(1 << 22)},
	} {
		if got := c.p.Sub(c.q); got != c.d {
			t.Errorf("%#x - %#x = %d, want %d", c.p, c.q, got, c.d)
		}
		if c.q.Add(uint32(c.d)&psnMask) != c.p {
			t.Errorf("%#x + %d != %#x", c.q, c.d, c.p)
		}
	}
	if !psn(psnMask).Before(0) || psn(0).Before(psnMask) {
		t.Error("before does not wrap")
	}
	if psn(psnMask).Add(2) != 1 {
		t.Error("add does not wrap")
	}
}

// FuzzParseHeader: any input either fails with errMalformed or yields a
// header that re-encodes to the same bytes and satisfies the invariants
// the reader relies on.
func FuzzParseHeader(f *testing.F) {
	for _, fr := range []frame{
		{op: opWrite, psn: 1, length: 100, rkey: 2, raddr: 3},
		{op: opSendImm, psn: psnMask, length: 0, imm: 9},
		{op: opReadReq, length: 1 << 20},
		{op: opFetchAdd, length: 8, compare: 1},
		{op: opNak, syndrome: synRNR, rnrTimer: 14, psn: 77},
		{op: opReadResp, length: 5},
	} {
		b := make([]byte, headerLen)
		header(b).encode(&fr)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, headerLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHeader(b)
		if err != nil {
			if !errors.Is(err, errMalformed) {
				t.Fatalf("error %v does not wrap errMalformed", err)
			}
			return
		}
		var fr frame
		h.decode(&fr)
		if !fr.op.known() || uint64(fr.length) > verbs.MaxMsgSize || uint32(fr.psn) > psnMask {
			t.Fatalf("accepted %+v", fr)
		}
		if (fr.op == opAck || fr.op == opNak || fr.op == opAtomicResp) && fr.length != 0 {
			t.Fatalf("accepted %+v", fr)
		}
		out := make([]byte, headerLen)
		header(out).encode(&fr)
		if !bytes.Equal(out, b[:headerLen]) {
			t.Fatalf("re-encoding %x gave %x", b[:headerLen], out)
		}
	})
}

// FuzzDecodeAddress: malformed addresses are refused, valid ones round-trip.
func FuzzDecodeAddress(f *testing.F) {
	a := qpAddr{ip: []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1}, port: 4791, qpn: 0x1234, nonce: 99}
	f.Add(a.encode())
	f.Add([]byte{1})
	f.Add(make([]byte, addrLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeAddr(b)
		if err != nil {
			return
		}
		if !bytes.Equal(a.encode(), b) {
			t.Fatalf("%x decodes to %+v, which encodes differently", b, a)
		}
		if _, err := parseHello(b); err == nil && len(b) < helloLen {
			t.Fatal("short hello accepted")
		}
	})
}
