/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "log.h"
#include "loop.h"
#include "util.h"

struct loop {
	int epfd;
	struct loop_fd wake;       /* eventfd: work queued or stop */
	pthread_t thread;
	pthread_mutex_t lock;      /* protects the work list and stop */
	struct loop_work *head, *tail;
	bool stop;
	/* The batch being dispatched, so loop_del_fd can cancel its events. */
	struct epoll_event *batch;
	int batch_len;
	char name[32];
	/* The test clock (loop_test_clock), when it was on at loop_create. */
	bool test;
	atomic_bool test_blocked;  /* about to block in epoll_wait */
	atomic_uint test_wakes;    /* returns from epoll_wait */
	struct loop *test_next;
	struct loop_timer *test_timers;
	struct loop_fd *test_fds;
};

/*
 * The test clock: off unless a test turns it on before its first loop.
 * Timers are then eventfds that loop_test_advance() makes readable, so a
 * scenario decides when a heartbeat or a reconnect fires, not the wall
 * clock; and loop_test_idle() tells when every loop has done what it was
 * given. A process that never turns it on pays one test of l->test per
 * loop lap and per timer call.
 */
static struct {
	pthread_mutex_t lock;      /* the lists of loops and timers, now_ms, due times */
	bool on;
	uint64_t now_ms;
	struct loop *loops;
	void (*idle)(void);
} tclock = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void loop_run_work(struct loop *l)
{
	for (;;) {
		struct loop_work *w;

		pthread_mutex_lock(&l->lock);
		w = l->head;
		if (w) {
			l->head = w->next;
			if (!l->head)
				l->tail = NULL;
		}
		pthread_mutex_unlock(&l->lock);
		if (!w)
			return;
		atomic_store(&w->queued, false);
		w->fn(w);
	}
}

static void *loop_thread(void *arg)
{
	struct loop *l = arg;
	struct epoll_event evs[16];

	pthread_setname_np(pthread_self(), l->name);
	for (;;) {
		int n;

		if (l->test) {
			atomic_store(&l->test_blocked, true);
			if (tclock.idle)
				tclock.idle();
		}
		n = epoll_wait(l->epfd, evs, ARRAY_SIZE(evs), -1);
		if (l->test) {
			atomic_store(&l->test_blocked, false);
			atomic_fetch_add(&l->test_wakes, 1);
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			log_err("%s: epoll_wait: %s", l->name, strerror(errno));
			break;
		}
		l->batch = evs;
		l->batch_len = n;
		for (int i = 0; i < n; i++) {
			struct loop_fd *h = evs[i].data.ptr;

			/* NULL: an earlier handler of this batch removed it. */
			if (h)
				h->cb(h, evs[i].events);
		}
		l->batch = NULL;
		l->batch_len = 0;
		loop_run_work(l);
		pthread_mutex_lock(&l->lock);
		bool stop = l->stop && !l->head;
		pthread_mutex_unlock(&l->lock);
		if (stop)
			break;
	}
	return NULL;
}

