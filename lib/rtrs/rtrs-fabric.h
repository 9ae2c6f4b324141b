/* SPDX-License-Identifier: MIT */
/*
 * The fabric layer: the internal interface between RTRS and the network,
 * one implementation per transport. rtrs-fabric-tcp.c implements it over
 * TCP sockets (frames on the stream, poll groups on io_uring) and is the
 * only file that frames RTRS on a byte stream; rtrs-fabric-rdma.c
 * implements it over librdmacm and libibverbs (RDMA devices) and is the
 * only file that calls rdma_* and ibv_*.
 *
 * Objects:
 *   fab      a fabric + domain, and the memory-key counters of that domain.
 *            Client: one per path. Server: one per listening address.
 *   fab_lst  a passive endpoint; its connection requests are delivered by
 *            fab_lst_process() from the owner's service loop.
 *   fab_con  one connected endpoint. Its completions and events run the
 *            owner's fab_con_ops on the thread of the poll group it
 *            belongs to for its life (each fabric has its groups), or on
 *            a poller's (fab_con_poll, tcp).
 *
 * Errors: 0 or a negative errno. The interface is an ops table (struct
 * fab_ops), dispatched on each object's first member.
 */
#ifndef RTRS_FABRIC_H
#define RTRS_FABRIC_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct fab;
struct fab_lst;
struct fab_con;
struct fab_connreq;
struct fab_con_cfg;
struct fab_rma;

/* What the provider gave us; the upper layers size things from it. */
struct fab_attr {
	char prov_name[32];
	bool mr_local;       /* local buffers need registration (verbs) */
	bool virt_addr;      /* remote addresses are virtual, not offsets */
	bool rx_cq_data;     /* each incoming immediate consumes a posted receive */
	bool imm_by_send;    /* no remote CQ data (iWARP): immediates are sent as
				4-byte messages after their write (send-after-write
				order); receivers see them as imm() all the same */
	size_t iov_limit;    /* local iovecs per operation */
	size_t rma_iov_limit; /* remote iovecs per operation */
	size_t max_queue;    /* send/receive queue entries an endpoint may have */
	size_t inject_size;  /* bytes fab_write_imm_data takes */
	bool prov_key;       /* the provider picks memory keys (verbs), not us */
	size_t connect_data_max; /* private data a connection request carries (0: not known
				    before an endpoint exists) */
	bool send_imm;       /* fab_send_imm: a message carrying an immediate */
	bool send_inv;       /* fab_send_inv: an empty message invalidating a peer's key */
	bool chain;          /* fab_post takes several operations as one post */
	unsigned win_binds;  /* memory windows (fab_win_*): binds a window takes before
				a key of it could come back; 0: no windows */
};

enum fab_mr_access {
	FAB_MR_LOCAL = 1 << 0,        /* source/sink of local transfers only */
	FAB_MR_REMOTE_WRITE = 1 << 1, /* peer may write into it */
	/*
	 * The key may use 64 bits: a secret permutation of a counter, at least
	 * 2^32 and never repeated in the domain (always_invalidate chunk keys).
	 * Other keys fit 32 bits, below 2^32, so the two never meet.
	 * A provider that picks keys itself (verbs) gives what it gives.
	 */
	FAB_MR_KEY64 = 1 << 2,
	FAB_MR_BIND = 1 << 3,         /* memory windows may be bound onto it */
};

struct fab_mr {
	const struct fab_ops *ops; /* NULL: nothing was registered */
	void *buf;
	size_t len;
	void *desc;     /* pass with local iovecs; NULL when not needed */
	uint64_t base;  /* what the peer adds offsets to: VA (verbs) or 0 (tcp) */
	uint64_t key;   /* remote key: fits 32 bits unless FAB_MR_KEY64 */
	void *priv;     /* provider object */
};

/*
 * A memory window (type 1): remote write access to a range of a region
 * registered with FAB_MR_BIND, under a key that work requests change on
 * any connection of the fab, with no system call: fab_win_bind gives it a
 * new key, a bind of length 0 takes its key away. The key of each bind is
 * new to the window for fab_attr.win_binds binds.
 */
struct fab_win {
	const struct fab_ops *ops; /* NULL: none */
	uint64_t key;   /* of the last bind posted */
	unsigned binds; /* posted since it was allocated */
	void *priv;
};

