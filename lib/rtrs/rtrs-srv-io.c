/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: IO. A request arrives as a write with immediate data on an
 * IO connection's completion thread (srv_handle_req), is validated and
 * handed to the user (rdma_ev); the user answers with rtrs_srv_resp_rdma,
 * which posts the response: for a read the data written into the
 * client's buffers, then the immediate with the op's id and errno
 * (op_post). Responses that meet a full send queue wait on their
 * connection (rtrs-path.c).
 *
 * An op (one per chunk) is FREE -> BUSY (the user owns it) -> RESPONDING
 * (the response is being posted, or waits for room) -> SENT (its last write
 * was handed to the fabric; the responder reads nothing of the op any more)
 * -> FREE. A client may reuse a chunk once it has the response, which can
 * be before the responder marks the op FREE: a request may take a FREE or
 * SENT op. One that finds it BUSY or RESPONDING broke the protocol.
 */
#include <errno.h>
#include <string.h>

#include "rtrs-srv-pri.h"

/*
 * The op's answer is out (or dropped). Callers keep p alive: they hold its
 * post_lock for reading, or run on a thread the path's teardown waits for.
 */
/*
 * The op ended: a request that waits for its chunk (op_defer) goes to its
 * connection, which runs it on its own thread (srv_post_pending).
 */
static void op_handover(struct rtrs_srv_op *op)
{
	struct rtrs_srv_sess *s = op->sess;

	pthread_mutex_lock(&s->defer_lock);
	if (op->defer_con && !op->defer_queued) {
		op->defer_queued = true;
		op->defer.id = op->id;
		rtrs_con_queue(&op->defer_con->c, &op->defer);
	}
	pthread_mutex_unlock(&s->defer_lock);
}

/*
 * The responder's end of its take: mine is the state word it left the op
 * in (RESPONDING or SENT, with its take count). From SENT the op may
 * already be BUSY with the client's next request: then it is not freed,
 * and that request's end hands over a request waiting for the chunk.
 */
static void op_finish(struct rtrs_srv_op *op, struct srv_path *p, unsigned mine)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	bool closing = atomic_load(&p->base.state) != RTRS_PATH_CONNECTED;

	/* After the state (op_defer stores deferred, then reads the state). */
	if (atomic_compare_exchange_strong(&op->state, &mine, op_with(mine, OP_FREE)) &&
	    atomic_load(&op->deferred))
		op_handover(op);
	if (atomic_fetch_sub(&p->base.inflight, 1) == 1 && closing)
		loop_queue(ctx->loop, &ctx->reap_work);
}

/*
 * Posts the end of a response: wrs[0..n), the last carrying the response
 * immediate (more than one only where the fabric chains them). The op
 * turns SENT first, since the client may answer the response at once;
 * nothing of the op is read after that. On failure the op goes back to
 * RESPONDING, unless a request took it meanwhile, which only a client that
 * reuses a chunk before its response can do: then the response is dropped
 * and -EPROTO fails the path.
 */
static int op_post_last(struct rtrs_srv_op *op, struct srv_path *p, struct fab_con *fc,
			const struct fab_wr *wrs, size_t n)
{
	/* RESPONDING with this take's count: nobody else moves the op from there. */
	unsigned resp = atomic_load(&op->state), sent = op_with(resp, OP_SENT), expected = sent;
	int rc;

	atomic_store(&op->state, sent);
	rc = fab_post(fc, wrs, n, NULL);
	if (!rc) {
		op_finish(op, p, sent);
		return 0;
	}
	if (atomic_compare_exchange_strong(&op->state, &expected, resp))
		return rc;
	log_err_rl("%s: chunk %u reused before its response", path_name(p), op->id);
	op_finish(op, p, sent);
	return -EPROTO;
}

/*
 * An op that ends without a response still gives its chunk a key again:
 * the client learns it with the next fence ack or info response. If the
 * registration fails, srv_keys_repair tries again before either goes out.
 */
