package perftest

// Running a test: the client's and the server's sides of the exchange and
// the per-size protocol. Everything runs in the caller's goroutine, except
// the control connection's reader (ctrl.go) and, for a server, a goroutine
// that closes the listener when ctx ends.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// Env is where a run writes and how it starts helpers; the zero value
// writes to os.Stdout and os.Stderr.
type Env struct {
	Stdout io.Writer
	Stderr io.Writer
	// Listener, if set, is where a server accepts its client instead of
	// listening on Options.Port.
	Listener net.Listener
	// Progress draws a progress bar on Stderr during -a sweeps (the CLI
	// sets it when stderr is a terminal).
	Progress bool
	// value receives the single figure of --output (Run sets it).
	value io.Writer
	// ServerCommand makes the command that runs `rdmakit perf ARGS` as the
	// server of a loopback run (default: this executable with "perf"
	// before ARGS).
	ServerCommand func(args []string) *exec.Cmd
}

// sourceAddr is the local address of the exchange connection
// (--source_ip), or nil.
func sourceAddr(ip string) net.Addr {
	if ip == "" {
		return nil
	}
	return &net.TCPAddr{IP: net.ParseIP(ip)}
}

func (env *Env) fill() {
	if env.Stdout == nil {
		env.Stdout = os.Stdout
	}
	if env.Stderr == nil {
		env.Stderr = os.Stderr
	}
}

// ListenFDEnv names the environment variable through which a loopback
// parent hands its server child an open listening socket (the fd number).
const ListenFDEnv = "RDMAKIT_PERF_LISTEN_FD"

// Run runs one side of a test: the server if o.Server is empty, else the
// client; with o.Loopback, both (the server as a child process). The
// report goes to env.Stdout. The error is one line, saying what to change
// where the user can change something.
func Run(ctx context.Context, o Options, env Env) error {
	env.fill()
	if err := o.check(); err != nil {
		return err
	}
	if o.Output != "" {
		// --output: only the figure, on stdout; everything else is dropped.
		env.value, env.Stdout = env.Stdout, io.Discard
	}
	if o.Loopback {
		return runLoopback(ctx, o, env)
	}
	if o.Server == "" {
		return runServer(ctx, o, env)
	}
	return runClient(ctx, o, env)
}

// findDevice returns the device called name among the linked transports.
func findDevice(name string) (verbs.DeviceInfo, error) {
	devs, _ := verbs.Devices()
	var names []string
	for _, d := range devs {
		if d.Name == name {
			return d, nil
		}
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return verbs.DeviceInfo{}, fmt.Errorf("device %s is not available: no transport is linked", name)
	}
	return verbs.DeviceInfo{}, fmt.Errorf("device %s is not available (devices: %s); choose one with -d", name, strings.Join(names, ", "))
}

// helloFor describes the client's configuration.
func helloFor(c *config, dev string) hello {
	return hello{version: wireVersion, test: c.Test, all: c.All, size: c.maxSize, iters: c.iters,
		duration: c.Duration, infinite: c.Infinite, qps: c.qps, bidir: c.Bidir, atomic: c.Atomic, conn: "RC", gbits: c.gbits,
		device: dev, tx: c.tx, rx: c.rx, cqMod: c.cqMod, inline: c.inline, mtu: c.MTU}
}

