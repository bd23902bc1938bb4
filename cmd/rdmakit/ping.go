package main

// rdmakit ping: rping's protocol (librdmacm's examples/rping.c), so that
// rdmakit and rping interoperate in either role. Per ping the client
// advertises a source buffer (Send of {addr, rkey, len}), the server RDMA
// Reads it and says go on (Send), the client advertises a sink buffer, the
// server RDMA Writes the data back and says done; the client compares. The
// connection is made through the RDMA CM: on roce devices rdmakit's own
// (transport/roce: DialCM, ListenCM, over UD QP 1), on ibverbs devices
// librdmacm's (transport/ibverbs, with -tags ibverbs). It runs in main's
// goroutine.

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/rdmakit/rdmakit/internal/cli"
	"github.com/rdmakit/rdmakit/verbs"
)

func init() {
	register("ping", "rping-compatible RDMA ping over rdma_cm (roce devices, or ibverbs ones with -tags ibverbs)", runPing)
}

// pingCM is the RDMA CM of one transport: ping_ibverbs.go registers
// librdmacm's for ibverbs devices (-tags ibverbs), ping_roce.go rdmakit's
// own (over UD QP 1) for roce devices.
type pingCM struct {
	// deviceFor names the device for ip (local: to listen on it).
	deviceFor func(ip net.IP, local bool) (string, error)
	dial      func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (io.Closer, error)
	listen    func(vctx *verbs.Context, ip net.IP, port uint16) (pingListener, error)
}

// pingCMs by transport name, in the order a device is looked for
// without --dev.
var (
	pingCMs     = map[string]*pingCM{}
	pingCMOrder []string
)

func registerPingCM(transport string, cm *pingCM) {
	pingCMs[transport] = cm
	pingCMOrder = append(pingCMOrder, transport)
}

type pingListener interface {
	Accept(ctx context.Context, qp *verbs.QP) (io.Closer, error)
	Close() error
}

const pingUsage = `usage: rdmakit ping -s|-c -a ADDR [flags]

Speaks rping's protocol (rdmacm-utils), in either role, over the RDMA CM:
on a roce device (rdmakit's RoCEv2) with rdmakit's own CM, on an RDMA NIC
or rxe/siw with librdmacm (a build with -tags ibverbs).

  -s            server: listen on ADDR
  -c            client: connect to ADDR
  -a ADDR       IP address (server: bind address; client: server address)
  -p PORT       rdma_cm port (default 7174, as rping)
  -C COUNT      pings (default 0: forever for the client; the server serves one client)
  -S SIZE       ping size in bytes (default 64, minimum 16)
  -v            print each ping's data, as rping -v
  -V            validate the echoed data (always done; accepted for rping compatibility)
  -d            debug output, as rping -d (connection steps to stderr)
  -P            persistent server (accepted, with a note: this server serves one client)
  -q, -l        accepted for rping compatibility (no effect here), with a note
  --dev DEV     device (default: the one rdma_cm picks for ADDR, else the
                roce device with ADDR (server) or routing to it (client))
`

// pingInfo is rping's struct rping_rdma_info: buf (be64), rkey (be32),
// size (be32).
const pingInfoLen = 16

