package sys

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"syscall"
)

// ErrNotSupported is wrapped by the error of every call that has no
// implementation on the running operating system (memfd, hole punching,
// pidfd and /proc on anything but Linux; memory mappings and descriptor
// I/O on Windows). The message names the call and the system:
//
//	sys: memfd_create is not supported on darwin
//
// It also matches errors.ErrUnsupported.
var ErrNotSupported error = notSupportedError{}

type notSupportedError struct{ call string }

func (e notSupportedError) Error() string {
	if e.call == "" {
		return "sys: not supported on " + runtime.GOOS
	}
	return fmt.Sprintf("sys: %s is not supported on %s", e.call, runtime.GOOS)
}

func (e notSupportedError) Is(target error) bool {
	return target == ErrNotSupported || target == errors.ErrUnsupported
}

// notSupported returns the error of call on a system that lacks it.
func notSupported(call string) error { return notSupportedError{call} }

// ErrAgain is returned by Read and Writev when a non-blocking descriptor
// has nothing to read or cannot take any byte now.
var ErrAgain error = syscall.EAGAIN

// MaxIOV is the most buffers one Writev call takes.
const MaxIOV = 128

// PageSize is the system page size.
var PageSize = os.Getpagesize()

// Unlimited is the MemlockLimit of a process without a limit.
const Unlimited = math.MaxUint64
