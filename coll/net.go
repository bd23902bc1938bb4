package coll

// Connection setup: one verbs context ("endpoint") per transport in use,
// one QP per (peer, channel), and the memory peers write into. Runs once,
// in the goroutine creating the communicator.
//
// Memory of an endpoint, all from its arena:
//
//	fifo  per (peer, channel): Slots flag words (padded to a page), Slots
//	      LL slots (padded to a page), then Slots chunks. The peer writes
//	      data into a chunk, then the flag; or a small message, flags
//	      interleaved, into an LL slot (see proto.go).
//	acks  per (peer, channel): Slots words. The peer writes, for each
//	      message of ours it consumed, its number+1 into the word of its
//	      slot: our credit to reuse the slot.
//	src   per (peer, channel): one word for outgoing flag values,
//	      Slots words for outgoing acks, and an LL slot where small
//	      messages are packed before they are written.
//	stage per (peer, channel), made on first use: Slots chunks where
//	      reductions are computed before being sent.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

const (
	maxInline = 256 // bytes written inline (copied when posted)
	wordSize  = 8
	// llMax is the largest message sent in the LL format (on synchronous
	// endpoints), llSlot the size of an LL slot: a header word and a word
	// per 4 data bytes.
	llMax  = 128
	llSlot = (1 + llMax/4) * wordSize
)

type endpoint struct {
	idx  int
	dev  string
	sync bool // writes are done when PostSend returns (shm)
	ctx  *verbs.Context
	pd   *verbs.PD
	scq  *verbs.CQ
	rcq  *verbs.CQ
	fifo *verbs.MR
	acks *verbs.MR
	src  *verbs.MR
	qps  []*qpState
	wcs  []verbs.WorkCompletion
}

type qpState struct {
	qp        *verbs.QP
	ep        *endpoint
	id        uint64
	peer      int
	posted    uint64 // work requests posted
	completed uint64 // ... and known complete
	needed    uint64 // the last posted write whose source is not copied at posting
	depth     uint64
}

type peer struct {
	rank int
	ep   *endpoint
	ch   []*channel
}

// channel is one QP to a peer with both directions of message passing.
type channel struct {
	q     *qpState
	peer  int
	slots uint64 // FIFO depth
	chunk int

	// Sending to the peer.
	sk       uint64 // messages sent
	remFlags uint64
	remSlots uint64
	remKey   uint32
	acks     []byte // credits the peer writes here
	flagSrc  []byte // one word
	flagAddr uint64
	srcKey   uint32
	stage    *region
	wr       [2]verbs.SendWR
	sge      [2]verbs.SGE

	ll     []byte // LL slots (receiving)
	remLL  uint64 // the peer's LL slots
	llSrc  []byte // packing area (sending)
	llAddr uint64
	llBuf  []byte // unpacked LL message (receiving)
	llWR   [1]verbs.SendWR
	llSGE  [1]verbs.SGE

	// Receiving from the peer.
	rk       uint64 // messages consumed
	acked    uint64 // consumed messages acknowledged to the peer
	flags    []byte
	fifo     []byte
	remAcks  uint64
	remAckK  uint32
	ackSrc   []byte // Slots words
	ackAddr  uint64
	ackBatch uint64
}

