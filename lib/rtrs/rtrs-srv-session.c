/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: sessions and paths, on the service loop. A session maps
 * its chunks at the first information request; a path goes through the
 * handshake (authentication on connection 0's completion thread,
 * srv_auth_recv, then the information exchange, path_info_work), is
 * stopped when it fails, fenced when the client asks, and freed once
 * nothing of it is in flight (srv_reap_work).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "rtrs-srv-pri.h"
#include "rtrs-tls.h"

/*
 * Any thread: the handshake event ev on p, against the table
 * (rtrs_srv_hs_next), by compare-and-swap. 0, or the errno the event is
 * refused with (*why says by which rule); the state then stays.
 */
int srv_hs_step(struct srv_path *p, enum rtrs_srv_hs_event ev, const char **why)
{
	int from = atomic_load(&p->hs), to, rc;

	do {
		rc = rtrs_srv_hs_next(from, ev, &to, why);
		if (rc)
			return rc;
	} while (from != to && !atomic_compare_exchange_weak(&p->hs, &from, to));
	if (from != to)
		log_dbg("%s: handshake %s -> %s (%s)", path_name(p), rtrs_srv_hs_state_str(from),
			rtrs_srv_hs_state_str(to), rtrs_srv_hs_event_str(ev));
	return 0;
}

/*
 * Secure channel concatenation: the PSK p's completed transaction
 * generated goes to the server's TLS context, for the handshakes of the
 * host's path that follow (docs/security.md section 9.3).
 */
static int srv_concat_keep(struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	char digest[RTRS_TLS_DIGEST_LEN + 1];
	struct rtrs_auth_key k;
	int rc;

	rc = rtrs_auth_txn_tls_psk(&p->auth, p->auth.host, ctx->auth_cfg.name, &k, digest);
	if (!rc)
		rc = ctx->tls ? rtrs_tls_ctx_add_generated(ctx->tls, p->auth.host, &k, digest) :
				-EPROTONOSUPPORT;
	rtrs_auth_wipe(&k, sizeof(k));
	if (rc)
		log_err("%s: cannot keep the TLS PSK generated for host %s: %s", path_name(p),
			p->auth.host, strerror(-rc));
	else
		log_dbg("%s: TLS PSK %s generated for host %s", path_name(p), digest, p->auth.host);
	return rc;
}

/*
 * Offload worker: auth_tx's first len bytes on connection 0, unless the
 * path stopped. srv_path_stop does not wait for the job: it sets
 * auth_stopped under auth_lock and then destroys the connections, so a
 * send is either over when the stop has the lock or never starts. 0 when
 * stopped: the stop is the path's outcome, nothing is left to tell.
 */
static int srv_auth_send(struct srv_path *p, size_t len)
{
	int rc = 0;

	pthread_mutex_lock(&p->auth_lock);
	if (!p->auth_stopped)
		rc = fab_send(p->cons[0].c.fc, p->auth_tx, len, p->auth_tx_mr.desc, NULL);
	pthread_mutex_unlock(&p->auth_lock);
	return rc;
}

/*
 * Offload worker: answers the authentication message in p->auth_msg (the
 * crypto, a DH exchange too, runs here: on a poll group it would hold every
 * other connection of the group).
 */
static void srv_auth_answer(struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	bool re = atomic_load(&p->reauth);
	void (*hook)(void) = atomic_load(&rtrs_test_srv_auth_step);
	enum rtrs_auth_step step;
	const char *why;
	size_t out_len = 0;
	int rc;

	if (!re) {
		rc = srv_hs_step(p, SRV_HS_EV_AUTH_MSG, &why);
		if (rc) {
			log_err("%s: %s; closing the path (handshake %s)", path_name(p), why,
				rtrs_srv_hs_state_str(atomic_load(&p->hs)));
			srv_fail_path(p, rc);
			return;
		}
	}
	/*
	 * A NEGOTIATE reads the host's keys from the file: the epoch before
	 * that read, so that a reload begun after it is seen (srv_path.auth_epoch).
	 */
	if (p->auth.state == AUTH_SRV_WAIT_NEGOTIATE)
		atomic_store(&p->auth_epoch, atomic_load(&ctx->key_epoch));
	if (hook)
		hook();
	step = rtrs_auth_srv_step(&p->auth, p->auth_msg, p->auth_msg_len, p->auth_tx,
				  sizeof(p->auth_tx), &out_len);
	atomic_store(&p->progress_ms, loop_now_ms());
	if (!re && p->auth.host_ok && p->tls_host[0] && strcmp(p->auth.host, p->tls_host)) {
		/* The TLS key said who the peer is; DH-HMAC-CHAP must say the same. */
		struct rtrs_auth_msg f = { .id = RTRS_AUTH_FAILURE1, .tid = p->auth.tid,
					   .fail_exp = RTRS_AUTH_FAIL_FAILED };

		log_err("%s: host %s authenticated inside a TLS connection of host %s; closing the "
			"path", path_name(p), p->auth.host, p->tls_host);
		atomic_fetch_add(&ctx->st.auth_failed, 1);
		rtrs_auth_txn_end(&p->auth);
		srv_hs_step(p, SRV_HS_EV_AUTH_FAILED, &why);
		/* FAILURE1 first: the client's verdict is then final. */
		out_len = rtrs_auth_encode(p->auth_tx, sizeof(p->auth_tx), &f);
		if (out_len && !srv_auth_send(p, out_len)) {
			p->close_err = -EKEYREJECTED;
			atomic_store(&p->close_at_ms, now_ms() + 1000);
		} else {
			srv_fail_path(p, -EKEYREJECTED);
		}
		return;
	}
	if (re && p->auth.host_ok && strcmp(p->auth.host, p->auth_host)) {
		/* A connected path's host is the one it authenticated as: nobody else. */
		log_err("%s: host %s re-authenticated as %s; closing the path", path_name(p),
			p->auth_host, p->auth.host);
		atomic_fetch_add(&ctx->st.auth_failed, 1);
		rtrs_auth_txn_end(&p->auth);
		srv_fail_path(p, -EKEYREJECTED);
		return;
	}
	/*
	 * Before the answer goes out: once the client reads SUCCESS1 it may
	 * request its next connection at once, and srv_on_connreq (on the
	 * loop) must find the host already proven.
	 */
	if (!re && p->auth.host_ok && step != RTRS_AUTH_FAILED)
		srv_hs_step(p, SRV_HS_EV_HOST_OK, &why);
	/*
	 * Admission by the host's name, on the loop (srv_held_admit), once:
	 * the name before admit_asked, which the loop reads first. Only this
	 * job writes them, one message at a time.
	 */
	if (!re && rtrs_srv_hs_host_proven(atomic_load(&p->hs)) && !atomic_load(&p->admit_asked)) {
		snprintf(p->held_host, sizeof(p->held_host), "%s", p->auth.host);
		atomic_store(&p->admit_asked, true);
		loop_queue(ctx->loop, &p->admit_work);
	}
	if (step == RTRS_AUTH_DONE && !re && p->concat) {
		/* The PSK is kept before the answer goes: the client connects with it at once. */
		rc = srv_concat_keep(p);
		if (rc) {
			rtrs_auth_txn_end(&p->auth);
			srv_fail_path(p, rc);
			return;
		}
		srv_hs_step(p, SRV_HS_EV_CONCAT_DONE, &why);
	} else if (step == RTRS_AUTH_DONE) {
		uint8_t digest[32];

		/* Under auth_lock: a reload's pass reads it on the loop (sessions_reauth). */
		srv_auth_digest(&p->auth.hkey, &p->auth.ckey, digest);
		pthread_mutex_lock(&p->auth_lock);
		memcpy(p->auth_digest, digest, sizeof(digest));
		pthread_mutex_unlock(&p->auth_lock);
		if (!re) {
			/* auth_host before the state that shows it (path_snap). */
			snprintf(p->auth_host, sizeof(p->auth_host), "%s", p->auth.host);
			srv_hs_step(p, SRV_HS_EV_AUTH_DONE, &why);
		}
	} else if (step == RTRS_AUTH_FAILED && !re) {
		srv_hs_step(p, SRV_HS_EV_AUTH_FAILED, &why);
	}
	rc = out_len ? srv_auth_send(p, out_len) : 0;
	switch (step) {
	case RTRS_AUTH_CONTINUE:
		break;
	case RTRS_AUTH_DONE:
		atomic_fetch_add(&ctx->st.auth_ok, 1);
		log_info("%s: host %s %sauthenticated (%s, %s%s)%s", path_name(p), p->auth.host,
			 re ? "re-" : "", rtrs_auth_hash_name(p->auth.hash),
			 rtrs_auth_dhgroup_name(p->auth.group),
			 p->auth.bidir ? ", bidirectional" : "",
			 p->concat ? ": a TLS PSK generated for its path (secure channel "
				     "concatenation)" : "");
		rtrs_auth_txn_end(&p->auth);
		atomic_store(&p->reauth, false);
		/*
		 * The key file was reloaded after this transaction read the
		 * host's keys: the reload's request found it running and let it
		 * be, so the path authenticates once more, on the keys of now.
		 */
		if (re && atomic_load(&p->auth_epoch) != atomic_load(&ctx->key_epoch))
			loop_queue(ctx->loop, &p->reauth_work);
		if (p->concat && !rc) {
			/* The client closes this connection and comes back with TLS. */
			p->close_err = -ETIMEDOUT;
			atomic_store(&p->close_at_ms, now_ms() + ctx->opts.auth_timeout_ms);
		}
		break;
	case RTRS_AUTH_FAILED:
		atomic_fetch_add(&ctx->st.auth_failed, 1);
		if (re)
			log_err("%s: host %s failed to re-authenticate: %s; closing the path",
				path_name(p), p->auth_host, strerror(-p->auth.err));
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
		log_err("%s: sending an authentication message failed: %s", path_name(p),
			strerror(-rc));
		srv_fail_path(p, rc);
	}
}

