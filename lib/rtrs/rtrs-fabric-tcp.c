/* SPDX-License-Identifier: MIT */
/*
 * The fabric layer over TCP sockets and io_uring (provider "tcp"): the only
 * file that frames RTRS's operations on a byte stream (struct rtrs_tcp_hdr,
 * rtrs-proto.h; docs/protocol.md section 15).
 *
 * Poll groups. A process runs a fixed set of group threads ("rtrs-tcp-N",
 * one per CPU unless fab_tcp_groups() said otherwise), started with the
 * first tcp fab and stopped with the last. Every connection belongs to one
 * group for its life, the one with the fewest connections when it was
 * made. A group owns an io_uring: each of its connections has at most one
 * poll for input and one for output armed in it, and the group waits for
 * all of them, and for its eventfd, in one io_uring_enter per pass. A
 * readable connection gets TCP_RX_BUDGET frames per pass; one with more
 * waits on the group's ready list behind the others, so a peer that floods
 * gets its share and no more. Other threads hand a group work through the
 * connection's work bits (queue_work): start, flush, completions, kick,
 * destroy. Every callback of a connection runs on its group's thread.
 *
 * Data goes to its place: a WRITE's payload into the region its key names
 * (checked against the region's bounds and access first), a SEND's into
 * the connection's receive buffer; large payloads are read straight into
 * it, small ones copied from a read-ahead (see TCP_RX_AHEAD). Sends go
 * out inline from the posting thread when nothing is queued before them
 * (sendmsg, MSG_DONTWAIT); what does not fit is queued and flushed by the
 * group when the socket takes more.
 *
 * Memory keys are the domain's: a keyed permutation of a counter
 * (keyperm.h), as in the other fabrics, so that a key tells nothing of
 * its neighbours; 32-bit keys skip those still registered, 64-bit keys
 * (FAB_MR_KEY64) never repeat. A region's remote offsets start at 0.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "keyperm.h"
#include "log.h"
#include "rtrs-fabric.h"
#include "rtrs-proto.h"
#include "rtrs-tls.h"
#include "rtrs.h"
#include "util.h"

#define TCP_RX_BUDGET 64        /* frames a connection gets per group pass */
#define TCP_RX_FLUSH 16         /* what the frames of a turn answered leaves after this many */
#define TCP_INJECT 64           /* fab_write_imm_data bytes */
#define TCP_IOV_LIMIT 32
#define TCP_RMA_LIMIT 16
#define TCP_QUEUE_DEFAULT 1024
#define TCP_QUEUE_MAX 65600
#define TCP_RING_SQ 512
#define TCP_RING_CQ 16384
/*
 * Iovecs gathered into one sendmsg by a flush. A frame takes 2 to 4 (its
 * header, the payload, a user header, a new key), so 64 split a flush of
 * 30 answered 4 KiB reads into 2 or 3 calls, and each call pushes its own
 * segments: 256 took 7-9 % off the CPU per 4 KiB IO of writes and of
 * always_invalidate reads (bench/RESULTS.md, 2026-12-04).
 */
#define TCP_FLUSH_IOV 256
#define TCP_STOP_DRAIN_MS 2000 /* a stopping group waits for its releases this long */
/*
 * Read-ahead. After a frame whose payload was at most TCP_LA_SMALL bytes,
 * the next read takes up to TCP_RX_AHEAD bytes into the reading thread's
 * buffer (struct rx_ahead), so that a run of small frames (4 KiB IOs,
 * their requests and responses) costs one recvmsg for all of them, not one
 * each: the kernel's per-call cost is several times that of copying 4 KiB
 * from a buffer that is hot in the cache (bench/RESULTS.md, 2026-12-03).
 * Payload bytes caught in it are copied to their place. A frame larger than
 * TCP_LA_SMALL has the rest of its payload read straight into place, with
 * only the next header beside it, so bulk data is never copied but for
 * what one read-ahead caught of it. Bytes a turn read but could not take
 * (its budget ran out) wait in the connection's stash until its next turn:
 * nothing per connection is kept between turns otherwise.
 */
#define TCP_RX_AHEAD (64 * 1024)
/*
 * Queued frames (struct tcp_txf) whose iovecs and copied bytes fit
 * TCP_TXF_SMALL, as a response or a request header does, are kept, up to
 * TCP_TXF_CACHE of them, by the thread that sent them (struct txf_cache):
 * a group's pass queues its answers and frees them in the flush, more
 * than malloc's per-thread cache holds.
 */
#define TCP_TXF_SMALL 256
#define TCP_TXF_CACHE 64
#define TCP_LA_SMALL (8 * 1024)
#define TCP_LA_RUN 8
#define TCP_LA_SHORT (16 * RTRS_TCP_HDR_LEN)
/* The memory keys' table starts this small and doubles past one region a bucket. */
#define TCP_MR_BUCKETS_MIN 16
/*
 * The table's locks: bucket b is under stripe b % TCP_MR_STRIPES (a power
 * of 2 no larger than TCP_MR_BUCKETS_MIN, so that a key's stripe does not
 * change when the table doubles). A 4 KiB read takes a stripe three times
 * (the client's registration, the server's write into it, the
 * deregistration), an always_invalidate write as often on the server: a
 * mutex costs a third of a reader-writer lock's pair there (bench/RESULTS.md,
 * 2026-12-06, second section), and stripes keep the group threads of a
 * server, each looking up keys for its own connections, off one lock.
 */
#define TCP_MR_STRIPES 16
/*
 * Deregistered regions kept for the next registration, per stripe (struct
 * mr_stripe.free): a read registers the caller's buffer and an
 * always_invalidate chunk gets a new key on every IO, and malloc's
 * per-thread caches miss when another thread frees what one allocated.
 */
#define TCP_MR_CACHE 8
#define TCP_ACCEPT_BATCH 256    /* accepts per listener event */
#define TCP_GROUPS_MAX RTRS_MAX_POLL_GROUPS

/* cqe user_data tags: the low bits of a connection's address */
#define TAG_RX 1u
#define TAG_TX 2u
#define TAG_MASK 3u
#define UD_EFD 0u               /* the group's eventfd read */
#define UD_IGNORE 3u            /* poll removals: nothing to do on their completion */

/* Work for a group (struct fab_con.work) */
enum {
	W_START = 1u << 0,   /* arm the first polls (and, server: connected) */
	W_FLUSH = 1u << 1,   /* the send queue has frames */
	W_DONE = 1u << 2,    /* completions to deliver */
	W_KICK = 1u << 3,    /* ops->kick */
	W_RETRY = 1u << 4,   /* ops->kick after the next completion, room, or 1 ms */
	W_DESTROY = 1u << 5, /* let go of it */
	W_FAIL = 1u << 6,    /* a send met an error: down */
	W_LEASE = 1u << 7,   /* a poller's turn left input: read at the lease's end */
};

struct tcp_mr {
	struct tcp_mr *next;     /* the fab's hash chain */
	uint64_t key;
	char *buf;
	size_t len;
	unsigned access;
	atomic_uint refs;        /* the table's, and one per connection writing into it */
	atomic_uint active;      /* recvmsg calls writing into it right now */
	atomic_bool dead;        /* deregistered: no write may start */
	struct fab *fab;
};

struct mr_stripe {
	pthread_mutex_t lock;          /* its buckets of fab.mr_tab, and free */
	struct tcp_mr *free;           /* deregistered, no reference left */
	unsigned nfree;
} __attribute__((aligned(64)));

struct fab {
	const struct fab_ops *ops; /* first: struct fab_obj */
	struct fab_attr attr;
	bool server;
	struct sockaddr_storage addr;  /* client: the destination; server: where to listen */
	socklen_t addrlen;
	struct sockaddr_storage src;   /* client: the source, if given */
	socklen_t srclen;
	struct mr_stripe mr_stripes[TCP_MR_STRIPES];
	/* mr_nb buckets, a power of 2: read under any stripe, changed under all */
	struct tcp_mr **mr_tab;
	atomic_size_t mr_nb;
	/* Written on every registration: a line of their own, away from what look-ups read. */
	_Alignas(64) atomic_size_t mr_count; /* regions in the table */
	atomic_uint_fast64_t next_key;
	atomic_uint_fast64_t next_key64;
	_Alignas(64) struct keyperm keys;
	enum fab_tls_mode tls_mode;    /* fab_set_tls */
	pthread_mutex_t tls_lock;      /* tls: it may change (a client's key rotated) */
	struct rtrs_tls_ctx *tls;
};

struct tcp_group {
	unsigned idx;
	pthread_t thread;
	struct io_uring ring;
	bool r_disabled;               /* the ring waits for its thread (io_uring_enable_rings) */
	int efd;
	uint64_t efd_val;
	atomic_bool woken;             /* an eventfd write is on its way */
	pthread_mutex_t lock;          /* the work list */
	struct fab_con *work_head, *work_tail;
	atomic_uint nr_cons;
	atomic_bool stop;
	/* The group thread's own */
	unsigned releasing;                       /* released, polls still to come back */
	struct fab_con *ready_head, *ready_tail;  /* readable, budget spent */
	struct fab_con *retry_head;               /* retry_later */
	struct fab_con *lease_head;               /* readable while a poller has them */
	struct fab_con *cork_head;                /* frames posted by this thread, to send */
	/* Written by the group thread only; read by fab_tcp_group_stats. */
	atomic_uint_fast64_t passes;
	atomic_uint_fast64_t budget_yields;       /* a connection's turn ended with input left */
	atomic_uint max_turn;                     /* the most frames one turn read */
};

static struct {
	pthread_mutex_t lock;
	unsigned users;        /* open tcp fabs */
	unsigned want;         /* fab_tcp_groups(); 0: one per CPU */
	uint32_t feat_mask;    /* fab_tcp_features_mask() */
	unsigned n;
	struct tcp_group *g;
} grp = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* A frame or a chain of them waiting to go out. */
struct tcp_txf {
	struct tcp_txf *next;
	void *ctx;
	bool counted;            /* against tx_max: the owner's, not a CONNECT */
	bool small;              /* TCP_TXF_SMALL bytes of data: a thread's cache may keep it */
	unsigned niov, cur;
	struct iovec *iov;
	char data[];             /* the iovecs, then the bytes copied */
};

enum tcp_state {
	TC_CONNECTING,  /* client: the TCP connect is under way */
	TC_TLS,         /* client: the TLS handshake is under way (CONNECT waits) */
	TC_HELLO,       /* client: CONNECT sent, waiting for ACCEPT or REJECT */
	TC_UP,
	TC_DOWN,
};

struct fab_con {
	const struct fab_ops *ops;
	struct fab *fab;
	struct fab_con_cfg cfg;
	struct fab_con_name name;
	int fd;
	bool server;
	struct tcp_group *g;
	/* Work from other threads: the bits, and the group's list (under g->lock). */
	atomic_uint work;
	bool on_work;
	struct fab_con *work_next;
	struct fab_done *dw;
	atomic_bool shut;        /* fab_con_shutdown */
	atomic_bool down_called;
	atomic_bool destroying;
	atomic_bool retry;
	/* Sending, under tx_lock */
	pthread_mutex_t tx_lock;
	struct tcp_txf *txq_head, *txq_tail;
	unsigned tx_n, tx_max;
	bool tx_open;            /* the socket is connected: frames may go out inline */
	bool tx_dead;            /* a send failed, or shut down: posts are dropped */
	int tx_err;
	void **dctx;             /* completions to deliver, in order */
	size_t dctx_n, dctx_cap;
	/* The group thread's own */
	enum tcp_state state;
	bool rx_armed, tx_armed, tx_want;
	bool on_ready;
	struct fab_con *ready_next;
	bool on_cork;            /* frames its group's callbacks posted wait for group_uncork */
	struct fab_con *cork_next;
	bool on_retry;
	bool released;           /* con_release ran: freed once its polls are back */
	struct fab_con *retry_next;
	uint64_t retry_at;
	bool on_lease;
	struct fab_con *lease_next;
	uint64_t lease_at;
	unsigned char hdr[RTRS_TCP_HDR_LEN];
	size_t hdr_got;
	bool in_payload;
	bool la_want;            /* the last frame was small: the next read reads ahead */
	uint8_t small_run;       /* small frames in a row, up to TCP_LA_RUN */
	uint32_t la_avg;         /* payload bytes a frame has, a moving average (7/8 kept) */
	unsigned char *stash;    /* read ahead, not taken: stash[stash_off .. stash_len) */
	size_t stash_off, stash_len;
	struct rtrs_tcp_frame fr;
	char *dst;
	size_t left;
	struct tcp_mr *mr;
	char cm[RTRS_TCP_CM_MAX];
	/*
	 * TLS: the connection's (NULL without); tls_io while OpenSSL makes
	 * the records (without kernel TLS). tls_plain: a TLS client's server
	 * answered in the clear, which only a REJECT may be.
	 */
	struct rtrs_tls *tls;
	bool tls_io;
	bool tls_plain;
	bool tls_heard;          /* bytes of TLS came from the server: no more peeking */
	/*
	 * Every callback runs under cb_lock, on the group's thread or on a
	 * poller's (fab_con_poll); so does everything that reads the socket.
	 */
	pthread_mutex_t cb_lock;
	_Atomic(struct fab_poller *) poller;
	/* The receive buffer (fab_con_rx_setup): one, as each is given back on return. */
	pthread_mutex_t rx_lock;
	char *rx_buf;
	size_t rx_size;
	uint64_t frames_in;
};

struct fab_lst;

struct tcp_raw {
	int fd;
	size_t idx;              /* in the listener's list */
	uint64_t since_ms;
	uint64_t last_ms;        /* bytes last came (since_ms until then) */
	bool spoke;              /* bytes have come */
	bool plain;              /* its first byte was not TLS's */
	struct rtrs_tls *tls;    /* a TLS handshake, then its records */
	bool tls_io;             /* the records are OpenSSL's (no kernel TLS) */
	bool want_out;           /* the handshake waits to write: EPOLLOUT */
	size_t got;
	char peer[INET6_ADDRSTRLEN + 8];
	unsigned char buf[RTRS_TCP_HDR_LEN + RTRS_TCP_CM_MAX];
};

struct fab_lst {
	const struct fab_ops *ops;
	struct fab *fab;
	int lfd, epfd, port, spare_fd;
	bool lfd_paused;           /* out of fds with no spare: lfd out of epfd until a sweep */
	struct fab_lst_limits lim;
	struct tcp_raw **raw;
	size_t nr_raw, cap;
	uint64_t closed;
};

struct fab_connreq {
	const struct fab_ops *ops;
	struct fab_lst *l;
	struct tcp_raw *r;
	bool answered;
};

