/* SPDX-License-Identifier: MIT */
/*
 * The RNBD client over librtrs (docs/rnbd.md section 4).
 *
 * A session is one RTRS session; devices mapped through it share it. Every
 * admin exchange is a synchronous RTRS request from the caller's thread:
 * SESS_INFO and OPEN as reads whose data is the response, CLOSE as an empty
 * write; IO is asynchronous, with its data.
 *
 * Waiting for a path and failing over are librtrs's: IO on a device that is
 * open on the server goes to the transport whether a path is up or not, and
 * waits there (fast_io_fail_ms). What librtrs cannot know is that the
 * server forgot the devices: it tells us that a path reached a new server
 * session (RTRS_CLT_LINK_EV_SERVER_SESSION), and from then on every device
 * is closed behind a gate until a worker thread of the session has sent
 * SESS_INFO and OPEN again for it (the worker runs only while there is such
 * a pass to make: an idle session has no thread). IO meeting a closed gate waits at it for
 * that open, and for nothing else.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/futex.h>

#include "log.h"
#include "rnbd-export.h"
#include "rnbd-hooks.h"
#include "rnbd-path.h"
#include "rnbd-proto.h"
#include "rnbd.h"
#include "util.h"

/*
 * MAPPED: open in the current server session, IO goes to the transport.
 * CLOSED: not open there (its server session went away, or its open
 * failed); IO waits at the gate and asks for an open. REOPENING: an OPEN is
 * on its way; IO waits at the gate for its outcome. SRV_CLOSED: the server
 * closed it (a force-close: it answered an IO sent under the device's
 * current id and server session with -ENOTCONN); IO fails with -ENOTCONN
 * unsent, nothing opens it again but a remap.
 */
enum dev_state { DEV_MAPPED, DEV_CLOSED, DEV_REOPENING, DEV_UNMAPPED, DEV_SRV_CLOSED };

static const char *const dev_state_names[] = {
	[DEV_MAPPED] = "mapped", [DEV_CLOSED] = "disconnected",
	[DEV_REOPENING] = "reopening", [DEV_UNMAPPED] = "unmapped",
	[DEV_SRV_CLOSED] = "closed",
};

struct clt_io;
STAILQ_HEAD(io_list, clt_io); /* IO at a gate, in order */

struct rnbd_clt_dev {
	struct rnbd_clt_sess *sess;
	struct rnbd_clt_dev *next;
	char name[RNBD_DEV_NAME_MAX];
	enum rnbd_access_mode mode;
	/* sess->lock */
	enum dev_state state;
	uint32_t id;
	uint64_t gen;                /* bumped at every (re)open: which id IO was sent under */
	uint64_t tried;              /* the worker's pass that last sent its OPEN */
	struct rnbd_open_rsp rsp;
	uint64_t bytes;
	unsigned inflight;           /* rnbd_clt_io calls using it */
	bool refusing;               /* a forced unmap is under way */
	bool opening;                /* an OPEN for it is on the wire (map, remap or worker) */
	uint64_t closed_epoch;       /* SRV_CLOSED: the server session that holds its id */
	struct io_list held;         /* IO at the gate: waits for the (re)open */
};

struct rnbd_clt_sess {
	struct rtrs_clt_sess *rtrs;
	char name[256];              /* the session name, for logs */
	unsigned ver;
	uint32_t max_io;
	uint32_t queue_depth;        /* IO slots: the RTRS queue depth less the admin permit */
	/*
	 * The server is of this project (rtrs_clt_peer_ext): it takes PREFLUSH
	 * and NOUNMAP. A kernel rnbd-server before 7.0 drops both.
	 */
	bool project_srv;
	struct rtrs_permit *admin_permit;
	pthread_mutex_t admin_lock;  /* one admin message at a time on it */
	void (*user_link_ev)(void *priv, enum rtrs_clt_link_ev ev);
	void *user_priv;
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* device states, inflight, the worker's flags */
	unsigned inflight_waiters;   /* under lock: unmaps waiting for a device's inflight to drain */
	struct rnbd_clt_dev *devs;
	bool up;                     /* a path is up (link events) */
	bool reopen;                 /* the worker is asked for a pass (reopen_all) */
	bool passing;                /* ... and runs one */
	uint64_t pass;               /* passes the worker started */
	/*
	 * Server sessions met since the open, less one: librtrs's
	 * RTRS_CLT_LINK_EV_SERVER_SESSION events. A device is open in the
	 * current one only (MAPPED); an answer is trusted only from it.
	 */
	uint64_t epoch;
	uint64_t info_epoch;         /* the epoch SESS_INFO last went out in */
	unsigned on_wire;            /* IO requests sent in this epoch, not answered yet */
	unsigned on_wire_old;        /* ... sent in an earlier one */
	struct clt_io *ios;          /* one slot per RTRS permit */
	/*
	 * Devices unmapped while no path was up, still open in the server
	 * session of their epoch: the worker's next pass sends their CLOSEs
	 * (closes_send), ahead of any OPEN in that epoch. Under lock.
	 */
	struct pending_close {
		uint32_t id;
		uint64_t epoch;
	} *closes;
	unsigned nr_closes, closes_cap;
	bool stop;
	bool ready;                  /* the open is done: passes may start a worker */
	pthread_t worker;
	bool worker_started;         /* not joined yet */
	bool worker_running;         /* it has not decided to end */
};

static void *worker(void *arg);

/*
 * The worker is asked for a pass (s->lock held): started unless it runs
 * (it takes the pass before it ends) or the session is not open yet (the
 * open starts it) or closing. A thread that cannot be had now is tried
 * again at the next ask.
 */
static void want_pass(struct rnbd_clt_sess *s)
{
	int rc;

	s->reopen = true;
	if (s->worker_running || s->stop || !s->ready)
		return;
	if (s->worker_started)
		pthread_join(s->worker, NULL); /* it ended: it no longer needs the lock */
	s->worker_started = false;
	rc = pthread_create(&s->worker, NULL, worker, s);
	if (rc) {
		log_err("rnbd: %s: cannot start the worker that opens devices again: %s", s->name,
			strerror(rc));
		return;
	}
	s->worker_started = true;
	s->worker_running = true;
}

/*
 * An IO lives in the session's slot for its permit from submit to done, so
 * the data path allocates nothing. Its pieces (max_io each) go out one
 * after the other on the same permit. An IO whose device is not open on the
 * server waits at the device's gate (d->held) until the open in progress
 * ends: then it is sent, or fails with the open's error.
 */
