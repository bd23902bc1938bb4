package perftest

// Running write_bw and send_bw against perftest's own binaries
// (--perftest-wire): perftest 4.5's sequence of exchanges (write_bw.c and
// send_bw.c, RC, one direction, iterations), over a plain TCP connection.
// Everything runs in the caller's goroutine, except a goroutine that
// closes the connection (or listener) when ctx ends.
//
//	both      version, cycle buffer, cache line size, MTU
//	write_bw  keys (per QP), connect, keys (per QP), handshake;
//	          client: warm-up, run, handshake, bw report, close
//	          server: handshake (the client's run), bw report, close
//	send_bw   keys (per QP), connect, handshake, keys (per QP);
//	          server posts receives; handshake; run; close
//	close     handshake, then "done\0" both ways
//
// A handshake is one exchange of QP 0's key message.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
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
}

// keys exchanges every QP's key message; the first exchange records the
// peer's keys, later ones must repeat them.
func (s *pwSession) keys(first bool) error {
	for i := range s.mine {
		if err := s.handshake(i, first); err != nil {
			return err
		}
	}
	return nil
}

// handshake is ctx_hand_shake on QP i.
func (s *pwSession) handshake(i int, first bool) error {
	return s.handshakeT(i, first, stepTimeout)
}

func (s *pwSession) handshakeT(i int, first bool, timeout time.Duration) error {
	b, err := s.p.xchg(s.mine[i].encode(), pwKeyLen, timeout)
	if err != nil {
		return err
	}
	k, err := parsePWKey(b)
	if err != nil {
		return fmt.Errorf("%s: %w", s.p.peer, err)
	}
	if first {
		s.rem = append(s.rem, k)
	} else if i >= len(s.rem) || k != s.rem[i] {
		return fmt.Errorf("%s: QP %d's keys changed between handshakes (%w)", s.p.peer, i, errMalformed)
	}
	return nil
}

// checkPWire rejects what this mode does not do.
func checkPWire(o Options) error {
	switch {
	case o.Test.Kind != KindBW || (o.Test.Verb != VerbWrite && o.Test.Verb != VerbSend):
		return usageErr("--perftest-wire runs write_bw and send_bw only, not %s", o.Test)
	case o.Bidir:
		return usageErr("--perftest-wire does not run -b (bidirectional)")
	case o.All:
		return usageErr("--perftest-wire does not run -a (all sizes); give one -s")
	case o.Duration > 0:
		return usageErr("--perftest-wire does not run -D (duration); give -n")
	case o.Loopback:
		return usageErr("--perftest-wire talks to perftest's binaries; drop --loopback")
	}
	return nil
}

// pwDevice is -d, or the first device of the ibverbs transport.
func pwDevice(name string) (verbs.DeviceInfo, error) {
	if name != "" {
		d, err := findDevice(name)
		if err != nil {
			return d, err
		}
		if d.Transport != "ibverbs" {
			return d, fmt.Errorf("--perftest-wire needs a device of the ibverbs transport, not %s (%s)", d.Name, d.Transport)
		}
		return d, nil
	}
	devs, _ := verbs.Devices()
	for _, d := range devs {
		if d.Transport == "ibverbs" {
			return d, nil
		}
	}
	return verbs.DeviceInfo{}, errors.New("--perftest-wire needs a device of the ibverbs transport and none is available (build with -tags ibverbs; give -d)")
}

