/* SPDX-License-Identifier: MIT */
/*
 * The RNBD server over librtrs (docs/rnbd.md section 2).
 *
 * Sessions come and go with the transport's link events. Requests arrive
 * through rdma_ev on the transport's completion threads: SESS_INFO and
 * OPEN are answered at once (in the read buffer); CLOSE once its device is
 * released; IO goes to the device's backing store and is answered from the
 * store's thread when it completes.
 *
 * Devices: a session's open devices sit in a table indexed by device id.
 * Every open of a file or block device has its own descriptor and store;
 * memory devices are shared by all sessions. The sharing rule counts
 * writers per backing object (device and inode) across sessions. A device
 * closed from the server side (force-close) keeps its id, and IO on it
 * fails with -ENOTCONN until the client closes it.
 *
 * Closing: a device has a reference while it is open and one per IO in
 * flight. CLOSE, force-close and a session going down drop the first (once:
 * `closing`); the last reference queues the release (store closed, writer
 * slot back) for a release thread. Nothing that holds a lock, and no
 * completion or service thread, ever waits for a device's IO to drain: a
 * backing file that hangs holds its own device, its session's CLOSE of it
 * and its writer slot, and nothing else. A CLOSE is answered once its device
 * is released, so a client that closed a device may open it again at once.
 *
 * Locks, each held only for short work that does not wait: srv->lock
 * guards the session list and the writer table; sess->open_lock
 * serialises a session's OPENs (a name opened twice at once is one device);
 * sess->lock guards the session's device table and each device's `forced`;
 * srv->rel_lock guards the release queue and what becomes of a device once
 * released. Order: sess->open_lock (an OPEN takes the writer table under
 * it), srv->lock, sess->lock, srv->rel_lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "log.h"
#include "rnbd-access.h"
#include "rnbd-backend.h"
#include "rnbd-export.h"
#include "rnbd-path.h"
#include "rnbd-proto.h"
#include "rnbd-qos.h"
#include "rnbd.h"
#include "rtrs.h"
#include "util.h"

#define RNBD_SESSNAME_MAX 256
#define MEM_DEVS_MAX 16
/* How long rnbd_srv_force_close waits for the device's IO in flight. */
#define RNBD_FORCE_CLOSE_WAIT_MS 1000
/* A release thread with nothing to do for this long ends. */
#define RNBD_RELEASE_IDLE_MS 5000

struct mem_dev {
	char name[RNBD_DEV_NAME_MAX];
	struct rnbd_store *store;
};

/* Writers of one backing object, across sessions. */
struct writers {
	LIST_ENTRY(writers) link;    /* srv->writers */
	dev_t dev;
	ino_t ino;
	unsigned count;
	/* Of count, devices closing: their slots come back once their IO is done. */
	atomic_uint releasing;
};

/* One force-close waiting for its device's release. */
struct rel_waiter {
	bool done;
};

struct sess_dev {
	struct rnbd_sess *sess;      /* holds a reference on it */
	uint32_t id;
	char name[RNBD_DEV_NAME_MAX];
	enum rnbd_access_mode mode;
	struct rnbd_store *store;
	bool own_store;              /* files: closed with the device; memory: shared */
	bool forced;                 /* sess->lock: closed by the server: IO gets -ENOTCONN */
	struct writers *w;           /* NULL when read-only */
	struct rnbd_qos *_Atomic qos; /* its name's rate limits; NULL: none ever set */
	/* One while open (until `closing`), one per IO in flight; the last releases. */
	atomic_uint refs;
	atomic_bool closing;
	bool w_releasing;            /* counted in w->releasing (dev_closing) */
	/* srv->rel_lock */
	bool detached;               /* out of its table: freed once released */
	bool released;               /* store and writer slot given back */
	struct rtrs_srv_op *close_op; /* a CLOSE answered once it is released */
	struct rel_waiter *waiter;   /* a force-close waiting for the release */
	STAILQ_ENTRY(sess_dev) rel_link; /* srv->rel_queue */
	/* What the session did on it (rnbd_srv_list). */
	atomic_uint_fast64_t reads, writes, read_bytes, write_bytes, other, errors;
};

/*
 * One IO on its way through a store, in its request's slot: a session has
 * one per RTRS chunk (rtrs_srv_op_id), so the IO path allocates nothing.
 * The slot is its op's from rdma_ev until rtrs_srv_resp_rdma, and is not
 * touched after that: the client may reuse the chunk at once.
 */
struct srv_io {
	struct rnbd_breq r;          /* the store's: a short transfer moves its offset and len on */
	struct rtrs_srv_op *op;
	struct sess_dev *sd;
	uint64_t offset;             /* the request as the client sent it, for counts and logs */
	uint32_t len;
	struct rnbd_qos_item q;      /* while its tokens are awaited */
};

struct rnbd_sess {
	struct rnbd_srv *srv;
	LIST_ENTRY(rnbd_sess) link;  /* srv->sessions */
	char name[RNBD_SESSNAME_MAX];
	char host[RNBD_SESSNAME_MAX]; /* the host it authenticated as; "" without authentication */
	struct rnbd_qos *_Atomic qos; /* its name's rate limits; NULL: none ever set */
	struct rnbd_qos *_Atomic host_qos; /* its host's; NULL: none ever set, or no host */
	atomic_uint ver;             /* negotiated; 0 before SESS_INFO */
	/*
	 * The client speaks only the kernel's RTRS (rtrs_srv_sess_peer_ext):
	 * a kernel rnbd-client, to which operation 5 meant WRITE_SAME (before
	 * 5.18), nothing (to 6.1) or WRITE_ZEROES (later): it is offered no
	 * write zeroes and may not send them.
	 */
	bool kernel_clt;
	atomic_uint refs;            /* the link's, and one per device not yet freed */
	pthread_mutex_t open_lock;
	pthread_mutex_t lock;
	struct sess_dev **devs;
	uint32_t ndevs;
	struct srv_io *ios;          /* one per RTRS chunk (queue depth) */
	uint32_t nios;
	/*
	 * Its devices' open, close and release lines: a burst of 10 per 5 s
	 * per session, so a client opening and closing in a loop does not
	 * fill the log while a storm of sessions each still logs its own.
	 */
	struct log_ratelimit dev_log_rl;
};

#define sess_dev_log(sess, ...)                                                       \
	do {                                                                          \
		if (LOG_INFO <= g_log_level && log_ratelimit_ok(&(sess)->dev_log_rl)) \
			log_msg(LOG_INFO, __VA_ARGS__);                              \
	} while (0)

struct rnbd_srv {
	struct rnbd_srv_opts o;
	char search[4096];
	/*
	 * The access file's rules (with authentication): access_lock guards
	 * the pointer, taken for reading around each look-up. NULL after a
	 * read that failed: nothing is granted.
	 */
	char access_file[4096];
	pthread_rwlock_t access_lock;
	struct rnbd_access *access;
	struct rnbd_qos_ctx *qos;    /* rate limits (rnbd-qos.h) */
	struct rtrs_srv_ctx *rtrs;
	struct rnbd_engine *engine;
	pthread_mutex_t lock;
	LIST_HEAD(, rnbd_sess) sessions;
	LIST_HEAD(, writers) writers;
	struct mem_dev mem[MEM_DEVS_MAX];
	unsigned nmem;
	/*
	 * Releases: a queue and the threads that work it (one more when none
	 * is idle; detached, each ends after RNBD_RELEASE_IDLE_MS with nothing
	 * to do).
	 */
	pthread_mutex_t rel_lock;
	pthread_cond_t rel_cond;     /* work queued, a device released or freed, a thread ended */
	STAILQ_HEAD(, sess_dev) rel_queue;
	unsigned rel_nthreads, rel_idle;
	bool rel_stop;
	unsigned live;               /* devices not freed yet */
};

/* ---- access (docs/security.md section 2.6) -------------------------------------- */

static bool access_session(struct rnbd_srv *srv, const char *host, const char *name)
{
	bool ok, unread;

	pthread_rwlock_rdlock(&srv->access_lock);
	ok = rnbd_access_session(srv->access, host, name);
	unread = !srv->access;
	pthread_rwlock_unlock(&srv->access_lock);
	if (!ok)
		log_err_rl("rnbd: session %s refused: host %s may not use that name (%s%s)", name,
			   host, srv->access_file, unread ? ", which could not be read" : "");
	return ok;
}

