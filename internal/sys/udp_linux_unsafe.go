//go:build linux

package sys

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

const ctlLen = 64

type batchOS struct {
	hdrs  [MaxBatch]unix.Mmsghdr
	iovs  [MaxBatch]unix.Iovec
	names [MaxBatch]unix.RawSockaddrInet6
	ctl   [MaxBatch][ctlLen]byte
	// vios holds the iovecs of messages sent from Vecs (grown, never
	// shrunk: no allocation once it fits a batch).
	vios [MaxBatch][]unix.Iovec
	// rxReady: the headers are set up for RecvBatch (SendBatch changes
	// them); a receive then only resets what the kernel wrote.
	rxReady bool
}

// HasUDPBatch reports whether SendBatch and RecvBatch work on this system.
const HasUDPBatch = true

func (b *UDPBatch) setName(i int, a netip.AddrPort) uint32 {
	p := (*[2]byte)(unsafe.Pointer(&b.names[i].Port))
	ip := a.Addr()
	if ip.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&b.names[i]))
		*sa = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ip.As4()}
		p = (*[2]byte)(unsafe.Pointer(&sa.Port))
		p[0], p[1] = byte(a.Port()>>8), byte(a.Port())
		return unix.SizeofSockaddrInet4
	}
	b.names[i] = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: ip.As16()}
	p[0], p[1] = byte(a.Port()>>8), byte(a.Port())
	return unix.SizeofSockaddrInet6
}

func (b *UDPBatch) name(i int) netip.AddrPort {
	sa := &b.names[i]
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		p := (*[2]byte)(unsafe.Pointer(&s4.Port))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), uint16(p[0])<<8|uint16(p[1]))
	case unix.AF_INET6:
		p := (*[2]byte)(unsafe.Pointer(&sa.Port))
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(p[0])<<8|uint16(p[1]))
	}
	return netip.AddrPort{}
}

// SendBatch sends Bufs[i] to Addrs[i] for i in [from, n) with one
// sendmmsg(2) and returns how many left. It retries on EINTR and returns
// ErrAgain when the socket cannot take one now.
func (b *UDPBatch) SendBatch(fd, from, n int) (int, error) { return b.sendBatch(fd, from, n, false) }

// SendBatchRaw is SendBatch without telling the Go scheduler that a
// system call is in progress, for sockets that never block (opened
// non-blocking; the call passes MSG_DONTWAIT as well). On the loopback
// interface a sendmmsg of a batch delivers its datagrams within the call,
// tens of microseconds: made as an ordinary system call, the runtime's
// sysmon takes the processor (P) from such a call and wakes another
// thread to look for work, which finds none and sleeps again, and the
// caller, back from the kernel without a P, sleeps until one is free:
// several thread switches per batch on a busy 2-core host. Raw, the P
// stays with the caller as it does for any goroutine computing for that
// long. Not when a message gathers caller memory (IsCallerMemory: it may
// be a file mapping, whose pages the call would read from disk first):
// then the call is an ordinary one, MSG_DONTWAIT still.
func (b *UDPBatch) SendBatchRaw(fd, from, n int) (int, error) { return b.sendBatch(fd, from, n, true) }

func (b *UDPBatch) sendBatch(fd, from, n int, raw bool) (int, error) {
	if from >= n {
		return 0, nil
	}
	b.rxReady = false
	askedRaw := raw
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
				raw = raw && rawOK(s)
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
		var r uintptr
		var e unix.Errno
		if raw {
			r, _, e = unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[from])), uintptr(n-from), unix.MSG_DONTWAIT, 0, 0)
		} else {
			flags := uintptr(0)
			if askedRaw {
				flags = unix.MSG_DONTWAIT // caller memory: not raw, yet never waiting
			}
			r, _, e = unix.Syscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[from])), uintptr(n-from), flags, 0, 0)
		}
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

// header resets message i's header to Bufs[i] as its one buffer and
// names[i] as its address (the caller sets the address length).
func (b *UDPBatch) header(i int) *unix.Msghdr {
	h := &b.hdrs[i].Hdr
	*h = unix.Msghdr{}
	b.iovs[i].Base = unsafe.SliceData(b.Bufs[i])
	b.iovs[i].SetLen(len(b.Bufs[i]))
	h.Iov = &b.iovs[i]
	h.Iovlen = 1
	h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	return h
}

// RecvBatch receives up to n datagrams into Bufs[:n] with one
// recvmmsg(2), without waiting, and sets their Lens, Addrs and TOS. It
// returns ErrAgain when nothing is there.
func (b *UDPBatch) RecvBatch(fd, n int) (int, error) { return b.recvBatch(fd, n, false) }

