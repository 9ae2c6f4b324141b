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
#include <unistd.h>

#include "rtrs-auth-sm.h"
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
	bool rekeyed;               /* always_invalidate: the chunk has its new key */
	struct rtrs_srv_op *pending_next;
};

struct srv_con {
	struct srv_path *path;
	unsigned cid;
	struct fab_con *fc;
	struct rtrs_desc *sg_scratch; /* RTRS_MAX_READ_SG; completion thread only */
	struct rtrs_hb_rx hb_rx;      /* completion thread only */
	pthread_mutex_t pending_lock;
	struct rtrs_srv_op *pending_head, *pending_tail;
};

struct srv_path {
	struct rtrs_srv_sess *sess;
	struct srv_path *next;
	uint8_t uuid[RTRS_UUID_LEN];
	char peer[64];
	char peer_host[64];         /* the peer's address without the port: limits */
	/*
	 * The log name: "(new)/peer" until the info request names the session,
	 * then "session/peer". Connection threads log with it while the loop
	 * renames, so the new name goes in a buffer of its own and name points
	 * at one of the two.
	 */
	char name_new[RTRS_NAME_MAX + 80];
	char name_info[RTRS_NAME_MAX + 80];
	const char *_Atomic name;
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
	/* Authentication: cid 0's completion thread runs it; the loop reads the flags. */
	struct rtrs_auth_txn auth;
	atomic_bool auth_host_ok;   /* the host proved its identity: more connections may come */
	char auth_host[RTRS_AUTH_WIRE_NAME]; /* who, once authenticated */
	atomic_bool auth_done;      /* transaction complete: the info request may come */
	char auth_tx[RTRS_AUTH_MSG_MAX];
	struct fab_mr auth_tx_mr;
	/* A refusal went out (FAILURE1 or a verdict): close once the client had time to read it. */
	atomic_uint_fast64_t close_at_ms;
	int close_err;
	uint8_t verdict[sizeof(struct rtrs_msg_info_rsp)]; /* an info response with an errno */
	struct fab_mr verdict_mr;
	uint64_t created_ms;
	uint64_t serial;            /* creation order: the oldest pending path, even within a ms */
	/* always_invalidate: the key table sent ahead of a fence ack. */
	struct rtrs_msg_new_rkey *fence_keys;
	struct fab_mr fence_keys_mr;
};