/* May sess open o (its name normalized)? -EACCES, logged, if not. */
static int access_device(struct rnbd_sess *sess, const struct rnbd_open *o)
{
	struct rnbd_srv *srv = sess->srv;
	bool ok, unread;

	if (!srv->access_file[0])
		return 0;
	pthread_rwlock_rdlock(&srv->access_lock);
	ok = rnbd_access_device(srv->access, sess->host, o->dev_name, o->access_mode);
	unread = !srv->access;
	pthread_rwlock_unlock(&srv->access_lock);
	if (ok)
		return 0;
	log_err_rl("rnbd: %s: host %s may not open %s (%s): not granted by %s%s", sess->name,
		   sess->host, o->dev_name, rnbd_access_mode_name(o->access_mode), srv->access_file,
		   unread ? ", which could not be read" : "");
	return -EACCES;
}

/*
 * Reads the access file into srv: 0, or the error (in err, and logged
 * unless at open, whose caller reports it) and nothing granted.
 */
static int access_load(struct rnbd_srv *srv, bool at_open, char *err, size_t errlen)
{
	struct rnbd_access *a = NULL, *old;
	char why[512];
	int rc = rnbd_access_load(srv->access_file, &a, why, sizeof(why));

	if (err && errlen)
		snprintf(err, errlen, "%s", rc ? why : "");
	if (rc && at_open)
		log_err("rnbd: access file %s", why);
	else if (rc)
		log_err("rnbd: access file %s: nothing new is granted to any host until it is "
			"fixed", why);
	else
		log_info("rnbd: access file %s: %u hosts' lines", srv->access_file,
			 rnbd_access_lines(a));
	pthread_rwlock_wrlock(&srv->access_lock);
	old = srv->access;
	srv->access = a;
	pthread_rwlock_unlock(&srv->access_lock);
	rnbd_access_free(old);
	return rc;
}

/* ---- devices ------------------------------------------------------------------ */

static void sess_put(struct rnbd_sess *sess)
{
	if (atomic_fetch_sub(&sess->refs, 1) == 1) {
		free(sess->devs);
		free(sess->ios);
		pthread_mutex_destroy(&sess->open_lock);
		pthread_mutex_destroy(&sess->lock);
		free(sess);
	}
}

/* A device out of its table and released: gone. */
static void dev_free(struct rnbd_srv *srv, struct sess_dev *sd)
{
	sess_put(sd->sess);
	free(sd);
	pthread_mutex_lock(&srv->rel_lock);
	if (--srv->live == 0)
		pthread_cond_broadcast(&srv->rel_cond);
	pthread_mutex_unlock(&srv->rel_lock);
}

static void *release_thread(void *arg);

/* Under rel_lock: one more release thread; 0 or a negative errno. */
static int release_thread_start_locked(struct rnbd_srv *srv)
{
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&t, &attr, release_thread, srv);
	pthread_attr_destroy(&attr);
	if (!rc)
		srv->rel_nthreads++;
	return rc;
}

/*
 * Queues sd for a release thread (its last reference is gone); starts
 * one when none is idle: the first with the first release, another when
 * all are busy, so that one release blocked in a close that hangs (a FUSE
 * or NFS file) does not hold up the others. A start that fails leaves the
 * release queued for a thread that frees up, the next release's start, or
 * srv_free's.
 */
static void release_queue(struct rnbd_srv *srv, struct sess_dev *sd)
{
	pthread_mutex_lock(&srv->rel_lock);
	STAILQ_INSERT_TAIL(&srv->rel_queue, sd, rel_link);
	if (!srv->rel_idle && !srv->rel_stop) {
		int rc = release_thread_start_locked(srv);

		if (rc)
			log_warn_rl("rnbd: cannot start a release thread: %s%s", strerror(-rc),
				    srv->rel_nthreads ? "" : "; the release waits for the next");
	}
	pthread_cond_broadcast(&srv->rel_cond);
	pthread_mutex_unlock(&srv->rel_lock);
}

/* Drops a reference: an IO's, or the open one (dev_close_start). */
static void dev_put(struct sess_dev *sd)
{
	if (atomic_fetch_sub(&sd->refs, 1) == 1)
		release_queue(sd->sess->srv, sd);
}

/* sd began closing (its open reference is about to go): its writer slot is on its way back. */
static void dev_closing(struct sess_dev *sd)
{
	if (sd->w) {
		sd->w_releasing = true;
		atomic_fetch_add(&sd->w->releasing, 1);
	}
}

/*
 * Starts closing sd: drops its open reference, once. IO in flight keeps it
 * until it completes; then a release thread releases it. Waits for nothing.
 */
static void dev_close_start(struct sess_dev *sd)
{
	if (!atomic_exchange(&sd->closing, true)) {
		dev_closing(sd);
		dev_put(sd);
	}
}

/*
 * What a CLOSE or a session going down does with a device it took out of
 * the table: frees it if it was released already (force-closed before),
 * else starts closing it and leaves the freeing, and op's answer, to the
 * release. Returns whether op (if any) is left to the release.
 */
static bool dev_detached(struct rnbd_srv *srv, struct sess_dev *sd, struct rtrs_srv_op *op)
{
	bool released, put;

	/*
	 * Once detached is set and the lock dropped, a release under way may
	 * free sd: whether to drop the open reference is decided under the
	 * lock, and sd is not touched after it but by that drop.
	 */
	pthread_mutex_lock(&srv->rel_lock);
	sd->detached = true;
	released = sd->released;
	if (!released)
		sd->close_op = op;
	put = !released && !atomic_exchange(&sd->closing, true);
	pthread_mutex_unlock(&srv->rel_lock);
	if (released) {
		dev_free(srv, sd);
		return false;
	}
	if (put) {
		dev_closing(sd);
		dev_put(sd);
	}
	return op != NULL;
}

/* Gives back sd's store and writer slot; on a release thread, or before sd was in a table. */
static void dev_release(struct rnbd_srv *srv, struct sess_dev *sd)
{
	if (sd->own_store)
		rnbd_store_close(sd->store);
	sd->store = NULL;
	pthread_mutex_lock(&srv->lock);
	if (sd->w && sd->w_releasing)
		atomic_fetch_sub(&sd->w->releasing, 1);
	if (sd->w && --sd->w->count == 0) {
		LIST_REMOVE(sd->w, link);
		free(sd->w);
	}
	sd->w = NULL;
	pthread_mutex_unlock(&srv->lock);
}

/*
 * A release thread: releases each queued device (no IO is left on it),
 * then frees it if it is out of its table, answering the CLOSE that took
 * it out, or tells a force-close waiting for it. Runs until rnbd_srv_close
 * stops it with nothing left.
 */
static void *release_thread(void *arg)
{
	struct rnbd_srv *srv = arg;

	pthread_setname_np(pthread_self(), "rnbd-release");
	pthread_mutex_lock(&srv->rel_lock);
	for (;;) {
		struct sess_dev *sd = STAILQ_FIRST(&srv->rel_queue);
		struct rtrs_srv_op *op = NULL;
		bool gone;

		if (!sd) {
			struct timespec dl = deadline_ms(RNBD_RELEASE_IDLE_MS);
			int rc = 0;

			if (srv->rel_stop)
				break;
			srv->rel_idle++;
			while (STAILQ_EMPTY(&srv->rel_queue) && !srv->rel_stop && rc != ETIMEDOUT)
				rc = pthread_cond_timedwait(&srv->rel_cond, &srv->rel_lock, &dl);
			srv->rel_idle--;
			if (rc == ETIMEDOUT && STAILQ_EMPTY(&srv->rel_queue))
				break; /* idle: a release that comes starts another */
			continue;
		}
		STAILQ_REMOVE_HEAD(&srv->rel_queue, rel_link);
		pthread_mutex_unlock(&srv->rel_lock);
		dev_release(srv, sd);
		sess_dev_log(sd->sess, "rnbd: %s: %s (device %u) released", sd->sess->name, sd->name,
			     sd->id);
		pthread_mutex_lock(&srv->rel_lock);
		sd->released = true;
		if (sd->waiter) {
			sd->waiter->done = true;
			sd->waiter = NULL;
		}
		gone = sd->detached;
		op = sd->close_op;
		pthread_cond_broadcast(&srv->rel_cond);
		pthread_mutex_unlock(&srv->rel_lock);
		if (gone)
			dev_free(srv, sd);
		if (op)
			rtrs_srv_resp_rdma(op, 0);
		pthread_mutex_lock(&srv->rel_lock);
	}
	/* The last touch of srv: srv_free waits for rel_nthreads 0 under the lock. */
	srv->rel_nthreads--;
	pthread_cond_broadcast(&srv->rel_cond);
	pthread_mutex_unlock(&srv->rel_lock);
	return NULL;
}

