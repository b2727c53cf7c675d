// C helpers of the rdma backend: the parts of libibverbs and mlx5dv that
// are macros or inline functions taking structures cgo cannot build
// conveniently. Only compiled with the rdma build tag.
#ifndef KRFS_IBV_H
#define KRFS_IBV_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

// krfs_wr is one send WR as Go lays it out (no pointers: addresses are
// integers, valid for the duration of the post call).
struct krfs_wr {
	uint64_t wr_id;
	uint64_t laddr;      // local IOVA (the MR's IOVA plus the SGE's offset) or inline data address
	uint64_t raddr;      // remote offset
	uint64_t compare_add;
	uint64_t swap;
	uint64_t ah;         // struct ibv_ah * of a DC target
	uint64_t dc_key;
	uint32_t opcode;     // enum ibv_wr_opcode
	uint32_t flags;      // enum ibv_send_flags
	uint32_t length;
	uint32_t lkey;
	uint32_t rkey;
	uint32_t imm;        // host order; converted to network order here
	uint32_t dctn;
	uint32_t pad;
};

struct krfs_recv {
	uint64_t wr_id;
	uint64_t laddr;
	uint32_t length;
	uint32_t lkey;
};

// krfs_mod carries the attributes of one state transition.
struct krfs_mod {
	int      qp_type;    // 1 RC, 2 DCI, 3 DCT (verbs.QPType)
	int      state;      // enum ibv_qp_state
	int      from;       // current state
	uint32_t access;
	uint32_t mtu;        // enum ibv_mtu
	uint32_t dest_qpn;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint8_t  timeout, retry_cnt, rnr_retry, min_rnr_timer;
	uint8_t  max_rd_atomic, port, sgid_index, is_global;
	uint16_t dlid;
	uint8_t  dgid[16];
	uint8_t  traffic_class, sl, hop_limit; // QoS of the address vector
};

static inline int krfs_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr) {
	return ibv_query_port(ctx, port, attr);
}

static inline int krfs_query_gid(struct ibv_context *ctx, uint32_t port, uint32_t index, uint8_t *gid, uint32_t *type, uint32_t *ifindex) {
	struct ibv_gid_entry e;
	int rc = ibv_query_gid_ex(ctx, port, index, &e, 0);
	if (rc)
		return rc;
	memcpy(gid, e.gid.raw, 16);
	*type = e.gid_type;
	*ifindex = e.ndev_ifindex;
	return 0;
}

// krfs_reg_mr registers len bytes at addr at IOVA iova, which must equal
// addr's offset in its page (the kernel refuses anything else).
static inline struct ibv_mr *krfs_reg_mr(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova, int access) {
	return ibv_reg_mr_iova(pd, addr, len, iova, access);
}

// krfs_probe_mr registers what the verbs contract registers: a page at
// IOVA 0, and a buffer 80 bytes into a page (where malloc puts small
// blocks) at IOVA 80. It returns 0 or the errno of the first refusal.
static inline int krfs_probe_mr(struct ibv_pd *pd, int access) {
	long page = sysconf(_SC_PAGESIZE);
	void *buf = NULL;
	int rc = posix_memalign(&buf, page, 2 * page);
	if (rc)
		return rc;
	struct ibv_mr *mr = ibv_reg_mr_iova(pd, buf, page, 0, access);
	if (!mr) {
		rc = errno ? errno : EINVAL;
		free(buf);
		return rc;
	}
	ibv_dereg_mr(mr);
	mr = ibv_reg_mr_iova(pd, (char *)buf + page + 80, 64, 80, access);
	if (!mr)
		rc = errno ? errno : EINVAL;
	else
		ibv_dereg_mr(mr);
	free(buf);
	return rc;
}

static inline struct ibv_qp *krfs_create_rc(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_srq *srq,
		uint32_t send_wr, uint32_t recv_wr, uint32_t inline_size) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = srq ? 0 : recv_wr;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = srq ? 0 : 1;
	a.cap.max_inline_data = inline_size;
	return ibv_create_qp(pd, &a);
}

