/* SPDX-License-Identifier: MIT */
/*
 * The fake fabric: the fabric layer (struct fab_ops) in memory, for the
 * unit tests, registered with fab_open() as provider "fake" by fake_init().
 * It is built into a test-only archive (librtrs-fake.a); the shipped
 * library neither contains nor registers it.
 *
 * A client connection and a server connection of the same process are
 * joined by a fake address: the server listens on node:port (port 0 picks
 * one), a client's fab_open names host:port and connects. Memory is
 * registered with keys; a write is checked like a NIC checks it (the key
 * must be registered in the target's domain for remote write, the range
 * inside its region), and a bad one fails the connection at both ends.
 *
 * Nothing travels by itself. Every operation posted (a connection request,
 * an accept or reject, a write, a send, a completion asked for, a kick, a
 * connection going down) becomes an event in one queue, in the order it
 * was posted, and runs only when it is delivered: then its effect happens
 * (bytes are placed, the listener gets the request) and the owner's
 * callback runs on the delivering thread. A test delivers, drops,
 * duplicates or holds back each event; events it does not hold
 * (fake_hold) are delivered in order by the fake's pump thread, as a
 * network would. Callbacks of one connection never run at once, and never
 * after fab_con_shutdown() or once fab_con_destroy() has returned.
 *
 * Time: fake_init() turns on the service loops' test clock
 * (loop_test_clock), so their timers fire only when fake_advance() moves
 * that clock; fake_settle() waits until the loops and the pump have
 * nothing left to do. A scenario therefore never sleeps.
 *
 * Every wait here gives up after FAKE_WAIT_MS, logs what it waited for,
 * and reports the failure (a test that would hang fails instead).
 */
#ifndef RTRS_FABRIC_FAKE_H
#define RTRS_FABRIC_FAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rtrs-fabric.h"

#define FAKE_WAIT_MS 5000

extern const struct fab_ops fab_fake_ops;

enum fake_ev_kind {
	FAKE_CONNREQ = 1, /* a connection request on its way to the listener (0: none) */
	FAKE_ACCEPT,      /* the accept reaching the client: connected(accept data) */
	FAKE_ESTABLISHED, /* the server's end of an accepted connection: connected() */
	FAKE_REJECT,      /* a reject (or nobody listening) at the client: down(-ECONNREFUSED) */
	FAKE_WRITE,       /* an RMA write, with or without an immediate */
	FAKE_SEND,        /* a two-sided message */
	FAKE_DONE,        /* the completion the poster asked for: done(ctx) */
	FAKE_DOWN,        /* the connection is gone: down(err) */
	FAKE_KICK,        /* the owner's kick(), after fab_con_kick or fab_con_retry_later */
};

struct fake_ev {
	/* What the event is, for tests to match on (read only). */
	enum fake_ev_kind kind;
	bool to_server;      /* it runs at (travels to) the server's end */
	char sess[64];       /* the client connection's name up to '#': its session */
	char host[64];       /* the host the client connected to: which path */
	int cid;             /* the number after '#' in the client connection's name, or -1 */
	bool with_imm;
	uint32_t imm;
	const void *data;    /* a message, the bytes written, or connection data */
	size_t len;
	int err;             /* FAKE_DOWN */
	uint64_t seq;        /* posting order */

	/* The fake's own. */
	struct fake_ev *prev, *next;
	struct fab_con *to, *from;
	struct fake_lvec *lvec;  /* mr_local writes: the local vectors and descriptors, owned */
	size_t nr_lvec;
	void *ctx;           /* FAKE_DONE: the poster's; writes and sends: asked for */
	struct fab_rma rma[8];
	size_t rma_cnt;
	bool counted;        /* holds a slot of from's send queue */
	bool claimed;        /* a test holds a pointer to it: the pump leaves it alone */
	bool queued;         /* in the queue (else: a zombie, its connection gone) */
	void *buf;           /* data, owned */
};

struct fake_lvec {
	const char *buf;
	size_t len;
	const void *desc;
};

typedef bool (*fake_pred)(const struct fake_ev *ev, void *arg);

/* Registers provider "fake" and turns on the loops' test clock: before any loop exists. */
int fake_init(void);
/*
 * Stops the pump and frees what is left. Returns how many objects were
 * still there (connections, domains, listeners, registrations, events),
 * each logged: 0 when the library cleaned up after itself.
 */
int fake_fini(void);
/* The same count without freeing anything: to check between scenarios. */
int fake_leftovers(void);

/* Local limits of domains opened from now on (default 4 and 4). */
void fake_set_limits(size_t iov_limit, size_t rma_iov_limit);
/* Whether domains opened from now on send messages with immediates (default: yes, as RoCE). */
void fake_set_send_imm(bool on);
/*
 * Whether domains opened from now on need local memory registered, as
 * verbs does (default: no, as tcp): then every local vector of a write
 * must lie in a live registration of its descriptor, or the write fails
 * with -EFAULT. fake_local_regs: local registrations made so far.
 */
void fake_set_mr_local(bool on);
uint64_t fake_local_regs(void);
/*
 * Whether a client's writes from local registrations complete late from
 * now on, as when their acknowledgement is lost or late on RC (default:
 * no, at their delivery): such a write's send completes (its done(), and
 * the deregistrations fab_mr_dereg_after put behind it) only once a write
 * or message its peer posted after it arrived has been delivered, and
 * then, as a device sending it again reads them, its local vectors must
 * still lie in the live registrations of their descriptors; else the
 * connection fails as a local protection error fails it (down(-EFAULT),
 * logged), counted in local_prot_errs. Needs fake_set_mr_local.
 */
