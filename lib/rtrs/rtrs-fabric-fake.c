/* SPDX-License-Identifier: MIT */
/*
 * The fake fabric (rtrs-fabric-fake.h): the fabric layer in memory, driven
 * step by step by the unit tests.
 *
 * One lock (net.lock) guards everything here: the domains, listeners,
 * connections, registrations and the event queue. It is never held while
 * an owner's callback runs, so callbacks may post, register and shut
 * connections down as they do over libfabric. net.cond is broadcast
 * whenever anything changes, and when a service loop goes idle, so that
 * every wait of a test re-checks what it waits for.
 *
 * Delivery (ev_run) is the one place events take effect; it runs on the
 * pump thread for the events a test does not hold, and on the test's
 * thread for those it delivers itself (fake_deliver).
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"
#include "rtrs-fabric-fake.h"
#include "util.h"

#define FAKE_CM_DATA_MAX 56   /* connection data: as much as verbs carries */
#define FAKE_INJECT_SIZE 64
#define FAKE_KEY64_MIN (1ull << 32)
#define FAKE_PORT_MIN 20000

/* Takes obj out of the NULL-terminated list at *head, chained through its `next`. */
#define LIST_DEL(head, obj)                                                   \
	do {                                                                  \
		for (__typeof__(obj) *pp_ = (head); *pp_; pp_ = &(*pp_)->next) { \
			if (*pp_ == (obj)) {                                  \
				*pp_ = (obj)->next;                           \
				break;                                        \
			}                                                     \
		}                                                             \
	} while (0)

/* A delivered event, for fake_delivered: without its payload beyond the first bytes. */
struct fake_rec {
	struct fake_ev ev;
	uint8_t head[32];
};

struct fake_mr {
	struct fake_mr *next;
	char *buf;
	size_t len;
	unsigned access;
	uint64_t key;
};

struct fab {
	const struct fab_ops *ops;     /* first: struct fab_obj */
	struct fab *next;
	struct fab_attr attr;
	bool server;
	char node[64], service[16], src[64];
	uint64_t next_key, next_key64;
	struct fake_mr *mrs;
};

struct fab_connreq {
	const struct fab_ops *ops;
	struct fab_connreq *next;
	struct fab_con *clt;           /* the end that asked; NULL once it is gone */
	void *data;
	size_t len;
	bool answered;
	char peer[96];
};

struct fab_lst {
	const struct fab_ops *ops;
	struct fab_lst *next;
	struct fab *fab;
	int fd;                        /* eventfd: readable while requests wait */
	int port;
	struct fab_connreq *inbox, *inbox_tail;
	struct fab_connreq *current;   /* handed to the owner's callback now */
};

struct fab_con {
	const struct fab_ops *ops;
	struct fab_con *next;
	struct fab *fab;
	struct fab_con_cfg cfg;
	char name[96];
	bool server;
	char sess[64], host[64];       /* the client end's, at both ends */
	int cid;
	unsigned serial;
	struct fab_con *peer;          /* the other end, while both exist */
	bool shutdown;                 /* by its owner: no callback any more */
	bool down;                     /* down() ran: nothing else runs */
	bool failed;                   /* cut (fake_fail, a bad write): data to and from it is lost */
	bool peer_told;                /* the peer has its DOWN for our going away */
	bool in_cb;                    /* a callback of ours runs on cb_thread */
	pthread_t cb_thread;
	bool kick_queued, retry;
	unsigned tx_out, tx_max;       /* writes posted and not delivered */
	unsigned eagain;               /* writes still to refuse (fake_eagain) */
	char *rx_buf;
	size_t rx_count, rx_size, rx_next;
	unsigned blocked_gen;          /* the pump's scan: an earlier event for us waits */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool ready;
	struct fab *fabs;
	struct fab_lst *lsts;
	struct fab_con *cons;
	struct fake_ev *head, *tail;   /* the queue, in posting order */
	struct fake_ev *zombies;       /* claimed events whose connection went away */
	uint64_t seq;
	unsigned serial;
	int next_port;
	size_t iov_limit, rma_iov_limit;
	fake_pred hold;
	void *hold_arg;
	fake_pred hook_pred;
	void *hook_pred_arg;
	void (*hook_fn)(struct fake_ev *ev, void *arg);
	void *hook_arg;
	pthread_t pump;
	bool pump_started, pump_stop, pump_busy;
	unsigned scan_gen;
	struct fake_stats st;
	struct fake_rec *recs;         /* what was delivered (fake_delivered) */
	size_t nr_recs, cap_recs;
} net = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.next_port = FAKE_PORT_MIN,
	.iov_limit = 4,
	.rma_iov_limit = 4,
};

static const char *const kind_names[] = {
	[FAKE_CONNREQ] = "connreq", [FAKE_ACCEPT] = "accept", [FAKE_ESTABLISHED] = "established",
	[FAKE_REJECT] = "reject", [FAKE_WRITE] = "write", [FAKE_SEND] = "send",
	[FAKE_DONE] = "done", [FAKE_DOWN] = "down", [FAKE_KICK] = "kick",
};

/*
 * The fake's lock, and its log lines: a line logged under the lock waits
 * until the lock is released, since a test's log sink may call
 * fake_notify(), which takes it.
 */
static __thread bool tl_locked;
static __thread unsigned tl_nlines;
static __thread char tl_lines[4][240];
static __thread enum log_level tl_levels[4];

static void net_lock(void)
{
	pthread_mutex_lock(&net.lock);
	tl_locked = true;
}

static void net_unlock(void)
{
	unsigned n = tl_nlines;

	tl_locked = false;
	tl_nlines = 0;
	pthread_mutex_unlock(&net.lock);
	for (unsigned i = 0; i < n; i++)
		log_at(tl_levels[i], "%s", tl_lines[i]);
}

