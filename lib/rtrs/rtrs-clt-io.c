/* SPDX-License-Identifier: MIT */
/*
 * RTRS client: requests and permits. A request is mapped, its header
 * encoded and posted on a path the policy picks (clt_req_route); with no
 * path it waits (clt_req_wait, bounded by fast_io_fail_ms). Responses come
 * in on the connections' completion threads (rtrs_con_imm, then
 * clt_handle_rsp); with always_invalidate each carries the chunk's next
 * key, which the session keeps (the newest generation wins,
 * clt_sess_key_update).
 *
 * Ownership of a request: IDLE (owned by the permit holder) -> INFLIGHT
 * (owned by the path it was posted on) -> completed exactly once by
 * whoever wins the INFLIGHT -> DONE compare-and-swap: the response handler,
 * or the path teardown after the path's threads have stopped. A response
 * is taken only once the write carrying the immediate is posted
 * (clt_req.sent); before that the request may still wait on its
 * connection's pending list, and a response is the server's error.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "rtrs-clt-pri.h"

/*
 * The session this thread polls now (rtrs_clt_poll), for clt_req_complete,
 * and the requests it completed in the poll.
 */
static _Thread_local const struct rtrs_clt_sess *clt_polling;
static _Thread_local int clt_polled_reqs;

/*
 * A completion that ran on another thread than a poller of s: counted
 * (poll_seq), so that the next rtrs_clt_poll returns at once for its caller
 * to look, and a waiting poller is woken. The count and waiting pair as
 * in Dekker's: the poller raises waiting, then reads the count.
 */
static void clt_poll_nudge(struct rtrs_clt_sess *s)
{
	if (clt_polling == s)
		clt_polled_reqs++;
	else
		rtrs_clt_poll_wake(s);
}

