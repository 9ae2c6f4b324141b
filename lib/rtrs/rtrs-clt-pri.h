/* SPDX-License-Identifier: MIT */
/*
 * The client's internal objects and what its files (rtrs-clt.c,
 * rtrs-clt-io.c, rtrs-clt-connect.c, rtrs-clt-recovery.c) call of each
 * other. Nothing here is public: include/rtrs.h is.
 */
#ifndef RTRS_CLT_PRI_H
#define RTRS_CLT_PRI_H

#include "rtrs-auth-sm.h"
#include "offload.h"
#include "rtrs-path.h"

struct rtrs_permit {
	uint32_t id;
	enum rtrs_clt_con_type con_type; /* admin permits use connection 0 */
	bool in_use;
};

enum clt_req_state { REQ_IDLE, REQ_INFLIGHT, REQ_DONE };

struct clt_con;
struct clt_req;

STAILQ_HEAD(clt_req_list, clt_req);

/*
 * The fence of a failed path whose requests wait to fail over
 * (rtrs-clt-fence.c, docs/protocol.md section 10). Changes are
 * compare-and-swap, except FENCE_DONE, which nothing leaves but the
 * path's next failure (clt_fence_reset, on the loop) and, after an error
 * answer, the fence's retry RTRS_FENCE_RETRY_MS later (quarantine_process,
 * on the loop).
 */
enum clt_fence_state {
	FENCE_NONE,  /* none out: the next pass sends one over another path */
	FENCE_SENT,  /* out, carried by the path whose fence_for this is */
	FENCE_DONE,  /* answered (fence_err), or implied by the path's reconnect */
};

/* A fence the server answered with an error is sent again after this long (quarantined permits). */
#define RTRS_FENCE_RETRY_MS 1000
/* A quarantined permit used again waits this long for its fence at least (rtrs_clt_request). */
#define RTRS_QUARANTINE_WAIT_MS 1000

struct clt_req {
	struct rtrs_clt_sess *sess;
	uint32_t id;
	atomic_int state;
	enum rtrs_dir dir;
	struct rtrs_clt_req_ops ops;
	enum rtrs_clt_con_type con_type;
	struct clt_path *path;
	struct clt_con *con;
	uint32_t usr_len;
	uint32_t data_len;
	uint32_t hdr_len;           /* user header + rtrs header in the slot */
	size_t data_cnt;
	unsigned nr_mrs;
	/*
	 * A read of several vectors from a kernel server, which takes one
	 * descriptor: the data lands in the permit's bounce buffer (the
	 * session's, max_io_size bytes) and is copied out on success.
	 */
	bool bounced;
	/*
	 * The write that carries the immediate is posted (req_post): only
	 * then may a response come. One for a request still waiting for
	 * room in its send queue is the server's error, not a completion.
	 */
	atomic_bool sent;
	/*
	 * A write posted with fab_write_left (tcp): the response completes
	 * it only once its data has left (REQ_TX_LEFT, from the poster or
	 * from done(&tx_ctx)), as the fabric reads the caller's buffers until
	 * then; whichever of the two comes second completes it, with the
	 * response's errno kept in the word (REQ_TX_ERR_SHIFT). Set before
	 * sent.
	 */
	bool wait_left;
	/*
	 * Its response came before its poster saw the data leave: completed
	 * from the connection's pending queue (clt_post_pending), where
	 * completions run, not inside rtrs_clt_request.
	 */
	bool complete_due;
	atomic_uint tx_state;
	char tx_ctx;                /* its address: the write's completion context */
	size_t next_iov;            /* posting progress after -EAGAIN */
	uint64_t next_off;
	/* The arrays come after the fields every IO touches: those share the head's lines. */
	struct iovec data[RTRS_MAX_SEGMENTS];
	struct fab_mr mrs[RTRS_MAX_SEGMENTS];
	struct rtrs_pending pend;   /* waits for room in con's send queue */
	STAILQ_ENTRY(clt_req) wait_link; /* on waiting (path == NULL) or fencing */
	uint64_t wait_deadline_ms;
	struct clt_path *fence_path; /* failed over from it: waits for its fence */
	/*
	 * Failed while the server may still hold its chunk, or with its key
	 * stale (the response that carried the new one lost): its permit is
	 * not given out again until this path is fenced (clt_req_quarantine).
	 * Written before the completion, read under permit_lock.
	 */
	struct clt_path *quarantine;
};