void srv_auth_digest(const struct rtrs_auth_key *hk, const struct rtrs_auth_key *ck, uint8_t out[32])
{
	EVP_MD_CTX *m = EVP_MD_CTX_new();
	unsigned n = 32;

	memset(out, 0, 32);
	if (!m)
		return;
	if (!EVP_DigestInit_ex(m, EVP_sha256(), NULL) ||
	    !EVP_DigestUpdate(m, hk, sizeof(*hk)) || !EVP_DigestUpdate(m, ck, sizeof(*ck)) ||
	    !EVP_DigestFinal_ex(m, out, &n))
		memset(out, 0, 32);
	EVP_MD_CTX_free(m);
}

bool srv_path_reauth(struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	struct rtrs_auth_msg m = { .id = RTRS_AUTH_REAUTH, .tid = 0 };
	size_t len;
	int rc;

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED || !p->sess->ext ||
	    !p->auth_host[0] || atomic_load(&p->reauth))
		return false;
	/* No transaction runs on a connected path: the job is idle, auth is ours. */
	rtrs_auth_srv_begin(&p->auth, &ctx->auth_cfg, path_name(p));
	pthread_mutex_lock(&p->auth_lock);
	p->auth_in_n = 0;
	pthread_mutex_unlock(&p->auth_lock);
	atomic_store(&p->reauth_since_ms, now_ms());
	atomic_store(&p->reauth, true);
	len = rtrs_auth_encode(p->auth_tx, sizeof(p->auth_tx), &m);
	rc = len ? fab_send(p->cons[0].c.fc, p->auth_tx, len, p->auth_tx_mr.desc, NULL) : -EIO;
	if (rc) {
		log_err("%s: cannot ask host %s to authenticate again: %s", path_name(p),
			p->auth_host, strerror(-rc));
		atomic_store(&p->reauth, false);
		srv_fail_path(p, rc);
		return false;
	}
	log_info("%s: key file changed: host %s asked to authenticate again", path_name(p),
		 p->auth_host);
	return true;
}

/* The information request on connection 0 of a path being established. */
static void srv_info_recv(struct srv_path *p, const void *buf, size_t len)
{
	const char *why = NULL;
	int rc;

	rc = srv_hs_step(p, SRV_HS_EV_MSG, &why);
	if (rc) {
		log_err_rl("%s: %s; closing the path (handshake %s)", path_name(p), why,
			   rtrs_srv_hs_state_str(atomic_load(&p->hs)));
		srv_fail_path(p, rc);
		return;
	}
	rc = rtrs_info_req_decode(buf, len, p->sess->ext, &p->info, &why);
	if (rc) {
		log_err("%s: invalid info request: %s", path_name(p), why);
		srv_fail_path(p, rc);
		return;
	}
	atomic_store(&p->progress_ms, loop_now_ms());
	loop_queue(p->sess->ctx->loop, &p->info_work);
}

/* Offload worker: the messages waiting, in the order they came. */
static void srv_auth_job(struct offload_job *j)
{
	struct srv_path *p = container_of(j, struct srv_path, auth_job);

	for (;;) {
		pthread_mutex_lock(&p->auth_lock);
		if (!p->auth_in_n || p->auth_stopped) {
			pthread_mutex_unlock(&p->auth_lock);
			return;
		}
		p->auth_msg_len = p->auth_in[0].len;
		memcpy(p->auth_msg, p->auth_in[0].buf, p->auth_in[0].len);
		if (--p->auth_in_n)
			p->auth_in[0] = p->auth_in[1];
		pthread_mutex_unlock(&p->auth_lock);
		if (rtrs_msg_type(p->auth_msg, p->auth_msg_len) == RTRS_MSG_AUTH)
			srv_auth_answer(p);
		else
			srv_info_recv(p, p->auth_msg, p->auth_msg_len);
	}
}