static const char *con_name(const struct fab_con *c)
{
	return fab_con_name_get(&c->name);
}

static void sockaddr_str(const void *sa, char *buf, size_t len)
{
	const struct sockaddr *s = sa;
	char host[INET6_ADDRSTRLEN] = "?";
	unsigned port = 0;

	if (s->sa_family == AF_INET) {
		const struct sockaddr_in *in = sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
		snprintf(buf, len, "%s:%u", host, port);
	} else if (s->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
		snprintf(buf, len, "[%s]:%u", host, port);
	} else {
		snprintf(buf, len, "?");
	}
}

/* ---- groups -------------------------------------------------------------------- */

void fab_tcp_groups(unsigned n)
{
	pthread_mutex_lock(&grp.lock);
	grp.want = MIN(n, TCP_GROUPS_MAX);
	pthread_mutex_unlock(&grp.lock);
}

void fab_tcp_features_mask(uint32_t features)
{
	pthread_mutex_lock(&grp.lock);
	grp.feat_mask = features;
	pthread_mutex_unlock(&grp.lock);
}

unsigned fab_tcp_groups_running(void)
{
	unsigned n;

	pthread_mutex_lock(&grp.lock);
	n = grp.users ? grp.n : 0;
	pthread_mutex_unlock(&grp.lock);
	return n;
}

static void group_wake(struct tcp_group *g)
{
	uint64_t one = 1;

	if (atomic_exchange(&g->woken, true))
		return;
	if (write(g->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn_rl("tcp group %u: eventfd write: %s", g->idx, strerror(errno));
}

static struct io_uring_sqe *group_sqe(struct tcp_group *g)
{
	struct io_uring_sqe *sqe;

	while (!(sqe = io_uring_get_sqe(&g->ring)))
		io_uring_submit(&g->ring);
	return sqe;
}

static void efd_arm(struct tcp_group *g)
{
	struct io_uring_sqe *sqe = group_sqe(g);

	/* A poll, not a read: a blocking read would be punted to an io-wq worker thread. */
	io_uring_prep_poll_add(sqe, g->efd, POLLIN);
	io_uring_sqe_set_data64(sqe, UD_EFD);
}

static void queue_work(struct fab_con *c, unsigned bits)
{
	struct tcp_group *g = c->g;
	bool wake = false;

	/*
	 * The bits under the lock: the group takes them only after it took c
	 * off its list under the lock, so a W_DESTROY cannot free c before
	 * this call is done with it.
	 */
	pthread_mutex_lock(&g->lock);
	atomic_fetch_or(&c->work, bits);
	if (!c->on_work) {
		c->on_work = true;
		c->work_next = NULL;
		if (g->work_tail)
			g->work_tail->work_next = c;
		else
			g->work_head = c;
		g->work_tail = c;
		wake = true;
	}
	pthread_mutex_unlock(&g->lock);
	/* The group's own thread looks at its list before it sleeps (group_thread). */
	if (wake && !pthread_equal(pthread_self(), g->thread))
		group_wake(g);
}

static bool on_group_thread(const struct fab_con *c)
{
	return c->g && pthread_equal(pthread_self(), c->g->thread);
}

/* A connection whose callbacks must stay silent: shut down, gone down or going. */
static bool con_quiet(struct fab_con *c)
{
	return atomic_load(&c->shut) || atomic_load(&c->down_called) ||
	       atomic_load(&c->destroying);
}

static void con_down(struct fab_con *c, int err, const void *data, size_t len)
{
	c->state = TC_DOWN;
	if (atomic_load(&c->shut) || atomic_load(&c->destroying) ||
	    atomic_exchange(&c->down_called, true))
		return;
	c->cfg.ops->down(c->cfg.priv, err, data, len);
}

static void mr_put(struct tcp_mr *mr);

/* The connection failed: no more input, nothing more sent, down() once. */
static void con_fail(struct fab_con *c, int err, const void *data, size_t len)
{
	pthread_mutex_lock(&c->tx_lock);
	c->tx_dead = true;
	pthread_mutex_unlock(&c->tx_lock);
	if (c->mr) {
		mr_put(c->mr);
		c->mr = NULL;
	}
	c->in_payload = false;
	shutdown(c->fd, SHUT_RDWR);
	con_down(c, err, data, len);
}

static void arm_rx(struct fab_con *c)
{
	struct io_uring_sqe *sqe;

	if (c->rx_armed || c->on_ready || c->state == TC_DOWN || atomic_load(&c->destroying))
		return;
	sqe = group_sqe(c->g);
	io_uring_prep_poll_add(sqe, c->fd, POLLIN | POLLRDHUP);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | TAG_RX);
	c->rx_armed = true;
}

static void arm_tx(struct fab_con *c)
{
	struct io_uring_sqe *sqe;

	if (c->tx_armed || c->state == TC_DOWN || atomic_load(&c->destroying))
		return;
	sqe = group_sqe(c->g);
	io_uring_prep_poll_add(sqe, c->fd, POLLOUT);
	io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)c | TAG_TX);
	c->tx_armed = true;
}

static void ready_add(struct fab_con *c)
{
	struct tcp_group *g = c->g;

	if (c->on_ready)
		return;
	c->on_ready = true;
	c->ready_next = NULL;
	if (g->ready_tail)
		g->ready_tail->ready_next = c;
	else
		g->ready_head = c;
	g->ready_tail = c;
}

/*
 * Group thread: c has frames that one of the group's callbacks posted.
 * They leave together when the callback's turn is over (group_uncork):
 * a turn that answers or issues many requests sends them in one sendmsg.
 */
static void cork_add(struct fab_con *c)
{
	struct tcp_group *g = c->g;

	if (c->on_cork)
		return;
	c->on_cork = true;
	c->cork_next = g->cork_head;
	g->cork_head = c;
}

static void cork_forget(struct fab_con *c)
{
	struct fab_con **pp = &c->g->cork_head;

	if (!c->on_cork)
		return;
	while (*pp && *pp != c)
		pp = &(*pp)->cork_next;
	if (*pp)
		*pp = c->cork_next;
	c->on_cork = false;
}

static void con_flush(struct fab_con *c);

/* Group thread, holding no connection's cb_lock: sends what the turn just over posted. */
static void group_uncork(struct tcp_group *g)
{
	struct fab_con *c;

	while ((c = g->cork_head)) {
		g->cork_head = c->cork_next;
		c->on_cork = false;
		if (atomic_load(&c->destroying) || c->released)
			continue;
		pthread_mutex_lock(&c->cb_lock);
		con_flush(c);
		pthread_mutex_unlock(&c->cb_lock);
	}
}

/* ---- memory regions ------------------------------------------------------------ */

/* Keys are a keyed permutation's output (keyperm.h): their low bits spread evenly. */
static size_t mr_hash(uint64_t key)
{
	return (size_t)(key ^ (key >> 29));
}

/* The stripe whose lock covers key's bucket, at any table size. */
static struct mr_stripe *mr_stripe_of(struct fab *f, uint64_t key)
{
	return &f->mr_stripes[mr_hash(key) & (TCP_MR_STRIPES - 1)];
}

/* key's stripe held */
static struct tcp_mr **mr_chain(struct fab *f, uint64_t key)
{
	return &f->mr_tab[mr_hash(key) & (atomic_load_explicit(&f->mr_nb, memory_order_relaxed) - 1)];
}

static struct tcp_mr *mr_find_locked(struct fab *f, uint64_t key)
{
	for (struct tcp_mr *m = *mr_chain(f, key); m; m = m->next)
		if (m->key == key)
			return m;
	return NULL;
}

static void mr_put(struct tcp_mr *mr)
{
	if (atomic_fetch_sub(&mr->refs, 1) == 1)
		free(mr);
}

/* A region a peer may write len bytes into at off, with a reference; NULL and *why if none. */
static struct tcp_mr *mr_get_remote(struct fab *f, uint64_t key, uint64_t off, uint64_t len,
				    const char **why)
{
	struct mr_stripe *st = mr_stripe_of(f, key);
	struct tcp_mr *m;

	pthread_mutex_lock(&st->lock);
	m = mr_find_locked(f, key);
	if (!m)
		*why = "write to an unknown key";
	else if (!(m->access & FAB_MR_REMOTE_WRITE))
		*why = "write to a key without remote access";
	else if (off > m->len || len > m->len - off)
		*why = "write beyond the region of its key";
	else
		atomic_fetch_add(&m->refs, 1);
	pthread_mutex_unlock(&st->lock);
	return *why ? NULL : m;
}

/*
 * Doubles the table, taking every stripe: a server holds every session's
 * chunks in one table, 64,000 regions for 1000 sessions of 64, and a
 * lookup per incoming write must stay one short chain.
 */
static void mr_grow(struct fab *f)
{
	size_t nb, ob;
	struct tcp_mr **tab;

	for (unsigned i = 0; i < TCP_MR_STRIPES; i++)
		pthread_mutex_lock(&f->mr_stripes[i].lock);
	ob = atomic_load(&f->mr_nb);
	nb = ob * 2;
	/* Another registration may have grown it meanwhile; stays as it is when memory is short. */
	tab = atomic_load(&f->mr_count) > ob ? calloc(nb, sizeof(*tab)) : NULL;
	if (tab) {
		for (size_t i = 0; i < ob; i++) {
			for (struct tcp_mr *m = f->mr_tab[i], *n; m; m = n) {
				size_t b = mr_hash(m->key) & (nb - 1);

				n = m->next;
				m->next = tab[b];
				tab[b] = m;
			}
		}
		free(f->mr_tab);
		f->mr_tab = tab;
		atomic_store(&f->mr_nb, nb);
	}
	for (unsigned i = TCP_MR_STRIPES; i-- > 0;)
		pthread_mutex_unlock(&f->mr_stripes[i].lock);
}

static int tcp_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	struct mr_stripe *st = NULL;
	struct tcp_mr *m = NULL;
	uint64_t key = 0;
	int tries;

	memset(mr, 0, sizeof(*mr));
	mr->buf = buf;
	mr->len = len;
	/* Local memory needs nothing: the socket reads and writes it. */
	if (!(access & FAB_MR_REMOTE_WRITE))
		return 0;
	for (tries = 0; tries < 64; tries++) {
		if (access & FAB_MR_KEY64)
			key = keyperm_key64(&f->keys, atomic_fetch_add(&f->next_key64, 1));
		else
			key = keyperm_key32(&f->keys, (uint32_t)(atomic_fetch_add(&f->next_key, 1) %
								 KEYPERM_KEY32_MAX));
		st = mr_stripe_of(f, key);
		pthread_mutex_lock(&st->lock);
		if (!m && st->free) {
			m = st->free;
			st->free = m->next;
			st->nfree--;
		}
		if (!m) {
			pthread_mutex_unlock(&st->lock);
			m = malloc(sizeof(*m));
			if (!m)
				return -ENOMEM;
			pthread_mutex_lock(&st->lock);
		}
		if (!mr_find_locked(f, key))
			break;
		pthread_mutex_unlock(&st->lock);
	}
	if (tries == 64) {
		free(m);
		log_err("tcp: no free memory key after 64 tries");
		return -ENOSPC;
	}
	m->buf = buf;
	m->len = len;
	m->access = access;
	m->fab = f;
	m->key = key;
	atomic_init(&m->refs, 1);
	atomic_init(&m->active, 0);
	atomic_init(&m->dead, false);
	{
		struct tcp_mr **chain = mr_chain(f, key);

		m->next = *chain;
		*chain = m;
	}
	pthread_mutex_unlock(&st->lock);
	if (atomic_fetch_add(&f->mr_count, 1) + 1 > atomic_load(&f->mr_nb))
		mr_grow(f);
	mr->ops = &fab_tcp_ops;
	mr->priv = m;
	mr->key = key;
	mr->base = 0;
	return 0;
}

static void tcp_mr_dereg(struct fab_mr *mr)
{
	struct tcp_mr *m = mr->priv, **pp;
	struct mr_stripe *st;
	struct fab *f;

	if (!m)
		return;
	f = m->fab;
	/*
	 * No write starts into it from now on; one inside recvmsg ends soon
	 * (the socket is non-blocking). A connection that was half way through
	 * a payload for it, or finds its key before it leaves the table, fails
	 * on its next read, as a write to a revoked key does on RDMA.
	 */
	atomic_store(&m->dead, true);
	while (atomic_load(&m->active))
		sched_yield();
	st = mr_stripe_of(f, m->key);
	pthread_mutex_lock(&st->lock);
	for (pp = mr_chain(f, m->key); *pp; pp = &(*pp)->next) {
		if (*pp == m) {
			*pp = m->next;
			atomic_fetch_sub(&f->mr_count, 1);
			break;
		}
	}
	/*
	 * Out of the table, no connection can take a reference (mr_get_remote
	 * takes them under the stripe's lock): with none held, it is kept for
	 * the next registration; else the last connection's mr_put frees it.
	 */
	if (atomic_load(&m->refs) == 1 && st->nfree < TCP_MR_CACHE) {
		m->next = st->free;
		st->free = m;
		st->nfree++;
		m = NULL;
	}
	pthread_mutex_unlock(&st->lock);
	mr->priv = NULL;
	mr->ops = NULL;
	if (m)
		mr_put(m);
}

/* With no region registered, the kept ones go back to the heap. */
static void tcp_trim(struct fab *f)
{
	unsigned nfree = 0;

	if (atomic_load(&f->mr_count))
		return;
	for (unsigned i = 0; i < TCP_MR_STRIPES; i++) {
		struct mr_stripe *st = &f->mr_stripes[i];
		struct tcp_mr *m, *n;

		pthread_mutex_lock(&st->lock);
		m = st->free;
		nfree += st->nfree;
		st->free = NULL;
		st->nfree = 0;
		pthread_mutex_unlock(&st->lock);
		for (; m; m = n) {
			n = m->next;
			free(m);
		}
	}
	if (nfree)
		log_dbg("fabric: tcp trim: %u kept memory regions given back", nfree);
}

/* ---- sending ------------------------------------------------------------------- */

struct txf_cache {
	unsigned n;
	struct tcp_txf *head;
};

static pthread_key_t txf_key;
static bool txf_keyed;
static pthread_once_t txf_once = PTHREAD_ONCE_INIT;
static __thread struct txf_cache *txf_mine;

static void txf_cache_free(void *p)
{
	struct txf_cache *tc = p;

	for (struct tcp_txf *t = tc->head, *n; t; t = n) {
		n = t->next;
		free(t);
	}
	free(tc);
	txf_mine = NULL;
}

static void txf_key_make(void)
{
	txf_keyed = pthread_key_create(&txf_key, txf_cache_free) == 0;
}

