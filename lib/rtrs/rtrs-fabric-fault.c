// SPDX-License-Identifier: MIT
/*
 * Fault injection as a fabric layer (rtrs-fault.h), compiled only with
 * meson -Dfault_injection=true. fab_open comes here; a fabric opened while
 * a fault applies to it is the one fab_impl picks, wrapped, and so are its
 * connections: each wrapper object starts with &fab_fault_ops and holds
 * the inner object. Listeners, connection requests and memory
 * registrations are the inner implementation's own objects, handed out as
 * they are: their calls dispatch there directly and never come here.
 *
 * The faults need no change to the client or the server: a slow path
 * delays the immediates the connection hands up, a full send queue
 * refuses posts, a stale key puts a chunk's first key back into the
 * outgoing write, and a claimed session or a kernel client rewrites the
 * connection request.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rtrs-fault.h"
#include "rtrs-pri.h"
#include "rtrs-tls.h"

/* Chunk ids fit the queue depth: 16 bits on the wire. */
#define FAULT_MAX_CHUNKS 65536
#define FAULT_MAX_DELAY_US 10000000u

/* One rtrs_fault_set(): shared by the fabrics opened under it. */
struct fault_set {
	atomic_int refs;
	unsigned eagain_every;
	bool delay_any;           /* delay_src was NULL */
	char delay_src[256];
	unsigned delay_us;
	bool stale_rkey;
	bool set_uuid;
	uint8_t paths_uuid[RTRS_UUID_LEN];
	bool kernel_client;
	unsigned open_delay_ms;
	bool down_nodev;
	bool nodev_dead;
	struct rtrs_tls_ctx *tls_alt;  /* tls_host's context, or NULL */
	bool tls_later_only;
	/* stale_rkey: the first key each chunk id was written with. */
	pthread_mutex_t key_lock;
	uint64_t *first_key;
	uint8_t *key_seen;
};

struct fault_fab {
	const struct fab_ops *ops; /* &fab_fault_ops, as struct fab_obj */
	struct fab *inner;
	struct fault_set *fs;
	bool server;
	unsigned delay_us;         /* this fabric's connections are slow */
	atomic_bool dead;          /* nodev_dead: a connection went down with -ENODEV */
	bool late;                 /* opened open_delay_ms late: counted at its close */
	/* tls_alt: what the owner set (fab_set_tls), given to connection 0 with tls_later_only */
	pthread_mutex_t tls_lock;
	enum fab_tls_mode tls_mode;
	struct rtrs_tls_ctx *tls_own;
};

