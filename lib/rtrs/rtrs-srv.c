/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: listening, sessions with their chunk memory, paths and
 * connections, IO dispatch and responses.
 *
 * Threads: the service loop owns the control plane (listening and its
 * retries, connection requests, info exchange, heartbeats, path close,
 * session lifetime); only it changes session and path structures. Each
 * connection's completion thread decodes IO requests and calls the user's
 * rdma_ev; responses are posted from whatever thread answers.
 *
 * An op (one per chunk) is FREE -> BUSY (the user owns it) -> RESPONDING
 * (the response is being posted, or waits for room) -> SENT (its last write
 * was handed to the fabric; the responder reads nothing of the op any more)
 * -> FREE. A client may reuse a chunk once it has the response, which can
 * be before the responder marks the op FREE: a request may take a FREE or
 * SENT op. One that finds it BUSY or RESPONDING broke the protocol.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>

#include "rtrs-pri.h"

enum srv_op_state { OP_FREE, OP_BUSY, OP_RESPONDING, OP_SENT };

struct srv_path;
struct srv_con;

struct rtrs_srv_op {
	struct rtrs_srv_sess *sess;
	uint32_t id;
	atomic_int state;
	struct srv_path *path;
	struct srv_con *con;
	enum rtrs_dir dir;
	uint32_t data_len;
	uint16_t sg_cnt;
	struct rtrs_desc *sg;       /* validated copy; the client cannot change it */
	int err;
	size_t next_sg;             /* posting progress after -EAGAIN */
	uint64_t next_local;
	struct rtrs_srv_op *pending_next;
};

struct srv_con {
	struct srv_path *path;
	unsigned cid;
	struct fab_con *fc;
	struct rtrs_desc sg_scratch[RTRS_MAX_READ_SG]; /* completion thread only */
	pthread_mutex_t pending_lock;
	struct rtrs_srv_op *pending_head, *pending_tail;
};

struct srv_path {
	struct rtrs_srv_sess *sess;
	struct srv_path *next;
	uint8_t uuid[RTRS_UUID_LEN];
	char peer[64];
	char name[RTRS_NAME_MAX + 80];
	_Atomic enum rtrs_path_state state;
	pthread_rwlock_t post_lock;
	unsigned cid_num;
	unsigned nr_accepted;
	struct srv_con *cons;
	uint64_t last_connreq_ms;
	struct rtrs_desc clt_imm;
	struct rtrs_info_req info;  /* from the admin thread to the loop */
	struct loop_work info_work;
	void *info_rsp;
	size_t info_rsp_len;
	struct fab_mr info_rsp_mr;
	struct rtrs_hb hb;
	struct loop_work fail_work;
	atomic_int fail_err;
	atomic_bool info_received;
	/* A fence asked for on this path (its admin connection). */
	uint8_t fence_uuid[RTRS_UUID_LEN];
	atomic_bool fence_pending;
	struct loop_work fence_work;
	struct loop_timer fence_timer;
	struct rtrs_msg_fence fence_ack;
	struct fab_mr fence_ack_mr;
	bool cons_destroyed;
	bool was_connected;
	atomic_uint inflight;
};

struct rtrs_srv_sess {
	struct rtrs_srv_ctx *ctx;
	struct rtrs_srv_sess *next;
	uint8_t paths_uuid[RTRS_UUID_LEN];
	char name[RTRS_NAME_MAX + 1];
	void *priv;
	uint32_t queue_depth;
	uint32_t chunk_size;
	size_t chunk_bytes;
	char *chunk_mem;
	void **chunk_bases;
	struct fab_mr chunk_mr;
	struct rtrs_srv_op *ops;
	struct rtrs_desc *op_sg;
	char imm_buf[RTRS_IMM_REGION];
	struct fab_mr imm_mr;
	struct srv_path *paths;
	unsigned paths_num;
	unsigned paths_up;
	bool link_up;
};

struct rtrs_srv_ctx {
	struct rtrs_srv_ops ops;
	struct rtrs_srv_opts opts;
	char addr[256];
	char provider[32];
	struct loop *loop;
	struct fab *fab;
	struct fab_lst *lst;
	struct loop_fd lst_h;
	struct loop_timer listen_timer;
	unsigned listen_failures;
	pthread_mutex_t lock;       /* listening, port, nr_sessions for waiters */
	pthread_cond_t cond;
	bool listening;
	bool closing;
	int port;
	struct rtrs_srv_sess *sessions;
	unsigned nr_sessions;
	struct loop_work reap_work; /* frees closed paths nobody references */
};

static void srv_fail_path(struct srv_path *p, int err);
static struct srv_path *path_find(struct rtrs_srv_sess *s, const uint8_t *uuid);

/* ---- responses ------------------------------------------------------------- */

/*
 * The op's answer is out (or dropped). Callers keep p alive: they hold its
 * post_lock for reading, or run on a thread the path's teardown waits for.
 */
static void op_finish(struct rtrs_srv_op *op, struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	int expected = OP_RESPONDING;
	bool closing = atomic_load(&p->state) != RTRS_PATH_CONNECTED;

	/* From SENT the op may already be BUSY with the client's next request. */
	if (!atomic_compare_exchange_strong(&op->state, &expected, OP_FREE) &&
	    expected == OP_SENT)
		atomic_compare_exchange_strong(&op->state, &expected, OP_FREE);
	if (atomic_fetch_sub(&p->inflight, 1) == 1 && closing)
		loop_queue(ctx->loop, &ctx->reap_work);
}

/*
 * Posts the last write of a response, prepared in locals. The op turns SENT
 * first, since the client may answer the response at once; nothing of the
 * op is read after that. On failure the op goes back to RESPONDING, unless
 * a request took it meanwhile, which only a client that reuses a chunk
 * before its response can do: then the response is dropped and -EPROTO
 * fails the path.
 */
