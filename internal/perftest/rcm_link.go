package perftest

// rdma_cm for -R and -z (see rcm.go): the exchange's connection (a QP
// whose every message is one Send), on the RDMA CM of the device's
// transport (rcmCMs: librdmacm's for ibverbs devices, rcm_ibverbs.go;
// transport/roce's own for roce devices, rcm_roce.go). The link's methods
// run on the run's goroutine; the QP's completions are polled there.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/rdmakit/rdmakit/verbs"
)

// rcmCM is one transport's RDMA CM.
type rcmCM struct {
	// deviceFor names the device rdma_cm routes ip through.
	deviceFor func(ip net.IP, local bool) (string, error)
	dial      func(ctx context.Context, qp *verbs.QP, ip net.IP, port uint16) (rcmCMConn, error)
	// listen listens on port, any address of vctx's device.
	listen func(vctx *verbs.Context, port uint16) (rcmListener, error)
	// keepQPConns: the test QPs' connections are closed with the link
	// (rather than left to the context's close).
	keepQPConns bool
}

// rcmCMConn is a connection the RDMA CM made.
type rcmCMConn interface {
	io.Closer
	// Disconnected reports whether the peer disconnected (non-blocking).
	Disconnected() bool
}

type rcmListener interface {
	Accept(ctx context.Context, qp *verbs.QP) (rcmCMConn, error)
	Close() error
}

// rcmCMs by transport name; rcmFirst is the transport a device is looked
// for without -d.
var (
	rcmCMs   = map[string]*rcmCM{}
	rcmFirst string
)

func registerRCM(transport string, cm *rcmCM, first bool) {
	rcmCMs[transport] = cm
	if first {
		rcmFirst = transport
	}
	rcmDial, rcmAccept = dialRCM, acceptRCM
}

// rcmRecvs receives are kept posted, each rcmMaxMsg bytes; the send
// buffer follows them in the region.
const rcmRecvs = 8

type rcmConn struct {
	ctx  *verbs.Context
	pd   *verbs.PD
	scq  *verbs.CQ
	rcq  *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	rcm  *rcmCM
	cm   rcmCMConn
	ln   rcmListener // the test QPs' listener (server)
	qpcs []io.Closer // the test QPs' connections (rcm.keepQPConns)
	ip   net.IP      // the server's address (client)
	dev  string
	port uint16
	qps  bool // -R: the test QPs connect through rdma_cm
	wcs  []verbs.WorkCompletion

	rdl, wdl time.Time
	pending  []byte // the rest of the last message received
	local    net.Addr
	remote   net.Addr

	// mu serialises polling with Close, which may come from another
	// goroutine (the run's context ending).
	mu     sync.Mutex
	closed bool
}