struct rtrs_srv_sess {
	struct rtrs_srv_ctx *ctx;
	struct rtrs_srv_sess *next;
	uint8_t paths_uuid[RTRS_UUID_LEN];
	char name[RTRS_NAME_MAX + 1];
	char auth_host[RTRS_AUTH_WIRE_NAME]; /* the host its first path authenticated as */
	void *priv;
	uint32_t queue_depth;
	uint32_t chunk_size;
	size_t chunk_bytes;
	bool chunks_mapped;         /* at the first info request: sess_map_chunks */
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
	/*
	 * always_invalidate: one MR per chunk with a 64-bit key that is revoked
	 * when an IO arrives and replaced when it is answered (or dropped);
	 * key 0 while revoked. gen counts both. chunk_mr then only serves local
	 * access (read responses on verbs).
	 */
	bool inval;
	uint64_t sess_id;           /* this incarnation, random */
	struct fab_mr *chunk_mrs;
	uint64_t *chunk_key;
	uint64_t *chunk_key_hist;   /* RTRS_KEY_HISTORY last keys per chunk, newest first */
	uint32_t *chunk_gen;
	pthread_mutex_t key_lock;
	struct rtrs_msg_new_rkey *rkey_msgs; /* response sources, one per chunk */
	struct fab_mr rkey_msgs_mr;
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
	uint64_t path_serial;       /* the last srv_path.serial given (loop thread) */
	struct loop_work reap_work; /* frees closed paths nobody references */
	struct srv_verdict *verdicts; /* final refusals held open (srv_reject_dnr) */
	unsigned nr_verdicts;
	struct loop_work verdict_work;
	bool auth_required;
	struct rtrs_auth_cfg auth_cfg;
	char auth_keys_file[4096];
	struct {
		atomic_uint_fast64_t connreqs, rejects, auth_ok, auth_failed, auth_timeouts;
		atomic_uint_fast64_t key_rotations, chunk_bytes;
		atomic_uint_fast64_t pending_evicted, limit_refusals, raw_closed;
	} st;
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
	if (inject) /* small: copied with the immediate in one injected write */
		rc = fab_write_imm_data(fc, iov->iov_base, iov->iov_len, rma->addr, rma->key, imm);
	else if (rma_cnt)
		rc = fab_write(fc, iov, desc, iov_cnt, rma, rma_cnt, true, imm, NULL);
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

/* ---- always_invalidate ----------------------------------------------------- */

/* The next generation of a chunk's key; never 0, which a client reads as "none yet". */
static uint32_t gen_next(uint32_t gen)
{
	return gen + 1 ? gen + 1 : 1;
}

/* Revokes chunk id's key: from now on a write with it is refused. */
static void chunk_revoke(struct rtrs_srv_sess *s, uint32_t id)
{
	pthread_mutex_lock(&s->key_lock);
	s->chunk_gen[id] = gen_next(s->chunk_gen[id]);
	s->chunk_key[id] = 0;
	pthread_mutex_unlock(&s->key_lock);
	fab_mr_dereg(&s->chunk_mrs[id]);
}

/*
 * Whether key was one of the chunk's last RTRS_KEY_HISTORY keys. A provider
 * that picks keys itself (verbs: an index and a random byte) can hand back
 * one just revoked; that one is not taken.
 */
static bool chunk_key_recent(const struct rtrs_srv_sess *s, uint32_t id, uint64_t key)
{
	const uint64_t *h = &s->chunk_key_hist[(size_t)id * RTRS_KEY_HISTORY];

	for (unsigned i = 0; i < RTRS_KEY_HISTORY; i++)
		if (h[i] == key)
			return true;
	return false;
}

/* Registers chunk id again under a key never used before; records it for the client. */
static int chunk_rekey(struct rtrs_srv_sess *s, uint32_t id)
{
	uint64_t *h = &s->chunk_key_hist[(size_t)id * RTRS_KEY_HISTORY];
	struct fab_mr mr;
	int rc, tries = 0;

	for (;;) {
		rc = fab_mr_reg(s->ctx->fab, s->chunk_bases[id], s->chunk_size,
				FAB_MR_REMOTE_WRITE | FAB_MR_KEY64, &mr);
		if (rc)
			return rc;
		if (!chunk_key_recent(s, id, mr.key))
			break;
		fab_mr_dereg(&mr);
		if (++tries == 64) {
			log_err_rl("%s: the provider keeps handing back revoked keys for chunk %u",
				   s->name, id);
			return -EKEYREVOKED;
		}
	}
	memmove(h + 1, h, (RTRS_KEY_HISTORY - 1) * sizeof(*h));
	h[0] = mr.key;
	pthread_mutex_lock(&s->key_lock);
	s->chunk_mrs[id] = mr;
	s->chunk_gen[id] = gen_next(s->chunk_gen[id]);
	s->chunk_key[id] = mr.key;
	rtrs_new_rkey_encode(&s->rkey_msgs[id], id, s->chunk_gen[id], mr.key);
	pthread_mutex_unlock(&s->key_lock);
	atomic_fetch_add_explicit(&s->ctx->st.key_rotations, 1, memory_order_relaxed);
	return 0;
}

/* The key table as one record per chunk, for an info response or a fence. */
static void chunk_keys_snapshot(struct rtrs_srv_sess *s, struct rtrs_msg_new_rkey *out)
{
	pthread_mutex_lock(&s->key_lock);
	for (uint32_t i = 0; i < s->queue_depth; i++)
		rtrs_new_rkey_encode(&out[i], i, s->chunk_gen[i], s->chunk_key[i]);
	pthread_mutex_unlock(&s->key_lock);
}

/*
 * An op that ends without a response still gives its chunk a key again:
 * the client learns it with the next fence ack or info response.
 */
static void op_drop(struct rtrs_srv_op *op, struct srv_path *p)
{
	struct rtrs_srv_sess *s = op->sess;

	if (s->inval && !op->rekeyed) {
		int rc = chunk_rekey(s, op->id);

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
	struct fab_con *fc = op->con->fc;
	uint32_t imm = rtrs_to_io_rsp_imm(op->id, op->err);
	size_t per = MIN(fab_attr(s->ctx->fab)->rma_iov_limit, 8);
	bool data = op->dir == RTRS_READ && !op->err && op->data_len && op->sg_cnt;
	int rc;

	if (s->inval && !op->rekeyed) {
		rc = chunk_rekey(s, op->id);
		if (rc)
			return rc == -EAGAIN ? -ENOMEM : rc;
		op->rekeyed = true;
	}
	while (data && op->next_sg < op->sg_cnt) {
		size_t cnt = MIN((size_t)op->sg_cnt - op->next_sg, per);
		struct fab_rma rma[8];
		struct iovec iov[2];
		void *desc[2] = { s->chunk_mr.desc, s->rkey_msgs_mr.desc };
		uint64_t len = 0;

		for (size_t i = 0; i < cnt; i++) {
			const struct rtrs_desc *d = &op->sg[op->next_sg + i];

			rma[i] = (struct fab_rma){ .addr = d->addr, .len = d->len, .key = d->key };
			len += d->len;
		}
		iov[0].iov_base = s->chunk_bases[op->id] + op->next_local;
		iov[0].iov_len = len;
		if (op->next_sg + cnt == op->sg_cnt && !s->inval)
			return op_post_last(op, p, fc, iov, desc, 1, rma, cnt, imm, false);
		if (op->next_sg + cnt == op->sg_cnt && cnt < per &&
		    fab_attr(s->ctx->fab)->iov_limit >= 2) {
			/* The data and the chunk's new key in one write, with the immediate. */
			iov[1].iov_base = &s->rkey_msgs[op->id];
			iov[1].iov_len = RTRS_RKEY_SLOT;
			rma[cnt] = (struct fab_rma){
				.addr = p->clt_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
				.len = RTRS_RKEY_SLOT, .key = p->clt_imm.key,
			};
			return op_post_last(op, p, fc, iov, desc, 2, rma, cnt + 1, imm, false);
		}
		rc = fab_write(fc, iov, desc, 1, rma, cnt, false, 0, NULL);
		if (rc)
			return rc;
		op->next_sg += cnt;
		op->next_local += len;
	}
	if (s->inval) {
		struct iovec iov = { .iov_base = &s->rkey_msgs[op->id], .iov_len = RTRS_RKEY_SLOT };
		struct fab_rma rma = {
			.addr = p->clt_imm.addr + (uint64_t)op->id * RTRS_RKEY_SLOT,
			.len = RTRS_RKEY_SLOT, .key = p->clt_imm.key,
		};

		return op_post_last(op, p, fc, &iov, &s->rkey_msgs_mr.desc, 1, &rma, 1, imm,
				    fab_attr(s->ctx->fab)->inject_size >= RTRS_RKEY_SLOT);
	}
	return op_post_last(op, p, fc, NULL, NULL, 0, NULL, 0, imm, false);
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
				op_drop(op, con->path);
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
	tsan_release(op); /* the chunk's contents: the client reuses it after this response */
	p = op->path;
	op->err = err;
	op->next_sg = 0;
	op->next_local = 0;
	pthread_rwlock_rdlock(&p->post_lock);
	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED) {
		/* The client fails this IO over or gets an error from its path. */
		op_drop(op, p);
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
			op_drop(op, p);
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
	uint32_t chunk;
	int state, rc;
	char *base;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED) {
		log_err_rl("%s: IO before the path is established", p->name);
		srv_fail_path(p, -EPROTO);
		return;
	}
	chunk = rtrs_io_req_chunk(s->queue_depth, payload);
	if (chunk < s->queue_depth)
		tsan_acquire(&s->ops[chunk]); /* ordered after its last response, by the wire */
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
	if (s->inval) {
		/* Before the user sees the data: the client can no longer write it. */
		chunk_revoke(s, req.chunk);
		op->rekeyed = false;
	}
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
	case RTRS_HB_ACK_IMM:
		if (!rtrs_hb_received(&p->hb, &con->hb_rx, con->cid, type == RTRS_HB_ACK_IMM,
				      p->name)) {
			fab_con_shutdown(con->fc);
			srv_fail_path(p, -EPROTO);
			break;
		}
		if (type == RTRS_HB_ACK_IMM || atomic_load(&p->state) != RTRS_PATH_CONNECTED)
			break;
		rc = rtrs_hb_post(&p->hb, con->fc, p->clt_imm.addr, p->clt_imm.key, true);
		if (rc && rc != -EAGAIN)
			srv_fail_path(p, rc);
		break;
	default:
		log_err_rl("%s: unknown immediate type %u", p->name, type);
		fab_con_shutdown(con->fc);
		srv_fail_path(p, -EPROTO);
	}
}