// setup builds endpoints and channels and connects them with every peer.
func (c *Comm) setup(ctx context.Context) error {
	n, me := c.nranks, c.rank
	deadline := time.Now().Add(c.opts.BootstrapTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	// Which device reaches whom.
	devOf := make([]string, n)
	var byDev = map[string][]int{}
	var devs []string
	for p := 0; p < n; p++ {
		if p == me {
			continue
		}
		same := c.infos[p].Host == c.infos[me].Host
		switch c.opts.Transport {
		case "shm":
			if !same {
				return fmt.Errorf("%w: %s=shm, but rank %d is on another host (%s)", ErrInvalidArgument, EnvTransport, p, c.infos[p].Hostname)
			}
			devOf[p] = "shm0"
		case "tcp":
			devOf[p] = "tcp0"
		default:
			devOf[p] = "tcp0"
			if same {
				devOf[p] = "shm0"
			}
		}
		if byDev[devOf[p]] == nil {
			devs = append(devs, devOf[p])
		}
		byDev[devOf[p]] = append(byDev[devOf[p]], p)
	}
	// shm first: it can only register its own memory, so regions are
	// allocated there and registered with tcp.
	if len(devs) == 2 && devs[0] != "shm0" {
		devs[0], devs[1] = devs[1], devs[0]
	}
	C, S, chunk := c.opts.Channels, c.opts.Slots, c.opts.ChunkSize
	flagBytes := (S*wordSize + 4095) &^ 4095
	llBytes := (S*llSlot + 4095) &^ 4095
	fifoBytes := flagBytes + llBytes + S*chunk
	ackBytes := (S*wordSize + 63) &^ 63
	srcBytes := 64 + ackBytes + llSlot
	psns := map[*qpState]uint32{}
	for i, dev := range devs {
		ps := byDev[dev]
		ep := &endpoint{idx: i, dev: dev, sync: dev == "shm0"}
		c.eps = append(c.eps, ep)
		var err error
		if ep.ctx, err = verbs.Open(dev, verbs.Options{}); err != nil {
			return err
		}
		if ep.pd, err = ep.ctx.AllocPD(); err != nil {
			return err
		}
		depth := 4*S + 16
		nq := len(ps) * C
		if ep.scq, err = ep.ctx.CreateCQ(nq*depth + 64); err != nil {
			return err
		}
		if ep.rcq, err = ep.ctx.CreateCQ(4); err != nil {
			return err
		}
		rw := verbs.AccessLocalWrite | verbs.AccessRemoteWrite
		if ep.fifo, err = ep.pd.AllocMR(nq*fifoBytes, rw); err != nil {
			return err
		}
		if ep.acks, err = ep.pd.AllocMR(nq*ackBytes, rw); err != nil {
			return err
		}
		if ep.src, err = ep.pd.AllocMR(nq*srcBytes, verbs.AccessLocalWrite); err != nil {
			return err
		}
		ep.wcs = make([]verbs.WorkCompletion, 64)
		for pi, p := range ps {
			pr := &peer{rank: p, ep: ep}
			c.peers[p] = pr
			for ch := 0; ch < C; ch++ {
				k := pi*C + ch
				qp, err := ep.pd.CreateQP(verbs.QPConfig{SendCQ: ep.scq, RecvCQ: ep.rcq, Cap: verbs.QPCap{
					MaxSendWR: depth, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: maxInline}})
				if err != nil {
					return err
				}
				if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite}); err != nil {
					return err
				}
				q := &qpState{qp: qp, ep: ep, id: uint64(len(ep.qps)), peer: p, depth: uint64(qp.Cap().MaxSendWR)}
				ep.qps = append(ep.qps, q)
				psns[q] = verbs.RandomPSN()
				fifo := ep.fifo.Bytes()[k*fifoBytes : (k+1)*fifoBytes]
				src := ep.src.Bytes()[k*srcBytes : (k+1)*srcBytes]
				chn := &channel{
					q: q, peer: p, slots: uint64(S), chunk: chunk,
					acks:    ep.acks.Bytes()[k*ackBytes : k*ackBytes+S*wordSize],
					flagSrc: src[:wordSize], flagAddr: ep.src.Addr() + uint64(k*srcBytes), srcKey: ep.src.LKey(),
					flags: fifo[:S*wordSize], ll: fifo[flagBytes : flagBytes+S*llSlot], fifo: fifo[flagBytes+llBytes:],
					ackSrc: src[64 : 64+S*wordSize], ackAddr: ep.src.Addr() + uint64(k*srcBytes+64),
					llSrc: src[64+ackBytes : 64+ackBytes+llSlot], llAddr: ep.src.Addr() + uint64(k*srcBytes+64+ackBytes),
					llBuf:    make([]byte, llMax),
					ackBatch: uint64(max(1, S/2)),
				}
				pr.ch = append(pr.ch, chn)
			}
		}
	}

	// Round 0: tell each peer, per channel, how to reach our QP and where
	// to write.
	blobs := make([][]byte, n)
	for p := 0; p < n; p++ {
		pr := c.peers[p]
		if pr == nil {
			continue
		}
		var e enc
		e.str(pr.ep.dev)
		e.u32(uint32(C))
		for _, ch := range pr.ch {
			ep := pr.ep
			e.u32(ch.q.qp.Num())
			e.u32(psns[ch.q])
			e.bytes(ch.q.qp.Address())
			e.u64(addrOf(ch.flags))
			e.u64(addrOf(ch.ll))
			e.u64(addrOf(ch.fifo))
			e.u32(ep.fifo.RKey())
			e.u64(addrOf(ch.acks))
			e.u32(ep.acks.RKey())
		}
		blobs[p] = e
	}
	got, err := exchange(ctx, c.boot, 0, blobs, deadline)
	if err != nil {
		return err
	}
	for p := 0; p < n; p++ {
		pr := c.peers[p]
		if pr == nil {
			continue
		}
		d := dec{b: got[p]}
		if dev := d.str(); dev != pr.ep.dev || int(d.u32()) != C {
			return fmt.Errorf("%w: rank %d connects with %q and %d channels, this rank with %q and %d (same %s and %s everywhere?)",
				ErrInvalidArgument, p, dev, C, pr.ep.dev, C, EnvTransport, EnvChannels)
		}
		var gid net.IP
		if pr.ep.dev == "tcp0" {
			gid = net.ParseIP(c.infos[p].IP)
		}
		for _, ch := range pr.ch {
			qpn, psn, addr := d.u32(), d.u32(), d.bytes()
			ch.remFlags, ch.remLL, ch.remSlots, ch.remKey = d.u64(), d.u64(), d.u64(), d.u32()
			ch.remAcks, ch.remAckK = d.u64(), d.u32()
			if d.err != nil {
				return fmt.Errorf("malformed connection data from rank %d", p)
			}
			if err := ch.q.qp.Modify(verbs.QPAttr{State: verbs.QPRTR, PathMTU: verbs.MTU4096, DestQPN: qpn, RQPSN: psn,
				AH: verbs.AddressHandle{GID: gid, Dest: addr}, MinRNRTimer: 1}); err != nil {
				return fmt.Errorf("connecting to rank %d over %s: %w", p, pr.ep.dev, err)
			}
			if err := ch.q.qp.Modify(verbs.QPAttr{State: verbs.QPRTS, SQPSN: psns[ch.q], RetryCount: 7, RNRRetry: 7}); err != nil {
				return fmt.Errorf("connecting to rank %d over %s: %w", p, pr.ep.dev, err)
			}
		}
	}
	// Round 1: everyone is ready to be written to.
	if _, err := exchange(ctx, c.boot, 1, make([][]byte, n), deadline); err != nil {
		return err
	}
	return nil
}

func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(sys.Addr(b))
}

// wrID packs a QP and its post count into a work request id.
func wrID(q *qpState, seq uint64) uint64 { return q.id<<48 | seq&(1<<48-1) }

func putWord(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
