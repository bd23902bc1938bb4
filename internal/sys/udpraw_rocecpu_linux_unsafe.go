//go:build linux

package sys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// SendBatchRaw is SendBatch without telling the Go scheduler that a
// system call is in progress, for sockets that never block (opened
// non-blocking). On the loopback interface a sendmmsg of a batch delivers
// its datagrams within the call, tens of microseconds: made as an
// ordinary system call, the runtime's sysmon takes the processor (P)
// from such a call and wakes another thread to look for work, which finds
// none and sleeps again, and the caller, back from the kernel without a
// P, sleeps until one is free: several thread switches per batch on a
// busy 2-core host. Raw, the P stays with the caller as it does for any
// goroutine computing for that long.
func (b *UDPBatch) SendBatchRaw(fd, from, n int) (int, error) {
	if from >= n {
		return 0, nil
	}
	b.rxReady = false
	for i := from; i < n; i++ {
		h := b.header(i)
		h.Namelen = b.setName(i, b.Addrs[i])
		if v := b.Vecs[i]; len(v) > 0 {
			if len(v) > MaxVecs {
				return 0, unix.EMSGSIZE
			}
			if cap(b.vios[i]) < len(v) {
				b.vios[i] = make([]unix.Iovec, len(v), max(len(v), 64))
			}
			io := b.vios[i][:len(v)]
			for k, s := range v {
				io[k].Base = unsafe.SliceData(s)
				io[k].SetLen(len(s))
			}
			h.Iov = &io[0]
			h.SetIovlen(len(io))
		}
		if b.Seg[i] != 0 {
			c := b.ctl[i][:unix.CmsgSpace(2)]
			clear(c)
			m := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
			m.Level, m.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			m.SetLen(unix.CmsgLen(2))
			*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = b.Seg[i]
			h.Control = &c[0]
			h.SetControllen(len(c))
		}
	}
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[from])), uintptr(n-from), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, ErrAgain
		case unix.EIO, unix.EINVAL:
			if b.Seg[from] != 0 {
				return 0, ErrGSO
			}
		}
		return 0, e
	}
}

// RecvBatchRaw is RecvBatch without telling the Go scheduler that a
// system call is in progress (see SendBatchRaw; a receive never waits).
func (b *UDPBatch) RecvBatchRaw(fd, n int) (int, error) {
	if !b.rxReady {
		for i := range b.hdrs {
			h := b.header(i)
			h.Control = &b.ctl[i][0]
		}
		b.rxReady = true
	}
	for i := 0; i < n; i++ {
		h := &b.hdrs[i].Hdr
		if b.iovs[i].Base != unsafe.SliceData(b.Bufs[i]) || uint64(b.iovs[i].Len) != uint64(len(b.Bufs[i])) {
			b.header(i)
			h.Control = &b.ctl[i][0]
		}
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(ctlLen)
	}
	for {
		r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, ErrAgain
		default:
			return 0, e
		}
		got := int(r)
		for i := 0; i < got; i++ {
			b.Lens[i] = int(b.hdrs[i].Len)
			b.Addrs[i] = b.name(i)
			b.TOS[i], b.Seg[i] = b.cmsgs(i)
		}
		return got, nil
	}
}
