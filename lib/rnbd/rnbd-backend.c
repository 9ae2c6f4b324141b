/* SPDX-License-Identifier: MIT */
/*
 * Backing stores and their engines (see rnbd-backend.h).
 *
 * The thread engine: a FIFO of requests and a pool of threads that run
 * each one to the end with plain system calls. The io_uring engine: reads
 * and writes go to one ring, submitted under a lock from whatever thread
 * the request comes on and reaped by one thread; flushes go to the
 * engine's flushers, threads that take a store's flushes queued and make
 * it durable with one fdatasync for all of them, stores side by side (io_uring would
 * hand each fsync to a worker thread of its own, io-wq, up to 8 per
 * submitting thread, one of them kept for the life of the process); a
 * PREFLUSH is a flush stage before the request, a FUA write to the page
 * cache one after it; what io_uring cannot do here (discard, write zeroes,
 * secure erase: fallocate and block ioctls) and whatever meets a full ring
 * goes to the engine's thread pool instead.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "log.h"
#include "rnbd-backend.h"
#include "rnbd-hooks.h"

struct rnbd_engine {
	bool uring;
	bool inline_writes;   /* rnbd_engine_set_inline_writes */
	/*
	 * the pool: every engine has one, of up to nthreads threads started
	 * as work comes that finds none idle (an engine on io_uring that
	 * never needs it has none); detached, each ends after
	 * RNBD_POOL_IDLE_MS without work
	 */
	pthread_mutex_t lock;
	pthread_cond_t cond;  /* work queued, stop, a thread ended */
	STAILQ_HEAD(, rnbd_breq) queue;
	bool stop;
	unsigned nthreads;
	unsigned started;     /* threads running */
	unsigned idle;        /* waiting for work */
	unsigned nqueued;     /* requests in queue */
	uint64_t pool_taken_ms; /* a pool thread last took a request */
	/*
	 * the flushers (io_uring engines): flushes queued, under lock. A
	 * store has one fdatasync running at a time, for all of its flushes
	 * queued when it began; stores do not wait for each other's (one
	 * store's slow or hung file system holds its own flushes, no
	 * other's). Threads start as stores with flushes queued outnumber
	 * the idle ones, up to RNBD_FLUSHERS_MAX; each ends after
	 * RNBD_POOL_IDLE_MS with nothing to take.
	 */
	STAILQ_HEAD(, rnbd_breq) flushq;
	pthread_cond_t flush_cond;
	unsigned flushers;       /* threads running */
	unsigned flushers_idle;  /* waiting for a store to sync */
	unsigned flush_syncing;  /* stores whose fdatasync runs (a flusher each) */
	unsigned flush_ready;    /* stores with flushes queued and no fdatasync running */
	atomic_uint_fast64_t flushes, flush_syncs; /* flush stages; fdatasync calls for them */
	/* io_uring */
	struct io_uring ring;
	pthread_mutex_t sq_lock;
	/*
	 * Bumped (release) after a request is put on the ring, read (acquire)
	 * by the reaper before it touches one: the ring hands requests over
	 * through memory the kernel writes, which thread sanitizers cannot
	 * see; this makes the hand-over visible to them (and costs one atomic).
	 */
	atomic_uint posted;
	pthread_t reaper;
	bool reaper_started;
};

struct rnbd_store {
	struct rnbd_engine *e;        /* NULL: memory */
	int fd;
	bool direct;
	atomic_bool nowait[2];        /* reads, writes: try RWF_NOWAIT first (nowait_try) */
	uint8_t *mem;
	struct rnbd_store_info info;
	pthread_mutex_t lock;
	pthread_cond_t idle;
	unsigned inflight;
	/*
	 * The first error a sync of it met (an fdatasync, or a FUA write's
	 * RWF_DSYNC that failed with EIO), given to every later flush: the
	 * kernel reports a lost write-back to one sync only, and a later
	 * fdatasync succeeds with acknowledged writes lost (store_sync).
	 */
	atomic_int sync_err;
	char name[64];                /* for the log (rnbd_store_set_name) */
	/* under e->lock: its flushes in e->flushq; a flusher's fdatasync of it runs */
	unsigned flushq_n;
	bool syncing;
	/*
	 * Pool threads running its requests (taken under e->lock, given back
	 * before complete): a store takes at most the pool's nthreads, so
	 * the threads the stuck rule adds serve the other stores, not more
	 * of a hung one's requests.
	 */
	atomic_uint pool_busy;
	/*
	 * A block device, or a file on a local disk file system
	 * (store_local_fs). Only then is a plain buffered write done at once
	 * on the submitting thread (the engine's inline_writes), and IO put
	 * on the io_uring ring: on NFS, FUSE, CIFS, Ceph and the like an IO
	 * can wait on a server for ever, and would hold the network thread
	 * (with it every connection of its poll group) or the ring's few
	 * io-wq workers (with them every other store's IO they take); the
	 * pool, which gives a store at most nthreads threads, takes it.
	 */
	bool local;
};

/* A pool thread without work for this long ends. */
#define RNBD_POOL_IDLE_MS 5000
/* Pool threads at most, when those it has hang (RNBD_POOL_STUCK_MS without taking one). */
#define RNBD_POOL_MAX 64
#define RNBD_POOL_STUCK_MS 1000
/* Flusher threads at most: as many stores' fdatasyncs at once. */
#define RNBD_FLUSHERS_MAX 32