static void flog(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void flog(enum log_level lvl, const char *fmt, ...)
{
	char line[240];
	va_list ap;

	if ((int)lvl > g_log_level)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (!tl_locked) {
		log_at(lvl, "%s", line);
		return;
	}
	if (tl_nlines == ARRAY_SIZE(tl_lines)) /* more than fit: the last one says so */
		snprintf(tl_lines[tl_nlines - 1], sizeof(tl_lines[0]), "fake: more lines lost");
	else {
		tl_levels[tl_nlines] = lvl;
		memcpy(tl_lines[tl_nlines++], line, sizeof(line));
	}
}

static struct timespec wait_deadline(void)
{
	return deadline_ms(FAKE_WAIT_MS);
}

/* ---- events (net.lock held) ------------------------------------------------------- */

static void ev_unlink(struct fake_ev *ev)
{
	if (!ev->queued)
		return;
	if (ev->prev)
		ev->prev->next = ev->next;
	else
		net.head = ev->next;
	if (ev->next)
		ev->next->prev = ev->prev;
	else
		net.tail = ev->prev;
	ev->prev = ev->next = NULL;
	ev->queued = false;
}

static void ev_free(struct fake_ev *ev)
{
	free(ev->buf);
	free(ev);
}

/*
 * A new event for connection to (its callback runs there), posted by from
 * (NULL: the fabric). The names of the client end go with it, so that a
 * test can tell the event after its connections are gone.
 */
static struct fake_ev *ev_new(enum fake_ev_kind kind, struct fab_con *to, struct fab_con *from)
{
	struct fake_ev *ev = calloc(1, sizeof(*ev));
	const struct fab_con *c = to ? to : from;

	if (!ev)
		return NULL;
	ev->kind = kind;
	ev->to = to;
	ev->from = from;
	ev->cid = -1;
	if (c) {
		memcpy(ev->sess, c->sess, sizeof(ev->sess));
		memcpy(ev->host, c->host, sizeof(ev->host));
		ev->cid = c->cid;
		ev->to_server = to ? to->server : true;
	}
	return ev;
}

static void ev_queue(struct fake_ev *ev)
{
	ev->seq = ++net.seq;
	ev->queued = true;
	ev->prev = net.tail;
	ev->next = NULL;
	if (net.tail)
		net.tail->next = ev;
	else
		net.head = ev;
	net.tail = ev;
	pthread_cond_broadcast(&net.cond);
}

/* Copies len bytes of data into ev. */
static int ev_set_data(struct fake_ev *ev, const void *data, size_t len)
{
	if (!len)
		return 0;
	ev->buf = malloc(len);
	if (!ev->buf)
		return -ENOMEM;
	memcpy(ev->buf, data, len);
	ev->data = ev->buf;
	ev->len = len;
	return 0;
}

/* A fabric event for c (down, kick, reject...); ENOMEM only loses it, logged. */
static struct fake_ev *ev_post_local(enum fake_ev_kind kind, struct fab_con *c, int err,
				     const void *data, size_t len)
{
	struct fake_ev *ev = ev_new(kind, c, NULL);

	if (!ev || ev_set_data(ev, data, len)) {
		flog(LOG_ERR, "fake: %s: no memory for a %s event", c->name, kind_names[kind]);
		free(ev);
		return NULL;
	}
	ev->err = err;
	if (kind == FAKE_KICK)
		c->kick_queued = true;
	ev_queue(ev);
	return ev;
}

/*
 * A write that will not be delivered, or has been, gives its send-queue
 * slot back: a completion, after which the owner's retry may find room.
 */
static void ev_uncount(struct fake_ev *ev)
{
	struct fab_con *c = ev->from;

	if (ev->counted && c) {
		c->tx_out--;
		if (c->retry && !c->kick_queued && !c->shutdown && !c->down) {
			c->retry = false;
			ev_post_local(FAKE_KICK, c, 0, NULL, 0);
		}
	}
	ev->counted = false;
}

/* Removes ev for good: freed, or kept as a zombie while a test holds it. */
static void ev_discard(struct fake_ev *ev)
{
	ev_unlink(ev);
	ev_uncount(ev);
	if (ev->claimed) {
		ev->to = ev->from = NULL;
		ev->next = net.zombies;
		net.zombies = ev;
		return;
	}
	ev_free(ev);
}

/* The end of c's connection goes away: the peer is told, once. */
static void con_tell_peer(struct fab_con *c)
{
	struct fab_con *p = c->peer;

	if (!p || c->peer_told || p->shutdown || p->down)
		return;
	c->peer_told = true;
	ev_post_local(FAKE_DOWN, p, -ECONNRESET, NULL, 0);
}

/* Drops every queued event that would run at c. */
static void con_purge_to(struct fab_con *c)
{
	for (struct fake_ev *ev = net.head, *n; ev; ev = n) {
		n = ev->next;
		if (ev->to == c) {
			net.st.dropped++;
			ev_discard(ev);
		}
	}
	c->kick_queued = false;
}

/* ---- delivery ----------------------------------------------------------------------- */

static struct fake_mr *mr_find(struct fab *f, uint64_t key)
{
	for (struct fake_mr *m = f->mrs; m; m = m->next)
		if (m->key == key)
			return m;
	return NULL;
}

/*
 * A bad write: as a NIC, the target refuses it and the connection breaks
 * at both ends; nothing more passes between them.
 */
static void write_refused(struct fake_ev *ev, const char *why, size_t i)
{
	struct fab_con *to = ev->to, *from = ev->from;

	net.st.bad_writes++;
	flog(LOG_ERR, "fake: %s: write %zu of %zu refused: %s (addr 0x%llx len %llu key 0x%llx)",
		to->name, i + 1, ev->rma_cnt, why, (unsigned long long)ev->rma[i].addr,
		(unsigned long long)ev->rma[i].len, (unsigned long long)ev->rma[i].key);
	to->failed = true;
	if (!to->shutdown && !to->down)
		ev_post_local(FAKE_DOWN, to, -ECONNRESET, NULL, 0);
	if (from) {
		from->failed = true;
		if (!from->shutdown && !from->down)
			ev_post_local(FAKE_DOWN, from, -EACCES, NULL, 0);
	}
}

/* Places a write's bytes in the target's registrations; false when refused. */
static bool write_place(struct fake_ev *ev)
{
	const char *src = ev->data;

	/* Checked whole first: a refused write places nothing. */
	for (size_t i = 0; i < ev->rma_cnt; i++) {
		struct fake_mr *m = mr_find(ev->to->fab, ev->rma[i].key);

		if (!m || !(m->access & FAB_MR_REMOTE_WRITE)) {
			write_refused(ev, m ? "not remotely writable" : "no such key", i);
			return false;
		}
		if (ev->rma[i].addr > m->len || ev->rma[i].len > m->len - ev->rma[i].addr) {
			write_refused(ev, "outside the region", i);
			return false;
		}
	}
	for (size_t i = 0; i < ev->rma_cnt; i++) {
		struct fake_mr *m = mr_find(ev->to->fab, ev->rma[i].key);

		memcpy(m->buf + ev->rma[i].addr, src, ev->rma[i].len);
		src += ev->rma[i].len;
	}
	return true;
}

/* Whether ev can run at its connection now (a message needs a receive buffer). */
static bool ev_ready(const struct fake_ev *ev)
{
	return ev->kind != FAKE_SEND || !ev->to || ev->to->rx_count || ev->to->shutdown ||
	       ev->to->down || ev->to->failed;
}

static struct fab_lst *lst_find(const struct fab *f)
{
	int port = atoi(f->service);

	for (struct fab_lst *l = net.lsts; l; l = l->next)
		if (l->port == port &&
		    (!strcmp(l->fab->node, "0.0.0.0") || !strcmp(l->fab->node, f->node)))
			return l;
	return NULL;
}

/* A connection request reaches the listener (or nobody listens there). */
static void connreq_arrive(struct fake_ev *ev)
{
	struct fab_con *c = ev->from;
	struct fab_lst *l = lst_find(c->fab);
	struct fab_connreq *req;
	uint64_t one = 1;

	if (!l) {
		ev_post_local(FAKE_REJECT, c, -ECONNREFUSED, NULL, 0);
		return;
	}
	req = calloc(1, sizeof(*req));
	if (!req) {
		flog(LOG_ERR, "fake: %s: no memory for a connection request", c->name);
		ev_post_local(FAKE_REJECT, c, -ECONNREFUSED, NULL, 0);
		return;
	}
	req->ops = &fab_fake_ops;
	req->clt = c;
	req->data = ev->buf;
	req->len = ev->len;
	ev->buf = NULL;
	snprintf(req->peer, sizeof(req->peer), "%s:%u",
		 c->fab->src[0] ? c->fab->src : "fake-client", c->serial);
	if (l->inbox_tail)
		l->inbox_tail->next = req;
	else
		l->inbox = req;
	l->inbox_tail = req;
	if (write(l->fd, &one, sizeof(one)) < 0)
		flog(LOG_WARN, "fake: listener eventfd write: %s", strerror(errno));
}

/* ev takes effect now: remembered for fake_delivered. */
static void ev_record(const struct fake_ev *ev)
{
	struct fake_rec *r;

	if (net.nr_recs == net.cap_recs) {
		size_t cap = net.cap_recs ? 2 * net.cap_recs : 1024;
		struct fake_rec *n = realloc(net.recs, cap * sizeof(*n));

		if (!n) {
			flog(LOG_ERR, "fake: no memory to record a delivery");
			return;
		}
		net.recs = n;
		net.cap_recs = cap;
	}
	r = &net.recs[net.nr_recs++];
	r->ev = *ev;
	r->ev.prev = r->ev.next = NULL;
	r->ev.to = r->ev.from = NULL;
	r->ev.buf = NULL;
	r->ev.len = MIN(ev->len, sizeof(r->head));
	if (r->ev.len)
		memcpy(r->head, ev->data, r->ev.len);
	r->ev.data = r->head;
}

/* The poster asked for a completion: it comes once the operation has arrived. */
static void post_done(const struct fake_ev *ev)
{
	struct fake_ev *done;

	if (!ev->ctx || !ev->from || ev->from->shutdown || ev->from->down)
		return;
	done = ev_post_local(FAKE_DONE, ev->from, 0, NULL, 0);
	if (done)
		done->ctx = ev->ctx;
}

/*
 * Runs ev, which is out of the queue; net.lock held, dropped around the
 * owner's callback. Frees ev.
 */
static void ev_run(struct fake_ev *ev)
{
	struct fab_con *to = ev->to, *from = ev->from;
	const struct fab_con_ops *ops;
	void *priv;
	char *rx = NULL;

	ev_uncount(ev);
	if (ev->kind == FAKE_CONNREQ) {
		ev_record(ev);
		connreq_arrive(ev);
		ev_free(ev);
		return;
	}
	/* Gone, shut down, or past its down(): nothing runs there any more. */
	if (!to || to->shutdown || to->down)
		goto drop;
	/* A cut connection loses what was on its way. */
	if ((to->failed || (from && from->failed)) && ev->kind != FAKE_DOWN && ev->kind != FAKE_KICK)
		goto drop;
	switch (ev->kind) {
	case FAKE_WRITE:
		if (!write_place(ev))
			goto drop;
		net.st.writes++;
		post_done(ev);
		if (!ev->with_imm) {
			ev_record(ev);
			ev_free(ev);
			return;
		}
		break;
	case FAKE_SEND:
		if (ev->len > to->rx_size) {
			flog(LOG_ERR, "fake: %s: a %zu-byte message for %zu-byte receive buffers", to->name,
				ev->len, to->rx_size);
			to->failed = true;
			ev_post_local(FAKE_DOWN, to, -EMSGSIZE, NULL, 0);
			goto drop;
		}
		rx = to->rx_buf + to->rx_next * to->rx_size;
		to->rx_next = (to->rx_next + 1) % to->rx_count;
		memcpy(rx, ev->data, ev->len);
		net.st.sends++;
		post_done(ev);
		break;
	case FAKE_REJECT:
	case FAKE_DOWN:
		to->down = true;
		break;
	case FAKE_KICK:
		to->kick_queued = false;
		break;
	default:
		break;
	}
	ev_record(ev);
	flog(LOG_DBG, "fake: %s #%llu to %s", kind_names[ev->kind], (unsigned long long)ev->seq,
	     to->name);
	ops = to->cfg.ops;
	priv = to->cfg.priv;
	to->in_cb = true;
	to->cb_thread = pthread_self();
	net_unlock();
	switch (ev->kind) {
	case FAKE_ACCEPT:
	case FAKE_ESTABLISHED:
		ops->connected(priv, ev->data, ev->len);
		break;
	case FAKE_REJECT:
		ops->down(priv, -ECONNREFUSED, ev->data, ev->len);
		break;
	case FAKE_DOWN:
		ops->down(priv, ev->err, NULL, 0);
		break;
	case FAKE_WRITE:
		ops->imm(priv, ev->imm);
		break;
	case FAKE_SEND:
		ops->recv(priv, rx, ev->len);
		break;
	case FAKE_DONE:
		ops->done(priv, ev->ctx);
		break;
	case FAKE_KICK:
		ops->kick(priv);
		break;
	default:
		break;
	}
	net_lock();
	to->in_cb = false;
	pthread_cond_broadcast(&net.cond);
	ev_free(ev);
	return;

drop:
	net.st.dropped++;
	ev_free(ev);
}

/* ---- the pump ------------------------------------------------------------------------- */

static bool ev_held(const struct fake_ev *ev)
{
	return net.hold && net.hold(ev, net.hold_arg);
}

/*
 * The first event the pump may deliver: not claimed, not held, and its
 * connection free; an event that must wait holds back the later ones of
 * its connection, which keeps each connection in order.
 */
static struct fake_ev *pump_next(void)
{
	unsigned gen = ++net.scan_gen;

	for (struct fake_ev *ev = net.head; ev; ev = ev->next) {
		if (ev->claimed || ev_held(ev))
			continue;
		if (ev->to && (ev->to->blocked_gen == gen || ev->to->in_cb || !ev_ready(ev))) {
			ev->to->blocked_gen = gen;
			continue;
		}
		return ev;
	}
	return NULL;
}

static void *pump_thread(void *arg)
{
	pthread_setname_np(pthread_self(), "fake-pump");
	net_lock();
	for (;;) {
		struct fake_ev *ev = NULL;

		while (!net.pump_stop && !(ev = pump_next()))
			pthread_cond_wait(&net.cond, &net.lock);
		if (net.pump_stop)
			break;
		ev_unlink(ev);
		net.pump_busy = true;
		ev_run(ev);
		net.pump_busy = false;
		pthread_cond_broadcast(&net.cond);
	}
	net_unlock();
	return arg;
}

/* A loop is about to block: whoever waits checks again. */
static void fake_loop_idle(void)
{
	net_lock();
	pthread_cond_broadcast(&net.cond);
	net_unlock();
}

/* ---- the test's side ------------------------------------------------------------------ */

int fake_init(void)
{
	int rc;

	net_lock();
	if (net.ready) {
		net_unlock();
		return 0;
	}
	cond_init_mono(&net.cond);
	net.ready = true;
	net_unlock();
	rc = fab_register(&fab_fake_ops);
	if (rc)
		return rc;
	loop_test_clock(fake_loop_idle);
	rc = -pthread_create(&net.pump, NULL, pump_thread, NULL);
	net.pump_started = !rc;
	return rc;
}

static int count_leftovers(bool report)
{
	int n = 0;

	for (struct fab_con *c = net.cons; c; c = c->next, n++)
		if (report)
			flog(LOG_ERR, "fake: connection %s was not destroyed", c->name);
	for (struct fab_lst *l = net.lsts; l; l = l->next, n++)
		if (report)
			flog(LOG_ERR, "fake: listener on port %d was not closed", l->port);
	for (struct fab *f = net.fabs; f; f = f->next) {
		n++;
		if (report)
			flog(LOG_ERR, "fake: domain %s:%s was not closed", f->node, f->service);
		for (struct fake_mr *m = f->mrs; m; m = m->next, n++)
			if (report)
				flog(LOG_ERR, "fake: a registration of %zu bytes (key 0x%llx) was left",
					m->len, (unsigned long long)m->key);
	}
	for (struct fake_ev *ev = net.head; ev; ev = ev->next, n++)
		if (report)
			flog(LOG_ERR, "fake: a %s event for %s#%d was left in the queue",
				kind_names[ev->kind], ev->sess, ev->cid);
	return n;
}

int fake_leftovers(void)
{
	int n;

	net_lock();
	n = count_leftovers(true);
	net_unlock();
	return n;
}

int fake_fini(void)
{
	int n;

	net_lock();
	net.pump_stop = true;
	pthread_cond_broadcast(&net.cond);
	net_unlock();
	if (net.pump_started)
		pthread_join(net.pump, NULL);
	net.pump_started = false;
	net_lock();
	n = count_leftovers(true);
	while (net.head) {
		struct fake_ev *ev = net.head;

		ev_unlink(ev);
		ev_free(ev);
	}
	while (net.zombies) {
		struct fake_ev *ev = net.zombies;

		net.zombies = ev->next;
		ev_free(ev);
	}
	free(net.recs);
	net.recs = NULL;
	net.nr_recs = net.cap_recs = 0;
	net_unlock();
	return n;
}

void fake_set_limits(size_t iov_limit, size_t rma_iov_limit)
{
	net_lock();
	net.iov_limit = MAX(iov_limit, 1);
	net.rma_iov_limit = MIN(MAX(rma_iov_limit, 1), 8);
	net_unlock();
}

bool fake_any(const struct fake_ev *ev, void *arg)
{
	return true;
}

void fake_hold(fake_pred pred, void *arg)
{
	net_lock();
	net.hold = pred;
	net.hold_arg = arg;
	/* Whatever the pump delivers now was taken under the old rule. */
	while (net.pump_busy && !pthread_equal(pthread_self(), net.pump))
		pthread_cond_wait(&net.cond, &net.lock);
	pthread_cond_broadcast(&net.cond);
	net_unlock();
}

static struct fake_ev *find_locked(fake_pred pred, void *arg)
{
	for (struct fake_ev *ev = net.head; ev; ev = ev->next) {
		if (ev->claimed || (pred && !pred(ev, arg)))
			continue;
		ev->claimed = true;
		return ev;
	}
	return NULL;
}

struct fake_ev *fake_find(fake_pred pred, void *arg)
{
	struct fake_ev *ev;

	net_lock();
	ev = find_locked(pred, arg);
	net_unlock();
	return ev;
}

struct fake_ev *fake_wait_ev(fake_pred pred, void *arg, const char *what)
{
	struct timespec dl = wait_deadline();
	struct fake_ev *ev;
	int rc = 0;

	net_lock();
	while (!(ev = find_locked(pred, arg)) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&net.cond, &net.lock, &dl);
	net_unlock();
	if (!ev)
		flog(LOG_ERR, "fake: no %s within %d ms", what, FAKE_WAIT_MS);
	return ev;
}

/* Takes a zombie off its list; true when ev was one. */
static bool zombie_take(struct fake_ev *ev)
{
	for (struct fake_ev **pz = &net.zombies; *pz; pz = &(*pz)->next) {
		if (*pz == ev) {
			*pz = ev->next;
			return true;
		}
	}
	return false;
}

int fake_deliver(struct fake_ev *ev)
{
	struct timespec dl = wait_deadline();
	int rc = 0;

	net_lock();
	if (zombie_take(ev)) {
		net_unlock();
		ev_free(ev);
		return -ENOTCONN;
	}
	while (ev->queued && ev->to && ev->to->in_cb &&
	       !pthread_equal(ev->to->cb_thread, pthread_self()) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&net.cond, &net.lock, &dl);
	if (!ev->queued) { /* its connection went while we waited: a zombie now */
		zombie_take(ev);
		net_unlock();
		ev_free(ev);
		return -ENOTCONN;
	}
	if (ev->to && ev->to->in_cb) {
		/* Another callback of the same connection inside this one: never over a fabric. */
		flog(LOG_ERR, "fake: %s: %s", ev->to->name,
			rc == ETIMEDOUT ? "its callback did not return" :
			"delivery from inside its own callback");
		net_unlock();
		return rc == ETIMEDOUT ? -ETIMEDOUT : -EDEADLK;
	}
	if (!ev_ready(ev)) {
		net_unlock();
		return -ENOBUFS;
	}
	ev_unlink(ev);
	ev_run(ev);
	net_unlock();
	return 0;
}

void fake_drop(struct fake_ev *ev)
{
	net_lock();
	if (!zombie_take(ev)) {
		ev_unlink(ev);
		ev_uncount(ev);
		net.st.dropped++;
		pthread_cond_broadcast(&net.cond);
	}
	net_unlock();
	ev_free(ev);
}

struct fake_ev *fake_dup(const struct fake_ev *ev)
{
	struct fake_ev *d;

	/* A second request from one connection would be a second connection: not a copy. */
	if (ev->kind == FAKE_CONNREQ)
		return NULL;
	d = malloc(sizeof(*d));
	if (!d)
		return NULL;
	net_lock();
	*d = *ev;
	d->buf = NULL;
	d->data = NULL;
	d->len = 0;
	d->counted = false;
	d->claimed = true;
	if (ev_set_data(d, ev->data, ev->len)) {
		net_unlock();
		free(d);
		return NULL;
	}
	if (!ev->queued) /* a zombie's copy: nowhere to go either */
		d->to = d->from = NULL;
	if (d->to)
		ev_queue(d);
	else {
		d->next = net.zombies;
		net.zombies = d;
	}
	net_unlock();
	return d;
}

int fake_rewrite(struct fake_ev *ev, const void *data, size_t len)
{
	void *buf = len ? malloc(len) : NULL;

	if (len && !buf)
		return -ENOMEM;
	if (len)
		memcpy(buf, data, len);
	net_lock();
	free(ev->buf);
	ev->buf = buf;
	ev->data = buf;
	ev->len = len;
	net_unlock();
	return 0;
}

void fake_unclaim(struct fake_ev *ev)
{
	net_lock();
	if (zombie_take(ev)) {
		ev_free(ev);
	} else {
		ev->claimed = false;
		pthread_cond_broadcast(&net.cond);
	}
	net_unlock();
}

void fake_on_post(fake_pred pred, void *pred_arg, void (*fn)(struct fake_ev *ev, void *arg),
		  void *arg)
{
	net_lock();
	net.hook_pred = pred;
	net.hook_pred_arg = pred_arg;
	net.hook_fn = fn;
	net.hook_arg = arg;
	net_unlock();
}

/* After posting ev (net.lock held): whether the test's hook wants it; then it is claimed. */
static bool hook_wants(struct fake_ev *ev, void (**fn)(struct fake_ev *, void *), void **arg)
{
	if (!ev || !net.hook_pred || !net.hook_pred(ev, net.hook_pred_arg))
		return false;
	*fn = net.hook_fn;
	*arg = net.hook_arg;
	net.hook_pred = NULL;
	ev->claimed = true;
	return true;
}

/*
 * Queues ev (net.lock held) and drops the lock; then the test's hook runs
 * here, on the posting thread, if ev is the event it waits for.
 */
static void queue_and_hook(struct fake_ev *ev)
{
	void (*fn)(struct fake_ev *, void *) = NULL;
	void *arg = NULL;
	bool hook;

	ev_queue(ev);
	hook = hook_wants(ev, &fn, &arg);
	net_unlock();
	if (hook)
		fn(ev, arg);
}

/*
 * Posts ev from c to its peer; it is ours from here on. A write (counted)
 * takes a slot of c's send queue, or meets -EAGAIN. With the peer gone the
 * operation is lost on the wire: posted, never delivered (c's own DOWN is
 * on its way).
 */
static int post_to_peer(struct fab_con *c, struct fake_ev *ev, bool counted)
{
	int rc = 0;

	net_lock();
	if (c->shutdown || c->down) {
		rc = -ECONNRESET;
	} else if (counted && (c->eagain || c->tx_out >= c->tx_max)) {
		if (c->eagain)
			c->eagain--;
		rc = -EAGAIN;
	} else if (!c->peer) {
		net.st.dropped++;
	} else {
		ev->to = c->peer;
		ev->to_server = c->peer->server;
		ev->counted = counted;
		c->tx_out += counted;
		queue_and_hook(ev);
		return 0;
	}
	net_unlock();
	ev_free(ev);
	return rc;
}

static bool con_matches(const struct fab_con *c, const char *sess, const char *host, int cid)
{
	return (!sess || !strcmp(c->sess, sess)) && (!host || !strcmp(c->host, host)) &&
	       (cid < 0 || c->cid == cid);
}

int fake_fail(const char *sess, const char *host, int cid, int clt_err, int srv_err)
{
	int n = 0;

	net_lock();
	for (struct fab_con *c = net.cons; c; c = c->next) {
		struct fab_con *s = c->peer;

		if (c->server || c->shutdown || c->failed || !con_matches(c, sess, host, cid))
			continue;
		n++;
		c->failed = true;
		if (clt_err && !c->down)
			ev_post_local(FAKE_DOWN, c, clt_err, NULL, 0);
		if (!s)
			continue;
		s->failed = true;
		c->peer_told = s->peer_told = true; /* told here, or never */
		if (srv_err && !s->shutdown && !s->down)
			ev_post_local(FAKE_DOWN, s, srv_err, NULL, 0);
	}
	net_unlock();
	return n;
}

int fake_eagain(const char *sess, const char *host, int cid, bool server, unsigned n)
{
	int found = 0;

	net_lock();
	for (struct fab_con *c = net.cons; c; c = c->next) {
		if (c->server != server || c->shutdown || !con_matches(c, sess, host, cid))
			continue;
		c->eagain = n;
		found++;
	}
	net_unlock();
	return found;
}

/* Nothing the pump may deliver, no callback running, every loop idle. */
static bool settled(void *arg)
{
	if (net.pump_busy || pump_next())
		return false;
	for (struct fab_con *c = net.cons; c; c = c->next)
		if (c->in_cb)
			return false;
	return loop_test_idle();
}

int fake_wait(bool (*cond)(void *arg), void *arg, const char *what)
{
	struct timespec dl = wait_deadline();
	bool ok;
	int rc = 0;

	net_lock();
	while (!(ok = cond(arg)) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&net.cond, &net.lock, &dl);
	net_unlock();
	if (!ok) {
		flog(LOG_ERR, "fake: waited %d ms for %s", FAKE_WAIT_MS, what);
		return -ETIMEDOUT;
	}
	return 0;
}

int fake_settle(void)
{
	int rc = fake_wait(settled, NULL, "the fabric and the loops to settle");

	log_dbg("fake: settled");
	return rc;
}

int fake_advance(unsigned ms)
{
	loop_test_advance(ms);
	return fake_settle();
}

void fake_notify(void)
{
	net_lock();
	pthread_cond_broadcast(&net.cond);
	net_unlock();
}

/* From a fake_wait condition the lock is ours already. */
static bool lock_unless_held(void)
{
	if (tl_locked)
		return false;
	net_lock();
	return true;
}

unsigned fake_delivered(fake_pred pred, void *arg)
{
	bool locked = lock_unless_held();
	unsigned n = 0;

	for (size_t i = 0; i < net.nr_recs; i++)
		n += !pred || pred(&net.recs[i].ev, arg);
	if (locked)
		net_unlock();
	return n;
}

void fake_delivered_reset(void)
{
	net_lock();
	net.nr_recs = 0;
	net_unlock();
}

void fake_get_stats(struct fake_stats *st)
{
	bool locked = lock_unless_held();

	*st = net.st;
	st->cons = 0;
	st->events = 0;
	for (struct fab_con *c = net.cons; c; c = c->next)
		st->cons++;
	for (struct fake_ev *ev = net.head; ev; ev = ev->next)
		st->events++;
	if (locked)
		net_unlock();
}

/* ---- fabric and domain ------------------------------------------------------------------ */

static int fake_open(const char *prov, const char *src, const char *node, const char *service,
		     bool server, size_t queue, struct fab **out)
{
	struct fab *f = calloc(1, sizeof(*f));

	if (!f)
		return -ENOMEM;
	f->ops = &fab_fake_ops;
	f->server = server;
	snprintf(f->node, sizeof(f->node), "%s", node ? node : "0.0.0.0");
	snprintf(f->service, sizeof(f->service), "%s", service ? service : "0");
	snprintf(f->src, sizeof(f->src), "%s", src ? src : "");
	snprintf(f->attr.prov_name, sizeof(f->attr.prov_name), "fake");
	f->next_key = 1;
	f->next_key64 = FAKE_KEY64_MIN;
	net_lock();
	f->attr.iov_limit = net.iov_limit;
	f->attr.rma_iov_limit = net.rma_iov_limit;
	f->attr.max_queue = queue ? queue : 256;
	f->attr.inject_size = FAKE_INJECT_SIZE;
	f->next = net.fabs;
	net.fabs = f;
	net_unlock();
	*out = f;
	return 0;
}

static void fake_close(struct fab *f)
{
	net_lock();
	LIST_DEL(&net.fabs, f);
	for (struct fab_con *c = net.cons; c; c = c->next)
		if (c->fab == f)
			flog(LOG_ERR, "fake: domain %s:%s closed under connection %s", f->node, f->service,
				c->name);
	while (f->mrs) {
		struct fake_mr *m = f->mrs;

		flog(LOG_ERR, "fake: domain %s:%s closed with a registration of %zu bytes", f->node,
			f->service, m->len);
		f->mrs = m->next;
		free(m);
	}
	net_unlock();
	free(f);
}

static const struct fab_attr *fake_attr(const struct fab *f)
{
	return &f->attr;
}

static int fake_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	struct fake_mr *m;

	memset(mr, 0, sizeof(*mr));
	mr->buf = buf;
	mr->len = len;
	/* As tcp: local memory needs no registration. */
	if (access == FAB_MR_LOCAL)
		return 0;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->buf = buf;
	m->len = len;
	m->access = access;
	net_lock();
	/* Keys are never used twice in a domain: a revoked one stays invalid. */
	m->key = access & FAB_MR_KEY64 ? f->next_key64++ : f->next_key++;
	m->next = f->mrs;
	f->mrs = m;
	net_unlock();
	mr->ops = &fab_fake_ops;
	mr->priv = m;
	mr->key = m->key;
	mr->base = 0;
	mr->desc = NULL;
	return 0;
}

