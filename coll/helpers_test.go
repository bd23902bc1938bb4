package coll

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/rdmakit/rdmakit/coll/internal/reduce"
)

// runRanks runs f on n goroutine ranks, each with its own communicator
// (its own verbs contexts), and returns their errors.
func runRanks(t testing.TB, n int, opts Options, f func(c *Comm) error) []error {
	t.Helper()
	id, err := GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 20 * time.Second
	}
	if opts.BootstrapTimeout == 0 {
		opts.BootstrapTimeout = 20 * time.Second
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			c, err := NewComm(context.Background(), id, n, r, &opts)
			if err != nil {
				errs[r] = err
				return
			}
			errs[r] = f(c)
			c.Close()
		}(r)
	}
	wg.Wait()
	return errs
}

func noErrors(t testing.TB, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// val is the test value of element i of rank r's input: small integers,
// so that every order of reduction gives exactly the same result in every
// type (products stay within ±32, sums within ±40).
func val(op RedOp, r, i int) int64 {
	if op == Prod {
		return [3]int64{1, 2, -1}[(r+i)%3]
	}
	return int64((r*7+i*3)%17) - 8
}

func put(dt DataType, b []byte, i int, v int64) {
	e := b[i*dt.Size():]
	le := binary.LittleEndian
	switch dt {
	case Int8, Uint8:
		e[0] = byte(v)
	case Int32, Uint32:
		le.PutUint32(e, uint32(v))
	case Int64, Uint64:
		le.PutUint64(e, uint64(v))
	case Float16:
		le.PutUint16(e, reduce.F32ToF16(float32(v)))
	case BFloat16:
		le.PutUint16(e, reduce.F32ToBF16(float32(v)))
	case Float32:
		le.PutUint32(e, math.Float32bits(float32(v)))
	case Float64:
		le.PutUint64(e, math.Float64bits(float64(v)))
	}
}

// fill writes rank r's input (offset by base elements, for the blocks of
// AllToAll and ReduceScatter).
func fill(dt DataType, op RedOp, b []byte, r, base int) {
	for i := 0; i < len(b)/dt.Size(); i++ {
		put(dt, b, i, val(op, r, base+i))
	}
}

// expect computes the reduction of all ranks' inputs for count elements
// starting at element base.
func expect(dt DataType, op RedOp, n, base, count int) []byte {
	es := dt.Size()
	acc := make([]byte, count*es)
	x := make([]byte, count*es)
	for r := 0; r < n; r++ {
		fill(dt, op, x, r, base)
		if r == 0 {
			copy(acc, x)
			continue
		}
		reduce.Apply(reduce.Type(dt), op.kernel(), acc, acc, x)
	}
	if op == Avg {
		reduce.Div(reduce.Type(dt), acc, acc, n)
	}
	return acc
}

// diff reports the first difference as an error.
func diff(what string, dt DataType, got, want []byte) error {
	if len(got) != len(want) {
		return fmt.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	es := dt.Size()
	for i := 0; i < len(got); i += es {
		if string(got[i:i+es]) != string(want[i:i+es]) {
			return fmt.Errorf("%s: element %d of %d is %x, want %x", what, i/es, len(got)/es, got[i:i+es], want[i:i+es])
		}
	}
	return nil
}
