/* SPDX-License-Identifier: MIT */
/*
 * The fake fabric's fab_ops (rtrs-fabric-fake.h): domains, registrations
 * with their keys, listeners, connections, and posting, which turns every
 * operation into an event on the fake's wire (rtrs-fabric-fake-wire.c).
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
	fk_lock();
	f->attr.iov_limit = fk_net.iov_limit;
	f->attr.rma_iov_limit = fk_net.rma_iov_limit;
	f->attr.max_queue = queue ? queue : 256;
	f->attr.inject_size = FAKE_INJECT_SIZE;
	f->attr.send_imm = !fk_net.no_send_imm; /* as RoCE: the kernel's always_invalidate */
	f->attr.chain = true;
	f->attr.win_binds = fk_net.win_binds;
	f->attr.mr_local = fk_net.mr_local;
	f->next = fk_net.fabs;
	fk_net.fabs = f;
	fk_unlock();
	*out = f;
	return 0;
}

static void fake_close(struct fab *f)
{
	fk_lock();
	LIST_DEL(&fk_net.fabs, f);
	for (struct fab_con *c = fk_net.cons; c; c = c->next)
		if (c->fab == f)
			fk_log(LOG_ERR, "fake: domain %s:%s closed under connection %s", f->node, f->service,
				c->name);
	while (f->mrs) {
		struct fake_mr *m = f->mrs;

		fk_log(LOG_ERR, "fake: domain %s:%s closed with a registration of %zu bytes", f->node,
			f->service, m->len);
		f->mrs = m->next;
		free(m);
	}
	fk_unlock();
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
	/* As tcp: local memory needs no registration (unless fake_set_mr_local). */
	if (access == FAB_MR_LOCAL && !f->attr.mr_local)
		return 0;
	fk_lock();
	if (access != FAB_MR_LOCAL && fk_net.fail_regs) {
		fk_net.fail_regs--;
		fk_unlock();
		return -ENOMEM;
	}
	fk_unlock();
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->buf = buf;
	m->len = len;
	m->access = access;
	fk_lock();
	/* Keys are never used twice in a domain: a revoked one stays invalid. */
	m->key = access & FAB_MR_KEY64 ? f->next_key64++ : f->next_key++;
	m->next = f->mrs;
	f->mrs = m;
	if (access == FAB_MR_LOCAL)
		fk_net.local_regs++;
	else
		fk_net.st.regs++;
	fk_unlock();
	mr->ops = &fab_fake_ops;
	mr->priv = m;
	mr->key = m->key;
	mr->base = 0;
	mr->desc = f->attr.mr_local ? m : NULL;
	return 0;
}

/* Lock held: m leaves its domain and is freed; false when no domain holds it. */
static bool mr_free_locked(struct fake_mr *m, size_t len)
{
	for (struct fab *f = fk_net.fabs; f; f = f->next) {
		for (struct fake_mr **pm = &f->mrs; *pm; pm = &(*pm)->next) {
			if (*pm == m) {
				*pm = m->next;
				free(m);
				return true;
			}
		}
	}
	/* Its domain was closed under it (and said so): freed with the domain. */
	fk_log(LOG_ERR, "fake: deregistering %zu bytes that no domain holds", len);
	return false;
}

static void fake_mr_dereg(struct fab_mr *mr)
{
	if (!mr->priv)
		return;
	fk_lock();
	mr_free_locked(mr->priv, mr->len);
	fk_unlock();
	mr->priv = NULL;
	mr->ops = NULL;
}

bool fk_local_live(const void *buf, size_t len, const void *desc)
{
	const char *b = buf;

	for (struct fab *f = fk_net.fabs; desc && f; f = f->next)
		for (const struct fake_mr *x = f->mrs; x; x = x->next)
			if (x == desc)
				return b >= x->buf && (size_t)(b - x->buf) <= x->len &&
				       len <= x->len - (size_t)(b - x->buf);
	return false;
}

void fk_con_sent(struct fab_con *c)
{
	uint64_t first = UINT64_MAX; /* the oldest of c's sends not completed */

	if (!c || !c->defer)
		return;
	for (struct fake_ev *ev = fk_net.head; ev; ev = ev->next) {
		if (ev->from == c && (ev->kind == FAKE_WRITE || ev->kind == FAKE_SEND)) {
			first = ev->seq; /* the queue is in posting order */
			break;
		}
	}
	for (struct fake_ack *a = c->acks; a; a = a->next)
		first = MIN(first, a->seq);
	for (struct fake_defer **pd = &c->defer; *pd;) {
		struct fake_defer *d = *pd;

		if (d->seq >= first) {
			pd = &d->next;
			continue;
		}
		*pd = d->next;
		mr_free_locked(d->mr, d->len);
		free(d);
	}
}

