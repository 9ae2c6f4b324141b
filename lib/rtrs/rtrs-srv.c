/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: listening (with retries while the address cannot be
 * bound) and the public API (include/rtrs.h): open, close, statistics,
 * session data. Threads: the service loop of each server runs listening,
 * connection requests (rtrs-srv-admit.c), the information exchange, path
 * timers, fences and teardown (rtrs-srv-session.c); each connection's
 * completion thread runs IO (rtrs-srv-io.c) and, on connection 0, the
 * server side of authentication.
 */
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "rtrs-srv-pri.h"
#include "rtrs-tls.h"

static void srv_lst_cb(struct loop_fd *h, uint32_t events)
{
	struct rtrs_srv_ctx *ctx = container_of(h, struct rtrs_srv_ctx, lst_h);

	fab_lst_process(ctx->lst, srv_on_connreq, ctx);
	atomic_store(&ctx->st.raw_closed, fab_lst_closed(ctx->lst));
}

/*
 * After the last session of a burst was freed: with no connection or
 * registration left, the fabric lets go of what it kept for them (where
 * it keeps anything: fab_trim), then the heap goes back to the system.
 */
static void srv_trim_timer(struct loop_timer *t)
{
	struct rtrs_srv_ctx *ctx = container_of(t, struct rtrs_srv_ctx, trim_timer);

	if (ctx->fab)
		fab_trim(ctx->fab);
	malloc_trim(0);
}