/* user_data of the NOP that tells the reaper to stop */
#define REAPER_STOP ((void *)1)

static void store_get(struct rnbd_store *s)
{
	pthread_mutex_lock(&s->lock);
	s->inflight++;
	pthread_mutex_unlock(&s->lock);
}

static void store_put(struct rnbd_store *s)
{
	pthread_mutex_lock(&s->lock);
	if (--s->inflight == 0)
		pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->lock);
}

static void sync_failed(struct rnbd_store *s, int err)
{
	int none = 0;

	if (atomic_compare_exchange_strong(&s->sync_err, &none, err))
		log_err("rnbd: %s: a sync failed (%s): every later flush of it fails so until it "
			"is opened again (writes acknowledged before may be lost)",
			s->name[0] ? s->name : "a store", strerror(-err));
}

static void complete(struct rnbd_breq *r, int err)
{
	struct rnbd_store *s = r->store;

	if (err == -EIO && r->op == RNBD_OP_WRITE && (r->flags & RNBD_F_FUA) && s->e)
		sync_failed(s, err); /* its RWF_DSYNC may have taken an earlier write-back's error */
	r->done(r, err);
	store_put(s);
}

/* ---- the synchronous path (thread pool) -------------------------------------- */

static int zero_fill(int fd, uint64_t off, uint64_t len)
{
	/* Aligned, so that it also serves O_DIRECT descriptors. */
	static const uint8_t zeros[65536] __attribute__((aligned(4096)));

	while (len) {
		ssize_t n = pwrite(fd, zeros, MIN(len, sizeof(zeros)), (off_t)off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		off += (uint64_t)n;
		len -= (uint64_t)n;
	}
	return 0;
}

static int (*_Atomic sync_hook)(void *priv, int fd);
static void *_Atomic sync_hook_priv;

static _Atomic uint32_t feat_mask;

void rnbd_engine_set_features_mask(uint32_t features)
{
	atomic_store(&feat_mask, features);
}

void rnbd_store_set_sync_hook(int (*fn)(void *priv, int fd), void *priv)
{
	sync_hook_priv = priv;
	atomic_store(&sync_hook, fn);
}

/* fdatasync(fd), or the test's hook in its place (rnbd-hooks.h). */
static int datasync(int fd)
{
	int (*hook)(void *priv, int fd) = atomic_load(&sync_hook);

	if (hook)
		return hook(sync_hook_priv, fd);
	return fdatasync(fd) ? -errno : 0;
}

/* Makes s durable: 0, or the first error a sync of it met (sync_err). */
static int store_sync(struct rnbd_store *s)
{
	int rc = atomic_load(&s->sync_err);

	if (rc)
		return rc;
	rc = datasync(s->fd);
	if (rc)
		sync_failed(s, rc);
	return rc;
}

static int rw_all(struct rnbd_store *s, struct rnbd_breq *r)
{
	uint64_t off = r->offset;
	uint8_t *p = r->buf;
	uint32_t left = r->len;
	int flags = r->op == RNBD_OP_WRITE && (r->flags & RNBD_F_FUA) ? RWF_DSYNC : 0;

	while (left) {
		struct iovec iov = { p, left };
		ssize_t n = r->op == RNBD_OP_READ ? preadv2(s->fd, &iov, 1, (off_t)off, 0)
						  : pwritev2(s->fd, &iov, 1, (off_t)off, flags);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO; /* the file shrank under us */
		p += n;
		off += (uint64_t)n;
		left -= (uint32_t)n;
	}
	return 0;
}

static int range_ioctl(int fd, unsigned long req, uint64_t off, uint64_t len)
{
	uint64_t range[2] = { off, len };

	return ioctl(fd, req, range) ? -errno : 0;
}

static int exec_sync(struct rnbd_store *s, struct rnbd_breq *r)
{
	bool bdev = s->info.block_device;
	int rc = 0;

	if (r->flags & RNBD_F_PREFLUSH) {
		rc = store_sync(s);
		if (rc)
			return rc;
	}
	switch (r->op) {
	case RNBD_OP_READ:
	case RNBD_OP_WRITE:
		rc = r->len ? rw_all(s, r) : 0;
		if (!rc && r->op == RNBD_OP_WRITE && !r->len && (r->flags & RNBD_F_FUA))
			rc = store_sync(s); /* an empty FUA write: a flush */
		return rc;
	case RNBD_OP_FLUSH:
		return store_sync(s);
	case RNBD_OP_DISCARD:
		rc = bdev ? range_ioctl(s->fd, BLKDISCARD, r->offset, r->len)
			  : (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				       (off_t)r->offset, r->len) ? -errno : 0);
		break;
	case RNBD_OP_SECURE_ERASE:
		rc = bdev ? range_ioctl(s->fd, BLKSECDISCARD, r->offset, r->len) : -EOPNOTSUPP;
		break;
	case RNBD_OP_WRITE_ZEROES:
		if (bdev) {
			rc = range_ioctl(s->fd, BLKZEROOUT, r->offset, r->len);
			break;
		}
		rc = fallocate(s->fd,
			       (r->flags & RNBD_F_NOUNMAP ? FALLOC_FL_ZERO_RANGE
							  : FALLOC_FL_PUNCH_HOLE) | FALLOC_FL_KEEP_SIZE,
			       (off_t)r->offset, r->len) ? -errno : 0;
		if (rc == -EOPNOTSUPP)
			rc = zero_fill(s->fd, r->offset, r->len);
		break;
	}
	if (!rc && (r->flags & RNBD_F_FUA))
		rc = store_sync(s);
	return rc;
}

