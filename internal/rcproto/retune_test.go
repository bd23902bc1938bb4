package rcproto

import (
	"testing"
	"time"
)

// An RTS → RTS change of the timeout takes effect on the running timer:
// 0 (infinite) stops it, a finite one restarts it.
func TestRetune(t *testing.T) {
	r := NewRequester(Config{FirstPSN: 100, MaxWR: 8, Timeout: 10, RetryCount: 0, RNRRetry: 7, Reliable: true})
	r.Connected(0)
	r.Post(WR{Op: OpWrite, Len: 64}, 0)
	var p Packet
	for r.Next(&p) {
	}
	failed := func(acts []Action) bool {
		for _, a := range acts {
			if a.Kind == ActComplete && a.Status != 0 {
				return true
			}
		}
		return false
	}
	r.Retune(0, 0, 7, time.Millisecond)
	if failed(r.Tick(time.Hour)) || r.Failed() {
		t.Fatal("timed out with the infinite timeout")
	}
	r.Retune(10, 0, 7, time.Hour)
	if !failed(r.Tick(time.Hour + time.Second)) {
		t.Fatal("no timeout after a finite one was set again")
	}
}
