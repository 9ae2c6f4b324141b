/* SPDX-License-Identifier: MIT */
/*
 * The server's internal objects and what its files (rtrs-srv.c,
 * rtrs-srv-io.c, rtrs-srv-keys.c, rtrs-srv-admit.c, rtrs-srv-session.c)
 * call of each other. Nothing here is public: include/rtrs.h is.
 */
#ifndef RTRS_SRV_PRI_H
#define RTRS_SRV_PRI_H

#include "offload.h"
#include "rtrs-auth-sm.h"
#include "rtrs-path.h"
#include "rtrs-srv-hs.h"

enum srv_op_state { OP_FREE, OP_BUSY, OP_RESPONDING, OP_SENT };

/*
 * An op's state word: the state in the low two bits, above them a count
 * of the op's takes (srv_handle_req adds one on every FREE/SENT -> BUSY).
 * A responder's transitions compare the whole word, so they apply to its
 * own take only: a response still finishing when the client's next
 * request has taken the chunk (legitimately, once the response arrived)
 * cannot free that next request's op.
 */
#define OP_STATE_MASK 3u
#define OP_TAKE_ONE 4u

static inline unsigned op_st(unsigned v)
{
	return v & OP_STATE_MASK;
}

static inline unsigned op_with(unsigned v, enum srv_op_state st)
{
	return (v & ~OP_STATE_MASK) | (unsigned)st;
}

struct srv_path;

struct srv_con;

/*
 * always_invalidate's chunk keys: one MR per chunk, revoked when an IO
 * arrives and registered again under a new key when it is answered (or
 * dropped); key 0 while revoked, gen counts both. A client of this
 * project has the session's, 64-bit, with records (msgs) that responses
 * write into its key slots; a kernel client has its path's, 32-bit, sent
 * in an RKEY_RSP with each response (rtrs-srv-keys.c).
 */
struct srv_keys {
	struct fab_mr *mrs;
	struct fab_win *wins;       /* a kernel client's, where the fabric has windows: a
				       chunk's key moves onto one at its first rotation */
	uint64_t *key;
	uint64_t *hist;             /* RTRS_KEY_HISTORY last keys per chunk, newest first */
	uint32_t *gen;
	struct rtrs_msg_new_rkey *msgs; /* response sources, one per chunk (project clients) */
	struct fab_mr msgs_mr;
};

struct rtrs_srv_op {
	struct rtrs_srv_sess *sess;
	uint32_t id;
	atomic_uint state;          /* op_st() and the take count: see OP_STATE_MASK */
	struct srv_path *path;
	struct srv_con *con;
	enum rtrs_dir dir;
	uint32_t data_len;
	uint16_t sg_cnt;
	struct rtrs_desc *sg;       /* validated copy; the client cannot change it */
	int err;
	size_t next_sg;             /* posting progress after -EAGAIN */
	uint64_t next_local;
	bool rekeyed;               /* always_invalidate: the chunk has its new key */
	atomic_bool revoking;       /* ... its old key's unbind is on its way (srv_op_revoked) */
	uint32_t usr_len;
	bool need_inval;            /* a read whose client asked for its key's invalidation */
	bool inv_sent;              /* ... and the SEND_WITH_INV is out */
	struct rtrs_pending pend;   /* waits for room in con's send queue */
	/*
	 * A kernel client's request for the chunk again, on another path,
	 * while the op is still busy with its first try (op_defer): it waits
	 * for the op to end, then runs on its own connection (defer on
	 * defer_con's pending list). sess->defer_lock; deferred mirrors
	 * defer_con != NULL for the op's end to look at without the lock.
	 */
	atomic_bool deferred;
	struct srv_con *defer_con;
	uint32_t defer_payload;
	bool defer_queued;          /* on defer_con's pending list */
	struct rtrs_pending defer;
};

struct srv_con {
	struct rtrs_con c;
	struct srv_path *path;
	struct rtrs_desc *sg_scratch; /* RTRS_MAX_READ_SG; completion thread only */
};