static void *pool_thread(void *arg)
{
	struct rnbd_engine *e = arg;

	pthread_setname_np(pthread_self(), "rnbd-pool");
	pthread_mutex_lock(&e->lock);
	for (;;) {
		struct rnbd_breq *r, *prev = NULL;
		struct rnbd_store *st;
		int rc;

		/* The first request of a store that does not hold nthreads of the pool already. */
		STAILQ_FOREACH(r, &e->queue, link) {
			if (atomic_load_explicit(&r->store->pool_busy, memory_order_relaxed) <
			    e->nthreads)
				break;
			prev = r;
		}
		if (!r) {
			/*
			 * Nothing it may take (none queued, or only requests of
			 * stores at their share): waits for work, looking again
			 * at each wake-up.
			 */
			struct timespec dl = deadline_ms(RNBD_POOL_IDLE_MS);

			if (e->stop)
				break;
			e->idle++;
			rc = pthread_cond_timedwait(&e->cond, &e->lock, &dl);
			e->idle--;
			if (rc == ETIMEDOUT && STAILQ_EMPTY(&e->queue))
				break; /* idle: work that comes starts another */
			continue;
		}
		if (prev)
			STAILQ_REMOVE(&e->queue, r, rnbd_breq, link);
		else
			STAILQ_REMOVE_HEAD(&e->queue, link);
		e->nqueued--;
		e->pool_taken_ms = now_ms();
		st = r->store;
		atomic_fetch_add_explicit(&st->pool_busy, 1, memory_order_relaxed);
		pthread_mutex_unlock(&e->lock);
		rc = exec_sync(st, r);
		/* Before complete: the store may be closed and freed once its last request is. */
		atomic_fetch_sub_explicit(&st->pool_busy, 1, memory_order_relaxed);
		complete(r, rc);
		pthread_mutex_lock(&e->lock);
	}
	/* The last touch of e: rnbd_engine_close waits for started 0 under the lock. */
	e->started--;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

/* Starts fn(e) on a detached thread; 0 or the error of pthread_create. */
static int start_detached(void *(*fn)(void *), struct rnbd_engine *e)
{
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &attr, fn, e);
	pthread_attr_destroy(&attr);
	return rc;
}

static void pool_queue(struct rnbd_engine *e, struct rnbd_breq *r)
{
	bool inline_run = false;

	pthread_mutex_lock(&e->lock);
	STAILQ_INSERT_TAIL(&e->queue, r, link);
	e->nqueued++;
	/*
	 * An idle thread looks (it may take this one), and one more starts
	 * while requests queued outnumber the idle threads: one woken and
	 * not yet running still counts as idle, and takes the request
	 * queued before this one.
	 */
	if (e->idle)
		pthread_cond_signal(&e->cond);
	if (e->nqueued > e->idle && (e->started < e->nthreads ||
		   /*
		    * Every thread busy and none has taken a request for a
		    * second: they hang on a store (a hung file system), and
		    * the other stores' requests get a thread more, at most
		    * one a second, up to RNBD_POOL_MAX.
		    */
		   (e->started < RNBD_POOL_MAX && now_ms() - e->pool_taken_ms >= RNBD_POOL_STUCK_MS))) {
		int rc = start_detached(pool_thread, e);

		if (e->started >= e->nthreads)
			e->pool_taken_ms = now_ms();
		if (!rc)
			e->started++;
		else if (!e->started)
			inline_run = true; /* no thread to take it: run it here */
		if (rc)
			log_warn_rl("rnbd: IO pool: cannot start a thread: %s", strerror(rc));
	}
	if (inline_run) {
		STAILQ_REMOVE(&e->queue, r, rnbd_breq, link);
		e->nqueued--;
	}
	pthread_mutex_unlock(&e->lock);
	if (inline_run)
		complete(r, exec_sync(r->store, r));
}

/* ---- io_uring ------------------------------------------------------------------ */

/*
 * Stages of a request on the io_uring engine: a flush before (PREFLUSH),
 * the request, a flush after (a FUA write to the page cache).
 */
enum { STAGE_PREFLUSH = 1, STAGE_MAIN, STAGE_POSTFLUSH };

/* r's current stage is a flush: the flushers'. */
static bool stage_is_flush(const struct rnbd_breq *r)
{
	return r->stage != STAGE_MAIN || r->op == RNBD_OP_FLUSH ||
	       (r->op == RNBD_OP_WRITE && !r->len);
}

/* A FUA write whose data goes to the page cache: durable by a flush after it. */
static bool fua_by_flush(const struct rnbd_breq *r)
{
	return r->op == RNBD_OP_WRITE && r->len && (r->flags & RNBD_F_FUA) && !r->store->direct;
}

static void flush_queue(struct rnbd_engine *e, struct rnbd_breq *r);
static bool nowait_try(struct rnbd_store *s, struct rnbd_breq *r);

