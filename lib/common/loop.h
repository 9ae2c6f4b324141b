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
};

struct loop_timer {
	struct loop_fd h;
	struct loop *loop;
	void (*cb)(struct loop_timer *t);
};

struct loop_work {
	struct loop_work *next;
	atomic_bool queued;
	void (*fn)(struct loop_work *w);
};

int loop_create(const char *name, struct loop **out);
/* Stops the thread (pending work is run first) and frees the loop. */
void loop_destroy(struct loop *l);
bool loop_in_thread(const struct loop *l);

int loop_add_fd(struct loop *l, struct loop_fd *h, uint32_t events);
void loop_del_fd(struct loop *l, struct loop_fd *h);

int loop_timer_init(struct loop *l, struct loop_timer *t, void (*cb)(struct loop_timer *t));
/* first_ms 0 disarms; period_ms 0 = one shot. */
void loop_timer_arm(struct loop_timer *t, unsigned first_ms, unsigned period_ms);
void loop_timer_fini(struct loop_timer *t);

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

#endif