static void op_drop(struct rtrs_srv_op *op, struct srv_path *p)
{
	struct rtrs_srv_sess *s = op->sess;

	/* A kernel client's keys are its path's, which is going away. */
	if (s->inval && !s->kinval && !op->rekeyed) {
		int rc = srv_chunk_rekey(s, srv_op_keys(op), op->id, NULL);

		if (rc)
			log_err_rl("%s: chunk %u keeps no key for now: %s", s->name, op->id, strerror(-rc));
		op->rekeyed = true;
	}
	/* RESPONDING, this take's: the op is the caller's until it is FREE. */
	op_finish(op, p, atomic_load(&op->state));
}

/* A response's operations, built before they are posted. */
#define RESP_WR_MAX 8
#define RESP_RMA_MAX 8 /* remote ranges per write, at most */

struct resp_chain {
	struct fab_wr wr[RESP_WR_MAX];
	struct iovec iov[RESP_WR_MAX][2];
	void *desc[RESP_WR_MAX][2];
	struct fab_rma rma[RESP_WR_MAX][RESP_RMA_MAX + 1];
	size_t n;
};

/*
 * Posts what is left of op's response: read data to the client's buffers,
 * at most rma_iov_limit descriptors per write, the last one with the
 * response immediate; or an empty write with it. With always_invalidate
 * the immediate comes with the chunk's new key, written into the client's
 * key slot for the chunk. Where the fabric chains operations (verbs) the
 * whole response is one post, as the kernel's server makes it; elsewhere
 * each goes alone and op records how far it got. 0 when all is posted.
 */