/* Puts r's current stage on the ring; false if the ring is full. */
static bool uring_post(struct rnbd_engine *e, struct rnbd_breq *r)
{
	struct rnbd_store *s = r->store;
	struct io_uring_sqe *sqe;
	bool ok = false;

	pthread_mutex_lock(&e->sq_lock);
	sqe = io_uring_get_sqe(&e->ring);
	if (sqe) {
		if (r->op == RNBD_OP_READ) {
			io_uring_prep_read(sqe, s->fd, r->buf, r->len, r->offset);
		} else {
			io_uring_prep_write(sqe, s->fd, r->buf, r->len, r->offset);
			/* O_DIRECT: the device writes through (REQ_FUA), no worker */
			if ((r->flags & RNBD_F_FUA) && s->direct)
				sqe->rw_flags = RWF_DSYNC;
		}
		io_uring_sqe_set_data(sqe, r);
		atomic_fetch_add_explicit(&e->posted, 1, memory_order_release);
		/*
		 * The entry is on the ring now, whatever submit says: if the
		 * kernel takes it later (the reaper submits what is pending),
		 * it must not also go to the pool.
		 */
		ok = true;
		if (io_uring_submit(&e->ring) < 0)
			log_err_rl("rnbd: io_uring submit failed; retried by the reaper");
	}
	pthread_mutex_unlock(&e->sq_lock);
	return ok;
}

/* r's current stage on the ring, or, the ring full, the rest of r on the pool. */
static void post_or_pool(struct rnbd_engine *e, struct rnbd_breq *r)
{
	if (!uring_post(e, r))
		pool_queue(e, r); /* it does it all; a PREFLUSH done is no longer asked for */
}

/* r's read or write is done: a FUA write to the page cache is flushed now. */
static void main_done(struct rnbd_engine *e, struct rnbd_breq *r)
{
	if (!fua_by_flush(r)) {
		complete(r, 0);
		return;
	}
	r->stage = STAGE_POSTFLUSH;
	flush_queue(e, r);
}

static void uring_start(struct rnbd_engine *e, struct rnbd_breq *r)
{
	r->stage = r->flags & RNBD_F_PREFLUSH ? STAGE_PREFLUSH : STAGE_MAIN;
	if (stage_is_flush(r))
		flush_queue(e, r);
	else
		post_or_pool(e, r);
}

/* A completion of r's current stage with result res. */
static void uring_step(struct rnbd_engine *e, struct rnbd_breq *r, int res)
{
	if (res < 0) {
		complete(r, res);
		return;
	}
	if (r->stage == STAGE_PREFLUSH) {
		r->stage = STAGE_MAIN;
		r->flags &= ~RNBD_F_PREFLUSH; /* done */
		if (r->op == RNBD_OP_FLUSH || !r->len) {
			complete(r, 0);
			return;
		}
		/* On a flusher's thread: at once if it can be, as at submission. */
		if (nowait_try(r->store, r)) {
			main_done(e, r);
			return;
		}
	} else if (r->stage == STAGE_MAIN && (r->op == RNBD_OP_READ || r->op == RNBD_OP_WRITE) &&
		   r->len) {
		if (res == 0) {
			complete(r, -EIO);
			return;
		}
		if ((uint32_t)res == r->len) {
			main_done(e, r);
			return;
		}
		/* Short: the rest as a request of its own. */
		r->buf = (uint8_t *)r->buf + res;
		r->offset += (uint32_t)res;
		r->len -= (uint32_t)res;
		/*
		 * A FUA write to the page cache: should the rest go to the
		 * pool (a full ring), its RWF_DSYNC covers only the rest, and
		 * the flush before it makes what was written so far durable.
		 */
		if (fua_by_flush(r))
			r->flags |= RNBD_F_PREFLUSH;
	} else {
		complete(r, 0); /* a flush, the request's or after it */
		return;
	}
	post_or_pool(e, r);
}

/* ---- the flushers (io_uring engines) ------------------------------------------ */

/*
 * Takes a store's flushes, all that are queued, and makes it durable with
 * one fdatasync, begun after each of them was queued (after the write
 * that a post-flush follows had completed): it covers them all. Their
 * next stages start from here. A store whose fdatasync runs on another
 * flusher waits for it; other stores do not.
 */
