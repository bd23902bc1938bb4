package ibverbs

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/rdmakit/rdmakit/internal/sys"
	"github.com/rdmakit/rdmakit/verbs"
)

// Errors of this transport, besides the verbs ones they wrap.
var (
	// ErrMemlock means the kernel refused to pin memory for a registration.
	ErrMemlock = errors.New("ibverbs: cannot pin memory for registration")
	// ErrNoCM means the connection manager could not reach the peer.
	ErrNoCM = errors.New("ibverbs: rdma_cm connection failed")
)

// memlockLimit describes RLIMIT_MEMLOCK for error messages.
func memlockLimit() string {
	v, err := sys.MemlockLimit()
	switch {
	case err != nil:
		return "unknown"
	case v == sys.Unlimited:
		return "unlimited"
	}
	return fmt.Sprintf("%d KiB", v/1024)
}

// regError explains a failed ibv_reg_mr: ENOMEM and EPERM from pinning
// mean the locked-memory limit is too low.
func regError(n int, err error) error {
	var e syscall.Errno
	if errors.As(err, &e) && (e == syscall.ENOMEM || e == syscall.EPERM || e == syscall.EAGAIN) {
		return fmt.Errorf("%w: ibv_reg_mr of %d bytes: %v; the locked-memory limit is %s: raise it with `ulimit -l unlimited` "+
			"(systemd: LimitMEMLOCK=infinity; docker: --ulimit memlock=-1; /etc/security/limits.conf: * - memlock unlimited): %w",
			ErrMemlock, n, err, memlockLimit(), verbs.ErrNoMemory)
	}
	return fmt.Errorf("ibv_reg_mr of %d bytes: %v: %w", n, err, mapErrno(err))
}

// mapErrno maps an errno from a verbs call to the closest verbs error.
func mapErrno(err error) error {
	var e syscall.Errno
	if !errors.As(err, &e) {
		return err
	}
	switch e {
	case syscall.EINVAL:
		return verbs.ErrInvalidArgument
	case syscall.ENOMEM, syscall.ENOSPC:
		return verbs.ErrNoMemory
	case syscall.EOPNOTSUPP, syscall.ENOSYS, syscall.EPROTONOSUPPORT:
		return verbs.ErrNotSupported
	case syscall.EBUSY:
		return verbs.ErrBusy
	case syscall.ENODEV, syscall.ENXIO:
		return verbs.ErrNoDevice
	}
	return err
}

// wrap describes a failed verb: "ibv_create_qp: Invalid argument: verbs:
// invalid argument".
func wrap(verb string, err error) error {
	m := mapErrno(err)
	if m == err {
		return fmt.Errorf("ibverbs: %s: %w", verb, err)
	}
	return fmt.Errorf("ibverbs: %s: %v: %w", verb, err, m)
}

// NoDeviceHint says what to do when no libibverbs device exists.
const NoDeviceHint = "no RDMA device: check `ibv_devices` or `rdma link`; without an RNIC create a software one, " +
	"e.g. `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0` (Soft-RoCE) or " +
	"`modprobe siw && rdma link add siw0 type siw netdev eth0` (soft-iWARP)"
