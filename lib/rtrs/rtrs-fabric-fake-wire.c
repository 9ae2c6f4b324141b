/* SPDX-License-Identifier: MIT */
/*
 * The fake fabric's wire (rtrs-fabric-fake-pri.h): the event queue, and
 * delivery (fk_ev_run), the one place events take effect. It runs on the
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
#include "rtrs-fabric-fake-pri.h"
#include "util.h"

struct fake_net fk_net = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.next_port = FAKE_PORT_MIN,
	.iov_limit = 4,
	.rma_iov_limit = 4,
};

const char *const fk_kind_names[] = {
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

void fk_lock(void)
{
	pthread_mutex_lock(&fk_net.lock);
	tl_locked = true;
}

void fk_unlock(void)
{
	unsigned n = tl_nlines;

	tl_locked = false;
	tl_nlines = 0;
	pthread_mutex_unlock(&fk_net.lock);
	for (unsigned i = 0; i < n; i++)
		log_at(tl_levels[i], "%s", tl_lines[i]);
}

void fk_log(enum log_level lvl, const char *fmt, ...)
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

bool fk_locked(void)
{
	return tl_locked;
}

struct timespec fk_deadline(void)
{
	return deadline_ms(FAKE_WAIT_MS);
}

/* ---- events (fk_net.lock held) ------------------------------------------------------- */

void fk_ev_unlink(struct fake_ev *ev)
{
	if (!ev->queued)
		return;
	if (ev->prev)
		ev->prev->next = ev->next;
	else
		fk_net.head = ev->next;
	if (ev->next)
		ev->next->prev = ev->prev;
	else
		fk_net.tail = ev->prev;
	ev->prev = ev->next = NULL;
	ev->queued = false;
}

void fk_ev_free(struct fake_ev *ev)
{
	free(ev->buf);
	free(ev->lvec);
	free(ev);
}

/*
 * A new event for connection to (its callback runs there), posted by from
 * (NULL: the fabric). The names of the client end go with it, so that a
 * test can tell the event after its connections are gone.
 */
struct fake_ev *fk_ev_new(enum fake_ev_kind kind, struct fab_con *to, struct fab_con *from)
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

void fk_ev_queue(struct fake_ev *ev)
{
	ev->seq = ++fk_net.seq;
	ev->queued = true;
	ev->prev = fk_net.tail;
	ev->next = NULL;
	if (fk_net.tail)
		fk_net.tail->next = ev;
	else
		fk_net.head = ev;
	fk_net.tail = ev;
	pthread_cond_broadcast(&fk_net.cond);
}

/* Copies len bytes of data into ev. */
int fk_ev_set_data(struct fake_ev *ev, const void *data, size_t len)
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
struct fake_ev *fk_ev_post_local(enum fake_ev_kind kind, struct fab_con *c, int err,
				 const void *data, size_t len)
{
	struct fake_ev *ev = fk_ev_new(kind, c, NULL);

	if (!ev || fk_ev_set_data(ev, data, len)) {
		fk_log(LOG_ERR, "fake: %s: no memory for a %s event", c->name, fk_kind_names[kind]);
		free(ev);
		return NULL;
	}
	ev->err = err;
	if (kind == FAKE_KICK)
		c->kick_queued = true;
	fk_ev_queue(ev);
	return ev;
}

/*
 * A write that will not be delivered, or has been, gives its send-queue
 * slot back: a completion, after which the owner's retry may find room.
 */
void fk_ev_uncount(struct fake_ev *ev)
{
	struct fab_con *c = ev->from;

	if (ev->counted && c) {
		c->tx_out--;
		if (c->retry && !c->kick_queued && !c->shutdown && !c->down) {
			c->retry = false;
			fk_ev_post_local(FAKE_KICK, c, 0, NULL, 0);
		}
	}
	ev->counted = false;
}

/* Removes ev for good: freed, or kept as a zombie while a test holds it. */
void fk_ev_discard(struct fake_ev *ev)
{
	fk_ev_unlink(ev);
	fk_ev_uncount(ev);
	fk_con_sent(ev->from);
	if (ev->claimed) {
		ev->to = ev->from = NULL;
		ev->next = fk_net.zombies;
		fk_net.zombies = ev;
		return;
	}
	fk_ev_free(ev);
}