void fake_set_late_ack(bool on);
/*
 * Whether fab_write_left says a write waits in a queue from now on (as the
 * tcp fabric's does when its socket is full), so that its done() comes
 * once it has arrived; default: no, every byte left at once (*left true,
 * no completion).
 */
void fake_set_tx_queued(bool on);
/*
 * The next n registrations for remote access, in any domain, fail with
 * -ENOMEM (as a device out of memory or past the memlock limit); 0: none.
 */
void fake_fail_regs(unsigned n);
/*
 * Fabrics opened from now on have memory windows taking binds binds each
 * (fab_attr.win_binds; 0: none, the default). A bind takes effect when it
 * is posted, under a key never used in the domain; one with a context
 * completes through the owner's done(), as an unbind on verbs.
 */
void fake_set_windows(unsigned binds);

/*
 * Events matching pred are held for the test; the pump delivers the rest
 * in posting order (per connection in order; a held event does not hold
 * back the ones behind it). NULL: nothing held. Returns once the pump is
 * between deliveries. The predicates run under the fake's lock: they may
 * only look at the event.
 */
void fake_hold(fake_pred pred, void *arg);
bool fake_any(const struct fake_ev *ev, void *arg);

/*
 * The first queued event matching pred (NULL: any) in posting order, or
 * NULL; it is claimed: the pump leaves it alone until the test delivers
 * or drops it. May be called from a fake_wait condition.
 */
struct fake_ev *fake_find(fake_pred pred, void *arg);
/* The same, waiting for one to be posted; NULL (and a log line) after FAKE_WAIT_MS. */
struct fake_ev *fake_wait_ev(fake_pred pred, void *arg, const char *what);
/*
 * Delivers ev on this thread, waiting while its connection is in a
 * callback on another thread, and frees it. 0; -ENOBUFS: a message for a
 * connection without receive buffers yet (it stays queued, claimed);
 * -ENOTCONN: its connection is gone (ev is freed, nothing ran).
 */
int fake_deliver(struct fake_ev *ev);
/* ev never arrives (and no completion for it comes); freed. */
void fake_drop(struct fake_ev *ev);
/*
 * A copy of ev at the end of the queue, claimed: a duplicate, or a replay
 * later (NULL for a connection request). A claimed event's imm may be
 * changed before it is delivered, and a message's payload replaced
 * (fake_rewrite): a forgery.
 */
struct fake_ev *fake_dup(const struct fake_ev *ev);
int fake_rewrite(struct fake_ev *ev, const void *data, size_t len);
/* Lets the pump have a claimed event again. */
void fake_unclaim(struct fake_ev *ev);

/*
 * Runs fn(ev, arg) on the posting thread right after the first event that
 * matches pred(ev, pred_arg) is posted, before the posting call returns; ev is claimed
 * for fn. Once: the hook is cleared before fn runs. NULL pred clears it.
 * Posted means sent by a connection, requested (FAKE_CONNREQ) or rejected
 * (FAKE_REJECT, on the listener's thread); not the fake's own events
 * (downs, kicks, completions).
 */
void fake_on_post(fake_pred pred, void *pred_arg, void (*fn)(struct fake_ev *ev, void *arg),
		  void *arg);

/*
 * The connection is cut. Every live client connection matching sess, host
 * (NULL: any) and cid (-1: any), and the server end joined to it: what is
 * on its way between them is lost; the client end is told clt_err and the
 * server end srv_err (0: that end notices nothing by itself). Returns how
 * many connections were cut.
 */
int fake_fail(const char *sess, const char *host, int cid, int clt_err, int srv_err);
/* The next n writes posted on the matching connections' client (or server) end fail with -EAGAIN. */
int fake_eagain(const char *sess, const char *host, int cid, bool server, unsigned n);

/*
 * Waits until nothing happens by itself any more: no event the pump may
 * deliver, no callback running, every service loop idle. 0 or -ETIMEDOUT.
 */
int fake_settle(void);
/* Moves the loops' test clock on by ms, then settles. */
int fake_advance(unsigned ms);
/*
 * Waits until cond(arg) holds; it is checked again whenever anything is
 * posted or delivered, a loop goes idle, or fake_notify() is called (from
 * a test's own callbacks). cond runs under the fake's lock: of the fake it
 * may call only fake_delivered and fake_get_stats. 0 or -ETIMEDOUT.
 */
int fake_wait(bool (*cond)(void *arg), void *arg, const char *what);
void fake_notify(void);

/*
 * How many events matching pred have taken effect so far: delivered, or
 * for a connection request, handed to its listener. pred sees each as it
 * was, its data cut to the first 32 bytes.
 */
unsigned fake_delivered(fake_pred pred, void *arg);
void fake_delivered_reset(void);

struct fake_stats {
	uint64_t connreqs;   /* connection requests the listeners handed over */
	uint64_t connreqs_done; /* ... and their owner has answered */
	uint64_t accepts, rejects;
	uint64_t writes, sends; /* delivered */
	uint64_t bad_writes; /* writes refused for their key or range */
	uint64_t local_prot_errs; /* late_ack: a write completed from a registration gone */
	uint64_t dropped;    /* events dropped: by a test, or lost with their connection */
	uint64_t chains;     /* fab_post calls that posted more than one operation */
	uint64_t regs;       /* registrations with a remote key (fab_mr_reg) */
	uint64_t windows, binds; /* memory windows allocated, and their binds */
	unsigned cons, events;
};
void fake_get_stats(struct fake_stats *st);

#endif
