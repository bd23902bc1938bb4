package coll

// Connection setup: one verbs context ("endpoint") per transport in use,
// one QP per (peer, channel), and the memory peers write into. Runs once,
// in the goroutine creating the communicator.
//
// Memory of an endpoint, all from its arena:
//
//	fifo  per (peer, channel): Slots flag words (padded to a page); on
//	      write-on-post devices llSlots LL slots and midSlots small-message
//	      slots (each padded to a page); then Slots chunks, each followed by
//	      slotTail bytes whose first word is the chunk's tail flag. The
//	      peer writes data into a chunk, then the flag (the flag word, or on
//	      write-on-post devices the data ending at the tail flag and the
//	      flag in one write); or a small message, flags interleaved, into an
//	      LL slot, or one smaller than a chunk into a small-message slot,
//	      ending at its tail flag (see proto.go).
//	acks  per (peer, channel): Slots words (padded to 64 bytes), then on
//	      write-on-post devices one word per lane (LL, small-message), each
//	      in a cache line of its own. The peer writes, for each message of
//	      ours in chunk slots it consumed, its number+1 into the word of
//	      its slot: our credit to reuse the slot; for a lane, the count of
//	      the lane's messages it consumed (one word for the whole ring).
//	src   per (peer, channel): Slots words for outgoing flag values
//	      (padded to 64 bytes), Slots words for outgoing acks (padded),
//	      a word per lane for its outgoing count (a line each), and an LL
//	      slot where small messages are packed before they are written.
//	      A flag or ack word of a slot is rewritten only once the peer has
//	      seen the previous one of that slot, so writes from here need not
//	      be inline (devices with little inline room: siw).
//	stage per (peer, channel), made on first use: Slots chunks where
//	      reductions are computed before being sent.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"slices"
	"time"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
	vdriver "github.com/rdmakit/rdmakit/verbs/driver"
)

const (
	maxInline = 256 // bytes written inline (copied when posted)
	wordSize  = 8
	// llMax is the largest message sent in the LL format (on synchronous
	// endpoints), llSlot the size of an LL slot: a header word and a word
	// per 4 data bytes.
	llMax  = 128
	llSlot = (1 + llMax/4) * wordSize
	// llStride is the distance between two LL slots, a whole number of
	// cache lines: a message of up to 28 bytes (header and 7 words) then
	// always lies in one line.
	llStride = (llSlot + 63) &^ 63
	// llSlots is the depth of the LL ring of a channel, and llBatch how
	// many LL messages the receiver consumes before it returns their
	// credits: LL messages have credits of their own, apart from the
	// chunk slots (proto.go), so that back-to-back small collectives
	// return a credit once per llBatch calls instead of every Slots/2,
	// for 20 KiB per channel instead of Slots chunks.
	llSlots = 64
	// midMax is the largest message of the small-message ring (on
	// write-on-post endpoints, messages over llMax and smaller than a
	// chunk), midSlots its depth: like the LL ring, a ring with credits of
	// its own, so that small collectives return a credit every
	// midSlots/2 messages for 130 KiB per channel.
	midMax    = 4096
	midSlots  = 32
	midStride = midMax + slotTail
	// laneAckStride is the room of a lane's credit word (acks) and of its
	// outgoing copy (src): a cache line, so that the peer's write of it
	// moves no other word.
	laneAckStride = 64
)

// Lanes: the rings of a channel besides its chunk slots (laneMain).
type laneID int8

const (
	laneNone laneID = iota - 2 // (waitWord: not a message)
	laneMain
	laneLL
	laneMid
	nLanes
	// slotTail follows each FIFO chunk: the tail flag word, padded to a
	// cache line.
	slotTail = 64
)