func openRCM(dev string, qps bool) (_ *rcmConn, err error) {
	c := &rcmConn{wcs: make([]verbs.WorkCompletion, 1), dev: dev, qps: qps, local: &net.TCPAddr{}, remote: &net.TCPAddr{}}
	if c.ctx, err = verbs.Open(dev, verbs.Options{}); err != nil {
		return nil, fmt.Errorf("opening %s for the exchange over rdma_cm: %w", dev, err)
	}
	defer func() {
		if err != nil {
			c.ctx.Close()
		}
	}()
	if c.rcm = rcmCMs[c.ctx.Info().Transport]; c.rcm == nil {
		return nil, fmt.Errorf("%s (transport %s) has no RDMA CM in this build", dev, c.ctx.Info().Transport)
	}
	if c.pd, err = c.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if c.scq, err = c.ctx.CreateCQ(4); err != nil {
		return nil, err
	}
	if c.rcq, err = c.ctx.CreateCQ(rcmRecvs + 1); err != nil {
		return nil, err
	}
	if c.qp, err = c.pd.CreateQP(verbs.QPConfig{SendCQ: c.scq, RecvCQ: c.rcq, Cap: verbs.QPCap{
		MaxSendWR: 2, MaxRecvWR: rcmRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if c.mr, err = c.pd.AllocMR((rcmRecvs+1)*rcmMaxMsg, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	// Receives can be posted from INIT on; rdma_cm takes the QP from there.
	if err = c.qp.Modify(verbs.QPAttr{State: verbs.QPInit, Port: 1, AccessFlags: verbs.AccessLocalWrite}); err != nil {
		return nil, err
	}
	for i := range rcmRecvs {
		if err = c.postRecv(i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *rcmConn) postRecv(i int) error {
	return c.qp.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{c.mr.SGE(i*rcmMaxMsg, rcmMaxMsg)}}})
}

func dialRCM(ctx context.Context, dev string, ip net.IP, port uint16, qps bool) (rcmLink, error) {
	if dev == "" {
		var err error
		if dev, err = rcmCMs[rcmFirst].deviceFor(ip, false); err != nil {
			return nil, err
		}
	}
	c, err := openRCM(dev, qps)
	if err != nil {
		return nil, err
	}
	if c.cm, err = c.rcm.dial(ctx, c.qp, ip, port); err != nil {
		c.ctx.Close()
		return nil, err
	}
	c.ip, c.port = ip, port
	c.remote = &net.TCPAddr{IP: ip, Port: int(port)}
	return c, nil
}

func acceptRCM(ctx context.Context, dev string, port uint16, qps bool) (rcmLink, error) {
	c, err := openRCM(dev, qps)
	if err != nil {
		return nil, err
	}
	ln, err := c.rcm.listen(c.ctx, port)
	if err != nil {
		c.ctx.Close()
		return nil, err
	}
	c.cm, err = ln.Accept(ctx, c.qp)
	ln.Close() // the test QPs' connections come to a new listener (dataListen)
	if err != nil {
		c.ctx.Close()
		return nil, err
	}
	c.port = port
	return c, nil
}

func (c *rcmConn) dataListen(vctx *verbs.Context) (err error) {
	c.ln, err = c.rcm.listen(vctx, c.port)
	return err
}

func (c *rcmConn) connectQP(ctx context.Context, qp *verbs.QP) error {
	if c.ln != nil {
		ctx, cancel := context.WithTimeout(ctx, stepTimeout)
		defer cancel()
		qc, err := c.ln.Accept(ctx, qp)
		if err != nil {
			return fmt.Errorf("accepting the client's rdma_cm connection for a test QP: %w", err)
		}
		c.keep(qc)
		return nil
	}
	// The server listens for the test QPs only after the handshake that
	// precedes them (and perftest sets up its buffers and QPs first):
	// retry while it is not there yet, as perftest does, for up to a
	// step's timeout (a REJ comes back at once on roce; under emulation
	// perftest took more than 20 tries' 2 s).
	var err error
	for start := time.Now(); time.Since(start) < stepTimeout; {
		var qc rcmCMConn
		if qc, err = c.rcm.dial(ctx, qp, c.ip, c.port); err == nil {
			c.keep(qc)
			return nil
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("connecting a test QP through rdma_cm to %s:%d: %w", c.ip, c.port, err)
}

// keep remembers a test QP's connection, for Close (where the CM wants).
func (c *rcmConn) keep(qc rcmCMConn) {
	if c.rcm.keepQPConns {
		c.qpcs = append(c.qpcs, qc)
	}
}

// poll waits for one completion on cq until dl (zero: no limit).
func (c *rcmConn) poll(cq *verbs.CQ, dl time.Time) (verbs.WorkCompletion, error) {
	for spins := 0; ; spins++ {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return verbs.WorkCompletion{}, net.ErrClosed
		}
		n, err := cq.Poll(c.wcs)
		c.mu.Unlock()
		if err != nil {
			return verbs.WorkCompletion{}, err
		}
		if n == 1 {
			w := c.wcs[0]
			return w, w.Err()
		}
		if c.cm.Disconnected() {
			return verbs.WorkCompletion{}, net.ErrClosed
		}
		if !dl.IsZero() && time.Now().After(dl) {
			return verbs.WorkCompletion{}, os.ErrDeadlineExceeded
		}
		if spins > 100 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

func (c *rcmConn) Read(p []byte) (int, error) {
	if len(c.pending) == 0 {
		w, err := c.poll(c.rcq, c.rdl)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0, io.EOF
			}
			return 0, err
		}
		i := int(w.WRID)
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.closed {
			return 0, io.EOF
		}
		c.pending = append(c.pending[:0], c.mr.Bytes()[i*rcmMaxMsg:i*rcmMaxMsg+int(w.ByteLen)]...)
		if err := c.postRecv(i); err != nil {
			return 0, err
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *rcmConn) Write(b []byte) (int, error) {
	done := 0
	for done < len(b) {
		n := min(len(b)-done, rcmMaxMsg)
		if err := c.post(b[done : done+n]); err != nil {
			return done, err
		}
		if _, err := c.poll(c.scq, c.wdl); err != nil {
			return done, err
		}
		done += n
	}
	return done, nil
}

// post sends one message.
func (c *rcmConn) post(b []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	off := rcmRecvs * rcmMaxMsg
	copy(c.mr.Bytes()[off:], b)
	return c.qp.PostSend([]verbs.SendWR{{ID: 1 << 32, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{c.mr.SGE(off, len(b))}}})
}

func (c *rcmConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.ln != nil {
		c.ln.Close()
	}
	for _, qc := range c.qpcs {
		qc.Close()
	}
	if c.cm != nil {
		c.cm.Close()
	}
	return c.ctx.Close()
}

func (c *rcmConn) device() string { return c.dev }

func (c *rcmConn) cmQPs() bool { return c.qps }

func (c *rcmConn) LocalAddr() net.Addr  { return c.local }
func (c *rcmConn) RemoteAddr() net.Addr { return c.remote }
func (c *rcmConn) SetDeadline(t time.Time) error {
	c.rdl, c.wdl = t, t
	return nil
}
func (c *rcmConn) SetReadDeadline(t time.Time) error  { c.rdl = t; return nil }
func (c *rcmConn) SetWriteDeadline(t time.Time) error { c.wdl = t; return nil }
