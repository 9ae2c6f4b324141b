/* SPDX-License-Identifier: MIT */
/*
 * RTRS server: admission. A connection request (srv_on_connreq) finds or
 * creates its session and path, within the limits on pending connections
 * (pending_admit, docs/security.md section 8), sessions and names; what
 * is refused is rejected with its errno, and a refusal that says "do not
 * retry" is held open until the client has read it (the verdicts).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtrs-srv-pri.h"

/* Sessions with a name: a path of theirs got as far as the info request. */
unsigned srv_sessions_named(const struct rtrs_srv_ctx *ctx)
{
	unsigned n = 0;

	for (const struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		n += s->name[0] != 0;
	return n;
}

/* A path of s that admission holds for its proven host, not connected yet (srv_held_admit). */
static const struct srv_path *sess_held_path(const struct rtrs_srv_sess *s,
					     const struct srv_path *except)
{
	for (const struct srv_path *p = s->paths; p; p = p->next)
		if (p != except && p->held && atomic_load(&p->base.state) == RTRS_PATH_CONNECTING)
			return p;
	return NULL;
}

/*
 * Sessions of one owner but self: with authentication, those its first
 * path named for the host name it proved and those still in their
 * handshake that a path proven as that host holds (a place taken at the
 * proof, srv_held_admit); without, the named ones whose first path came
 * from that address (the others' paths are pending, within those limits).
 */
unsigned srv_sessions_of(const struct rtrs_srv_ctx *ctx, const char *owner,
			 const struct rtrs_srv_sess *self)
{
	unsigned n = 0;

	for (const struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next) {
		const struct srv_path *h;

		if (s == self)
			continue;
		if (s->name[0])
			n += !strcmp(ctx->auth_required ? s->auth_host : s->peer_host, owner);
		else if (ctx->auth_required && (h = sess_held_path(s, NULL)))
			n += !strcmp(h->held_host, owner);
	}
	return n;
}

int rtrs_admit_decide(const struct rtrs_admit_entry *pending, size_t n, const char *host,
		      const struct rtrs_admit_limits *lim, struct rtrs_admit_evict evict[2])
{
	int nr_evict = 0;

	for (int scope = 0; scope < 2; scope++) {
		unsigned max = scope ? lim->max_per_peer : lim->max_total, count = 0;
		size_t oldest = n;

		for (size_t i = 0; i < n; i++) {
			if (nr_evict && evict[0].idx == i)
				continue; /* made room already, in all */
			if (scope && strcmp(pending[i].host, host))
				continue;
			count++;
			if (pending[i].stalled &&
			    (oldest == n || pending[i].serial < pending[oldest].serial))
				oldest = i;
		}
		if (count < max)
			continue;
		if (oldest == n)
			return -EBUSY; /* every one of them is progressing: the newcomer waits */
		evict[nr_evict++] = (struct rtrs_admit_evict){ .idx = oldest, .per_peer = scope,
							       .count = count };
	}
	return nr_evict;
}

int rtrs_admit_held_decide(const struct rtrs_admit_entry *held, size_t n, const char *host,
			   unsigned max_held, struct rtrs_admit_evict *evict)
{
	/* The host's scope alone: a total no count reaches (a host needs a key). */
	const struct rtrs_admit_limits lim = { .max_total = UINT_MAX, .max_per_peer = max_held };
	struct rtrs_admit_evict ev[2];
	int rc = rtrs_admit_decide(held, n, host, &lim, ev);

	if (rc > 0)
		*evict = ev[0];
	return rc;
}

static bool waiter_is(const struct rtrs_admit_waiter *w, const char *host, const uint8_t uuid[16])
{
	return w->refusals && !memcmp(w->uuid, uuid, sizeof(w->uuid)) && !strcmp(w->host, host);
}

void rtrs_admit_waits(const struct rtrs_admit_waiter *w, size_t n, const char *host,
		      const uint8_t uuid[16], uint64_t now_ms, unsigned *waits, unsigned *most)
{
	*waits = 0;
	*most = 0;
	for (size_t i = 0; i < n; i++) {
		if (!w[i].refusals || strcmp(w[i].host, host))
			continue;
		if (waiter_is(&w[i], host, uuid))
			*waits = w[i].refusals;
		else if (now_ms - w[i].last_ms < RTRS_ADMIT_WAITER_LIVE_MS && w[i].refusals > *most)
			*most = w[i].refusals;
	}
}

int rtrs_admit_queue(int decided, unsigned waits, unsigned most)
{
	return decided >= 0 && !waits && most ? -EBUSY : decided;
}

/* Whether a should make room before b: refused fewer times, then seen longer ago. */
static bool waiter_weaker(const struct rtrs_admit_waiter *a, const struct rtrs_admit_waiter *b)
{
	return a->refusals < b->refusals || (a->refusals == b->refusals && a->last_ms < b->last_ms);
}

void rtrs_admit_waiter_note(struct rtrs_admit_waiter *w, size_t n, const char *host,
			    const uint8_t uuid[16], uint64_t now_ms)
{
	size_t free_i = n, weakest = n, weakest_own = n, own = 0, v;

	for (size_t i = 0; i < n; i++) {
		if (waiter_is(&w[i], host, uuid)) {
			w[i].refusals++;
			w[i].last_ms = now_ms;
			return;
		}
		if (!w[i].refusals) {
			if (free_i == n)
				free_i = i;
			continue;
		}
		if (weakest == n || waiter_weaker(&w[i], &w[weakest]))
			weakest = i;
		if (!strcmp(w[i].host, host)) {
			own++;
			if (weakest_own == n || waiter_weaker(&w[i], &w[weakest_own]))
				weakest_own = i;
		}
	}
	/*
	 * A free entry; else, a host that holds half the table makes room
	 * from its own; else the weakest of all goes (the oldest refused
	 * once: a client that comes back does so well before a flood refused
	 * at the same time has filled the table anew).
	 */
	v = free_i < n ? free_i : own >= n / 2 && weakest_own < n ? weakest_own : weakest;
	if (v == n)
		return;
	snprintf(w[v].host, sizeof(w[v].host), "%s", host);
	memcpy(w[v].uuid, uuid, sizeof(w[v].uuid));
	w[v].refusals = 1;
	w[v].last_ms = now_ms;
}

void rtrs_admit_waiter_forget(struct rtrs_admit_waiter *w, size_t n, const char *host,
			      const uint8_t uuid[16])
{
	for (size_t i = 0; i < n; i++)
		if (waiter_is(&w[i], host, uuid))
			w[i].refusals = 0;
}

/*
 * A path still to prove itself: not connected, and with authentication
 * on, its host not authenticated yet. These are what a peer can hold
 * without any key.
 */
static bool path_pending(const struct srv_path *p)
{
	return atomic_load(&p->base.state) == RTRS_PATH_CONNECTING &&
	       !(p->sess->ctx->auth_required && rtrs_srv_hs_host_proven(atomic_load(&p->hs)));
}

/*
 * How long a pending path may go without a step of its handshake before
 * admission may close it for a newcomer: a quarter of the handshake
 * timeout (1250 ms by default). A client connects one connection after
 * another, each a round trip, so a live one steps far more often.
 */
uint64_t srv_admit_stall_ms(const struct rtrs_srv_ctx *ctx)
{
	return MAX(ctx->opts.handshake_timeout_ms / 4, 20u);
}

/*
 * Whether p's handshake waits on the server: an authentication message of
 * its waits for an offload worker, or is being answered (a DH exchange;
 * srv_auth_recv stamps progress_ms before it submits the job, and
 * srv_auth_answer after each answer).
 */
static bool path_server_busy(struct srv_path *p)
{
	int st = atomic_load(&p->auth_job.state);

	return st == OFFLOAD_QUEUED || st == OFFLOAD_RUNNING;
}

/* What admission decided for a newcomer: the stalled paths to close once it is in. */
struct srv_admit {
	struct srv_path *victim[2];
	struct rtrs_admit_evict evict[2];
	int n;
	bool waited;                /* it was refused busy before: forgotten once in */
};

/*
 * Loop thread: room for one more pending path from host, as
 * rtrs_admit_decide says, into *a: the stalled paths it names are closed
 * only once the newcomer is admitted (pending_evict), so a refusal that
 * comes after this one costs nobody a place. -EBUSY when every pending
 * path in the scope is progressing.
 */
static int pending_admit(struct rtrs_srv_ctx *ctx, const char *host, const uint8_t uuid[16],
			 struct srv_admit *a)
{
	unsigned waits, most;
	const struct rtrs_admit_limits lim = {
		.max_total = ctx->opts.max_pending, .max_per_peer = ctx->opts.max_pending_per_peer,
	};
	struct rtrs_admit_entry *pending;
	struct srv_path **paths;
	uint64_t now = loop_now_ms(), stall = srv_admit_stall_ms(ctx);
	size_t n = 0;
	int rc;

	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		for (struct srv_path *p = s->paths; p; p = p->next)
			n += path_pending(p);
	pending = calloc(n + 1, sizeof(*pending));
	paths = calloc(n + 1, sizeof(*paths));
	if (!pending || !paths) {
		free(pending);
		free(paths);
		return -ENOMEM;
	}
	n = 0;
	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next) {
		for (struct srv_path *p = s->paths; p; p = p->next) {
			if (!path_pending(p))
				continue;
			/* Stamped on other threads too: it may be later than now. */
			uint64_t step = atomic_load(&p->progress_ms);

			pending[n] = (struct rtrs_admit_entry){
				.host = p->peer_host, .serial = p->serial,
				.stalled = now > step && now - step >= stall && !path_server_busy(p),
			};
			paths[n++] = p;
		}
	}
	rc = rtrs_admit_decide(pending, n, host, &lim, a->evict);
	rtrs_admit_waits(ctx->waiters, RTRS_ADMIT_WAITERS, host, uuid, now, &waits, &most);
	rc = rtrs_admit_queue(rc, waits, most);
	if (rc == -EBUSY)
		rtrs_admit_waiter_note(ctx->waiters, RTRS_ADMIT_WAITERS, host, uuid, now);
	a->n = rc < 0 ? 0 : rc;
	a->waited = rc >= 0 && waits;
	for (int i = 0; i < a->n; i++)
		a->victim[i] = paths[a->evict[i].idx];
	free(pending);
	free(paths);
	return rc < 0 ? rc : 0;
}