struct fault_con {
	const struct fab_ops *ops; /* &fab_fault_ops */
	struct fab_con *inner;
	struct fault_set *fs;
	struct fault_fab *ff;      /* its fabric, which outlives it */
	bool client;
	unsigned delay_us;
	const struct fab_con_ops *user_ops;
	void *user_priv;
	char name[64];
	atomic_uint posts;         /* eagain_every */
	atomic_uint queue_depth;   /* stale_rkey: from the connect response; 0 unknown */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fault_set *g_set;
static atomic_uint_fast64_t st_eagain, st_delayed, st_stale, st_uuids, st_kernel, st_nodev;
static atomic_uint_fast64_t st_tls, st_late_opens, st_late_closes;

static struct fault_fab *ff_of(struct fab *f)
{
	return (struct fault_fab *)(void *)f;
}

static const struct fault_fab *ff_of_const(const struct fab *f)
{
	return (const struct fault_fab *)(const void *)f;
}

static struct fault_con *fc_of(struct fab_con *c)
{
	return (struct fault_con *)(void *)c;
}

static const struct fault_con *fc_of_const(const struct fab_con *c)
{
	return (const struct fault_con *)(const void *)c;
}

/* ---- the fault set ---------------------------------------------------------- */

static void fault_set_put(struct fault_set *fs)
{
	if (!fs || atomic_fetch_sub(&fs->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&fs->key_lock);
	if (fs->tls_alt)
		rtrs_tls_ctx_put(fs->tls_alt);
	free(fs->first_key);
	free(fs->key_seen);
	free(fs);
}

/* The faults in force now, with a reference; NULL: none. */
static struct fault_set *fault_set_get(void)
{
	struct fault_set *fs;

	pthread_mutex_lock(&g_lock);
	fs = g_set;
	if (fs)
		atomic_fetch_add(&fs->refs, 1);
	pthread_mutex_unlock(&g_lock);
	return fs;
}

static int fault_set_new(const struct rtrs_fault *f, struct fault_set **out)
{
	struct fault_set *fs;

	*out = NULL;
	if (!f || (!f->eagain_every && !f->delay_us && !f->stale_rkey && !f->paths_uuid &&
		   !f->kernel_client && !f->open_delay_ms && !f->down_nodev && !f->tls_host &&
		   !f->tls_server && !f->tls_key))
		return 0;
	if (!f->tls_host != !f->tls_server || !f->tls_host != !f->tls_key)
		return -EINVAL;
	if (f->eagain_every == 1 || f->delay_us > FAULT_MAX_DELAY_US ||
	    f->open_delay_ms > FAULT_MAX_DELAY_US / 1000 ||
	    (f->delay_src && strlen(f->delay_src) >= sizeof(fs->delay_src)) ||
	    (f->paths_uuid && strlen(f->paths_uuid) > RTRS_UUID_LEN))
		return -EINVAL;
	fs = calloc(1, sizeof(*fs));
	if (!fs)
		return -ENOMEM;
	atomic_init(&fs->refs, 1);
	fs->eagain_every = f->eagain_every;
	fs->delay_us = f->delay_us;
	fs->delay_any = !f->delay_src;
	if (f->delay_src)
		snprintf(fs->delay_src, sizeof(fs->delay_src), "%s", f->delay_src);
	fs->stale_rkey = f->stale_rkey;
	fs->kernel_client = f->kernel_client;
	fs->open_delay_ms = f->open_delay_ms;
	fs->down_nodev = f->down_nodev;
	fs->nodev_dead = f->down_nodev && f->nodev_dead;
	if (f->paths_uuid) {
		fs->set_uuid = true;
		memcpy(fs->paths_uuid, f->paths_uuid, strlen(f->paths_uuid));
	}
	pthread_mutex_init(&fs->key_lock, NULL);
	fs->tls_later_only = f->tls_later_only;
	if (f->tls_key) {
		struct rtrs_auth_key k;
		const char *why = NULL;
		int rc = rtrs_tls_key_check(f->tls_key, &k, NULL, NULL, &why);

		if (!rc)
			rc = rtrs_tls_ctx_client(f->tls_host, f->tls_server, &k, NULL, true,
						 &fs->tls_alt);
		rtrs_auth_wipe(&k, sizeof(k));
		if (rc) {
			fault_set_put(fs);
			return rc;
		}
	}
	if (fs->stale_rkey) {
		fs->first_key = calloc(FAULT_MAX_CHUNKS, sizeof(*fs->first_key));
		fs->key_seen = calloc(FAULT_MAX_CHUNKS, sizeof(*fs->key_seen));
		if (!fs->first_key || !fs->key_seen) {
			fault_set_put(fs);
			return -ENOMEM;
		}
	}
	*out = fs;
	return 0;
}

RTRS_EXPORT int rtrs_fault_set(const struct rtrs_fault *f)
{
	struct fault_set *fs, *old;
	int rc;

	if (f && f->rdma_connect_threads > 64)
		return -EINVAL;
	rc = fault_set_new(f, &fs);
	if (rc)
		return rc;
	fab_rdma_connect_threads(f ? f->rdma_connect_threads : 0);
	fab_rdma_post_fail_at(f ? f->rdma_post_fail_at : 0);
	pthread_mutex_lock(&g_lock);
	old = g_set;
	g_set = fs;
	pthread_mutex_unlock(&g_lock);
	fault_set_put(old);
	return 0;
}

RTRS_EXPORT void rtrs_fault_get_stats(struct rtrs_fault_stats *st)
{
	st->eagain = atomic_load(&st_eagain);
	st->delayed = atomic_load(&st_delayed);
	st->stale_keys = atomic_load(&st_stale);
	st->uuids = atomic_load(&st_uuids);
	st->kernel_reqs = atomic_load(&st_kernel);
	st->nodev = atomic_load(&st_nodev);
	st->tls_swaps = atomic_load(&st_tls);
	st->late_opens = atomic_load(&st_late_opens);
	st->late_closes = atomic_load(&st_late_closes);
	st->posts_failed = fab_rdma_posts_failed();
}

/* ---- connection callbacks: the owner's, with the faults in between ---------- */

static void fault_connected(void *priv, const void *data, size_t len)
{
	struct fault_con *c = priv;

	if (c->client && c->fs->stale_rkey) {
		struct rtrs_conn_rsp rsp;
		const char *why = NULL;

		/* The chunk id in a request's immediate is sized by the queue depth. */
		if (!rtrs_conn_rsp_decode(data, len, &rsp, &why) && !rsp.err)
			atomic_store(&c->queue_depth, rsp.queue_depth);
		else
			log_err("%s: fault injection: no queue depth in the connect response (%s): "
				"keys are not made stale", c->name, why ? why : "refused");
	}
	c->user_ops->connected(c->user_priv, data, len);
}

static void fault_down(void *priv, int err, const void *data, size_t len)
{
	struct fault_con *c = priv;

	if (c->client && c->fs->down_nodev) {
		atomic_fetch_add(&st_nodev, 1);
		err = -ENODEV;
		if (c->fs->nodev_dead)
			atomic_store(&c->ff->dead, true);
	}
	c->user_ops->down(c->user_priv, err, data, len);
}

static void fault_imm(void *priv, uint32_t imm)
{
	struct fault_con *c = priv;

	if (c->delay_us) {
		usleep(c->delay_us);
		atomic_fetch_add(&st_delayed, 1);
	}
	c->user_ops->imm(c->user_priv, imm);
}

static void fault_recv(void *priv, void *buf, size_t len)
{
	struct fault_con *c = priv;

	c->user_ops->recv(c->user_priv, buf, len);
}

static void fault_done(void *priv, void *ctx)
{
	struct fault_con *c = priv;

	c->user_ops->done(c->user_priv, ctx);
}

static void fault_kick(void *priv)
{
	struct fault_con *c = priv;

	c->user_ops->kick(c->user_priv);
}

static const struct fab_con_ops fault_con_ops = {
	.connected = fault_connected,
	.down = fault_down,
	.imm = fault_imm,
	.recv = fault_recv,
	.done = fault_done,
	.kick = fault_kick,
};

/* ---- fabric ------------------------------------------------------------------ */

static bool fault_slow(const struct fault_set *fs, const char *src)
{
	return fs->delay_us && (fs->delay_any || (src && !strcmp(src, fs->delay_src)));
}

static int fault_open(const char *prov, const char *src, const char *node, const char *service,
		      bool server, size_t queue, struct fab **out)
{
	struct fault_set *fs = fault_set_get();
	struct fault_fab *ff;
	bool slow, client_faults;
	int rc;

	if (fs && fs->open_delay_ms && !server) {
		struct timespec ts = { .tv_sec = fs->open_delay_ms / 1000,
				       .tv_nsec = (long)(fs->open_delay_ms % 1000) * 1000000L };

		log_warn("fault injection: opening a fabric to %s:%s %u ms late", node ? node : "*",
			 service ? service : "*", fs->open_delay_ms);
		while (nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	slow = fs && fault_slow(fs, src);
	/* A fabric opened late is wrapped too: its close is counted. */
	client_faults = fs && !server &&
			(fs->stale_rkey || fs->set_uuid || fs->kernel_client || fs->down_nodev ||
			 fs->tls_alt || fs->open_delay_ms);
	if (!fs || (!fs->eagain_every && !slow && !client_faults)) {
		fault_set_put(fs);
		return fab_impl(prov)->open(prov, src, node, service, server, queue, out);
	}
	ff = calloc(1, sizeof(*ff));
	if (!ff) {
		fault_set_put(fs);
		return -ENOMEM;
	}
	rc = fab_impl(prov)->open(prov, src, node, service, server, queue, &ff->inner);
	if (rc) {
		fault_set_put(fs);
		free(ff);
		return rc;
	}
	ff->ops = &fab_fault_ops;
	ff->fs = fs;
	ff->server = server;
	pthread_mutex_init(&ff->tls_lock, NULL);
	ff->delay_us = slow ? fs->delay_us : 0;
	ff->late = client_faults && fs->open_delay_ms;
	if (ff->late)
		atomic_fetch_add(&st_late_opens, 1);
	log_warn("fault injection: %s %s:%s:%s%s%s%s%s%s%s%s", server ? "listening on" : "connecting to",
		 node ? node : "*", service ? service : "*",
		 fs->eagain_every ? " every write may be refused" : "",
		 slow ? " slow" : "", client_faults && fs->stale_rkey ? " stale keys" : "",
		 client_faults && fs->set_uuid ? " claimed session uuid" : "",
		 client_faults && fs->kernel_client ? " as a kernel client" : "",
		 client_faults && fs->down_nodev ? " downs as a removed device" : "",
		 client_faults && fs->tls_alt ? " another host's TLS key" : "",
		 client_faults && fs->open_delay_ms ? " opened late" : "");
	*out = (struct fab *)(void *)ff;
	return 0;
}

static void fault_close(struct fab *f)
{
	struct fault_fab *ff = ff_of(f);

	fab_close(ff->inner);
	if (ff->late)
		atomic_fetch_add(&st_late_closes, 1);
	fault_set_put(ff->fs);
	if (ff->tls_own)
		rtrs_tls_ctx_put(ff->tls_own);
	pthread_mutex_destroy(&ff->tls_lock);
	free(ff);
}

static const struct fab_attr *fault_attr(const struct fab *f)
{
	return fab_attr(ff_of_const(f)->inner);
}

static int fault_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	if (atomic_load(&ff_of(f)->dead))
		return -EIO;
	return fab_mr_reg(ff_of(f)->inner, buf, len, access, mr);
}

/* The registration is the inner fabric's; the sends it waits for are the inner connection's. */
static void fault_mr_dereg_after(struct fab_con *c, struct fab_mr *mr)
{
	fab_mr_dereg_after(fc_of(c)->inner, mr);
}

static void fault_trim(struct fab *f)
{
	fab_trim(ff_of(f)->inner);
}

static int fault_win_alloc(struct fab *f, struct fab_win *w)
{
	return fab_win_alloc(ff_of(f)->inner, w);
}

static int fault_listen(struct fab *f, struct fab_lst **out)
{
	return fab_listen(ff_of(f)->inner, out);
}

/* The connection request rewritten in m: the claimed session uuid, or a kernel client's flags. */
static int conn_req_rewrite(const struct fault_set *fs, const char *name, const void *data,
			    size_t len, struct rtrs_msg_conn_req *m)
{
	struct rtrs_conn_req req;
	const char *why = NULL;
	int rc = rtrs_conn_req_decode(data, len, &req, &why);

	if (rc || len != sizeof(*m)) {
		log_err("%s: fault injection: not a connection request (%s)", name,
			why ? why : "size");
		return rc ? rc : -EINVAL;
	}
	if (fs->set_uuid) {
		memcpy(req.paths_uuid, fs->paths_uuid, RTRS_UUID_LEN);
		atomic_fetch_add(&st_uuids, 1);
	}
	if (fs->kernel_client) {
		req.ext = req.fence = req.auth = false; /* the encoder sends fence, auth with ext only */
		atomic_fetch_add(&st_kernel, 1);
	}
	rtrs_conn_req_encode(m, &req);
	return 0;
}

/*
 * Connects (req NULL) or accepts req: a wrapper connection between the
 * owner and the inner one. *out is the wrapper before any callback can run.
 */
static int con_open(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
		    const void *data, size_t len, struct fab_con **out)
{
	struct fault_fab *ff = ff_of(f);
	struct fault_con *c = calloc(1, sizeof(*c));
	struct rtrs_msg_conn_req m;
	struct fab_con_cfg icfg = *cfg;
	int rc = 0;

	if (!c)
		return -ENOMEM;
	if (atomic_load(&ff->dead)) {
		free(c);
		return -EIO;
	}
	c->ops = &fab_fault_ops;
	c->fs = ff->fs;
	c->ff = ff;
	atomic_fetch_add(&c->fs->refs, 1);
	c->client = !ff->server;
	c->delay_us = ff->delay_us;
	c->user_ops = cfg->ops;
	c->user_priv = cfg->priv;
	snprintf(c->name, sizeof(c->name), "%s", cfg->name ? cfg->name : "?");
	atomic_init(&c->posts, 0);
	atomic_init(&c->queue_depth, 0);
	icfg.ops = &fault_con_ops;
	icfg.priv = c;
	/* The owner's callbacks may use the handle from their first call on. */
	*out = (struct fab_con *)(void *)c;
	if (req) {
		rc = fab_con_accept(ff->inner, req, &icfg, data, len, &c->inner);
	} else {
		if (c->fs->set_uuid || c->fs->kernel_client) {
			rc = conn_req_rewrite(c->fs, c->name, data, len, &m);
			data = &m;
		}
		if (!rc && c->fs->tls_alt) {
			/* Another host's PSK for this connection (all, or all but 0). */
			struct rtrs_conn_req cr;
			const char *why = NULL;
			bool swap = !c->fs->tls_later_only ||
				    (!rtrs_conn_req_decode(data, len, &cr, &why) && cr.cid);

			pthread_mutex_lock(&ff->tls_lock);
			if (ff->tls_mode != FAB_TLS_OFF)
				rc = fab_set_tls(ff->inner, ff->tls_mode,
						 swap ? c->fs->tls_alt : ff->tls_own);
			if (!rc)
				rc = fab_con_connect(ff->inner, &icfg, data, len, &c->inner);
			pthread_mutex_unlock(&ff->tls_lock);
			if (!rc && swap && ff->tls_mode != FAB_TLS_OFF)
				atomic_fetch_add(&st_tls, 1);
		} else if (!rc) {
			rc = fab_con_connect(ff->inner, &icfg, data, len, &c->inner);
		}
	}
	if (rc) {
		*out = NULL;
		fault_set_put(c->fs);
		free(c);
	}
	return rc;
}

static int fault_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			     size_t len, struct fab_con **out)
{
	return con_open(f, NULL, cfg, data, len, out);
}

static int fault_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			    const void *data, size_t len, struct fab_con **out)
{
	return con_open(f, req, cfg, data, len, out);
}

/* ---- connection -------------------------------------------------------------- */

static void fault_con_shutdown(struct fab_con *c)
{
	fab_con_shutdown(fc_of(c)->inner);
}

static int fault_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	return fab_con_rx_setup(fc_of(c)->inner, count, size);
}

