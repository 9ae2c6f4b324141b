/* SPDX-License-Identifier: MIT */
/*
 * Rate limits: token buckets per session, host or device name, and the thread
 * that lets queued IO go (rnbd-qos.h; docs/rnbd.md section 2.7).
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rnbd-export.h"
#include "rnbd-path.h"
#include "rnbd-qos.h"
#include "util.h"

#define QOS_NAME_MAX 255

STAILQ_HEAD(qos_queue, rnbd_qos_item);

struct rnbd_qos {
	LIST_ENTRY(rnbd_qos) link;   /* ctx->groups */
	enum rnbd_qos_kind kind;
	char name[QOS_NAME_MAX + 1];
	atomic_bool active;          /* a limit is set */
	/* ctx->lock */
	struct rnbd_qos_bucket b[RNBD_QOS_NR];
	uint64_t last_ns;            /* buckets refilled up to */
	/*
	 * IO this group holds back, oldest first: reads [0] and writes [1]
	 * apart, their heads served in the order of their seq (rnbd-qos.h).
	 */
	struct qos_queue queue[2];
	uint64_t delayed, queued, wait_ns;
};

struct rnbd_qos_ctx {
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* work: a queue, a drop, a new rate, the stop */
	LIST_HEAD(, rnbd_qos) groups;
	struct qos_queue dropped;    /* dispatched with -ENOTCONN */
	unsigned nr_queued;          /* in a group's queue or dropped, not yet dispatched */
	uint64_t seq;                /* of the last item queued */
	bool stop;
	pthread_t thread;
	rnbd_qos_dispatch_fn dispatch;
};

/* ---- buckets (pure) ----------------------------------------------------------- */

double rnbd_qos_burst(uint64_t rate)
{
	double b = (double)rate / 10;

	return b < 1 ? 1 : b;
}

void rnbd_qos_refill(struct rnbd_qos_bucket *b, uint64_t dt_ns)
{
	double burst;

	if (!b->rate)
		return;
	burst = rnbd_qos_burst(b->rate);
	b->tokens += (double)b->rate * (double)dt_ns / 1e9;
	if (b->tokens > burst)
		b->tokens = burst;
}

static double qos_need(const struct rnbd_qos_bucket *b, uint64_t amount)
{
	double burst = rnbd_qos_burst(b->rate);

	return (double)amount < burst ? (double)amount : burst;
}

bool rnbd_qos_can(const struct rnbd_qos_bucket *b, uint64_t amount)
{
	return !b->rate || !amount || b->tokens >= qos_need(b, amount);
}

uint64_t rnbd_qos_wait_ns(const struct rnbd_qos_bucket *b, uint64_t amount)
{
	if (rnbd_qos_can(b, amount))
		return 0;
	return (uint64_t)((qos_need(b, amount) - b->tokens) * 1e9 / (double)b->rate) + 1;
}

/* ---- groups ------------------------------------------------------------------- */

/* The amounts an item takes from each of a group's buckets. */
static void qos_amounts(const struct rnbd_qos_item *it, uint64_t a[RNBD_QOS_NR])
{
	a[RNBD_QOS_IOPS] = 1;
	a[RNBD_QOS_READ_IOPS] = it->read;
	a[RNBD_QOS_WRITE_IOPS] = !it->read;
	a[RNBD_QOS_BPS] = it->bytes;
	a[RNBD_QOS_READ_BPS] = it->read ? it->bytes : 0;
	a[RNBD_QOS_WRITE_BPS] = it->read ? 0 : it->bytes;
}

static void qos_refill(struct rnbd_qos *g, uint64_t now)
{
	if (now <= g->last_ns)
		return; /* read before another thread's refill: nothing more yet */
	for (int i = 0; i < RNBD_QOS_NR; i++)
		rnbd_qos_refill(&g->b[i], now - g->last_ns);
	g->last_ns = now;
}

/* ns until g has tokens for it (0: now). */
static uint64_t qos_wait(const struct rnbd_qos *g, const struct rnbd_qos_item *it)
{
	uint64_t a[RNBD_QOS_NR], w = 0;

	qos_amounts(it, a);
	for (int i = 0; i < RNBD_QOS_NR; i++)
		w = MAX(w, rnbd_qos_wait_ns(&g->b[i], a[i]));
	return w;
}

static void qos_take(struct rnbd_qos *g, const struct rnbd_qos_item *it)
{
	uint64_t a[RNBD_QOS_NR];

	qos_amounts(it, a);
	for (int i = 0; i < RNBD_QOS_NR; i++)
		if (g->b[i].rate)
			g->b[i].tokens -= (double)a[i];
}