/* Loop thread: the newcomer pending_admit let in is in; the paths it made room from go. */
static void pending_evict(struct rtrs_srv_ctx *ctx, const char *host, const uint8_t uuid[16],
			  const struct srv_admit *a)
{
	uint64_t now = loop_now_ms();

	if (a->waited)
		rtrs_admit_waiter_forget(ctx->waiters, RTRS_ADMIT_WAITERS, host, uuid);
	for (int i = 0; i < a->n; i++) {
		struct srv_path *oldest = a->victim[i];

		log_warn("%s: closed to make room for a new connection from %s: no step of its "
			 "handshake for %llu ms (%u pending%s%s)", path_name(oldest), host,
			 (unsigned long long)(now - atomic_load(&oldest->progress_ms)),
			 a->evict[i].count, a->evict[i].per_peer ? " from " : " in all",
			 a->evict[i].per_peer ? host : "");
		atomic_fetch_add(&ctx->st.pending_evicted, 1);
		srv_path_stop(oldest, -ETIMEDOUT);
	}
}

/*
 * Loop thread: p's host has proven itself (srv_auth_answer stored the name
 * in held_host, then admit_asked, and queued admit_work), and admission by
 * that name has not decided yet: now. Run from the work, and before the
 * path's next connection request or information request is taken, which a
 * busy loop may serve before its queued work. A path proven but not connected
 * is no longer pending, but it may hold up to max_cons_per_path
 * connections until connect_timeout_ms, and make a session: a host with
 * a key holds at most max_sessions_per_peer of them, from whatever
 * addresses (what its sessions may hold connected: a storm of one host's
 * sessions, a reconnect after a server restart, meets this only at the
 * session limit; the per-address pending limit, 8, refused such storms
 * until their opens gave up) (rtrs_admit_held_decide: its oldest stalled one goes for the
 * newcomer, a progressing one never), and at most max_sessions_per_peer
 * sessions, those still in their handshake counted (srv_sessions_of). A
 * path refused keeps admit_err: its next connection request or its
 * information request is refused with it (no DNR: the client tries
 * again), and it is closed if it makes neither within a stall
 * (path_handshake_deadlines). Its address and uuid go to the waiters, so
 * that it is let in first when it comes back.
 */