static int op_post_last(struct rtrs_srv_op *op, struct srv_path *p, struct fab_con *fc,
			const struct iovec *iov, void *desc, const struct fab_rma *rma,
			size_t rma_cnt, uint32_t imm)
{
	int expected = OP_SENT;
	int rc;

	atomic_store(&op->state, OP_SENT);
	if (rma_cnt)
		rc = fab_write(fc, iov, &desc, 1, rma, rma_cnt, true, imm, NULL);
	else
		rc = fab_write_imm(fc, p->clt_imm.addr, p->clt_imm.key, imm);
	if (!rc) {
		op_finish(op, p);
		return 0;
	}
	if (atomic_compare_exchange_strong(&op->state, &expected, OP_RESPONDING))
		return rc;
	log_err_rl("%s: chunk %u reused before its response", p->name, op->id);
	op_finish(op, p);
	return -EPROTO;
}

/*
 * Posts what is left of op's response: read data to the client's buffers,
 * at most rma_iov_limit descriptors per write, the last one with the
 * response immediate; or an empty write with it. 0 when all is posted.
 */
static int op_post(struct rtrs_srv_op *op)
{
	struct srv_path *p = op->path;
	struct rtrs_srv_sess *s = op->sess;
	struct fab_con *fc = op->con->fc;
	uint32_t imm = rtrs_to_io_rsp_imm(op->id, op->err);
	size_t per = MIN(fab_attr(s->ctx->fab)->rma_iov_limit, 8);
	int rc;

	if (op->dir != RTRS_READ || op->err || op->data_len == 0 || op->sg_cnt == 0)
		return op_post_last(op, p, fc, NULL, NULL, NULL, 0, imm);
	while (op->next_sg < op->sg_cnt) {
		size_t cnt = MIN((size_t)op->sg_cnt - op->next_sg, per);
		struct fab_rma rma[8];
		struct iovec iov;
		void *desc = s->chunk_mr.desc;
		uint64_t len = 0;

		for (size_t i = 0; i < cnt; i++) {
			const struct rtrs_desc *d = &op->sg[op->next_sg + i];

			rma[i] = (struct fab_rma){ .addr = d->addr, .len = d->len, .key = d->key };
			len += d->len;
		}
		iov.iov_base = s->chunk_bases[op->id] + op->next_local;
		iov.iov_len = len;
		if (op->next_sg + cnt == op->sg_cnt)
			return op_post_last(op, p, fc, &iov, desc, rma, cnt, imm);
		rc = fab_write(fc, &iov, &desc, 1, rma, cnt, false, 0, NULL);
		if (rc)
			return rc;
		op->next_sg += cnt;
		op->next_local += len;
	}
	return 0;
}

static void con_pending_push(struct srv_con *con, struct rtrs_srv_op *op)
{
	log_dbg("%s#%u: send queue full, response %u waits", con->path->name, con->cid, op->id);
	pthread_mutex_lock(&con->pending_lock);
	op->pending_next = NULL;
	if (con->pending_tail)
		con->pending_tail->pending_next = op;
	else
		con->pending_head = op;
	con->pending_tail = op;
	pthread_mutex_unlock(&con->pending_lock);
	fab_con_kick(con->fc);
}

static struct rtrs_srv_op *con_pending_pop(struct srv_con *con)
{
	struct rtrs_srv_op *op;

	pthread_mutex_lock(&con->pending_lock);
	op = con->pending_head;
	if (op) {
		con->pending_head = op->pending_next;
		if (!con->pending_head)
			con->pending_tail = NULL;
	}
	pthread_mutex_unlock(&con->pending_lock);
	return op;
}

static void srv_con_kick(void *priv)
{
	struct srv_con *con = priv;
	struct rtrs_srv_op *op;

	while ((op = con_pending_pop(con))) {
		int rc = op_post(op);

		if (rc == -EAGAIN) {
			/* Back to the head without a kick: retried after 1 ms or a completion. */
			pthread_mutex_lock(&con->pending_lock);
			op->pending_next = con->pending_head;
			con->pending_head = op;
			if (!con->pending_tail)
				con->pending_tail = op;
			pthread_mutex_unlock(&con->pending_lock);
			fab_con_retry_later(con->fc);
			return;
		}
		if (rc) {
			log_err_rl("%s: posting a response failed: %s", con->path->name,
				   strerror(-rc));
			if (rc != -EPROTO) /* -EPROTO: op_post_last finished it */
				op_finish(op, con->path);
			srv_fail_path(con->path, rc);
			return;
		}
	}
}

RTRS_EXPORT
int rtrs_srv_resp_rdma(struct rtrs_srv_op *op, int err)
{
	int expected = OP_BUSY;
	struct srv_path *p;
	int rc;

	if (!op)
		return -EINVAL;
	if (!atomic_compare_exchange_strong(&op->state, &expected, OP_RESPONDING)) {
		log_err_rl("%s: answer to request %u that is not waiting for one",
			   op->sess->name, op->id);
		return -EINVAL;
	}
	p = op->path;
	op->err = err;
	op->next_sg = 0;
	op->next_local = 0;
	pthread_rwlock_rdlock(&p->post_lock);
	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED) {
		/* The client fails this IO over or gets an error from its path. */
		op_finish(op, p);
		pthread_rwlock_unlock(&p->post_lock);
		return -ENOTCONN;
	}
	rc = op_post(op);
	if (rc == -EAGAIN) {
		con_pending_push(op->con, op);
		rc = 0;
	} else if (rc) {
		log_err_rl("%s: posting a response failed: %s", p->name, strerror(-rc));
		if (rc != -EPROTO) /* -EPROTO: op_post_last finished it */
			op_finish(op, p);
		srv_fail_path(p, rc);
	}
	pthread_rwlock_unlock(&p->post_lock);
	return rc;
}

/* ---- IO requests (completion threads) -------------------------------------- */