#define REQ_TX_RSP 1u        /* its response came */
#define REQ_TX_LEFT 2u       /* its data left */
#define REQ_TX_ERR_SHIFT 8   /* the response's -errno, above the bits */

struct clt_con {
	struct rtrs_con c;
	struct clt_path *path;
	bool connected;             /* under path->lock */
	int err;                    /* under path->lock: why it went down */
	struct rtrs_conn_rsp rsp;   /* cid 0: what the server accepted with */
	bool concat;                /* cid 0 of a secure channel concatenation: its end ends nothing */
	/*
	 * kinval: the RKEY_RSP of the message the immediate in hand came
	 * with (recv, then imm, on the completion thread); rkey_buf_id
	 * UINT32_MAX when none.
	 */
	uint32_t rkey_buf_id;
	uint32_t rkey;
	/*
	 * Requests issued on it and not completed: a poll round reads only
	 * the queues of those with some (rtrs_clt_poll). Set to 0 when the
	 * path joins the poll set; a path's teardown leaves it as it is.
	 */
	atomic_uint inflight;
};

struct clt_open_job;

struct clt_path {
	struct rtrs_path base;       /* state, post lock, heartbeat, failure, cons */
	struct rtrs_clt_sess *sess;
	unsigned idx;
	char name[528];             /* "sess/host:port"; rtrs_path_stats.name */
	char host[256], port[8];
	char src[256];              /* empty: any */
	uint8_t uuid[RTRS_UUID_LEN];
	struct fab *fab;
	struct clt_con *cons;       /* base.nr_cons of them; base.cons points at each */
	struct rtrs_desc *rbufs;    /* one per chunk */
	uint32_t *info_gens;        /* key generations of an info response */
	/*
	 * Where the server aims empty writes; with always_invalidate also the
	 * key slots (one per chunk) and the table written before a fence ack.
	 */
	char *imm_area;
	size_t imm_len;
	struct fab_mr imm_mr;
	struct fab_mr hdr_mr;       /* the session's header area in this domain */
	struct rtrs_msg_info_req info_req;
	struct fab_mr info_req_mr;
	uint16_t recon_cnt;         /* sent in conn_req; 1 on the first connect, as the kernel */
	/*
	 * Connection 0 was accepted once (the kernel's for_new_clt): from then
	 * on the path's requests carry RTRS_CONN_FIRST, so it may set the
	 * session up again at a server that lost it. first_sent: this
	 * attempt's did.
	 */
	bool connected_once;
	bool first_sent;
	/*
	 * Establishing the path: a state machine on the service loop
	 * (rtrs-clt-connect.c). lock guards what the connections' callbacks
	 * hand over (cons[].connected and .err, info_*, auth_rx*) and the
	 * verdict an opener waits for on cond (conn_done, conn_rc).
	 */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned cst;               /* enum clt_cst: the attempt's step (loop thread) */
	unsigned cst_cid;           /* the connection CST_CON waits for */
	struct loop_work conn_work; /* a callback's news: path_step */
	struct loop_timer conn_timer; /* the step's deadline, connect_timeout_ms */
	bool opening;               /* rtrs_clt_open or _add_path waits (loop thread) */
	int open_attempt;           /* ... and this is its attempt number, of open_tries */
	int open_tries;
	int fab_open_rc;            /* the opener's fab_open failed so (clt_path_open) */
	/*
	 * The fabric is no good any more: its device went while the path was
	 * up (-ENODEV), or an attempt could not register on it. The next
	 * attempt closes it and opens another (CST_OPEN).
	 */
	atomic_bool fab_lost;
	/*
	 * CST_OPEN: a fabric opened again on an offload worker (after its
	 * device went), shared with the worker (rtrs-clt-connect.c). An attempt
	 * ended by force lets go of it without waiting; the path keeps it
	 * while it runs, so that the next attempt waits for it, not for a
	 * second one. NULL: none. Loop thread, and path_fini.
	 */
	struct clt_open_job *open_job;
	bool attempt_counted;       /* a reconnect in clt_reconnects_running */
	bool conn_done;             /* the opener's verdict, conn_rc, is in */
	int conn_rc;
	char conn_detail[512];      /* ... and the loop's err_detail for it */
	bool info_done;
	int info_err;
	/*
	 * RTRS_TLS_CONCAT: the attempt authenticates on a connection in the
	 * clear first (concat_phase), then opens the path with TLS under the
	 * PSK that exchange generated (path_concat_switch).
	 */
	bool concat_phase;
	/* Authentication: the step CST_AUTH runs it; cid 0 hands messages over. */
	struct rtrs_auth_txn auth;
	bool auth_active;           /* auth holds a transaction (path_auth_end wipes it) */
	uint16_t auth_tid;
	char auth_tx[RTRS_AUTH_MSG_MAX];
	struct fab_mr auth_tx_mr;
	/*
	 * Under lock: the server's messages waiting, in order (auth_rx_n).
	 * An attempt takes one at a time: a second is a protocol error. A
	 * connected path may have two: a re-authentication's SUCCESS1 and the
	 * server's next request to authenticate again, sent right after it
	 * (the key file was reloaded while that transaction ran).
	 */
	char auth_rx[2][RTRS_AUTH_MSG_MAX];
	size_t auth_rx_len[2];
	unsigned auth_rx_n;
	/*
	 * CST_AUTH_CALC: the server's message in auth_msg is answered on an
	 * offload worker (a DH exchange is too slow for the loop): the job
	 * owns auth, auth_tx and the results below until the loop takes it.
	 */
	struct offload_job auth_job;
	char auth_msg[RTRS_AUTH_MSG_MAX];
	size_t auth_msg_len;
	int auth_step;              /* enum rtrs_auth_step, the job's verdict */
	size_t auth_out_len;        /* bytes of auth_tx to send */
	char auth_detail[512];      /* the job's err_detail, for the loop's (rtrs_last_error) */
	/*
	 * Re-authentication of the connected path, asked by the server
	 * (RTRS_AUTH_REAUTH): reauth while it runs, driven by reauth_work on
	 * the loop and reauth_job on an offload worker, with auth, auth_tx,
	 * auth_rx, auth_msg and the job's results as an attempt has them (no
	 * attempt runs on a connected path). auth_cfg: the session's settings
	 * as this path's transactions use them, copied under the session's
	 * auth_lock (a re-authentication reads the secrets' files again).
	 */
	bool reauth;
	struct loop_work reauth_work;
	struct offload_job reauth_job;
	struct rtrs_auth_cfg auth_cfg;
	/* The reconnect decision's inputs and its last verdict. */
	atomic_bool fail_dnr;       /* do not retry: the server said so, or it changed */
	atomic_int refused_err;     /* the errno the server first refused this attempt with */
	atomic_bool reached;        /* this attempt had an RTRS answer (accept or refusal) */
	atomic_int last_err;
	atomic_int verdict;         /* enum rtrs_reconnect_verdict; -1: none yet */
	atomic_uint_fast64_t stat_auth_runs;
	/* Reconnect: the timer (loop) starts an attempt; an open's next try too. */
	struct loop_timer reconnect_timer;
	atomic_int attempts;        /* failed reconnect attempts in a row */
	atomic_uint_fast64_t down_since_ms; /* when it last failed (loss timeout) */
	atomic_bool keep_closed;    /* disconnected by the user */
	/*
	 * rtrs_clt_reconnect_path: at least one attempt, even with a budget of
	 * none (max_reconnect_attempts 0); until the path is up or given up.
	 */
	atomic_bool by_hand;
	atomic_bool removed;        /* rtrs_clt_remove_path: the slot stays, closed */
	/* Fencing (docs/protocol.md section 10). */
	bool srv_fence;             /* the server answers fences */
	struct rtrs_msg_fence fence_msg; /* a fence sent over this path */
	struct fab_mr fence_mr;
	_Atomic(struct clt_path *) fence_for; /* the failed path this one carries a fence for */
	_Atomic enum clt_fence_state fence; /* this path's own fence, once it failed */
	atomic_int fence_err;       /* the server's answer, set before FENCE_DONE */
	uint64_t fence_err_ms;      /* ... when it came, if an error (loop thread) */
	/*
	 * recon_cnt of the last attempt that got through (-1: none yet), and
	 * the incarnation this path's fence names: the one whose requests
	 * wait, taken at its failure (a failed attempt after it keeps it).
	 */
	atomic_int live_recon;
	atomic_int fence_recon;
	/*
	 * As a carrier: the ack of the fence it carries came (fence_ack_err,
	 * written before), for the loop to take (fence_acks_take): only the
	 * loop, where failures reset fences, can tell whether the ack is for
	 * the incarnation the fenced path waits on now.
	 */
	atomic_bool fence_acked;
	int fence_ack_err;
	atomic_uint_fast64_t stat_reconnects, stat_reconnect_failures, stat_failovers;
	atomic_uint_fast64_t stat_reads, stat_writes, stat_read_bytes, stat_write_bytes;
	/* The session's registered regions on this path's fabric (rtrs-clt-mem.c). */
	struct fab_mr mem_mrs[RTRS_CLT_MEM_MAX];
	bool mem_ready;             /* under sess->mem_lock: mem_mrs are p->fab's */
	/* Its IO connections are in the session's poll set (under sess->poll_lock). */
	bool polled;
	bool poll_fds_in;           /* ... and their wait fds in poll_epfd */
};

