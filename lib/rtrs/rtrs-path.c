/* SPDX-License-Identifier: MIT */
/*
 * The path and connection machinery both sides share (rtrs-path.h): state
 * changes, failure hand-off, heartbeats, the queue of items waiting for
 * room in a send queue, connection teardown.
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "rtrs-path.h"

static void path_fail_work(struct loop_work *w)
{
	struct rtrs_path *p = container_of(w, struct rtrs_path, fail_work);

	p->ops->stop(p, atomic_load(&p->fail_err));
}

int rtrs_path_init(struct rtrs_path *p, const struct rtrs_path_ops *ops, struct loop *loop,
		   const char *name, enum rtrs_path_state state,
		   void (*hb_cb)(struct loop_timer *t))
{
	pthread_rwlockattr_t attr;
	int rc;

	p->ops = ops;
	p->loop = loop;
	atomic_init(&p->name, name);
	atomic_init(&p->state, state);
	atomic_init(&p->fail_err, 0);
	atomic_init(&p->inflight, 0);
	atomic_init(&p->hb.peer_ready, true);
	atomic_init(&p->post_writer, (pthread_t)0);
	loop_work_init(&p->fail_work, path_fail_work);
	/* Writers (state changes) must not starve behind a stream of posts. */
	pthread_rwlockattr_init(&attr);
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	rc = -pthread_rwlock_init(&p->post_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (rc)
		return rc;
	rc = loop_timer_init(loop, &p->hb.timer, hb_cb);
	if (rc)
		pthread_rwlock_destroy(&p->post_lock);
	return rc;
}

void rtrs_path_hb_arm(struct rtrs_path *p)
{
	loop_timer_slack(&p->hb.timer, p->hb.interval_ms / 10);
	loop_timer_arm(&p->hb.timer, p->hb.interval_ms, p->hb.interval_ms);
}

void rtrs_path_fini(struct rtrs_path *p)
{
	loop_timer_fini(&p->hb.timer);
	pthread_rwlock_destroy(&p->post_lock);
}

void rtrs_con_init(struct rtrs_con *con, struct rtrs_path *p, unsigned cid)
{
	con->path = p;
	con->cid = cid;
	con->fc = NULL;
	pthread_mutex_init(&con->pending_lock, NULL);
	STAILQ_INIT(&con->pending);
}

void rtrs_con_fini(struct rtrs_con *con)
{
	pthread_mutex_destroy(&con->pending_lock);
}

void rtrs_path_wrlock(struct rtrs_path *p)
{
	pthread_rwlock_wrlock(&p->post_lock);
	atomic_store(&p->post_writer, pthread_self());
}

void rtrs_path_wrunlock(struct rtrs_path *p)
{
	atomic_store(&p->post_writer, (pthread_t)0);
	pthread_rwlock_unlock(&p->post_lock);
}

bool rtrs_path_set_state(struct rtrs_path *p, enum rtrs_path_state to)
{
	enum rtrs_path_state from = atomic_load(&p->state);

	for (;;) {
		_Atomic enum rtrs_path_state probe = from;

		assert((from != RTRS_PATH_CONNECTED && to != RTRS_PATH_CONNECTED) ||
		       pthread_equal(atomic_load(&p->post_writer), pthread_self()));
		/* The table's verdict and its log, on a copy: the swap below makes the change. */
		if (!rtrs_path_change_state(&probe, rtrs_path_name(p), to))
			return false;
		if (atomic_compare_exchange_strong(&p->state, &from, to))
			return true;
		/* Another thread moved it meanwhile: judge again from where it is now. */
	}
}

void rtrs_path_fail(struct rtrs_path *p, int err)
{
	int zero = 0;

	atomic_compare_exchange_strong(&p->fail_err, &zero, err ? err : -EIO);
	if (p->ops->fail_elsewhere && p->ops->fail_elsewhere(p))
		return;
	loop_queue(p->loop, &p->fail_work);
}

static struct rtrs_pending *con_pending_pop(struct rtrs_con *con)
{
	struct rtrs_pending *it;

	pthread_mutex_lock(&con->pending_lock);
	it = STAILQ_FIRST(&con->pending);
	if (it)
		STAILQ_REMOVE_HEAD(&con->pending, link);
	pthread_mutex_unlock(&con->pending_lock);
	return it;
}