void srv_held_admit(struct srv_path *p)
{
	struct srv_path *victim = NULL;
	struct rtrs_srv_sess *s = p->sess;
	struct rtrs_srv_ctx *ctx = s->ctx;
	struct rtrs_admit_entry *held;
	struct srv_path **paths;
	struct rtrs_admit_evict ev = { 0 };
	uint64_t now = loop_now_ms(), stall = srv_admit_stall_ms(ctx);
	const char *host = p->held_host;
	unsigned sessions = 0, mine = 0;
	size_t n = 0;
	int rc;

	if (!atomic_load(&p->admit_asked) || p->held || p->admit_err ||
	    atomic_load(&p->base.state) != RTRS_PATH_CONNECTING)
		return;
	for (struct rtrs_srv_sess *t = ctx->sessions; t; t = t->next)
		for (struct srv_path *q = t->paths; q; q = q->next)
			n += q->held && atomic_load(&q->base.state) == RTRS_PATH_CONNECTING;
	held = calloc(n + 1, sizeof(*held));
	paths = calloc(n + 1, sizeof(*paths));
	if (!held || !paths) {
		/* Refused like the others (its callers carry on with p), and tried again. */
		free(held);
		free(paths);
		p->admit_err = -ENOMEM;
		p->admit_err_ms = now;
		return;
	}
	n = 0;
	for (struct rtrs_srv_sess *t = ctx->sessions; t; t = t->next) {
		for (struct srv_path *q = t->paths; q; q = q->next) {
			if (!q->held || atomic_load(&q->base.state) != RTRS_PATH_CONNECTING)
				continue;
			uint64_t step = atomic_load(&q->progress_ms);

			held[n] = (struct rtrs_admit_entry){
				.host = q->held_host, .serial = q->serial,
				.stalled = now > step && now - step >= stall && !path_server_busy(q),
			};
			paths[n++] = q;
			mine += !strcmp(q->held_host, host);
		}
	}
	rc = rtrs_admit_held_decide(held, n, host, ctx->opts.max_sessions_per_peer, &ev);
	if (rc > 0)
		victim = paths[ev.idx];
	free(held);
	free(paths);
	/* A session still to be named takes one of its host's places now. */
	if (rc >= 0 && !s->name[0] && !sess_held_path(s, p)) {
		sessions = srv_sessions_of(ctx, host, s);
		if (sessions >= ctx->opts.max_sessions_per_peer)
			rc = -ENOSPC;
	}
	if (rc < 0) {
		p->admit_err = rc;
		p->admit_err_ms = now;
		atomic_fetch_add(&ctx->st.limit_refusals, 1);
		if (rc == -ENOSPC)
			log_rl(LOG_WARN, "%s: refused: host %s has %u sessions already, those in "
			       "their handshake counted (max_sessions_per_peer); the client may try "
			       "again", path_name(p), host, sessions);
		else
			log_rl(LOG_WARN, "%s: refused: host %s holds %u paths not connected yet, "
			       "none of them stalled (max_sessions_per_peer); the client tries again",
			       path_name(p), host, mine);
		rtrs_admit_waiter_note(ctx->waiters, RTRS_ADMIT_WAITERS, p->peer_host, p->uuid, now);
		return;
	}
	p->held = true;
	if (victim) {
		log_warn("%s: closed to make room for a new path of host %s: no step of its "
			 "handshake for %llu ms (%u paths of the host not connected)", path_name(victim),
			 host, (unsigned long long)(now - atomic_load(&victim->progress_ms)), ev.count);
		atomic_fetch_add(&ctx->st.pending_evicted, 1);
		srv_path_stop(victim, -ETIMEDOUT);
	}
}