func runPing(args []string) int {
	fs := flag.NewFlagSet("ping", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	server := fs.Bool("s", false, "")
	client := fs.Bool("c", false, "")
	addr := fs.String("a", "", "")
	port := fs.Int("p", 7174, "")
	count := fs.Int("C", 0, "")
	size := fs.Int("S", 64, "")
	verbose := fs.Bool("v", false, "")
	fs.Bool("V", false, "")
	debug := fs.Bool("d", false, "")
	persistent := fs.Bool("P", false, "")
	quiet := fs.Bool("q", false, "")
	loop := fs.Bool("l", false, "")
	dev := fs.String("dev", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Print(pingUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "rdmakit ping: %v\n%s", err, pingUsage)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rdmakit ping: unexpected argument %q\n%s", fs.Arg(0), pingUsage)
		return 2
	}
	for _, f := range []struct {
		set  bool
		flag string
	}{{*persistent, "-P"}, {*quiet, "-q"}, {*loop, "-l"}} {
		if f.set {
			fmt.Fprintf(os.Stderr, "rdmakit ping: note: %s is accepted for rping compatibility and has no effect here\n", f.flag)
		}
	}
	if *server == *client || *addr == "" {
		fmt.Fprint(os.Stderr, "rdmakit ping: give -s or -c, and -a ADDR\n", pingUsage)
		return 2
	}
	if *size < pingInfoLen {
		fmt.Fprintf(os.Stderr, "rdmakit ping: -S %d is below the minimum of %d\n", *size, pingInfoLen)
		return 2
	}
	ip := net.ParseIP(*addr)
	if ip == nil {
		ips, err := net.LookupIP(*addr)
		if err != nil || len(ips) == 0 {
			fmt.Fprintf(os.Stderr, "rdmakit ping: cannot resolve %q\n", *addr)
			return 2
		}
		ip = ips[0]
	}
	sigs := cli.NotifySignals(context.Background())
	defer sigs.Stop()
	ctx := context.Context(sigs)
	p := &pinger{ip: ip, port: uint16(*port), count: *count, size: *size, verbose: *verbose, dev: *dev}
	debugf := func(format string, a ...any) {
		if *debug {
			fmt.Fprintf(os.Stderr, "rdmakit ping: "+format+"\n", a...)
		}
	}
	var err error
	if *server {
		debugf("server on %s port %d, device %q", ip, *port, *dev)
		err = p.serve(ctx)
	} else {
		debugf("client to %s port %d, device %q, %d pings of %d bytes", ip, *port, *dev, *count, *size)
		err = p.ping(ctx)
	}
	debugf("done: %v", err)
	if st := sigs.Status(); st != 0 {
		// rping stops on a signal too; say so in the exit status.
		return st
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdmakit ping: %v\n", err)
		return 1
	}
	return 0
}

type pinger struct {
	ip      net.IP
	port    uint16
	count   int
	size    int
	verbose bool
	dev     string

	cm   *pingCM
	ctx  *verbs.Context
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	wcs  []verbs.WorkCompletion
	recv []verbs.WorkCompletion // receive completions not yet consumed
}

// Buffer layout in one region: start (size), rdma (size), recv (16), send (16).
func (p *pinger) start() []byte { return p.mr.Bytes()[:p.size] }
func (p *pinger) rdma() []byte  { return p.mr.Bytes()[p.size : 2*p.size] }
func (p *pinger) offRecv() int  { return 2 * p.size }
func (p *pinger) offSend() int  { return 2*p.size + pingInfoLen }

func (p *pinger) setup(local bool) error {
	name := p.dev
	if name == "" {
		var errs []error
		for _, t := range pingCMOrder {
			n, err := pingCMs[t].deviceFor(p.ip, local)
			if err == nil {
				name = n
				break
			}
			errs = append(errs, err)
		}
		if name == "" {
			return fmt.Errorf("no device for %s: %w", p.ip, errors.Join(errs...))
		}
	}
	var err error
	if p.ctx, err = verbs.Open(name, verbs.Options{}); err != nil {
		return err
	}
	t := p.ctx.Info().Transport
	if p.cm = pingCMs[t]; p.cm == nil {
		if t == "ibverbs" || t == "" {
			return fmt.Errorf("%s: this rdmakit was built without rdma_cm for RDMA NICs: rebuild with `go build -tags ibverbs ./cmd/rdmakit` (needs libibverbs-dev, librdmacm-dev), or use a roce device", name)
		}
		return fmt.Errorf("%s: transport %s has no RDMA CM; use a roce device (or an RDMA NIC with -tags ibverbs)", name, t)
	}
	if p.pd, err = p.ctx.AllocPD(); err != nil {
		return err
	}
	if p.cq, err = p.ctx.CreateCQ(64); err != nil {
		return err
	}
	if p.qp, err = p.pd.CreateQP(verbs.QPConfig{SendCQ: p.cq, RecvCQ: p.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	if p.mr, err = p.pd.AllocMR(2*p.size+2*pingInfoLen, verbs.AccessAll); err != nil {
		return err
	}
	p.wcs = make([]verbs.WorkCompletion, 16)
	// Receives can be posted from INIT on; rdma_cm takes the QP from there.
	if err := p.qp.Modify(verbs.QPAttr{State: verbs.QPInit, Port: 1,
		AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite}); err != nil {
		return err
	}
	return p.postRecv()
}

func (p *pinger) close() {
	if p.ctx != nil {
		p.ctx.Close()
	}
}

func (p *pinger) postRecv() error {
	return p.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{p.mr.SGE(p.offRecv(), pingInfoLen)}}})
}

// poll waits for one completion of kind recv (or a send-side one) and
// returns it, with a bound so that a vanished peer ends the run.
func (p *pinger) poll(ctx context.Context, recv bool) (verbs.WorkCompletion, error) {
	for {
		if recv && len(p.recv) > 0 {
			w := p.recv[0]
			p.recv = p.recv[1:]
			return w, w.Err()
		}
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		n, err := p.cq.Wait(c, p.wcs)
		cancel()
		if err != nil {
			return verbs.WorkCompletion{}, fmt.Errorf("waiting for a completion: %w", err)
		}
		var sendWC *verbs.WorkCompletion
		for i := 0; i < n; i++ {
			w := p.wcs[i]
			if w.Opcode == verbs.WCRecv {
				p.recv = append(p.recv, w)
			} else if sendWC == nil {
				sendWC = &w
			}
		}
		if !recv && sendWC != nil {
			return *sendWC, sendWC.Err()
		}
	}
}

// sendInfo sends {addr, rkey, len} of buf (offset off in the region).
func (p *pinger) sendInfo(ctx context.Context, off, n int) error {
	b := p.mr.Bytes()[p.offSend() : p.offSend()+pingInfoLen]
	binary.BigEndian.PutUint64(b[0:], p.mr.Addr()+uint64(off))
	binary.BigEndian.PutUint32(b[8:], p.mr.RKey())
	binary.BigEndian.PutUint32(b[12:], uint32(n))
	return p.send(ctx)
}