/*
 * The job is done (an offload worker, under the pool's lock: queueing only).
 * The reaper skipped a stopped path while its job ran: it looks again.
 */
static void srv_auth_job_done(struct offload_job *j)
{
	struct srv_path *p = container_of(j, struct srv_path, auth_job);
	int st = atomic_load(&p->base.state);

	if (st == RTRS_PATH_CLOSING || st == RTRS_PATH_CLOSED)
		loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
}

/*
 * A message on connection 0 of a path being established, on that
 * connection's completion thread. Authentication messages are queued for
 * an offload worker (srv_auth_job), which checks each against the
 * handshake in turn; so is any message that comes while some wait or one
 * is answered (a bidirectional client sends SUCCESS2 and its information
 * request back to back: they are taken in that order). A client sends one
 * authentication message and waits for the answer, so a third message
 * waiting is a protocol error. False when msg is for the caller (nothing
 * waits).
 */
static bool srv_auth_recv(struct srv_path *p, const void *buf, size_t len, bool auth)
{
	int st;
	bool full;

	pthread_mutex_lock(&p->auth_lock);
	if (p->auth_stopped) {
		/* The path stops (it passed the state check as it did): nothing to answer. */
		pthread_mutex_unlock(&p->auth_lock);
		return true;
	}
	st = atomic_load(&p->auth_job.state);
	if (!auth && !p->auth_in_n && st != OFFLOAD_QUEUED && st != OFFLOAD_RUNNING) {
		pthread_mutex_unlock(&p->auth_lock);
		return false;
	}
	full = len > sizeof(p->auth_in[0].buf) || p->auth_in_n == 2;
	if (!full) {
		memcpy(p->auth_in[p->auth_in_n].buf, buf, len);
		p->auth_in[p->auth_in_n++].len = len;
	}
	pthread_mutex_unlock(&p->auth_lock);
	if (full) {
		log_err("%s: %s; closing the path", path_name(p),
			len > sizeof(p->auth_in[0].buf) ? "a handshake message too long"
							: "messages before the last was answered");
		srv_fail_path(p, -EPROTO);
		return true;
	}
	atomic_store(&p->progress_ms, loop_now_ms());
	if (offload_submit(&p->auth_job) == -EAGAIN)
		srv_auth_job(&p->auth_job); /* no worker to be had: here, then */
	return true;
}

static void srv_con_recv(void *priv, void *buf, size_t len)
{
	struct srv_con *con = container_of(priv, struct srv_con, c);
	struct srv_path *p = con->path;
	const char *why = NULL;
	int rc, err;

	rtrs_hb_heard(&p->base.hb);
	if (con->c.cid == 0 && atomic_load(&p->base.state) == RTRS_PATH_CONNECTED) {
		/* Fences only from a client that speaks our extensions (and was offered them). */
		if (!p->sess->ext) {
			log_err_rl("%s: a message on a connected path from a kernel client",
				   path_name(p));
			srv_fail_path(p, -EPROTO);
			return;
		}
		if (rtrs_msg_type(buf, len) == RTRS_MSG_AUTH) {
			/* Only while the server asked for it (srv_path_reauth). */
			if (!atomic_load(&p->reauth)) {
				log_err_rl("%s: authentication message on a connected path",
					   path_name(p));
				srv_fail_path(p, -EPROTO);
				return;
			}
			srv_auth_recv(p, buf, len, true);
			return;
		}
		/* One fence at a time per path: the client waits for each ack. */
		uint8_t uuid[RTRS_UUID_LEN];
		int32_t recon;

		rc = rtrs_fence_decode(buf, len, RTRS_MSG_FENCE, uuid, &recon, &err, &why);
		if (rc || atomic_exchange(&p->fence_pending, true)) {
			log_err_rl("%s: unexpected message: %s", path_name(p), rc ? why : "second fence");
			srv_fail_path(p, rc ? rc : -EPROTO);
			return;
		}
		memcpy(p->fence_uuid, uuid, RTRS_UUID_LEN);
		p->fence_recon = recon;
		loop_queue(p->sess->ctx->loop, &p->fence_work);
		return;
	}
	if (con->c.cid != 0 || atomic_load(&p->base.state) != RTRS_PATH_CONNECTING) {
		log_err_rl("%s: unexpected message on connection %u", path_name(p), con->c.cid);
		srv_fail_path(p, -EPROTO);
		return;
	}
	if (!srv_auth_recv(p, buf, len, rtrs_msg_type(buf, len) == RTRS_MSG_AUTH))
		srv_info_recv(p, buf, len);
}

static void srv_con_connected(void *priv, const void *data, size_t len)
{
	struct srv_con *con = container_of(priv, struct srv_con, c);

	atomic_store(&con->path->progress_ms, loop_now_ms());
	log_dbg("%s: connection %u established", path_name(con->path), con->c.cid);
}

static void srv_con_down(void *priv, int err, const void *data, size_t len)
{
	struct srv_con *con = container_of(priv, struct srv_con, c);
	/* A concatenation's connection ends once its PSK is made: as it should. */
	bool done = atomic_load(&con->path->hs) == SRV_HS_CONCAT;

	log_at(done ? LOG_DBG : LOG_INFO, "%s: connection %u went down: %s", path_name(con->path),
	       con->c.cid, strerror(-err));
	srv_fail_path(con->path, err);
}

const struct fab_con_ops srv_con_ops = {
	.connected = srv_con_connected,
	.down = srv_con_down,
	.imm = rtrs_con_imm,
	.recv = srv_con_recv,
	.done = srv_con_done,
	.kick = rtrs_con_kick,
};

/*
 * n elements of size bytes, zeroed, on pages of their own: a session's
 * large arrays. From the allocator they would come back from a heap that
 * earlier sessions grew (glibc raises its mmap threshold as mapped chunks
 * are freed), zeroed by hand and so resident whole, and stay with it after
 * the session: measured, an idle session's RSS went from 0.9 to 2.7 MiB
 * over three rounds of 32 sessions (bench/session-memory.sh).
 */
