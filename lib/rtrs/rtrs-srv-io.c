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
static void op_finish(struct rtrs_srv_op *op, struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	int expected = OP_RESPONDING;
	bool closing = atomic_load(&p->base.state) != RTRS_PATH_CONNECTED;

	/* From SENT the op may already be BUSY with the client's next request. */
	if (!atomic_compare_exchange_strong(&op->state, &expected, OP_FREE) &&
	    expected == OP_SENT)
		atomic_compare_exchange_strong(&op->state, &expected, OP_FREE);
	if (atomic_fetch_sub(&p->base.inflight, 1) == 1 && closing)
		loop_queue(ctx->loop, &ctx->reap_work);
}

/*
 * Posts the last write of a response, prepared in locals (inject: iov is
 * small enough to go inline with the immediate). The op turns SENT
 * first, since the client may answer the response at once; nothing of the
 * op is read after that. On failure the op goes back to RESPONDING, unless
 * a request took it meanwhile, which only a client that reuses a chunk
 * before its response can do: then the response is dropped and -EPROTO
 * fails the path.
 */
static int op_post_last(struct rtrs_srv_op *op, struct srv_path *p, struct fab_con *fc,
			const struct iovec *iov, void *const *desc, size_t iov_cnt,
			const struct fab_rma *rma, size_t rma_cnt, uint32_t imm, bool inject)
{
	int expected = OP_SENT;
	int rc;

	atomic_store(&op->state, OP_SENT);
	if (!rma && iov_cnt) /* a message with the immediate, copied at once (kinval) */
		rc = fab_send_imm(fc, iov->iov_base, iov->iov_len, NULL, imm, NULL);
	else if (inject) /* small: copied with the immediate in one injected write */
		rc = fab_write_imm_data(fc, iov->iov_base, iov->iov_len, rma->addr, rma->key, imm);
	else if (rma_cnt)
		rc = fab_write(fc, iov, desc, iov_cnt, rma, rma_cnt, true, imm, NULL);
	else
		rc = fab_write_imm(fc, p->base.peer_imm.addr, p->base.peer_imm.key, imm);
	if (!rc) {
		op_finish(op, p);
		return 0;
	}
	if (atomic_compare_exchange_strong(&op->state, &expected, OP_RESPONDING))
		return rc;
	log_err_rl("%s: chunk %u reused before its response", path_name(p), op->id);
	op_finish(op, p);
	return -EPROTO;
}

/*
 * An op that ends without a response still gives its chunk a key again:
 * the client learns it with the next fence ack or info response.
 */
static void op_drop(struct rtrs_srv_op *op, struct srv_path *p)
{
	struct rtrs_srv_sess *s = op->sess;

	if (s->inval && !op->rekeyed) {
		int rc = srv_chunk_rekey(s, srv_op_keys(op), op->id);

		if (rc)
			log_err_rl("%s: chunk %u keeps no key: %s", s->name, op->id, strerror(-rc));
		op->rekeyed = true;
	}
	op_finish(op, p);
}

/*
 * Posts what is left of op's response: read data to the client's buffers,
 * at most rma_iov_limit descriptors per write, the last one with the
 * response immediate; or an empty write with it. With always_invalidate
 * the immediate comes with the chunk's new key, written into the client's
 * key slot for the chunk. 0 when all is posted.
 */
