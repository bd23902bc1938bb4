//go:build ibverbs

package ibverbs

// This file is the package's one gateway to C and to unsafe: every call
// into libibverbs and librdmacm goes through a function here, and every
// other file works with the Go types these return. The C side is shim.c.

/*
#cgo LDFLAGS: -libverbs -lrdmacm
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"github.com/rdmakit/rdmakit/verbs"
)

// errnoErr turns a negative errno return into an error (nil for >= 0).
func errnoErr(r C.int) error {
	if r >= 0 {
		return nil
	}
	return syscall.Errno(-r)
}

// rcErr turns a positive errno return (ibv_modify_qp and friends) into an error.
func rcErr(r C.int) error {
	if r == 0 {
		return nil
	}
	if r < 0 {
		r = -r
	}
	return syscall.Errno(r)
}

// cgoNop is an empty C call: the fixed cost of crossing into C.
func cgoNop() { C.rk_nop() }

func deviceNames() ([]string, error) {
	n := int(C.rk_device_count())
	if n < 0 {
		return nil, syscall.Errno(-n)
	}
	var buf [C.IBV_SYSFS_NAME_MAX]C.char
	names := make([]string, 0, n)
	for i := 0; i < n; i++ {
		if C.rk_device_name(C.int(i), &buf[0], C.int(len(buf))) != 0 {
			break
		}
		names = append(names, C.GoString(&buf[0]))
	}
	return names, nil
}

// cCtx is an open device with its completion channel.
type cCtx struct {
	p  *C.struct_ibv_context
	ch *C.struct_ibv_comp_channel
}

func openDevice(name string) (*cCtx, error) {
	cs := C.CString(name)
	defer C.free(unsafe.Pointer(cs))
	p, err := C.rk_open(cs)
	if p == nil {
		if err == nil {
			err = syscall.ENODEV
		}
		return nil, err
	}
	return &cCtx{p: p}, nil
}

// startEvents creates the completion channel and makes both event fds
// non-blocking (the netpoller waits on them).
func (c *cCtx) startEvents() error {
	ch, err := C.ibv_create_comp_channel(c.p)
	if ch == nil {
		return fmt.Errorf("ibv_create_comp_channel: %v", err)
	}
	c.ch = ch
	if err := errnoErr(C.rk_set_nonblock(ch.fd)); err != nil {
		return err
	}
	return errnoErr(C.rk_set_nonblock(c.p.async_fd))
}

func (c *cCtx) compFd() int  { return int(c.ch.fd) }
func (c *cCtx) asyncFd() int { return int(c.p.async_fd) }

// cqEvent takes one completion event; ok is false when none is pending.
func (c *cCtx) cqEvent() (id uint64, ok bool) {
	var v C.uint64_t
	if C.rk_get_cq_event(c.ch, &v) != 0 {
		return 0, false
	}
	return uint64(v), true
}

// asyncEvent takes one asynchronous event; ok is false when none is pending.
func (c *cCtx) asyncEvent() (typ int, obj uint64, ok bool) {
	var t C.int
	var o C.uint64_t
	if C.rk_get_async_event(c.p, &t, &o) != 0 {
		return 0, 0, false
	}
	return int(t), uint64(o), true
}

func (c *cCtx) close() {
	if c.ch != nil {
		C.ibv_destroy_comp_channel(c.ch)
		c.ch = nil
	}
	if c.p != nil {
		C.ibv_close_device(c.p)
		c.p = nil
	}
}

type devAttr struct {
	fw                                            string
	guid, maxMRSize                               uint64
	vendor, part                                  uint32
	maxQP, maxQPWR, maxSGE, maxSGERd, maxCQ       int
	maxCQE, maxMR, maxPD, maxRdAtom, maxInitRd    int
	maxSRQ, maxSRQWR, maxSRQSGE, atomicCap, ports int
	nodeType, transportType                       int
}

func (c *cCtx) queryDevice() (devAttr, error) {
	var a C.struct_rk_dev_attr
	if err := rcErr(C.rk_query_device(c.p, &a)); err != nil {
		return devAttr{}, err
	}
	return devAttr{
		fw: C.GoString(&a.fw_ver[0]), guid: uint64(a.node_guid), maxMRSize: uint64(a.max_mr_size),
		vendor: uint32(a.vendor_id), part: uint32(a.vendor_part_id),
		maxQP: int(a.max_qp), maxQPWR: int(a.max_qp_wr), maxSGE: int(a.max_sge), maxSGERd: int(a.max_sge_rd),
		maxCQ: int(a.max_cq), maxCQE: int(a.max_cqe), maxMR: int(a.max_mr), maxPD: int(a.max_pd),
		maxRdAtom: int(a.max_qp_rd_atom), maxInitRd: int(a.max_qp_init_rd_atom),
		maxSRQ: int(a.max_srq), maxSRQWR: int(a.max_srq_wr), maxSRQSGE: int(a.max_srq_sge),
		atomicCap: int(a.atomic_cap), ports: int(a.phys_port_cnt),
		nodeType: int(a.node_type), transportType: int(a.transport_type),
	}, nil
}

type portAttr struct {
	state, maxMTU, activeMTU, gidTblLen, linkLayer int
	maxMsgSz                                       uint32
	lid                                            uint16
}

func (c *cCtx) queryPort(port int) (portAttr, error) {
	var a C.struct_rk_port_attr
	if err := rcErr(C.rk_query_port(c.p, C.uint8_t(port), &a)); err != nil {
		return portAttr{}, err
	}
	return portAttr{state: int(a.state), maxMTU: int(a.max_mtu), activeMTU: int(a.active_mtu),
		gidTblLen: int(a.gid_tbl_len), linkLayer: int(a.link_layer), maxMsgSz: uint32(a.max_msg_sz), lid: uint16(a.lid)}, nil
}

func (c *cCtx) queryGIDs(port, tblLen int) []gidEntry {
	const max = 1024
	out := (*[max]C.struct_rk_gid)(C.calloc(max, C.sizeof_struct_rk_gid))
	defer C.free(unsafe.Pointer(out))
	n := int(C.rk_query_gids(c.p, C.uint8_t(port), C.int(tblLen), &out[0], max))
	var gids []gidEntry
	for i := 0; i < n; i++ {
		g := gidEntry{index: int(out[i].index), typ: int(out[i]._type), ifindex: int(out[i].ifindex)}
		for j := range g.gid {
			g.gid[j] = byte(out[i].raw[j])
		}
		gids = append(gids, g)
	}
	return gids
}

// ---------------------------------------------------------------- PD, MR

type cPD struct{ p *C.struct_ibv_pd }

func (c *cCtx) allocPD() (*cPD, error) {
	p, err := C.ibv_alloc_pd(c.p)
	if p == nil {
		return nil, err
	}
	return &cPD{p}, nil
}

func (pd *cPD) dealloc() error { return rcErr(C.ibv_dealloc_pd(pd.p)) }

type cMR struct{ p *C.struct_ibv_mr }

func (pd *cPD) regMR(buf []byte, access verbs.Access) (*cMR, error) {
	var addr unsafe.Pointer
	if len(buf) > 0 {
		addr = unsafe.Pointer(unsafe.SliceData(buf))
	}
	p, err := C.rk_reg_mr(pd.p, addr, C.size_t(len(buf)), C.int(access))
	if p == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		return nil, err
	}
	return &cMR{p}, nil
}

func (pd *cPD) regDmabufMR(off uint64, length int, iova uint64, fd int, access verbs.Access) (*cMR, error) {
	p, err := C.rk_reg_dmabuf_mr(pd.p, C.uint64_t(off), C.size_t(length), C.uint64_t(iova), C.int(fd), C.int(access))
	if p == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		return nil, err
	}
	return &cMR{p}, nil
}

func (m *cMR) keys() (lkey, rkey uint32) { return uint32(m.p.lkey), uint32(m.p.rkey) }
func (m *cMR) dereg() error              { return rcErr(C.ibv_dereg_mr(m.p)) }

// addrOf returns the address of b's first byte (for SGEs in tests).
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

// ---------------------------------------------------------------- CQ

// pollBatch is how many completions one cgo call can return.
const pollBatch = 256

type cCQ struct {
	c   *C.struct_rk_cq
	out []C.struct_rk_wc
	cap int
}

func (c *cCtx) createCQ(cqe int, id uint64) (*cCQ, error) {
	cq, err := C.rk_create_cq(c.p, C.int(cqe), C.uint64_t(id), c.ch)
	if cq == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		return nil, err
	}
	rc := (*C.struct_rk_cq)(C.calloc(1, C.sizeof_struct_rk_cq))
	rc.cq = cq
	rc.max = pollBatch
	rc.tmp = (*C.struct_ibv_wc)(C.calloc(pollBatch, C.sizeof_struct_ibv_wc))
	rc.out = (*C.struct_rk_wc)(C.calloc(pollBatch, C.sizeof_struct_rk_wc))
	return &cCQ{c: rc, out: unsafe.Slice(rc.out, pollBatch), cap: int(cq.cqe)}, nil
}

func (q *cCQ) reqNotify() error { return rcErr(C.rk_req_notify(q.c.cq)) }

// poll moves up to len(wcs) completions into wcs (one cgo call).
func (q *cCQ) poll(wcs []verbs.WorkCompletion) (int, error) {
	n := len(wcs)
	if n > pollBatch {
		n = pollBatch
	}
	got := int(C.rk_poll(q.c, C.int(n)))
	if got < 0 {
		return 0, syscall.Errno(-got)
	}
	for i := 0; i < got; i++ {
		o := &q.out[i]
		wcs[i] = verbs.WorkCompletion{
			WRID: uint64(o.wr_id), Status: verbs.Status(o.status), Opcode: verbs.WCOpcode(o.opcode),
			ByteLen: uint32(o.byte_len), Imm: uint32(o.imm), Flags: verbs.WCFlags(o.flags) & verbs.WCWithImm,
			QPNum: uint32(o.qp_num), SrcQP: uint32(o.src_qp),
		}
	}
	return got, nil
}

func (q *cCQ) destroy() error {
	err := rcErr(C.ibv_destroy_cq(q.c.cq))
	if err != nil {
		return err
	}
	C.free(unsafe.Pointer(q.c.tmp))
	C.free(unsafe.Pointer(q.c.out))
	C.free(unsafe.Pointer(q.c))
	q.c = nil
	return nil
}

// ---------------------------------------------------------------- work queues

// cWQ is a send or receive queue's preallocated C memory: flat work
// requests and SGEs that Go fills and the shim links into a chain.
type cWQ struct {
	q    *C.struct_rk_wq
	in   []C.struct_rk_swr
	sges []C.struct_ibv_sge
	sge  int
}

func newWQ(obj unsafe.Pointer, maxWR, maxSGE int, send bool) *cWQ {
	if maxWR < 1 {
		maxWR = 1
	}
	if maxSGE < 1 {
		maxSGE = 1
	}
	q := (*C.struct_rk_wq)(C.calloc(1, C.sizeof_struct_rk_wq))
	q.qp = obj
	q.max_wr = C.int(maxWR)
	q.max_sge = C.int(maxSGE)
	q.in = (*C.struct_rk_swr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_rk_swr))
	if send {
		q.swrs = (*C.struct_ibv_send_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_ibv_send_wr))
	} else {
		q.rwrs = (*C.struct_ibv_recv_wr)(C.calloc(C.size_t(maxWR), C.sizeof_struct_ibv_recv_wr))
	}
	q.sges = (*C.struct_ibv_sge)(C.calloc(C.size_t(maxWR*maxSGE), C.sizeof_struct_ibv_sge))
	return &cWQ{q: q, in: unsafe.Slice(q.in, maxWR), sges: unsafe.Slice(q.sges, maxWR*maxSGE), sge: maxSGE}
}

func (w *cWQ) free() {
	if w == nil || w.q == nil {
		return
	}
	C.free(unsafe.Pointer(w.q.in))
	C.free(unsafe.Pointer(w.q.swrs))
	C.free(unsafe.Pointer(w.q.rwrs))
	C.free(unsafe.Pointer(w.q.sges))
	C.free(unsafe.Pointer(w.q))
	w.q = nil
}

func (w *cWQ) maxWR() int { return len(w.in) }

// setSend fills slot i from wr; the SGL has been validated against the
// queue's SGE limit. Inline data is gathered by the provider at post time.
//
// Zero-length SGEs are left out, on every device: they move no bytes, and
// siw (Linux 6.1) dereferences NULL in siw_tx_hdt for a Write whose first
// SGE is empty and whose next is not. A Read whose SGEs are all empty keeps
// the first (iWARP takes exactly one).
func (w *cWQ) setSend(i int, wr *verbs.SendWR, opcode uint32, flags uint32) {
	in := &w.in[i]
	in.wr_id = C.uint64_t(wr.ID)
	in.remote_addr = C.uint64_t(wr.RemoteAddr)
	in.compare_add = C.uint64_t(wr.CompareAdd)
	in.swap = C.uint64_t(wr.Swap)
	in.rkey = C.uint32_t(wr.RKey)
	in.imm = C.uint32_t(wr.Imm)
	in.opcode = C.uint32_t(opcode)
	in.flags = C.uint32_t(flags)
	sg := w.sges[i*w.sge : i*w.sge+len(wr.SGL)]
	n := 0
	for j := range wr.SGL {
		if wr.SGL[j].Length == 0 {
			continue
		}
		sg[n].addr = C.uint64_t(wr.SGL[j].Addr)
		sg[n].length = C.uint32_t(wr.SGL[j].Length)
		sg[n].lkey = C.uint32_t(wr.SGL[j].LKey)
		n++
	}
	if n == 0 && len(wr.SGL) > 0 && wr.Opcode == verbs.OpRead {
		sg[0].addr = C.uint64_t(wr.SGL[0].Addr)
		sg[0].length = 0
		sg[0].lkey = C.uint32_t(wr.SGL[0].LKey)
		n = 1
	}
	in.num_sge = C.uint32_t(n)
}

// setReadPart fills slot i with part of the one-SGE Read wr: n bytes from
// offset off of both its local SGE and its remote range, with id and flags.
func (w *cWQ) setReadPart(i int, wr *verbs.SendWR, id uint64, flags uint32, off, n uint32) {
	in := &w.in[i]
	in.wr_id = C.uint64_t(id)
	in.remote_addr = C.uint64_t(wr.RemoteAddr + uint64(off))
	in.compare_add, in.swap, in.imm = 0, 0, 0
	in.rkey = C.uint32_t(wr.RKey)
	in.opcode = C.uint32_t(ibvWROpRead)
	in.flags = C.uint32_t(flags)
	in.num_sge = 1
	sg := &w.sges[i*w.sge]
	sg.addr = C.uint64_t(wr.SGL[0].Addr + uint64(off))
	sg.length = C.uint32_t(n)
	sg.lkey = C.uint32_t(wr.SGL[0].LKey)
}

// sendSlot returns what slot i holds (for tests): id, opcode, flags,
// remote address and its SGEs.
func (w *cWQ) sendSlot(i int) (id uint64, opcode, flags uint32, raddr uint64, sges []verbs.SGE) {
	in := &w.in[i]
	for j := 0; j < int(in.num_sge); j++ {
		s := w.sges[i*w.sge+j]
		sges = append(sges, verbs.SGE{Addr: uint64(s.addr), Length: uint32(s.length), LKey: uint32(s.lkey)})
	}
	return uint64(in.wr_id), uint32(in.opcode), uint32(in.flags), uint64(in.remote_addr), sges
}

func (w *cWQ) setRecv(i int, wr *verbs.RecvWR) {
	in := &w.in[i]
	in.wr_id = C.uint64_t(wr.ID)
	in.num_sge = C.uint32_t(len(wr.SGL))
	sg := w.sges[i*w.sge : i*w.sge+len(wr.SGL)]
	for j := range wr.SGL {
		sg[j].addr = C.uint64_t(wr.SGL[j].Addr)
		sg[j].length = C.uint32_t(wr.SGL[j].Length)
		sg[j].lkey = C.uint32_t(wr.SGL[j].LKey)
	}
}

// postSend posts slots [0,n) as one chain; on failure it returns the index
// of the refused work request and the errno.
func (w *cWQ) postSend(n int) (int, syscall.Errno) {
	if r := C.rk_post_send(w.q, C.int(n)); r != 0 {
		return int(w.q.bad), syscall.Errno(r)
	}
	return 0, 0
}

func (w *cWQ) postRecv(n int, srq bool) (int, syscall.Errno) {
	s := C.int(0)
	if srq {
		s = 1
	}
	if r := C.rk_post_recv(w.q, C.int(n), s); r != 0 {
		return int(w.q.bad), syscall.Errno(r)
	}
	return 0, 0
}

// ---------------------------------------------------------------- QP, SRQ

type cQP struct {
	p *C.struct_ibv_qp
}

func (pd *cPD) createQP(scq, rcq *cCQ, srq *cSRQ, id uint64, sigAll bool, cp *verbs.QPCap) (*cQP, error) {
	caps := [5]C.uint32_t{C.uint32_t(cp.MaxSendWR), C.uint32_t(cp.MaxRecvWR), C.uint32_t(cp.MaxSendSGE),
		C.uint32_t(cp.MaxRecvSGE), C.uint32_t(cp.MaxInlineData)}
	var s *C.struct_ibv_srq
	if srq != nil {
		s = srq.p
	}
	sig := C.int(0)
	if sigAll {
		sig = 1
	}
	p, err := C.rk_create_qp(pd.p, scq.c.cq, rcq.c.cq, s, C.uint64_t(id), sig, &caps[0])
	if p == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		return nil, err
	}
	cp.MaxSendWR, cp.MaxRecvWR, cp.MaxSendSGE = int(caps[0]), int(caps[1]), int(caps[2])
	cp.MaxRecvSGE, cp.MaxInlineData = int(caps[3]), int(caps[4])
	return &cQP{p: p}, nil
}

func (q *cQP) num() uint32             { return uint32(q.p.qp_num) }
func (q *cQP) ptr() unsafe.Pointer     { return unsafe.Pointer(q.p) }
func (q *cQP) destroy() error          { return rcErr(C.ibv_destroy_qp(q.p)) }
func (q *cQP) modifyState(s int) error { return rcErr(C.rk_modify_state(q.p, C.int(s))) }

func (q *cQP) modifyInit(port uint8, access verbs.Access, iwarp bool) error {
	iw := C.int(0)
	if iwarp {
		iw = 1
	}
	return rcErr(C.rk_modify_init(q.p, C.uint8_t(port), C.uint32_t(access), iw))
}

type rtrAttr struct {
	destQPN, rqPSN               uint32
	mtu, maxDestRd, minRNR, port uint8
	global                       bool
	sgid, hopLimit, sl, tclass   uint8
	dlid                         uint16
	dgid                         [16]byte
}

func (q *cQP) modifyRTR(a *rtrAttr) error {
	var r C.struct_rk_rtr
	r.dest_qpn, r.rq_psn = C.uint32_t(a.destQPN), C.uint32_t(a.rqPSN)
	r.path_mtu, r.max_dest_rd_atomic, r.min_rnr_timer, r.port = C.uint8_t(a.mtu), C.uint8_t(a.maxDestRd), C.uint8_t(a.minRNR), C.uint8_t(a.port)
	if a.global {
		r.is_global = 1
	}
	r.sgid_index, r.hop_limit, r.dlid = C.uint8_t(a.sgid), C.uint8_t(a.hopLimit), C.uint16_t(a.dlid)
	r.sl, r.traffic_class = C.uint8_t(a.sl), C.uint8_t(a.tclass)
	for i, b := range a.dgid {
		r.dgid[i] = C.uint8_t(b)
	}
	return rcErr(C.rk_modify_rtr(q.p, &r))
}

func (q *cQP) modifyRTS(psn uint32, timeout, retry, rnr, maxRd uint8, fromRTR bool) error {
	var r C.struct_rk_rts
	r.sq_psn = C.uint32_t(psn)
	r.timeout, r.retry_cnt, r.rnr_retry, r.max_rd_atomic = C.uint8_t(timeout), C.uint8_t(retry), C.uint8_t(rnr), C.uint8_t(maxRd)
	f := C.int(0)
	if fromRTR {
		f = 1
	}
	return rcErr(C.rk_modify_rts(q.p, &r, f))
}

// queryState returns the ibv_qp_state (IBV_QPS_*), or -1.
func (q *cQP) queryState() int {
	s := int(C.rk_query_state(q.p))
	if s < 0 {
		return -1
	}
	return s
}

type cSRQ struct{ p *C.struct_ibv_srq }

func (pd *cPD) createSRQ(maxWR, maxSGE int) (*cSRQ, int, int, error) {
	w, s := C.uint32_t(maxWR), C.uint32_t(maxSGE)
	p, err := C.rk_create_srq(pd.p, &w, &s)
	if p == nil {
		if err == nil {
			err = syscall.EINVAL
		}
		return nil, 0, 0, err
	}
	return &cSRQ{p}, int(w), int(s), nil
}

func (s *cSRQ) ptr() unsafe.Pointer { return unsafe.Pointer(s.p) }
func (s *cSRQ) destroy() error      { return rcErr(C.ibv_destroy_srq(s.p)) }

// ---------------------------------------------------------------- rdma_cm

type cCMChannel struct{ p *C.struct_rdma_event_channel }

func newCMChannel() (*cCMChannel, error) {
	p, err := C.rdma_create_event_channel()
	if p == nil {
		if err == nil {
			err = syscall.ENODEV
		}
		return nil, fmt.Errorf("rdma_create_event_channel: %w (is rdma_ucm loaded? /dev/infiniband/rdma_cm must exist)", err)
	}
	if err := errnoErr(C.rk_set_nonblock(p.fd)); err != nil {
		C.rdma_destroy_event_channel(p)
		return nil, err
	}
	return &cCMChannel{p}, nil
}

func (ch *cCMChannel) fd() int  { return int(ch.p.fd) }
func (ch *cCMChannel) destroy() { C.rdma_destroy_event_channel(ch.p) }

type cmEvent struct {
	idCtx       uint64
	newID       *cCMID
	event       int
	status      int
	qpNum       uint32
	respRes     uint8
	initDepth   uint8
	privateData []byte
}

// event takes one rdma_cm event (already acknowledged); ok is false when
// none is pending.
func (ch *cCMChannel) event() (cmEvent, bool) {
	var e C.struct_rk_cm_event
	if C.rk_cm_get_event(ch.p, &e) != 0 {
		return cmEvent{}, false
	}
	ev := cmEvent{idCtx: uint64(e.id_ctx), event: int(e.event), status: int(e.status), qpNum: uint32(e.qp_num),
		respRes: uint8(e.responder_resources), initDepth: uint8(e.initiator_depth)}
	if e.new_id != nil {
		ev.newID = &cCMID{p: e.new_id}
	}
	if e.pdata_len > 0 {
		ev.privateData = C.GoBytes(unsafe.Pointer(&e.pdata[0]), C.int(e.pdata_len))
	}
	return ev, true
}

type cCMID struct{ p *C.struct_rdma_cm_id }

func (ch *cCMChannel) createID(ctx uint64) (*cCMID, error) {
	p, err := C.rk_cm_create_id(ch.p, C.uint64_t(ctx))
	if p == nil {
		return nil, fmt.Errorf("rdma_create_id: %v", err)
	}
	return &cCMID{p}, nil
}

func ip16(ip net.IP) (*C.uint8_t, func(), bool) {
	b := ip.To16()
	v4 := ip.To4() != nil
	p := (*C.uint8_t)(C.CBytes(b))
	return p, func() { C.free(unsafe.Pointer(p)) }, v4
}

// bind binds id to ip:port and, when backlog >= 0, listens; it returns the
// bound port.
func (id *cCMID) bind(ip net.IP, port uint16, backlog int) (uint16, error) {
	p, free, v4 := ip16(ip)
	defer free()
	cport := C.uint16_t(port)
	iv := C.int(0)
	if v4 {
		iv = 1
	}
	if err := errnoErr(C.rk_cm_bind_listen(id.p, p, iv, C.int(backlog), &cport)); err != nil {
		return 0, err
	}
	return uint16(cport), nil
}

func (id *cCMID) resolveAddr(src, dst net.IP, port uint16, timeoutMS int) error {
	d, freeD, v4 := ip16(dst)
	defer freeD()
	var s *C.uint8_t
	if src != nil {
		var freeS func()
		s, freeS, _ = ip16(src)
		defer freeS()
	}
	iv := C.int(0)
	if v4 {
		iv = 1
	}
	return errnoErr(C.rk_cm_resolve(id.p, s, d, iv, C.uint16_t(port), C.int(timeoutMS)))
}

func (id *cCMID) resolveRoute(timeoutMS int) error {
	return errnoErr(C.rk_cm_resolve_route(id.p, C.int(timeoutMS)))
}

// connect (accept=false) or accept a connection for QP number qpn.
func (id *cCMID) connect(qpn uint32, rdAtom, initDepth uint8, pdata []byte, accept bool) error {
	var p unsafe.Pointer
	if len(pdata) > 0 {
		p = C.CBytes(pdata)
		defer C.free(p)
	}
	a := C.int(0)
	if accept {
		a = 1
	}
	return errnoErr(C.rk_cm_connect(id.p, C.uint32_t(qpn), C.uint8_t(rdAtom), C.uint8_t(initDepth), p, C.int(len(pdata)), a))
}

func (id *cCMID) establish() error {
	if C.rdma_establish(id.p) != 0 {
		return fmt.Errorf("rdma_establish failed")
	}
	return nil
}

func (id *cCMID) reject() { C.rdma_reject(id.p, nil, 0) }

func (id *cCMID) disconnect() { C.rdma_disconnect(id.p) }

func (id *cCMID) destroy() { C.rdma_destroy_id(id.p) }

func (id *cCMID) setContext(ctx uint64) { C.rk_cm_set_context(id.p, C.uint64_t(ctx)) }

// deviceName names the verbs device the id is bound to ("" if none yet).
func (id *cCMID) deviceName() string { return C.GoString(C.rk_cm_dev_name(id.p)) }

// initQP moves qp to state (IBV_QPS_*) with the attributes rdma_cm derives
// for the id (path, GIDs, PSNs, QP numbers).
func (id *cCMID) initQP(qp *cQP, state int, rdAtom uint8) error {
	return errnoErr(C.rk_cm_init_qp(id.p, qp.p, C.int(state), C.uint8_t(rdAtom)))
}

// deviceForIP names the device rdma_cm uses for ip: the one that owns it
// (bindOnly) or the one that routes to it.
func deviceForIP(ip net.IP, bindOnly bool, timeoutMS int) (string, error) {
	p, free, v4 := ip16(ip)
	defer free()
	var buf [C.IBV_SYSFS_NAME_MAX]C.char
	iv, bo := C.int(0), C.int(0)
	if v4 {
		iv = 1
	}
	if bindOnly {
		bo = 1
	}
	if err := errnoErr(C.rk_cm_device_for(p, iv, bo, C.int(timeoutMS), &buf[0], C.int(len(buf)))); err != nil {
		return "", err
	}
	return C.GoString(&buf[0]), nil
}

// IBV constants the Go side needs.
const (
	ibvQPSReset = int(C.IBV_QPS_RESET)
	ibvQPSInit  = int(C.IBV_QPS_INIT)
	ibvQPSRTR   = int(C.IBV_QPS_RTR)
	ibvQPSRTS   = int(C.IBV_QPS_RTS)
	ibvQPSErr   = int(C.IBV_QPS_ERR)

	ibvNodeCA   = int(C.IBV_NODE_CA)
	ibvNodeRNIC = int(C.IBV_NODE_RNIC)

	ibvTransportIWARP = int(C.IBV_TRANSPORT_IWARP)

	ibvLinkIB  = int(C.IBV_LINK_LAYER_INFINIBAND)
	ibvLinkEth = int(C.IBV_LINK_LAYER_ETHERNET)

	ibvEventCQErr = int(C.IBV_EVENT_CQ_ERR)

	ibvEventQPFatal     = int(C.IBV_EVENT_QP_FATAL)
	ibvEventQPReqErr    = int(C.IBV_EVENT_QP_REQ_ERR)
	ibvEventQPAccessErr = int(C.IBV_EVENT_QP_ACCESS_ERR)

	cmAddrResolved  = int(C.RDMA_CM_EVENT_ADDR_RESOLVED)
	cmAddrError     = int(C.RDMA_CM_EVENT_ADDR_ERROR)
	cmRouteResolved = int(C.RDMA_CM_EVENT_ROUTE_RESOLVED)
	cmRouteError    = int(C.RDMA_CM_EVENT_ROUTE_ERROR)
	cmConnRequest   = int(C.RDMA_CM_EVENT_CONNECT_REQUEST)
	cmConnResponse  = int(C.RDMA_CM_EVENT_CONNECT_RESPONSE)
	cmConnError     = int(C.RDMA_CM_EVENT_CONNECT_ERROR)
	cmUnreachable   = int(C.RDMA_CM_EVENT_UNREACHABLE)
	cmRejected      = int(C.RDMA_CM_EVENT_REJECTED)
	cmEstablished   = int(C.RDMA_CM_EVENT_ESTABLISHED)
	cmDisconnected  = int(C.RDMA_CM_EVENT_DISCONNECTED)
	cmDeviceRemoval = int(C.RDMA_CM_EVENT_DEVICE_REMOVAL)
	cmTimewaitExit  = int(C.RDMA_CM_EVENT_TIMEWAIT_EXIT)

	ibvWROpWrite    = uint32(C.IBV_WR_RDMA_WRITE)
	ibvWROpWriteImm = uint32(C.IBV_WR_RDMA_WRITE_WITH_IMM)
	ibvWROpSend     = uint32(C.IBV_WR_SEND)
	ibvWROpSendImm  = uint32(C.IBV_WR_SEND_WITH_IMM)
	ibvWROpRead     = uint32(C.IBV_WR_RDMA_READ)
	ibvWROpCAS      = uint32(C.IBV_WR_ATOMIC_CMP_AND_SWP)
	ibvWROpFAA      = uint32(C.IBV_WR_ATOMIC_FETCH_AND_ADD)
)

// cmEventName is rdma_event_str.
func cmEventName(e int) string { return C.GoString(C.rdma_event_str(C.enum_rdma_cm_event_type(e))) }

func isFatalQPEvent(t int) bool {
	return t == ibvEventQPFatal || t == ibvEventQPReqErr || t == ibvEventQPAccessErr
}