struct srv_path {
	struct rtrs_path base;      /* state, post lock, heartbeat, failure, cons */
	struct rtrs_srv_sess *sess;
	struct srv_path *next;
	uint8_t uuid[RTRS_UUID_LEN];
	char peer[64];
	char peer_host[64];         /* the peer's address without the port: limits */
	char local[64];             /* the address:port its first connection came in on */
	/*
	 * The log name: "(new)/peer" until the info request names the session,
	 * then "session/peer". Connection threads log with it while the loop
	 * renames, so the new name goes in a buffer of its own and base.name
	 * points at one of the two.
	 */
	char name_new[RTRS_NAME_MAX + 80];
	char name_info[RTRS_NAME_MAX + 80];
	unsigned nr_accepted;
	struct srv_con *cons;
	uint64_t last_connreq_ms;
	/*
	 * The last step of its handshake (a connection requested or up, an
	 * authentication message or its answer, the information request, a
	 * poll of a takeover's wait): admission never evicts a path that made
	 * one within a quarter of handshake_timeout_ms (srv_admit_stall_ms),
	 * nor one whose authentication message waits for or runs on an
	 * offload worker (path_server_busy).
	 */
	atomic_uint_fast64_t progress_ms;
	struct rtrs_info_req info;  /* from the admin thread to the loop */
	struct loop_work info_work;
	void *info_rsp;
	size_t info_rsp_len;
	struct fab_mr info_rsp_mr;
	uint16_t recon_cnt;         /* its connection request's: the client's incarnation */
	/* A fence asked for on this path (its admin connection): the path, its incarnation. */
	uint8_t fence_uuid[RTRS_UUID_LEN];
	int32_t fence_recon;
	atomic_bool fence_pending;
	struct loop_work fence_work;
	struct loop_timer fence_timer;
	/* Its session's name is held by a session it waits to take over from (srv_takeover_check). */
	uint64_t takeover_since_ms;
	struct rtrs_msg_fence fence_ack;
	struct fab_mr fence_ack_mr;
	bool cons_destroyed;
	bool was_connected;
	/*
	 * The session's incarnation its connection 0 was told (sess_id): a
	 * link that went down meanwhile gave the session a new one, and the
	 * path is refused at its information request (srv_relinked).
	 */
	uint64_t sess_id_told;
	/*
	 * The handshake (enum rtrs_srv_hs_state), moved by srv_hs_step from
	 * the loop and from connection 0's completion thread.
	 */
	_Atomic int hs;
	/*
	 * Authentication: cid 0's completion thread queues each message in
	 * auth_in (under auth_lock; a client sends one and waits, so a third
	 * waiting is a protocol error) and an offload worker answers them in
	 * order (auth_job, srv_auth_job: a DH exchange is too slow for a poll
	 * group); the job owns auth, auth_msg and auth_tx. srv_path_stop does
	 * not wait for it (auth_stopped); srv_reap_work frees the path only
	 * once it is done (srv_auth_job_done queues the reaper).
	 */
	struct rtrs_auth_txn auth;
	char auth_host[RTRS_AUTH_WIRE_NAME]; /* who, once authenticated */
	/*
	 * Admission by the host's name once it is proven (srv_held_admit,
	 * docs/security.md section 8): the job that proves it stores the
	 * name in held_host, then admit_asked, and queues admit_work once;
	 * the loop then (at the latest at the path's next connection request
	 * or information request) counts the path among its host's held
	 * paths (held: proven, not connected, at most max_pending_per_peer of
	 * one host), or refuses it (admit_err, since admit_err_ms): its next
	 * connection request or its information request is refused with that
	 * errno, no DNR, and a path that makes neither within a stall is
	 * closed. Loop only, but held_host and admit_asked.
	 */
	char held_host[RTRS_AUTH_WIRE_NAME];
	atomic_bool admit_asked;
	struct loop_work admit_work;
	bool held;
	int admit_err;
	uint64_t admit_err_ms;
	char tls_host[RTRS_AUTH_WIRE_NAME];  /* connection 0's TLS identity said this host ("": none) */
	bool concat;                /* a secure channel concatenation's path (RTRS_CONN_CONCAT) */
	char auth_tx[RTRS_AUTH_MSG_MAX];
	struct fab_mr auth_tx_mr;
	struct offload_job auth_job;
	pthread_mutex_t auth_lock;
	struct {
		char buf[RTRS_AUTH_MSG_MAX];
		size_t len;
	} auth_in[2];
	unsigned auth_in_n;
	/*
	 * srv_path_stop ran (under auth_lock): nothing more is queued, a job
	 * that runs after it (one a completion submitted as the path stopped)
	 * answers nothing, and a job still answering sends nothing: its sends
	 * check this under the lock (srv_auth_send), so none reaches a
	 * connection gone.
	 */
	bool auth_stopped;
	char auth_msg[RTRS_AUTH_MSG_MAX]; /* the one being answered */
	size_t auth_msg_len;
	/*
	 * Re-authentication of the connected path (srv_path_reauth, after the
	 * key file changed): reauth while its transaction runs (the same auth,
	 * auth_job and auth_tx), since when; auth_digest (under auth_lock: the
	 * job writes it, a reload's pass reads it on the loop): a digest of the
	 * keys the path last authenticated with, so that a reload
	 * re-authenticates only the paths whose keys changed.
	 */
	atomic_bool reauth;
	atomic_uint_fast64_t reauth_since_ms;
	uint8_t auth_digest[32];
	/*
	 * ctx->key_epoch as its transaction's NEGOTIATE was answered, before
	 * the keys were read from the file (srv_auth_answer). A reload since
	 * (the epoch moved on) may have changed or removed those keys: the
	 * path is refused at its information request (path_info_work,
	 * -EAGAIN: it authenticates anew), or a re-authentication that
	 * completed on them is asked for again (reauth_work).
	 */
	atomic_uint_fast64_t auth_epoch;
	struct loop_work reauth_work;
	/* A refusal went out (FAILURE1 or a verdict): close once the client had time to read it. */
	atomic_uint_fast64_t close_at_ms;
	int close_err;
	uint8_t verdict[sizeof(struct rtrs_msg_info_rsp)]; /* an info response with an errno */
	struct fab_mr verdict_mr;
	uint64_t created_ms;
	uint64_t serial;            /* creation order in the server (ctx->path_serial) */
	/* always_invalidate: the key table sent ahead of a fence ack. */
	struct rtrs_msg_new_rkey *fence_keys;
	struct fab_mr fence_keys_mr;
	/* always_invalidate with a kernel client: this path's chunk keys. */
	struct srv_keys keys;
	/* Requests taken on this path (rtrs_srv_sessions). */
	struct {
		atomic_uint_fast64_t reads, read_bytes, writes, write_bytes;
	} st;
};

