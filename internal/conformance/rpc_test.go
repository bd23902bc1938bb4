package conformance

import (
	"errors"
	"fmt"
	"testing"

	"github.com/rdmakit/rdmakit/verbs"
)

// Errors keep their identity across the peer process boundary.
func TestErrorCodesCrossProcesses(t *testing.T) {
	for _, want := range []error{verbs.ErrNotSupported, verbs.ErrInvalidArgument, verbs.ErrQueueFull, verbs.StatusRemoteAccess, verbs.StatusWRFlush} {
		err := fmt.Errorf("peer: %w", &verbs.PostError{Index: 2, Err: fmt.Errorf("%w: detail", want)})
		got := decodeErr(err.Error(), errCode(err))
		if !errors.Is(got, want) || got.Error() != err.Error() {
			t.Errorf("%v: decoded %q, errors.Is = %v", want, got, errors.Is(got, want))
		}
	}
	if got := decodeErr("plain", errCode(errors.New("plain"))); got.Error() != "plain" || errors.Is(got, verbs.ErrNotSupported) {
		t.Errorf("a plain error: %v", got)
	}
}
