/* SPDX-License-Identifier: MIT */
/* Offload workers: see offload.h. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "offload.h"
#include "util.h"

static struct {
	pthread_mutex_t lock;
	pthread_cond_t work;      /* a job was queued */
	pthread_cond_t done;      /* a job is done */
	struct offload_job *head, *tail;
	unsigned workers, idle, running, max;
} pool = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.work = PTHREAD_COND_INITIALIZER,
	.done = PTHREAD_COND_INITIALIZER,
};

static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static void (*_Atomic idle_hook)(void);

static void pool_init(void)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	/* Workers wait on the monotonic clock (no worker exists yet). */
	pthread_cond_destroy(&pool.work);
	cond_init_mono(&pool.work);
	pool.max = (unsigned)MIN(MAX(ncpu / 2, 2), OFFLOAD_WORKERS_MAX);
}

/*
 * The queue (pool's lock): a ring of classes, each its first job (pool.head
 * to pool.tail, through next), the class's other jobs behind it (more to
 * more_tail, through next). j joins its class, or the ring's end.
 */
static void queue_push(struct offload_job *j)
{
	j->next = NULL;
	j->more = j->more_tail = NULL;
	atomic_store(&j->state, OFFLOAD_QUEUED);
	for (struct offload_job *l = pool.head; j->cls && l; l = l->next) {
		if (l->cls != j->cls)
			continue;
		if (l->more_tail)
			l->more_tail->next = j;
		else
			l->more = j;
		l->more_tail = j;
		return;
	}
	if (pool.tail)
		pool.tail->next = j;
	else
		pool.head = j;
	pool.tail = j;
}

/* The first job of l's class after l, heading the rest of it (NULL: none). */
static struct offload_job *class_next(struct offload_job *l)
{
	struct offload_job *f = l->more;

	if (f) {
		f->more = f->next;
		f->more_tail = f->next ? l->more_tail : NULL;
		f->next = NULL;
	}
	l->more = l->more_tail = NULL;
	return f;
}

/* The ring's first class gives its first job; the class goes to the end. */
static struct offload_job *queue_pop(void)
{
	struct offload_job *j = pool.head, *f;

	if (!j)
		return NULL;
	pool.head = j->next;
	if (!pool.head)
		pool.tail = NULL;
	j->next = NULL;
	f = class_next(j);
	if (f) {
		if (pool.tail)
			pool.tail->next = f;
		else
			pool.head = f;
		pool.tail = f;
	}
	return j;
}

/* j, queued, leaves the queue; its class keeps its place in the ring. */
static void queue_remove(struct offload_job *j)
{
	struct offload_job *prev = NULL;

	for (struct offload_job *l = pool.head; l; prev = l, l = l->next) {
		if (l == j) {
			struct offload_job *f = class_next(j);

			if (f)
				f->next = j->next;
			else
				f = j->next;
			if (prev)
				prev->next = f;
			else
				pool.head = f;
			if (pool.tail == j)
				pool.tail = f && !f->next ? f : prev;
			j->next = NULL;
			return;
		}
		if (!j->cls || l->cls != j->cls)
			continue;
		for (struct offload_job **pp = &l->more, *mp = NULL; *pp; mp = *pp, pp = &(*pp)->next) {
			if (*pp != j)
				continue;
			*pp = j->next;
			if (l->more_tail == j)
				l->more_tail = mp;
			j->next = NULL;
			return;
		}
	}
}

static void *worker(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "rtrs-offload");
	pthread_mutex_lock(&pool.lock);
	for (;;) {
		struct offload_job *j;

		if (!pool.head) {
			struct timespec dl = deadline_ms(OFFLOAD_IDLE_MS);
			int rc = 0;

			pool.idle++;
			while (!pool.head && rc != ETIMEDOUT)
				rc = pthread_cond_timedwait(&pool.work, &pool.lock, &dl);
			pool.idle--;
			if (!pool.head)
				break;
			continue;
		}
		j = queue_pop();
		atomic_store(&j->state, OFFLOAD_RUNNING);
		pool.running++;
		pthread_mutex_unlock(&pool.lock);
		j->fn(j);
		pthread_mutex_lock(&pool.lock);
		pool.running--;
		if (j->again) {
			/* Submitted while it ran: once more, at the queue's end. */
			j->again = false;
			queue_push(j);
		} else {
			void (*notify)(struct offload_job *) = j->notify;

			/*
			 * Nothing of j is read once it is done: offload_take
			 * (no lock) may give it back to its owner at once.
			 */
			atomic_store(&j->state, OFFLOAD_DONE);
			if (notify)
				notify(j);
		}
		pthread_cond_broadcast(&pool.done);
		if (!pool.head && !pool.running && atomic_load(&idle_hook)) {
			void (*fn)(void) = atomic_load(&idle_hook);

			pthread_mutex_unlock(&pool.lock);
			fn();
			pthread_mutex_lock(&pool.lock);
		}
	}
	pool.workers--;
	pthread_mutex_unlock(&pool.lock);
	return NULL;
}

