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
	struct loop_fd tfd;        /* timerfd: the earliest deadline of the heap (not on the test clock) */
	pthread_t thread;
	pthread_mutex_t lock;      /* protects the work list, stop and the timers' heap */
	struct loop_timer **heap;  /* armed timers, earliest deadline first */
	unsigned heap_n, heap_cap;
	uint64_t tfd_ns;           /* the deadline tfd is set to, 0 none */
	unsigned nr_timers;        /* set up on this loop: the heap's room */
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
	struct loop_fd *test_fds;
};

/*
 * The test clock: off unless a test turns it on before its first loop.
 * Timers then follow its time, which moves only in loop_test_advance()
 * (that wakes the loops), so a scenario decides when a heartbeat or a
 * reconnect fires, not the wall clock; and loop_test_idle() tells when every loop has done what it was
 * given. A process that never turns it on pays one test of l->test per
 * loop lap and per timer call.
 */
static struct {
	pthread_mutex_t lock;      /* the lists of loops and timers, now_ms, due times */
	bool on;
	_Atomic uint64_t now_ms;   /* read without the lock: a loop's timers are under its own */
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

/* ---- timers: a heap per loop, one timerfd ------------------------------------------ */

static void loop_kick(struct loop *l);

static uint64_t loop_time_ns(const struct loop *l)
{
	return l->test ? loop_test_now() * 1000000ull : now_ns();
}

static bool heap_less(const struct loop_timer *a, const struct loop_timer *b)
{
	return a->deadline_ns < b->deadline_ns;
}

static void heap_set(struct loop *l, unsigned i, struct loop_timer *t)
{
	l->heap[i] = t;
	t->idx = i;
}

static void heap_up(struct loop *l, unsigned i)
{
	struct loop_timer *t = l->heap[i];

	while (i && heap_less(t, l->heap[(i - 1) / 2])) {
		heap_set(l, i, l->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	heap_set(l, i, t);
}

static void heap_down(struct loop *l, unsigned i)
{
	struct loop_timer *t = l->heap[i];

	for (;;) {
		unsigned c = 2 * i + 1;

		if (c >= l->heap_n)
			break;
		if (c + 1 < l->heap_n && heap_less(l->heap[c + 1], l->heap[c]))
			c++;
		if (!heap_less(l->heap[c], t))
			break;
		heap_set(l, i, l->heap[c]);
		i = c;
	}
	heap_set(l, i, t);
}

/* l->lock held. */
static void heap_remove(struct loop *l, struct loop_timer *t)
{
	unsigned i = t->idx;
	struct loop_timer *last;

	if (i == LOOP_TIMER_IDLE)
		return;
	t->idx = LOOP_TIMER_IDLE;
	last = l->heap[--l->heap_n];
	if (last == t)
		return;
	heap_set(l, i, last);
	heap_up(l, i);
	heap_down(l, last->idx);
}

/* l->lock held; the heap has room (loop_timer_init makes it). */
static void heap_insert(struct loop *l, struct loop_timer *t)
{
	heap_set(l, l->heap_n++, t);
	heap_up(l, t->idx);
}

/* l->lock held: the timerfd follows the earliest deadline. */
static void tfd_update(struct loop *l)
{
	uint64_t want = l->heap_n ? l->heap[0]->deadline_ns : 0;
	struct itimerspec its = { 0 };

	if (l->test) {
		if (want && want <= loop_test_now() * 1000000ull)
			loop_kick(l);
		return;
	}
	if (want == l->tfd_ns)
		return;
	l->tfd_ns = want;
	if (want) {
		its.it_value.tv_sec = (time_t)(want / 1000000000ull);
		its.it_value.tv_nsec = (long)(want % 1000000000ull);
	}
	timerfd_settime(l->tfd.fd, TFD_TIMER_ABSTIME, &its, NULL);
}

/*
 * Loop thread: fires the timers that are due, one at a time (a callback
 * may arm, disarm or finish any timer), the earliest deadline first; with
 * it every other one already due whose deadline comes next. A periodic
 * timer's expiries in between collapse into one, as a timerfd counts them.
 */
static void run_timers(struct loop *l)
{
	uint64_t now = loop_time_ns(l);

	for (;;) {
		struct loop_timer *t;

		pthread_mutex_lock(&l->lock);
		t = l->heap_n ? l->heap[0] : NULL;
		if (!t || t->due_ns > now) {
			tfd_update(l);
			pthread_mutex_unlock(&l->lock);
			return;
		}
		heap_remove(l, t);
		if (t->period_ms) {
			uint64_t period = t->period_ms * 1000000ull;

			while (t->due_ns <= now)
				t->due_ns += period;
			t->deadline_ns = t->due_ns + (l->test ? 0 : t->slack_ms * 1000000ull);
			heap_insert(l, t);
		}
		pthread_mutex_unlock(&l->lock);
		t->cb(t);
	}
}

static void loop_tfd_cb(struct loop_fd *h, uint32_t events)
{
	struct loop *l = container_of(h, struct loop, tfd);
	uint64_t v;

	(void)events;
	if (read(h->fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn("%s: timerfd read: %s", l->name, strerror(errno));
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
		run_timers(l);
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
	l->tfd.fd = -1;
	pthread_mutex_lock(&tclock.lock);
	l->test = tclock.on;
	pthread_mutex_unlock(&tclock.lock);
	rc = loop_add_fd(l, &l->wake, EPOLLIN);
	if (rc)
		goto out_close_wake;
	if (!l->test) {
		l->tfd.fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		l->tfd.cb = loop_tfd_cb;
		rc = l->tfd.fd < 0 ? -errno : loop_add_fd(l, &l->tfd, EPOLLIN);
		if (rc)
			goto out_close_wake;
	}
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
	if (l->tfd.fd >= 0)
		close(l->tfd.fd);
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
	for (unsigned i = 0; i < l->heap_n; i++)
		l->heap[i]->idx = LOOP_TIMER_IDLE;
	free(l->heap);
	if (l->tfd.fd >= 0)
		close(l->tfd.fd);
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

int loop_timer_init(struct loop *l, struct loop_timer *t, void (*cb)(struct loop_timer *t))
{
	int rc = 0;

	pthread_mutex_lock(&l->lock);
	/* Room for every timer set up, so that arming never allocates. */
	if (l->heap_cap == l->nr_timers) {
		unsigned cap = l->heap_cap ? 2 * l->heap_cap : 16;
		struct loop_timer **h = realloc(l->heap, cap * sizeof(*h));

		if (h) {
			l->heap = h;
			l->heap_cap = cap;
		} else {
			rc = -ENOMEM;
		}
	}
	if (!rc) {
		l->nr_timers++;
		t->cb = cb;
		t->idx = LOOP_TIMER_IDLE;
		t->period_ms = 0;
		t->slack_ms = 0; /* a timer in memory that was not zeroed fires on time too */
		t->loop = l;
	}
	pthread_mutex_unlock(&l->lock);
	return rc;
}

void loop_timer_slack(struct loop_timer *t, unsigned slack_ms)
{
	t->slack_ms = slack_ms;
}

void loop_timer_arm(struct loop_timer *t, unsigned first_ms, unsigned period_ms)
{
	struct loop *l = t->loop;

	if (!l)
		return;
	uint64_t now = loop_time_ns(l);

	pthread_mutex_lock(&l->lock);
	heap_remove(l, t);
	t->period_ms = period_ms;
	if (first_ms) {
		t->due_ns = now + first_ms * 1000000ull;
		t->deadline_ns = t->due_ns + (l->test ? 0 : t->slack_ms * 1000000ull);
		heap_insert(l, t);
	}
	tfd_update(l);
	pthread_mutex_unlock(&l->lock);
}

void loop_timer_fini(struct loop_timer *t)
{
	struct loop *l = t->loop;

	if (!l)
		return;
	pthread_mutex_lock(&l->lock);
	heap_remove(l, t);
	l->nr_timers--;
	tfd_update(l);
	pthread_mutex_unlock(&l->lock);
	t->loop = NULL;
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
	pthread_mutex_lock(&tclock.lock);
	atomic_fetch_add(&tclock.now_ms, ms);
	/* Each loop looks at its timers when it wakes (run_timers). */
	for (struct loop *l = tclock.loops; l; l = l->test_next)
		loop_kick(l);
	pthread_mutex_unlock(&tclock.lock);
}

uint64_t loop_now_ms(void)
{
	return tclock.on ? loop_test_now() : now_ms();
}

uint64_t loop_test_now(void)
{
	return atomic_load(&tclock.now_ms);
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