// RecvBatchRaw is RecvBatch without telling the Go scheduler that a
// system call is in progress (see SendBatchRaw; a receive never waits).
func (b *UDPBatch) RecvBatchRaw(fd, n int) (int, error) { return b.recvBatch(fd, n, true) }

func (b *UDPBatch) recvBatch(fd, n int, raw bool) (int, error) {
	if !b.rxReady {
		for i := range b.hdrs {
			h := b.header(i)
			h.Control = &b.ctl[i][0]
		}
		b.rxReady = true
	}
	for i := 0; i < n; i++ {
		// The kernel writes the lengths of name and control data; the
		// pointers stay, and the buffer's only where Bufs[i] changed.
		h := &b.hdrs[i].Hdr
		if b.iovs[i].Base != unsafe.SliceData(b.Bufs[i]) || uint64(b.iovs[i].Len) != uint64(len(b.Bufs[i])) {
			b.header(i)
			h.Control = &b.ctl[i][0]
		}
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(ctlLen)
	}
	for {
		var r uintptr
		var e unix.Errno
		if raw {
			r, _, e = unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		} else {
			r, _, e = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(n), unix.MSG_DONTWAIT, 0, 0)
		}
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

// cmsgs reads the control messages of datagram i: its traffic class
// (IP_TOS / IPV6_TCLASS) and, for datagrams the kernel coalesced
// (UDP_GRO), their segment size.
func (b *UDPBatch) cmsgs(i int) (tos uint8, seg uint16) {
	h := &b.hdrs[i].Hdr
	c := b.ctl[i][:min(int(h.Controllen), ctlLen)]
	for len(c) >= unix.SizeofCmsghdr {
		m := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		l := int(m.Len)
		if l < unix.SizeofCmsghdr || l > len(c) {
			return
		}
		data := c[unix.SizeofCmsghdr:l]
		switch {
		case m.Level == unix.IPPROTO_IP && m.Type == unix.IP_TOS && len(data) >= 1:
			tos = data[0]
		case m.Level == unix.IPPROTO_IPV6 && m.Type == unix.IPV6_TCLASS && len(data) >= 4:
			tos = uint8(*(*int32)(unsafe.Pointer(&data[0])))
		case m.Level == unix.SOL_UDP && m.Type == unix.UDP_GRO && len(data) >= 2:
			if len(data) >= 4 {
				seg = uint16(*(*int32)(unsafe.Pointer(&data[0])))
			} else {
				seg = *(*uint16)(unsafe.Pointer(&data[0]))
			}
		}
		adv := (l + unix.SizeofPtr - 1) &^ (unix.SizeofPtr - 1)
		if adv > len(c) {
			return
		}
		c = c[adv:]
	}
	return
}

// SetUDPOptions prepares a UDP socket for RoCEv2: DF set on every
// datagram, IPv6 datagrams with a zero UDP checksum accepted (so the IPv4 identification is 0 and datagrams never
// fragment), the traffic class tos on every datagram (ECN bits included),
// the traffic class of arriving datagrams reported (RecvBatch's TOS),
// with gro the kernel's receive coalescing, and buffers of bufSize bytes
// each way (as far as the system allows).
func SetUDPOptions(fd int, v6 bool, tos uint8, bufSize int, gro bool) error {
	set := func(level, opt, v int) error { return unix.SetsockoptInt(fd, level, opt, v) }
	var err error
	if v6 {
		err = firstErr(set(unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO),
			set(unix.IPPROTO_IPV6, unix.IPV6_TCLASS, int(tos)),
			set(unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1),
			// RoCEv2 senders (the kernel's rxe) may send a zero UDP
			// checksum: the ICRC protects the datagram.
			set(unix.SOL_UDP, unix.UDP_NO_CHECK6_RX, 1))
	} else {
		err = firstErr(set(unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO),
			set(unix.IPPROTO_IP, unix.IP_TOS, int(tos)),
			set(unix.IPPROTO_IP, unix.IP_RECVTOS, 1))
	}
	if err != nil {
		return err
	}
	if gro {
		// Best effort (Linux 5.0+): the kernel hands over runs of
		// datagrams as one buffer with their segment size (RecvBatch's
		// Seg); buffers must then hold MaxGSOBytes.
		set(unix.SOL_UDP, unix.UDP_GRO, 1)
	}
	if bufSize > 0 {
		// Best effort: the kernel caps these at net.core.[rw]mem_max
		// unless the process may exceed them (CAP_NET_ADMIN).
		if set(unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bufSize) != nil {
			set(unix.SOL_SOCKET, unix.SO_RCVBUF, bufSize)
		}
		if set(unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, bufSize) != nil {
			set(unix.SOL_SOCKET, unix.SO_SNDBUF, bufSize)
		}
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