static void *flusher_thread(void *arg)
{
	struct rnbd_engine *e = arg;

	pthread_setname_np(pthread_self(), "rnbd-flush");
	pthread_mutex_lock(&e->lock);
	for (;;) {
		STAILQ_HEAD(, rnbd_breq) mine = STAILQ_HEAD_INITIALIZER(mine);
		struct rnbd_store *s = NULL;
		struct rnbd_breq *r, *t;
		int rc;

		if (!e->flush_ready) {
			struct timespec dl = deadline_ms(RNBD_POOL_IDLE_MS);

			rc = 0;
			e->flushers_idle++;
			while (!e->flush_ready && !e->stop && rc != ETIMEDOUT)
				rc = pthread_cond_timedwait(&e->flush_cond, &e->lock, &dl);
			e->flushers_idle--;
			if (!e->flush_ready)
				break; /* idle or stopping: a flush that comes starts another */
		}
		STAILQ_FOREACH(r, &e->flushq, link)
			if (!r->store->syncing) {
				s = r->store;
				break;
			}
		for (r = STAILQ_FIRST(&e->flushq); s && r; r = t) {
			t = STAILQ_NEXT(r, link);
			if (r->store == s) {
				STAILQ_REMOVE(&e->flushq, r, rnbd_breq, link);
				STAILQ_INSERT_TAIL(&mine, r, link);
			}
		}
		if (!s) {
			/* flush_ready counts such stores: not reached, but never a spin. */
			e->flush_ready = 0;
			continue;
		}
		s->flushq_n = 0;
		s->syncing = true;
		e->flush_ready--;
		e->flush_syncing++;
		pthread_mutex_unlock(&e->lock);
		rc = store_sync(s);
		atomic_fetch_add_explicit(&e->flush_syncs, 1, memory_order_relaxed);
		pthread_mutex_lock(&e->lock);
		/* Before the next stages: the last of them may close the store. */
		s->syncing = false;
		e->flush_syncing--;
		if (s->flushq_n) {
			e->flush_ready++;
			pthread_cond_signal(&e->flush_cond);
		}
		pthread_mutex_unlock(&e->lock);
		/* The next stages may queue flushes again: not this sync's. */
		while ((r = STAILQ_FIRST(&mine))) {
			STAILQ_REMOVE_HEAD(&mine, link);
			uring_step(e, r, rc);
		}
		pthread_mutex_lock(&e->lock);
	}
	/* The last touch of e: rnbd_engine_close waits for no flushers under the lock. */
	e->flushers--;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

static void flush_queue(struct rnbd_engine *e, struct rnbd_breq *r)
{
	struct rnbd_store *s = r->store;
	bool inline_run = false;

	atomic_fetch_add_explicit(&e->flushes, 1, memory_order_relaxed);
	pthread_mutex_lock(&e->lock);
	STAILQ_INSERT_TAIL(&e->flushq, r, link);
	if (s->flushq_n++ == 0 && !s->syncing)
		e->flush_ready++;
	if (e->flushers_idle)
		pthread_cond_signal(&e->flush_cond);
	/* Stores waiting for a flusher beyond those free (idle, or about to look): one more. */
	if (e->flush_ready > e->flushers - e->flush_syncing && e->flushers < RNBD_FLUSHERS_MAX) {
		int rc = start_detached(flusher_thread, e);

		if (!rc) {
			e->flushers++;
		} else if (!e->flushers) {
			log_warn_rl("rnbd: flusher: cannot start a thread: %s", strerror(rc));
			STAILQ_REMOVE(&e->flushq, r, rnbd_breq, link);
			if (--s->flushq_n == 0 && !s->syncing)
				e->flush_ready--;
			inline_run = true; /* no thread to take it: run it here */
		}
	}
	pthread_mutex_unlock(&e->lock);
	if (inline_run)
		uring_step(e, r, store_sync(r->store));
}

void rnbd_engine_flush_stats(struct rnbd_engine *e, uint64_t *flushes, uint64_t *syncs)
{
	*flushes = atomic_load(&e->flushes);
	*syncs = atomic_load(&e->flush_syncs);
}

/*
 * The reaper's wait for a completion, at most 1 s. Before Linux 5.11 (no
 * IORING_FEAT_EXT_ARG) liburing times its wait with a timeout request it
 * puts on the submission queue itself, beside the submitters and without
 * their sq_lock, and the wait then returns the count it submitted: there
 * readiness comes from poll(2) on the ring instead.
 */
static int reaper_wait(struct rnbd_engine *e, struct io_uring_cqe **cqe)
{
	struct __kernel_timespec ts = { .tv_sec = 1 };
	struct pollfd p = { .fd = e->ring.ring_fd, .events = POLLIN };
	int rc;

	if (e->ring.features & IORING_FEAT_EXT_ARG)
		return io_uring_wait_cqe_timeout(&e->ring, cqe, &ts);
	rc = io_uring_peek_cqe(&e->ring, cqe);
	if (rc != -EAGAIN)
		return rc;
	rc = poll(&p, 1, 1000);
	if (rc < 0)
		return -errno;
	rc = io_uring_peek_cqe(&e->ring, cqe);
	return rc == -EAGAIN ? -ETIME : rc;
}

static void *reaper_thread(void *arg)
{
	struct rnbd_engine *e = arg;

	pthread_setname_np(pthread_self(), "rnbd-reaper");
	for (;;) {
		struct io_uring_cqe *cqe;
		struct rnbd_breq *r;
		/*
		 * With a deadline: entries a failed submit left on the ring
		 * (no memory for the kernel) are submitted again below even
		 * when nothing else completes.
		 */
		int res, rc = reaper_wait(e, &cqe);

		if (rc == -EINTR || rc == -ETIME || rc == -EBADR) {
			/* -EBADR: the kernel dropped completions (no memory for its overflow list). */
			if (rc == -EBADR)
				log_err_rl("rnbd: io_uring lost completions (no memory): the IO they "
					   "ended waits for ever");
			pthread_mutex_lock(&e->sq_lock);
			if (io_uring_sq_ready(&e->ring))
				io_uring_submit(&e->ring);
			pthread_mutex_unlock(&e->sq_lock);
			continue;
		}
		if (rc) {
			log_err("rnbd: io_uring wait failed: %s", strerror(-rc));
			break;
		}
		(void)atomic_load_explicit(&e->posted, memory_order_acquire);
		r = io_uring_cqe_get_data(cqe);
		res = cqe->res;
		io_uring_cqe_seen(&e->ring, cqe);
		if (r == REAPER_STOP)
			break;
		uring_step(e, r, res);
		/* Entries a failed submit left on the ring. */
		pthread_mutex_lock(&e->sq_lock);
		if (io_uring_sq_ready(&e->ring))
			io_uring_submit(&e->ring);
		pthread_mutex_unlock(&e->sq_lock);
	}
	return NULL;
}

/* ---- engines ------------------------------------------------------------------- */

int rnbd_engine_open(enum rnbd_engine_kind kind, unsigned threads, unsigned depth,
		     struct rnbd_engine **out)
{
	struct rnbd_engine *e = calloc(1, sizeof(*e));
	int rc;

	if (!e)
		return -ENOMEM;
	pthread_mutex_init(&e->lock, NULL);
	cond_init_mono(&e->cond); /* idle pool threads wait with a deadline */
	cond_init_mono(&e->flush_cond);
	STAILQ_INIT(&e->flushq);
	pthread_mutex_init(&e->sq_lock, NULL);
	STAILQ_INIT(&e->queue);
	e->nthreads = threads ? threads : 4;
	if (kind != RNBD_ENGINE_THREADS) {
		rc = io_uring_queue_init(depth ? depth : 256, &e->ring, 0);
		if (rc && kind == RNBD_ENGINE_URING) {
			free(e);
			return rc;
		}
		e->uring = rc == 0;
		if (e->uring)
			e->ring.features &= ~atomic_load(&feat_mask);
	}
	if (e->uring) {
		/*
		 * What the ring cannot do without blocking (buffered writes
		 * to most file systems) goes to the kernel's io-wq workers,
		 * threads of this process; by default up to 4 per CPU. A
		 * buffered write is a copy into the page cache: a quarter of
		 * the CPUs (at least one) keep up with the network, and the
		 * process stays within its thread budget.
		 */
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		unsigned max[2] = { (unsigned)MAX(cpus / 4, 1), 0 }; /* bounded; unbounded as is */

		rc = io_uring_register_iowq_max_workers(&e->ring, max);
		if (rc)
			log_dbg("rnbd: io_uring's worker limit stays the kernel's: %s", strerror(-rc));
	}
	if (e->uring) {
		rc = -pthread_create(&e->reaper, NULL, reaper_thread, e);
		if (rc) {
			io_uring_queue_exit(&e->ring);
			free(e);
			return rc;
		}
		e->reaper_started = true;
	}
	*out = e;
	return 0;
}

void rnbd_engine_set_inline_writes(struct rnbd_engine *e, bool on)
{
	e->inline_writes = on;
}

const char *rnbd_engine_name(const struct rnbd_engine *e)
{
	return e->uring ? "io_uring" : "threads";
}

void rnbd_engine_close(struct rnbd_engine *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->lock);
	e->stop = true;
	pthread_cond_broadcast(&e->cond);
	pthread_cond_broadcast(&e->flush_cond);
	while (e->started || e->flushers)
		pthread_cond_wait(&e->cond, &e->lock);
	pthread_mutex_unlock(&e->lock);
	if (e->reaper_started) {
		struct io_uring_sqe *sqe;

		pthread_mutex_lock(&e->sq_lock);
		while (!(sqe = io_uring_get_sqe(&e->ring)))
			io_uring_submit(&e->ring);
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, REAPER_STOP);
		io_uring_submit(&e->ring);
		pthread_mutex_unlock(&e->sq_lock);
		pthread_join(e->reaper, NULL);
	}
	if (e->uring)
		io_uring_queue_exit(&e->ring);
	free(e);
}