static void srv_handle_req(struct srv_con *con, uint32_t payload)
{
	struct srv_path *p = con->path;
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_limits lim = {
		.queue_depth = s->queue_depth, .chunk_size = s->chunk_size,
		.max_hdr_size = RTRS_MAX_HDR_SIZE,
	};
	struct rtrs_io_req req;
	struct rtrs_srv_op *op;
	const char *why = NULL;
	int state, rc;
	char *base;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED) {
		log_err_rl("%s: IO before the path is established", p->name);
		srv_fail_path(p, -EPROTO);
		return;
	}
	/* Decoded into this connection's scratch: the op may still be busy. */
	rc = rtrs_io_req_decode(payload, &lim, s->chunk_bases, con->sg_scratch, &req, &why);
	if (rc) {
		log_err_rl("%s: invalid IO request: %s", p->name, why);
		srv_fail_path(p, rc);
		return;
	}
	op = &s->ops[req.chunk];
	state = atomic_load(&op->state);
	/* FREE, or SENT (its response is out): both are ours. */
	do {
		if (state == OP_BUSY || state == OP_RESPONDING) {
			log_err_rl("%s: request for chunk %u which is still in use", p->name,
				   req.chunk);
			srv_fail_path(p, -EPROTO);
			return;
		}
	} while (!atomic_compare_exchange_weak(&op->state, &state, OP_BUSY));
	atomic_fetch_add(&p->inflight, 1);
	op->path = p;
	op->con = con;
	op->dir = req.type == RTRS_MSG_READ ? RTRS_READ : RTRS_WRITE;
	op->data_len = req.data_len;
	op->sg_cnt = req.sg_cnt;
	if (req.sg_cnt)
		memcpy(op->sg, req.sg, req.sg_cnt * sizeof(*op->sg));
	base = s->chunk_bases[req.chunk];
	rc = s->ctx->ops.rdma_ev(s->ctx->ops.priv, op, op->dir, base, req.data_len,
				 base + req.data_len, req.usr_len);
	if (rc)
		rtrs_srv_resp_rdma(op, rc < 0 ? rc : -rc);
}

static void srv_con_imm(void *priv, uint32_t imm)
{
	struct srv_con *con = priv;
	struct srv_path *p = con->path;
	uint32_t payload;
	unsigned type;
	int rc;

	rtrs_hb_heard(&p->hb);
	rtrs_from_imm(imm, &type, &payload);
	switch (type) {
	case RTRS_IO_REQ_IMM:
		srv_handle_req(con, payload);
		break;
	case RTRS_HB_MSG_IMM:
		if (atomic_load(&p->state) != RTRS_PATH_CONNECTED)
			break;
		rc = fab_write_imm(con->fc, p->clt_imm.addr, p->clt_imm.key,
				   rtrs_to_imm(RTRS_HB_ACK_IMM, 0));
		if (rc && rc != -EAGAIN)
			srv_fail_path(p, rc);
		break;
	case RTRS_HB_ACK_IMM:
		rtrs_hb_acked(&p->hb);
		break;
	default:
		log_err_rl("%s: unknown immediate type %u", p->name, type);
		srv_fail_path(p, -EPROTO);
	}
}

static void srv_con_recv(void *priv, void *buf, size_t len)
{
	struct srv_con *con = priv;
	struct srv_path *p = con->path;
	const char *why = NULL;
	int rc, err;

	rtrs_hb_heard(&p->hb);
	if (con->cid == 0 && atomic_load(&p->state) == RTRS_PATH_CONNECTED) {
		/* One fence at a time per path: the client waits for each ack. */
		rc = rtrs_fence_decode(buf, len, RTRS_MSG_FENCE, p->fence_uuid, &err, &why);
		if (rc || atomic_exchange(&p->fence_pending, true)) {
			log_err_rl("%s: unexpected message: %s", p->name, rc ? why : "second fence");
			srv_fail_path(p, rc ? rc : -EPROTO);
			return;
		}
		loop_queue(p->sess->ctx->loop, &p->fence_work);
		return;
	}
	if (con->cid != 0 || atomic_load(&p->state) != RTRS_PATH_CONNECTING ||
	    atomic_exchange(&p->info_received, true)) {
		log_err_rl("%s: unexpected message on connection %u", p->name, con->cid);
		srv_fail_path(p, -EPROTO);
		return;
	}
	rc = rtrs_info_req_decode(buf, len, &p->info, &why);
	if (rc) {
		log_err("%s: invalid info request: %s", p->name, why);
		srv_fail_path(p, rc);
		return;
	}
	loop_queue(p->sess->ctx->loop, &p->info_work);
}

static void srv_con_connected(void *priv, const void *data, size_t len)
{
	struct srv_con *con = priv;

	log_dbg("%s: connection %u established", con->path->name, con->cid);
}

static void srv_con_down(void *priv, int err, const void *data, size_t len)
{
	struct srv_con *con = priv;

	log_info("%s: connection %u went down: %s", con->path->name, con->cid, strerror(-err));
	srv_fail_path(con->path, err);
}

static void srv_con_done(void *priv, void *ctx)
{
}

static const struct fab_con_ops srv_con_ops = {
	.connected = srv_con_connected,
	.down = srv_con_down,
	.imm = srv_con_imm,
	.recv = srv_con_recv,
	.done = srv_con_done,
	.kick = srv_con_kick,
};

/* ---- sessions and paths (service loop) -------------------------------------- */