static void *zmap(size_t n, size_t size)
{
	void *p;

	if (!n || n > SIZE_MAX / size)
		return NULL;
	p = mmap(NULL, n * size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static void zunmap(void *p, size_t n, size_t size)
{
	if (p)
		munmap(p, n * size);
}

/* Undoes sess_map_chunks, whole or in part. */
static void sess_unmap_chunks(struct rtrs_srv_sess *s)
{
	srv_keys_release(s, &s->keys);
	fab_mr_dereg(&s->chunk_mr);
	if (s->chunk_mem)
		munmap(s->chunk_mem, s->chunk_bytes);
	free(s->chunk_bases);
	zunmap(s->ops, s->queue_depth, sizeof(*s->ops));
	zunmap(s->op_sg, (size_t)s->queue_depth * RTRS_MAX_READ_SG, sizeof(*s->op_sg));
	s->chunk_mem = NULL;
	s->chunk_bases = NULL;
	s->ops = NULL;
	s->op_sg = NULL;
}

void srv_sess_free(struct rtrs_srv_sess *s)
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
	pthread_mutex_destroy(&s->defer_lock);
	log_info("session %s closed", s->name[0] ? s->name : "(unnamed)");
	free(s);
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions--;
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	if (loop_timer_live(&ctx->trim_timer) && !ctx->closing)
		loop_timer_arm(&ctx->trim_timer, 50, 0); /* a burst of closes: one trim after it */
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
	s->ops = zmap(qd, sizeof(*s->ops));
	s->op_sg = zmap((size_t)qd * RTRS_MAX_READ_SG, sizeof(*s->op_sg));
	if (!s->chunk_bases || !s->ops || !s->op_sg)
		return -ENOMEM;
	for (uint32_t i = 0; i < qd; i++) {
		s->chunk_bases[i] = s->chunk_mem + (size_t)i * s->chunk_size;
		s->ops[i].sess = s;
		s->ops[i].id = i;
		s->ops[i].sg = &s->op_sg[(size_t)i * RTRS_MAX_READ_SG];
		atomic_init(&s->ops[i].state, OP_FREE);
	}
	/* A kernel client's chunk keys may move onto windows over this region. */
	rc = fab_mr_reg(ctx->fab, s->chunk_mem, s->chunk_bytes,
			s->kinval ? FAB_MR_LOCAL | FAB_MR_BIND :
			s->inval ? FAB_MR_LOCAL : FAB_MR_REMOTE_WRITE | FAB_MR_LOCAL, &s->chunk_mr);
	if (rc || !s->inval || s->kinval) /* a kernel client's keys are its paths' */
		return rc;
	return srv_keys_setup(s, &s->keys, true);
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
int srv_sess_create(struct rtrs_srv_ctx *ctx, const uint8_t *uuid, bool ext,
		    struct rtrs_srv_sess **out)
{
	struct rtrs_srv_sess *s = calloc(1, sizeof(*s));
	int rc;

	if (!s)
		return -ENOMEM;
	s->ctx = ctx;
	s->ext = ext;
	memcpy(s->paths_uuid, uuid, RTRS_UUID_LEN);
	pthread_mutex_init(&s->key_lock, NULL);
	pthread_mutex_init(&s->defer_lock, NULL);
	s->inval = ctx->opts.always_invalidate;
	s->kinval = s->inval && !ext;
	s->queue_depth = ctx->opts.queue_depth;
	s->chunk_size = ctx->opts.max_chunk_size;
	s->chunk_bytes = (size_t)s->queue_depth * s->chunk_size;
	pthread_mutex_lock(&ctx->lock);
	ctx->nr_sessions++; /* srv_sess_free counts it down */
	pthread_mutex_unlock(&ctx->lock);
	rc = rand_bytes(&s->sess_id, sizeof(s->sess_id));
	if (!rc)
		rc = fab_mr_reg(ctx->fab, s->imm_buf, sizeof(s->imm_buf), FAB_MR_REMOTE_WRITE,
				&s->imm_mr);
	if (rc) {
		srv_sess_free(s);
		return rc;
	}
	s->next = ctx->sessions;
	ctx->sessions = s;
	*out = s;
	return 0;
}

static void path_fini(struct srv_path *p);

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
	log_dbg("%s: path freed", path_name(p));
	path_fini(p);
	if (!s->paths)
		srv_sess_free(s);
}

/*
 * Loop thread: frees every closed path whose ops are all answered. The
 * write lock waits out responders still inside op_finish().
 */
void srv_reap_work(struct loop_work *w)
{
	struct rtrs_srv_ctx *ctx = container_of(w, struct rtrs_srv_ctx, reap_work);
	struct rtrs_srv_sess *s, *sn;
	struct srv_path *p, *pn;

	for (s = ctx->sessions; s; s = sn) {
		sn = s->next;
		for (p = s->paths; p; p = pn) {
			int job = atomic_load(&p->auth_job.state);
			bool idle;

			pn = p->next;
			/*
			 * Its own work items still queued would run on freed
			 * memory, and so would its authentication job, which
			 * the stop did not wait for: its done queues this again
			 * (srv_auth_job_done).
			 */
			if (!p->cons_destroyed || atomic_load(&p->base.fail_work.queued) ||
			    atomic_load(&p->info_work.queued) || atomic_load(&p->fence_work.queued) ||
			    atomic_load(&p->reauth_work.queued) ||
			    atomic_load(&p->admit_work.queued) || job == OFFLOAD_QUEUED ||
			    job == OFFLOAD_RUNNING)
				continue;
			rtrs_path_wrlock(&p->base);
			idle = atomic_load(&p->base.inflight) == 0;
			rtrs_path_wrunlock(&p->base);
			if (idle)
				path_free(p); /* may free s: sn was taken before */
		}
	}
}

static bool srv_path_change_state(struct srv_path *p, enum rtrs_path_state to)
{
	return rtrs_path_set_state(&p->base, to);
}

/* Loop thread: close the path's connections; free it once answered. */
void srv_path_stop(struct srv_path *p, int err)
{
	struct rtrs_srv_sess *s = p->sess;
	enum rtrs_path_state st;

	rtrs_path_wrlock(&p->base);
	st = atomic_load(&p->base.state);
	if (st == RTRS_PATH_CLOSING || st == RTRS_PATH_CLOSED) {
		rtrs_path_wrunlock(&p->base);
		return;
	}
	srv_path_change_state(p, RTRS_PATH_CLOSING);
	rtrs_path_wrunlock(&p->base);
	loop_timer_arm(&p->base.hb.timer, 0, 0);
	/* Requests waiting on this path for a busy chunk: the client's path fails them. */
	srv_defers_cancel(p);
	/*
	 * An authentication answer being computed is not waited for: this
	 * loop serves every session, and a job may take a key file's read
	 * and a DH exchange. After auth_stopped nothing is queued or answered
	 * and the job sends nothing (srv_auth_send): taking auth_lock waits
	 * out at most a send of its under way, so the connections can go. A
	 * message that a completion thread queues as the path stops (it passed
	 * its state check before CLOSING) is dropped.
	 */
	pthread_mutex_lock(&p->auth_lock);
	p->auth_stopped = true;
	p->auth_in_n = 0;
	pthread_mutex_unlock(&p->auth_lock);
	/* Responses that never got out are dropped: the client's path fails them. */
	rtrs_path_destroy_cons(&p->base);
	/*
	 * No completion thread submits the job any more: one queued leaves
	 * the queue; one running is left to finish, and the reaper waits for
	 * its done (srv_auth_job_done) before it frees the path.
	 */
	offload_cancel_nowait(&p->auth_job);
	srv_ops_abandon(p);
	p->cons_destroyed = true;
	srv_path_change_state(p, RTRS_PATH_CLOSED);
	log_at(atomic_load(&p->hs) == SRV_HS_CONCAT ? LOG_DBG : LOG_INFO, "%s: path closed: %s",
	       path_name(p), strerror(-err));
	if (p->was_connected && --s->paths_up == 0 && s->link_up) {
		s->link_up = false;
		if (s->ctx->ops.link_ev)
			s->ctx->ops.link_ev(s, RTRS_SRV_LINK_EV_DISCONNECTED, s->ctx->ops.priv);
		/*
		 * The user forgot the session (RNBD its open devices); a path
		 * that links it up again makes a new one of it (CONNECTED). The
		 * session object may outlive the link (a path still in its
		 * handshake, or a closed one whose requests the user holds), so
		 * it takes a new incarnation: a client that joins it sees a new
		 * server session and sets its state up again, as after a restart
		 * (docs/protocol.md section 10). Only sessions of this project's
		 * clients compare it; a kernel client sets up again after every
		 * reconnect anyway.
		 */
		if (rand_bytes(&s->sess_id, sizeof(s->sess_id)))
			s->sess_id++;
	}
	loop_queue(s->ctx->loop, &s->ctx->reap_work);
}

/* Service loop: the failure srv_fail_path handed over. */
static void srv_path_stop_op(struct rtrs_path *base, int err)
{
	struct srv_path *p = container_of(base, struct srv_path, base);

	srv_path_stop(p, err);
	/* The reaper skipped this path while this item was queued. */
	loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
}

/* Any thread: the path is broken; it is stopped on the service loop. */
void srv_fail_path(struct srv_path *p, int err)
{
	rtrs_path_fail(&p->base, err);
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

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		atomic_store(&p->fence_pending, false);
		/* The reaper may have skipped this path while this item was queued. */
		loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
		return;
	}
	t = srv_path_find(p->sess, p->fence_uuid);
	switch (rtrs_fence_decide(&(struct rtrs_fence_in){ .found = t != NULL, .self = t == p,
							   .recon = p->fence_recon,
							   .path_recon = t ? t->recon_cnt : 0 })) {
	case RTRS_FENCE_SELF:
		err = -EINVAL;
		break;
	case RTRS_FENCE_ACK:
		if (t)
			log_info("%s: fence for %s's incarnation %d: gone; incarnation %u stays",
				 path_name(p), path_name(t), p->fence_recon, t->recon_cnt);
		break;
	case RTRS_FENCE_STOP:
		if (atomic_load(&t->base.state) == RTRS_PATH_CONNECTING ||
		    atomic_load(&t->base.state) == RTRS_PATH_CONNECTED) {
			log_info("%s: fencing %s for the client", path_name(p), path_name(t));
			srv_path_stop(t, -ECONNRESET);
		}
		if (!t->cons_destroyed || atomic_load(&t->base.inflight)) {
			loop_timer_arm(&p->fence_timer, 5, 0);
			return;
		}
		break;
	}
	/* A chunk the fenced path's ops left without a key gets one first, or the fence fails. */
	if (!err && p->sess->inval)
		err = srv_keys_repair(p->sess, &p->sess->keys);
	rtrs_fence_encode(&p->fence_ack, true, p->fence_uuid, p->fence_recon, err);
	rc = 0;
	if (p->sess->inval && !err) {
		/*
		 * Keys of chunks whose responses the fenced path lost: the whole
		 * table, into the client's table area, ahead of the ack
		 * (send-after-write order).
		 */
		size_t len = (size_t)p->sess->queue_depth * RTRS_RKEY_SLOT;
		struct iovec iov = { .iov_base = p->fence_keys, .iov_len = len };
		struct fab_rma rma = { .addr = p->base.peer_imm.addr + len, .len = len,
				       .key = p->base.peer_imm.key };

		srv_chunk_keys_snapshot(p->sess, &p->sess->keys, p->fence_keys);
		rc = fab_write(p->cons[0].c.fc, &iov, &p->fence_keys_mr.desc, 1, &rma, 1, false, 0,
			       NULL);
	}
	/*
	 * Free for the next fence before the ack goes: the client may answer
	 * the ack with its next fence on this path before fab_send returns.
	 * What that fence's arrival writes (fence_uuid, fence_recon) this
	 * ack has been encoded from already; its check runs on this thread,
	 * after this one.
	 */
	atomic_store(&p->fence_pending, false);
	if (!rc)
		rc = fab_send(p->cons[0].c.fc, &p->fence_ack, sizeof(p->fence_ack),
			      p->fence_ack_mr.desc, NULL);
	if (rc)
		srv_fail_path(p, rc);
}

