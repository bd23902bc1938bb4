package kv

import (
	"context"
	"fmt"
	"testing"
)

// TestGetAllocs counts the allocations of a GetMR of a key whose location
// the client keeps (the path kv bench runs) over shm0 and tcp0.
func TestGetAllocs(t *testing.T) {
	for _, dev := range []string{"shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			ctx := context.Background()
			srv, err := Open(ctx, Config{Capacity: 8 << 20, Transfer: tcfg(dev)})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			c, err := Open(ctx, Config{Addr: srv.Addr(), Transfer: tcfg(dev)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			mr, _ := c.AllocMR(4096)
			buf := Buf{MR: mr, Len: 4096}
			key := []byte("k")
			if err := c.PutMR(ctx, key, buf); err != nil {
				t.Fatal(err)
			}
			n := testing.AllocsPerRun(200, func() {
				if _, err := c.GetMR(ctx, key, buf); err != nil {
					t.Fatal(err)
				}
			})
			fmt.Println(dev, n)
		})
	}
}
