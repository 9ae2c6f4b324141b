/* SPDX-License-Identifier: MIT */
/*
 * What a test does with the fake fabric's events and what it waits for
 * (the fake_* functions of rtrs-fabric-fake.h other than the fab_ops).
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
#include "offload.h"
#include "rtrs-fabric-fake-pri.h"
#include "util.h"

/* ---- the test's side ------------------------------------------------------------------ */

int fake_init(void)
{
	int rc;

	fk_lock();
	if (fk_net.ready) {
		fk_unlock();
		return 0;
	}
	cond_init_mono(&fk_net.cond);
	fk_net.ready = true;
	fk_unlock();
	rc = fab_register(&fab_fake_ops);
	if (rc)
		return rc;
	loop_test_clock(fk_loop_idle);
	offload_idle_hook(fk_loop_idle);
	rc = -pthread_create(&fk_net.pump, NULL, fk_pump_thread, NULL);
	fk_net.pump_started = !rc;
	return rc;
}

static int count_leftovers(bool report)
{
	int n = 0;

	for (struct fab_con *c = fk_net.cons; c; c = c->next, n++)
		if (report)
			fk_log(LOG_ERR, "fake: connection %s was not destroyed", c->name);
	for (struct fab_lst *l = fk_net.lsts; l; l = l->next, n++)
		if (report)
			fk_log(LOG_ERR, "fake: listener on port %d was not closed", l->port);
	for (struct fab *f = fk_net.fabs; f; f = f->next) {
		n++;
		if (report)
			fk_log(LOG_ERR, "fake: domain %s:%s was not closed", f->node, f->service);
		for (struct fake_mr *m = f->mrs; m; m = m->next, n++)
			if (report)
				fk_log(LOG_ERR, "fake: a registration of %zu bytes (key 0x%llx) was left",
					m->len, (unsigned long long)m->key);
	}
	for (struct fake_ev *ev = fk_net.head; ev; ev = ev->next, n++)
		if (report)
			fk_log(LOG_ERR, "fake: a %s event for %s#%d was left in the queue",
				fk_kind_names[ev->kind], ev->sess, ev->cid);
	return n;
}

int fake_leftovers(void)
{
	int n;

	fk_lock();
	n = count_leftovers(true);
	fk_unlock();
	return n;
}

int fake_fini(void)
{
	int n;

	fk_lock();
	fk_net.pump_stop = true;
	pthread_cond_broadcast(&fk_net.cond);
	fk_unlock();
	if (fk_net.pump_started)
		pthread_join(fk_net.pump, NULL);
	fk_net.pump_started = false;
	fk_lock();
	n = count_leftovers(true);
	while (fk_net.head) {
		struct fake_ev *ev = fk_net.head;

		fk_ev_unlink(ev);
		fk_ev_free(ev);
	}
	while (fk_net.zombies) {
		struct fake_ev *ev = fk_net.zombies;

		fk_net.zombies = ev->next;
		fk_ev_free(ev);
	}
	free(fk_net.recs);
	fk_net.recs = NULL;
	fk_net.nr_recs = fk_net.cap_recs = 0;
	fk_unlock();
	return n;
}

void fake_set_limits(size_t iov_limit, size_t rma_iov_limit)
{
	fk_lock();
	fk_net.iov_limit = MAX(iov_limit, 1);
	fk_net.rma_iov_limit = MIN(MAX(rma_iov_limit, 1), 8);
	fk_unlock();
}

void fake_set_send_imm(bool on)
{
	fk_lock();
	fk_net.no_send_imm = !on;
	fk_unlock();
}

void fake_set_mr_local(bool on)
{
	fk_lock();
	fk_net.mr_local = on;
	fk_unlock();
}

void fake_set_late_ack(bool on)
{
	fk_lock();
	fk_net.late_ack = on;
	fk_unlock();
}

void fake_set_tx_queued(bool on)
{
	fk_lock();
	fk_net.tx_queued = on;
	fk_unlock();
}

void fake_set_windows(unsigned binds)
{
	fk_lock();
	fk_net.win_binds = binds;
	fk_unlock();
}

void fake_fail_regs(unsigned n)
{
	fk_lock();
	fk_net.fail_regs = n;
	fk_unlock();
}

uint64_t fake_local_regs(void)
{
	uint64_t n;

	fk_lock();
	n = fk_net.local_regs;
	fk_unlock();
	return n;
}