static int op_post(struct rtrs_srv_op *op)
{
	struct srv_path *p = op->path;
	struct rtrs_srv_sess *s = op->sess;
	struct fab_con *fc = op->con->c.fc;
	size_t per = MIN(fab_attr(s->ctx->fab)->rma_iov_limit, 8);
	bool data = op->dir == RTRS_READ && !op->err && op->data_len && op->sg_cnt;
	/*
	 * A read that asked for invalidation (a kernel client's: its buffer is
	 * a fast registration) is answered as the kernel's server does: the
	 * data, a SEND_WITH_INV of the client's key, then the immediate of
	 * type IO_RSP_W_INV. Without the SEND_WITH_INV the kernel client
	 * invalidates the key itself, with a warning on its console.
	 */
	bool inv = op->need_inval && fab_attr(s->ctx->fab)->send_inv;
	uint32_t imm = inv ? rtrs_to_io_rsp_w_inv_imm(op->id, op->err) :
			     rtrs_to_io_rsp_imm(op->id, op->err);
	int rc;

	if (s->inval && !op->rekeyed) {
		rc = srv_chunk_rekey(s, srv_op_keys(op), op->id);
		if (rc)
			return rc == -EAGAIN ? -ENOMEM : rc;
		op->rekeyed = true;
	}
	while (data && op->next_sg < op->sg_cnt) {
		size_t cnt = MIN((size_t)op->sg_cnt - op->next_sg, per);
		struct fab_rma rma[8];
		struct iovec iov[2];
		void *desc[2] = { s->chunk_mr.desc, s->keys.msgs_mr.desc };
		uint64_t len = 0;

		for (size_t i = 0; i < cnt; i++) {
			const struct rtrs_desc *d = &op->sg[op->next_sg + i];

			rma[i] = (struct fab_rma){ .addr = d->addr, .len = d->len, .key = d->key };
			len += d->len;
		}
		iov[0].iov_base = s->chunk_bases[op->id] + op->next_local;
		iov[0].iov_len = len;
		if (op->next_sg + cnt == op->sg_cnt && !s->inval && !inv)
			return op_post_last(op, p, fc, iov, desc, 1, rma, cnt, imm, false);
		if (op->next_sg + cnt == op->sg_cnt && cnt < per && !inv && !s->kinval &&
		    fab_attr(s->ctx->fab)->iov_limit >= 2) {
			/* The data and the chunk's new key in one write, with the immediate. */
			iov[1].iov_base = &s->keys.msgs[op->id];
			iov[1].iov_len = RTRS_RKEY_SLOT;
			rma[cnt] = (struct fab_rma){
				.addr = p->base.peer_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
				.len = RTRS_RKEY_SLOT, .key = p->base.peer_imm.key,
			};
			return op_post_last(op, p, fc, iov, desc, 2, rma, cnt + 1, imm, false);
		}
		rc = fab_write(fc, iov, desc, 1, rma, cnt, false, 0, NULL);
		if (rc)
			return rc;
		op->next_sg += cnt;
		op->next_local += len;
	}
	if (inv && !op->inv_sent) {
		rc = fab_send_inv(fc, (uint32_t)op->sg[0].key, NULL);
		if (rc)
			return rc;
		op->inv_sent = true;
	}
	if (s->kinval) {
		/*
		 * The kernel's way: the chunk's new key in an RKEY_RSP, sent with
		 * the response's immediate (its client reads the message, then
		 * the immediate).
		 */
		struct rtrs_msg_rkey_rsp msg;
		struct iovec iov = { .iov_base = &msg, .iov_len = sizeof(msg) };

		rtrs_rkey_rsp_encode(&msg, op->id, (uint32_t)srv_chunk_key(s, &p->keys, op->id));
		return op_post_last(op, p, fc, &iov, NULL, 1, NULL, 0, imm, false);
	}
	if (s->inval) {
		struct iovec iov = { .iov_base = &s->keys.msgs[op->id], .iov_len = RTRS_RKEY_SLOT };
		struct fab_rma rma = {
			.addr = p->base.peer_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
			.len = RTRS_RKEY_SLOT, .key = p->base.peer_imm.key,
		};

		return op_post_last(op, p, fc, &iov, &s->keys.msgs_mr.desc, 1, &rma, 1, imm,
				    fab_attr(s->ctx->fab)->inject_size >= RTRS_RKEY_SLOT);
	}
	return op_post_last(op, p, fc, NULL, NULL, 0, NULL, 0, imm, false);
}

/* Completion thread (kick): a response that met a full send queue. */
int srv_post_pending(struct rtrs_con *con, struct rtrs_pending *it)
{
	return op_post(&container_of(con, struct srv_con, c)->path->sess->ops[it->id]);
}

/* A waiting response will not go out: its post failed (err) or its connection is gone (0). */
void srv_drop_pending(struct rtrs_con *con, struct rtrs_pending *it, int err)
{
	struct srv_path *p = container_of(con, struct srv_con, c)->path;

	if (err != -EPROTO) /* -EPROTO: op_post_last finished it */
		op_drop(&p->sess->ops[it->id], p);
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
	int state, rc;
	char *base;

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
	state = atomic_load(&op->state);
	/* FREE, or SENT (its response is out): both are ours. */
	do {
		if (state == OP_BUSY || state == OP_RESPONDING) {
			log_err_rl("%s: request for chunk %u which is still in use", path_name(p),
				   req.chunk);
			srv_fail_path(p, -EPROTO);
			return;
		}
	} while (!atomic_compare_exchange_weak(&op->state, &state, OP_BUSY));
	atomic_fetch_add(&p->base.inflight, 1);
	if (s->inval) {
		/* Before the user sees the data: the client can no longer write it. */
		op->path = p;
		srv_chunk_revoke(s, srv_op_keys(op), req.chunk);
		op->rekeyed = false;
	}
	op->path = p;
	op->con = con;
	op->dir = req.type == RTRS_MSG_READ ? RTRS_READ : RTRS_WRITE;
	op->data_len = req.data_len;
	op->sg_cnt = req.sg_cnt;
	op->need_inval = op->dir == RTRS_READ && (req.flags & RTRS_MSG_NEED_INVAL_F) &&
			 req.sg_cnt == 1;
	if (req.sg_cnt)
		memcpy(op->sg, req.sg, req.sg_cnt * sizeof(*op->sg));
	base = s->chunk_bases[req.chunk];
	rc = s->ctx->ops.rdma_ev(s->ctx->ops.priv, op, op->dir, base, req.data_len,
				 base + req.data_len, req.usr_len);
	if (rc)
		rtrs_srv_resp_rdma(op, rc < 0 ? rc : -rc);
}

/* rtrs_path_ops.io_imm: a request. */
bool srv_io_imm(struct rtrs_con *c, unsigned type, uint32_t payload)
{
	if (type != RTRS_IO_REQ_IMM)
		return false;
	srv_handle_req(container_of(c, struct srv_con, c), payload);
	return true;
}