static void path_fence_work(struct loop_work *w)
{
	srv_fence_check(container_of(w, struct srv_path, fence_work));
}

static void path_fence_timer(struct loop_timer *t)
{
	struct srv_path *p = container_of(t, struct srv_path, fence_timer);

	/* While the path connects, its timer paces a takeover's wait (srv_takeover_check). */
	if (p->takeover_since_ms)
		loop_queue(p->sess->ctx->loop, &p->info_work);
	else
		srv_fence_check(p);
}

/*
 * A path still connecting, at each tick of its timer: a refusal the
 * client had its chance to read, an authentication or a handshake that
 * takes too long end it.
 */
static void path_handshake_deadlines(struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	uint64_t close_at = atomic_load(&p->close_at_ms);
	int hs = atomic_load(&p->hs);

	if (close_at && now_ms() >= close_at) {
		/* Refused: the client had its chance to read why. */
		srv_path_stop(p, p->close_err);
		return;
	}
	if ((hs == SRV_HS_AUTH || hs == SRV_HS_HOST_OK) &&
	    now_ms() - p->created_ms > ctx->opts.auth_timeout_ms) {
		log_err("%s: not authenticated after %u ms, closing the path", path_name(p),
			ctx->opts.auth_timeout_ms);
		atomic_fetch_add(&ctx->st.auth_timeouts, 1);
		srv_path_stop(p, -ETIMEDOUT);
		return;
	}
	/* Refused at its host's proof, and silent since: it takes no more steps. */
	if (p->admit_err && !close_at && loop_now_ms() >= p->admit_err_ms + srv_admit_stall_ms(ctx)) {
		srv_path_stop(p, p->admit_err);
		return;
	}
	/* A path the client never finished would hold its chunks forever. */
	if (now_ms() - p->last_connreq_ms > ctx->opts.connect_timeout_ms) {
		log_err("%s: still connecting after %u ms, closing the path", path_name(p),
			ctx->opts.connect_timeout_ms);
		srv_path_stop(p, -ETIMEDOUT);
	}
}