static void fake_mr_dereg(struct fab_mr *mr)
{
	struct fake_mr *m = mr->priv;

	if (!m)
		return;
	net_lock();
	for (struct fab *f = net.fabs; f; f = f->next) {
		for (struct fake_mr **pm = &f->mrs; *pm; pm = &(*pm)->next) {
			if (*pm == m) {
				*pm = m->next;
				goto found;
			}
		}
	}
	/* Its domain was closed under it (and said so): freed with the domain. */
	flog(LOG_ERR, "fake: deregistering %zu bytes that no domain holds", mr->len);
	net_unlock();
	mr->priv = NULL;
	mr->ops = NULL;
	return;
found:
	net_unlock();
	free(m);
	mr->priv = NULL;
	mr->ops = NULL;
}

/* ---- listening ----------------------------------------------------------------------------- */

static int fake_listen(struct fab *f, struct fab_lst **out)
{
	struct fab_lst *l = calloc(1, sizeof(*l));
	int port = atoi(f->service);

	if (!l)
		return -ENOMEM;
	l->ops = &fab_fake_ops;
	l->fab = f;
	l->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (l->fd < 0) {
		free(l);
		return -errno;
	}
	net_lock();
	if (!port)
		port = net.next_port++;
	for (struct fab_lst *o = net.lsts; o; o = o->next) {
		if (o->port == port && !strcmp(o->fab->node, f->node)) {
			net_unlock();
			close(l->fd);
			free(l);
			return -EADDRINUSE;
		}
	}
	l->port = port;
	l->next = net.lsts;
	net.lsts = l;
	net_unlock();
	*out = l;
	return 0;
}