/* Callbacks from a connection's completion thread. */
struct fab_con_ops {
	/* Connected; data = the accept private data on the client. */
	void (*connected)(void *priv, const void *data, size_t len);
	/*
	 * The connection is gone or failed: peer shutdown, reject (data =
	 * reject private data, err = -ECONNREFUSED), CQ error, timeout.
	 * Called at most once; nothing else is called afterwards.
	 */
	void (*down)(void *priv, int err, const void *data, size_t len);
	/* An incoming write with immediate data. */
	void (*imm)(void *priv, uint32_t imm);
	/* A two-sided message; buf is reposted when this returns. */
	void (*recv)(void *priv, void *buf, size_t len);
	/* A completion that was asked for (ctx != NULL when posting). */
	void (*done)(void *priv, void *ctx);
	/* fab_con_kick() was called: retry work that met -EAGAIN. */
	void (*kick)(void *priv);
};

/*
 * Connections accepted by the network that have not yet delivered their
 * connection request (a TCP socket that sends nothing): at most max_total
 * of them, max_per_peer from one address, each for timeout_ms; beyond
 * that the oldest are closed. 0: no limit.
 */
struct fab_lst_limits {
	unsigned max_total;
	unsigned max_per_peer;
	unsigned timeout_ms;
};

struct fab_rma {
	uint64_t addr;  /* peer base + offset */
	uint64_t len;
	uint64_t key;
};

/*
 * One operation of a chain for fab_post: what fab_write, fab_write_imm,
 * fab_send_imm and fab_send_inv post alone, with the same arguments.
 */
enum fab_wr_kind {
	FAB_WR_WRITE,     /* iov/desc/iov_cnt to rma/rma_cnt; with_imm: imm with it */
	FAB_WR_WRITE_IMM, /* buf/len (inline) to addr/key, with imm */
	FAB_WR_SEND_IMM,  /* the message buf/len (desc[0], or inline), with imm */
	FAB_WR_SEND_INV,  /* an empty message invalidating the peer's rkey */
};

struct fab_wr {
	enum fab_wr_kind kind;
	const struct iovec *iov;
	void *const *desc;
	size_t iov_cnt;
	const struct fab_rma *rma;
	size_t rma_cnt;
	const void *buf;
	size_t len;
	uint64_t addr, key;
	bool with_imm;
	uint32_t imm;
	uint32_t rkey;
};

/*
 * The operations one implementation provides. Every object an
 * implementation returns starts with its ops pointer (struct fab_obj), so
 * the calls below dispatch on the object; fab_open picks the implementation.
 * Each member is documented at its wrapper below.
 */
struct fab_poller;
struct rtrs_tls_ctx;

/*
 * TLS on a fabric's connections (rtrs-tls.h; the tcp fabric has it).
 * Client: off or required (every connection runs the handshake before a
 * byte of RTRS). Server: off (a TLS client is refused), offered (either),
 * or required (a plain client is refused). Refusals are a CM reject with
 * -EPROTONOSUPPORT and DNR, sent in the clear.
 */
enum fab_tls_mode { FAB_TLS_OFF, FAB_TLS_OFFERED, FAB_TLS_REQUIRED };

