// Package roce is rdmakit's RoCEv2 transport: reliable-connected queue
// pairs whose packets are RoCEv2 (InfiniBand transport headers in UDP
// datagrams to port 4791), sent and received on an ordinary UDP socket,
// so that a Go program with no RDMA NIC, no RDMA kernel modules and no
// privileges speaks to the Linux kernel's Soft-RoCE (rxe), to RoCE NICs
// and to other rdmakit processes. Import it for its side effect:
//
//	import _ "github.com/rdmakit/rdmakit/transport/roce"
//
// It registers transport "roce" with a device roceN per IP interface that
// is up and has an address (RDMAKIT_ROCE_IFACES="eth0,lo" chooses), whose
// GID table holds the interface's addresses (IPv4 as IPv4-mapped, RoCEv2)
// and whose MTU is the largest InfiniBand MTU (256..4096) the interface's
// MTU carries.
//
// A context binds a UDP socket to one address of its device:
// RDMAKIT_ROCE_ADDR ("ip", "ip:port", or ":port" for the device's own
// address) if set, else the device's first IPv4 (or global IPv6) address,
// port 4791. The ICRC covers the IP addresses, so a wildcard address is
// refused. Contexts bound to the same address and port share the socket.
// Only one program can bind 4791 on an address: two rdmakit processes on
// one host use two addresses (127.0.0.1 and 127.0.0.2 on the loopback
// interface) or network namespaces, or rdmakit-only ports (the port
// travels in QP.Address; RDMAKIT_ROCE_ADDR=:0 lets the system choose one
// per context); with the kernel's rxe on the same interface, bind another
// address or put rdmakit in its own namespace. Only the peer's port 4791
// reaches an rxe or RoCE NIC peer.
//
// # Connecting
//
// QP.Address is 24 bytes (version, UDP port, QP number, IP). For an
// rdmakit peer, AddressHandle.Dest is that address; for any other RoCEv2
// peer, leave Dest empty and set AddressHandle.GID to its GID (IPv4
// mapped or IPv6) and DestQPN, RQPSN and SQPSN as exchanged out of band:
// packets go to the GID's address, port 4791. PathMTU must match on both
// sides (rxe on a 1500-byte Ethernet uses 1024).
//
// # Protocol
//
// internal/rcproto's RC engine runs the protocol in its datagram setting:
// segmentation at the path MTU, PSNs, coalesced ACKs, NAK sequence error
// with go-back-N, the local ACK timeout with retry_cnt, RNR NAK with the
// IBTA timer table and rnr_retry, duplicate detection, READs re-executed
// and atomics replayed from the saved result, max_rd_atomic. At most
// 1024 request packets are outstanding per QP. Packets are built and
// parsed by transport/roce/header; every packet's ICRC is checked (and
// counted when wrong, see Stats). Datagrams are sent with DF set and ECT(0)
// marked; a request that arrives CE-marked is answered with a congestion
// notification packet (CNP), and the sender runs DCQCN rate control.
//
// Each QP sends its requests from a socket of its own (a UDP source port
// per QP, so that ECMP spreads QPs); everything arrives on the context's
// socket.
//
// One progress goroutine per socket receives. While datagrams flow it
// busy-polls the socket (non-blocking receives, a sched_yield between
// them) for up to RDMAKIT_ROCE_BUSY_POLL (a duration, default 50µs; "0"
// turns it off) after the last one before it sleeps: fewer thread
// wake-ups per window, for up to that much of a core after each burst.
//
// # RDMA CM
//
// ListenCM and DialCM connect RC QPs through the RDMA CM's wire exchange
// (REQ, REP, RTU; DREQ, DREP; REJ and MRA), whose MADs travel in UD
// packets to and from QP 1 on the device socket, so that rdma_cm peers
// (rping, perftest -R, against rxe or a RoCE NIC) connect to rdmakit and
// rdmakit to them; package cm's TCP handshake remains the way between
// rdmakit programs that share a credential.
//
// Not served: SEND with invalidate, UD queue pairs for applications (QP 1
// carries only the CM), alternate paths.
//
// # Goroutines and performance
//
// One progress goroutine per socket receives in batches (recvmmsg, with
// UDP GRO), runs the responders and steps the requesters, and answers in
// batches (sendmmsg). A goroutine that polls a CQ of the context and
// finds it empty does the same work itself, when the progress goroutine
// is not at it (CQ.Poll, through internal/soft's Progresser): an
// application that spins on its CQ receives its ACKs and the peer's
// writes on its own thread, with no goroutine to wake. Requests are sent
// by the goroutine that makes them possible (PostSend's caller, a QP's
// timer, a poller after an ACK; the sender goroutine when the progress
// goroutine received the ACK). Runs of equal-sized datagrams to an
// rdmakit peer go as one UDP GSO message. Packet buffers are allocated
// once per socket and per QP; nothing allocates per packet.
package roce