static void fake_lst_close(struct fab_lst *l)
{
	net_lock();
	LIST_DEL(&net.lsts, l);
	/* Requests nobody took: refused, as by a closed port. */
	while (l->inbox) {
		struct fab_connreq *req = l->inbox;

		l->inbox = req->next;
		if (req->clt)
			ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, NULL, 0);
		free(req->data);
		free(req);
	}
	net_unlock();
	close(l->fd);
	free(l);
}

static int fake_lst_fd(const struct fab_lst *l)
{
	return l->fd;
}

static int fake_lst_port(const struct fab_lst *l)
{
	return l->port;
}

static int fake_lst_process(struct fab_lst *l,
			    void (*cb)(void *priv, struct fab_connreq *req, const void *data,
				       size_t len),
			    void *priv)
{
	uint64_t v;

	if (read(l->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		flog(LOG_WARN, "fake: listener eventfd read: %s", strerror(errno));
	for (;;) {
		struct fab_connreq *req;

		net_lock();
		req = l->inbox;
		if (req) {
			l->inbox = req->next;
			if (!l->inbox)
				l->inbox_tail = NULL;
			l->current = req;
			net.st.connreqs++;
		}
		net_unlock();
		if (!req)
			return 0;
		cb(priv, req, req->data, req->len);
		net_lock();
		l->current = NULL;
		net.st.connreqs_done++;
		if (!req->answered && req->clt)
			ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, NULL, 0);
		pthread_cond_broadcast(&net.cond);
		net_unlock();
		free(req->data);
		free(req);
	}
}

static void fake_lst_limit(struct fab_lst *l, const struct fab_lst_limits *lim)
{
	/* No raw connections here: every connection arrives with its request. */
}

static void fake_lst_sweep(struct fab_lst *l)
{
}

static uint64_t fake_lst_closed(const struct fab_lst *l)
{
	return 0;
}

static int fake_reject(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len)
{
	int rc = 0;

	net_lock();
	req->answered = true;
	net.st.rejects++;
	if (req->clt && !ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, data, len))
		rc = -ENOMEM;
	net_unlock();
	return rc;
}

