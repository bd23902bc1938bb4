// Package kv is a KV-cache store over the transfer engine, in the manner
// of Mooncake Store: store nodes offer registered memory, a master places
// values in it, and clients move values one-sided: a Put writes the value
// with RDMA Writes into space the master allocated on the holders, a Get
// reads it with an RDMA Read from a holder's memory. Nothing on the holder
// runs for either.
//
//	s, err := kv.Open(ctx, kv.Config{Capacity: 1 << 30, Transfer: transfer.Config{Secret: secret}}) // runs the master
//	c, err := kv.Open(ctx, kv.Config{Addr: s.Addr(), Transfer: transfer.Config{Secret: secret}})      // a client
//	err = c.Put(ctx, key, value)
//	v, err := c.Get(ctx, key)                                  // ErrNotFound when absent
//	n, err := c.GetMR(ctx, key, kv.Buf{MR: mr, Len: mr.Len()}) // zero-copy into registered memory
//
// Keys are opaque bytes (BlockKeys derives prefix-chained keys of token
// blocks, as serving engines key their prefix caches). The master keeps
// versions and read leases: a value being read is neither evicted nor
// overwritten under its reader, so a Get returns a value as one Put
// committed it, whole. Under capacity the least recently used values not
// being read are evicted; a Put that cannot be placed fails with ErrFull.
//
// With the metadata in etcd, every node opened without Addr runs for
// master through an etcd election; the master writes its table through to
// etcd, fenced by its election key, and a survivor takes over when the
// master's node goes (ha.go, docs/transfer.md).
//
// Goroutines: a store node with capacity beats its heartbeat to the master
// (store.go); every Store hands back read leases left over (store.go); the
// master's service runs transfer/internal/rpc's goroutines and its state
// (master.go) is I/O-free under one lock. Calls run on the caller's
// goroutine. See docs/transfer.md for the design, the wire format and the
// benchmarks.
package kv
