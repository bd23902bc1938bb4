//go:build !linux

package sys

import (
	"net/netip"
	"time"
)

type batchOS struct{}

// HasUDPBatch reports whether SendBatch and RecvBatch work on this system.
const HasUDPBatch = false

// SendBatch is not supported on this system.
func (b *UDPBatch) SendBatch(fd, from, n int) (int, error) { return 0, notSupported("sendmmsg") }

// RecvBatch is not supported on this system.
func (b *UDPBatch) RecvBatch(fd, n int) (int, error) { return 0, notSupported("recvmmsg") }

// SendBatchRaw is SendBatch (not supported on this system).
func (b *UDPBatch) SendBatchRaw(fd, from, n int) (int, error) { return b.SendBatch(fd, from, n) }

// RecvBatchRaw is RecvBatch (not supported on this system).
func (b *UDPBatch) RecvBatchRaw(fd, n int) (int, error) { return b.RecvBatch(fd, n) }

// SetUDPOptions is not supported on this system.
func SetUDPOptions(fd int, v6 bool, tos uint8, bufSize int, gro bool) error {
	return notSupported("RoCEv2 socket options")
}

// ListenUDPFD is not supported on this system.
func ListenUDPFD(bind netip.AddrPort) (int, netip.AddrPort, error) {
	return -1, netip.AddrPort{}, notSupported("a UDP socket outside the network poller")
}

// NewEvent is not supported on this system.
func NewEvent() (int, error) { return -1, notSupported("eventfd") }

// Signal does nothing on this system.
func Signal(efd int) {}

// Drain does nothing on this system.
func Drain(efd int) bool { return false }

// WaitFD does not wait on this system.
func WaitFD(fd, efd int, out bool, timeout time.Duration) (ready, woken bool) {
	return false, false
}

// SendToFD is not supported on this system.
func SendToFD(fd int, b []byte, to netip.AddrPort) error { return notSupported("sendto") }
