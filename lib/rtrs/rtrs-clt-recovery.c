/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: what happens when a path fails. The failure reaches the
 * service loop (rtrs_path_fail), which stops the path (clt_path_stop): its
 * requests fail, or, with fencing, wait until another path's fence of the
 * failed one is answered and are then sent again (rtrs-clt-fence.c,
 * clt_sess_retry_waiting). Then the reconnect decision (rtrs_should_reconnect)
 * and the reconnect timer (docs/protocol.md section 10,
 * docs/security.md section 5).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "rtrs-clt-pri.h"

/*
 * Loop thread: retries the waiting requests; fails those past their
 * deadline (-ETIMEDOUT) or with no path left to wait for (-ECONNABORTED).
 * Completions run without the lock: conf may submit again.
 */
void clt_sess_retry_waiting(struct rtrs_clt_sess *s)
{
	struct clt_req_list list = STAILQ_HEAD_INITIALIZER(list);
	struct clt_req_list keep = STAILQ_HEAD_INITIALIZER(keep);
	struct clt_req *req;
	bool may_come = clt_sess_path_may_come(s);
	uint64_t now = now_ms();

	clt_fence_process(s, now, may_come);

	pthread_mutex_lock(&s->wait_lock);
	STAILQ_CONCAT(&list, &s->waiting);
	pthread_mutex_unlock(&s->wait_lock);
	while ((req = STAILQ_FIRST(&list))) {
		int err = 0;

		STAILQ_REMOVE_HEAD(&list, wait_link);
		if (!may_come)
			err = -ECONNABORTED;
		else if (now >= req->wait_deadline_ms)
			err = -ETIMEDOUT;
		else if (clt_req_route(req, true) == 0)
			continue; /* on its way */
		if (err) {
			if (err == -ETIMEDOUT)
				log_warn_rl("%s: no path came up within %u ms, request %u fails",
					    s->name, atomic_load(&s->fast_io_fail_ms), req->id);
			req->path = NULL;
			clt_req_complete(req, err);
			continue;
		}
		/* A failed try left it INFLIGHT: it still waits. */
		req->path = NULL;
		STAILQ_INSERT_TAIL(&keep, req, wait_link);
	}
	pthread_mutex_lock(&s->wait_lock);
	/* Still first in line: those that came meanwhile go after them. */
	STAILQ_CONCAT(&keep, &s->waiting);
	STAILQ_CONCAT(&s->waiting, &keep);
	if (STAILQ_EMPTY(&s->waiting) && STAILQ_EMPTY(&s->fencing) && !atomic_load(&s->quar_n))
		loop_timer_arm(&s->wait_timer, 0, 0);
	pthread_mutex_unlock(&s->wait_lock);
}

void clt_sess_wait_timer(struct loop_timer *t)
{
	clt_sess_retry_waiting(container_of(t, struct rtrs_clt_sess, wait_timer));
}

void clt_sess_wait_work(struct loop_work *w)
{
	clt_sess_retry_waiting(container_of(w, struct rtrs_clt_sess, wait_work));
}

bool clt_path_change_state(struct clt_path *p, enum rtrs_path_state to)
{
	return rtrs_path_set_state(&p->base, to);
}

void clt_path_destroy_cons(struct clt_path *p)
{
	clt_path_poll_leave(p);
	rtrs_path_destroy_cons(&p->base);
	for (unsigned i = 0; i < p->base.nr_cons; i++)
		p->cons[i].connected = false;
}