struct fab_ops {
	const char *name;
	int (*open)(const char *prov, const char *src, const char *node, const char *service,
		    bool server, size_t queue, struct fab **out);
	void (*close)(struct fab *f);
	const struct fab_attr *(*attr)(const struct fab *f);
	int (*mr_reg)(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr);
	void (*mr_dereg)(struct fab_mr *mr);
	/* Optional (NULL: fab_mr_dereg at once). */
	void (*mr_dereg_after)(struct fab_con *c, struct fab_mr *mr);
	void (*trim)(struct fab *f);
	int (*listen)(struct fab *f, struct fab_lst **out);
	void (*lst_close)(struct fab_lst *l);
	int (*lst_fd)(const struct fab_lst *l);
	int (*lst_port)(const struct fab_lst *l);
	int (*lst_process)(struct fab_lst *l,
			   void (*cb)(void *priv, struct fab_connreq *req, const void *data,
				      size_t len),
			   void *priv);
	void (*lst_limit)(struct fab_lst *l, const struct fab_lst_limits *lim);
	void (*lst_sweep)(struct fab_lst *l);
	uint64_t (*lst_closed)(const struct fab_lst *l);
	int (*reject)(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len);
	void (*connreq_peer)(const struct fab_connreq *req, char *buf, size_t len);
	int (*con_connect)(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			   size_t len, struct fab_con **out);
	int (*con_accept)(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			  const void *data, size_t len, struct fab_con **out);
	void (*con_shutdown)(struct fab_con *c);
	int (*con_rx_setup)(struct fab_con *c, size_t count, size_t size);
	void (*con_kick)(struct fab_con *c);
	void (*con_retry_later)(struct fab_con *c);
	void (*con_destroy)(struct fab_con *c);
	void (*con_local)(const struct fab_con *c, char *buf, size_t len);
	int (*write)(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t iov_cnt,
		     const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
		     void *ctx);
	/* Optional: fab_write_left. */
	int (*write_left)(struct fab_con *c, const struct iovec *iov, void *const *desc,
			  size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
			  uint32_t imm, void *ctx, bool *left);
	int (*write_imm)(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			 uint64_t key, uint32_t imm, void *ctx);
	int (*send)(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx);
	/* Optional (NULL: -EOPNOTSUPP); fab_attr says which a fabric has. */
	int (*send_imm)(struct fab_con *c, const void *buf, size_t len, void *desc, uint32_t imm,
			void *ctx);
	int (*send_inv)(struct fab_con *c, uint32_t rkey, void *ctx);
	int (*post)(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx);
	int (*win_alloc)(struct fab *f, struct fab_win *w);
	void (*win_free)(struct fab_win *w);
	int (*win_bind)(struct fab_con *c, struct fab_win *w, const struct fab_mr *mr, void *buf,
			size_t len, void *ctx);
	/* Optional (NULL: -EOPNOTSUPP): completions read on the owner's thread. */
	int (*con_poll)(struct fab_con *c);
	int (*con_trywait)(struct fab_con *c);
	int (*con_wait_fd)(const struct fab_con *c);
	void (*con_set_poller)(struct fab_con *c, struct fab_poller *p);
	void (*con_rename)(struct fab_con *c, const char *name);
	/* Optional (NULL: no TLS, -EPROTONOSUPPORT for any mode but off). */
	int (*set_tls)(struct fab *f, enum fab_tls_mode mode, struct rtrs_tls_ctx *ctx);
	/* Optional (NULL: no TLS): the host a TLS request's PSK identity named. */
	void (*connreq_tls_host)(const struct fab_connreq *req, char *buf, size_t len);
};

/*
 * The native TCP implementation (rtrs-fabric-tcp.c): sockets in poll
 * groups on io_uring, provider "tcp".
 */
extern const struct fab_ops fab_tcp_ops;
/*
 * Poll groups of the tcp fabric: how many threads the next start makes (0:
 * one per CPU); they start with the first tcp fab and stop with the last.
 */
void fab_tcp_groups(unsigned n);
/*
 * io_uring features (IORING_FEAT_*) the next start's rings act as if the
 * kernel lacked: tests run the paths of older kernels (IORING_FEAT_EXT_ARG,
 * before Linux 5.11: liburing's waits with a timeout queue a timeout of
 * their own, whose completion the group then meets).
 */
void fab_tcp_features_mask(uint32_t features);
/* Group threads running now (0 when no tcp fab is open). */
unsigned fab_tcp_groups_running(void);
/* What a poll group did so far, for tests and statistics. */
struct fab_tcp_group_stats {
	uint64_t passes;          /* trips round its loop */
	uint64_t budget_yields;   /* turns that ended with the connection's input not all read */
	unsigned max_turn_frames; /* the most frames one connection's turn read */
	unsigned turn_budget;     /* frames a turn may read (TCP_RX_BUDGET) */
	unsigned nr_cons;         /* connections placed on it now */
};
/* Group idx's statistics; -ENOENT when no such group runs. */
int fab_tcp_group_stats(unsigned idx, struct fab_tcp_group_stats *st);
/* The poll group a tcp connection was placed on for its life; -EINVAL for another fabric's. */
int fab_tcp_con_group(const struct fab_con *c);
/* The rdma-core implementation (rtrs-fabric-rdma.c): RDMA devices, providers "verbs" and "rdma". */
extern const struct fab_ops fab_rdma_ops;
/*
 * Poll groups of the rdma-core fabric, as fab_tcp_groups: how many the next
 * start makes (0: one per CPU); they start with the first rdma fab and stop
 * with the last.
 */
