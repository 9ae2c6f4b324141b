/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: sessions, paths, connections, permits and requests.
 *
 * Threads: the caller of rtrs_clt_open() establishes the paths; each
 * connection's completion thread handles responses, heartbeats and info
 * messages; the session's service loop runs heartbeat timers and path
 * teardown. Ownership of a request: IDLE (owned by the permit holder) ->
 * INFLIGHT (owned by the path it was posted on) -> completed exactly once by
 * whoever wins the INFLIGHT -> DONE compare-and-swap: the response handler,
 * or the path teardown after the path's threads have stopped.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rtrs-auth-sm.h"
#include "rtrs-pri.h"

struct rtrs_permit {
	uint32_t id;
	enum rtrs_clt_con_type con_type; /* admin permits use connection 0 */
	bool in_use;
};

enum clt_req_state { REQ_IDLE, REQ_INFLIGHT, REQ_DONE };

struct clt_con;

struct clt_req {
	struct rtrs_clt_sess *sess;
	uint32_t id;
	atomic_int state;
	enum rtrs_dir dir;
	struct rtrs_clt_req_ops ops;
	enum rtrs_clt_con_type con_type;
	struct clt_path *path;
	struct clt_con *con;
	uint32_t usr_len;
	uint32_t data_len;
	uint32_t hdr_len;           /* user header + rtrs header in the slot */
	size_t data_cnt;
	struct iovec data[RTRS_MAX_SEGMENTS];
	struct fab_mr mrs[RTRS_MAX_SEGMENTS];
	unsigned nr_mrs;
	size_t next_iov;            /* posting progress after -EAGAIN */
	uint64_t next_off;
	struct clt_req *pending_next;
	struct clt_req *wait_next;  /* waiting for a path (path == NULL) */
	uint64_t wait_deadline_ms;
	struct clt_path *fence_path; /* failed over from it: waits for its fence */
};

struct clt_con {
	struct clt_path *path;
	unsigned cid;
	struct fab_con *fc;
	bool connected;             /* under path->lock */
	int err;                    /* under path->lock: why it went down */
	struct rtrs_conn_rsp rsp;   /* cid 0: what the server accepted with */
	struct rtrs_hb_rx hb_rx;    /* completion thread only */
	pthread_mutex_t pending_lock;
	struct clt_req *pending_head, *pending_tail;
};

struct clt_path {
	struct rtrs_clt_sess *sess;
	unsigned idx;
	char name[528];             /* "sess/host:port"; rtrs_path_stats.name */
	char host[256], port[8];
	char src[256];              /* empty: any */
	uint8_t uuid[RTRS_UUID_LEN];
	_Atomic enum rtrs_path_state state;
	pthread_rwlock_t post_lock; /* readers post; the writer changes state */
	struct fab *fab;
	unsigned nr_cons;
	struct clt_con *cons;
	struct rtrs_desc *rbufs;    /* one per chunk */
	uint32_t *info_gens;        /* key generations of an info response */
	struct rtrs_desc srv_imm;
	/*
	 * Where the server aims empty writes; with always_invalidate also the
	 * key slots (one per chunk) and the table written before a fence ack.
	 */
	char *imm_area;
	size_t imm_len;
	struct fab_mr imm_mr;
	struct fab_mr hdr_mr;       /* the session's header area in this domain */
	struct rtrs_msg_info_req info_req;
	struct fab_mr info_req_mr;
	uint16_t recon_cnt;
	pthread_mutex_t lock;       /* connection establishment */
	pthread_cond_t cond;
	bool info_done;
	int info_err;
	/* Authentication: the connecting thread runs it; cid 0 hands messages over. */
	struct rtrs_auth_txn auth;
	uint16_t auth_tid;
	char auth_tx[RTRS_AUTH_MSG_MAX];
	struct fab_mr auth_tx_mr;
	char auth_rx[RTRS_AUTH_MSG_MAX];
	size_t auth_rx_len;         /* under lock: a message waits */
	/* The reconnect decision's inputs and its last verdict. */
	atomic_bool fail_dnr;       /* do not retry: the server said so, or it changed */
	atomic_bool refused;        /* the server answered this attempt with an errno */
	atomic_int last_err;
	atomic_int verdict;         /* enum rtrs_reconnect_verdict; -1: none yet */
	atomic_uint_fast64_t stat_auth_runs;
	struct rtrs_hb hb;
	struct loop_work fail_work;
	atomic_int fail_err;
	atomic_uint inflight;
	/* Reconnect: the timer (loop) starts a worker thread per attempt. */
	struct loop_timer reconnect_timer;
	pthread_t worker;
	bool worker_started;        /* loop thread and close only */
	atomic_int attempts;        /* failed attempts in a row (loop and worker) */
	atomic_uint_fast64_t down_since_ms; /* when it last failed (loss timeout) */
	atomic_bool keep_closed;    /* disconnected by the user */
	bool removed;               /* rtrs_clt_remove_path: the slot stays, closed */
	unsigned fault_delay_us;    /* RTRS_FAULT_DELAY_PATH: a slow path, for tests */
	/* Fencing (docs/protocol.md section 10). */
	bool srv_fence;             /* the server answers fences */
	struct rtrs_msg_fence fence_msg; /* a fence sent over this path */
	struct fab_mr fence_mr;
	_Atomic(struct clt_path *) fence_for; /* the path this one's fence is for */
	atomic_bool fence_sent;     /* a fence for this path is out */
	atomic_bool fence_acked;    /* ... and answered (or implied by a reconnect) */
	atomic_int fence_err;
	atomic_uint_fast64_t stat_reconnects, stat_reconnect_failures, stat_failovers;
	atomic_uint_fast64_t stat_reads, stat_writes, stat_read_bytes, stat_write_bytes;
};

struct rtrs_clt_sess {
	char name[RTRS_NAME_MAX + 1];
	uint8_t paths_uuid[RTRS_UUID_LEN];
	char provider[32];
	uint16_t port;
	unsigned nr_io_cons;
	unsigned hb_interval_ms, hb_missed_max, connect_timeout_ms;
	unsigned reconnect_delay_ms, reconnect_jitter_ms, reconnect_loss_timeout_ms;
	int max_reconnect_attempts;
	bool wait_timer_ready;
	void (*link_ev)(void *priv, enum rtrs_clt_link_ev ev);
	void (*path_ev)(void *priv, unsigned idx, int up);
	void *priv;
	atomic_bool opened;         /* link events only after rtrs_clt_open */
	struct loop *loop;

	/* Limits from the first path's connect response; fixed afterwards. */
	uint32_t queue_depth, max_io_size, max_hdr_size, chunk_size;

	pthread_mutex_t permit_lock;
	pthread_cond_t permit_cond;
	uint32_t *free_ids;
	uint32_t nr_free;
	unsigned permit_waiters;    /* close waits until they have left */
	bool closing;
	struct rtrs_permit *permits;
	struct clt_req *reqs;
	char *hdr_area;             /* queue_depth slots of max_hdr_size */

	struct clt_path *paths;
	_Atomic size_t paths_num;   /* published paths; slots for all 128 exist */
	pthread_mutex_t admin_lock; /* add/remove path */
	atomic_uint paths_up;
	_Atomic enum rtrs_mp_policy mp_policy;
	atomic_uint rr_cursor;

	/* Authentication settings, secrets included (wiped at close). */
	struct rtrs_auth_cfg auth;
	/*
	 * always_invalidate (the server's NEW_RKEY_F): chunk keys are the
	 * session's, each with its generation; the newest seen wins.
	 */
	bool inval, inval_known;
	uint64_t srv_sess_id;       /* the server incarnation the keys come from */
	atomic_uint_fast64_t srv_sessions; /* incarnations met: rtrs_attrs.server_sessions */
	uint64_t *rkeys;
	uint32_t *rkey_gens;
	pthread_mutex_t rkey_lock;
	bool fault_stale_rkey;      /* RTRS_FAULT_STALE_RKEY: keep using first keys */

	/* Requests waiting for a path, bounded by fast_io_fail_ms. */
	unsigned fast_io_fail_ms;
	pthread_mutex_t wait_lock;
	struct clt_req *wait_head;
	struct clt_req *fence_head; /* in flight on a failed path, awaiting its fence */
	struct loop_timer wait_timer;
	struct loop_work wait_work;
};

static void clt_fail_path(struct clt_path *p, int err);
static int path_connect(struct clt_path *p, bool retry);
static void path_release(struct clt_path *p);

/* ---- requests ------------------------------------------------------------ */

static void req_release_mrs(struct clt_req *req)
{
	for (unsigned i = 0; i < req->nr_mrs; i++)
		fab_mr_dereg(&req->mrs[i]);
	req->nr_mrs = 0;
}

/* Completes req once with err; returns false if someone else did. */
static bool req_complete(struct clt_req *req, int err)
{
	int expected = REQ_INFLIGHT;
	struct rtrs_clt_req_ops ops;
	struct clt_path *p = req->path;

	if (!atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE))
		return false;
	tsan_acquire(req); /* everything up to its post (req_post) */
	req_release_mrs(req);
	ops = req->ops;
	if (p) /* NULL: it was waiting for a path */
		atomic_fetch_sub(&p->inflight, 1);
	atomic_store(&req->state, REQ_IDLE);
	/* req may be reused by the permit holder from here on. */
	ops.conf(ops.priv, err);
	return true;
}