static void fault_con_kick(struct fab_con *c)
{
	fab_con_kick(fc_of(c)->inner);
}

static void fault_con_retry_later(struct fab_con *c)
{
	fab_con_retry_later(fc_of(c)->inner);
}

static int fault_con_poll(struct fab_con *c)
{
	return fab_con_poll(fc_of(c)->inner);
}

static int fault_con_trywait(struct fab_con *c)
{
	return fab_con_trywait(fc_of(c)->inner);
}

static int fault_con_wait_fd(const struct fab_con *c)
{
	return fab_con_wait_fd(fc_of_const(c)->inner);
}

static void fault_con_set_poller(struct fab_con *c, struct fab_poller *p)
{
	fab_con_set_poller(fc_of(c)->inner, p);
}

static void fault_con_destroy(struct fab_con *c)
{
	struct fault_con *wc = fc_of(c);

	/* The inner thread is joined here: no callback can come afterwards. */
	fab_con_destroy(wc->inner);
	fault_set_put(wc->fs);
	free(wc);
}

static int fault_set_tls(struct fab *f, enum fab_tls_mode mode, struct rtrs_tls_ctx *ctx)
{
	struct fault_fab *ff = ff_of(f);
	int rc;

	pthread_mutex_lock(&ff->tls_lock);
	rc = fab_set_tls(ff->inner, mode, ctx);
	if (!rc) {
		if (ctx && mode != FAB_TLS_OFF)
			rtrs_tls_ctx_get(ctx);
		if (ff->tls_own)
			rtrs_tls_ctx_put(ff->tls_own);
		ff->tls_own = mode != FAB_TLS_OFF ? ctx : NULL;
		ff->tls_mode = mode;
	}
	pthread_mutex_unlock(&ff->tls_lock);
	return rc;
}