static void fake_connreq_peer(const struct fab_connreq *req, char *buf, size_t len)
{
	snprintf(buf, len, "%s", req->peer);
}

/* ---- connections ------------------------------------------------------------------------------ */

static int con_rx_alloc(struct fab_con *c, size_t count, size_t size)
{
	char *buf;

	if (!count || !size)
		return -EINVAL;
	buf = calloc(count, size);
	if (!buf)
		return -ENOMEM;
	net_lock();
	if (c->rx_count) {
		net_unlock();
		free(buf);
		return -EEXIST;
	}
	c->rx_buf = buf;
	c->rx_size = size;
	c->rx_count = count;
	pthread_cond_broadcast(&net.cond); /* messages waiting for buffers may go */
	net_unlock();
	return 0;
}

/* A connection of f for cfg; its names come from the client end ("sess#cid"). */
static struct fab_con *con_new(struct fab *f, const struct fab_con_cfg *cfg, bool server)
{
	struct fab_con *c = calloc(1, sizeof(*c));
	const char *hash;

	if (!c)
		return NULL;
	c->ops = &fab_fake_ops;
	c->fab = f;
	c->cfg = *cfg;
	c->server = server;
	c->cid = -1;
	snprintf(c->name, sizeof(c->name), "%s", cfg->name ? cfg->name : "?");
	c->cfg.name = c->name;
	c->tx_max = (unsigned)MIN(MAX(cfg->tx_depth, 16), f->attr.max_queue);
	if (!server) {
		hash = strrchr(c->name, '#');
		snprintf(c->sess, sizeof(c->sess), "%.*s",
			 (int)(hash ? (size_t)(hash - c->name) : strlen(c->name)), c->name);
		if (hash)
			c->cid = atoi(hash + 1);
		snprintf(c->host, sizeof(c->host), "%s", f->node);
	}
	if (cfg->rx_depth && con_rx_alloc(c, cfg->rx_depth, MAX(cfg->rx_size, 64))) {
		free(c);
		return NULL;
	}
	return c;
}

