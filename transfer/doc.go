// Package transfer is a transfer engine in the manner of Mooncake's
// Transfer Engine: nodes publish named segments of memory (or files) in a
// metadata table, and any node moves bytes between its own memory and any
// segment with batches of one-sided RDMA Reads and Writes, over whichever
// device reaches the segment's node (shm0 on the same host, tcp0 or an
// RDMA NIC elsewhere; software RoCEv2, roceN, when Config.Devices names
// it).
//
//	n, err := transfer.New(ctx, transfer.Config{Name: "a", Secret: secret})          // serves the table
//	m, err := transfer.New(ctx, transfer.Config{Name: "b", Secret: secret, MetadataAddr: n.Addr()})
//	seg, err := n.AllocSegment(ctx, "kv", 1<<30)                                      // on a
//	buf, err := m.AllocMR(1 << 20)                                                    // on b
//	b, err := m.Submit(ctx, []transfer.Request{{Op: transfer.Read, Local: buf, Segment: "kv", Offset: 4096, Length: 1 << 20}})
//	err = b.Wait(ctx)
//
// Nodes. New opens the node's devices (Config.Devices, default chosen by
// capability), starts a cm listener on each (connections need the shared
// Config.Secret, or Insecure), and registers the node in the metadata
// table: its own embedded one, served on Config.ListenAddr, or another
// node's (Config.MetadataAddr), an etcd cluster (MetadataAddr
// "etcd://host:2379,..."), or any Metadata implementation. A node
// renews its lease every third of Config.LeaseTTL; a node that stops (a
// killed process) disappears from the table with its segments within
// LeaseTTL.
//
// Segments. AllocSegment, RegisterSegment (memory from AllocMR) and
// RegisterFileSegment publish a segment under a name unique in the table
// (ErrExists otherwise); OpenSegment returns its size, node and access;
// unknown names are ErrNoSegment. A mapped file segment is guarded by a
// file lease: a process that truncates the file waits until the node has
// withdrawn the segment.
//
// Transfers. Submit checks every request before anything moves (bounds:
// ErrBounds, read-only segments: ErrReadOnly, unknown segments), connects
// to the segments' nodes on first use (Config.QPsPerPeer QPs each,
// cached, closed after Config.IdleTimeout unused or when the peer goes),
// cuts each request into slices spread round-robin over the QPs and, to
// another host, over every network device both nodes have (Config.Rails),
// and posts them; SubmitAsync returns before posting. A request completes when all its slices
// do; its Status goes Waiting, Pending, then Completed, Failed (with the
// cause: a remote access error, ErrPeerLost when its node went away),
// Timeout or Canceled (Submit's context ended before all was posted).
// Batch.Wait waits for all, and every slice always returns: a peer that
// dies or goes silent is declared lost by cm within Config.PeerTimeout,
// and what was in flight to it fails.
//
// Goroutines and locks are described at the top of each file: node.go
// (devices, leases, accepted connections), conn.go (per-QP completion and
// watcher goroutines, the janitor), metanet.go (the metadata service),
// etcd.go (the etcd client's), lease_linux.go (the file lease watcher).
// Posting and completion handling allocate nothing per slice.
//
// See docs/transfer.md for the design, the wire format of the metadata
// service and what is not done yet.
package transfer
