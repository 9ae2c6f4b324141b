/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: fencing a failed path before its requests fail over
 * (docs/protocol.md section 10). When a path fails with requests in
 * flight, they must not go out again while a copy may still land from the
 * failed path: they wait (s->fencing) until the server, asked over
 * another connected path, answers that the failed path is gone and
 * drained, or until the failed path reconnects (the server took the
 * reconnect only after the old path was freed). Then they join the
 * requests waiting for a path (s->waiting) and are sent again, once.
 *
 * A failed path's fence: FENCE_NONE -> FENCE_SENT (a carrier path sent
 * it) -> FENCE_DONE (answered, or implied). A carrier that fails before
 * the answer puts the fence back to FENCE_NONE, and the next pass sends it
 * over another path. Each carrier carries one fence at a time, from its
 * send until its answer is taken (or its own loss), even when the fence
 * was implied meanwhile: the server answers every fence. A fence names
 * the incarnation of the path whose requests wait (fence_recon); an
 * answer for an earlier one (the path came back and failed again while
 * the fence was out) fences nothing that waits now, and is only taken to
 * free its carrier (fence_acks_take).
 */
#include <errno.h>
#include <string.h>

#include "rtrs-clt-pri.h"

/* Sends a fence for failed path f over another connected path. Loop thread. */
static void fence_send(struct rtrs_clt_sess *s, struct clt_path *f)
{
	for (size_t i = 0; i < s->paths_num; i++) {
		struct clt_path *h = &s->paths[i];
		struct clt_path *none = NULL;
		enum clt_fence_state st = FENCE_NONE;

		if (h == f || atomic_load(&h->fence_for) || !h->srv_fence ||
		    atomic_load(&h->base.state) != RTRS_PATH_CONNECTED)
			continue;
		rtrs_fence_encode(&h->fence_msg, false, f->uuid, atomic_load(&f->fence_recon), 0);
		atomic_store(&h->fence_acked, false); /* one its lost connection got */
		/* Carried before it goes: the answer may come before fab_send returns. */
		if (!atomic_compare_exchange_strong(&h->fence_for, &none, f))
			continue;
		if (!atomic_compare_exchange_strong(&f->fence, &st, FENCE_SENT)) {
			atomic_store(&h->fence_for, NULL); /* answered or implied meanwhile */
			return;
		}
		if (fab_send(h->cons[0].c.fc, &h->fence_msg, sizeof(h->fence_msg), h->fence_mr.desc,
			     NULL)) {
			st = FENCE_SENT;
			atomic_compare_exchange_strong(&f->fence, &st, FENCE_NONE);
			atomic_store(&h->fence_for, NULL);
			continue;
		}
		log_info("%s: asked the server to fence %s", h->name, f->name);
		return;
	}
}

void clt_fence_reset(struct clt_path *p)
{
	atomic_store(&p->fence_recon, atomic_load(&p->live_recon));
	atomic_store(&p->fence_err, 0);
	atomic_store(&p->fence, FENCE_NONE);
}

static void fence_ack_take(struct clt_path *h, struct clt_path *f);

/* Loop thread, once the carrier's connections are gone (no answer can come any more). */
void clt_fence_carrier_lost(struct clt_path *carrier)
{
	bool acked = atomic_exchange(&carrier->fence_acked, false);
	struct clt_path *f = atomic_exchange(&carrier->fence_for, NULL);
	enum clt_fence_state st = FENCE_SENT;

	if (!f)
		return;
	/* An answer that came before the loss counts; else the fence goes again on the next pass. */
	if (acked) {
		fence_ack_take(carrier, f);
		loop_queue(carrier->sess->loop, &carrier->sess->wait_work);
	} else {
		atomic_compare_exchange_strong(&f->fence, &st, FENCE_NONE);
	}
}

void clt_fence_implied(struct clt_path *p)
{
	atomic_store(&p->fence_err, 0);
	atomic_store(&p->fence, FENCE_DONE);
}

/*
 * A message on connected carrier's connection 0 (its completion thread):
 * the answer to the fence it carries. With always_invalidate the server
 * wrote the whole key table ahead of it, unless the answer is an error. The loop takes the answer
 * (fence_acks_take). 0, or -EPROTO for anything else.
 */