static bool qos_live(const struct rnbd_qos *g)
{
	return g && atomic_load_explicit(&g->active, memory_order_relaxed);
}

/* The buckets both directions take from; the others are one direction's. */
#define QOS_SHARED (1u << RNBD_QOS_IOPS | 1u << RNBD_QOS_BPS)

/* The shared buckets of g that it takes from (a mask of 1 << bucket). */
static unsigned qos_shared_needs(const struct rnbd_qos *g, const struct rnbd_qos_item *it)
{
	uint64_t a[RNBD_QOS_NR];
	unsigned m = 0;

	qos_amounts(it, a);
	for (int i = 0; i < RNBD_QOS_NR; i++)
		if ((QOS_SHARED & 1u << i) && g->b[i].rate && a[i])
			m |= 1u << i;
	return m;
}

/*
 * The shared buckets of g that the head of one of its queues claims: every
 * one it takes from, unless a bucket of its own direction holds it (then
 * none: the other direction goes meanwhile). While it waits nothing else
 * takes from its direction's buckets (the rest of its direction is behind
 * it), so once it claims, it goes as soon as the claimed buckets fill.
 */
static unsigned qos_claims(const struct rnbd_qos *g, const struct rnbd_qos_item *head)
{
	uint64_t a[RNBD_QOS_NR];

	if (!head)
		return 0;
	qos_amounts(head, a);
	for (int i = 0; i < RNBD_QOS_NR; i++)
		if (!(QOS_SHARED & 1u << i) && !rnbd_qos_can(&g->b[i], a[i]))
			return 0;
	return qos_shared_needs(g, head);
}

/* Its queue of a group: reads [0], writes [1]. */
static int qos_dir(const struct rnbd_qos_item *it)
{
	return it->read ? 0 : 1;
}

/*
 * Locked, g refilled: must a new item wait at g? Behind what waits of its
 * direction; behind the other direction's head when that claims a shared
 * bucket the item takes from; and for its tokens.
 */
static bool qos_held(const struct rnbd_qos *g, const struct rnbd_qos_item *it)
{
	int d = qos_dir(it);

	return !STAILQ_EMPTY(&g->queue[d]) ||
	       (qos_claims(g, STAILQ_FIRST(&g->queue[!d])) & qos_shared_needs(g, it)) ||
	       qos_wait(g, it);
}

static void qos_enqueue(struct rnbd_qos_ctx *ctx, struct rnbd_qos *g, struct rnbd_qos_item *it,
			unsigned stage, uint64_t now)
{
	it->stage = stage;
	it->seq = ++ctx->seq;
	it->queued_ns = now;
	STAILQ_INSERT_TAIL(&g->queue[qos_dir(it)], it, link);
	g->delayed++;
	g->queued++;
}

/*
 * Locked: it passes its groups from g[stage] on, taking their tokens, until
 * one holds it (queued there: false) or none is left (true: it may go).
 * Once the context stops, nothing holds it.
 */
static bool qos_pass(struct rnbd_qos_ctx *ctx, struct rnbd_qos_item *it, unsigned stage,
		     uint64_t now)
{
	for (; stage < RNBD_QOS_STAGES; stage++) {
		struct rnbd_qos *g = it->g[stage];

		if (!qos_live(g))
			continue;
		qos_refill(g, now);
		if (!ctx->stop && qos_held(g, it)) {
			qos_enqueue(ctx, g, it, stage, now);
			return false;
		}
		qos_take(g, it);
	}
	return true;
}

bool rnbd_qos_admit(struct rnbd_qos_ctx *ctx, struct rnbd_qos_item *it)
{
	bool go;

	pthread_mutex_lock(&ctx->lock);
	go = qos_pass(ctx, it, 0, now_ns());
	if (!go && (ctx->nr_queued++ == 0 ||
		    STAILQ_FIRST(&it->g[it->stage]->queue[qos_dir(it)]) == it))
		pthread_cond_signal(&ctx->cond); /* a new head: the thread's wait may change */
	pthread_mutex_unlock(&ctx->lock);
	return go;
}