/* A queue entry with room for need bytes of iovecs and copies. */
static struct tcp_txf *txf_alloc(size_t need)
{
	struct txf_cache *tc = txf_mine;
	struct tcp_txf *t;

	if (need > TCP_TXF_SMALL) {
		t = malloc(sizeof(*t) + need);
		if (t)
			t->small = false;
		return t;
	}
	if (tc && tc->head) {
		t = tc->head;
		tc->head = t->next;
		tc->n--;
		return t;
	}
	t = malloc(sizeof(*t) + TCP_TXF_SMALL);
	if (t)
		t->small = true;
	return t;
}

static void txf_release(struct tcp_txf *t)
{
	struct txf_cache *tc = txf_mine;

	if (t->small && !tc) {
		pthread_once(&txf_once, txf_key_make);
		tc = txf_keyed ? calloc(1, sizeof(*tc)) : NULL;
		if (tc && pthread_setspecific(txf_key, tc)) {
			free(tc);
			tc = NULL;
		}
		txf_mine = tc;
	}
	if (t->small && tc && tc->n < TCP_TXF_CACHE) {
		t->next = tc->head;
		tc->head = t;
		tc->n++;
		return;
	}
	free(t);
}

/* Under tx_lock: a completion for the group to deliver. */
static int dctx_add(struct fab_con *c, void *ctx)
{
	if (c->dctx_n == c->dctx_cap) {
		size_t cap = c->dctx_cap ? c->dctx_cap * 2 : 16;
		void **n = realloc(c->dctx, cap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		c->dctx = n;
		c->dctx_cap = cap;
	}
	c->dctx[c->dctx_n++] = ctx;
	return 0;
}

static size_t iov_total(const struct iovec *iov, unsigned n)
{
	size_t t = 0;

	for (unsigned i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Skips done bytes of iov[*cur..n). */
static void iov_advance(struct iovec *iov, unsigned n, unsigned *cur, size_t done)
{
	while (*cur < n && done) {
		size_t take = MIN(done, iov[*cur].iov_len);

		iov[*cur].iov_base = (char *)iov[*cur].iov_base + take;
		iov[*cur].iov_len -= take;
		done -= take;
		if (!iov[*cur].iov_len)
			(*cur)++;
	}
	while (*cur < n && !iov[*cur].iov_len)
		(*cur)++;
}

/*
 * Under tx_lock: queues what is left of iov[cur..n) as one entry. Bytes in
 * [keep, keep + keep_len) (the frame headers, on the poster's stack) and,
 * with copy_all, all of them are copied; the rest stays where it is, the
 * caller's until its completion, as on RDMA.
 */
static int txq_add(struct fab_con *c, const struct iovec *iov, unsigned n, unsigned cur,
		   const void *keep, size_t keep_len, bool copy_all, void *ctx)
{
	size_t copy = 0, niov = n - cur;
	struct tcp_txf *t;
	char *p;

	for (unsigned i = cur; i < n; i++) {
		const char *b = iov[i].iov_base;

		if (copy_all || (b >= (const char *)keep && b < (const char *)keep + keep_len))
			copy += iov[i].iov_len;
	}
	t = txf_alloc(niov * sizeof(struct iovec) + copy);
	if (!t)
		return -ENOMEM;
	t->next = NULL;
	t->ctx = ctx;
	t->counted = true;
	t->niov = (unsigned)niov;
	t->cur = 0;
	t->iov = (struct iovec *)t->data;
	p = t->data + niov * sizeof(struct iovec);
	for (unsigned i = cur; i < n; i++) {
		const char *b = iov[i].iov_base;
		struct iovec *d = &t->iov[i - cur];

		if (copy_all || (b >= (const char *)keep && b < (const char *)keep + keep_len)) {
			memcpy(p, b, iov[i].iov_len);
			*d = (struct iovec){ p, iov[i].iov_len };
			p += iov[i].iov_len;
		} else {
			*d = iov[i];
		}
	}
	if (c->txq_tail)
		c->txq_tail->next = t;
	else
		c->txq_head = t;
	c->txq_tail = t;
	c->tx_n++;
	return 0;
}

/*
 * Posts frames: inline when nothing waits before them, else queued for
 * the group. 0 also when the connection is broken or shut down: the frames
 * are dropped, as a QP in error drops what is posted to it, and the owner
 * hears of it through down(). -EAGAIN when tx_depth entries are queued.
 * left (fab_write_left), when not NULL: set true when every byte went
 * inline, and then no completion comes for ctx; false when some wait in
 * the queue (or were dropped), and ctx completes once they have left.
 */
/* The socket's sendmsg, or OpenSSL's records. */
static ssize_t con_sendv(struct fab_con *c, struct iovec *iov, unsigned n)
{
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = n };

	if (c->tls_io)
		return rtrs_tls_writev(c->tls, iov, n);
	return sendmsg(c->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* Encrypted bytes wait in user space for the socket. */
static bool con_tls_pending(struct fab_con *c)
{
	return c->tls_io && rtrs_tls_pending(c->tls);
}

static int tx_post(struct fab_con *c, struct iovec *iov, unsigned n, const void *keep,
		   size_t keep_len, bool copy_all, void *ctx, bool *left)
{
	unsigned cur = 0;
	unsigned bits = 0;
	bool partial = false;
	int rc = 0;

	if (left)
		*left = false;
	pthread_mutex_lock(&c->tx_lock);
	if (c->tx_dead) {
		pthread_mutex_unlock(&c->tx_lock);
		return 0;
	}
	if (c->tx_n >= c->tx_max) {
		pthread_mutex_unlock(&c->tx_lock);
		return -EAGAIN;
	}
	/*
	 * Inline, unless the group's own thread posts (a callback of its
	 * pass): then the frames wait for the pass's end and leave with the
	 * others of the pass in one sendmsg (con_flush from the work list).
	 */
	bool cork = on_group_thread(c);

	if (c->tx_open && !c->txq_head && !cork && !con_tls_pending(c)) {
		size_t total = iov_total(iov, n);
		ssize_t w = con_sendv(c, iov, n);

		if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			c->tx_dead = true;
			c->tx_err = -errno;
			pthread_mutex_unlock(&c->tx_lock);
			queue_work(c, W_FAIL);
			return 0;
		}
		if (w > 0 && (size_t)w == total) {
			/*
			 * User-space TLS takes the frame whole into its records but
			 * may not get them all onto the socket: the group sends the
			 * rest (tx_flush), with a wait for room if need be.
			 */
			if (con_tls_pending(c))
				bits |= W_FLUSH;
			if (left) {
				*left = true; /* TLS copied it into its records */
			} else if (ctx) {
				rc = dctx_add(c, ctx);
				bits |= W_DONE;
			}
			if (rc) {
				/* It left, and its done cannot be kept: the connection fails. */
				c->tx_dead = true;
				c->tx_err = rc;
				bits = W_FAIL;
				rc = 0;
			}
			pthread_mutex_unlock(&c->tx_lock);
			if (bits)
				queue_work(c, bits);
			return rc;
		}
		if (w > 0) {
			iov_advance(iov, n, &cur, (size_t)w);
			partial = true;
		}
	}
	rc = txq_add(c, iov, n, cur, keep, keep_len, copy_all, ctx);
	if (rc && partial) {
		/*
		 * Part of the frame is on the stream and the rest has no room:
		 * the stream is out of step, so the connection fails (the post
		 * is not refused: the peer may act on what it got).
		 */
		c->tx_dead = true;
		c->tx_err = rc;
		pthread_mutex_unlock(&c->tx_lock);
		queue_work(c, W_FAIL);
		return 0;
	}
	pthread_mutex_unlock(&c->tx_lock);
	if (!rc && cork)
		cork_add(c);
	else if (!rc)
		queue_work(c, W_FLUSH);
	return rc;
}

/*
 * Group thread: sends what is queued, as much as the socket takes. True
 * when the queue is empty; false when it waits for room (POLLOUT) or the
 * connection failed (*err).
 */
static bool tx_flush(struct fab_con *c, bool *delivered, int *err)
{
	struct iovec iov[TCP_FLUSH_IOV];
	bool empty, room = false;

	*err = 0;
	pthread_mutex_lock(&c->tx_lock);
	while (c->tx_open && !c->tx_dead) {
		unsigned n = 0;
		ssize_t w;

		if (!c->txq_head) {
			/* The last records may wait in user space. */
			int prc = c->tls_io ? rtrs_tls_push(c->tls) : 0;

			if (prc && prc != -EAGAIN) {
				c->tx_dead = true;
				*err = prc;
			}
			break;
		}
		for (struct tcp_txf *t = c->txq_head; t && n < TCP_FLUSH_IOV; t = t->next)
			for (unsigned i = t->cur; i < t->niov && n < TCP_FLUSH_IOV; i++)
				iov[n++] = t->iov[i];
		w = con_sendv(c, iov, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (w < 0) {
			c->tx_dead = true;
			*err = -errno;
			break;
		}
		/* The bytes sent close entries in order. */
		size_t done = (size_t)w;

		for (struct tcp_txf *t = c->txq_head; t && done; t = t->next) {
			size_t take = MIN(done, iov_total(t->iov + t->cur, t->niov - t->cur));

			iov_advance(t->iov, t->niov, &t->cur, take);
			done -= take;
		}
		while (c->txq_head && c->txq_head->cur == c->txq_head->niov) {
			struct tcp_txf *t = c->txq_head;

			c->txq_head = t->next;
			if (!c->txq_head)
				c->txq_tail = NULL;
			room |= t->counted;
			c->tx_n -= t->counted;
			if (t->ctx && !dctx_add(c, t->ctx)) {
				*delivered = true;
			} else if (t->ctx) {
				/* Its done cannot be kept: the connection fails, as a lost send would. */
				c->tx_dead = true;
				*err = -ENOMEM;
			}
			txf_release(t);
		}
	}
	empty = !c->txq_head && !con_tls_pending(c);
	pthread_mutex_unlock(&c->tx_lock);
	/*
	 * Room made in the queue: a post refused for tx_depth
	 * (con_retry_later) is due now, not at the next tick; frames without
	 * a completion (a server's responses) make room only here.
	 */
	if (room && c->on_retry)
		c->retry_at = 0;
	return empty && !*err;
}

/* ---- receiving ----------------------------------------------------------------- */

static void con_protocol_error(struct fab_con *c, const char *why)
{
	log_warn_rl("%s: peer broke the frame protocol: %s", con_name(c), why);
	con_fail(c, -EPROTO, NULL, 0);
}

/* A frame header is in c->hdr: checks it and sets up where its payload goes. */
static bool rx_frame_start(struct fab_con *c)
{
	const char *why = NULL;
	struct rtrs_tcp_frame *f = &c->fr;

	c->hdr_got = 0;
	if (rtrs_tcp_hdr_decode(c->hdr, sizeof(c->hdr), f, &why)) {
		con_protocol_error(c, why);
		return false;
	}
	c->frames_in++;
	switch (f->op) {
	case RTRS_TCP_ACCEPT:
	case RTRS_TCP_REJECT:
		if (c->state != TC_HELLO) {
			con_protocol_error(c, "connection frame on an established connection");
			return false;
		}
		if (f->op == RTRS_TCP_ACCEPT && c->tls_plain) {
			con_protocol_error(c, "the server accepted a TLS connection in the clear");
			return false;
		}
		c->dst = c->cm;
		break;
	case RTRS_TCP_WRITE:
	case RTRS_TCP_SEND:
		if (c->state != TC_UP) {
			con_protocol_error(c, "data before the connection was accepted");
			return false;
		}
		if (f->op == RTRS_TCP_WRITE) {
			c->dst = NULL;
			if (f->len) {
				c->mr = mr_get_remote(c->fab, f->key, f->off, f->len, &why);
				if (!c->mr) {
					con_protocol_error(c, why);
					return false;
				}
				c->dst = c->mr->buf + f->off;
			}
			break;
		}
		pthread_mutex_lock(&c->rx_lock);
		c->dst = c->rx_buf;
		if (!c->rx_buf)
			why = "message with no receive buffer set up";
		else if (f->len > c->rx_size)
			why = "message longer than the receive buffer";
		pthread_mutex_unlock(&c->rx_lock);
		if (why) {
			con_protocol_error(c, why);
			return false;
		}
		break;
	default:
		con_protocol_error(c, "connection request on a connection");
		return false;
	}
	c->left = f->len;
	c->in_payload = true;
	return true;
}

/* The payload is all in: the callbacks it makes. False when the connection ended. */
static bool rx_frame_end(struct fab_con *c)
{
	struct rtrs_tcp_frame *f = &c->fr;
	void *priv = c->cfg.priv;

	c->in_payload = false;
	c->la_avg = (uint32_t)(((uint64_t)c->la_avg * 7 + f->len) / 8);
	c->la_want = f->len <= TCP_LA_SMALL;
	if (!c->la_want)
		c->small_run = 0;
	else if (c->small_run < TCP_LA_RUN)
		c->small_run++;
	switch (f->op) {
	case RTRS_TCP_ACCEPT:
		c->state = TC_UP;
		if (!con_quiet(c))
			c->cfg.ops->connected(priv, c->cm, f->len);
		break;
	case RTRS_TCP_REJECT:
		con_fail(c, -ECONNREFUSED, c->cm, f->len);
		return false;
	case RTRS_TCP_WRITE:
		if (c->mr) {
			mr_put(c->mr);
			c->mr = NULL;
		}
		if (f->has_imm && !con_quiet(c))
			c->cfg.ops->imm(priv, f->imm);
		break;
	case RTRS_TCP_SEND:
		if (!con_quiet(c))
			c->cfg.ops->recv(priv, c->rx_buf, f->len);
		if (f->has_imm && !con_quiet(c))
			c->cfg.ops->imm(priv, f->imm);
		break;
	default:
		break;
	}
	return !con_quiet(c) && c->state != TC_DOWN;
}

enum rx_end { RX_EMPTY, RX_BUDGET, RX_STOP };

/*
 * A write into c->mr's region is about to start: holds it off
 * deregistration (active) unless that began; false (and c failed) then.
 */
static bool rx_mr_enter(struct fab_con *c)
{
	if (!c->mr)
		return true;
	atomic_fetch_add(&c->mr->active, 1);
	if (atomic_load(&c->mr->dead)) {
		atomic_fetch_sub(&c->mr->active, 1);
		log_warn_rl("%s: write into a key deregistered under it", con_name(c));
		con_fail(c, -EACCES, NULL, 0);
		return false;
	}
	return true;
}

static void rx_mr_exit(struct fab_con *c)
{
	if (c->mr)
		atomic_fetch_sub(&c->mr->active, 1);
}

/* A thread's read-ahead buffer: the group's, or a poller's (fab_con_poll). */
struct rx_ahead {
	bool busy;               /* a turn of this thread is using it */
	unsigned char buf[TCP_RX_AHEAD];
};

static pthread_key_t rx_ahead_key;
static bool rx_ahead_keyed;
static pthread_once_t rx_ahead_once = PTHREAD_ONCE_INIT;
static __thread struct rx_ahead *rx_ahead_mine;

static void rx_ahead_key_make(void)
{
	rx_ahead_keyed = pthread_key_create(&rx_ahead_key, free) == 0;
}

/*
 * The calling thread's buffer, taken for one turn; NULL when it cannot
 * have one (no memory) or a turn of this thread already holds it (a
 * callback that polls another connection): that turn reads without
 * read-ahead.
 */
static struct rx_ahead *rx_ahead_take(void)
{
	struct rx_ahead *ra = rx_ahead_mine;

	if (!ra) {
		pthread_once(&rx_ahead_once, rx_ahead_key_make);
		if (!rx_ahead_keyed)
			return NULL;
		ra = malloc(sizeof(*ra));
		if (!ra)
			return NULL;
		if (pthread_setspecific(rx_ahead_key, ra)) {
			free(ra);
			return NULL;
		}
		ra->busy = false;
		rx_ahead_mine = ra;
	}
	if (ra->busy)
		return NULL;
	ra->busy = true;
	return ra;
}

static void rx_ahead_give(struct rx_ahead *ra)
{
	if (ra)
		ra->busy = false;
}

/*
 * Takes bytes read ahead, buf[*off .. len): into the header, or into the
 * payload's place. Counts a frame that ended in *frames and *budget; false
 * when the connection ended.
 */
static bool rx_take_ahead(struct fab_con *c, const unsigned char *buf, size_t *off, size_t len,
			  unsigned *budget, unsigned *frames)
{
	size_t avail = len - *off, take;
	const unsigned char *from = buf + *off;

	if (c->in_payload) {
		take = MIN(avail, c->left);
		if (!rx_mr_enter(c))
			return false;
		memcpy(c->dst + (c->fr.len - c->left), from, take);
		rx_mr_exit(c);
		c->left -= take;
	} else {
		take = MIN(avail, sizeof(c->hdr) - c->hdr_got);
		memcpy(c->hdr + c->hdr_got, from, take);
		c->hdr_got += take;
		*off += take;
		if (c->hdr_got < sizeof(c->hdr))
			return true;
		if (!rx_frame_start(c))
			return false;
		take = 0;
	}
	*off += take;
	if (c->in_payload && !c->left) {
		(*budget)--;
		(*frames)++;
		return rx_frame_end(c);
	}
	return true;
}

/*
 * Takes buf[0 .. len) read ahead, as far as the budget goes; what is left
 * goes to the stash. False when the connection ended (the rest is dropped).
 */
static bool rx_take_buf(struct fab_con *c, const unsigned char *buf, size_t len, unsigned *budget,
			unsigned *frames)
{
	size_t off = 0;

	while (off < len) {
		if (!*budget)
			break;
		if (!rx_take_ahead(c, buf, &off, len, budget, frames))
			return false;
		if (con_quiet(c) || c->state == TC_DOWN)
			return false;
	}
	if (off < len) {
		c->stash = malloc(len - off);
		if (!c->stash) {
			log_warn_rl("%s: no memory for %zu bytes read ahead", con_name(c), len - off);
			con_fail(c, -ENOMEM, NULL, 0);
			return false;
		}
		memcpy(c->stash, buf + off, len - off);
		c->stash_off = 0;
		c->stash_len = len - off;
	}
	return true;
}

/*
 * Under cb_lock: reads frames, at most TCP_RX_BUDGET; *frames, how many
 * ended. RX_EMPTY when the socket has no more, RX_BUDGET when the budget
 * ran out, RX_STOP when the connection ended or went quiet.
 */
static enum rx_end rx_frames(struct fab_con *c, unsigned *frames)
{
	unsigned budget = TCP_RX_BUDGET;
	enum rx_end end = RX_STOP;
	bool drained = false; /* a read came back short: the socket had no more */
	struct rx_ahead *ra = NULL;
	unsigned flushed = 0;

	*frames = 0;

	while (budget && !con_quiet(c) && c->state != TC_DOWN) {
		struct iovec iov[2];
		unsigned n = 0;
		struct msghdr mh = { .msg_iov = iov };
		ssize_t r;
		bool guard = false, ahead, bulk;

		if (c->stash) {
			size_t off = c->stash_off;
			bool ok = rx_take_ahead(c, c->stash, &off, c->stash_len, &budget, frames);

			c->stash_off = off;
			if (off == c->stash_len) {
				free(c->stash);
				c->stash = NULL;
			}
			if (!ok)
				goto out;
			continue;
		}
		if (!c->in_payload && c->hdr_got == sizeof(c->hdr)) {
			if (!rx_frame_start(c))
				goto out;
			if (!c->left) {
				budget--;
				(*frames)++;
				if (!rx_frame_end(c))
					goto out;
				continue;
			}
		}
		/* What is buffered is taken first; then a read that would find nothing is saved. */
		if (drained) {
			end = RX_EMPTY;
			goto out;
		}
		/* Read ahead after small frames, or within one; a large one's rest goes in place. */
		ahead = c->in_payload ? c->fr.len <= TCP_LA_SMALL : c->la_want;
		/* The payload's last frame of the budget: its rest and the next header, no more. */
		if (c->in_payload && budget == 1)
			ahead = false;
		if (ahead && !ra)
			ra = rx_ahead_take();
		ahead = ahead && ra;
		if (c->in_payload) {
			iov[n++] = (struct iovec){ c->dst + (c->fr.len - c->left), c->left };
			if (c->mr) {
				if (!rx_mr_enter(c))
					goto out;
				guard = true;
			}
		}
		bulk = ahead && c->small_run >= TCP_LA_RUN;
		if (ahead) {
			/*
			 * No more than the frames the budget still takes, at
			 * the average frame's size and a quarter (a mixed
			 * stream, 4 KiB writes among small read requests, is
			 * not read a few frames a call): what a turn reads but
			 * cannot take is copied to the stash and back.
			 */
			size_t want = bulk ? sizeof(ra->buf) : TCP_LA_SHORT;
			size_t after = budget - (c->in_payload ? 1 : 0);
			size_t cap = after * (RTRS_TCP_HDR_LEN + (size_t)c->la_avg + c->la_avg / 4);

			iov[n++] = (struct iovec){ ra->buf, MIN(want, cap) };
		}
		else
			/* The header, or the next one with the payload's end, in the same call. */
			iov[n++] = (struct iovec){ c->hdr + c->hdr_got, sizeof(c->hdr) - c->hdr_got };
		mh.msg_iovlen = n;
		r = c->tls_io ? rtrs_tls_readv(c->tls, iov, n) : recvmsg(c->fd, &mh, MSG_DONTWAIT);
		if (guard)
			rx_mr_exit(c);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			end = RX_EMPTY;
			goto out;
		}
		if (r <= 0) {
			con_fail(c, r ? -errno : -ECONNRESET, NULL, 0);
			goto out;
		}
		size_t got = (size_t)r;

		drained = got < iov[0].iov_len + (n > 1 ? iov[1].iov_len : 0);
		if (c->in_payload) {
			size_t take = MIN(got, c->left);

			c->left -= take;
			got -= take;
			if (!c->left) {
				budget--;
				(*frames)++;
				if (!rx_frame_end(c))
					goto out;
			}
		}
		if (got) {
			if (!ahead)
				c->hdr_got += got;
			else if (!rx_take_buf(c, ra->buf, got, &budget, frames))
				goto out;
		}
		/*
		 * What the frames of this read answered leaves now, in one
		 * sendmsg, not at the turn's end: the peer's next requests
		 * need not wait for the rest of the turn.
		 */
		/* on_cork is the group thread's: looked at only there. */
		if ((bulk || *frames - flushed >= TCP_RX_FLUSH) && on_group_thread(c) &&
		    c->on_cork) {
			flushed = *frames;
			cork_forget(c);
			con_flush(c);
		}
	}
	if (!budget && !con_quiet(c) && c->state != TC_DOWN)
		end = RX_BUDGET;
out:
	rx_ahead_give(ra);
	return end;
}

/*
 * Group thread, under cb_lock: reads, then waits on the ready list when
 * the budget ran out, or arms its poll when the socket is empty.
 */
static void con_rx(struct fab_con *c)
{
	struct tcp_group *g = c->g;
	unsigned frames;
	enum rx_end end = rx_frames(c, &frames);

	if (frames > atomic_load_explicit(&g->max_turn, memory_order_relaxed))
		atomic_store_explicit(&g->max_turn, frames, memory_order_relaxed);
	switch (end) {
	case RX_EMPTY:
		arm_rx(c);
		break;
	case RX_BUDGET:
		atomic_fetch_add_explicit(&g->budget_yields, 1, memory_order_relaxed);
		ready_add(c);
		break;
	case RX_STOP:
		break;
	}
}

static bool poller_active(struct fab_con *c)
{
	struct fab_poller *p = atomic_load(&c->poller);

	return p && (atomic_load(&p->waiting) > 0 ||
		     now_ms() - atomic_load(&p->last_ms) < FAB_POLL_LEASE_MS);
}



/* ---- the group thread ---------------------------------------------------------- */

static void con_free(struct fab_con *c);

/* Destroying: the polls still armed are removed; their completions free it. */
static void con_release(struct fab_con *c)
{
	struct tcp_group *g = c->g;
	struct io_uring_sqe *sqe;

	c->released = true;
	g->releasing++;
	cork_forget(c);
	if (c->on_ready) {
		struct fab_con **pp = &g->ready_head, *prev = NULL;

		for (; *pp; prev = *pp, pp = &(*pp)->ready_next) {
			if (*pp == c) {
				*pp = c->ready_next;
				if (g->ready_tail == c)
					g->ready_tail = prev;
				break;
			}
		}
		c->on_ready = false;
	}
	if (c->on_retry) {
		for (struct fab_con **pp = &g->retry_head; *pp; pp = &(*pp)->retry_next) {
			if (*pp == c) {
				*pp = c->retry_next;
				break;
			}
		}
		c->on_retry = false;
	}
	if (c->on_lease) {
		for (struct fab_con **pp = &g->lease_head; *pp; pp = &(*pp)->lease_next) {
			if (*pp == c) {
				*pp = c->lease_next;
				break;
			}
		}
		c->on_lease = false;
	}
	if (c->rx_armed) {
		sqe = group_sqe(g);
		io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)c | TAG_RX);
		io_uring_sqe_set_data64(sqe, UD_IGNORE);
	}
	if (c->tx_armed) {
		sqe = group_sqe(g);
		io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)c | TAG_TX);
		io_uring_sqe_set_data64(sqe, UD_IGNORE);
	}
	if (!c->rx_armed && !c->tx_armed)
		con_free(c);
}