// krfs_create_dc creates a DCI (key ignored) or a DCT through mlx5 direct
// verbs. A DCI asks for the atomic send operations only with atomics: mlx5
// refuses a DCI with them (EOPNOTSUPP) on a device whose atomic_cap is
// NONE. A DCT's send CQ (unused) and receive CQ are scq and cq.
static inline struct ibv_qp *krfs_create_dc(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *cq,
		struct ibv_srq *srq, int dct, uint64_t key, uint32_t send_wr, uint32_t inline_size, int atomics) {
	struct ibv_qp_init_attr_ex a;
	struct mlx5dv_qp_init_attr dv;
	memset(&a, 0, sizeof a);
	memset(&dv, 0, sizeof dv);
	a.qp_type = IBV_QPT_DRIVER;
	a.send_cq = scq;
	a.recv_cq = cq;
	a.pd = pd;
	a.comp_mask = IBV_QP_INIT_ATTR_PD;
	dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
	if (dct) {
		a.srq = srq;
		dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCT;
		dv.dc_init_attr.dct_access_key = key;
	} else {
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ;
		if (atomics)
			a.send_ops_flags |= IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		a.cap.max_send_wr = send_wr;
		a.cap.max_send_sge = 1;
		a.cap.max_inline_data = inline_size;
		dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
	}
	return mlx5dv_create_qp(ctx, &a, &dv);
}

static inline void krfs_fill_av(struct ibv_ah_attr *av, const struct krfs_mod *m) {
	memset(av, 0, sizeof *av);
	av->port_num = m->port;
	av->dlid = m->dlid;
	av->sl = m->sl;
	if (m->is_global) {
		av->is_global = 1;
		memcpy(av->grh.dgid.raw, m->dgid, 16);
		av->grh.sgid_index = m->sgid_index;
		av->grh.hop_limit = m->hop_limit;
		av->grh.traffic_class = m->traffic_class;
	}
}

// krfs_modify applies one transition with the attribute mask the QP type
// and the transition need.
static inline int krfs_modify(struct ibv_qp *qp, const struct krfs_mod *m) {
	struct ibv_qp_attr a;
	int mask = IBV_QP_STATE;
	memset(&a, 0, sizeof a);
	a.qp_state = m->state;
	switch (m->state) {
	case IBV_QPS_INIT:
		if (m->from == IBV_QPS_INIT) {
			if (m->qp_type != 2) {
				a.qp_access_flags = m->access;
				mask |= IBV_QP_ACCESS_FLAGS;
			}
			break;
		}
		a.pkey_index = 0;
		a.port_num = m->port;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
		if (m->qp_type != 2) {
			a.qp_access_flags = m->access;
			mask |= IBV_QP_ACCESS_FLAGS;
		}
		break;
	case IBV_QPS_RTR:
		a.path_mtu = m->mtu;
		mask |= IBV_QP_PATH_MTU;
		if (m->qp_type == 1) {
			krfs_fill_av(&a.ah_attr, m);
			a.dest_qp_num = m->dest_qpn;
			a.rq_psn = m->rq_psn;
			a.max_dest_rd_atomic = m->max_rd_atomic;
			a.min_rnr_timer = m->min_rnr_timer;
			mask |= IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		} else if (m->qp_type == 3) {
			krfs_fill_av(&a.ah_attr, m);
			a.min_rnr_timer = m->min_rnr_timer;
			mask |= IBV_QP_AV | IBV_QP_MIN_RNR_TIMER;
		} else {
			krfs_fill_av(&a.ah_attr, m);
			mask |= IBV_QP_AV;
		}
		break;
	case IBV_QPS_RTS:
		if (m->from == IBV_QPS_RTS) {
			if (m->access && m->qp_type == 1) {
				a.qp_access_flags = m->access;
				mask |= IBV_QP_ACCESS_FLAGS;
			}
			break;
		}
		a.timeout = m->timeout;
		a.retry_cnt = m->retry_cnt;
		a.rnr_retry = m->rnr_retry;
		a.sq_psn = m->sq_psn;
		a.max_rd_atomic = m->max_rd_atomic;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
		break;
	default:
		break;
	}
	return ibv_modify_qp(qp, &a, mask);
}

static inline void krfs_fill_sge(struct ibv_sge *s, const struct krfs_wr *w) {
	s->addr = w->laddr;
	s->length = w->length;
	s->lkey = w->lkey;
}

#define KRFS_CHUNK 32