/* Takes a writer slot for (dev, ino) under the sharing rule. srv->lock held. */
static int writers_take(struct rnbd_srv *srv, dev_t dev, ino_t ino,
			enum rnbd_access_mode mode, struct writers **out)
{
	struct writers *w;
	int rc;

	LIST_FOREACH(w, &srv->writers, link)
		if (w->dev == dev && w->ino == ino)
			break;
	rc = rnbd_access_admit(mode, w ? w->count : 0);
	/* Refused only for writers that are closing: -EBUSY, the caller waits for them. */
	if (rc == -EPERM && w && atomic_load(&w->releasing) &&
	    !rnbd_access_admit(mode, w->count - atomic_load(&w->releasing)))
		return -EBUSY;
	if (rc || mode == RNBD_ACCESS_RO)
		return rc;
	if (!w) {
		w = calloc(1, sizeof(*w));
		if (!w)
			return -ENOMEM;
		w->dev = dev;
		w->ino = ino;
		LIST_INSERT_HEAD(&srv->writers, w, link);
	}
	w->count++;
	*out = w;
	return 0;
}

static struct mem_dev *mem_find(struct rnbd_srv *srv, const char *name)
{
	for (unsigned i = 0; i < srv->nmem; i++)
		if (!strcmp(srv->mem[i].name, name))
			return &srv->mem[i];
	return NULL;
}

/*
 * O_DIRECT on an opened file or block device where the server's options
 * want it: a block device unless buffered_bdev, a file with direct. Closes
 * fd on failure.
 */
static int dev_set_direct(struct rnbd_srv *srv, int fd, bool *direct, const char **why)
{
	struct stat st;
	int fl;

	if (fstat(fd, &st)) {
		*why = "cannot stat it";
		goto fail;
	}
	*direct = S_ISBLK(st.st_mode) ? !srv->o.buffered_bdev : srv->o.direct;
	if (!*direct)
		return 0;
	fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_DIRECT)) {
		*why = "cannot open it with O_DIRECT";
		goto fail;
	}
	return 0;
fail:
	fl = -errno;
	close(fd);
	return fl;
}

/* Opens the backing store of a new device of sess. */
static int dev_open_store(struct rnbd_sess *sess, struct sess_dev *sd, const char **why)
{
	struct rnbd_srv *srv = sess->srv;
	struct mem_dev *m = mem_find(srv, sd->name);
	char root[4096];
	bool direct;
	dev_t dev;
	ino_t ino;
	int fd, rc;

	if (m) {
		sd->store = m->store;
		dev = 0;
		ino = (ino_t)(m - srv->mem) + 1;
	} else if (!srv->search[0]) {
		*why = "no file devices are exported here (the server has no search path)";
		return -ENOENT;
	} else {
		rc = rnbd_search_root(srv->search, sess->name, root, sizeof(root), why);
		if (rc)
			return rc;
		rc = rnbd_dev_open(root, sd->name,
				   sd->mode == RNBD_ACCESS_RO ? O_RDONLY : O_RDWR, &fd, why);
		if (rc)
			return rc;
		rc = dev_set_direct(srv, fd, &direct, why);
		if (rc)
			return rc;
		rc = rnbd_store_fd(srv->engine, fd, direct, &sd->store);
		if (rc) {
			*why = "not a file or block device";
			return rc;
		}
		rnbd_store_set_name(sd->store, sd->name);
		/* OPEN_RSP has 16 bits for it (as the kernel's): 32768 at most. */
		if (rnbd_store_info(sd->store)->logical_block_size > RNBD_MAX_BLOCK_SIZE) {
			rnbd_store_close(sd->store);
			sd->store = NULL;
			*why = "its logical block size is beyond the protocol's 32768 bytes";
			return -EOPNOTSUPP;
		}
		sd->own_store = true;
		dev = rnbd_store_info(sd->store)->dev;
		ino = rnbd_store_info(sd->store)->ino;
	}
	pthread_mutex_lock(&srv->lock);
	rc = writers_take(srv, dev, ino, sd->mode, &sd->w);
	pthread_mutex_unlock(&srv->lock);
	/*
	 * The writers in the way are closing (a CLOSE, a force-close or their
	 * session gone, with IO still in flight: say a client whose session
	 * came back opens its device again while the old one drains). Their
	 * slots come back at their release: a client of this project is told
	 * -EBUSY and tries again a while (this thread, a poll group's, does
	 * not wait); a kernel client gets the rule's -EPERM, as from the
	 * kernel's server.
	 */
	if (rc == -EBUSY && sd->sess->kernel_clt)
		rc = -EPERM;
	if (rc) {
		*why = rc == -EPERM ? "access mode refused by the sharing rule" :
		       rc == -EBUSY ? "its writer is still closing (IO in flight); try again" :
				      "no memory";
		if (sd->own_store)
			rnbd_store_close(sd->store);
		sd->store = NULL;
	}
	return rc;
}

static void open_rsp_fill(struct rnbd_msg_open_rsp *m, const struct sess_dev *sd)
{
	const struct rnbd_store_info *in = rnbd_store_info(sd->store);
	uint32_t lbs = in->logical_block_size;
	bool zeroes = in->write_zeroes && !sd->sess->kernel_clt;
	struct rnbd_open_rsp r = {
		.device_id = sd->id,
		.nsectors = in->size >> RNBD_SECTOR_SHIFT,
		.max_hw_sectors = UINT32_MAX >> RNBD_SECTOR_SHIFT,
		.max_write_zeroes_sectors = zeroes ? UINT32_MAX >> RNBD_SECTOR_SHIFT : 0,
		.max_discard_sectors = in->discard ? UINT32_MAX >> RNBD_SECTOR_SHIFT : 0,
		.discard_granularity = in->discard ? MAX(lbs, 4096u) : 0,
		/* A hint: one beyond 16 bits goes as the largest power of two that fits. */
		.physical_block_size = (uint16_t)MIN(in->physical_block_size, RNBD_MAX_BLOCK_SIZE),
		.logical_block_size = (uint16_t)lbs,
		/*
		 * No segment limit here (a request lands in one chunk): the
		 * value the kernel's server sends for an ordinary device
		 * (BLK_MAX_SEGMENTS). A 6.1 kernel client takes its RTRS
		 * client's instead; 1 would split a later one's IO per page.
		 */
		.max_segments = 128,
		.secure_discard = in->secure_erase,
		.cache_policy = (in->write_cache ? RNBD_WRITEBACK : 0) | (in->fua ? RNBD_FUA : 0),
	};

	r.max_hw_sectors -= r.max_hw_sectors % (lbs >> RNBD_SECTOR_SHIFT);
	rnbd_open_rsp_encode(m, &r);
}

/* ---- requests ------------------------------------------------------------------ */

static int do_sess_info(struct rnbd_sess *sess, enum rtrs_dir dir, void *data, size_t datalen,
			const void *usr, size_t usrlen)
{
	const char *why = NULL;
	unsigned peer;
	int rc;

	if (dir != RTRS_READ || datalen < sizeof(struct rnbd_msg_sess_info)) {
		log_err_rl("rnbd: %s: SESS_INFO without room for its response", sess->name);
		return -EINVAL;
	}
	rc = rnbd_sess_info_decode(usr, usrlen, false, &peer, &why);
	if (rc) {
		log_err_rl("rnbd: %s: bad SESS_INFO: %s", sess->name, why);
		return rc;
	}
	atomic_store(&sess->ver, rnbd_version_negotiate(peer));
	memset(data, 0, datalen);
	rnbd_sess_info_encode(data, true, atomic_load(&sess->ver));
	return 0;
}