struct rtrs_clt_sess {
	char name[RTRS_NAME_MAX + 1];
	uint8_t paths_uuid[RTRS_UUID_LEN];
	char provider[32];
	uint16_t port;
	unsigned nr_io_cons;
	unsigned hb_interval_ms, hb_missed_max, connect_timeout_ms;
	/* rtrs_clt_set_reconnect changes these while paths read them. */
	atomic_uint reconnect_delay_ms, reconnect_jitter_ms;
	atomic_uint reconnect_loss_timeout_ms;
	atomic_int max_reconnect_attempts;
	bool wait_timer_ready;
	void (*link_ev)(void *priv, enum rtrs_clt_link_ev ev);
	void (*path_ev)(void *priv, unsigned idx, int up);
	void *priv;
	atomic_bool opened;         /* link events only after rtrs_clt_open */
	struct loop *loop;

	/* Limits from the first path's connect response; fixed afterwards. */
	uint32_t queue_depth, max_io_size, max_hdr_size, chunk_size;

	pthread_mutex_t permit_lock;
	pthread_cond_t permit_cond;
	uint32_t *free_ids;
	uint32_t nr_free;
	uint32_t *quar_ids;         /* permits put back while quarantined (clt_quarantine_process) */
	uint32_t nr_quar;
	atomic_uint quar_n;         /* nr_quar, read without permit_lock: keeps the wait timer */
	unsigned permit_waiters;    /* close waits until they have left */
	atomic_bool closing;        /* read anywhere; waiters use permit_cond */
	struct rtrs_permit *permits;
	struct clt_req *reqs;
	char *hdr_area;             /* queue_depth slots of max_hdr_size */