/* The path's one timer: the handshake's deadlines, then heartbeats. */
static void path_timer(struct loop_timer *t)
{
	struct srv_path *p = container_of(t, struct srv_path, base.hb.timer);
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	uint64_t close_at;

	if (atomic_load(&p->base.state) == RTRS_PATH_CONNECTING) {
		path_handshake_deadlines(p);
		return;
	}
	/* A re-authentication that failed (its FAILURE1 had time), or takes too long. */
	close_at = atomic_load(&p->close_at_ms);
	if (close_at && now_ms() >= close_at) {
		srv_path_stop(p, p->close_err);
		return;
	}
	if (atomic_load(&p->reauth) &&
	    now_ms() - atomic_load(&p->reauth_since_ms) > ctx->opts.auth_timeout_ms) {
		log_err("%s: host %s did not authenticate again within %u ms, closing the path",
			path_name(p), p->auth_host, ctx->opts.auth_timeout_ms);
		atomic_fetch_add(&ctx->st.auth_timeouts, 1);
		srv_path_stop(p, -ETIMEDOUT);
		return;
	}
	rtrs_path_hb_tick(&p->base);
}

/*
 * Loop thread: a request to start p again arrived. The client may be gone
 * (its link was cut and it reconnects elsewhere), or alive while someone
 * replays its request: a heartbeat now, and the path's last beat counted
 * as missed but one, so the next tick or the one after closes it unless
 * the client answers. A live client keeps its path.
 */
void srv_path_probe(struct srv_path *p)
{
	int rc;

	if (atomic_load(&p->base.hb.missed) + 1 < p->base.hb.missed_max)
		atomic_store(&p->base.hb.missed, p->base.hb.missed_max - 1);
	rc = !atomic_load(&p->base.hb.peer_ready) ? 0 :
	     rtrs_hb_post(&p->base.hb, p->cons[0].c.fc, p->base.peer_imm.addr,
			  p->base.peer_imm.key, false);
	if (rc && rc != -EAGAIN)
		srv_path_stop(p, rc);
	else
		log_info("%s: a request to start this path again: closing it unless the "
			 "client answers a heartbeat", path_name(p));
}

/* Loop thread: a re-authentication that completed on keys a reload may have changed (auth_epoch). */
static void path_reauth_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, reauth_work);

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTED) {
		/* The reaper skipped this path while this item was queued. */
		loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
		return;
	}
	srv_path_reauth(p);
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
	if (s->kinval) {
		/*
		 * The kernel's always_invalidate: this path's MR per chunk, its
		 * key in the chunk's descriptor, a new one in an RKEY_RSP with
		 * each response. Registered now, before the client can use them.
		 */
		if (!p->keys.mrs) {
			rc = srv_keys_setup(s, &p->keys, false);
			if (rc)
				return rc;
		}
		descs = calloc(qd, sizeof(*descs));
		p->info_rsp_len = rtrs_info_rsp_size(qd, 0);
		p->info_rsp = calloc(1, p->info_rsp_len);
		if (!descs || !p->info_rsp) {
			free(descs);
			return -ENOMEM;
		}
		for (unsigned i = 0; i < qd; i++)
			descs[i] = (struct rtrs_desc){ .addr = fab_attr(ctx->fab)->virt_addr ?
								(uintptr_t)s->chunk_bases[i] : 0,
						       .key = srv_chunk_key(s, &p->keys, i),
						       .len = s->chunk_size };
		rtrs_info_rsp_encode(p->info_rsp, descs, qd);
		free(descs);
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
	rc = srv_keys_repair(s, &s->keys);
	if (rc)
		return rc;
	srv_chunk_keys_snapshot(s, &s->keys, rtrs_info_rsp_keys(p->info_rsp, qd));
	rc = fab_mr_reg(ctx->fab, p->info_rsp, p->info_rsp_len, FAB_MR_LOCAL, &p->info_rsp_mr);
	if (!rc)
		rc = fab_mr_reg(ctx->fab, p->fence_keys, (size_t)qd * RTRS_RKEY_SLOT, FAB_MR_LOCAL,
				&p->fence_keys_mr);
	return rc;
}

static unsigned srv_takeover_drain_ms(const struct rtrs_srv_ctx *ctx)
{
	return MIN(ctx->opts.connect_timeout_ms / 2, RTRS_TAKEOVER_DRAIN_MS);
}

/*
 * Loop thread: p's session name against a session the server still holds
 * (rtrs_takeover_decide). While it waits, p's info request is taken again
 * every RTRS_TAKEOVER_POLL_MS (fence_timer, idle while p connects).
 */
static enum rtrs_takeover_verdict srv_takeover_check(struct srv_path *p)
{
	struct rtrs_srv_ctx *ctx = p->sess->ctx;
	struct rtrs_srv_sess *h = srv_name_holder(ctx, p->sess, p->info.pathname);
	uint64_t now = loop_now_ms(), live = (uint64_t)ctx->opts.hb_interval_ms * ctx->opts.hb_missed_max;
	struct rtrs_takeover_in in = { .held = h != NULL };
	enum rtrs_takeover_verdict v;
	bool first = false;

	if (h) {
		in.same_host = ctx->auth_required ? !strcmp(h->auth_host, p->auth_host) :
			       !strcmp(h->peer_host, p->peer_host);
		in.paths_up = h->paths_up;
		/* Its connected paths all left the last two heartbeats unanswered. */
		in.silent = true;
		for (struct srv_path *q = h->paths; q; q = q->next)
			if (atomic_load(&q->base.state) == RTRS_PATH_CONNECTED &&
			    atomic_load(&q->base.hb.missed) < 2)
				in.silent = false;
		if (!p->takeover_since_ms) {
			p->takeover_since_ms = now ? now : 1;
			first = true;
		}
		in.waited_ms = now - p->takeover_since_ms;
		in.drain_ms = srv_takeover_drain_ms(ctx);
		in.live_ms = MIN(live, in.drain_ms);
	}
	v = rtrs_takeover_decide(&in);
	if (v == RTRS_TAKEOVER_WAIT) {
		/* The server's wait, not the client's: admission must not take it for a stall. */
		atomic_store(&p->progress_ms, now);
		if (first)
			log_info("%s: session %s is still held by this host's previous session "
				 "(%u paths up); waiting until it is gone with all its requests",
				 path_name(p), p->info.pathname, in.paths_up);
		loop_timer_arm(&p->fence_timer, RTRS_TAKEOVER_POLL_MS, 0);
	} else if (v == RTRS_TAKEOVER_PROCEED && p->takeover_since_ms) {
		log_info("%s: session %s taken over after %llu ms", path_name(p), p->info.pathname,
			 (unsigned long long)(now - p->takeover_since_ms));
	}
	if (v != RTRS_TAKEOVER_WAIT)
		p->takeover_since_ms = 0;
	return v;
}