void fab_rdma_groups(unsigned n);
/*
 * Receives of the shared receive queue that a server's imm-only connections
 * of one poll group on one device share (0: each posts its own); for CQs
 * made from now on.
 */
void fab_rdma_srq(unsigned depth);
/* Group threads running now (0 when no rdma fab is open). */
unsigned fab_rdma_groups_running(void);
/* The poll group an rdma connection was placed on for its life; -EINVAL for another fabric's. */
int fab_rdma_con_group(const struct fab_con *c);
/*
 * The shipped implementation for provider prov: rdma-core for "verbs" and
 * "rdma", the native TCP fabric for "tcp" and NULL (the default); NULL for
 * any other name, which fab_open refuses (-EPROTONOSUPPORT).
 */
const struct fab_ops *fab_impl(const char *prov);
#ifdef RTRS_FAULT_INJECTION
/*
 * Test builds only (meson -Dfault_injection=true): wraps the shipped
 * implementation (fab_impl) and injects the faults set with rtrs_fault_set() (rtrs-fabric-fault.c).
 */
extern const struct fab_ops fab_fault_ops;
/* iWARP's connect threads are at most n from now on (0: RDMA_CONNECT_THREADS_MAX); rtrs_fault_set. */
void fab_rdma_connect_threads(unsigned n);
/* The nth post of the process from now on fails after queuing (0: none); rtrs_fault_set. */
void fab_rdma_post_fail_at(unsigned n);
/* How many posts fab_rdma_post_fail_at made fail. */
uint64_t fab_rdma_posts_failed(void);
#endif

/*
 * Another implementation, chosen by its provider name (ops->name) in
 * fab_open from now on: the fake fabric of the unit tests
 * (rtrs-fabric-fake.c) registers itself as "fake". Nothing in the library
 * registers one, so every other name goes to fab_impl. -ENOSPC when the
 * table is full, -EEXIST for a name already taken.
 */
int fab_register(const struct fab_ops *ops);
/* Whether fab_open has an implementation for provider prov (NULL: tcp). */
bool fab_known(const char *prov);

/*
 * For the fabrics' implementations: what their connections share.
 *
 * A connection's name in log lines: made with it, renamed once (when its
 * session is known). A logger may hold the first name while the rename
 * publishes the second: neither buffer changes once published.
 */
struct fab_con_name {
	_Atomic(const char *) cur;
	char made[64];
	char later[64];
	atomic_bool renamed;
};
void fab_con_name_init(struct fab_con_name *n, const char *name);
/* The second name; a later call does nothing. */
void fab_con_name_set(struct fab_con_name *n, const char *name);
static inline const char *fab_con_name_get(const struct fab_con_name *n)
{
	return atomic_load_explicit(&((struct fab_con_name *)n)->cur, memory_order_acquire);
}

/*
 * A destroyer waiting for a group thread to let a connection go: on the
 * destroyer's stack, fab_done_init, then fab_done_wait (which also ends
 * it); the group's thread calls fab_done_signal once.
 */
struct fab_done {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
};
void fab_done_init(struct fab_done *d);
void fab_done_signal(struct fab_done *d);
void fab_done_wait(struct fab_done *d);

struct fab_obj {
	const struct fab_ops *ops;
};

static inline const struct fab_ops *fab_ops_of(const void *obj)
{
	return ((const struct fab_obj *)obj)->ops;
}

/* ---- fabric and domain ----------------------------------------------------- */

/*
 * Opens a fabric and domain for provider prov. Client: node/service name the
 * destination (kept for fab_con_connect) and src, if not NULL, the local
 * address to connect from. Server: node is the local address to listen on.
 * queue: the send/receive queue entries endpoints will want (0: provider
 * default); fab_attr()->max_queue says what was granted, and connections
 * are clamped to it.
 */
int fab_open(const char *prov, const char *src, const char *node, const char *service,
	     bool server, size_t queue, struct fab **out);
