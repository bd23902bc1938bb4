package soft

import (
	"fmt"

	"github.com/rdmakit/rdmakit/internal/rc"
	"github.com/rdmakit/rdmakit/internal/ring"
	"github.com/rdmakit/rdmakit/verbs/driver"
)

// SRQ is a shared receive queue: queue pairs created with it take their
// receives from it instead of from their own receive queue.
type SRQ struct {
	pd     *PD
	r      ring.Ring
	off, n int
	maxSGE int
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(cfg SRQConfig) (driver.SRQ, error) {
	if cfg.MaxWR == 0 {
		cfg.MaxWR = 1024
	}
	if cfg.MaxSGE == 0 {
		cfg.MaxSGE = 4
	}
	if cfg.MaxWR < 0 || cfg.MaxSGE < 0 || cfg.MaxSGE > rc.MaxSGE {
		return nil, fmt.Errorf("%w: SRQ max_wr %d, max_sge %d (max %d)", ErrInvalidArgument, cfg.MaxWR, cfg.MaxSGE, rc.MaxSGE)
	}
	c := pd.ctx
	n := ring.Size(cfg.MaxWR, rc.RecvWQESize(cfg.MaxSGE))
	off, b, err := c.allocShared(n)
	if err != nil {
		return nil, err
	}
	s := &SRQ{pd: pd, r: ring.Init(b, cfg.MaxWR, rc.RecvWQESize(cfg.MaxSGE)), off: off, n: n, maxSGE: cfg.MaxSGE}
	c.mu.Lock()
	c.srqs[s] = struct{}{}
	c.mu.Unlock()
	return s, nil
}

// PostRecv posts receives to the SRQ.
func (s *SRQ) PostRecv(wrs []RecvWR) error {
	if err := postRecvRing(s.r, s.maxSGE, wrs); err != nil {
		return err
	}
	c := s.pd.ctx
	c.mu.Lock()
	var users []*QP
	for _, q := range c.qps {
		if q.srq == s {
			users = append(users, q)
		}
	}
	c.mu.Unlock()
	for _, q := range users {
		q.drv.PostRecv()
	}
	return nil
}

// Close destroys the SRQ; it fails with ErrBusy while queue pairs use it.
func (s *SRQ) Close() error {
	c := s.pd.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range c.qps {
		if q.srq == s {
			return fmt.Errorf("%w: SRQ still used by QP %#x", ErrBusy, q.num)
		}
	}
	delete(c.srqs, s)
	c.arena.Free(s.off, s.n)
	return nil
}

func postRecvRing(r ring.Ring, maxSGE int, wrs []RecvWR) error {
	var w rc.RecvWQE
	var buf [rc.RecvWQEMax]byte
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > maxSGE {
			return postErr(i, ErrInvalidArgument, "%d SGEs, max_recv_sge is %d", len(wr.SGL), maxSGE)
		}
		w.WRID = wr.ID
		w.N = len(wr.SGL)
		for j, sg := range wr.SGL {
			w.SGL[j] = rc.SGE{Addr: sg.Addr, Len: sg.Length, LKey: sg.LKey}
		}
		sz := rc.RecvWQESize(w.N)
		w.Encode(buf[:sz])
		clear(buf[sz:r.Payload()])
		if !r.TryPush(buf[:r.Payload()]) {
			r.Notify()
			return postErr(i, ErrQueueFull, "receive queue holds %d work requests", r.Cap())
		}
	}
	r.Notify() // a requester waiting out a receiver-not-ready may retry now
	return nil
}