static void sess_free(struct rtrs_srv_sess *s)
{
	struct rtrs_srv_ctx *ctx = s->ctx;
	struct rtrs_srv_sess **pp;

	for (pp = &ctx->sessions; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	fab_mr_dereg(&s->chunk_mr);
	fab_mr_dereg(&s->imm_mr);
	if (s->chunk_mem)
		munmap(s->chunk_mem, s->chunk_bytes);
	free(s->chunk_bases);
	free(s->ops);
	free(s->op_sg);
	log_info("session %s closed", s->name[0] ? s->name : "(unnamed)");
	free(s);
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions--;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
}

static int sess_create(struct rtrs_srv_ctx *ctx, const uint8_t *uuid, struct rtrs_srv_sess **out)
{
	struct rtrs_srv_sess *s = calloc(1, sizeof(*s));
	uint32_t qd = ctx->opts.queue_depth;
	int rc = -ENOMEM;

	if (!s)
		return -ENOMEM;
	s->ctx = ctx;
	memcpy(s->paths_uuid, uuid, RTRS_UUID_LEN);
	s->queue_depth = qd;
	s->chunk_size = ctx->opts.max_chunk_size;
	s->chunk_bytes = (size_t)qd * s->chunk_size;
	s->chunk_mem = mmap(NULL, s->chunk_bytes, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (s->chunk_mem == MAP_FAILED) {
		s->chunk_mem = NULL;
		goto out_free;
	}
	s->chunk_bases = calloc(qd, sizeof(*s->chunk_bases));
	s->ops = calloc(qd, sizeof(*s->ops));
	s->op_sg = calloc((size_t)qd * RTRS_MAX_READ_SG, sizeof(*s->op_sg));
	if (!s->chunk_bases || !s->ops || !s->op_sg)
		goto out_free;
	for (uint32_t i = 0; i < qd; i++) {
		s->chunk_bases[i] = s->chunk_mem + (size_t)i * s->chunk_size;
		s->ops[i].sess = s;
		s->ops[i].id = i;
		s->ops[i].sg = &s->op_sg[(size_t)i * RTRS_MAX_READ_SG];
		atomic_init(&s->ops[i].state, OP_FREE);
	}
	rc = fab_mr_reg(ctx->fab, s->chunk_mem, s->chunk_bytes,
			FAB_MR_REMOTE_WRITE | FAB_MR_LOCAL, &s->chunk_mr);
	if (rc)
		goto out_free;
	rc = fab_mr_reg(ctx->fab, s->imm_buf, sizeof(s->imm_buf), FAB_MR_REMOTE_WRITE, &s->imm_mr);
	if (rc)
		goto out_free;
	s->next = ctx->sessions;
	ctx->sessions = s;
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions++;
	pthread_mutex_unlock(&ctx->lock);
	*out = s;
	return 0;

out_free:
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions++; /* sess_free counts it down */
	pthread_mutex_unlock(&ctx->lock);
	sess_free(s);
	return rc;
}

static void path_free(struct srv_path *p)
{
	struct rtrs_srv_sess *s = p->sess;
	struct srv_path **pp;

	for (pp = &s->paths; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	s->paths_num--;
	loop_timer_fini(&p->hb.timer);
	loop_timer_fini(&p->fence_timer);
	fab_mr_dereg(&p->fence_ack_mr);
	fab_mr_dereg(&p->info_rsp_mr);
	free(p->info_rsp);
	for (unsigned i = 0; i < p->cid_num; i++)
		pthread_mutex_destroy(&p->cons[i].pending_lock);
	free(p->cons);
	pthread_rwlock_destroy(&p->post_lock);
	log_dbg("%s: path freed", p->name);
	free(p);
	if (!s->paths)
		sess_free(s);
}

/*
 * Loop thread: frees every closed path whose ops are all answered. The
 * write lock waits out responders still inside op_finish().
 */
static void srv_reap_work(struct loop_work *w)
{
	struct rtrs_srv_ctx *ctx = container_of(w, struct rtrs_srv_ctx, reap_work);
	struct rtrs_srv_sess *s, *sn;
	struct srv_path *p, *pn;

	for (s = ctx->sessions; s; s = sn) {
		sn = s->next;
		for (p = s->paths; p; p = pn) {
			bool idle;

			pn = p->next;
			/* Its own work items still queued would run on freed memory. */
			if (!p->cons_destroyed || atomic_load(&p->fail_work.queued) ||
			    atomic_load(&p->info_work.queued) || atomic_load(&p->fence_work.queued))
				continue;
			pthread_rwlock_wrlock(&p->post_lock);
			idle = atomic_load(&p->inflight) == 0;
			pthread_rwlock_unlock(&p->post_lock);
			if (idle)
				path_free(p); /* may free s: sn was taken before */
		}
	}
}

static bool srv_path_change_state(struct srv_path *p, enum rtrs_path_state to)
{
	return rtrs_path_change_state(&p->state, p->name, to);
}

/* Loop thread: close the path's connections; free it once answered. */
static void path_stop(struct srv_path *p, int err)
{
	struct rtrs_srv_sess *s = p->sess;
	enum rtrs_path_state st;

	pthread_rwlock_wrlock(&p->post_lock);
	st = atomic_load(&p->state);
	if (st == RTRS_PATH_CLOSING || st == RTRS_PATH_CLOSED) {
		pthread_rwlock_unlock(&p->post_lock);
		return;
	}
	srv_path_change_state(p, RTRS_PATH_CLOSING);
	pthread_rwlock_unlock(&p->post_lock);
	loop_timer_arm(&p->hb.timer, 0, 0);
	for (unsigned i = 0; i < p->cid_num; i++)
		fab_con_shutdown(p->cons[i].fc);
	for (unsigned i = 0; i < p->cid_num; i++) {
		struct srv_con *con = &p->cons[i];
		struct rtrs_srv_op *op;

		fab_con_destroy(con->fc);
		con->fc = NULL;
		/* Responses that never got out: the client's path fails them. */
		while ((op = con_pending_pop(con)))
			op_finish(op, p);
	}
	p->cons_destroyed = true;
	srv_path_change_state(p, RTRS_PATH_CLOSED);
	log_info("%s: path closed: %s", p->name, strerror(-err));
	if (p->was_connected && --s->paths_up == 0 && s->link_up) {
		s->link_up = false;
		if (s->ctx->ops.link_ev)
			s->ctx->ops.link_ev(s, RTRS_SRV_LINK_EV_DISCONNECTED, s->ctx->ops.priv);
	}
	loop_queue(s->ctx->loop, &s->ctx->reap_work);
}

static void path_fail_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, fail_work);

	path_stop(p, atomic_load(&p->fail_err));
	/* The reaper skipped this path while this item was queued. */
	loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
}

static void srv_fail_path(struct srv_path *p, int err)
{
	int zero = 0;

	atomic_compare_exchange_strong(&p->fail_err, &zero, err ? err : -EIO);
	loop_queue(p->sess->ctx->loop, &p->fail_work);
}

/*
 * Loop thread: a fence asked for on p. The fenced path is stopped, and the
 * ack waits until its connections are gone and every op it dispatched has
 * been answered (checked again every 5 ms), so nothing of it can land
 * after the ack. An unknown path needs no waiting.
 */
static void srv_fence_check(struct srv_path *p)
{
	struct srv_path *t;
	int err = 0, rc;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED) {
		atomic_store(&p->fence_pending, false);
		return;
	}
	t = path_find(p->sess, p->fence_uuid);
	if (t == p) {
		err = -EINVAL;
	} else if (t) {
		if (atomic_load(&t->state) == RTRS_PATH_CONNECTING ||
		    atomic_load(&t->state) == RTRS_PATH_CONNECTED) {
			log_info("%s: fencing %s for the client", p->name, t->name);
			path_stop(t, -ECONNRESET);
		}
		if (!t->cons_destroyed || atomic_load(&t->inflight)) {
			loop_timer_arm(&p->fence_timer, 5, 0);
			return;
		}
	}
	rtrs_fence_encode(&p->fence_ack, true, p->fence_uuid, err);
	rc = fab_send(p->cons[0].fc, &p->fence_ack, sizeof(p->fence_ack), p->fence_ack_mr.desc,
		      NULL);
	atomic_store(&p->fence_pending, false);
	if (rc)
		srv_fail_path(p, rc);
}