bool fake_any(const struct fake_ev *ev, void *arg)
{
	return true;
}

void fake_hold(fake_pred pred, void *arg)
{
	fk_lock();
	fk_net.hold = pred;
	fk_net.hold_arg = arg;
	/* Whatever the pump delivers now was taken under the old rule. */
	while (fk_net.pump_busy && !pthread_equal(pthread_self(), fk_net.pump))
		pthread_cond_wait(&fk_net.cond, &fk_net.lock);
	pthread_cond_broadcast(&fk_net.cond);
	fk_unlock();
}

static struct fake_ev *find_locked(fake_pred pred, void *arg)
{
	for (struct fake_ev *ev = fk_net.head; ev; ev = ev->next) {
		if (ev->claimed || (pred && !pred(ev, arg)))
			continue;
		ev->claimed = true;
		return ev;
	}
	return NULL;
}

/* From a fake_wait condition the lock is ours already. */
static bool lock_unless_held(void)
{
	if (fk_locked())
		return false;
	fk_lock();
	return true;
}

struct fake_ev *fake_find(fake_pred pred, void *arg)
{
	bool locked = lock_unless_held();
	struct fake_ev *ev;

	ev = find_locked(pred, arg);
	if (locked)
		fk_unlock();
	return ev;
}

struct fake_ev *fake_wait_ev(fake_pred pred, void *arg, const char *what)
{
	struct timespec dl = fk_deadline();
	struct fake_ev *ev;
	int rc = 0;

	fk_lock();
	while (!(ev = find_locked(pred, arg)) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fk_net.cond, &fk_net.lock, &dl);
	fk_unlock();
	if (!ev)
		fk_log(LOG_ERR, "fake: no %s within %d ms", what, FAKE_WAIT_MS);
	return ev;
}

/* Takes a zombie off its list; true when ev was one. */
static bool zombie_take(struct fake_ev *ev)
{
	for (struct fake_ev **pz = &fk_net.zombies; *pz; pz = &(*pz)->next) {
		if (*pz == ev) {
			*pz = ev->next;
			return true;
		}
	}
	return false;
}

int fake_deliver(struct fake_ev *ev)
{
	struct timespec dl = fk_deadline();
	int rc = 0;

	fk_lock();
	if (zombie_take(ev)) {
		fk_unlock();
		fk_ev_free(ev);
		return -ENOTCONN;
	}
	while (ev->queued && ev->to && ev->to->in_cb &&
	       !pthread_equal(ev->to->cb_thread, pthread_self()) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fk_net.cond, &fk_net.lock, &dl);
	if (!ev->queued) { /* its connection went while we waited: a zombie now */
		zombie_take(ev);
		fk_unlock();
		fk_ev_free(ev);
		return -ENOTCONN;
	}
	if (ev->to && ev->to->in_cb) {
		/* Another callback of the same connection inside this one: never over a fabric. */
		fk_log(LOG_ERR, "fake: %s: %s", ev->to->name,
			rc == ETIMEDOUT ? "its callback did not return" :
			"delivery from inside its own callback");
		fk_unlock();
		return rc == ETIMEDOUT ? -ETIMEDOUT : -EDEADLK;
	}
	if (!fk_ev_ready(ev)) {
		fk_unlock();
		return -ENOBUFS;
	}
	fk_ev_unlink(ev);
	fk_ev_run(ev);
	fk_unlock();
	return 0;
}

void fake_drop(struct fake_ev *ev)
{
	fk_lock();
	if (!zombie_take(ev)) {
		fk_ev_unlink(ev);
		fk_ev_uncount(ev);
		fk_con_sent(ev->from);
		fk_net.st.dropped++;
		pthread_cond_broadcast(&fk_net.cond);
	}
	fk_unlock();
	fk_ev_free(ev);
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
	fk_lock();
	*d = *ev;
	d->buf = NULL;
	d->data = NULL;
	d->len = 0;
	d->counted = false;
	d->claimed = true;
	d->lvec = NULL; /* a copy on the wire, not a send of ours */
	d->nr_lvec = 0;
	if (fk_ev_set_data(d, ev->data, ev->len)) {
		fk_unlock();
		free(d);
		return NULL;
	}
	if (!ev->queued) /* a zombie's copy: nowhere to go either */
		d->to = d->from = NULL;
	if (d->to)
		fk_ev_queue(d);
	else {
		d->next = fk_net.zombies;
		fk_net.zombies = d;
	}
	fk_unlock();
	return d;
}