func (p *pinger) send(ctx context.Context) error {
	if err := p.qp.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.mr.SGE(p.offSend(), pingInfoLen)}}}); err != nil {
		return err
	}
	_, err := p.poll(ctx, false)
	return err
}

// recvInfo waits for the peer's message and reposts the receive.
func (p *pinger) recvInfo(ctx context.Context) (addr uint64, rkey, n uint32, err error) {
	w, err := p.poll(ctx, true)
	if err != nil {
		return 0, 0, 0, err
	}
	if w.ByteLen != pingInfoLen {
		return 0, 0, 0, fmt.Errorf("peer sent %d bytes, want %d (is it rping?)", w.ByteLen, pingInfoLen)
	}
	b := p.mr.Bytes()[p.offRecv() : p.offRecv()+pingInfoLen]
	addr, rkey, n = binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])
	return addr, rkey, n, p.postRecv()
}

func (p *pinger) rdmaOp(ctx context.Context, op verbs.Opcode, n int, addr uint64, rkey uint32) error {
	if err := p.qp.PostSend([]verbs.SendWR{{ID: 3, Opcode: op, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{p.mr.SGE(p.size, n)}, RemoteAddr: addr, RKey: rkey}}); err != nil {
		return err
	}
	_, err := p.poll(ctx, false)
	return err
}

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// ping is the client (rping -c).
func (p *pinger) ping(ctx context.Context) error {
	defer p.close()
	if err := p.setup(false); err != nil {
		return err
	}
	conn, err := p.cm.dial(ctx, p.qp, p.ip, p.port)
	if err != nil {
		return err
	}
	defer conn.Close()
	start := byte(65)
	for n := 0; p.count == 0 || n < p.count; n++ {
		buf := p.start()
		cc := copy(buf, fmt.Sprintf("rdma-ping-%d: ", n))
		c := start
		for i := cc; i < len(buf); i++ {
			buf[i] = c
			if c++; c > 122 {
				c = 65
			}
		}
		if start++; start > 122 {
			start = 65
		}
		buf[len(buf)-1] = 0
		if err := p.sendInfo(ctx, 0, p.size); err != nil {
			return fmt.Errorf("ping %d: advertising the source: %w", n, err)
		}
		if _, _, _, err := p.recvInfo(ctx); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's read: %w", n, err)
		}
		if err := p.sendInfo(ctx, p.size, p.size); err != nil {
			return fmt.Errorf("ping %d: advertising the sink: %w", n, err)
		}
		if _, _, _, err := p.recvInfo(ctx); err != nil {
			return fmt.Errorf("ping %d: waiting for the server's write: %w", n, err)
		}
		if string(p.start()) != string(p.rdma()) {
			return fmt.Errorf("ping %d: data mismatch: sent %q, got back %q", n, cstring(p.start()), cstring(p.rdma()))
		}
		if p.verbose {
			fmt.Printf("ping data: %s\n", cstring(p.rdma()))
		}
		clear(p.rdma())
	}
	return nil
}

// serve is the server (rping -s): it serves one client until that client
// disconnects, or -C pings.
func (p *pinger) serve(ctx context.Context) error {
	defer p.close()
	if err := p.setup(true); err != nil {
		return err
	}
	l, err := p.cm.listen(p.ctx, p.ip, p.port)
	if err != nil {
		return err
	}
	defer l.Close()
	conn, err := l.Accept(ctx, p.qp)
	if err != nil {
		return err
	}
	defer conn.Close()
	for n := 0; p.count == 0 || n < p.count; n++ {
		addr, rkey, ln, err := p.recvInfo(ctx)
		if err != nil {
			if n > 0 && (errors.Is(err, verbs.StatusWRFlush) || p.qp.State() == verbs.QPError) {
				return nil // the client is done and disconnected
			}
			return fmt.Errorf("ping %d: waiting for the client's source: %w", n, err)
		}
		if int(ln) > p.size {
			return fmt.Errorf("ping %d: client buffer of %d bytes exceeds -S %d", n, ln, p.size)
		}
		if err := p.rdmaOp(ctx, verbs.OpRead, int(ln), addr, rkey); err != nil {
			return fmt.Errorf("ping %d: RDMA Read: %w", n, err)
		}
		if p.verbose {
			fmt.Printf("server ping data: %s\n", cstring(p.rdma()))
		}
		if err := p.send(ctx); err != nil {
			return fmt.Errorf("ping %d: go-ahead: %w", n, err)
		}
		addr, rkey, _, err = p.recvInfo(ctx)
		if err != nil {
			return fmt.Errorf("ping %d: waiting for the client's sink: %w", n, err)
		}
		if err := p.rdmaOp(ctx, verbs.OpWrite, len(cstring(p.rdma()))+1, addr, rkey); err != nil {
			return fmt.Errorf("ping %d: RDMA Write: %w", n, err)
		}
		if err := p.send(ctx); err != nil {
			return fmt.Errorf("ping %d: done: %w", n, err)
		}
	}
	return nil
}
