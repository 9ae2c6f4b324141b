/* SPDX-License-Identifier: MIT */
/*
 * A service loop: one thread blocked in epoll that runs fd handlers, timers
 * (timerfd) and queued work items. Sessions use it for heartbeats, path
 * failure handling and teardown, so none of that runs on completion threads.
 *
 * Rules: handlers run on the loop thread and may add/remove fds and timers.
 * Other threads may only queue work (loop_queue) and arm/disarm timers;
 * they must not remove fds while the loop runs.
 */
#ifndef RTRS_COMMON_LOOP_H
#define RTRS_COMMON_LOOP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct loop;

struct loop_fd {
	int fd;
	void (*cb)(struct loop_fd *h, uint32_t events);
	struct loop_fd *test_next;    /* the test clock's list of the loop's fds */
};

/*
 * A timer of a loop: one of the loop's heap, which one timerfd per loop
 * serves. A timer may fire up to slack_ms late, so that timers due close
 * together fire in one wake-up (loop_timer_slack; 0 by default).
 */
struct loop_timer {
	struct loop *loop;           /* NULL: not set up (zeroed), or finished */
	void (*cb)(struct loop_timer *t);
	uint64_t due_ns;             /* loop time it fires at (armed) */
	uint64_t deadline_ns;        /* due_ns + slack: the heap's order */
	unsigned period_ms;
	unsigned slack_ms;
	unsigned idx;                /* place in the heap; LOOP_TIMER_IDLE when not armed */
};
#define LOOP_TIMER_IDLE (~0u)

struct loop_work {
	struct loop_work *next;
	atomic_bool queued;
	void (*fn)(struct loop_work *w);
};

int loop_create(const char *name, struct loop **out);
/* Stops the thread (pending work is run first) and frees the loop. */
void loop_destroy(struct loop *l);
bool loop_in_thread(const struct loop *l);

/*
 * The process's shared service loops (LOOP_SHARED_MAX of them, made on
 * first use): a user that needs a loop for timers and failure handling,
 * such as a client session, takes the least used one, so that the threads
 * do not grow with the number of users. Handlers of one user then share
 * the thread with the others': they must not block for long. Before
 * loop_shared_put a user takes its fds and timers off (on the loop) and
 * makes sure none of its work is queued (loop_call is a barrier for work
 * queued before it); the last put stops the loop unless it comes from the
 * loop's own thread (the loop then stays, for the next user).
 */
#define LOOP_SHARED_MAX 2
int loop_shared_get(const char *name, struct loop **out);
void loop_shared_put(struct loop *l);
/* Users of each shared loop, for tests: n[i] of slot i; returns the slots. */
unsigned loop_shared_users(unsigned *n, unsigned max);

int loop_add_fd(struct loop *l, struct loop_fd *h, uint32_t events);
void loop_del_fd(struct loop *l, struct loop_fd *h);

/* Sets t up on l (it takes no fd); any thread. */
int loop_timer_init(struct loop *l, struct loop_timer *t, void (*cb)(struct loop_timer *t));
/* first_ms 0 disarms; period_ms 0 = one shot. Any thread. */
void loop_timer_arm(struct loop_timer *t, unsigned first_ms, unsigned period_ms);
/* How late t may fire, from its next arming on (heartbeats: a tenth of the interval). */
void loop_timer_slack(struct loop_timer *t, unsigned slack_ms);
/* Disarms t for good; on the loop thread while the loop runs (t->loop is NULL after). */
void loop_timer_fini(struct loop_timer *t);
static inline bool loop_timer_live(const struct loop_timer *t)
{
	return t->loop != NULL;
}

static inline void loop_work_init(struct loop_work *w, void (*fn)(struct loop_work *w))
{
	w->next = 0;
	atomic_init(&w->queued, false);
	w->fn = fn;
}

/* Queues w unless it is already queued; any thread. */
void loop_queue(struct loop *l, struct loop_work *w);
/* Runs fn(arg) on the loop thread and waits for it (not from the loop thread). */
void loop_call(struct loop *l, void (*fn)(void *arg), void *arg);

/*
 * Tests only (the fake fabric's scenarios): timers of every loop created
 * afterwards follow a clock that moves only in loop_test_advance(), and
 * idle (may be NULL) is called each time a loop is about to block with
 * nothing to do. Call before the first loop_create(); a process that never
 * calls it runs on CLOCK_MONOTONIC as always.
 */
void loop_test_clock(void (*idle)(void));
/* Moves the test clock on by ms: timers due by then fire (once each; slack is not used). */
void loop_test_advance(unsigned ms);
/* The test clock's time in ms (0 at loop_test_clock). */
uint64_t loop_test_now(void);
/*
 * The service loops' time in ms, from any thread: now_ms(), or the test
 * clock's when it is on. For deadlines a test must step with its timers.
 */
uint64_t loop_now_ms(void);
/* True when every loop is blocked with nothing ready and no work queued. */
bool loop_test_idle(void);

#endif
