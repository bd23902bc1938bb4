package perftest

// Running against perftest's own binaries (ib_write_bw ... ib_atomic_lat):
// perftest 4.5's sequence of exchanges over the plain TCP connection, for
// the eight tests, RC, one direction, iterations, one size or -a. Which
// side the peer is comes from the first exchange (greet): both sides open
// with perftest's 16-byte version message; rdmakit's carries a marker
// after the NUL that perftest ignores, so an rdmakit peer continues with
// rdmakit's exchange and a perftest peer with perftest's. Everything runs
// in the caller's goroutine, except a goroutine that closes the
// connection (or listener) when ctx ends.
//
//	both        version, cycle buffer, cache line size, MTU
//	write_bw    keys (per QP), connect, keys (per QP), handshake;
//	read_bw     client: each size: (warm-up), run; then handshake, bw
//	atomic_bw   report, close; server: handshake (when the client is
//	            done), bw report (its size must be ours), close
//	send_bw     keys, connect, handshake, keys; each size: receives
//	            posted, handshake, run, (with -a: handshake); close
//	write_lat   handshake, keys, connect, keys, handshake; each size: run
//	            (no closing exchange)
//	send_lat    keys, connect, handshake, keys; each size: receives
//	            posted, handshake, run; close
//	read_lat    handshake, keys, connect, keys, handshake; client: each
//	atomic_lat  size: run; close; server: close (when the client is done)
//	close       handshake, then "done\0" (read best effort)
//
// A handshake is one exchange of QP 0's key message.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// pwConn is the exchange connection.
type pwConn struct {
	conn   net.Conn
	client bool
	peer   string
}

// xchg sends mine and reads n bytes (the client writes first). timeout 0
// waits as long as the connection lives.
func (p *pwConn) xchg(mine []byte, n int, timeout time.Duration) ([]byte, error) {
	write := func() error {
		p.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := p.conn.Write(mine); err != nil {
			return fmt.Errorf("sending to the %s: %w", p.peer, err)
		}
		return nil
	}
	got := make([]byte, n)
	read := func() error {
		var dl time.Time
		if timeout > 0 {
			dl = time.Now().Add(timeout)
		}
		p.conn.SetReadDeadline(dl)
		if _, err := io.ReadFull(p.conn, got); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return fmt.Errorf("the %s (perftest) %w (it prints why)", p.peer, errPeerGone)
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("the %s did not answer within %v", p.peer, timeout)
			}
			return fmt.Errorf("reading from the %s: %w", p.peer, err)
		}
		return nil
	}
	steps := []func() error{write, read}
	if !p.client {
		steps = []func() error{read, write}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return nil, err
		}
	}
	return got, nil
}

// pwSession is one perftest-wire run, either side.
type pwSession struct {
	*session
	p    *pwConn
	mine []pwKey
	rem  []pwKey
	// link is the -R or -z exchange (rcm.go), nil on TCP.
	link rcmLink
}

// keys exchanges every QP's key message.
func (s *pwSession) keys() error {
	for i := range s.mine {
		if err := s.handshake(i); err != nil {
			return err
		}
	}
	return nil
}

// handshake is ctx_hand_shake on QP i: the first exchange of a QP records
// the peer's key, later ones must repeat it.
func (s *pwSession) handshake(i int) error {
	return s.handshakeT(i, stepTimeout)
}

func (s *pwSession) handshakeT(i int, timeout time.Duration) error {
	mine, n, parse := s.mine[i].encode(), pwKeyLen, parsePWKey
	if s.link != nil {
		mine, n, parse = s.mine[i].encodeBin(), pwKeyBinLen, parsePWKeyBin
	}
	b, err := s.p.xchg(mine, n, timeout)
	if err != nil {
		return err
	}
	k, err := parse(b)
	if err != nil {
		return fmt.Errorf("%s: %w", s.p.peer, err)
	}
	switch {
	case i == len(s.rem):
		s.rem = append(s.rem, k)
	case i > len(s.rem) || k != s.rem[i]:
		return fmt.Errorf("%s: QP %d's keys changed between handshakes (%w)", s.p.peer, i, errMalformed)
	}
	return nil
}

// pwGreeting is this side's opening message: perftest's version message
// with rdmakit's marker after its NUL.
func pwGreeting() []byte {
	b := encodePWVersion(pwVersion)
	copy(b[len(pwVersion)+1:], pwMarker)
	return b
}

// pwFromRdmakit reports whether an opening message carries the marker.
func pwFromRdmakit(b []byte) bool {
	i := bytes.IndexByte(b, 0)
	return i >= 0 && bytes.HasPrefix(b[i+1:], []byte(pwMarker))
}

