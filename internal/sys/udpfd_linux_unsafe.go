//go:build linux

package sys

import (
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A UDP socket outside Go's network poller: a descriptor of the caller's
// own, non-blocking (closed with Close), that the runtime never waits on, so that datagrams
// arriving while nobody wants them wake no thread. The caller waits for
// it (WaitFD) on a goroutine of its own: that goroutine's thread blocks
// in the kernel (the runtime hands its P to another thread meanwhile).

// ListenUDPFD opens a non-blocking UDP socket bound to bind (an IPv6
// socket for an IPv6 address, IPv6 only) and returns it with the address
// it is bound to (the port chosen when bind's is 0).
func ListenUDPFD(bind netip.AddrPort) (int, netip.AddrPort, error) {
	ip := bind.Addr()
	family := unix.AF_INET
	if ip.Is6() && !ip.Is4In6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	var sa unix.Sockaddr
	if family == unix.AF_INET {
		sa = &unix.SockaddrInet4{Port: int(bind.Port()), Addr: ip.Unmap().As4()}
	} else {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			unix.Close(fd)
			return -1, netip.AddrPort{}, err
		}
		zone := uint32(0)
		if z := ip.Zone(); z != "" {
			if ifi, err := ifIndex(z); err == nil {
				zone = ifi
			}
		}
		sa = &unix.SockaddrInet6{Port: int(bind.Port()), Addr: ip.As16(), ZoneId: zone}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, err
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, err
	}
	var local netip.AddrPort
	switch a := got.(type) {
	case *unix.SockaddrInet4:
		local = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		local = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return fd, local, nil
}

func ifIndex(name string) (uint32, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		return 0, err
	}
	return ifr.Uint32(), nil
}

// NewEvent returns a non-blocking event descriptor (eventfd(2)) for
// WaitFD's wake-ups.
func NewEvent() (int, error) {
	return unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
}

// Signal makes the event descriptor efd readable (WaitFD returns woken)
// until Drain.
func Signal(efd int) {
	one := uint64(1)
	for {
		_, _, e := unix.Syscall(unix.SYS_WRITE, uintptr(efd), uintptr(unsafe.Pointer(&one)), 8)
		if e != unix.EINTR {
			return
		}
	}
}

// Drain makes efd unreadable again; it reports whether it was signalled.
func Drain(efd int) bool {
	// Raw system calls: the wrappers make the buffer escape (race
	// builds), and this runs on the data path.
	var v uint64
	for {
		n, _, e := unix.Syscall(unix.SYS_READ, uintptr(efd), uintptr(unsafe.Pointer(&v)), 8)
		if e != unix.EINTR {
			return e == 0 && n == 8
		}
	}
}

// WaitFD blocks until fd can be read (out false) or written (out true),
// efd is signalled, or timeout passes (negative: no limit), and reports
// which of the first two happened. fd < 0 waits for efd alone; efd < 0
// for fd alone. Interrupted waits return early with neither set.
func WaitFD(fd, efd int, out bool, timeout time.Duration) (ready, woken bool) {
	ev := int16(unix.POLLIN)
	if out {
		ev = unix.POLLOUT
	}
	fds := [2]unix.PollFd{{Fd: int32(fd), Events: ev}, {Fd: int32(efd), Events: unix.POLLIN}}
	var ts *unix.Timespec
	var t unix.Timespec
	if timeout >= 0 {
		t = unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	n, err := unix.Ppoll(fds[:], ts, nil)
	if err != nil || n <= 0 {
		return false, false
	}
	return fds[0].Revents != 0, fds[1].Revents != 0
}

// SendToFD sends b as one datagram to to without waiting; it returns
// ErrAgain when the socket cannot take it now.
func SendToFD(fd int, b []byte, to netip.AddrPort) error {
	var sa unix.Sockaddr
	if ip := to.Addr(); ip.Is4() {
		sa = &unix.SockaddrInet4{Port: int(to.Port()), Addr: ip.As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(to.Port()), Addr: ip.As16()}
	}
	for {
		err := unix.Sendto(fd, b, unix.MSG_DONTWAIT, sa)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return ErrAgain
		}
		return err
	}
}