static void srv_listen_timer(struct loop_timer *t)
{
	struct rtrs_srv_ctx *ctx = container_of(t, struct rtrs_srv_ctx, listen_timer);
	char port[8];
	bool say;
	int rc;

	if (ctx->lst) {
		/* Listening: the timer now enforces the handshake deadline. */
		fab_lst_sweep(ctx->lst);
		srv_verdicts_reap(ctx, false);
		atomic_store(&ctx->st.raw_closed, fab_lst_closed(ctx->lst));
		return;
	}
	snprintf(port, sizeof(port), "%u", ctx->opts.port);
	if (!ctx->fab) {
		rc = fab_open(ctx->provider, NULL, ctx->addr, port, true, ctx->opts.queue_depth + 16,
			      &ctx->fab);
		if (rc)
			goto retry;
		rc = fab_set_tls(ctx->fab, (enum fab_tls_mode)ctx->opts.tls, ctx->tls);
		if (rc) {
			fab_close(ctx->fab);
			ctx->fab = NULL;
			goto retry;
		}
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
	ctx->listen_err = 0;
	ctx->port = fab_lst_port(ctx->lst);
	pthread_cond_broadcast(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	log_info("listening on %s:%d (%s), queue depth %u, chunk %u, always_invalidate %s, TLS %s",
		 ctx->addr, ctx->port, ctx->provider, ctx->opts.queue_depth,
		 ctx->opts.max_chunk_size, ctx->opts.always_invalidate ? "on" : "off",
		 ctx->opts.tls == RTRS_TLS_REQUIRED ? "required" :
		 ctx->opts.tls == RTRS_TLS_OFFERED ? "offered" : "off");
	/* Requests that arrived between listen and the fd being watched. */
	srv_lst_cb(&ctx->lst_h, EPOLLIN);
	return;

retry:
	/* Kept for the waiters; said at the first failure and whenever the cause changes. */
	pthread_mutex_lock(&ctx->lock);
	say = ctx->listen_failures++ == 0 || rc != ctx->listen_err;
	ctx->listen_err = rc;
	pthread_mutex_unlock(&ctx->lock);
	if (say)
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
	if (o->always_invalidate && !strcmp(o->provider ? o->provider : "tcp", "tcp") &&
	    rtrs_info_rsp_size(o->queue_depth, o->queue_depth) > RTRS_TCP_SEND_MAX) {
		/* A chunk's descriptor and its key record each: one tcp message. */
		log_err("server: queue depth %u with always_invalidate on tcp: the information "
			"response (a descriptor and a key per chunk) would exceed one message of "
			"%u bytes; at most %zu chunks", o->queue_depth, RTRS_TCP_SEND_MAX,
			(RTRS_TCP_SEND_MAX - rtrs_info_rsp_size(0, 0)) /
				(rtrs_info_rsp_size(1, 1) - rtrs_info_rsp_size(0, 0)));
		err_detail("queue depth %u with always_invalidate on tcp: at most %zu chunks",
			   o->queue_depth,
			   (RTRS_TCP_SEND_MAX - rtrs_info_rsp_size(0, 0)) /
				   (rtrs_info_rsp_size(1, 1) - rtrs_info_rsp_size(0, 0)));
		return -EINVAL;
	}
	if (!o->hb_interval_ms || !o->hb_missed_max || !o->listen_retry_ms ||
	    o->max_cons_per_path < 2 || o->max_cons_per_path > RTRS_MAX_CONNS ||
	    !o->connect_timeout_ms || o->poll_groups > RTRS_MAX_POLL_GROUPS)
		return -EINVAL;
	if (!fab_known(o->provider)) {
		log_err("server: unknown provider %s (tcp, verbs or rdma)", o->provider);
		err_detail("unknown provider %s: the fabrics are tcp, and verbs or rdma for RDMA "
			   "devices", o->provider);
		return -EPROTONOSUPPORT;
	}
	if (o->auth_keys_file && (!*o->auth_keys_file || !o->auth_timeout_ms)) {
		log_err("server: authentication needs a key file name and a timeout");
		return -EINVAL;
	}
	if ((unsigned)o->tls > RTRS_TLS_REQUIRED) {
		log_err("server: TLS mode %d is not a server's (off, offered or required)", (int)o->tls);
		return -EINVAL;
	}
	if (o->tls != RTRS_TLS_OFF && strcmp(o->provider ? o->provider : "tcp", "tcp")) {
		log_err("server: TLS is on the tcp provider only, not %s", o->provider);
		err_detail("TLS needs the tcp provider, not %s", o->provider);
		return -EPROTONOSUPPORT;
	}
	if (o->tls != RTRS_TLS_OFF && !o->auth_keys_file) {
		log_err("server: TLS needs the authentication key file: it holds the PSKs");
		err_detail("TLS needs an authentication key file (it holds the PSKs)");
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
	if (!o->max_sessions_per_peer)
		o->max_sessions_per_peer = MIN(RTRS_DEFAULT_MAX_SESSIONS_PER_PEER, o->max_sessions);
	if (!o->max_chunk_mem)
		o->max_chunk_mem = rtrs_default_max_chunk_mem();
}

/* The whole key file must parse and list a host (else every host is refused). */
static int srv_check_keys(struct rtrs_srv_ctx *ctx)
{
	struct rtrs_auth_cfg *cfg = &ctx->auth_cfg;
	struct rtrs_auth_key hk, ck;
	const char *why = NULL;
	unsigned line = 0;
	int rc;

	rc = rtrs_keyfile_lookup(cfg->keyfile, NULL, &hk, &ck, &line, &why);
	rtrs_auth_wipe(&hk, sizeof(hk));
	rtrs_auth_wipe(&ck, sizeof(ck));
	if (rc == -ENOKEY)
		log_err("server: authentication key file %s lists no host: every host would be "
			"refused", cfg->keys_file);
	else if (rc && line)
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
	rc = srv_check_keys(ctx);
	if (!rc && o->tls != RTRS_TLS_OFF) {
		const char *why = NULL;
		unsigned line = 0;

		rc = rtrs_tls_ctx_server(cfg->name, cfg->keys_file, o->tls_no_ktls, &ctx->tls, &line,
					 &why);
		if (rc && line)
			log_err("server: %s line %u: %s", cfg->keys_file, line, why ? why : "invalid");
		else if (rc)
			log_err("server: TLS: %s", why ? why : strerror(-rc));
	}
	return rc;
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

/* Loop thread: every path of the sessions of the hosts named is closed. */
struct revoke_call {
	struct rtrs_srv_ctx *ctx;
	char (*hosts)[RTRS_AUTH_WIRE_NAME];
	unsigned nr_hosts;
	unsigned closed;          /* paths */
	bool snap;                /* first pass: only list the hosts of live sessions */
	/* Re-authentication: the hosts kept, each with the digest of its keys now. */
	char (*kept)[RTRS_AUTH_WIRE_NAME];
	uint8_t (*digest)[32];
	unsigned nr_kept;
	unsigned reauth;          /* paths asked to authenticate again */
};

/* Loop thread: the connected paths of kept hosts whose keys changed authenticate again. */
static void sessions_reauth(void *arg)
{
	struct revoke_call *c = arg;

	for (struct rtrs_srv_sess *s = c->ctx->sessions; s; s = s->next) {
		unsigned k;

		if (!s->auth_host[0])
			continue;
		for (k = 0; k < c->nr_kept && strcmp(c->kept[k], s->auth_host); k++)
			;
		if (k == c->nr_kept)
			continue;
		for (struct srv_path *p = s->paths; p; p = p->next) {
			bool changed;

			/* Written by the path's authentication job, under auth_lock. */
			pthread_mutex_lock(&p->auth_lock);
			changed = memcmp(p->auth_digest, c->digest[k], 32) != 0;
			pthread_mutex_unlock(&p->auth_lock);
			if (changed && srv_path_reauth(p))
				c->reauth++;
		}
	}
}

static bool revoke_has(const struct revoke_call *c, const char *host)
{
	for (unsigned i = 0; i < c->nr_hosts; i++)
		if (!strcmp(c->hosts[i], host))
			return true;
	return false;
}

static void sessions_revoke(void *arg)
{
	struct revoke_call *c = arg;

	/*
	 * A path not yet connected is in no list below (its session may have
	 * no host yet, and its transaction may still be running): it is
	 * refused at its information request if its keys were read before
	 * now (srv_path.auth_epoch). Moved here, on the loop, so that a path
	 * connected before this pass is in the list and one connecting after
	 * it finds the epoch moved.
	 */
	if (c->snap)
		atomic_fetch_add(&c->ctx->key_epoch, 1);
	for (struct rtrs_srv_sess *s = c->ctx->sessions; s; s = s->next) {
		if (!s->auth_host[0])
			continue;
		if (c->snap) {
			void *grown;

			if (revoke_has(c, s->auth_host))
				continue;
			grown = realloc(c->hosts, (c->nr_hosts + 1) * sizeof(*c->hosts));
			if (!grown)
				continue; /* not revoked now: the next reload sees it */
			c->hosts = grown;
			snprintf(c->hosts[c->nr_hosts++], sizeof(*c->hosts), "%s", s->auth_host);
			continue;
		}
		if (!revoke_has(c, s->auth_host))
			continue;
		for (struct srv_path *p = s->paths; p; p = p->next) {
			enum rtrs_path_state st = atomic_load(&p->base.state);

			if (st == RTRS_PATH_CLOSING || st == RTRS_PATH_CLOSED)
				continue;
			log_warn("%s: host %s is no longer in the key file %s: path closed", path_name(p),
				 s->auth_host, c->ctx->auth_keys_file);
			srv_path_stop(p, -EKEYREJECTED);
			c->closed++;
		}
	}
}

RTRS_EXPORT
int rtrs_srv_reload_keys(struct rtrs_srv_ctx *ctx)
{
	struct revoke_call c = { .ctx = ctx, .snap = true };
	unsigned keep = 0;
	int rc = rtrs_srv_check_keys(ctx);

	if (rc)
		return rc;
	if (ctx->tls) {
		const char *why = NULL;
		unsigned line = 0;

		rc = rtrs_tls_ctx_reload(ctx->tls, &line, &why);
		if (rc) {
			log_err("server: key file %s%s%u: %s: TLS keys kept", ctx->auth_keys_file,
				line ? " line " : "", line, why ? why : strerror(-rc));
			return rc;
		}
	}
	/* The hosts of live sessions; each looked up in the file, off the loop. */
	loop_call(ctx->loop, sessions_revoke, &c);
	for (unsigned i = 0; i < c.nr_hosts; i++) {
		struct rtrs_auth_key hk, ck;
		const char *why = NULL;
		unsigned line = 0;

		rc = rtrs_keyfile_lookup(ctx->auth_cfg.keyfile, c.hosts[i], &hk, &ck, &line, &why);
		if (!rc) {
			/* Still listed: kept, and authenticated again if its keys changed. */
			void *k = realloc(c.kept, (c.nr_kept + 1) * sizeof(*c.kept));
			void *d = k ? realloc(c.digest, (c.nr_kept + 1) * sizeof(*c.digest)) : NULL;

			if (k)
				c.kept = k;
			if (d)
				c.digest = d;
			if (k && d) {
				snprintf(c.kept[c.nr_kept], sizeof(*c.kept), "%s", c.hosts[i]);
				srv_auth_digest(&hk, &ck, c.digest[c.nr_kept]);
				c.nr_kept++;
			}
		}
		rtrs_auth_wipe(&hk, sizeof(hk));
		rtrs_auth_wipe(&ck, sizeof(ck));
		if (rc && rc != -ESRCH) {
			/* Not read whole: revoke nobody on a guess. */
			log_err("server: key file %s: %s: no host revoked", ctx->auth_keys_file,
				why ? why : strerror(-rc));
			free(c.hosts);
			free(c.kept);
			free(c.digest);
			return rc;
		}
		if (!rc)
			continue;
		memmove(c.hosts[keep], c.hosts[i], sizeof(*c.hosts));
		keep++;
	}
	c.nr_hosts = keep;
	c.snap = false;
	if (keep)
		loop_call(ctx->loop, sessions_revoke, &c);
	if (c.nr_kept)
		loop_call(ctx->loop, sessions_reauth, &c);
	if (c.reauth)
		log_info("server: key file %s: %u paths of hosts whose keys changed asked to "
			 "authenticate again", ctx->auth_keys_file, c.reauth);
	free(c.hosts);
	free(c.kept);
	free(c.digest);
	return (int)c.closed;
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
	if (o->poll_groups) { /* for when the groups start */
		fab_tcp_groups(o->poll_groups);
		fab_rdma_groups(o->poll_groups);
	}
	fab_rdma_srq(o->no_srq ? 0 : o->srq_depth ? o->srq_depth : RTRS_DEFAULT_SRQ_DEPTH);
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
		if (ctx->tls)
			rtrs_tls_ctx_put(ctx->tls);
		free(ctx);
		return rc;
	}
	ctx->listen_timer.loop = NULL;
	ctx->trim_timer.loop = NULL;
	loop_work_init(&ctx->reap_work, srv_reap_work);
	loop_work_init(&ctx->srv_verdict_work, srv_verdict_work);
	pthread_mutex_init(&ctx->lock, NULL);
	cond_init_mono(&ctx->cond);
	rc = loop_create("rtrs-srv", &ctx->loop);
	if (rc)
		goto out_free;
	rc = loop_timer_init(ctx->loop, &ctx->listen_timer, srv_listen_timer);
	if (rc)
		goto out_free;
	rc = loop_timer_init(ctx->loop, &ctx->trim_timer, srv_trim_timer);
	if (rc)
		goto out_free;
	/* Listening starts on the loop thread, never here (no network at init). */
	loop_timer_arm(&ctx->listen_timer, 1, 0);
	*out = ctx;
	return 0;

out_free:
	loop_destroy(ctx->loop);
	rtrs_keyfile_free(ctx->auth_cfg.keyfile);
	if (ctx->tls)
		rtrs_tls_ctx_put(ctx->tls);
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
	rc = ctx->listening ? 0 : ctx->listen_err ? ctx->listen_err : -ETIMEDOUT;
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
	loop_timer_fini(&ctx->trim_timer);
	srv_verdicts_reap(ctx, true);
	if (ctx->lst) {
		loop_del_fd(ctx->loop, &ctx->lst_h);
		fab_lst_close(ctx->lst);
		ctx->lst = NULL;
	}
	for (struct rtrs_srv_sess *s = ctx->sessions, *sn; s; s = sn) {
		sn = s->next;
		for (struct srv_path *p = s->paths, *pn; p; p = pn) {
			pn = p->next;
			srv_path_stop(p, -ESHUTDOWN);
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
	if (ctx->tls)
		rtrs_tls_ctx_put(ctx->tls);
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
int rtrs_srv_sess_peer_ext(struct rtrs_srv_sess *s)
{
	if (!s)
		return -EINVAL;
	return s->ext;
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
int rtrs_srv_get_sess_host(struct rtrs_srv_sess *s, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s", s->auth_host);

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

RTRS_EXPORT
unsigned rtrs_srv_op_id(const struct rtrs_srv_op *op)
{
	return op->id;
}

/* ---- sessions, for the management plane ---------------------------------------------- */

struct sess_snap {
	struct rtrs_srv_sess_info info;
	struct rtrs_srv_path_info *paths;
};

struct snap_call {
	struct rtrs_srv_ctx *ctx;
	struct sess_snap *v;
	unsigned n;
	int rc;
};

static void path_snap(struct srv_path *p, struct rtrs_srv_path_info *pi)
{
	uint64_t now = now_ms();
	int hs = atomic_load(&p->hs);

	snprintf(pi->peer, sizeof(pi->peer), "%s", p->peer);
	snprintf(pi->local, sizeof(pi->local), "%s", p->local);
	pi->state = rtrs_path_state_str(atomic_load(&p->base.state));
	pi->age_ms = now > p->created_ms ? now - p->created_ms : 0;
	pi->cons = p->nr_accepted;
	pi->inflight = (uint32_t)atomic_load(&p->base.inflight);
	pi->reads = atomic_load(&p->st.reads);
	pi->read_bytes = atomic_load(&p->st.read_bytes);
	pi->writes = atomic_load(&p->st.writes);
	pi->write_bytes = atomic_load(&p->st.write_bytes);
	/* Copied before the transaction's end moved the state on (srv_auth_recv). */
	if (rtrs_srv_hs_host_proven(hs) && hs != SRV_HS_HOST_OK)
		snprintf(pi->auth_host, sizeof(pi->auth_host), "%s", p->auth_host);
}

/* Loop thread: the sessions and their paths, copied. */
static void sessions_snap(void *arg)
{
	struct snap_call *c = arg;
	unsigned n = 0;

	for (struct rtrs_srv_sess *s = c->ctx->sessions; s; s = s->next)
		n++;
	c->v = n ? calloc(n, sizeof(*c->v)) : NULL;
	if (n && !c->v) {
		c->rc = -ENOMEM;
		return;
	}
	for (struct rtrs_srv_sess *s = c->ctx->sessions; s; s = s->next) {
		struct sess_snap *sn = &c->v[c->n++];
		unsigned np = 0, i = 0;

		snprintf(sn->info.name, sizeof(sn->info.name), "%s", s->name);
		sn->info.kernel_client = !s->ext;
		sn->info.always_invalidate = s->inval;
		sn->info.queue_depth = s->queue_depth;
		sn->info.chunk_size = s->chunk_size;
		sn->info.paths_up = s->paths_up;
		sn->info.priv = s->priv;
		for (struct srv_path *p = s->paths; p; p = p->next)
			np++;
		sn->paths = np ? calloc(np, sizeof(*sn->paths)) : NULL;
		if (np && !sn->paths) {
			c->rc = -ENOMEM;
			return;
		}
		for (struct srv_path *p = s->paths; p; p = p->next)
			path_snap(p, &sn->paths[i++]);
		sn->info.paths_num = np;
		sn->info.paths = sn->paths;
	}
}

RTRS_EXPORT
int rtrs_srv_sessions(struct rtrs_srv_ctx *ctx,
		      void (*fn)(void *priv, const struct rtrs_srv_sess_info *info), void *priv)
{
	struct snap_call c = { .ctx = ctx };

	if (!ctx || !fn)
		return -EINVAL;
	loop_call(ctx->loop, sessions_snap, &c);
	for (unsigned i = 0; i < c.n; i++) {
		if (!c.rc)
			fn(priv, &c.v[i].info);
		free(c.v[i].paths);
	}
	free(c.v);
	return c.rc ? c.rc : (int)c.n;
}