static void path_fence_work(struct loop_work *w)
{
	srv_fence_check(container_of(w, struct srv_path, fence_work));
}

static void path_fence_timer(struct loop_timer *t)
{
	srv_fence_check(container_of(t, struct srv_path, fence_timer));
}

static void path_hb_timer(struct loop_timer *t)
{
	struct srv_path *p = container_of(t, struct srv_path, hb.timer);
	int rc;

	if (atomic_load(&p->state) == RTRS_PATH_CONNECTING) {
		/* A path the client never finished would hold its chunks forever. */
		if (now_ms() - p->last_connreq_ms > p->sess->ctx->opts.connect_timeout_ms) {
			log_err("%s: still connecting after %u ms, closing the path", p->name,
				p->sess->ctx->opts.connect_timeout_ms);
			path_stop(p, -ETIMEDOUT);
		}
		return;
	}
	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED)
		return;
	if (rtrs_hb_tick_expired(&p->hb)) {
		log_err("%s: no heartbeat from the client for %u ms, closing the path", p->name,
			p->hb.interval_ms * p->hb.missed_max);
		path_stop(p, -ETIMEDOUT);
		return;
	}
	rc = fab_write_imm(p->cons[0].fc, p->clt_imm.addr, p->clt_imm.key,
			   rtrs_to_imm(RTRS_HB_MSG_IMM, 0));
	if (rc && rc != -EAGAIN)
		path_stop(p, rc);
}

static bool name_taken(struct rtrs_srv_ctx *ctx, const struct rtrs_srv_sess *self,
		       const char *name)
{
	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		if (s != self && !strcmp(s->name, name))
			return true;
	return false;
}

static void path_info_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, info_work);
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_srv_ctx *ctx = s->ctx;
	struct rtrs_desc d;
	int rc;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTING) {
		/* The reaper skipped this path while this item was queued. */
		loop_queue(ctx->loop, &ctx->reap_work);
		return;
	}
	if (p->nr_accepted != p->cid_num) {
		log_err("%s: info request with %u of %u connections", p->name, p->nr_accepted,
			p->cid_num);
		path_stop(p, -EPROTO);
		return;
	}
	if (s->name[0] && strcmp(s->name, p->info.pathname)) {
		log_err("%s: path names session %s, which differs", p->name, p->info.pathname);
		path_stop(p, -EINVAL);
		return;
	}
	if (!s->name[0]) {
		if (name_taken(ctx, s, p->info.pathname)) {
			log_err("%s: session name %s is already in use", p->name, p->info.pathname);
			path_stop(p, -EPERM);
			return;
		}
		snprintf(s->name, sizeof(s->name), "%s", p->info.pathname);
	}
	snprintf(p->name, sizeof(p->name), "%s/%s", s->name, p->peer);
	p->clt_imm = (struct rtrs_desc){ .addr = p->info.imm_addr, .key = p->info.imm_key };

	d = (struct rtrs_desc){ .addr = s->chunk_mr.base, .key = s->chunk_mr.key,
				.len = (uint32_t)s->chunk_bytes };
	if (s->chunk_bytes > UINT32_MAX) {
		log_err("%s: chunk area of %zu bytes does not fit one descriptor", p->name,
			s->chunk_bytes);
		path_stop(p, -EOVERFLOW);
		return;
	}
	p->info_rsp_len = rtrs_info_rsp_size(1);
	p->info_rsp = calloc(1, p->info_rsp_len);
	if (!p->info_rsp) {
		path_stop(p, -ENOMEM);
		return;
	}
	rtrs_info_rsp_encode(p->info_rsp, &d, 1);
	rc = fab_mr_reg(ctx->fab, p->info_rsp, p->info_rsp_len, FAB_MR_LOCAL, &p->info_rsp_mr);
	if (!rc)
		rc = fab_mr_reg(ctx->fab, &p->fence_ack, sizeof(p->fence_ack), FAB_MR_LOCAL,
				&p->fence_ack_mr);
	if (rc) {
		path_stop(p, rc);
		return;
	}

	/* IO may follow the info response at once: be ready for it first. */
	if (!s->link_up && ctx->ops.link_ev) {
		rc = ctx->ops.link_ev(s, RTRS_SRV_LINK_EV_CONNECTED, ctx->ops.priv);
		if (rc) {
			log_err("%s: session refused by its user: %s", p->name, strerror(-rc));
			path_stop(p, rc < 0 ? rc : -rc);
			return;
		}
	}
	s->link_up = true;
	s->paths_up++;
	p->was_connected = true;
	pthread_rwlock_wrlock(&p->post_lock);
	srv_path_change_state(p, RTRS_PATH_CONNECTED);
	pthread_rwlock_unlock(&p->post_lock);
	rc = fab_send(p->cons[0].fc, p->info_rsp, p->info_rsp_len, p->info_rsp_mr.desc, NULL);
	if (rc) {
		path_stop(p, rc);
		return;
	}
	log_info("%s: path connected (%u connections)", p->name, p->cid_num);
}