static void fault_con_rename(struct fab_con *c, const char *name)
{
	fab_con_rename(fc_of(c)->inner, name);
}

static void fault_con_local(const struct fab_con *c, char *buf, size_t len)
{
	fab_con_local(fc_of_const(c)->inner, buf, len);
}

static bool fault_eagain(struct fault_con *c)
{
	unsigned every = c->fs->eagain_every;

	if (!every || atomic_fetch_add(&c->posts, 1) % every != every - 1)
		return false;
	atomic_fetch_add(&st_eagain, 1);
	return true;
}

/*
 * stale_rkey: the key chunk id was first written with, which key becomes
 * on its first use. The chunk comes from the request's immediate.
 */
static int stale_key(struct fault_con *c, bool with_imm, uint32_t imm, uint64_t *key)
{
	struct fault_set *fs = c->fs;
	unsigned qd = atomic_load(&c->queue_depth), type;
	uint32_t payload, id;

	if (!with_imm) {
		/* Its first writes would go with the new key: not what was asked. */
		log_err_rl("%s: fault injection: a request in several writes cannot use a stale key",
			   c->name);
		return -EOPNOTSUPP;
	}
	rtrs_from_imm(imm, &type, &payload);
	if (type != RTRS_IO_REQ_IMM || !qd)
		return 0;
	id = rtrs_io_req_chunk(qd, payload);
	if (id >= FAULT_MAX_CHUNKS)
		return 0;
	pthread_mutex_lock(&fs->key_lock);
	if (!fs->key_seen[id]) {
		fs->key_seen[id] = 1;
		fs->first_key[id] = *key;
	} else if (fs->first_key[id] != *key) {
		*key = fs->first_key[id];
		atomic_fetch_add(&st_stale, 1);
	}
	pthread_mutex_unlock(&fs->key_lock);
	return 0;
}

