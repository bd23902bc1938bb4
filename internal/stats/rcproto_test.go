package stats_test

import (
	"testing"

	"github.com/rdmakit/rdmakit/internal/rcproto"
	"github.com/rdmakit/rdmakit/internal/stats"
)

// The RC engine counts an RNR NAK and the go-back-N resend it causes.
func TestRequesterCountsRNR(t *testing.T) {
	c := stats.New("tcp", "tcp0")
	r := rcproto.NewRequester(rcproto.Config{FirstPSN: 100, MaxWR: 8, Timeout: 10, RetryCount: 3, RNRRetry: 7, Reliable: true, Stats: c})
	r.Connected(0)
	r.Post(rcproto.WR{Op: rcproto.OpWrite, Len: 64}, 0)
	var p rcproto.Packet
	for r.Next(&p) {
	}
	r.Step(&rcproto.Packet{Op: rcproto.OpNak, Syn: rcproto.SynRNR, PSN: 100, RNRTimer: 1}, 0)
	if s := c.Snapshot(); s.RNR != 1 || s.Retransmissions != 1 {
		t.Errorf("after an RNR NAK: %+v", s)
	}
}