int fake_rewrite(struct fake_ev *ev, const void *data, size_t len)
{
	void *buf = len ? malloc(len) : NULL;

	if (len && !buf)
		return -ENOMEM;
	if (len)
		memcpy(buf, data, len);
	fk_lock();
	free(ev->buf);
	ev->buf = buf;
	ev->data = buf;
	ev->len = len;
	fk_unlock();
	return 0;
}

void fake_unclaim(struct fake_ev *ev)
{
	fk_lock();
	if (zombie_take(ev)) {
		fk_ev_free(ev);
	} else {
		ev->claimed = false;
		pthread_cond_broadcast(&fk_net.cond);
	}
	fk_unlock();
}

void fake_on_post(fake_pred pred, void *pred_arg, void (*fn)(struct fake_ev *ev, void *arg),
		  void *arg)
{
	fk_lock();
	fk_net.hook_pred = pred;
	fk_net.hook_pred_arg = pred_arg;
	fk_net.hook_fn = fn;
	fk_net.hook_arg = arg;
	fk_unlock();
}

static bool con_matches(const struct fab_con *c, const char *sess, const char *host, int cid)
{
	return (!sess || !strcmp(c->sess, sess)) && (!host || !strcmp(c->host, host)) &&
	       (cid < 0 || c->cid == cid);
}

int fake_fail(const char *sess, const char *host, int cid, int clt_err, int srv_err)
{
	int n = 0;

	fk_lock();
	for (struct fab_con *c = fk_net.cons; c; c = c->next) {
		struct fab_con *s = c->peer;

		if (c->server || c->shutdown || c->failed || !con_matches(c, sess, host, cid))
			continue;
		n++;
		c->failed = true;
		if (clt_err && !c->down)
			fk_ev_post_local(FAKE_DOWN, c, clt_err, NULL, 0);
		if (!s)
			continue;
		s->failed = true;
		c->peer_told = s->peer_told = true; /* told here, or never */
		if (srv_err && !s->shutdown && !s->down)
			fk_ev_post_local(FAKE_DOWN, s, srv_err, NULL, 0);
	}
	fk_unlock();
	return n;
}

int fake_eagain(const char *sess, const char *host, int cid, bool server, unsigned n)
{
	int found = 0;

	fk_lock();
	for (struct fab_con *c = fk_net.cons; c; c = c->next) {
		if (c->server != server || c->shutdown || !con_matches(c, sess, host, cid))
			continue;
		c->eagain = n;
		found++;
	}
	fk_unlock();
	return found;
}

/* Nothing the pump may deliver, no callback or offloaded job running, every loop idle. */
static bool settled(void *arg)
{
	if (fk_net.pump_busy || fk_pump_next() || !offload_idle())
		return false;
	for (struct fab_con *c = fk_net.cons; c; c = c->next)
		if (c->in_cb)
			return false;
	return loop_test_idle();
}

int fake_wait(bool (*cond)(void *arg), void *arg, const char *what)
{
	struct timespec dl = fk_deadline();
	bool ok;
	int rc = 0;

	fk_lock();
	while (!(ok = cond(arg)) && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&fk_net.cond, &fk_net.lock, &dl);
	fk_unlock();
	if (!ok) {
		fk_log(LOG_ERR, "fake: waited %d ms for %s", FAKE_WAIT_MS, what);
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
	fk_lock();
	pthread_cond_broadcast(&fk_net.cond);
	fk_unlock();
}

unsigned fake_delivered(fake_pred pred, void *arg)
{
	bool locked = lock_unless_held();
	unsigned n = 0;

	for (size_t i = 0; i < fk_net.nr_recs; i++)
		n += !pred || pred(&fk_net.recs[i].ev, arg);
	if (locked)
		fk_unlock();
	return n;
}

void fake_delivered_reset(void)
{
	fk_lock();
	fk_net.nr_recs = 0;
	fk_unlock();
}

void fake_get_stats(struct fake_stats *st)
{
	bool locked = lock_unless_held();

	*st = fk_net.st;
	st->cons = 0;
	st->events = 0;
	for (struct fab_con *c = fk_net.cons; c; c = c->next)
		st->cons++;
	for (struct fake_ev *ev = fk_net.head; ev; ev = ev->next)
		st->events++;
	if (locked)
		fk_unlock();
}