// greet is the first exchange (perftest's exchange_versions): the client
// writes first. It reports whether the peer is perftest; an opening that
// is neither perftest's nor rdmakit's is an error.
func greet(conn net.Conn, client bool, peer string) (perftest bool, err error) {
	p := &pwConn{conn: conn, client: client, peer: peer}
	b, err := p.xchg(pwGreeting(), pwVersionLen, stepTimeout)
	if err != nil {
		return false, err
	}
	if pwFromRdmakit(b) {
		return false, nil
	}
	if v, f := parsePWVersion(b); f < pwMinVersion {
		if bytes.HasPrefix(b, []byte(kindHello)) {
			return false, fmt.Errorf("the %s is an older rdmakit: use the same rdmakit on both sides", peer)
		}
		return false, fmt.Errorf("the %s speaks neither rdmakit's exchange nor perftest's (perftest announces a version of %.2f or later; got %q) (%w)", peer, pwMinVersion, v, errMalformed)
	}
	return true, nil
}

// checkPWire rejects what runs against perftest do not do.
func checkPWire(o Options) error {
	switch {
	case o.Bidir:
		return usageErr("the peer is perftest: -b (bidirectional) runs only between rdmakit peers")
	case o.Infinite:
		return usageErr("the peer is perftest: --run_infinitely runs only between rdmakit peers")
	case o.Duration > 0:
		return usageErr("the peer is perftest: -D (duration) runs only between rdmakit peers; give -n")
	}
	return nil
}

// pwTransports are the transports whose QPs perftest can reach, in the
// order pwDevice prefers them.
var pwTransports = []string{"ibverbs", "roce"}

// pwDevice is -d, or the first device of the ibverbs transport, else of
// the roce transport.
func pwDevice(name string) (verbs.DeviceInfo, error) {
	if name != "" {
		d, err := findDevice(name)
		if err != nil {
			return d, err
		}
		if !slices.Contains(pwTransports, d.Transport) {
			return d, fmt.Errorf("the peer is perftest: it needs a device of the ibverbs or roce transport, not %s (%s)", d.Name, d.Transport)
		}
		return d, nil
	}
	devs, _ := verbs.Devices()
	for _, t := range pwTransports {
		for _, d := range devs {
			if d.Transport == t {
				return d, nil
			}
		}
	}
	return verbs.DeviceInfo{}, errors.New("the peer is perftest: it needs a device of the ibverbs or roce transport and none is available (build with -tags ibverbs, or give -d roceN)")
}

// runPWire runs one side against perftest on conn, after greet.
func runPWire(ctx context.Context, o Options, env Env, conn net.Conn, server bool) (err error) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := checkPWire(o); err != nil {
		return err
	}
	dev, err := pwDevice(o.Device)
	if err != nil {
		return err
	}
	c, err := o.resolve(dev)
	if err != nil {
		return err
	}
	p := &pwConn{conn: conn, client: !server, peer: "server"}
	if server {
		p.peer = "client"
	}
	// check_sys_data: both use the larger cycle buffer and cache line.
	b, err := p.xchg(encodePWInt(pwCycleBuffer), 4, stepTimeout)
	if err != nil {
		return err
	}
	cycle := max(int64(parsePWInt(b)), pwCycleBuffer)
	if cycle > 1<<30 {
		return fmt.Errorf("the %s announces a cycle buffer of %d bytes (%w)", p.peer, cycle, errMalformed)
	}
	if _, err := p.xchg(encodePWInt(pwCacheLine), 4, stepTimeout); err != nil {
		return err
	}
	// check_mtu: both use the smaller MTU.
	if b, err = p.xchg(encodePWMTU(int(c.mtu)), pwMTULen, stepTimeout); err != nil {
		return err
	}
	if m := verbs.MTU(parsePWMTU(b)); m != 0 && m < c.mtu {
		c.mtu = m
	}
	// perftest walks its Writes, Reads and atomics through a cycle buffer
	// of the peer's memory: the halves are at least that long.
	c.minHalf = cycle

	s := &pwSession{session: &session{cfg: c, env: env, server: server}, p: p}
	s.link, _ = conn.(rcmLink)
	s.w = newWatch(ctx, nil)
	s.w.tune(dev)
	if c.Test.Kind == KindBW && c.noPeak && !server {
		io.WriteString(env.Stdout, noPeakWarn)
	}
	s.e, err = openEndpoint(c, dev)
	if err != nil {
		return err
	}
	defer s.e.close()
	s.e.flat = true
	for i := range s.e.qps {
		q := s.e.local(i)
		gid, lid, ok := pwAddrGID(q.addr)
		if !ok {
			return fmt.Errorf("device %s gives no GID for its QPs; perftest peers need the ibverbs or roce transport", dev.Name)
		}
		if q.outReads == 0 {
			q.outReads = 1 // perftest's for Write and Send
		}
		s.mine = append(s.mine, pwKey{lid: lid, outReads: q.outReads, qpn: q.qpn, psn: q.psn, rkey: q.rkey,
			vaddr: q.vaddr + uint64(s.e.half), gid: gid})
	}
	c.exCM, c.cmQPs = s.link != nil, s.link != nil && s.link.cmQPs()
	printHeader(env.Stdout, c, dev, server)
	if err := s.run(); err != nil {
		return s.explainPW(err)
	}
	return s.finish(dev)
}