void fk_con_sent_all(struct fab_con *c)
{
	while (c->acks) {
		struct fake_ack *a = c->acks;

		c->acks = a->next;
		free(a->lvec);
		free(a);
	}
	while (c->defer) {
		struct fake_defer *d = c->defer;

		c->defer = d->next;
		mr_free_locked(d->mr, d->len);
		free(d);
	}
}

/* Kept until the sends c posted so far have completed (fk_con_sent), or c goes. */
static void fake_mr_dereg_after(struct fab_con *c, struct fab_mr *mr)
{
	struct fake_defer *d;

	if (!mr->priv)
		return;
	d = malloc(sizeof(*d));
	if (!d) {
		fake_mr_dereg(mr);
		return;
	}
	d->mr = mr->priv;
	d->len = mr->len;
	fk_lock();
	d->seq = fk_net.seq;
	d->next = c->defer;
	c->defer = d;
	fk_con_sent(c);
	fk_unlock();
	mr->priv = NULL;
	mr->ops = NULL;
}

/* A window: a registration of nothing until a bind gives it a range and a key. */
static int fake_win_alloc(struct fab *f, struct fab_win *w)
{
	struct fake_mr *m;

	memset(w, 0, sizeof(*w));
	if (!f->attr.win_binds)
		return -EOPNOTSUPP;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->access = FAB_MR_REMOTE_WRITE;
	fk_lock();
	m->key = f->next_key++;
	m->next = f->mrs;
	f->mrs = m;
	fk_net.st.windows++;
	fk_unlock();
	w->ops = &fab_fake_ops;
	w->priv = m;
	w->key = m->key;
	return 0;
}

static void fake_win_free(struct fab_win *w)
{
	struct fab_mr mr = { .ops = &fab_fake_ops, .priv = w->priv };

	fake_mr_dereg(&mr);
	w->priv = NULL;
	w->ops = NULL;
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
	fk_lock();
	if (!port)
		port = fk_net.next_port++;
	for (struct fab_lst *o = fk_net.lsts; o; o = o->next) {
		if (o->port == port && !strcmp(o->fab->node, f->node)) {
			fk_unlock();
			close(l->fd);
			free(l);
			return -EADDRINUSE;
		}
	}
	l->port = port;
	l->next = fk_net.lsts;
	fk_net.lsts = l;
	fk_unlock();
	*out = l;
	return 0;
}

static void fake_lst_close(struct fab_lst *l)
{
	fk_lock();
	LIST_DEL(&fk_net.lsts, l);
	/* Requests nobody took: refused, as by a closed port. */
	while (l->inbox) {
		struct fab_connreq *req = l->inbox;

		l->inbox = req->next;
		if (req->clt)
			fk_ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, NULL, 0);
		free(req->data);
		free(req);
	}
	fk_unlock();
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
		fk_log(LOG_WARN, "fake: listener eventfd read: %s", strerror(errno));
	for (;;) {
		struct fab_connreq *req;

		fk_lock();
		req = l->inbox;
		if (req) {
			l->inbox = req->next;
			if (!l->inbox)
				l->inbox_tail = NULL;
			l->current = req;
			fk_net.st.connreqs++;
		}
		fk_unlock();
		if (!req)
			return 0;
		cb(priv, req, req->data, req->len);
		fk_lock();
		l->current = NULL;
		fk_net.st.connreqs_done++;
		if (!req->answered && req->clt)
			fk_ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, NULL, 0);
		pthread_cond_broadcast(&fk_net.cond);
		fk_unlock();
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
	struct fake_ev *ev = NULL;
	int rc = 0;

	fk_lock();
	req->answered = true;
	fk_net.st.rejects++;
	if (req->clt && !(ev = fk_ev_post_local(FAKE_REJECT, req->clt, -ECONNREFUSED, data, len)))
		rc = -ENOMEM;
	/* A test may take the reject as it is posted (fake_on_post): to lose its data. */
	fk_hook_and_unlock(ev);
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
	fk_lock();
	if (c->rx_count) {
		fk_unlock();
		free(buf);
		return -EEXIST;
	}
	c->rx_buf = buf;
	c->rx_size = size;
	c->rx_count = count;
	pthread_cond_broadcast(&fk_net.cond); /* messages waiting for buffers may go */
	fk_unlock();
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
	c->serial = ++fk_net.serial;
	c->next = fk_net.cons;
	fk_net.cons = c;
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
	ev = fk_ev_new(FAKE_CONNREQ, NULL, c);
	if (!ev || fk_ev_set_data(ev, data, len)) {
		free(ev);
		free(c->rx_buf);
		free(c);
		return -ENOMEM;
	}
	fk_lock();
	con_list_add(c);
	*out = c;
	fk_queue_and_hook(ev);
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
	fk_lock();
	req->answered = true;
	fk_net.st.accepts++;
	con_list_add(s);
	*out = s;
	c = req->clt;
	if (!c || c->shutdown) {
		/* The client gave up meanwhile: this end learns it at once. */
		fk_ev_post_local(FAKE_DOWN, s, -ECONNRESET, NULL, 0);
	} else {
		memcpy(s->sess, c->sess, sizeof(s->sess));
		memcpy(s->host, c->host, sizeof(s->host));
		s->cid = c->cid;
		s->peer = c;
		c->peer = s;
		fk_ev_post_local(FAKE_ACCEPT, c, 0, data, len);
		fk_ev_post_local(FAKE_ESTABLISHED, s, 0, NULL, 0);
	}
	fk_unlock();
	return 0;
}