int clt_fence_answered(struct clt_path *carrier, const void *buf, size_t len)
{
	struct clt_path *f = atomic_load(&carrier->fence_for);
	struct rtrs_clt_sess *s = carrier->sess;
	uint8_t uuid[RTRS_UUID_LEN];
	const char *why = NULL;
	int32_t recon;
	int err;

	if (rtrs_fence_decode(buf, len, RTRS_MSG_FENCE_ACK, uuid, &recon, &err, &why) || !f ||
	    memcmp(uuid, f->uuid, RTRS_UUID_LEN) || atomic_load(&carrier->fence_acked)) {
		log_err_rl("%s: unexpected message: %s", carrier->name,
			   why ? why : "stray fence ack");
		return -EPROTO;
	}
	/* A server of this project before incarnations echoes none. */
	if (recon >= 0 && (!(le16_get(carrier->fence_msg.flags) & RTRS_FENCE_RECON_F) ||
			   recon != le16_get(carrier->fence_msg.recon_cnt))) {
		log_err_rl("%s: unexpected message: a fence ack for incarnation %d of %s, not the "
			   "one fenced", carrier->name, recon, f->name);
		return -EPROTO;
	}
	/* An ack with an error comes without the table (docs/protocol.md section 10). */
	if (s->inval && !err && clt_path_keys_merge(carrier, (size_t)s->queue_depth * RTRS_RKEY_SLOT))
		return -EPROTO;
	carrier->fence_ack_err = err;
	atomic_store(&carrier->fence_acked, true);
	loop_queue(s->loop, &s->wait_work);
	return 0;
}

/* The fence's incarnation as the carrier sent it (-1: none named). */
static int32_t fence_sent_recon(const struct clt_path *carrier)
{
	return le16_get(carrier->fence_msg.flags) & RTRS_FENCE_RECON_F ?
	       (int32_t)le16_get(carrier->fence_msg.recon_cnt) : -1;
}

/*
 * Loop thread: the acks carriers received. An ack fences its path only if
 * the path still waits on the incarnation the fence named: a path that
 * came back and failed again meanwhile waits on a later one, which the
 * ack says nothing of (the server acks a fence for an incarnation it no
 * longer holds at once), and gets a fence of its own. Then the carrier is
 * free for the next fence: a fence made moot by its path's reconnect
 * (clt_fence_implied) is still answered, and a second fence on the
 * carrier before that would cross it.
 */
static void fence_ack_take(struct clt_path *h, struct clt_path *f)
{
	if (fence_sent_recon(h) == atomic_load(&f->fence_recon)) {
		/*
		 * Only a fence still out: one its path's reconnect implied
		 * meanwhile (clt_fence_implied, also on this thread) is done,
		 * and a late error answer must not undo that.
		 */
		if (atomic_load(&f->fence) != FENCE_SENT)
			return;
		atomic_store(&f->fence_err, h->fence_ack_err);
		if (h->fence_ack_err)
			f->fence_err_ms = loop_now_ms();
		atomic_store(&f->fence, FENCE_DONE);
	} else {
		log_info("%s: the fence for %s's incarnation %d was answered after that path "
			 "failed again; fencing incarnation %d", h->name, f->name,
			 fence_sent_recon(h), atomic_load(&f->fence_recon));
	}
}

static void fence_acks_take(struct rtrs_clt_sess *s)
{
	for (size_t i = 0; i < s->paths_num; i++) {
		struct clt_path *h = &s->paths[i];
		struct clt_path *f = atomic_load(&h->fence_for);

		if (!f || !atomic_load(&h->fence_acked))
			continue;
		fence_ack_take(h, f);
		atomic_store(&h->fence_acked, false);
		atomic_store(&h->fence_for, NULL);
	}
}

/*
 * A request that fails (is completed with an error) after it went out on
 * path f, which may have delivered it: the server may still hold its
 * chunk, and under always_invalidate the chunk's key it revoked was
 * replaced in a response that never came. Its permit, once put back, is
 * kept from the next request until f is fenced (the ack brings the key
 * table) or reconnects (its info response does): a request on that chunk
 * before would be refused, and its connection with it (docs/protocol.md
 * section 10). A kernel server has no fences and no such chunks.
 */
void clt_req_quarantine(struct clt_req *req, struct clt_path *f)
{
	if (f && f->srv_fence && !atomic_load(&req->sess->closing))
		req->quarantine = f;
}

/*
 * Loop thread: permits put back while quarantined go back to the free
 * list once their path is fenced; a path not fenced yet gets its fence
 * sent, as for the requests that wait on it.
 */
