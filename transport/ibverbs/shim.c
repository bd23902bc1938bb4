//go:build ibverbs

// shim.c: see shim.h.
#include "shim.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

int rk_nop(void) { return 0; }

int rk_device_count(void)
{
	int n = 0;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l)
		return -errno;
	ibv_free_device_list(l);
	return n;
}

int rk_device_name(int i, char *buf, int n)
{
	int cnt = 0;
	struct ibv_device **l = ibv_get_device_list(&cnt);
	if (!l)
		return -errno;
	if (i >= cnt) {
		ibv_free_device_list(l);
		return -ENODEV;
	}
	strncpy(buf, ibv_get_device_name(l[i]), n - 1);
	buf[n - 1] = 0;
	ibv_free_device_list(l);
	return 0;
}

struct ibv_context *rk_open(const char *name)
{
	int cnt = 0, i;
	struct ibv_context *ctx = NULL;
	struct ibv_device **l = ibv_get_device_list(&cnt);
	if (!l)
		return NULL;
	errno = ENODEV;
	for (i = 0; i < cnt; i++) {
		if (strcmp(ibv_get_device_name(l[i]), name) == 0) {
			ctx = ibv_open_device(l[i]);
			break;
		}
	}
	ibv_free_device_list(l);
	return ctx;
}

int rk_query_device(struct ibv_context *ctx, struct rk_dev_attr *o)
{
	struct ibv_device_attr a;
	int rc = ibv_query_device(ctx, &a);
	if (rc)
		return rc;
	memset(o, 0, sizeof(*o));
	memcpy(o->fw_ver, a.fw_ver, sizeof(o->fw_ver) < sizeof(a.fw_ver) ? sizeof(o->fw_ver) : sizeof(a.fw_ver));
	o->fw_ver[sizeof(o->fw_ver) - 1] = 0;
	o->node_guid = be64toh(a.node_guid);
	o->max_mr_size = a.max_mr_size;
	o->vendor_id = a.vendor_id;
	o->vendor_part_id = a.vendor_part_id;
	o->max_qp = a.max_qp;
	o->max_qp_wr = a.max_qp_wr;
	o->max_sge = a.max_sge;
	o->max_sge_rd = a.max_sge_rd;
	o->max_cq = a.max_cq;
	o->max_cqe = a.max_cqe;
	o->max_mr = a.max_mr;
	o->max_pd = a.max_pd;
	o->max_qp_rd_atom = a.max_qp_rd_atom;
	o->max_qp_init_rd_atom = a.max_qp_init_rd_atom;
	o->max_srq = a.max_srq;
	o->max_srq_wr = a.max_srq_wr;
	o->max_srq_sge = a.max_srq_sge;
	o->atomic_cap = a.atomic_cap;
	o->phys_port_cnt = a.phys_port_cnt;
	o->node_type = ctx->device->node_type;
	o->transport_type = ctx->device->transport_type;
	return 0;
}

int rk_query_port(struct ibv_context *ctx, uint8_t port, struct rk_port_attr *o)
{
	struct ibv_port_attr a;
	/* The verbs.h macro: the provider's query_port with the full struct. */
	int rc = ibv_query_port(ctx, port, &a);
	if (rc)
		return rc;
	o->state = a.state;
	o->max_mtu = a.max_mtu;
	o->active_mtu = a.active_mtu;
	o->gid_tbl_len = a.gid_tbl_len;
	o->link_layer = a.link_layer;
	o->max_msg_sz = a.max_msg_sz;
	o->lid = a.lid;
	return 0;
}

int rk_query_gids(struct ibv_context *ctx, uint8_t port, int tbl_len, struct rk_gid *out, int max)
{
	int n = 0, i;
	size_t cap = 4096;
	struct ibv_gid_entry *e = calloc(cap, sizeof(*e));
	ssize_t got = e ? ibv_query_gid_table(ctx, e, cap, 0) : -ENOMEM;
	if (got >= 0) {
		for (i = 0; i < got && n < max; i++) {
			if (e[i].port_num != port)
				continue;
			memcpy(out[n].raw, e[i].gid.raw, 16);
			out[n].index = e[i].gid_index;
			out[n].type = e[i].gid_type;
			out[n].ifindex = e[i].ndev_ifindex;
			n++;
		}
		free(e);
		return n;
	}
	free(e);
	/* Older kernels or providers without the GID table ioctl. */
	for (i = 0; i < tbl_len && n < max; i++) {
		union ibv_gid g;
		static const uint8_t zero[16];
		if (ibv_query_gid(ctx, port, i, &g))
			break;
		if (memcmp(g.raw, zero, 16) == 0)
			continue;
		memcpy(out[n].raw, g.raw, 16);
		out[n].index = i;
		out[n].type = 0xff;
		out[n].ifindex = 0;
		n++;
	}
	return n;
}

