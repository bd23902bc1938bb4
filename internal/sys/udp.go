package sys

import "net/netip"

// MaxBatch is the most datagrams one UDPBatch call moves.
const MaxBatch = 64

// MaxGSOSegments and MaxGSOBytes bound one GSO message: the kernel's
// segment limit and the largest IP packet.
const (
	MaxGSOSegments = 64
	// MaxVecs bounds the buffers of one message (UDPBatch.Vecs): the
	// kernel's UIO_MAXIOV.
	MaxVecs     = 1024
	MaxGSOBytes = 65000
)

// ErrGSO is returned by SendBatch (and SendBatchRaw) when the kernel or the route refuses
// segmentation offload; the caller sends those datagrams one by one.
var ErrGSO = errGSO{}

type errGSO struct{}

func (errGSO) Error() string { return "sys: UDP segmentation offload refused" }

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
	// Seg, when non-zero, makes SendBatch send Bufs[i] as datagrams of
	// Seg[i] bytes each (the last may be shorter) with one UDP
	// segmentation offload (GSO) message (see MaxGSOSegments); from
	// RecvBatch it says Bufs[i] holds datagrams of Seg[i] bytes the
	// kernel coalesced (UDP_GRO), the last possibly shorter.
	Seg [MaxBatch]uint16
	// Vecs, when Vecs[i] is not empty, makes SendBatch send the
	// concatenation of Vecs[i] as message i instead of Bufs[i] (a
	// gather list: headers from one place, payload from another; with
	// Seg[i] the kernel cuts the whole into datagrams). At most
	// MaxVecs buffers a message. SendBatch only.
	Vecs [MaxBatch][][]byte

	batchOS
}