static int op_post(struct rtrs_srv_op *op)
{
	struct srv_path *p = op->path;
	struct rtrs_srv_sess *s = op->sess;
	struct fab_con *fc = op->con->c.fc;
	const struct fab_attr *a = fab_attr(s->ctx->fab);
	size_t per = MIN(a->rma_iov_limit, RESP_RMA_MAX);
	bool data = op->dir == RTRS_READ && !op->err && op->data_len && op->sg_cnt;
	/*
	 * A read that asked for invalidation (a kernel client's: its buffer is
	 * a fast registration) is answered as the kernel's server does: the
	 * data, a SEND_WITH_INV of the client's key, then the immediate of
	 * type IO_RSP_W_INV. Without the SEND_WITH_INV the kernel client
	 * invalidates the key itself, with a warning on its console.
	 */
	bool inv = op->need_inval && a->send_inv;
	uint32_t imm = inv ? rtrs_to_io_rsp_w_inv_imm(op->id, op->err) :
			     rtrs_to_io_rsp_imm(op->id, op->err);
	size_t sg = op->next_sg;
	uint64_t local = op->next_local;
	struct rtrs_msg_rkey_rsp msg;
	struct resp_chain ch;
	struct fab_wr *w;
	int rc;

	if (s->inval && !op->rekeyed) {
		/* -EAGAIN: the window's bind met a full send queue; it waits with the rest. */
		rc = srv_chunk_rekey(s, srv_op_keys(op), op->id, fc);
		if (rc)
			return rc;
		op->rekeyed = true;
	}
	ch.n = 0;
	while (data && sg < op->sg_cnt) {
		size_t cnt = MIN((size_t)op->sg_cnt - sg, per), i = ch.n;
		bool last = sg + cnt == op->sg_cnt;
		uint64_t len = 0;

		w = &ch.wr[i];
		for (size_t j = 0; j < cnt; j++) {
			const struct rtrs_desc *d = &op->sg[sg + j];

			ch.rma[i][j] = (struct fab_rma){ .addr = d->addr, .len = d->len, .key = d->key };
			len += d->len;
		}
		ch.iov[i][0] = (struct iovec){ s->chunk_bases[op->id] + local, len };
		ch.desc[i][0] = s->chunk_mr.desc;
		*w = (struct fab_wr){ .kind = FAB_WR_WRITE, .iov = ch.iov[i], .desc = ch.desc[i],
				      .iov_cnt = 1, .rma = ch.rma[i], .rma_cnt = cnt };
		ch.n++;
		if (last && !s->inval && !inv) {
			w->with_imm = true;
			w->imm = imm;
			return op_post_last(op, p, fc, ch.wr, ch.n);
		}
		if (last && cnt < per && !inv && !s->kinval && a->iov_limit >= 2) {
			/* The data and the chunk's new key in one write, with the immediate. */
			ch.iov[i][1] = (struct iovec){ &s->keys.msgs[op->id], RTRS_RKEY_SLOT };
			ch.desc[i][1] = s->keys.msgs_mr.desc;
			ch.rma[i][cnt] = (struct fab_rma){
				.addr = p->base.peer_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
				.len = RTRS_RKEY_SLOT, .key = p->base.peer_imm.key,
			};
			w->iov_cnt = 2;
			w->rma_cnt = cnt + 1;
			w->with_imm = true;
			w->imm = imm;
			return op_post_last(op, p, fc, ch.wr, ch.n);
		}
		sg += cnt;
		local += len;
		/* Alone, or a chain that has no room left for the response's end. */
		if (!a->chain || ch.n == RESP_WR_MAX - 2) {
			rc = fab_post(fc, ch.wr, ch.n, NULL);
			if (rc)
				return rc;
			op->next_sg = sg;
			op->next_local = local;
			ch.n = 0;
		}
	}
	if (inv && !op->inv_sent) {
		ch.wr[ch.n++] = (struct fab_wr){ .kind = FAB_WR_SEND_INV,
						 .rkey = (uint32_t)op->sg[0].key };
		if (!a->chain) {
			rc = fab_post(fc, ch.wr, ch.n, NULL);
			if (rc)
				return rc;
			op->inv_sent = true;
			ch.n = 0;
		}
	}
	w = &ch.wr[ch.n++];
	if (s->kinval) {
		/*
		 * The kernel's way: the chunk's new key in an RKEY_RSP, sent with
		 * the response's immediate (its client reads the message, then
		 * the immediate).
		 */
		rtrs_rkey_rsp_encode(&msg, op->id, (uint32_t)srv_chunk_key(s, &p->keys, op->id));
		*w = (struct fab_wr){ .kind = FAB_WR_SEND_IMM, .buf = &msg, .len = sizeof(msg),
				      .imm = imm };
	} else if (s->inval && a->inject_size >= RTRS_RKEY_SLOT) {
		/* Small: copied with the immediate in one injected write. */
		*w = (struct fab_wr){
			.kind = FAB_WR_WRITE_IMM, .buf = &s->keys.msgs[op->id], .len = RTRS_RKEY_SLOT,
			.addr = p->base.peer_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
			.key = p->base.peer_imm.key, .imm = imm,
		};
	} else if (s->inval) {
		size_t i = ch.n - 1;

		ch.iov[i][0] = (struct iovec){ &s->keys.msgs[op->id], RTRS_RKEY_SLOT };
		ch.desc[i][0] = s->keys.msgs_mr.desc;
		ch.rma[i][0] = (struct fab_rma){
			.addr = p->base.peer_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
			.len = RTRS_RKEY_SLOT, .key = p->base.peer_imm.key,
		};
		*w = (struct fab_wr){ .kind = FAB_WR_WRITE, .iov = ch.iov[i], .desc = ch.desc[i],
				      .iov_cnt = 1, .rma = ch.rma[i], .rma_cnt = 1,
				      .with_imm = true, .imm = imm };
	} else {
		*w = (struct fab_wr){ .kind = FAB_WR_WRITE_IMM, .addr = p->base.peer_imm.addr,
				      .key = p->base.peer_imm.key, .imm = imm };
	}
	return op_post_last(op, p, fc, ch.wr, ch.n);
}

static void srv_handle_req(struct srv_con *con, uint32_t payload);

/* Takes op's waiting request off it (defer_lock held); its payload. */
static uint32_t op_defer_take(struct rtrs_srv_op *op)
{
	op->defer_con = NULL;
	op->defer_queued = false;
	atomic_store(&op->deferred, false);
	return op->defer_payload;
}

/*
 * Completion thread (kick): a response that met a full send queue, or a
 * request whose chunk was busy, now free (op_handover).
 */