int rk_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int rk_get_cq_event(struct ibv_comp_channel *ch, uint64_t *cq_ctx)
{
	struct ibv_cq *cq;
	void *c;
	if (ibv_get_cq_event(ch, &cq, &c))
		return -errno;
	*cq_ctx = (uint64_t)(uintptr_t)c;
	ibv_ack_cq_events(cq, 1);
	return 0;
}

int rk_get_async_event(struct ibv_context *ctx, int *type, uint64_t *obj)
{
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return -errno;
	*type = ev.event_type;
	*obj = 0;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		*obj = (uint64_t)(uintptr_t)ev.element.cq->cq_context;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		*obj = (uint64_t)(uintptr_t)ev.element.qp->qp_context;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_GID_CHANGE:
		*obj = (uint64_t)ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

struct ibv_cq *rk_create_cq(struct ibv_context *ctx, int cqe, uint64_t cq_ctx, struct ibv_comp_channel *ch)
{
	return ibv_create_cq(ctx, cqe, (void *)(uintptr_t)cq_ctx, ch, 0);
}

int rk_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

int rk_poll(struct rk_cq *c, int n)
{
	int i, got;
	if (n > c->max)
		n = c->max;
	got = ibv_poll_cq(c->cq, n, c->tmp);
	for (i = 0; i < got; i++) {
		struct ibv_wc *w = &c->tmp[i];
		struct rk_wc *o = &c->out[i];
		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->byte_len = w->byte_len;
		o->imm = (w->wc_flags & IBV_WC_WITH_IMM) ? ntohl(w->imm_data) : 0;
		o->flags = w->wc_flags;
		o->qp_num = w->qp_num;
		o->src_qp = w->src_qp;
		o->vendor_err = w->vendor_err;
	}
	return got;
}

struct ibv_qp *rk_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq,
			    uint64_t qp_ctx, int sig_all, uint32_t *caps)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;
	memset(&a, 0, sizeof(a));
	a.qp_context = (void *)(uintptr_t)qp_ctx;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = sig_all;
	a.cap.max_send_wr = caps[0];
	a.cap.max_recv_wr = srq ? 0 : caps[1];
	a.cap.max_send_sge = caps[2];
	a.cap.max_recv_sge = srq ? 0 : caps[3];
	a.cap.max_inline_data = caps[4];
	qp = ibv_create_qp(pd, &a);
	if (!qp)
		return NULL;
	caps[0] = a.cap.max_send_wr;
	caps[1] = a.cap.max_recv_wr;
	caps[2] = a.cap.max_send_sge;
	caps[3] = a.cap.max_recv_sge;
	caps[4] = a.cap.max_inline_data;
	return qp;
}

int rk_modify_init(struct ibv_qp *qp, uint8_t port, uint32_t access, int iwarp)
{
	struct ibv_qp_attr a;
	int mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.qp_access_flags = access;
	if (!iwarp) {
		a.pkey_index = 0;
		a.port_num = port;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	}
	return ibv_modify_qp(qp, &a, mask);
}

int rk_modify_rtr(struct ibv_qp *qp, struct rk_rtr *r)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = r->path_mtu;
	a.dest_qp_num = r->dest_qpn;
	a.rq_psn = r->rq_psn;
	a.max_dest_rd_atomic = r->max_dest_rd_atomic;
	a.min_rnr_timer = r->min_rnr_timer;
	a.ah_attr.is_global = r->is_global;
	a.ah_attr.dlid = r->dlid;
	a.ah_attr.sl = r->sl;
	a.ah_attr.src_path_bits = 0;
	a.ah_attr.port_num = r->port;
	if (r->is_global) {
		memcpy(a.ah_attr.grh.dgid.raw, r->dgid, 16);
		a.ah_attr.grh.sgid_index = r->sgid_index;
		a.ah_attr.grh.hop_limit = r->hop_limit;
		a.ah_attr.grh.traffic_class = r->traffic_class;
		a.ah_attr.grh.flow_label = 0;
	}
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int rk_modify_rts(struct ibv_qp *qp, struct rk_rts *r, int from_rtr)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	if (!from_rtr)
		return ibv_modify_qp(qp, &a, IBV_QP_STATE);
	a.sq_psn = r->sq_psn;
	a.timeout = r->timeout;
	a.retry_cnt = r->retry_cnt;
	a.rnr_retry = r->rnr_retry;
	a.max_rd_atomic = r->max_rd_atomic;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				     IBV_QP_MAX_QP_RD_ATOMIC);
}