static void con_deliver_done(struct fab_con *c)
{
	void *local[32], **ctxs = local;
	size_t n;

	pthread_mutex_lock(&c->tx_lock);
	n = c->dctx_n;
	if (n > ARRAY_SIZE(local)) {
		ctxs = c->dctx;
		c->dctx = NULL;
		c->dctx_cap = 0;
	} else {
		memcpy(local, c->dctx, n * sizeof(*ctxs));
	}
	c->dctx_n = 0;
	pthread_mutex_unlock(&c->tx_lock);
	for (size_t i = 0; i < n && !con_quiet(c); i++)
		c->cfg.ops->done(c->cfg.priv, ctxs[i]);
	if (ctxs != local)
		free(ctxs);
	if (n && c->on_retry)
		c->retry_at = 0; /* a completion: the retry is due now */
}

static void con_flush(struct fab_con *c)
{
	bool delivered = false;
	int err;

	if (c->state == TC_DOWN)
		return;
	if (!tx_flush(c, &delivered, &err)) {
		if (err) {
			con_fail(c, err, NULL, 0);
			return;
		}
		pthread_mutex_lock(&c->tx_lock);
		bool waiting = (c->txq_head || con_tls_pending(c)) && c->tx_open && !c->tx_dead;
		pthread_mutex_unlock(&c->tx_lock);
		if (waiting)
			arm_tx(c);
	}
	if (delivered)
		con_deliver_done(c);
}

/* Client: the stream is ready (TCP connected, TLS up if any): the CONNECT waiting goes now. */
static void con_hello(struct fab_con *c)
{
	c->state = TC_HELLO;
	pthread_mutex_lock(&c->tx_lock);
	c->tx_open = true;
	pthread_mutex_unlock(&c->tx_lock);
	con_flush(c);
	arm_rx(c);
}

/* Client: the TLS handshake is done. */
static void con_tls_up(struct fab_con *c)
{
	char d[96];

	c->tls_io = !rtrs_tls_ktls(c->tls);
	rtrs_tls_describe(c->tls, d, sizeof(d));
	log_dbg("%s: TLS: %s", con_name(c), d);
	con_hello(c);
}

/*
 * Client, TC_TLS: a step of the handshake (readable: in; else out). A
 * server that answers a ClientHello in the clear (its first byte an RTRS
 * frame's) has refused TLS: its REJECT is read as such.
 */
static void con_tls_step(struct fab_con *c, bool readable)
{
	bool ww;
	int rc;

	if (readable && !c->tls_heard) {
		unsigned char b;
		ssize_t n = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);

		if (n == 1 && b == RTRS_TCP_MAGIC) {
			c->tls_plain = true;
			c->state = TC_HELLO;
			con_rx(c);
			return;
		}
		c->tls_heard = n == 1;
	}
	rc = rtrs_tls_handshake(c->tls, &ww);
	if (!rc) {
		con_tls_up(c);
		return;
	}
	if (rc == -EAGAIN) {
		if (ww)
			arm_tx(c);
		else
			arm_rx(c);
		return;
	}
	log_err("%s: %s", con_name(c), rtrs_tls_error(c->tls));
	err_detail("%s", rtrs_tls_error(c->tls));
	con_fail(c, rc, NULL, 0);
}

/* Client: the TCP connect finished (POLLOUT on the socket). */
/* fab_con_cfg.live_ms on c's socket, once its TCP connection exists. */
static void con_set_live(struct fab_con *c)
{
	unsigned ms = c->cfg.live_ms;

	if (ms && setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms)))
		log_warn("%s: TCP_USER_TIMEOUT %u ms: %s (a lost connection then fails only "
			 "after the system's retransmissions)", con_name(c), ms, strerror(errno));
}

