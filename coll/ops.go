package coll

// The public collectives: argument checks, buffer resolution (registered
// memory is used in place, other memory goes through bounce buffers),
// algorithm choice and the per-call signature. They run in the caller's
// goroutine, one at a time per communicator (opMu).

import (
	"context"
	"fmt"

	"github.com/rdmakit/rdmakit/internal/sys"
)

// Operation kinds, part of the signature.
const (
	kAllReduce byte = iota + 1
	kAllGather
	kReduceScatter
	kBroadcast
	kReduce
	kAllToAll
	kBarrier
	kP2P
)

var kindNames = [...]string{"", "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "AllToAll", "Barrier", "Send/Recv"}

// call describes a collective for its signature and for error messages.
type call struct {
	kind   byte
	dt     DataType
	op     RedOp
	count  int
	root   int
	algo   Algorithm
	direct bool
}

func (k call) String() string {
	return fmt.Sprintf("%s(count %d, %s, %s, root %d, %s)", kindNames[k.kind], k.count, k.dt, k.op, k.root, k.algo)
}

// signature hashes the call with a sequence number into the 32 bits
// every flag carries (a multiply-xorshift mix: cheap, no allocation, and
// any difference in the fields changes it with high probability).
func signature(k call, seq uint32) uint32 {
	a := uint64(k.kind) | uint64(k.dt)<<8 | uint64(k.op)<<16 | uint64(k.algo)<<24 | uint64(uint32(k.root))<<32
	b := uint64(k.count)
	d := uint64(seq)
	if k.direct {
		d |= 1 << 32
	}
	h := a*0x9e3779b97f4a7c15 ^ b*0xc2b2ae3d27d4eb4f ^ d*0x165667b19e3779f9
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 32
	return uint32(h)
}

// begin starts a collective: it takes opMu and checks the communicator.
func (c *Comm) begin(ctx context.Context, k call) error {
	c.opMu.Lock()
	if c.closed.Load() {
		c.opMu.Unlock()
		return ErrClosed
	}
	if err := c.Err(); err != nil {
		c.opMu.Unlock()
		return err
	}
	c.op = opState{ctx: ctx, call: k}
	return nil
}

// end finishes a collective: writes drained, opMu released.
func (c *Comm) end(err error) error {
	if err == nil {
		err = c.drain()
	}
	c.op = opState{}
	c.opMu.Unlock()
	return err
}

func (c *Comm) collective(ctx context.Context, k call) error {
	if err := c.begin(ctx, k); err != nil {
		return err
	}
	c.op.sig = signature(k, c.seq)
	c.seq++
	return nil
}

func (c *Comm) checkLen(what string, b []byte, dt DataType, want int) error {
	if want >= 0 && len(b) != want {
		return fmt.Errorf("%w: %s buffer is %d bytes, want %d", ErrInvalidArgument, what, len(b), want)
	}
	if len(b)%dt.Size() != 0 {
		return fmt.Errorf("%w: %s buffer of %d bytes is not a whole number of %s", ErrInvalidArgument, what, len(b), dt)
	}
	return nil
}

func sameStart(a, b []byte) bool {
	return len(a) > 0 && len(b) > 0 && &a[0] == &b[0]
}

// input returns send as registered memory, copying it into the input
// bounce buffer if it is not.
func (c *Comm) input(send []byte) (mem, error) {
	if rg := c.lookup(send); rg != nil {
		return mem{b: send, rg: rg}, nil
	}
	m, err := c.bounce(&c.bounceIn, len(send))
	if err != nil {
		return mem{}, err
	}
	copy(m.b, send)
	return m, nil
}

// output returns recv as registered memory, or the output bounce buffer
// (staged: copy it back with unstage).
func (c *Comm) output(recv []byte) (m mem, staged bool, err error) {
	if rg := c.lookup(recv); rg != nil {
		return mem{b: recv, rg: rg}, false, nil
	}
	m, err = c.bounce(&c.bounceOu, len(recv))
	return m, true, err
}

// bounce returns n bytes of a bounce buffer, growing it (to a power of
// two) when needed: no allocation in steady state.
func (c *Comm) bounce(rg *region, n int) (mem, error) {
	if len(rg.buf) < n {
		size := 4096
		for size < n {
			size *= 2
		}
		if rg.buf != nil {
			c.freeRegion(rg)
		}
		nr, err := c.newRegion(size)
		if err != nil {
			*rg = region{}
			return mem{}, err
		}
		*rg = *nr
	}
	return mem{b: rg.buf[:n], rg: rg}, nil
}

// inOut resolves the buffers of a collective whose input may be the
// output or a part of it (inPlaceOff: offset of send in recv when in
// place, or of recv in send when recvInSend).
func (c *Comm) inOut(send, recv []byte, off int, recvInSend bool) (in, out mem, staged bool, err error) {
	inPlace := false
	if recvInSend {
		inPlace = len(recv) > 0 && off+len(recv) <= len(send) && sameStart(send[off:], recv)
	} else {
		inPlace = len(send) > 0 && off+len(send) <= len(recv) && sameStart(recv[off:], send)
	}
	if !inPlace {
		if in, err = c.input(send); err != nil {
			return
		}
		out, staged, err = c.output(recv)
		return
	}
	big := recv
	if recvInSend {
		big = send
	}
	if rg := c.lookup(big); rg != nil {
		m := mem{b: big, rg: rg}
		if recvInSend {
			return m, m.sub(off, len(recv)), false, nil
		}
		return m.sub(off, len(send)), m, false, nil
	}
	m, err := c.bounce(&c.bounceOu, len(big))
	if err != nil {
		return
	}
	copy(m.b, big)
	if recvInSend {
		return m, m.sub(off, len(recv)), true, nil
	}
	return m.sub(off, len(send)), m, true, nil
}

// partlyOverlap reports whether a and b share memory without starting at
// the same address (the algorithms read send while they write recv).
func partlyOverlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	x, y := sys.Addr(a), sys.Addr(b)
	return x != y && x < y+uintptr(len(b)) && y < x+uintptr(len(a))
}

