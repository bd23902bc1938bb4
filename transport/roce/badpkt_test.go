package roce

import (
	"net"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/transport/roce/header"
	"github.com/rdmakit/rdmakit/verbs"
)

// TestBadPackets: datagrams that are not RoCEv2, have a wrong ICRC, or
// name no QP are dropped and counted, and the QPs carry on.
func TestBadPackets(t *testing.T) {
	a, b := pair(t, 1<<20, verbs.MTU4096)
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	to := net.UDPAddrFromAddrPort(LocalAddr(b.ctx))
	src := c.LocalAddr().(*net.UDPAddr).AddrPort()
	pkt := func(qpn uint32, corrupt bool) []byte {
		buf := make([]byte, header.Len(header.RCWriteOnly, 8))
		var p header.Packet
		header.Build(&p, buf, header.RCWriteOnly, 8)
		p.BTH.Encode(&header.BTHFields{Opcode: header.RCWriteOnly, PKey: header.DefaultPKey, DestQP: qpn, PSN: 1})
		p.RETH.Encode(b.mr.Addr(), b.mr.RKey(), 8)
		copy(p.Payload, "INTRUDER")
		ad := header.Addrs{Src: src.Addr(), Dst: LocalAddr(b.ctx).Addr(), SrcPort: src.Port(), DstPort: LocalAddr(b.ctx).Port()}
		header.PutICRC(&ad, buf)
		if corrupt {
			buf[len(buf)-6] ^= 1
		}
		return buf
	}
	before, _ := Stats(b.ctx)
	send := func(p []byte) {
		if _, err := c.WriteToUDP(p, to); err != nil {
			t.Fatal(err)
		}
	}
	send([]byte("not a RoCE packet at all"))
	send(pkt(b.qp.Num(), true))       // from the peer's address, wrong ICRC
	send(pkt(0x777777, false))        // no such QP
	send(pkt(b.qp.Num(), false)[:20]) // truncated
	deadline := time.Now().Add(5 * time.Second)
	var after Counters
	for {
		after, _ = Stats(b.ctx)
		if after.RxMalformed-before.RxMalformed >= 2 && after.RxBadICRC > before.RxBadICRC && after.RxUnknownQP > before.RxUnknownQP {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters before %+v after %+v", before, after)
		}
		time.Sleep(time.Millisecond)
	}
	if string(b.mr.Bytes()[:8]) == "INTRUDER" {
		t.Fatal("a packet with a bad ICRC was executed")
	}
	// The QPs are unharmed.
	copy(a.mr.Bytes(), "GOODDATA")
	a.post(verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	a.wait(a.scq, 1, 10*time.Second)
	if string(b.mr.Bytes()[:8]) != "GOODDATA" {
		t.Fatalf("memory %q", b.mr.Bytes()[:8])
	}
}