static void quarantine_process(struct rtrs_clt_sess *s)
{
	struct clt_path *need[RTRS_MAX_PATHS];
	size_t nneed = 0;
	uint64_t now;

	if (!atomic_load(&s->quar_n))
		return;
	now = loop_now_ms(); /* the loop's clock: a test steps the retry with its timers */
	pthread_mutex_lock(&s->permit_lock);
	for (uint32_t i = 0; i < s->nr_quar;) {
		uint32_t id = s->quar_ids[i];
		struct clt_path *f = s->reqs[id].quarantine;
		enum clt_fence_state st = atomic_load(&f->fence);

		/*
		 * The server could not fence the path (its re-key failed: no
		 * memory): the fence goes again a while later, or the permit
		 * would stay out until the path reconnects, for ever if it
		 * never does.
		 */
		if (st == FENCE_DONE && atomic_load(&f->fence_err) &&
		    now - f->fence_err_ms >= RTRS_FENCE_RETRY_MS) {
			atomic_store(&f->fence_err, 0);
			atomic_store(&f->fence, FENCE_NONE);
			st = FENCE_NONE;
		}

		if (atomic_load(&s->closing) || (st == FENCE_DONE && !atomic_load(&f->fence_err))) {
			s->reqs[id].quarantine = NULL;
			s->free_ids[s->nr_free++] = id;
			s->quar_ids[i] = s->quar_ids[--s->nr_quar];
			pthread_cond_signal(&s->permit_cond);
			continue;
		}
		if (st == FENCE_NONE) {
			size_t k = 0;

			while (k < nneed && need[k] != f)
				k++;
			if (k == nneed && nneed < RTRS_MAX_PATHS)
				need[nneed++] = f;
		}
		i++;
	}
	atomic_store(&s->quar_n, s->nr_quar);
	pthread_mutex_unlock(&s->permit_lock);
	for (size_t k = 0; k < nneed; k++)
		fence_send(s, need[k]);
}

/*
 * Loop thread: requests parked after their path failed. Past the deadline
 * they fail; once the path is fenced (or has reconnected) they join the
 * wait list and go out again; otherwise a fence is sent for the path if
 * none is out.
 */
void clt_fence_process(struct rtrs_clt_sess *s, uint64_t now, bool may_come)
{
	struct clt_req_list list = STAILQ_HEAD_INITIALIZER(list);
	struct clt_req_list keep = STAILQ_HEAD_INITIALIZER(keep);
	struct clt_req_list go = STAILQ_HEAD_INITIALIZER(go);
	struct clt_req *req;

	fence_acks_take(s);
	pthread_mutex_lock(&s->wait_lock);
	STAILQ_CONCAT(&list, &s->fencing);
	pthread_mutex_unlock(&s->wait_lock);
	while ((req = STAILQ_FIRST(&list))) {
		struct clt_path *f = req->fence_path;
		enum clt_fence_state st = atomic_load(&f->fence);

		STAILQ_REMOVE_HEAD(&list, wait_link);
		if (!may_come || now >= req->wait_deadline_ms) {
			req->fence_path = NULL;
			clt_req_quarantine(req, f);
			clt_req_complete(req, may_come ? -ETIMEDOUT : -ECONNABORTED);
		} else if (st == FENCE_DONE && atomic_load(&f->fence_err)) {
			log_warn_rl("%s: the server could not fence the path: %s", f->name,
				    strerror(-atomic_load(&f->fence_err)));
			req->fence_path = NULL;
			clt_req_quarantine(req, f);
			clt_req_complete(req, -EIO);
		} else if (st == FENCE_DONE) {
			req->fence_path = NULL;
			STAILQ_INSERT_TAIL(&go, req, wait_link);
		} else {
			if (st == FENCE_NONE)
				fence_send(s, f);
			STAILQ_INSERT_TAIL(&keep, req, wait_link);
		}
	}
	pthread_mutex_lock(&s->wait_lock);
	STAILQ_CONCAT(&keep, &s->fencing);
	STAILQ_CONCAT(&s->fencing, &keep);
	/* Fenced: ahead of those that wait for a path (they came later). */
	STAILQ_CONCAT(&go, &s->waiting);
	STAILQ_CONCAT(&s->waiting, &go);
	pthread_mutex_unlock(&s->wait_lock);
	quarantine_process(s);
}