// compareHello returns the first parameter client and server disagree on,
// as a one-line error saying what to change (perftest's negotiate_params
// compares the same: test method, connection type, verb, test kind, atomic
// type, test type, report format, size, iterations, QPs, duration).
func compareHello(s, c hello) error {
	diff := func(what, sv, cv, fix string) error {
		return fmt.Errorf("client and server disagree on %s: server %s, client %s; %s", what, sv, cv, fix)
	}
	onoff := func(b bool, flag string) string {
		if b {
			return flag
		}
		return "no " + flag
	}
	switch {
	case s.test != c.test:
		return diff("the test", s.test.String(), c.test.String(), "run the same test on both sides")
	case s.all != c.all:
		return diff("-a (all sizes)", onoff(s.all, "-a"), onoff(c.all, "-a"), "give both or neither -a")
	case !s.all && s.size != c.size:
		return diff("the message size", "-s "+strconv.FormatInt(s.size, 10), "-s "+strconv.FormatInt(c.size, 10), "give both the same -s")
	case s.infinite != c.infinite:
		return diff("--run_infinitely", onoff(s.infinite, "--run_infinitely"), onoff(c.infinite, "--run_infinitely"), "give both or neither --run_infinitely")
	case s.duration != c.duration:
		return diff("-D (duration)", strconv.Itoa(s.duration), strconv.Itoa(c.duration), "give both the same -D (0: iterations)")
	case s.duration == 0 && s.iters != c.iters:
		return diff("the iterations", "-n "+strconv.FormatInt(s.iters, 10), "-n "+strconv.FormatInt(c.iters, 10), "give both the same -n")
	case s.qps != c.qps:
		return diff("the number of QPs", "-q "+strconv.Itoa(s.qps), "-q "+strconv.Itoa(c.qps), "give both the same -q")
	case s.bidir != c.bidir:
		return diff("-b (bidirectional)", onoff(s.bidir, "-b"), onoff(c.bidir, "-b"), "give both or neither -b")
	case s.atomic != c.atomic:
		return diff("the atomic type", "-A "+s.atomic.String(), "-A "+c.atomic.String(), "give both the same -A")
	case s.conn != c.conn:
		return diff("the connection type", s.conn, c.conn, "give both the same -c")
	case s.gbits != c.gbits:
		return diff("the report format", onoff(s.gbits, "--report_gbits"), onoff(c.gbits, "--report_gbits"), "give both or neither --report_gbits")
	}
	return nil
}

// session is one connected run, either side.
type session struct {
	cfg    *config
	env    Env
	k      *ctrl
	e      *endpoint
	w      *watch
	server bool
	res    []result
	// inf is the loop --run_infinitely's periods share.
	inf *sizeRun
}

// exchangeQPs sends this side's QP lines and reads the peer's (the client
// writes first, as perftest's ctx_hand_shake), then connects the QPs.
func (s *session) exchangeQPs(ctx context.Context, peerIP net.IP) error {
	n := len(s.e.qps)
	send := func() error {
		for i := 0; i < n; i++ {
			if err := s.k.send(s.e.local(i).line()); err != nil {
				return err
			}
		}
		return nil
	}
	var remote []qpInfo
	recv := func() error {
		for i := 0; i < n; i++ {
			l, err := s.k.recv(ctx, kindQP, stepTimeout)
			if err != nil {
				return err
			}
			q, err := parseQPInfo(l)
			if err != nil {
				return fmt.Errorf("%s: %w", s.k.peer, err)
			}
			if q.idx != i {
				return fmt.Errorf("%s sent QP %d where QP %d was expected (%w)", s.k.peer, q.idx, i, errMalformed)
			}
			remote = append(remote, q)
		}
		return nil
	}
	steps := []func() error{send, recv}
	if s.server {
		steps = []func() error{recv, send}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return err
		}
	}
	if err := s.e.connect(remote, peerIP); err != nil {
		return err
	}
	// Both sides are in RTS before anything is posted.
	if s.server {
		if _, err := s.k.recv(ctx, kindSync, stepTimeout); err != nil {
			return err
		}
		return s.k.send(line{kind: kindSync, words: []string{"connected"}})
	}
	if err := s.k.send(line{kind: kindSync, words: []string{"connected"}}); err != nil {
		return err
	}
	_, err := s.k.recv(ctx, kindSync, stepTimeout)
	return err
}

func (s *session) printAddresses() {
	var b strings.Builder
	for i := range s.e.qps {
		b.WriteString(addrLine(s.cfg, "local", s.e.local(i)))
	}
	for _, q := range s.e.remote {
		b.WriteString(addrLine(s.cfg, "remote", q))
	}
	b.WriteString(resultLine)
	b.WriteString(columnHeader(s.cfg))
	io.WriteString(s.env.Stdout, b.String())
}

// sizeRun is this side's loop for one size (one of the two).
type sizeRun struct {
	bw     *bwLoop
	lat    *latLoop
	warmed bool
}

