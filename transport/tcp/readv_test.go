package tcp

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// The read that takes the last bytes of a payload takes what follows it
// in the same readv (place: into place, and into the link's buffer): a
// READ_RESP's trailer, the next frame's header, and small frames behind
// it. A fake peer sends a READ_RESP of 40 KiB with its trailer, four
// small WRITEs (one of them empty, one larger than the 1 KiB a read takes
// after a large payload), a WRITE of 20 KiB and a WRITE of 8 bytes, split
// in two writes at every byte offset from shortly before the READ_RESP's
// payload ends to the end of the first small frames (then every 7th
// offset, and a few inside the payloads), with a pause between the two
// parts; every byte must land where its frame says, and the READ and the
// WRITEs complete. Three ways of reading: the link goroutine alone (busy
// polling off), pollers alone (pollersOnly), and the two alternating
// (busy polling on; the test polls around some splits and sleeps in
// CQ.Wait or not at all around others).
func TestPayloadTailReadWithNext(t *testing.T) {
	for _, mode := range []string{"reader", "poller", "alternating"} {
		t.Run(mode, func(t *testing.T) { testPayloadTail(t, mode) })
	}
}

func testPayloadTail(t *testing.T, mode string) {
	o := opts{}.withDefaults()
	var a *end
	var c net.Conn
	switch mode {
	case "poller":
		a, c = pollerEnd(t)
	default:
		bp := -time.Duration(1)
		if mode == "alternating" {
			bp = 50 * time.Microsecond
		}
		a = newEnd(t, openBusy(t, bp), o, 0)
		f := newFakePeer(t, 0)
		f.connectReal(a, o)
		c = f.dialTo(a)
		linkConn(t, a.qp)
	}
	mem := a.mr.Bytes()

	// The fake peer's reader: the last ACK's PSN, READ requests.
	var acked atomic.Int64
	acked.Store(-1)
	reads := make(chan psn, 1)
	go func() {
		var rb [headerLen]byte
		var f frame
		for {
			if _, err := io.ReadFull(c, rb[:]); err != nil {
				return
			}
			header(rb[:]).decode(&f)
			switch f.op {
			case opAck:
				acked.Store(int64(f.psn))
			case opReadReq:
				reads <- f.psn
			case opNak:
				t.Errorf("NAK %+v", f)
				return
			}
		}
	}()

	const (
		bigRead  = 40 << 10 // READ_RESP payload: a read after it is capped
		bigWrite = 20 << 10 // read straight into place, not capped after
		readAt   = 1 << 20
		smallAt  = 2 << 20
		writeAt  = 3 << 20
	)
	smalls := []int{16, 0, 100, 3000}
	rsrc := make([]byte, bigRead)
	wsrc := make([]byte, bigWrite)
	ssrc := make([]byte, 4096)
	next := psn(1000)

	// Offsets into the stream from the end of the READ_RESP's payload.
	var offs []int
	for d := -80; d < 600; d++ {
		offs = append(offs, d)
	}
	for d := 600; d < 4400; d += 7 {
		offs = append(offs, d)
	}
	offs = append(offs, -bigRead+10, -bigRead/2, 4400+bigWrite/2, 4400+bigWrite+40)
	if testing.Short() {
		var some []int
		for i := 0; i < len(offs); i += 5 {
			some = append(some, offs[i])
		}
		offs = some
	}

	for i, d := range offs {
		seed := uint64(i + 1)
		pattern(rsrc, seed)
		pattern(wsrc, seed+1000)
		pattern(ssrc, seed+2000)
		polling := mode == "poller" || (mode == "alternating" && i%2 == 0)

		// The READ and its request.
		a.post(verbs.SendWR{ID: uint64(i), Opcode: verbs.OpRead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{a.mr.SGE(readAt, bigRead)}, RemoteAddr: 0x1000, RKey: 77})
		var rpsn psn
		for got := false; !got; {
			select {
			case rpsn = <-reads:
				got = true
			case <-time.After(time.Millisecond):
				if mode == "poller" {
					pollFor(a, 100*time.Microsecond)
				}
			}
		}

		// The stream: READ_RESP, trailer, small WRITEs, a larger WRITE
		// and a small one.
		var s []byte
		s = append(s, hdr(frame{op: opReadResp, psn: rpsn, length: bigRead, flags: flagStatus})...)
		s = append(s, rsrc...)
		tail := len(s) // where the READ_RESP's payload ends
		s = append(s, trailerOK[:]...)
		off := 0
		for _, n := range smalls {
			s = append(s, hdr(frame{op: opWrite, psn: next, length: uint32(n), rkey: a.mr.RKey(), raddr: a.mr.Addr() + uint64(smallAt+off)})...)
			s = append(s, ssrc[off:off+n]...)
			off += n
			next++
		}
		s = append(s, hdr(frame{op: opWrite, psn: next, length: bigWrite, rkey: a.mr.RKey(), raddr: a.mr.Addr() + writeAt})...)
		s = append(s, wsrc...)
		next++
		s = append(s, hdr(frame{op: opWrite, psn: next, length: 8, rkey: a.mr.RKey(), raddr: a.mr.Addr() + writeAt + bigWrite})...)
		s = append(s, ssrc[:8]...)
		last := next
		next++

		// The READ_RESP's header and the first KiB of its payload go
		// first, alone: the reader takes them in one read, and the rest
		// of the payload then goes straight into place, so that the
		// payload's last read (the readv) meets the split wherever it is
		// (a partial trailer, a partial header, a frame cut in its
		// payload).
		pause := func() {
			if polling {
				pollFor(a, 300*time.Microsecond)
			} else {
				time.Sleep(300 * time.Microsecond)
			}
		}
		first := headerLen + 1024
		cut := min(max(tail+d, first+1), len(s)-1)
		writeAll(t, c, s[:first])
		pause()
		writeAll(t, c, s[first:cut])
		pause()
		writeAll(t, c, s[cut:])

		// The READ completes, the WRITEs are acknowledged.
		var wc verbs.WorkCompletion
		if polling {
			wc = spinCQ(t, a, a.scq, 1)[0]
		} else {
			wc = a.waitCQ(a.scq, 1, 10*time.Second)[0]
		}
		expect(t, wc, verbs.StatusSuccess)
		if wc.WRID != uint64(i) {
			t.Fatalf("split %d: completion of wr %d, want %d", d, wc.WRID, i)
		}
		deadline := time.Now().Add(10 * time.Second)
		for acked.Load() != int64(last) {
			if time.Now().After(deadline) {
				t.Fatalf("split %d: last ACK %d, want %d", d, acked.Load(), last)
			}
			if polling {
				pollFor(a, 100*time.Microsecond)
			} else {
				time.Sleep(100 * time.Microsecond)
			}
		}
		if !bytes.Equal(mem[readAt:readAt+bigRead], rsrc) {
			t.Fatalf("split %d: READ data differs", d)
		}
		if !bytes.Equal(mem[smallAt:smallAt+off], ssrc[:off]) {
			t.Fatalf("split %d: small WRITEs' data differs", d)
		}
		if !bytes.Equal(mem[writeAt:writeAt+bigWrite], wsrc) || !bytes.Equal(mem[writeAt+bigWrite:writeAt+bigWrite+8], ssrc[:8]) {
			t.Fatalf("split %d: WRITE data differs", d)
		}
		if t.Failed() {
			return
		}
	}
}