struct rtrs_srv_sess {
	struct rtrs_srv_ctx *ctx;
	struct rtrs_srv_sess *next;
	uint8_t paths_uuid[RTRS_UUID_LEN];
	char name[RTRS_NAME_MAX + 1];
	char auth_host[RTRS_AUTH_WIRE_NAME]; /* the host its first path authenticated as */
	char peer_host[64];         /* the address its first named path came from */
	void *priv;
	uint32_t queue_depth;
	uint32_t chunk_size;
	size_t chunk_bytes;
	bool chunks_mapped;         /* at the first info request: sess_map_chunks */
	char *chunk_mem;
	void **chunk_bases;
	struct fab_mr chunk_mr;
	struct rtrs_srv_op *ops;
	struct rtrs_desc *op_sg;
	char imm_buf[RTRS_IMM_REGION];
	struct fab_mr imm_mr;
	struct srv_path *paths;
	unsigned paths_num;
	unsigned paths_up;
	bool link_up;
	/*
	 * The client is of this project (RTRS_CONN_EXT in its first request,
	 * and every path must agree). Without, it gets the kernel server's
	 * answers: no imm target, no fencing, no verdicts.
	 */
	bool ext;
	/*
	 * always_invalidate: chunk keys that a request revokes and its
	 * response replaces; chunk_mr then only serves local access (read
	 * responses on verbs). A client of this project uses the session's
	 * keys; a kernel client (kinval) each path's own, as the kernel.
	 */
	bool inval;
	bool kinval;                /* inval && !ext: the kernel's scheme */
	uint64_t sess_id;           /* this incarnation, random */
	struct srv_keys keys;       /* inval && ext */
	pthread_mutex_t key_lock;   /* every srv_keys of the session */
	pthread_mutex_t defer_lock; /* ops' deferred requests (op_defer) */
};

struct rtrs_srv_ctx {
	struct rtrs_srv_ops ops;
	struct rtrs_srv_opts opts;
	char addr[256];
	char provider[32];
	struct loop *loop;
	struct fab *fab;
	struct fab_lst *lst;
	struct loop_fd lst_h;
	struct loop_timer listen_timer;
	/*
	 * 50 ms after the last session freed, malloc_trim: a session's
	 * teardown frees its pieces from several threads' arenas, and glibc
	 * gives free pages inside an arena back only when asked.
	 */
	struct loop_timer trim_timer;
	unsigned listen_failures;
	pthread_mutex_t lock;       /* listening, listen_err, port, nr_sessions for waiters */
	pthread_cond_t cond;
	bool listening;
	int listen_err;             /* why the last attempt to listen failed; 0 once listening */
	bool closing;
	int port;
	struct rtrs_srv_sess *sessions;
	unsigned nr_sessions;
	uint64_t path_serial;       /* paths created so far (loop thread) */
	struct loop_work reap_work; /* frees closed paths nobody references */
	struct srv_verdict *verdicts; /* final refusals held open (srv_reject_dnr) */
	unsigned nr_verdicts;
	/* Paths refused busy, who goes first when a place frees (rtrs_admit_queue); loop thread. */
	struct rtrs_admit_waiter waiters[RTRS_ADMIT_WAITERS];
	struct loop_work srv_verdict_work;
	bool auth_required;
	/*
	 * Reloads of the key file begun: moved on by rtrs_srv_reload_keys on
	 * the loop thread, in the pass that lists the hosts of live sessions,
	 * so that path_info_work (the loop too) either connects a path before
	 * that pass sees it or finds the epoch moved (srv_path.auth_epoch).
	 */
	atomic_uint_fast64_t key_epoch;
	struct rtrs_auth_cfg auth_cfg;
	char auth_keys_file[4096];
	struct rtrs_tls_ctx *tls;   /* opts.tls: the PSKs of the key file */
	struct {
		atomic_uint_fast64_t connreqs, rejects, auth_ok, auth_failed, auth_timeouts;
		atomic_uint_fast64_t key_rotations, chunk_bytes;
		atomic_uint_fast64_t pending_evicted, limit_refusals, raw_closed;
	} st;
};