int srv_post_pending(struct rtrs_con *con, struct rtrs_pending *it)
{
	struct srv_con *sc = container_of(con, struct srv_con, c);
	struct rtrs_srv_sess *s = sc->path->sess;
	struct rtrs_srv_op *op = &s->ops[it->id];
	uint32_t payload;

	if (it != &op->defer)
		return op_post(op);
	pthread_mutex_lock(&s->defer_lock);
	payload = op_defer_take(op);
	pthread_mutex_unlock(&s->defer_lock);
	srv_handle_req(sc, payload);
	return 0;
}

/*
 * A waiting response will not go out: its post failed (err) or its
 * connection is gone (0). A waiting request is forgotten: the client's
 * path fails it.
 */
void srv_drop_pending(struct rtrs_con *con, struct rtrs_pending *it, int err)
{
	struct srv_path *p = container_of(con, struct srv_con, c)->path;
	struct rtrs_srv_op *op = &p->sess->ops[it->id];

	if (it == &op->defer) {
		pthread_mutex_lock(&p->sess->defer_lock);
		op_defer_take(op);
		pthread_mutex_unlock(&p->sess->defer_lock);
	} else if (err != -EPROTO) { /* -EPROTO: op_post_last finished it */
		op_drop(op, p);
	}
}

/*
 * The answer to op's take whose state word is expected (OP_BUSY): only
 * that take's, never a later one's (a later request of the chunk).
 */
static int op_respond(struct rtrs_srv_op *op, unsigned expected, int err)
{
	struct srv_path *p;
	int rc;

	if (op_st(expected) != OP_BUSY ||
	    !atomic_compare_exchange_strong(&op->state, &expected,
					    op_with(expected, OP_RESPONDING))) {
		log_err_rl("%s: answer to request %u that is not waiting for one",
			   op->sess->name, op->id);
		return -EINVAL;
	}
	tsan_release(op); /* the chunk's contents: the client reuses it after this response */
	p = op->path;
	op->err = err;
	op->next_sg = 0;
	op->inv_sent = false;
	op->next_local = 0;
	pthread_rwlock_rdlock(&p->base.post_lock);
	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		/* The client fails this IO over or gets an error from its path. */
		op_drop(op, p);
		pthread_rwlock_unlock(&p->base.post_lock);
		return -ENOTCONN;
	}
	rc = op_post(op);
	if (rc == -EAGAIN) {
		op->pend.id = op->id;
		rtrs_con_pending_add(&op->con->c, &op->pend);
		rc = 0;
	} else if (rc) {
		log_err_rl("%s: posting a response failed: %s", path_name(p), strerror(-rc));
		if (rc != -EPROTO) /* -EPROTO: op_post_last finished it */
			op_drop(op, p);
		srv_fail_path(p, rc);
	}
	pthread_rwlock_unlock(&p->base.post_lock);
	return rc;
}

RTRS_EXPORT
int rtrs_srv_resp_rdma(struct rtrs_srv_op *op, int err)
{
	if (!op)
		return -EINVAL;
	return op_respond(op, atomic_load(&op->state), err);
}

/*
 * Hands op's request to the user, the chunk's data now the server's alone.
 * An error it returns is answered for it, but only while its take is still
 * unanswered: a user that answered and also returned an error (the answer's
 * own, say, when the path had gone) is not answered twice, which once its
 * op was dropped and taken by the client's next request for the chunk (a
 * retry on another path) would have answered that request instead.
 */
static void op_deliver(struct rtrs_srv_op *op)
{
	struct rtrs_srv_ctx *ctx = op->sess->ctx;
	char *base = op->sess->chunk_bases[op->id];
	unsigned taken = atomic_load(&op->state);
	int rc;

	rc = ctx->ops.rdma_ev(ctx->ops.priv, op, op->dir, base, op->data_len,
			      base + op->data_len, op->usr_len);
	if (!rc)
		return;
	if (atomic_load(&op->state) != taken) {
		log_err_rl("%s: request %u was answered, and its handler also returned %s: "
			   "not answered again", op->sess->name, op->id, strerror(rc < 0 ? -rc : rc));
		return;
	}
	op_respond(op, taken, rc < 0 ? rc : -rc);
}