static void con_list_add(struct fab_con *c)
{
	c->serial = ++net.serial;
	c->next = net.cons;
	net.cons = c;
}

static int fake_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			    size_t len, struct fab_con **out)
{
	struct fake_ev *ev;
	struct fab_con *c;

	if (len > FAKE_CM_DATA_MAX)
		return -EMSGSIZE;
	c = con_new(f, cfg, false);
	if (!c)
		return -ENOMEM;
	ev = ev_new(FAKE_CONNREQ, NULL, c);
	if (!ev || ev_set_data(ev, data, len)) {
		free(ev);
		free(c->rx_buf);
		free(c);
		return -ENOMEM;
	}
	net_lock();
	con_list_add(c);
	*out = c;
	queue_and_hook(ev);
	return 0;
}

static int fake_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			   const void *data, size_t len, struct fab_con **out)
{
	struct fab_con *s, *c;

	if (len > FAKE_CM_DATA_MAX)
		return -EMSGSIZE;
	s = con_new(f, cfg, true);
	if (!s)
		return -ENOMEM;
	net_lock();
	req->answered = true;
	net.st.accepts++;
	con_list_add(s);
	*out = s;
	c = req->clt;
	if (!c || c->shutdown) {
		/* The client gave up meanwhile: this end learns it at once. */
		ev_post_local(FAKE_DOWN, s, -ECONNRESET, NULL, 0);
	} else {
		memcpy(s->sess, c->sess, sizeof(s->sess));
		memcpy(s->host, c->host, sizeof(s->host));
		s->cid = c->cid;
		s->peer = c;
		c->peer = s;
		ev_post_local(FAKE_ACCEPT, c, 0, data, len);
		ev_post_local(FAKE_ESTABLISHED, s, 0, NULL, 0);
	}
	net_unlock();
	return 0;
}