/* ---- stores -------------------------------------------------------------------- */

static struct rnbd_store *store_new(void)
{
	struct rnbd_store *s = calloc(1, sizeof(*s));

	if (s) {
		s->fd = -1;
		pthread_mutex_init(&s->lock, NULL);
		pthread_cond_init(&s->idle, NULL);
	}
	return s;
}

/*
 * A block device's queue attribute from sysfs, its first line into buf
 * without the newline: false when it cannot be read. A partition has no
 * queue of its own: its disk's (the directory above) is read.
 */
static bool queue_str(dev_t rdev, const char *name, char *buf, int len)
{
	char path[128];
	FILE *f;
	bool ok;

	snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/%s", major(rdev), minor(rdev),
		 name);
	f = fopen(path, "r");
	if (!f) {
		snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/../queue/%s", major(rdev),
			 minor(rdev), name);
		f = fopen(path, "r");
	}
	if (!f)
		return false;
	ok = fgets(buf, len, f) != NULL;
	fclose(f);
	if (ok)
		buf[strcspn(buf, "\n")] = '\0';
	return ok;
}

/* A block device's numeric queue attribute, or dflt. */
static uint64_t queue_attr(dev_t rdev, const char *name, uint64_t dflt)
{
	char buf[32];
	uint64_t v;

	return queue_str(rdev, name, buf, sizeof(buf)) && !parse_u64(buf, 0, UINT64_MAX, &v) ?
	       v : dflt;
}

/* Whether fd's file system is a local disk's (or memory's): one a write never waits on a server for. */
static bool store_local_fs(int fd)
{
	static const unsigned long local[] = {
		0xEF53,     /* ext2, ext3, ext4 */
		0x58465342, /* xfs */
		0x9123683E, /* btrfs */
		0xF2F52010, /* f2fs */
		0x01021994, /* tmpfs */
		0x858458f6, /* ramfs */
		0x2fc12fc1, /* zfs */
		0x5346544e, /* ntfs (ntfs3) */
		0x4d44,     /* vfat */
		0x2011BAB0, /* exfat */
		0x3153464a, /* jfs */
		0x52654973, /* reiserfs */
		0x794c7630, /* overlayfs (containers: its layers on the host's disk) */
	};
	struct statfs sf;

	if (fstatfs(fd, &sf))
		return false;
	for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
		if ((unsigned long)sf.f_type == local[i])
			return true;
	return false;
}