// prepare builds the loop for size and posts its receives; it runs before
// this side declares itself ready.
func (s *session) prepare(size int64) (*sizeRun, error) {
	c := s.cfg
	r := &sizeRun{}
	s.w.start()
	if c.Test.Kind == KindBW {
		send := !s.server || c.Bidir
		recv := c.Test.Verb == VerbSend && (s.server || c.Bidir)
		if c.Infinite && s.inf != nil {
			// --run_infinitely: the next period continues the same loop
			// (its queues and counters: work requests and receives of the
			// previous period may still be outstanding).
			return s.inf, nil
		}
		r.bw = newBWLoop(s.e, s.w, size, send, recv)
		if c.Infinite {
			s.inf = r
		}
		if recv {
			if err := r.bw.postRecvs(); err != nil {
				return nil, err
			}
		}
		return r, nil
	}
	// The client starts the ping-pong, except in perftest's write_lat,
	// where its server does.
	initiator := !s.server
	if s.e.flat && c.Test.Verb == VerbWrite {
		initiator = s.server
	}
	r.lat = newLatLoop(s.e, s.w, size, initiator)
	return r, r.lat.postRecvs()
}

// measure runs one size (after prepare) and returns this side's result,
// zero where this side measures nothing, and the latency samples. A
// failure is blamed on the peer if it hung up.
func (s *session) measure(r *sizeRun, size int64) (result, []float64, error) {
	res, d, err := s.measure1(r, size)
	return res, d, s.explain(err)
}

// explain turns the error of a timed loop into "lost the server/client"
// when the control connection ends at about the same time: a work
// completion error alone (flushed, retry exceeded) does not say that the
// peer died.
func (s *session) explain(err error) error {
	if err == nil || s.w.ctx.Err() != nil || strings.HasPrefix(err.Error(), "lost the ") {
		return err
	}
	for deadline := time.Now().Add(300 * time.Millisecond); !s.k.dead.Load() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if !s.k.dead.Load() {
		return err
	}
	return fmt.Errorf("lost the %s during the test (%w); on this side: %w", s.k.peer, s.k.goneReason(), err)
}

func (s *session) measure1(r *sizeRun, size int64) (result, []float64, error) {
	c := s.cfg
	if r.bw != nil && !r.bw.send && !r.bw.recv {
		// The passive side of a one-sided test: nothing to run.
		return result{}, nil, nil
	}
	if r.bw != nil {
		if !r.warmed {
			if err := r.bw.warmUp(); err != nil {
				return result{}, nil, err
			}
			r.warmed = true
		}
		st, err := r.bw.run()
		if err != nil {
			return result{}, nil, err
		}
		if !r.bw.send {
			return result{}, nil, nil
		}
		return bwResult(c, size, st), nil, nil
	}
	st, err := r.lat.run()
	if err != nil || (s.server && st.tposted == nil) {
		return result{}, nil, err
	}
	if c.Duration > 0 {
		return durLatResult(c, size, st), nil, nil
	}
	d := latSamples(c, st.tposted)
	res := latResult(size, int64(len(st.tposted)), d)
	if c.Unsorted {
		// -U: the histogram lists the samples in the order measured.
		d = latDeltas(c, st.tposted)
	}
	return res, d, nil
}

func (s *session) printResult(r result, samples []float64) {
	if s.cfg.Histogram && samples != nil {
		histogram(s.env.Stdout, s.cfg, samples)
	}
	if !(s.cfg.ReportBoth && s.cfg.Bidir && !s.server) {
		// With --report-both the client printed the two directions instead
		// (printBoth), as perftest does.
		io.WriteString(s.env.Stdout, reportLine(s.cfg, r))
	}
	if s.env.value != nil {
		io.WriteString(s.env.value, outputValue(s.cfg, r))
	}
	s.res = append(s.res, r)
}

// printBoth prints the two directions of a bidirectional run separately
// (--report-both), as perftest's "Local results" and "Remote results".
func (s *session) printBoth(local, remote result) {
	w := s.env.Stdout
	for _, b := range []struct {
		label string
		r     result
	}{{"Local", local}, {"Remote", remote}} {
		fmt.Fprintf(w, "%s\n %s results: \n%s%s%s", resultLine, b.label, resultLine, columnHeader(s.cfg), reportLine(s.cfg, b.r))
	}
}