int offload_submit(struct offload_job *j)
{
	int rc = 0;

	pthread_once(&pool_once, pool_init);
	pthread_mutex_lock(&pool.lock);
	if (atomic_load(&j->state) == OFFLOAD_QUEUED) {
		pthread_mutex_unlock(&pool.lock);
		return -EBUSY;
	}
	if (atomic_load(&j->state) == OFFLOAD_RUNNING) {
		j->again = true;
		pthread_mutex_unlock(&pool.lock);
		return 0;
	}
	/* Jobs waiting beyond the idle workers: one more worker, if the cap allows. */
	if (pool.workers < pool.max && (!pool.idle || pool.head)) {
		pthread_t t;
		pthread_attr_t attr;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		rc = -pthread_create(&t, &attr, worker, NULL);
		pthread_attr_destroy(&attr);
		if (!rc)
			pool.workers++;
		else if (pool.workers)
			rc = 0; /* the workers there are will take it */
		else
			log_warn_rl("offload: no worker thread: %s", strerror(-rc));
	}
	if (!rc) {
		queue_push(j);
		pthread_cond_signal(&pool.work);
	}
	pthread_mutex_unlock(&pool.lock);
	return rc;
}

bool offload_take(struct offload_job *j)
{
	int done = OFFLOAD_DONE;

	return atomic_compare_exchange_strong(&j->state, &done, OFFLOAD_IDLE);
}

void offload_cancel(struct offload_job *j)
{
	pthread_mutex_lock(&pool.lock);
	for (;;) {
		int st = atomic_load(&j->state);

		if (st == OFFLOAD_RUNNING) {
			j->again = false;
			pthread_cond_wait(&pool.done, &pool.lock);
			continue;
		}
		if (st == OFFLOAD_QUEUED)
			queue_remove(j);
		break;
	}
	atomic_store(&j->state, OFFLOAD_IDLE);
	pthread_mutex_unlock(&pool.lock);
}

bool offload_cancel_nowait(struct offload_job *j)
{
	bool out;

	pthread_mutex_lock(&pool.lock);
	if (atomic_load(&j->state) == OFFLOAD_QUEUED)
		queue_remove(j);
	out = atomic_load(&j->state) != OFFLOAD_RUNNING;
	if (out)
		atomic_store(&j->state, OFFLOAD_IDLE);
	else
		j->again = false;
	pthread_mutex_unlock(&pool.lock);
	return out;
}

bool offload_dequeue(struct offload_job *j)
{
	bool out = false;

	pthread_mutex_lock(&pool.lock);
	if (atomic_load(&j->state) == OFFLOAD_QUEUED) {
		queue_remove(j);
		atomic_store(&j->state, OFFLOAD_IDLE);
		out = true;
	}
	pthread_mutex_unlock(&pool.lock);
	return out;
}

bool offload_idle(void)
{
	bool idle;

	pthread_mutex_lock(&pool.lock);
	idle = !pool.head && !pool.running;
	pthread_mutex_unlock(&pool.lock);
	return idle;
}

void offload_idle_hook(void (*fn)(void))
{
	atomic_store(&idle_hook, fn);
}

unsigned offload_workers(void)
{
	unsigned n;

	pthread_mutex_lock(&pool.lock);
	n = pool.workers;
	pthread_mutex_unlock(&pool.lock);
	return n;
}

unsigned offload_queued(void)
{
	unsigned n = 0;

	pthread_mutex_lock(&pool.lock);
	for (const struct offload_job *l = pool.head; l; l = l->next) {
		n++;
		for (const struct offload_job *m = l->more; m; m = m->next)
			n++;
	}
	pthread_mutex_unlock(&pool.lock);
	return n;
}
