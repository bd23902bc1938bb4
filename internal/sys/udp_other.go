//go:build !linux

package sys

type batchOS struct{}

// HasUDPBatch reports whether SendBatch and RecvBatch work on this system.
const HasUDPBatch = false

// SendBatch is not supported on this system.
func (b *UDPBatch) SendBatch(fd, from, n int) (int, error) { return 0, notSupported("sendmmsg") }

// RecvBatch is not supported on this system.
func (b *UDPBatch) RecvBatch(fd, n int) (int, error) { return 0, notSupported("recvmmsg") }

// SetUDPOptions is not supported on this system.
func SetUDPOptions(fd int, v6 bool, tos uint8, bufSize int, gro bool) error {
	return notSupported("RoCEv2 socket options")
}
