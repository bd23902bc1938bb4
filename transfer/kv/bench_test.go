package kv

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkGetMR: one client reading 256 KiB values zero-copy over shm0
// (and tcp0) from a store node in this process.
func BenchmarkGetMR(b *testing.B) {
	for _, dev := range []string{"shm0", "tcp0"} {
		b.Run(dev, func(b *testing.B) {
			ctx := context.Background()
			c0 := Config{Capacity: 64 << 20, Transfer: tcfg(dev)}
			srv, err := Open(ctx, c0)
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Close()
			c, err := Open(ctx, Config{Addr: srv.Addr(), Transfer: tcfg(dev)})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			const size = 256 << 10
			mr, _ := c.AllocMR(size)
			buf := Buf{MR: mr, Len: size}
			for i := 0; i < 100; i++ {
				if err := c.PutMR(ctx, []byte(fmt.Sprint(i)), buf); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.GetMR(ctx, []byte(fmt.Sprint(i%100)), buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkExists: one round trip to the master.
func BenchmarkExists(b *testing.B) {
	ctx := context.Background()
	srv, err := Open(ctx, Config{Capacity: 1 << 20, Transfer: tcfg("shm0")})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := Open(ctx, Config{Addr: srv.Addr(), Transfer: tcfg("shm0")})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	key := []byte("k")
	for i := 0; i < b.N; i++ {
		if _, err := c.Exists(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGet: as BenchmarkGetMR/shm0 with the []byte API.
func BenchmarkGet(b *testing.B) {
	ctx := context.Background()
	srv, err := Open(ctx, Config{Capacity: 64 << 20, Transfer: tcfg("shm0")})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := Open(ctx, Config{Addr: srv.Addr(), Transfer: tcfg("shm0")})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	const size = 256 << 10
	v := make([]byte, size)
	for i := 0; i < 100; i++ {
		if err := c.Put(ctx, []byte(fmt.Sprint(i)), v); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.GetInto(ctx, []byte(fmt.Sprint(i%100)), v); err != nil {
			b.Fatal(err)
		}
	}
}