void srv_held_admit_work(struct loop_work *w)
{
	struct srv_path *p = container_of(w, struct srv_path, admit_work);

	if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTING) {
		/* The reaper skipped this path while this item was queued. */
		loop_queue(p->sess->ctx->loop, &p->sess->ctx->reap_work);
		return;
	}
	srv_held_admit(p);
}

enum rtrs_takeover_verdict rtrs_takeover_decide(const struct rtrs_takeover_in *in)
{
	if (!in->held)
		return RTRS_TAKEOVER_PROCEED;
	if (!in->same_host)
		return RTRS_TAKEOVER_TAKEN;
	if (in->paths_up) {
		if (in->waited_ms < in->live_ms)
			return RTRS_TAKEOVER_WAIT;
		return in->silent ? RTRS_TAKEOVER_RETRY : RTRS_TAKEOVER_TAKEN;
	}
	return in->waited_ms >= in->drain_ms ? RTRS_TAKEOVER_RETRY : RTRS_TAKEOVER_WAIT;
}

/*
 * A server holds one path per uuid and creates the next only once the
 * last is freed (drained): a held path of another incarnation than the
 * fence names came after it, so the one named is gone.
 */
enum rtrs_fence_verdict rtrs_fence_decide(const struct rtrs_fence_in *in)
{
	if (!in->found || (in->recon >= 0 && in->recon != in->path_recon))
		return RTRS_FENCE_ACK;
	return in->self ? RTRS_FENCE_SELF : RTRS_FENCE_STOP;
}