struct clt_io {
	struct rnbd_clt_dev *d;
	struct rtrs_permit *permit;
	struct rtrs_clt_req_ops ops;
	struct rnbd_msg_io msg;
	enum rnbd_io_op op;
	uint32_t flags;
	bool flush_first;            /* a PREFLUSH for a kernel server: a FLUSH goes first */
	bool flush_after;            /* a FUA a kernel server cannot take: a FLUSH goes last */
	bool flushing;               /* the FLUSH of flush_first or flush_after is on the wire */
	uint64_t offset;
	uint8_t *buf;
	uint32_t len;                /* left to do, from offset */
	uint32_t n;                  /* the piece on the wire */
	uint32_t max;                /* largest piece: the device's max IO when routed */
	uint32_t id;                 /* the device id it goes under */
	uint64_t gen;                /* the device's gen then */
	uint64_t epoch;              /* the session's epoch then */
	int verdict;                 /* held_run: what becomes of it (as io_route) */
	STAILQ_ENTRY(clt_io) next;   /* the gate's list */
	rnbd_clt_done_fn done;
	void *priv;
};

/* ---- one request ---------------------------------------------------------------- */

/*
 * A caller waiting for its request's end: a futex word, RUNNING until the
 * caller goes to sleep on it (SLEEPING) or the request ends (DONE). The
 * completion stores the result, then the word; the caller may return as
 * soon as it reads DONE, so after that store the completion uses only the
 * word's address, for the wake (one that reaches a later wait at the same
 * address is spurious there, and every futex user checks its word again).
 * One wait and one wake per request, where a mutex and a condition cost a
 * third system call: pthread_cond_wait takes its mutex back as contended,
 * so its unlock always wakes.
 */
enum { WAITER_RUNNING, WAITER_DONE, WAITER_SLEEPING };

struct waiter {
	atomic_uint state;
	int err;
};

static void waiter_done(void *priv, int err)
{
	struct waiter *w = priv;
	atomic_uint *word = &w->state;

	w->err = err;
	if (atomic_exchange_explicit(word, WAITER_DONE, memory_order_acq_rel) == WAITER_SLEEPING)
		syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* Waits for waiter_done; its result. */
static int waiter_wait(struct waiter *w)
{
	unsigned st = WAITER_RUNNING;

	if (atomic_compare_exchange_strong_explicit(&w->state, &st, WAITER_SLEEPING,
						    memory_order_acquire, memory_order_acquire))
		st = WAITER_SLEEPING;
	while (st != WAITER_DONE) {
		/* Returns at once unless the word still says SLEEPING; woken, or not, look again. */
		syscall(SYS_futex, &w->state, FUTEX_WAIT_PRIVATE, WAITER_SLEEPING, NULL, NULL, 0);
		st = atomic_load_explicit(&w->state, memory_order_acquire);
	}
	return w->err;
}

static uint64_t sess_epoch(struct rnbd_clt_sess *s)
{
	uint64_t e;

	pthread_mutex_lock(&s->lock);
	e = s->epoch;
	pthread_mutex_unlock(&s->lock);
	return e;
}

/* For request(): send whatever the epoch. */
#define ANY_EPOCH UINT64_MAX
/*
 * How long a map or a remap waits for the session to be ready for an OPEN
 * after a new server session (dev_open_locked): the old IO answered, which
 * may wait for a path up to fast_io_fail_ms, and SESS_INFO.
 */
#define RNBD_OPEN_READY_MS 60000
/*
 * An OPEN answered -EBUSY (the device's writer at the server is closing
 * with IO in flight) is sent again every RNBD_OPEN_BUSY_RETRY_MS for up
 * to RNBD_OPEN_BUSY_MS.
 */
#define RNBD_OPEN_BUSY_MS 5000
#define RNBD_OPEN_BUSY_RETRY_MS 50

/*
 * Sends an admin message (SESS_INFO, OPEN, CLOSE: on the admin connection,
 * as the kernel sends them) with data read into it or written from it, and
 * waits for the answer. They take turns on the session's reserved permit:
 * IO waiting at a gate, or in the transport, holds its permits until its
 * device is open again, so the messages that open it must not wait for one
 * of those. With an epoch, the message is sent only if the session is
 * still in it (else -ENOTCONN): a message meant for a server session that
 * is gone then reaches the new one, if at all, before the worker's
 * SESS_INFO (which waits for admin_lock), where it is refused (-EPROTO)
 * rather than taken for a device opened again under its id.
 */
static int request(struct rnbd_clt_sess *s, uint64_t epoch, enum rtrs_dir dir, const void *msg,
		   size_t msglen, void *data, size_t datalen)
{
	struct waiter w = { WAITER_RUNNING, 0 };
	struct rtrs_clt_req_ops ops = { .priv = &w, .conf = waiter_done };
	struct iovec usr = { (void *)msg, msglen }, iov = { data, datalen };
	int rc;

	pthread_mutex_lock(&s->admin_lock);
	if (epoch != ANY_EPOCH && sess_epoch(s) != epoch) {
		pthread_mutex_unlock(&s->admin_lock);
		return -ENOTCONN;
	}
	rc = rtrs_clt_request(s->rtrs, dir, &ops, s->admin_permit, &usr, 1, &iov,
			      datalen ? 1 : 0);
	if (!rc)
		rc = waiter_wait(&w);
	pthread_mutex_unlock(&s->admin_lock);
	return rc;
}

static int sess_info(struct rnbd_clt_sess *s, uint64_t epoch)
{
	struct rnbd_msg_sess_info m, rsp;
	const char *why = NULL;
	unsigned ver;
	int rc;

	rnbd_sess_info_encode(&m, false, RNBD_PROTO_VER_MAJOR);
	memset(&rsp, 0, sizeof(rsp));
	rc = request(s, epoch, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp));
	if (rc)
		return rc;
	rc = rnbd_sess_info_decode(&rsp, sizeof(rsp), true, &ver, &why);
	if (rc) {
		log_err("rnbd: %s: bad SESS_INFO response: %s", s->name, why);
		return rc;
	}
	s->ver = rnbd_version_negotiate(ver);
	return 0;
}

/*
 * The largest piece of op on d, in whole blocks (s->lock held): reads and
 * writes carry their data in an RTRS request (the transport's max IO) and
 * the server takes max_hw_sectors; discard and secure erase up to
 * max_discard_sectors, write zeroes up to max_write_zeroes_sectors (each
 * from OPEN_RSP). 0: op is not supported. A flush has no size.
 */
static uint32_t dev_max_piece(const struct rnbd_clt_dev *d, enum rnbd_io_op op)
{
	uint64_t sectors, max;

	switch (op) {
	case RNBD_OP_READ:
	case RNBD_OP_WRITE:
		sectors = d->rsp.max_hw_sectors;
		break;
	case RNBD_OP_DISCARD:
		sectors = d->rsp.max_discard_sectors;
		break;
	case RNBD_OP_SECURE_ERASE:
		sectors = d->rsp.secure_discard ? d->rsp.max_discard_sectors : 0;
		break;
	case RNBD_OP_WRITE_ZEROES:
		/*
		 * Only from a server of ours: a kernel server's field was
		 * max_write_same_sectors before Linux 5.18, and operation 5 WRITE_SAME
		 * (one block of data, which write zeroes does not carry).
		 */
		sectors = d->sess->project_srv ? d->rsp.max_write_zeroes_sectors : 0;
		break;
	default:
		return UINT32_MAX;
	}
	max = MIN(sectors << RNBD_SECTOR_SHIFT, (uint64_t)UINT32_MAX);
	if (op == RNBD_OP_READ || op == RNBD_OP_WRITE)
		max = MIN(max, (uint64_t)d->sess->max_io);
	return (uint32_t)(max - max % d->rsp.logical_block_size);
}