static void shutdown_locked(struct fab_con *c)
{
	if (c->shutdown)
		return;
	c->shutdown = true;
	fk_con_purge_to(c);
	fk_con_tell_peer(c);
	pthread_cond_broadcast(&fk_net.cond);
}

static void fake_con_shutdown(struct fab_con *c)
{
	fk_lock();
	shutdown_locked(c);
	fk_unlock();
}

static void fake_con_destroy(struct fab_con *c)
{
	struct timespec dl = fk_deadline();
	int rc = 0;

	fk_lock();
	shutdown_locked(c);
	/* A callback running elsewhere finishes first, as a completion thread is joined. */
	while (c->in_cb && !pthread_equal(c->cb_thread, pthread_self()) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fk_net.cond, &fk_net.lock, &dl);
	if (c->in_cb) {
		/* Freeing it would pull it from under its callback: leak it, loudly. */
		fk_log(LOG_ERR, "fake: %s destroyed %s", c->name,
		     rc ? "while its callback still runs" : "from its own callback");
		fk_unlock();
		return;
	}
	/* What its last callback posted for it goes too. */
	fk_con_purge_to(c);
	fk_con_tell_peer(c);
	LIST_DEL(&fk_net.cons, c);
	for (struct fake_ev *ev = fk_net.head, *n; ev; ev = n) {
		n = ev->next;
		if (ev->from == c && ev->kind == FAKE_CONNREQ) {
			fk_net.st.dropped++;
			fk_ev_discard(ev); /* withdrawn before it arrived */
		} else if (ev->from == c) {
			fk_ev_uncount(ev);
			ev->from = NULL; /* on the wire: it may still arrive */
		}
	}
	for (struct fake_ev *ev = fk_net.zombies; ev; ev = ev->next)
		if (ev->from == c)
			ev->from = NULL;
	for (struct fab_lst *l = fk_net.lsts; l; l = l->next) {
		for (struct fab_connreq *req = l->inbox; req; req = req->next)
			if (req->clt == c)
				req->clt = NULL;
		if (l->current && l->current->clt == c)
			l->current->clt = NULL;
	}
	if (c->peer)
		c->peer->peer = NULL;
	fk_con_sent_all(c);
	pthread_cond_broadcast(&fk_net.cond);
	fk_unlock();
	free(c->rx_buf);
	free(c);
}

static int fake_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	return con_rx_alloc(c, count, MAX(size, 1));
}

static void fake_con_kick(struct fab_con *c)
{
	fk_lock();
	if (!c->kick_queued && !c->shutdown && !c->down)
		fk_ev_post_local(FAKE_KICK, c, 0, NULL, 0);
	fk_unlock();
}

static void fake_con_retry_later(struct fab_con *c)
{
	fk_lock();
	/* After the next completion; with nothing on its way, now (the 1 ms of the real fabrics). */
	if (c->tx_out)
		c->retry = true;
	else if (!c->kick_queued && !c->shutdown && !c->down)
		fk_ev_post_local(FAKE_KICK, c, 0, NULL, 0);
	fk_unlock();
}