/*
 * An authentication message on connection 0 of a path being established,
 * on that connection's completion thread: the crypto (DH too) runs here,
 * off the service loop.
 */
static void srv_auth_recv(struct srv_path *p, const void *buf, size_t len)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	enum rtrs_auth_step step;
	size_t out_len = 0;
	int rc;

	if (!ctx->auth_required || atomic_load(&p->auth_done) || atomic_load(&p->close_at_ms) ||
	    p->auth.state == AUTH_SRV_FAILED) {
		log_err("%s: authentication message not expected; closing the path", p->name);
		srv_fail_path(p, -EPROTO);
		return;
	}
	step = rtrs_auth_srv_step(&p->auth, buf, len, p->auth_tx, sizeof(p->auth_tx), &out_len);
	/*
	 * Before the answer goes out: once the client reads SUCCESS1 it may
	 * request its next connection at once, and srv_on_connreq (on the
	 * loop) must find the host already proven.
	 */
	if (p->auth.host_ok)
		atomic_store(&p->auth_host_ok, true);
	rc = out_len ? fab_send(p->cons[0].fc, p->auth_tx, out_len, p->auth_tx_mr.desc, NULL) : 0;
	switch (step) {
	case RTRS_AUTH_CONTINUE:
		break;
	case RTRS_AUTH_DONE:
		atomic_fetch_add(&ctx->st.auth_ok, 1);
		log_info("%s: host %s authenticated (%s, %s%s)", p->name, p->auth.host,
			 rtrs_auth_hash_name(p->auth.hash), rtrs_auth_dhgroup_name(p->auth.group),
			 p->auth.bidir ? ", bidirectional" : "");
		snprintf(p->auth_host, sizeof(p->auth_host), "%s", p->auth.host);
		atomic_store(&p->auth_done, true);
		rtrs_auth_txn_end(&p->auth);
		break;
	case RTRS_AUTH_FAILED:
		atomic_fetch_add(&ctx->st.auth_failed, 1);
		atomic_store(&p->auth_host_ok, false);
		rtrs_auth_txn_end(&p->auth);
		if (out_len && !rc) {
			/* Let the FAILURE1 reach the client; it closes, or the timer does. */
			p->close_err = p->auth.err;
			atomic_store(&p->close_at_ms, now_ms() + 1000);
		} else {
			srv_fail_path(p, p->auth.err);
		}
		return;
	}
	if (rc) {
		log_err("%s: sending an authentication message failed: %s", p->name,
			strerror(-rc));
		srv_fail_path(p, rc);
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
	if (con->cid == 0 && atomic_load(&p->state) == RTRS_PATH_CONNECTING &&
	    rtrs_msg_type(buf, len) == RTRS_MSG_AUTH) {
		srv_auth_recv(p, buf, len);
		return;
	}
	if (con->cid == 0 && p->sess->ctx->auth_required && !atomic_load(&p->auth_done)) {
		log_err("%s: message before authentication; closing the path", p->name);
		srv_fail_path(p, -EACCES);
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
	struct srv_con *con = priv;

	rtrs_hb_done(&con->path->hb, ctx);
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

/* Undoes sess_map_chunks, whole or in part. */
static void sess_unmap_chunks(struct rtrs_srv_sess *s)
{
	for (uint32_t i = 0; s->chunk_mrs && i < s->queue_depth; i++)
		fab_mr_dereg(&s->chunk_mrs[i]);
	fab_mr_dereg(&s->rkey_msgs_mr);
	fab_mr_dereg(&s->chunk_mr);
	free(s->chunk_mrs);
	free(s->chunk_key);
	free(s->chunk_key_hist);
	free(s->chunk_gen);
	free(s->rkey_msgs);
	if (s->chunk_mem)
		munmap(s->chunk_mem, s->chunk_bytes);
	free(s->chunk_bases);
	free(s->ops);
	free(s->op_sg);
	s->chunk_mrs = NULL;
	s->chunk_key = NULL;
	s->chunk_gen = NULL;
	s->rkey_msgs = NULL;
	s->chunk_mem = NULL;
	s->chunk_bases = NULL;
	s->ops = NULL;
	s->op_sg = NULL;
}

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
	if (s->chunks_mapped)
		atomic_fetch_sub(&ctx->st.chunk_bytes, s->chunk_bytes);
	sess_unmap_chunks(s);
	fab_mr_dereg(&s->imm_mr);
	pthread_mutex_destroy(&s->key_lock);
	log_info("session %s closed", s->name[0] ? s->name : "(unnamed)");
	free(s);
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions--;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
}

/*
 * The chunks: memory, per-chunk state and registrations. Done when the
 * first path of a session asks for them (its info request, after
 * authentication), not at its first connection request: a peer that has
 * not proved itself costs the server no chunk memory, no pinned pages
 * (verbs) and no keys. Loop thread; IO sees the chunks only once a path is
 * connected, after this.
 */
static int sess_map_chunks_(struct rtrs_srv_sess *s)
{
	struct rtrs_srv_ctx *ctx = s->ctx;
	uint32_t qd = s->queue_depth;
	void *mem;
	int rc;

	mem = mmap(NULL, s->chunk_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		   -1, 0);
	if (mem == MAP_FAILED)
		return -ENOMEM;
	s->chunk_mem = mem;
	s->chunk_bases = calloc(qd, sizeof(*s->chunk_bases));
	s->ops = calloc(qd, sizeof(*s->ops));
	s->op_sg = calloc((size_t)qd * RTRS_MAX_READ_SG, sizeof(*s->op_sg));
	if (!s->chunk_bases || !s->ops || !s->op_sg)
		return -ENOMEM;
	for (uint32_t i = 0; i < qd; i++) {
		s->chunk_bases[i] = s->chunk_mem + (size_t)i * s->chunk_size;
		s->ops[i].sess = s;
		s->ops[i].id = i;
		s->ops[i].sg = &s->op_sg[(size_t)i * RTRS_MAX_READ_SG];
		atomic_init(&s->ops[i].state, OP_FREE);
	}
	rc = fab_mr_reg(ctx->fab, s->chunk_mem, s->chunk_bytes,
			s->inval ? FAB_MR_LOCAL : FAB_MR_REMOTE_WRITE | FAB_MR_LOCAL, &s->chunk_mr);
	if (rc || !s->inval)
		return rc;
	s->chunk_mrs = calloc(qd, sizeof(*s->chunk_mrs));
	s->chunk_key = calloc(qd, sizeof(*s->chunk_key));
	s->chunk_key_hist = calloc((size_t)qd * RTRS_KEY_HISTORY, sizeof(*s->chunk_key_hist));
	s->chunk_gen = calloc(qd, sizeof(*s->chunk_gen));
	s->rkey_msgs = aligned_alloc(64, ((size_t)qd * RTRS_RKEY_SLOT + 63) & ~(size_t)63);
	if (!s->chunk_mrs || !s->chunk_key || !s->chunk_key_hist || !s->chunk_gen || !s->rkey_msgs)
		return -ENOMEM;
	rc = fab_mr_reg(ctx->fab, s->rkey_msgs, (size_t)qd * RTRS_RKEY_SLOT, FAB_MR_LOCAL,
			&s->rkey_msgs_mr);
	for (uint32_t i = 0; !rc && i < qd; i++)
		rc = chunk_rekey(s, i);
	return rc;
}

static int sess_map_chunks(struct rtrs_srv_sess *s)
{
	int rc;

	if (s->chunks_mapped)
		return 0;
	if (atomic_load(&s->ctx->st.chunk_bytes) + s->chunk_bytes > s->ctx->opts.max_chunk_mem) {
		log_err("server: session %s: its %zu bytes of chunks would pass the limit of %llu "
			"(max_chunk_mem)", s->name, s->chunk_bytes,
			(unsigned long long)s->ctx->opts.max_chunk_mem);
		atomic_fetch_add(&s->ctx->st.limit_refusals, 1);
		return -ENOSPC;
	}
	rc = sess_map_chunks_(s);
	if (rc) {
		sess_unmap_chunks(s);
		return rc;
	}
	s->chunks_mapped = true;
	atomic_fetch_add(&s->ctx->st.chunk_bytes, s->chunk_bytes);
	return 0;
}

/* A session as its first connection request creates it: no chunks yet. */
static int sess_create(struct rtrs_srv_ctx *ctx, const uint8_t *uuid, struct rtrs_srv_sess **out)
{
	struct rtrs_srv_sess *s = calloc(1, sizeof(*s));
	int rc;

	if (!s)
		return -ENOMEM;
	s->ctx = ctx;
	memcpy(s->paths_uuid, uuid, RTRS_UUID_LEN);
	pthread_mutex_init(&s->key_lock, NULL);
	s->inval = ctx->opts.always_invalidate;
	s->queue_depth = ctx->opts.queue_depth;
	s->chunk_size = ctx->opts.max_chunk_size;
	s->chunk_bytes = (size_t)s->queue_depth * s->chunk_size;
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions++; /* sess_free counts it down */
	pthread_mutex_unlock(&ctx->lock);
	rc = rand_bytes(&s->sess_id, sizeof(s->sess_id));
	if (!rc)
		rc = fab_mr_reg(ctx->fab, s->imm_buf, sizeof(s->imm_buf), FAB_MR_REMOTE_WRITE,
				&s->imm_mr);
	if (rc) {
		sess_free(s);
		return rc;
	}
	s->next = ctx->sessions;
	ctx->sessions = s;
	*out = s;
	return 0;
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
	fab_mr_dereg(&p->auth_tx_mr);
	fab_mr_dereg(&p->verdict_mr);
	fab_mr_dereg(&p->fence_keys_mr);
	free(p->fence_keys);
	free(p->info_rsp);
	rtrs_auth_txn_end(&p->auth);
	for (unsigned i = 0; i < p->cid_num; i++) {
		pthread_mutex_destroy(&p->cons[i].pending_lock);
		free(p->cons[i].sg_scratch);
	}
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
			op_drop(op, p);
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
		/* The reaper may have skipped this path while this item was queued. */
		loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
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
	rc = 0;
	if (p->sess->inval) {
		/*
		 * Keys of chunks whose responses the fenced path lost: the whole
		 * table, into the client's table area, ahead of the ack
		 * (send-after-write order).
		 */
		size_t len = (size_t)p->sess->queue_depth * RTRS_RKEY_SLOT;
		struct iovec iov = { .iov_base = p->fence_keys, .iov_len = len };
		struct fab_rma rma = { .addr = p->clt_imm.addr + len, .len = len,
				       .key = p->clt_imm.key };

		chunk_keys_snapshot(p->sess, p->fence_keys);
		rc = fab_write(p->cons[0].fc, &iov, &p->fence_keys_mr.desc, 1, &rma, 1, false, 0,
			       NULL);
	}
	if (!rc)
		rc = fab_send(p->cons[0].fc, &p->fence_ack, sizeof(p->fence_ack),
			      p->fence_ack_mr.desc, NULL);
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
		struct rtrs_srv_ctx *ctx = p->sess->ctx;
		uint64_t close_at = atomic_load(&p->close_at_ms);

		if (close_at && now_ms() >= close_at) {
			/* Refused: the client had its chance to read why. */
			path_stop(p, p->close_err);
			return;
		}
		if (ctx->auth_required && !atomic_load(&p->auth_done) && !close_at &&
		    now_ms() - p->created_ms > ctx->opts.auth_timeout_ms) {
			log_err("%s: not authenticated after %u ms, closing the path", p->name,
				ctx->opts.auth_timeout_ms);
			atomic_fetch_add(&ctx->st.auth_timeouts, 1);
			path_stop(p, -ETIMEDOUT);
			return;
		}
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
	rc = rtrs_hb_post(&p->hb, p->cons[0].fc, p->clt_imm.addr, p->clt_imm.key, false);
	if (rc && rc != -EAGAIN)
		path_stop(p, rc);
}

/*
 * Loop thread: a request to start p again arrived. The client may be gone
 * (its link was cut and it reconnects elsewhere), or alive while someone
 * replays its request: a heartbeat now, and the path's last beat counted
 * as missed but one, so the next tick or the one after closes it unless
 * the client answers. A live client keeps its path.
 */
static void path_probe(struct srv_path *p)
{
	int rc;

	if (atomic_load(&p->hb.missed) + 1 < p->hb.missed_max)
		atomic_store(&p->hb.missed, p->hb.missed_max - 1);
	rc = rtrs_hb_post(&p->hb, p->cons[0].fc, p->clt_imm.addr, p->clt_imm.key, false);
	if (rc && rc != -EAGAIN)
		path_stop(p, rc);
	else
		log_info("%s: a request to start this path again: closing it unless the "
			 "client answers a heartbeat", p->name);
}

/* Sessions with a name: a path of theirs got as far as the info request. */
static unsigned sessions_named(const struct rtrs_srv_ctx *ctx)
{
	unsigned n = 0;

	for (const struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		n += s->name[0] != 0;
	return n;
}

/*
 * A path still to prove itself: not connected, and with authentication
 * on, its host not authenticated yet. These are what a peer can hold
 * without any key.
 */
static bool path_pending(const struct srv_path *p)
{
	return atomic_load(&p->state) == RTRS_PATH_CONNECTING &&
	       !(p->sess->ctx->auth_required && atomic_load(&p->auth_host_ok));
}

/*
 * Loop thread: room for one more pending path from host. At a limit (all
 * pending paths, or those of host) the oldest pending path in that scope
 * is closed: a peer that holds half-open paths loses the oldest, while a
 * client mid-handshake, being newer, goes on. -EBUSY when nothing can go.
 */
static int pending_admit(struct rtrs_srv_ctx *ctx, const char *host)
{
	for (int scope = 0; scope < 2; scope++) {
		unsigned max = scope ? ctx->opts.max_pending_per_peer : ctx->opts.max_pending, n = 0;
		struct srv_path *oldest = NULL;

		for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next) {
			for (struct srv_path *p = s->paths; p; p = p->next) {
				if (!path_pending(p) || (scope && strcmp(p->peer_host, host)))
					continue;
				n++;
				if (!oldest || p->serial < oldest->serial)
					oldest = p;
			}
		}
		if (n < max)
			continue;
		if (!oldest)
			return -EBUSY;
		log_warn("%s: closed to make room for a new connection from %s (%u pending%s%s)",
			 oldest->name, host, n, scope ? " from " : " in all", scope ? host : "");
		atomic_fetch_add(&ctx->st.pending_evicted, 1);
		path_stop(oldest, -ETIMEDOUT);
	}
	return 0;
}

static bool name_taken(struct rtrs_srv_ctx *ctx, const struct rtrs_srv_sess *self,
		       const char *name)
{
	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		if (s != self && !strcmp(s->name, name))
			return true;
	return false;
}

/*
 * Loop thread: refuses a path whose connections are up. The client gets err
 * (and whether retrying can help) in place of the info response; the path
 * closes a second later, or as soon as the client closes it.
 */
static void path_refuse(struct srv_path *p, int err, bool dnr)
{
	rtrs_info_rsp_encode_verdict(p->verdict, err, dnr);
	p->close_err = err;
	atomic_store(&p->close_at_ms, now_ms() + 1000);
	if (fab_send(p->cons[0].fc, p->verdict, sizeof(p->verdict), p->verdict_mr.desc, NULL))
		path_stop(p, err);
}

/* The info response: where the chunks are, and with always_invalidate their keys. */
static int path_info_rsp(struct srv_path *p)
{
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_srv_ctx *ctx = s->ctx;
	unsigned qd = s->queue_depth;
	struct rtrs_desc d, *descs;
	int rc;

	if (!s->inval) { /* one region: srv_opts_validate keeps it under 4 GiB */
		d = (struct rtrs_desc){ .addr = s->chunk_mr.base, .key = s->chunk_mr.key,
					.len = (uint32_t)s->chunk_bytes };
		p->info_rsp_len = rtrs_info_rsp_size(1, 0);
		p->info_rsp = calloc(1, p->info_rsp_len);
		if (!p->info_rsp)
			return -ENOMEM;
		rtrs_info_rsp_encode(p->info_rsp, &d, 1);
		return fab_mr_reg(ctx->fab, p->info_rsp, p->info_rsp_len, FAB_MR_LOCAL,
				  &p->info_rsp_mr);
	}
	/* One MR per chunk: addresses are the chunk's own (verbs) or offsets from 0. */
	descs = calloc(qd, sizeof(*descs));
	p->info_rsp_len = rtrs_info_rsp_size(qd, qd);
	p->info_rsp = calloc(1, p->info_rsp_len);
	p->fence_keys = calloc(qd, RTRS_RKEY_SLOT);
	if (!descs || !p->info_rsp || !p->fence_keys) {
		free(descs);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < qd; i++)
		descs[i] = (struct rtrs_desc){
			.addr = fab_attr(ctx->fab)->virt_addr ? (uintptr_t)s->chunk_bases[i] : 0,
			.len = s->chunk_size,
		};
	rtrs_info_rsp_encode(p->info_rsp, descs, qd);
	free(descs);
	chunk_keys_snapshot(s, rtrs_info_rsp_keys(p->info_rsp, qd));
	rc = fab_mr_reg(ctx->fab, p->info_rsp, p->info_rsp_len, FAB_MR_LOCAL, &p->info_rsp_mr);
	if (!rc)
		rc = fab_mr_reg(ctx->fab, p->fence_keys, (size_t)qd * RTRS_RKEY_SLOT, FAB_MR_LOCAL,
				&p->fence_keys_mr);
	return rc;
}

static void path_info_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, info_work);
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_srv_ctx *ctx = s->ctx;
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
		path_refuse(p, -EINVAL, true);
		return;
	}
	/*
	 * A session's paths all belong to one authenticated host: another
	 * host, however good its own key, does not get this session's chunks
	 * and keys by naming its uuid.
	 */
	if (ctx->auth_required && s->auth_host[0] && strcmp(s->auth_host, p->auth_host)) {
		log_err("%s: host %s authenticated, but session %s belongs to host %s", p->name,
			p->auth_host, s->name, s->auth_host);
		path_refuse(p, -EACCES, true);
		return;
	}
	if (!s->name[0]) {
		if (name_taken(ctx, s, p->info.pathname)) {
			log_err("%s: session name %s is already in use", p->name, p->info.pathname);
			path_refuse(p, -EPERM, true);
			return;
		}
		if (sessions_named(ctx) >= ctx->opts.max_sessions) {
			log_err("%s: session %s refused: %u sessions already (max_sessions)", p->name,
				p->info.pathname, ctx->opts.max_sessions);
			atomic_fetch_add(&ctx->st.limit_refusals, 1);
			path_refuse(p, -ENOSPC, false);
			return;
		}
		snprintf(s->name, sizeof(s->name), "%s", p->info.pathname);
	}
	if (ctx->auth_required && !s->auth_host[0])
		snprintf(s->auth_host, sizeof(s->auth_host), "%s", p->auth_host);
	snprintf(p->name_info, sizeof(p->name_info), "%s/%s", s->name, p->peer);
	atomic_store(&p->name, p->name_info);
	p->clt_imm = (struct rtrs_desc){ .addr = p->info.imm_addr, .key = p->info.imm_key };

	rc = sess_map_chunks(s);
	if (rc == -ENOSPC) {
		path_refuse(p, rc, false);
		return;
	}
	if (!rc)
		rc = path_info_rsp(p);
	if (!rc)
		rc = fab_mr_reg(ctx->fab, &p->fence_ack, sizeof(p->fence_ack), FAB_MR_LOCAL,
				&p->fence_ack_mr);
	if (rc) {
		log_err("%s: preparing the info response failed: %s", p->name, strerror(-rc));
		path_stop(p, rc);
		return;
	}

	/* IO may follow the info response at once: be ready for it first. */
	if (!s->link_up && ctx->ops.link_ev) {
		rc = ctx->ops.link_ev(s, RTRS_SRV_LINK_EV_CONNECTED, ctx->ops.priv);
		if (rc) {
			rc = rc < 0 ? rc : -rc;
			log_err("%s: session refused by its user: %s", p->name, strerror(-rc));
			path_refuse(p, rc, rc == -EACCES || rc == -EPERM);
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

/* "host:port" or "[v6]:port" to the host alone. */
static void peer_host_of(const char *peer, char *buf, size_t len)
{
	const char *colon = strrchr(peer, ':');
	size_t n = colon ? (size_t)(colon - peer) : strlen(peer);

	if (n >= 2 && peer[0] == '[' && peer[n - 1] == ']') {
		peer++;
		n -= 2;
	}
	snprintf(buf, len, "%.*s", (int)n, peer);
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
	peer_host_of(peer, p->peer_host, sizeof(p->peer_host));
	snprintf(p->name_new, sizeof(p->name_new), "%s/%s", s->name[0] ? s->name : "(new)", peer);
	p->name = p->name_new;
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
	p->created_ms = now_ms();
	p->serial = ++ctx->path_serial;
	rtrs_auth_srv_begin(&p->auth, &ctx->auth_cfg, p->name);
	rc = fab_mr_reg(ctx->fab, p->verdict, sizeof(p->verdict), FAB_MR_LOCAL, &p->verdict_mr);
	if (!rc && ctx->auth_required)
		rc = fab_mr_reg(ctx->fab, p->auth_tx, sizeof(p->auth_tx), FAB_MR_LOCAL,
				&p->auth_tx_mr);
	if (rc) {
		fab_mr_dereg(&p->verdict_mr);
		loop_timer_fini(&p->fence_timer);
		pthread_rwlock_destroy(&p->post_lock);
		free(p->cons);
		free(p);
		return rc;
	}
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

/*
 * A final refusal ("do not retry") must reach the client, or it retries
 * what cannot succeed. A reject's private data is gone if the connection
 * is torn down before the client reads it (over tcp the provider closes
 * the socket right after sending it), so a final refusal is an accepted
 * connection whose accept data carries the errno, held open until the
 * client closes it or SRV_VERDICT_HOLD_MS pass. At most SRV_VERDICTS_MAX
 * at a time (each is a connection); beyond that, a plain reject.
 */
#define SRV_VERDICTS_MAX 16
#define SRV_VERDICT_HOLD_MS 2000

struct srv_verdict {
	struct rtrs_srv_ctx *ctx;
	struct fab_con *fc;
	uint64_t until_ms;
	atomic_bool gone;           /* the client closed it */
	struct srv_verdict *next;
};

static void verdict_down(void *priv, int err, const void *data, size_t len)
{
	struct srv_verdict *v = priv;

	atomic_store(&v->gone, true);
	loop_queue(v->ctx->loop, &v->ctx->verdict_work);
}

static void verdict_nop(void *priv) {}
static void verdict_connected(void *priv, const void *data, size_t len) {}
static void verdict_imm(void *priv, uint32_t imm) {}
static void verdict_recv(void *priv, void *buf, size_t len) {}
static void verdict_done(void *priv, void *ctx) {}

static const struct fab_con_ops verdict_ops = {
	.connected = verdict_connected,
	.down = verdict_down,
	.imm = verdict_imm,
	.recv = verdict_recv,
	.done = verdict_done,
	.kick = verdict_nop,
};

/* Loop thread: lets go of refusals read (or timed out); all of them when closing. */
static void verdicts_reap(struct rtrs_srv_ctx *ctx, bool all)
{
	uint64_t now = now_ms();

	for (struct srv_verdict **pv = &ctx->verdicts, *v; (v = *pv);) {
		if (!all && !atomic_load(&v->gone) && now < v->until_ms) {
			pv = &v->next;
			continue;
		}
		*pv = v->next;
		fab_con_destroy(v->fc);
		free(v);
		ctx->nr_verdicts--;
	}
}

static void verdict_work(struct loop_work *w)
{
	verdicts_reap(container_of(w, struct rtrs_srv_ctx, verdict_work), false);
}

/* A final refusal as an accepted connection; false when it cannot be one. */
static bool verdict_send(struct rtrs_srv_ctx *ctx, struct fab_connreq *req,
			 const struct rtrs_msg_conn_rsp *msg)
{
	struct srv_verdict *v;
	struct fab_con_cfg cfg = { .ops = &verdict_ops, .name = "verdict", .tx_depth = 16 };

	if (ctx->nr_verdicts >= SRV_VERDICTS_MAX || !(v = calloc(1, sizeof(*v))))
		return false;
	v->ctx = ctx;
	v->until_ms = now_ms() + SRV_VERDICT_HOLD_MS;
	cfg.priv = v;
	/* In the list before any callback can queue the reaper for it. */
	v->next = ctx->verdicts;
	ctx->verdicts = v;
	ctx->nr_verdicts++;
	if (fab_con_accept(ctx->fab, req, &cfg, msg, sizeof(*msg), &v->fc) == 0)
		return true;
	ctx->verdicts = v->next;
	ctx->nr_verdicts--;
	free(v);
	return false;
}

/*
 * Refuses a connection request with err; dnr tells the client that trying
 * again with the same parameters cannot succeed (its reconnect decision
 * then stops), and then the refusal is held open until read.
 */
static void srv_reject_dnr(struct rtrs_srv_ctx *ctx, struct fab_connreq *req, const char *peer,
			   int err, bool dnr, const char *why)
{
	struct rtrs_conn_rsp rsp = { .err = err, .dnr = dnr };
	struct rtrs_msg_conn_rsp msg;

	atomic_fetch_add(&ctx->st.rejects, 1);
	log_warn("connection from %s rejected: %s (%s%s)", peer, why, strerror(-err),
		 dnr ? ", do not retry" : "");
	rtrs_conn_rsp_encode(&msg, &rsp);
	if (dnr && verdict_send(ctx, req, &msg))
		return;
	fab_reject(ctx->lst, req, &msg, RTRS_CONN_REJ_LEN);
}

static void srv_reject(struct rtrs_srv_ctx *ctx, struct fab_connreq *req, const char *peer,
		       int err, const char *why)
{
	srv_reject_dnr(ctx, req, peer, err, false, why);
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
	atomic_fetch_add(&ctx->st.connreqs, 1);
	if (ctx->closing) {
		srv_reject(ctx, creq, peer, -ESHUTDOWN, "server is closing");
		return;
	}
	rc = rtrs_conn_req_decode(data, len, &req, &why);
	if (rc) {
		/* Another protocol version, or garbage: retrying sends the same. */
		srv_reject_dnr(ctx, creq, peer, rc, true, why);
		return;
	}
	if (req.cid_num > ctx->opts.max_cons_per_path) {
		srv_reject_dnr(ctx, creq, peer, -EINVAL, true,
			       "more connections per path than allowed");
		return;
	}
	if (ctx->auth_required && !req.auth) {
		srv_reject_dnr(ctx, creq, peer, -EACCES, true,
			       "authentication required and the client does not speak it");
		return;
	}
	s = sess_find(ctx, req.paths_uuid);
	if (!s) {
		if (!req.first_conn) {
			srv_reject_dnr(ctx, creq, peer, -ENXIO, true,
				       "unknown session and not a first connection");
			return;
		}
		rc = sess_create(ctx, req.paths_uuid, &s);
		if (rc) {
			srv_reject(ctx, creq, peer, rc, "cannot create the session");
			return;
		}
	}
	p = path_find(s, req.sess_uuid);
	if (!p) {
		char host[64];

		peer_host_of(peer, host, sizeof(host));
		rc = req.cid == 0 ? pending_admit(ctx, host) : 0;
		if (rc) {
			srv_reject(ctx, creq, peer, rc, "too many connections still to prove themselves");
			if (!s->paths)
				sess_free(s);
			return;
		}
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
		 * The client starts this path again: it may have given up on
		 * the old one without our noticing yet, or this is somebody
		 * replaying its request. Only a path that has gone silent
		 * goes: a connected one is probed (path_probe), one still
		 * connecting ends on its own (its connections close, or the
		 * connect timeout). The client's next attempt finds it gone.
		 */
		srv_reject(ctx, creq, peer, -EAGAIN, "the client reconnects a path still open here");
		if (atomic_load(&p->state) == RTRS_PATH_CONNECTED)
			path_probe(p);
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
	if (ctx->auth_required && req.cid && !atomic_load(&p->auth_host_ok)) {
		/* Only an authenticated host adds connections to its path. */
		srv_reject(ctx, creq, peer, -EACCES, "connection before the path authenticated");
		return;
	}
	p->last_connreq_ms = now_ms();

	struct rtrs_conn_rsp rsp = {
		.queue_depth = (uint16_t)s->queue_depth,
		.max_io_size = s->chunk_size - RTRS_MAX_HDR_SIZE,
		.max_hdr_size = RTRS_MAX_HDR_SIZE,
		.flags = RTRS_MSG_FENCE_F | (ctx->auth_required ? RTRS_MSG_AUTH_F : 0) |
			 (s->inval ? RTRS_MSG_NEW_RKEY_F : 0),
		.imm_desc = { .addr = s->imm_mr.base, .key = s->imm_mr.key, .len = RTRS_IMM_REGION },
		.sess_id = s->sess_id,
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
	/* Allocated as connections come, not for all those the request announces. */
	if (!p->cons[req.cid].sg_scratch) {
		p->cons[req.cid].sg_scratch = calloc(RTRS_MAX_READ_SG, sizeof(struct rtrs_desc));
		if (!p->cons[req.cid].sg_scratch) {
			srv_reject(ctx, creq, peer, -ENOMEM, "cannot allocate the connection");
			path_stop(p, -ENOMEM);
			return;
		}
	}
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
	atomic_store(&ctx->st.raw_closed, fab_lst_closed(ctx->lst));
}

static void srv_listen_timer(struct loop_timer *t)
{
	struct rtrs_srv_ctx *ctx = container_of(t, struct rtrs_srv_ctx, listen_timer);
	char port[8];
	int rc;

	if (ctx->lst) {
		/* Listening: the timer now enforces the handshake deadline. */
		fab_lst_sweep(ctx->lst);
		verdicts_reap(ctx, false);
		atomic_store(&ctx->st.raw_closed, fab_lst_closed(ctx->lst));
		return;
	}
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
	struct fab_lst_limits lim = {
		.max_total = ctx->opts.max_pending, .max_per_peer = ctx->opts.max_pending_per_peer,
		.timeout_ms = ctx->opts.handshake_timeout_ms,
	};
	unsigned tick = MAX(MIN(ctx->opts.handshake_timeout_ms / 4, 1000u), 10u);

	fab_lst_limit(ctx->lst, &lim);
	loop_timer_arm(&ctx->listen_timer, tick, tick);
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
	if (o->auth_keys_file && (!*o->auth_keys_file || !o->auth_timeout_ms)) {
		log_err("server: authentication needs a key file name and a timeout");
		return -EINVAL;
	}
	if (o->auth_name && !rtrs_auth_name_valid(o->auth_name)) {
		log_err("server: name must be 1..%d printable characters without blanks",
			RTRS_AUTH_WIRE_NAME_MAX);
		return -EINVAL;
	}
	return 0;
}

/* Limits left at 0 take their defaults (struct rtrs_srv_opts). */
static void srv_opts_defaults(struct rtrs_srv_opts *o)
{
	if (!o->max_pending)
		o->max_pending = RTRS_DEFAULT_MAX_PENDING;
	if (!o->max_pending_per_peer)
		o->max_pending_per_peer = MIN(RTRS_DEFAULT_MAX_PENDING_PER_PEER, o->max_pending);
	if (!o->handshake_timeout_ms)
		o->handshake_timeout_ms = RTRS_DEFAULT_HANDSHAKE_TIMEOUT_MS;
	if (!o->max_sessions)
		o->max_sessions = RTRS_DEFAULT_MAX_SESSIONS;
	if (!o->max_chunk_mem)
		o->max_chunk_mem = rtrs_default_max_chunk_mem();
}

/* The whole key file must parse; which host we look up does not matter. */
static int srv_check_keys(struct rtrs_srv_ctx *ctx)
{
	struct rtrs_auth_cfg *cfg = &ctx->auth_cfg;
	struct rtrs_auth_key hk, ck;
	const char *why = NULL;
	unsigned line = 0;
	int rc;

	rc = rtrs_keyfile_lookup(cfg->keyfile, "(validation)", &hk, &ck, &line, &why);
	rtrs_auth_wipe(&hk, sizeof(hk));
	rtrs_auth_wipe(&ck, sizeof(ck));
	if (rc == -ESRCH)
		return 0;
	if (rc && line)
		log_err("server: %s line %u: %s", cfg->keys_file, line, why ? why : "invalid");
	else if (rc)
		log_err("server: authentication key file %s: %s", cfg->keys_file,
			why ? why : strerror(-rc));
	return rc;
}

/* Authentication settings, checked now so that a typo fails at start. */
static int srv_auth_setup(struct rtrs_srv_ctx *ctx, const struct rtrs_srv_opts *o)
{
	struct rtrs_auth_cfg *cfg = &ctx->auth_cfg;
	int rc;

	snprintf(cfg->name, sizeof(cfg->name), "%s", o->auth_name ? o->auth_name : "rtrs-server");
	rc = rtrs_auth_cfg_lists(cfg, o->auth_hashes, o->auth_dhgroups, true, "server");
	if (rc || !o->auth_keys_file)
		return rc;
	snprintf(ctx->auth_keys_file, sizeof(ctx->auth_keys_file), "%s", o->auth_keys_file);
	cfg->keys_file = ctx->auth_keys_file;
	ctx->auth_required = true;
	rc = rtrs_keyfile_new(cfg->keys_file, &cfg->keyfile);
	if (rc) {
		log_err("server: cannot start reading %s: %s", cfg->keys_file, strerror(-rc));
		return rc;
	}
	return srv_check_keys(ctx);
}

RTRS_EXPORT
int rtrs_srv_check_keys(struct rtrs_srv_ctx *ctx)
{
	int rc;

	if (!ctx)
		return -EINVAL;
	if (!ctx->auth_cfg.keyfile)
		return -ENOENT;
	rc = srv_check_keys(ctx);
	if (!rc)
		log_info("server: key file %s read again: it parses", ctx->auth_keys_file);
	return rc;
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
	ctx->opts.auth_keys_file = NULL; /* the caller's strings are not kept */
	ctx->opts.auth_name = NULL;
	ctx->opts.auth_hashes = NULL;
	ctx->opts.auth_dhgroups = NULL;
	srv_opts_defaults(&ctx->opts);
	rc = srv_auth_setup(ctx, o);
	if (rc) {
		rtrs_keyfile_free(ctx->auth_cfg.keyfile);
		free(ctx);
		return rc;
	}
	ctx->listen_timer.h.fd = -1;
	loop_work_init(&ctx->reap_work, srv_reap_work);
	loop_work_init(&ctx->verdict_work, verdict_work);
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
	rtrs_keyfile_free(ctx->auth_cfg.keyfile);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	free(ctx);
	return rc;
}

RTRS_EXPORT
int rtrs_srv_get_stats(struct rtrs_srv_ctx *ctx, struct rtrs_srv_stats *st)
{
	if (!ctx || !st || st->size < sizeof(*st))
		return -EINVAL;
	st->connreqs = atomic_load(&ctx->st.connreqs);
	st->rejects = atomic_load(&ctx->st.rejects);
	st->auth_ok = atomic_load(&ctx->st.auth_ok);
	st->auth_failed = atomic_load(&ctx->st.auth_failed);
	st->auth_timeouts = atomic_load(&ctx->st.auth_timeouts);
	st->key_rotations = atomic_load(&ctx->st.key_rotations);
	st->chunk_bytes = atomic_load(&ctx->st.chunk_bytes);
	st->pending_evicted = atomic_load(&ctx->st.pending_evicted);
	st->raw_closed = atomic_load(&ctx->st.raw_closed);
	st->limit_refusals = atomic_load(&ctx->st.limit_refusals);
	pthread_mutex_lock(&ctx->lock);
	st->sessions = ctx->nr_sessions;
	pthread_mutex_unlock(&ctx->lock);
	return 0;
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
	verdicts_reap(ctx, true);
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
	rtrs_keyfile_free(ctx->auth_cfg.keyfile);
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