static void con_connect_done(struct fab_con *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) || err) {
		if (!err)
			err = errno;
		log_dbg("%s: connect: %s", con_name(c), strerror(err));
		con_fail(c, err == ECONNREFUSED ? -ECONNREFUSED : -err, NULL, 0);
		return;
	}
	con_set_live(c);
	if (c->fab->tls_mode != FAB_TLS_OFF) {
		int rc;

		pthread_mutex_lock(&c->fab->tls_lock);
		rc = rtrs_tls_new(c->fab->tls, c->fd, false, con_name(c), &c->tls);
		pthread_mutex_unlock(&c->fab->tls_lock);

		if (rc) {
			con_fail(c, rc, NULL, 0);
			return;
		}
		c->state = TC_TLS;
		con_tls_step(c, false);
		return;
	}
	con_hello(c);
}

/* Group thread, under cb_lock: c's input is read here a lease from now, unless already due. */
static void lease_add(struct fab_con *c)
{
	struct tcp_group *g = c->g;

	if (c->on_lease)
		return;
	c->on_lease = true;
	c->lease_at = now_ms() + FAB_POLL_LEASE_MS;
	c->lease_next = g->lease_head;
	g->lease_head = c;
}

static void con_work(struct fab_con *c)
{
	unsigned bits = atomic_exchange(&c->work, 0);

	if (bits & W_DESTROY) {
		con_release(c);
		return;
	}
	if (atomic_load(&c->destroying))
		return;
	pthread_mutex_lock(&c->cb_lock);
	if (bits & W_START) {
		if (c->state == TC_CONNECTING) {
			arm_tx(c);
		} else {
			if (c->server && !con_quiet(c))
				c->cfg.ops->connected(c->cfg.priv, NULL, 0);
			/* OpenSSL may hold bytes the listener read past the request. */
			if (c->tls_io && c->state == TC_UP)
				con_rx(c);
			else
				arm_rx(c);
		}
	}
	if (bits & W_FAIL) {
		int err;

		pthread_mutex_lock(&c->tx_lock);
		err = c->tx_err ? c->tx_err : -ECONNRESET;
		pthread_mutex_unlock(&c->tx_lock);
		con_fail(c, err, NULL, 0);
	}
	if ((bits & W_FLUSH) && c->state != TC_CONNECTING && c->state != TC_TLS)
		con_flush(c);
	if (bits & W_DONE)
		con_deliver_done(c);
	if ((bits & W_RETRY) && !c->on_retry) {
		c->on_retry = true;
		c->retry_at = now_ms() + 1;
		c->retry_next = c->g->retry_head;
		c->g->retry_head = c;
	}
	if ((bits & W_KICK) && !con_quiet(c))
		c->cfg.ops->kick(c->cfg.priv);
	if ((bits & W_LEASE) && c->state == TC_UP)
		lease_add(c);
	pthread_mutex_unlock(&c->cb_lock);
}

/* The head of the group's work list, taken off it; NULL when empty. */
static struct fab_con *work_pop(struct tcp_group *g)
{
	struct fab_con *c;

	pthread_mutex_lock(&g->lock);
	c = g->work_head;
	if (c) {
		g->work_head = c->work_next;
		if (!g->work_head)
			g->work_tail = NULL;
		c->on_work = false;
	}
	pthread_mutex_unlock(&g->lock);
	return c;
}

static void group_drain_work(struct tcp_group *g)
{
	/*
	 * One at a time off the list: a callback may destroy another
	 * connection of the group, which must then be found listed (its
	 * W_DESTROY waits its turn), never freed under this loop.
	 */
	for (struct fab_con *c; (c = work_pop(g));)
		con_work(c);
}

/* Each connection on the ready list at the start gets one more budget; ones that use it up again go behind. */
static void group_run_ready(struct tcp_group *g)
{
	size_t n = 0;

	for (struct fab_con *c = g->ready_head; c; c = c->ready_next)
		n++;
	while (n-- && g->ready_head) {
		struct fab_con *c = g->ready_head;

		g->ready_head = c->ready_next;
		if (!g->ready_head)
			g->ready_tail = NULL;
		c->on_ready = false;
		if (!atomic_load(&c->destroying)) {
			pthread_mutex_lock(&c->cb_lock);
			con_rx(c);
			pthread_mutex_unlock(&c->cb_lock);
		}
	}
}

static void group_run_retry(struct tcp_group *g)
{
	uint64_t now = now_ms();

	/* From the head again after each kick: a kick may destroy a listed connection. */
	for (;;) {
		struct fab_con **pp = &g->retry_head, *c;

		while (*pp && (*pp)->retry_at > now)
			pp = &(*pp)->retry_next;
		c = *pp;
		if (!c)
			break;
		*pp = c->retry_next;
		c->on_retry = false;
		pthread_mutex_lock(&c->cb_lock);
		if (!con_quiet(c))
			c->cfg.ops->kick(c->cfg.priv);
		pthread_mutex_unlock(&c->cb_lock);
	}
	/*
	 * Input left a lease long to a poller: read it here, so that nothing
	 * waits on a caller that stopped polling.
	 */
	for (;;) {
		struct fab_con **pp = &g->lease_head, *c;

		while (*pp && (*pp)->lease_at > now)
			pp = &(*pp)->lease_next;
		c = *pp;
		if (!c)
			break;
		*pp = c->lease_next;
		c->on_lease = false;
		pthread_mutex_lock(&c->cb_lock);
		if (c->state != TC_DOWN)
			con_rx(c);
		pthread_mutex_unlock(&c->cb_lock);
	}
}

static void group_cqe(struct tcp_group *g, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	struct fab_con *c = (struct fab_con *)(uintptr_t)(ud & ~(uint64_t)TAG_MASK);

	if (ud == UD_EFD) {
		if (read(g->efd, &g->efd_val, sizeof(g->efd_val)) < 0 && errno != EAGAIN)
			log_warn_rl("tcp group %u: eventfd read: %s", g->idx, strerror(errno));
		efd_arm(g);
		atomic_store(&g->woken, false);
		return;
	}
	/*
	 * liburing's own timeout (io_uring_submit_and_wait_timeout on a
	 * kernel without IORING_FEAT_EXT_ARG, before 5.11): skipped by it
	 * only at the head of the queue.
	 */
	if (ud == UD_IGNORE || ud == LIBURING_UDATA_TIMEOUT)
		return;
	if ((ud & TAG_MASK) == TAG_RX)
		c->rx_armed = false;
	else
		c->tx_armed = false;
	if (c->released) {
		if (!c->rx_armed && !c->tx_armed)
			con_free(c);
		return;
	}
	if (atomic_load(&c->destroying))
		return;
	pthread_mutex_lock(&c->cb_lock);
	if (c->state == TC_DOWN) {
		/* nothing */
	} else if (c->state == TC_TLS) {
		con_tls_step(c, (ud & TAG_MASK) == TAG_RX);
	} else if ((ud & TAG_MASK) == TAG_TX) {
		if (c->state == TC_CONNECTING)
			con_connect_done(c);
		else
			con_flush(c);
	} else if (c->state == TC_UP && poller_active(c)) {
		/* A poller reads it; after a lease, whatever is left is read here. */
		lease_add(c);
	} else {
		con_rx(c);
	}
	pthread_mutex_unlock(&c->cb_lock);
}

/*
 * A group stops when its fabrics are all closed (their memory freed), but
 * first frees the connections whose destroy was handed to it: one queued
 * by a callback just before the last close (W_DESTROY), or released with
 * its polls still to come back. Nothing else is run then: any other work,
 * or a poll's completion, of a connection nobody destroyed (the caller's
 * leak, groups_put says so) would reach its freed fabric. It waits for
 * the polls at most TCP_STOP_DRAIN_MS.
 */
static void group_stop_drain(struct tcp_group *g)
{
	uint64_t end = now_ms() + TCP_STOP_DRAIN_MS;

	for (;;) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;

		for (struct fab_con *c; (c = work_pop(g));)
			if ((atomic_exchange(&c->work, 0) & W_DESTROY) && !c->released)
				con_release(c);
		if (!g->releasing)
			return;
		if (now_ms() >= end) {
			log_warn("tcp group %u: stopped with %u connections still being released",
				 g->idx, g->releasing);
			return;
		}
		struct __kernel_timespec ts = { .tv_nsec = 1000000 };

		io_uring_submit_and_wait_timeout(&g->ring, &cqe, 1, &ts, NULL);
		io_uring_for_each_cqe(&g->ring, head, cqe) {
			uint64_t ud = io_uring_cqe_get_data64(cqe);
			struct fab_con *c = (struct fab_con *)(uintptr_t)(ud & ~(uint64_t)TAG_MASK);

			seen++;
			if (ud == UD_EFD || ud == UD_IGNORE || ud == LIBURING_UDATA_TIMEOUT ||
			    !c->released)
				continue;
			if ((ud & TAG_MASK) == TAG_RX)
				c->rx_armed = false;
			else
				c->tx_armed = false;
			if (!c->rx_armed && !c->tx_armed)
				con_free(c);
		}
		io_uring_cq_advance(&g->ring, seen);
	}
}

static void *group_thread(void *arg)
{
	struct tcp_group *g = arg;
	char name[16];

	snprintf(name, sizeof(name), "rtrs-tcp-%u", g->idx);
	pthread_setname_np(pthread_self(), name);
	if (g->r_disabled) {
		/* liburing 2.3 declares io_uring_enable_rings but does not export it. */
		long rc = syscall(__NR_io_uring_register, g->ring.ring_fd,
				  IORING_REGISTER_ENABLE_RINGS, NULL, 0);

		/* Cannot fail on a ring made disabled; the group would be dead if it did. */
		if (rc < 0)
			log_err("tcp group %u: enabling its ring: %s", g->idx, strerror(errno));
	}
	efd_arm(g);
	while (!atomic_load(&g->stop)) {
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		int rc;

		atomic_store_explicit(&g->passes, atomic_load_explicit(&g->passes, memory_order_relaxed) + 1,
				      memory_order_relaxed);
		group_drain_work(g);
		group_uncork(g);
		group_run_ready(g);
		group_uncork(g);
		group_run_retry(g);
		group_uncork(g);
		/* Work this thread queued itself wakes nobody. */
		pthread_mutex_lock(&g->lock);
		bool work = g->work_head != NULL;
		pthread_mutex_unlock(&g->lock);
		if (g->ready_head || work) {
			/* And the completions queued meanwhile (DEFER_TASKRUN posts them only so). */
			rc = io_uring_submit_and_get_events(&g->ring);
		} else {
			bool timer = g->retry_head || g->lease_head;
			struct __kernel_timespec ts = { .tv_sec = timer ? 0 : 1,
							.tv_nsec = timer ? 1000000 : 0 };

			rc = io_uring_submit_and_wait_timeout(&g->ring, &cqe, 1, &ts, NULL);
		}
		if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EBUSY)
			log_warn_rl("tcp group %u: io_uring_enter: %s", g->idx, strerror(-rc));
		io_uring_for_each_cqe(&g->ring, head, cqe) {
			group_cqe(g, cqe);
			/* What the turn posted leaves now, one sendmsg per connection. */
			group_uncork(g);
			seen++;
		}
		io_uring_cq_advance(&g->ring, seen);
	}
	group_stop_drain(g);
	return NULL;
}

static int groups_get(void)
{
	int rc = 0;

	pthread_mutex_lock(&grp.lock);
	if (grp.users++) {
		pthread_mutex_unlock(&grp.lock);
		return 0;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = grp.want ? grp.want : (unsigned)MAX(cpus, 1);

	grp.g = calloc(n, sizeof(*grp.g));
	if (!grp.g) {
		rc = -ENOMEM;
		goto fail;
	}
	for (grp.n = 0; grp.n < n; grp.n++) {
		struct tcp_group *g = &grp.g[grp.n];
		/*
		 * Only the group thread submits, so the ring is its alone
		 * (SINGLE_ISSUER, enabled by the thread itself): a socket's
		 * wake-up then queues its poll's completion for the next wait
		 * (DEFER_TASKRUN) instead of signalling the thread at once, and
		 * wakes it only when it sleeps. Kernels before 6.1: no IPI for
		 * it at least (COOP_TASKRUN), or neither.
		 */
		static const unsigned tries[] = {
			IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
			IORING_SETUP_R_DISABLED,
			IORING_SETUP_COOP_TASKRUN,
			0,
		};

		g->idx = grp.n;
		pthread_mutex_init(&g->lock, NULL);
		g->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		if (g->efd < 0) {
			rc = -errno;
			pthread_mutex_destroy(&g->lock);
			break;
		}
		rc = -EINVAL;
		for (unsigned t = 0; t < ARRAY_SIZE(tries) && rc == -EINVAL; t++) {
			struct io_uring_params p = { .flags = IORING_SETUP_CQSIZE | tries[t],
						     .cq_entries = TCP_RING_CQ };

			rc = io_uring_queue_init_params(TCP_RING_SQ, &g->ring, &p);
			g->r_disabled = !rc && (tries[t] & IORING_SETUP_R_DISABLED);
			if (!rc)
				g->ring.features &= ~grp.feat_mask;
		}
		if (rc) {
			log_err("tcp: io_uring_queue_init: %s", strerror(-rc));
			close(g->efd);
			pthread_mutex_destroy(&g->lock);
			break;
		}
		rc = -pthread_create(&g->thread, NULL, group_thread, g);
		if (rc) {
			io_uring_queue_exit(&g->ring);
			close(g->efd);
			pthread_mutex_destroy(&g->lock);
			break;
		}
	}
	if (!rc) {
		pthread_mutex_unlock(&grp.lock);
		log_dbg("tcp: %u poll groups", grp.n);
		return 0;
	}
fail:
	grp.users--;
	for (unsigned i = 0; i < grp.n; i++) {
		atomic_store(&grp.g[i].stop, true);
		group_wake(&grp.g[i]);
		pthread_join(grp.g[i].thread, NULL);
		io_uring_queue_exit(&grp.g[i].ring);
		close(grp.g[i].efd);
		pthread_mutex_destroy(&grp.g[i].lock);
	}
	free(grp.g);
	grp.g = NULL;
	grp.n = 0;
	pthread_mutex_unlock(&grp.lock);
	return rc;
}

static void groups_put(void)
{
	pthread_mutex_lock(&grp.lock);
	if (--grp.users) {
		pthread_mutex_unlock(&grp.lock);
		return;
	}
	for (unsigned i = 0; i < grp.n; i++) {
		struct tcp_group *g = &grp.g[i];

		atomic_store(&g->stop, true);
		atomic_store(&g->woken, false);
		group_wake(g);
		pthread_join(g->thread, NULL);
		if (atomic_load(&g->nr_cons))
			log_warn("tcp group %u: stopped with %u connections", i,
				 atomic_load(&g->nr_cons));
		io_uring_queue_exit(&g->ring);
		close(g->efd);
		pthread_mutex_destroy(&g->lock);
	}
	free(grp.g);
	grp.g = NULL;
	grp.n = 0;
	pthread_mutex_unlock(&grp.lock);
}

int fab_tcp_group_stats(unsigned idx, struct fab_tcp_group_stats *st)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&grp.lock);
	if (idx < grp.n) {
		struct tcp_group *g = &grp.g[idx];

		st->passes = atomic_load_explicit(&g->passes, memory_order_relaxed);
		st->budget_yields = atomic_load_explicit(&g->budget_yields, memory_order_relaxed);
		st->max_turn_frames = atomic_load_explicit(&g->max_turn, memory_order_relaxed);
		st->turn_budget = TCP_RX_BUDGET;
		st->nr_cons = atomic_load(&g->nr_cons);
		rc = 0;
	}
	pthread_mutex_unlock(&grp.lock);
	return rc;
}