type endpoint struct {
	idx  int
	dev  string
	off  *devOffer // the device: transport, port, capabilities
	sync bool      // writes are done when PostSend returns (CapWriteOnPost)
	// sleepWait: progress needs goroutines of this process (tcp's
	// readers), so waits sleep to leave them the processor instead of
	// spinning. Writes of shm peers and of RDMA devices land without
	// this process's help: waits spin, then back off (Comm.backoff).
	sleepWait bool
	ctx       *verbs.Context
	pd        *verbs.PD
	// scq takes the send completions of every QP of the endpoint, except
	// on sleepWait endpoints (tcp), where each QP has its own (qpState.cq):
	// a poll of an empty CQ reads the sockets of the QPs completing into
	// it (the transport's progress), so a wait for one peer's message
	// reads that peer's socket only, not one per peer and channel.
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
	cq        *verbs.CQ // its send CQ: ep.scq, or its own (see endpoint.scq)
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
	q      *qpState
	peer   int
	slots  uint64 // FIFO depth
	chunk  int
	stride int // chunk + slotTail: from one FIFO slot to the next

	// inline is the largest write posted inline (copied at posting):
	// maxInline, or less where the device grants less (siw: 80 bytes).
	inline int

	// Sending to the peer.
	sk       uint64 // messages sent
	remFlags uint64
	remSlots uint64
	remKey   uint32
	acks     []byte // credits the peer writes here
	flagSrc  []byte // a word per slot: outgoing flag values
	flagAddr uint64
	srcKey   uint32
	stage    *region
	// dst and dstKey, when dst is not 0, send the next message's data
	// to the peer's memory there instead of to its FIFO slot
	// (postDirect, on endpoints that are not synchronous).
	dst    uint64
	dstKey uint32
	wr     [4]verbs.SendWR // a message's data and flag, after up to two credit writes
	sge    [4]verbs.SGE

	// The LL and small-message rings (write-on-post endpoints only).
	lanes  [nLanes]lane
	llSrc  []byte // LL packing area (sending)
	llAddr uint64
	llBuf  []byte // unpacked LL message (receiving)
	llWR   [1]verbs.SendWR
	llSGE  [1]verbs.SGE
	// pend is the lane of the message recv returned, which release
	// consumes (at most one message per channel is received and not yet
	// released).
	pend laneID

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
	// owing is ch's index in Comm.owing while credits are due to the
	// peer and wait for the next post on ch or the next wait (endpoints
	// that are not synchronous: see deferCredits in proto.go); -1 when
	// none are.
	owing int
}

// lane is a ring of slots of a channel with its own message counters and
// credits, beside the chunk slots (whose counters are the channel's).
// Its credits are one word: the count of the lane's messages the receiver
// consumed, written every slots/2 of them; the sender reads it only when
// the count it last read runs out.
type lane struct {
	slots   uint64
	stride  int    // from one slot to the next
	rx      []byte // the slots (receiving)
	remRx   uint64 // the peer's
	sk      uint64 // messages sent
	acks    []byte // the credit word: the peer writes its count here
	credit  uint64 // the count last read from acks
	rk      uint64 // messages consumed
	acked   uint64 // ... and acknowledged to the peer
	ackSrc  []byte // the outgoing count (one word)
	ackAddr uint64
	remAcks uint64
}

// tcpBusyPoll is the TCPBusyPoll of coll's tcp contexts: on (any
// positive value turns on progress from polls), and as short as it gets,
// so that a reader nobody polls spins a few non-blocking reads only
// before it parks (transport/tcp's spinFor keeps busy polls this short
// as they are).
const tcpBusyPoll = time.Nanosecond

// tcpChunk is the largest default chunk when some pair of ranks talks
// over tcp: 256 KiB, as elsewhere. It was 64 KiB while a payload larger
// than the poller's buffer went to the transport's reader goroutine (a
// wake-up per message); since pollers move payloads of any size straight
// into place (transport/tcp payload.go), fewer, larger messages cost
// fewer system calls and frames. 2-core host, µs, A/B alternating,
// medians of 3-5 launches, 64 KiB / 256 KiB: 2 ranks AllReduce 256 KiB
// 86 / 65, 1 MiB 402 / 278, 16 MiB 7051 / 6334, 64 MiB 28952 / 26141;
// 4 ranks AllReduce 1 MiB 1582 / 1088, AllGather 739 / 659,
// ReduceScatter 598 / 501; 8 ranks AllReduce 1 MiB 4091 / 3248,
// AllGather 1830 / 1343. (512 KiB: 8 ranks AllGather 1432, no better.)
const tcpChunk = 256 << 10