// krfs_post_rc posts n WRs on an RC QP in chunks of KRFS_CHUNK chained WRs
// (one doorbell per chunk). It returns 0, or an errno with *bad the index
// of the first WR not posted.
static inline int krfs_post_rc(struct ibv_qp *qp, const struct krfs_wr *w, int n, int *bad) {
	struct ibv_send_wr wrs[KRFS_CHUNK];
	struct ibv_sge sges[KRFS_CHUNK];
	for (int base = 0; base < n; base += KRFS_CHUNK) {
		int k = n - base < KRFS_CHUNK ? n - base : KRFS_CHUNK;
		memset(wrs, 0, sizeof(wrs[0]) * k);
		for (int i = 0; i < k; i++) {
			const struct krfs_wr *x = &w[base + i];
			struct ibv_send_wr *r = &wrs[i];
			r->wr_id = x->wr_id;
			r->opcode = x->opcode;
			r->send_flags = x->flags;
			krfs_fill_sge(&sges[i], x);
			r->sg_list = &sges[i];
			r->num_sge = x->length ? 1 : 0;
			r->imm_data = htobe32(x->imm);
			if (x->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || x->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
				r->wr.atomic.remote_addr = x->raddr;
				r->wr.atomic.rkey = x->rkey;
				r->wr.atomic.compare_add = x->compare_add;
				r->wr.atomic.swap = x->swap;
			} else {
				r->wr.rdma.remote_addr = x->raddr;
				r->wr.rdma.rkey = x->rkey;
			}
			r->next = i + 1 < k ? &wrs[i + 1] : NULL;
		}
		struct ibv_send_wr *badwr = NULL;
		int rc = ibv_post_send(qp, wrs, &badwr);
		if (rc) {
			*bad = base + (badwr ? (int)(badwr - wrs) : 0);
			return rc;
		}
	}
	return 0;
}

// krfs_post_dci posts n WRs on a DCI with the extended post API: each WR
// names its DC target (AH, DCT number, DC key). On failure nothing of the
// batch is posted.
static inline int krfs_post_dci(struct ibv_qp *qp, const struct krfs_wr *w, int n) {
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qp);
	struct mlx5dv_qp_ex *dv = mlx5dv_qp_ex_from_ibv_qp_ex(qpx);
	if (!qpx || !dv)
		return EOPNOTSUPP;
	ibv_wr_start(qpx);
	for (int i = 0; i < n; i++) {
		const struct krfs_wr *x = &w[i];
		qpx->wr_id = x->wr_id;
		qpx->wr_flags = x->flags & ~IBV_SEND_INLINE;
		switch (x->opcode) {
		case IBV_WR_RDMA_READ:
			ibv_wr_rdma_read(qpx, x->rkey, x->raddr);
			break;
		case IBV_WR_RDMA_WRITE:
			ibv_wr_rdma_write(qpx, x->rkey, x->raddr);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(qpx, x->rkey, x->raddr, htobe32(x->imm));
			break;
		case IBV_WR_SEND:
			ibv_wr_send(qpx);
			break;
		case IBV_WR_SEND_WITH_IMM:
			ibv_wr_send_imm(qpx, htobe32(x->imm));
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			ibv_wr_atomic_cmp_swp(qpx, x->rkey, x->raddr, x->compare_add, x->swap);
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			ibv_wr_atomic_fetch_add(qpx, x->rkey, x->raddr, x->compare_add);
			break;
		default:
			ibv_wr_abort(qpx);
			return EINVAL;
		}
		mlx5dv_wr_set_dc_addr(dv, (struct ibv_ah *)(uintptr_t)x->ah, x->dctn, x->dc_key);
		if (x->flags & IBV_SEND_INLINE)
			ibv_wr_set_inline_data(qpx, (void *)(uintptr_t)x->laddr, x->length);
		else if (x->length)
			ibv_wr_set_sge(qpx, x->lkey, x->laddr, x->length);
		else
			ibv_wr_set_sge_list(qpx, 0, NULL);
	}
	return ibv_wr_complete(qpx);
}