static void path_info_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, info_work);
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_srv_ctx *ctx = s->ctx;
	const char *why;
	int rc;

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTING) {
		/* The reaper skipped this path while this item was queued. */
		loop_queue(ctx->loop, &ctx->reap_work);
		return;
	}
	srv_held_admit(p);
	if (p->admit_err) {
		/* Refused when its host proved itself (srv_held_admit): told now. */
		srv_path_refuse(p, p->admit_err, false);
		return;
	}
	if (p->nr_accepted != p->base.nr_cons) {
		log_err("%s: info request with %u of %u connections", path_name(p), p->nr_accepted,
			p->base.nr_cons);
		srv_path_stop(p, -EPROTO);
		return;
	}
	/*
	 * The key file was reloaded after this path's transaction read the
	 * host's keys: they may be gone or changed, and the reload's passes
	 * saw only connected paths. The client authenticates anew (a retry,
	 * not a final verdict: its keys may well be the file's).
	 */
	if (ctx->auth_required && atomic_load(&p->auth_epoch) != atomic_load(&ctx->key_epoch)) {
		log_warn("%s: host %s authenticated with the key file as it was before a reload; "
			 "refused, the client authenticates again", path_name(p), p->auth_host);
		srv_path_refuse(p, -EAGAIN, false);
		return;
	}
	/*
	 * Its connection 0 was told an incarnation that ended since (the
	 * session's link went down, srv_path_stop): linked up now, it would
	 * give the user a new session under the id its client knows, and
	 * the client would never set its state up again. It tries again and
	 * is told the new one.
	 */
	if (p->sess_id_told != s->sess_id) {
		log_info("%s: the session's link went down during the path's handshake; refused, "
			 "the client connects to the session's new incarnation", path_name(p));
		srv_path_refuse(p, -EAGAIN, false);
		return;
	}
	if (s->name[0] && strcmp(s->name, p->info.pathname)) {
		log_err("%s: path names session %s, which differs", path_name(p), p->info.pathname);
		srv_path_refuse(p, -EINVAL, true);
		return;
	}
	/*
	 * A session's paths all belong to one authenticated host: another
	 * host, however good its own key, does not get this session's chunks
	 * and keys by naming its uuid.
	 */
	if (ctx->auth_required && s->auth_host[0] && strcmp(s->auth_host, p->auth_host)) {
		log_err("%s: host %s authenticated, but session %s belongs to host %s", path_name(p),
			p->auth_host, s->name, s->auth_host);
		srv_path_refuse(p, -EACCES, true);
		return;
	}
	/* Another path of the session took the name over while this one waited. */
	if (s->name[0])
		p->takeover_since_ms = 0;
	if (!s->name[0]) {
		switch (srv_takeover_check(p)) {
		case RTRS_TAKEOVER_PROCEED:
			break;
		case RTRS_TAKEOVER_WAIT:
			return;
		case RTRS_TAKEOVER_TAKEN:
			log_err("%s: session name %s is already in use", path_name(p), p->info.pathname);
			srv_path_refuse(p, -EPERM, true);
			return;
		case RTRS_TAKEOVER_RETRY:
			log_warn("%s: session %s of this host is still at the server (a silent path, "
				 "or requests) after %u ms; refused, the client tries again",
				 path_name(p), p->info.pathname, srv_takeover_drain_ms(ctx));
			srv_path_refuse(p, -EAGAIN, false);
			return;
		}
		if (srv_sessions_named(ctx) >= ctx->opts.max_sessions) {
			log_err("%s: session %s refused: %u sessions already (max_sessions)", path_name(p),
				p->info.pathname, ctx->opts.max_sessions);
			atomic_fetch_add(&ctx->st.limit_refusals, 1);
			srv_path_refuse(p, -ENOSPC, false);
			return;
		}
		const char *owner = ctx->auth_required ? p->auth_host : p->peer_host;

		/* Those in their handshake count, as at the proof: this one took its place then. */
		if (srv_sessions_of(ctx, owner, s) >= ctx->opts.max_sessions_per_peer) {
			log_err("%s: session %s refused: %s %s has %u sessions already "
				"(max_sessions_per_peer)", path_name(p), p->info.pathname,
				ctx->auth_required ? "host" : "address", owner,
				ctx->opts.max_sessions_per_peer);
			atomic_fetch_add(&ctx->st.limit_refusals, 1);
			srv_path_refuse(p, -ENOSPC, false);
			return;
		}
		snprintf(s->name, sizeof(s->name), "%s", p->info.pathname);
		snprintf(s->peer_host, sizeof(s->peer_host), "%s", p->peer_host);
	}
	if (ctx->auth_required && !s->auth_host[0])
		snprintf(s->auth_host, sizeof(s->auth_host), "%s", p->auth_host);
	snprintf(p->name_info, sizeof(p->name_info), "%s/%s", s->name, p->peer);
	atomic_store_explicit(&p->base.name, p->name_info, memory_order_release);
	/* Threads named before the session had a name ("(new)/PEER#CID") take it now. */
	for (unsigned i = 0; i < p->base.nr_cons; i++) {
		char cname[sizeof(p->name_info) + 16];

		if (!p->cons[i].c.fc)
			continue;
		snprintf(cname, sizeof(cname), "%s#%u", p->name_info, i);
		fab_con_rename(p->cons[i].c.fc, cname);
	}
	p->base.peer_imm = (struct rtrs_desc){ .addr = p->info.imm_addr, .key = p->info.imm_key };

	rc = sess_map_chunks(s);
	if (rc == -ENOSPC) {
		srv_path_refuse(p, rc, false);
		return;
	}
	if (!rc)
		rc = path_info_rsp(p);
	if (!rc)
		rc = fab_mr_reg(ctx->fab, &p->fence_ack, sizeof(p->fence_ack), FAB_MR_LOCAL,
				&p->fence_ack_mr);
	if (rc) {
		log_err("%s: preparing the info response failed: %s", path_name(p), strerror(-rc));
		srv_path_stop(p, rc);
		return;
	}

	/* IO may follow the info response at once: be ready for it first. */
	if (!s->link_up && ctx->ops.link_ev) {
		rc = ctx->ops.link_ev(s, RTRS_SRV_LINK_EV_CONNECTED, ctx->ops.priv);
		if (rc) {
			/* Any int may come back: the wire carries an errno in 1..4095. */
			if (rc > 0 && rc <= 4095)
				rc = -rc;
			else if (rc < -4095 || rc > 0)
				rc = -ECONNRESET;
			log_err("%s: session refused by its user: %s", path_name(p), strerror(-rc));
			srv_path_refuse(p, rc, rc == -EACCES || rc == -EPERM);
			return;
		}
	}
	if (srv_hs_step(p, SRV_HS_EV_INFO_OK, &why)) {
		log_err("%s: %s (handshake %s)", path_name(p), why,
			rtrs_srv_hs_state_str(atomic_load(&p->hs)));
		srv_path_stop(p, -EPROTO);
		return;
	}
	s->link_up = true;
	s->paths_up++;
	p->was_connected = true;
	/* No beat until the client speaks again: it posts its receives on reading this. */
	atomic_store(&p->base.hb.peer_ready, false);
	rtrs_path_wrlock(&p->base);
	srv_path_change_state(p, RTRS_PATH_CONNECTED);
	rtrs_path_wrunlock(&p->base);
	rc = fab_send(p->cons[0].c.fc, p->info_rsp, p->info_rsp_len, p->info_rsp_mr.desc, NULL);
	if (rc) {
		srv_path_stop(p, rc);
		return;
	}
	log_info("%s: path connected (%u connections)", path_name(p), p->base.nr_cons);
}