static void fake_con_local(const struct fab_con *c, char *buf, size_t len)
{
	snprintf(buf, len, "%s:%u", c->fab->src[0] ? c->fab->src : "fake-client", c->serial);
}

/*
 * Posts a write: the bytes are taken now (the fabric's copy is on the
 * wire) and placed when it is delivered.
 */
static int post_write(struct fab_con *c, const struct iovec *iov, void *const *desc,
		      size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
		      uint32_t imm, void *ctx)
{
	uint64_t local = 0, remote = 0;
	struct fake_ev *ev;
	char *p;

	for (size_t i = 0; i < iov_cnt; i++)
		local += iov[i].iov_len;
	for (size_t i = 0; i < rma_cnt; i++)
		remote += rma[i].len;
	if (local != remote) {
		fk_log(LOG_ERR, "fake: %s: a write of %llu local bytes to %llu remote ones", c->name,
			(unsigned long long)local, (unsigned long long)remote);
		return -EINVAL;
	}
	ev = fk_ev_new(FAKE_WRITE, NULL, c);
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
	if (desc && iov_cnt && c->fab->attr.mr_local) {
		/* What a late completion checks (fake_set_late_ack). */
		ev->lvec = calloc(iov_cnt, sizeof(*ev->lvec));
		if (!ev->lvec) {
			fk_ev_free(ev);
			return -ENOMEM;
		}
		for (size_t i = 0; i < iov_cnt; i++)
			ev->lvec[i] = (struct fake_lvec){ iov[i].iov_base, iov[i].iov_len, desc[i] };
		ev->nr_lvec = iov_cnt;
	}
	p = ev->buf;
	ev->data = p;
	ev->len = local;
	ev->with_imm = with_imm;
	ev->imm = imm;
	ev->ctx = ctx;
	ev->rma_cnt = rma_cnt;
	memcpy(ev->rma, rma, rma_cnt * sizeof(*rma));
	return fk_post_to_peer(c, ev, true);
}

/* mr_local: each local vector lies in the live registration its descriptor names. */
static int check_local(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t cnt)
{
	int rc = 0;

	fk_lock();
	for (size_t i = 0; !rc && i < cnt; i++)
		if (!fk_local_live(iov[i].iov_base, iov[i].iov_len, desc ? desc[i] : NULL))
			rc = -EFAULT;
	fk_unlock();
	if (rc)
		fk_log(LOG_ERR, "fake: %s: a write from memory that is not registered", c->name);
	return rc;
}

static int fake_write(struct fab_con *c, const struct iovec *iov, void *const *desc,
		      size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
		      uint32_t imm, void *ctx)
{
	if (c->fab->attr.mr_local && check_local(c, iov, desc, iov_cnt))
		return -EFAULT;
	if (rma_cnt > ARRAY_SIZE(((struct fake_ev *)0)->rma) ||
	    rma_cnt > c->fab->attr.rma_iov_limit || iov_cnt > c->fab->attr.iov_limit)
		return -EINVAL;
	return post_write(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx);
}

/* As tcp's: at once (*left), or queued until it arrives (fake_set_tx_queued). */
static int fake_write_left(struct fab_con *c, const struct iovec *iov, void *const *desc,
			   size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
			   uint32_t imm, void *ctx, bool *left)
{
	fk_lock();
	*left = !fk_net.tx_queued;
	fk_unlock();
	return fake_write(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, *left ? NULL : ctx);
}

static int fake_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			  uint64_t key, uint32_t imm, void *ctx)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct fab_rma rma = { .addr = addr, .len = len, .key = key };

	if (len > c->fab->attr.inject_size)
		return -EMSGSIZE;
	/* Even an empty write names a region it must be allowed into, as on tcp. */
	return post_write(c, &iov, NULL, len ? 1 : 0, &rma, 1, true, imm, ctx);
}

static int fake_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	struct fake_ev *ev = fk_ev_new(FAKE_SEND, NULL, c);

	if (!ev || fk_ev_set_data(ev, buf, len)) {
		free(ev);
		return -ENOMEM;
	}
	ev->ctx = ctx;
	return fk_post_to_peer(c, ev, false);
}