static int open_locked(struct rnbd_sess *sess, const struct rnbd_open *req, void *data)
{
	struct rnbd_open o = *req; /* its name normalized */
	struct sess_dev *sd, **grown;
	const char *why = NULL;
	uint32_t id;
	int rc;

	unsigned open = 0, max = sess->srv->o.max_devs_per_session ?
				 sess->srv->o.max_devs_per_session : RNBD_DEFAULT_MAX_DEVS_PER_SESSION;

	pthread_mutex_lock(&sess->lock);
	/* The same name again (a remap): the device it has, in a mode that covers the new one. */
	for (id = 0; id < sess->ndevs; id++) {
		sd = sess->devs[id];
		open += sd != NULL;
		if (sd && !sd->forced && !strcmp(sd->name, o.dev_name)) {
			enum rnbd_access_mode had = sd->mode;

			if (had == RNBD_ACCESS_RO && o.access_mode != RNBD_ACCESS_RO) {
				pthread_mutex_unlock(&sess->lock);
				log_err_rl("rnbd: %s: cannot open %s (%s): the session has it open "
					   "read-only (close it first)", sess->name, o.dev_name,
					   rnbd_access_mode_name(o.access_mode));
				return -EBUSY;
			}
			open_rsp_fill(data, sd);
			pthread_mutex_unlock(&sess->lock);
			return 0;
		}
	}
	pthread_mutex_unlock(&sess->lock);
	if (open >= max) {
		log_err_rl("rnbd: %s: cannot open %s: the session has %u devices open, its most "
			   "(max_devs_per_session)", sess->name, o.dev_name, open);
		return -EMFILE;
	}

	sd = calloc(1, sizeof(*sd));
	if (!sd)
		return -ENOMEM;
	sd->sess = sess;
	sd->mode = o.access_mode;
	memcpy(sd->name, o.dev_name, sizeof(sd->name));
	atomic_init(&sd->refs, 1); /* open */
	rc = dev_open_store(sess, sd, &why);
	if (rc) {
		log_err_rl("rnbd: %s: cannot open %s (%s): %s: %s", sess->name, o.dev_name,
			   rnbd_access_mode_name(o.access_mode), why, strerror(-rc));
		free(sd);
		return rc;
	}
	pthread_mutex_lock(&sess->lock);
	for (id = 0; id < sess->ndevs && sess->devs[id]; id++)
		;
	if (id == sess->ndevs) {
		grown = realloc(sess->devs, (sess->ndevs + 8) * sizeof(*grown));
		if (!grown) {
			pthread_mutex_unlock(&sess->lock);
			dev_release(sess->srv, sd);
			free(sd);
			return -ENOMEM;
		}
		memset(grown + sess->ndevs, 0, 8 * sizeof(*grown));
		sess->devs = grown;
		sess->ndevs += 8;
	}
	sd->id = id;
	atomic_fetch_add(&sess->refs, 1);
	pthread_mutex_lock(&sess->srv->rel_lock);
	sess->srv->live++;
	pthread_mutex_unlock(&sess->srv->rel_lock);
	sess->devs[id] = sd;
	/* Under sess->lock: a limit set meanwhile finds it in the table, or is found here. */
	atomic_store(&sd->qos, rnbd_qos_find(sess->srv->qos, RNBD_QOS_DEVICE, sd->name));
	open_rsp_fill(data, sd);
	/*
	 * What the log says is taken under the lock: once it is let go, a
	 * close from the client or the server may release sd's store.
	 */
	struct rnbd_store_info in = *rnbd_store_info(sd->store);
	char name[sizeof(sd->name)];
	enum rnbd_access_mode mode = sd->mode;

	memcpy(name, sd->name, sizeof(name));
	pthread_mutex_unlock(&sess->lock);
	sess_dev_log(sess, "rnbd: %s: opened %s (%s) as device %u, %llu bytes%s%s, %s, %s", sess->name,
		 name, rnbd_access_mode_name(mode), id, (unsigned long long)in.size,
		 in.block_device ? ", block device" : "", in.direct ? ", O_DIRECT" : "",
		 in.write_cache ? "write cache" : "no write cache", in.fua ? "FUA" : "no FUA");
	return 0;
}

static int do_open(struct rnbd_sess *sess, enum rtrs_dir dir, void *data, size_t datalen,
		   const void *usr, size_t usrlen)
{
	struct rnbd_open o;
	const char *why = NULL;
	int rc;

	if (dir != RTRS_READ || datalen < sizeof(struct rnbd_msg_open_rsp)) {
		log_err_rl("rnbd: %s: OPEN without room for its response", sess->name);
		return -EINVAL;
	}
	rc = rnbd_open_decode(usr, usrlen, &o, &why);
	if (rc) {
		log_err_rl("rnbd: %s: OPEN refused: %s", sess->name, why);
		return rc;
	}
	memset(data, 0, datalen);
	rnbd_dev_name_normalize(o.dev_name);
	rc = access_device(sess, &o);
	if (rc)
		return rc;
	/*
	 * The session's OPENs one at a time (two of one name are one device);
	 * other sessions' OPENs, CLOSEs and IO do not wait for this one, whose
	 * open(2) may block on a backing file system.
	 */
	pthread_mutex_lock(&sess->open_lock);
	rc = open_locked(sess, &o, data);
	pthread_mutex_unlock(&sess->open_lock);
	return rc;
}

/* Takes device id of sess out of its table. */
static struct sess_dev *dev_detach(struct rnbd_sess *sess, uint32_t id)
{
	struct sess_dev *sd = NULL;

	pthread_mutex_lock(&sess->lock);
	if (id < sess->ndevs) {
		sd = sess->devs[id];
		sess->devs[id] = NULL;
	}
	pthread_mutex_unlock(&sess->lock);
	return sd;
}

/*
 * CLOSE: the device leaves the table at once (its id may be given out
 * again); the answer goes when it is released, after its IO in flight (1:
 * answered later, by the release thread).
 */
static int do_close(struct rnbd_sess *sess, struct rtrs_srv_op *op, const void *usr,
		    size_t usrlen)
{
	const char *why = NULL;
	struct sess_dev *sd;
	uint32_t id;
	int rc = rnbd_close_decode(usr, usrlen, &id, &why);

	if (rc) {
		log_err_rl("rnbd: %s: bad CLOSE: %s", sess->name, why);
		return rc;
	}
	sd = dev_detach(sess, id);
	if (!sd)
		return -ENOENT;
	sess_dev_log(sess, "rnbd: %s: closing %s (device %u)", sess->name, sd->name, id);
	return dev_detached(sess->srv, sd, op) ? 1 : 0;
}

static void io_done(struct rnbd_breq *r, int err)
{
	struct srv_io *io = (struct srv_io *)r;
	struct sess_dev *sd = io->sd;
	struct rtrs_srv_op *op = io->op;

	if (err) {
		atomic_fetch_add_explicit(&sd->errors, 1, memory_order_relaxed);
		log_err_rl("rnbd: %s: %s %s at %llu+%u failed: %s", sd->sess->name, sd->name,
			   rnbd_op_name(r->op), (unsigned long long)io->offset, io->len,
			   strerror(-err));
	} else if (r->op == RNBD_OP_READ) {
		atomic_fetch_add_explicit(&sd->reads, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&sd->read_bytes, io->len, memory_order_relaxed);
	} else if (r->op == RNBD_OP_WRITE) {
		atomic_fetch_add_explicit(&sd->writes, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&sd->write_bytes, io->len, memory_order_relaxed);
	} else {
		atomic_fetch_add_explicit(&sd->other, 1, memory_order_relaxed);
	}
	/* The slot is the next request's from here on. */
	rtrs_srv_resp_rdma(op, err);
	dev_put(sd);
}

/* ---- rate limits (rnbd-qos.h) -------------------------------------------------- */

/*
 * May io go now? false: the rate limits hold it, qos_dispatch submits it
 * later (or answers it, its device force-closed or its session gone).
 */
static bool qos_admit(struct rnbd_sess *sess, struct sess_dev *sd, struct srv_io *io)
{
	struct rnbd_qos *gs = atomic_load_explicit(&sess->qos, memory_order_relaxed);
	struct rnbd_qos *gh = atomic_load_explicit(&sess->host_qos, memory_order_relaxed);
	struct rnbd_qos *gd = atomic_load_explicit(&sd->qos, memory_order_relaxed);
	bool moves = io->r.op == RNBD_OP_READ || io->r.op == RNBD_OP_WRITE;
	bool go, forced;

	if (!rnbd_qos_active(gs) && !rnbd_qos_active(gh) && !rnbd_qos_active(gd))
		return true;
	io->q = (struct rnbd_qos_item){
		.g = { gs, gh, gd }, .read = io->r.op == RNBD_OP_READ,
		.bytes = moves ? io->r.len : 0, .owner = sess, .dev = sd,
	};
	/* Once queued, io and its reference are the limits' thread's: this one keeps sd. */
	atomic_fetch_add(&sd->refs, 1);
	go = rnbd_qos_admit(sess->srv->qos, &io->q);
	if (!go) {
		/*
		 * A force-close between do_io's look at `forced` and the queueing
		 * dropped the device's held IO without this one: dropped here.
		 */
		pthread_mutex_lock(&sess->lock);
		forced = sd->forced;
		pthread_mutex_unlock(&sess->lock);
		if (forced)
			rnbd_qos_drop(sess->srv->qos, sess, sd);
	}
	dev_put(sd);
	return go;
}