	struct clt_path *paths;
	_Atomic size_t paths_num;   /* published paths; slots for all 128 exist */
	pthread_mutex_t admin_lock; /* add/remove path */
	atomic_uint paths_up;
	/* When paths_up last fell to 0 (now_ms): a slot's wait without a path is bounded from it. */
	_Atomic uint64_t no_path_ms;
	_Atomic enum rtrs_mp_policy mp_policy;
	atomic_uint rr_cursor;

	/* Authentication settings, secrets included (wiped at close). */
	struct rtrs_auth_cfg auth;
	/* auth's keys, changed by a re-authentication that read them again from: */
	pthread_mutex_t auth_lock;
	char *auth_secret_file, *auth_ctrl_file;  /* "@PATH" or "file:PATH" as given; NULL: inline */
	/*
	 * TLS (opts.tls): every path's fabric gets it (NULL: none), under
	 * auth_lock. tls_derived: its PSK comes from auth.hkey, so a
	 * re-authentication that read a new secret makes a new one.
	 */
	struct rtrs_tls_ctx *tls;
	bool tls_derived, tls_no_ktls;
	bool tls_concat;            /* RTRS_TLS_CONCAT: each attempt of a path generates its PSK */
	/*
	 * The server is of this project (RTRS_MSG_EXT_F), known from the
	 * first path and the same for all: without, it is a kernel server
	 * and the session speaks the kernel's protocol (no fencing, no
	 * authentication, no verdicts, one descriptor per read).
	 */
	bool srv_ext, srv_ext_known;
	atomic_bool ever_accepted;  /* some path's connection 0 was accepted once */
	atomic_uint paths_removed;  /* rtrs_clt_remove_path: slots that stay, closed */
	char **bounce;              /* per permit, made at its first bounced read */
	/*
	 * always_invalidate (the server's KEY64_F): chunk keys are the
	 * session's, each with its generation; the newest seen wins.
	 */
	bool inval, inval_known;
	/*
	 * The kernel's always_invalidate (a kernel server's NEW_RKEY_F): each
	 * path has a key per chunk (rbufs), replaced by the RKEY_RSP that
	 * comes with each response. Fixed by the first path, with inval.
	 */
	bool kinval;
	uint64_t srv_sess_id;       /* the server incarnation the keys come from */
	atomic_uint_fast64_t srv_sessions; /* incarnations met: rtrs_attrs.server_sessions */
	_Atomic uint64_t *rkeys;    /* read by posters without rkey_lock */
	uint32_t *rkey_gens;
	pthread_mutex_t rkey_lock;

