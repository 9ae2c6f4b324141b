/* SPDX-License-Identifier: MIT */
/*
 * Internals of the fake fabric (rtrs-fabric-fake.h), shared by its files:
 *   rtrs-fabric-fake-wire.c  the event queue, delivery (fk_ev_run), the pump;
 *   rtrs-fabric-fake-ctl.c   what a test does with the events and waits for;
 *   rtrs-fabric-fake.c       the fab_ops: domains, registrations, listeners,
 *                            connections, posting.
 *
 * One lock (fk_net.lock, fk_lock/fk_unlock) guards everything: the domains,
 * listeners, connections, registrations and the event queue. It is never
 * held while an owner's callback runs, so callbacks may post, register
 * and shut connections down as they do over a real fabric. fk_net.cond is
 * broadcast whenever anything changes, and when a service loop goes idle,
 * so that every wait of a test checks again what it waits for. Lines
 * logged under the lock (fk_log) wait until it is released: a test's log
 * sink may call fake_notify(), which takes it.
 */
#ifndef RTRS_FABRIC_FAKE_PRI_H
#define RTRS_FABRIC_FAKE_PRI_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "log.h"
#include "rtrs-fabric-fake.h"

#define FAKE_CM_DATA_MAX 56   /* connection data: as much as verbs carries */
#define FAKE_INJECT_SIZE 64
#define FAKE_KEY64_MIN (1ull << 32)
#define FAKE_PORT_MIN 20000

/* Takes obj out of the NULL-terminated list at *head, chained through its `next`. */
#define LIST_DEL(head, obj)                                                   \
	do {                                                                  \
		for (__typeof__(obj) *pp_ = (head); *pp_; pp_ = &(*pp_)->next) { \
			if (*pp_ == (obj)) {                                  \
				*pp_ = (obj)->next;                           \
				break;                                        \
			}                                                     \
		}                                                             \
	} while (0)

/* A delivered event, for fake_delivered: without its payload beyond the first bytes. */
struct fake_rec {
	struct fake_ev ev;
	uint8_t head[32];
};

struct fake_mr {
	struct fake_mr *next;
	char *buf;
	size_t len;
	unsigned access;
	uint64_t key;
};

/* A registration fab_mr_dereg_after left to go once the sends posted before it completed. */
struct fake_defer {
	struct fake_defer *next;
	struct fake_mr *mr;
	size_t len;
	uint64_t seq;                  /* fk_net.seq then: the last event posted before it */
};

/* late_ack: a write of ours that arrived and whose send has not completed. */
struct fake_ack {
	struct fake_ack *next;
	uint64_t seq;                  /* the write's */
	uint64_t after;                /* fk_net.seq at its arrival: completes after a later word */
	void *ctx;                     /* its done()'s */
	struct fake_lvec *lvec;        /* owned */
	size_t nr_lvec;
};

struct fab {
	const struct fab_ops *ops;     /* first: struct fab_obj */
	struct fab *next;
	struct fab_attr attr;
	bool server;
	char node[64], service[16], src[64];
	uint64_t next_key, next_key64;
	struct fake_mr *mrs;
};

struct fab_connreq {
	const struct fab_ops *ops;
	struct fab_connreq *next;
	struct fab_con *clt;           /* the end that asked; NULL once it is gone */
	void *data;
	size_t len;
	bool answered;
	char peer[96];
};

struct fab_lst {
	const struct fab_ops *ops;
	struct fab_lst *next;
	struct fab *fab;
	int fd;                        /* eventfd: readable while requests wait */
	int port;
	struct fab_connreq *inbox, *inbox_tail;
	struct fab_connreq *current;   /* handed to the owner's callback now */
};

struct fab_con {
	const struct fab_ops *ops;
	struct fab_con *next;
	struct fab *fab;
	struct fab_con_cfg cfg;
	char name[96];
	bool server;
	char sess[64], host[64];       /* the client end's, at both ends */
	int cid;
	unsigned serial;
	struct fab_con *peer;          /* the other end, while both exist */
	bool shutdown;                 /* by its owner: no callback any more */
	bool down;                     /* down() ran: nothing else runs */
	bool failed;                   /* cut (fake_fail, a bad write): data to and from it is lost */
	bool peer_told;                /* the peer has its DOWN for our going away */
	bool in_cb;                    /* a callback of ours runs on cb_thread */
	pthread_t cb_thread;
	bool kick_queued, retry;
	unsigned tx_out, tx_max;       /* writes posted and not delivered */
	unsigned eagain;               /* writes still to refuse (fake_eagain) */
	char *rx_buf;
	size_t rx_count, rx_size, rx_next;
	unsigned blocked_gen;          /* the pump's scan: an earlier event for us waits */
	struct fake_defer *defer;      /* fk_con_sent frees them */
	struct fake_ack *acks;         /* late_ack, oldest first */
};