static int path_create(struct rtrs_srv_sess *s, const struct rtrs_conn_req *req,
		       const char *peer, struct srv_path **out)
{
	struct rtrs_srv_ctx *ctx = s->ctx;
	pthread_rwlockattr_t attr;
	struct srv_path *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	p->cons = calloc(req->cid_num, sizeof(*p->cons));
	if (!p->cons) {
		free(p);
		return -ENOMEM;
	}
	p->sess = s;
	memcpy(p->uuid, req->sess_uuid, RTRS_UUID_LEN);
	snprintf(p->peer, sizeof(p->peer), "%s", peer);
	snprintf(p->name, sizeof(p->name), "%s/%s", s->name[0] ? s->name : "(new)", peer);
	p->cid_num = req->cid_num;
	atomic_init(&p->state, RTRS_PATH_CONNECTING);
	pthread_rwlockattr_init(&attr);
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&p->post_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	for (unsigned i = 0; i < p->cid_num; i++) {
		p->cons[i].path = p;
		p->cons[i].cid = i;
		pthread_mutex_init(&p->cons[i].pending_lock, NULL);
	}
	p->hb.interval_ms = ctx->opts.hb_interval_ms;
	p->hb.missed_max = ctx->opts.hb_missed_max;
	loop_work_init(&p->info_work, path_info_work);
	loop_work_init(&p->fail_work, path_fail_work);
	loop_work_init(&p->fence_work, path_fence_work);
	p->fence_timer.h.fd = -1;
	if (loop_timer_init(ctx->loop, &p->fence_timer, path_fence_timer)) {
		pthread_rwlock_destroy(&p->post_lock);
		free(p->cons);
		free(p);
		return -ENOMEM;
	}
	p->last_connreq_ms = now_ms();
	rc = loop_timer_init(ctx->loop, &p->hb.timer, path_hb_timer);
	if (rc) {
		pthread_rwlock_destroy(&p->post_lock);
		free(p->cons);
		free(p);
		return rc;
	}
	/* Ticks from now on: the zombie check while connecting, then heartbeats. */
	loop_timer_arm(&p->hb.timer, p->hb.interval_ms, p->hb.interval_ms);
	p->next = s->paths;
	s->paths = p;
	s->paths_num++;
	*out = p;
	return 0;
}

static void srv_reject(struct rtrs_srv_ctx *ctx, struct fab_connreq *req, const char *peer,
		       int err, const char *why)
{
	struct rtrs_conn_rsp rsp = { .err = err };
	struct rtrs_msg_conn_rsp msg;

	log_warn("connection from %s rejected: %s (%s)", peer, why, strerror(-err));
	rtrs_conn_rsp_encode(&msg, &rsp);
	/* Only magic, version and errno matter in a reject. */
	fab_reject(ctx->lst, req, &msg, offsetof(struct rtrs_msg_conn_rsp, queue_depth));
}

static struct rtrs_srv_sess *sess_find(struct rtrs_srv_ctx *ctx, const uint8_t *uuid)
{
	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		if (!memcmp(s->paths_uuid, uuid, RTRS_UUID_LEN))
			return s;
	return NULL;
}

static struct srv_path *path_find(struct rtrs_srv_sess *s, const uint8_t *uuid)
{
	for (struct srv_path *p = s->paths; p; p = p->next)
		if (!memcmp(p->uuid, uuid, RTRS_UUID_LEN))
			return p;
	return NULL;
}

