package soft

// Progress driven by the application's polling: a transport whose work
// otherwise waits for one of its own goroutines (tcp's reader, woken from
// the network poller) can do that work on the goroutine that polls an
// empty completion queue instead, as a busy-polling RDMA library does.

// Progresser is a ContextTransport that makes progress when asked by a
// poll: CQ.Poll (and with it verbs' CQ.Wait, which polls before it
// sleeps) calls Progress on the polling goroutine whenever it finds the
// CQ empty, and then takes what Progress completed. Progress must not
// block, must not allocate, and must cost little when there is nothing to
// do; it may complete work requests of any CQ.
type Progresser interface {
	Progress(cq *CQ)
	// Sleep says that a waiter on cq is about to sleep (CQ.Wait found it
	// empty): until the next poll, progress is up to the transport.
	Sleep(cq *CQ)
}

// progresser is the context's transport as a Progresser, or nil.
func progresser(c *Context) Progresser {
	p, _ := c.drv.(Progresser)
	return p
}

// progress runs the transport's progress when the CQ is empty.
func (cq *CQ) progress() {
	if cq.prog != nil && cq.r.Empty() {
		cq.prog.Progress(cq)
	}
}

// sleeping tells the transport that a waiter is about to sleep.
func (cq *CQ) sleeping() {
	if cq.prog != nil {
		cq.prog.Sleep(cq)
	}
}

// CQs returns the QP's send and receive completion queues.
func (qp *QP) CQs() (send, recv *CQ) { return qp.sendCQ, qp.recvCQ }