func (c *Comm) checkTypes(dt DataType, op RedOp) error {
	if !dt.valid() {
		return fmt.Errorf("%w: data type %d", ErrInvalidArgument, dt)
	}
	if !op.valid() {
		return fmt.Errorf("%w: reduction %d", ErrInvalidArgument, op)
	}
	return nil
}

func (c *Comm) checkRoot(root int) error {
	if root < 0 || root >= c.nranks {
		return fmt.Errorf("%w: root %d of %d ranks", ErrInvalidArgument, root, c.nranks)
	}
	return nil
}

// AllReduce reduces send across all ranks with op and leaves the result in
// recv on every rank. send and recv have the same length; they may be the
// same buffer (in place), but not overlap otherwise (ErrInvalidArgument).
func (c *Comm) AllReduce(ctx context.Context, send, recv []byte, dt DataType, op RedOp) error {
	if err := c.checkTypes(dt, op); err != nil {
		return err
	}
	if err := c.checkLen("send", send, dt, -1); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, len(send)); err != nil {
		return err
	}
	if partlyOverlap(send, recv) {
		return fmt.Errorf("%w: send and recv overlap without being the same buffer", ErrInvalidArgument)
	}
	count := len(send) / dt.Size()
	k := call{kind: kAllReduce, dt: dt, op: op, count: count, root: -1, algo: c.pickAlgo(kAllReduce, len(send)), direct: c.directAR(len(send))}
	if err := c.collective(ctx, k); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	in, out, staged, err := c.inOut(send, recv, 0, false)
	if err == nil {
		switch {
		case c.nranks == 1:
			copy(out.b, in.b)
			c.finish(dt, op, out.b)
		case k.algo == AlgoDirect:
			err = c.directAllReduce(in, out, count, dt, op)
		case k.algo == AlgoTree:
			err = c.treeAllReduce(in, out, count, dt, op)
		case k.algo == AlgoHalving:
			err = c.halvingAllReduce(in, out, count, dt, op)
		default:
			err = c.ringAllReduce(in, out, count, dt, op)
		}
	}
	return c.endOut(err, staged, recv, out)
}

// endOut finishes a collective whose output may be staged.
func (c *Comm) endOut(err error, staged bool, recv []byte, out mem) error {
	err = c.end(err)
	if err == nil && staged {
		copy(recv, out.b)
	}
	return err
}