// connect moves the QPs to RTS with the peer's keys (ctx_connect); with
// -R rdma_cm has done that, and the keys only say where to write.
func (s *pwSession) connect() error {
	remote := make([]qpInfo, len(s.rem))
	for i, k := range s.rem {
		remote[i] = qpInfo{lid: k.lid, outReads: k.outReads, qpn: k.qpn, psn: k.psn, rkey: k.rkey,
			vaddr: k.vaddr, srqn: k.srqn, idx: i, addr: append([]byte(nil), k.gid[:]...)}
	}
	if s.link != nil && s.link.cmQPs() {
		if len(remote) != len(s.e.qps) {
			return fmt.Errorf("the %s sent %d QPs' keys, want %d", s.p.peer, len(remote), len(s.e.qps))
		}
		s.e.remote = remote
		return nil
	}
	return s.e.connect(remote, nil)
}

// rcmPre is, with -R, perftest's create_rdma_cm_connection, which comes
// before the first exchange of keys or handshake: a handshake, the test
// QPs' rdma_cm connections, a handshake (the keys in these two are not
// filled in yet and are ignored).
func (s *pwSession) rcmPre() error {
	if s.link == nil || !s.link.cmQPs() {
		return nil
	}
	if s.server {
		if err := s.link.dataListen(s.e.ctx); err != nil {
			return err
		}
	}
	blank := make([]byte, pwKeyBinLen)
	if _, err := s.p.xchg(blank, pwKeyBinLen, stepTimeout); err != nil {
		return err
	}
	for _, qp := range s.e.qps {
		if err := s.link.connectQP(s.w.ctx, qp); err != nil {
			return err
		}
	}
	_, err := s.p.xchg(blank, pwKeyBinLen, stepTimeout)
	return err
}