void rnbd_qos_drop(struct rnbd_qos_ctx *ctx, const void *owner, const void *dev)
{
	struct rnbd_qos *g;
	bool any = false;

	pthread_mutex_lock(&ctx->lock);
	LIST_FOREACH(g, &ctx->groups, link) {
		for (int d = 0; d < 2; d++) {
			struct qos_queue keep = STAILQ_HEAD_INITIALIZER(keep);
			struct rnbd_qos_item *it;

			while ((it = STAILQ_FIRST(&g->queue[d]))) {
				STAILQ_REMOVE_HEAD(&g->queue[d], link);
				if (it->owner == owner && (!dev || it->dev == dev)) {
					g->queued--;
					STAILQ_INSERT_TAIL(&ctx->dropped, it, link);
					any = true;
				} else {
					STAILQ_INSERT_TAIL(&keep, it, link);
				}
			}
			STAILQ_CONCAT(&g->queue[d], &keep);
		}
	}
	if (any)
		pthread_cond_signal(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
}

/*
 * Locked: the heads of g's queues pass g while they may, the older head
 * first; the younger passes before it only when the older claims no shared
 * bucket the younger takes from. What has passed every group of it goes on
 * go; what has passed g but not its later groups queues at the next that
 * holds it.
 * Returns whether anything passed; *next: the least wait of a head that
 * waits for tokens.
 */
static bool qos_serve(struct rnbd_qos_ctx *ctx, struct rnbd_qos *g, uint64_t now,
		      struct qos_queue *go, uint64_t *next)
{
	bool moved = false;

	qos_refill(g, now);
	for (;;) {
		struct rnbd_qos_item *h[2] = { STAILQ_FIRST(&g->queue[0]),
					       STAILQ_FIRST(&g->queue[1]) }, *it = NULL;
		int old = !h[0] || (h[1] && h[1]->seq < h[0]->seq), d = old;

		for (int k = 0; k < 2 && !it; k++) {
			uint64_t w;

			d = old ^ k;
			if (!h[d])
				continue;
			if (k && !ctx->stop && (qos_claims(g, h[old]) & qos_shared_needs(g, h[d])))
				break; /* behind the older head, which wakes the thread */
			/* A limit lifted meanwhile lets it go now. */
			w = ctx->stop ? 0 : qos_wait(g, h[d]);
			if (w)
				*next = MIN(*next, w);
			else
				it = h[d];
		}
		if (!it)
			return moved;
		STAILQ_REMOVE_HEAD(&g->queue[d], link);
		qos_take(g, it);
		g->queued--;
		g->wait_ns += now - it->queued_ns;
		moved = true;
		if (qos_pass(ctx, it, it->stage + 1, now)) {
			ctx->nr_queued--;
			STAILQ_INSERT_TAIL(go, it, link);
		}
	}
}

/*
 * The thread: what may go, goes (the dispatch callback, without the
 * lock); then it sleeps until the first head has its tokens, or until
 * something changes.
 */
static void *qos_thread(void *arg)
{
	struct rnbd_qos_ctx *ctx = arg;

	pthread_setname_np(pthread_self(), "rnbd-qos");
	pthread_mutex_lock(&ctx->lock);
	while (!ctx->stop || ctx->nr_queued || !STAILQ_EMPTY(&ctx->dropped)) {
		struct qos_queue go = STAILQ_HEAD_INITIALIZER(go);
		struct qos_queue drop = STAILQ_HEAD_INITIALIZER(drop);
		uint64_t now = now_ns(), next = UINT64_MAX;
		struct rnbd_qos_item *it;
		struct rnbd_qos *g;
		bool moved = false;

		STAILQ_CONCAT(&drop, &ctx->dropped);
		LIST_FOREACH(g, &ctx->groups, link)
			moved |= qos_serve(ctx, g, now, &go, &next);
		if (!STAILQ_EMPTY(&go) || !STAILQ_EMPTY(&drop)) {
			pthread_mutex_unlock(&ctx->lock);
			while ((it = STAILQ_FIRST(&go))) {
				STAILQ_REMOVE_HEAD(&go, link);
				ctx->dispatch(it, 0);
			}
			while ((it = STAILQ_FIRST(&drop))) {
				STAILQ_REMOVE_HEAD(&drop, link);
				pthread_mutex_lock(&ctx->lock);
				ctx->nr_queued--;
				pthread_mutex_unlock(&ctx->lock);
				ctx->dispatch(it, -ENOTCONN);
			}
			pthread_mutex_lock(&ctx->lock);
			continue;
		}
		if (moved)
			continue; /* queued at a later group: served from the top */
		if (next == UINT64_MAX) {
			pthread_cond_wait(&ctx->cond, &ctx->lock);
		} else {
			struct timespec t;

			clock_gettime(CLOCK_MONOTONIC, &t);
			next += (uint64_t)t.tv_nsec;
			t.tv_sec += (time_t)(next / 1000000000u);
			t.tv_nsec = (long)(next % 1000000000u);
			pthread_cond_timedwait(&ctx->cond, &ctx->lock, &t);
		}
	}
	pthread_mutex_unlock(&ctx->lock);
	return NULL;
}

int rnbd_qos_ctx_open(rnbd_qos_dispatch_fn dispatch, struct rnbd_qos_ctx **out)
{
	struct rnbd_qos_ctx *ctx = calloc(1, sizeof(*ctx));
	pthread_condattr_t ca;
	int rc;

	if (!ctx)
		return -ENOMEM;
	ctx->dispatch = dispatch;
	LIST_INIT(&ctx->groups);
	STAILQ_INIT(&ctx->dropped);
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&ctx->cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = -pthread_create(&ctx->thread, NULL, qos_thread, ctx);
	if (rc) {
		pthread_cond_destroy(&ctx->cond);
		pthread_mutex_destroy(&ctx->lock);
		free(ctx);
		return rc;
	}
	*out = ctx;
	return 0;
}

void rnbd_qos_ctx_close(struct rnbd_qos_ctx *ctx)
{
	struct rnbd_qos *g;

	if (!ctx)
		return;
	pthread_mutex_lock(&ctx->lock);
	ctx->stop = true;
	pthread_cond_signal(&ctx->cond);
	pthread_mutex_unlock(&ctx->lock);
	pthread_join(ctx->thread, NULL);
	while ((g = LIST_FIRST(&ctx->groups))) {
		LIST_REMOVE(g, link);
		free(g);
	}
	pthread_cond_destroy(&ctx->cond);
	pthread_mutex_destroy(&ctx->lock);
	free(ctx);
}

static struct rnbd_qos *qos_find_locked(struct rnbd_qos_ctx *ctx, enum rnbd_qos_kind kind,
					const char *name)
{
	struct rnbd_qos *g;

	LIST_FOREACH(g, &ctx->groups, link)
		if (g->kind == kind && !strcmp(g->name, name))
			return g;
	return NULL;
}

struct rnbd_qos *rnbd_qos_find(struct rnbd_qos_ctx *ctx, enum rnbd_qos_kind kind,
			       const char *name)
{
	struct rnbd_qos *g;

	pthread_mutex_lock(&ctx->lock);
	g = qos_find_locked(ctx, kind, name);
	pthread_mutex_unlock(&ctx->lock);
	return g;
}

int rnbd_qos_set(struct rnbd_qos_ctx *ctx, enum rnbd_qos_kind kind, const char *name,
		 const struct rnbd_qos_limits *l, struct rnbd_qos **out)
{
	const uint64_t rates[RNBD_QOS_NR] = { l->iops, l->read_iops, l->write_iops,
					      l->bps, l->read_bps, l->write_bps };
	struct rnbd_qos *g;
	bool active = false;

	if (!name[0] || strlen(name) > QOS_NAME_MAX ||
	    (kind != RNBD_QOS_SESSION && kind != RNBD_QOS_DEVICE && kind != RNBD_QOS_HOST))
		return -EINVAL;
	pthread_mutex_lock(&ctx->lock);
	g = qos_find_locked(ctx, kind, name);
	if (!g) {
		g = calloc(1, sizeof(*g));
		if (!g) {
			pthread_mutex_unlock(&ctx->lock);
			return -ENOMEM;
		}
		g->kind = kind;
		snprintf(g->name, sizeof(g->name), "%s", name);
		STAILQ_INIT(&g->queue[0]);
		STAILQ_INIT(&g->queue[1]);
		g->last_ns = now_ns();
		LIST_INSERT_HEAD(&ctx->groups, g, link);
	}
	qos_refill(g, now_ns());
	for (int i = 0; i < RNBD_QOS_NR; i++) {
		if (g->b[i].rate != rates[i])
			g->b[i].tokens = rnbd_qos_burst(rates[i]); /* a new rate starts full */
		g->b[i].rate = rates[i];
		active |= rates[i] != 0;
	}
	atomic_store(&g->active, active);
	pthread_cond_signal(&ctx->cond); /* what waits may go at the new rate */
	pthread_mutex_unlock(&ctx->lock);
	if (out)
		*out = g;
	return 0;
}

bool rnbd_qos_active(const struct rnbd_qos *g)
{
	return qos_live(g);
}

void rnbd_qos_get(struct rnbd_qos_ctx *ctx, const struct rnbd_qos *g, struct rnbd_qos_limits *l,
		  struct rnbd_qos_stats *st)
{
	pthread_mutex_lock(&ctx->lock);
	if (l) {
		l->iops = g->b[RNBD_QOS_IOPS].rate;
		l->read_iops = g->b[RNBD_QOS_READ_IOPS].rate;
		l->write_iops = g->b[RNBD_QOS_WRITE_IOPS].rate;
		l->bps = g->b[RNBD_QOS_BPS].rate;
		l->read_bps = g->b[RNBD_QOS_READ_BPS].rate;
		l->write_bps = g->b[RNBD_QOS_WRITE_BPS].rate;
	}
	if (st) {
		st->delayed = g->delayed;
		st->queued = g->queued;
		st->wait_us = g->wait_ns / 1000;
	}
	pthread_mutex_unlock(&ctx->lock);
}

/* ---- the spec of a limit ------------------------------------------------------ */

RNBD_EXPORT
int rnbd_qos_parse(const char *spec, enum rnbd_qos_kind *kind, char *name, size_t namelen,
		   struct rnbd_qos_limits *l, const char **why)
{
	static const struct { const char *key; size_t off; bool bytes; } keys[] = {
		{ "iops", offsetof(struct rnbd_qos_limits, iops), false },
		{ "read_iops", offsetof(struct rnbd_qos_limits, read_iops), false },
		{ "write_iops", offsetof(struct rnbd_qos_limits, write_iops), false },
		{ "bps", offsetof(struct rnbd_qos_limits, bps), true },
		{ "read_bps", offsetof(struct rnbd_qos_limits, read_bps), true },
		{ "write_bps", offsetof(struct rnbd_qos_limits, write_bps), true },
	};
	const char *c1 = strchr(spec, ':'), *c2 = strrchr(spec, ':'), *p;
	unsigned seen = 0;
	size_t n;

	*l = (struct rnbd_qos_limits){ .size = sizeof(*l) };
	if (!c1 || c1 == c2) {
		*why = "not KIND:NAME:LIMITS (session:hv1:iops=2000, host:NQN:bps=1G)";
		return -EINVAL;
	}
	if ((size_t)(c1 - spec) == 7 && !strncmp(spec, "session", 7)) {
		*kind = RNBD_QOS_SESSION;
	} else if ((size_t)(c1 - spec) == 6 && !strncmp(spec, "device", 6)) {
		*kind = RNBD_QOS_DEVICE;
	} else if ((size_t)(c1 - spec) == 4 && !strncmp(spec, "host", 4)) {
		*kind = RNBD_QOS_HOST;
	} else {
		*why = "the kind is not session, host or device";
		return -EINVAL;
	}
	n = (size_t)(c2 - c1 - 1);
	if (!n || n > QOS_NAME_MAX || n >= namelen) {
		*why = n ? "a name longer than 255 bytes" : "an empty name";
		return -EINVAL;
	}
	memcpy(name, c1 + 1, n);
	name[n] = '\0';
	if (*kind == RNBD_QOS_DEVICE) {
		/* As the server keeps device names: "/vm//a/" is "vm/a". */
		rnbd_dev_name_normalize(name);
		if (!name[0]) {
			*why = "a device name of slashes only";
			return -EINVAL;
		}
	}
	for (p = c2 + 1;;) {
		const char *comma = strchr(p, ','), *eq = strchr(p, '=');
		size_t flen = comma ? (size_t)(comma - p) : strlen(p), k;
		char val[32];
		uint64_t v;

		if (!eq || (size_t)(eq - p) >= flen) {
			*why = "a limit is not KEY=VALUE (iops, read_iops, write_iops, bps, "
			       "read_bps, write_bps)";
			return -EINVAL;
		}
		for (k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
			if (strlen(keys[k].key) == (size_t)(eq - p) &&
			    !strncmp(p, keys[k].key, (size_t)(eq - p)))
				break;
		if (k == sizeof(keys) / sizeof(keys[0])) {
			*why = "an unknown limit (iops, read_iops, write_iops, bps, read_bps, "
			       "write_bps)";
			return -EINVAL;
		}
		if (seen & 1u << k) {
			*why = "a limit given twice";
			return -EINVAL;
		}
		seen |= 1u << k;
		n = flen - (size_t)(eq + 1 - p);
		if (!n || n >= sizeof(val)) {
			*why = "a limit without a value, or one too long";
			return -EINVAL;
		}
		memcpy(val, eq + 1, n);
		val[n] = '\0';
		if ((keys[k].bytes ? parse_size(val, 0, 1ull << 50, &v) :
				     parse_u64(val, 0, 100000000, &v))) {
			*why = keys[k].bytes ? "a byte rate that is not a size up to 1024T (100M, 2G)" :
					       "an IO rate that is not a number up to 100000000";
			return -EINVAL;
		}
		*(uint64_t *)((char *)l + keys[k].off) = v;
		if (!comma)
			break;
		p = comma + 1;
	}
	return 0;
}
