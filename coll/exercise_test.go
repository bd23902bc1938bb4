package coll

import (
	"bytes"
	"context"
	"fmt"
)

// scenario is a list of collectives every rank runs in the same order,
// each checked against the expected result.
type scenario struct {
	kinds  []string // allreduce, reducescatter, allgather, broadcast, reduce, alltoall, sendrecv, sendpair, barrier
	types  []DataType
	ops    []RedOp
	counts []int
	algos  []Algorithm
	roots  []int // broadcast/reduce roots (mod n)
	places []bool
}

// exercise runs sc on c. Buffers alternate between registered (Alloc) and
// plain Go memory.
func exercise(ctx context.Context, c *Comm, sc scenario) error {
	n, r := c.Size(), c.Rank()
	maxc := 0
	for _, k := range sc.counts {
		maxc = max(maxc, k)
	}
	regSize := 2 * (n + 1) * maxc * 8
	arena, err := c.Alloc(regSize)
	if err != nil {
		return err
	}
	defer c.Free(arena)
	combo := 0
	bufs := func(sendLen, recvLen int) (s, rv []byte) {
		combo++
		if combo%2 == 0 {
			return arena[:sendLen:sendLen], arena[sendLen : sendLen+recvLen : sendLen+recvLen]
		}
		return make([]byte, sendLen), make([]byte, recvLen)
	}
	algos := sc.algos
	if len(algos) == 0 {
		algos = []Algorithm{AlgoAuto}
	}
	places := sc.places
	if len(places) == 0 {
		places = []bool{false, true}
	}
	saved := c.opts.Algorithm
	defer func() { c.opts.Algorithm = saved }()
	for _, kind := range sc.kinds {
		for _, dt := range sc.types {
			es := dt.Size()
			ops := []RedOp{Sum}
			switch kind {
			case "allreduce", "reducescatter", "reduce":
				ops = sc.ops
			}
			for _, op := range ops {
				for _, count := range sc.counts {
					for _, algo := range algos {
						c.opts.Algorithm = algo
						for _, inPlace := range places {
							what := fmt.Sprintf("rank %d: %s %s %s count %d algo %s in-place %v", r, kind, dt, op, count, algo, inPlace)
							if err := one(ctx, c, kind, dt, op, count, inPlace, sc.roots, bufs, es); err != nil {
								return fmt.Errorf("%s: %w", what, err)
							}
						}
					}
				}
			}
		}
	}
	return nil
}

func one(ctx context.Context, c *Comm, kind string, dt DataType, op RedOp, count int, inPlace bool, roots []int,
	bufs func(int, int) ([]byte, []byte), es int) error {
	n, r := c.Size(), c.Rank()
	switch kind {
	case "allreduce":
		send, recv := bufs(count*es, count*es)
		fill(dt, op, send, r, 0)
		if inPlace {
			recv = send
		}
		if err := c.AllReduce(ctx, send, recv, dt, op); err != nil {
			return err
		}
		if !inPlace {
			// The algorithms send from and reduce with send itself
			// (foldStart): it must come back unchanged.
			want := make([]byte, len(send))
			fill(dt, op, want, r, 0)
			if !bytes.Equal(send, want) {
				return fmt.Errorf("allreduce changed its send buffer")
			}
		}
		return diff("result", dt, recv, expect(dt, op, n, 0, count))
	case "reducescatter":
		send, recv := bufs(n*count*es, count*es)
		fill(dt, op, send, r, 0)
		if inPlace {
			recv = send[r*count*es : (r+1)*count*es]
		}
		if err := c.ReduceScatter(ctx, send, recv, dt, op); err != nil {
			return err
		}
		return diff("result", dt, recv, expect(dt, op, n, r*count, count))
	case "allgather":
		send, recv := bufs(count*es, n*count*es)
		if inPlace {
			send = recv[r*count*es : (r+1)*count*es]
		}
		fill(dt, Sum, send, r, 0)
		if err := c.AllGather(ctx, send, recv, dt); err != nil {
			return err
		}
		want := make([]byte, n*count*es)
		for j := 0; j < n; j++ {
			fill(dt, Sum, want[j*count*es:(j+1)*count*es], j, 0)
		}
		return diff("result", dt, recv, want)
	case "broadcast", "reduce":
		for _, rt := range roots {
			root := rt % n
			send, recv := bufs(count*es, count*es)
			if kind == "broadcast" {
				if r == root {
					fill(dt, Sum, send, root, 0)
				} else {
					send = nil
				}
			} else {
				fill(dt, op, send, r, 0)
				if r != root {
					recv = nil
				}
			}
			if inPlace {
				if kind == "broadcast" && r == root {
					recv = send
				} else if kind == "reduce" && r == root {
					recv = send
				}
			}
			if kind == "broadcast" {
				if err := c.Broadcast(ctx, send, recv, dt, root); err != nil {
					return err
				}
				want := make([]byte, count*es)
				fill(dt, Sum, want, root, 0)
				if err := diff(fmt.Sprintf("root %d", root), dt, recv, want); err != nil {
					return err
				}
				continue
			}
			if err := c.Reduce(ctx, send, recv, dt, op, root); err != nil {
				return err
			}
			if r == root {
				if err := diff(fmt.Sprintf("root %d", root), dt, recv, expect(dt, op, n, 0, count)); err != nil {
					return err
				}
			}
		}
		return nil
	case "alltoall":
		send, recv := bufs(n*count*es, n*count*es)
		fill(dt, Sum, send, r, 0)
		if inPlace {
			recv = send
		}
		if err := c.AllToAll(ctx, send, recv, dt); err != nil {
			return err
		}
		want := make([]byte, n*count*es)
		for s := 0; s < n; s++ {
			fill(dt, Sum, want[s*count*es:(s+1)*count*es], s, r*count)
		}
		return diff("result", dt, recv, want)
	case "sendrecv":
		send, recv := bufs(count*es, count*es)
		fill(dt, Sum, send, r, 0)
		if err := c.SendRecv(ctx, send, (r+1)%n, recv, (r-1+n)%n, dt); err != nil {
			return err
		}
		want := make([]byte, count*es)
		fill(dt, Sum, want, (r-1+n)%n, 0)
		return diff("result", dt, recv, want)
	case "sendpair":
		// Rank 0 sends to the last rank, which receives; others skip.
		buf, _ := bufs(count*es, 0)
		switch r {
		case 0:
			fill(dt, Sum, buf, 0, 0)
			return c.Send(ctx, buf, dt, n-1)
		case n - 1:
			if err := c.Recv(ctx, buf, dt, 0); err != nil {
				return err
			}
			want := make([]byte, count*es)
			fill(dt, Sum, want, 0, 0)
			return diff("result", dt, buf, want)
		}
		return nil
	case "barrier":
		return c.Barrier(ctx)
	}
	return fmt.Errorf("unknown kind %q", kind)
}