int rk_modify_state(struct ibv_qp *qp, int state)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

int rk_query_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
	if (rc)
		return -rc;
	return a.qp_state;
}

int rk_post_send(struct rk_wq *q, int n)
{
	int i;
	struct ibv_send_wr *badwr = NULL;
	struct ibv_qp *qp = q->qp;
	int rc;
	for (i = 0; i < n; i++) {
		struct rk_swr *in = &q->in[i];
		struct ibv_send_wr *w = &q->swrs[i];
		w->wr_id = in->wr_id;
		w->next = i + 1 < n ? &q->swrs[i + 1] : NULL;
		w->sg_list = &q->sges[(size_t)i * q->max_sge];
		w->num_sge = in->num_sge;
		w->opcode = in->opcode;
		w->send_flags = in->flags;
		w->imm_data = htonl(in->imm);
		switch (in->opcode) {
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_WRITE_WITH_IMM:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = in->remote_addr;
			w->wr.rdma.rkey = in->rkey;
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			w->wr.atomic.remote_addr = in->remote_addr;
			w->wr.atomic.rkey = in->rkey;
			w->wr.atomic.compare_add = in->compare_add;
			w->wr.atomic.swap = in->swap;
			break;
		default:
			break;
		}
	}
	rc = ibv_post_send(qp, q->swrs, &badwr);
	q->bad = (rc && badwr) ? (int)(badwr - q->swrs) : 0;
	return rc;
}

int rk_post_recv(struct rk_wq *q, int n, int srq)
{
	int i, rc;
	struct ibv_recv_wr *badwr = NULL;
	for (i = 0; i < n; i++) {
		struct ibv_recv_wr *w = &q->rwrs[i];
		w->wr_id = q->in[i].wr_id;
		w->next = i + 1 < n ? &q->rwrs[i + 1] : NULL;
		w->sg_list = &q->sges[(size_t)i * q->max_sge];
		w->num_sge = q->in[i].num_sge;
	}
	if (srq)
		rc = ibv_post_srq_recv((struct ibv_srq *)q->qp, q->rwrs, &badwr);
	else
		rc = ibv_post_recv((struct ibv_qp *)q->qp, q->rwrs, &badwr);
	q->bad = (rc && badwr) ? (int)(badwr - q->rwrs) : 0;
	return rc;
}

struct ibv_mr *rk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr(pd, addr, len, access);
}

struct ibv_mr *rk_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access)
{
	return ibv_reg_dmabuf_mr(pd, off, len, iova, fd, access);
}

struct ibv_srq *rk_create_srq(struct ibv_pd *pd, uint32_t *max_wr, uint32_t *max_sge)
{
	struct ibv_srq_init_attr a;
	struct ibv_srq *s;
	memset(&a, 0, sizeof(a));
	a.attr.max_wr = *max_wr;
	a.attr.max_sge = *max_sge;
	s = ibv_create_srq(pd, &a);
	if (s) {
		*max_wr = a.attr.max_wr;
		*max_sge = a.attr.max_sge;
	}
	return s;
}

/* ---------------------------------------------------------------- rdma_cm */

struct rdma_cm_id *rk_cm_create_id(struct rdma_event_channel *ch, uint64_t ctx)
{
	struct rdma_cm_id *id = NULL;
	if (rdma_create_id(ch, &id, (void *)(uintptr_t)ctx, RDMA_PS_TCP))
		return NULL;
	return id;
}

static socklen_t rk_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip16, int v4, uint16_t port)
{
	memset(ss, 0, sizeof(*ss));
	if (v4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(port);
		memcpy(&s->sin_addr, ip16 + 12, 4);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons(port);
	memcpy(&s6->sin6_addr, ip16, 16);
	return sizeof(*s6);
}

int rk_cm_bind_listen(struct rdma_cm_id *id, const uint8_t *ip16, int v4, int backlog, uint16_t *port)
{
	struct sockaddr_storage ss;
	rk_sockaddr(&ss, ip16, v4, *port);
	if (rdma_bind_addr(id, (struct sockaddr *)&ss))
		return -errno;
	if (backlog >= 0 && rdma_listen(id, backlog))
		return -errno;
	*port = ntohs(rdma_get_src_port(id));
	return 0;
}

int rk_cm_resolve(struct rdma_cm_id *id, const uint8_t *src16, const uint8_t *dst16, int v4, uint16_t port, int timeout_ms)
{
	struct sockaddr_storage src, dst;
	rk_sockaddr(&dst, dst16, v4, port);
	if (src16)
		rk_sockaddr(&src, src16, v4, 0);
	if (rdma_resolve_addr(id, src16 ? (struct sockaddr *)&src : NULL, (struct sockaddr *)&dst, timeout_ms))
		return -errno;
	return 0;
}

int rk_cm_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	if (rdma_resolve_route(id, timeout_ms))
		return -errno;
	return 0;
}

