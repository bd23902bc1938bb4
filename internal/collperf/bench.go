package collperf

// One collective run, timed and verified. Runs in the rank's benchmark
// goroutine.

import (
	"context"
	"encoding/binary"
	"math"
	"time"

	"github.com/rdmakit/rdmakit/coll"
)

// collBench runs one collective of one size, out of place or in place, the
// way nccl-tests lays out its buffers.
type collBench struct {
	c          *coll.Comm
	t          collTest
	dt         coll.DataType
	op         coll.RedOp
	root       int
	send, recv []byte
	param      int
	inPlace    bool
	// agg is the number of collectives per timed iteration (-m);
	// blocking adds a barrier after each collective (-z).
	agg      int
	blocking bool
}

// run issues the collective once.
func (b *collBench) run(ctx context.Context) error {
	c, n, r, es := b.c, b.c.Size(), b.c.Rank(), b.dt.Size()
	send, recv := b.send, b.recv
	switch b.t.name {
	case "all_reduce":
		if b.inPlace {
			send = recv
		}
		return c.AllReduce(ctx, send, recv, b.dt, b.op)
	case "all_gather":
		if b.inPlace {
			send = recv[r*b.param*es : (r+1)*b.param*es]
		}
		return c.AllGather(ctx, send, recv, b.dt)
	case "reduce_scatter":
		if b.inPlace {
			recv = send[r*b.param*es : (r+1)*b.param*es]
		}
		return c.ReduceScatter(ctx, send, recv, b.dt, b.op)
	case "alltoall":
		if b.inPlace {
			send = recv
		}
		return c.AllToAll(ctx, send, recv, b.dt)
	case "broadcast":
		if b.inPlace {
			send = recv
		}
		return c.Broadcast(ctx, send, recv, b.dt, b.root)
	case "reduce":
		if b.inPlace {
			send = recv
		}
		return c.Reduce(ctx, send, recv, b.dt, b.op, b.root)
	case "sendrecv":
		if b.inPlace {
			send = recv
			recv = b.send // nccl-tests' in-place sendrecv still needs two buffers
		}
		return c.SendRecv(ctx, send, (r+1)%n, recv, (r-1+n)%n, b.dt)
	}
	return nil
}