	/* Registered memory for writes (rtrs_clt_mem_register): slots with len 0 are free. */
	struct { char *buf; size_t len; } mem[RTRS_CLT_MEM_MAX];
	atomic_uint nr_mem;
	pthread_rwlock_t mem_lock;  /* mem, and every path's mem_mrs and mem_ready */

	/*
	 * rtrs_clt_poll: the poller the IO connections of every connected
	 * path are given, the lock a poll round and the set's changes take,
	 * the epoll set of their wait fds and an eventfd in it that
	 * completions elsewhere write while a poller waits.
	 */
	struct fab_poller poller;
	pthread_mutex_t poll_lock;
	int poll_epfd, poll_wake_fd;
	atomic_uint_fast64_t poll_seq;  /* completions run elsewhere (clt_poll_nudge) */
	atomic_uint_fast64_t poll_seen; /* ... as of rtrs_clt_poll's last return */
	atomic_bool poll_wake_set;      /* poll_wake_fd written since its last read (wait_end) */
	atomic_bool poll_unsupported;   /* a path's queues have no wait fds: no polled mode */

	/* Requests waiting for a path, bounded by fast_io_fail_ms (rtrs_clt_set_reconnect). */
	atomic_uint fast_io_fail_ms;
	unsigned busy_poll_us;
	pthread_mutex_t wait_lock;
	struct clt_req_list waiting; /* for a path, oldest first */
	struct clt_req_list fencing; /* in flight on a failed path, awaiting its fence */
	struct loop_timer wait_timer;
	struct loop_work wait_work;