/*
 * A kernel client sends a request again on another path when its path
 * fails (failover), with the same chunk, which this server may still be
 * busy with: the first try is with the user, or its unbind is on its
 * way, and the server may not know yet that its path is gone. The
 * kernel's server has an op per path and takes the second try at once;
 * here it waits for the op to end (op_handover), the path it came on
 * left up. A client of this project fences instead (no request before
 * the fence ack): it never gets here. 0: it waits (or its path closes:
 * dropped); -EAGAIN: the op is ours to take now; -EPROTO: a request
 * waits for the chunk already.
 */
static int op_defer(struct rtrs_srv_op *op, struct srv_con *con, uint32_t payload)
{
	struct rtrs_srv_sess *s = op->sess;
	struct srv_path *p = con->path;
	unsigned state;
	int rc = 0;

	pthread_mutex_lock(&s->defer_lock);
	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		rc = -ENOTCONN; /* srv_defers_cancel ran or runs: nobody would take it */
	} else if (op->defer_con) {
		rc = -EPROTO;
	} else {
		void (*hook)(void) = atomic_load(&rtrs_test_srv_defer_checked);

		if (hook)
			hook();
		op->defer_con = con;
		op->defer_payload = payload;
		op->defer_queued = false;
		atomic_store(&op->deferred, true);
		/* After deferred (op_finish stores the state, then reads deferred). */
		state = op_st(atomic_load(&op->state));
		if (state != OP_BUSY && state != OP_RESPONDING) {
			op_defer_take(op);
			rc = -EAGAIN;
		}
	}
	pthread_mutex_unlock(&s->defer_lock);
	if (!rc)
		log_warn_rl("%s: chunk %u is still busy with an earlier request (a failover?): "
			    "this one waits for it", path_name(p), op->id);
	return rc == -ENOTCONN ? 0 : rc;
}

/*
 * Loop thread, p closing (no request defers on it any more): requests
 * that wait on p for their chunk are forgotten; those already handed over
 * are dropped with p's connections (srv_drop_pending).
 */
void srv_defers_cancel(struct srv_path *p)
{
	struct rtrs_srv_sess *s = p->sess;

	/*
	 * Every op under defer_lock, deferred or not: an op_defer that read
	 * the path CONNECTED before it went CLOSING may not have stored its
	 * request yet; the lock orders it before this look (it is seen here)
	 * or after (it sees CLOSING and does not defer).
	 */
	for (uint32_t i = 0; s->ops && i < s->queue_depth; i++) {
		struct rtrs_srv_op *op = &s->ops[i];

		pthread_mutex_lock(&s->defer_lock);
		if (op->defer_con && op->defer_con->path == p && !op->defer_queued)
			op_defer_take(op);
		pthread_mutex_unlock(&s->defer_lock);
	}
	void (*hook)(void) = atomic_load(&rtrs_test_srv_defers_cancelled);

	if (hook)
		hook();
}

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
	uint32_t chunk;
	unsigned state;
	int rc;

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		log_err_rl("%s: IO before the path is established", path_name(p));
		srv_fail_path(p, -EPROTO);
		return;
	}
	chunk = rtrs_io_req_chunk(s->queue_depth, payload);
	if (chunk < s->queue_depth)
		tsan_acquire(&s->ops[chunk]); /* ordered after its last response, by the wire */
	/* Decoded into this connection's scratch: the op may still be busy. */
	rc = rtrs_io_req_decode(payload, &lim, s->chunk_bases, con->sg_scratch, &req, &why);
	if (rc) {
		log_err_rl("%s: invalid IO request: %s", path_name(p), why);
		srv_fail_path(p, rc);
		return;
	}
	op = &s->ops[req.chunk];
	/* FREE, or SENT (its response is out): both are ours. */
	for (;;) {
		state = atomic_load(&op->state);
		if (op_st(state) == OP_BUSY || op_st(state) == OP_RESPONDING) {
			rc = s->ext ? -EPROTO : op_defer(op, con, payload);
			if (rc == -EAGAIN)
				continue;
			if (rc == -EPROTO) {
				log_err_rl("%s: request for chunk %u which is still in use",
					   path_name(p), req.chunk);
				srv_fail_path(p, -EPROTO);
			}
			return;
		}
		/* A new take: its count tells its responder's transitions from the last's. */
		if (atomic_compare_exchange_weak(&op->state, &state,
						 op_with(state + OP_TAKE_ONE, OP_BUSY)))
			break;
	}
	atomic_fetch_add(&p->base.inflight, 1);
	if (req.type == RTRS_MSG_READ) {
		atomic_fetch_add_explicit(&p->st.reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->st.read_bytes, req.data_len, memory_order_relaxed);
	} else {
		atomic_fetch_add_explicit(&p->st.writes, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->st.write_bytes, req.data_len, memory_order_relaxed);
	}
	/* Atomic: srv_ops_abandon of another path may read it meanwhile (and compare only). */
	__atomic_store_n(&op->path, p, __ATOMIC_RELAXED);
	op->con = con;
	op->dir = req.type == RTRS_MSG_READ ? RTRS_READ : RTRS_WRITE;
	op->data_len = req.data_len;
	op->usr_len = req.usr_len;
	op->sg_cnt = req.sg_cnt;
	op->need_inval = op->dir == RTRS_READ && (req.flags & RTRS_MSG_NEED_INVAL_F) &&
			 req.sg_cnt == 1;
	if (req.sg_cnt)
		memcpy(op->sg, req.sg, req.sg_cnt * sizeof(*op->sg));
	if (s->inval) {
		/* Before the user sees the data: the client can no longer write it. */
		op->rekeyed = false;
		atomic_store(&op->revoking, true);
		if (srv_chunk_revoke(s, srv_op_keys(op), req.chunk, con->c.fc, op) > 0)
			return; /* srv_op_revoked goes on */
		atomic_store(&op->revoking, false);
	}
	op_deliver(op);
}

