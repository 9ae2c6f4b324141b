/* SPDX-License-Identifier: MIT */
/*
 * What a path and a connection are on both sides: the base objects that
 * the client's clt_path/clt_con and the server's srv_path/srv_con embed,
 * as the kernel's rtrs_clt_path and rtrs_srv_path embed its rtrs_path.
 *
 * A path has a state (changed only through rtrs_path_set_state, against
 * the table in rtrs.c), a lock that posting holds for reading and a state
 * change for writing, its heartbeat, its count of IO in flight and the
 * hand-off of a failure from any thread to its service loop. A connection
 * has its fabric endpoint, its heartbeat policing and the queue of items
 * (client requests, server responses) that met a full send queue, which
 * its completion thread posts again when the fabric kicks it.
 *
 * The side-specific parts come in through struct rtrs_path_ops.
 */
#ifndef RTRS_PATH_H
#define RTRS_PATH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/queue.h>

#include "rtrs-pri.h"

struct rtrs_path;
struct rtrs_con;

/* Something a connection posts that may have to wait for room. */
struct rtrs_pending {
	STAILQ_ENTRY(rtrs_pending) link;
	uint32_t id; /* the permit's or op's id, for the log */
};

STAILQ_HEAD(rtrs_pending_list, rtrs_pending);

struct rtrs_path_ops {
	const char *item;  /* what waits: "request" or "response", for the log */
	const char *peer;  /* "server" or "client", for the log */
	/*
	 * An immediate of the side's IO (requests on the server, responses on
	 * the client) arrived on con; false: not a type this side takes.
	 */
	bool (*io_imm)(struct rtrs_con *con, unsigned type, uint32_t payload);
	/* Posts what is left of it on con: 0, -EAGAIN (progress kept) or an error. */
	int (*post)(struct rtrs_con *con, struct rtrs_pending *it);
	/*
	 * it will not be posted: its post failed with err (not -EAGAIN), or
	 * the connection is gone (err 0). NULL: nothing to do, whoever owns
	 * it finds it in flight.
	 */
	void (*drop)(struct rtrs_con *con, struct rtrs_pending *it, int err);
	/* Service loop: the failure rtrs_path_fail handed over (fail_err). */
	void (*stop)(struct rtrs_path *p, int err);
	/*
	 * Any thread, before the hand-over: true when the failure is the
	 * business of another thread (the client's establishing thread while
	 * the path is CONNECTING), which this call has told. NULL: never.
	 */
	bool (*fail_elsewhere)(struct rtrs_path *p);
};

struct rtrs_con {
	struct rtrs_path *path;
	unsigned cid;
	struct fab_con *fc;
	struct rtrs_hb_rx hb_rx;    /* completion thread only */
	pthread_mutex_t pending_lock;
	struct rtrs_pending_list pending;
};

struct rtrs_path {
	const struct rtrs_path_ops *ops;
	/* For the log; may be renamed while threads log with it (the server's). */
	const char *_Atomic name;
	_Atomic enum rtrs_path_state state;
	pthread_rwlock_t post_lock; /* readers post; the writer changes state */
	_Atomic pthread_t post_writer; /* who holds post_lock for writing, else 0 */
	struct loop *loop;
	unsigned nr_cons;
	struct rtrs_con **cons;     /* the side's connection objects, cid order */
	struct rtrs_desc peer_imm;  /* where the peer lets us aim empty writes */
	struct rtrs_hb hb;
	struct loop_work fail_work;
	atomic_int fail_err;        /* the first failure since the path was (re)started */
	atomic_uint inflight;       /* IO of this path not answered yet */
};

/*
 * Sets the path up: ops, its service loop, name, and the state it starts
 * in; hb_cb is its heartbeat timer's callback (it calls rtrs_path_hb_tick
 * when connected). 0 or a negative errno.
 */
int rtrs_path_init(struct rtrs_path *p, const struct rtrs_path_ops *ops, struct loop *loop,
		   const char *name, enum rtrs_path_state state,
		   void (*hb_cb)(struct loop_timer *t));
/* Undoes rtrs_path_init (the timer first: nothing may run afterwards). */
/*
 * Starts the heartbeat timer at the path's interval. It may fire up to a
 * tenth of the interval late, so that the heartbeats of many paths of one
 * loop share its wake-ups.
 */
void rtrs_path_hb_arm(struct rtrs_path *p);
void rtrs_path_fini(struct rtrs_path *p);
/* cons[cid] of the side's array: set once, when the array is made. */
void rtrs_con_init(struct rtrs_con *con, struct rtrs_path *p, unsigned cid);
void rtrs_con_fini(struct rtrs_con *con);

static inline const char *rtrs_path_name(struct rtrs_path *p)
{
	return atomic_load_explicit(&p->name, memory_order_acquire);
}

/*
 * Takes and lets go of post_lock for writing: no request or response is
 * being posted on the path while it is held.
 */
void rtrs_path_wrlock(struct rtrs_path *p);
void rtrs_path_wrunlock(struct rtrs_path *p);

/*
 * A state change, checked against the table (rtrs_path_change_state in
 * rtrs.c) and made by compare-and-swap, so that two threads never both
 * move the path from one state. Entering or leaving CONNECTED asserts
 * that the caller holds post_lock for writing: posters check for
 * CONNECTED under the read lock, so none is still posting afterwards.
 */
bool rtrs_path_set_state(struct rtrs_path *p, enum rtrs_path_state to);

/*
 * Any thread: the path is broken with err; the first failure is kept, and
 * the service loop stops the path (ops->stop) unless ops->fail_elsewhere
 * says another thread deals with it.
 */
void rtrs_path_fail(struct rtrs_path *p, int err);
/* The path starts again: the next failure is a new one. */
static inline void rtrs_path_fail_reset(struct rtrs_path *p)
{
	atomic_store(&p->fail_err, 0);
}

/*
 * Shuts every connection down, then destroys them; after it no completion
 * thread of the path runs. Items still waiting go to ops->drop (err 0).
 * Service loop.
 */
void rtrs_path_destroy_cons(struct rtrs_path *p);

/*
 * One tick of the heartbeat timer of a connected path (service loop):
 * fails the path when the peer has been silent for too long, else sends
 * a heartbeat on connection 0.
 */
void rtrs_path_hb_tick(struct rtrs_path *p);

/* ---- connection callbacks shared by both sides (completion threads) ---- */

/*
 * fab_con_ops.imm: the peer is alive; heartbeats are policed and answered
 * (on a connected path), IO goes to ops->io_imm, and anything else, or a
 * peer breaking the heartbeat rules, loses the path (-EPROTO).
 */
void rtrs_con_imm(void *priv, uint32_t imm);
/* fab_con_ops.done: only heartbeat acks ask for a completion. */
void rtrs_con_done(void *priv, void *ctx);
/* fab_con_ops.kick: posts waiting items again, in order. */
void rtrs_con_kick(void *priv);

/* it met a full send queue: it waits on con, which is kicked. Any thread. */
void rtrs_con_pending_add(struct rtrs_con *con, struct rtrs_pending *it);
/* The same without the log: it for con's thread to post (ops->post) when kicked. */
void rtrs_con_queue(struct rtrs_con *con, struct rtrs_pending *it);

#endif