/* A message with an immediate: the peer's recv(), then its imm(). */
static int fake_send_imm(struct fab_con *c, const void *buf, size_t len, void *desc, uint32_t imm,
			 void *ctx)
{
	struct fake_ev *ev = fk_ev_new(FAKE_SEND, NULL, c);

	(void)desc;
	if (!fab_attr(c->fab)->send_imm) {
		free(ev);
		return -EOPNOTSUPP;
	}
	if (!ev || fk_ev_set_data(ev, buf, len)) {
		free(ev);
		return -ENOMEM;
	}
	ev->ctx = ctx;
	ev->with_imm = true;
	ev->imm = imm;
	return fk_post_to_peer(c, ev, false);
}

static int fake_win_bind(struct fab_con *c, struct fab_win *w, const struct fab_mr *mr, void *buf,
			 size_t len, void *ctx)
{
	struct fake_mr *m = w->priv;
	struct fake_ev *done;
	int rc = 0;

	if (!m || !mr || (len && (!mr->buf || (char *)buf < (char *)mr->buf ||
				   len > mr->len - (size_t)((char *)buf - (char *)mr->buf))))
		return -EINVAL;
	fk_lock();
	if (c->shutdown || c->down) {
		rc = -ECONNRESET;
	} else {
		m->buf = buf;
		m->len = len;
		m->key = c->fab->next_key++;
		w->key = m->key;
		w->binds++;
		fk_net.st.binds++;
		if (ctx) {
			done = fk_ev_post_local(FAKE_DONE, c, 0, NULL, 0);
			if (done)
				done->ctx = ctx;
		}
	}
	fk_unlock();
	return rc;
}

/*
 * A chain: checked whole, room made for all of its writes at once (all or
 * nothing, as one post on verbs), then posted one by one in order.
 */
static int fake_post(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx)
{
	const struct fab_attr *a = &c->fab->attr;
	unsigned counted = 0;
	int rc = 0;

	for (size_t i = 0; i < n; i++) {
		const struct fab_wr *w = &wrs[i];

		if (w->kind == FAB_WR_WRITE &&
		    (w->rma_cnt > ARRAY_SIZE(((struct fake_ev *)0)->rma) ||
		     w->rma_cnt > a->rma_iov_limit || w->iov_cnt > a->iov_limit))
			return -EINVAL;
		if (w->kind == FAB_WR_WRITE_IMM && w->len > a->inject_size)
			return -EMSGSIZE;
		if ((w->kind == FAB_WR_SEND_IMM && !a->send_imm) || w->kind == FAB_WR_SEND_INV)
			return -EOPNOTSUPP;
		counted += w->kind == FAB_WR_WRITE || w->kind == FAB_WR_WRITE_IMM;
	}
	fk_lock();
	if (c->shutdown || c->down) {
		rc = -ECONNRESET;
	} else if (counted && (c->eagain || c->tx_out + counted > c->tx_max)) {
		if (c->eagain)
			c->eagain--;
		rc = -EAGAIN;
	}
	fk_unlock();
	if (rc)
		return rc;
	fk_chain_resv = counted;
	for (size_t i = 0; !rc && i < n; i++) {
		const struct fab_wr *w = &wrs[i];
		void *x = i + 1 == n ? ctx : NULL;

		switch (w->kind) {
		case FAB_WR_WRITE:
			rc = fake_write(c, w->iov, w->desc, w->iov_cnt, w->rma, w->rma_cnt,
					w->with_imm, w->imm, x);
			break;
		case FAB_WR_WRITE_IMM:
			rc = fake_write_imm(c, w->buf, w->len, w->addr, w->key, w->imm, x);
			break;
		default:
			rc = fake_send_imm(c, w->buf, w->len, w->desc ? w->desc[0] : NULL, w->imm, x);
			break;
		}
	}
	fk_chain_resv = 0;
	if (!rc && n > 1) {
		fk_lock();
		fk_net.st.chains++;
		fk_unlock();
	}
	return rc;
}

const struct fab_ops fab_fake_ops = {
	.name = "fake",
	.open = fake_open,
	.close = fake_close,
	.attr = fake_attr,
	.mr_reg = fake_mr_reg,
	.mr_dereg = fake_mr_dereg,
	.mr_dereg_after = fake_mr_dereg_after,
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
	.write_left = fake_write_left,
	.write_imm = fake_write_imm,
	.send = fake_send,
	.send_imm = fake_send_imm,
	.post = fake_post,
	.win_alloc = fake_win_alloc,
	.win_free = fake_win_free,
	.win_bind = fake_win_bind,
};