// AllGather concatenates every rank's send, in rank order, into recv on
// every rank: len(recv) == Size()*len(send). In place when send is
// recv[Rank()*len(send):][:len(send)].
func (c *Comm) AllGather(ctx context.Context, send, recv []byte, dt DataType) error {
	if err := c.checkTypes(dt, Sum); err != nil {
		return err
	}
	if err := c.checkLen("send", send, dt, -1); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, len(send)*c.nranks); err != nil {
		return err
	}
	count := len(send) / dt.Size()
	k := call{kind: kAllGather, dt: dt, count: count, root: -1, algo: c.pickAlgo(kAllGather, len(recv)), direct: c.direct(len(recv))}
	if err := c.collective(ctx, k); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	in, out, staged, err := c.inOut(send, recv, c.rank*len(send), false)
	if err == nil {
		switch {
		case c.nranks == 1:
			copy(out.b, in.b)
		case k.algo == AlgoDirect:
			err = c.directAllGather(in, out, count, dt.Size())
		case k.algo == AlgoHalving:
			err = c.halvingAllGather(in, out, count, dt.Size())
		default:
			err = c.ringAllGather(in, out, count, dt.Size())
		}
	}
	return c.endOut(err, staged, recv, out)
}

// ReduceScatter reduces send across ranks and leaves block Rank() of the
// result in recv: len(send) == Size()*len(recv). In place when recv is
// send[Rank()*len(recv):][:len(recv)].
func (c *Comm) ReduceScatter(ctx context.Context, send, recv []byte, dt DataType, op RedOp) error {
	if err := c.checkTypes(dt, op); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, -1); err != nil {
		return err
	}
	if err := c.checkLen("send", send, dt, len(recv)*c.nranks); err != nil {
		return err
	}
	count := len(recv) / dt.Size()
	k := call{kind: kReduceScatter, dt: dt, op: op, count: count, root: -1, algo: c.pickAlgo(kReduceScatter, len(send))}
	if err := c.collective(ctx, k); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	in, out, staged, err := c.inOut(send, recv, c.rank*len(recv), true)
	if err == nil {
		switch {
		case c.nranks == 1:
			copy(out.b, in.b)
			c.finish(dt, op, out.b)
		case k.algo == AlgoDirect:
			err = c.directReduceScatter(in, out, count, dt, op)
		case k.algo == AlgoHalving:
			err = c.halvingReduceScatter(in, out, count, dt, op)
		default:
			err = c.ringReduceScatter(in, out, count, dt, op)
		}
	}
	return c.endOut(err, staged, recv, out)
}

// Broadcast copies root's send into recv on every rank. send matters only
// at root (where it has recv's length, or is recv itself); other ranks may
// pass nil.
func (c *Comm) Broadcast(ctx context.Context, send, recv []byte, dt DataType, root int) error {
	if err := c.checkTypes(dt, Sum); err != nil {
		return err
	}
	if err := c.checkRoot(root); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, -1); err != nil {
		return err
	}
	if c.rank == root {
		if err := c.checkLen("send", send, dt, len(recv)); err != nil {
			return err
		}
	} else {
		send = recv
	}
	count := len(recv) / dt.Size()
	k := call{kind: kBroadcast, dt: dt, count: count, root: root, algo: c.pickAlgo(kBroadcast, len(recv)), direct: c.direct(len(recv))}
	if err := c.collective(ctx, k); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	in, out, staged, err := c.inOut(send, recv, 0, false)
	if err == nil {
		switch {
		case c.nranks == 1:
			copy(out.b, in.b)
		case k.algo == AlgoTree:
			err = c.treeBroadcast(in, out, count, dt.Size(), root)
		default:
			err = c.chainBroadcast(in, out, count, dt.Size(), root)
		}
	}
	return c.endOut(err, staged, recv, out)
}

// Reduce reduces send across ranks into recv at root. recv matters only
// at root (same length as send, or send itself); other ranks may pass nil.
func (c *Comm) Reduce(ctx context.Context, send, recv []byte, dt DataType, op RedOp, root int) error {
	if err := c.checkTypes(dt, op); err != nil {
		return err
	}
	if err := c.checkRoot(root); err != nil {
		return err
	}
	if err := c.checkLen("send", send, dt, -1); err != nil {
		return err
	}
	if c.rank == root {
		if err := c.checkLen("recv", recv, dt, len(send)); err != nil {
			return err
		}
	} else {
		recv = send
	}
	count := len(send) / dt.Size()
	k := call{kind: kReduce, dt: dt, op: op, count: count, root: root, algo: c.pickAlgo(kReduce, len(send))}
	if err := c.collective(ctx, k); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	var in, out mem
	var staged bool
	var err error
	if c.rank == root {
		in, out, staged, err = c.inOut(send, recv, 0, false)
	} else {
		in, err = c.input(send)
	}
	if err == nil {
		switch {
		case c.nranks == 1:
			copy(out.b, in.b)
			c.finish(dt, op, out.b)
		case k.algo == AlgoTree:
			err = c.treeReduce(in, out, count, dt, op, root)
		default:
			err = c.chainReduce(in, out, count, dt, op, root)
		}
	}
	return c.endOut(err, staged, recv, out)
}

