// shim.h: the C side of transport/ibverbs (build tag ibverbs).
//
// One thin function per verb. Each calls the real libibverbs/librdmacm entry
// point the way rdma-core's own headers do, so none of the compat symbols
// are reached from Go: ibv_query_port is a macro in verbs.h that calls the
// provider's query_port with the full struct ibv_port_attr (the exported
// ibv_query_port symbol fills an older, shorter struct); ibv_post_send,
// ibv_poll_cq and ibv_req_notify_cq are static inlines that jump through the
// provider's ops table, which cgo cannot call directly.
//
// Work requests and completions cross the boundary in flat structs (rk_swr,
// rk_wc) without unions; the shim builds the linked ibv_send_wr chain in
// memory preallocated per queue pair, so one PostSend is one cgo call and
// one ibv_post_send.
#ifndef RDMAKIT_IBVERBS_SHIM_H
#define RDMAKIT_IBVERBS_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

struct rk_swr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint64_t compare_add;
	uint64_t swap;
	uint32_t rkey;
	uint32_t imm; /* host order; the shim converts to network order */
	uint32_t opcode;
	uint32_t flags;
	uint32_t num_sge;
	uint32_t pad;
};

/* A send (or receive) queue's preallocated C memory. */
struct rk_wq {
	void *qp; /* struct ibv_qp * or, for an SRQ, struct ibv_srq * */
	struct rk_swr *in;
	struct ibv_send_wr *swrs;
	struct ibv_recv_wr *rwrs;
	struct ibv_sge *sges;
	int max_wr;
	int max_sge;
	int bad; /* index of the refused work request after a failed post */
};

struct rk_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t imm; /* host order */
	uint32_t flags;
	uint32_t qp_num;
	uint32_t src_qp;
	uint32_t vendor_err;
};

struct rk_cq {
	struct ibv_cq *cq;
	struct ibv_wc *tmp;
	struct rk_wc *out;
	int max;
};

struct rk_dev_attr {
	char fw_ver[64];
	uint64_t node_guid;
	uint64_t max_mr_size;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	int max_qp, max_qp_wr, max_sge, max_sge_rd, max_cq, max_cqe, max_mr, max_pd;
	int max_qp_rd_atom, max_qp_init_rd_atom, max_srq, max_srq_wr, max_srq_sge;
	int atomic_cap;
	int phys_port_cnt;
	int node_type;
	int transport_type;
};

struct rk_port_attr {
	int state, max_mtu, active_mtu, gid_tbl_len, link_layer;
	uint32_t max_msg_sz;
	uint16_t lid;
};

struct rk_gid {
	uint8_t raw[16];
	uint32_t index;
	uint32_t type; /* IBV_GID_TYPE_* */
	uint32_t ifindex;
};

struct rk_rtr {
	uint32_t dest_qpn, rq_psn;
	uint8_t path_mtu, max_dest_rd_atomic, min_rnr_timer, port;
	uint8_t is_global, sgid_index, hop_limit, sl;
	uint16_t dlid;
	uint8_t traffic_class, pad;
	uint8_t dgid[16];
};

struct rk_rts {
	uint32_t sq_psn;
	uint8_t timeout, retry_cnt, rnr_retry, max_rd_atomic;
};

struct rk_cm_event {
	uint64_t id_ctx;     /* context of the id the event is for (listener for a request) */
	struct rdma_cm_id *new_id; /* of a connect request */
	int event;
	int status;
	uint32_t qp_num;     /* remote QP number (connect request / response) */
	uint8_t responder_resources, initiator_depth, pdata_len, pad;
	uint8_t pdata[64];
};

int rk_nop(void);
int rk_device_count(void);
int rk_device_name(int i, char *buf, int n);
struct ibv_context *rk_open(const char *name);
int rk_query_device(struct ibv_context *ctx, struct rk_dev_attr *out);
int rk_query_port(struct ibv_context *ctx, uint8_t port, struct rk_port_attr *out);
int rk_query_gids(struct ibv_context *ctx, uint8_t port, int tbl_len, struct rk_gid *out, int max);

int rk_set_nonblock(int fd);
int rk_get_cq_event(struct ibv_comp_channel *ch, uint64_t *cq_ctx);
int rk_get_async_event(struct ibv_context *ctx, int *type, uint64_t *obj_ctx);

struct ibv_cq *rk_create_cq(struct ibv_context *ctx, int cqe, uint64_t cq_ctx, struct ibv_comp_channel *ch);
int rk_req_notify(struct ibv_cq *cq);
int rk_poll(struct rk_cq *c, int n);

struct ibv_qp *rk_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq,
			    uint64_t qp_ctx, int sig_all, uint32_t *caps /* in/out: send_wr recv_wr send_sge recv_sge inline */);
int rk_modify_init(struct ibv_qp *qp, uint8_t port, uint32_t access, int iwarp);
int rk_modify_rtr(struct ibv_qp *qp, struct rk_rtr *a);
int rk_modify_rts(struct ibv_qp *qp, struct rk_rts *a, int from_rtr);
int rk_modify_state(struct ibv_qp *qp, int state);
int rk_query_state(struct ibv_qp *qp);
int rk_post_send(struct rk_wq *q, int n);
int rk_post_recv(struct rk_wq *q, int n, int srq);

struct ibv_mr *rk_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access);
struct ibv_mr *rk_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd, int access);
struct ibv_srq *rk_create_srq(struct ibv_pd *pd, uint32_t *max_wr, uint32_t *max_sge);

/* rdma_cm */
struct rdma_cm_id *rk_cm_create_id(struct rdma_event_channel *ch, uint64_t ctx);
int rk_cm_bind_listen(struct rdma_cm_id *id, const uint8_t *ip16, int v4, int backlog, uint16_t *port);
int rk_cm_resolve(struct rdma_cm_id *id, const uint8_t *src16, const uint8_t *dst16, int v4, uint16_t port, int timeout_ms);
int rk_cm_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int rk_cm_connect(struct rdma_cm_id *id, uint32_t qpn, uint8_t rd_atom, uint8_t init_depth, const void *pdata, int plen, int accept);
int rk_cm_get_event(struct rdma_event_channel *ch, struct rk_cm_event *out);
void rk_cm_set_context(struct rdma_cm_id *id, uint64_t ctx);
int rk_cm_init_qp(struct rdma_cm_id *id, struct ibv_qp *qp, int state, uint8_t rd_atom);
const char *rk_cm_dev_name(struct rdma_cm_id *id);
int rk_cm_device_for(const uint8_t *ip16, int v4, int bind_only, int timeout_ms, char *name, int n);

#endif
