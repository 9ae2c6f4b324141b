/* SPDX-License-Identifier: MIT */
/*
 * Rate limits of the server (docs/rnbd.md section 2.7): a limit group per
 * session name, host name or device name, each with six token buckets
 * (IOPS and bytes per second; all, reads, writes), and one thread that
 * lets queued IO go as tokens come.
 *
 * An IO of a session and host with no active group, on a device with
 * none, never comes here (the server checks the three pointers).
 * Otherwise rnbd_qos_admit lets it go at once when it may, or queues it;
 * the thread hands it to the dispatch callback once it has passed every
 * group of it. It passes its session's group first, then its host's, then
 * its device's, taking each one's tokens as it passes it: an IO that its
 * session's limit holds claims nothing of its host or device meanwhile,
 * nor one its host's limit holds of its device.
 *
 * Fairness, within a group: IO of one direction passes in the order it
 * came. The shared buckets (iops, bps) serve both directions in the order
 * they came: an IO that waits for them, held by nothing of its own
 * direction, keeps every IO that came later from taking the tokens it
 * needs, so every held IO passes within a bounded time (its own tokens and
 * those of what waited before it, at the group's rates). An IO held by its
 * own direction's bucket (read_*, write_*) claims nothing meanwhile: a
 * write limit does not hold reads back, nor a read limit writes.
 * Groups are made by rnbd_qos_set and live as long as the context.
 *
 * Locks: ctx->lock guards every group's buckets and queue; the dispatch
 * callback runs on the thread without it.
 */
#ifndef RNBD_QOS_H
#define RNBD_QOS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>

#include "rnbd.h"

enum { RNBD_QOS_IOPS, RNBD_QOS_READ_IOPS, RNBD_QOS_WRITE_IOPS, RNBD_QOS_BPS, RNBD_QOS_READ_BPS,
       RNBD_QOS_WRITE_BPS, RNBD_QOS_NR };

/* One rate: tokens come at rate per second, up to the burst. */
struct rnbd_qos_bucket {
	uint64_t rate; /* 0: no limit */
	double tokens;
};

/* The burst of a rate: a tenth of a second's worth, at least one. */
double rnbd_qos_burst(uint64_t rate);
/* Tokens for dt_ns more, up to the burst. */
void rnbd_qos_refill(struct rnbd_qos_bucket *b, uint64_t dt_ns);
/*
 * Whether amount may go: tokens for it, or for the whole burst when it is
 * larger (a large IO waits for a full bucket, then leaves a debt).
 */
bool rnbd_qos_can(const struct rnbd_qos_bucket *b, uint64_t amount);
/* How long until rnbd_qos_can(b, amount), in ns (0: now). */
uint64_t rnbd_qos_wait_ns(const struct rnbd_qos_bucket *b, uint64_t amount);

struct rnbd_qos;
struct rnbd_qos_ctx;

/* The groups an IO passes, in order: its session's, its host's, its device's. */
#define RNBD_QOS_STAGES 3

/* An IO on its way: in the server's request slot. */
struct rnbd_qos_item {
	STAILQ_ENTRY(rnbd_qos_item) link;
	struct rnbd_qos *g[RNBD_QOS_STAGES]; /* its groups (session's, host's, device's), NULL where none */
	bool read;
	uint32_t bytes;
	const void *owner;           /* its session, for rnbd_qos_drop */
	const void *dev;             /* its device, for rnbd_qos_drop */
	/* The limits' own, under their lock. */
	unsigned stage;              /* g[stage]'s queue holds it */
	uint64_t seq;                /* when it came to that queue: the order of both directions */
	uint64_t queued_ns;
};

/*
 * The dispatch callback: err 0 (tokens taken: go) or -ENOTCONN (dropped:
 * answer it). Called without the limits' lock: it may admit IO.
 */
typedef void (*rnbd_qos_dispatch_fn)(struct rnbd_qos_item *it, int err);

int rnbd_qos_ctx_open(rnbd_qos_dispatch_fn dispatch, struct rnbd_qos_ctx **out);
/* Stops the thread; nothing may be queued any more. */
void rnbd_qos_ctx_close(struct rnbd_qos_ctx *ctx);

/* The group of kind and name, or NULL when no limit was ever set on it. */
struct rnbd_qos *rnbd_qos_find(struct rnbd_qos_ctx *ctx, enum rnbd_qos_kind kind,
			       const char *name);
/* Sets its limits (made if new): 0 or -ENOMEM / -EINVAL (a name too long or empty). */
int rnbd_qos_set(struct rnbd_qos_ctx *ctx, enum rnbd_qos_kind kind, const char *name,
		 const struct rnbd_qos_limits *l, struct rnbd_qos **out);
/* Any limit set? (An inactive group lets every IO go without the lock.) */
bool rnbd_qos_active(const struct rnbd_qos *g);
void rnbd_qos_get(struct rnbd_qos_ctx *ctx, const struct rnbd_qos *g, struct rnbd_qos_limits *l,
		  struct rnbd_qos_stats *st);
/* true: go now, tokens taken; false: queued, dispatched by the thread later. */
bool rnbd_qos_admit(struct rnbd_qos_ctx *ctx, struct rnbd_qos_item *it);
/*
 * Every queued item of owner (of owner and dev, unless dev is NULL) is
 * dispatched with -ENOTCONN, soon, by the thread. Only those queued now:
 * the caller first stops admitting IO of them, and whoever queued one
 * without seeing that stop drops it too (rnbd-srv.c's qos_admit).
 */
void rnbd_qos_drop(struct rnbd_qos_ctx *ctx, const void *owner, const void *dev);

#endif