static void srv_on_connreq(void *priv, struct fab_connreq *creq, const void *data, size_t len)
{
	struct rtrs_srv_ctx *ctx = priv;
	const struct fab_attr *a = fab_attr(ctx->fab);
	struct rtrs_conn_req req;
	struct rtrs_srv_sess *s;
	struct srv_path *p;
	const char *why = NULL;
	char peer[64], name[RTRS_NAME_MAX + 96];
	int rc;

	fab_connreq_peer(creq, peer, sizeof(peer));
	if (ctx->closing) {
		srv_reject(ctx, creq, peer, -ESHUTDOWN, "server is closing");
		return;
	}
	rc = rtrs_conn_req_decode(data, len, &req, &why);
	if (rc) {
		srv_reject(ctx, creq, peer, rc, why);
		return;
	}
	if (req.cid_num > ctx->opts.max_cons_per_path) {
		srv_reject(ctx, creq, peer, -EINVAL, "more connections per path than allowed");
		return;
	}
	s = sess_find(ctx, req.paths_uuid);
	if (!s) {
		if (!req.first_conn) {
			srv_reject(ctx, creq, peer, -ENXIO,
				   "unknown session and not a first connection");
			return;
		}
		rc = sess_create(ctx, req.paths_uuid, &s);
		if (rc) {
			srv_reject(ctx, creq, peer, rc, "cannot allocate session memory");
			return;
		}
	}
	p = path_find(s, req.sess_uuid);
	if (!p) {
		if (s->paths_num >= RTRS_MAX_PATHS) {
			srv_reject(ctx, creq, peer, -ECONNRESET, "too many paths in the session");
			return;
		}
		rc = path_create(s, &req, peer, &p);
		if (rc) {
			srv_reject(ctx, creq, peer, rc, "cannot allocate the path");
			if (!s->paths)
				sess_free(s);
			return;
		}
	} else if (req.cid == 0 && (atomic_load(&p->state) == RTRS_PATH_CONNECTED ||
				    p->cons[0].fc)) {
		/*
		 * The client starts this path again: it has given up on the old
		 * one, which we may not have noticed yet. Close it; the client's
		 * next attempt finds the path gone (or being freed).
		 */
		srv_reject(ctx, creq, peer, -EAGAIN, "the client reconnects a path still open here");
		path_stop(p, -ECONNRESET);
		return;
	} else if (atomic_load(&p->state) != RTRS_PATH_CONNECTING || req.cid_num != p->cid_num ||
		   p->cons[req.cid].fc) {
		srv_reject(ctx, creq, peer, -EEXIST, "connection does not fit the path's state");
		/* A path stuck half-connected would refuse reconnects forever. */
		if (atomic_load(&p->state) == RTRS_PATH_CONNECTING &&
		    now_ms() - p->last_connreq_ms > p->sess->ctx->opts.connect_timeout_ms)
			path_stop(p, -ETIMEDOUT);
		return;
	}
	p->last_connreq_ms = now_ms();

	struct rtrs_conn_rsp rsp = {
		.queue_depth = (uint16_t)s->queue_depth,
		.max_io_size = s->chunk_size - RTRS_MAX_HDR_SIZE,
		.max_hdr_size = RTRS_MAX_HDR_SIZE,
		.flags = RTRS_MSG_FENCE_F,
		.imm_desc = { .addr = s->imm_mr.base, .key = s->imm_mr.key, .len = RTRS_IMM_REGION },
	};
	struct rtrs_msg_conn_rsp msg;
	struct fab_con_cfg cfg = {
		.ops = &srv_con_ops, .priv = &p->cons[req.cid], .name = name,
		.tx_depth = s->queue_depth + 16,
		/* verbs: every incoming immediate takes a receive, admin IO too */
		.rx_depth = a->rx_cq_data ? s->queue_depth + 16 :
			    req.cid ? 0 : RTRS_ADMIN_RX_DEPTH,
		.rx_size = req.cid ? 0 : RTRS_ADMIN_MSG_SIZE,
	};

	snprintf(name, sizeof(name), "%s#%u", p->name, req.cid);
	rtrs_conn_rsp_encode(&msg, &rsp);
	rc = fab_con_accept(ctx->fab, creq, &cfg, &msg, sizeof(msg), &p->cons[req.cid].fc);
	if (rc) {
		log_err("%s: accepting connection %u failed: %s", p->name, req.cid, strerror(-rc));
		srv_reject(ctx, creq, peer, rc, "cannot set up the connection");
		path_stop(p, rc);
		return;
	}
	p->nr_accepted++;
}

/* ---- listening ------------------------------------------------------------------ */

static void srv_lst_cb(struct loop_fd *h, uint32_t events)
{
	struct rtrs_srv_ctx *ctx = container_of(h, struct rtrs_srv_ctx, lst_h);

	fab_lst_process(ctx->lst, srv_on_connreq, ctx);
}

static void srv_listen_timer(struct loop_timer *t)
{
	struct rtrs_srv_ctx *ctx = container_of(t, struct rtrs_srv_ctx, listen_timer);
	char port[8];
	int rc;

	snprintf(port, sizeof(port), "%u", ctx->opts.port);
	if (!ctx->fab) {
		rc = fab_open(ctx->provider, NULL, ctx->addr, port, true, ctx->opts.queue_depth + 16,
			      &ctx->fab);
		if (rc)
			goto retry;
	}
	rc = fab_listen(ctx->fab, &ctx->lst);
	if (rc)
		goto retry;
	ctx->lst_h.fd = fab_lst_fd(ctx->lst);
	ctx->lst_h.cb = srv_lst_cb;
	rc = loop_add_fd(ctx->loop, &ctx->lst_h, EPOLLIN);
	if (rc) {
		fab_lst_close(ctx->lst);
		ctx->lst = NULL;
		goto retry;
	}
	loop_timer_arm(&ctx->listen_timer, 0, 0);
	pthread_mutex_lock(&ctx->lock);
	ctx->listening = true;
	ctx->port = fab_lst_port(ctx->lst);
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	log_info("listening on %s:%d (%s), queue depth %u, chunk %u", ctx->addr, ctx->port,
		 ctx->provider, ctx->opts.queue_depth, ctx->opts.max_chunk_size);
	/* Requests that arrived between listen and the fd being watched. */
	srv_lst_cb(&ctx->lst_h, EPOLLIN);
	return;

retry:
	if (ctx->listen_failures++ == 0)
		log_warn("cannot listen on %s:%s with provider %s yet (%s); retrying every %u ms",
			 ctx->addr, port, ctx->provider, strerror(-rc), ctx->opts.listen_retry_ms);
	if (ctx->fab && !ctx->lst) {
		fab_close(ctx->fab);
		ctx->fab = NULL;
	}
	loop_timer_arm(&ctx->listen_timer, ctx->opts.listen_retry_ms, 0);
}

