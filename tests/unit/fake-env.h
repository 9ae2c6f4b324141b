/* SPDX-License-Identifier: MIT */
/*
 * What the fake-fabric scenarios (test-fake*.c) share: an RTRS server in
 * the same process that serves a memory area (each request's user header
 * says where), clients with paths named by host ("a", "b", ...), requests
 * that remember how often and how they completed, event matchers, and a
 * log capture that wakes the fake's waits on every line. Everything runs
 * over the fake fabric (lib/rtrs/rtrs-fabric-fake.h) with the loops' test
 * clock: nothing here sleeps.
 */
#ifndef RTRS_TEST_FAKE_ENV_H
#define RTRS_TEST_FAKE_ENV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "rtrs.h"
#include "rtrs-fabric-fake.h"
#include "rtrs-proto.h"

#define LEN 4096
#define AREA (64 * LEN)
#define HOST_NQN "nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-0000-4000-8000-00000000f001"
#define SERVER_NQN "nqn.2026-11.io.rtrs:fake-server"
#define HB_MS 1000          /* the heartbeat of whichever side a scenario watches */
#define HB_NEVER 3600000    /* ... and of the other: it never ticks */
#define RECONNECT_MS 100

extern const char *const KEY_A;
extern const char *const KEY_B;

/* ---- the server ---------------------------------------------------------------------- */

struct srv_env {
	struct rtrs_srv_ctx *ctx;
	int port;
	uint8_t area[AREA];
	atomic_int rdma_evs;          /* IO handed to rdma_ev */
	atomic_int link_up, link_down;
	atomic_int ext_sessions, kernel_sessions; /* up, by what their client speaks */
	atomic_int refuse;            /* link_ev(CONNECTED) answers this */
	/* Deferring: rdma_ev keeps the ops here instead of answering. */
	atomic_bool defer;
	struct rtrs_srv_op *_Atomic deferred[16];
	atomic_int nr_deferred;       /* counted before the slot is filled: see srv_held() */
	atomic_int answer_then_fail;  /* rdma_ev answers 0, then returns this (a buggy user) */
	char keys_path[256];
};

extern struct srv_env srv;

/*
 * How many ops the server's user holds that a scenario can answer: the
 * filled slots of srv.deferred from the first (rdma_ev counts an op in
 * nr_deferred before it stores it).
 */
int srv_held(void);

/* Options a scenario starts from: queue depth 16, 16 KiB chunks, heartbeats off. */
void srv_opts(struct rtrs_srv_opts *so);
/* With authentication: the key file lists HOST_NQN with key. */
void srv_opts_auth(struct rtrs_srv_opts *so, const char *key);
void srv_write_keys(const char *key);
/* Opens it and lets it listen (the test clock moves 1 ms). 0 or the error. */
int srv_start(const struct rtrs_srv_opts *so);
void srv_stop(void);
struct rtrs_srv_stats srv_stats(void);

/* ---- clients -------------------------------------------------------------------------- */

struct clt {
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa[4];
	char dst[4][64];
	char src[4][64];
	struct rtrs_clt_sess *sess;
	pthread_t thr;
	bool thr_started;
	atomic_int rc;
	atomic_bool opened;
	atomic_int path_up, path_down;
	size_t open_mark;   /* the log from clt_open_async on */
};

/*
 * A session named name with one path per letter of hosts ("ab": paths to
 * hosts a and b), one IO connection, reconnects after RECONNECT_MS, and a
 * heartbeat that never ticks unless a scenario changes it.
 */
void clt_init(struct clt *c, const char *name, const char *hosts);
/* The source address of path i (for the server's per-peer limits). */
void clt_src(struct clt *c, unsigned i, const char *src);
/* rtrs_clt_open, moving the test clock on while it waits for a timer (clt_open_join). */
int clt_open(struct clt *c);
/* rtrs_clt_open on a thread of its own (a scenario steps its handshake). */
void clt_open_async(struct clt *c);
int clt_open_join(struct clt *c);
void clt_close(struct clt *c);
/* The end of a scenario: everything goes, c closes, the server stops. fake_settle's result. */
int env_teardown(struct clt *c);
/* State and statistics of path idx. */
struct rtrs_path_stats clt_path(struct clt *c, unsigned idx);
bool clt_path_is(struct clt *c, unsigned idx, const char *state);

/* ---- requests --------------------------------------------------------------------------- */