static inline void fab_close(struct fab *f)
{
	if (f)
		fab_ops_of(f)->close(f);
}
static inline const struct fab_attr *fab_attr(const struct fab *f)
{
	return fab_ops_of(f)->attr(f);
}

static inline int fab_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	return fab_ops_of(f)->mr_reg(f, buf, len, access, mr);
}
static inline void fab_mr_dereg(struct fab_mr *mr)
{
	if (mr && mr->ops)
		mr->ops->mr_dereg(mr);
}

/*
 * Deregisters mr, a registration of c's fab that sends posted on c may
 * read, once every send posted on c so far has completed, or c is
 * destroyed; mr is empty on return, as after fab_mr_dereg. A response
 * does not tell that a write's send completed: its acknowledgement may
 * still be lost or late, and the device then sends the write again from
 * the local buffer, through the key, after the peer answered it;
 * deregistered meanwhile, that is a local protection error and the
 * connection fails. A send posted without a context may be seen to
 * complete only with a later one, so a caller asks for a completion on
 * its last send that reads mr, or the release may wait for the
 * connection's next. Any thread, until fab_con_destroy(c) begins. c
 * NULL (gone), or a fabric without local registration (tcp) or without
 * the operation: at once.
 */
static inline void fab_mr_dereg_after(struct fab_con *c, struct fab_mr *mr)
{
	if (!mr || !mr->ops)
		return;
	if (c && fab_ops_of(c)->mr_dereg_after)
		fab_ops_of(c)->mr_dereg_after(c, mr);
	else
		fab_mr_dereg(mr);
}

/*
 * While no registration of f is open, gives back what the implementation
 * keeps for ones that are gone (tcp: the regions kept for reuse). A no-op
 * otherwise, and where an implementation keeps nothing (rdma-core).
 */
static inline void fab_trim(struct fab *f)
{
	const struct fab_ops *o = fab_ops_of(f);

	if (o->trim)
		o->trim(f);
}

/* A memory window, not bound yet; -EOPNOTSUPP where fab_attr.win_binds is 0. */
static inline int fab_win_alloc(struct fab *f, struct fab_win *w)
{
	const struct fab_ops *o = fab_ops_of(f);

	return o->win_alloc ? o->win_alloc(f, w) : -EOPNOTSUPP;
}
/* Frees w: its key is dead once this returns (also the way out after a failed bind). */
static inline void fab_win_free(struct fab_win *w)
{
	if (w && w->ops)
		w->ops->win_free(w);
}

/*
 * Sets f's TLS, before its first connection or listener; ctx is
 * referenced (rtrs_tls_ctx_get) until f closes. -EPROTONOSUPPORT on a
 * fabric without TLS unless mode is FAB_TLS_OFF.
 */
static inline int fab_set_tls(struct fab *f, enum fab_tls_mode mode, struct rtrs_tls_ctx *ctx)
{
	const struct fab_ops *o = fab_ops_of(f);

	if (!o->set_tls)
		return mode == FAB_TLS_OFF ? 0 : -EPROTONOSUPPORT;
	return o->set_tls(f, mode, ctx);
}

/* ---- listening --------------------------------------------------------------- */

/* Listens; the EQ fd to watch is fab_lst_fd(). */
static inline int fab_listen(struct fab *f, struct fab_lst **out)
{
	return fab_ops_of(f)->listen(f, out);
}
static inline void fab_lst_close(struct fab_lst *l)
{
	if (l)
		fab_ops_of(l)->lst_close(l);
}
static inline int fab_lst_fd(const struct fab_lst *l)
{
	return fab_ops_of(l)->lst_fd(l);
}
/* The bound port. */
static inline int fab_lst_port(const struct fab_lst *l)
{
	return fab_ops_of(l)->lst_port(l);
}

/*
 * Reads pending listener events and calls cb for each connection request.
 * The callback must answer the request with fab_con_accept() or
 * fab_reject() before returning.
 */