RTRS_EXPORT
void rtrs_clt_poll_wake(struct rtrs_clt_sess *s)
{
	uint64_t one = 1;

	atomic_fetch_add(&s->poll_seq, 1);
	if (!atomic_load(&s->poller.waiting))
		return;
	if (write(s->poll_wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn_rl("%s: poll eventfd write: %s", s->name, strerror(errno));
	/*
	 * After the write: a sleeper outside rtrs_clt_poll that finds it set
	 * reads the count whole (rtrs_clt_poll_wait_end); one that comes
	 * between the two reads nothing and wakes once more, harmless.
	 */
	atomic_store(&s->poll_wake_set, true);
}

void clt_req_release_mrs(struct clt_req *req, struct fab_con *fc)
{
	if (req->dir != RTRS_WRITE)
		fc = NULL;
	for (unsigned i = 0; i < req->nr_mrs; i++)
		fab_mr_dereg_after(fc, &req->mrs[i]);
	req->nr_mrs = 0;
}

/* The read data in the permit's bounce buffer goes to the caller's vectors. */
static void req_unbounce(struct clt_req *req)
{
	const char *from = req->sess->bounce[req->id];

	for (size_t i = 0; i < req->data_cnt; i++) {
		memcpy(req->data[i].iov_base, from, req->data[i].iov_len);
		from += req->data[i].iov_len;
	}
}

/* Completes req once with err; returns false if someone else did. */
bool clt_req_complete(struct clt_req *req, int err)
{
	int expected = REQ_INFLIGHT;
	struct rtrs_clt_req_ops ops;
	struct clt_path *p = req->path;

	if (!atomic_compare_exchange_strong(&req->state, &expected, REQ_DONE))
		return false;
	tsan_acquire(req); /* everything up to its post (req_post) */
	/* From the path's teardown its connections are gone (fc NULL): at once. */
	clt_req_release_mrs(req, p ? req->con->c.fc : NULL);
	if (req->bounced && !err)
		req_unbounce(req);
	ops = req->ops;
	if (p) { /* NULL: it was waiting for a path */
		atomic_fetch_sub(&p->base.inflight, 1);
		atomic_fetch_sub_explicit(&req->con->inflight, 1, memory_order_relaxed);
	}
	atomic_store(&req->state, REQ_IDLE);
	/* req may be reused by the permit holder from here on. */
	ops.conf(ops.priv, err);
	clt_poll_nudge(req->sess);
	return true;
}

/*
 * Polled completions (rtrs_clt_poll). A path's IO connections join the
 * session's poll set before it turns CONNECTED, so no request goes out on
 * a connection nobody may poll, and leave it before they are destroyed;
 * both under poll_lock, which a poll round holds. Connection 0 is never
 * polled: heartbeats and control messages stay on its thread.
 */
void clt_path_poll_enroll(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;
	unsigned cid;

	pthread_mutex_lock(&s->poll_lock);
	for (cid = 1; cid < p->base.nr_cons; cid++)
		atomic_store(&p->cons[cid].inflight, 0);
	if (atomic_load(&s->poll_unsupported)) {
		pthread_mutex_unlock(&s->poll_lock);
		return;
	}
	for (cid = 1; cid < p->base.nr_cons; cid++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = p };
		int fd = fab_con_wait_fd(p->cons[cid].c.fc);

		if (fd < 0)
			break;
		if (epoll_ctl(s->poll_epfd, EPOLL_CTL_ADD, fd, &ev)) {
			log_warn("%s: no polled completions from now on: epoll_ctl: %s", p->name,
				 strerror(errno));
			break;
		}
	}
	if (cid < p->base.nr_cons) {
		/*
		 * No polled mode (a fabric without wait fds, or a full epoll
		 * set): the path's threads keep reading their queues, and
		 * rtrs_clt_poll says -EOPNOTSUPP from now on.
		 */
		for (unsigned k = 1; k < cid; k++)
			epoll_ctl(s->poll_epfd, EPOLL_CTL_DEL, fab_con_wait_fd(p->cons[k].c.fc),
				  NULL);
		atomic_store(&s->poll_unsupported, true);
		rtrs_clt_poll_wake(s); /* a poller asleep now returns and learns it */
		pthread_mutex_unlock(&s->poll_lock);
		return;
	}
	for (cid = 1; cid < p->base.nr_cons; cid++)
		fab_con_set_poller(p->cons[cid].c.fc, &s->poller);
	p->poll_fds_in = true;
	p->polled = true;
	pthread_mutex_unlock(&s->poll_lock);
}

static void path_poll_fds_out(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;

	for (unsigned cid = 1; p->poll_fds_in && cid < p->base.nr_cons; cid++) {
		int fd = fab_con_wait_fd(p->cons[cid].c.fc);

		if (fd >= 0)
			epoll_ctl(s->poll_epfd, EPOLL_CTL_DEL, fd, NULL);
	}
	p->poll_fds_in = false;
}

void clt_path_poll_leave(struct clt_path *p)
{
	struct rtrs_clt_sess *s = p->sess;

	pthread_mutex_lock(&s->poll_lock);
	if (p->polled) {
		path_poll_fds_out(p);
		for (unsigned cid = 1; cid < p->base.nr_cons; cid++)
			if (p->cons[cid].c.fc)
				fab_con_set_poller(p->cons[cid].c.fc, NULL);
		p->polled = false;
	}
	pthread_mutex_unlock(&s->poll_lock);
}

/*
 * One round over the poll set: the completions run, or a negative errno.
 * It reads only the queues of connections with requests in flight: on
 * tcp every look costs a system call (a read of the socket), and a caller
 * that stays on one CPU has its requests on one connection. A CONNECTING path (just
 * enrolled) is skipped; a path that is neither CONNECTING nor CONNECTED
 * is skipped with its fds out of the set: its connections
 * may be shut down (their fds would say readable for ever) and its
 * teardown completes what it had in flight.
 *
 * With *sleep_ok the round arms every queue in the set to wake a sleeper
 * instead, and at the first that refuses, since it has something already,
 * reads that one, clears *sleep_ok and ends. It reads no queue before
 * arming it: arming refuses whenever anything is queued (on tcp,
 * fab_con_trywait polls the socket), so nothing is slept over, and a read
 * first would only cost another system call.
 */
static int clt_poll_round(struct rtrs_clt_sess *s, bool *sleep_ok)
{
	size_t np = atomic_load(&s->paths_num);
	bool arm = *sleep_ok;
	int done = 0;

	for (size_t i = 0; i < np; i++) {
		struct clt_path *p = &s->paths[i];
		int state;

		if (!p->polled)
			continue;
		state = atomic_load(&p->base.state);
		if (state != RTRS_PATH_CONNECTED) {
			/* CONNECTING: enrolled a moment before it turns CONNECTED. */
			if (state != RTRS_PATH_CONNECTING)
				path_poll_fds_out(p);
			continue;
		}
		for (unsigned cid = 1; cid < p->base.nr_cons; cid++) {
			struct fab_con *fc = p->cons[cid].c.fc;
			int n;

			if (arm ? !fab_con_trywait(fc)
				: !atomic_load_explicit(&p->cons[cid].inflight,
							memory_order_relaxed))
				continue;
			n = fab_con_poll(fc);
			if (n < 0 || arm) {
				*sleep_ok = false;
				return n;
			}
			done += n;
		}
	}
	return done;
}

/* A round under poll_lock: *reqs, the requests it completed on this thread. */
static int clt_poll_locked(struct rtrs_clt_sess *s, bool *armed, int *reqs)
{
	int n;

	pthread_mutex_lock(&s->poll_lock);
	clt_polling = s;
	clt_polled_reqs = 0;
	n = clt_poll_round(s, armed);
	*reqs = clt_polled_reqs;
	clt_polling = NULL;
	pthread_mutex_unlock(&s->poll_lock);
	return n;
}

/* rtrs_clt_poll's return: what ended elsewhere so far is the caller's to see now. */
static int clt_poll_ret(struct rtrs_clt_sess *s, int n)
{
	atomic_store(&s->poll_seen, atomic_load(&s->poll_seq));
	return n;
}

RTRS_EXPORT
int rtrs_clt_poll(struct rtrs_clt_sess *s, int timeout_ms)
{
	uint64_t start = now_ms();

	if (!s)
		return -EINVAL;
	if (s->poll_epfd < 0)
		return -EOPNOTSUPP;
	/* Something ended on another thread since the last return: look first. */
	if (atomic_load(&s->poll_seq) != atomic_load(&s->poll_seen) &&
	    !atomic_load(&s->poll_unsupported))
		return clt_poll_ret(s, 0);
	for (;;) {
		struct epoll_event evs[16];
		bool armed = false;
		int n, ne, reqs, wait_ms = -1;

		if (atomic_load(&s->poll_unsupported))
			return -EOPNOTSUPP;
		atomic_store(&s->poller.last_ms, now_ms());
		n = clt_poll_locked(s, &armed, &reqs);
		if (n < 0)
			return n;
		if (reqs || timeout_ms == 0)
			return clt_poll_ret(s, reqs);
		if (n)
			continue; /* completions of sends only: there may be more */
		if (timeout_ms > 0) {
			uint64_t spent = now_ms() - start;

			if (spent >= (uint64_t)timeout_ms)
				return clt_poll_ret(s, 0);
			wait_ms = timeout_ms - (int)spent;
		}
		/* sleeps first: a thread that reads waiting first sees this wait's number. */
		atomic_fetch_add(&s->poller.sleeps, 1);
		atomic_fetch_add(&s->poller.waiting, 1);
		if (atomic_load(&s->poll_seq) != atomic_load(&s->poll_seen)) {
			atomic_fetch_sub(&s->poller.waiting, 1);
			return clt_poll_ret(s, 0);
		}
		/* Again, now that a completion elsewhere wakes us, and arm the queues. */
		armed = true;
		n = clt_poll_locked(s, &armed, &reqs);
		if (n) {
			atomic_fetch_sub(&s->poller.waiting, 1);
			if (n < 0)
				return n;
			if (reqs)
				return clt_poll_ret(s, reqs);
			continue;
		}
		if (!armed) {
			/* Something came between the round and arming. */
			atomic_fetch_sub(&s->poller.waiting, 1);
			continue;
		}
		ne = epoll_wait(s->poll_epfd, evs, ARRAY_SIZE(evs), wait_ms);
		atomic_fetch_sub(&s->poller.waiting, 1);
		if (ne < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; i < ne; i++) {
			uint64_t v;

			if (!evs[i].data.ptr && read(s->poll_wake_fd, &v, sizeof(v)) < 0 &&
			    errno != EAGAIN)
				log_warn_rl("%s: poll eventfd read: %s", s->name, strerror(errno));
		}
	}
}

RTRS_EXPORT
int rtrs_clt_poll_fd(struct rtrs_clt_sess *s)
{
	if (!s)
		return -EINVAL;
	if (s->poll_epfd < 0 || atomic_load(&s->poll_unsupported))
		return -EOPNOTSUPP;
	return s->poll_epfd;
}

/*
 * rtrs_clt_poll's way to sleep, for a caller that sleeps elsewhere: the
 * poller counted asleep (the completion threads leave the queues to it),
 * then every queue armed, as before rtrs_clt_poll's epoll_wait. A queue
 * that refuses is read, and the caller hears -EAGAIN: what it read ran
 * here, and the caller polls again before it sleeps.
 */
RTRS_EXPORT
int rtrs_clt_poll_wait_begin(struct rtrs_clt_sess *s)
{
	bool armed = true;
	int n, reqs;

	if (!s)
		return -EINVAL;
	if (s->poll_epfd < 0 || atomic_load(&s->poll_unsupported))
		return -EOPNOTSUPP;
	atomic_store(&s->poller.last_ms, now_ms());
	/* sleeps first: a thread that reads waiting first sees this wait's number. */
	atomic_fetch_add(&s->poller.sleeps, 1);
	atomic_fetch_add(&s->poller.waiting, 1);
	if (atomic_load(&s->poll_seq) != atomic_load(&s->poll_seen)) {
		/* Something ended elsewhere since rtrs_clt_poll last returned: it says so first. */
		atomic_fetch_sub(&s->poller.waiting, 1);
		return -EAGAIN;
	}
	n = clt_poll_locked(s, &armed, &reqs);
	if (n || !armed) {
		atomic_fetch_sub(&s->poller.waiting, 1);
		return n < 0 ? n : -EAGAIN;
	}
	return 0;
}

RTRS_EXPORT
void rtrs_clt_poll_wait_end(struct rtrs_clt_sess *s)
{
	uint64_t v;

	if (!s)
		return;
	atomic_fetch_sub(&s->poller.waiting, 1);
	atomic_store(&s->poller.last_ms, now_ms());
	/* A wake written while asleep: read, or the fd would stay readable for ever. */
	if (atomic_exchange(&s->poll_wake_set, false) &&
	    read(s->poll_wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn_rl("%s: poll eventfd read: %s", s->name, strerror(errno));
}

/* A chunk key learned from the server: kept if newer than the one we have. */
void clt_sess_key_update(struct rtrs_clt_sess *s, uint32_t id, uint32_t gen, uint64_t key)
{
	pthread_mutex_lock(&s->rkey_lock);
	if (!s->rkey_gens[id] || (int32_t)(gen - s->rkey_gens[id]) > 0) {
		s->rkey_gens[id] = gen;
		atomic_store(&s->rkeys[id], key);
	}
	pthread_mutex_unlock(&s->rkey_lock);
}

/* The key table the server wrote into p's imm area at offset off (records). */
int clt_path_keys_merge(struct clt_path *p, size_t off)
{
	struct rtrs_clt_sess *s = p->sess;
	const char *why = NULL;

	for (uint32_t i = 0; i < s->queue_depth; i++) {
		uint64_t key;
		uint32_t gen;

		if (rtrs_new_rkey_decode(p->imm_area + off + (size_t)i * RTRS_RKEY_SLOT, i, &gen,
					 &key, &why)) {
			log_err_rl("%s: invalid key table from the server: %s", p->name, why);
			return -EPROTO;
		}
		clt_sess_key_update(s, i, gen, key);
	}
	return 0;
}

/*
 * The context the last write of a request that registered its data asks
 * for (req_post): its send's completion comes then, not with some later
 * signalled send, which an idle connection may never post, and with it
 * the regions' deregistration (clt_req_release_mrs). Its done() does
 * nothing: clt_con_done hands it to rtrs_con_done, which takes only a
 * heartbeat ack's context.
 */
static char req_sent_ctx;

/*
 * req's data has left (its done(), on the connection's completion
 * thread or poller): if its response came already, this completes it,
 * with the response's errno (req_post does the same for data that left at
 * once, through clt_post_pending).
 * Until its data has left, a write is not complete whatever its response
 * says: the fabric still reads the caller's buffers, which the caller may
 * free or fill anew once it is told (an honest server answers only what
 * it has received, so only a lying one meets this wait).
 */
static void req_tx_left(struct clt_req *req)
{
	unsigned old = atomic_fetch_or(&req->tx_state, REQ_TX_LEFT);

	if (old & REQ_TX_RSP)
		clt_req_complete(req, -(int)(old >> REQ_TX_ERR_SHIFT));
}

/* The client's connections' done(): a write's data left (req_tx_left), or the heartbeat's. */
void clt_con_done(void *priv, void *ctx)
{
	struct rtrs_con *c = priv;
	struct rtrs_clt_sess *s = container_of(c, struct clt_con, c)->path->sess;
	uintptr_t off = (uintptr_t)ctx - (uintptr_t)s->reqs;

	if ((uintptr_t)ctx >= (uintptr_t)s->reqs &&
	    off < (uintptr_t)s->queue_depth * sizeof(*s->reqs) &&
	    off % sizeof(*s->reqs) == offsetof(struct clt_req, tx_ctx)) {
		req_tx_left(&s->reqs[off / sizeof(*s->reqs)]);
		return;
	}
	rtrs_con_done(priv, ctx);
}

static char *req_hdr_slot(const struct clt_req *req)
{
	return req->sess->hdr_area + (size_t)req->id * req->sess->max_hdr_size;
}

/*
 * Posts what is left of req: data vectors then the header slot, at most
 * iov_limit vectors per write; the last write carries the immediate. Returns
 * 0, -EAGAIN (progress saved), or another error. Nothing touches req after
 * the last write is posted: the response may already be completing it.
 */
static int req_post(struct clt_req *req)
{
	struct rtrs_clt_sess *s = req->sess;
	struct clt_path *p = req->path;
	const struct fab_attr *a = fab_attr(p->fab);
	struct iovec iov[RTRS_MAX_SEGMENTS + 1];
	void *desc[RTRS_MAX_SEGMENTS + 1];
	const struct rtrs_desc *chunk = &p->rbufs[req->id];
	/* Its data registered per IO (not copies of the session's regions' descriptors). */
	bool own_mrs = req->dir == RTRS_WRITE && req->nr_mrs && req->mrs[0].ops;
	/* A fabric that reads the data after the post only while it waits (tcp): req_tx_left. */
	bool wait_left = req->dir == RTRS_WRITE && !own_mrs && fab_has_write_left(req->con->c.fc);
	size_t n = 0;
	uint32_t imm;

	if (req->dir == RTRS_WRITE) {
		for (size_t i = 0; i < req->data_cnt; i++) {
			iov[n] = req->data[i];
			desc[n++] = req->nr_mrs ? req->mrs[i].desc : NULL;
		}
	}
	iov[n] = (struct iovec){ .iov_base = req_hdr_slot(req), .iov_len = req->hdr_len };
	desc[n++] = p->hdr_mr.desc;
	if (req->next_iov == 0)
		req->next_off = req->dir == RTRS_WRITE ? 0 : req->data_len;
	imm = rtrs_to_io_req_imm(s->queue_depth, req->id, req->data_len + req->usr_len);

	while (req->next_iov < n) {
		size_t cnt = MIN(n - req->next_iov, a->iov_limit);
		bool last = req->next_iov + cnt == n;
		struct fab_rma rma = {
			.addr = chunk->addr + req->next_off,
			.key = s->inval ? atomic_load(&s->rkeys[req->id]) :
			       s->kinval ? __atomic_load_n(&chunk->key, __ATOMIC_RELAXED) :
					   chunk->key,
		};
		struct fab_con *fc = req->con->c.fc;
		size_t first = req->next_iov;
		int rc;

		for (size_t i = 0; i < cnt; i++)
			rma.len += iov[first + i].iov_len;
		if (last) {
			/* Before the post: its response may come before fab_write returns. */
			req->wait_left = wait_left;
			req->complete_due = false;
			atomic_store_explicit(&req->tx_state, 0, memory_order_relaxed);
			atomic_store(&req->sent, true);
			tsan_release(req); /* clt_req_complete's acquire; req is not read after */
		}
		if (last && wait_left) {
			bool left;

			rc = fab_write_left(fc, &iov[first], &desc[first], cnt, &rma, 1, true, imm,
					    &req->tx_ctx, &left);
			/*
			 * Left at once (else done(&req->tx_ctx) tells). A response
			 * that came first (its server answered as the last bytes
			 * went) makes this thread the one to complete it, but conf
			 * does not run inside rtrs_clt_request: the connection's
			 * pending queue completes it where completions run.
			 */
			if (!rc && left &&
			    (atomic_fetch_or(&req->tx_state, REQ_TX_LEFT) & REQ_TX_RSP)) {
				req->complete_due = true;
				req->pend.id = req->id;
				rtrs_con_queue(&req->con->c, &req->pend);
			}
		} else {
			rc = fab_write(fc, &iov[first], &desc[first], cnt, &rma, 1, last, imm,
				       last && own_mrs ? &req_sent_ctx : NULL);
		}
		if (rc) {
			if (last)
				atomic_store(&req->sent, false);
			return rc;
		}
		if (last)
			return 0;
		req->next_iov += cnt;
		req->next_off += rma.len;
	}
	return 0;
}

/*
 * Completion thread (kick): what is left of a request that met a full send
 * queue; or the completion of one whose response came before its poster
 * saw its data leave (complete_due).
 */
int clt_post_pending(struct rtrs_con *con, struct rtrs_pending *it)
{
	struct clt_req *req = &container_of(con, struct clt_con, c)->path->sess->reqs[it->id];

	if (req->complete_due) {
		req->complete_due = false;
		clt_req_complete(req, -(int)(atomic_load(&req->tx_state) >> REQ_TX_ERR_SHIFT));
		return 0;
	}
	return req_post(req);
}

/*
 * Descriptors a read of data_cnt vectors carries: one per vector, except
 * to a kernel server, which fails the IO and closes the path for any
 * count but one: then the vectors share a bounce buffer.
 */
static unsigned req_read_descs(const struct rtrs_clt_sess *s, size_t data_cnt)
{
	return !s->srv_ext && data_cnt > 1 ? 1 : (unsigned)data_cnt;
}

/* A read into the permit's bounce buffer, registered in p's domain for the server to write. */
static int req_map_bounce(struct clt_req *req, struct clt_path *p)
{
	struct rtrs_clt_sess *s = req->sess;
	int rc;

	/* Only the permit's holder touches its slot. */
	if (!s->bounce[req->id]) {
		s->bounce[req->id] = malloc(s->max_io_size);
		if (!s->bounce[req->id])
			return -ENOMEM;
	}
	rc = fab_mr_reg(p->fab, s->bounce[req->id], req->data_len, FAB_MR_REMOTE_WRITE,
			&req->mrs[0]);
	if (rc)
		return rc;
	req->nr_mrs = 1;
	req->bounced = true;
	return 0;
}

static int req_map(struct clt_req *req, struct clt_path *p)
{
	const struct fab_attr *a = fab_attr(p->fab);
	unsigned access = req->dir == RTRS_READ ? FAB_MR_REMOTE_WRITE : FAB_MR_LOCAL;

	req->nr_mrs = 0;
	req->bounced = false;
	if (req->dir == RTRS_READ && req_read_descs(req->sess, req->data_cnt) < req->data_cnt)
		return req_map_bounce(req, p);
	if (req->dir == RTRS_WRITE && !a->mr_local)
		return 0;
	if (req->dir == RTRS_WRITE && atomic_load_explicit(&req->sess->nr_mem, memory_order_relaxed) &&
	    clt_req_map_mem(req, p))
		return 0;
	for (size_t i = 0; i < req->data_cnt; i++) {
		int rc = fab_mr_reg(p->fab, req->data[i].iov_base, req->data[i].iov_len, access,
				    &req->mrs[i]);

		if (rc) {
			clt_req_release_mrs(req, NULL);
			return rc;
		}
		req->nr_mrs++;
	}
	return 0;
}

static void req_encode_hdr(struct clt_req *req)
{
	char *slot = req_hdr_slot(req) + req->usr_len;

	if (req->dir == RTRS_WRITE) {
		rtrs_write_hdr_encode(slot, req->usr_len);
		return;
	}
	struct rtrs_desc sg[RTRS_MAX_SEGMENTS];

	if (req->bounced) {
		sg[0] = (struct rtrs_desc){ .addr = req->mrs[0].base, .key = req->mrs[0].key,
					    .len = req->data_len };
		rtrs_read_hdr_encode(slot, req->usr_len, 0, sg, 1);
		return;
	}
	for (size_t i = 0; i < req->data_cnt; i++)
		sg[i] = (struct rtrs_desc){ .addr = req->mrs[i].base, .key = req->mrs[i].key,
					    .len = (uint32_t)req->data[i].iov_len };
	/* Flags 0: no NEED_INVAL, an ordinary region cannot be invalidated from afar. */
	rtrs_read_hdr_encode(slot, req->usr_len, 0, sg, (unsigned)req->data_cnt);
}

/* Posts req on path p; with p->base.post_lock held for reading. */
static int req_issue(struct clt_req *req, struct clt_path *p, bool accepted)
{
	struct rtrs_clt_sess *s = req->sess;
	unsigned cpu = (unsigned)sched_getcpu();
	int rc;

	rc = req_map(req, p);
	if (rc)
		return rc;
	req_encode_hdr(req);
	req->path = p;
	req->con = req->con_type == RTRS_ADMIN_CON ? &p->cons[0] :
		   &p->cons[1 + (cpu % (p->base.nr_cons - 1))];
	req->next_iov = 0;
	req->complete_due = false;
	atomic_store(&req->sent, false);
	atomic_fetch_add(&p->base.inflight, 1);
	atomic_fetch_add_explicit(&req->con->inflight, 1, memory_order_relaxed);
	if (req->dir == RTRS_WRITE) {
		atomic_fetch_add_explicit(&p->stat_writes, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->stat_write_bytes, req->data_len, memory_order_relaxed);
	} else {
		atomic_fetch_add_explicit(&p->stat_reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->stat_read_bytes, req->data_len, memory_order_relaxed);
	}
	atomic_store(&req->state, REQ_INFLIGHT);
	rc = req_post(req);
	if (rc == -EAGAIN) {
		req->pend.id = req->id;
		rtrs_con_pending_add(&req->con->c, &req->pend);
		return 0;
	}
	if (rc) {
		/*
		 * No immediate went out, so the server never acts on whatever
		 * pieces reached its chunk: the caller gets the error and conf
		 * is not called. A request accepted earlier (one that waited
		 * for a path) stays INFLIGHT: it is still the loop's, and its
		 * permit's next holder must get -EBUSY meanwhile.
		 */
		atomic_store(&req->state, accepted ? REQ_INFLIGHT : REQ_IDLE);
		atomic_fetch_sub(&p->base.inflight, 1);
		atomic_fetch_sub_explicit(&req->con->inflight, 1, memory_order_relaxed);
		/* Its first writes may have gone. */
		clt_req_release_mrs(req, req->con->c.fc);
		log_err_rl("%s: posting a request failed: %s", p->name, strerror(-rc));
		(void)s;
	}
	return rc;
}

/*
 * Sends req on a path the policy picks; another if posting there fails.
 * accepted: req was taken earlier (it waited); on failure it stays INFLIGHT.
 */
int clt_req_route(struct clt_req *req, bool accepted)
{
	struct rtrs_clt_sess *s = req->sess;
	struct rtrs_mp_path snap[RTRS_MAX_PATHS];
	enum rtrs_mp_policy policy = atomic_load(&s->mp_policy);
	size_t n = atomic_load(&s->paths_num); /* once: a path may be added meanwhile */
	int rc = -ECONNABORTED;

	for (size_t i = 0; i < n; i++)
		snap[i] = (struct rtrs_mp_path){
			.connected = atomic_load(&s->paths[i].base.state) == RTRS_PATH_CONNECTED,
			.inflight = atomic_load(&s->paths[i].base.inflight),
			.latency_ns = atomic_load(&s->paths[i].base.hb.latency_ns),
		};
	for (size_t tries = 0; tries < n; tries++) {
		unsigned rr = atomic_load(&s->rr_cursor);
		int i = rtrs_mp_select(policy, snap, n, &rr);
		struct clt_path *p;

		if (i < 0)
			break;
		if (policy == RTRS_MP_POLICY_RR)
			atomic_store(&s->rr_cursor, rr);
		snap[i].tried = true;
		p = &s->paths[i];
		pthread_rwlock_rdlock(&p->base.post_lock);
		rc = atomic_load(&p->base.state) == RTRS_PATH_CONNECTED ? req_issue(req, p, accepted) :
		     -ECONNABORTED;
		pthread_rwlock_unlock(&p->base.post_lock);
		if (rc == 0)
			return 0;
	}
	return rc;
}

/*
 * True while some path is up or on its way (a request may wait for it),
 * rtrs_clt_add_path's not yet published included. A
 * path that is closing after a failure is on its way too (it reconnects
 * unless its reconnect decision says otherwise); seen from the service
 * loop it is never closing (clt_path_stop runs there), so a request that
 * waits for it fails at the next retry if it ended closed.
 */
bool clt_sess_path_may_come(struct rtrs_clt_sess *s)
{
	if (atomic_load(&s->closing))
		return false;
	if (atomic_load(&s->add_pending))
		return true;
	for (size_t i = 0; i < s->paths_num; i++) {
		enum rtrs_path_state st = atomic_load(&s->paths[i].base.state);

		if (st != RTRS_PATH_CLOSED &&
		    (st != RTRS_PATH_CLOSING || !atomic_load(&s->paths[i].keep_closed)))
			return true;
	}
	return false;
}

/* No path now: park req until one comes or fast_io_fail_ms passes. */
void clt_req_wait(struct clt_req *req)
{
	struct rtrs_clt_sess *s = req->sess;
	bool first;

	req->path = NULL;
	req->wait_deadline_ms = now_ms() + atomic_load(&s->fast_io_fail_ms);
	atomic_store(&req->state, REQ_INFLIGHT);
	pthread_mutex_lock(&s->wait_lock);
	first = STAILQ_EMPTY(&s->waiting);
	STAILQ_INSERT_TAIL(&s->waiting, req, wait_link);
	pthread_mutex_unlock(&s->wait_lock);
	if (first) /* retried every 50 ms, and at once when a path comes up */
		loop_timer_arm(&s->wait_timer, 50, 50);
}

RTRS_EXPORT
int rtrs_clt_request(struct rtrs_clt_sess *s, enum rtrs_dir dir,
		     const struct rtrs_clt_req_ops *ops, struct rtrs_permit *permit,
		     const struct iovec *usr, size_t usr_cnt,
		     const struct iovec *data, size_t data_cnt)
{
	struct clt_req *req;
	size_t usr_len = 0, data_len = 0, hdr;
	char *slot;

	if (!s || !ops || !ops->conf || !permit || (dir != RTRS_READ && dir != RTRS_WRITE))
		return -EINVAL;
	if (permit->id >= s->queue_depth || permit != &s->permits[permit->id] ||
	    !permit->in_use || (data_cnt && !data) || (usr_cnt && !usr))
		return -EINVAL;
	if (data_cnt > RTRS_MAX_SEGMENTS)
		return -EMSGSIZE;
	for (size_t i = 0; i < usr_cnt; i++)
		if (add_overflow(usr_len, usr[i].iov_len, &usr_len))
			return -EMSGSIZE;
	for (size_t i = 0; i < data_cnt; i++) {
		if (data[i].iov_len == 0 || add_overflow(data_len, data[i].iov_len, &data_len))
			return -EINVAL;
	}
	hdr = rtrs_io_hdr_size(dir == RTRS_READ, dir == RTRS_READ ? req_read_descs(s, data_cnt) : 0);
	if (usr_len + hdr > s->max_hdr_size || data_len > s->max_io_size)
		return -EMSGSIZE;
	if (atomic_load(&s->closing))
		return -ESHUTDOWN;

	req = &s->reqs[permit->id];
	if (atomic_load(&req->state) != REQ_IDLE)
		return -EBUSY;
	req->dir = dir;
	req->ops = *ops;
	req->con_type = permit->con_type;
	req->usr_len = (uint32_t)usr_len;
	req->data_len = (uint32_t)data_len;
	req->hdr_len = (uint32_t)(usr_len + hdr);
	req->data_cnt = data_cnt;
	if (data_cnt)
		memcpy(req->data, data, data_cnt * sizeof(*data));
	slot = req_hdr_slot(req);
	for (size_t i = 0; i < usr_cnt; i++) {
		memcpy(slot, usr[i].iov_base, usr[i].iov_len);
		slot += usr[i].iov_len;
	}

	if (req->quarantine) {
		/*
		 * The permit of a request that failed after going out on a
		 * path not yet fenced, used again at once (a retry in conf):
		 * it waits for that fence as a failed-over request does, and
		 * goes once its chunk and key are the client's again; the
		 * fence takes a round trip on a connected path, which it may
		 * wait for as long as a request waits for a path, and at least
		 * RTRS_QUARANTINE_WAIT_MS. With no path to wait for it fails
		 * here, as any request would.
		 */
		bool up = false;

		for (size_t i = 0; i < atomic_load(&s->paths_num) && !up; i++)
			up = atomic_load(&s->paths[i].base.state) == RTRS_PATH_CONNECTED;
		if (!clt_sess_path_may_come(s) || (!up && !atomic_load(&s->fast_io_fail_ms)))
			return -ECONNABORTED;
		req->fence_path = req->quarantine;
		req->quarantine = NULL;
		req->path = NULL;
		req->wait_deadline_ms = now_ms() + MAX(atomic_load(&s->fast_io_fail_ms),
						       RTRS_QUARANTINE_WAIT_MS);
		atomic_store(&req->state, REQ_INFLIGHT);
		pthread_mutex_lock(&s->wait_lock);
		STAILQ_INSERT_TAIL(&s->fencing, req, wait_link);
		pthread_mutex_unlock(&s->wait_lock);
		loop_timer_arm(&s->wait_timer, 1, 50);
		return 0;
	}
	{
		int rc = clt_req_route(req, false);

		if (rc == -ECONNABORTED && atomic_load(&s->fast_io_fail_ms) &&
		    clt_sess_path_may_come(s)) {
			clt_req_wait(req);
			return 0;
		}
		return rc;
	}
}

/*
 * permit_lock held, no slot free: the errno a slot's taker gets when no
 * path is up, as a request would (rtrs_clt_request): ECONNABORTED at once
 * with fast_io_fail_ms 0 or no path to come, ETIMEDOUT once
 * fast_io_fail_ms passed since the last path went; 0 to go on waiting
 * (with wait: for a free slot, a path event, or that deadline). Slots of
 * requests that failed with their path stay quarantined until it is
 * fenced or back: without this, IO that waits for a slot outlived
 * fast_io_fail_ms, for ever if the server never came back.
 */
static int slot_wait_nopath(struct rtrs_clt_sess *s, bool wait)
{
	unsigned ff = atomic_load(&s->fast_io_fail_ms);
	uint64_t since, now;

	if (atomic_load(&s->paths_up)) {
		if (wait)
			pthread_cond_wait(&s->permit_cond, &s->permit_lock);
		return 0;
	}
	if (!ff || !clt_sess_path_may_come(s))
		return ECONNABORTED;
	since = atomic_load(&s->no_path_ms);
	now = now_ms();
	if (now - since >= ff)
		return ETIMEDOUT;
	if (wait) {
		struct timespec dl = deadline_ms((unsigned)(since + ff - now));

		pthread_cond_timedwait(&s->permit_cond, &s->permit_lock, &dl);
	}
	return 0;
}

RTRS_EXPORT
struct rtrs_permit *rtrs_clt_get_permit(struct rtrs_clt_sess *s,
					enum rtrs_clt_con_type con_type, enum rtrs_wait wait)
{
	struct rtrs_permit *permit = NULL;

	int err = 0;

	if (!s) {
		errno = EINVAL;
		return NULL;
	}
	pthread_mutex_lock(&s->permit_lock);
	s->permit_waiters++;
	while (!s->nr_free && !s->closing) {
		err = slot_wait_nopath(s, wait == RTRS_PERMIT_WAIT);
		if (err || wait != RTRS_PERMIT_WAIT)
			break;
	}
	if (s->nr_free && !s->closing) {
		permit = &s->permits[s->free_ids[--s->nr_free]];
		permit->con_type = con_type;
		permit->in_use = true;
		err = 0;
	} else if (s->closing) {
		err = ECONNABORTED;
	} else if (!err) {
		err = EAGAIN;
	}
	if (--s->permit_waiters == 0 && s->closing)
		pthread_cond_broadcast(&s->permit_cond);
	pthread_mutex_unlock(&s->permit_lock);
	if (!permit)
		errno = err;
	return permit;
}

RTRS_EXPORT
void rtrs_clt_put_permit(struct rtrs_clt_sess *s, struct rtrs_permit *permit)
{
	if (!s || !permit)
		return;
	pthread_mutex_lock(&s->permit_lock);
	if (permit->id >= s->queue_depth || permit != &s->permits[permit->id] ||
	    !permit->in_use) {
		pthread_mutex_unlock(&s->permit_lock);
		log_err("%s: put of a permit that is not taken (double put?)", s->name);
		return;
	}
	permit->in_use = false;
	if (s->reqs[permit->id].quarantine && !atomic_load(&s->closing)) {
		/* Its chunk or key is not ours yet: back once its path is fenced. */
		s->quar_ids[s->nr_quar++] = permit->id;
		atomic_store(&s->quar_n, s->nr_quar);
		pthread_mutex_unlock(&s->permit_lock);
		if (s->wait_timer_ready) {
			/*
			 * Under wait_lock, where the loop reads quar_n and then
			 * disarms the timer when nothing waits: a disarm that
			 * read 0 before the store above cannot undo this arm.
			 */
			pthread_mutex_lock(&s->wait_lock);
			loop_timer_arm(&s->wait_timer, 1, 50);
			pthread_mutex_unlock(&s->wait_lock);
		}
		return;
	}
	s->reqs[permit->id].quarantine = NULL;
	s->free_ids[s->nr_free++] = permit->id;
	pthread_cond_signal(&s->permit_cond);
	pthread_mutex_unlock(&s->permit_lock);
}

RTRS_EXPORT
unsigned rtrs_permit_id(const struct rtrs_permit *permit)
{
	return permit->id;
}

static void clt_handle_rsp(struct clt_con *con, uint32_t payload)
{
	struct clt_path *p = con->path;
	struct rtrs_clt_sess *s = p->sess;
	const char *why = NULL;
	struct clt_req *req;
	uint32_t id;
	int err;

	if (rtrs_io_rsp_decode(payload, s->queue_depth, &id, &err, &why)) {
		log_err_rl("%s: invalid response: %s", p->name, why);
		clt_fail_path(p, -EPROTO);
		return;
	}
	req = &s->reqs[id];
	if (atomic_load(&req->state) != REQ_INFLIGHT || req->path != p ||
	    !atomic_load(&req->sent)) {
		log_err_rl("%s: response for request %u that is not in flight here", p->name, id);
		clt_fail_path(p, -EPROTO);
		return;
	}
	if (s->inval) {
		/* The chunk's next key came with the response, in its slot. */
		uint64_t key;
		uint32_t gen;

		if (rtrs_new_rkey_decode(p->imm_area + (size_t)id * RTRS_RKEY_SLOT, id, &gen, &key,
					 &why)) {
			log_err_rl("%s: response %u without a valid new key: %s", p->name, id, why);
			clt_fail_path(p, -EPROTO);
			return;
		}
		clt_sess_key_update(s, id, gen, key);
	} else if (s->kinval) {
		/*
		 * The kernel's way: the chunk's new key for this path came in the
		 * message this immediate arrived with; the old one is revoked.
		 */
		if (con->rkey_buf_id != id) {
			log_err_rl("%s: response %u without its chunk's new key", p->name, id);
			clt_fail_path(p, -EPROTO);
			return;
		}
		con->rkey_buf_id = UINT32_MAX;
		/* Read by the next poster on this chunk, after the permit went round. */
		__atomic_store_n(&p->rbufs[id].key, con->rkey, __ATOMIC_RELAXED);
	}
	if (req->wait_left) {
		unsigned old = atomic_load(&req->tx_state), nw;

		do {
			if (old & REQ_TX_RSP) {
				log_err_rl("%s: a second response for request %u", p->name, id);
				clt_fail_path(p, -EPROTO);
				return;
			}
			nw = old | REQ_TX_RSP | (unsigned)-err << REQ_TX_ERR_SHIFT;
		} while (!atomic_compare_exchange_weak(&req->tx_state, &old, nw));
		if (!(old & REQ_TX_LEFT))
			return; /* completed once its data has left (req_tx_left) */
	}
	clt_req_complete(req, err);
}

/* rtrs_path_ops.io_imm: a response. */
bool clt_io_imm(struct rtrs_con *c, unsigned type, uint32_t payload)
{
	if (type != RTRS_IO_RSP_IMM && type != RTRS_IO_RSP_W_INV_IMM)
		return false;
	clt_handle_rsp(container_of(c, struct clt_con, c), payload);
	return true;
}