int rk_cm_connect(struct rdma_cm_id *id, uint32_t qpn, uint8_t rd_atom, uint8_t init_depth, const void *pdata, int plen, int accept)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdata;
	p.private_data_len = plen;
	p.responder_resources = rd_atom;
	p.initiator_depth = init_depth;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	p.qp_num = qpn;
	if (accept)
		return rdma_accept(id, &p) ? -errno : 0;
	return rdma_connect(id, &p) ? -errno : 0;
}

int rk_cm_get_event(struct rdma_event_channel *ch, struct rk_cm_event *o)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		return -errno;
	memset(o, 0, sizeof(*o));
	o->event = e->event;
	o->status = e->status;
	if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		o->id_ctx = (uint64_t)(uintptr_t)e->listen_id->context;
		o->new_id = e->id;
	} else {
		o->id_ctx = (uint64_t)(uintptr_t)e->id->context;
	}
	if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST || e->event == RDMA_CM_EVENT_CONNECT_RESPONSE ||
	    e->event == RDMA_CM_EVENT_ESTABLISHED || e->event == RDMA_CM_EVENT_REJECTED) {
		const struct rdma_conn_param *c = &e->param.conn;
		o->qp_num = c->qp_num;
		o->responder_resources = c->responder_resources;
		o->initiator_depth = c->initiator_depth;
		if (c->private_data && c->private_data_len) {
			int n = c->private_data_len > 64 ? 64 : c->private_data_len;
			memcpy(o->pdata, c->private_data, n);
			o->pdata_len = n;
		}
	}
	rdma_ack_cm_event(e);
	return 0;
}

void rk_cm_set_context(struct rdma_cm_id *id, uint64_t ctx) { id->context = (void *)(uintptr_t)ctx; }

int rk_cm_init_qp(struct rdma_cm_id *id, struct ibv_qp *qp, int state, uint8_t rd_atom)
{
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = state;
	if (rdma_init_qp_attr(id, &a, &mask))
		return -errno;
	if (state == IBV_QPS_RTR && rd_atom)
		a.max_dest_rd_atomic = rd_atom;
	if (state == IBV_QPS_RTS && rd_atom)
		a.max_rd_atomic = rd_atom;
	return -ibv_modify_qp(qp, &a, mask);
}

const char *rk_cm_dev_name(struct rdma_cm_id *id)
{
	if (!id->verbs)
		return "";
	return ibv_get_device_name(id->verbs->device);
}

/* rk_cm_device_for names the verbs device that rdma_cm picks for an address:
 * the one that owns it (bind_only) or the one that routes to it. Blocking,
 * on a private event channel. */
int rk_cm_device_for(const uint8_t *ip16, int v4, int bind_only, int timeout_ms, char *name, int n)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	struct sockaddr_storage ss;
	int rc = 0;
	if (!ch)
		return -errno;
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		rc = -errno;
		goto out;
	}
	rk_sockaddr(&ss, ip16, v4, 0);
	if (bind_only) {
		if (rdma_bind_addr(id, (struct sockaddr *)&ss))
			rc = -errno;
	} else if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms)) {
		rc = -errno;
	} else {
		struct rdma_cm_event *e;
		if (rdma_get_cm_event(ch, &e)) {
			rc = -errno;
		} else {
			if (e->event != RDMA_CM_EVENT_ADDR_RESOLVED)
				rc = e->status ? (e->status < 0 ? e->status : -e->status) : -EHOSTUNREACH;
			rdma_ack_cm_event(e);
		}
	}
	if (!rc) {
		if (!id->verbs) {
			rc = -ENODEV;
		} else {
			strncpy(name, ibv_get_device_name(id->verbs->device), n - 1);
			name[n - 1] = 0;
		}
	}
	rdma_destroy_id(id);
out:
	rdma_destroy_event_channel(ch);
	return rc;
}