// finish writes the JSON and the plot, if asked for.
func (s *session) finish(dev verbs.DeviceInfo) error {
	io.WriteString(s.env.Stdout, resultLine)
	if s.cfg.OutJSON != "" {
		if err := writeJSON(s.cfg.OutJSON, s.cfg, dev, s.res); err != nil {
			return err
		}
	}
	if s.cfg.Plot != "" {
		if err := plotResults(s.cfg.Plot, s.cfg, dev, s.res); err != nil {
			return err
		}
	}
	return nil
}

func runClient(ctx context.Context, o Options, env Env) (err error) {
	port := o.Port
	if port == 0 {
		port = DefaultPort
	}
	if o.Device != "" {
		// An unknown device is a usage error before anything is dialed.
		if _, err := findDevice(o.Device); err != nil {
			return err
		}
	}
	addr := net.JoinHostPort(o.Server, strconv.Itoa(port))
	var conn net.Conn
	var cmErr error
	if dev, ok := rcmDevice(o); ok {
		// -R or -z: perftest's exchange over rdma_cm; an rdmakit server
		// without them answers on TCP instead.
		var ip net.IP
		if ips, err := net.DefaultResolver.LookupIP(ctx, "ip", o.Server); err == nil && len(ips) > 0 {
			ip = ips[0]
		}
		if ip == nil {
			cmErr = fmt.Errorf("cannot resolve %s", o.Server)
		} else if link, err := rcmDial(ctx, dev, ip, uint16(port), o.RDMACM); err != nil {
			cmErr = err
		} else {
			conn = link
			if o.Device == "" {
				o.Device = link.device()
			}
		}
	}
	if conn == nil {
		d := net.Dialer{Timeout: dialTimeout, LocalAddr: sourceAddr(o.SourceIP)}
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		if cmErr != nil {
			return fmt.Errorf("cannot reach server %s through rdma_cm (-R/-z: %v) nor TCP: %w", addr, cmErr, dialCause(err))
		}
		return fmt.Errorf("cannot reach server %s: %w%s", addr, dialCause(err), refusedHint(err))
	}
	perftest, err := greet(conn, true, "server")
	if err != nil {
		conn.Close()
		return err
	}
	if perftest {
		defer conn.Close()
		return runPWire(ctx, o, env, conn, false)
	}
	if o.Device == "" {
		o.Device = "tcp0"
	}
	dev, err := findDevice(o.Device)
	if err != nil {
		conn.Close()
		return err
	}
	c, err := o.resolve(dev)
	if err != nil {
		conn.Close()
		return err
	}
	k := newCtrl(conn, "server")
	defer k.close()
	s := &session{cfg: c, env: env, k: k, w: newWatch(ctx, k)}
	s.w.tune(dev)
	defer func() {
		if err != nil {
			var pe *PeerError
			if !errors.As(err, &pe) && !k.dead.Load() {
				k.sendErr(err)
			}
		}
	}()
	if c.Test.Kind == KindBW && c.noPeak {
		io.WriteString(env.Stdout, noPeakWarn)
	}
	if err := k.send(helloFor(c, dev.Name).line()); err != nil {
		return err
	}
	l, err := k.recv(ctx, kindAccept, stepTimeout)
	if err != nil {
		return err
	}
	if _, err := parseAccept(l); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.e, err = openEndpoint(c, dev)
	if err != nil {
		return err
	}
	defer s.e.close()
	printHeader(env.Stdout, c, dev, false)
	var peerIP net.IP
	if ta, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		peerIP = ta.IP
	}
	if err := s.exchangeQPs(ctx, peerIP); err != nil {
		return err
	}
	s.printAddresses()
	bar := newProgress(env, c)
	err = s.clientSizes(ctx, bar)
	bar.clear()
	stopped := false
	if err != nil {
		if !c.Infinite || ctx.Err() == nil {
			return err
		}
		// --run_infinitely ends with an interrupt: the server is told, and
		// both sides end as after the last size.
		ctx, stopped = context.Background(), true
	}
	if err := k.send(line{kind: kindDone}); err != nil {
		return err
	}
	for {
		// Interrupted, the client may have asked for a period the server
		// then declared itself ready for.
		l, err := k.recvAny(ctx, stepTimeout, kindDone, kindReady)
		if err != nil {
			return err
		}
		if l.kind == kindDone {
			break
		}
		if !stopped {
			return fmt.Errorf("server sent READY where DONE was expected (%w)", errMalformed)
		}
	}
	return s.finish(dev)
}

