/* SPDX-License-Identifier: MIT */
/*
 * Offload: a few worker threads, shared by the process, for work too slow
 * for a service loop or a poll group (a DH-HMAC-CHAP step: a Diffie-Hellman
 * exchange in ffdhe8192 costs about 150 ms of CPU). Workers are made when
 * jobs wait and none is free, up to half the CPUs but at least two (a
 * process that is client and server, as tests are, answers both sides at
 * once) and at most OFFLOAD_WORKERS_MAX, and end after OFFLOAD_IDLE_MS
 * without work: a process that offloads nothing has none.
 *
 * A job runs fn on a worker, then, under the pool's lock, is marked done and
 * notify runs (queue the owner's loop work: it must not block or call into
 * this module). Once it is marked done the worker reads nothing of the job
 * (notify gets its address), so once offload_take saw it done, or
 * offload_cancel returned (offload_cancel_nowait: true), the owner may
 * reuse or free the job and what fn worked on; a notify still running
 * holds the pool's lock, which offload_submit and both cancels wait for.
 * A job submitted again while fn runs (fn handed its result
 * over itself, and the next input came) runs again once fn returns, without
 * a notify in between.
 *
 * Fairness. A job has a class (offload_job_class; by default a class of its
 * own): jobs of one class run in the order they were submitted, and the
 * classes with jobs waiting take turns, one job each. A server gives a
 * path's handshake the class of the peer's address, so a host that opens
 * a thousand handshakes at once (a flood, or a storm of its own sessions)
 * has a worker for one job in each round, and a host with one handshake
 * waits behind at most one job of every other host, not behind all of
 * theirs.
 */
#ifndef RTRS_COMMON_OFFLOAD_H
#define RTRS_COMMON_OFFLOAD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define OFFLOAD_WORKERS_MAX 4
#define OFFLOAD_IDLE_MS 5000

enum offload_state {
	OFFLOAD_IDLE,    /* never submitted, cancelled, or done and seen */
	OFFLOAD_QUEUED,
	OFFLOAD_RUNNING,
	OFFLOAD_DONE,
};

struct offload_job {
	void (*fn)(struct offload_job *j);     /* on a worker */
	void (*notify)(struct offload_job *j); /* on the worker, under the pool's lock */
	struct offload_job *next;              /* the ring of classes (first jobs) */
	struct offload_job *more, *more_tail;  /* a first job's: its class's others */
	uint64_t cls;                          /* its class; 0: its own */
	_Atomic int state;                     /* enum offload_state */
	bool again;                            /* submitted while running (pool's lock) */
};

static inline void offload_job_init(struct offload_job *j, void (*fn)(struct offload_job *j),
				    void (*notify)(struct offload_job *j))
{
	j->fn = fn;
	j->notify = notify;
	j->next = NULL;
	j->more = j->more_tail = NULL;
	j->cls = 0;
	j->again = false;
	atomic_init(&j->state, OFFLOAD_IDLE);
}

/* Jobs of class cls share turns (not while j is queued or running). */
static inline void offload_job_class(struct offload_job *j, uint64_t cls)
{
	j->cls = cls;
}

/* A class for a name (a peer's address): FNV-1a, never 0. */
static inline uint64_t offload_class_of(const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 0x100000001b3ull;
	return h ? h : 1;
}

/*
 * Queues j; one already queued: -EBUSY; one running: it runs again after.
 * -EAGAIN when no worker exists and none can be made (the caller may run
 * fn itself).
 */
int offload_submit(struct offload_job *j);
/* True once fn has returned (notify may still run); the state goes back to idle. */
bool offload_take(struct offload_job *j);
/*
 * j is out of the pool when this returns: taken off the queue if it had not
 * started, waited for if it runs. Any thread but a worker.
 */
void offload_cancel(struct offload_job *j);
/*
 * The same without waiting (but for the pool's lock): true when j is out
 * of the pool (taken off the queue, or not in it); false while fn runs,
 * which it then finishes without running again: its notify says when.
 * For an owner that must not wait a DH exchange out (a service loop).
 */
bool offload_cancel_nowait(struct offload_job *j);
/*
 * j taken off the queue if it had not started: true, and it never runs
 * (no notify either: what it held for its worker is the caller's to let
 * go). False when it runs, is done, or was never queued. Any thread but a
 * worker.
 */
bool offload_dequeue(struct offload_job *j);
/* No job queued or running (the fake fabric's tests: nothing is still to come). */
bool offload_idle(void);
/*
 * Tests: fn runs (on the worker, no lock of this module held) each time the
 * pool becomes idle, so that a waiter for offload_idle() is woken.
 */
void offload_idle_hook(void (*fn)(void));
/* Workers alive now, for tests. */
unsigned offload_workers(void);
/* Jobs queued and not started, for tests. */
unsigned offload_queued(void);

#endif