struct rtrs_srv_sess *srv_name_holder(struct rtrs_srv_ctx *ctx, const struct rtrs_srv_sess *self,
				      const char *name)
{
	for (struct rtrs_srv_sess *s = ctx->sessions; s; s = s->next)
		if (s != self && !strcmp(s->name, name))
			return s;
	return NULL;
}

/*
 * Loop thread: refuses a path whose connections are up. The client gets err
 * (and whether retrying can help) in place of the info response; the path
 * closes a second later, or as soon as the client closes it. A kernel
 * client reads no verdict: as a kernel server does, the path closes.
 */
void srv_path_refuse(struct srv_path *p, int err, bool dnr)
{
	const char *why;

	if (!p->sess->ext || srv_hs_step(p, SRV_HS_EV_REFUSE, &why)) {
		srv_path_stop(p, err);
		return;
	}
	rtrs_info_rsp_encode_verdict(p->verdict, err, dnr);
	p->close_err = err;
	atomic_store(&p->close_at_ms, now_ms() + 1000);
	if (fab_send(p->cons[0].c.fc, p->verdict, sizeof(p->verdict), p->verdict_mr.desc, NULL))
		srv_path_stop(p, err);
}

/* "host:port" or "[v6]:port" to the host alone. */
void srv_peer_host_of(const char *peer, char *buf, size_t len)
{
	const char *colon = strrchr(peer, ':');
	size_t n = colon ? (size_t)(colon - peer) : strlen(peer);

	if (n >= 2 && peer[0] == '[' && peer[n - 1] == ']') {
		peer++;
		n -= 2;
	}
	snprintf(buf, len, "%.*s", (int)n, peer);
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
	loop_queue(v->ctx->loop, &v->ctx->srv_verdict_work);
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
void srv_verdicts_reap(struct rtrs_srv_ctx *ctx, bool all)
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

void srv_verdict_work(struct loop_work *w)
{
	srv_verdicts_reap(container_of(w, struct rtrs_srv_ctx, srv_verdict_work), false);
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
 * then stops), and then the refusal is held open until read. A kernel
 * client (ext false) gets the kernel's reject: 56 bytes, no flags.
 */
/*
 * The log's rate limit of a reason (a static string: every reason is
 * one): a flood of one kind of refusal (a peer that retries a bad
 * request, a storm past the pending limits) is counted, and does not hide
 * another kind.
 */
static struct log_ratelimit *reject_rl(const char *why)
{
	static struct {
		const char *why;
		struct log_ratelimit rl;
	} tab[64];
	static struct log_ratelimit other;
	static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	size_t h = ((uintptr_t)why >> 3) % 64;
	struct log_ratelimit *rl = &other;

	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < 64; i++, h = (h + 1) % 64) {
		if (!tab[h].why)
			tab[h].why = why;
		if (tab[h].why == why) {
			rl = &tab[h].rl;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return rl;
}

static void srv_reject_ext(struct rtrs_srv_ctx *ctx, struct fab_connreq *req, const char *peer,
			   int err, bool dnr, bool ext, const char *why)
{
	struct rtrs_conn_rsp rsp = { .err = err, .dnr = dnr && ext };
	struct rtrs_msg_conn_rsp msg;

	atomic_fetch_add(&ctx->st.rejects, 1);
	if (g_log_level >= LOG_WARN && log_ratelimit_ok(reject_rl(why)))
		log_msg(LOG_WARN, "connection from %s%s rejected: %s (%s%s)",
			ext ? "" : "kernel client ", peer, why, strerror(-err),
			rsp.dnr ? ", do not retry" : "");
	rtrs_conn_rsp_encode(&msg, &rsp);
	if (rsp.dnr && verdict_send(ctx, req, &msg))
		return;
	fab_reject(ctx->lst, req, &msg, sizeof(msg));
}

/* The same for a request that could not be read: whoever sent it, do not retry. */
static void srv_reject_dnr(struct rtrs_srv_ctx *ctx, struct fab_connreq *req, const char *peer,
			   int err, bool dnr, const char *why)
{
	srv_reject_ext(ctx, req, peer, err, dnr, true, why);
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

struct srv_path *srv_path_find(struct rtrs_srv_sess *s, const uint8_t *uuid)
{
	for (struct srv_path *p = s->paths; p; p = p->next)
		if (!memcmp(p->uuid, uuid, RTRS_UUID_LEN))
			return p;
	return NULL;
}

void srv_on_connreq(void *priv, struct fab_connreq *creq, const void *data, size_t len)
{
	struct rtrs_srv_ctx *ctx = priv;
	const struct fab_attr *a = fab_attr(ctx->fab);
	struct rtrs_conn_req req;
	struct rtrs_srv_sess *s;
	struct srv_path *p;
	struct srv_admit admit = { .n = 0 };
	const char *why = NULL;
	char peer[64], name[RTRS_NAME_MAX + 96], tls_host[RTRS_AUTH_WIRE_NAME], host[64];
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
	if (atomic_load(&rtrs_test_kernel_srv))
		req.ext = req.fence = req.auth = false; /* test hook: a kernel server's reading */
	if (req.cid_num > ctx->opts.max_cons_per_path) {
		srv_reject_ext(ctx, creq, peer, -EINVAL, true, req.ext,
			       "more connections per path than allowed");
		return;
	}
	/* TLS: a connection in the clear only where the server allows it. */
	fab_connreq_tls_host(creq, tls_host, sizeof(tls_host));
	if (req.concat) {
		why = ctx->opts.tls == RTRS_TLS_OFF ?
		      "a secure channel concatenation, and this server has no TLS" :
		      tls_host[0] ? "a secure channel concatenation inside TLS" :
		      !ctx->auth_required || !req.auth ?
		      "a secure channel concatenation without authentication" :
		      req.cid || req.cid_num != 1 || !req.first_conn ?
		      "a secure channel concatenation that is not a path's only connection" : NULL;
		if (why) {
			srv_reject_ext(ctx, creq, peer, ctx->opts.tls == RTRS_TLS_OFF ?
				       -EPROTONOSUPPORT : -EPROTO, true, req.ext, why);
			return;
		}
	} else if (ctx->opts.tls == RTRS_TLS_REQUIRED && !tls_host[0]) {
		srv_reject_ext(ctx, creq, peer, -EPROTONOSUPPORT, true, req.ext,
			       "a connection without TLS (this server requires it)");
		return;
	}
	if (ctx->auth_required && !req.auth) {
		srv_reject_ext(ctx, creq, peer, -EACCES, true, req.ext,
			       "authentication required and the client does not speak it");
		return;
	}
	if (!req.ext && ctx->opts.always_invalidate && !fab_attr(ctx->fab)->send_imm) {
		/*
		 * The kernel's always_invalidate sends each chunk's new key in a
		 * message with the response's immediate, which iWARP lacks (and
		 * the kernel's RTRS does not run on iWARP).
		 */
		srv_reject_ext(ctx, creq, peer, -EOPNOTSUPP, true, false,
			       "a kernel client, and always_invalidate toward it needs messages "
			       "with immediates, which this fabric has not (serve kernel clients "
			       "over RoCE or InfiniBand, or with always_invalidate off)");
		return;
	}
	s = sess_find(ctx, req.paths_uuid);
	if (s && s->ext != req.ext) {
		srv_reject_ext(ctx, creq, peer, -EINVAL, true, req.ext,
			       "its session's other paths speak another protocol (RTRS_CONN_EXT)");
		return;
	}
	if (!s) {
		if (!req.first_conn) {
			srv_reject_ext(ctx, creq, peer, -ENXIO, true, req.ext,
				       "unknown session and not a first connection");
			return;
		}
		rc = srv_sess_create(ctx, req.paths_uuid, req.ext, &s);
		if (rc) {
			srv_reject_ext(ctx, creq, peer, rc, false, req.ext,
				       "cannot create the session");
			return;
		}
	}
	p = srv_path_find(s, req.sess_uuid);
	if (!p && req.cid) {
		/*
		 * A path starts with its connection 0 (a kernel client waits
		 * for each connection before the next): a later one of a path
		 * unknown here belongs to one closed and reaped meanwhile, and
		 * taking it as a new path would let a peer open paths that
		 * never pass the pending limits. The client starts it anew.
		 */
		srv_reject_ext(ctx, creq, peer, -EAGAIN, false, req.ext,
			       "a later connection of a path unknown here; the client must start "
			       "it again");
		if (!s->paths)
			srv_sess_free(s);
		return;
	}
	if (!p) {
		/* Refusals that need no room first: nobody is closed for a newcomer refused. */
		if (s->paths_num >= RTRS_MAX_PATHS) {
			srv_reject_ext(ctx, creq, peer, -ECONNRESET, false, req.ext,
				       "too many paths in the session");
			return;
		}
		srv_peer_host_of(peer, host, sizeof(host));
		rc = pending_admit(ctx, host, req.sess_uuid, &admit);
		if (rc) {
			srv_reject_ext(ctx, creq, peer, rc, false, req.ext,
				       "too many connections still to prove themselves");
			if (!s->paths)
				srv_sess_free(s);
			return;
		}
		rc = srv_path_create(s, &req, peer, &p);
		if (rc) {
			srv_reject_ext(ctx, creq, peer, rc, false, req.ext, "cannot allocate the path");
			if (!s->paths)
				srv_sess_free(s);
			return;
		}
		if (req.concat) {
			/* Its one transaction must generate a TLS PSK (SC_C NEWTLSPSK). */
			p->concat = true;
			p->auth.scc = RTRS_AUTH_SCC_NEWTLSPSK;
		}
	} else if (req.cid == 0 && (atomic_load(&p->base.state) == RTRS_PATH_CONNECTED ||
				    p->cons[0].c.fc)) {
		/*
		 * The client starts this path again: it may have given up on
		 * the old one without our noticing yet, or this is somebody
		 * replaying its request. A connected path goes only if it has
		 * gone silent: it is probed (srv_path_probe). A handshake is
		 * superseded: the client restarts a path only after giving up
		 * on it, and only who saw its request knows its uuid. The
		 * client's next attempt finds it gone.
		 */
		srv_reject_ext(ctx, creq, peer, -EAGAIN, false, req.ext,
			       "the client reconnects a path still open here");
		if (atomic_load(&p->base.state) == RTRS_PATH_CONNECTED)
			srv_path_probe(p);
		else
			srv_path_stop(p, -ECONNRESET);
		return;
	} else if (atomic_load(&p->base.state) == RTRS_PATH_CLOSING ||
		   atomic_load(&p->base.state) == RTRS_PATH_CLOSED) {
		/*
		 * A later connection of a path closed here (its handshake
		 * stalled, a connection of it failed): gone once its last op
		 * is answered, and the client starts it anew after this.
		 */
		srv_reject_ext(ctx, creq, peer, -EAGAIN, false, req.ext,
			       "its path was closed here; the client must start it again");
		return;
	} else if (atomic_load(&p->base.state) != RTRS_PATH_CONNECTING || req.cid_num != p->base.nr_cons ||
		   p->cons[req.cid].c.fc) {
		srv_reject_ext(ctx, creq, peer, -EEXIST, false, req.ext,
			       "connection does not fit the path's state");
		/* A path stuck half-connected would refuse reconnects forever. */
		if (atomic_load(&p->base.state) == RTRS_PATH_CONNECTING &&
		    now_ms() - p->last_connreq_ms > p->sess->ctx->opts.connect_timeout_ms)
			srv_path_stop(p, -ETIMEDOUT);
		return;
	}
	if (req.cid)
		srv_held_admit(p);
	if (req.cid && p->admit_err) {
		/* Refused when its host proved itself (srv_held_admit); no DNR. */
		srv_reject_ext(ctx, creq, peer, p->admit_err, false, req.ext,
			       p->admit_err == -ENOSPC ?
			       "its host has as many sessions as it may (max_sessions_per_peer)" :
			       p->admit_err == -EBUSY ?
			       "its host holds as many paths not connected yet as it may "
			       "(max_sessions_per_peer)" : "cannot admit the path for its host");
		return;
	}
	if (req.cid && (rc = srv_hs_step(p, SRV_HS_EV_CONNREQ, &why))) {
		/* Only an authenticated host adds connections to its path. */
		srv_reject_ext(ctx, creq, peer, rc, false, req.ext, why);
		return;
	}
	/* TLS: every connection of a path is the host's that authenticated it. */
	if (!req.cid) {
		snprintf(p->tls_host, sizeof(p->tls_host), "%s", tls_host);
	} else if (strcmp(tls_host, p->tls_host)) {
		log_err("%s: connection %u's TLS key is host %s's, the path's host %s's", path_name(p),
			req.cid, tls_host[0] ? tls_host : "(none)", p->tls_host);
		srv_reject_ext(ctx, creq, peer, -EKEYREJECTED, true, req.ext,
			       "a TLS key of another host");
		return;
	}
	p->last_connreq_ms = now_ms();
	atomic_store(&p->progress_ms, loop_now_ms());
	if (!req.cid)
		p->sess_id_told = s->sess_id;

	/* For a kernel client the encoder leaves out everything of ours. */
	struct rtrs_conn_rsp rsp = {
		.ext = s->ext,
		.queue_depth = (uint16_t)s->queue_depth,
		.max_io_size = s->chunk_size - RTRS_MAX_HDR_SIZE,
		.max_hdr_size = RTRS_MAX_HDR_SIZE,
		.flags = RTRS_MSG_FENCE_F | (ctx->auth_required ? RTRS_MSG_AUTH_F : 0) |
			 (s->kinval ? RTRS_MSG_NEW_RKEY_F : s->inval ? RTRS_MSG_KEY64_F : 0),
		.imm_desc = { .addr = s->imm_mr.base, .key = s->imm_mr.key, .len = RTRS_IMM_REGION },
		.sess_id = s->sess_id,
	};
	struct rtrs_msg_conn_rsp msg;
	struct fab_con_cfg cfg = {
		.ops = &srv_con_ops, .priv = &p->cons[req.cid].c, .name = name,
		.tx_depth = s->queue_depth + 16,
		/* verbs: every incoming immediate takes a receive, admin IO too */
		.rx_depth = a->rx_cq_data ? s->queue_depth + 16 :
			    req.cid ? 0 : RTRS_ADMIN_RX_DEPTH,
		.rx_size = req.cid ? 0 : RTRS_ADMIN_MSG_SIZE,
		.poll_us = req.cid ? ctx->opts.busy_poll_us : 0,
		.live_ms = rtrs_live_ms(ctx->opts.hb_interval_ms, ctx->opts.hb_missed_max),
	};

	snprintf(name, sizeof(name), "%s#%u", path_name(p), req.cid);
	/* Allocated as connections come, not for all those the request announces. */
	if (!p->cons[req.cid].sg_scratch) {
		p->cons[req.cid].sg_scratch = calloc(RTRS_MAX_READ_SG, sizeof(struct rtrs_desc));
		if (!p->cons[req.cid].sg_scratch) {
			srv_reject_ext(ctx, creq, peer, -ENOMEM, false, req.ext,
				       "cannot allocate the connection");
			srv_path_stop(p, -ENOMEM);
			return;
		}
	}
	rtrs_conn_rsp_encode(&msg, &rsp);
	rc = fab_con_accept(ctx->fab, creq, &cfg, &msg, sizeof(msg), &p->cons[req.cid].c.fc);
	if (rc) {
		log_err("%s: accepting connection %u failed: %s", path_name(p), req.cid, strerror(-rc));
		srv_reject_ext(ctx, creq, peer, rc, false, req.ext, "cannot set up the connection");
		srv_path_stop(p, rc);
		return;
	}
	if (!req.cid)
		fab_con_local(p->cons[0].c.fc, p->local, sizeof(p->local));
	p->nr_accepted++;
	/* A new path is in: the stalled paths admission made room from go now. */
	if (admit.n || admit.waited)
		pending_evict(ctx, host, req.sess_uuid, &admit);
}