struct io {
	struct clt *c;
	struct rtrs_permit *permit;
	enum rtrs_dir dir;
	uint32_t off;
	size_t len;
	uint8_t buf[LEN];
	atomic_int calls;            /* conf calls: exactly one, or a bug */
	atomic_int err;
};

/* Takes a permit and sends; a write carries a pattern made from seed. The submit error. */
int io_start(struct io *io, struct clt *c, enum rtrs_dir dir, enum rtrs_clt_con_type type,
	     uint32_t off, size_t len, uint8_t seed);
/* The same with the caller's data vectors (io->buf unused). */
int io_startv(struct io *io, struct clt *c, enum rtrs_dir dir, enum rtrs_clt_con_type type,
	      uint32_t off, const struct iovec *d, size_t cnt);
/* Waits for conf; its error (-ETIMEDOUT if it never came). */
int io_wait(struct io *io);
void io_put(struct io *io);
/* start, wait, put. */
int io_sync(struct clt *c, enum rtrs_dir dir, uint32_t off, size_t len, uint8_t seed);
/* Writes a pattern at off and reads it back over c: true when every byte came back. */
bool io_roundtrip(struct clt *c, uint32_t off, uint8_t seed);
void pattern(uint8_t *p, size_t n, uint8_t seed);
/* The server's area holds the pattern of seed at off. */
bool area_has(uint32_t off, size_t len, uint8_t seed);

/* ---- events ------------------------------------------------------------------------------- */

/*
 * An event matcher for fake_pred match(): fields left 0 match anything.
 * Values that can be 0 are stored plus one: use the macros.
 */
struct m {
	int kind;                    /* FAKE_* */
	int dir;                     /* TO_SRV or TO_CLT */
	const char *host, *sess;
	int cid;                     /* CID(n) */
	int imm;                     /* IMM(type): a write with this immediate type */
	int msg;                     /* MSG(type): a message of this RTRS type */
	int auth;                    /* AUTH(id): an authentication message of this id */
};
#define TO_SRV 1
#define TO_CLT 2
#define CID(n) ((n) + 1)
#define IMM(t) ((t) + 1)
#define MSG(t) ((t) + 1)
#define AUTH(t) ((t) + 1)

bool match(const struct fake_ev *ev, void *arg);
/* The immediate type of a write, or -1. */
int ev_imm_type(const struct fake_ev *ev);

/*
 * Delivers queued events one by one, in posting order, until one matching
 * pred is posted: that one is returned claimed and undelivered (NULL if
 * none came). For scenarios that hold everything (fake_hold(fake_any)).
 */
struct fake_ev *step_until(fake_pred pred, void *arg, const char *what);
/*
 * Holds every event, opens c on a thread of its own and steps its
 * handshake (step_until) to the first event matching pred.
 */
struct fake_ev *open_step_to(struct clt *c, fake_pred pred, void *arg, const char *what);
/*
 * The same, then cuts c's connection cid at both ends (-ECONNRESET) and
 * lets everything go but the connection request (cid 0) of the open's
 * next attempt, which it waits for and returns claimed: rtrs_clt_open,
 * which had its answer from the server, starts a dropped path again
 * (NULL and a log line if it did not). With drop, the event stepped to is
 * lost first. The test looks at what the first attempt left, then
 * open_resume.
 */
struct fake_ev *open_cut_at(struct clt *c, fake_pred pred, void *arg, const char *what, int cid,
			    bool drop);
/*
 * Lets everything go but the connection request (cid 0) of an open's next
 * attempt: waits for it and returns it claimed (NULL if none came), once
 * the first attempt has settled.
 */
struct fake_ev *hold_open_retry(void);
/* Lets the held attempt (may be NULL) and everything else go; what rtrs_clt_open returned. */
int open_resume(struct clt *c, struct fake_ev *retry);
/* Waits until an event matching pred is queued; leaves it where it is. */
bool ev_appears(fake_pred pred, void *arg, const char *what);

/* ---- the scenario's frame -------------------------------------------------------------------- */

/* Log lines go to the capture (logcap.h) and wake the fake's waits. */
void env_log_sink(void *priv, int level, const char *line);
/* Logged since the scenario began; how many times. */
bool env_logged(const char *s);
unsigned env_log_count(const char *s);
void env_log_dump(void);
/*
 * A scenario starts from a clean frame: counters, the area, what was
 * delivered, and client and server speaking this project's protocol.
 */
void env_reset(void);

#endif