static const struct rtrs_path_ops srv_path_ops = {
	.item = "response",
	.peer = "client",
	.io_imm = srv_io_imm,
	.post = srv_post_pending,
	.drop = srv_drop_pending,
	.stop = srv_path_stop_op,
};

/* Undoes srv_path_create, whole or in part (fence_timer not live: the base is not set up). */
static void path_fini(struct srv_path *p)
{
	/*
	 * First: the job uses what follows. It is not running here (the
	 * reaper waited for its done; a path that failed to be created never
	 * submitted it): this waits only for a done still holding the pool.
	 */
	offload_cancel(&p->auth_job);
	if (loop_timer_live(&p->fence_timer)) {
		loop_timer_fini(&p->fence_timer);
		rtrs_path_fini(&p->base);
	}
	fab_mr_dereg(&p->fence_ack_mr);
	fab_mr_dereg(&p->info_rsp_mr);
	fab_mr_dereg(&p->auth_tx_mr);
	fab_mr_dereg(&p->verdict_mr);
	fab_mr_dereg(&p->fence_keys_mr);
	free(p->fence_keys);
	free(p->info_rsp);
	srv_keys_release(p->sess, &p->keys);
	pthread_mutex_destroy(&p->auth_lock);
	rtrs_auth_txn_end(&p->auth);
	for (unsigned i = 0; p->cons && i < p->base.nr_cons; i++) {
		rtrs_con_fini(&p->cons[i].c);
		free(p->cons[i].sg_scratch);
	}
	free(p->cons);
	free(p->base.cons);
	free(p);
}

int srv_path_create(struct rtrs_srv_sess *s, const struct rtrs_conn_req *req,
		    const char *peer, struct srv_path **out)
{
	struct rtrs_srv_ctx *ctx = s->ctx;
	struct srv_path *p = calloc(1, sizeof(*p));
	int rc;

	if (!p)
		return -ENOMEM;
	p->fence_timer.loop = NULL;
	p->sess = s;
	memcpy(p->uuid, req->sess_uuid, RTRS_UUID_LEN);
	p->recon_cnt = req->recon_cnt;
	snprintf(p->peer, sizeof(p->peer), "%s", peer);
	srv_peer_host_of(peer, p->peer_host, sizeof(p->peer_host));
	snprintf(p->name_new, sizeof(p->name_new), "%s/%s", s->name[0] ? s->name : "(new)", peer);
	atomic_init(&p->hs, rtrs_srv_hs_initial(ctx->auth_required));
	offload_job_init(&p->auth_job, srv_auth_job, srv_auth_job_done);
	/* A host's handshakes take turns with other hosts' (offload.h). */
	offload_job_class(&p->auth_job, offload_class_of(p->peer_host));
	pthread_mutex_init(&p->auth_lock, NULL);
	rtrs_auth_srv_begin(&p->auth, &ctx->auth_cfg, p->name_new);
	p->cons = calloc(req->cid_num, sizeof(*p->cons));
	p->base.cons = calloc(req->cid_num, sizeof(*p->base.cons));
	if (!p->cons || !p->base.cons) {
		path_fini(p);
		return -ENOMEM;
	}
	p->base.nr_cons = req->cid_num;
	for (unsigned i = 0; i < p->base.nr_cons; i++) {
		rtrs_con_init(&p->cons[i].c, &p->base, i);
		p->cons[i].path = p;
		p->base.cons[i] = &p->cons[i].c;
	}
	rc = rtrs_path_init(&p->base, &srv_path_ops, ctx->loop, p->name_new, RTRS_PATH_CONNECTING,
			    path_timer);
	if (!rc) {
		rc = loop_timer_init(ctx->loop, &p->fence_timer, path_fence_timer);
		if (rc)
			rtrs_path_fini(&p->base);
	}
	if (rc) {
		path_fini(p);
		return rc;
	}
	p->base.hb.interval_ms = ctx->opts.hb_interval_ms;
	p->base.hb.missed_max = ctx->opts.hb_missed_max;
	/*
	 * A kernel client is allowed the silence a kernel server allows it
	 * (5 x 5 s), as it expects: we still beat at our pace and it answers
	 * each beat, but a stalled host (a busy VM) is not cut at 3 s. The
	 * server gains nothing from noticing a dead client sooner: there is
	 * nothing to fail over on this side.
	 */
	if (!s->ext) {
		unsigned need = (RTRS_KERNEL_HB_BUDGET_MS + p->base.hb.interval_ms - 1) /
				p->base.hb.interval_ms;

		if (p->base.hb.missed_max < need)
			p->base.hb.missed_max = need;
	}
	loop_work_init(&p->info_work, path_info_work);
	loop_work_init(&p->fence_work, path_fence_work);
	loop_work_init(&p->reauth_work, path_reauth_work);
	loop_work_init(&p->admit_work, srv_held_admit_work);
	p->last_connreq_ms = now_ms();
	p->created_ms = now_ms();
	atomic_init(&p->progress_ms, loop_now_ms());
	/* Paths made in the same millisecond are still told apart by age. */
	p->serial = ++ctx->path_serial;
	rc = fab_mr_reg(ctx->fab, p->verdict, sizeof(p->verdict), FAB_MR_LOCAL, &p->verdict_mr);
	if (!rc && ctx->auth_required)
		rc = fab_mr_reg(ctx->fab, p->auth_tx, sizeof(p->auth_tx), FAB_MR_LOCAL,
				&p->auth_tx_mr);
	if (rc) {
		path_fini(p);
		return rc;
	}
	/* Ticks from now on: the handshake's deadlines while connecting, then heartbeats. */
	rtrs_path_hb_arm(&p->base);
	p->next = s->paths;
	s->paths = p;
	s->paths_num++;
	*out = p;
	return 0;
}