int fab_tcp_con_group(const struct fab_con *c)
{
	return c && fab_ops_of(c) == &fab_tcp_ops && c->g ? (int)c->g->idx : -EINVAL;
}

/* The group with the fewest connections. */
static struct tcp_group *group_pick(void)
{
	struct tcp_group *best = NULL;

	pthread_mutex_lock(&grp.lock);
	for (unsigned i = 0; i < grp.n; i++)
		if (!best || atomic_load(&grp.g[i].nr_cons) < atomic_load(&best->nr_cons))
			best = &grp.g[i];
	if (best)
		atomic_fetch_add(&best->nr_cons, 1);
	pthread_mutex_unlock(&grp.lock);
	return best;
}

/* ---- fabric and domain --------------------------------------------------------- */

static int resolve(const char *node, const char *service, bool passive,
		   struct sockaddr_storage *out, socklen_t *outlen, const char *what)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *res = NULL;
	int rc = getaddrinfo(node, service, &hints, &res);

	if (rc) {
		/* The wording the other fabrics use: "cannot resolve HOST: why". */
		log_err("fabric: %s %s: %s", what, node ? node : "*", gai_strerror(rc));
		if (!strcmp(what, "source address"))
			err_detail("cannot resolve the source address %s: %s", node, gai_strerror(rc));
		else
			err_detail("cannot resolve %s: %s", node ? node : "*", gai_strerror(rc));
		return rc == EAI_SYSTEM ? -errno : -ENXIO;
	}
	memcpy(out, res->ai_addr, res->ai_addrlen);
	*outlen = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int tcp_open(const char *prov, const char *src, const char *node, const char *service,
		    bool server, size_t queue, struct fab **out)
{
	struct fab *f;
	int rc;

	(void)prov;
	/* Aligned for its lock stripes (one cache line each). */
	if (posix_memalign((void **)&f, _Alignof(struct fab), sizeof(*f)))
		return -ENOMEM;
	memset(f, 0, sizeof(*f));
	f->ops = &fab_tcp_ops;
	f->server = server;
	rc = resolve(node, service ? service : "0", server, &f->addr, &f->addrlen,
		     server ? "listen address" : "address");
	if (!rc && src && *src) {
		rc = resolve(src, NULL, true, &f->src, &f->srclen, "source address");
		if (rc == -ENXIO)
			rc = -EINVAL;
	}
	if (!rc)
		rc = keyperm_init(&f->keys);
	if (!rc) {
		static_assert((TCP_MR_STRIPES & (TCP_MR_STRIPES - 1)) == 0 &&
			      TCP_MR_STRIPES <= TCP_MR_BUCKETS_MIN, "a key's stripe is fixed");
		atomic_init(&f->mr_nb, TCP_MR_BUCKETS_MIN);
		atomic_init(&f->mr_count, 0);
		f->mr_tab = calloc(TCP_MR_BUCKETS_MIN, sizeof(*f->mr_tab));
		rc = f->mr_tab ? 0 : -ENOMEM;
	}
	if (!rc)
		rc = groups_get();
	if (rc) {
		keyperm_clear(&f->keys);
		free(f->mr_tab);
		free(f);
		return rc;
	}
	for (unsigned i = 0; i < TCP_MR_STRIPES; i++)
		pthread_mutex_init(&f->mr_stripes[i].lock, NULL);
	pthread_mutex_init(&f->tls_lock, NULL);
	atomic_init(&f->next_key, 0);
	atomic_init(&f->next_key64, KEYPERM_KEY64_MIN);

	struct fab_attr *a = &f->attr;

	snprintf(a->prov_name, sizeof(a->prov_name), "tcp");
	a->iov_limit = TCP_IOV_LIMIT;
	a->rma_iov_limit = TCP_RMA_LIMIT;
	a->max_queue = queue ? MIN(queue, TCP_QUEUE_MAX) : TCP_QUEUE_DEFAULT;
	a->inject_size = TCP_INJECT;
	a->connect_data_max = RTRS_TCP_CM_MAX;
	*out = f;
	return 0;
}

static void tcp_close(struct fab *f)
{
	size_t left = 0;

	if (!f)
		return;
	for (size_t i = 0; f->mr_tab && i < f->mr_nb; i++)
		for (struct tcp_mr *m = f->mr_tab[i], *n; m; m = n) {
			n = m->next;
			left++;
			mr_put(m);
		}
	if (left)
		log_warn("fabric: tcp closed with %zu memory regions registered", left);
	for (unsigned i = 0; i < TCP_MR_STRIPES; i++) {
		for (struct tcp_mr *m = f->mr_stripes[i].free, *n; m; m = n) {
			n = m->next;
			free(m);
		}
		pthread_mutex_destroy(&f->mr_stripes[i].lock);
	}
	keyperm_clear(&f->keys);
	free(f->mr_tab);
	if (f->tls)
		rtrs_tls_ctx_put(f->tls);
	pthread_mutex_destroy(&f->tls_lock);
	free(f);
	groups_put();
}

static int tcp_set_tls(struct fab *f, enum fab_tls_mode mode, struct rtrs_tls_ctx *ctx)
{
	if (mode != FAB_TLS_OFF && !ctx)
		return -ENOKEY;
	if (mode == FAB_TLS_OFFERED && !f->server)
		return -EINVAL;
	struct rtrs_tls_ctx *old;

	if (ctx && mode != FAB_TLS_OFF)
		rtrs_tls_ctx_get(ctx);
	pthread_mutex_lock(&f->tls_lock);
	old = f->tls;
	f->tls = mode == FAB_TLS_OFF ? NULL : ctx;
	f->tls_mode = mode;
	pthread_mutex_unlock(&f->tls_lock);
	if (old)
		rtrs_tls_ctx_put(old);
	return 0;
}

static const struct fab_attr *tcp_attr(const struct fab *f)
{
	return &f->attr;
}

/* ---- listening ----------------------------------------------------------------- */

static int sock_new(int family)
{
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;

	if (fd < 0)
		return -errno;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

static int tcp_listen(struct fab *f, struct fab_lst **out)
{
	struct fab_lst *l = calloc(1, sizeof(*l));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = NULL };
	int one = 1, rc;

	if (!l)
		return -ENOMEM;
	l->ops = &fab_tcp_ops;
	l->fab = f;
	l->epfd = -1;
	l->spare_fd = -1;
	l->lfd = sock_new(f->addr.ss_family);
	if (l->lfd < 0) {
		rc = l->lfd;
		goto fail;
	}
	setsockopt(l->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->lfd, (struct sockaddr *)&f->addr, f->addrlen) || listen(l->lfd, 4096)) {
		rc = -errno;
		char a[80];

		sockaddr_str(&f->addr, a, sizeof(a));
		log_err("listener: %s: %s", a, strerror(-rc));
		err_detail("cannot listen on %s: %s", a, strerror(-rc));
		goto fail;
	}
	if (!getsockname(l->lfd, (struct sockaddr *)&ss, &sl))
		l->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port) :
						     ntohs(((struct sockaddr_in *)&ss)->sin_port);
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (l->epfd < 0 || epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->lfd, &ev)) {
		rc = -errno;
		goto fail;
	}
	/* One fd kept back: with the table full, a connection is still accepted and closed. */
	l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	*out = l;
	return 0;
fail:
	if (l->lfd >= 0)
		close(l->lfd);
	if (l->epfd >= 0)
		close(l->epfd);
	free(l);
	return rc;
}

static void raw_free(struct fab_lst *l, struct tcp_raw *r, bool counted)
{
	rtrs_tls_free(r->tls);
	if (r->fd >= 0) {
		epoll_ctl(l->epfd, EPOLL_CTL_DEL, r->fd, NULL);
		close(r->fd);
	}
	if (counted)
		l->closed++;
	free(r);
}

/* Takes raw i out of the list (its order does not matter: ages are stored). */
static struct tcp_raw *raw_take(struct fab_lst *l, size_t i)
{
	struct tcp_raw *r = l->raw[i];

	l->raw[i] = l->raw[--l->nr_raw];
	l->raw[i]->idx = i;
	return r;
}

static void tcp_lst_close(struct fab_lst *l)
{
	if (!l)
		return;
	while (l->nr_raw)
		raw_free(l, raw_take(l, l->nr_raw - 1), false);
	free(l->raw);
	close(l->lfd);
	close(l->epfd);
	if (l->spare_fd >= 0)
		close(l->spare_fd);
	free(l);
}

static int tcp_lst_fd(const struct fab_lst *l)
{
	return l->epfd;
}

static int tcp_lst_port(const struct fab_lst *l)
{
	return l->port;
}

static void tcp_lst_limit(struct fab_lst *l, const struct fab_lst_limits *lim)
{
	l->lim = *lim;
}

static uint64_t tcp_lst_closed(const struct fab_lst *l)
{
	return l->closed;
}

/*
 * A connection is silent when no byte of its request has come, neither
 * read nor waiting in the socket (FIONREAD), and TCP_RAW_GRACE_MS passed
 * since it was accepted: one just accepted is no flood's yet (a storm of
 * clients connecting at once is accepted in a batch, some before they
 * sent). One that spoke and then stalled, no byte for a quarter of the
 * handshake timeout (raw_stall_ms), is silent too: a byte per connection
 * does not make a flood's connections exempt. Beyond TCP_RAW_HARD_CAP
 * times max_total of every kind, the least recently progressing go,
 * whatever their age: a connect flood cannot take the fds, whatever its
 * connections send.
 */
#define TCP_RAW_GRACE_MS 100
#define TCP_RAW_HARD_CAP 4

static uint64_t raw_stall_ms(const struct fab_lst *l)
{
	unsigned t = l->lim.timeout_ms ? l->lim.timeout_ms / 4 : 1250;

	return t > TCP_RAW_GRACE_MS ? t : TCP_RAW_GRACE_MS;
}

static bool raw_silent(const struct fab_lst *l, const struct tcp_raw *r, uint64_t now)
{
	/* last_ms may be after now: bytes found waiting since now was read. */
	return r->spoke ? r->last_ms <= now && now - r->last_ms >= raw_stall_ms(l) :
			  now - r->since_ms >= TCP_RAW_GRACE_MS;
}

/* Bytes of r's request came (or wait in its socket). */
static void raw_progress(struct tcp_raw *r)
{
	r->spoke = true;
	r->last_ms = now_ms();
}

/*
 * Whether bytes of r's request wait in its socket (FIONREAD): then it is
 * read next, no flood's, and is marked as progressing. Asked only of a
 * connection about to be closed for the limits, so that a flood costs a
 * system call per connection it makes, not one per connection held.
 */
static bool raw_has_bytes(struct tcp_raw *r)
{
	int ready = 0;

	if (!ioctl(r->fd, FIONREAD, &ready) && ready > 0) {
		raw_progress(r);
		return true;
	}
	return false;
}

/*
 * The limits on silent connections: the oldest of a peer beyond
 * max_per_peer (of peer, or of every peer when NULL), the oldest of all
 * beyond max_total. Returns how many were closed.
 */
static size_t raw_enforce_peer(struct fab_lst *l, const char *peer, uint64_t now, bool hard);

static size_t raw_enforce(struct fab_lst *l, const char *peer)
{
	uint64_t now = now_ms();
	size_t closed = 0;

	if (l->lim.max_per_peer && peer) {
		closed += raw_enforce_peer(l, peer, now, false);
	} else if (l->lim.max_per_peer) {
		/* Each peer once: the first raw of it in the list, from the end (takes move the last). */
		for (size_t i = l->nr_raw; i-- > 0;) {
			bool seen = false;

			if (i >= l->nr_raw)
				continue;
			for (size_t j = i + 1; j < l->nr_raw && !seen; j++)
				seen = !strcmp(l->raw[j]->peer, l->raw[i]->peer);
			if (!seen) {
				char p[sizeof(l->raw[i]->peer)];

				memcpy(p, l->raw[i]->peer, sizeof(p));
				closed += raw_enforce_peer(l, p, now, false);
			}
		}
	}
	if (l->lim.max_total) {
		closed += raw_enforce_peer(l, NULL, now, false);
		closed += raw_enforce_peer(l, NULL, now, true);
	}
	return closed;
}

/*
 * peer NULL: the total limit over every peer. hard: the hard cap, which
 * counts every one, silent or not, and closes the least recently
 * progressing first (a legitimate request comes whole and leaves the
 * list at its first read; a TLS handshake makes progress at every
 * flight).
 */
static size_t raw_enforce_peer(struct fab_lst *l, const char *peer, uint64_t now, bool hard)
{
	unsigned max = peer ? l->lim.max_per_peer : l->lim.max_total * (hard ? TCP_RAW_HARD_CAP : 1);
	size_t closed = 0;

	for (;;) {
		size_t counted = 0, oldest = SIZE_MAX;

		for (size_t i = 0; i < l->nr_raw; i++) {
			struct tcp_raw *r = l->raw[i];

			if ((!hard && !raw_silent(l, r, now)) || (peer && strcmp(r->peer, peer)))
				continue;
			counted++;
			/* Progress this very millisecond (bytes found waiting below): kept. */
			if (r->last_ms >= now)
				continue;
			if (oldest == SIZE_MAX || r->last_ms < l->raw[oldest]->last_ms)
				oldest = i;
		}
		if (counted <= max || oldest == SIZE_MAX)
			break;
		if (raw_has_bytes(l->raw[oldest]))
			continue; /* bytes wait: progressing, no longer a candidate */
		raw_free(l, raw_take(l, oldest), true);
		closed++;
	}
	return closed;
}