/*
 * The qos thread: io's tokens are there (err 0), or its session went or
 * its device was force-closed (-ENOTCONN).
 */
static void qos_dispatch(struct rnbd_qos_item *it, int err)
{
	struct srv_io *io = container_of(it, struct srv_io, q);
	struct sess_dev *sd = io->sd;

	if (!err) {
		rnbd_store_submit(sd->store, &io->r);
		return;
	}
	rtrs_srv_resp_rdma(io->op, err);
	dev_put(sd);
}

/* Points the sessions and open devices of g's name at g. */
static void qos_attach(struct rnbd_srv *srv, enum rnbd_qos_kind kind, const char *name,
		       struct rnbd_qos *g)
{
	struct rnbd_sess *sess;

	pthread_mutex_lock(&srv->lock);
	LIST_FOREACH(sess, &srv->sessions, link) {
		if (kind == RNBD_QOS_SESSION) {
			if (!strcmp(sess->name, name))
				atomic_store(&sess->qos, g);
			continue;
		}
		if (kind == RNBD_QOS_HOST) {
			if (!strcmp(sess->host, name))
				atomic_store(&sess->host_qos, g);
			continue;
		}
		pthread_mutex_lock(&sess->lock);
		for (uint32_t id = 0; id < sess->ndevs; id++)
			if (sess->devs[id] && !strcmp(sess->devs[id]->name, name))
				atomic_store(&sess->devs[id]->qos, g);
		pthread_mutex_unlock(&sess->lock);
	}
	pthread_mutex_unlock(&srv->lock);
}

static const char *qos_kind_name(enum rnbd_qos_kind kind)
{
	return kind == RNBD_QOS_SESSION ? "session" : kind == RNBD_QOS_HOST ? "host" : "device";
}

/* A name as the server keeps it: a device's normalized. -EINVAL if empty or too long. */
static int qos_name(enum rnbd_qos_kind kind, const char *name, char *out, size_t len)
{
	if (!name || !name[0] || strlen(name) >= len || strlen(name) > 255)
		return -EINVAL;
	snprintf(out, len, "%s", name);
	if (kind == RNBD_QOS_DEVICE)
		rnbd_dev_name_normalize(out);
	return out[0] ? 0 : -EINVAL;
}

RNBD_EXPORT
int rnbd_srv_qos_set(struct rnbd_srv *srv, enum rnbd_qos_kind kind, const char *name,
		     const struct rnbd_qos_limits *l)
{
	char n[RNBD_DEV_NAME_MAX > RNBD_SESSNAME_MAX ? RNBD_DEV_NAME_MAX : RNBD_SESSNAME_MAX];
	struct rnbd_qos *g;
	int rc;

	if (!srv || !l || l->size < sizeof(*l))
		return -EINVAL;
	/* Sessions have a host only where they authenticate (the access file comes with it). */
	if (kind == RNBD_QOS_HOST && !srv->access_file[0])
		return -EOPNOTSUPP;
	rc = qos_name(kind, name, n, sizeof(n));
	if (!rc)
		rc = rnbd_qos_set(srv->qos, kind, n, l, &g);
	if (rc)
		return rc;
	qos_attach(srv, kind, n, g);
	log_info("rnbd: rate limits of %s %s: iops %llu (read %llu, write %llu), bytes/s %llu "
		 "(read %llu, write %llu)", qos_kind_name(kind), n,
		 (unsigned long long)l->iops, (unsigned long long)l->read_iops,
		 (unsigned long long)l->write_iops, (unsigned long long)l->bps,
		 (unsigned long long)l->read_bps, (unsigned long long)l->write_bps);
	return 0;
}

RNBD_EXPORT
int rnbd_srv_qos_get(struct rnbd_srv *srv, enum rnbd_qos_kind kind, const char *name,
		     struct rnbd_qos_limits *l, struct rnbd_qos_stats *st)
{
	char n[RNBD_DEV_NAME_MAX > RNBD_SESSNAME_MAX ? RNBD_DEV_NAME_MAX : RNBD_SESSNAME_MAX];
	struct rnbd_qos *g;

	if (!srv || !l || l->size < sizeof(*l) || (st && st->size < sizeof(*st)) ||
	    qos_name(kind, name, n, sizeof(n)))
		return -EINVAL;
	g = rnbd_qos_find(srv->qos, kind, n);
	if (!g)
		return -ENOENT;
	rnbd_qos_get(srv->qos, g, l, st);
	return 0;
}

static int do_io(struct rnbd_sess *sess, struct rtrs_srv_op *op, enum rtrs_dir dir,
		 void *data, size_t datalen, const void *usr, size_t usrlen)
{
	struct rnbd_io m;
	struct sess_dev *sd = NULL;
	struct srv_io *io;
	const char *why = NULL;
	unsigned slot = rtrs_srv_op_id(op);
	int rc = rnbd_io_decode(usr, usrlen, atomic_load(&sess->ver), datalen, &m, &why);

	if (rc) {
		log_err_rl("rnbd: %s: bad IO: %s", sess->name, why);
		return rc;
	}
	if (slot >= sess->nios) {
		/* librtrs gives ids below the session's queue depth: a bug, not the peer. */
		log_err_rl("rnbd: %s: request slot %u beyond the session's %u", sess->name, slot,
			   sess->nios);
		return -EPROTO;
	}
	/*
	 * A flush comes either way: the kernel's client sends its block
	 * layer's flush requests as RTRS reads (rq_data_dir), ours as writes.
	 */
	if (m.op != RNBD_OP_FLUSH && (m.op == RNBD_OP_READ) != (dir == RTRS_READ)) {
		log_err_rl("rnbd: %s: %s sent as an RTRS %s", sess->name, rnbd_op_name(m.op),
			   dir == RTRS_READ ? "read" : "write");
		return -EINVAL;
	}
	if (m.op == RNBD_OP_WRITE_ZEROES && sess->kernel_clt) {
		/* Not offered: what a kernel sends as operation 5 depends on its version. */
		log_err_rl("rnbd: %s: operation 5 from a kernel client refused (WRITE_SAME before "
			   "Linux 5.18, write zeroes later; not offered to it)", sess->name);
		return -EOPNOTSUPP;
	}
	pthread_mutex_lock(&sess->lock);
	if (m.device_id < sess->ndevs)
		sd = sess->devs[m.device_id];
	if (sd && !sd->forced)
		atomic_fetch_add(&sd->refs, 1); /* the open reference is there: not closing */
	else
		rc = -ENOTCONN;
	pthread_mutex_unlock(&sess->lock);
	if (rc)
		return rc;
	if (sd->mode == RNBD_ACCESS_RO && m.op != RNBD_OP_READ && m.op != RNBD_OP_FLUSH) {
		dev_put(sd);
		return -EROFS;
	}
	io = &sess->ios[slot];
	io->op = op;
	io->sd = sd;
	io->offset = m.sector << RNBD_SECTOR_SHIFT;
	io->len = m.bi_size;
	io->r = (struct rnbd_breq){
		.op = m.op, .flags = m.flags, .offset = m.sector << RNBD_SECTOR_SHIFT,
		.len = m.bi_size, .buf = data, .done = io_done,
	};
	/* A flush is never held: an empty write (PREFLUSH or FUA) is one too. */
	if (m.op != RNBD_OP_FLUSH && !(m.op == RNBD_OP_WRITE && !m.bi_size) &&
	    !qos_admit(sess, sd, io))
		return 0; /* qos_dispatch submits it once its tokens are there */
	rnbd_store_submit(sd->store, &io->r);
	return 0;
}

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *op, enum rtrs_dir dir, void *data,
		       size_t datalen, const void *usr, size_t usrlen)
{
	struct rnbd_sess *sess = rtrs_srv_get_sess_priv(rtrs_srv_op_sess(op));
	const char *why = NULL;
	int type = rnbd_msg_type(usr, usrlen, &why), rc;

	if (!sess)
		return -ENOTCONN;
	if (type < 0) {
		log_err_rl("rnbd: %s: %s", sess->name, why);
		return type;
	}
	if (type != RNBD_MSG_SESS_INFO && !atomic_load(&sess->ver)) {
		log_err_rl("rnbd: %s: request before SESS_INFO", sess->name);
		return -EPROTO;
	}
	switch (type) {
	case RNBD_MSG_SESS_INFO:
		rc = do_sess_info(sess, dir, data, datalen, usr, usrlen);
		break;
	case RNBD_MSG_OPEN:
		rc = do_open(sess, dir, data, datalen, usr, usrlen);
		break;
	case RNBD_MSG_CLOSE:
		rc = do_close(sess, op, usr, usrlen);
		if (rc > 0)
			return 0; /* answered when the device is released */
		break;
	case RNBD_MSG_IO:
		/* Answered by io_done when the store completes it. */
		return do_io(sess, op, dir, data, datalen, usr, usrlen);
	default:
		log_err_rl("rnbd: %s: a response type sent as a request", sess->name);
		return -EINVAL;
	}
	/*
	 * Done here: answered now, or an error the library answers. Never the
	 * answer's own result: a failed answer has ended the request already.
	 */
	if (!rc)
		rtrs_srv_resp_rdma(op, 0);
	return rc;
}