int rnbd_store_fd(struct rnbd_engine *e, int fd, bool direct, struct rnbd_store **out)
{
	struct rnbd_store *s = store_new();
	struct rnbd_store_info *in;
	struct stat st;
	int rc;

	if (!s) {
		close(fd);
		return -ENOMEM;
	}
	s->e = e;
	s->fd = fd;
	s->direct = direct;
	in = &s->info;
	if (fstat(fd, &st)) {
		rc = -errno;
		goto fail;
	}
	in->dev = st.st_dev;
	in->ino = st.st_ino;
	if (S_ISBLK(st.st_mode)) {
		uint64_t bytes;
		int lbs = 512;
		unsigned pbs = 512;

		in->block_device = true;
		in->dev = st.st_rdev;
		in->ino = 0;
		s->local = true;
		if (ioctl(fd, BLKGETSIZE64, &bytes) || ioctl(fd, BLKSSZGET, &lbs) ||
		    ioctl(fd, BLKPBSZGET, &pbs)) {
			rc = -errno;
			goto fail;
		}
		in->size = bytes;
		in->logical_block_size = (uint32_t)lbs;
		in->physical_block_size = MAX(pbs, (unsigned)lbs);
		in->discard = queue_attr(st.st_rdev, "discard_max_bytes", 0) > 0;
		in->write_zeroes = true; /* BLKZEROOUT writes zeros where the device cannot */
		in->secure_erase = false;
		/*
		 * Direct: the device's own write cache ("write back" or "write
		 * through") and FUA; through the page cache, both. What cannot
		 * be read counts as there: a flush too many costs little.
		 */
		char wc[32];

		in->write_cache = !direct || !queue_str(st.st_rdev, "write_cache", wc, sizeof(wc)) ||
				  strcmp(wc, "write through") != 0;
		in->fua = !direct || queue_attr(st.st_rdev, "fua", 1) != 0;
	} else if (S_ISREG(st.st_mode)) {
		s->local = store_local_fs(fd);
		in->size = (uint64_t)st.st_size;
		in->logical_block_size = direct ? 4096 : 512;
		in->physical_block_size = 4096;
		in->discard = true;
		in->write_zeroes = true;
		in->write_cache = true;
		in->fua = true;
	} else {
		rc = -ENOTBLK;
		goto fail;
	}
	in->direct = direct;
	in->size -= in->size % in->logical_block_size;
	atomic_init(&s->nowait[0], !direct); /* the page cache is there to hit */
	atomic_init(&s->nowait[1], !direct);
	*out = s;
	return 0;
fail:
	close(fd);
	free(s);
	return rc;
}

void rnbd_store_set_name(struct rnbd_store *s, const char *name)
{
	snprintf(s->name, sizeof(s->name), "%s", name);
}

int rnbd_store_memory(uint64_t size, struct rnbd_store **out)
{
	struct rnbd_store *s;

	if (!size || size % 4096)
		return -EINVAL;
	s = store_new();
	if (!s)
		return -ENOMEM;
	s->mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
		      MAP_NORESERVE, -1, 0);
	if (s->mem == MAP_FAILED) {
		free(s);
		return -ENOMEM;
	}
	s->info = (struct rnbd_store_info){
		.size = size, .logical_block_size = 512, .physical_block_size = 4096,
		.discard = true, .secure_erase = true, .write_zeroes = true,
	};
	*out = s;
	return 0;
}

const struct rnbd_store_info *rnbd_store_info(const struct rnbd_store *s)
{
	return &s->info;
}

/*
 * A write into a memory device: the data goes past the CPU's caches
 * (non-temporal stores). The device is large and written at random, so
 * the lines written are rarely in cache; a plain copy reads each one
 * first to own it, twice the memory traffic, and evicts lines the next
 * requests need. The sfence orders the stores before the response that
 * follows: a read of the range after it sees the data. Measured with
 * 4 KiB random writes (bench/RESULTS.md): 0.15-0.2 us less per IO for
 * rnbd-server. Unaligned ranges, and CPUs without SSE2, copy plainly.
 */
static void mem_copy_in(void *dst, const void *src, size_t len)
{
#if defined(__SSE2__)
	if (!(((uintptr_t)dst | (uintptr_t)src | len) & 63)) {
		__m128i *d = dst;
		const __m128i *from = src;

		for (size_t i = 0; i < len / 16; i += 4) {
			__m128i a = _mm_load_si128(from + i), b = _mm_load_si128(from + i + 1);
			__m128i c = _mm_load_si128(from + i + 2), e = _mm_load_si128(from + i + 3);

			_mm_stream_si128(d + i, a);
			_mm_stream_si128(d + i + 1, b);
			_mm_stream_si128(d + i + 2, c);
			_mm_stream_si128(d + i + 3, e);
		}
		_mm_sfence();
		return;
	}
#endif
	memcpy(dst, src, len);
}

/*
 * Discard, write zeroes, secure erase on a memory device: its whole pages
 * given back (MADV_DONTNEED: a private anonymous mapping reads zeroes
 * there again), the partial ones at the edges cleared. A memset would
 * make every page never written resident: a mkfs that discards the
 * device would commit all of it.
 */