/* OPEN, sent only in epoch; the decoded response in *out. */
static int dev_open_msg(struct rnbd_clt_sess *s, uint64_t epoch, const char *name,
			enum rnbd_access_mode mode, struct rnbd_open_rsp *out)
{
	struct rnbd_open o = { .access_mode = mode };
	struct rnbd_msg_open m;
	struct rnbd_msg_open_rsp rsp;
	const char *why = NULL;
	int rc;

	snprintf(o.dev_name, sizeof(o.dev_name), "%s", name);
	rnbd_open_encode(&m, &o);
	/*
	 * -EBUSY: the device's writer at the server is closing with IO in
	 * flight (say our own, from a server session that went away while a
	 * write of it was still in the backing store), and its slot comes
	 * back when that IO is done. Asked again for a while; then the error
	 * stands.
	 */
	for (uint64_t end = now_ms() + RNBD_OPEN_BUSY_MS;;) {
		memset(&rsp, 0, sizeof(rsp));
		rc = request(s, epoch, RTRS_READ, &m, sizeof(m), &rsp, sizeof(rsp));
		if (rc != -EBUSY || now_ms() >= end)
			break;
		usleep(RNBD_OPEN_BUSY_RETRY_MS * 1000);
	}
	if (rc)
		return rc;
	rc = rnbd_open_rsp_decode(&rsp, sizeof(rsp), out, &why);
	if (rc)
		log_err("rnbd: %s: bad OPEN response for %s: %s", s->name, name, why);
	return rc;
}

static int dev_close_msg(struct rnbd_clt_sess *s, uint64_t epoch, uint32_t id)
{
	struct rnbd_msg_close m;

	rnbd_close_encode(&m, id);
	return request(s, epoch, RTRS_WRITE, &m, sizeof(m), NULL, 0);
}

/* CLOSEs still to send to the current server session (s->lock held). */
static bool closes_due(const struct rnbd_clt_sess *s)
{
	for (unsigned i = 0; i < s->nr_closes; i++)
		if (s->closes[i].epoch == s->epoch)
			return true;
	return false;
}

/*
 * d, open in the server session of epoch, is unmapped while no path is
 * up (s->lock held): its CLOSE goes with the worker's next pass, once a
 * path is (the server keeps the device, and its writer slot, until the
 * client closes it or the session ends). -ENOMEM: it cannot be kept.
 */
static int close_later(struct rnbd_clt_sess *s, uint64_t epoch, uint32_t id)
{
	if (s->nr_closes == s->closes_cap) {
		unsigned cap = s->closes_cap ? 2 * s->closes_cap : 8;
		struct pending_close *c = realloc(s->closes, cap * sizeof(*c));

		if (!c)
			return -ENOMEM;
		s->closes = c;
		s->closes_cap = cap;
	}
	s->closes[s->nr_closes++] = (struct pending_close){ .id = id, .epoch = epoch };
	return 0;
}

/*
 * Worker (s->lock held; dropped while a CLOSE is on its way): the pending
 * CLOSEs of the current server session go, in the order of their unmaps;
 * those of an earlier one are dropped (that session and its devices are
 * gone). A CLOSE that fails is not sent again: the server keeps the
 * device until the session ends.
 */
static void closes_send(struct rnbd_clt_sess *s)
{
	while (s->nr_closes && !s->stop) {
		struct pending_close c = s->closes[0];
		int rc = 0;

		if (c.epoch == s->epoch) {
			/* Listed until answered: an OPEN waits for it (closes_due). */
			pthread_mutex_unlock(&s->lock);
			rc = dev_close_msg(s, c.epoch, c.id);
			pthread_mutex_lock(&s->lock);
			if (rc && rc != -ENOTCONN)
				log_warn("rnbd: %s: closing device %u on the server after its unmap: %s",
					 s->name, c.id, strerror(-rc));
			else if (!rc)
				log_info("rnbd: %s: device %u, unmapped while no path was up, closed on "
					 "the server", s->name, c.id);
		}
		/* Only this thread takes entries: the first is still c. */
		memmove(s->closes, s->closes + 1, --s->nr_closes * sizeof(*s->closes));
	}
	pthread_cond_broadcast(&s->cond);
}

/* ---- the gate and the reconnect ----------------------------------------------------- */

static void io_conf(void *priv, int err);
static int io_route(struct clt_io *io);

/*
 * IO waits at d's gate (s->lock held). A closed device asks the worker for
 * an open; a reopening one has its OPEN on the way, whose outcome releases
 * the gate (gate_release).
 */
static void held_add(struct rnbd_clt_dev *d, struct clt_io *io)
{
	struct rnbd_clt_sess *s = d->sess;

	STAILQ_INSERT_TAIL(&d->held, io, next);
	if (d->state == DEV_CLOSED && !s->stop) {
		want_pass(s);
		pthread_cond_broadcast(&s->cond);
	}
}

/*
 * An open of d ended (s->lock held): 0, d is mapped and its IO is routed
 * (sent once the lock is dropped); else it fails with err. The IO moves to
 * the end of *out, for held_run.
 */
static void gate_release(struct rnbd_clt_dev *d, int err, struct io_list *out)
{
	struct clt_io *io;

	STAILQ_FOREACH(io, &d->held, next)
		io->verdict = err ? err : io_route(io); /* mapped: never held again */
	STAILQ_CONCAT(out, &d->held);
}

/* Sends or fails what gate_release or an unmap took from a gate (no lock held). */
static void io_finish(struct clt_io *io, int err);
static void io_send(struct clt_io *io);

static void held_run(struct io_list *list)
{
	struct clt_io *io;

	struct rtrs_clt_sess *rtrs = NULL;

	while ((io = STAILQ_FIRST(list))) {
		STAILQ_REMOVE_HEAD(list, next);
		rtrs = io->d->sess->rtrs;
		if (io->verdict == 1)
			io_send(io);
		else
			io_finish(io, io->verdict);
	}
	/* What ended here, on this thread, a poller learns of (rnbd_clt_poll). */
	if (rtrs)
		rtrs_clt_poll_wake(rtrs);
}

