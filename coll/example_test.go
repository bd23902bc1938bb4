package coll_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/rdmakit/rdmakit/coll"
)

// Two ranks (goroutines here; usually processes) sum a vector.
func Example() {
	id, err := coll.GetUniqueID() // in real use: made by one process, sent to all
	if err != nil {
		fmt.Println(err)
		return
	}
	const nranks = 2
	results := make([][]float32, nranks)
	var wg sync.WaitGroup
	for rank := 0; rank < nranks; rank++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			c, err := coll.NewComm(ctx, id, nranks, rank, nil)
			if err != nil {
				fmt.Println(err)
				return
			}
			defer c.Close()
			buf, err := c.Alloc(4 * 4) // registered memory: no staging copies
			if err != nil {
				fmt.Println(err)
				return
			}
			x := coll.Slice[float32](buf)
			for i := range x {
				x[i] = float32(10*rank + i)
			}
			if err := c.AllReduce(ctx, buf, buf, coll.Float32, coll.Sum); err != nil {
				fmt.Println(err)
				return
			}
			results[rank] = append([]float32(nil), x...)
		}()
	}
	wg.Wait()
	fmt.Println(results[0], results[1])
	// Output: [10 12 14 16] [10 12 14 16]
}