	/* The process's sessions, for rtrs_clt_shutdown_all (under its lock, rtrs-clt.c). */
	struct rtrs_clt_sess *all_next, **all_prev;
	struct clt_path *adding;    /* a path rtrs_clt_add_path is connecting */
	/*
	 * rtrs_clt_add_path is connecting one, not published yet: requests
	 * may wait for it (clt_sess_path_may_come), since its link events
	 * (SERVER_SESSION, RECONNECTED) come before it is published.
	 */
	atomic_bool add_pending;
};

/* rtrs-clt-io.c */
/*
 * Deregisters what req registered for its data: a write's regions once the
 * sends posted on fc so far have completed (fab_mr_dereg_after: the device
 * may send the write again from them after its response came), a read's,
 * and any with fc NULL (nothing posted, or the connection gone), at once.
 */
void clt_req_release_mrs(struct clt_req *req, struct fab_con *fc);
bool clt_req_complete(struct clt_req *req, int err);
/* rtrs-clt-io.c: a connected path's IO connections into the poll set, and out. */
void clt_path_poll_enroll(struct clt_path *p);
void clt_path_poll_leave(struct clt_path *p);
void clt_sess_key_update(struct rtrs_clt_sess *s, uint32_t id, uint32_t gen, uint64_t key);
int clt_path_keys_merge(struct clt_path *p, size_t off);
int clt_post_pending(struct rtrs_con *con, struct rtrs_pending *it);
void clt_req_wait(struct clt_req *req);
int clt_req_route(struct clt_req *req, bool accepted);
bool clt_sess_path_may_come(struct rtrs_clt_sess *s);
bool clt_io_imm(struct rtrs_con *c, unsigned type, uint32_t payload);
void clt_con_done(void *priv, void *ctx);

/* rtrs-clt-fence.c */
void clt_fence_process(struct rtrs_clt_sess *s, uint64_t now, bool may_come);
void clt_req_quarantine(struct clt_req *req, struct clt_path *f);
void clt_sess_tables_free(struct rtrs_clt_sess *s);
void clt_fence_reset(struct clt_path *p);
void clt_fence_carrier_lost(struct clt_path *carrier);
int clt_fence_answered(struct clt_path *carrier, const void *buf, size_t len);
void clt_fence_implied(struct clt_path *p);

/* rtrs-clt-recovery.c */
void clt_sess_retry_waiting(struct rtrs_clt_sess *s);
void clt_sess_wait_timer(struct loop_timer *t);
void clt_sess_wait_work(struct loop_work *w);
bool clt_path_change_state(struct clt_path *p, enum rtrs_path_state to);
void clt_path_destroy_cons(struct clt_path *p);
void clt_path_schedule_reconnect(struct clt_path *p, unsigned min_ms);
bool clt_path_should_reconnect(struct clt_path *p, int err, int attempts);
void clt_path_stop(struct clt_path *p, int err, enum rtrs_path_state next);
void clt_path_reconnect_timer(struct loop_timer *t);
extern atomic_uint clt_reconnects_running;
void clt_fail_path(struct clt_path *p, int err);
void clt_path_hb_timer(struct loop_timer *t);
extern const struct rtrs_path_ops clt_path_ops;

/* rtrs-clt-mem.c */
int clt_path_mem_setup(struct clt_path *p);
void clt_path_mem_release(struct clt_path *p);
bool clt_req_map_mem(struct clt_req *req, struct clt_path *p);

/* rtrs-clt-connect.c */
void clt_path_release_mrs(struct clt_path *p);
void clt_path_release(struct clt_path *p);
int clt_path_conn_init(struct clt_path *p);
void clt_path_kick(struct clt_path *p);
void clt_path_attempt_start(struct clt_path *p);
void clt_path_attempt_poke(struct clt_path *p);
void clt_path_attempt_failed(struct clt_path *p, int rc);
/* The attempt lets go of its fabric's open (last: the path is freed); never waits. */
void clt_path_open_job_end(struct clt_path *p, bool last);
int clt_path_open_begin(struct clt_path *p, int tries);
int clt_path_open_wait(struct clt_path *p);
int clt_path_open(struct clt_path *p, int tries);

#endif
