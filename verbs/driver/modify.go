package driver

import "fmt"

// The queue pair state machine as pure functions: which transitions exist,
// which attributes each one takes and checks, and how they merge into the
// attributes a QP has. Devices that keep the state themselves (RNICs)
// still run CheckModify first, so every device refuses the same input with
// the same error.

// ValidTransition reports whether Modify may move a QP from from to to.
func ValidTransition(from, to QPState) bool {
	switch to {
	case QPReset, QPError:
		return from <= QPError
	case QPInit:
		return from == QPReset || from == QPInit
	case QPRTR:
		return from == QPInit
	case QPRTS:
		return from == QPRTR || from == QPRTS
	}
	return false
}

// CheckModify validates a transition from from to attr.State and the
// attributes that transition takes. Errors wrap ErrInvalidState or
// ErrInvalidArgument.
func CheckModify(from QPState, attr *QPAttr) error {
	to := attr.State
	if !ValidTransition(from, to) {
		return fmt.Errorf("%w: %s → %s", ErrInvalidState, from, to)
	}
	switch to {
	case QPInit:
		if attr.AccessFlags&^AccessAll != 0 {
			return fmt.Errorf("%w: access flags %#x", ErrInvalidArgument, uint32(attr.AccessFlags))
		}
	case QPRTR:
		if attr.PathMTU != 0 && attr.PathMTU.Bytes() == 0 {
			return fmt.Errorf("%w: path MTU %d", ErrInvalidArgument, attr.PathMTU)
		}
		if attr.MinRNRTimer > 31 {
			return fmt.Errorf("%w: min_rnr_timer %d (0..31)", ErrInvalidArgument, attr.MinRNRTimer)
		}
	case QPRTS:
		if attr.RetryCount > 7 || attr.RNRRetry > 7 || attr.Timeout > 31 {
			return fmt.Errorf("%w: retry_cnt %d, rnr_retry %d (0..7), timeout %d (0..31)", ErrInvalidArgument, attr.RetryCount, attr.RNRRetry, attr.Timeout)
		}
	}
	return nil
}

// MergeAttr returns the attributes a QP has after a transition from from
// to attr.State, given the ones it had (cur): each transition takes its
// own fields (see QPAttr), the rest are kept; RESET clears everything.
// The path MTU defaults to 4096; the send PSN is taken only on RTR → RTS.
func MergeAttr(cur QPAttr, from QPState, attr *QPAttr) QPAttr {
	next := cur
	switch attr.State {
	case QPInit:
		next.AccessFlags, next.Port = attr.AccessFlags, attr.Port
	case QPRTR:
		next.PathMTU, next.DestQPN, next.RQPSN, next.AH = attr.PathMTU, attr.DestQPN, attr.RQPSN, attr.AH
		next.MinRNRTimer, next.MaxDestRdAtomic = attr.MinRNRTimer, attr.MaxDestRdAtomic
		if next.PathMTU == 0 {
			next.PathMTU = MTU4096
		}
	case QPRTS:
		if from == QPRTR {
			next.SQPSN = attr.SQPSN
		}
		next.Timeout, next.RetryCount, next.RNRRetry, next.MaxRdAtomic = attr.Timeout, attr.RetryCount, attr.RNRRetry, attr.MaxRdAtomic
	case QPReset:
		next = QPAttr{}
	}
	next.State = attr.State
	return next
}

// Limits of rdmakit's software devices, and the defaults verbs applies.
const (
	MaxQPWR     = 16384
	MaxInline   = 1024
	MaxSGE      = 32
	MaxMsgSize  = 1 << 31
	DefaultQPWR = 128
)

// DefaultQPCap fills the zero fields of c with the defaults: 128 send and
// receive work requests, 4 SGEs each way, 64 bytes inline.
func DefaultQPCap(c QPCap) QPCap {
	if c.MaxSendWR == 0 {
		c.MaxSendWR = DefaultQPWR
	}
	if c.MaxRecvWR == 0 {
		c.MaxRecvWR = DefaultQPWR
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 4
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 4
	}
	if c.MaxInlineData == 0 {
		c.MaxInlineData = 64
	}
	return c
}