// AllToAll sends block j of send (len(send)/Size() bytes) to rank j, which
// stores it as block Rank() of its recv. send and recv have the same
// length; in place is allowed (through a staging copy).
func (c *Comm) AllToAll(ctx context.Context, send, recv []byte, dt DataType) error {
	if err := c.checkTypes(dt, Sum); err != nil {
		return err
	}
	if err := c.checkLen("send", send, dt, -1); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, len(send)); err != nil {
		return err
	}
	if len(send)%(c.nranks*dt.Size()) != 0 {
		return fmt.Errorf("%w: AllToAll buffer of %d bytes is not %d equal blocks of %s", ErrInvalidArgument, len(send), c.nranks, dt)
	}
	count := len(send) / dt.Size() / c.nranks
	if err := c.collective(ctx, call{kind: kAllToAll, dt: dt, count: count, root: -1}); err != nil {
		return err
	}
	if count == 0 {
		return c.end(nil)
	}
	var in, out mem
	var staged bool
	var err error
	if sameStart(send, recv) {
		// Blocks are overwritten before they are sent: send from a copy.
		if in, err = c.bounce(&c.bounceIn, len(send)); err == nil {
			copy(in.b, send)
			out, staged, err = c.output(recv)
		}
	} else if in, err = c.input(send); err == nil {
		out, staged, err = c.output(recv)
	}
	if err == nil {
		err = c.allToAll(in, out, count, dt.Size())
	}
	return c.endOut(err, staged, recv, out)
}

// Send sends buf to rank peer, which must call Recv (or SendRecv) with the
// same length and type. Messages between two ranks arrive in order. A
// Send larger than the peer's receive FIFO (Slots×ChunkSize bytes) waits
// for the matching Recv; use SendRecv to exchange in both directions.
func (c *Comm) Send(ctx context.Context, buf []byte, dt DataType, peer int) error {
	return c.SendRecv(ctx, buf, peer, nil, -1, dt)
}

// Recv receives len(buf) bytes from rank peer's matching Send.
func (c *Comm) Recv(ctx context.Context, buf []byte, dt DataType, peer int) error {
	return c.SendRecv(ctx, nil, -1, buf, peer, dt)
}

// SendRecv sends send to rank dst and receives recv from rank src at the
// same time (pieces interleaved, so pairs and rings of exchanges of any
// size do not deadlock). dst or src -1 skips that direction.
func (c *Comm) SendRecv(ctx context.Context, send []byte, dst int, recv []byte, src int, dt DataType) error {
	if err := c.checkTypes(dt, Sum); err != nil {
		return err
	}
	for _, p := range []int{dst, src} {
		if p == c.rank || p < -1 || p >= c.nranks {
			return fmt.Errorf("%w: peer %d (rank %d of %d)", ErrInvalidArgument, p, c.rank, c.nranks)
		}
	}
	if err := c.checkLen("send", send, dt, -1); err != nil {
		return err
	}
	if err := c.checkLen("recv", recv, dt, -1); err != nil {
		return err
	}
	es := dt.Size()
	if err := c.begin(ctx, call{kind: kP2P, dt: dt, count: len(send) / es, root: dst}); err != nil {
		return err
	}
	var ssig, rsig uint32
	if dst >= 0 {
		ssig = signature(call{kind: kP2P, dt: dt, count: len(send) / es}, c.sendSeq[dst])
		c.sendSeq[dst]++
	}
	if src >= 0 {
		rsig = signature(call{kind: kP2P, dt: dt, count: len(recv) / es}, c.recvSeq[src])
		c.recvSeq[src]++
	}
	var in, out mem
	var staged bool
	var err error
	if dst >= 0 && len(send) > 0 {
		in, err = c.input(send)
	}
	if err == nil && src >= 0 && len(recv) > 0 {
		out, staged, err = c.output(recv)
	}
	if err == nil {
		err = c.sendRecv(in, len(send)/es, dst, out, len(recv)/es, src, es, ssig, rsig)
	}
	return c.endOut(err, staged, recv, out)
}

// Barrier returns once every rank has entered it.
func (c *Comm) Barrier(ctx context.Context) error {
	if err := c.collective(ctx, call{kind: kBarrier, root: -1}); err != nil {
		return err
	}
	var err error
	if c.nranks > 1 {
		err = c.barrier()
	}
	return c.end(err)
}