/* fab_write, or fab_write_left where left is not NULL. */
static int fault_write_any(struct fab_con *c, const struct iovec *iov, void *const *desc,
			   size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
			   uint32_t imm, void *ctx, bool *left)
{
	struct fault_con *wc = fc_of(c);
	struct fab_rma stale;

	if (fault_eagain(wc))
		return -EAGAIN;
	if (wc->client && wc->fs->stale_rkey) {
		int rc;

		/* The client writes a request to one chunk: one remote range. */
		if (rma_cnt != 1)
			return -EOPNOTSUPP;
		stale = rma[0];
		rc = stale_key(wc, with_imm, imm, &stale.key);
		if (rc)
			return rc;
		rma = &stale;
	}
	if (left)
		return fab_write_left(wc->inner, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm,
				      ctx, left);
	return fab_write(wc->inner, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx);
}

static int fault_write(struct fab_con *c, const struct iovec *iov, void *const *desc,
		       size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
		       uint32_t imm, void *ctx)
{
	return fault_write_any(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx, NULL);
}

static int fault_write_left(struct fab_con *c, const struct iovec *iov, void *const *desc,
			    size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt,
			    bool with_imm, uint32_t imm, void *ctx, bool *left)
{
	*left = false;
	return fault_write_any(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx, left);
}