/* The end of c's connection goes away: the peer is told, once. */
void fk_con_tell_peer(struct fab_con *c)
{
	struct fab_con *p = c->peer;

	if (!p || c->peer_told || p->shutdown || p->down)
		return;
	c->peer_told = true;
	fk_ev_post_local(FAKE_DOWN, p, -ECONNRESET, NULL, 0);
}

/* Drops every queued event that would run at c. */
void fk_con_purge_to(struct fab_con *c)
{
	for (struct fake_ev *ev = fk_net.head, *n; ev; ev = n) {
		n = ev->next;
		if (ev->to == c) {
			fk_net.st.dropped++;
			fk_ev_discard(ev);
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

	fk_net.st.bad_writes++;
	fk_log(LOG_ERR, "fake: %s: write %zu of %zu refused: %s (addr 0x%llx len %llu key 0x%llx)",
		to->name, i + 1, ev->rma_cnt, why, (unsigned long long)ev->rma[i].addr,
		(unsigned long long)ev->rma[i].len, (unsigned long long)ev->rma[i].key);
	to->failed = true;
	if (!to->shutdown && !to->down)
		fk_ev_post_local(FAKE_DOWN, to, -ECONNRESET, NULL, 0);
	if (from) {
		from->failed = true;
		if (!from->shutdown && !from->down)
			fk_ev_post_local(FAKE_DOWN, from, -EACCES, NULL, 0);
	}
}

/* Places a write's bytes in the target's registrations; false when refused. */
static bool write_place(struct fake_ev *ev)
{
	const char *src = ev->data;

	/* Checked whole first: a refused write places nothing. */
	for (size_t i = 0; i < ev->rma_cnt; i++) {
		struct fake_mr *m;

		/*
		 * An empty write to no memory (address and key 0): the kernel
		 * RTRS's immediates, which verbs does not check (IBA C9-88). A
		 * registration never has key 0 here.
		 */
		if (!ev->rma[i].len && !ev->rma[i].addr && !ev->rma[i].key)
			continue;
		m = mr_find(ev->to->fab, ev->rma[i].key);

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

		if (!ev->rma[i].len)
			continue; /* an empty write (an immediate alone): src may be NULL */
		memcpy(m->buf + ev->rma[i].addr, src, ev->rma[i].len);
		src += ev->rma[i].len;
	}
	return true;
}

/* Whether ev can run at its connection now (a message needs a receive buffer). */
bool fk_ev_ready(const struct fake_ev *ev)
{
	return ev->kind != FAKE_SEND || !ev->to || ev->to->rx_count || ev->to->shutdown ||
	       ev->to->down || ev->to->failed;
}

static struct fab_lst *lst_find(const struct fab *f)
{
	int port = atoi(f->service);

	for (struct fab_lst *l = fk_net.lsts; l; l = l->next)
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
		fk_ev_post_local(FAKE_REJECT, c, -ECONNREFUSED, NULL, 0);
		return;
	}
	req = calloc(1, sizeof(*req));
	if (!req) {
		fk_log(LOG_ERR, "fake: %s: no memory for a connection request", c->name);
		fk_ev_post_local(FAKE_REJECT, c, -ECONNREFUSED, NULL, 0);
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
		fk_log(LOG_WARN, "fake: listener eventfd write: %s", strerror(errno));
}

/* ev takes effect now: remembered for fake_delivered. */
static void ev_record(const struct fake_ev *ev)
{
	struct fake_rec *r;

	if (fk_net.nr_recs == fk_net.cap_recs) {
		size_t cap = fk_net.cap_recs ? 2 * fk_net.cap_recs : 1024;
		struct fake_rec *n = realloc(fk_net.recs, cap * sizeof(*n));

		if (!n) {
			fk_log(LOG_ERR, "fake: no memory to record a delivery");
			return;
		}
		fk_net.recs = n;
		fk_net.cap_recs = cap;
	}
	r = &fk_net.recs[fk_net.nr_recs++];
	r->ev = *ev;
	r->ev.prev = r->ev.next = NULL;
	r->ev.to = r->ev.from = NULL;
	r->ev.buf = NULL;
	r->ev.len = MIN(ev->len, sizeof(r->head));
	if (r->ev.len)
		memcpy(r->head, ev->data, r->ev.len);
	r->ev.data = r->head;
}

/* done(ctx) for c, which asked for it: unless c is shut down or down. */
static void post_done_to(struct fab_con *c, void *ctx)
{
	struct fake_ev *done;

	if (!ctx || !c || c->shutdown || c->down)
		return;
	done = fk_ev_post_local(FAKE_DONE, c, 0, NULL, 0);
	if (done)
		done->ctx = ctx;
}

/*
 * The poster asked for a completion: it comes once the operation has
 * arrived, or with late_ack, for a client's write from local
 * registrations, once its acknowledgement does (acks_run): the write is
 * kept on its connection until then.
 */
static void post_done(struct fake_ev *ev)
{
	struct fab_con *from = ev->from;
	struct fake_ack *a, **tail;

	if (!fk_net.late_ack || ev->kind != FAKE_WRITE || !ev->nr_lvec || !from || from->server ||
	    from->shutdown || from->down || !(a = calloc(1, sizeof(*a)))) {
		post_done_to(from, ev->ctx);
		return;
	}
	a->seq = ev->seq;
	a->after = fk_net.seq;
	a->ctx = ev->ctx;
	a->lvec = ev->lvec;
	a->nr_lvec = ev->nr_lvec;
	ev->lvec = NULL;
	ev->nr_lvec = 0;
	for (tail = &from->acks; *tail; tail = &(*tail)->next)
		;
	*tail = a;
}

/*
 * late_ack: a word of c's peer (ev, a write or a message) was delivered to
 * c: the writes of c that arrived before the peer posted it complete now,
 * in order. A device that had not seen their acknowledgement sends them
 * again from their local vectors: each must still lie in its live
 * registration, or the connection fails as a local protection error
 * fails it, and what else it had on its way is flushed.
 */
static void acks_run(struct fab_con *c, const struct fake_ev *ev)
{
	while (c->acks && c->acks->after < ev->seq) {
		struct fake_ack *a = c->acks;
		bool live = true;

		c->acks = a->next;
		for (size_t i = 0; live && i < a->nr_lvec; i++)
			live = fk_local_live(a->lvec[i].buf, a->lvec[i].len, a->lvec[i].desc);
		free(a->lvec);
		if (!live && !c->shutdown && !c->down && !c->failed) {
			fk_net.st.local_prot_errs++;
			fk_log(LOG_ERR, "fake: %s: a write's send completed after its local "
			       "registration went: local protection error", c->name);
			c->failed = true;
			fk_ev_post_local(FAKE_DOWN, c, -EFAULT, NULL, 0);
		}
		if (live)
			post_done_to(c, a->ctx);
		free(a);
	}
	fk_con_sent(c);
}

/*
 * Runs ev, which is out of the queue; fk_net.lock held, dropped around the
 * owner's callback. Frees ev.
 */
void fk_ev_run(struct fake_ev *ev)
{
	struct fab_con *to = ev->to, *from = ev->from;
	const struct fab_con_ops *ops;
	void *priv;
	char *rx = NULL;

	fk_ev_uncount(ev);
	if (ev->kind == FAKE_CONNREQ) {
		ev_record(ev);
		connreq_arrive(ev);
		fk_ev_free(ev);
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
		fk_net.st.writes++;
		post_done(ev);
		fk_con_sent(from);
		if (!ev->with_imm) {
			ev_record(ev);
			fk_ev_free(ev);
			return;
		}
		break;
	case FAKE_SEND:
		if (ev->len > to->rx_size) {
			fk_log(LOG_ERR, "fake: %s: a %zu-byte message for %zu-byte receive buffers", to->name,
				ev->len, to->rx_size);
			to->failed = true;
			fk_ev_post_local(FAKE_DOWN, to, -EMSGSIZE, NULL, 0);
			goto drop;
		}
		rx = to->rx_buf + to->rx_next * to->rx_size;
		to->rx_next = (to->rx_next + 1) % to->rx_count;
		memcpy(rx, ev->data, ev->len);
		fk_net.st.sends++;
		post_done(ev);
		fk_con_sent(from);
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
	fk_log(LOG_DBG, "fake: %s #%llu to %s", fk_kind_names[ev->kind], (unsigned long long)ev->seq,
	     to->name);
	ops = to->cfg.ops;
	priv = to->cfg.priv;
	to->in_cb = true;
	to->cb_thread = pthread_self();
	fk_unlock();
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
		if (ev->with_imm)
			ops->imm(priv, ev->imm);
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
	fk_lock();
	to->in_cb = false;
	if (to->acks && (ev->kind == FAKE_WRITE || ev->kind == FAKE_SEND))
		acks_run(to, ev);
	pthread_cond_broadcast(&fk_net.cond);
	fk_ev_free(ev);
	return;

drop:
	fk_net.st.dropped++;
	fk_con_sent(from);
	fk_ev_free(ev);
}

/* ---- the pump ------------------------------------------------------------------------- */

static bool ev_held(const struct fake_ev *ev)
{
	return fk_net.hold && fk_net.hold(ev, fk_net.hold_arg);
}

/*
 * The first event the pump may deliver: not claimed, not held, and its
 * connection free; an event that must wait holds back the later ones of
 * its connection, which keeps each connection in order.
 */
struct fake_ev *fk_pump_next(void)
{
	unsigned gen = ++fk_net.scan_gen;

	for (struct fake_ev *ev = fk_net.head; ev; ev = ev->next) {
		if (ev->claimed || ev_held(ev))
			continue;
		if (ev->to && (ev->to->blocked_gen == gen || ev->to->in_cb || !fk_ev_ready(ev))) {
			ev->to->blocked_gen = gen;
			continue;
		}
		return ev;
	}
	return NULL;
}

void *fk_pump_thread(void *arg)
{
	pthread_setname_np(pthread_self(), "fake-pump");
	fk_lock();
	for (;;) {
		struct fake_ev *ev = NULL;

		while (!fk_net.pump_stop && !(ev = fk_pump_next()))
			pthread_cond_wait(&fk_net.cond, &fk_net.lock);
		if (fk_net.pump_stop)
			break;
		fk_ev_unlink(ev);
		fk_net.pump_busy = true;
		fk_ev_run(ev);
		fk_net.pump_busy = false;
		pthread_cond_broadcast(&fk_net.cond);
	}
	fk_unlock();
	return arg;
}

/* A loop is about to block: whoever waits checks again. */
void fk_loop_idle(void)
{
	fk_lock();
	pthread_cond_broadcast(&fk_net.cond);
	fk_unlock();
}

/* ---- posting --------------------------------------------------------------------------- */

/* After posting ev (fk_net.lock held): whether the test's hook wants it; then it is claimed. */
static bool hook_wants(struct fake_ev *ev, void (**fn)(struct fake_ev *, void *), void **arg)
{
	if (!ev || !fk_net.hook_pred || !fk_net.hook_pred(ev, fk_net.hook_pred_arg))
		return false;
	*fn = fk_net.hook_fn;
	*arg = fk_net.hook_arg;
	fk_net.hook_pred = NULL;
	ev->claimed = true;
	return true;
}

/*
 * ev was just queued (fk_net.lock held; NULL: nothing was): drops the lock,
 * then the test's hook runs here, on the posting thread, if ev is the
 * event it waits for.
 */
void fk_hook_and_unlock(struct fake_ev *ev)
{
	void (*fn)(struct fake_ev *, void *) = NULL;
	void *arg = NULL;
	bool hook;

	hook = hook_wants(ev, &fn, &arg);
	fk_unlock();
	if (hook)
		fn(ev, arg);
}

/* Queues ev (fk_net.lock held) and drops the lock; then the hook, as above. */
void fk_queue_and_hook(struct fake_ev *ev)
{
	fk_ev_queue(ev);
	fk_hook_and_unlock(ev);
}

/*
 * Posts ev from c to its peer; it is ours from here on. A write (counted)
 * takes a slot of c's send queue, or meets -EAGAIN. With the peer gone the
 * operation is lost on the wire: posted, never delivered (c's own DOWN is
 * on its way).
 */
__thread unsigned fk_chain_resv;

int fk_post_to_peer(struct fab_con *c, struct fake_ev *ev, bool counted)
{
	int rc = 0;

	fk_lock();
	if (c->shutdown || c->down) {
		rc = -ECONNRESET;
	} else if (counted && fk_chain_resv) {
		fk_chain_resv--; /* fake_post made room for it */
	} else if (counted && (c->eagain || c->tx_out >= c->tx_max)) {
		if (c->eagain)
			c->eagain--;
		rc = -EAGAIN;
	}
	if (!rc && !c->peer) {
		fk_net.st.dropped++;
	} else if (!rc) {
		ev->to = c->peer;
		ev->to_server = c->peer->server;
		ev->counted = counted;
		c->tx_out += counted;
		fk_queue_and_hook(ev);
		return 0;
	}
	fk_unlock();
	fk_ev_free(ev);
	return rc;
}