static void mem_zero(void *start, size_t len)
{
	char *p = start;
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1);
	uintptr_t hi = ((uintptr_t)p + len) & ~(page - 1);

	if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED)) {
		memset(p, 0, len);
		return;
	}
	memset(p, 0, lo - (uintptr_t)p);
	memset((void *)hi, 0, (uintptr_t)p + len - hi);
}

static int mem_exec(struct rnbd_store *s, struct rnbd_breq *r)
{
	switch (r->op) {
	case RNBD_OP_READ:
		memcpy(r->buf, s->mem + r->offset, r->len);
		break;
	case RNBD_OP_WRITE:
		mem_copy_in(s->mem + r->offset, r->buf, r->len);
		break;
	case RNBD_OP_FLUSH:
		break;
	default:
		mem_zero(s->mem + r->offset, r->len);
		break;
	}
	return 0;
}

/*
 * A plain read or write of a buffered file whose pages are in the page
 * cache is done at once on the submitting thread (RWF_NOWAIT: the kernel
 * refuses, -EAGAIN, rather than wait for the disk or a lock): no hand-off
 * to a ring or a pool thread and back. Where the file system cannot write
 * with RWF_NOWAIT (ext4), a plain write is done at once all the same when
 * the engine says so (inline_writes): a copy into the page cache, which
 * io_uring would hand to one of its worker threads, a context switch each
 * way (bench/RESULTS.md, file engines); the thread may wait while the
 * kernel throttles dirty pages. True when the whole request was done;
 * otherwise it goes the usual way, whole (a read read again, a write
 * written again with the same bytes).
 */
static bool nowait_try(struct rnbd_store *s, struct rnbd_breq *r)
{
	struct iovec iov = { r->buf, r->len };
	bool w = r->op == RNBD_OP_WRITE;
	ssize_t n;

	/*
	 * FUA: on io_uring engines a write to the page cache is flushed after
	 * (main_done). An empty write is a flush (stage_is_flush): never here.
	 */
	if ((r->op != RNBD_OP_READ && !w) || !r->len || (r->flags & RNBD_F_PREFLUSH) ||
	    ((r->flags & RNBD_F_FUA) && (s->direct || !s->e->uring)))
		return false;
	if (!atomic_load_explicit(&s->nowait[w], memory_order_relaxed)) {
		if (!w || s->direct || !s->e->inline_writes || !s->local)
			return false;
		n = pwritev2(s->fd, &iov, 1, (off_t)r->offset, 0);
		return n == (ssize_t)r->len;
	}
	n = w ? pwritev2(s->fd, &iov, 1, (off_t)r->offset, RWF_NOWAIT)
	      : preadv2(s->fd, &iov, 1, (off_t)r->offset, RWF_NOWAIT);
	if (n < 0 && errno == EOPNOTSUPP) {
		/*
		 * Not on this file system (ext4 writes): never again, and this
		 * write too is done the way the next ones will be, not handed
		 * to io_uring, whose worker thread for it (io-wq) would stay.
		 */
		atomic_store_explicit(&s->nowait[w], false, memory_order_relaxed);
		if (w && !s->direct && s->e->inline_writes && s->local)
			n = pwritev2(s->fd, &iov, 1, (off_t)r->offset, 0);
	}
	return n == (ssize_t)r->len;
}

/* Test hook (rnbd-hooks.h): may hold a request, as a backing store that hangs would. */
static bool (*_Atomic hold_hook)(void *priv, struct rnbd_breq *r);
static void *_Atomic hold_hook_priv;

void rnbd_store_set_hold_hook(bool (*fn)(void *priv, struct rnbd_breq *r), void *priv)
{
	hold_hook_priv = priv;
	atomic_store(&hold_hook, fn);
}

/* Runs a request that passed the checks (rnbd_store_submit). */
static void store_exec(struct rnbd_store *s, struct rnbd_breq *r)
{
	if (!s->e) {
		complete(r, mem_exec(s, r));
		return;
	}
	if (nowait_try(s, r)) {
		if (s->e->uring)
			main_done(s->e, r);
		else
			complete(r, 0);
		return;
	}
	if (s->e->uring && s->local && (r->op == RNBD_OP_READ || r->op == RNBD_OP_WRITE ||
					r->op == RNBD_OP_FLUSH))
		uring_start(s->e, r);
	else
		pool_queue(s->e, r);
}

void rnbd_store_resume(struct rnbd_breq *r)
{
	store_exec(r->store, r);
}

void rnbd_store_submit(struct rnbd_store *s, struct rnbd_breq *r)
{
	uint32_t align = s->direct ? s->info.logical_block_size : 1;
	bool (*hold)(void *priv, struct rnbd_breq *r) = atomic_load(&hold_hook);

	r->store = s;
	store_get(s);
	if (r->offset > s->info.size || r->len > s->info.size - r->offset) {
		complete(r, -EINVAL);
		return;
	}
	if (align > 1 && (r->offset % align || r->len % align ||
			  (uintptr_t)r->buf % align)) {
		complete(r, -EINVAL);
		return;
	}
	if (hold && hold(hold_hook_priv, r))
		return; /* the test resumes it (rnbd_store_resume) */
	store_exec(s, r);
}

void rnbd_store_close(struct rnbd_store *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->lock);
	while (s->inflight)
		pthread_cond_wait(&s->idle, &s->lock);
	pthread_mutex_unlock(&s->lock);
	if (s->mem)
		munmap(s->mem, s->info.size);
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}