static void loop_wake_cb(struct loop_fd *h, uint32_t events)
{
	uint64_t v;

	if (read(h->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn("loop: eventfd read: %s", strerror(errno));
}

static void loop_kick(struct loop *l)
{
	uint64_t one = 1;

	if (write(l->wake.fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("%s: eventfd write: %s", l->name, strerror(errno));
}

static void test_unlist(struct loop *l)
{
	pthread_mutex_lock(&tclock.lock);
	for (struct loop **pl = &tclock.loops; *pl; pl = &(*pl)->test_next) {
		if (*pl == l) {
			*pl = l->test_next;
			break;
		}
	}
	pthread_mutex_unlock(&tclock.lock);
}

int loop_create(const char *name, struct loop **out)
{
	struct loop *l = calloc(1, sizeof(*l));
	int rc;

	if (!l)
		return -ENOMEM;
	snprintf(l->name, sizeof(l->name), "%s", name);
	pthread_mutex_init(&l->lock, NULL);
	l->wake.fd = -1;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0) {
		rc = -errno;
		goto out_free;
	}
	l->wake.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (l->wake.fd < 0) {
		rc = -errno;
		goto out_close_ep;
	}
	l->wake.cb = loop_wake_cb;
	pthread_mutex_lock(&tclock.lock);
	l->test = tclock.on;
	pthread_mutex_unlock(&tclock.lock);
	rc = loop_add_fd(l, &l->wake, EPOLLIN);
	if (rc)
		goto out_close_wake;
	if (l->test) {
		pthread_mutex_lock(&tclock.lock);
		l->test_next = tclock.loops;
		tclock.loops = l;
		pthread_mutex_unlock(&tclock.lock);
	}
	rc = -pthread_create(&l->thread, NULL, loop_thread, l);
	if (rc) {
		test_unlist(l);
		goto out_close_wake;
	}
	*out = l;
	return 0;

out_close_wake:
	close(l->wake.fd);
out_close_ep:
	close(l->epfd);
out_free:
	pthread_mutex_destroy(&l->lock);
	free(l);
	return rc;
}

void loop_destroy(struct loop *l)
{
	if (!l)
		return;
	if (l->test)
		test_unlist(l);
	pthread_mutex_lock(&l->lock);
	l->stop = true;
	pthread_mutex_unlock(&l->lock);
	loop_kick(l);
	pthread_join(l->thread, NULL);
	close(l->wake.fd);
	close(l->epfd);
	pthread_mutex_destroy(&l->lock);
	free(l);
}

bool loop_in_thread(const struct loop *l)
{
	return pthread_equal(pthread_self(), l->thread);
}

int loop_add_fd(struct loop *l, struct loop_fd *h, uint32_t events)
{
	struct epoll_event ev = { .events = events, .data.ptr = h };

	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, h->fd, &ev))
		return -errno;
	if (l->test) {
		pthread_mutex_lock(&tclock.lock);
		h->test_next = l->test_fds;
		l->test_fds = h;
		pthread_mutex_unlock(&tclock.lock);
	}
	return 0;
}

void loop_del_fd(struct loop *l, struct loop_fd *h)
{
	if (l->test) {
		pthread_mutex_lock(&tclock.lock);
		for (struct loop_fd **ph = &l->test_fds; *ph; ph = &(*ph)->test_next) {
			if (*ph == h) {
				*ph = h->test_next;
				break;
			}
		}
		pthread_mutex_unlock(&tclock.lock);
	}
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, h->fd, NULL);
	if (loop_in_thread(l))
		for (int i = 0; i < l->batch_len; i++)
			if (l->batch[i].data.ptr == h)
				l->batch[i].data.ptr = NULL;
}

static void loop_timer_cb(struct loop_fd *h, uint32_t events)
{
	struct loop_timer *t = container_of(h, struct loop_timer, h);
	uint64_t expirations;

	if (read(h->fd, &expirations, sizeof(expirations)) != sizeof(expirations))
		return; /* disarmed or re-armed meanwhile */
	t->cb(t);
}

int loop_timer_init(struct loop *l, struct loop_timer *t, void (*cb)(struct loop_timer *t))
{
	int rc;

	t->loop = l;
	t->cb = cb;
	t->h.cb = loop_timer_cb;
	/* The test clock fires a timer by making its eventfd readable. */
	t->h.fd = l->test ? eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC) :
		  timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (t->h.fd < 0)
		return -errno;
	rc = loop_add_fd(l, &t->h, EPOLLIN);
	if (rc) {
		close(t->h.fd);
		t->h.fd = -1;
		return rc;
	}
	if (l->test) {
		pthread_mutex_lock(&tclock.lock);
		t->test_due_ms = 0;
		t->test_next = l->test_timers;
		l->test_timers = t;
		pthread_mutex_unlock(&tclock.lock);
	}
	return 0;
}