static int srv_opts_validate(const struct rtrs_srv_ops *ops, const struct rtrs_srv_opts *o)
{
	if (!ops || !ops->rdma_ev || !o || o->size < sizeof(*o))
		return -EINVAL;
	if (o->queue_depth == 0 || o->queue_depth > RTRS_MAX_SESS_QUEUE_DEPTH) {
		log_err("server: queue depth %u out of range 1..%u", o->queue_depth,
			RTRS_MAX_SESS_QUEUE_DEPTH);
		return -EINVAL;
	}
	if (!is_pow2(o->max_chunk_size) || o->max_chunk_size < RTRS_MIN_CHUNK_SIZE ||
	    o->max_chunk_size > RTRS_MAX_CHUNK_SIZE) {
		log_err("server: chunk size %u must be a power of two in %u..%u",
			o->max_chunk_size, RTRS_MIN_CHUNK_SIZE, RTRS_MAX_CHUNK_SIZE);
		return -EINVAL;
	}
	if (!rtrs_imm_fits(o->queue_depth, o->max_chunk_size)) {
		log_err("server: queue depth %u and chunk size %u do not fit the 28-bit immediate",
			o->queue_depth, o->max_chunk_size);
		return -EINVAL;
	}
	if ((uint64_t)o->queue_depth * o->max_chunk_size > UINT32_MAX) {
		log_err("server: queue depth x chunk size exceeds 4 GiB");
		return -EINVAL;
	}
	if (!o->hb_interval_ms || !o->hb_missed_max || !o->listen_retry_ms ||
	    o->max_cons_per_path < 2 || o->max_cons_per_path > RTRS_MAX_CONNS ||
	    !o->connect_timeout_ms)
		return -EINVAL;
	return 0;
}

RTRS_EXPORT
int rtrs_srv_open(const struct rtrs_srv_ops *ops, const struct rtrs_srv_opts *o,
		  struct rtrs_srv_ctx **out)
{
	struct rtrs_srv_ctx *ctx;
	int rc;

	rc = srv_opts_validate(ops, o);
	if (rc)
		return rc;
	ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	ctx->ops = *ops;
	ctx->opts = *o;
	snprintf(ctx->addr, sizeof(ctx->addr), "%s", o->addr ? o->addr : "0.0.0.0");
	snprintf(ctx->provider, sizeof(ctx->provider), "%s", o->provider ? o->provider : "tcp");
	ctx->opts.addr = ctx->addr;
	ctx->opts.provider = ctx->provider;
	ctx->listen_timer.h.fd = -1;
	loop_work_init(&ctx->reap_work, srv_reap_work);
	pthread_mutex_init(&ctx->lock, NULL);
	cond_init_mono(&ctx->cond);
	rc = loop_create("rtrs-srv", &ctx->loop);
	if (rc)
		goto out_free;
	rc = loop_timer_init(ctx->loop, &ctx->listen_timer, srv_listen_timer);
	if (rc)
		goto out_free;
	/* Listening starts on the loop thread, never here (no network at init). */
	loop_timer_arm(&ctx->listen_timer, 1, 0);
	*out = ctx;
	return 0;

out_free:
	loop_destroy(ctx->loop);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	free(ctx);
	return rc;
}

RTRS_EXPORT
int rtrs_srv_wait_listening(struct rtrs_srv_ctx *ctx, unsigned timeout_ms)
{
	struct timespec dl = deadline_ms(timeout_ms);
	int rc = 0;

	pthread_mutex_lock(&ctx->lock);
	while (!ctx->listening && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&ctx->cond, &ctx->lock, &dl);
	rc = ctx->listening ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&ctx->lock);
	return rc;
}

RTRS_EXPORT
int rtrs_srv_get_port(struct rtrs_srv_ctx *ctx)
{
	int port;

	pthread_mutex_lock(&ctx->lock);
	port = ctx->listening ? ctx->port : -ENOTCONN;
	pthread_mutex_unlock(&ctx->lock);
	return port;
}

static void srv_close_call(void *arg)
{
	struct rtrs_srv_ctx *ctx = arg;

	ctx->closing = true;
	loop_timer_fini(&ctx->listen_timer);
	if (ctx->lst) {
		loop_del_fd(ctx->loop, &ctx->lst_h);
		fab_lst_close(ctx->lst);
		ctx->lst = NULL;
	}
	for (struct rtrs_srv_sess *s = ctx->sessions, *sn; s; s = sn) {
		sn = s->next;
		for (struct srv_path *p = s->paths, *pn; p; p = pn) {
			pn = p->next;
			path_stop(p, -ESHUTDOWN);
		}
	}
}

RTRS_EXPORT
void rtrs_srv_close(struct rtrs_srv_ctx *ctx)
{
	if (!ctx)
		return;
	loop_call(ctx->loop, srv_close_call, ctx);
	/* Sessions go once the user has answered every IO it holds. */
	pthread_mutex_lock(&ctx->lock);
	while (ctx->nr_sessions)
		pthread_cond_wait(&ctx->cond, &ctx->lock);
	pthread_mutex_unlock(&ctx->lock);
	loop_destroy(ctx->loop);
	fab_close(ctx->fab);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	free(ctx);
}

RTRS_EXPORT
void rtrs_srv_set_sess_priv(struct rtrs_srv_sess *s, void *priv)
{
	s->priv = priv;
}

RTRS_EXPORT
void *rtrs_srv_get_sess_priv(struct rtrs_srv_sess *s)
{
	return s->priv;
}

RTRS_EXPORT
int rtrs_srv_get_sess_name(struct rtrs_srv_sess *s, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s", s->name);

	return n >= 0 && (size_t)n < len ? 0 : -ENOBUFS;
}

RTRS_EXPORT
int rtrs_srv_get_queue_depth(struct rtrs_srv_sess *s)
{
	return (int)s->queue_depth;
}

RTRS_EXPORT
struct rtrs_srv_sess *rtrs_srv_op_sess(struct rtrs_srv_op *op)
{
	return op->sess;
}