void rtrs_path_destroy_cons(struct rtrs_path *p)
{
	for (unsigned i = 0; i < p->nr_cons; i++)
		fab_con_shutdown(p->cons[i]->fc);
	for (unsigned i = 0; i < p->nr_cons; i++) {
		struct rtrs_con *con = p->cons[i];
		struct rtrs_pending *it;

		fab_con_destroy(con->fc);
		con->fc = NULL;
		while ((it = con_pending_pop(con)))
			if (p->ops->drop)
				p->ops->drop(con, it, 0);
	}
}

void rtrs_path_hb_tick(struct rtrs_path *p)
{
	int rc;

	if (atomic_load(&p->state) != RTRS_PATH_CONNECTED)
		return;
	if (rtrs_hb_tick_expired(&p->hb)) {
		log_err("%s: no heartbeat from the %s for %u ms, failing the path",
			rtrs_path_name(p), p->ops->peer, p->hb.interval_ms * p->hb.missed_max);
		rtrs_path_fail(p, -ETIMEDOUT);
		return;
	}
	if (!atomic_load(&p->hb.peer_ready))
		return; /* it may have no receive buffer for a beat yet (rtrs_hb.peer_ready) */
	rc = rtrs_hb_post(&p->hb, p->cons[0]->fc, p->peer_imm.addr, p->peer_imm.key, false);
	if (rc && rc != -EAGAIN) {
		log_err("%s: sending a heartbeat failed: %s", rtrs_path_name(p), strerror(-rc));
		rtrs_path_fail(p, rc);
	}
}

static void con_hb_imm(struct rtrs_con *con, bool ack)
{
	struct rtrs_path *p = con->path;
	int rc;

	if (!rtrs_hb_received(&p->hb, &con->hb_rx, con->cid, ack, rtrs_path_name(p), con->fc)) {
		fab_con_shutdown(con->fc);
		rtrs_path_fail(p, -EPROTO);
		return;
	}
	/* Answered on a connected path only: before, the peer's area is not known. */
	if (ack || atomic_load(&p->state) != RTRS_PATH_CONNECTED)
		return;
	rc = rtrs_hb_post(&p->hb, con->fc, p->peer_imm.addr, p->peer_imm.key, true);
	if (rc && rc != -EAGAIN)
		rtrs_path_fail(p, rc);
}

void rtrs_con_imm(void *priv, uint32_t imm)
{
	struct rtrs_con *con = priv;
	struct rtrs_path *p = con->path;
	uint32_t payload;
	unsigned type;

	rtrs_hb_heard(&p->hb);
	rtrs_from_imm(imm, &type, &payload);
	if (type == RTRS_HB_MSG_IMM || type == RTRS_HB_ACK_IMM) {
		con_hb_imm(con, type == RTRS_HB_ACK_IMM);
		return;
	}
	if (p->ops->io_imm(con, type, payload))
		return;
	log_err_rl("%s: unknown immediate type %u", rtrs_path_name(p), type);
	fab_con_shutdown(con->fc);
	rtrs_path_fail(p, -EPROTO);
}

void rtrs_con_done(void *priv, void *ctx)
{
	struct rtrs_con *con = priv;

	rtrs_hb_done(&con->path->hb, ctx);
}

void rtrs_con_pending_add(struct rtrs_con *con, struct rtrs_pending *it)
{
	log_dbg("%s#%u: send queue full, %s %u waits", rtrs_path_name(con->path), con->cid,
		con->path->ops->item, it->id);
	rtrs_con_queue(con, it);
}

void rtrs_con_queue(struct rtrs_con *con, struct rtrs_pending *it)
{
	pthread_mutex_lock(&con->pending_lock);
	STAILQ_INSERT_TAIL(&con->pending, it, link);
	pthread_mutex_unlock(&con->pending_lock);
	fab_con_kick(con->fc);
}

void rtrs_con_kick(void *priv)
{
	struct rtrs_con *con = priv;
	struct rtrs_path *p = con->path;
	struct rtrs_pending *it;

	while ((it = con_pending_pop(con))) {
		int rc = p->ops->post(con, it);

		if (rc == -EAGAIN) {
			/* Back to the head without a kick: retried after 1 ms or a completion. */
			pthread_mutex_lock(&con->pending_lock);
			STAILQ_INSERT_HEAD(&con->pending, it, link);
			pthread_mutex_unlock(&con->pending_lock);
			fab_con_retry_later(con->fc);
			return;
		}
		if (rc) {
			log_err_rl("%s: posting a %s failed: %s", rtrs_path_name(p), p->ops->item,
				   strerror(-rc));
			if (p->ops->drop)
				p->ops->drop(con, it, rc);
			rtrs_path_fail(p, rc);
			return;
		}
	}
}