static struct timespec ms_to_ts(unsigned ms)
{
	return (struct timespec){ .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
}

void loop_timer_arm(struct loop_timer *t, unsigned first_ms, unsigned period_ms)
{
	struct itimerspec its = { .it_value = ms_to_ts(first_ms), .it_interval = ms_to_ts(period_ms) };

	if (t->h.fd < 0)
		return;
	if (t->loop->test) {
		uint64_t v;

		pthread_mutex_lock(&tclock.lock);
		/* An expiry not read yet is gone, as timerfd_settime makes it. */
		if (read(t->h.fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			log_warn("%s: timer eventfd read: %s", t->loop->name, strerror(errno));
		t->test_due_ms = first_ms ? tclock.now_ms + first_ms : 0;
		t->test_period_ms = period_ms;
		pthread_mutex_unlock(&tclock.lock);
		return;
	}
	timerfd_settime(t->h.fd, 0, &its, NULL);
}

void loop_timer_fini(struct loop_timer *t)
{
	if (t->h.fd < 0)
		return;
	if (t->loop->test) {
		pthread_mutex_lock(&tclock.lock);
		for (struct loop_timer **pt = &t->loop->test_timers; *pt; pt = &(*pt)->test_next) {
			if (*pt == t) {
				*pt = t->test_next;
				break;
			}
		}
		pthread_mutex_unlock(&tclock.lock);
	}
	loop_del_fd(t->loop, &t->h);
	close(t->h.fd);
	t->h.fd = -1;
}

void loop_queue(struct loop *l, struct loop_work *w)
{
	if (atomic_exchange(&w->queued, true))
		return;
	pthread_mutex_lock(&l->lock);
	w->next = NULL;
	if (l->tail)
		l->tail->next = w;
	else
		l->head = w;
	l->tail = w;
	pthread_mutex_unlock(&l->lock);
	loop_kick(l);
}

struct loop_call_ctx {
	struct loop_work w;
	void (*fn)(void *arg);
	void *arg;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
};

static void loop_call_work(struct loop_work *w)
{
	struct loop_call_ctx *c = container_of(w, struct loop_call_ctx, w);

	c->fn(c->arg);
	pthread_mutex_lock(&c->lock);
	c->done = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

void loop_call(struct loop *l, void (*fn)(void *arg), void *arg)
{
	struct loop_call_ctx c = { .fn = fn, .arg = arg };

	if (loop_in_thread(l)) {
		fn(arg);
		return;
	}
	loop_work_init(&c.w, loop_call_work);
	pthread_mutex_init(&c.lock, NULL);
	pthread_cond_init(&c.cond, NULL);
	loop_queue(l, &c.w);
	pthread_mutex_lock(&c.lock);
	while (!c.done)
		pthread_cond_wait(&c.cond, &c.lock);
	pthread_mutex_unlock(&c.lock);
	pthread_mutex_destroy(&c.lock);
	pthread_cond_destroy(&c.cond);
}

/* ---- shared loops --------------------------------------------------------------- */

static struct {
	pthread_mutex_t lock;      /* the slots and their users */
	struct loop *loop[LOOP_SHARED_MAX];
	unsigned users[LOOP_SHARED_MAX];
} shared = { .lock = PTHREAD_MUTEX_INITIALIZER };

int loop_shared_get(const char *name, struct loop **out)
{
	unsigned best = 0;
	int rc = 0;

	pthread_mutex_lock(&shared.lock);
	for (unsigned i = 1; i < LOOP_SHARED_MAX; i++)
		if (shared.users[i] < shared.users[best])
			best = i;
	if (!shared.loop[best]) {
		char n[32];

		snprintf(n, sizeof(n), "%.24s-%u", name, best);
		rc = loop_create(n, &shared.loop[best]);
	}
	if (!rc) {
		shared.users[best]++;
		*out = shared.loop[best];
	}
	pthread_mutex_unlock(&shared.lock);
	return rc;
}

void loop_shared_put(struct loop *l)
{
	struct loop *stop = NULL;

	if (!l)
		return;
	pthread_mutex_lock(&shared.lock);
	for (unsigned i = 0; i < LOOP_SHARED_MAX; i++) {
		if (shared.loop[i] != l)
			continue;
		if (--shared.users[i] == 0 && !loop_in_thread(l)) {
			stop = l;
			shared.loop[i] = NULL;
		}
		break;
	}
	pthread_mutex_unlock(&shared.lock);
	loop_destroy(stop);
}

unsigned loop_shared_users(unsigned *n, unsigned max)
{
	unsigned i;

	pthread_mutex_lock(&shared.lock);
	for (i = 0; i < LOOP_SHARED_MAX && i < max; i++)
		n[i] = shared.loop[i] ? shared.users[i] : 0;
	pthread_mutex_unlock(&shared.lock);
	return i;
}

/* ---- the test clock ------------------------------------------------------------- */

void loop_test_clock(void (*idle)(void))
{
	pthread_mutex_lock(&tclock.lock);
	if (tclock.loops)
		log_err("loop: the test clock is turned on with loops running; they keep real time");
	tclock.on = true;
	tclock.idle = idle;
	pthread_mutex_unlock(&tclock.lock);
}

void loop_test_advance(unsigned ms)
{
	uint64_t one = 1;

	pthread_mutex_lock(&tclock.lock);
	tclock.now_ms += ms;
	for (struct loop *l = tclock.loops; l; l = l->test_next) {
		for (struct loop_timer *t = l->test_timers; t; t = t->test_next) {
			if (!t->test_due_ms || t->test_due_ms > tclock.now_ms)
				continue;
			if (write(t->h.fd, &one, sizeof(one)) < 0)
				log_warn("%s: timer eventfd write: %s", l->name, strerror(errno));
			/* Expiries in between collapse into one, as a timerfd read counts them. */
			if (t->test_period_ms)
				while (t->test_due_ms <= tclock.now_ms)
					t->test_due_ms += t->test_period_ms;
			else
				t->test_due_ms = 0;
		}
	}
	pthread_mutex_unlock(&tclock.lock);
}

uint64_t loop_now_ms(void)
{
	return tclock.on ? loop_test_now() : now_ms();
}

uint64_t loop_test_now(void)
{
	uint64_t now;

	pthread_mutex_lock(&tclock.lock);
	now = tclock.now_ms;
	pthread_mutex_unlock(&tclock.lock);
	return now;
}

/*
 * Blocked in (or on its way into) epoll_wait, with none of its fds ready
 * and no work queued. The fds are looked at one by one: each stays ready
 * until its handler reads it, which the loop does only after leaving
 * epoll_wait. The loop may leave it while we look (and read an fd we have
 * not polled yet): its count of wake-ups, read before and after, tells.
 * (The epoll fd itself would not do: while epoll_wait hands its events
 * over, its ready list looks empty.)
 */
static bool loop_idle(struct loop *l)
{
	unsigned wakes = atomic_load(&l->test_wakes);
	bool idle = atomic_load(&l->test_blocked);

	for (struct loop_fd *h = l->test_fds; h && idle; h = h->test_next) {
		struct pollfd pfd = { .fd = h->fd, .events = POLLIN };

		idle = poll(&pfd, 1, 0) == 0;
	}
	pthread_mutex_lock(&l->lock);
	idle = idle && !l->head;
	pthread_mutex_unlock(&l->lock);
	return idle && atomic_load(&l->test_blocked) && atomic_load(&l->test_wakes) == wakes;
}

bool loop_test_idle(void)
{
	bool idle = true;

	pthread_mutex_lock(&tclock.lock);
	for (struct loop *l = tclock.loops; l && idle; l = l->test_next)
		idle = loop_idle(l);
	pthread_mutex_unlock(&tclock.lock);
	return idle;
}