/* ---- sessions ------------------------------------------------------------------ */

/*
 * The session's last path went (service loop): every device leaves its
 * table and closes, without waiting for IO in flight (the loop runs every
 * session's heartbeats); the session's memory goes with its last device.
 */
static void sess_destroy(struct rnbd_sess *sess)
{
	for (uint32_t id = 0; id < sess->ndevs; id++) {
		struct sess_dev *sd = dev_detach(sess, id);

		if (sd)
			dev_detached(sess->srv, sd, NULL);
	}
	sess_put(sess);
}

static int srv_link_ev(struct rtrs_srv_sess *rs, enum rtrs_srv_link_ev ev, void *priv)
{
	struct rnbd_srv *srv = priv;
	struct rnbd_sess *sess;

	if (ev == RTRS_SRV_LINK_EV_CONNECTED) {
		/* librtrs keeps it in 1..65535 */
		uint32_t qd = (uint32_t)rtrs_srv_get_queue_depth(rs);
		char name[RNBD_SESSNAME_MAX];

		rtrs_srv_get_sess_name(rs, name, sizeof(name));
		sess = calloc(1, sizeof(*sess));
		if (sess)
			sess->ios = calloc(qd, sizeof(*sess->ios));
		if (!sess || !sess->ios) {
			log_err("rnbd: session %s refused: no memory for it and its %u request slots",
				name, qd);
			free(sess);
			return -ENOMEM;
		}
		sess->nios = qd;
		sess->srv = srv;
		sess->kernel_clt = rtrs_srv_sess_peer_ext(rs) == 0;
		atomic_init(&sess->refs, 1); /* the link */
		pthread_mutex_init(&sess->open_lock, NULL);
		pthread_mutex_init(&sess->lock, NULL);
		memcpy(sess->name, name, sizeof(sess->name));
		rtrs_srv_get_sess_host(rs, sess->host, sizeof(sess->host));
		if (srv->access_file[0] && !access_session(srv, sess->host, name)) {
			free(sess->ios);
			free(sess);
			return -EACCES;
		}
		pthread_mutex_lock(&srv->lock);
		/* Under srv->lock: a limit set meanwhile finds it listed, or is found here. */
		atomic_store(&sess->qos, rnbd_qos_find(srv->qos, RNBD_QOS_SESSION, name));
		if (sess->host[0])
			atomic_store(&sess->host_qos,
				     rnbd_qos_find(srv->qos, RNBD_QOS_HOST, sess->host));
		LIST_INSERT_HEAD(&srv->sessions, sess, link);
		pthread_mutex_unlock(&srv->lock);
		rtrs_srv_set_sess_priv(rs, sess);
		log_info("rnbd: session %s up%s", sess->name,
			 sess->kernel_clt ? " (a kernel client: no write zeroes offered)" : "");
		return 0;
	}
	sess = rtrs_srv_get_sess_priv(rs);
	if (!sess)
		return 0;
	rtrs_srv_set_sess_priv(rs, NULL);
	pthread_mutex_lock(&srv->lock);
	LIST_REMOVE(sess, link); /* linked when its priv was set */
	pthread_mutex_unlock(&srv->lock);
	log_info("rnbd: session %s down, closing its devices", sess->name);
	rnbd_qos_drop(srv->qos, sess, NULL); /* its IO held by rate limits: answered, not done */
	sess_destroy(sess);
	return 0;
}

/* ---- logging ------------------------------------------------------------------- */

/* One log state in the process, librtrs.so's (lib/common is linked once, there). */
RNBD_EXPORT
void rnbd_set_log_level(int level)
{
	rtrs_set_log_level(level);
}

RNBD_EXPORT
void rnbd_set_log_fn(void (*fn)(void *priv, int level, const char *line), void *priv)
{
	rtrs_set_log_fn(fn, priv);
}

/* ---- the server ----------------------------------------------------------------- */

RNBD_EXPORT
int rnbd_srv_opts_init(struct rnbd_srv_opts *o, size_t size)
{
	int rc;

	if (!o || size < sizeof(*o))
		return -EINVAL;
	memset(o, 0, size);
	rc = rtrs_srv_opts_init(&o->rtrs, sizeof(o->rtrs));
	if (rc)
		return rc;
	o->size = size;
	o->rtrs.port = RNBD_DEFAULT_PORT_NR;
	o->engine = "auto";
	o->engine_threads = 4;
	o->inline_writes = 1;
	o->max_devs_per_session = RNBD_DEFAULT_MAX_DEVS_PER_SESSION;
	return 0;
}

/* "name:size[,name:size...]" -> memory stores. */
/*
 * What memory devices may hold in all: the machine's RAM and swap. Their
 * memory is anonymous and mapped without a reservation, taken as it is
 * written; more than this can never be written whole (the OOM killer
 * ends the server first), so it is refused at start.
 */
static uint64_t mem_devices_room(uint64_t *ram, uint64_t *swap)
{
	struct sysinfo si;

	if (sysinfo(&si))
		return UINT64_MAX; /* not known: nothing refused */
	*ram = (uint64_t)si.totalram * si.mem_unit;
	*swap = (uint64_t)si.totalswap * si.mem_unit;
	return *ram + *swap;
}

/* buf: the list, NAME:SIZE[,NAME:SIZE...], cut up here. */
static int mem_devices_parse_in(struct rnbd_srv *srv, char *buf)
{
	char *save = NULL, *item;
	uint64_t total = 0, ram = 0, swap = 0, room = mem_devices_room(&ram, &swap);
	int rc;

	for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *colon = strrchr(item, ':');
		struct mem_dev *m;
		uint64_t size;
		const char *why = NULL;

		if (!colon) {
			log_err("rnbd: memory device \"%s\": expected name:size", item);
			return -EINVAL;
		}
		*colon = '\0';
		if (!rnbd_dev_name_valid(item, &why)) {
			log_err("rnbd: memory device \"%s\": %s", item, why);
			return -EINVAL;
		}
		rc = parse_size(colon + 1, 4096, UINT64_MAX >> 1, &size);
		if (rc == -ERANGE && parse_size(colon + 1, 0, UINT64_MAX, &size) == 0 && size < 4096) {
			log_err("rnbd: memory device %s: size %s is less than 4 KiB", item, colon + 1);
			return -EINVAL;
		}
		if (rc) {
			log_err("rnbd: memory device %s: size \"%s\": %s", item, colon + 1,
				rc == -ERANGE ? "too large" :
				"expected a number of bytes, with K, M, G or T (KiB, MiB, GiB, TiB)");
			return -EINVAL;
		}
		if (size % 4096) {
			log_err("rnbd: memory device %s: size %s is not a multiple of 4 KiB", item,
				colon + 1);
			return -EINVAL;
		}
		total += size;
		if (total > room) {
			log_err("rnbd: memory device %s: %s%s is more than this machine's memory "
				"(%" PRIu64 " MiB RAM + %" PRIu64 " MiB swap): memory devices are "
				"allocated as they are written, and could never be written whole",
				item, colon + 1, srv->nmem ? " with the memory devices before it" : "",
				ram >> 20, swap >> 20);
			return -EINVAL;
		}
		rnbd_dev_name_normalize(item);
		if (srv->nmem == MEM_DEVS_MAX || mem_find(srv, item)) {
			log_err("rnbd: memory device %s: %s", item,
				srv->nmem == MEM_DEVS_MAX ? "too many" : "named twice");
			return -EINVAL;
		}
		m = &srv->mem[srv->nmem];
		snprintf(m->name, sizeof(m->name), "%s", item);
		rc = rnbd_store_memory(size, &m->store);
		if (rc) {
			/* With vm.overcommit_memory 2 the mapping is charged whole, at once. */
			log_err("rnbd: memory device %s: cannot map %s: %s", item, colon + 1,
				strerror(-rc));
			return rc;
		}
		srv->nmem++;
	}
	return 0;
}