static inline int fab_lst_process(struct fab_lst *l,
		    void (*cb)(void *priv, struct fab_connreq *req, const void *data, size_t len),
		    void *priv)
{
	return fab_ops_of(l)->lst_process(l, cb, priv);
}
/* Sets the limits on raw connections; checked as requests come and by fab_lst_sweep. */
static inline void fab_lst_limit(struct fab_lst *l, const struct fab_lst_limits *lim)
{
	fab_ops_of(l)->lst_limit(l, lim);
}
/* Enforces the deadline now (from a timer: nothing may arrive to trigger it). */
static inline void fab_lst_sweep(struct fab_lst *l)
{
	fab_ops_of(l)->lst_sweep(l);
}
/* Raw connections closed so far. */
static inline uint64_t fab_lst_closed(const struct fab_lst *l)
{
	return fab_ops_of(l)->lst_closed(l);
}
static inline int fab_reject(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len)
{
	return fab_ops_of(l)->reject(l, req, data, len);
}
/* Peer address of a request, as "host:port". */
static inline void fab_connreq_peer(const struct fab_connreq *req, char *buf, size_t len)
{
	fab_ops_of(req)->connreq_peer(req, buf, len);
}

/*
 * The host name of the PSK a request's TLS handshake used ("" for a request
 * without TLS): who the TLS layer says the peer is.
 */
static inline void fab_connreq_tls_host(const struct fab_connreq *req, char *buf, size_t len)
{
	const struct fab_ops *o = fab_ops_of(req);

	if (len)
		buf[0] = '\0';
	if (o->connreq_tls_host)
		o->connreq_tls_host(req, buf, len);
}

/* ---- connections ------------------------------------------------------------- */

struct fab_con_cfg {
	const struct fab_con_ops *ops;
	void *priv;
	const char *name;  /* for logs and the thread name: "sess/path#cid" */
	size_t tx_depth;   /* outstanding sends/writes */
	size_t rx_depth;   /* posted receives (messages + imm on rx_cq_data) */
	size_t rx_queue;   /* receive queue size if larger than rx_depth, for a
			      pool set up later with fab_con_rx_setup */
	size_t rx_size;    /* bytes per receive buffer (0: imm only) */
	unsigned poll_us;  /* busy-poll an empty queue this long before sleeping */
	/*
	 * A connection whose sent bytes stay unacknowledged this long fails
	 * (down, -ETIMEDOUT): one of a path's IO connections that the network
	 * lost (a flow an ECMP or LAG member drops) while its connection 0,
	 * the only one with heartbeats, goes on. tcp: TCP_USER_TIMEOUT once
	 * the TCP connection exists (a peer that is alive but not reading
	 * acknowledges the window probes, and is not failed). rdma: the
	 * device's retry budget does this. 0: the system's (tcp: about 15
	 * minutes of retransmissions).
	 */
	unsigned live_ms;
};

/*
 * Client: creates an endpoint to the fab's destination and connects it.
 * *out is set before any callback of the connection can run. It waits
 * (address, route): not from a poll group's thread (rdma: -EDEADLK).
 */
static inline int fab_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
		    size_t len, struct fab_con **out)
{
	return fab_ops_of(f)->con_connect(f, cfg, data, len, out);
}
/* Server: creates an endpoint for req and accepts it with data; *out and threads as above. */
static inline int fab_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
		   const void *data, size_t len, struct fab_con **out)
{
	return fab_ops_of(f)->con_accept(f, req, cfg, data, len, out);
}
/*
 * Shuts the endpoint down; queued operations are flushed and the peer sees
 * a disconnect. Nothing is read from it afterwards and no callback
 * follows (the owner knows). Any thread, the connection's own included:
 * a callback that finds the peer breaking the protocol shuts it down at
 * once, so that nothing more of the peer's is read while the owner's
 * teardown is on its way.
 */
static inline void fab_con_shutdown(struct fab_con *c)
{
	if (c)
		fab_ops_of(c)->con_shutdown(c);
}
/*
 * Sets up the receive pool later than creation (count buffers of size
 * bytes), before the peer can send anything. Once per connection.
 */
static inline int fab_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	return fab_ops_of(c)->con_rx_setup(c, count, size);
}
/* Asks the connection's poll group to call ops->kick soon. Any thread. */
static inline void fab_con_kick(struct fab_con *c)
{
	fab_ops_of(c)->con_kick(c);
}
/*
 * From ops->kick after -EAGAIN: call kick again after the next completion
 * (tcp: or room made in the send queue) or 1 ms, rather than spin while
 * the send queue is full.
 */
