// Command mcbench measures memcached SET and GET throughput the way
// redis-benchmark does for Redis: --clients connections, each doing its
// share of --ops requests one at a time over --keys random keys of
// --size-byte values, SETs first, then GETs. It prints one line per test,
// "SET: 12345.6 ops/s, 3.2 GB/s, p50 0.050 ms, p99 0.210 ms", the lines
// bench/kv-vs-redis.sh reads.
//
//	go run . --server 127.0.0.1:11311 --size 262144 --clients 8 --ops 2048
package main

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

func main() {
	server := flag.String("server", "127.0.0.1:11211", "memcached address")
	size := flag.Int("size", 4096, "value size in bytes")
	clients := flag.Int("clients", 1, "concurrent connections")
	ops := flag.Int("ops", 10000, "requests per test, over all connections")
	keys := flag.Int("keys", 100, "distinct keys")
	flag.Parse()
	if *size < 0 || *clients <= 0 || *ops <= 0 || *keys <= 0 {
		fmt.Fprintln(os.Stderr, "mcbench: bad arguments")
		os.Exit(2)
	}
	value := make([]byte, *size)
	for i := range value {
		value[i] = byte(i * 7)
	}
	for _, test := range []string{"SET", "GET"} {
		if err := run(test, *server, value, *clients, *ops, *keys); err != nil {
			fmt.Fprintln(os.Stderr, "mcbench:", err)
			os.Exit(1)
		}
	}
}

func run(test, server string, value []byte, clients, ops, keys int) error {
	lat := make([][]time.Duration, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range clients {
		n := ops / clients
		if c < ops%clients {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mc := memcache.New(server)
			mc.Timeout = 10 * time.Second
			mc.MaxIdleConns = 1
			defer mc.Close()
			r := rand.New(rand.NewPCG(uint64(c), 1))
			lat[c] = make([]time.Duration, 0, n)
			for range n {
				key := fmt.Sprintf("key:%012d", r.IntN(keys))
				t0 := time.Now()
				var err error
				if test == "SET" {
					err = mc.Set(&memcache.Item{Key: key, Value: value})
				} else {
					var it *memcache.Item
					it, err = mc.Get(key)
					if err == nil && len(it.Value) != len(value) {
						err = fmt.Errorf("GET %s: %d bytes, want %d", key, len(it.Value), len(value))
					}
					if errors.Is(err, memcache.ErrCacheMiss) {
						err = nil // as redis-benchmark: a miss is an answer
					}
				}
				if err != nil {
					errs[c] = fmt.Errorf("%s: %w", test, err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	ms := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / 1e6 }
	rate := float64(len(all)) / elapsed.Seconds()
	fmt.Printf("%s: %.1f ops/s, %.2f GB/s, p50 %.3f ms, p99 %.3f ms\n", test, rate, rate*float64(len(value))/1e9, ms(0.5), ms(0.99))
	return nil
}