// clientSizes runs the client's sizes (with --run_infinitely, its one size
// until ctx ends), each after the server said it is ready.
func (s *session) clientSizes(ctx context.Context, bar *progress) error {
	c, k := s.cfg, s.k
	for i := 0; i < len(c.sizes) || c.Infinite; i++ {
		size := c.sizes[min(i, len(c.sizes)-1)]
		r, err := s.prepare(size)
		if err != nil {
			return err
		}
		if err := k.send(sizeLine(kindSize, size)); err != nil {
			return err
		}
		l, err := k.recv(ctx, kindReady, stepTimeout)
		if err != nil {
			return err
		}
		if n, err := parseSizeLine(l, kindReady); err != nil || n != size {
			return fmt.Errorf("server answered READY %d to SIZE %d (%w)", n, size, errMalformed)
		}
		start := time.Now()
		res, samples, err := s.measure(r, size)
		if err != nil {
			return err
		}
		if c.Bidir {
			// The server measured at the same time; allow for it being slower.
			l, err := k.recv(ctx, kindResult, stepTimeout+2*time.Since(start))
			if err != nil {
				return err
			}
			peer, err := parseResult(l)
			if err != nil {
				return fmt.Errorf("server: %w", err)
			}
			if c.ReportBoth {
				s.printBoth(res, peer)
			}
			res = addBW(res, peer)
		}
		if err := k.send(res.line()); err != nil {
			return err
		}
		bar.clear()
		s.printResult(res, samples)
		bar.update(i + 1)
	}
	return nil
}

// refusedHint explains a refused connection: no server on the port, or a
// perftest server run with -R or -z, which listens through rdma_cm only.
func refusedHint(err error) string {
	if errors.Is(err, syscall.ECONNREFUSED) {
		if rcmFirst == "ibverbs" {
			return " (no server on that port; a perftest server run with -R or -z listens through rdma_cm: give this side the same flag)"
		}
		return " (no server on that port; a perftest server run with -R or -z listens through rdma_cm, which this build of rdmakit perf speaks only on roce devices (-d roceN with -R or -z; build with -tags ibverbs for RDMA NICs): run it without -R or -z)"
	}
	return ""
}

// dialCause strips a dial error down to its reason ("connection refused",
// "i/o timeout", "no such host").
func dialCause(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return dnsErr
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("no answer within %v", dialTimeout)
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// listen returns the server's listener: env.Listener, an inherited socket
// (loopback child), or a new one on the port.
func listen(c *config, env Env) (net.Listener, error) {
	if env.Listener != nil {
		return env.Listener, nil
	}
	if fd := os.Getenv(ListenFDEnv); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil || n < 3 {
			return nil, fmt.Errorf("%s=%q: not a file descriptor", ListenFDEnv, fd)
		}
		os.Unsetenv(ListenFDEnv)
		f := os.NewFile(uintptr(n), "listener")
		defer f.Close()
		l, err := net.FileListener(f)
		if err != nil {
			return nil, fmt.Errorf("inherited listener: %w", err)
		}
		return l, nil
	}
	l, err := net.Listen("tcp", ":"+strconv.Itoa(c.port))
	if err != nil {
		return nil, fmt.Errorf("cannot listen on port %d (another server running? choose another -p): %w", c.port, err)
	}
	return l, nil
}