/* Arms the next reconnect attempt: delay plus random jitter. Loop thread. */
void clt_path_schedule_reconnect(struct clt_path *p, unsigned min_ms)
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
bool clt_path_should_reconnect(struct clt_path *p, int err, int attempts)
{
	const struct rtrs_clt_sess *s = p->sess;
	struct rtrs_reconnect_in in = {
		.err = err,
		.dnr = atomic_load(&p->fail_dnr),
		.stopping = atomic_load(&s->closing) ||
			    atomic_load(&p->keep_closed),
		.attempts = attempts,
		.max_attempts = atomic_load(&s->max_reconnect_attempts),
		.down_ms = now_ms() - atomic_load(&p->down_since_ms),
		.loss_timeout_ms = atomic_load(&s->reconnect_loss_timeout_ms),
	};
	enum rtrs_reconnect_verdict v;

	if (in.max_attempts == 0 && atomic_load(&p->by_hand))
		in.max_attempts = 1; /* "never" by itself; asked by hand: once */
	v = rtrs_should_reconnect(&in);
	if (v != RTRS_RECONNECT_RETRY)
		atomic_store(&p->by_hand, false);
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
void clt_path_stop(struct clt_path *p, int err, enum rtrs_path_state next)
{
	struct rtrs_clt_sess *s = p->sess;
	enum rtrs_path_state st;
	bool was_up;
	unsigned failed = 0;

	rtrs_path_wrlock(&p->base);
	st = atomic_load(&p->base.state);
	was_up = st == RTRS_PATH_CONNECTED;
	if (st == RTRS_PATH_CLOSED || st == RTRS_PATH_CONNECTING) {
		/* Closed already, or an attempt is connecting it: it decides. */
		rtrs_path_wrunlock(&p->base);
		return;
	}
	if (st == RTRS_PATH_RECONNECTING) {
		if (next == RTRS_PATH_CLOSED) {
			loop_timer_arm(&p->reconnect_timer, 0, 0);
			clt_path_change_state(p, RTRS_PATH_CLOSED);
		}
		rtrs_path_wrunlock(&p->base);
		return;
	}
	clt_path_change_state(p, RTRS_PATH_CLOSING);
	rtrs_path_wrunlock(&p->base);
	atomic_store(&p->down_since_ms, now_ms());

	loop_timer_arm(&p->base.hb.timer, 0, 0);
	/* After this no completion thread of the path runs any more. */
	clt_path_destroy_cons(p);
	clt_fence_carrier_lost(p);
	/* Loaded once: rtrs_clt_set_reconnect may change it meanwhile. */
	bool may_wait = atomic_load(&s->fast_io_fail_ms) && err != -ESHUTDOWN &&
			!atomic_load(&s->closing);
	bool fence = p->srv_fence && may_wait;
	/*
	 * A kernel server has no fencing: its requests go to another path at
	 * once, as the kernel's client fails them over (docs/protocol.md
	 * section 14: what that does not guarantee).
	 */
	bool unfenced = !fence && !s->srv_ext && may_wait;
	unsigned moved = 0, resent = 0;

	clt_fence_reset(p);
	for (uint32_t i = 0; s->reqs && i < s->queue_depth; i++) {
		struct clt_req *req = &s->reqs[i];

		if (atomic_load(&req->state) != REQ_INFLIGHT || req->path != p)
			continue;
		/* Its connections are gone: nothing reads its regions any more. */
		if (unfenced) {
			clt_req_release_mrs(req, NULL);
			atomic_fetch_sub(&p->base.inflight, 1);
			clt_req_wait(req);
			resent++;
			continue;
		}
		if (!fence) {
			clt_req_quarantine(req, p);
			failed += clt_req_complete(req, -ECONNABORTED);
			continue;
		}
		/* Failover: after the server fences this path, same permit and chunk. */
		clt_req_release_mrs(req, NULL);
		atomic_fetch_sub(&p->base.inflight, 1);
		req->path = NULL;
		req->fence_path = p;
		req->wait_deadline_ms = now_ms() + atomic_load(&s->fast_io_fail_ms);
		pthread_mutex_lock(&s->wait_lock);
		STAILQ_INSERT_TAIL(&s->fencing, req, wait_link);
		pthread_mutex_unlock(&s->wait_lock);
		moved++;
	}
	if (resent) {
		atomic_fetch_add(&p->stat_failovers, resent);
		/* Armed before the line is logged: a test that waits for the line finds it armed. */
		loop_timer_arm(&s->wait_timer, 1, 50);
		log_info("%s: %u requests fail over to the other paths unfenced (a kernel server)",
			 p->name, resent);
	}
	if (moved) {
		atomic_fetch_add(&p->stat_failovers, moved);
		log_info("%s: %u requests wait for this path to be fenced, then fail over",
			 p->name, moved);
		loop_timer_arm(&s->wait_timer, 1, 50);
	}
	clt_path_release(p);
	if (err == -ENODEV)
		/* Its device went: a registration on its fabric fails from now on (-EIO). */
		atomic_store(&p->fab_lost, true);
	if (next == RTRS_PATH_RECONNECTING &&
	    !clt_path_should_reconnect(p, err, atomic_load(&p->attempts)))
		next = RTRS_PATH_CLOSED;
	clt_path_change_state(p, next);
	if (failed)
		log_at(err == -ESHUTDOWN ? LOG_INFO : LOG_WARN,
		       "%s: path closed (%s), %u requests failed", p->name, strerror(-err), failed);
	/* paths_up before path_ev(down), as path_ev(up) comes after it: a callback sees them agree. */
	bool last = was_up && atomic_fetch_sub(&s->paths_up, 1) == 1;

	if (last) {
		/* Those waiting for a slot now wait at most fast_io_fail_ms (rtrs_clt_get_permit). */
		atomic_store(&s->no_path_ms, now_ms());
		pthread_mutex_lock(&s->permit_lock);
		pthread_cond_broadcast(&s->permit_cond);
		pthread_mutex_unlock(&s->permit_lock);
	}
	if (was_up && s->path_ev && atomic_load(&s->opened))
		s->path_ev(s->priv, p->idx, 0);
	if (last && s->link_ev && atomic_load(&s->opened))
		s->link_ev(s->priv, RTRS_CLT_LINK_EV_DISCONNECTED);
	if (next == RTRS_PATH_RECONNECTING)
		clt_path_schedule_reconnect(p, 0);
}

/* Reconnect attempts in progress in the process (RTRS_RECONNECT_ATTEMPTS_MAX). */
atomic_uint clt_reconnects_running;

/*
 * Loop thread: the reconnect timer fired. An open between two tries makes
 * its next; a RECONNECTING path, asked again, starts an attempt.
 */
void clt_path_reconnect_timer(struct loop_timer *t)
{
	struct clt_path *p = container_of(t, struct clt_path, reconnect_timer);

	if (p->opening) {
		if (atomic_load(&p->sess->closing))
			clt_path_attempt_poke(p); /* ends the open */
		else
			clt_path_attempt_start(p);
		return;
	}
	if (atomic_load(&p->base.state) != RTRS_PATH_RECONNECTING)
		return;
	/* Asked again: the loss timeout or the attempt budget may have run out meanwhile. */
	if (!clt_path_should_reconnect(p, atomic_load(&p->last_err), atomic_load(&p->attempts))) {
		rtrs_path_wrlock(&p->base);
		clt_path_change_state(p, RTRS_PATH_CLOSED);
		rtrs_path_wrunlock(&p->base);
		return;
	}
	/* Others are connecting: this path's turn comes a little later. */
	if (atomic_fetch_add(&clt_reconnects_running, 1) >= RTRS_RECONNECT_ATTEMPTS_MAX) {
		atomic_fetch_sub(&clt_reconnects_running, 1);
		loop_timer_arm(&p->reconnect_timer, RTRS_RECONNECT_DEFER_MS, 0);
		return;
	}
	p->attempt_counted = true;
	rtrs_path_wrlock(&p->base);
	clt_path_change_state(p, RTRS_PATH_CONNECTING);
	rtrs_path_wrunlock(&p->base);
	clt_path_attempt_start(p);
}

/*
 * While the path is being established its attempt owns it: a failure is
 * news for the attempt's next step, which gives up itself (and
 * path_attempt_done checks fail_err once more after the path is up, for a
 * failure in between).
 */
static bool clt_fail_elsewhere(struct rtrs_path *base)
{
	struct clt_path *p = container_of(base, struct clt_path, base);

	if (atomic_load(&base->state) != RTRS_PATH_CONNECTING)
		return false;
	clt_path_kick(p);
	return true;
}

/* Any thread: the path is broken; it is torn down on the service loop. */
void clt_fail_path(struct clt_path *p, int err)
{
	rtrs_path_fail(&p->base, err);
}

void clt_path_hb_timer(struct loop_timer *t)
{
	rtrs_path_hb_tick(&container_of(t, struct clt_path, base.hb.timer)->base);
}

static void clt_path_stop_op(struct rtrs_path *base, int err)
{
	clt_path_stop(container_of(base, struct clt_path, base), err, RTRS_PATH_RECONNECTING);
}

const struct rtrs_path_ops clt_path_ops = {
	.item = "request",
	.peer = "server",
	.io_imm = clt_io_imm,
	.post = clt_post_pending,
	.stop = clt_path_stop_op,
	.fail_elsewhere = clt_fail_elsewhere,
};