static void raw_peer(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	const void *a = NULL;

	snprintf(buf, len, "?");
	if (getpeername(fd, (struct sockaddr *)&ss, &sl))
		return;
	if (ss.ss_family == AF_INET)
		a = &((struct sockaddr_in *)&ss)->sin_addr;
	else if (ss.ss_family == AF_INET6)
		a = &((struct sockaddr_in6 *)&ss)->sin6_addr;
	if (a)
		inet_ntop(ss.ss_family, a, buf, (socklen_t)len);
}

static void lst_accept(struct fab_lst *l)
{
	size_t over = 0;

	/* Lost to a shortage (its reopen failed): tried again. */
	if (l->spare_fd < 0)
		l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	for (int i = 0; i < TCP_ACCEPT_BATCH; i++) {
		int fd = accept4(l->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		struct tcp_raw *r;
		int one = 1;

		if (fd < 0 && (errno == EMFILE || errno == ENFILE) && l->spare_fd >= 0) {
			/* Out of fds: take the connection with the spare and close it at once. */
			close(l->spare_fd);
			fd = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0)
				close(fd);
			l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			log_warn_rl("listener: out of file descriptors: connection closed at once");
			l->closed++;
			continue;
		}
		if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
			/*
			 * Out of fds and no spare to take the connection with: the
			 * listening socket stays readable, and watching it would
			 * spin the service loop. It is left out until the next
			 * sweep (tcp_lst_sweep); the connections wait in the backlog.
			 */
			if (!epoll_ctl(l->epfd, EPOLL_CTL_DEL, l->lfd, NULL))
				l->lfd_paused = true;
			log_warn_rl("listener: out of file descriptors: not accepting for now");
			break;
		}
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED &&
			    errno != EINTR)
				log_warn_rl("listener: accept: %s", strerror(errno));
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			break;
		}
		r = calloc(1, sizeof(*r));
		if (r && l->nr_raw == l->cap) {
			size_t cap = l->cap ? l->cap * 2 : 64;
			struct tcp_raw **n = realloc(l->raw, cap * sizeof(*n));

			if (n) {
				l->raw = n;
				l->cap = cap;
			}
		}
		if (!r || l->nr_raw == l->cap) {
			free(r);
			close(fd);
			l->closed++;
			continue;
		}
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		r->fd = fd;
		r->since_ms = r->last_ms = now_ms();
		raw_peer(fd, r->peer, sizeof(r->peer));
		ev.data.ptr = r;
		if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev)) {
			raw_free(l, r, true);
			continue;
		}
		r->idx = l->nr_raw;
		l->raw[l->nr_raw++] = r;
		over += raw_enforce(l, r->peer);
	}
	if (over)
		log_warn_rl("listener: closed %zu connections that sent no connection request "
			    "(over the limits of %u, %u per peer)", over, l->lim.max_total,
			    l->lim.max_per_peer);
}

static void tcp_lst_sweep(struct fab_lst *l)
{
	uint64_t now = now_ms();
	size_t late = 0;

	if (l->lfd_paused) {
		struct epoll_event ev = { .events = EPOLLIN };

		if (l->spare_fd < 0)
			l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (!epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->lfd, &ev))
			l->lfd_paused = false;
	}

	for (size_t i = 0; l->lim.timeout_ms && i < l->nr_raw;) {
		if (now - l->raw[i]->since_ms >= l->lim.timeout_ms) {
			raw_free(l, raw_take(l, i), true);
			late++;
		} else {
			i++;
		}
	}
	size_t over = raw_enforce(l, NULL);

	if (late || over)
		log_warn_rl("listener: closed %zu connections that sent no connection request "
			    "(%zu after %u ms, %zu over the limits of %u, %u per peer)", late + over,
			    late, l->lim.timeout_ms, over, l->lim.max_total, l->lim.max_per_peer);
}

/* Sends a connection frame on a socket of our own, blocking briefly at most. */
static int cm_send(int fd, enum rtrs_tcp_op op, const void *data, size_t len);

/* cm_send, through OpenSSL's records when they are: the frame is taken whole or not at all. */
static int tls_cm_send(struct rtrs_tls *tls, enum rtrs_tcp_op op, const void *data, size_t len)
{
	struct rtrs_tcp_frame f = { .op = op, .len = (uint32_t)len };
	struct rtrs_tcp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)data, len } };
	ssize_t w;

	rtrs_tcp_hdr_encode(&h, &f);
	w = rtrs_tls_writev(tls, iov, len ? 2 : 1);
	if (w < 0)
		return -errno;
	return w == (ssize_t)(sizeof(h) + len) ? 0 : -EAGAIN;
}

static int raw_cm_send(struct tcp_raw *r, enum rtrs_tcp_op op, const void *data, size_t len)
{
	return r->tls_io ? tls_cm_send(r->tls, op, data, len) : cm_send(r->fd, op, data, len);
}

/*
 * Answers a raw connection with a REJECT and closes it. The peer reads
 * the verdict, then the end of the stream: what it sent beyond its
 * request is read first, or the close would reset the connection and the
 * verdict with it.
 */
static int raw_reject(struct fab_lst *l, struct tcp_raw *r, const void *data, size_t len,
		      bool counted)
{
	char junk[512];
	int rc = raw_cm_send(r, RTRS_TCP_REJECT, data, len);

	shutdown(r->fd, SHUT_WR);
	for (int i = 0; i < 64 && recv(r->fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; i++)
		;
	raw_free(l, r, counted);
	return rc;
}

/* A TLS mismatch: -EPROTONOSUPPORT with DNR, in the clear; r is gone. */
static void raw_refuse_tls(struct fab_lst *l, struct tcp_raw *r, const char *why)
{
	struct rtrs_conn_rsp rsp = { .err = -EPROTONOSUPPORT, .dnr = true };
	struct rtrs_msg_conn_rsp m;

	log_warn_rl("listener: %s: refused: %s", r->peer, why);
	rtrs_conn_rsp_encode(&m, &rsp);
	raw_reject(l, raw_take(l, r->idx), &m, sizeof(m), true);
}

/*
 * TLS on a raw connection: its first byte says whether it speaks TLS (a
 * handshake record, 0x16) or RTRS in the clear; the server's mode says
 * whether that may go on. Then the handshake, a step per event. True
 * when the request may be read (plainly, or through OpenSSL); false when
 * it waits, or r is gone.
 */
static bool raw_tls(struct fab_lst *l, struct tcp_raw *r)
{
	struct fab *f = l->fab;
	bool ww;
	int rc;

	if (r->plain || r->tls_io)
		return true;
	if (!r->tls) {
		unsigned char b;
		ssize_t n;

		do
			n = recv(r->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return false;
		if (n <= 0) {
			raw_free(l, raw_take(l, r->idx), true);
			return false;
		}
		raw_progress(r);
		if (b != 0x16) {
			/*
			 * In the clear. A server that requires TLS takes only a
			 * secure channel concatenation so (RTRS_CONN_CONCAT):
			 * its server decides by the request (fab_connreq_tls_host
			 * says "" for it).
			 */
			r->plain = true;
			return true;
		}
		if (f->tls_mode == FAB_TLS_OFF) {
			raw_refuse_tls(l, r, "a TLS connection (this server has no TLS)");
			return false;
		}
		rc = rtrs_tls_new(f->tls, r->fd, true, r->peer, &r->tls);
		if (rc) {
			log_warn_rl("listener: %s: TLS: %s", r->peer, strerror(-rc));
			raw_free(l, raw_take(l, r->idx), true);
			return false;
		}
	}
	/* The handshake's next flight (OpenSSL reads it): progress, as a request's bytes. */
	raw_has_bytes(r);
	rc = rtrs_tls_handshake(r->tls, &ww);
	if (rc == -EAGAIN || (!rc && ww)) {
		if (ww != r->want_out) {
			struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | (ww ? EPOLLOUT : 0),
						  .data.ptr = r };

			r->want_out = ww;
			epoll_ctl(l->epfd, EPOLL_CTL_MOD, r->fd, &ev);
		}
		return false;
	}
	if (rc) {
		log_warn_rl("listener: %s: %s", r->peer, rtrs_tls_error(r->tls));
		raw_free(l, raw_take(l, r->idx), true);
		return false;
	}
	if (r->want_out) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.ptr = r };

		r->want_out = false;
		epoll_ctl(l->epfd, EPOLL_CTL_MOD, r->fd, &ev);
	}
	r->tls_io = !rtrs_tls_ktls(r->tls);
	if (!r->tls_io)
		r->plain = true; /* the kernel has the records: the socket reads plainly */
	{
		char d[96];

		rtrs_tls_describe(r->tls, d, sizeof(d));
		log_dbg("listener: %s: TLS: %s, host %s", r->peer, d, rtrs_tls_peer_host(r->tls));
	}
	return true;
}

/* Reads what a raw connection sent; its request whole: the callback. False: r is gone. */
static void raw_read(struct fab_lst *l, struct tcp_raw *r,
		     void (*cb)(void *priv, struct fab_connreq *req, const void *data, size_t len),
		     void *priv)
{
	struct rtrs_tcp_frame fr = { 0 };
	const char *why = NULL;
	size_t idx = r->idx;
	ssize_t n;

	if (!raw_tls(l, r))
		return;
	for (;;) {
		size_t need = RTRS_TCP_HDR_LEN;

		if (r->got >= RTRS_TCP_HDR_LEN) {
			if (!rtrs_tcp_hdr_decode(r->buf, r->got, &fr, &why) &&
			    fr.op != RTRS_TCP_CONNECT)
				why = "first frame is not a connection request";
			if (why) {
				log_warn_rl("listener: %s: %s", r->peer, why);
				raw_free(l, raw_take(l, idx), true);
				return;
			}
			need = RTRS_TCP_HDR_LEN + fr.len;
			if (r->got == need)
				break;
		}
		if (r->tls_io) {
			struct iovec iov = { r->buf + r->got, need - r->got };

			n = rtrs_tls_readv(r->tls, &iov, 1);
		} else {
			n = recv(r->fd, r->buf + r->got, need - r->got, MSG_DONTWAIT);
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			raw_free(l, raw_take(l, idx), true);
			return;
		}
		raw_progress(r);
		r->got += (size_t)n;
	}
	raw_take(l, idx);
	epoll_ctl(l->epfd, EPOLL_CTL_DEL, r->fd, NULL);

	struct fab_connreq req = { .ops = &fab_tcp_ops, .l = l, .r = r };

	cb(priv, &req, r->buf + RTRS_TCP_HDR_LEN, fr.len);
	if (!req.answered)
		raw_free(l, r, false);
}

static int tcp_lst_process(struct fab_lst *l,
			   void (*cb)(void *priv, struct fab_connreq *req, const void *data,
				      size_t len),
			   void *priv)
{
	struct epoll_event evs[64];

	for (int rounds = 0; rounds < 64; rounds++) {
		bool listener = false;
		int n = epoll_wait(l->epfd, evs, ARRAY_SIZE(evs), 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		/* The raw connections first: accepting may close some of them. */
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr)
				raw_read(l, evs[i].data.ptr, cb, priv);
			else
				listener = true;
		}
		if (listener)
			lst_accept(l);
	}
	return 0;
}

/* Sends a connection frame on a socket of our own, blocking briefly at most. */
static int cm_send(int fd, enum rtrs_tcp_op op, const void *data, size_t len)
{
	struct rtrs_tcp_frame f = { .op = op, .len = (uint32_t)len };
	struct rtrs_tcp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)data, len } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
	ssize_t w;

	rtrs_tcp_hdr_encode(&h, &f);
	w = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	return w == (ssize_t)(sizeof(h) + len) ? 0 : w < 0 ? -errno : -EAGAIN;
}

static int tcp_reject(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len)
{
	if (len > RTRS_TCP_CM_MAX)
		return -EMSGSIZE;
	req->answered = true;
	return raw_reject(l, req->r, data, len, false);
}

static void tcp_connreq_tls_host(const struct fab_connreq *req, char *buf, size_t len)
{
	if (req->r->tls)
		snprintf(buf, len, "%s", rtrs_tls_peer_host(req->r->tls));
}

static void tcp_connreq_peer(const struct fab_connreq *req, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getpeername(req->r->fd, (struct sockaddr *)&ss, &sl))
		snprintf(buf, len, "?");
	else
		sockaddr_str(&ss, buf, len);
}

/* ---- connections --------------------------------------------------------------- */

static int con_rx_alloc(struct fab_con *c, size_t count, size_t size)
{
	char *buf;

	if (!count || !size)
		return -EINVAL;
	pthread_mutex_lock(&c->rx_lock);
	if (c->rx_buf) {
		pthread_mutex_unlock(&c->rx_lock);
		return -EEXIST;
	}
	/* One buffer: each message is given back when recv() returns. */
	buf = malloc(size);
	if (buf) {
		c->rx_buf = buf;
		c->rx_size = size;
	}
	pthread_mutex_unlock(&c->rx_lock);
	return buf ? 0 : -ENOMEM;
}

static int tcp_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	return con_rx_alloc(c, count, size);
}

static int con_create(struct fab *f, int fd, const struct fab_con_cfg *cfg, bool server,
		      struct fab_con **out)
{
	struct fab_con *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->ops = &fab_tcp_ops;
	c->fab = f;
	c->cfg = *cfg;
	c->cfg.name = NULL;
	fab_con_name_init(&c->name, cfg->name ? cfg->name : "tcp");
	c->fd = fd;
	c->server = server;
	c->tx_max = (unsigned)MAX(cfg->tx_depth, 1);
	c->state = server ? TC_UP : TC_CONNECTING;
	pthread_mutex_init(&c->tx_lock, NULL);
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_mutex_init(&c->cb_lock, NULL);
	if (cfg->rx_depth && cfg->rx_size) {
		rc = con_rx_alloc(c, cfg->rx_depth, cfg->rx_size);
		if (rc) {
			pthread_mutex_destroy(&c->tx_lock);
			pthread_mutex_destroy(&c->rx_lock);
			pthread_mutex_destroy(&c->cb_lock);
			free(c);
			return rc;
		}
	}
	if (server) /* accepted: connected already */
		con_set_live(c);
	c->g = group_pick();
	*out = c;
	return 0;
}