// krfs_post_recv posts receive WRs on a QP (srq NULL) or an SRQ.
static inline int krfs_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, const struct krfs_recv *w, int n, int *bad) {
	struct ibv_recv_wr wrs[KRFS_CHUNK];
	struct ibv_sge sges[KRFS_CHUNK];
	for (int base = 0; base < n; base += KRFS_CHUNK) {
		int k = n - base < KRFS_CHUNK ? n - base : KRFS_CHUNK;
		for (int i = 0; i < k; i++) {
			const struct krfs_recv *x = &w[base + i];
			sges[i].addr = x->laddr;
			sges[i].length = x->length;
			sges[i].lkey = x->lkey;
			wrs[i].wr_id = x->wr_id;
			wrs[i].sg_list = &sges[i];
			wrs[i].num_sge = 1;
			wrs[i].next = i + 1 < k ? &wrs[i + 1] : NULL;
		}
		struct ibv_recv_wr *badwr = NULL;
		int rc = srq ? ibv_post_srq_recv(srq, wrs, &badwr) : ibv_post_recv(qp, wrs, &badwr);
		if (rc) {
			*bad = base + (badwr ? (int)(badwr - wrs) : 0);
			return rc;
		}
	}
	return 0;
}

// krfs_wc is a completion as Go reads it.
struct krfs_wc {
	uint64_t wr_id;
	uint32_t status, opcode, qp_num, src_qp, byte_len, imm, wc_flags, vendor_err;
};

static inline int krfs_poll(struct ibv_cq *cq, struct krfs_wc *out, int n) {
	struct ibv_wc wc[32];
	int got = 0;
	while (got < n) {
		int want = n - got < 32 ? n - got : 32;
		int k = ibv_poll_cq(cq, want, wc);
		if (k < 0)
			return got ? got : k;
		for (int i = 0; i < k; i++) {
			struct krfs_wc *o = &out[got + i];
			o->wr_id = wc[i].wr_id;
			o->status = wc[i].status;
			o->opcode = wc[i].opcode;
			o->qp_num = wc[i].qp_num;
			o->src_qp = wc[i].src_qp;
			o->byte_len = wc[i].byte_len;
			o->imm = be32toh(wc[i].imm_data);
			o->wc_flags = wc[i].wc_flags;
			o->vendor_err = wc[i].vendor_err;
		}
		got += k;
		if (k < want)
			break;
	}
	return got;
}

static inline struct ibv_ah *krfs_create_ah(struct ibv_pd *pd, const struct krfs_mod *m) {
	struct ibv_ah_attr av;
	krfs_fill_av(&av, m);
	return ibv_create_ah(pd, &av);
}

static inline int krfs_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// krfs_probe_dc reports 0 if a DCI (without atomics) can be created on
// ctx, -1 if the device is not an mlx5 device, else the errno of the
// refusal.
static inline int krfs_probe_dc(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq) {
	if (!mlx5dv_is_supported(ctx->device))
		return -1;
	errno = 0;
	struct ibv_qp *qp = krfs_create_dc(ctx, pd, cq, cq, NULL, 0, 0, 1, 0, 0);
	if (!qp)
		return errno ? errno : EOPNOTSUPP;
	ibv_destroy_qp(qp);
	return 0;
}

// krfs_event is an asynchronous event as Go reads it.
struct krfs_event {
	uint32_t type;
	uint32_t qp_num;   // QP events: the QP's number (a DCT's, after RTR)
	uint64_t cq, srq;  // CQ and SRQ events: the object's address
	uint32_t port;
};

// krfs_get_event reads one asynchronous event (the context's async fd is
// non-blocking: EAGAIN when there is none), copies what Go needs and
// acknowledges it at once, so that destroying the object it names never
// waits. It returns 0 or an errno.
static inline int krfs_get_event(struct ibv_context *ctx, struct krfs_event *out) {
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev))
		return errno ? errno : EAGAIN;
	memset(out, 0, sizeof *out);
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		out->cq = (uint64_t)(uintptr_t)ev.element.cq;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		out->srq = (uint64_t)(uintptr_t)ev.element.srq;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	case IBV_EVENT_DEVICE_FATAL:
		break;
	case IBV_EVENT_WQ_FATAL:
		break;
	default:
		out->qp_num = ev.element.qp ? ev.element.qp->qp_num : 0;
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

// krfs_arm_srq arms an SRQ's limit (0 disarms).
static inline int krfs_arm_srq(struct ibv_srq *srq, uint32_t limit) {
	struct ibv_srq_attr a;
	memset(&a, 0, sizeof a);
	a.srq_limit = limit;
	return ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT);
}

#endif
