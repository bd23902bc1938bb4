package doctor

import (
	"fmt"
	"strconv"
	"strings"
)

// PeerPass is the fraction of the link rate below which the peer check
// warns.
const PeerPass = 0.7

func checkPeer(d *doc) {
	if d.o.PeerAddr == "" {
		return
	}
	if d.o.Peer == nil {
		d.add("peer", Skip, "peer "+d.o.PeerAddr, "this build cannot measure (no Peer function)", "")
		return
	}
	r, err := d.o.Peer(d.o.PeerAddr, d.o.PeerDev)
	if err != nil {
		d.add("peer", Fail, "peer "+d.o.PeerAddr, err.Error(),
			"run rdmakit doctor --serve-peer on that host (same --dev and --port), and let TCP ports PORT and PORT+1 (default 18515, 18516) and UDP 4791 through")
		return
	}
	subject := fmt.Sprintf("peer %s over %s: latency %.2f µs, bandwidth %s", d.o.PeerAddr, r.Device, r.LatencyUs, formatBits(r.BitsPerS))
	if r.LinkBits <= 0 {
		d.add("peer", Pass, subject, "link rate unknown for "+r.Device+": nothing to compare with", "")
		return
	}
	frac := r.BitsPerS / r.LinkBits
	detail := fmt.Sprintf("%.0f%% of the link rate %s", 100*frac, formatBits(r.LinkBits))
	if frac >= PeerPass {
		d.add("peer", Pass, subject, detail, "")
		return
	}
	d.add("peer", Warn, subject, detail+": below "+strconv.Itoa(int(100*PeerPass))+"%",
		"look at the MTU, ECN/PFC, CPU governor and NUMA results above on both hosts, the switch ports' counters, and rdmakit exporter's rdma_hw_* counters during a run")
}

// formatBits writes a rate in Gb/s or Mb/s.
func formatBits(b float64) string {
	if b >= 1e9 {
		return strings.TrimSuffix(fmt.Sprintf("%.1f", b/1e9), ".0") + " Gb/s"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.1f", b/1e6), ".0") + " Mb/s"
}