func runPWire(ctx context.Context, o Options, env Env) (err error) {
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
	server := o.Server == ""
	var conn net.Conn
	if server {
		ln, err := listen(c, env)
		if err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		io.WriteString(env.Stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		conn, err = ln.Accept()
		ln.Close()
		stop()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("accepting the client: %w", err)
		}
	} else {
		addr := net.JoinHostPort(o.Server, strconv.Itoa(c.port))
		d := net.Dialer{Timeout: dialTimeout, LocalAddr: sourceAddr(o.SourceIP)}
		conn, err = d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("cannot reach server %s: %w", addr, dialCause(err))
		}
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	defer conn.Close()
	p := &pwConn{conn: conn, client: !server, peer: "server"}
	if server {
		p.peer = "client"
	}

	// exchange_versions, check_version_compatibility, check_sys_data.
	b, err := p.xchg(encodePWVersion(pwVersion), pwVersionLen, stepTimeout)
	if err != nil {
		return err
	}
	if v, f := parsePWVersion(b); f < pwMinVersion {
		return fmt.Errorf("the %s announces perftest version %q; the perftest 4.5 exchange needs %.2f or later", p.peer, v, pwMinVersion)
	}
	if _, err := p.xchg(encodePWInt(pwCycleBuffer), 4, stepTimeout); err != nil {
		return err
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

	s := &pwSession{session: &session{cfg: c, env: env, server: server}, p: p}
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
	for i := range s.e.qps {
		q := s.e.local(i)
		gid, lid, ok := pwIBAddrGID(q.addr)
		if !ok {
			return fmt.Errorf("device %s gives no GID for its QPs; --perftest-wire needs the ibverbs transport", dev.Name)
		}
		s.mine = append(s.mine, pwKey{lid: lid, outReads: q.outReads, qpn: q.qpn, psn: q.psn, rkey: q.rkey, vaddr: q.vaddr, gid: gid})
	}
	printHeader(env.Stdout, c, dev, server)

	if err := s.keys(true); err != nil {
		return err
	}
	remote := make([]qpInfo, len(s.rem))
	for i, k := range s.rem {
		// The bandwidth loop targets vaddr + half (the layout of
		// endpoint.go); perftest's buffer starts at its vaddr.
		remote[i] = qpInfo{lid: k.lid, outReads: k.outReads, qpn: k.qpn, psn: k.psn, rkey: k.rkey,
			vaddr: k.vaddr - uint64(s.e.half), srqn: k.srqn, idx: i, addr: append([]byte(nil), k.gid[:]...)}
	}
	if err := s.e.connect(remote, nil); err != nil {
		return err
	}
	if c.Test.Verb == VerbWrite {
		if err := s.keys(false); err != nil {
			return err
		}
		if err := s.handshake(0, false); err != nil {
			return err
		}
	} else {
		if err := s.handshake(0, false); err != nil {
			return err
		}
		if err := s.keys(false); err != nil {
			return err
		}
	}
	s.printKeys()

	size := c.maxSize
	var res result
	switch {
	case c.Test.Verb == VerbWrite && !server:
		r, err := s.prepare(size)
		if err != nil {
			return err
		}
		if res, _, err = s.measure1(r, size); err != nil {
			return err
		}
		if err := s.handshake(0, false); err != nil {
			return err
		}
		if _, err := s.xchgReport(res); err != nil {
			return err
		}
	case c.Test.Verb == VerbWrite:
		// The client runs; its closing handshake comes when it is done.
		if err := s.handshakeT(0, false, 0); err != nil {
			return err
		}
		peer, err := s.xchgReport(result{})
		if err != nil {
			return err
		}
		res = result{kind: KindBW, size: int64(peer.size), iters: int64(peer.iters), peak: peer.peak, bwAvg: peer.avg, rate: peer.msgRateAvg}
	default: // send_bw
		r, err := s.prepare(size)
		if err != nil {
			return err
		}
		if err := s.handshake(0, false); err != nil {
			return err
		}
		if !server {
			if res, _, err = s.measure1(r, size); err != nil {
				return err
			}
			break
		}
		start := time.Now()
		st, err := r.bw.run()
		if err != nil {
			return err
		}
		res = recvResult(c, size, st.n, time.Since(start))
	}
	s.printResult(res, nil)
	if err := s.handshake(0, false); err != nil {
		return err
	}
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	conn.Write(pwDone)
	// The peer's "done" (best effort: perftest closes right after it).
	conn.SetReadDeadline(time.Now().Add(time.Second))
	io.ReadFull(conn, make([]byte, len(pwDone)))
	return s.finish(dev)
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