static inline void fab_con_retry_later(struct fab_con *c)
{
	fab_ops_of(c)->con_retry_later(c);
}
/*
 * Frees the connection; once this returns no callback of it runs or will
 * run. From a callback of another connection of its poll group it hands
 * the connection to the group and returns; from any other thread it waits
 * for the group to let go (so not from a callback on another group whose
 * connections that group may be destroying at the same time).
 */
static inline void fab_con_destroy(struct fab_con *c)
{
	if (c)
		fab_ops_of(c)->con_destroy(c);
}
/*
 * Completions read by the owner's threads (rtrs_clt_poll). A connection
 * given a poller leaves its completion queue to whoever calls
 * fab_con_poll for as long as the poller says one is active: inside a
 * wait (waiting > 0), or polled within FAB_POLL_LEASE_MS. Then its
 * thread reads only connection events and kicks; otherwise it reads the
 * queue itself, as without a poller, so completions never wait for a
 * caller that stopped polling for longer than the lease. A thread that
 * finds the same wait (sleeps unchanged) still going a lease later sleeps
 * on the completion queue's fd too, rather than look again every lease:
 * whatever makes the queue readable wakes it, so a caller that left its
 * wait and stopped polling still has its completions read. Every callback
 * of a connection runs under one lock, whichever thread reads: they
 * never run concurrently.
 */
#define FAB_POLL_LEASE_MS 10

struct fab_poller {
	_Atomic uint64_t last_ms;   /* now_ms() of the last fab_con_poll round */
	atomic_int waiting;         /* callers asleep on the wait fds */
	atomic_uint sleeps;         /* waits begun so far, by any caller */
};

/*
 * Reads the connection's completion queue once on the calling thread and
 * runs the callbacks of what it found: their number, 0 when none or when
 * another thread is reading it now, -EOPNOTSUPP where the fabric has no
 * such mode. Not after fab_con_destroy has begun.
 */
static inline int fab_con_poll(struct fab_con *c)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->con_poll ? o->con_poll(c) : -EOPNOTSUPP;
}
/*
 * Before sleeping on fab_con_wait_fd: 0 when the fd will signal anything
 * new, -EAGAIN when there is something to read first.
 */
static inline int fab_con_trywait(struct fab_con *c)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->con_trywait ? o->con_trywait(c) : -EOPNOTSUPP;
}
/* An fd that turns readable when the completion queue has work: for epoll. */
static inline int fab_con_wait_fd(const struct fab_con *c)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->con_wait_fd ? o->con_wait_fd(c) : -EOPNOTSUPP;
}
/* Gives the connection a poller, or takes it away (NULL). */
static inline void fab_con_set_poller(struct fab_con *c, struct fab_poller *p)
{
	const struct fab_ops *o = fab_ops_of(c);

	if (o->con_set_poller)
		o->con_set_poller(c, p);
}

/*
 * Renames a connection whose owner learnt its name only after it came up
 * (the server's first path, before the session's name): its log lines
 * from now on, once (a second rename changes only the thread), and its
 * thread (the first 15 bytes, as ps and top -H show it), where the fabric
 * has one per connection.
 */
static inline void fab_con_rename(struct fab_con *c, const char *name)
{
	const struct fab_ops *o = fab_ops_of(c);

	if (o->con_rename)
		o->con_rename(c, name);
}

/* Local address of the connection as "host:port". */
static inline void fab_con_local(const struct fab_con *c, char *buf, size_t len)
{
	fab_ops_of(c)->con_local(c, buf, len);
}

/*
 * RMA write from local iovecs (with their descs) to remote ranges; with_imm
 * attaches imm as remote CQ data. ctx != NULL asks for a completion (done).
 * -EAGAIN when the send queue is full. Every posting call below keeps to
 * the connection's tx_depth: where the provider's queue has no bound of
 * its own (tcp queues without limit behind a peer that stops reading),
 * the fabric layer counts what has not left yet and says -EAGAIN itself.
 */