// time returns the mean time of iters calls after warmup calls, all ranks
// starting together.
func (b *collBench) time(ctx context.Context, warmup, iters int) (float64, error) {
	for i := 0; i < warmup; i++ {
		if err := b.run(ctx); err != nil {
			return 0, err
		}
	}
	if err := b.c.Barrier(ctx); err != nil {
		return 0, err
	}
	agg := max(b.agg, 1)
	t0 := time.Now()
	for i := 0; i < iters*agg; i++ {
		if err := b.run(ctx); err != nil {
			return 0, err
		}
		if b.blocking {
			if err := b.c.Barrier(ctx); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(t0).Seconds() / float64(iters*agg), nil
}

// collValue is element i of rank r's input: distinct per rank and index,
// small enough that every order of reduction is exact in every type.
func collValue(op coll.RedOp, r, i int) int64 {
	if op == coll.Prod {
		return [3]int64{1, 2, -1}[(r+i)%3]
	}
	return int64((r*7+i*3)%17 - 8)
}

func isFloat(dt coll.DataType) bool {
	return dt == coll.Float16 || dt == coll.BFloat16 || dt == coll.Float32 || dt == coll.Float64
}

// collPut stores v (an integer, or for floating types a value given as
// float64) as element i of b.
func collPut(dt coll.DataType, b []byte, i int, v int64, f float64) {
	e := b[i*dt.Size():]
	le := binary.LittleEndian
	switch dt {
	case coll.Int8, coll.Uint8:
		e[0] = byte(v)
	case coll.Int32, coll.Uint32:
		le.PutUint32(e, uint32(v))
	case coll.Int64, coll.Uint64:
		le.PutUint64(e, uint64(v))
	case coll.Float16:
		le.PutUint16(e, coll.F16From(float32(f)).Bits())
	case coll.BFloat16:
		le.PutUint16(e, coll.BF16From(float32(f)).Bits())
	case coll.Float32:
		le.PutUint32(e, math.Float32bits(float32(f)))
	case coll.Float64:
		le.PutUint64(e, math.Float64bits(f))
	}
}

// collExpected computes element i of the reduction of all ranks' inputs,
// in the element type's arithmetic (integers wrap, unsigned avg divides
// the wrapped sum).
func collExpected(dt coll.DataType, op coll.RedOp, n, i int) []byte {
	es := dt.Size()
	acc := collValue(op, 0, i)
	for r := 1; r < n; r++ {
		v := collValue(op, r, i)
		switch op {
		case coll.Sum, coll.Avg:
			acc += v
		case coll.Prod:
			acc *= v
		case coll.Min:
			acc = min(acc, v)
		case coll.Max:
			acc = max(acc, v)
		}
	}
	f := float64(acc)
	if op == coll.Avg {
		switch dt {
		case coll.Uint8, coll.Uint32, coll.Uint64:
			u := uint64(acc)
			if bits := uint(es * 8); bits < 64 {
				u &= 1<<bits - 1
			}
			acc = int64(u / uint64(n))
		case coll.Int8:
			acc = int64(int8(acc) / int8(n))
		case coll.Int32:
			acc = int64(int32(acc) / int32(n))
		case coll.Int64:
			acc /= int64(n)
		}
		f /= float64(n)
	}
	if !isFloat(dt) && (op == coll.Min || op == coll.Max) && (dt == coll.Uint8 || dt == coll.Uint32 || dt == coll.Uint64) {
		// Unsigned comparison: recompute over the stored (wrapped) values.
		mask := uint64(1)<<(uint(es)*8) - 1
		if es == 8 {
			mask = ^uint64(0)
		}
		u := uint64(collValue(op, 0, i)) & mask
		for r := 1; r < n; r++ {
			v := uint64(collValue(op, r, i)) & mask
			if op == coll.Min {
				u = min(u, v)
			} else {
				u = max(u, v)
			}
		}
		acc = int64(u)
	}
	out := make([]byte, es)
	collPut(dt, out, 0, acc, f)
	return out
}

func collFill(dt coll.DataType, op coll.RedOp, b []byte, r, base int) {
	for i := 0; i < len(b)/dt.Size(); i++ {
		v := collValue(op, r, base+i)
		collPut(dt, b, i, v, float64(v))
	}
}

func collWrong(dt coll.DataType, got []byte, want func(i int) []byte) int64 {
	es := dt.Size()
	var w int64
	for i := 0; i < len(got)/es; i++ {
		if string(got[i*es:(i+1)*es]) != string(want(i)) {
			w++
		}
	}
	return w
}

// verify initialises the input the way run lays out buffers, runs the
// collective once and counts wrong elements of this rank's result.
func (b *collBench) verify(ctx context.Context) (int64, error) {
	n, r, es, pc := b.c.Size(), b.c.Rank(), b.dt.Size(), b.param
	clear(b.recv)
	one := func(v int64) []byte { x := make([]byte, es); collPut(b.dt, x, 0, v, float64(v)); return x }
	in, result := b.send, b.recv // input as run uses it, and where the result lands
	if b.inPlace {
		switch b.t.name {
		case "all_reduce", "reduce", "alltoall", "broadcast":
			in = b.recv
		case "all_gather":
			in = b.recv[r*pc*es : (r+1)*pc*es]
		case "reduce_scatter":
			result = b.send[r*pc*es : (r+1)*pc*es]
		case "sendrecv":
			in, result = b.recv, b.send
		}
	}
	var want func(i int) []byte
	switch b.t.name {
	case "all_reduce", "reduce":
		collFill(b.dt, b.op, in[:pc*es], r, 0)
		result = result[:pc*es]
		want = func(i int) []byte { return collExpected(b.dt, b.op, n, i) }
		if b.t.name == "reduce" && r != b.root {
			result = nil
		}
	case "reduce_scatter":
		collFill(b.dt, b.op, in[:n*pc*es], r, 0)
		result = result[:pc*es]
		want = func(i int) []byte { return collExpected(b.dt, b.op, n, r*pc+i) }
	case "all_gather":
		collFill(b.dt, coll.Sum, in[:pc*es], r, 0)
		result = result[:n*pc*es]
		want = func(i int) []byte { return one(collValue(coll.Sum, i/max(pc, 1), i%max(pc, 1))) }
	case "alltoall":
		collFill(b.dt, coll.Sum, in[:n*pc*es], r, 0)
		result = result[:n*pc*es]
		want = func(i int) []byte { return one(collValue(coll.Sum, i/max(pc, 1), r*pc+i%max(pc, 1))) }
	case "broadcast":
		if r == b.root {
			collFill(b.dt, coll.Sum, in[:pc*es], r, 0)
		}
		result = result[:pc*es]
		want = func(i int) []byte { return one(collValue(coll.Sum, b.root, i)) }
	case "sendrecv":
		collFill(b.dt, coll.Sum, in[:pc*es], r, 0)
		result = result[:pc*es]
		want = func(i int) []byte { return one(collValue(coll.Sum, (r-1+n)%n, i)) }
	}
	if err := b.run(ctx); err != nil {
		return 0, err
	}
	if result == nil {
		return 0, nil
	}
	return collWrong(b.dt, result, want), nil
}