/* The chunk's old key is dead: a window's unbind completed (completion thread). */
static void srv_op_revoked(struct rtrs_srv_op *op)
{
	if (atomic_exchange(&op->revoking, false))
		op_deliver(op);
}

/* fab_con_ops.done: a heartbeat's acknowledgement left, or a chunk's unbind completed. */
void srv_con_done(void *priv, void *ctx)
{
	struct srv_con *con = container_of((struct rtrs_con *)priv, struct srv_con, c);
	struct rtrs_srv_sess *s = con->path->sess;

	if (rtrs_hb_done(&con->path->base.hb, ctx))
		return;
	if (s->ops && ctx >= (void *)s->ops && ctx < (void *)(s->ops + s->queue_depth))
		srv_op_revoked(ctx);
}

/*
 * Loop thread, once p's connections are destroyed: requests whose unbind
 * was still on its way will not get its completion. They end unanswered;
 * the client fails them over or reports them.
 */
void srv_ops_abandon(struct srv_path *p)
{
	struct rtrs_srv_sess *s = p->sess;

	for (uint32_t i = 0; s->ops && i < s->queue_depth; i++) {
		struct rtrs_srv_op *op = &s->ops[i];

		/*
		 * Another path's thread may take an op meanwhile: it stores
		 * op->path, then revoking, so a revoking seen here comes with
		 * the path it was set for (both atomic; the exchange decides).
		 */
		if (atomic_load(&op->revoking) && __atomic_load_n(&op->path, __ATOMIC_RELAXED) == p &&
		    atomic_exchange(&op->revoking, false)) {
			unsigned busy = atomic_load(&op->state);

			/* As an answer would take it: op_finish frees RESPONDING. */
			if (op_st(busy) == OP_BUSY)
				atomic_compare_exchange_strong(&op->state, &busy,
							       op_with(busy, OP_RESPONDING));
			op_drop(op, p);
		}
	}
}

/* rtrs_path_ops.io_imm: a request. */
bool srv_io_imm(struct rtrs_con *c, unsigned type, uint32_t payload)
{
	if (type != RTRS_IO_REQ_IMM)
		return false;
	srv_handle_req(container_of(c, struct srv_con, c), payload);
	return true;
}