struct fake_net {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool ready;
	struct fab *fabs;
	struct fab_lst *lsts;
	struct fab_con *cons;
	struct fake_ev *head, *tail;   /* the queue, in posting order */
	struct fake_ev *zombies;       /* claimed events whose connection went away */
	uint64_t seq;
	unsigned serial;
	int next_port;
	size_t iov_limit, rma_iov_limit;
	bool no_send_imm;           /* fabrics opened from now on lack fab_send_imm (iWARP) */
	bool mr_local;              /* fabrics opened from now on need local registrations (verbs) */
	bool late_ack;              /* fake_set_late_ack */
	bool tx_queued;             /* fake_set_tx_queued */
	uint64_t local_regs;        /* local registrations made (mr_local) */
	unsigned fail_regs;         /* the next remote registrations to fail (fake_fail_regs) */
	unsigned win_binds;         /* fabrics opened from now on have windows */
	fake_pred hold;
	void *hold_arg;
	fake_pred hook_pred;
	void *hook_pred_arg;
	void (*hook_fn)(struct fake_ev *ev, void *arg);
	void *hook_arg;
	pthread_t pump;
	bool pump_started, pump_stop, pump_busy;
	unsigned scan_gen;
	struct fake_stats st;
	struct fake_rec *recs;         /* what was delivered (fake_delivered) */
	size_t nr_recs, cap_recs;
};

extern struct fake_net fk_net;
extern const char *const fk_kind_names[];

/* The lock and the log (rtrs-fabric-fake-wire.c). */
void fk_lock(void);
void fk_unlock(void);
bool fk_locked(void);           /* by this thread */
void fk_log(enum log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct timespec fk_deadline(void); /* FAKE_WAIT_MS from now */

/* Events; all with the lock held. */
struct fake_ev *fk_ev_new(enum fake_ev_kind kind, struct fab_con *to, struct fab_con *from);
int fk_ev_set_data(struct fake_ev *ev, const void *data, size_t len);
void fk_ev_queue(struct fake_ev *ev);
void fk_ev_unlink(struct fake_ev *ev);
void fk_ev_free(struct fake_ev *ev);
/* A fabric event for c (down, kick, reject, ...); ENOMEM only loses it, logged. */
struct fake_ev *fk_ev_post_local(enum fake_ev_kind kind, struct fab_con *c, int err,
				 const void *data, size_t len);
void fk_ev_uncount(struct fake_ev *ev);
void fk_ev_discard(struct fake_ev *ev);
bool fk_ev_ready(const struct fake_ev *ev);
/* Runs ev, which is out of the queue; drops the lock around the callback; frees ev. */
void fk_ev_run(struct fake_ev *ev);
void fk_con_tell_peer(struct fab_con *c);
void fk_con_purge_to(struct fab_con *c);

/* Registrations (rtrs-fabric-fake.c); lock held. */
/* Whether [buf, buf + len) lies in desc, a live registration. */
bool fk_local_live(const void *buf, size_t len, const void *desc);
/*
 * A send of c completed, or will not (delivered, acknowledged, dropped):
 * the registrations deferred behind the sends that all have go.
 */
void fk_con_sent(struct fab_con *c);
/* c is gone: what it deferred goes, its writes' late completions never come. */
void fk_con_sent_all(struct fab_con *c);

/* Posting (lock held on entry, released on return). */
void fk_queue_and_hook(struct fake_ev *ev);
void fk_hook_and_unlock(struct fake_ev *ev);
/*
 * Lock not held: posts ev from c to its peer; ev is the fake's from here on.
 * fk_chain_resv: counted posts of this thread that fake_post made room for.
 */
extern __thread unsigned fk_chain_resv;
int fk_post_to_peer(struct fab_con *c, struct fake_ev *ev, bool counted);

/* The pump. */
struct fake_ev *fk_pump_next(void);
void *fk_pump_thread(void *arg);
void fk_loop_idle(void);

#endif