static int fault_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			   uint64_t key, uint32_t imm, void *ctx)
{
	struct fault_con *wc = fc_of(c);

	if (fault_eagain(wc))
		return -EAGAIN;
	return fab_ops_of(wc->inner)->write_imm(wc->inner, buf, len, addr, key, imm, ctx);
}

static int fault_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	return fab_send(fc_of(c)->inner, buf, len, desc, ctx);
}

static int fault_send_imm(struct fab_con *c, const void *buf, size_t len, void *desc,
			  uint32_t imm, void *ctx)
{
	return fab_send_imm(fc_of(c)->inner, buf, len, desc, imm, ctx);
}

static int fault_send_inv(struct fab_con *c, uint32_t rkey, void *ctx)
{
	return fab_send_inv(fc_of(c)->inner, rkey, ctx);
}

static int fault_win_bind(struct fab_con *c, struct fab_win *w, const struct fab_mr *mr,
			  void *buf, size_t len, void *ctx)
{
	return fab_win_bind(fc_of(c)->inner, w, mr, buf, len, ctx);
}

/* A chain: the inner fabric's (a request in a chain cannot take a stale key). */
static int fault_post(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx)
{
	struct fault_con *wc = fc_of(c);

	if (n == 1 && wrs[0].kind == FAB_WR_WRITE)
		return fault_write(c, wrs[0].iov, wrs[0].desc, wrs[0].iov_cnt, wrs[0].rma,
				   wrs[0].rma_cnt, wrs[0].with_imm, wrs[0].imm, ctx);
	if (n == 1 && wrs[0].kind == FAB_WR_WRITE_IMM)
		return fault_write_imm(c, wrs[0].buf, wrs[0].len, wrs[0].addr, wrs[0].key,
				       wrs[0].imm, ctx);
	if (fault_eagain(wc))
		return -EAGAIN;
	return fab_post(wc->inner, wrs, n, ctx);
}