// run is the test's sequence (see the top of the file).
func (s *pwSession) run() error {
	c := s.cfg
	t := c.Test
	hs := func() error { return s.handshake(0) }
	if err := s.rcmPre(); err != nil {
		return err
	}
	steps := func(fs ...func() error) error {
		for _, f := range fs {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
	switch {
	case t.Kind == KindBW && t.Verb == VerbSend:
		if err := steps(s.keys, s.connect, hs, s.keys); err != nil {
			return err
		}
		s.printKeys()
		for _, size := range c.sizes {
			r, err := s.prepare(size)
			if err != nil {
				return err
			}
			if err := hs(); err != nil {
				return err
			}
			res, err := s.sendBW(r, size)
			if err != nil {
				return err
			}
			s.printResult(res, nil)
			if c.All {
				if err := hs(); err != nil {
					return err
				}
			}
		}
		return s.close()
	case t.Kind == KindBW:
		if err := steps(s.keys, s.connect, s.keys, hs); err != nil {
			return err
		}
		s.printKeys()
		if s.server {
			// The client runs; its closing handshake comes when it is done.
			if err := s.handshakeT(0, 0); err != nil {
				return err
			}
			peer, err := s.xchgReport(result{})
			if err != nil {
				return err
			}
			if want := c.maxSize; int64(peer.size) != want {
				return fmt.Errorf("the client (perftest) ran %d-byte messages, this server %d: give both sides the same -s (and both or neither -a)", peer.size, want)
			}
			s.printResult(result{kind: KindBW, size: int64(peer.size), iters: int64(peer.iters), peak: peer.peak, bwAvg: peer.avg, rate: peer.msgRateAvg}, nil)
			return s.close()
		}
		var last result
		for _, size := range c.sizes {
			r, err := s.prepare(size)
			if err != nil {
				return err
			}
			if last, _, err = s.measure1(r, size); err != nil {
				return err
			}
			s.printResult(last, nil)
		}
		if err := hs(); err != nil {
			return err
		}
		if _, err := s.xchgReport(last); err != nil {
			return err
		}
		return s.close()
	case t.Verb == VerbSend: // send_lat
		if err := steps(s.keys, s.connect, hs, s.keys); err != nil {
			return err
		}
		s.printKeys()
		for _, size := range c.sizes {
			r, err := s.prepare(size)
			if err != nil {
				return err
			}
			if err := hs(); err != nil {
				return err
			}
			if err := s.latSize(r, size); err != nil {
				return err
			}
		}
		return s.close()
	default: // write_lat, read_lat, atomic_lat
		if err := steps(hs, s.keys, s.connect, s.keys, hs); err != nil {
			return err
		}
		s.printKeys()
		if s.server && t.Verb != VerbWrite {
			return s.closeT(0) // the client reads (or works atomics) alone
		}
		for _, size := range c.sizes {
			r, err := s.prepare(size)
			if err != nil {
				return err
			}
			if err := s.latSize(r, size); err != nil {
				return err
			}
		}
		if t.Verb == VerbWrite {
			return nil // perftest's write_lat ends without a closing exchange
		}
		return s.close()
	}
}

// latSize runs one size of a latency test and prints it.
func (s *pwSession) latSize(r *sizeRun, size int64) error {
	res, samples, err := s.measure1(r, size)
	if err != nil {
		return err
	}
	s.printResult(res, samples)
	return nil
}

// sendBW runs one size of send_bw: the client sends, the server counts
// what it received (perftest's run_iter_bw_server).
func (s *pwSession) sendBW(r *sizeRun, size int64) (result, error) {
	if !s.server {
		res, _, err := s.measure1(r, size)
		return res, err
	}
	if !s.e.dev.Caps.Has(verbs.CapRNRRetry) && !r.bw.credits {
		// iWARP: perftest's sender counts on receive credits.
		r.bw.enableCredits()
	}
	start := time.Now()
	st, err := r.bw.run()
	if err != nil {
		return result{}, err
	}
	return recvResult(s.cfg, size, st.n, time.Since(start)), nil
}

// close is ctx_close_connection: a handshake, then "done" both ways (the
// peer's read best effort: perftest closes right after writing it).
func (s *pwSession) close() error { return s.closeT(stepTimeout) }

func (s *pwSession) closeT(timeout time.Duration) error {
	if err := s.handshakeT(0, timeout); err != nil {
		return err
	}
	if s.link != nil {
		return nil // perftest's -R and -z close is the handshake alone
	}
	conn := s.p.conn
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	conn.Write(pwDone)
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.ReadFull(conn, make([]byte, len(pwDone)))
	return nil
}

// explainPW adds what an error completion most likely means against
// perftest, whose exchange carries no message size: a buffer smaller than
// this side's -s.
func (s *pwSession) explainPW(err error) error {
	if errors.Is(err, verbs.StatusRemoteAccess) || errors.Is(err, verbs.StatusRemoteInvalidReq) {
		return fmt.Errorf("%w: the %s's (perftest's) buffer is smaller than this side's messages; give both sides the same -s", err, s.p.peer)
	}
	return err
}

// xchgReport is xchg_bw_reports: each field is its own exchange.
func (s *pwSession) xchgReport(r result) (pwReport, error) {
	mine := pwReport{size: uint64(r.size), iters: uint64(r.iters), peak: r.peak, avg: r.bwAvg, msgRateAvg: r.rate}.encode()
	var got []byte
	for off := 0; off < pwReportLen; off += 8 {
		b, err := s.p.xchg(mine[off:off+8], 8, stepTimeout)
		if err != nil {
			return pwReport{}, err
		}
		got = append(got, b...)
	}
	return parsePWReport(got)
}

// recvResult is the receiving side's figures (perftest's
// run_iter_bw_server): n receives of size bytes in d.
func recvResult(c *config, size, n int64, d time.Duration) result {
	r := result{kind: KindBW, size: size, iters: n}
	if sec := d.Seconds(); sec > 0 && n > 0 {
		r.bwAvg = float64(size) * float64(n) / sec / unitBytes(c.gbits)
		r.rate = float64(n) / sec / 1e6
		r.peak = r.bwAvg
	}
	return r
}

// printKeys is ctx_print_pingpong_data for both sides, then the column
// header.
func (s *pwSession) printKeys() {
	w := s.env.Stdout
	for _, k := range s.mine {
		io.WriteString(w, pwAddrLine(s.cfg, "local", k))
	}
	for _, k := range s.rem {
		io.WriteString(w, pwAddrLine(s.cfg, "remote", k))
	}
	io.WriteString(w, resultLine)
	io.WriteString(w, columnHeader(s.cfg))
}

func pwAddrLine(c *config, side string, k pwKey) string {
	l := addrLine(c, side, qpInfo{lid: k.lid, outReads: k.outReads, qpn: k.qpn, psn: k.psn, rkey: k.rkey, vaddr: k.vaddr})
	g := k.gid
	return l + fmt.Sprintf(" GID: %02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d\n",
		g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15])
}
