// Package perftest is the machinery behind `rdmakit perf`: the eight tests
// of linux-rdma/perftest (ib_{send,write,read,atomic}_{bw,lat}) on any
// rdmakit device, with perftest's flags, defaults, definitions and output
// format, so that figures can be compared with perftest runs on real RNICs.
//
// A run is two processes, a server (no address given) and a client (the
// server's address given), like perftest:
//
//	server                                   client
//	listen on -p (18515)
//	                             ◄────────   HELLO  version, test, parameters, device
//	compare parameters, open the device
//	                             ────────►   ACCEPT device, transport, MTU   (or ERR reason)
//	                             ◄────────   QP line per queue pair (QPN, PSN, rkey, VA, address)
//	                             ────────►   QP line per queue pair
//	both: QPs → INIT → RTR → RTS; SYNC
//	for each message size:
//	                             ◄────────   SIZE n
//	post receives                ────────►   READY n
//	run (pong side)                          run (timed side)
//	                             ◄────────   RESULT figures   (both ways with -b)
//	                             ◄────────   DONE
//
// The exchange is a line format over one TCP connection (wire.go); its QP
// line carries perftest's Ethernet-exchange key string
// (LID:OUT_READS:QPN:PSN:RKEY:VADDR:SRQN) followed by the transport's QP
// address, so exact perftest wire compatibility can be added in one place
// (docs/perf.md says what it would take).
//
// The timed loops (bw.go, lat.go) run in the goroutine that calls Run: they
// post work requests and spin-poll completion queues (or, for write_lat, the
// receive buffer) with no goroutine handoff, no blocking wait and no
// allocation per operation. One goroutine per run reads the control
// connection (ctrl.go); the loops learn from an atomic flag that the peer
// hung up, and give up after a bounded time without progress, so a dead
// peer ends a run with an error instead of a hang. Loopback mode
// (loopback.go) re-executes the program as the server in a child process
// that is always reaped.
//
// Report definitions (report.go) are perftest's: MB/sec is 2^20 bytes per
// second, BW average is total bytes over the time from the first post to
// the last completion, BW peak the best rate over any window from a post to
// a later signaled completion, t_typical the median of per-iteration times
// with the two largest dropped, send/write latency half a round trip and
// read/atomic latency the whole operation.
package perftest