static inline int fab_write(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t iov_cnt,
	      const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
	      void *ctx)
{
	return fab_ops_of(c)->write(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx);
}
/*
 * fab_write, on a fabric whose sends read the caller's buffers after the
 * post has returned only while they wait in the connection's queue (tcp,
 * whose queue holds them when the socket has no room, or until the group's
 * pass ends when its own thread posts): *left true when every byte has
 * left (tcp: handed to the kernel) and no completion comes for ctx; false
 * when some of it waits, and done(ctx) comes once all of it has left, or
 * never, if the connection goes down first (down() comes then). The peer
 * cannot have seen what has not left: an answer to it before then is the
 * peer's lie, which must not free the buffers (rtrs-clt-io.c). Fabrics
 * without it (fab_has_write_left false): fab_write without ctx, *left
 * true.
 */
static inline bool fab_has_write_left(const struct fab_con *c)
{
	return fab_ops_of(c)->write_left != NULL;
}
static inline int fab_write_left(struct fab_con *c, const struct iovec *iov, void *const *desc,
				 size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt,
				 bool with_imm, uint32_t imm, void *ctx, bool *left)
{
	if (!fab_ops_of(c)->write_left) {
		*left = true;
		return fab_ops_of(c)->write(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm,
					    NULL);
	}
	return fab_ops_of(c)->write_left(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx,
					 left);
}
/* Empty write with immediate data to (addr, key): responses, heartbeats. */
static inline int fab_write_imm(struct fab_con *c, uint64_t addr, uint64_t key, uint32_t imm)
{
	return fab_ops_of(c)->write_imm(c, NULL, 0, addr, key, imm, NULL);
}
/* The same, with a completion (done(ctx)) once it has left. */
static inline int fab_write_imm_ctx(struct fab_con *c, uint64_t addr, uint64_t key, uint32_t imm,
				    void *ctx)
{
	return fab_ops_of(c)->write_imm(c, NULL, 0, addr, key, imm, ctx);
}

/*
 * The same with a few bytes of data (at most fab_attr.inject_size), copied
 * at once: buf may be reused when this returns, and needs no registration.
 */
static inline int fab_write_imm_data(struct fab_con *c, const void *buf, size_t len,
				     uint64_t addr, uint64_t key, uint32_t imm)
{
	return fab_ops_of(c)->write_imm(c, buf, len, addr, key, imm, NULL);
}
/* Two-sided message from a registered (or mr_local-free) buffer. */
static inline int fab_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	return fab_ops_of(c)->send(c, buf, len, desc, ctx);
}
/*
 * The same, carrying an immediate that the peer sees after the message
 * (recv, then imm): the kernel's always_invalidate sends a chunk's new key
 * so, with the response. desc NULL: len within inject_size, copied at once.
 */
static inline int fab_send_imm(struct fab_con *c, const void *buf, size_t len, void *desc,
			       uint32_t imm, void *ctx)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->send_imm ? o->send_imm(c, buf, len, desc, imm, ctx) : -EOPNOTSUPP;
}
/*
 * An empty message that invalidates the peer's memory key rkey on its
 * arrival (SEND_WITH_INV): the answer to a kernel client's read that asked
 * for it. It takes one of the peer's posted receives.
 */
static inline int fab_send_inv(struct fab_con *c, uint32_t rkey, void *ctx)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->send_inv ? o->send_inv(c, rkey, ctx) : -EOPNOTSUPP;
}

/*
 * Binds w to [buf, buf + len) of mr for remote writes under a new key
 * (w->key), by a work request on c: ordered before what c posts next, so
 * a message posted after it may hand the key out. len 0 takes w's key
 * away; ctx asks for done(ctx) once the bind has taken effect, after which
 * no write with the old key lands. -EAGAIN when c's send queue is full.
 */
static inline int fab_win_bind(struct fab_con *c, struct fab_win *w, const struct fab_mr *mr,
			       void *buf, size_t len, void *ctx)
{
	const struct fab_ops *o = fab_ops_of(c);

	return o->win_bind ? o->win_bind(c, w, mr, buf, len, ctx) : -EOPNOTSUPP;
}

/*
 * Posts wrs[0..n) in order, as one post where fab_attr.chain says the
 * fabric can (one doorbell for a response's data, invalidation and
 * immediate, as the kernel's server posts them): all or nothing, -EAGAIN
 * when the send queue has no room for all. ctx asks for one completion,
 * after the last. Without chain, n must be 1.
 */
int fab_post(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx);

#endif