func runServer(ctx context.Context, o Options, env Env) (err error) {
	// The device-independent configuration, for comparing with the client.
	c0, err := o.resolve(verbs.DeviceInfo{})
	if err != nil {
		return err
	}
	var conn net.Conn
	if dev, ok := rcmDevice(o); ok && env.Listener == nil {
		// -R or -z: perftest's exchange over rdma_cm (not for --loopback's
		// child, whose listener is inherited).
		io.WriteString(env.Stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		var link rcmLink
		if link, err = rcmAccept(ctx, dev, uint16(c0.port), o.RDMACM); err == nil {
			conn = link
			if o.Device == "" {
				o.Device = dev
			}
		}
	} else {
		var ln net.Listener
		if ln, err = listen(c0, env); err != nil {
			return err
		}
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		io.WriteString(env.Stdout, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
		conn, err = ln.Accept()
		ln.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("accepting the client: %w", err)
	}
	perftest, err := greet(conn, false, "client")
	if err != nil {
		conn.Close()
		return err
	}
	if perftest {
		defer conn.Close()
		return runPWire(ctx, o, env, conn, true)
	}
	k := newCtrl(conn, "client")
	defer k.close()
	defer func() {
		if err != nil {
			var pe *PeerError
			if !errors.As(err, &pe) && !k.dead.Load() {
				k.sendErr(err)
			}
		}
	}()
	l, err := k.recv(ctx, kindHello, stepTimeout)
	if err != nil {
		return err
	}
	if v, err := helloVersion(l); err != nil {
		return fmt.Errorf("client: %w", err)
	} else if v != wireVersion {
		return fmt.Errorf("client speaks exchange version %d, this server version %d: use the same rdmakit on both sides", v, wireVersion)
	}
	h, err := parseHello(l)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	if err := compareHello(helloFor(c0, ""), h); err != nil {
		return err
	}
	name := h.device
	if o.Device != "" && o.Device != h.device {
		return fmt.Errorf("client and server disagree on the device: server -d %s, client uses %s; give both the same -d (or no -d to the server)", o.Device, h.device)
	}
	dev, err := findDevice(name)
	if err != nil {
		return fmt.Errorf("the client uses device %s: %w", name, err)
	}
	c, err := o.resolve(dev)
	if err != nil {
		return err
	}
	if c.Test.Kind == KindBW && c.noPeak && c.Bidir {
		io.WriteString(env.Stdout, noPeakWarn)
	}
	s := &session{cfg: c, env: env, k: k, w: newWatch(ctx, k), server: true}
	s.w.tune(dev)
	s.e, err = openEndpoint(c, dev)
	if err != nil {
		return err
	}
	defer s.e.close()
	if err := k.send(accept{device: dev.Name, transport: dev.Transport, mtu: c.mtu.Bytes()}.line()); err != nil {
		return err
	}
	printHeader(env.Stdout, c, dev, true)
	var peerIP net.IP
	if ta, ok := conn.RemoteAddr().(*net.TCPAddr); ok {
		peerIP = ta.IP
	}
	if err := s.exchangeQPs(ctx, peerIP); err != nil {
		return err
	}
	s.printAddresses()
	for i := 0; ; i++ {
		l, err := k.recvAny(ctx, stepTimeout, kindSize, kindDone)
		if err != nil {
			return err
		}
		if l.kind == kindDone {
			if err := k.send(line{kind: kindDone}); err != nil {
				return err
			}
			return s.finish(dev)
		}
		size, err := parseSizeLine(l, kindSize)
		if err != nil {
			return fmt.Errorf("client: %w", err)
		}
		if want := c.sizes[min(i, len(c.sizes)-1)]; size != want || (i >= len(c.sizes) && !c.Infinite) {
			return fmt.Errorf("client asked for size %d out of turn (%w)", size, errMalformed)
		}
		r, err := s.prepare(size)
		if err != nil {
			return err
		}
		if err := k.send(sizeLine(kindReady, size)); err != nil {
			return err
		}
		mine, _, err := s.measure(r, size)
		if err != nil {
			return err
		}
		if c.Bidir {
			if err := k.send(mine.line()); err != nil {
				return err
			}
		}
		l, err = k.recvAny(ctx, 0, kindResult, kindDone)
		if err != nil {
			return err
		}
		if l.kind == kindDone && c.Infinite {
			// The client was interrupted during this period.
			if err := k.send(line{kind: kindDone}); err != nil {
				return err
			}
			return s.finish(dev)
		}
		if l.kind == kindDone {
			return fmt.Errorf("client ended during size %d (%w)", size, errMalformed)
		}
		res, err := parseResult(l)
		if err != nil {
			return fmt.Errorf("client: %w", err)
		}
		s.printResult(res, nil)
	}
}
