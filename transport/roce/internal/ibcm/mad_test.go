package ibcm

import (
	"net/netip"
	"testing"
)

// Bit positions, against the IBTA tables (and what tshark's InfiniBand
// dissector decodes from these packets: see transport/roce's
// roce-cm.sh capture).
func TestLayout(t *testing.T) {
	var b [MADLen]byte
	r := REQ{MAD(b[:])}
	r.Init(AttrREQ, 0x0102030405060708)
	r.SetQPN(0x123456)
	r.SetResponderResources(0x10)
	r.SetRemoteCMTimeout(20)
	r.SetTransportType(0)
	r.SetFlowControl(true)
	r.SetPSN(0xabcdef)
	r.SetLocalCMTimeout(20)
	r.SetRetryCount(7)
	r.SetPathMTU(5)
	r.SetRNRRetryCount(7)
	r.SetMaxCMRetries(15)
	r.SetAckTimeout(14)
	r.SetPacketRate(0x10)
	want := map[int]byte{0: 1, 1: 7, 2: 2, 3: 3, 8: 1, 15: 8, 17: 0x10,
		24 + 32: 0x12, 24 + 33: 0x34, 24 + 34: 0x56, 24 + 35: 0x10, 24 + 43: 0xa1, 24 + 44: 0xab, 24 + 46: 0xef,
		24 + 47: 0xa7, 24 + 50: 0x57, 24 + 51: 0xf0, 24 + 95: 14 << 3, 24 + 91: 0x10}
	for off, v := range want {
		if b[off] != v {
			t.Errorf("REQ byte %d = %#02x, want %#02x", off, b[off], v)
		}
	}
	if r.QPN() != 0x123456 || r.PSN() != 0xabcdef || r.RemoteCMTimeout() != 20 || !r.FlowControl() || r.LocalCMTimeout() != 20 ||
		r.RetryCount() != 7 || r.PathMTU() != 5 || r.RNRRetryCount() != 7 || r.MaxCMRetries() != 15 || r.AckTimeout() != 14 ||
		r.ResponderResources() != 0x10 || r.TID() != 0x0102030405060708 || r.PacketRate() != 0x10 {
		t.Error("REQ fields do not read back")
	}
	var c [MADLen]byte
	p := REP{MAD(c[:])}
	p.Init(AttrREP, 1)
	p.SetQPN(0xfedcba)
	p.SetPSN(0x010203)
	p.SetTargetAckDelay(15)
	p.SetFlowControl(true)
	p.SetRNRRetryCount(7)
	p.SetSRQ(true)
	want = map[int]byte{24 + 12: 0xfe, 24 + 14: 0xba, 24 + 15: 0, 24 + 20: 1, 24 + 22: 3, 24 + 26: 0x79, 24 + 27: 0xf0}
	for off, v := range want {
		if c[off] != v {
			t.Errorf("REP byte %d = %#02x, want %#02x", off, c[off], v)
		}
	}
	if p.QPN() != 0xfedcba || p.PSN() != 0x010203 || p.TargetAckDelay() != 15 || !p.FlowControl() || p.RNRRetryCount() != 7 || !p.SRQ() {
		t.Error("REP fields do not read back")
	}
	var d [MADLen]byte
	j := REJ{MAD(d[:])}
	j.Init(AttrREJ, 1)
	j.SetRejected(MsgREP)
	j.SetReason(RejTimeout)
	j.SetARI([]byte{1, 2, 3})
	if d[24+8] != 0x40 || d[24+9] != 3<<1 || d[24+11] != 4 || len(j.ARI()) != 3 || j.ARI()[2] != 3 {
		t.Errorf("REJ bytes %x", d[24:40])
	}
	m := MRA{MAD(d[:])}
	m.Init(AttrMRA, 1)
	m.SetMRAed(MsgREQ)
	m.SetServiceTimeout(20)
	if d[24+9] != 20<<3 || m.ServiceTimeout() != 20 {
		t.Errorf("MRA bytes %x", d[24:40])
	}
	var h [CMAHeaderLen]byte
	CMAHeader(h[:]).Encode(netip.MustParseAddr("10.98.0.2"), 0x1234, netip.MustParseAddr("10.98.0.1"))
	if h[1] != 0x40 || h[2] != 0x12 || h[19] != 2 || h[35] != 1 || h[4] != 0 || h[16] != 10 {
		t.Errorf("CMA header %x", h)
	}
	CMAHeader(h[:]).Encode(netip.MustParseAddr("fd00::2"), 1, netip.MustParseAddr("fd00::1"))
	hv, err := ParseCMAHeader(h[:])
	if err != nil || hv.Src() != netip.MustParseAddr("fd00::2") || hv.Dst() != netip.MustParseAddr("fd00::1") || hv.IPVersion() != 6 {
		t.Errorf("CMA header v6 %x: %v", h, err)
	}
	for n := 0; n < CMAHeaderLen; n++ {
		if _, err := ParseCMAHeader(h[:n]); err == nil {
			t.Fatalf("CMA header of %d bytes taken", n)
		}
	}
}

// FuzzInput feeds arbitrary MADs to an engine that listens and has a
// connection in each state it can reach: nothing panics, and whatever
// the engine sends parses.
func FuzzInput(f *testing.F) {
	for seed := uint64(0); seed < 3; seed++ {
		a, b := newEngine(seed), newEngine(seed+100)
		b.Listen(7174)
		a.Connect(connectParams(), 1)
		for _, o := range a.Outbox() {
			f.Add(o.MAD[:], false)
			ev, _ := b.Input(o.MAD[:], addrA, addrA, 1)
			b.Accept(ev.Conn, &AcceptParams{QPN: 1}, 2)
		}
		for _, o := range b.Outbox() {
			f.Add(o.MAD[:], true)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, toActive bool) {
		a, b := newEngine(1), newEngine(101)
		b.Listen(7174)
		ca, _ := a.Connect(connectParams(), 1)
		ev, _ := b.Input(a.Outbox()[0].MAD[:], addrA, addrA, 1)
		if ev.Conn == nil {
			t.Fatal("handshake")
		}
		b.Accept(ev.Conn, &AcceptParams{QPN: 1}, 2)
		b.Outbox()
		e, from := b, addrA
		if toActive {
			e, from = a, addrB
		}
		// The fuzzer's data, and the same with the comm IDs made to match.
		for _, d := range [][]byte{data, withIDs(data, ev.Conn.LocalID, ca.LocalID, toActive)} {
			if m, err := Parse(d); err == nil {
				_ = m.Attr().String()
				r := REQ{m}
				_, _, _, _ = r.LocalGID(), r.RemoteGID(), r.FlowLabel(), r.PrivateData()
				_ = REJ{m}.ARI()
			}
			e.Input(d, from, from, 3)
			e.Tick(1e10, nil)
			for _, o := range e.Outbox() {
				if _, err := Parse(o.MAD[:]); err != nil {
					t.Fatalf("the engine sent an unparsable MAD: %v", err)
				}
			}
		}
	})
}

func withIDs(data []byte, passiveID, activeID uint32, toActive bool) []byte {
	if len(data) < MADLen {
		return data
	}
	d := append([]byte(nil), data...)
	if toActive {
		MAD(d).put32(offLocalCommID, passiveID)
		MAD(d).put32(offRemoteCommID, activeID)
	} else {
		MAD(d).put32(offLocalCommID, activeID)
		MAD(d).put32(offRemoteCommID, passiveID)
	}
	return d
}
