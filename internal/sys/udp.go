package sys

import "net/netip"

// MaxBatch is the most datagrams one UDPBatch call moves.
const MaxBatch = 64

// UDPBatch is a batch of datagrams for one sendmmsg(2) or recvmmsg(2)
// call: buffers, peer addresses, lengths and the IP traffic class of each
// (ECN bits included), with the kernel's headers preallocated so that
// batched I/O allocates nothing. One per goroutine doing I/O.
type UDPBatch struct {
	Bufs  [MaxBatch][]byte
	Addrs [MaxBatch]netip.AddrPort
	Lens  [MaxBatch]int
	// TOS is the IPv4 type of service or IPv6 traffic class a datagram
	// arrived with (RecvTOS enabled), 0 otherwise.
	TOS [MaxBatch]uint8

	batchOS
}
