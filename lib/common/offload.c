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

/* Pool's lock held: j at the queue's end. */
static void queue_push(struct offload_job *j)
{
	j->next = NULL;
	atomic_store(&j->state, OFFLOAD_QUEUED);
	if (pool.tail)
		pool.tail->next = j;
	else
		pool.head = j;
	pool.tail = j;
}

static void *worker(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "rtrs-offload");
	pthread_mutex_lock(&pool.lock);
	for (;;) {
		struct offload_job *j = pool.head;

		if (!j) {
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
		pool.head = j->next;
		if (!pool.head)
			pool.tail = NULL;
		j->next = NULL;
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
			atomic_store(&j->state, OFFLOAD_DONE);
			if (j->notify)
				j->notify(j);
			/* j is its owner's again from here on. */
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
		if (st == OFFLOAD_QUEUED) {
			struct offload_job **pp = &pool.head, *prev = NULL;

			while (*pp && *pp != j) {
				prev = *pp;
				pp = &(*pp)->next;
			}
			if (*pp) {
				*pp = j->next;
				if (pool.tail == j)
					pool.tail = prev;
			}
			j->next = NULL;
		}
		break;
	}
	atomic_store(&j->state, OFFLOAD_IDLE);
	pthread_mutex_unlock(&pool.lock);
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