/*
 * Listener, connection request, MR and window-freeing calls are absent: those objects are
 * the inner implementation's and dispatch there.
 */
const struct fab_ops fab_fault_ops = {
	.name = "fault injection",
	.open = fault_open,
	.close = fault_close,
	.attr = fault_attr,
	.mr_reg = fault_mr_reg,
	.mr_dereg_after = fault_mr_dereg_after,
	.trim = fault_trim,
	.listen = fault_listen,
	.con_connect = fault_con_connect,
	.con_accept = fault_con_accept,
	.con_shutdown = fault_con_shutdown,
	.con_rx_setup = fault_con_rx_setup,
	.con_kick = fault_con_kick,
	.con_retry_later = fault_con_retry_later,
	.con_destroy = fault_con_destroy,
	.con_poll = fault_con_poll,
	.con_trywait = fault_con_trywait,
	.con_wait_fd = fault_con_wait_fd,
	.con_set_poller = fault_con_set_poller,
	.con_local = fault_con_local,
	.con_rename = fault_con_rename,
	.set_tls = fault_set_tls,
	.write = fault_write,
	.write_left = fault_write_left,
	.write_imm = fault_write_imm,
	.send = fault_send,
	.send_imm = fault_send_imm,
	.send_inv = fault_send_inv,
	.post = fault_post,
	.win_alloc = fault_win_alloc,
	.win_bind = fault_win_bind,
};