static inline const char *path_name(struct srv_path *p)
{
	return rtrs_path_name(&p->base);
}

/* rtrs-srv-io.c */
int srv_post_pending(struct rtrs_con *con, struct rtrs_pending *it);
void srv_drop_pending(struct rtrs_con *con, struct rtrs_pending *it, int err);
bool srv_io_imm(struct rtrs_con *c, unsigned type, uint32_t payload);
void srv_con_done(void *priv, void *ctx);
void srv_ops_abandon(struct srv_path *p);
void srv_defers_cancel(struct srv_path *p);

/* rtrs-srv-keys.c */
int srv_keys_setup(struct rtrs_srv_sess *s, struct srv_keys *k, bool records);
void srv_keys_release(struct rtrs_srv_sess *s, struct srv_keys *k);
int srv_chunk_revoke(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id,
		     struct fab_con *fc, void *ctx);
int srv_chunk_rekey(struct rtrs_srv_sess *s, struct srv_keys *k, uint32_t id, struct fab_con *fc);
int srv_keys_repair(struct rtrs_srv_sess *s, struct srv_keys *k);
void srv_chunk_keys_snapshot(struct rtrs_srv_sess *s, const struct srv_keys *k,
			     struct rtrs_msg_new_rkey *out);
uint64_t srv_chunk_key(struct rtrs_srv_sess *s, const struct srv_keys *k, uint32_t id);

/* The keys an op's chunk uses: its path's for a kernel client, else the session's. */
static inline struct srv_keys *srv_op_keys(const struct rtrs_srv_op *op)
{
	return op->sess->kinval ? &op->path->keys : &op->sess->keys;
}

/* rtrs-srv-admit.c */
unsigned srv_sessions_of(const struct rtrs_srv_ctx *ctx, const char *owner,
			 const struct rtrs_srv_sess *self);
/* Loop thread: p's host proved itself (admit_work): held, or refused. */
void srv_held_admit(struct srv_path *p);
void srv_held_admit_work(struct loop_work *w);
/* How long a path may go without a step of its handshake before it counts as stalled. */
uint64_t srv_admit_stall_ms(const struct rtrs_srv_ctx *ctx);
unsigned srv_sessions_named(const struct rtrs_srv_ctx *ctx);
/* The session named name, other than self; NULL when none is. */
struct rtrs_srv_sess *srv_name_holder(struct rtrs_srv_ctx *ctx, const struct rtrs_srv_sess *self,
				      const char *name);
void srv_path_refuse(struct srv_path *p, int err, bool dnr);
void srv_peer_host_of(const char *peer, char *buf, size_t len);
void srv_verdicts_reap(struct rtrs_srv_ctx *ctx, bool all);
void srv_verdict_work(struct loop_work *w);
struct srv_path *srv_path_find(struct rtrs_srv_sess *s, const uint8_t *uuid);
void srv_on_connreq(void *priv, struct fab_connreq *creq, const void *data, size_t len);

/* rtrs-srv-session.c */
extern const struct fab_con_ops srv_con_ops;
void srv_sess_free(struct rtrs_srv_sess *s);
int srv_sess_create(struct rtrs_srv_ctx *ctx, const uint8_t *uuid, bool ext,
		    struct rtrs_srv_sess **out);
void srv_reap_work(struct loop_work *w);
void srv_path_stop(struct srv_path *p, int err);
/* Loop thread: asks the client of connected path p to authenticate again; false if it cannot. */
bool srv_path_reauth(struct srv_path *p);
/* SHA-256 over a host's keys, as auth_digest holds it. */
void srv_auth_digest(const struct rtrs_auth_key *hk, const struct rtrs_auth_key *ck, uint8_t out[32]);
void srv_fail_path(struct srv_path *p, int err);
void srv_path_probe(struct srv_path *p);
int srv_hs_step(struct srv_path *p, enum rtrs_srv_hs_event ev, const char **why);
int srv_path_create(struct rtrs_srv_sess *s, const struct rtrs_conn_req *req,
		    const char *peer, struct srv_path **out);

#endif
