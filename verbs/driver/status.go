package driver

import (
	"errors"
	"fmt"

	"github.com/rdmakit/rdmakit/internal/rc"
)

// Status is a work completion status (values as in ibv_wc_status). A Status
// is an error, so errors.Is(err, verbs.StatusRemoteAccess) works on the
// error of a completion (WorkCompletion.Err).
type Status uint32

// Completion statuses.
const (
	StatusSuccess          Status = Status(rc.Success)
	StatusLocalLength      Status = Status(rc.LocalLength)
	StatusLocalQPOperation Status = Status(rc.LocalQPOperation)
	StatusLocalProtection  Status = Status(rc.LocalProtection)
	StatusWRFlush          Status = Status(rc.WRFlush)
	StatusBadResponse      Status = Status(rc.BadResponse)
	StatusLocalAccess      Status = Status(rc.LocalAccess)
	StatusRemoteInvalidReq Status = Status(rc.RemoteInvalidReq)
	StatusRemoteAccess     Status = Status(rc.RemoteAccess)
	StatusRemoteOperation  Status = Status(rc.RemoteOperation)
	StatusRetryExceeded    Status = Status(rc.RetryExceeded)
	StatusRNRRetryExceeded Status = Status(rc.RNRRetryExceeded)
	StatusRemoteAbort      Status = Status(rc.RemoteAbort)
	StatusFatal            Status = Status(rc.Fatal)
	StatusResponseTimeout  Status = Status(rc.ResponseTimeout)
	StatusGeneral          Status = Status(rc.General)
)

var statusNames = map[Status]string{
	StatusSuccess:          "success",
	StatusLocalLength:      "local length error",
	StatusLocalQPOperation: "local QP operation error",
	StatusLocalProtection:  "local protection error",
	StatusWRFlush:          "Work Request Flushed Error",
	StatusBadResponse:      "bad response error",
	StatusLocalAccess:      "local access error",
	StatusRemoteInvalidReq: "remote invalid request error",
	StatusRemoteAccess:     "remote access error",
	StatusRemoteOperation:  "remote operation error",
	StatusRetryExceeded:    "transport retry counter exceeded",
	StatusRNRRetryExceeded: "RNR retry counter exceeded",
	StatusRemoteAbort:      "remote aborted error",
	StatusFatal:            "fatal error",
	StatusResponseTimeout:  "response timeout error",
	StatusGeneral:          "general error",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", uint32(s))
}

func (s Status) Error() string { return "verbs: " + s.String() }

// WCError is the error of a failed work completion.
type WCError struct {
	Status Status
	WRID   uint64
	QPNum  uint32
	Opcode WCOpcode
}

func (e *WCError) Error() string {
	return fmt.Sprintf("verbs: %s on QP %#x (wr_id %d, %s)", e.Status.String(), e.QPNum, e.WRID, e.Opcode)
}

// Is matches the Status.
func (e *WCError) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// Unwrap returns the Status.
func (e *WCError) Unwrap() error { return e.Status }

// Errors returned by verbs calls (as opposed to completion statuses).
var (
	ErrNoDevice        = errors.New("verbs: no such device")
	ErrNotSupported    = errors.New("verbs: operation not supported by this device")
	ErrInvalidArgument = errors.New("verbs: invalid argument")
	ErrInvalidState    = errors.New("verbs: invalid queue pair state for this operation")
	ErrQueueFull       = errors.New("verbs: work queue full")
	ErrCQOverflow      = errors.New("verbs: completion queue overflow (completions were lost; size the CQ for all outstanding work requests)")
	ErrClosed          = errors.New("verbs: object closed")
	ErrBusy            = errors.New("verbs: object in use")
	ErrNoMemory        = errors.New("verbs: out of memory or resources")
)

// PostError reports which work request of a batch was refused. Work
// requests before Index were posted; Index and later were not.
type PostError struct {
	Index int
	Err   error
}

func (e *PostError) Error() string {
	return fmt.Sprintf("verbs: work request %d refused: %v", e.Index, e.Err)
}

func (e *PostError) Unwrap() error { return e.Err }

func postErr(i int, err error, format string, args ...any) error {
	return &PostError{Index: i, Err: fmt.Errorf("%w: "+format, append([]any{err}, args...)...)}
}