static void shutdown_locked(struct fab_con *c)
{
	if (c->shutdown)
		return;
	c->shutdown = true;
	con_purge_to(c);
	con_tell_peer(c);
	pthread_cond_broadcast(&net.cond);
}

static void fake_con_shutdown(struct fab_con *c)
{
	net_lock();
	shutdown_locked(c);
	net_unlock();
}

static void fake_con_destroy(struct fab_con *c)
{
	struct timespec dl = wait_deadline();
	int rc = 0;

	net_lock();
	shutdown_locked(c);
	/* A callback running elsewhere finishes first, as a completion thread is joined. */
	while (c->in_cb && !pthread_equal(c->cb_thread, pthread_self()) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&net.cond, &net.lock, &dl);
	if (c->in_cb) {
		/* Freeing it would pull it from under its callback: leak it, loudly. */
		flog(LOG_ERR, "fake: %s destroyed %s", c->name,
		     rc ? "while its callback still runs" : "from its own callback");
		net_unlock();
		return;
	}
	/* What its last callback posted for it goes too. */
	con_purge_to(c);
	con_tell_peer(c);
	LIST_DEL(&net.cons, c);
	for (struct fake_ev *ev = net.head, *n; ev; ev = n) {
		n = ev->next;
		if (ev->from == c && ev->kind == FAKE_CONNREQ) {
			net.st.dropped++;
			ev_discard(ev); /* withdrawn before it arrived */
		} else if (ev->from == c) {
			ev_uncount(ev);
			ev->from = NULL; /* on the wire: it may still arrive */
		}
	}
	for (struct fake_ev *ev = net.zombies; ev; ev = ev->next)
		if (ev->from == c)
			ev->from = NULL;
	for (struct fab_lst *l = net.lsts; l; l = l->next) {
		for (struct fab_connreq *req = l->inbox; req; req = req->next)
			if (req->clt == c)
				req->clt = NULL;
		if (l->current && l->current->clt == c)
			l->current->clt = NULL;
	}
	if (c->peer)
		c->peer->peer = NULL;
	pthread_cond_broadcast(&net.cond);
	net_unlock();
	free(c->rx_buf);
	free(c);
}

