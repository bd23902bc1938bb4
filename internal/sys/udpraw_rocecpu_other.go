//go:build !linux

package sys

// SendBatchRaw is SendBatch (not supported on this system).
func (b *UDPBatch) SendBatchRaw(fd, from, n int) (int, error) { return b.SendBatch(fd, from, n) }

// RecvBatchRaw is RecvBatch (not supported on this system).
func (b *UDPBatch) RecvBatchRaw(fd, n int) (int, error) { return b.RecvBatch(fd, n) }