/* spec: as the option gives it (rnbd_srv_opts.mem_devices), any length. */
static int mem_devices_parse(struct rnbd_srv *srv, const char *spec)
{
	char *buf = strdup(spec);
	int rc;

	if (!buf) {
		log_err("rnbd: memory devices: out of memory");
		return -ENOMEM;
	}
	rc = mem_devices_parse_in(srv, buf);
	free(buf);
	return rc;
}

/*
 * Every session is gone (rtrs_srv_close answered every request first), so
 * every device is on its way to being freed: waits for that, then stops
 * the release threads.
 */
static void srv_free(struct rnbd_srv *srv)
{
	pthread_mutex_lock(&srv->rel_lock);
	while (srv->live) {
		/* Releases queued while no thread could start: start one now. */
		if (!srv->rel_nthreads && !STAILQ_EMPTY(&srv->rel_queue) &&
		    release_thread_start_locked(srv)) {
			struct timespec t = deadline_ms(100);

			pthread_cond_timedwait(&srv->rel_cond, &srv->rel_lock, &t);
			continue;
		}
		pthread_cond_wait(&srv->rel_cond, &srv->rel_lock);
	}
	srv->rel_stop = true;
	pthread_cond_broadcast(&srv->rel_cond);
	while (srv->rel_nthreads)
		pthread_cond_wait(&srv->rel_cond, &srv->rel_lock);
	pthread_mutex_unlock(&srv->rel_lock);
	for (unsigned i = 0; i < srv->nmem; i++)
		rnbd_store_close(srv->mem[i].store);
	rnbd_qos_ctx_close(srv->qos);
	rnbd_engine_close(srv->engine);
	rnbd_access_free(srv->access);
	pthread_rwlock_destroy(&srv->access_lock);
	pthread_mutex_destroy(&srv->lock);
	pthread_mutex_destroy(&srv->rel_lock);
	pthread_cond_destroy(&srv->rel_cond);
	free(srv);
}

/*
 * The search path's fixed part, up to the component that holds
 * %SESSNAME%, must be a directory at start: a mistyped path would
 * otherwise serve nothing, each client told ENOENT.
 */
RNBD_EXPORT
int rnbd_search_path_check(const char *search, char *why, size_t len)
{
	const char *tok;
	size_t n;
	char dir[sizeof(((struct rnbd_srv *)0)->search)], none[1];
	struct stat st;

	if (!why || !len) {
		why = none;
		len = sizeof(none);
	}
	if (!search || search[0] != '/') {
		snprintf(why, len, "not an absolute path");
		return -EINVAL;
	}
	n = strlen(search);
	if (n >= sizeof(dir)) {
		snprintf(why, len, "longer than %zu bytes", sizeof(dir) - 1);
		return -ENAMETOOLONG;
	}
	tok = strstr(search, RNBD_SESSNAME_TOKEN);
	if (tok) {
		n = (size_t)(tok - search);
		while (n > 1 && search[n - 1] != '/')
			n--;
		n -= n > 1; /* "/srv", not "/srv/" */
	}
	snprintf(dir, sizeof(dir), "%.*s", (int)n, search);
	const char *cause = stat(dir, &st) ? strerror(errno) :
			    !S_ISDIR(st.st_mode) ? "not a directory" : NULL;

	if (cause) {
		snprintf(why, len, "%s%s", tok ? dir : "", tok ? ": " : "");
		snprintf(why + strlen(why), len - strlen(why), "%s", cause);
		return -EINVAL;
	}
	return 0;
}

RNBD_EXPORT
int rnbd_srv_open(const struct rnbd_srv_opts *o, struct rnbd_srv **out)
{
	static const struct { const char *name; enum rnbd_engine_kind kind; } engines[] = {
		{ "auto", RNBD_ENGINE_AUTO }, { "io_uring", RNBD_ENGINE_URING },
		{ "threads", RNBD_ENGINE_THREADS },
	};
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev, .link_ev = srv_link_ev };
	struct rnbd_srv *srv;
	int kind = -1, rc;

	if (!o || o->size < sizeof(*o) || !out)
		return -EINVAL;
	for (unsigned i = 0; i < ARRAY_SIZE(engines); i++)
		if (o->engine && !strcmp(o->engine, engines[i].name))
			kind = (int)engines[i].kind;
	if (kind < 0) {
		log_err("rnbd: unknown engine \"%s\" (auto, io_uring, threads)",
			o->engine ? o->engine : "");
		return -EINVAL;
	}
	if (o->dev_search_path) {
		char why[4200];

		rc = rnbd_search_path_check(o->dev_search_path, why, sizeof(why));
		if (rc) {
			log_err("rnbd: the device search path \"%s\": %s", o->dev_search_path, why);
			err_detail("the device search path: %s", why);
			return rc;
		}
	}
	if (o->rtrs.auth_keys_file && !o->access_file) {
		log_err("rnbd: an authenticating server needs an access file (which host may use "
			"which session names and open which devices; docs/security.md section "
			"2.6): without one every host would open everything");
		return -EINVAL;
	}
	if (o->access_file && !o->rtrs.auth_keys_file) {
		log_err("rnbd: the access file %s names hosts by their authentication: it needs "
			"a key file", o->access_file);
		return -EINVAL;
	}
	if (o->access_file && (!o->access_file[0] || strlen(o->access_file) >= 4096)) {
		log_err("rnbd: the access file's name is empty or longer than 4095 bytes");
		return -EINVAL;
	}
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	srv->o = *o;
	LIST_INIT(&srv->sessions);
	LIST_INIT(&srv->writers);
	STAILQ_INIT(&srv->rel_queue);
	pthread_mutex_init(&srv->lock, NULL);
	pthread_mutex_init(&srv->rel_lock, NULL);
	pthread_rwlock_init(&srv->access_lock, NULL);
	cond_init_mono(&srv->rel_cond); /* force-close waits with a deadline */
	if (o->dev_search_path)
		snprintf(srv->search, sizeof(srv->search), "%s", o->dev_search_path);
	srv->o.dev_search_path = srv->search[0] ? srv->search : NULL;
	if (o->access_file) {
		snprintf(srv->access_file, sizeof(srv->access_file), "%s", o->access_file);
		srv->o.access_file = srv->access_file;
		rc = access_load(srv, true, NULL, 0);
		if (rc) {
			srv_free(srv);
			return rc == -ENOMEM ? rc : -EINVAL;
		}
	}
	rc = rnbd_engine_open(kind, o->engine_threads, MAX(o->rtrs.queue_depth, 64u), &srv->engine);
	if (!rc)
		rnbd_engine_set_inline_writes(srv->engine, o->inline_writes);
	if (rc) {
		log_err("rnbd: cannot start the %s engine: %s", o->engine, strerror(-rc));
		srv_free(srv);
		return rc;
	}
	if (o->mem_devices && (rc = mem_devices_parse(srv, o->mem_devices))) {
		srv_free(srv);
		return rc;
	}
	rc = rnbd_qos_ctx_open(qos_dispatch, &srv->qos);
	if (rc) {
		log_err("rnbd: cannot start the rate limits' thread: %s", strerror(-rc));
		srv_free(srv);
		return rc;
	}
	for (const char *const *q = o->qos; q && *q; q++) {
		struct rnbd_qos_limits l;
		enum rnbd_qos_kind qkind;
		char name[256];
		const char *why = NULL;

		rc = rnbd_qos_parse(*q, &qkind, name, sizeof(name), &l, &why);
		/* One spec a name: a second would silently replace the first's limits. */
		for (const char *const *e = o->qos; !rc && e < q; e++) {
			struct rnbd_qos_limits el;
			enum rnbd_qos_kind ekind;
			char ename[256];

			if (!rnbd_qos_parse(*e, &ekind, ename, sizeof(ename), &el, &why) &&
			    ekind == qkind && !strcmp(ename, name)) {
				why = "its name has limits already";
				rc = -EINVAL;
			}
		}
		if (!rc)
			rc = rnbd_srv_qos_set(srv, qkind, name, &l);
		if (rc == -EOPNOTSUPP)
			why = "a host's limits need authentication (a key file): without it a "
			      "session has no host";
		if (rc) {
			log_err("rnbd: rate limit \"%s\": %s", *q, why ? why : strerror(-rc));
			srv_free(srv);
			return -EINVAL;
		}
	}
	/*
	 * Nothing is exported unless asked for: a server without a search path
	 * opens no file, and one with neither a search path nor a memory
	 * device has nothing to serve, which is a configuration mistake better
	 * reported at start than by every client's OPEN.
	 */
	if (!srv->search[0] && !srv->nmem) {
		log_err("rnbd: nothing to export: give a device search path or memory devices");
		srv_free(srv);
		return -EINVAL;
	}
	ops.priv = srv;
	rc = rtrs_srv_open(&ops, &o->rtrs, &srv->rtrs);
	if (rc) {
		srv_free(srv);
		return rc;
	}
	if (srv->search[0])
		log_info("rnbd: serving files and block devices below %s (%s engine; files %s, "
			 "block devices %s)", srv->search, rnbd_engine_name(srv->engine),
			 o->direct ? "O_DIRECT" : "buffered",
			 o->buffered_bdev ? "buffered" : "O_DIRECT");
	else
		log_info("rnbd: serving memory devices only (no search path)");
	if (!strcmp(srv->search, "/"))
		log_warn("rnbd: the search path is /: every file and block device of this host "
			 "that the server may open is exported");
	if (!o->rtrs.auth_keys_file)
		log_warn("rnbd: no authentication (no key file): any host that reaches %s may "
			 "open the exported devices", o->rtrs.addr ? o->rtrs.addr : "this host");
	*out = srv;
	return 0;
}