static int fake_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	return con_rx_alloc(c, count, MAX(size, 1));
}

static void fake_con_kick(struct fab_con *c)
{
	net_lock();
	if (!c->kick_queued && !c->shutdown && !c->down)
		ev_post_local(FAKE_KICK, c, 0, NULL, 0);
	net_unlock();
}

static void fake_con_retry_later(struct fab_con *c)
{
	net_lock();
	/* After the next completion; with nothing on its way, now (the 1 ms of libfabric's). */
	if (c->tx_out)
		c->retry = true;
	else if (!c->kick_queued && !c->shutdown && !c->down)
		ev_post_local(FAKE_KICK, c, 0, NULL, 0);
	net_unlock();
}

static void fake_con_local(const struct fab_con *c, char *buf, size_t len)
{
	snprintf(buf, len, "%s:%u", c->fab->src[0] ? c->fab->src : "fake-client", c->serial);
}

/*
 * Posts a write: the bytes are taken now (the fabric's copy is on the
 * wire) and placed when it is delivered.
 */
static int post_write(struct fab_con *c, const struct iovec *iov, size_t iov_cnt,
		      const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
		      void *ctx)
{
	uint64_t local = 0, remote = 0;
	struct fake_ev *ev;
	char *p;

	for (size_t i = 0; i < iov_cnt; i++)
		local += iov[i].iov_len;
	for (size_t i = 0; i < rma_cnt; i++)
		remote += rma[i].len;
	if (local != remote) {
		flog(LOG_ERR, "fake: %s: a write of %llu local bytes to %llu remote ones", c->name,
			(unsigned long long)local, (unsigned long long)remote);
		return -EINVAL;
	}
	ev = ev_new(FAKE_WRITE, NULL, c);
	if (!ev)
		return -ENOMEM;
	if (local) {
		ev->buf = malloc(local);
		if (!ev->buf) {
			free(ev);
			return -ENOMEM;
		}
	}
	for (size_t i = 0, off = 0; i < iov_cnt; off += iov[i].iov_len, i++)
		if (iov[i].iov_len)
			memcpy((char *)ev->buf + off, iov[i].iov_base, iov[i].iov_len);
	p = ev->buf;
	ev->data = p;
	ev->len = local;
	ev->with_imm = with_imm;
	ev->imm = imm;
	ev->ctx = ctx;
	ev->rma_cnt = rma_cnt;
	memcpy(ev->rma, rma, rma_cnt * sizeof(*rma));
	return post_to_peer(c, ev, true);
}

static int fake_write(struct fab_con *c, const struct iovec *iov, void *const *desc,
		      size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
		      uint32_t imm, void *ctx)
{
	if (rma_cnt > ARRAY_SIZE(((struct fake_ev *)0)->rma) ||
	    rma_cnt > c->fab->attr.rma_iov_limit || iov_cnt > c->fab->attr.iov_limit)
		return -EINVAL;
	return post_write(c, iov, iov_cnt, rma, rma_cnt, with_imm, imm, ctx);
}

static int fake_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			  uint64_t key, uint32_t imm, void *ctx)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct fab_rma rma = { .addr = addr, .len = len, .key = key };

	if (len > c->fab->attr.inject_size)
		return -EMSGSIZE;
	/* Even an empty write names a region it must be allowed into, as on tcp. */
	return post_write(c, &iov, len ? 1 : 0, &rma, 1, true, imm, ctx);
}

static int fake_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	struct fake_ev *ev = ev_new(FAKE_SEND, NULL, c);

	if (!ev || ev_set_data(ev, buf, len)) {
		free(ev);
		return -ENOMEM;
	}
	ev->ctx = ctx;
	return post_to_peer(c, ev, false);
}

const struct fab_ops fab_fake_ops = {
	.name = "fake",
	.open = fake_open,
	.close = fake_close,
	.attr = fake_attr,
	.mr_reg = fake_mr_reg,
	.mr_dereg = fake_mr_dereg,
	.listen = fake_listen,
	.lst_close = fake_lst_close,
	.lst_fd = fake_lst_fd,
	.lst_port = fake_lst_port,
	.lst_process = fake_lst_process,
	.lst_limit = fake_lst_limit,
	.lst_sweep = fake_lst_sweep,
	.lst_closed = fake_lst_closed,
	.reject = fake_reject,
	.connreq_peer = fake_connreq_peer,
	.con_connect = fake_con_connect,
	.con_accept = fake_con_accept,
	.con_shutdown = fake_con_shutdown,
	.con_rx_setup = fake_con_rx_setup,
	.con_kick = fake_con_kick,
	.con_retry_later = fake_con_retry_later,
	.con_destroy = fake_con_destroy,
	.con_local = fake_con_local,
	.write = fake_write,
	.write_imm = fake_write_imm,
	.send = fake_send,
};