/* A chunk key learned from the server: kept if newer than the one we have. */
static void sess_key_update(struct rtrs_clt_sess *s, uint32_t id, uint32_t gen, uint64_t key)
{
	pthread_mutex_lock(&s->rkey_lock);
	if (!(s->fault_stale_rkey && s->rkey_gens[id]) &&
	    (!s->rkey_gens[id] || (int32_t)(gen - s->rkey_gens[id]) > 0)) {
		s->rkey_gens[id] = gen;
		__atomic_store_n(&s->rkeys[id], key, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&s->rkey_lock);
}

/* The key table the server wrote into p's imm area at offset off (records). */
static int path_keys_merge(struct clt_path *p, size_t off)
{
	struct rtrs_clt_sess *s = p->sess;
	const char *why = NULL;

	for (uint32_t i = 0; i < s->queue_depth; i++) {
		uint64_t key;
		uint32_t gen;

		if (rtrs_new_rkey_decode(p->imm_area + off + (size_t)i * RTRS_RKEY_SLOT, i, &gen,
					 &key, &why)) {
			log_err_rl("%s: invalid key table from the server: %s", p->name, why);
			return -EPROTO;
		}
		sess_key_update(s, i, gen, key);
	}
	return 0;
}

static char *req_hdr_slot(const struct clt_req *req)
{
	return req->sess->hdr_area + (size_t)req->id * req->sess->max_hdr_size;
}

/*
 * Posts what is left of req: data vectors then the header slot, at most
 * iov_limit vectors per write; the last write carries the immediate. Returns
 * 0, -EAGAIN (progress saved), or another error. Nothing touches req after
 * the last write is posted: the response may already be completing it.
 */
static int req_post(struct clt_req *req)
{
	struct rtrs_clt_sess *s = req->sess;
	struct clt_path *p = req->path;
	const struct fab_attr *a = fab_attr(p->fab);
	struct iovec iov[RTRS_MAX_SEGMENTS + 1];
	void *desc[RTRS_MAX_SEGMENTS + 1];
	const struct rtrs_desc *chunk = &p->rbufs[req->id];
	size_t n = 0;
	uint32_t imm;

	if (req->dir == RTRS_WRITE) {
		for (size_t i = 0; i < req->data_cnt; i++) {
			iov[n] = req->data[i];
			desc[n++] = req->nr_mrs ? req->mrs[i].desc : NULL;
		}
	}
	iov[n] = (struct iovec){ .iov_base = req_hdr_slot(req), .iov_len = req->hdr_len };
	desc[n++] = p->hdr_mr.desc;
	if (req->next_iov == 0)
		req->next_off = req->dir == RTRS_WRITE ? 0 : req->data_len;
	imm = rtrs_to_io_req_imm(s->queue_depth, req->id, req->data_len + req->usr_len);

	while (req->next_iov < n) {
		size_t cnt = MIN(n - req->next_iov, a->iov_limit);
		bool last = req->next_iov + cnt == n;
		struct fab_rma rma = {
			.addr = chunk->addr + req->next_off,
			.key = s->inval ? __atomic_load_n(&s->rkeys[req->id], __ATOMIC_ACQUIRE) :
					  chunk->key,
		};
		struct fab_con *fc = req->con->fc;
		size_t first = req->next_iov;
		int rc;

		for (size_t i = 0; i < cnt; i++)
			rma.len += iov[first + i].iov_len;
		if (last)
			tsan_release(req); /* req_complete's acquire; req is not read after */
		rc = fab_write(fc, &iov[first], &desc[first], cnt, &rma, 1, last, imm, NULL);
		if (rc)
			return rc;
		if (last)
			return 0;
		req->next_iov += cnt;
		req->next_off += rma.len;
	}
	return 0;
}

static void con_pending_add(struct clt_con *con, struct clt_req *req)
{
	log_dbg("%s#%u: send queue full, request %u waits", con->path->name, con->cid, req->id);
	pthread_mutex_lock(&con->pending_lock);
	req->pending_next = NULL;
	if (con->pending_tail)
		con->pending_tail->pending_next = req;
	else
		con->pending_head = req;
	con->pending_tail = req;
	pthread_mutex_unlock(&con->pending_lock);
	fab_con_kick(con->fc);
}

/* Completion thread: retry requests that met a full send queue. */
static void clt_con_kick(void *priv)
{
	struct clt_con *con = priv;

	for (;;) {
		struct clt_req *req;
		int rc;

		pthread_mutex_lock(&con->pending_lock);
		req = con->pending_head;
		if (req) {
			con->pending_head = req->pending_next;
			if (!con->pending_head)
				con->pending_tail = NULL;
		}
		pthread_mutex_unlock(&con->pending_lock);
		if (!req)
			return;
		rc = req_post(req);
		if (rc == -EAGAIN) {
			/* Back to the head without a kick: retried after 1 ms or a completion. */
			pthread_mutex_lock(&con->pending_lock);
			req->pending_next = con->pending_head;
			con->pending_head = req;
			if (!con->pending_tail)
				con->pending_tail = req;
			pthread_mutex_unlock(&con->pending_lock);
			fab_con_retry_later(con->fc);
			return;
		}
		if (rc) {
			log_err_rl("%s: posting a request failed: %s", con->path->name, strerror(-rc));
			clt_fail_path(con->path, rc);
			return;
		}
	}
}

static int req_map(struct clt_req *req, struct clt_path *p)
{
	const struct fab_attr *a = fab_attr(p->fab);
	unsigned access = req->dir == RTRS_READ ? FAB_MR_REMOTE_WRITE : FAB_MR_LOCAL;

	req->nr_mrs = 0;
	if (req->dir == RTRS_WRITE && !a->mr_local)
		return 0;
	for (size_t i = 0; i < req->data_cnt; i++) {
		int rc = fab_mr_reg(p->fab, req->data[i].iov_base, req->data[i].iov_len, access,
				    &req->mrs[i]);

		if (rc) {
			req_release_mrs(req);
			return rc;
		}
		req->nr_mrs++;
	}
	return 0;
}

static void req_encode_hdr(struct clt_req *req)
{
	char *slot = req_hdr_slot(req) + req->usr_len;

	if (req->dir == RTRS_WRITE) {
		rtrs_write_hdr_encode(slot, req->usr_len);
		return;
	}
	struct rtrs_desc sg[RTRS_MAX_SEGMENTS];

	for (size_t i = 0; i < req->data_cnt; i++)
		sg[i] = (struct rtrs_desc){ .addr = req->mrs[i].base, .key = req->mrs[i].key,
					    .len = (uint32_t)req->data[i].iov_len };
	rtrs_read_hdr_encode(slot, req->usr_len, 0, sg, (unsigned)req->data_cnt);
}

/* Posts req on path p; with p->post_lock held for reading. */
static int req_issue(struct clt_req *req, struct clt_path *p)
{
	struct rtrs_clt_sess *s = req->sess;
	unsigned cpu = (unsigned)sched_getcpu();
	int rc;

	rc = req_map(req, p);
	if (rc)
		return rc;
	req_encode_hdr(req);
	req->path = p;
	req->con = req->con_type == RTRS_ADMIN_CON ? &p->cons[0] :
		   &p->cons[1 + (cpu % (p->nr_cons - 1))];
	req->next_iov = 0;
	atomic_fetch_add(&p->inflight, 1);
	if (req->dir == RTRS_WRITE) {
		atomic_fetch_add_explicit(&p->stat_writes, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->stat_write_bytes, req->data_len, memory_order_relaxed);
	} else {
		atomic_fetch_add_explicit(&p->stat_reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->stat_read_bytes, req->data_len, memory_order_relaxed);
	}
	atomic_store(&req->state, REQ_INFLIGHT);
	rc = req_post(req);
	if (rc == -EAGAIN) {
		con_pending_add(req->con, req);
		return 0;
	}
	if (rc) {
		/*
		 * No immediate went out, so the server never acts on whatever
		 * pieces reached its chunk: the caller gets the error and conf
		 * is not called.
		 */
		atomic_store(&req->state, REQ_IDLE);
		atomic_fetch_sub(&p->inflight, 1);
		req_release_mrs(req);
		log_err_rl("%s: posting a request failed: %s", p->name, strerror(-rc));
		(void)s;
	}
	return rc;
}

/* Sends req on a path the policy picks; another if posting there fails. */
static int req_route(struct clt_req *req)
{
	struct rtrs_clt_sess *s = req->sess;
	struct rtrs_mp_path snap[RTRS_MAX_PATHS];
	enum rtrs_mp_policy policy = atomic_load(&s->mp_policy);
	int rc = -ECONNABORTED;

	for (size_t i = 0; i < s->paths_num; i++)
		snap[i] = (struct rtrs_mp_path){
			.connected = atomic_load(&s->paths[i].state) == RTRS_PATH_CONNECTED,
			.inflight = atomic_load(&s->paths[i].inflight),
			.latency_ns = atomic_load(&s->paths[i].hb.latency_ns),
		};
	for (size_t tries = 0; tries < s->paths_num; tries++) {
		unsigned rr = atomic_load(&s->rr_cursor);
		int i = rtrs_mp_select(policy, snap, s->paths_num, &rr);
		struct clt_path *p;

		if (i < 0)
			break;
		if (policy == RTRS_MP_POLICY_RR)
			atomic_store(&s->rr_cursor, rr);
		snap[i].tried = true;
		p = &s->paths[i];
		pthread_rwlock_rdlock(&p->post_lock);
		rc = atomic_load(&p->state) == RTRS_PATH_CONNECTED ? req_issue(req, p) : -ECONNABORTED;
		pthread_rwlock_unlock(&p->post_lock);
		if (rc == 0)
			return 0;
	}
	return rc;
}

/* True while some path is up or on its way (a request may wait for it). */
static bool sess_path_may_come(struct rtrs_clt_sess *s)
{
	if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
		return false;
	for (size_t i = 0; i < s->paths_num; i++) {
		enum rtrs_path_state st = atomic_load(&s->paths[i].state);

		if (st != RTRS_PATH_CLOSED && st != RTRS_PATH_CLOSING)
			return true;
	}
	return false;
}

/* No path now: park req until one comes or fast_io_fail_ms passes. */
static void req_wait(struct clt_req *req)
{
	struct rtrs_clt_sess *s = req->sess;
	bool first;

	req->path = NULL;
	req->wait_deadline_ms = now_ms() + s->fast_io_fail_ms;
	atomic_store(&req->state, REQ_INFLIGHT);
	pthread_mutex_lock(&s->wait_lock);
	first = !s->wait_head;
	req->wait_next = s->wait_head;
	s->wait_head = req;
	pthread_mutex_unlock(&s->wait_lock);
	if (first) /* retried every 50 ms, and at once when a path comes up */
		loop_timer_arm(&s->wait_timer, 50, 50);
}

/*
 * Loop thread: retries the waiting requests; fails those past their
 * deadline (-ETIMEDOUT) or with no path left to wait for (-ECONNABORTED).
 * Completions run without the lock: conf may submit again.
 */
/* Sends a fence for failed path f over another connected path. Loop thread. */
static void sess_send_fence(struct rtrs_clt_sess *s, struct clt_path *f)
{
	for (size_t i = 0; i < s->paths_num; i++) {
		struct clt_path *h = &s->paths[i];

		if (h == f || atomic_load(&h->fence_for) || !h->srv_fence ||
		    atomic_load(&h->state) != RTRS_PATH_CONNECTED)
			continue;
		rtrs_fence_encode(&h->fence_msg, false, f->uuid, 0);
		/* Before the send: its ack may come back before fab_send returns. */
		atomic_store(&h->fence_for, f);
		atomic_store(&f->fence_sent, true);
		if (fab_send(h->cons[0].fc, &h->fence_msg, sizeof(h->fence_msg), h->fence_mr.desc,
			     NULL)) {
			atomic_store(&h->fence_for, NULL);
			atomic_store(&f->fence_sent, false);
			continue;
		}
		log_info("%s: asked the server to fence %s", h->name, f->name);
		return;
	}
}

/*
 * Requests parked after their path failed: past the deadline they fail;
 * once the path is fenced (or has reconnected) they join the wait list and
 * go out again; otherwise a fence is sent for the path if none is out.
 */
static void sess_process_fences(struct rtrs_clt_sess *s, uint64_t now, bool may_come)
{
	struct clt_req *list, *req, *keep = NULL, *go = NULL;

	/* A path whose fence was answered may carry the next one. */
	for (size_t i = 0; i < s->paths_num; i++) {
		struct clt_path *f = atomic_load(&s->paths[i].fence_for);

		if (f && atomic_load(&f->fence_acked))
			atomic_store(&s->paths[i].fence_for, NULL);
	}
	pthread_mutex_lock(&s->wait_lock);
	list = s->fence_head;
	s->fence_head = NULL;
	pthread_mutex_unlock(&s->wait_lock);
	while ((req = list)) {
		struct clt_path *f = req->fence_path;

		list = req->wait_next;
		if (!may_come || now >= req->wait_deadline_ms) {
			req->fence_path = NULL;
			req_complete(req, may_come ? -ETIMEDOUT : -ECONNABORTED);
		} else if (atomic_load(&f->fence_acked) && atomic_load(&f->fence_err)) {
			log_warn_rl("%s: the server could not fence the path: %s", f->name,
				    strerror(-atomic_load(&f->fence_err)));
			req->fence_path = NULL;
			req_complete(req, -EIO);
		} else if (atomic_load(&f->fence_acked)) {
			req->fence_path = NULL;
			req->wait_next = go;
			go = req;
		} else {
			if (!atomic_load(&f->fence_sent))
				sess_send_fence(s, f);
			req->wait_next = keep;
			keep = req;
		}
	}
	pthread_mutex_lock(&s->wait_lock);
	while ((req = keep)) {
		keep = req->wait_next;
		req->wait_next = s->fence_head;
		s->fence_head = req;
	}
	while ((req = go)) {
		go = req->wait_next;
		req->wait_next = s->wait_head;
		s->wait_head = req;
	}
	pthread_mutex_unlock(&s->wait_lock);
}

static void sess_retry_waiting(struct rtrs_clt_sess *s)
{
	struct clt_req *list, *req, *keep = NULL;
	bool may_come = sess_path_may_come(s);
	uint64_t now = now_ms();

	sess_process_fences(s, now, may_come);

	pthread_mutex_lock(&s->wait_lock);
	list = s->wait_head;
	s->wait_head = NULL;
	pthread_mutex_unlock(&s->wait_lock);
	while ((req = list)) {
		int err = 0;

		list = req->wait_next;
		if (!may_come)
			err = -ECONNABORTED;
		else if (now >= req->wait_deadline_ms)
			err = -ETIMEDOUT;
		else if (req_route(req) == 0)
			continue; /* on its way */
		if (err) {
			if (err == -ETIMEDOUT)
				log_warn_rl("%s: no path came up within %u ms, request %u fails",
					    s->name, s->fast_io_fail_ms, req->id);
			req->path = NULL;
			req_complete(req, err);
			continue;
		}
		/* A failed try left it IDLE: it still waits, so it is ours again. */
		req->path = NULL;
		atomic_store(&req->state, REQ_INFLIGHT);
		req->wait_next = keep;
		keep = req;
	}
	pthread_mutex_lock(&s->wait_lock);
	while ((req = keep)) {
		keep = req->wait_next;
		req->wait_next = s->wait_head;
		s->wait_head = req;
	}
	if (!s->wait_head && !s->fence_head)
		loop_timer_arm(&s->wait_timer, 0, 0);
	pthread_mutex_unlock(&s->wait_lock);
}

static void sess_wait_timer(struct loop_timer *t)
{
	sess_retry_waiting(container_of(t, struct rtrs_clt_sess, wait_timer));
}

static void sess_wait_work(struct loop_work *w)
{
	sess_retry_waiting(container_of(w, struct rtrs_clt_sess, wait_work));
}

RTRS_EXPORT
int rtrs_clt_request(struct rtrs_clt_sess *s, enum rtrs_dir dir,
		     const struct rtrs_clt_req_ops *ops, struct rtrs_permit *permit,
		     const struct iovec *usr, size_t usr_cnt,
		     const struct iovec *data, size_t data_cnt)
{
	struct clt_req *req;
	size_t usr_len = 0, data_len = 0, hdr;
	char *slot;

	if (!s || !ops || !ops->conf || !permit || (dir != RTRS_READ && dir != RTRS_WRITE))
		return -EINVAL;
	if (permit->id >= s->queue_depth || permit != &s->permits[permit->id] ||
	    !permit->in_use || (data_cnt && !data) || (usr_cnt && !usr))
		return -EINVAL;
	if (data_cnt > RTRS_MAX_SEGMENTS)
		return -EMSGSIZE;
	for (size_t i = 0; i < usr_cnt; i++)
		if (add_overflow(usr_len, usr[i].iov_len, &usr_len))
			return -EMSGSIZE;
	for (size_t i = 0; i < data_cnt; i++) {
		if (data[i].iov_len == 0 || add_overflow(data_len, data[i].iov_len, &data_len))
			return -EINVAL;
	}
	hdr = rtrs_io_hdr_size(dir == RTRS_READ, dir == RTRS_READ ? (unsigned)data_cnt : 0);
	if (usr_len + hdr > s->max_hdr_size || data_len > s->max_io_size)
		return -EMSGSIZE;
	if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
		return -ESHUTDOWN;

	req = &s->reqs[permit->id];
	if (atomic_load(&req->state) != REQ_IDLE)
		return -EBUSY;
	req->dir = dir;
	req->ops = *ops;
	req->con_type = permit->con_type;
	req->usr_len = (uint32_t)usr_len;
	req->data_len = (uint32_t)data_len;
	req->hdr_len = (uint32_t)(usr_len + hdr);
	req->data_cnt = data_cnt;
	if (data_cnt)
		memcpy(req->data, data, data_cnt * sizeof(*data));
	slot = req_hdr_slot(req);
	for (size_t i = 0; i < usr_cnt; i++) {
		memcpy(slot, usr[i].iov_base, usr[i].iov_len);
		slot += usr[i].iov_len;
	}

	{
		int rc = req_route(req);

		if (rc == -ECONNABORTED && s->fast_io_fail_ms && sess_path_may_come(s)) {
			req_wait(req);
			return 0;
		}
		return rc;
	}
}

/* ---- permits --------------------------------------------------------------- */

RTRS_EXPORT
struct rtrs_permit *rtrs_clt_get_permit(struct rtrs_clt_sess *s,
					enum rtrs_clt_con_type con_type, enum rtrs_wait wait)
{
	struct rtrs_permit *permit = NULL;

	if (!s)
		return NULL;
	pthread_mutex_lock(&s->permit_lock);
	s->permit_waiters++;
	while (!s->nr_free && !s->closing && wait == RTRS_PERMIT_WAIT)
		pthread_cond_wait(&s->permit_cond, &s->permit_lock);
	if (s->nr_free && !s->closing) {
		permit = &s->permits[s->free_ids[--s->nr_free]];
		permit->con_type = con_type;
		permit->in_use = true;
	}
	if (--s->permit_waiters == 0 && s->closing)
		pthread_cond_broadcast(&s->permit_cond);
	pthread_mutex_unlock(&s->permit_lock);
	return permit;
}

RTRS_EXPORT
void rtrs_clt_put_permit(struct rtrs_clt_sess *s, struct rtrs_permit *permit)
{
	if (!s || !permit)
		return;
	pthread_mutex_lock(&s->permit_lock);
	if (permit->id >= s->queue_depth || permit != &s->permits[permit->id] ||
	    !permit->in_use) {
		pthread_mutex_unlock(&s->permit_lock);
		log_err("%s: put of a permit that is not taken (double put?)", s->name);
		return;
	}
	permit->in_use = false;
	s->free_ids[s->nr_free++] = permit->id;
	pthread_cond_signal(&s->permit_cond);
	pthread_mutex_unlock(&s->permit_lock);
}

RTRS_EXPORT
unsigned rtrs_permit_id(const struct rtrs_permit *permit)
{
	return permit->id;
}

/* ---- connection callbacks (completion threads) --------------------------- */

static void clt_con_connected(void *priv, const void *data, size_t len)
{
	struct clt_con *con = priv;
	struct clt_path *p = con->path;
	const char *why = NULL;
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = rtrs_conn_rsp_decode(data, len, &con->rsp, &why);
	if (rc) {
		log_err("%s: invalid connect response on connection %u: %s", p->name, con->cid, why);
		con->err = rc;
	} else if (con->rsp.err) {
		con->err = con->rsp.err;
		atomic_store(&p->refused, true);
		if (con->rsp.dnr)
			atomic_store(&p->fail_dnr, true);
	} else {
		con->connected = true;
	}
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

static void clt_con_down(void *priv, int err, const void *data, size_t len)
{
	struct clt_con *con = priv;
	struct clt_path *p = con->path;
	struct rtrs_conn_rsp rsp;
	const char *why = NULL;

	if (err == -ECONNREFUSED && len) {
		/* A reject from the server carries its reason. */
		if (rtrs_conn_rsp_decode(data, len, &rsp, &why) == 0 && rsp.err) {
			log_err("%s: server rejected connection %u: %s%s", p->name, con->cid,
				strerror(-rsp.err), rsp.dnr ? " (do not retry)" : "");
			err = rsp.err;
			atomic_store(&p->refused, true);
			if (rsp.dnr)
				atomic_store(&p->fail_dnr, true);
		} else {
			log_err("%s: connection %u refused with unreadable reason: %s", p->name,
				con->cid, why ? why : "?");
		}
	}
	pthread_mutex_lock(&p->lock);
	bool was_connected = atomic_load(&p->state) == RTRS_PATH_CONNECTED;

	con->err = err ? err : -ECONNRESET;
	con->connected = false;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	/*
	 * Connected: tear the path down. Connecting: clt_fail_path only wakes
	 * the establishing thread, which reports (even after its last wait).
	 */
	if (was_connected)
		log_warn("%s: connection %u went down: %s", p->name, con->cid, strerror(-err));
	if (atomic_load(&p->state) != RTRS_PATH_CLOSING && atomic_load(&p->state) != RTRS_PATH_CLOSED)
		clt_fail_path(p, err ? err : -ECONNRESET);
}

static void clt_handle_rsp(struct clt_con *con, uint32_t payload)
{
	struct clt_path *p = con->path;
	struct rtrs_clt_sess *s = p->sess;
	const char *why = NULL;
	struct clt_req *req;
	uint32_t id;
	int err;

	if (rtrs_io_rsp_decode(payload, s->queue_depth, &id, &err, &why)) {
		log_err_rl("%s: invalid response: %s", p->name, why);
		clt_fail_path(p, -EPROTO);
		return;
	}
	req = &s->reqs[id];
	if (atomic_load(&req->state) != REQ_INFLIGHT || req->path != p) {
		log_err_rl("%s: response for request %u that is not in flight here", p->name, id);
		clt_fail_path(p, -EPROTO);
		return;
	}
	if (s->inval) {
		/* The chunk's next key came with the response, in its slot. */
		uint64_t key;
		uint32_t gen;

		if (rtrs_new_rkey_decode(p->imm_area + (size_t)id * RTRS_RKEY_SLOT, id, &gen, &key,
					 &why)) {
			log_err_rl("%s: response %u without a valid new key: %s", p->name, id, why);
			clt_fail_path(p, -EPROTO);
			return;
		}
		sess_key_update(s, id, gen, key);
	}
	req_complete(req, err);
}

static void clt_con_imm(void *priv, uint32_t imm)
{
	struct clt_con *con = priv;
	struct clt_path *p = con->path;
	uint32_t payload;
	unsigned type;
	int rc;

	if (unlikely(p->fault_delay_us))
		usleep(p->fault_delay_us); /* fault injection: this path is slow */
	rtrs_hb_heard(&p->hb);
	rtrs_from_imm(imm, &type, &payload);
	switch (type) {
	case RTRS_IO_RSP_IMM:
	case RTRS_IO_RSP_W_INV_IMM:
		clt_handle_rsp(con, payload);
		break;
	case RTRS_HB_MSG_IMM:
	case RTRS_HB_ACK_IMM:
		if (!rtrs_hb_received(&p->hb, &con->hb_rx, con->cid, type == RTRS_HB_ACK_IMM,
				      p->name)) {
			fab_con_shutdown(con->fc);
			clt_fail_path(p, -EPROTO);
			break;
		}
		if (type == RTRS_HB_ACK_IMM)
			break;
		rc = rtrs_hb_post(&p->hb, con->fc, p->srv_imm.addr, p->srv_imm.key, true);
		if (rc && rc != -EAGAIN)
			clt_fail_path(p, rc);
		break;
	default:
		log_err_rl("%s: unknown immediate type %u", p->name, type);
		clt_fail_path(p, -EPROTO);
	}
}

static void clt_con_recv(void *priv, void *buf, size_t len)
{
	struct clt_con *con = priv;
	struct clt_path *p = con->path;
	struct rtrs_limits lim = {
		.queue_depth = p->sess->queue_depth, .chunk_size = p->sess->chunk_size,
		.max_hdr_size = p->sess->max_hdr_size,
	};
	const char *why = NULL;
	int rc;

	rtrs_hb_heard(&p->hb);
	if (con->cid == 0 && atomic_load(&p->state) == RTRS_PATH_CONNECTED) {
		uint8_t uuid[RTRS_UUID_LEN];
		struct clt_path *f = atomic_load(&p->fence_for);
		int err;

		if (rtrs_fence_decode(buf, len, RTRS_MSG_FENCE_ACK, uuid, &err, &why) || !f ||
		    memcmp(uuid, f->uuid, RTRS_UUID_LEN)) {
			log_err_rl("%s: unexpected message: %s", p->name, why ? why : "stray fence ack");
			clt_fail_path(p, -EPROTO);
			return;
		}
		/* The server wrote the key table ahead of the ack. */
		if (p->sess->inval &&
		    path_keys_merge(p, (size_t)p->sess->queue_depth * RTRS_RKEY_SLOT)) {
			clt_fail_path(p, -EPROTO);
			return;
		}
		atomic_store(&f->fence_err, err);
		atomic_store(&f->fence_acked, true);
		loop_queue(p->sess->loop, &p->sess->wait_work);
		return;
	}
	pthread_mutex_lock(&p->lock);
	if (con->cid == 0 && rtrs_msg_type(buf, len) == RTRS_MSG_AUTH) {
		/* For the connecting thread, which runs the transaction. */
		if (p->auth_rx_len || len > sizeof(p->auth_rx)) {
			pthread_mutex_unlock(&p->lock);
			log_err_rl("%s: unexpected authentication message", p->name);
			clt_fail_path(p, -EPROTO);
			return;
		}
		memcpy(p->auth_rx, buf, len);
		p->auth_rx_len = len;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	if (con->cid != 0 || p->info_done) {
		pthread_mutex_unlock(&p->lock);
		log_err_rl("%s: unexpected message on connection %u", p->name, con->cid);
		clt_fail_path(p, -EPROTO);
		return;
	}
	int verdict;
	bool dnr;

	lim.new_rkey = p->sess->inval;
	rc = rtrs_info_rsp_decode(buf, len, &lim, p->rbufs, p->info_gens, &verdict, &dnr, &why);
	if (rc) {
		log_err("%s: invalid info response: %s", p->name, why);
	} else if (verdict) {
		log_err("%s: server refused the path: %s%s", p->name, strerror(-verdict),
			dnr ? " (do not retry)" : "");
		atomic_store(&p->fail_dnr, dnr);
		atomic_store(&p->refused, true);
		rc = verdict;
	} else if (p->sess->inval) {
		for (uint32_t i = 0; i < p->sess->queue_depth; i++)
			sess_key_update(p->sess, i, p->info_gens[i], p->rbufs[i].key);
	}
	p->info_err = rc;
	p->info_done = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

static void clt_con_done(void *priv, void *ctx)
{
	struct clt_con *con = priv;

	/* Only heartbeats ask for a completion. */
	rtrs_hb_done(&con->path->hb, ctx);
}

static const struct fab_con_ops clt_con_ops = {
	.connected = clt_con_connected,
	.down = clt_con_down,
	.imm = clt_con_imm,
	.recv = clt_con_recv,
	.done = clt_con_done,
	.kick = clt_con_kick,
};

/* ---- path failure and teardown (service loop) --------------------------- */

static bool path_change_state(struct clt_path *p, enum rtrs_path_state to)
{
	return rtrs_path_change_state(&p->state, p->name, to);
}

static void path_destroy_cons(struct clt_path *p)
{
	for (unsigned i = 0; i < p->nr_cons; i++)
		fab_con_shutdown(p->cons[i].fc);
	for (unsigned i = 0; i < p->nr_cons; i++) {
		fab_con_destroy(p->cons[i].fc);
		p->cons[i].fc = NULL;
		p->cons[i].connected = false;
		p->cons[i].pending_head = p->cons[i].pending_tail = NULL;
	}
}

/* Arms the next reconnect attempt: delay plus random jitter. Loop thread. */
static void path_schedule_reconnect(struct clt_path *p, unsigned min_ms)
{
	struct rtrs_clt_sess *s = p->sess;
	unsigned ms = rtrs_reconnect_wait_ms(s->reconnect_delay_ms, s->reconnect_jitter_ms, min_ms);

	loop_timer_arm(&p->reconnect_timer, ms, 0);
	log_info("%s: reconnecting in %u ms (attempt %d)", p->name, ms,
		 atomic_load(&p->attempts) + 1);
}

/*
 * Asks the reconnect decision (rtrs_should_reconnect) about the path failing
 * with err after attempts failed attempts, and records err and the verdict
 * for the path's statistics. Logs a verdict that ends the path.
 */
static bool path_should_reconnect(struct clt_path *p, int err, int attempts)
{
	const struct rtrs_clt_sess *s = p->sess;
	struct rtrs_reconnect_in in = {
		.err = err,
		.dnr = atomic_load(&p->fail_dnr),
		.stopping = __atomic_load_n(&s->closing, __ATOMIC_ACQUIRE) ||
			    atomic_load(&p->keep_closed),
		.attempts = attempts,
		.max_attempts = __atomic_load_n(&s->max_reconnect_attempts, __ATOMIC_RELAXED),
		.down_ms = now_ms() - atomic_load(&p->down_since_ms),
		.loss_timeout_ms = s->reconnect_loss_timeout_ms,
	};
	enum rtrs_reconnect_verdict v = rtrs_should_reconnect(&in);

	if (err)
		atomic_store(&p->last_err, err);
	atomic_store(&p->verdict, (int)v);
	if (v != RTRS_RECONNECT_RETRY && v != RTRS_RECONNECT_STOPPED)
		log_warn("%s: not reconnecting (%s, last error: %s); reconnect it by hand", p->name,
			 rtrs_reconnect_verdict_str(v), strerror(-atomic_load(&p->last_err)));
	return v == RTRS_RECONNECT_RETRY;
}

/*
 * Stops the path and fails every request in flight on it; it ends in
 * RECONNECTING (next attempt scheduled) or CLOSED. Loop thread.
 */
static void path_stop(struct clt_path *p, int err, enum rtrs_path_state next)
{
	struct rtrs_clt_sess *s = p->sess;
	enum rtrs_path_state st;
	bool was_up;
	unsigned failed = 0;

	pthread_rwlock_wrlock(&p->post_lock);
	st = atomic_load(&p->state);
	was_up = st == RTRS_PATH_CONNECTED;
	if (st == RTRS_PATH_CLOSED || st == RTRS_PATH_CONNECTING) {
		/* Closed already, or a worker is connecting it: it decides. */
		pthread_rwlock_unlock(&p->post_lock);
		return;
	}
	if (st == RTRS_PATH_RECONNECTING) {
		if (next == RTRS_PATH_CLOSED) {
			loop_timer_arm(&p->reconnect_timer, 0, 0);
			path_change_state(p, RTRS_PATH_CLOSED);
		}
		pthread_rwlock_unlock(&p->post_lock);
		return;
	}
	path_change_state(p, RTRS_PATH_CLOSING);
	pthread_rwlock_unlock(&p->post_lock);
	atomic_store(&p->down_since_ms, now_ms());

	loop_timer_arm(&p->hb.timer, 0, 0);
	/* After this no completion thread of the path runs any more. */
	path_destroy_cons(p);
	/* A fence this path carried for another one will not be answered. */
	struct clt_path *carried = atomic_exchange(&p->fence_for, NULL);

	if (carried)
		atomic_store(&carried->fence_sent, false);
	bool fence = p->srv_fence && s->fast_io_fail_ms && err != -ESHUTDOWN &&
		     !__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE);
	unsigned moved = 0;

	atomic_store(&p->fence_sent, false);
	atomic_store(&p->fence_acked, false);
	for (uint32_t i = 0; s->reqs && i < s->queue_depth; i++) {
		struct clt_req *req = &s->reqs[i];

		if (atomic_load(&req->state) != REQ_INFLIGHT || req->path != p)
			continue;
		if (!fence) {
			failed += req_complete(req, -ECONNABORTED);
			continue;
		}
		/* Failover: after the server fences this path, same permit and chunk. */
		req_release_mrs(req);
		atomic_fetch_sub(&p->inflight, 1);
		req->path = NULL;
		req->fence_path = p;
		req->wait_deadline_ms = now_ms() + s->fast_io_fail_ms;
		pthread_mutex_lock(&s->wait_lock);
		req->wait_next = s->fence_head;
		s->fence_head = req;
		pthread_mutex_unlock(&s->wait_lock);
		moved++;
	}
	if (moved) {
		atomic_fetch_add(&p->stat_failovers, moved);
		log_info("%s: %u requests wait for this path to be fenced, then fail over",
			 p->name, moved);
		loop_timer_arm(&s->wait_timer, 1, 50);
	}
	path_release(p);
	if (next == RTRS_PATH_RECONNECTING &&
	    !path_should_reconnect(p, err, atomic_load(&p->attempts)))
		next = RTRS_PATH_CLOSED;
	path_change_state(p, next);
	if (failed)
		log_at(err == -ESHUTDOWN ? LOG_INFO : LOG_WARN,
		       "%s: path closed (%s), %u requests failed", p->name, strerror(-err), failed);
	if (was_up && s->path_ev && atomic_load(&s->opened))
		s->path_ev(s->priv, p->idx, 0);
	if (was_up && atomic_fetch_sub(&s->paths_up, 1) == 1 && s->link_ev &&
	    atomic_load(&s->opened))
		s->link_ev(s->priv, RTRS_CLT_LINK_EV_DISCONNECTED);
	if (next == RTRS_PATH_RECONNECTING)
		path_schedule_reconnect(p, 0);
}

static void path_fail_work(struct loop_work *w)
{
	struct clt_path *p = container_of(w, struct clt_path, fail_work);

	path_stop(p, atomic_load(&p->fail_err), RTRS_PATH_RECONNECTING);
}

/* A reconnect attempt, on its own thread: connecting blocks. */
static void *path_reconnect_worker(void *arg)
{
	struct clt_path *p = arg;
	char tname[16];
	int rc;

	snprintf(tname, sizeof(tname), "rtrs-reconnect");
	pthread_setname_np(pthread_self(), tname);
	rc = path_connect(p, true);
	if (!rc) {
		atomic_store(&p->attempts, 0);
		atomic_fetch_add(&p->stat_reconnects, 1);
		log_info("%s: reconnected", p->name);
	} else {
		atomic_fetch_add(&p->attempts, 1);
		atomic_fetch_add(&p->stat_reconnect_failures, 1);
		if (atomic_load(&p->state) == RTRS_PATH_CLOSED)
			log_warn("%s: reconnect failed (%s); path closed after %d attempts", p->name,
				 strerror(-rc), atomic_load(&p->attempts));
	}
	return NULL;
}

/* Loop thread: the reconnect timer fired. */
static void path_reconnect_timer(struct loop_timer *t)
{
	struct clt_path *p = container_of(t, struct clt_path, reconnect_timer);

	if (p->worker_started) {
		pthread_join(p->worker, NULL); /* the last attempt, finished */
		p->worker_started = false;
	}
	if (atomic_load(&p->state) != RTRS_PATH_RECONNECTING)
		return;
	/* Asked again: the loss timeout or the attempt budget may have run out meanwhile. */
	if (!path_should_reconnect(p, atomic_load(&p->last_err), atomic_load(&p->attempts))) {
		pthread_rwlock_wrlock(&p->post_lock);
		path_change_state(p, RTRS_PATH_CLOSED);
		pthread_rwlock_unlock(&p->post_lock);
		return;
	}
	pthread_rwlock_wrlock(&p->post_lock);
	path_change_state(p, RTRS_PATH_CONNECTING);
	pthread_rwlock_unlock(&p->post_lock);
	if (pthread_create(&p->worker, NULL, path_reconnect_worker, p) == 0) {
		p->worker_started = true;
	} else {
		path_change_state(p, RTRS_PATH_RECONNECTING);
		path_schedule_reconnect(p, 1000);
	}
}

/*
 * Any thread: the path is broken; tear it down on the service loop. While
 * the path is being established its establishing thread owns it: it is
 * woken and gives up itself (and checks fail_err once more after the path
 * is up, for a failure in between).
 */
static void clt_fail_path(struct clt_path *p, int err)
{
	int zero = 0;

	atomic_compare_exchange_strong(&p->fail_err, &zero, err ? err : -EIO);
	if (atomic_load(&p->state) == RTRS_PATH_CONNECTING) {
		pthread_mutex_lock(&p->lock);
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		return;
	}
	loop_queue(p->sess->loop, &p->fail_work);
}

static void path_hb_timer(struct loop_timer *t)
{
	struct clt_path *p = container_of(t, struct clt_path, hb.timer);
	int rc;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED)
		return;
	if (rtrs_hb_tick_expired(&p->hb)) {
		log_err("%s: no heartbeat from the server for %u ms, failing the path", p->name,
			p->hb.interval_ms * p->hb.missed_max);
		clt_fail_path(p, -ETIMEDOUT);
		return;
	}
	rc = rtrs_hb_post(&p->hb, p->cons[0].fc, p->srv_imm.addr, p->srv_imm.key, false);
	if (rc && rc != -EAGAIN) {
		log_err("%s: sending a heartbeat failed: %s", p->name, strerror(-rc));
		clt_fail_path(p, rc);
	}
}

/* ---- establishing a path (caller's thread) ---------------------------------- */

/* Waits for connection con to connect; 0 or its error. */
static int path_wait_con(struct clt_path *p, struct clt_con *con)
{
	struct timespec dl = deadline_ms(p->sess->connect_timeout_ms);
	int rc = 0;

	pthread_mutex_lock(&p->lock);
	while (!con->connected && !con->err && !atomic_load(&p->fail_err) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&p->cond, &p->lock, &dl);
	rc = atomic_load(&p->fail_err) ? atomic_load(&p->fail_err) : con->connected ? 0 :
	     con->err ? con->err : -ETIMEDOUT;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* Allocates what depends on the queue depth, once per session. */
static int sess_set_limits(struct rtrs_clt_sess *s, const struct rtrs_conn_rsp *rsp)
{
	uint32_t qd = rsp->queue_depth;

	if (s->queue_depth) {
		if (qd != s->queue_depth || rsp->chunk_size != s->chunk_size)
			return -ECONNRESET;
		return 0;
	}
	s->reqs = calloc(qd, sizeof(*s->reqs));
	s->permits = calloc(qd, sizeof(*s->permits));
	s->free_ids = calloc(qd, sizeof(*s->free_ids));
	/* aligned_alloc wants a multiple of the alignment. */
	s->hdr_area = aligned_alloc(4096, ((size_t)qd * rsp->max_hdr_size + 4095) & ~(size_t)4095);
	s->rkeys = calloc(qd, sizeof(*s->rkeys));
	s->rkey_gens = calloc(qd, sizeof(*s->rkey_gens));
	if (!s->reqs || !s->permits || !s->free_ids || !s->hdr_area || !s->rkeys || !s->rkey_gens)
		return -ENOMEM;
	for (uint32_t i = 0; i < qd; i++) {
		s->reqs[i].sess = s;
		s->reqs[i].id = i;
		atomic_init(&s->reqs[i].state, REQ_IDLE);
		s->permits[i].id = i;
		s->free_ids[i] = qd - 1 - i;
	}
	s->nr_free = qd;
	s->max_io_size = rsp->max_io_size;
	s->max_hdr_size = rsp->max_hdr_size;
	s->chunk_size = rsp->chunk_size;
	s->queue_depth = qd;
	return 0;
}

static int path_connect_con(struct clt_path *p, unsigned cid)
{
	struct rtrs_clt_sess *s = p->sess;
	struct clt_con *con = &p->cons[cid];
	const struct fab_attr *a = fab_attr(p->fab);
	struct rtrs_conn_req req = {
		.cid = (uint16_t)cid, .cid_num = (uint16_t)p->nr_cons,
		.recon_cnt = p->recon_cnt, .first_conn = true, .fence = true, .auth = true,
	};
	struct rtrs_msg_conn_req msg;
	char name[RTRS_NAME_MAX + 16];
	struct fab_con_cfg cfg = {
		.ops = &clt_con_ops, .priv = con, .name = name,
		.tx_depth = cid ? s->queue_depth + 16 : 128,
		/* verbs: one receive per incoming immediate (responses) */
		.rx_depth = cid && a->rx_cq_data ? s->queue_depth + 16 : 0,
		.rx_queue = cid ? 0 : RTRS_CLT_ADMIN_RX_QUEUE,
	};
	int rc;

	snprintf(name, sizeof(name), "%s#%u", s->name, cid);
	memcpy(req.sess_uuid, p->uuid, RTRS_UUID_LEN);
	memcpy(req.paths_uuid, s->paths_uuid, RTRS_UUID_LEN);
	rtrs_conn_req_encode(&msg, &req);
	con->path = p;
	con->cid = cid;
	con->err = 0;
	con->connected = false;
	rc = fab_con_connect(p->fab, &cfg, &msg, sizeof(msg), &con->fc);
	if (rc)
		return rc;
	return path_wait_con(p, con);
}

/*
 * DH-HMAC-CHAP on connection 0, on the connecting thread: the completion
 * thread hands each message over (auth_rx) and this thread answers.
 */
static int path_authenticate(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	struct timespec dl = deadline_ms(s->connect_timeout_ms);
	enum rtrs_auth_step step = RTRS_AUTH_CONTINUE;
	char msg[RTRS_AUTH_MSG_MAX];
	size_t out_len = 0, len;
	int rc, wait = 0;

	if (!s->auth.hkey.len) {
		log_err("%s: the server requires authentication and this client has no secret",
			p->name);
		return -ENOKEY;
	}
	rc = fab_mr_reg(p->fab, p->auth_tx, sizeof(p->auth_tx), FAB_MR_LOCAL, &p->auth_tx_mr);
	if (rc)
		return rc;
	rc = rtrs_auth_clt_begin(&p->auth, &s->auth, p->name, ++p->auth_tid, p->auth_tx,
				 sizeof(p->auth_tx), &out_len);
	while (!rc) {
		if (out_len) {
			rc = fab_send(p->cons[0].fc, p->auth_tx, out_len, p->auth_tx_mr.desc, NULL);
			if (rc)
				break;
		}
		if (step == RTRS_AUTH_DONE)
			break;
		if (step == RTRS_AUTH_FAILED) {
			rc = p->auth.err;
			break;
		}
		pthread_mutex_lock(&p->lock);
		while (!p->auth_rx_len && !p->cons[0].err && !atomic_load(&p->fail_err) &&
		       wait != ETIMEDOUT)
			wait = pthread_cond_timedwait(&p->cond, &p->lock, &dl);
		len = p->auth_rx_len;
		if (len)
			memcpy(msg, p->auth_rx, len);
		p->auth_rx_len = 0;
		rc = len ? 0 : atomic_load(&p->fail_err) ? atomic_load(&p->fail_err) :
		     p->cons[0].err ? p->cons[0].err : -ETIMEDOUT;
		pthread_mutex_unlock(&p->lock);
		if (rc)
			break;
		step = rtrs_auth_clt_step(&p->auth, msg, len, p->auth_tx, sizeof(p->auth_tx),
					  &out_len);
	}
	if (!rc) {
		atomic_fetch_add(&p->stat_auth_runs, 1);
		log_info("%s: authenticated as %s (%s, %s%s)", p->name, s->auth.name,
			 rtrs_auth_hash_name(p->auth.hash), rtrs_auth_dhgroup_name(p->auth.group),
			 p->auth.bidir ? ", server authenticated too" : "");
	} else {
		log_err("%s: authentication failed: %s", p->name, strerror(-rc));
	}
	rtrs_auth_txn_end(&p->auth);
	return rc;
}

static int path_after_first_con(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	const struct rtrs_conn_rsp *rsp = &p->cons[0].rsp;
	size_t rx_size;
	int rc;

	rc = sess_set_limits(s, rsp);
	if (rc == -ECONNRESET) {
		/* As the kernel: a changed server needs a decision, not retries. */
		log_err("%s: server queue depth %u / chunk %u differs from the session's %u / %u; "
			"no automatic reconnect, reconnect by hand", p->name, rsp->queue_depth,
			rsp->chunk_size, s->queue_depth, s->chunk_size);
		atomic_store(&p->fail_dnr, true);
	}
	if (rc)
		return rc;
	bool inval = rsp->flags & RTRS_MSG_NEW_RKEY_F;

	if (!s->inval_known) {
		s->inval = inval;
		s->inval_known = true;
	} else if (inval != s->inval) {
		log_err("%s: the server switched always_invalidate %s; reconnect by hand", p->name,
			inval ? "on" : "off");
		atomic_store(&p->fail_dnr, true);
		return -ECONNRESET;
	}
	/* Compared and changed under the lock: paths connecting at once count it once. */
	pthread_mutex_lock(&s->rkey_lock);
	if (rsp->sess_id != s->srv_sess_id) {
		/* A new server session (it restarted): keys of the old one mean nothing. */
		memset(s->rkeys, 0, (size_t)s->queue_depth * sizeof(*s->rkeys));
		memset(s->rkey_gens, 0, (size_t)s->queue_depth * sizeof(*s->rkey_gens));
		s->srv_sess_id = rsp->sess_id;
		atomic_fetch_add(&s->srv_sessions, 1);
	}
	pthread_mutex_unlock(&s->rkey_lock);
	p->srv_imm = rsp->imm_desc;
	p->srv_fence = rsp->flags & RTRS_MSG_FENCE_F;
	free(p->rbufs);
	free(p->info_gens);
	p->rbufs = calloc(s->queue_depth, sizeof(*p->rbufs));
	p->info_gens = calloc(s->queue_depth, sizeof(*p->info_gens));
	if (!p->rbufs || !p->info_gens)
		return -ENOMEM;
	/* Empty writes land here; with always_invalidate: key slots, then the fence table. */
	if (!p->imm_area) {
		p->imm_len = MAX((size_t)RTRS_IMM_REGION,
				 2 * (size_t)s->queue_depth * RTRS_RKEY_SLOT);
		p->imm_area = calloc(1, p->imm_len);
		if (!p->imm_area)
			return -ENOMEM;
	}
	rc = fab_mr_reg(p->fab, p->imm_area, p->imm_len, FAB_MR_REMOTE_WRITE, &p->imm_mr);
	if (rc)
		return rc;
	rc = fab_mr_reg(p->fab, s->hdr_area, (size_t)s->queue_depth * s->max_hdr_size,
			FAB_MR_LOCAL, &p->hdr_mr);
	if (rc) {
		log_err("%s: registering the header area failed: %s", p->name, strerror(-rc));
		return rc;
	}
	/*
	 * The info response holds up to one descriptor per chunk. On verbs
	 * every incoming immediate (admin IO responses too) takes a receive.
	 */
	rx_size = MAX(rtrs_info_rsp_size(s->queue_depth, s->inval ? s->queue_depth : 0),
		      RTRS_ADMIN_MSG_SIZE);
	rc = fab_con_rx_setup(p->cons[0].fc,
			      fab_attr(p->fab)->rx_cq_data ?
			      MIN(s->queue_depth + 16, RTRS_CLT_ADMIN_RX_QUEUE) : 2, rx_size);
	if (rc) {
		log_err("%s: posting receives on the admin connection failed: %s", p->name,
			strerror(-rc));
		return rc;
	}
	if (rsp->flags & RTRS_MSG_AUTH_F)
		return path_authenticate(p);
	if (s->auth.ckey.len) {
		log_err("%s: the server offers no authentication, and this client must "
			"authenticate it (controller secret set)", p->name);
		return -ENOKEY;
	}
	return 0;
}

static int path_exchange_info(struct clt_path *p)
{
	struct rtrs_info_req r = { .imm_addr = p->imm_mr.base, .imm_key = p->imm_mr.key };
	struct timespec dl = deadline_ms(p->sess->connect_timeout_ms);
	int rc, wait = 0;

	snprintf(r.pathname, sizeof(r.pathname), "%s", p->sess->name);
	rtrs_info_req_encode(&p->info_req, &r);
	rc = fab_mr_reg(p->fab, &p->info_req, sizeof(p->info_req), FAB_MR_LOCAL, &p->info_req_mr);
	if (rc)
		return rc;
	rc = fab_send(p->cons[0].fc, &p->info_req, sizeof(p->info_req), p->info_req_mr.desc,
		      NULL);
	if (rc)
		return rc;
	pthread_mutex_lock(&p->lock);
	while (!p->info_done && !p->cons[0].err && !atomic_load(&p->fail_err) && wait != ETIMEDOUT)
		wait = pthread_cond_timedwait(&p->cond, &p->lock, &dl);
	rc = atomic_load(&p->fail_err) ? atomic_load(&p->fail_err) :
	     p->info_done ? p->info_err : p->cons[0].err ? p->cons[0].err : -ETIMEDOUT;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static void path_release_mrs(struct clt_path *p)
{
	fab_mr_dereg(&p->auth_tx_mr);
	fab_mr_dereg(&p->fence_mr);
	fab_mr_dereg(&p->hdr_mr);
	fab_mr_dereg(&p->info_req_mr);
	fab_mr_dereg(&p->imm_mr);
}

/* After the connections are gone: the path's registrations and fabric. */
static void path_release(struct clt_path *p)
{
	path_release_mrs(p);
	fab_close(p->fab);
	p->fab = NULL;
}


/*
 * Establishes the path; the caller's thread blocks. On failure the path
 * ends CLOSED, or (retry) RECONNECTING with the next attempt scheduled.
 */
static int path_connect(struct clt_path *p, bool retry)
{
	struct rtrs_clt_sess *s = p->sess;
	bool again;
	int rc;

	p->info_done = false;
	p->info_err = 0;
	p->auth_rx_len = 0;
	atomic_store(&p->fail_err, 0);
	atomic_store(&p->fail_dnr, false);
	atomic_store(&p->refused, false);
	rtrs_hb_reset(&p->hb);
	p->recon_cnt++;
	/* The server's queue depth is not known yet: ask for room for a large one. */
	rc = fab_open(s->provider, p->src[0] ? p->src : NULL, p->host, p->port, false,
		      RTRS_CLT_QUEUE_HINT, &p->fab);
	if (rc) {
		log_err("%s: cannot resolve %s:%s with provider %s: %s", p->name, p->host,
			p->port, s->provider, strerror(-rc));
		return rc;
	}
	rc = fab_mr_reg(p->fab, &p->fence_msg, sizeof(p->fence_msg), FAB_MR_LOCAL,
			&p->fence_mr);
	if (rc)
		goto out_fail;
	for (unsigned cid = 0; cid < p->nr_cons; cid++) {
		rc = path_connect_con(p, cid);
		if (rc) {
			log_err("%s: connection %u of %u failed: %s", p->name, cid, p->nr_cons,
				strerror(-rc));
			goto out_fail;
		}
		if (cid == 0) {
			rc = path_after_first_con(p);
			if (rc)
				goto out_fail;
		}
	}
	rc = path_exchange_info(p);
	if (rc) {
		log_err("%s: info exchange failed: %s", p->name, strerror(-rc));
		goto out_fail;
	}
	pthread_rwlock_wrlock(&p->post_lock);
	if (!path_change_state(p, RTRS_PATH_CONNECTED)) {
		pthread_rwlock_unlock(&p->post_lock);
		rc = -EIO;
		goto out_fail;
	}
	pthread_rwlock_unlock(&p->post_lock);
	loop_timer_arm(&p->hb.timer, p->hb.interval_ms, p->hb.interval_ms);
	if (atomic_fetch_add(&s->paths_up, 1) == 0 && s->link_ev && atomic_load(&s->opened))
		s->link_ev(s->priv, RTRS_CLT_LINK_EV_RECONNECTED);
	if (s->path_ev && atomic_load(&s->opened))
		s->path_ev(s->priv, p->idx, 1);
	/* A failure reported while we were finishing: handle it now. */
	if (atomic_load(&p->fail_err))
		loop_queue(s->loop, &p->fail_work);
	/*
	 * Requests that failed over from this path go too: the server took
	 * this reconnect only after the old path was drained and freed.
	 */
	atomic_store(&p->fence_err, 0);
	atomic_store(&p->fence_acked, true);
	/* Requests waiting for a path go now. */
	loop_queue(s->loop, &s->wait_work);
	log_info("%s: connected, %u connections, queue depth %u, max io %u", p->name,
		 p->nr_cons, s->queue_depth, s->max_io_size);
	return 0;

out_fail:
	path_destroy_cons(p);
	path_release(p);
	/* Another attempt? This one counts (the worker adds it afterwards). */
	if (retry) {
		again = path_should_reconnect(p, rc, atomic_load(&p->attempts) + 1);
	} else {
		again = false;
		atomic_store(&p->last_err, rc);
	}
	pthread_rwlock_wrlock(&p->post_lock);
	path_change_state(p, again ? RTRS_PATH_RECONNECTING : RTRS_PATH_CLOSED);
	pthread_rwlock_unlock(&p->post_lock);
	if (again)
		path_schedule_reconnect(p, 0); /* arming a timer is safe off the loop */
	return rc;
}

/*
 * The first connect of a path, in rtrs_clt_open. A server that refuses
 * without saying "do not retry" is busy or mid-change (a path it still
 * closes, a host whose proof it is recording): try again, a few times,
 * after the reconnect delay. Anything else (no answer, a rejected or
 * missing key, "do not retry") fails the open at once, as in the kernel.
 */
static int path_open(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	int rc;

	for (int attempt = 1;; attempt++) {
		struct rtrs_reconnect_in in = { .attempts = attempt,
						.max_attempts = RTRS_OPEN_REFUSED_TRIES };

		rc = path_connect(p, false);
		if (!rc || !atomic_load(&p->refused))
			return rc;
		in.err = rc;
		in.dnr = atomic_load(&p->fail_dnr);
		if (rtrs_should_reconnect(&in) != RTRS_RECONNECT_RETRY)
			return rc;
		unsigned ms = rtrs_reconnect_wait_ms(s->reconnect_delay_ms, s->reconnect_jitter_ms,
						     0);

		log_info("%s: the server refused the path (%s); trying again in %u ms (%d of %d)",
			 p->name, strerror(-rc), ms, attempt + 1, RTRS_OPEN_REFUSED_TRIES);
		usleep((useconds_t)MIN(ms, 10000u) * 1000);
		pthread_rwlock_wrlock(&p->post_lock);
		path_change_state(p, RTRS_PATH_CONNECTING);
		pthread_rwlock_unlock(&p->post_lock);
	}
}

/* ---- session ------------------------------------------------------------------ */

static int opts_validate(const struct rtrs_clt_opts *o)
{
	if (!o || o->size < sizeof(*o))
		return -EINVAL;
	if (!o->sessname || !rtrs_name_valid(o->sessname)) {
		log_err("session name %s is invalid: 1..255 printable characters without '/' or '.'",
			o->sessname ? o->sessname : "(null)");
		return -EINVAL;
	}
	if (!o->paths || o->paths_num == 0 || o->paths_num > RTRS_MAX_PATHS) {
		log_err("%s: %zu paths given, need 1..%d", o->sessname, o->paths_num,
			RTRS_MAX_PATHS);
		return -EINVAL;
	}
	for (size_t i = 0; i < o->paths_num; i++) {
		if (!o->paths[i].dst || !*o->paths[i].dst) {
			log_err("%s: path %zu has no destination", o->sessname, i);
			return -EINVAL;
		}
	}
	if (o->max_reconnect_attempts < -1 || o->reconnect_delay_ms > 3600000 ||
	    o->reconnect_jitter_ms > 3600000 || o->fast_io_fail_ms > 3600000) {
		log_err("%s: reconnect attempts below -1 or delay/jitter above an hour",
			o->sessname);
		return -EINVAL;
	}
	if ((unsigned)o->mp_policy > RTRS_MP_POLICY_MIN_LATENCY) {
		log_err("%s: unknown multipath policy %d", o->sessname, (int)o->mp_policy);
		return -EINVAL;
	}
	if (o->nr_io_cons > RTRS_MAX_CONNS - 1 || !o->hb_interval_ms || !o->hb_missed_max ||
	    !o->connect_timeout_ms) {
		log_err("%s: connection count, heartbeat or timeout out of range", o->sessname);
		return -EINVAL;
	}
	return 0;
}

static void sess_free(struct rtrs_clt_sess *s)
{
	for (size_t i = 0; s->paths && i < s->paths_num; i++) {
		struct clt_path *p = &s->paths[i];

		if (!p->sess)
			continue; /* never initialised */
		loop_timer_fini(&p->hb.timer);
		loop_timer_fini(&p->reconnect_timer);
		path_release_mrs(p);
		fab_close(p->fab);
		free(p->cons);
		free(p->rbufs);
		free(p->info_gens);
		free(p->imm_area);
		pthread_rwlock_destroy(&p->post_lock);
		pthread_mutex_destroy(&p->lock);
		pthread_cond_destroy(&p->cond);
	}
	free(s->paths);
	free(s->reqs);
	free(s->permits);
	free(s->free_ids);
	free(s->hdr_area);
	free(s->rkeys);
	free(s->rkey_gens);
	rtrs_auth_wipe(&s->auth, sizeof(s->auth));
	pthread_mutex_destroy(&s->rkey_lock);
	pthread_mutex_destroy(&s->permit_lock);
	pthread_cond_destroy(&s->permit_cond);
	pthread_mutex_destroy(&s->wait_lock);
	pthread_mutex_destroy(&s->admin_lock);
	free(s);
}

static void sess_close_waiting(void *arg)
{
	struct rtrs_clt_sess *s = arg;

	sess_retry_waiting(s); /* closing: nothing may come, all fail */
	loop_timer_fini(&s->wait_timer);
}

static void path_close_call(void *arg)
{
	struct clt_path *p = arg;

	/* No more attempts (closing is set), and the last one is over. */
	loop_timer_arm(&p->reconnect_timer, 0, 0);
	if (p->worker_started) {
		pthread_join(p->worker, NULL);
		p->worker_started = false;
	}
	path_stop(p, -ESHUTDOWN, RTRS_PATH_CLOSED);
	loop_timer_fini(&p->reconnect_timer);
	loop_timer_fini(&p->hb.timer);
}

RTRS_EXPORT
void rtrs_clt_close(struct rtrs_clt_sess *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->permit_lock);
	__atomic_store_n(&s->closing, true, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&s->permit_cond);
	/* Threads waking from a permit wait still touch the session. */
	while (s->permit_waiters)
		pthread_cond_wait(&s->permit_cond, &s->permit_lock);
	pthread_mutex_unlock(&s->permit_lock);
	/* Wake attempts in progress: they give up (fail_err) and see closing. */
	for (size_t i = 0; i < s->paths_num; i++)
		if (s->paths[i].sess)
			clt_fail_path(&s->paths[i], -ESHUTDOWN);
	for (size_t i = 0; s->loop && i < s->paths_num; i++)
		if (s->paths[i].sess)
			loop_call(s->loop, path_close_call, &s->paths[i]);
	/* Closing: every request still waiting for a path fails now. */
	if (s->loop && s->wait_timer_ready)
		loop_call(s->loop, sess_close_waiting, s);
	loop_destroy(s->loop);
	s->loop = NULL;
	sess_free(s);
}

static int path_init(struct rtrs_clt_sess *s, struct clt_path *p, unsigned idx,
		     const struct rtrs_path_addr *addr)
{
	pthread_rwlockattr_t attr;
	int rc;

	p->sess = s;
	p->idx = idx;
	p->hb.timer.h.fd = -1;
	p->reconnect_timer.h.fd = -1;
	rc = rtrs_split_hostport(addr->dst, s->port, p->host, sizeof(p->host), p->port,
				 sizeof(p->port));
	if (rc) {
		log_err("%s: path %u: cannot parse destination '%s'", s->name, idx, addr->dst);
		return rc;
	}
	if (addr->src)
		snprintf(p->src, sizeof(p->src), "%s", addr->src);
	snprintf(p->name, sizeof(p->name), "%s/%s:%s", s->name, p->host, p->port);
	rc = rand_bytes(p->uuid, sizeof(p->uuid));
	if (rc)
		return rc;
	atomic_init(&p->state, RTRS_PATH_CONNECTING);
	pthread_rwlockattr_init(&attr);
	/* Teardown must not starve behind a stream of posters. */
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&p->post_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	pthread_mutex_init(&p->lock, NULL);
	cond_init_mono(&p->cond);
	p->nr_cons = 1 + s->nr_io_cons;
	p->cons = calloc(p->nr_cons, sizeof(*p->cons));
	if (!p->cons)
		return -ENOMEM;
	for (unsigned i = 0; i < p->nr_cons; i++)
		pthread_mutex_init(&p->cons[i].pending_lock, NULL);
	p->hb.interval_ms = s->hb_interval_ms;
	p->hb.missed_max = s->hb_missed_max;
	/*
	 * Fault injection, documented in docs/architecture.md: with
	 * RTRS_FAULT_DELAY_PATH=IDX:US, every immediate path IDX receives
	 * (responses, heartbeat acks) is handled US microseconds late.
	 */
	const char *fd = getenv("RTRS_FAULT_DELAY_PATH");
	unsigned fidx, fus;

	if (fd && sscanf(fd, "%u:%u", &fidx, &fus) == 2 && fidx == idx) {
		p->fault_delay_us = fus;
		log_warn("%s: fault injection: every completion %u us late", p->name, fus);
	}
	loop_work_init(&p->fail_work, path_fail_work);
	atomic_init(&p->keep_closed, false);
	atomic_init(&p->verdict, -1);
	rc = loop_timer_init(s->loop, &p->reconnect_timer, path_reconnect_timer);
	if (rc)
		return rc;
	return loop_timer_init(s->loop, &p->hb.timer, path_hb_timer);
}

/* This host's default name: /etc/nvme/hostnqn as nvme-cli does, else from the machine id. */
static void default_host_name(char *buf, size_t len)
{
	char line[256] = "";
	FILE *f = fopen("/etc/nvme/hostnqn", "r");

	if (f) {
		if (fgets(line, sizeof(line), f))
			line[strcspn(line, " \t\r\n")] = '\0';
		fclose(f);
		if (line[0]) {
			snprintf(buf, len, "%s", line);
			return;
		}
	}
	f = fopen("/etc/machine-id", "r");
	if (f) {
		if (fgets(line, sizeof(line), f))
			line[strcspn(line, " \t\r\n")] = '\0';
		fclose(f);
	}
	if (strlen(line) == 32) {
		snprintf(buf, len, "nqn.2014-08.org.nvmexpress:uuid:%.8s-%.4s-%.4s-%.4s-%.12s", line,
			 line + 8, line + 12, line + 16, line + 20);
		return;
	}
	gethostname(line, sizeof(line) - 1);
	snprintf(buf, len, "nqn.2014-08.org.nvmexpress:host:%s", line[0] ? line : "localhost");
}

/* Authentication settings of a session; secrets are loaded now and kept in memory. */
static int sess_auth_setup(struct rtrs_clt_sess *s, const struct rtrs_clt_opts *o)
{
	struct rtrs_auth_cfg *cfg = &s->auth;
	const char *why = NULL;
	int rc;

	if (o->auth_host_name)
		snprintf(cfg->name, sizeof(cfg->name), "%s", o->auth_host_name);
	else
		default_host_name(cfg->name, sizeof(cfg->name));
	snprintf(cfg->server, sizeof(cfg->server), "%s",
		 o->auth_server_name ? o->auth_server_name : "rtrs-server");
	/* Checked whole: the copies above may have cut a long name short. */
	if (!rtrs_auth_name_valid(o->auth_host_name ? o->auth_host_name : cfg->name) ||
	    !rtrs_auth_name_valid(o->auth_server_name ? o->auth_server_name : cfg->server)) {
		log_err("%s: host and server names must be 1..%d printable characters without "
			"blanks", s->name, RTRS_AUTH_WIRE_NAME_MAX);
		return -EINVAL;
	}
	rc = rtrs_auth_cfg_lists(cfg, o->auth_hashes, o->auth_dhgroups, false, s->name);
	if (rc)
		return rc;
	if (o->auth_secret) {
		rc = rtrs_auth_key_load(o->auth_secret, &cfg->hkey, &why);
		if (rc) {
			log_err("%s: host secret: %s", s->name, why ? why : strerror(-rc));
			return rc;
		}
	}
	if (o->auth_ctrl_secret) {
		if (!o->auth_secret) {
			log_err("%s: a controller secret needs a host secret too", s->name);
			return -EINVAL;
		}
		rc = rtrs_auth_key_load(o->auth_ctrl_secret, &cfg->ckey, &why);
		if (rc) {
			log_err("%s: controller secret: %s", s->name, why ? why : strerror(-rc));
			return rc;
		}
	}
	return 0;
}

RTRS_EXPORT
int rtrs_clt_open(const struct rtrs_clt_opts *o, struct rtrs_clt_sess **out)
{
	struct rtrs_clt_sess *s;
	long ncpu;
	int rc;

	rc = opts_validate(o);
	if (rc)
		return rc;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	snprintf(s->name, sizeof(s->name), "%s", o->sessname);
	snprintf(s->provider, sizeof(s->provider), "%s", o->provider ? o->provider : "tcp");
	s->port = o->port;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	/* One per CPU, at most 128: what a server accepts by default (129 in all). */
	s->nr_io_cons = o->nr_io_cons ? o->nr_io_cons : (unsigned)MIN(MAX(ncpu, 1), 128);
	s->hb_interval_ms = o->hb_interval_ms;
	s->hb_missed_max = o->hb_missed_max;
	s->connect_timeout_ms = o->connect_timeout_ms;
	s->reconnect_delay_ms = o->reconnect_delay_ms;
	s->reconnect_jitter_ms = o->reconnect_jitter_ms;
	s->max_reconnect_attempts = o->max_reconnect_attempts;
	s->reconnect_loss_timeout_ms = o->reconnect_loss_timeout_ms;
	s->link_ev = o->link_ev;
	s->path_ev = o->path_ev;
	s->priv = o->priv;
	atomic_init(&s->mp_policy, o->mp_policy);
	pthread_mutex_init(&s->permit_lock, NULL);
	pthread_cond_init(&s->permit_cond, NULL);
	pthread_mutex_init(&s->wait_lock, NULL);
	pthread_mutex_init(&s->admin_lock, NULL);
	pthread_mutex_init(&s->rkey_lock, NULL);
	s->fault_stale_rkey = getenv("RTRS_FAULT_STALE_RKEY") != NULL;
	if (s->fault_stale_rkey)
		log_warn("%s: fault injection: chunk keys are never renewed", s->name);
	atomic_init(&s->paths_up, 0);
	s->fast_io_fail_ms = o->fast_io_fail_ms;
	s->wait_timer.h.fd = -1;
	loop_work_init(&s->wait_work, sess_wait_work);
	rc = rand_bytes(s->paths_uuid, sizeof(s->paths_uuid));
	if (rc)
		goto out_free;
	if (getenv("RTRS_FAULT_PATHS_UUID")) {
		/* Another session's paths may be claimed (the server must refuse it). */
		const char *u = getenv("RTRS_FAULT_PATHS_UUID");

		memset(s->paths_uuid, 0, sizeof(s->paths_uuid));
		memcpy(s->paths_uuid, u, MIN(strlen(u), sizeof(s->paths_uuid)));
		log_warn("%s: fault injection: session uuid from RTRS_FAULT_PATHS_UUID", s->name);
	}
	rc = sess_auth_setup(s, o);
	if (rc)
		goto out_free;
	rc = loop_create("rtrs-clt", &s->loop);
	if (rc)
		goto out_free;
	rc = loop_timer_init(s->loop, &s->wait_timer, sess_wait_timer);
	if (rc)
		goto out_free;
	s->wait_timer_ready = true;
	/* Every slot up front: paths added later never move the table. */
	s->paths = calloc(RTRS_MAX_PATHS, sizeof(*s->paths));
	if (!s->paths) {
		rc = -ENOMEM;
		goto out_free;
	}
	s->paths_num = o->paths_num;
	for (size_t i = 0; i < o->paths_num; i++) {
		rc = path_init(s, &s->paths[i], (unsigned)i, &o->paths[i]);
		if (rc)
			goto out_free;
	}
	for (size_t i = 0; i < s->paths_num; i++) {
		rc = path_open(&s->paths[i]);
		if (rc)
			goto out_free;
	}
	atomic_store(&s->opened, true);
	*out = s;
	return 0;

out_free:
	rtrs_clt_close(s);
	return rc;
}

RTRS_EXPORT
int rtrs_clt_query(struct rtrs_clt_sess *s, struct rtrs_attrs *attrs)
{
	if (!s || !attrs || attrs->size < sizeof(*attrs))
		return -EINVAL;
	attrs->paths_up = atomic_load(&s->paths_up);
	attrs->paths_num = (uint32_t)atomic_load(&s->paths_num);
	attrs->server_sessions = atomic_load(&s->srv_sessions);
	if (!attrs->paths_up)
		return -ECOMM;
	attrs->queue_depth = s->queue_depth;
	attrs->max_io_size = s->max_io_size;
	attrs->max_hdr_size = s->max_hdr_size;
	attrs->max_segments = RTRS_MAX_SEGMENTS;
	attrs->paths_num = (uint32_t)s->paths_num;
	return 0;
}

RTRS_EXPORT
int rtrs_clt_set_mp_policy(struct rtrs_clt_sess *s, enum rtrs_mp_policy policy)
{
	if (!s || (unsigned)policy > RTRS_MP_POLICY_MIN_LATENCY)
		return -EINVAL;
	atomic_store(&s->mp_policy, policy);
	log_info("%s: multipath policy %d", s->name, (int)policy);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_path_stats(struct rtrs_clt_sess *s, unsigned idx, struct rtrs_path_stats *st)
{
	struct clt_path *p;

	if (!s || !st || st->size < sizeof(*st))
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	p = &s->paths[idx];
	snprintf(st->name, sizeof(st->name), "%s", p->name);
	st->state = rtrs_path_state_str(atomic_load(&p->state));
	st->reads = atomic_load(&p->stat_reads);
	st->read_bytes = atomic_load(&p->stat_read_bytes);
	st->writes = atomic_load(&p->stat_writes);
	st->write_bytes = atomic_load(&p->stat_write_bytes);
	st->inflight = atomic_load(&p->inflight);
	st->hb_latency_ns = atomic_load(&p->hb.latency_ns);
	st->reconnects = atomic_load(&p->stat_reconnects);
	st->reconnect_failures = atomic_load(&p->stat_reconnect_failures);
	st->failovers = atomic_load(&p->stat_failovers);
	st->last_error = atomic_load(&p->last_err);
	st->reconnect_verdict = atomic_load(&p->verdict) < 0 ? "" :
				rtrs_reconnect_verdict_str(atomic_load(&p->verdict));
	st->auth_runs = atomic_load(&p->stat_auth_runs);
	return 0;
}

static void path_disconnect_call(void *arg)
{
	struct clt_path *p = arg;

	atomic_store(&p->keep_closed, true);
	loop_timer_arm(&p->reconnect_timer, 0, 0);
	if (p->worker_started) {
		/* An attempt in progress gives up (fail_err) and stays closed. */
		clt_fail_path(p, -ESHUTDOWN);
		pthread_join(p->worker, NULL);
		p->worker_started = false;
	}
	/* Not a session close: its requests fail over after a fence. */
	path_stop(p, -ENOTCONN, RTRS_PATH_CLOSED);
}

RTRS_EXPORT
int rtrs_clt_disconnect_path(struct rtrs_clt_sess *s, unsigned idx)
{
	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	loop_call(s->loop, path_disconnect_call, &s->paths[idx]);
	return 0;
}

static void path_reconnect_call(void *arg)
{
	struct clt_path *p = arg;

	atomic_store(&p->keep_closed, false);
	atomic_store(&p->fail_dnr, false);
	atomic_store(&p->last_err, 0);
	atomic_store(&p->verdict, -1);
	atomic_store(&p->attempts, 0);
	atomic_store(&p->down_since_ms, now_ms()); /* a fresh loss timeout too */
	switch (atomic_load(&p->state)) {
	case RTRS_PATH_CONNECTED:
		/* Closed first; path_stop schedules the attempt itself. */
		path_stop(p, -ECONNRESET, RTRS_PATH_RECONNECTING);
		return;
	case RTRS_PATH_CLOSED:
		pthread_rwlock_wrlock(&p->post_lock);
		path_change_state(p, RTRS_PATH_RECONNECTING);
		pthread_rwlock_unlock(&p->post_lock);
		/* fall through */
	case RTRS_PATH_RECONNECTING:
		loop_timer_arm(&p->reconnect_timer, 1, 0);
		return;
	default:
		return; /* connecting or closing: an attempt is under way */
	}
}

RTRS_EXPORT
int rtrs_clt_add_path(struct rtrs_clt_sess *s, const struct rtrs_path_addr *addr,
		      unsigned *idx_out)
{
	struct clt_path *p;
	size_t n;
	int rc;

	if (!s || !addr || !addr->dst || !*addr->dst)
		return -EINVAL;
	if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
		return -ESHUTDOWN;
	pthread_mutex_lock(&s->admin_lock);
	n = atomic_load(&s->paths_num);
	if (n >= RTRS_MAX_PATHS) {
		pthread_mutex_unlock(&s->admin_lock);
		log_err("%s: already %d paths", s->name, RTRS_MAX_PATHS);
		return -ENOSPC;
	}
	p = &s->paths[n];
	memset(p, 0, sizeof(*p));
	rc = path_init(s, p, (unsigned)n, addr);
	if (!rc)
		rc = path_connect(p, false);
	if (rc) {
		/* Never published: tear the slot down again. */
		loop_timer_fini(&p->hb.timer);
		loop_timer_fini(&p->reconnect_timer);
		if (p->sess) {
			for (unsigned i = 0; p->cons && i < p->nr_cons; i++)
				pthread_mutex_destroy(&p->cons[i].pending_lock);
			pthread_rwlock_destroy(&p->post_lock);
			pthread_mutex_destroy(&p->lock);
			pthread_cond_destroy(&p->cond);
		}
		free(p->cons);
		free(p->rbufs);
		free(p->info_gens);
		free(p->imm_area);
		memset(p, 0, sizeof(*p));
		pthread_mutex_unlock(&s->admin_lock);
		return rc;
	}
	atomic_store(&s->paths_num, n + 1);
	pthread_mutex_unlock(&s->admin_lock);
	log_info("%s: path %zu added", s->name, n);
	if (idx_out)
		*idx_out = (unsigned)n;
	return 0;
}

RTRS_EXPORT
int rtrs_clt_remove_path(struct rtrs_clt_sess *s, unsigned idx)
{
	int rc;

	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num || s->paths[idx].removed)
		return -ENOENT;
	rc = rtrs_clt_disconnect_path(s, idx);
	if (!rc)
		s->paths[idx].removed = true;
	return rc;
}

RTRS_EXPORT
int rtrs_clt_set_reconnect(struct rtrs_clt_sess *s, unsigned delay_ms, unsigned jitter_ms,
			   int max_attempts)
{
	if (!s || max_attempts < -1 || delay_ms > 3600000 || jitter_ms > 3600000)
		return -EINVAL;
	/* Read by the loop and the reconnect workers at the next attempt. */
	__atomic_store_n(&s->reconnect_delay_ms, delay_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&s->reconnect_jitter_ms, jitter_ms, __ATOMIC_RELAXED);
	__atomic_store_n(&s->max_reconnect_attempts, max_attempts, __ATOMIC_RELAXED);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_reconnect_path(struct rtrs_clt_sess *s, unsigned idx)
{
	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num || s->paths[idx].removed)
		return -ENOENT;
	if (__atomic_load_n(&s->closing, __ATOMIC_ACQUIRE))
		return -ESHUTDOWN;
	loop_call(s->loop, path_reconnect_call, &s->paths[idx]);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_reset_path_stats(struct rtrs_clt_sess *s, unsigned idx)
{
	struct clt_path *p;

	if (!s)
		return -EINVAL;
	if (idx >= s->paths_num)
		return -ENOENT;
	p = &s->paths[idx];
	atomic_store(&p->stat_reads, 0);
	atomic_store(&p->stat_read_bytes, 0);
	atomic_store(&p->stat_writes, 0);
	atomic_store(&p->stat_write_bytes, 0);
	return 0;
}

RTRS_EXPORT
int rtrs_clt_opts_init(struct rtrs_clt_opts *o, size_t size)
{
	if (!o || size != sizeof(*o))
		return -EINVAL;
	memset(o, 0, sizeof(*o));
	o->size = size;
	o->port = RTRS_DEFAULT_PORT;
	o->provider = RTRS_DEFAULT_PROVIDER;
	o->hb_interval_ms = RTRS_DEFAULT_HB_INTERVAL_MS;
	o->hb_missed_max = RTRS_DEFAULT_HB_MISSED_MAX;
	o->connect_timeout_ms = RTRS_DEFAULT_CONNECT_TIMEOUT_MS;
	o->mp_policy = RTRS_MP_POLICY_MIN_INFLIGHT;
	o->reconnect_delay_ms = 1000;
	o->reconnect_jitter_ms = 1000;
	o->max_reconnect_attempts = -1;
	o->fast_io_fail_ms = RTRS_DEFAULT_FAST_IO_FAIL_MS;
	return 0;
}