RNBD_EXPORT
int rnbd_srv_port(struct rnbd_srv *srv, unsigned timeout_ms)
{
	int rc = rtrs_srv_wait_listening(srv->rtrs, timeout_ms);

	return rc ? rc : rtrs_srv_get_port(srv->rtrs);
}

RNBD_EXPORT
int rnbd_srv_check_keys(struct rnbd_srv *srv)
{
	return srv ? rtrs_srv_check_keys(srv->rtrs) : -EINVAL;
}

RNBD_EXPORT
int rnbd_srv_reload_keys(struct rnbd_srv *srv)
{
	return srv ? rtrs_srv_reload_keys(srv->rtrs) : -EINVAL;
}

RNBD_EXPORT
int rnbd_srv_reload_access(struct rnbd_srv *srv, char *err, size_t errlen)
{
	if (!srv)
		return -EINVAL;
	if (!srv->access_file[0]) {
		if (err && errlen)
			snprintf(err, errlen, "no access file");
		return -ENOENT;
	}
	return access_load(srv, false, err, errlen);
}

RNBD_EXPORT
int rnbd_srv_force_close(struct rnbd_srv *srv, const char *sessname, const char *dev_name)
{
	struct rel_waiter w = { false };
	struct sess_dev *found = NULL;
	struct rnbd_sess *sess;
	char name[RNBD_DEV_NAME_MAX];
	struct timespec dl;
	int rc = 0;

	if (!srv || !sessname || !dev_name ||
	    snprintf(name, sizeof(name), "%s", dev_name) >= (int)sizeof(name))
		return -EINVAL;
	rnbd_dev_name_normalize(name);
	dev_name = name;

	pthread_mutex_lock(&srv->lock);
	LIST_FOREACH(sess, &srv->sessions, link) {
		if (found)
			break;
		if (strcmp(sess->name, sessname))
			continue;
		pthread_mutex_lock(&sess->lock);
		for (uint32_t id = 0; id < sess->ndevs; id++) {
			struct sess_dev *sd = sess->devs[id];

			if (sd && !sd->forced && !strcmp(sd->name, dev_name)) {
				sd->forced = true; /* the id stays taken; IO gets -ENOTCONN */
				/*
				 * Its IO held by rate limits: answered, not done, so
				 * that it does not keep the device (and its writer
				 * slot) for as long as its tokens take. After `forced`:
				 * an IO queued later sees it (qos_admit).
				 */
				rnbd_qos_drop(srv->qos, sess, sd);
				found = sd;
				/* Under the table's lock: a CLOSE cannot free it before. */
				pthread_mutex_lock(&srv->rel_lock);
				sd->waiter = &w;
				pthread_mutex_unlock(&srv->rel_lock);
				dev_close_start(sd);
				break;
			}
		}
		pthread_mutex_unlock(&sess->lock);
	}
	pthread_mutex_unlock(&srv->lock);
	if (!found)
		return -ENOENT;
	log_info("rnbd: %s: %s closed by the server", sessname, dev_name);
	/*
	 * Waits a while for the release (IO in flight answered, store closed,
	 * writer slot back), so that the device can be opened elsewhere when
	 * this returns 0; no lock is held meanwhile. A device whose IO hangs is
	 * released when it completes: -EINPROGRESS.
	 */
	dl = deadline_ms(RNBD_FORCE_CLOSE_WAIT_MS);
	pthread_mutex_lock(&srv->rel_lock);
	while (!w.done && pthread_cond_timedwait(&srv->rel_cond, &srv->rel_lock, &dl) != ETIMEDOUT)
		;
	if (!w.done) {
		found->waiter = NULL; /* not released, so not freed either */
		rc = -EINPROGRESS;
	}
	pthread_mutex_unlock(&srv->rel_lock);
	if (rc)
		log_warn("rnbd: %s: %s still has IO in flight after %u ms; it is released when "
			 "that completes", sessname, dev_name, RNBD_FORCE_CLOSE_WAIT_MS);
	return rc;
}

/* One device as rnbd_srv_list reports it: a copy, names included. */
struct list_item {
	struct rnbd_srv_dev_stats st;
	char session[RNBD_SESSNAME_MAX];
	char device[RNBD_DEV_NAME_MAX];
};

/*
 * A snapshot of every device, taken under the locks; fn runs on it after
 * they are released, so a slow fn (a control client that does not read)
 * holds up nothing of the server.
 */
RNBD_EXPORT
int rnbd_srv_list(struct rnbd_srv *srv,
		  void (*fn)(void *priv, const struct rnbd_srv_dev_stats *st), void *priv)
{
	struct list_item *items = NULL, *grown;
	struct rnbd_sess *sess;
	size_t n = 0, cap = 0;
	int rc = 0;

	if (!srv || !fn)
		return -EINVAL;
	pthread_mutex_lock(&srv->lock);
	LIST_FOREACH(sess, &srv->sessions, link) {
		if (rc)
			break;
		pthread_mutex_lock(&sess->lock);
		for (uint32_t id = 0; id < sess->ndevs; id++) {
			struct sess_dev *sd = sess->devs[id];
			struct list_item *it;

			if (!sd)
				continue;
			if (n == cap) {
				cap = cap ? cap * 2 : 16;
				grown = realloc(items, cap * sizeof(*items));
				if (!grown) {
					rc = -ENOMEM;
					break;
				}
				items = grown;
			}
			it = &items[n++];
			snprintf(it->session, sizeof(it->session), "%s", sess->name);
			snprintf(it->device, sizeof(it->device), "%s", sd->name);
			it->st = (struct rnbd_srv_dev_stats){
				.size = sizeof(it->st), .device_id = id,
				.mode = rnbd_access_mode_name(sd->mode), .closed = sd->forced,
				.reads = atomic_load_explicit(&sd->reads, memory_order_relaxed),
				.writes = atomic_load_explicit(&sd->writes, memory_order_relaxed),
				.read_bytes = atomic_load_explicit(&sd->read_bytes, memory_order_relaxed),
				.write_bytes = atomic_load_explicit(&sd->write_bytes, memory_order_relaxed),
				.other = atomic_load_explicit(&sd->other, memory_order_relaxed),
				.errors = atomic_load_explicit(&sd->errors, memory_order_relaxed),
				/* IO references: all of them once closing */
				.inflight = atomic_load(&sd->refs) - !atomic_load(&sd->closing),
			};
		}
		pthread_mutex_unlock(&sess->lock);
	}
	pthread_mutex_unlock(&srv->lock);
	for (size_t i = 0; i < n && !rc; i++) {
		items[i].st.session = items[i].session;
		items[i].st.device = items[i].device;
		fn(priv, &items[i].st);
	}
	free(items);
	if (rc)
		log_err("rnbd: list: no memory for the snapshot");
	return rc ? rc : (int)n;
}

RNBD_EXPORT
void rnbd_srv_close(struct rnbd_srv *srv)
{
	if (!srv)
		return;
	/* Answers every IO in flight and takes every session down (link events). */
	rtrs_srv_close(srv->rtrs);
	srv_free(srv);
}

RNBD_EXPORT
struct rtrs_srv_ctx *rnbd_srv_rtrs(struct rnbd_srv *srv)
{
	return srv ? srv->rtrs : NULL;
}