// tcpChannels is the default number of channels when some pair of ranks
// talks over tcp: one TCP connection per peer. More streams move no more
// over loopback, where the copies in and out of the kernel are the limit,
// and each costs polls and wake-ups (AllReduce 1 MiB over tcp on a 2-core
// host, µs, medians of 4-5 launches at load 5-7: 2 ranks 618 with 2
// channels, 633 with 1; 4 ranks 2108, 1540; 8 ranks 19193, 9215).
// NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD or RDMAKIT_COLL_CHANNELS
// set more, for links where one stream does not fill the wire.
const tcpChannels = 1

// maxEndpoints bounds the devices of a rank: one same-host device and
// one per network transport.
const maxEndpoints = 3

// ibTimeout etc. are the RC timing of RDMA devices (NCCL's defaults):
// local ACK timeout 4.096 µs × 2^18 ≈ 1.07 s, 7 retries, RNR timer 12
// (0.64 ms; coll never sends, so no RNR is expected). rdmakit's own
// transports keep Timeout 0 (tcp: no silence limit).
const (
	ibTimeout    = 18
	ibRetryCount = 7
	ibMinRNR     = 12
)

// setup chooses devices, builds endpoints and channels and connects them
// with every peer, in three rounds through the root: offers (which
// devices each rank has), connection data, ready.
func (c *Comm) setup(ctx context.Context) error {
	n, me := c.nranks, c.rank
	deadline := time.Now().Add(c.opts.BootstrapTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	gidIdx, err := c.opts.gidIndex()
	if err != nil {
		return err
	}

	// Round 0: every rank's offer to every rank.
	mine, err := c.localOffer()
	if err != nil {
		return err
	}
	var oe enc
	mine.encode(&oe)
	blobs := make([][]byte, n)
	for p := range blobs {
		if p != me {
			blobs[p] = oe
		}
	}
	got, err := exchange(ctx, c.boot, 0, blobs, deadline)
	if err != nil {
		return err
	}
	offers := make([]offer, n)
	hosts := make([]string, n)
	for p := 0; p < n; p++ {
		hosts[p] = c.infos[p].Host
		if p == me {
			offers[p] = mine
			continue
		}
		if offers[p], err = decodeOffer(&dec{b: got[p]}); err != nil {
			return fmt.Errorf("malformed device offer from rank %d", p)
		}
	}
	plan, err := planDevices(c.opts.Transport, me, offers, hosts)
	if err != nil {
		return err
	}
	c.allSync, c.anyTCP = plan.allSync, plan.anyTCP
	if plan.anyTCP && !c.opts.chunkSet {
		c.opts.ChunkSize = min(c.opts.ChunkSize, tcpChunk)
	}
	if plan.anyTCP && !c.opts.channelsSet {
		c.opts.Channels = tcpChannels
	}

	// Endpoints: one per device in use, those that cannot register
	// memory they did not allocate (shm) first, so that regions are
	// allocated there and registered with the others.
	var byDev = map[string][]int{}
	var devs []*devOffer
	for p := 0; p < n; p++ {
		d := plan.devOf[p]
		if d == nil {
			continue
		}
		if byDev[d.Device] == nil {
			devs = append(devs, d)
		}
		byDev[d.Device] = append(byDev[d.Device], p)
	}
	slices.SortStableFunc(devs, func(a, b *devOffer) int {
		ra, rb := a.Caps.Has(verbs.CapRegisterCallerMemory), b.Caps.Has(verbs.CapRegisterCallerMemory)
		switch {
		case ra == rb:
			return 0
		case rb:
			return -1
		}
		return 1
	})
	if len(devs) > maxEndpoints || (len(devs) > 1 && !devs[1].Caps.Has(verbs.CapRegisterCallerMemory)) {
		var names []string
		for _, d := range devs {
			names = append(names, d.Device)
		}
		return fmt.Errorf("%w: this rank would need devices %v; at most %d, and only one that cannot register caller memory",
			ErrInvalidArgument, names, maxEndpoints)
	}
	C, S, chunk := c.opts.Channels, c.opts.Slots, c.opts.ChunkSize
	flagBytes := (S*wordSize + 4095) &^ 4095
	ackBytes := (S*wordSize + 63) &^ 63
	psns := map[*qpState]uint32{}
	for i, d := range devs {
		ps := byDev[d.Device]
		ep := &endpoint{idx: i, dev: d.Device, off: d, sync: d.Caps.Has(verbs.CapWriteOnPost)}
		laneSlots, laneStride := [nLanes]int{llSlots, midSlots}, [nLanes]int{llStride, midStride}
		if !ep.sync {
			laneSlots = [nLanes]int{} // LL and small-message rings: write-on-post only
		}
		var laneOff [nLanes]int
		laneBytes, laneAcks := 0, 0
		for l := range laneSlots {
			laneOff[l] = laneBytes
			laneBytes += (laneSlots[l]*laneStride[l] + 4095) &^ 4095
			if laneSlots[l] > 0 {
				laneAcks += laneAckStride
			}
		}
		fifoBytes := flagBytes + laneBytes + S*(chunk+slotTail)
		acksBytes := ackBytes + laneAcks
		srcBytes := 2*ackBytes + laneAcks + llStride
		ep.sleepWait = !ep.sync && d.Transport != rdmaTransport
		c.eps = append(c.eps, ep)
		var err error
		var vo verbs.Options
		if os.Getenv(vdriver.EnvBusyPoll) == "" {
			// The ranks' waits poll the send CQ, and a poll reads the
			// sockets itself (waitWordPolling): busy polling must be on
			// for that, but the reader's own spin, once nobody polls,
			// only takes the cores of the ranks (2-rank AllReduce 8 B
			// over tcp: 77-99 µs with the transport's default 50 µs,
			// 50-53 µs with readers parked in the network poller).
			vo.TCPBusyPoll = tcpBusyPoll
		}
		if ep.ctx, err = verbs.Open(d.Device, vo); err != nil {
			return err
		}
		if ep.pd, err = ep.ctx.AllocPD(); err != nil {
			return err
		}
		depth := 4*S + 16
		nq := len(ps) * C
		if !ep.sleepWait {
			if ep.scq, err = ep.ctx.CreateCQ(nq*depth + 64); err != nil {
				return err
			}
		}
		if ep.rcq, err = ep.ctx.CreateCQ(4); err != nil {
			return err
		}
		rw := verbs.AccessLocalWrite | verbs.AccessRemoteWrite
		if ep.fifo, err = ep.pd.AllocMR(nq*fifoBytes, rw); err != nil {
			return err
		}
		if ep.acks, err = ep.pd.AllocMR(nq*acksBytes, rw); err != nil {
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
				sges := 1
				if ep.sync {
					sges = 2 // data and flag in one write (proto.go)
				}
				cq := ep.scq
				if cq == nil {
					if cq, err = ep.ctx.CreateCQ(depth + 16); err != nil {
						return err
					}
				}
				qp, err := ep.pd.CreateQP(verbs.QPConfig{SendCQ: cq, RecvCQ: ep.rcq, Cap: verbs.QPCap{
					MaxSendWR: depth, MaxRecvWR: 1, MaxSendSGE: sges, MaxRecvSGE: 1, MaxInlineData: maxInline}})
				if err != nil {
					return fmt.Errorf("creating a queue pair on %s: %w", d.Device, err)
				}
				if err := qp.Modify(verbs.QPAttr{State: verbs.QPInit, AccessFlags: verbs.AccessRemoteWrite, Port: uint8(d.Port)}); err != nil {
					return fmt.Errorf("queue pair on %s port %d to INIT: %w", d.Device, d.Port, err)
				}
				if gidIdx >= 0 && d.Transport == rdmaTransport {
					if err := setGIDIndex(qp, gidIdx); err != nil {
						return err
					}
				}
				q := &qpState{qp: qp, cq: cq, ep: ep, id: uint64(len(ep.qps)), peer: p, depth: uint64(qp.Cap().MaxSendWR)}
				ep.qps = append(ep.qps, q)
				psns[q] = verbs.RandomPSN()
				fifo := ep.fifo.Bytes()[k*fifoBytes : (k+1)*fifoBytes]
				src := ep.src.Bytes()[k*srcBytes : (k+1)*srcBytes]
				srcAddr := ep.src.Addr() + uint64(k*srcBytes)
				acks := ep.acks.Bytes()[k*acksBytes : (k+1)*acksBytes]
				lo := 2*ackBytes + laneAcks // the LL packing area in src
				chn := &channel{
					q: q, peer: p, slots: uint64(S), chunk: chunk, stride: chunk + slotTail,
					inline:  min(maxInline, qp.Cap().MaxInlineData),
					acks:    acks[:S*wordSize],
					flagSrc: src[:S*wordSize], flagAddr: srcAddr, srcKey: ep.src.LKey(),
					flags: fifo[:S*wordSize], fifo: fifo[flagBytes+laneBytes:],
					ackSrc: src[ackBytes : ackBytes+S*wordSize], ackAddr: srcAddr + uint64(ackBytes),
					llSrc: src[lo : lo+llSlot], llAddr: srcAddr + uint64(lo),
					llBuf:    make([]byte, llMax),
					ackBatch: uint64(max(1, S/2)),
					pend:     laneMain,
					owing:    -1,
				}
				ao := 0 // the lanes' credit words, in acks after ackBytes and in src after 2*ackBytes
				for l := range chn.lanes {
					n := laneSlots[l]
					rx := fifo[flagBytes+laneOff[l]:][:n*laneStride[l]]
					w := 0 // the credit word; none without the ring
					if n > 0 {
						w = wordSize
					}
					chn.lanes[l] = lane{slots: uint64(n), stride: laneStride[l], rx: rx,
						acks:   acks[ackBytes+ao:][:w],
						ackSrc: src[2*ackBytes+ao:][:w], ackAddr: srcAddr + uint64(2*ackBytes+ao)}
					if n > 0 {
						ao += laneAckStride
					}
				}
				pr.ch = append(pr.ch, chn)
			}
		}
	}
	nch := 0
	for _, pr := range c.peers {
		if pr != nil {
			nch += len(pr.ch)
		}
	}
	c.owing = make([]*channel, 0, nch)

	// Round 1: tell each peer, per channel, how to reach our QP and where
	// to write.
	blobs = make([][]byte, n)
	for p := 0; p < n; p++ {
		pr := c.peers[p]
		if pr == nil {
			continue
		}
		var e enc
		e.str(pr.ep.off.Transport)
		e.u32(uint32(C))
		for _, ch := range pr.ch {
			ep := pr.ep
			e.u32(ch.q.qp.Num())
			e.u32(psns[ch.q])
			e.bytes(ch.q.qp.Address())
			e.u64(addrOf(ch.flags))
			e.u64(addrOf(ch.fifo))
			e.u32(ep.fifo.RKey())
			e.u64(addrOf(ch.acks))
			e.u32(ep.acks.RKey())
			for l := range ch.lanes {
				e.u64(addrOf(ch.lanes[l].rx))
				e.u64(addrOf(ch.lanes[l].acks))
			}
		}
		blobs[p] = e
	}
	if got, err = exchange(ctx, c.boot, 1, blobs, deadline); err != nil {
		return err
	}
	for p := 0; p < n; p++ {
		pr := c.peers[p]
		if pr == nil {
			continue
		}
		d := dec{b: got[p]}
		dev := pr.ep.off
		if tr := d.str(); tr != dev.Transport || int(d.u32()) != C {
			return fmt.Errorf("%w: rank %d connects with %s and %d channels, this rank with %s and %d (same %s and %s everywhere?)",
				ErrInvalidArgument, p, tr, C, dev.Transport, C, EnvTransport, EnvChannels)
		}
		rtr := verbs.QPAttr{State: verbs.QPRTR, PathMTU: dev.MTU, MinRNRTimer: 1}
		if their := offers[p].deviceOf(dev.Transport); their != nil && their.MTU != 0 {
			rtr.PathMTU = min(rtr.PathMTU, their.MTU)
		}
		rts := verbs.QPAttr{State: verbs.QPRTS, RetryCount: 7, RNRRetry: 7}
		if rtr.PathMTU == 0 {
			rtr.PathMTU = verbs.MTU4096
		}
		if !dev.Caps.Has(verbs.CapSameHost) {
			// The peer's address as the bootstrap saw it (tcp dials it;
			// RDMA devices take the GID from the QP's address).
			rtr.AH.GID = net.ParseIP(c.infos[p].IP)
		}
		if dev.Transport == rdmaTransport {
			rtr.MinRNRTimer = ibMinRNR
			rts.Timeout, rts.RetryCount = ibTimeout, ibRetryCount
		}
		for _, ch := range pr.ch {
			qpn, psn, addr := d.u32(), d.u32(), d.bytes()
			ch.remFlags, ch.remSlots, ch.remKey = d.u64(), d.u64(), d.u32()
			ch.remAcks, ch.remAckK = d.u64(), d.u32()
			for l := range ch.lanes {
				ch.lanes[l].remRx, ch.lanes[l].remAcks = d.u64(), d.u64()
			}
			if d.err != nil {
				return fmt.Errorf("malformed connection data from rank %d", p)
			}
			rtr.DestQPN, rtr.RQPSN, rtr.AH.Dest = qpn, psn, addr
			if err := ch.q.qp.Modify(rtr); err != nil {
				return fmt.Errorf("connecting to rank %d over %s: %w", p, pr.ep.dev, err)
			}
		}
		// RTS after every channel to the peer is at RTR: on iWARP the
		// active side waits in RTS for the connection, which the peer's
		// rdma_cm accepts by itself.
		for _, ch := range pr.ch {
			rts.SQPSN = psns[ch.q]
			if err := ch.q.qp.Modify(rts); err != nil {
				return fmt.Errorf("connecting to rank %d over %s: %w", p, pr.ep.dev, err)
			}
		}
	}
	// Round 2: everyone is ready to be written to.
	if _, err := exchange(ctx, c.boot, 2, make([][]byte, n), deadline); err != nil {
		return err
	}
	return nil
}

// localOffer lists this rank's devices and picks what it offers.
func (c *Comm) localOffer() (offer, error) {
	devs, lerr := verbs.Devices()
	hca, err := parseHCAFilter(c.opts.HCA)
	if err != nil {
		return offer{}, err
	}
	o := localOffer(devs, hca)
	if hca.set() && !c.opts.hcaLenient && o.netOf(rdmaTransport) == nil && (c.opts.Transport == "auto" || c.opts.Transport == rdmaTransport) {
		var rdma []string
		for _, d := range devs {
			if d.Transport == rdmaTransport {
				rdma = append(rdma, d.Name)
			}
		}
		if len(rdma) > 0 {
			why := o.why[rdmaTransport]
			if why == "" {
				why = "no device matches"
			}
			return o, fmt.Errorf("%w: HCA list %q leaves no usable RDMA device (%s; devices: %v)", ErrInvalidArgument, c.opts.HCA, why, rdma)
		}
	}
	if o.same == nil && len(o.net) == 0 && lerr != nil {
		return o, lerr
	}
	return o, nil
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