static void link_ev(void *priv, enum rtrs_clt_link_ev ev)
{
	struct rnbd_clt_sess *s = priv;

	pthread_mutex_lock(&s->lock);
	switch (ev) {
	case RTRS_CLT_LINK_EV_DISCONNECTED:
		s->up = false;
		if (!s->stop) /* not the session's own close */
			log_warn("rnbd: %s: no path left; IO waits for one in the transport",
				 s->name);
		break;
	case RTRS_CLT_LINK_EV_RECONNECTED:
		/*
		 * Devices whose open failed for want of a path, if any; not
		 * while a pass runs (the one for a new server session, whose
		 * messages waited for this path), which would only try again
		 * what that pass could not open.
		 */
		s->up = true;
		if (!s->passing || closes_due(s))
			want_pass(s);
		break;
	case RTRS_CLT_LINK_EV_SERVER_SESSION:
		/*
		 * The server forgot our devices. Before this returns no
		 * request reaches the new server session, so an answer from it
		 * always finds the epoch moved on (io_conf, dev_open_locked).
		 */
		s->epoch++;
		s->on_wire_old += s->on_wire;
		s->on_wire = 0;
		for (struct rnbd_clt_dev *d = s->devs; d; d = d->next)
			if (d->state == DEV_MAPPED)
				d->state = DEV_CLOSED;
		want_pass(s); /* SESS_INFO, and the devices */
		if (!s->stop)
			log_info("rnbd: %s: the server has a new session for us (it restarted, or "
				 "dropped the old one): devices are opened again", s->name);
		break;
	default: /* an event of a later librtrs */
		break;
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (s->user_link_ev)
		s->user_link_ev(s->user_priv, ev);
}

/* Test hook (rnbd-hooks.h): called when an OPEN was answered, before its answer is taken. */
static void (*_Atomic open_hook)(void *priv, const char *dev_name);
static void *_Atomic open_hook_priv;

void rnbd_clt_set_open_hook(void (*fn)(void *priv, const char *dev_name), void *priv)
{
	open_hook_priv = priv;
	atomic_store(&open_hook, fn);
}

/*
 * Sends OPEN for d and takes its answer: every OPEN (a map, a remap, the
 * worker's pass) goes through here. Called with s->lock held and d in the
 * session's list, marked REOPENING and opening, so that link events and
 * the worker see it while the OPEN is on its way; returns with the lock
 * held and the OPEN's result. The answer's id, geometry and size are taken
 * whatever happened meanwhile (each OPEN_RSP refreshes the size: the device
 * may have grown while the session was away). d is mapped under the new id
 * only if the session is still in the epoch the OPEN went out in: if a new
 * server session came meanwhile, the answer may be from the one that is
 * gone (its id may name another device in the new one), so d is closed and
 * the worker is asked for another pass, and the IO at its gate waits for
 * that. Otherwise the gate opens (its IO is moved to *release, for held_run
 * once the lock is dropped): it goes, or fails with the OPEN's error.
 */
static int dev_open_locked(struct rnbd_clt_dev *d, struct io_list *release)
{
	struct rnbd_clt_sess *s = d->sess;
	void (*hook)(void *priv, const char *dev_name) = atomic_load(&open_hook);
	uint64_t epoch;
	struct rnbd_open_rsp r;
	int rc;

	/*
	 * A map or a remap waits, as the worker's pass does, until the IO of
	 * an earlier server session is answered and the current one has had
	 * SESS_INFO: an OPEN before that may be given an id that a stale
	 * request still on its way names (a kernel server gives out the
	 * lowest free id, and takes OPEN before SESS_INFO), so that request
	 * would land on this device. The worker's own OPENs find it so.
	 * Likewise the CLOSEs of devices unmapped while no path was up go
	 * first (the server would refuse a device still open under the old
	 * id).
	 */
	if (s->on_wire_old || s->info_epoch != s->epoch || closes_due(s)) {
		struct timespec dl = deadline_ms(RNBD_OPEN_READY_MS);
		int w = 0;

		want_pass(s);
		while ((s->on_wire_old || s->info_epoch != s->epoch || closes_due(s)) && !s->stop &&
		       w != ETIMEDOUT)
			w = pthread_cond_timedwait(&s->cond, &s->lock, &dl);
		if (s->stop || s->on_wire_old || s->info_epoch != s->epoch || closes_due(s)) {
			rc = s->stop ? -ESHUTDOWN : -ETIMEDOUT;
			d->opening = false;
			d->state = DEV_CLOSED;
			gate_release(d, rc, release);
			pthread_cond_broadcast(&s->cond);
			return rc;
		}
	}
	epoch = s->epoch;
	pthread_mutex_unlock(&s->lock);
	rc = dev_open_msg(s, epoch, d->name, d->mode, &r);
	if (hook)
		hook(open_hook_priv, d->name);
	pthread_mutex_lock(&s->lock);
	d->opening = false;
	if (!rc) {
		d->id = r.device_id;
		d->rsp = r;
		d->bytes = r.nsectors << RNBD_SECTOR_SHIFT;
	}
	if (s->epoch == epoch) {
		d->state = rc ? DEV_CLOSED : DEV_MAPPED; /* failed: opened again on demand */
		if (!rc)
			d->gen++;
		gate_release(d, rc, release);
	} else {
		d->state = DEV_CLOSED;
		if (!s->stop)
			want_pass(s);
	}
	pthread_cond_broadcast(&s->cond);
	return rc;
}

/* Opens d again (as dev_open_locked); -ENOTCONN when a new server session came meanwhile. */
static int dev_reopen(struct rnbd_clt_dev *d, struct io_list *release)
{
	int rc = dev_open_locked(d, release);

	return rc ? rc : d->state == DEV_MAPPED ? 0 : -ENOTCONN;
}

/*
 * SESS_INFO failed in a pass (s->lock held): the IO at the gates of the
 * closed devices it was to open fails with its error (to *out).
 */
static void gates_fail(struct rnbd_clt_sess *s, int err, struct io_list *out)
{
	for (struct rnbd_clt_dev *d = s->devs; d; d = d->next)
		if (d->state == DEV_CLOSED && !d->opening)
			gate_release(d, err, out);
}

/*
 * One pass of the worker: SESS_INFO to a server session that has not had
 * it, then OPEN for every closed device. First the IO still on the wire
 * from an earlier server session must be answered: librtrs holds requests
 * across a reconnect and may deliver them to a server that has forgotten
 * the devices, and such a request must find no device (-EPROTO before
 * SESS_INFO) rather than one opened again under its old id. Devices are
 * opened in the order of their old ids (the server gives out the lowest
 * free id, so they get theirs back when all open); one that fails stays
 * closed, its gate's IO fails with the error, and the others go on. A new
 * server session meanwhile ends the pass; the next one starts over.
 */
static void reopen_all(struct rnbd_clt_sess *s)
{
	struct io_list release = STAILQ_HEAD_INITIALIZER(release);
	struct rnbd_clt_dev *d;
	uint64_t epoch, pass;
	int rc;

	pthread_mutex_lock(&s->lock);
	while (s->on_wire_old && !s->stop)
		pthread_cond_wait(&s->cond, &s->lock);
	epoch = s->epoch;
	pass = ++s->pass;
	if (s->info_epoch != epoch && !s->stop) {
		pthread_mutex_unlock(&s->lock);
		rc = sess_info(s, epoch);
		pthread_mutex_lock(&s->lock);
		if (!rc && s->epoch == epoch) {
			s->info_epoch = epoch;
		} else if (rc && s->epoch == epoch) {
			log_err("rnbd: %s: SESS_INFO after reconnect failed: %s", s->name,
				strerror(-rc));
			gates_fail(s, rc, &release);
		}
	}
	while (s->info_epoch == epoch && s->epoch == epoch && !s->stop) {
		struct rnbd_clt_dev *next = NULL;

		closes_send(s); /* unmapped while no path was up: before any OPEN */
		if (s->epoch != epoch || s->stop)
			break;

		/* The closed device with the lowest old id not tried in this pass. */
		for (d = s->devs; d; d = d->next)
			if (d->state == DEV_CLOSED && !d->refusing && !d->opening &&
			    d->tried != pass && (!next || d->id < next->id))
				next = d;
		d = next;
		if (!d)
			break;
		d->state = DEV_REOPENING;
		d->opening = true;
		d->tried = pass;
		rc = dev_reopen(d, &release);
		if (!rc)
			log_info("rnbd: %s: %s open again (device %u)", s->name, d->name, d->id);
		else if (s->epoch == epoch)
			log_err("rnbd: %s: opening %s again failed: %s", s->name, d->name,
				strerror(-rc));
		pthread_mutex_unlock(&s->lock);
		held_run(&release);
		pthread_mutex_lock(&s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	held_run(&release);
}

/* The session's worker: the passes that open devices again (reopen_all), while asked. */
static void *worker(void *arg)
{
	struct rnbd_clt_sess *s = arg;

	pthread_setname_np(pthread_self(), "rnbd-reopen");
	pthread_mutex_lock(&s->lock);
	while (!s->stop && s->reopen) {
		s->reopen = false;
		s->passing = true;
		pthread_mutex_unlock(&s->lock);
		reopen_all(s);
		pthread_mutex_lock(&s->lock);
		s->passing = false;
	}
	s->worker_running = false;
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* ---- sessions ------------------------------------------------------------------- */

RNBD_EXPORT
int rnbd_clt_sess_open(const struct rtrs_clt_opts *opts, struct rnbd_clt_sess **out)
{
	struct rtrs_clt_opts o;
	struct rtrs_attrs a = { .size = sizeof(a) };
	struct rnbd_clt_sess *s;
	int rc;

	if (!opts || opts->size < sizeof(o) || !out)
		return -EINVAL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->admin_lock, NULL);
	cond_init_mono(&s->cond); /* dev_open_locked waits with a deadline */
	s->up = true; /* rtrs_clt_open connects every path */
	o = *opts;
	snprintf(s->name, sizeof(s->name), "%s", o.sessname ? o.sessname : "");
	s->user_link_ev = o.link_ev;
	s->user_priv = o.priv;
	o.link_ev = link_ev;
	o.priv = s;
	rc = rtrs_clt_open(&o, &s->rtrs);
	if (rc)
		goto fail;
	rc = rtrs_clt_query(s->rtrs, &a);
	if (!rc && a.queue_depth < 2) {
		log_err("rnbd: %s: the server gives %u request slot(s): one is kept for admin "
			"messages, IO needs another", s->name, a.queue_depth);
		rc = -ENOSPC;
	}
	if (!rc) {
		/*
		 * Whatever the epoch: if a new server session came already,
		 * info_epoch stays behind and the worker sends it again.
		 */
		uint64_t epoch = sess_epoch(s);

		s->admin_permit = rtrs_clt_get_permit(s->rtrs, RTRS_ADMIN_CON, RTRS_PERMIT_WAIT);
		rc = s->admin_permit ? sess_info(s, ANY_EPOCH) : -ECONNABORTED;
		s->info_epoch = epoch;
	}
	if (rc) {
		log_err("rnbd: %s: session setup failed: %s", s->name, strerror(-rc));
		goto fail_rtrs;
	}
	s->max_io = a.max_io_size;
	s->queue_depth = a.queue_depth - 1;
	s->project_srv = rtrs_clt_peer_ext(s->rtrs) == 1;
	s->ios = calloc(a.queue_depth, sizeof(*s->ios)); /* indexed by permit id */
	if (!s->ios) {
		rc = -ENOMEM;
		goto fail_rtrs;
	}
	pthread_mutex_lock(&s->lock);
	s->ready = true;
	if (s->reopen) /* asked while opening */
		want_pass(s);
	pthread_mutex_unlock(&s->lock);
	log_info("rnbd: %s: session open, protocol version %u, IO up to %u bytes%s", s->name,
		 s->ver, s->max_io, s->project_srv ? "" : "; a kernel server: PREFLUSH goes as a "
		 "FLUSH first, NOUNMAP is refused");
	*out = s;
	return 0;
fail_rtrs:
	rtrs_clt_put_permit(s->rtrs, s->admin_permit);
	rtrs_clt_close(s->rtrs);
fail:
	free(s->ios);
	free(s->closes);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->admin_lock);
	pthread_cond_destroy(&s->cond);
	free(s);
	return rc;
}

RNBD_EXPORT
void rnbd_clt_sess_close(struct rnbd_clt_sess *s)
{
	if (!s)
		return;
	for (;;) {
		struct rnbd_clt_dev *d;

		pthread_mutex_lock(&s->lock);
		d = s->devs;
		pthread_mutex_unlock(&s->lock);
		if (!d)
			break;
		rnbd_clt_unmap(d, true);
	}
	pthread_mutex_lock(&s->lock);
	s->stop = true; /* no worker starts any more */
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	if (s->worker_started)
		pthread_join(s->worker, NULL);
	rtrs_clt_put_permit(s->rtrs, s->admin_permit);
	rtrs_clt_close(s->rtrs);
	free(s->ios);
	free(s->closes);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->admin_lock);
	pthread_cond_destroy(&s->cond);
	free(s);
}

/* ---- devices -------------------------------------------------------------------- */

/* The mapped device named name (normalised), or NULL (s->lock held). */
static struct rnbd_clt_dev *dev_find(struct rnbd_clt_sess *s, const char *name)
{
	for (struct rnbd_clt_dev *o = s->devs; o; o = o->next)
		if (!strcmp(o->name, name))
			return o;
	return NULL;
}

RNBD_EXPORT
int rnbd_dev_name_check(const char *dev_name, const char **why)
{
	return rnbd_dev_name_valid(dev_name, why) ? 0 : -EINVAL;
}

RNBD_EXPORT
int rnbd_clt_map(struct rnbd_clt_sess *s, const char *dev_name, enum rnbd_clt_mode mode,
		 struct rnbd_clt_dev **out)
{
	struct io_list release = STAILQ_HEAD_INITIALIZER(release);
	struct rnbd_clt_dev *d;
	const char *why = NULL;
	int rc;

	err_detail_clear();
	if (!s || !out || (unsigned)mode > RNBD_ACCESS_MIGRATION)
		return -EINVAL;
	if (!rnbd_dev_name_valid(dev_name, &why)) {
		log_err("rnbd: %s: cannot map \"%s\": %s", s->name, dev_name ? dev_name : "", why);
		err_detail("%s", why);
		return -EINVAL;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->sess = s;
	STAILQ_INIT(&d->held);
	d->mode = (enum rnbd_access_mode)mode;
	snprintf(d->name, sizeof(d->name), "%s", dev_name);
	rnbd_dev_name_normalize(d->name);
	/*
	 * In the list before the OPEN goes, as a device being opened again:
	 * a new server session meanwhile treats it as any other device
	 * (dev_open_locked), so an answer from a server session that is gone
	 * never becomes a mapping.
	 */
	d->state = DEV_REOPENING;
	d->opening = true;
	pthread_mutex_lock(&s->lock);
	if (dev_find(s, d->name)) {
		pthread_mutex_unlock(&s->lock);
		free(d);
		return -EEXIST;
	}
	d->next = s->devs;
	s->devs = d;
	rc = dev_open_locked(d, &release); /* no handle yet, so nothing at its gate */
	if (rc) {
		/* Never mapped: out of the list before the worker may pick it up. */
		for (struct rnbd_clt_dev **pp = &s->devs; *pp; pp = &(*pp)->next) {
			if (*pp == d) {
				*pp = d->next;
				break;
			}
		}
		pthread_mutex_unlock(&s->lock);
		log_err("rnbd: %s: mapping %s (%s) failed: %s", s->name, d->name,
			rnbd_access_mode_name(d->mode), strerror(-rc));
		free(d);
		return rc;
	}
	if (d->state == DEV_MAPPED && !dev_max_piece(d, RNBD_OP_READ)) {
		/* Not one block fits the transport's largest IO: nothing could be read or written. */
		uint32_t id = d->id, lbs = d->rsp.logical_block_size, max_io = s->max_io;
		uint64_t epoch = s->epoch;

		for (struct rnbd_clt_dev **pp = &s->devs; *pp; pp = &(*pp)->next) {
			if (*pp == d) {
				*pp = d->next;
				break;
			}
		}
		pthread_mutex_unlock(&s->lock);
		rc = dev_close_msg(s, epoch, id);
		log_err("rnbd: %s: mapping %s refused: its blocks of %u bytes are larger than the "
			"transport's largest IO of %u bytes%s", s->name, d->name, lbs, max_io,
			rc ? " (and its CLOSE failed)" : "");
		err_detail("blocks of %u bytes, larger than the transport's largest IO of %u bytes",
			   lbs, max_io);
		free(d);
		return -EINVAL;
	}
	log_info("rnbd: %s: mapped %s (%s), %llu bytes%s", s->name, d->name,
		 rnbd_access_mode_name(d->mode), (unsigned long long)d->bytes,
		 d->state == DEV_MAPPED ? "" : "; the server has a new session since, it is "
					       "opened again with the others");
	pthread_mutex_unlock(&s->lock);
	held_run(&release);
	*out = d;
	return 0;
}

RNBD_EXPORT
int rnbd_clt_unmap(struct rnbd_clt_dev *d, bool force)
{
	struct io_list held = STAILQ_HEAD_INITIALIZER(held);
	struct rnbd_clt_sess *s;
	bool open_there;
	uint64_t epoch;
	int rc = 0;

	if (!d)
		return -EINVAL;
	s = d->sess;
	pthread_mutex_lock(&s->lock);
	if (d->inflight && !force) {
		pthread_mutex_unlock(&s->lock);
		return -EBUSY;
	}
	d->refusing = true;
	gate_release(d, -ENODEV, &held); /* sent nowhere yet: they fail now */
	pthread_mutex_unlock(&s->lock);
	held_run(&held);
	pthread_mutex_lock(&s->lock);
	s->inflight_waiters++;
	while (d->inflight || d->opening)
		pthread_cond_wait(&s->cond, &s->lock);
	s->inflight_waiters--;
	/*
	 * Open in the current server session: CLOSE. While no path is up it
	 * would wait for one here: the worker sends it when a path is back
	 * (if the server session is gone by then, the device went with it).
	 */
	open_there = d->state == DEV_MAPPED ||
		     (d->state == DEV_SRV_CLOSED && d->closed_epoch == s->epoch);
	epoch = s->epoch;
	if (open_there && !s->up) {
		open_there = false;
		if (close_later(s, epoch, d->id))
			log_err("rnbd: %s: %s stays open on the server until its session ends: no "
				"memory to keep its CLOSE", s->name, d->name);
	}
	d->state = DEV_UNMAPPED;
	for (struct rnbd_clt_dev **pp = &s->devs; *pp; pp = &(*pp)->next) {
		if (*pp == d) {
			*pp = d->next;
			break;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (open_there) {
		rc = dev_close_msg(s, epoch, d->id);
		if (rc && rc != -ENOTCONN)
			log_warn("rnbd: %s: closing %s on the server: %s", s->name, d->name,
				 strerror(-rc));
	}
	log_info("rnbd: %s: unmapped %s", s->name, d->name);
	free(d);
	return 0;
}

RNBD_EXPORT
int rnbd_clt_remap(struct rnbd_clt_dev *d)
{
	struct io_list release = STAILQ_HEAD_INITIALIZER(release);
	struct rnbd_clt_sess *s;
	int rc;

	if (!d)
		return -EINVAL;
	s = d->sess;
	pthread_mutex_lock(&s->lock);
	if (d->state == DEV_MAPPED)
		rc = -EALREADY;
	else if ((d->state != DEV_CLOSED && d->state != DEV_SRV_CLOSED) || d->refusing ||
		 d->opening)
		rc = -EBUSY;
	else {
		bool held = d->state == DEV_SRV_CLOSED && d->closed_epoch == s->epoch && s->up;
		uint64_t epoch = s->epoch;
		uint32_t id = d->id;

		d->state = DEV_REOPENING;
		d->opening = true;
		if (held) {
			/* The server keeps a closed device's id until told: closed first. */
			pthread_mutex_unlock(&s->lock);
			rc = dev_close_msg(s, epoch, id);
			if (rc && rc != -ENOTCONN)
				log_warn("rnbd: %s: closing %s (id %u) on the server before opening it "
					 "again: %s", s->name, d->name, id, strerror(-rc));
			pthread_mutex_lock(&s->lock);
		}
		rc = dev_reopen(d, &release);
	}
	pthread_mutex_unlock(&s->lock);
	held_run(&release);
	return rc;
}

RNBD_EXPORT
int rnbd_clt_resize(struct rnbd_clt_dev *d, uint64_t size)
{
	uint64_t server;
	int rc = 0;

	if (!d)
		return -EINVAL;
	pthread_mutex_lock(&d->sess->lock);
	server = d->rsp.nsectors << RNBD_SECTOR_SHIFT;
	if (!size || size % d->rsp.logical_block_size || size > server)
		rc = -EINVAL;
	else
		d->bytes = size;
	pthread_mutex_unlock(&d->sess->lock);
	if (rc)
		log_err("rnbd: %s: cannot resize %s to %llu bytes: the size must be whole %u-byte "
			"blocks, 1 block to the %llu bytes the server has", d->sess->name, d->name,
			(unsigned long long)size, d->rsp.logical_block_size,
			(unsigned long long)server);
	return rc;
}

RNBD_EXPORT
int rnbd_clt_dev_info(struct rnbd_clt_dev *d, struct rnbd_clt_dev_info *in)
{
	if (!d || !in || in->size < sizeof(*in))
		return -EINVAL;
	pthread_mutex_lock(&d->sess->lock);
	*in = (struct rnbd_clt_dev_info){
		.size = in->size,
		.bytes = d->bytes,
		.logical_block_size = d->rsp.logical_block_size,
		.physical_block_size = d->rsp.physical_block_size,
		.max_io = dev_max_piece(d, RNBD_OP_READ),
		.read_only = d->mode == RNBD_ACCESS_RO,
		/* What a request can carry: none below one block. */
		.discard = dev_max_piece(d, RNBD_OP_DISCARD) > 0,
		.write_zeroes = dev_max_piece(d, RNBD_OP_WRITE_ZEROES) > 0,
		.secure_erase = dev_max_piece(d, RNBD_OP_SECURE_ERASE) > 0,
		.write_cache = d->rsp.cache_policy & RNBD_WRITEBACK,
		.fua = (d->rsp.cache_policy & (RNBD_WRITEBACK | RNBD_FUA)) ==
		       (RNBD_WRITEBACK | RNBD_FUA),
		/* Open on the server, but with no path to it: "disconnected" too. */
		.state = d->refusing && d->state != DEV_UNMAPPED ? "unmapping"
			 : d->state == DEV_MAPPED && !d->sess->up ? "disconnected"
			 : dev_state_names[d->state],
		.queue_depth = d->sess->queue_depth,
	};
	pthread_mutex_unlock(&d->sess->lock);
	return 0;
}

/* ---- IO --------------------------------------------------------------------------- */

static __thread bool in_done; /* this thread runs a done callback */

/*
 * Where io goes next (s->lock held): 1, out under the device's current id
 * (counted on the wire in the current epoch); 0, at the device's gate until
 * its open ends; or the error it fails with.
 */
static int io_route(struct clt_io *io)
{
	struct rnbd_clt_dev *d = io->d;
	struct rnbd_clt_sess *s = d->sess;

	if (d->refusing || d->state == DEV_UNMAPPED)
		return -ENODEV;
	if (d->state == DEV_SRV_CLOSED)
		return -ENOTCONN;
	if (d->state == DEV_MAPPED) {
		io->max = dev_max_piece(d, io->op);
		if (!io->max)
			return -EOPNOTSUPP; /* opened again, the device no longer does it */
		io->id = d->id;
		io->gen = d->gen;
		io->epoch = s->epoch;
		s->on_wire++;
		return 1;
	}
	held_add(d, io);
	return 0;
}

/* Sends io's next piece (no lock held). */
static void io_send(struct clt_io *io)
{
	struct rnbd_clt_sess *s = io->d->sess;
	bool data = io->op == RNBD_OP_READ || io->op == RNBD_OP_WRITE;
	struct rnbd_io w = { .device_id = io->id, .sector = io->offset >> RNBD_SECTOR_SHIFT,
			     .op = io->op, .flags = io->flags };
	struct iovec usr = { &io->msg, sizeof(io->msg) }, iov;
	int rc;

	if (io->flushing) {
		/*
		 * For a kernel server, which would drop the PREFLUSH (or fail a
		 * FUA that is not on a write): a FLUSH of its own.
		 */
		struct rnbd_io f = { .device_id = io->id, .op = RNBD_OP_FLUSH, .flags = RNBD_F_SYNC };

		io->n = 0;
		rnbd_io_encode(&io->msg, &f);
		rc = rtrs_clt_request(s->rtrs, RTRS_WRITE, &io->ops, io->permit, &usr, 1, NULL, 0);
		if (rc)
			io_conf(io, rc);
		return;
	}
	/* Cut at the device's largest piece for the op (dev_max_piece). */
	io->n = MIN(io->len, io->max);
	w.bi_size = io->n;
	if (io->op == RNBD_OP_WRITE || io->op == RNBD_OP_FLUSH)
		w.flags |= io->flags & (RNBD_F_FUA | RNBD_F_PREFLUSH) ? RNBD_F_SYNC : 0;
	rnbd_io_encode(&io->msg, &w);
	iov = (struct iovec){ io->buf, data ? io->n : 0 };
	rc = rtrs_clt_request(s->rtrs, io->op == RNBD_OP_READ ? RTRS_READ : RTRS_WRITE, &io->ops,
			      io->permit, &usr, 1, &iov, data ? 1 : 0);
	if (rc)
		io_conf(io, rc);
}

/*
 * The end of io (no lock held): its slot goes back, the device stops
 * counting it (an unmap may go on), then done runs.
 */
static void io_finish(struct clt_io *io, int err)
{
	struct rnbd_clt_dev *d = io->d;
	struct rnbd_clt_sess *s = d->sess;
	rnbd_clt_done_fn done = io->done;
	void *priv = io->priv;
	bool nested = in_done;

	rtrs_clt_put_permit(s->rtrs, io->permit); /* io may be reused from here on */
	pthread_mutex_lock(&s->lock);
	/* Only an unmap waits for it: no wake-up of the worker per IO. */
	if (--d->inflight == 0 && s->inflight_waiters)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	in_done = true;
	done(priv, err);
	in_done = nested;
}

/*
 * A piece's answer. On success the next piece goes, or the IO is done. A
 * piece that failed because its device was not open where it arrived
 * (-ENOTCONN, or -EPROTO before SESS_INFO) or because the transport gave
 * up on it (-ECONNABORTED, -ETIMEDOUT) is routed again (sent, or held at
 * the gate until the device is open again) when the server session changed
 * since it was routed (epoch: librtrs tells of a new one before any request
 * reaches it, so an answer from it always finds the epoch moved on) or the
 * device was opened again meanwhile (gen). Otherwise the error stands: a
 * force-close's -ENOTCONN reaches the caller, and so does the transport's
 * verdict after waiting fast_io_fail_ms for a path; an IO does not wait
 * for a path twice. If such a piece cannot be routed again (a forced
 * unmap), its own error stands too. A block write may thus be sent twice,
 * as block layers do on failover, but only once its first server session is
 * gone.
 */
static void io_conf(void *priv, int err)
{
	struct clt_io *io = priv;
	struct rnbd_clt_dev *d = io->d;
	struct rnbd_clt_sess *s = d->sess;
	bool retry = err == -ENOTCONN || err == -ETIMEDOUT || err == -ECONNABORTED ||
		     err == -EPROTO, closed = false;
	int route = -1; /* 1: send the next piece, 0: held, < 0: finished with result */
	int result = err;

	pthread_mutex_lock(&s->lock);
	if (io->epoch == s->epoch)
		s->on_wire--;
	else if (--s->on_wire_old == 0)
		pthread_cond_broadcast(&s->cond); /* the worker's pass waits for it */
	if (retry && (io->epoch != s->epoch || io->gen != d->gen)) {
		route = io_route(io); /* the same piece again; if it cannot go, err stands */
	} else if (err == -ENOTCONN && d->state == DEV_MAPPED) {
		/* Its server session and id are the device's now: the server closed it. */
		d->state = DEV_SRV_CLOSED;
		d->closed_epoch = s->epoch;
		closed = true;
	} else if (!err && io->flushing && io->flush_first) {
		io->flush_first = io->flushing = false; /* flushed: now the IO itself */
		route = result = io_route(io);
	} else if (!err && io->flushing) {
		io->flushing = false; /* the FLUSH after the last piece: done */
	} else if (!err && io->len > io->n) {
		io->offset += io->n;
		io->len -= io->n;
		if (io->buf)
			io->buf += io->n;
		io->flags &= ~(uint32_t)RNBD_F_PREFLUSH; /* once, before the first piece */
		route = result = io_route(io);
	} else if (!err && io->flush_after) {
		io->flush_after = false; /* the last piece is in: now the FLUSH */
		io->flushing = true;
		route = result = io_route(io);
	}
	pthread_mutex_unlock(&s->lock);
	if (closed)
		log_warn("rnbd: %s: %s was closed by the server: its IO fails with ENOTCONN "
			 "(a remap opens it again)", s->name, d->name);
	if (route == 1)
		io_send(io);
	else if (route < 0)
		io_finish(io, result);
}

/*
 * Whether d takes this IO (s->lock held): refused here, nothing is sent.
 * -ENODEV: unmapped or being unmapped; -EROFS: anything but read and flush
 * on a read-only mapping; -EOPNOTSUPP: discard, secure erase or write
 * zeroes the device does not do (OPEN_RSP); -EINVAL: a range outside the
 * device or not in whole logical blocks, empty, or a flush with a range.
 */
static int dev_takes(const struct rnbd_clt_dev *d, enum rnbd_io_op op, uint64_t offset,
		     uint32_t len)
{
	uint32_t lbs = d->rsp.logical_block_size;

	if (d->state == DEV_UNMAPPED || d->refusing)
		return -ENODEV;
	if (d->state == DEV_SRV_CLOSED)
		return -ENOTCONN;
	if (d->mode == RNBD_ACCESS_RO && op != RNBD_OP_READ && op != RNBD_OP_FLUSH)
		return -EROFS;
	if (op == RNBD_OP_FLUSH)
		return offset || len ? -EINVAL : 0;
	if (!dev_max_piece(d, op))
		return -EOPNOTSUPP;
	if (!len || offset % lbs || len % lbs || offset > d->bytes || len > d->bytes - offset)
		return -EINVAL;
	return 0;
}

RNBD_EXPORT
int rnbd_clt_submit(struct rnbd_clt_dev *d, enum rnbd_clt_op cop, uint32_t flags,
		    uint64_t offset, void *buf, uint32_t len, rnbd_clt_done_fn done, void *priv)
{
	enum rnbd_io_op op = (enum rnbd_io_op)cop;
	bool data = op == RNBD_OP_READ || op == RNBD_OP_WRITE, flush_first = false;
	bool flush_after = false;
	const char *why = NULL;
	struct rnbd_clt_sess *s;
	struct rtrs_permit *permit;
	struct clt_io *io;
	bool nowait = in_done || (flags & RNBD_CLT_F_NOWAIT);
	int rc;

	flags &= ~RNBD_CLT_F_NOWAIT; /* the library's, not the wire's */
	/* What needs no device: the op, its flags (as the server checks them), the buffer. */
	if (!d || !done || (flags & RNBD_F_SYNC) || rnbd_io_op_check(op, flags, &why) ||
	    data != (buf != NULL))
		return -EINVAL;
	s = d->sess;
	/* What a kernel server cannot keep: PREFLUSH as a FLUSH before, NOUNMAP refused. */
	if (!s->project_srv && rnbd_io_for_kernel(op, &flags, &flush_first, &flush_after)) {
		log_dbg("rnbd: %s: %s: write zeroes that keep the blocks (NOUNMAP) refused: a "
			"kernel server would drop the flag", s->name, d->name);
		return -EOPNOTSUPP;
	}
	/* Refused before waiting for a slot ... */
	pthread_mutex_lock(&s->lock);
	rc = dev_takes(d, op, offset, len);
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return rc;
	permit = rtrs_clt_get_permit(s->rtrs, RTRS_IO_CON,
				     nowait ? RTRS_PERMIT_NOWAIT : RTRS_PERMIT_WAIT);
	if (!permit)
		return nowait && errno == EAGAIN ? -EAGAIN : errno == ETIMEDOUT ? -ETIMEDOUT :
		       -ECONNABORTED;
	io = &s->ios[rtrs_permit_id(permit)];
	*io = (struct clt_io){ .d = d, .permit = permit, .ops = { .priv = io, .conf = io_conf },
			       .op = op, .flags = flags, .flush_first = flush_first,
			       .flush_after = flush_after, .flushing = flush_first,
			       .offset = offset, .buf = buf, .len = len, .done = done, .priv = priv };
	/* ... and again after it, which may have taken a while (an unmap, a reopen). */
	pthread_mutex_lock(&s->lock);
	rc = dev_takes(d, op, offset, len);
	if (!rc)
		rc = io_route(io);
	if (rc >= 0)
		d->inflight++;
	pthread_mutex_unlock(&s->lock);
	if (rc < 0) {
		rtrs_clt_put_permit(s->rtrs, permit);
		return rc;
	}
	if (rc == 1)
		io_send(io);
	return 0;
}

RNBD_EXPORT
int rnbd_clt_io(struct rnbd_clt_dev *d, enum rnbd_clt_op op, uint32_t flags, uint64_t offset,
		void *buf, uint32_t len)
{
	struct waiter w = { WAITER_RUNNING, 0 };
	int rc;

	if (in_done)
		return -EDEADLK;
	rc = rnbd_clt_submit(d, op, flags, offset, buf, len, waiter_done, &w);
	return rc ? rc : waiter_wait(&w);
}

RNBD_EXPORT
int rnbd_clt_poll(struct rnbd_clt_sess *sess, int timeout_ms)
{
	return sess ? rtrs_clt_poll(sess->rtrs, timeout_ms) : -EINVAL;
}

RNBD_EXPORT
int rnbd_clt_poll_fd(struct rnbd_clt_sess *sess)
{
	return sess ? rtrs_clt_poll_fd(sess->rtrs) : -EINVAL;
}

RNBD_EXPORT
int rnbd_clt_poll_wait_begin(struct rnbd_clt_sess *sess)
{
	return sess ? rtrs_clt_poll_wait_begin(sess->rtrs) : -EINVAL;
}

RNBD_EXPORT
void rnbd_clt_poll_wait_end(struct rnbd_clt_sess *sess)
{
	if (sess)
		rtrs_clt_poll_wait_end(sess->rtrs);
}

RNBD_EXPORT
struct rtrs_clt_sess *rnbd_clt_rtrs(struct rnbd_clt_sess *sess)
{
	return sess ? sess->rtrs : NULL;
}