static void con_free(struct fab_con *c)
{
	struct fab_done *dw = c->dw;
	struct tcp_group *g = c->g;

	if (c->released)
		g->releasing--;

	/*
	 * Work queued before its W_DESTROY was taken with earlier bits (the
	 * bits are read whole) leaves it listed: out of the list before it
	 * goes.
	 */
	pthread_mutex_lock(&g->lock);
	if (c->on_work) {
		struct fab_con *prev = NULL;

		for (struct fab_con *w = g->work_head; w; prev = w, w = w->work_next) {
			if (w != c)
				continue;
			if (prev)
				prev->work_next = c->work_next;
			else
				g->work_head = c->work_next;
			if (g->work_tail == c)
				g->work_tail = prev;
			break;
		}
		c->on_work = false;
	}
	pthread_mutex_unlock(&g->lock);

	while (c->txq_head) {
		struct tcp_txf *t = c->txq_head;

		c->txq_head = t->next;
		txf_release(t);
	}
	if (c->mr)
		mr_put(c->mr);
	free(c->dctx);
	free(c->rx_buf);
	free(c->stash);
	rtrs_tls_free(c->tls);
	if (c->fd >= 0)
		close(c->fd);
	atomic_fetch_sub(&g->nr_cons, 1);
	pthread_mutex_destroy(&c->tx_lock);
	pthread_mutex_destroy(&c->rx_lock);
	pthread_mutex_destroy(&c->cb_lock);
	free(c);
	if (dw) {
		fab_done_signal(dw);
	}
}

static int tcp_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			   size_t len, struct fab_con **out)
{
	struct rtrs_tcp_frame fr = { .op = RTRS_TCP_CONNECT, .len = (uint32_t)len };
	struct rtrs_tcp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)data, len } };
	struct fab_con *c;
	int fd, rc;

	if (len > RTRS_TCP_CM_MAX) {
		log_err("%s: %zu bytes of connection data exceed the provider's %u", cfg->name,
			len, RTRS_TCP_CM_MAX);
		return -EMSGSIZE;
	}
	fd = sock_new(f->addr.ss_family);
	if (fd < 0)
		return fd;
	if (f->srclen && bind(fd, (struct sockaddr *)&f->src, f->srclen)) {
		rc = -errno;
		char a[80];

		sockaddr_str(&f->src, a, sizeof(a));
		log_err("%s: cannot bind to the source address %s: %s", cfg->name, a,
			strerror(-rc));
		err_detail("cannot use the source address %s: %s", a, strerror(-rc));
		close(fd);
		return rc;
	}
	rc = con_create(f, fd, cfg, false, &c);
	if (rc) {
		close(fd);
		return rc;
	}
	rtrs_tcp_hdr_encode(&h, &fr);
	pthread_mutex_lock(&c->tx_lock);
	rc = txq_add(c, iov, len ? 2 : 1, 0, NULL, 0, true, NULL);
	if (!rc) {
		c->txq_tail->counted = false; /* the CONNECT frame is not the owner's */
		c->tx_n--;
	}
	pthread_mutex_unlock(&c->tx_lock);
	if (!rc && connect(fd, (struct sockaddr *)&f->addr, f->addrlen) && errno != EINPROGRESS)
		rc = -errno;
	if (rc) {
		char a[80];

		sockaddr_str(&f->addr, a, sizeof(a));
		log_err("%s: connect to %s: %s", cfg->name, a, strerror(-rc));
		c->fd = -1;
		close(fd);
		atomic_store(&c->destroying, true);
		con_free(c);
		return rc;
	}
	*out = c;
	queue_work(c, W_START);
	return 0;
}

static int tcp_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			  const void *data, size_t len, struct fab_con **out)
{
	struct fab_con *c;
	int rc;

	if (len > RTRS_TCP_CM_MAX)
		return -EMSGSIZE;
	rc = con_create(f, req->r->fd, cfg, true, &c);
	if (rc)
		return rc;
	/* The verdict first: nothing of the owner's may pass it. */
	rc = raw_cm_send(req->r, RTRS_TCP_ACCEPT, data, len);
	if (rc) {
		log_warn("%s: accept: %s", c->name.made, strerror(-rc));
		c->fd = -1;
		con_free(c);
		return rc;
	}
	req->answered = true;
	req->r->fd = -1;
	c->tls = req->r->tls;
	c->tls_io = req->r->tls_io;
	req->r->tls = NULL;
	if (c->tls)
		rtrs_tls_rename(c->tls, c->name.made);
	free(req->r);
	c->tx_open = true;
	*out = c;
	/* The ACCEPT's records may wait for the socket: the flush sends them. */
	queue_work(c, W_START | (c->tls_io ? W_FLUSH : 0));
	return 0;
}

static void tcp_con_shutdown(struct fab_con *c)
{
	if (!c || atomic_exchange(&c->shut, true))
		return;
	pthread_mutex_lock(&c->tx_lock);
	c->tx_dead = true;
	pthread_mutex_unlock(&c->tx_lock);
	shutdown(c->fd, SHUT_RDWR);
}

static void tcp_con_kick(struct fab_con *c)
{
	queue_work(c, W_KICK);
}

static void tcp_con_retry_later(struct fab_con *c)
{
	queue_work(c, W_RETRY);
}

static void tcp_con_destroy(struct fab_con *c)
{
	struct fab_done dw;

	if (!c)
		return;
	atomic_store(&c->shut, true);
	if (on_group_thread(c)) {
		/*
		 * From a callback of another connection of this group: the
		 * group lets go of it when it may (its polls are removed).
		 */
		atomic_store(&c->destroying, true);
		shutdown(c->fd, SHUT_RDWR);
		queue_work(c, W_DESTROY);
		return;
	}
	fab_done_init(&dw);
	c->dw = &dw;
	atomic_store(&c->destroying, true);
	shutdown(c->fd, SHUT_RDWR);
	queue_work(c, W_DESTROY);
	fab_done_wait(&dw);
}

static void tcp_con_rename(struct fab_con *c, const char *name)
{
	fab_con_name_set(&c->name, name);
	if (c->tls)
		rtrs_tls_rename(c->tls, name);
}

static void tcp_con_local(const struct fab_con *c, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	if (getsockname(c->fd, (struct sockaddr *)&ss, &sl))
		snprintf(buf, len, "?");
	else
		sockaddr_str(&ss, buf, len);
}

/* ---- polled mode (rtrs_clt_poll) ---------------------------------------------- */

/*
 * The caller's thread reads the socket and runs the callbacks, as the
 * group would: 0 when another thread is at it. While the connection's
 * poller is active (rtrs-fabric.h, FAB_POLL_LEASE_MS), the group leaves
 * its input to the poller and reads only what is still there a lease
 * later.
 */
/*
 * A turn whose budget ran out leaves input in user space (the stash, a
 * header, OpenSSL's buffer) that no socket poll announces: the group puts
 * the connection on its lease list (W_LEASE), so that if the poller stops
 * the lease's end reads it. The group's own socket poll may have been
 * prepared before this turn emptied the socket and submitted after: it
 * then waits on an empty socket, and without the lease the frames left
 * here would wait for the peer's next byte.
 */
static int tcp_con_poll(struct fab_con *c)
{
	enum rx_end end = RX_EMPTY;
	unsigned frames = 0;

	if (atomic_load(&c->destroying) || pthread_mutex_trylock(&c->cb_lock))
		return 0;
	if (c->state == TC_UP && !con_quiet(c))
		end = rx_frames(c, &frames);
	pthread_mutex_unlock(&c->cb_lock);
	if (end == RX_BUDGET)
		queue_work(c, W_LEASE);
	return (int)frames;
}

/*
 * The socket itself is the wait fd: readable when a frame (or the end) is
 * there. Frames a turn read but left (the stash, a header whose frame
 * did not start) are not on it: -EAGAIN while there are, or while a
 * turn is reading.
 */
static int tcp_con_trywait(struct fab_con *c)
{
	struct pollfd pfd = { .fd = c->fd, .events = POLLIN };
	bool left;

	if (pthread_mutex_trylock(&c->cb_lock))
		return -EAGAIN;
	left = c->stash || (!c->in_payload && c->hdr_got == sizeof(c->hdr)) ||
	       (c->tls_io && !rtrs_tls_drained(c->tls));
	pthread_mutex_unlock(&c->cb_lock);
	if (left)
		return -EAGAIN;
	return poll(&pfd, 1, 0) > 0 ? -EAGAIN : 0;
}

static int tcp_con_wait_fd(const struct fab_con *c)
{
	return c->fd;
}

static void tcp_con_set_poller(struct fab_con *c, struct fab_poller *p)
{
	/* Taken away: what the group left to it is read at the lease's end. */
	atomic_store(&c->poller, p);
}

/* ---- operations ---------------------------------------------------------------- */

/*
 * Frames for a write of iov[0..iov_cnt) into rma[0..rma_cnt): one WRITE
 * per remote range, the immediate on the last. hdrs: rma_cnt headers;
 * out: room for rma_cnt * (iov_cnt + 1) iovecs. Returns their number, or
 * -EINVAL when the lengths disagree.
 */
static int write_frames(const struct iovec *iov, size_t iov_cnt, const struct fab_rma *rma,
			size_t rma_cnt, bool with_imm, uint32_t imm, struct rtrs_tcp_hdr *hdrs,
			struct iovec *out)
{
	size_t li = 0, loff = 0;
	int n = 0;

	for (size_t r = 0; r < rma_cnt; r++) {
		struct rtrs_tcp_frame f = {
			.op = RTRS_TCP_WRITE, .len = (uint32_t)rma[r].len, .key = rma[r].key,
			.off = rma[r].addr, .has_imm = with_imm && r == rma_cnt - 1, .imm = imm,
		};
		uint64_t need = rma[r].len;

		/* An empty write without an immediate is what the peer refuses (the decoder). */
		if (rma[r].len > RTRS_TCP_WRITE_MAX || (!rma[r].len && !f.has_imm))
			return -EINVAL;
		rtrs_tcp_hdr_encode(&hdrs[r], &f);
		out[n++] = (struct iovec){ &hdrs[r], sizeof(hdrs[r]) };
		while (need) {
			if (li == iov_cnt)
				return -EINVAL;
			size_t take = MIN(need, iov[li].iov_len - loff);

			if (take)
				out[n++] = (struct iovec){ (char *)iov[li].iov_base + loff, take };
			need -= take;
			loff += take;
			if (loff == iov[li].iov_len) {
				li++;
				loff = 0;
			}
		}
	}
	/* The local bytes are the remote ranges', no more (RDMA fails such a post too). */
	while (li < iov_cnt && !iov[li].iov_len)
		li++;
	if (loff || li < iov_cnt)
		return -EINVAL;
	return n;
}

static int tcp_write_left(struct fab_con *c, const struct iovec *iov, void *const *desc,
			  size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
			  uint32_t imm, void *ctx, bool *left)
{
	struct rtrs_tcp_hdr hdrs[TCP_RMA_LIMIT];
	struct iovec out[TCP_RMA_LIMIT * (TCP_IOV_LIMIT + 1)];
	int n;

	(void)desc;
	if (!rma_cnt || rma_cnt > TCP_RMA_LIMIT || iov_cnt > TCP_IOV_LIMIT)
		return -EINVAL;
	n = write_frames(iov, iov_cnt, rma, rma_cnt, with_imm, imm, hdrs, out);
	if (n < 0)
		return n;
	return tx_post(c, out, (unsigned)n, hdrs, sizeof(hdrs), false, ctx, left);
}

static int tcp_write(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t iov_cnt,
		     const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
		     void *ctx)
{
	return tcp_write_left(c, iov, desc, iov_cnt, rma, rma_cnt, with_imm, imm, ctx, NULL);
}

static int tcp_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			 uint64_t key, uint32_t imm, void *ctx)
{
	struct rtrs_tcp_frame f = { .op = RTRS_TCP_WRITE, .len = (uint32_t)len, .key = key,
				    .off = addr, .has_imm = true, .imm = imm };
	struct rtrs_tcp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)buf, len } };

	if (len > TCP_INJECT)
		return -EMSGSIZE;
	rtrs_tcp_hdr_encode(&h, &f);
	return tx_post(c, iov, len ? 2 : 1, NULL, 0, true, ctx, NULL);
}

static int send_frame(struct fab_con *c, const void *buf, size_t len, bool has_imm, uint32_t imm,
		      void *ctx)
{
	struct rtrs_tcp_frame f = { .op = RTRS_TCP_SEND, .len = (uint32_t)len, .has_imm = has_imm,
				    .imm = imm };
	struct rtrs_tcp_hdr h;
	int rc;

	if (!len || len > RTRS_TCP_SEND_MAX)
		return -EMSGSIZE;
	rtrs_tcp_hdr_encode(&h, &f);
	/*
	 * Control messages go out from service threads, where waiting for room
	 * is safe; never on the group's own thread.
	 */
	for (int tries = 0;; tries++) {
		struct iovec iov[2] = { { &h, sizeof(h) }, { (void *)buf, len } };

		rc = tx_post(c, iov, 2, NULL, 0, true, ctx, NULL);
		if (rc != -EAGAIN || tries == 1000 || on_group_thread(c))
			return rc;
		usleep(1000);
	}
}

static int tcp_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	(void)desc;
	return send_frame(c, buf, len, false, 0, ctx);
}

static int tcp_send_imm(struct fab_con *c, const void *buf, size_t len, void *desc, uint32_t imm,
			void *ctx)
{
	(void)desc;
	return send_frame(c, buf, len, true, imm, ctx);
}

const struct fab_ops fab_tcp_ops = {
	.name = "tcp",
	.open = tcp_open,
	.close = tcp_close,
	.attr = tcp_attr,
	.mr_reg = tcp_mr_reg,
	.mr_dereg = tcp_mr_dereg,
	.trim = tcp_trim,
	.listen = tcp_listen,
	.lst_close = tcp_lst_close,
	.lst_fd = tcp_lst_fd,
	.lst_port = tcp_lst_port,
	.lst_process = tcp_lst_process,
	.lst_limit = tcp_lst_limit,
	.lst_sweep = tcp_lst_sweep,
	.lst_closed = tcp_lst_closed,
	.reject = tcp_reject,
	.connreq_peer = tcp_connreq_peer,
	.con_connect = tcp_con_connect,
	.con_accept = tcp_con_accept,
	.con_shutdown = tcp_con_shutdown,
	.con_rx_setup = tcp_con_rx_setup,
	.con_kick = tcp_con_kick,
	.con_retry_later = tcp_con_retry_later,
	.con_destroy = tcp_con_destroy,
	.con_local = tcp_con_local,
	.con_rename = tcp_con_rename,
	.set_tls = tcp_set_tls,
	.connreq_tls_host = tcp_connreq_tls_host,
	.write = tcp_write,
	.write_left = tcp_write_left,
	.write_imm = tcp_write_imm,
	.send = tcp_send,
	.send_imm = tcp_send_imm,
	.con_poll = tcp_con_poll,
	.con_trywait = tcp_con_trywait,
	.con_wait_fd = tcp_con_wait_fd,
	.con_set_poller = tcp_con_set_poller,
};
