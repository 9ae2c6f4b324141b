/* SPDX-License-Identifier: MIT */
/*
 * The fabric layer over rdma-core: librdmacm for connections, libibverbs
 * for everything that moves data. The only file in the project that calls
 * rdma_* or ibv_*. It is the fabric for RDMA devices (soft-RoCE, siw,
 * hardware); rtrs-fabric-tcp.c is the fabric for TCP.
 *
 * Why native: the kernel's RTRS puts its connection request, response and
 * reject in the RDMA CM's private data, raw. libfabric's verbs provider
 * puts a length byte in front of that data in both directions, so neither
 * side could read the kernel's (that is why this fabric exists rather
 * than libfabric's, which the project no longer uses). Here private data goes out and comes in as
 * it is; on IB and RoCE the CM pads it (a request to 56 bytes, an accept to
 * 196, a reject to 148), and the decoders read the prefix they know.
 *
 * The rules that shape this file:
 *   - RDMA_PS_TCP CM ids, as the kernel's RTRS uses; RC queue pairs;
 *   - no thread per connection: a process runs poll groups (one per CPU
 *     unless told otherwise, fab_rdma_groups), and every connection belongs
 *     to one for its life, the one with the fewest. A group has one CM
 *     event channel for all of its connections' ids and, per device, CQs
 *     that its connections' queue pairs share (each with its completion
 *     channel); its thread sleeps in epoll on those and on an eventfd
 *     for work (kicks, retries, destroys), and runs every callback of its
 *     connections. A completion is its connection's by the QP number;
 *   - nothing on a group's thread waits on the network: iWARP's
 *     rdma_connect, which makes a TCP connection before it returns, runs on
 *     a connect thread (con_connect_run);
 *   - a connection leaves its group on the group's thread: its QP is
 *     destroyed there, the CQ is read until it is empty once more (what
 *     the QP left in it is dropped), and only then can its QP number mean
 *     another connection;
 *   - a client resolves the address and route before it returns from
 *     fab_con_connect, so the receive pool is posted before the request
 *     leaves (a peer may send the moment it accepts);
 *   - every send and write is signalled and counted: the send queue never
 *     overflows, and a full one is -EAGAIN;
 *   - immediates ride on RDMA WRITE WITH IMM; a device without it (iWARP)
 *     sends each as a 4-byte message after its write, and send-after-write
 *     order makes its arrival mean the data is placed;
 *   - the device picks memory keys (32 bits); always_invalidate's rotation
 *     re-registers, and rtrs-srv-keys.c refuses a key it saw recently.
 * The RDMA CM keeps nothing of ours for a peer that connects and says
 * nothing (no socket reaches us before its request), so the listener's
 * raw-connection limits have nothing to do here.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "log.h"
#include "rtrs-fabric.h"
#include "rtrs.h"
#include "util.h"

#define RDMA_CQ_BATCH 64
#define RDMA_RESOLVE_MS 5000   /* address and route resolution */
#define RDMA_INLINE 64         /* inline bytes asked for: immediates' data, key records */
#define RDMA_SGE_MAX 16        /* local vectors per operation, at most */
/*
 * Providers round a send queue up to a power of two (rxe: its entries and
 * one more): a depth up to this far past one is cut to just below it, which
 * halves the ring and the CQ room it reserves (a queue depth of 512 with its
 * 16 spare entries asked for 528, and got 1024). Posts beyond it wait in
 * the connection's pending list, as on any full queue.
 */
#define RDMA_SQ_SLACK 32
#define RDMA_CHAIN_MAX 16      /* work requests in one post (fab_post) */
#define RDMA_DRAIN_MS 500      /* an SRQ user's QP: how long its release waits for its flush */
#define RDMA_CHAIN_SGE 48      /* ... and their vectors */
#define RDMA_IMM_MSG_LEN 4     /* an immediate carried as a message (iWARP) */
#define RDMA_RX_MIN 64         /* the smallest receive buffer */
#define RDMA_CQ_ACK_BATCH 64   /* completion events acknowledged at a time */
#define RDMA_SIG_EVERY_MAX 64  /* at most this many send requests go unsignalled in a row */
/* soft-iWARP's vendor id ("bmt"): its sends go out on a kernel TCP socket. */
#define RDMA_SIW_VENDOR_ID 0x626d74
/* Private data the CM carries (IBA 12.7 via the RDMA CM's 36-byte header; MPA on iWARP). */
#define RDMA_IB_CONNECT_MAX 56
#define RDMA_IB_ACCEPT_MAX 196
#define RDMA_IB_REJECT_MAX 148
#define RDMA_IW_PDATA_MAX 255 /* MPA carries 512; rdma_cm's length field is a byte */
#define RDMA_GROUPS_MAX RTRS_MAX_POLL_GROUPS
#define RDMA_GCQ_ENTRIES 8192  /* a group's CQ has at least this many entries (a server's twice) */
#define RDMA_RETRY_MS 1        /* a retry after -EAGAIN comes this soon without completions */
#define RDMA_CM_POLL_NS 1000000 /* a group that never sleeps reads its CM channel this often */
#define RDMA_INSERT_WAIT_MS 2000 /* a reused QP number waits this long for its last owner */
/* iWARP's connect threads (con_connect_run): at most this many, each ends this long idle. */
#define RDMA_CONNECT_THREADS_MAX 64
#define RDMA_CONNECT_IDLE_MS 5000
/*
 * ... and at most this many of them in rdma_connect to one destination
 * (address and port), so that a dead host (each connect stuck for the
 * kernel's TCP connect timeout) holds no more than this of the pool: 16
 * dead hosts at once before live ones wait. 4: a live host's connect
 * returns within a round trip, so one path's connections (1 + its IO
 * connections, connected together) to a live server lose little to the
 * queue, while one lost SYN (a second's retransmit) leaves three going.
 */
#define RDMA_CONNECT_PER_DEST_MAX 4
#define RDMA_SRQ_DEFAULT RTRS_DEFAULT_SRQ_DEPTH
/*
 * The wait a peer's RNR NAK asks for when a shared receive queue is empty
 * (IBA's encoding: 10 is 0.32 ms). The CM leaves 0, which is 655 ms.
 */
#define RDMA_SRQ_RNR_TIMER 10
#define RDMA_SRQ_RX 64         /* bytes per receive of a shared receive queue (imm only) */
/* The IB CM's reject reason for a consumer's reject, which carries its private data. */
#define RDMA_IB_REJ_CONSUMER 28
/* ... and the CM's when nothing listens on the service (the port). */
#define RDMA_IB_REJ_NO_LISTENER 8

struct fab {
	const struct fab_ops *ops; /* first: struct fab_obj */
	struct ibv_context *verbs; /* the device every connection of this fab uses */
	struct ibv_pd *pd;
	struct fab_attr attr;
	unsigned max_cqe;          /* the device's largest CQ */
	unsigned max_srq_wr;       /* the device's largest SRQ (0: it has none) */
	bool iwarp;
	bool sigpipe_guard;        /* siw: posting can raise SIGPIPE (below) */
	bool siw;                  /* holds a siw_plug reference */
	bool server;
	/*
	 * The owner's reference and one per connect handed to the connect
	 * threads (con_connect_start: waiting for its destination or a thread,
	 * or running, until con_connect_run's end): fab_close frees the
	 * fabric when the last goes, since such a connection's QP and CM id
	 * hold its PD and groups.
	 */
	atomic_uint refs;
	struct sockaddr_storage src, dst; /* client: where from and to */
	bool has_src;
	/* Server: the bound id and its channel, handed to fab_listen. */
	struct rdma_event_channel *lch;
	struct rdma_cm_id *lid;
	bool listening;
};

struct fab_lst {
	const struct fab_ops *ops;
	struct fab *fab;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	int port;
};

struct fab_connreq {
	const struct fab_ops *ops;
	struct rdma_cm_id *id;
	bool answered;  /* accepted or rejected */
	bool accepted;  /* a connection owns the id now */
};

struct fab_rx {
	char *buf;
	struct ibv_mr *mr;
	size_t count;
	size_t size;
};

/* QP number -> connection, open addressing; under the group's lock. */
struct rdma_qpmap {
	uint32_t *key;          /* 0: empty; RDMA_QPMAP_GONE: removed */
	struct fab_con **val;
	size_t cap, used, live; /* used counts removed slots too */
};
#define RDMA_QPMAP_GONE UINT32_MAX

/*
 * A CQ of a poll group on one device, shared by the QPs of the group's
 * connections there; its completion channel is its own. Made by a
 * connection's setup when the group has none with room, kept until the
 * groups stop; the list only grows (the group thread reads it without
 * the lock).
 */
struct rdma_gcq {
	struct rdma_gcq *next;
	struct rdma_group *g;
	struct ibv_context *verbs;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	unsigned size;          /* entries */
	unsigned used;          /* reserved by QPs on it (send + receive queues), under g->lock */
	/*
	 * Its QPs by number, under g->lock: per CQ, since each device
	 * numbers its QPs on its own.
	 */
	struct rdma_qpmap map;
	bool armed;             /* group thread only */
	unsigned unacked;       /* completion events not yet acknowledged; group thread only */
	/*
	 * The shared receive queue whose receives this CQ's QPs may complete
	 * (one at most), while srq_users of them use it; its srq_count
	 * entries are reserved in used meanwhile, since every receive could
	 * complete here. Under g->lock.
	 */
	struct rdma_gsrq *srq;
	unsigned srq_users;
};

/*
 * A shared receive queue of a poll group on one device and PD
 * (rdma_srq_depth receives of RDMA_SRQ_RX bytes, all posted), used by a
 * server's imm-only connections there: made by the first, destroyed with
 * the last (users); its CQs reserve room for it (rdma_gcq.srq). The list
 * and users under g->lock; a connection that holds it posts to it without.
 */
struct rdma_gsrq {
	struct rdma_gsrq *next;
	struct rdma_group *g;
	struct ibv_context *verbs;
	struct ibv_pd *pd;
	struct ibv_srq *srq;
	struct ibv_mr *mr;
	char *buf;
	unsigned count;
	unsigned users;
};

struct rdma_group {
	unsigned idx;
	pthread_t thread;
	int epfd, efd;
	struct rdma_event_channel *ch; /* every connection's CM id, once set up */
	pthread_mutex_t lock;   /* cqs (adding), map, srqs, CQ and SRQ room, work, destroy waits */
	_Atomic(struct rdma_gcq *) cqs;
	struct rdma_gsrq *srqs; /* under lock */
	struct fab_con *work;   /* connections with work bits set */
	struct fab_con *retry;  /* waiting to be kicked again (group thread only) */
	uint64_t retry_since;
	atomic_bool woken, stop;
	atomic_uint nr_cons;
	_Atomic uint64_t poll_ns; /* busy-poll this long before sleeping (the most any asked) */
};

/* Work handed to a connection's group (fab_con.work). */
enum {
	W_KICK = 1u << 0,       /* ops->kick */
	W_RETRY = 1u << 1,      /* ops->kick after a completion or RDMA_RETRY_MS */
	W_CONNECTED = 1u << 2,  /* the connect thread's result (connect_rc) */
	W_DESTROY = 1u << 3,    /* leave the group (destroy) */
};

/* A registration whose deregistration waits for the sends posted before it (nat_mr_dereg_after). */
struct rdma_defer {
	struct rdma_defer *next;
	struct ibv_mr *mr;
	size_t len;
	uint64_t seq;           /* the connection's tx_seq when it was deferred */
};

/* A destroyer's wait (con_destroy); keep: the connect thread frees the connection. */
struct con_dw {
	struct fab_done done;
	bool keep;
};

struct fab_con {
	const struct fab_ops *ops;
	struct fab *fab;
	struct fab_con_cfg cfg;
	struct fab_con_name name; /* in log lines (con_name) */
	struct rdma_cm_id *id;
	/*
	 * A client's connection: its id is on the group's channel from the
	 * start, and the group resolves, makes the QP and connects (handle_cm);
	 * destroying it goes through the group even before a QP is made.
	 */
	bool on_group;
	uint8_t pdata[RDMA_IW_PDATA_MAX]; /* the connect's private data, kept until then */
	uint8_t pdata_len;
	struct ibv_qp *qp;      /* id's QP once made; it may outlive id (group_release) */
	bool own_id;            /* destroy id with the connection */
	struct rdma_group *g;   /* for its life */
	struct rdma_gcq *gcq;   /* its QP's CQ */
	unsigned cq_reserved;   /* entries of gcq it reserved */
	bool qp_made;
	bool qp_gone;           /* destroyed by the group */
	bool drained;           /* srq_qp_drain's marker came back */
	uint32_t qpn;           /* its QP's number, kept past the QP */
	bool in_map;
	struct fab_rx rx;
	struct rdma_gsrq *srq;  /* where its receives come from, if shared (gcq->srq) */
	size_t rx_cap;          /* receives it may post: what its CQ room was reserved for */
	pthread_mutex_t rx_lock; /* rx pool set up from another thread */
	atomic_uint work;       /* W_* bits for the group */
	struct fab_con *work_next, *retry_next;
	bool in_retry;          /* group thread only */
	struct con_dw *dw;      /* the destroyer waiting, if any */
	/*
	 * iWARP: rdma_connect runs on a connect thread (con_connect_run)
	 * while connecting (waiting for one, or running); its result in
	 * connect_rc. A connection destroyed meanwhile is orphaned: the group
	 * leaves its id and QP alone and the connect thread, once
	 * rdma_connect returned, destroys it. Under g->lock.
	 */
	bool connecting;
	bool orphaned;
	int connect_rc;
	/*
	 * Its place in the connect threads' pool (cpool), under cpool.lock:
	 * waiting for its destination (CS_WAIT, on cdest's list), for a
	 * thread (CS_READY, on the pool's list), or taken by one (CS_RUN);
	 * cslot: counted in cdest->running.
	 */
	struct fab_con *connect_next;
	struct cdest *cdest;
	uint8_t cstate;
	bool cslot;
	atomic_bool destroying; /* no callback runs any more */
	atomic_bool down;       /* down() was called (or the owner shut us down) */
	atomic_bool shutdown;   /* fab_con_shutdown() was called */
	atomic_uint tx_posted;  /* work requests posted and not completed */
	unsigned tx_max;        /* the send queue's size */
	/*
	 * Selective signalling: a work request is signalled when it carries a
	 * context or when tx_sig_every have gone unsignalled; a signalled
	 * completion gives back the room of every request up to it (an RC send
	 * queue completes in order). tx_fifo holds, per signalled request in
	 * flight, how many requests its completion covers; under tx_lock, which
	 * also keeps the posting order equal to the FIFO's.
	 */
	pthread_mutex_t tx_lock;
	unsigned tx_unsig;      /* posted since the last signalled request */
	unsigned tx_sig_every;
	unsigned *tx_fifo;      /* tx_max entries */
	unsigned tx_head, tx_count;
	/*
	 * Work requests posted (tx_account) and completed (tx_complete) so
	 * far, and the registrations that wait for tx_done to reach the
	 * tx_seq of their deferral (nat_mr_dereg_after), oldest first: all
	 * under tx_lock. What is left goes when the connection is freed.
	 */
	uint64_t tx_seq, tx_done;
	struct rdma_defer *defer, **defer_tail;
	size_t max_inline;      /* granted */
};

/*
 * A verbs call's failure as a negative errno within 1..4095: providers
 * differ (most return the errno; libsiw returns it negated, or -1 with
 * errno set when the write to its doorbell is refused). err: errno right
 * after the call.
 */
static int verbs_err(int rc, int err)
{
	int e = rc > 0 ? rc : rc == -1 && err > 0 ? err : -rc;

	return e > 0 && e < 4096 ? -e : -EIO;
}

/* The poll groups of this process: started with the first fab, stopped with the last. */
static struct {
	pthread_mutex_t lock;
	unsigned want;          /* fab_rdma_groups; 0: one per CPU */
	unsigned users, n;
	struct rdma_group *g;
} rgrp = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* Receives of a group's shared receive queue per device (fab_rdma_srq); 0: none. */
static _Atomic unsigned rdma_srq_depth = RDMA_SRQ_DEFAULT;

/* The group whose thread this is, if any. */
static __thread struct rdma_group *tls_group;

static int nat_con_rx_setup(struct fab_con *c, size_t count, size_t size);
static int con_connect_routed(struct fab_con *c);
static void cpool_cancel(struct fab_con *c);
static void con_connected_rc(struct fab_con *c);
static int groups_get(void);
static void groups_put(void);

/* ---- helpers ------------------------------------------------------------------ */

static const char *con_name(const struct fab_con *c)
{
	return fab_con_name_get(&c->name);
}

static void sockaddr_str(const struct sockaddr *s, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (!s) {
		snprintf(buf, len, "?");
	} else if (s->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)s;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
	} else if (s->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)s;

		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr))
			inet_ntop(AF_INET, &in6->sin6_addr.s6_addr[12], host, sizeof(host));
		else
			inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) ? "%s:%u" : "[%s]:%u",
			 host, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "family-%d", s->sa_family);
	}
}

/* node[:service] to a socket address; -ENXIO (logged) when it does not resolve. */
static int resolve(const char *node, const char *service, bool passive,
		   struct sockaddr_storage *out)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0 };
	struct addrinfo *res;
	int rc = getaddrinfo(node, service, &hints, &res);

	if (rc) {
		log_err("fabric: %s%s%s: %s", node ? node : "*", service ? ":" : "",
			service ? service : "", gai_strerror(rc));
		err_detail("cannot resolve %s: %s", node ? node : "*", gai_strerror(rc));
		return rc == EAI_SYSTEM ? -errno : -ENXIO;
	}
	memset(out, 0, sizeof(*out));
	memcpy(out, res->ai_addr, MIN(res->ai_addrlen, sizeof(*out)));
	freeaddrinfo(res);
	return 0;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static struct rdma_event_channel *channel_open(void)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();

	if (ch && set_nonblock(ch->fd)) {
		rdma_destroy_event_channel(ch);
		return NULL;
	}
	return ch;
}

/*
 * Waits up to ms for the next event on ch, which must be want; 0, or the
 * error the event means. fab_open's resolution, before the fab has a group.
 */
static int cm_wait(struct rdma_event_channel *ch, enum rdma_cm_event_type want, unsigned ms)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *ev;
	uint64_t end = now_ms() + ms;
	int rc;

	for (;;) {
		if (rdma_get_cm_event(ch, &ev) == 0)
			break;
		if (errno != EAGAIN && errno != EINTR)
			return -errno;
		uint64_t now = now_ms();

		if (now >= end)
			return -ETIMEDOUT;
		if (poll(&p, 1, (int)(end - now)) < 0 && errno != EINTR)
			return -errno;
	}
	if (ev->event == want) {
		rc = 0;
	} else {
		switch (ev->event) {
		case RDMA_CM_EVENT_ADDR_ERROR:
			rc = ev->status < 0 ? ev->status : -EHOSTUNREACH;
			break;
		case RDMA_CM_EVENT_ROUTE_ERROR:
			rc = ev->status < 0 ? ev->status : -ENETUNREACH;
			break;
		default:
			rc = -EIO;
		}
		log_dbg("fabric: waited for %s, got %s (status %d)", rdma_event_str(want),
			rdma_event_str(ev->event), ev->status);
	}
	rdma_ack_cm_event(ev);
	return rc;
}

/* Resolves id's address to dst from src: the device behind the route (fab_open). */
static int id_resolve(struct rdma_event_channel *ch, struct rdma_cm_id *id, struct fab *f)
{
	if (rdma_resolve_addr(id, f->has_src ? (struct sockaddr *)&f->src : NULL,
			      (struct sockaddr *)&f->dst, RDMA_RESOLVE_MS))
		return -errno;
	return cm_wait(ch, RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_RESOLVE_MS + 1000);
}

/* The most private data the CM carries for op on this fab's transport. */
static size_t pdata_max(const struct fab *f, int op)
{
	if (f->iwarp)
		return RDMA_IW_PDATA_MAX;
	return op == 0 ? RDMA_IB_CONNECT_MAX : op == 1 ? RDMA_IB_ACCEPT_MAX : RDMA_IB_REJECT_MAX;
}

/* ---- fabric and domain ----------------------------------------------------------- */

/*
 * siw's user library takes the mmap key 0x90000 (SIW_INVAL_UOBJ_KEY) for
 * "no queue": a CQ, send or receive queue that the kernel maps at that page
 * offset fails to be made (NULL, errno untouched), and so does every later
 * one, which lands on the same free offset. The kernel hands out offsets
 * from the lowest free page of the process's device context, so the 145th
 * page is met after some dozens of connections. A CQ of RDMA_SIW_PLUG_CQE
 * entries (1 MiB) made first holds the pages up to past that offset for as
 * long as the fabric is open in the process.
 */
#define RDMA_SIW_PLUG_CQE 32768
static struct {
	pthread_mutex_t lock;
	unsigned users;
	struct ibv_context *verbs[8];
	struct ibv_cq *cq[8];
} siw_plug = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void siw_plug_get(struct ibv_context *verbs)
{
	unsigned i;

	pthread_mutex_lock(&siw_plug.lock);
	siw_plug.users++;
	for (i = 0; i < ARRAY_SIZE(siw_plug.verbs) && siw_plug.verbs[i]; i++)
		if (siw_plug.verbs[i] == verbs)
			break;
	if (i < ARRAY_SIZE(siw_plug.verbs) && !siw_plug.verbs[i]) {
		siw_plug.cq[i] = ibv_create_cq(verbs, RDMA_SIW_PLUG_CQE, NULL, NULL, 0);
		if (siw_plug.cq[i])
			siw_plug.verbs[i] = verbs;
		else
			log_warn("fabric: %s: the completion queue that keeps siw's invalid mmap "
				 "key unused could not be made; connections may fail to be made",
				 ibv_get_device_name(verbs->device));
	}
	pthread_mutex_unlock(&siw_plug.lock);
}

static void siw_plug_put(void)
{
	pthread_mutex_lock(&siw_plug.lock);
	if (siw_plug.users && !--siw_plug.users) {
		for (unsigned i = 0; i < ARRAY_SIZE(siw_plug.verbs); i++) {
			if (siw_plug.cq[i])
				ibv_destroy_cq(siw_plug.cq[i]);
			siw_plug.cq[i] = NULL;
			siw_plug.verbs[i] = NULL;
		}
	}
	pthread_mutex_unlock(&siw_plug.lock);
}

/* The device's limits as the upper layers see them. */
static int fab_setup_device(struct fab *f, struct ibv_context *verbs)
{
	struct ibv_device_attr da;
	struct fab_attr *a = &f->attr;

	if (ibv_query_device(verbs, &da))
		return -errno;
	f->verbs = verbs;
	f->max_cqe = (unsigned)MAX(da.max_cqe, 0);
	f->max_srq_wr = da.max_srq ? (unsigned)MAX(da.max_srq_wr, 0) : 0;
	f->iwarp = verbs->device->transport_type == IBV_TRANSPORT_IWARP;
	f->sigpipe_guard = f->iwarp && da.vendor_id == RDMA_SIW_VENDOR_ID;
	f->siw = f->sigpipe_guard;
	f->pd = ibv_alloc_pd(verbs);
	if (!f->pd)
		return errno ? -errno : -ENOMEM;
	snprintf(a->prov_name, sizeof(a->prov_name), "verbs");
	a->mr_local = true;
	a->virt_addr = true;
	a->rx_cq_data = true;   /* an incoming immediate consumes a posted receive */
	a->imm_by_send = f->iwarp;
	a->iov_limit = (size_t)MAX(MIN(da.max_sge, RDMA_SGE_MAX), 1);
	a->rma_iov_limit = 1;   /* one remote range per RDMA write */
	a->max_queue = (size_t)MIN(da.max_qp_wr, da.max_cqe / 2);
	a->inject_size = RDMA_INLINE;
	a->prov_key = true;
	a->connect_data_max = pdata_max(f, 0);
	/* iWARP has neither a send with immediate nor, in siw, a send with invalidate. */
	a->send_imm = !f->iwarp;
	a->send_inv = !f->iwarp;
	a->chain = true;
	/*
	 * Type-1 memory windows (rxe has them, siw has none): each bind
	 * advances the key's low byte, so 255 binds give 255 new keys.
	 */
	if ((da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) && da.max_mw > 0)
		a->win_binds = 255;
	log_dbg("fabric: device %s (%s), max_qp_wr %d, max_sge %d, max_cqe %d, max_srq_wr %d",
		ibv_get_device_name(verbs->device), f->iwarp ? "iWARP" : "IB/RoCE", da.max_qp_wr,
		da.max_sge, da.max_cqe, da.max_srq ? da.max_srq_wr : 0);
	return 0;
}

/*
 * A wildcard listener is bound to no device: it takes the first RDMA
 * device there is, and connections that arrive on another are refused.
 */
static struct ibv_context *first_device(void)
{
	int n = 0;
	struct ibv_context **devs = rdma_get_devices(&n);
	struct ibv_context *v = NULL;

	if (devs && n > 0) {
		v = devs[0];
		if (n > 1)
			log_warn("fabric: listening on every address with %d RDMA devices: "
				 "connections only through %s", n, ibv_get_device_name(v->device));
	}
	if (devs)
		rdma_free_devices(devs);
	return v;
}

static int nat_open(const char *prov, const char *src, const char *node, const char *service,
		     bool server, size_t queue, struct fab **out)
{
	struct rdma_event_channel *ch = NULL;
	struct rdma_cm_id *id = NULL;
	struct ibv_context *verbs;
	struct fab *f;
	int rc;

	(void)prov;
	(void)queue;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->ops = &fab_rdma_ops;
	f->server = server;
	atomic_init(&f->refs, 1);
	ch = channel_open();
	if (!ch) {
		rc = errno ? -errno : -ENOMEM;
		goto fail;
	}
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		rc = -errno;
		log_err("fabric: rdma_create_id: %s%s", strerror(-rc),
			rc == -ENODEV ? " (no RDMA device, or the rdma_ucm module is not loaded)" : "");
		goto fail;
	}
	if (server) {
		rc = resolve(node, service, true, &f->src);
		if (rc)
			goto fail;
		if (rdma_bind_addr(id, (struct sockaddr *)&f->src)) {
			rc = -errno;
			log_err("fabric: binding %s:%s: %s", node ? node : "*", service,
				strerror(-rc));
			goto fail;
		}
		verbs = id->verbs ? id->verbs : first_device();
		if (!verbs) {
			log_err("fabric: no RDMA device to listen on");
			rc = -ENODEV;
			goto fail;
		}
		f->lch = ch;
		f->lid = id;
		ch = NULL;
		id = NULL;
	} else {
		rc = resolve(node, service, false, &f->dst);
		if (!rc && src && *src) {
			rc = resolve(src, NULL, false, &f->src);
			f->has_src = !rc;
		}
		if (rc)
			goto fail;
		/* The device behind the route: memory is registered before any connection. */
		rc = id_resolve(ch, id, f);
		if (rc) {
			log_err("fabric: no RDMA device reaches %s:%s: %s", node, service,
				strerror(-rc));
			goto fail;
		}
		verbs = id->verbs;
	}
	rc = fab_setup_device(f, verbs);
	if (rc)
		goto fail;
	rc = groups_get();
	if (rc)
		goto fail;
	if (f->siw)
		siw_plug_get(verbs);
	if (id)
		rdma_destroy_id(id);
	if (ch)
		rdma_destroy_event_channel(ch);
	*out = f;
	return 0;

fail:
	if (id)
		rdma_destroy_id(id);
	if (ch)
		rdma_destroy_event_channel(ch);
	if (f->lid)
		rdma_destroy_id(f->lid);
	if (f->lch)
		rdma_destroy_event_channel(f->lch);
	if (f->pd)
		ibv_dealloc_pd(f->pd);
	free(f);
	return rc;
}

/* The last reference to f (fab_close, or the last connect thread) frees it. */
static void fab_put(struct fab *f)
{
	if (atomic_fetch_sub(&f->refs, 1) != 1)
		return;
	if (f->lid && !f->listening)
		rdma_destroy_id(f->lid);
	if (f->lch && !f->listening)
		rdma_destroy_event_channel(f->lch);
	if (f->pd && ibv_dealloc_pd(f->pd))
		log_warn("fabric: a protection domain still in use at close");
	if (f->siw)
		siw_plug_put();
	free(f);
	groups_put();
}

/*
 * An iWARP connect thread still in rdma_connect (its connection destroyed)
 * keeps the fabric until it returns: its QP is on the PD, its id on a
 * group's channel.
 */
static void nat_close(struct fab *f)
{
	if (f)
		fab_put(f);
}

static const struct fab_attr *nat_attr(const struct fab *f)
{
	return &f->attr;
}

static int nat_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	int acc = IBV_ACCESS_LOCAL_WRITE;
	struct ibv_mr *m;

	memset(mr, 0, sizeof(*mr));
	mr->buf = buf;
	mr->len = len;
	/* Never remote read: we issue no RDMA reads, and nobody reads our memory. */
	if (access & FAB_MR_REMOTE_WRITE)
		acc |= IBV_ACCESS_REMOTE_WRITE;
	if ((access & FAB_MR_BIND) && f->attr.win_binds)
		acc |= IBV_ACCESS_MW_BIND;
	m = ibv_reg_mr(f->pd, buf, len, acc);
	if (!m) {
		int rc = errno ? -errno : -ENOMEM;

		log_err("fabric: registering %zu bytes failed: %s", len, strerror(-rc));
		return rc;
	}
	mr->priv = m;
	mr->ops = &fab_rdma_ops;
	mr->key = m->rkey;
	mr->desc = m;
	mr->base = (uint64_t)(uintptr_t)buf;
	return 0;
}

static int nat_win_alloc(struct fab *f, struct fab_win *w)
{
	struct ibv_mw *mw;

	memset(w, 0, sizeof(*w));
	if (!f->attr.win_binds)
		return -EOPNOTSUPP;
	mw = ibv_alloc_mw(f->pd, IBV_MW_TYPE_1);
	if (!mw)
		return errno ? -errno : -ENOMEM;
	w->ops = &fab_rdma_ops;
	w->priv = mw;
	w->key = mw->rkey;
	return 0;
}

static void nat_win_free(struct fab_win *w)
{
	if (w && w->priv) {
		if (ibv_dealloc_mw(w->priv))
			log_warn("fabric: freeing a memory window failed: %s", strerror(errno));
		w->priv = NULL;
		w->ops = NULL;
	}
}

static void nat_mr_dereg(struct fab_mr *mr)
{
	if (mr && mr->priv) {
		if (ibv_dereg_mr(mr->priv))
			log_warn("fabric: deregistering %zu bytes failed: %s", mr->len,
				 strerror(errno));
		mr->priv = NULL;
		mr->ops = NULL;
	}
}

/* ---- listening --------------------------------------------------------------------- */

static int nat_listen(struct fab *f, struct fab_lst **out)
{
	struct fab_lst *l;

	if (!f->server || !f->lid || f->listening)
		return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	if (rdma_listen(f->lid, 128)) {
		int rc = -errno;

		log_err("fabric: rdma_listen: %s", strerror(-rc));
		free(l);
		return rc;
	}
	l->ops = &fab_rdma_ops;
	l->fab = f;
	l->ch = f->lch;
	l->id = f->lid;
	l->port = ntohs(rdma_get_src_port(l->id));
	f->listening = true;
	*out = l;
	return 0;
}

static void nat_lst_close(struct fab_lst *l)
{
	if (!l)
		return;
	rdma_destroy_id(l->id);
	rdma_destroy_event_channel(l->ch);
	l->fab->lid = NULL;
	l->fab->lch = NULL;
	l->fab->listening = false;
	free(l);
}

static int nat_lst_fd(const struct fab_lst *l)
{
	return l->ch->fd;
}

static int nat_lst_port(const struct fab_lst *l)
{
	return l->port;
}

static int nat_lst_process(struct fab_lst *l,
			    void (*cb)(void *priv, struct fab_connreq *req, const void *data,
				       size_t len),
			    void *priv)
{
	struct rdma_cm_event *ev;
	uint8_t data[UINT8_MAX + 1]; /* private_data_len is a byte */

	while (rdma_get_cm_event(l->ch, &ev) == 0) {
		enum rdma_cm_event_type type = ev->event;
		struct fab_connreq req = { .ops = &fab_rdma_ops, .id = ev->id };
		size_t len = 0;

		if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			char peer[64];

			len = ev->param.conn.private_data_len;
			if (len && ev->param.conn.private_data)
				memcpy(data, ev->param.conn.private_data, len);
			sockaddr_str(rdma_get_peer_addr(ev->id), peer, sizeof(peer));
			log_dbg("listener: a connection request from %s (%zu bytes)", peer, len);
		} else {
			log_dbg("listener: %s (status %d)", rdma_event_str(type), ev->status);
			if (type == RDMA_CM_EVENT_DEVICE_REMOVAL)
				log_err("listener: the RDMA device went away");
		}
		/* Acknowledged first: the connection moves the id to its own channel. */
		rdma_ack_cm_event(ev);
		if (type != RDMA_CM_EVENT_CONNECT_REQUEST)
			continue;
		if (req.id->verbs != l->fab->verbs) {
			log_warn_rl("listener: a connection request through another RDMA device "
				    "(%s): refused", req.id->verbs ?
				    ibv_get_device_name(req.id->verbs->device) : "?");
			rdma_reject(req.id, NULL, 0);
			rdma_destroy_id(req.id);
			continue;
		}
		cb(priv, &req, data, len);
		if (req.accepted)
			continue;
		if (!req.answered)
			rdma_reject(req.id, NULL, 0);
		rdma_destroy_id(req.id);
	}
	if (errno == EAGAIN || errno == EINTR)
		return 0;
	log_err("listener: rdma_get_cm_event: %s", strerror(errno));
	return -errno;
}

static void nat_lst_limit(struct fab_lst *l, const struct fab_lst_limits *lim)
{
	(void)l;
	(void)lim;
}

static void nat_lst_sweep(struct fab_lst *l)
{
	(void)l;
}

static uint64_t nat_lst_closed(const struct fab_lst *l)
{
	(void)l;
	return 0;
}

static int nat_reject_req(struct fab_lst *l, struct fab_connreq *req, const void *data,
			   size_t len)
{
	req->answered = true;
	if (len > pdata_max(l->fab, 2))
		len = pdata_max(l->fab, 2);
	return rdma_reject(req->id, data, (uint8_t)len) ? -errno : 0;
}

static void nat_connreq_peer(const struct fab_connreq *req, char *buf, size_t len)
{
	sockaddr_str(rdma_get_peer_addr(req->id), buf, len);
}

/* ---- poll groups ------------------------------------------------------------------- */

void fab_rdma_srq(unsigned depth)
{
	atomic_store(&rdma_srq_depth, depth);
}

void fab_rdma_groups(unsigned n)
{
	pthread_mutex_lock(&rgrp.lock);
	rgrp.want = MIN(n, RDMA_GROUPS_MAX);
	pthread_mutex_unlock(&rgrp.lock);
}

unsigned fab_rdma_groups_running(void)
{
	unsigned n;

	pthread_mutex_lock(&rgrp.lock);
	n = rgrp.users ? rgrp.n : 0;
	pthread_mutex_unlock(&rgrp.lock);
	return n;
}

int fab_rdma_con_group(const struct fab_con *c)
{
	return c && fab_ops_of(c) == &fab_rdma_ops && c->g ? (int)c->g->idx : -EINVAL;
}

/* The eventfd read, then the flag cleared: a wake after this writes it again. */
static void group_woken(struct rdma_group *g)
{
	uint64_t v;

	if (read(g->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn_rl("rdma group %u: eventfd read: %s", g->idx, strerror(errno));
	atomic_store(&g->woken, false);
}

static void group_wake(struct rdma_group *g)
{
	uint64_t one = 1;

	if (atomic_exchange(&g->woken, true))
		return;
	if (write(g->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn_rl("rdma group %u: eventfd write: %s", g->idx, strerror(errno));
}

/* Hands work to c's group; wakes it unless this is a group thread (it looks before sleeping). */
static void queue_work(struct fab_con *c, unsigned bits)
{
	struct rdma_group *g = c->g;

	if (atomic_fetch_or(&c->work, bits))
		return; /* already on the list */
	pthread_mutex_lock(&g->lock);
	c->work_next = g->work;
	g->work = c;
	pthread_mutex_unlock(&g->lock);
	if (tls_group != g)
		group_wake(g);
}

static size_t qpmap_slot(const struct rdma_qpmap *m, uint32_t qpn)
{
	return (size_t)(qpn * 2654435761u) & (m->cap - 1);
}

/* The connection of QP number qpn, or NULL; under g->lock. */
static struct fab_con *qpmap_find(const struct rdma_qpmap *m, uint32_t qpn)
{
	if (!m->cap)
		return NULL;
	for (size_t i = qpmap_slot(m, qpn);; i = (i + 1) & (m->cap - 1)) {
		if (m->key[i] == qpn)
			return m->val[i];
		if (!m->key[i])
			return NULL;
	}
}

/* Under g->lock; -EEXIST while qpn still means another connection. */
static int qpmap_add(struct rdma_qpmap *m, uint32_t qpn, struct fab_con *c)
{
	if (qpmap_find(m, qpn))
		return -EEXIST;
	if ((m->used + 1) * 2 > m->cap) {
		/* Twice as large, or as large again when removed slots fill it. */
		struct rdma_qpmap n = { .cap = !m->cap ? 64 : m->live * 4 < m->cap ? m->cap :
					       m->cap * 2 };

		n.key = calloc(n.cap, sizeof(*n.key));
		n.val = calloc(n.cap, sizeof(*n.val));
		if (!n.key || !n.val) {
			free(n.key);
			free(n.val);
			return -ENOMEM;
		}
		for (size_t i = 0; i < m->cap; i++) {
			if (!m->key[i] || m->key[i] == RDMA_QPMAP_GONE)
				continue;
			size_t j = qpmap_slot(&n, m->key[i]);

			while (n.key[j])
				j = (j + 1) & (n.cap - 1);
			n.key[j] = m->key[i];
			n.val[j] = m->val[i];
			n.used++;
			n.live++;
		}
		free(m->key);
		free(m->val);
		*m = n;
	}
	size_t i = qpmap_slot(m, qpn);

	while (m->key[i] && m->key[i] != RDMA_QPMAP_GONE)
		i = (i + 1) & (m->cap - 1);
	if (!m->key[i])
		m->used++;
	m->live++;
	m->key[i] = qpn;
	m->val[i] = c;
	return 0;
}

static void qpmap_del(struct rdma_qpmap *m, uint32_t qpn)
{
	if (!m->cap)
		return;
	for (size_t i = qpmap_slot(m, qpn); m->key[i]; i = (i + 1) & (m->cap - 1)) {
		if (m->key[i] == qpn) {
			m->key[i] = RDMA_QPMAP_GONE;
			m->val[i] = NULL;
			m->live--;
			return;
		}
	}
}

/* Whether wr_id is a receive buffer of q. */
static bool srq_owns(const struct rdma_gsrq *q, uint64_t wr_id)
{
	const char *p = (const char *)(uintptr_t)wr_id;

	return q && p >= q->buf && p < q->buf + (size_t)q->count * RDMA_SRQ_RX;
}

/* Posts n receive buffers of q from the one at p on, in chains. */
static int srq_post(struct rdma_gsrq *q, char *p, unsigned n)
{
	struct ibv_sge sge[RDMA_CQ_BATCH];
	struct ibv_recv_wr wr[RDMA_CQ_BATCH], *bad;

	while (n) {
		unsigned k = MIN(n, RDMA_CQ_BATCH);

		for (unsigned i = 0; i < k; i++, p += RDMA_SRQ_RX) {
			sge[i] = (struct ibv_sge){ .addr = (uintptr_t)p, .length = RDMA_SRQ_RX,
						   .lkey = q->mr->lkey };
			wr[i] = (struct ibv_recv_wr){ .wr_id = sge[i].addr, .sg_list = &sge[i],
						      .num_sge = 1,
						      .next = i + 1 < k ? &wr[i + 1] : NULL };
		}
		int rc = ibv_post_srq_recv(q->srq, wr, &bad);

		if (rc)
			return verbs_err(rc, errno);
		n -= k;
	}
	return 0;
}

/* A shared receive goes back to its queue, whatever became of its completion. */
static void srq_repost(struct rdma_gsrq *q, uint64_t wr_id)
{
	int rc = srq_post(q, (char *)(uintptr_t)wr_id, 1);

	if (rc)
		log_err_rl("rdma group %u: reposting a shared receive failed: %s", q->g->idx,
			   strerror(-rc));
}

static void gsrq_free(struct rdma_gsrq *q)
{
	if (q->srq && ibv_destroy_srq(q->srq))
		log_warn("rdma group %u: destroying a shared receive queue: %s", q->g->idx,
			 strerror(errno));
	if (q->mr)
		ibv_dereg_mr(q->mr);
	free(q->buf);
	free(q);
}

/*
 * The group's shared receive queue on f's device and PD, made with count
 * receives, every one posted, if it has none; one more user. g->lock held.
 */
static int gsrq_get(struct rdma_group *g, struct fab *f, unsigned count, struct rdma_gsrq **out)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = count, .max_sge = 1 } };
	struct rdma_gsrq *q;
	int rc;

	for (q = g->srqs; q; q = q->next) {
		if (q->verbs == f->verbs && q->pd == f->pd) {
			q->users++;
			*out = q;
			return 0;
		}
	}
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->g = g;
	q->verbs = f->verbs;
	q->pd = f->pd;
	q->buf = calloc(count, RDMA_SRQ_RX);
	if (q->buf)
		q->mr = ibv_reg_mr(f->pd, q->buf, (size_t)count * RDMA_SRQ_RX,
				   IBV_ACCESS_LOCAL_WRITE);
	errno = 0;
	q->srq = q->mr ? ibv_create_srq(f->pd, &sa) : NULL;
	if (!q->srq) {
		rc = errno ? -errno : -ENOMEM;
		log_err_rl("rdma group %u: a shared receive queue of %u receives on %s: %s",
			   g->idx, count, ibv_get_device_name(f->verbs->device), strerror(-rc));
		gsrq_free(q);
		return rc;
	}
	q->count = count;
	rc = srq_post(q, q->buf, count);
	if (rc) {
		log_err_rl("rdma group %u: posting the shared receive queue: %s", g->idx,
			   strerror(-rc));
		gsrq_free(q);
		return rc;
	}
	log_dbg("rdma group %u: a shared receive queue of %u receives on %s", g->idx, count,
		ibv_get_device_name(f->verbs->device));
	q->users = 1;
	q->next = g->srqs;
	g->srqs = q;
	*out = q;
	return 0;
}

/* One user fewer of q; the last one destroys it (its QP is gone). g->lock held. */
static void gsrq_put(struct rdma_group *g, struct rdma_gsrq *q)
{
	if (--q->users)
		return;
	for (struct rdma_gsrq **pp = &g->srqs; *pp; pp = &(*pp)->next) {
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	}
	log_dbg("rdma group %u: the shared receive queue on %s goes", g->idx,
		ibv_get_device_name(q->verbs->device));
	gsrq_free(q);
}

/* What c reserved on its CQ given back, its hold on the SRQ too; g->lock held. */
static void gcq_unreserve(struct fab_con *c)
{
	struct rdma_gcq *q = c->gcq;

	if (!q)
		return;
	q->used -= c->cq_reserved;
	c->cq_reserved = 0;
	if (c->srq) {
		if (!--q->srq_users) {
			q->used -= q->srq->count;
			q->srq = NULL;
		}
		gsrq_put(c->g, c->srq);
		c->srq = NULL;
	}
}

/* Whether q can take n more entries and, with sq, its users (only those with own_srq). */
static bool gcq_fits(const struct rdma_gcq *q, const struct fab *f, unsigned n,
		     const struct rdma_gsrq *sq, bool own_srq)
{
	if (q->verbs != f->verbs)
		return false;
	if (!sq)
		return q->size - q->used >= n;
	if (q->srq == sq)
		return q->size - q->used >= n;
	return !own_srq && !q->srq && q->size - q->used >= n + sq->count;
}

/*
 * A CQ of c's group on c's device with room for n more entries: one it
 * has, or a new one. With sq (a hold on the group's shared receive queue,
 * gsrq_get), c takes its receives from there, and the CQ has room for all
 * of them too (counted once per CQ); the hold becomes c's, unless this
 * fails. The reservation is c's until it leaves the group.
 */
static int gcq_reserve(struct fab_con *c, unsigned n, struct rdma_gsrq *sq)
{
	unsigned srq = sq ? sq->count : 0;
	struct rdma_group *g = c->g;
	struct fab *f = c->fab;
	struct rdma_gcq *q;
	int rc;

	if (n + srq > f->max_cqe) {
		log_err("%s: %u completion queue entries needed, the device has at most %u",
			con_name(c), n + srq, f->max_cqe);
		return -EINVAL;
	}
	pthread_mutex_lock(&g->lock);
	/*
	 * With an SRQ, a CQ that has room reserved for it already comes
	 * first: each other CQ that takes its users reserves that room again.
	 */
	q = NULL;
	for (int pass = sq ? 0 : 1; pass < 2 && !q; pass++)
		for (q = atomic_load(&g->cqs); q; q = q->next)
			if (gcq_fits(q, f, n, sq, pass == 0))
				break;
	if (q) {
		unsigned need = n + (sq && q->srq != sq ? srq : 0);

		q->used += need;
		if (sq) {
			q->srq = sq;
			q->srq_users++;
			c->srq = sq;
		}
		pthread_mutex_unlock(&g->lock);
		c->gcq = q;
		c->cq_reserved = n;
		return 0;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		pthread_mutex_unlock(&g->lock);
		return -ENOMEM;
	}
	q->g = g;
	q->verbs = f->verbs;
	/* A server's are larger: its IO connections' SRQ takes room on each that they use. */
	q->size = MIN(MAX(n + srq, f->server ? 2 * RDMA_GCQ_ENTRIES : RDMA_GCQ_ENTRIES), f->max_cqe);
	q->cc = ibv_create_comp_channel(f->verbs);
	rc = q->cc ? set_nonblock(q->cc->fd) : (errno ? -errno : -ENOMEM);
	if (!rc) {
		q->cq = ibv_create_cq(f->verbs, (int)q->size, q, q->cc, 0);
		if (!q->cq) {
			rc = errno ? -errno : -ENOMEM;
			log_err("rdma group %u: ibv_create_cq (%u entries): %s", g->idx, q->size,
				strerror(-rc));
		}
	}
	if (!rc) {
		struct epoll_event ev = { .events = EPOLLIN, .data.ptr = q };

		if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, q->cc->fd, &ev))
			rc = -errno;
	}
	if (rc) {
		if (q->cq)
			ibv_destroy_cq(q->cq);
		if (q->cc)
			ibv_destroy_comp_channel(q->cc);
		free(q);
		pthread_mutex_unlock(&g->lock);
		return rc;
	}
	q->used = n + srq;
	if (sq) {
		q->srq = sq;
		q->srq_users = 1;
		c->srq = sq;
	}
	q->next = atomic_load(&g->cqs);
	atomic_store(&g->cqs, q); /* published whole: the thread walks the list unlocked */
	pthread_mutex_unlock(&g->lock);
	log_dbg("rdma group %u: a completion queue of %u entries on %s", g->idx, q->size,
		ibv_get_device_name(f->verbs->device));
	c->gcq = q;
	c->cq_reserved = n;
	group_wake(g); /* to arm it */
	return 0;
}

/* The QP number of c means c to its group from now on (waits while it means a connection leaving). */
static int con_map(struct fab_con *c)
{
	struct rdma_group *g = c->g;
	uint64_t end = now_ms() + RDMA_INSERT_WAIT_MS;
	int rc;

	for (;;) {
		pthread_mutex_lock(&g->lock);
		rc = qpmap_add(&c->gcq->map, c->qpn, c);
		pthread_mutex_unlock(&g->lock);
		/* On the group's thread the last owner is gone: it left here (group_release). */
		if (rc != -EEXIST || now_ms() >= end || tls_group == g)
			break;
		usleep(1000);
	}
	if (rc)
		log_err("%s: QP %u into its group's table: %s", con_name(c), c->qpn,
			strerror(-rc));
	else
		c->in_map = true;
	return rc;
}

/* ---- connections --------------------------------------------------------------------- */

static void con_down(struct fab_con *c, int err, const void *data, size_t len)
{
	/* After our own shutdown the owner already knows; say nothing. */
	if (atomic_exchange(&c->down, true) || atomic_load(&c->shutdown) ||
	    atomic_load(&c->destroying))
		return;
	c->cfg.ops->down(c->cfg.priv, err, data, len);
}

static int rx_post(struct fab_con *c, size_t i)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)(c->rx.buf + i * c->rx.size),
		.length = (uint32_t)c->rx.size,
		.lkey = c->rx.mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = sge.addr, .sg_list = &sge, .num_sge = 1 }, *bad;

	int rc = ibv_post_recv(c->qp, &wr, &bad);

	return rc ? verbs_err(rc, errno) : 0;
}

static bool is_rx_buf(const struct fab_con *c, uint64_t wr_id)
{
	const char *p = (const char *)(uintptr_t)wr_id;
	/* count is published last (release): buf and size are valid once seen. */
	size_t count = __atomic_load_n(&c->rx.count, __ATOMIC_ACQUIRE);

	return count && p >= c->rx.buf && p < c->rx.buf + count * c->rx.size;
}

static void rx_repost(struct fab_con *c, uint64_t wr_id)
{
	size_t i;
	int rc;

	if (c->srq) {
		srq_repost(c->srq, wr_id);
		return;
	}
	i = (size_t)((char *)(uintptr_t)wr_id - c->rx.buf) / c->rx.size;
	rc = rx_post(c, i);

	if (rc && !atomic_load(&c->down)) {
		log_err("%s: reposting a receive failed: %s", con_name(c), strerror(-rc));
		con_down(c, rc, NULL, 0);
	}
}

static int wc_errno(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_WR_FLUSH_ERR: return -ECONNRESET;
	case IBV_WC_REM_ACCESS_ERR: return -EACCES;
	case IBV_WC_RETRY_EXC_ERR: case IBV_WC_RNR_RETRY_EXC_ERR: return -ETIMEDOUT;
	case IBV_WC_LOC_LEN_ERR: case IBV_WC_REM_INV_REQ_ERR: return -EMSGSIZE;
	case IBV_WC_LOC_PROT_ERR: return -EFAULT;
	default: return -EIO;
	}
}

/* Under tx_lock: the deferred registrations whose sends have all completed, taken off c. */
static struct rdma_defer *defer_due(struct fab_con *c)
{
	struct rdma_defer *due = c->defer, **tail = &c->defer;

	while (*tail && (*tail)->seq <= c->tx_done)
		tail = &(*tail)->next;
	if (tail == &c->defer)
		return NULL;
	c->defer = *tail;
	*tail = NULL;
	if (!c->defer)
		c->defer_tail = &c->defer;
	return due;
}

/* Deregisters a list of deferred registrations (not under tx_lock: system calls). */
static void defer_free(struct rdma_defer *d)
{
	while (d) {
		struct rdma_defer *next = d->next;

		if (ibv_dereg_mr(d->mr))
			log_warn("fabric: deregistering %zu bytes failed: %s", d->len,
				 strerror(errno));
		free(d);
		d = next;
	}
}

/*
 * fab_mr_dereg_after: mr goes once tx_done reaches the work requests
 * posted on c so far (an RC send queue completes in order), or with c
 * (con_free, after its QP). Without memory for the record, at once.
 */
static void nat_mr_dereg_after(struct fab_con *c, struct fab_mr *mr)
{
	struct rdma_defer *d = mr->priv ? malloc(sizeof(*d)) : NULL, *due;

	if (!d) {
		if (mr->priv)
			log_warn_rl("%s: no memory to defer a deregistration: deregistered at once",
				    con_name(c));
		nat_mr_dereg(mr);
		return;
	}
	*d = (struct rdma_defer){ .mr = mr->priv, .len = mr->len };
	pthread_mutex_lock(&c->tx_lock);
	d->seq = c->tx_seq;
	*c->defer_tail = d;
	c->defer_tail = &d->next;
	due = defer_due(c);
	pthread_mutex_unlock(&c->tx_lock);
	defer_free(due);
	mr->priv = NULL;
	mr->ops = NULL;
}

/*
 * A signalled send completed: the room of the requests it covers comes
 * back, and the registrations deferred until they completed go.
 */
static void tx_complete(struct fab_con *c)
{
	struct rdma_defer *due = NULL;
	unsigned covers = 0;

	pthread_mutex_lock(&c->tx_lock);
	if (c->tx_count) {
		covers = c->tx_fifo[c->tx_head];
		c->tx_head = (c->tx_head + 1) % c->tx_max;
		c->tx_count--;
		c->tx_done += covers;
		if (c->defer)
			due = defer_due(c);
	}
	pthread_mutex_unlock(&c->tx_lock);
	defer_free(due);
	if (!covers) {
		log_err_rl("%s: a send completion that no signalled request accounts for", con_name(c));
		return;
	}
	atomic_fetch_sub_explicit(&c->tx_posted, covers, memory_order_relaxed);
}

/* Nothing of the connection reaches its owner any more (fab_con_shutdown, down, destroy). */
static bool con_quiet(const struct fab_con *c)
{
	return atomic_load(&c->destroying) || atomic_load(&c->down) || atomic_load(&c->shutdown);
}

/*
 * Completions with an error come for unsignalled requests too; they only
 * come once the connection failed, when the send queue's room no longer
 * matters. Nothing of a connection shut down, down or being destroyed
 * reaches its owner, successful completions included: the rest of a
 * batch polled before a callback found the peer breaking the protocol
 * (and shut the connection down) is not delivered.
 */
static void handle_wc(struct fab_con *c, const struct ibv_wc *wc)
{
	bool recv = wc->opcode & IBV_WC_RECV;
	/* Told by its buffer: a failed completion's opcode means nothing. */
	bool srq_rx = srq_owns(c->srq, wc->wr_id);

	if (wc->wr_id == (uintptr_t)&c->drained) {
		c->drained = true; /* srq_qp_drain's marker */
		return;
	}

	if (wc->status == IBV_WC_SUCCESS && con_quiet(c)) {
		if (srq_rx)
			srq_repost(c->srq, wc->wr_id);
		else if (!recv)
			tx_complete(c);
		return;
	}
	if (atomic_load(&c->destroying) || wc->status != IBV_WC_SUCCESS) {
		/* A shared receive serves the other connections whatever became of this one. */
		if (srq_rx)
			srq_repost(c->srq, wc->wr_id);
		if (atomic_load(&c->destroying))
			return;
		if (atomic_load(&c->down) || atomic_load(&c->shutdown))
			return; /* flushes after the connection went away */
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			log_err_rl("%s: completion error: %s (vendor error 0x%x)", con_name(c),
				   ibv_wc_status_str(wc->status), wc->vendor_err);
		con_down(c, wc_errno(wc->status), NULL, 0);
		return;
	}
	if (!recv) {
		tx_complete(c);
		if (wc->wr_id)
			c->cfg.ops->done(c->cfg.priv, (void *)(uintptr_t)wc->wr_id);
		return;
	}
	if (!srq_rx && !is_rx_buf(c, wc->wr_id)) {
		log_err_rl("%s: receive completion with an unknown buffer", con_name(c));
		return;
	}
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		rx_repost(c, wc->wr_id);
		c->cfg.ops->imm(c->cfg.priv, ntohl(wc->imm_data));
		return;
	}
	if (c->fab->iwarp && wc->byte_len == RDMA_IMM_MSG_LEN) {
		/* An immediate carried as a message (RTRS messages are longer). */
		struct le32 imm;

		memcpy(&imm, (void *)(uintptr_t)wc->wr_id, sizeof(imm));
		rx_repost(c, wc->wr_id);
		c->cfg.ops->imm(c->cfg.priv, le32_get(imm));
		return;
	}
	c->cfg.ops->recv(c->cfg.priv, (void *)(uintptr_t)wc->wr_id, wc->byte_len);
	rx_repost(c, wc->wr_id);
	/*
	 * A message with an immediate (the kernel's always_invalidate sends its
	 * new key so, with the response): the message first, then the
	 * immediate, so that the key is known when the request completes.
	 */
	if (wc->wc_flags & IBV_WC_WITH_IMM)
		c->cfg.ops->imm(c->cfg.priv, ntohl(wc->imm_data));
}

/* A CM event of one of the group's connections. */
static void handle_cm(struct fab_con *c, enum rdma_cm_event_type type, int status,
		      const uint8_t *data, size_t len)
{
	int rc;

	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (rdma_resolve_route(c->id, RDMA_RESOLVE_MS)) {
			rc = -errno;
			log_err("%s: resolving the route: %s", con_name(c), strerror(-rc));
			con_down(c, rc, NULL, 0);
		}
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		rc = con_connect_routed(c);
		if (rc)
			con_down(c, rc, NULL, 0);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
		rc = status < 0 ? status : type == RDMA_CM_EVENT_ADDR_ERROR ? -EHOSTUNREACH :
		     -ENETUNREACH;
		log_err("%s: resolving the %s: %s", con_name(c),
			type == RDMA_CM_EVENT_ADDR_ERROR ? "address" : "route", strerror(-rc));
		con_down(c, rc, NULL, 0);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->srq) {
			/*
			 * In RTS (rdma_accept moved it), where the RNR timer may
			 * change; until now a sender that found the shared queue
			 * empty was told to wait 655 ms (the CM's 0).
			 */
			struct ibv_qp_attr qa = { .min_rnr_timer = RDMA_SRQ_RNR_TIMER };

			if (ibv_modify_qp(c->qp, &qa, IBV_QP_MIN_RNR_TIMER))
				log_warn_rl("%s: setting the RNR timer: %s", con_name(c),
					    strerror(errno));
		}
		c->cfg.ops->connected(c->cfg.priv, data, len);
		break;
	case RDMA_CM_EVENT_REJECTED:
		/*
		 * A consumer's reject carries its data; the CM's own (no
		 * listener on the port, a timeout) carries padding.
		 */
		if (!c->fab->iwarp && status != RDMA_IB_REJ_CONSUMER)
			len = 0;
		log_dbg("%s: rejected (status %d, %zu bytes)", con_name(c), status, len);
		if (!len) {
			char local[64];

			/* No server's answer: the CM's own (on iWARP, an MPA reject or a close). */
			sockaddr_str(rdma_get_local_addr(c->id), local, sizeof(local));
			if (c->fab->iwarp && status < 0)
				log_warn_rl("%s: refused by the peer's connection manager, not "
					    "by a server (%s, from %s)", con_name(c),
					    strerror(-status), local);
			else if (!c->fab->iwarp && status == RDMA_IB_REJ_NO_LISTENER)
				log_warn_rl("%s: refused from %s: nothing listens at the "
					    "destination", con_name(c), local);
			else
				log_warn_rl("%s: refused by the peer's connection manager, not "
					    "by a server (reject reason %d, from %s)", con_name(c),
					    status, local);
		}
		con_down(c, -ECONNREFUSED, len ? data : NULL, len);
		break;
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		log_dbg("%s: %s (status %d)", con_name(c), rdma_event_str(type), status);
		con_down(c, status == -ECONNREFUSED ? -ECONNREFUSED : -ETIMEDOUT, NULL, 0);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		con_down(c, -ECONNRESET, NULL, 0);
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		con_down(c, -ENODEV, NULL, 0);
		break;
	case RDMA_CM_EVENT_ADDR_CHANGE:
		con_down(c, -ENETRESET, NULL, 0);
		break;
	default:
		log_dbg("%s: ignoring %s", con_name(c), rdma_event_str(type));
	}
}

/*
 * The group's CM events. An event holds its id until acknowledged, so
 * rdma_destroy_id (by a destroyer, after the connection left the group)
 * cannot return while the event is read: the connection is looked at
 * first, and one being destroyed is passed over.
 */
static void group_cm(struct rdma_group *g)
{
	struct rdma_cm_event *ev;
	uint8_t data[UINT8_MAX + 1]; /* private_data_len is a byte */

	while (rdma_get_cm_event(g->ch, &ev) == 0) {
		struct fab_con *c = ev->id ? ev->id->context : NULL;
		enum rdma_cm_event_type type = ev->event;
		int status = ev->status;
		size_t len = ev->param.conn.private_data_len;
		/* After a shutdown nothing more: no connect once routed, no connected(). */
		bool skip = !c || con_quiet(c);

		if (len && ev->param.conn.private_data)
			memcpy(data, ev->param.conn.private_data, len);
		else
			len = 0;
		/* Before the ack: a connection being destroyed may be freed once it is acked. */
		log_dbg("%s: %s (status %d)%s", c ? con_name(c) : "rdma group", rdma_event_str(type),
			status, skip ? ", ignored" : "");
		rdma_ack_cm_event(ev);
		if (!skip)
			handle_cm(c, type, status, data, len);
	}
}

/* Takes a CQ's completion events; it is to be armed again. */
static void gcq_events(struct rdma_gcq *q)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(q->cc, &cq, &ctx) == 0) {
		if (++q->unacked >= RDMA_CQ_ACK_BATCH) {
			ibv_ack_cq_events(q->cq, q->unacked);
			q->unacked = 0;
		}
	}
	q->armed = false;
}

/*
 * Reads up to a batch of q's completions and runs them; how many, or -EIO.
 * A completion whose QP means no connection is what a connection that left
 * the group left behind.
 */
static int gcq_poll(struct rdma_group *g, struct rdma_gcq *q, struct ibv_wc *wcs,
		    struct fab_con **cons)
{
	int n = ibv_poll_cq(q->cq, RDMA_CQ_BATCH, wcs);

	if (n <= 0)
		return n < 0 ? -EIO : 0;
	pthread_mutex_lock(&g->lock);
	for (int i = 0; i < n; i++) {
		cons[i] = qpmap_find(&q->map, wcs[i].qp_num);
		/* A shared receive that a connection gone left behind goes back. */
		if (!cons[i] && srq_owns(q->srq, wcs[i].wr_id))
			srq_repost(q->srq, wcs[i].wr_id);
	}
	pthread_mutex_unlock(&g->lock);
	for (int i = 0; i < n; i++)
		if (cons[i])
			handle_wc(cons[i], &wcs[i]);
	return n;
}

static void con_free(struct fab_con *c);

/*
 * Before an SRQ user's QP goes (group thread): some providers (mlx5, mlx4)
 * take a destroyed QP's completions off the CQ, and with them the shared
 * receives it had taken, which would be gone from the queue for good (a
 * few per teardown under load, until the queue ran dry for every
 * connection of the group). The QP goes to the error state, where it takes
 * no more of them, a marker send follows, and the CQ is read until the
 * marker's flush comes (at most RDMA_DRAIN_MS): a device writes the
 * completions of one QP in order, so what it completed before is read by
 * then and its receives go back (handle_wc, c being destroyed). The
 * kernel's ib_drain_qp is the same idea. Without room for the marker, the
 * CQ is read once as for any QP.
 */
static void srq_qp_drain(struct rdma_group *g, struct fab_con *c, struct ibv_wc *wcs,
			 struct fab_con **cons)
{
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };
	struct ibv_send_wr wr = { .wr_id = (uintptr_t)&c->drained, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	uint64_t until;
	int rc;

	if (ibv_modify_qp(c->qp, &qa, IBV_QP_STATE)) {
		log_warn_rl("%s: moving the QP to the error state before it goes: %s",
			    con_name(c), strerror(errno));
		return;
	}
	pthread_mutex_lock(&c->tx_lock);
	rc = ibv_post_send(c->qp, &wr, &bad);
	pthread_mutex_unlock(&c->tx_lock);
	if (rc)
		return;
	until = now_ms() + RDMA_DRAIN_MS;
	while (!c->drained && now_ms() < until)
		if (gcq_poll(g, c->gcq, wcs, cons) <= 0)
			sched_yield();
	if (!c->drained)
		log_warn_rl("%s: the QP's flush did not come within %u ms: shared receives it "
			    "took may be lost", con_name(c), RDMA_DRAIN_MS);
}

/*
 * c leaves its group, on the group's thread: its QP goes, the CQ is read
 * until it is empty (what the QP left there is dropped, c being
 * destroyed), its QP number and CQ room are given back. Then the destroyer
 * waiting is told, or, with none waiting, c is freed here.
 */
static void group_release(struct rdma_group *g, struct fab_con *c, struct ibv_wc *wcs,
			  struct fab_con **cons)
{
	if (c->in_retry) {
		for (struct fab_con **p = &g->retry; *p; p = &(*p)->retry_next) {
			if (*p == c) {
				*p = c->retry_next;
				break;
			}
		}
		c->in_retry = false;
	}
	pthread_mutex_lock(&g->lock);
	if (c->connecting) {
		/*
		 * Its rdma_connect runs, or waits for a connect thread
		 * (con_connect_run): destroying its id or QP now could wait in
		 * the kernel for the connect. That thread finishes the release
		 * once the connect returned (or skips it); the destroyer does not
		 * wait for that, nor free c.
		 */
		struct con_dw *dw = c->dw;

		c->orphaned = true;
		c->dw = NULL;
		if (dw)
			dw->keep = true;
		pthread_mutex_unlock(&g->lock);
		cpool_cancel(c); /* one still queued gives up its place, and goes soon */
		if (dw)
			fab_done_signal(&dw->done);
		return;
	}
	pthread_mutex_unlock(&g->lock);
	if (c->qp_made && !c->qp_gone) {
		if (c->srq)
			srq_qp_drain(g, c, wcs, cons);
		if (c->fab->iwarp && c->own_id) {
			/*
			 * iWARP: the CM id first. siw's destroy_qp waits, asleep
			 * in the kernel and deaf to signals, until every
			 * reference to the QP is gone, and the iWARP CM holds
			 * one until it has processed the connection's close or
			 * its id is destroyed: destroying the QP first makes this
			 * thread, and every connection of the group, wait on the
			 * CM (seen once under load: a test held until its guest's
			 * timeout). Destroying the id drops the CM's reference at
			 * once. Here, on the group's thread, no CM event of c is
			 * being handled.
			 */
			rdma_destroy_id(c->id);
			c->id = NULL;
			ibv_destroy_qp(c->qp);
		} else {
			rdma_destroy_qp(c->id);
		}
		c->qp_gone = true;
		/* Every entry it can hold, and as many again that others add meanwhile. */
		for (unsigned i = 0; i < 2 * c->gcq->size / RDMA_CQ_BATCH + 2; i++) {
			int n = gcq_poll(g, c->gcq, wcs, cons);

			if (n < 0)
				log_err_rl("%s: reading the completion queue after its QP went: %s",
					   con_name(c), strerror(-n));
			if (n < RDMA_CQ_BATCH)
				break;
		}
	}
	pthread_mutex_lock(&g->lock);
	if (c->in_map)
		qpmap_del(&c->gcq->map, c->qpn);
	c->in_map = false;
	gcq_unreserve(c);
	struct con_dw *dw = c->dw;
	pthread_mutex_unlock(&g->lock);
	if (dw) {
		fab_done_signal(&dw->done);
	} else {
		con_free(c);
	}
}

/* The work handed to the group; whether there was any. */
static bool group_drain_work(struct rdma_group *g, struct ibv_wc *wcs, struct fab_con **cons)
{
	struct fab_con *list;

	pthread_mutex_lock(&g->lock);
	list = g->work;
	g->work = NULL;
	pthread_mutex_unlock(&g->lock);
	if (!list)
		return false;
	while (list) {
		struct fab_con *c = list;
		unsigned bits;

		list = c->work_next;
		bits = atomic_exchange(&c->work, 0);
		if (bits & W_DESTROY) {
			group_release(g, c, wcs, cons);
			continue;
		}
		if (atomic_load(&c->destroying))
			continue; /* its W_DESTROY is on its way */
		if (bits & W_CONNECTED)
			con_connected_rc(c);
		if ((bits & W_RETRY) && !c->in_retry) {
			if (!g->retry)
				g->retry_since = now_ms();
			c->retry_next = g->retry;
			g->retry = c;
			c->in_retry = true;
		}
		if ((bits & W_KICK) && !con_quiet(c))
			c->cfg.ops->kick(c->cfg.priv);
	}
	return true;
}

/* Kicks the connections waiting to retry. */
static void group_run_retry(struct rdma_group *g)
{
	struct fab_con *list = g->retry;

	g->retry = NULL;
	while (list) {
		struct fab_con *c = list;

		list = c->retry_next;
		c->in_retry = false;
		if (!con_quiet(c))
			c->cfg.ops->kick(c->cfg.priv);
	}
}

static uint64_t mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Every CQ of the group read once; completions run. */
static int group_poll(struct rdma_group *g, struct ibv_wc *wcs, struct fab_con **cons)
{
	int total = 0;

	for (struct rdma_gcq *q = atomic_load(&g->cqs); q; q = q->next) {
		int n = gcq_poll(g, q, wcs, cons);

		if (n < 0) {
			log_err_rl("rdma group %u: polling a completion queue failed", g->idx);
			continue;
		}
		total += n;
	}
	return total;
}

/*
 * A group's thread: runs the work handed to it, reads its CQs until they
 * are empty, arms them, reads once more (what came between the last read
 * and the arming), then sleeps on their completion channels, the CM
 * channel and the eventfd. Retries after -EAGAIN run on the next
 * completion, else after RDMA_RETRY_MS.
 */
static void *group_thread(void *arg)
{
	struct rdma_group *g = arg;
	struct ibv_wc wcs[RDMA_CQ_BATCH];
	struct fab_con *cons[RDMA_CQ_BATCH];
	char name[16];
	uint64_t cm_last = 0;
	bool cm_due = true;

	tls_group = g;
	snprintf(name, sizeof(name), "rtrs-rdma-g%u", g->idx);
	pthread_setname_np(pthread_self(), name);
	while (!atomic_load(&g->stop)) {
		bool busy = group_drain_work(g, wcs, cons);
		int n = group_poll(g, wcs, cons);

		/*
		 * A busy group still hears of connects and disconnects: one that
		 * never sleeps (completions, or busy polling that finds them)
		 * reads its CM channel at least every RDMA_CM_POLL_NS.
		 */
		uint64_t now = mono_ns();

		if (cm_due || now - cm_last >= RDMA_CM_POLL_NS) {
			cm_due = false;
			cm_last = now;
			group_cm(g);
		}
		if (g->retry && (n > 0 || now_ms() - g->retry_since >= RDMA_RETRY_MS)) {
			group_run_retry(g);
			busy = true;
		}
		if (n > 0 || busy)
			continue;
		uint64_t poll_ns = atomic_load_explicit(&g->poll_ns, memory_order_relaxed);

		if (poll_ns) {
			/* Busy-poll a while before sleeping: a wake-up costs more than a short spin. */
			uint64_t until = mono_ns() + poll_ns;

			do {
				n = group_poll(g, wcs, cons);
			} while (n == 0 && !atomic_load(&g->woken) && !atomic_load(&g->stop) &&
				 mono_ns() < until);
			if (atomic_load(&g->woken)) {
				group_woken(g);
				cm_due = true; /* the CM channel was not watched meanwhile */
				continue;
			}
			if (n != 0)
				continue;
		}
		bool armed_now = false;

		for (struct rdma_gcq *q = atomic_load(&g->cqs); q; q = q->next) {
			if (q->armed)
				continue;
			if (ibv_req_notify_cq(q->cq, 0))
				log_err_rl("rdma group %u: arming a completion queue failed", g->idx);
			q->armed = true;
			armed_now = true;
		}
		if (armed_now)
			continue;
		pthread_mutex_lock(&g->lock);
		bool work = g->work != NULL;
		pthread_mutex_unlock(&g->lock);
		if (work)
			continue;

		struct epoll_event evs[16];
		int ne = epoll_wait(g->epfd, evs, ARRAY_SIZE(evs), g->retry ? RDMA_RETRY_MS : 10000);

		for (int i = 0; i < ne; i++) {
			void *p = evs[i].data.ptr;

			if (p == (void *)&g->efd) {
				group_woken(g);
			} else if (p == (void *)g) {
				cm_due = true;
			} else {
				gcq_events(p);
			}
		}
	}
	tls_group = NULL;
	return NULL;
}

static void group_fini(struct rdma_group *g)
{
	struct rdma_gcq *q = atomic_load(&g->cqs);

	while (q) {
		struct rdma_gcq *next = q->next;

		if (q->used)
			log_warn("rdma group %u: a completion queue still has %u entries reserved",
				 g->idx, q->used);
		if (q->unacked)
			ibv_ack_cq_events(q->cq, q->unacked);
		if (ibv_destroy_cq(q->cq))
			log_warn("rdma group %u: destroying a completion queue: %s", g->idx,
				 strerror(errno));
		ibv_destroy_comp_channel(q->cc);
		free(q->map.key);
		free(q->map.val);
		free(q);
		q = next;
	}
	while (g->srqs) {
		struct rdma_gsrq *sq = g->srqs;

		log_warn("rdma group %u: a shared receive queue still has %u users", g->idx,
			 sq->users);
		g->srqs = sq->next;
		gsrq_free(sq);
	}
	if (g->ch)
		rdma_destroy_event_channel(g->ch);
	if (g->epfd >= 0)
		close(g->epfd);
	if (g->efd >= 0)
		close(g->efd);
	pthread_mutex_destroy(&g->lock);
}

static int group_init(struct rdma_group *g, unsigned idx)
{
	struct epoll_event ev = { .events = EPOLLIN };
	int rc;

	g->idx = idx;
	g->epfd = g->efd = -1;
	pthread_mutex_init(&g->lock, NULL);
	g->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	g->epfd = epoll_create1(EPOLL_CLOEXEC);
	g->ch = channel_open();
	if (g->efd < 0 || g->epfd < 0 || !g->ch) {
		rc = errno ? -errno : -ENOMEM;
		goto fail;
	}
	ev.data.ptr = &g->efd;
	if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->efd, &ev)) {
		rc = -errno;
		goto fail;
	}
	ev.data.ptr = g;
	if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->ch->fd, &ev)) {
		rc = -errno;
		goto fail;
	}
	rc = -pthread_create(&g->thread, NULL, group_thread, g);
	if (!rc)
		return 0;
fail:
	log_err("rdma: starting poll group %u: %s", idx, strerror(-rc));
	group_fini(g);
	return rc;
}

static void group_stop(struct rdma_group *g)
{
	atomic_store(&g->stop, true);
	atomic_store(&g->woken, false);
	group_wake(g);
	pthread_join(g->thread, NULL);
	group_fini(g);
}

static int groups_get(void)
{
	int rc = 0;

	pthread_mutex_lock(&rgrp.lock);
	if (rgrp.users++) {
		pthread_mutex_unlock(&rgrp.lock);
		return 0;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned n = rgrp.want ? rgrp.want : (unsigned)MAX(cpus, 1);

	rgrp.g = calloc(n, sizeof(*rgrp.g));
	if (!rgrp.g)
		rc = -ENOMEM;
	for (rgrp.n = 0; !rc && rgrp.n < n; rgrp.n++) {
		rc = group_init(&rgrp.g[rgrp.n], rgrp.n);
		if (rc)
			break;
	}
	if (rc) {
		for (unsigned i = 0; i < rgrp.n; i++)
			group_stop(&rgrp.g[i]);
		free(rgrp.g);
		rgrp.g = NULL;
		rgrp.n = 0;
		rgrp.users--;
	} else {
		log_dbg("rdma: %u poll groups", rgrp.n);
	}
	pthread_mutex_unlock(&rgrp.lock);
	return rc;
}

static void groups_put(void)
{
	pthread_mutex_lock(&rgrp.lock);
	if (--rgrp.users) {
		pthread_mutex_unlock(&rgrp.lock);
		return;
	}
	for (unsigned i = 0; i < rgrp.n; i++) {
		if (atomic_load(&rgrp.g[i].nr_cons))
			log_warn("rdma group %u: stopped with %u connections", i,
				 atomic_load(&rgrp.g[i].nr_cons));
		group_stop(&rgrp.g[i]);
	}
	free(rgrp.g);
	rgrp.g = NULL;
	rgrp.n = 0;
	pthread_mutex_unlock(&rgrp.lock);
}

/* The group with the fewest connections; counted on it. */
static struct rdma_group *group_pick(void)
{
	struct rdma_group *best = NULL;

	pthread_mutex_lock(&rgrp.lock);
	for (unsigned i = 0; i < rgrp.n; i++)
		if (!best || atomic_load(&rgrp.g[i].nr_cons) < atomic_load(&best->nr_cons))
			best = &rgrp.g[i];
	if (best)
		atomic_fetch_add(&best->nr_cons, 1);
	pthread_mutex_unlock(&rgrp.lock);
	return best;
}

/* What is left of c once it is out of its group (or was never in one). */
static void con_free(struct fab_con *c)
{
	if (c->qp_made && !c->qp_gone)
		rdma_destroy_qp(c->id);
	if (c->id && c->own_id)
		rdma_destroy_id(c->id);
	/* Its QP is gone: nothing reads the deferred registrations any more. */
	defer_free(c->defer);
	if (c->rx.mr)
		ibv_dereg_mr(c->rx.mr);
	free(c->rx.buf);
	pthread_mutex_destroy(&c->rx_lock);
	pthread_mutex_destroy(&c->tx_lock);
	free(c->tx_fifo);
	if (c->cq_reserved) { /* its QP was never made: the group never had it */
		pthread_mutex_lock(&c->g->lock);
		gcq_unreserve(c);
		pthread_mutex_unlock(&c->g->lock);
	}
	if (c->g)
		atomic_fetch_sub(&c->g->nr_cons, 1);
	free(c);
}

/*
 * Destroys c: no callback of it runs once this returns. A connection whose
 * QP was made, or whose id is on the group's channel (a client's, from
 * its connect on), leaves its group on the group's thread (group_release):
 * from any other thread this waits for that; from its group's thread (a
 * callback of another of its connections) it is handed over and freed
 * there. One whose rdma_connect still runs on its connect thread (iWARP)
 * is left to that thread: this returns at once, nothing of it runs.
 */
static void con_destroy(struct fab_con *c)
{
	struct con_dw dw = { .keep = false };

	atomic_store(&c->destroying, true);
	if (!c->qp_made && !c->on_group) {
		con_free(c);
		return;
	}
	if (tls_group == c->g) {
		/* From a callback of another connection of its group: nothing of c runs now. */
		queue_work(c, W_DESTROY);
		return;
	}
	fab_done_init(&dw.done);
	pthread_mutex_lock(&c->g->lock);
	c->dw = &dw;
	pthread_mutex_unlock(&c->g->lock);
	queue_work(c, W_DESTROY);
	fab_done_wait(&dw.done);
	if (!dw.keep) /* else its connect thread frees it */
		con_free(c);
}

/* A connection object on a poll group; no id, CQ or QP yet. */
static int con_new(struct fab *f, const struct fab_con_cfg *cfg, struct fab_con **out)
{
	struct fab_con *c = calloc(1, sizeof(*c));
	uint64_t poll_ns = (uint64_t)cfg->poll_us * 1000;

	if (!c)
		return -ENOMEM;
	c->ops = &fab_rdma_ops;
	c->fab = f;
	c->cfg = *cfg;
	fab_con_name_init(&c->name, cfg->name);
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_mutex_init(&c->tx_lock, NULL);
	c->defer_tail = &c->defer;
	c->g = group_pick();
	if (!c->g) {
		con_free(c);
		return -ENODEV; /* no fab open: cannot be */
	}
	for (uint64_t cur = atomic_load(&c->g->poll_ns); cur < poll_ns;)
		if (atomic_compare_exchange_weak(&c->g->poll_ns, &cur, poll_ns))
			break;
	*out = c;
	return 0;
}

/*
 * The QP on c->id (which is resolved, or a request's), its CQ room in the
 * group, its place in the group's table and the receive pool.
 */
/* want, or just below the power of two it is at most RDMA_SQ_SLACK past. */
static size_t sq_depth(size_t want)
{
	size_t p = 1;

	while (p <= (want + 1) / 2)
		p *= 2; /* the largest power of two not above want + 1 */
	return p > 16 && want + 1 - p <= RDMA_SQ_SLACK ? p - 1 : want;
}

static int con_qp(struct fab_con *c)
{
	struct fab *f = c->fab;
	const struct fab_con_cfg *cfg = &c->cfg;
	struct ibv_qp_init_attr qa = { 0 };
	size_t tx = MIN(sq_depth(MAX(cfg->tx_depth, 16)), f->attr.max_queue);
	size_t rx_depth = cfg->rx_depth;
	size_t rxq = MIN(MAX(MAX(rx_depth, cfg->rx_queue), 16), f->attr.max_queue);
	struct rdma_gsrq *sq = NULL;
	unsigned srq = 0;
	int rc;

	if (c->id->verbs != f->verbs) {
		log_err("%s: the route goes through another RDMA device (%s)", con_name(c),
			c->id->verbs ? ibv_get_device_name(c->id->verbs->device) : "?");
		return -ENODEV;
	}
	if (rx_depth > rxq) {
		log_warn("%s: %zu receives wanted, the device grants %zu", con_name(c), rx_depth, rxq);
		rx_depth = rxq;
	}
	/*
	 * A server's connection that only receives immediates (its IO
	 * connections) takes them from its group's shared receive queue on the
	 * device, so that receive memory does not grow with the connections.
	 * On IB and RoCE a sender that finds it empty waits and retries (RNR,
	 * without limit: both clients ask for 7); iWARP has no such retry (an
	 * untagged message without a receive ends the connection), so there
	 * each connection keeps its own, which its peer's credit never
	 * overruns.
	 */
	if (f->server && rx_depth && !cfg->rx_size && !cfg->rx_queue && f->max_srq_wr && !f->iwarp)
		srq = MIN(MIN(atomic_load(&rdma_srq_depth), f->max_srq_wr), f->max_cqe / 2);
	if (srq) {
		pthread_mutex_lock(&c->g->lock);
		rc = gsrq_get(c->g, f, srq, &sq);
		pthread_mutex_unlock(&c->g->lock);
		if (rc) {
			log_warn_rl("%s: no shared receive queue (%s): it posts receives of its own",
				    con_name(c), strerror(-rc));
			sq = NULL;
		}
	}
	rc = gcq_reserve(c, (unsigned)(tx + (sq ? 0 : rxq)), sq);
	if (rc) {
		if (sq) {
			pthread_mutex_lock(&c->g->lock);
			gsrq_put(c->g, sq);
			pthread_mutex_unlock(&c->g->lock);
		}
		return rc;
	}
	qa.send_cq = c->gcq->cq;
	qa.recv_cq = c->gcq->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = (uint32_t)tx;
	qa.cap.max_send_sge = (uint32_t)f->attr.iov_limit;
	if (c->srq) {
		qa.srq = c->srq->srq;
		rx_depth = 0;
	} else {
		c->rx_cap = rxq;
		qa.cap.max_recv_wr = (uint32_t)rxq;
		qa.cap.max_recv_sge = 1;
	}
	qa.cap.max_inline_data = RDMA_INLINE;
	errno = 0;
	if (rdma_create_qp(c->id, f->pd, &qa)) {
		rc = errno ? -errno : -EIO; /* a provider may fail without saying why */
		log_err("%s: rdma_create_qp (send %zu, receive %zu%s): %s", con_name(c), tx,
			c->srq ? (size_t)0 : rxq, c->srq ? ", shared" : "", strerror(-rc));
		return rc;
	}
	c->qp_made = true;
	c->qp = c->id->qp;
	c->qpn = c->qp->qp_num;
	rc = con_map(c);
	if (rc)
		return rc;
	if (qa.cap.max_inline_data < RDMA_INLINE) {
		log_err("%s: the device grants %u inline bytes, %d needed", con_name(c),
			qa.cap.max_inline_data, RDMA_INLINE);
		return -EOPNOTSUPP;
	}
	c->max_inline = qa.cap.max_inline_data;
	/* Never more than the CQ room reserved for it, whatever the QP grants. */
	c->tx_max = MIN(qa.cap.max_send_wr, (uint32_t)tx);
	c->tx_sig_every = MIN(MAX(c->tx_max / 4, 1), RDMA_SIG_EVERY_MAX);
	c->tx_fifo = calloc(c->tx_max, sizeof(*c->tx_fifo));
	if (!c->tx_fifo)
		return -ENOMEM;
	c->rx.size = MAX(cfg->rx_size, RDMA_RX_MIN);
	if (rx_depth)
		rc = nat_con_rx_setup(c, rx_depth, c->rx.size);
	return rc;
}

/* rdma_connect's failure, logged as the owner hears it (on the group's thread). */
static int con_connect_failed(struct fab_con *c, int rc)
{
	if (rc == -ECONNREFUSED) {
		/* iWARP connects the TCP socket here: nobody listening is said at once. */
		char local[64];

		sockaddr_str(rdma_get_local_addr(c->id), local, sizeof(local));
		log_warn_rl("%s: refused at once from %s: nothing listens at the destination",
			    con_name(c), local);
	} else if (rc == -EADDRNOTAVAIL) {
		/*
		 * iWARP binds the TCP socket to a port the RDMA CM picked from
		 * its own space, which knows nothing of the kernel's sockets in
		 * TIME_WAIT (seen on siw, a session opened among hundreds closed
		 * just before): the owner's next attempt picks another.
		 */
		log_warn_rl("%s: rdma_connect: the port the CM picked is taken (%s)", con_name(c),
			    strerror(-rc));
	} else {
		log_err("%s: rdma_connect: %s", con_name(c), strerror(-rc));
	}
	return rc;
}

static int con_connect_call(struct fab_con *c)
{
	struct rdma_conn_param param = {
		.private_data = c->pdata, .private_data_len = c->pdata_len,
		.retry_count = 7, .rnr_retry_count = 7,
	};

	return rdma_connect(c->id, &param) ? -errno : 0;
}

/*
 * iWARP's connect threads: made as connects need them, up to
 * RDMA_CONNECT_THREADS_MAX, kept RDMA_CONNECT_IDLE_MS after their last,
 * so that connects that come in a storm (sessions reconnecting) reuse
 * them. At most RDMA_CONNECT_PER_DEST_MAX connects to one destination
 * (cdest: the fab's address and port) hold a place: the next ones wait on
 * its list in FIFO order, and the first there takes the place of each
 * that ends. A connect with a place is ready: idle threads, new ones, or
 * with RDMA_CONNECT_THREADS_MAX busy the next one free, take the ready in
 * FIFO order. A connection destroyed while it waits (cpool_cancel) gives
 * its place, or its turn on its destination's list, up at once and goes
 * first among the ready, where a thread drops it without connecting
 * (con_connect_run). cpool.lock and a group's lock are never held
 * together.
 */
struct cdest {
	struct sockaddr_storage addr;
	unsigned running;            /* connects holding a place (fab_con.cslot) */
	struct fab_con *head, *tail; /* waiting for one (CS_WAIT) */
	struct cdest *next;
};

enum { CS_NONE, CS_WAIT, CS_READY, CS_RUN };

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* a connect is ready */
	struct fab_con *head, *tail; /* ready (CS_READY) */
	unsigned ready;              /* on that list */
	unsigned threads;
	unsigned idle;               /* waiting for a ready connect */
	unsigned starting;           /* made for the ready, not yet waiting */
	unsigned max;                /* RDMA_CONNECT_THREADS_MAX (a test's fewer) */
	struct cdest *dests;         /* those with a connect holding a place */
} cpool = { .lock = PTHREAD_MUTEX_INITIALIZER, .max = RDMA_CONNECT_THREADS_MAX };
static pthread_once_t cpool_once = PTHREAD_ONCE_INIT;

static void cpool_init(void)
{
	cond_init_mono(&cpool.cond);
}

#ifdef RTRS_FAULT_INJECTION
/* Test builds (rtrs_fault_set): a test fills the pool with a few connects that hang. */
void fab_rdma_connect_threads(unsigned n)
{
	pthread_mutex_lock(&cpool.lock);
	cpool.max = n && n < RDMA_CONNECT_THREADS_MAX ? n : RDMA_CONNECT_THREADS_MAX;
	pthread_mutex_unlock(&cpool.lock);
}
#endif

static bool dest_same(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;

		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	if (a->ss_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;

		return x->sin6_port == y->sin6_port && x->sin6_scope_id == y->sin6_scope_id &&
		       !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr));
	}
	return !memcmp(a, b, sizeof(*a));
}

/* dst's entry, made if it has none; NULL without memory (its connects go unbounded). */
static struct cdest *cdest_get(const struct sockaddr_storage *dst)
{
	struct cdest *d;

	for (d = cpool.dests; d; d = d->next)
		if (dest_same(&d->addr, dst))
			return d;
	d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	d->addr = *dst;
	d->next = cpool.dests;
	cpool.dests = d;
	return d;
}

static void clist_add(struct fab_con **head, struct fab_con **tail, struct fab_con *c, bool first)
{
	if (first) {
		c->connect_next = *head;
		*head = c;
		if (!*tail)
			*tail = c;
		return;
	}
	c->connect_next = NULL;
	if (*tail)
		(*tail)->connect_next = c;
	else
		*head = c;
	*tail = c;
}

static void clist_del(struct fab_con **head, struct fab_con **tail, struct fab_con *c)
{
	struct fab_con *prev = NULL;

	for (struct fab_con **p = head; *p; prev = *p, p = &(*p)->connect_next) {
		if (*p == c) {
			*p = c->connect_next;
			if (*tail == c)
				*tail = prev;
			return;
		}
	}
}

static void cpool_ready(struct fab_con *c, bool first)
{
	c->cstate = CS_READY;
	clist_add(&cpool.head, &cpool.tail, c, first);
	cpool.ready++;
}

/* A connect to d gave its place back: the first waiting there takes it. */
static void cdest_release(struct cdest *d)
{
	struct fab_con *w = d->head;

	if (w) {
		d->head = w->connect_next;
		if (!d->head)
			d->tail = NULL;
		w->cslot = true;
		cpool_ready(w, false);
		return;
	}
	if (--d->running)
		return;
	for (struct cdest **p = &cpool.dests; *p; p = &(*p)->next) {
		if (*p == d) {
			*p = d->next;
			break;
		}
	}
	free(d);
}

/* Wakes the idle threads for the ready; returns how many threads to make (counted). */
static unsigned cpool_wake(void)
{
	unsigned n = 0;

	if (cpool.idle)
		pthread_cond_broadcast(&cpool.cond);
	while (cpool.ready > cpool.idle + cpool.starting && cpool.threads < cpool.max) {
		cpool.threads++;
		cpool.starting++;
		n++;
	}
	return n;
}

/*
 * One connect: iWARP's rdma_connect makes the TCP connection before it
 * returns (siw: a blocking connect of its kernel socket), which to a peer
 * that drops SYNs takes the kernel's TCP connect timeout, minutes. So it
 * runs on a connect thread, never on the group's (every connection of the
 * group would wait) nor on an offload worker (a few per process, which
 * DH-HMAC-CHAP needs). Its result goes back to the group (W_CONNECTED); a
 * connection destroyed meanwhile (orphaned) is released from here, and
 * one destroyed while it waited for a thread is not connected at all.
 */
static void con_connect_run(struct fab_con *c)
{
	struct rdma_group *g = c->g;
	struct fab *f = c->fab;
	bool orphaned;
	int rc;

	pthread_mutex_lock(&g->lock);
	orphaned = c->orphaned;
	pthread_mutex_unlock(&g->lock);
	rc = orphaned ? -ECANCELED : con_connect_call(c);
	pthread_mutex_lock(&g->lock);
	c->connecting = false;
	c->connect_rc = rc;
	orphaned = c->orphaned;
	/* queue_work's hand-over, under the lock: c may go as soon as it is released. */
	if (!orphaned && !atomic_fetch_or(&c->work, W_CONNECTED)) {
		c->work_next = g->work;
		g->work = c;
	}
	pthread_mutex_unlock(&g->lock);
	if (orphaned)
		con_destroy(c); /* now without waiting on the kernel */
	else
		group_wake(g);
	fab_put(f); /* last: the fabric holds the group */
}

/* Takes the ready connects in turn; its place at its destination goes back once it is done. */
static void *con_connect_thread(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "rtrs-rdma-conn");
	pthread_mutex_lock(&cpool.lock);
	cpool.starting--;
	for (;;) {
		struct timespec dl = deadline_ms(RDMA_CONNECT_IDLE_MS);
		struct fab_con *c;
		struct cdest *d;
		int rc = 0;

		cpool.idle++;
		while (!cpool.head && rc != ETIMEDOUT)
			rc = pthread_cond_timedwait(&cpool.cond, &cpool.lock, &dl);
		cpool.idle--;
		c = cpool.head;
		if (!c) {
			cpool.threads--;
			pthread_mutex_unlock(&cpool.lock);
			return NULL;
		}
		clist_del(&cpool.head, &cpool.tail, c);
		cpool.ready--;
		c->cstate = CS_RUN;
		d = c->cslot ? c->cdest : NULL;
		pthread_mutex_unlock(&cpool.lock);
		con_connect_run(c); /* c may be freed once it returns */
		pthread_mutex_lock(&cpool.lock);
		if (d)
			cdest_release(d);
	}
}

/* Makes n connect threads (counted by cpool_wake); 0, or the first failure's error. */
static int cpool_spawn(unsigned n)
{
	pthread_attr_t attr;
	sigset_t all, old;
	int rc = 0;

	if (!n)
		return 0;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	/* No signal of the process's interrupts a connect, or runs there. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	for (; n && !rc; n--) {
		pthread_t t;

		rc = -pthread_create(&t, &attr, con_connect_thread, NULL);
		if (!rc)
			continue;
		pthread_mutex_lock(&cpool.lock);
		cpool.threads -= n;
		cpool.starting -= n;
		pthread_mutex_unlock(&cpool.lock);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	return rc;
}

/*
 * c was orphaned while connecting (group_release): if it still waits, for
 * its destination or for a thread, it holds no place there from now on
 * and goes first among the ready, so that the next thread free (an idle
 * one, or a new one) drops it (con_connect_run), and its CM id and QP go,
 * without waiting for connects to its destination that hang. One a thread
 * took is that thread's already.
 */
static void cpool_cancel(struct fab_con *c)
{
	struct cdest *d;
	unsigned n;
	int rc;

	pthread_mutex_lock(&cpool.lock);
	d = c->cdest;
	if (c->cstate == CS_WAIT) {
		clist_del(&d->head, &d->tail, c);
	} else if (c->cstate == CS_READY && c->cslot) {
		c->cslot = false;
		cdest_release(d);
		clist_del(&cpool.head, &cpool.tail, c);
		cpool.ready--;
	} else {
		pthread_mutex_unlock(&cpool.lock);
		return;
	}
	c->cdest = NULL;
	cpool_ready(c, true);
	n = cpool_wake();
	pthread_mutex_unlock(&cpool.lock);
	rc = cpool_spawn(n);
	if (rc)
		log_warn_rl("%s: no thread to drop its connect (%s): it waits for one to be free",
			    con_name(c), strerror(-rc));
}

/* The connect thread's result, on the group's thread: as a synchronous rdma_connect's. */
static void con_connected_rc(struct fab_con *c)
{
	if (!c->connect_rc) {
		/* A shutdown while it ran left the disconnect to be done (nat_con_shutdown). */
		if (atomic_load(&c->shutdown))
			rdma_disconnect(c->id);
		return;
	}
	if (!con_quiet(c))
		con_down(c, con_connect_failed(c, c->connect_rc), NULL, 0);
}

/* rdma_connect on a connect thread (con_connect_run); 0 when it is handed over. */
static int con_connect_start(struct fab_con *c)
{
	struct cdest *d;
	unsigned n;
	int rc;

	pthread_mutex_lock(&c->g->lock);
	/* Checked with the flag set under the lock: a shutdown disconnects, or finds it. */
	if (atomic_load(&c->shutdown)) {
		pthread_mutex_unlock(&c->g->lock);
		return 0; /* the owner knows; nothing to connect */
	}
	c->connecting = true;
	pthread_mutex_unlock(&c->g->lock);
	atomic_fetch_add(&c->fab->refs, 1);
	pthread_once(&cpool_once, cpool_init);
	pthread_mutex_lock(&cpool.lock);
	d = cdest_get(&c->fab->dst);
	c->cdest = d;
	c->cslot = false;
	if (d && d->running >= RDMA_CONNECT_PER_DEST_MAX) {
		/* Its destination has its fill of connects: the next to end gives it its place. */
		c->cstate = CS_WAIT;
		clist_add(&d->head, &d->tail, c, false);
		pthread_mutex_unlock(&cpool.lock);
		return 0;
	}
	if (d) {
		d->running++;
		c->cslot = true;
	}
	cpool_ready(c, false);
	n = cpool_wake();
	pthread_mutex_unlock(&cpool.lock);
	rc = cpool_spawn(n);
	if (!rc)
		return 0;
	pthread_mutex_lock(&cpool.lock);
	if (c->cstate != CS_READY || cpool.threads) {
		/* A thread took it, or one will once free. */
		pthread_mutex_unlock(&cpool.lock);
		log_warn_rl("%s: no new thread for rdma_connect (%s): it waits for one to be free",
			    con_name(c), strerror(-rc));
		return 0;
	}
	/*
	 * No thread at all: it connects here, on the poll group's, as it would
	 * with no pool; one waiting for d that takes its place waits for the
	 * next thread made.
	 */
	clist_del(&cpool.head, &cpool.tail, c);
	cpool.ready--;
	c->cstate = CS_NONE;
	if (c->cslot)
		cdest_release(d);
	c->cslot = false;
	c->cdest = NULL;
	pthread_mutex_unlock(&cpool.lock);
	pthread_mutex_lock(&c->g->lock);
	c->connecting = false;
	pthread_mutex_unlock(&c->g->lock);
	atomic_fetch_sub(&c->fab->refs, 1); /* the owner's is still held */
	log_warn_rl("%s: no thread for rdma_connect (%s): connecting on the poll group's",
		    con_name(c), strerror(-rc));
	return -EAGAIN;
}

/*
 * A client's connection, on its group's thread from the resolved route on
 * (handle_cm): the QP, then the connect request with the private data kept
 * since nat_con_connect; on iWARP the connect runs on a connect thread
 * (con_connect_run). 0, or the error the owner hears as down().
 */
static int con_connect_routed(struct fab_con *c)
{
	int rc = con_qp(c);

	if (rc)
		return rc;
	if (c->fab->iwarp && con_connect_start(c) == 0)
		return 0;
	rc = con_connect_call(c);
	return rc ? con_connect_failed(c, rc) : 0;
}

/*
 * Starts a client's connection: its CM id on the group's channel, the
 * address being resolved. The group goes on from the events (handle_cm:
 * route, QP, connect); nothing here waits, so the caller may be a service
 * loop that many sessions share. What fails later reaches the owner as
 * down() with the error.
 */
static int nat_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			    size_t len, struct fab_con **out)
{
	struct fab_con *c;
	int rc;

	if (f->server)
		return -EINVAL;
	if (tls_group) {
		/* A reused QP number may wait for another group's release (con_map). */
		log_err("%s: a connection cannot be made from a poll group's thread", cfg->name);
		return -EDEADLK;
	}
	if (len > pdata_max(f, 0)) {
		log_err("%s: %zu bytes of connection data exceed the provider's %zu", cfg->name,
			len, pdata_max(f, 0));
		return -EMSGSIZE;
	}
	rc = con_new(f, cfg, &c);
	if (rc)
		return rc;
	memcpy(c->pdata, data, len);
	c->pdata_len = (uint8_t)len;
	if (rdma_create_id(c->g->ch, &c->id, c, RDMA_PS_TCP)) {
		rc = -errno;
		log_err("%s: rdma_create_id: %s", con_name(c), strerror(-rc));
		con_free(c);
		return rc;
	}
	c->own_id = true;
	c->on_group = true;
	/* Its events may come, and a down() reach the owner, before this returns. */
	*out = c;
	if (rdma_resolve_addr(c->id, f->has_src ? (struct sockaddr *)&f->src : NULL,
			      (struct sockaddr *)&f->dst, RDMA_RESOLVE_MS) == 0)
		return 0;
	rc = -errno;
	log_err("%s: resolving the address: %s", con_name(c), strerror(-rc));
	*out = NULL;
	con_destroy(c);
	return rc;
}

static int nat_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			   const void *data, size_t len, struct fab_con **out)
{
	struct rdma_conn_param param = {
		.private_data = data, .private_data_len = (uint8_t)len,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	bool migrated = false;
	struct fab_con *c;
	int rc;

	if (len > pdata_max(f, 1))
		return -EMSGSIZE;
	if (tls_group) {
		log_err("%s: a connection cannot be accepted on a poll group's thread", cfg->name);
		return -EDEADLK;
	}
	rc = con_new(f, cfg, &c);
	if (rc)
		return rc;
	c->id = req->id;
	rc = con_qp(c);
	if (rc)
		goto fail;
	/* The group reads its events from here: the id names the connection. */
	c->id->context = c;
	if (rdma_migrate_id(c->id, c->g->ch)) {
		rc = -errno;
		goto fail;
	}
	migrated = true;
	*out = c;
	/*
	 * The connection owns the request's id from the accept on: its events
	 * may come, and a destroy follow, before rdma_accept returns here.
	 */
	c->own_id = true;
	req->answered = true;
	req->accepted = true;
	if (rdma_accept(c->id, &param)) {
		rc = -errno;
		log_err("%s: rdma_accept: %s", con_name(c), strerror(-rc));
		c->own_id = false;
		req->answered = false;
		req->accepted = false;
		*out = NULL;
		goto fail;
	}
	return 0;

fail:
	/* Nothing of it reaches the owner, even an event read before the id moves back. */
	atomic_store(&c->destroying, true);
	/*
	 * The id stays the listener's, which refuses and frees it: back on
	 * the listener's channel first, since the group's destroys the ids on
	 * it when it closes.
	 */
	if (migrated && rdma_migrate_id(c->id, f->lch))
		log_err("%s: handing the request back to the listener: %s", con_name(c),
			strerror(errno));
	c->id->context = NULL;
	con_destroy(c);
	return rc;
}

static int nat_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	size_t bytes;
	char *buf;
	int rc = 0;

	size = MAX(size, RDMA_RX_MIN);
	if (mul_overflow(count, size, &bytes) || !count || size > UINT32_MAX)
		return -EINVAL;
	if (count > c->rx_cap) {
		log_err("%s: %zu receive buffers, the queue was made for %zu", con_name(c), count,
			c->rx_cap);
		return -EINVAL;
	}
	pthread_mutex_lock(&c->rx_lock);
	if (c->rx.count) {
		pthread_mutex_unlock(&c->rx_lock);
		return -EEXIST;
	}
	buf = calloc(count, size);
	if (!buf) {
		pthread_mutex_unlock(&c->rx_lock);
		return -ENOMEM;
	}
	c->rx.mr = ibv_reg_mr(c->fab->pd, buf, bytes, IBV_ACCESS_LOCAL_WRITE);
	if (!c->rx.mr) {
		rc = errno ? -errno : -ENOMEM;
		free(buf);
		pthread_mutex_unlock(&c->rx_lock);
		return rc;
	}
	c->rx.buf = buf;
	c->rx.size = size;
	__atomic_store_n(&c->rx.count, count, __ATOMIC_RELEASE);
	for (size_t i = 0; i < count && !rc; i++)
		rc = rx_post(c, i);
	pthread_mutex_unlock(&c->rx_lock);
	return rc;
}

static void nat_con_retry_later(struct fab_con *c)
{
	queue_work(c, W_RETRY);
}

static void nat_con_kick(struct fab_con *c)
{
	queue_work(c, W_KICK);
}

static void nat_con_shutdown(struct fab_con *c)
{
	bool connecting;

	if (!c || atomic_exchange(&c->shutdown, true))
		return;
	/*
	 * Not while its connect thread is in rdma_connect, which holds the id
	 * in the kernel: the group disconnects once it returned
	 * (con_connected_rc).
	 */
	pthread_mutex_lock(&c->g->lock);
	connecting = c->connecting;
	pthread_mutex_unlock(&c->g->lock);
	/* Flushes the queue pair; the peer sees a disconnect. */
	if (c->id && !connecting)
		rdma_disconnect(c->id);
}

static void nat_con_destroy(struct fab_con *c)
{
	if (!c)
		return;
	atomic_store(&c->shutdown, true);
	con_destroy(c);
}

static void nat_con_rename(struct fab_con *c, const char *name)
{
	fab_con_name_set(&c->name, name);
}

static void nat_con_local(const struct fab_con *c, char *buf, size_t len)
{
	sockaddr_str(c->id ? rdma_get_local_addr(c->id) : NULL, buf, len);
}

/* Room for n more work requests on the send queue, or -EAGAIN. */
static int tx_reserve(struct fab_con *c, unsigned n)
{
	if (atomic_fetch_add_explicit(&c->tx_posted, n, memory_order_relaxed) + n > c->tx_max) {
		atomic_fetch_sub_explicit(&c->tx_posted, n, memory_order_relaxed);
		return -EAGAIN;
	}
	return 0;
}

/*
 * ibv_post_send, on siw without SIGPIPE: siw transmits on its kernel TCP
 * socket in the poster's context, and a send to a peer that reset the
 * connection raises SIGPIPE in the posting thread, which kills a process
 * that did not ignore it (seen: test-peer-death killed after its server
 * was). A library must not change the process's disposition, so the
 * signal is blocked around the post and a SIGPIPE the post raised is
 * taken before the mask is restored; the post's error tells the rest.
 */
#ifdef RTRS_FAULT_INJECTION
static atomic_uint post_fail_at, post_count;
static atomic_uint_fast64_t posts_failed;

void fab_rdma_post_fail_at(unsigned n)
{
	atomic_store(&post_count, 0);
	atomic_store(&post_fail_at, n);
}

uint64_t fab_rdma_posts_failed(void)
{
	return atomic_load(&posts_failed);
}

/* A successful post that is to be reported failed after queuing (rtrs_fault.rdma_post_fail_at). */
static int post_fault(int rc)
{
	unsigned at = atomic_load_explicit(&post_fail_at, memory_order_relaxed);

	if (rc || !at || atomic_fetch_add(&post_count, 1) + 1 != at)
		return rc;
	atomic_fetch_add(&posts_failed, 1);
	return -ENOMEM;
}
#else
#define post_fault(rc) (rc)
#endif

static int post_send(struct fab_con *c, struct ibv_send_wr *first, struct ibv_send_wr **bad)
{
	static const struct timespec zero;
	sigset_t pipe_set, old, pending;
	bool was_pending;
	int rc;

	if (!c->fab->sigpipe_guard) {
		rc = ibv_post_send(c->qp, first, bad);
		return post_fault(rc ? verbs_err(rc, errno) : 0);
	}
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
	rc = ibv_post_send(c->qp, first, bad);
	if (rc)
		rc = verbs_err(rc, errno); /* before the signal calls below can change errno */
	if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
		while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
			;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return post_fault(rc);
}

/* Under tx_lock: whether the next post of n requests is to be signalled. */
static bool tx_sig_due(const struct fab_con *c, bool ctx, unsigned n)
{
	return ctx || c->tx_unsig + n >= c->tx_sig_every;
}

/*
 * Under tx_lock, after a post of n requests (sig: its last signalled) of
 * which `unposted` did not go: those give their room back, and what went
 * is unsignalled (the next signalled request covers it).
 */
static void tx_account(struct fab_con *c, unsigned n, unsigned unposted, bool sig)
{
	c->tx_seq += n - unposted;
	if (!unposted && sig) {
		c->tx_fifo[(c->tx_head + c->tx_count) % c->tx_max] = c->tx_unsig + n;
		c->tx_count++;
		c->tx_unsig = 0;
		return;
	}
	c->tx_unsig += n - unposted;
	if (unposted)
		atomic_fetch_sub_explicit(&c->tx_posted, unposted, memory_order_relaxed);
}

/*
 * Posts a chain of n work requests (last is its last) that tx_reserve made
 * room for; the ones that did not go give their room back. Only the last can
 * be signalled: when it has a context, or when enough went unsignalled.
 */
static int post_chain(struct fab_con *c, struct ibv_send_wr *first, struct ibv_send_wr *last,
		      unsigned n)
{
	struct ibv_send_wr *bad = NULL;
	unsigned unposted = 0;
	bool sig;
	int rc;

	pthread_mutex_lock(&c->tx_lock);
	sig = tx_sig_due(c, last->wr_id, n);
	if (sig)
		last->send_flags |= IBV_SEND_SIGNALED;
	rc = post_send(c, first, &bad);
	if (rc && !bad) {
		/*
		 * A failure that names no request has queued them all: the
		 * provider's doorbell failed after they went into the queue
		 * (libsiw's as the QP closes, rxe's write to the device's file
		 * that failed). They may still go, at the next doorbell, so
		 * they are posted: a retry would send them twice, and the
		 * server would answer a request twice (the second answer
		 * completing whatever request holds the permit by then). So
		 * that they cannot wait for a doorbell that never comes, the
		 * QP goes to the error state: they complete flushed, the
		 * connection fails, and its requests are recovered with the
		 * path's. Their completions give their room back.
		 */
		struct ibv_qp_attr qa = { .qp_state = IBV_QPS_ERR };

		log_err_rl("%s: posting failed after the requests were queued (%s): closing the "
			   "connection", con_name(c), strerror(-rc));
		ibv_modify_qp(c->qp, &qa, IBV_QP_STATE);
		rc = 0;
	}
	/* The ones from bad on did not go. */
	for (struct ibv_send_wr *w = rc ? bad : NULL; w; w = w->next)
		unposted++;
	tx_account(c, n, unposted, sig);
	pthread_mutex_unlock(&c->tx_lock);
	return rc == -ENOMEM ? -EAGAIN : rc;
}

/*
 * The work requests of one post: fab_post's chain, or the one or two of a
 * single operation. Only the last may carry a context.
 */
struct rdma_chain {
	struct ibv_send_wr wr[RDMA_CHAIN_MAX];
	struct ibv_sge sge[RDMA_CHAIN_SGE];
	struct le32 imm[RDMA_CHAIN_MAX];
	unsigned n, nsge;
};

static struct ibv_send_wr *chain_wr(struct rdma_chain *ch)
{
	struct ibv_send_wr *wr;

	if (ch->n == RDMA_CHAIN_MAX)
		return NULL;
	wr = &ch->wr[ch->n++];
	memset(wr, 0, sizeof(*wr));
	return wr;
}

static struct ibv_sge *chain_sge(struct rdma_chain *ch, size_t n)
{
	struct ibv_sge *sge;

	if (n > RDMA_CHAIN_SGE - ch->nsge)
		return NULL;
	sge = &ch->sge[ch->nsge];
	ch->nsge += (unsigned)n;
	return sge;
}

/* The 4-byte message that carries an immediate on iWARP, inline. */
static int chain_imm_msg(struct rdma_chain *ch, uint32_t imm)
{
	struct ibv_send_wr *wr = chain_wr(ch);
	struct ibv_sge *sge = chain_sge(ch, 1);
	struct le32 *v;

	if (!wr || !sge)
		return -E2BIG;
	v = &ch->imm[ch->n - 1];
	*v = le32_put(imm);
	*sge = (struct ibv_sge){ .addr = (uintptr_t)v, .length = sizeof(*v) };
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = IBV_WR_SEND;
	wr->send_flags = IBV_SEND_INLINE;
	return 0;
}

/* An RDMA write from registered vectors to one remote range. */
static int chain_write(struct fab_con *c, struct rdma_chain *ch, const struct fab_wr *w)
{
	bool imm_msg = w->with_imm && c->fab->iwarp;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;

	if (w->rma_cnt != 1 || w->iov_cnt > c->fab->attr.iov_limit || !w->desc)
		return -EINVAL;
	wr = chain_wr(ch);
	sge = chain_sge(ch, w->iov_cnt);
	if (!wr || !sge)
		return -E2BIG;
	for (size_t i = 0; i < w->iov_cnt; i++) {
		const struct ibv_mr *m = w->desc[i];

		if (!m)
			return -EINVAL;
		sge[i] = (struct ibv_sge){ .addr = (uintptr_t)w->iov[i].iov_base,
					   .length = (uint32_t)w->iov[i].iov_len, .lkey = m->lkey };
	}
	wr->sg_list = sge;
	wr->num_sge = (int)w->iov_cnt;
	wr->opcode = w->with_imm && !imm_msg ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
	wr->imm_data = htonl(w->imm);
	wr->wr.rdma.remote_addr = w->rma[0].addr;
	wr->wr.rdma.rkey = (uint32_t)w->rma[0].key;
	/* The immediate follows as a message: its arrival means the data is placed. */
	return imm_msg ? chain_imm_msg(ch, w->imm) : 0;
}

/* A write of a few inline bytes (or none) with an immediate. */
static int chain_write_imm(struct fab_con *c, struct rdma_chain *ch, const struct fab_wr *w)
{
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;

	if (w->len > c->max_inline)
		return -EMSGSIZE;
	if (c->fab->iwarp && !w->len) /* just the immediate, as a message */
		return chain_imm_msg(ch, w->imm);
	wr = chain_wr(ch);
	sge = chain_sge(ch, 1);
	if (!wr || !sge)
		return -E2BIG;
	*sge = (struct ibv_sge){ .addr = (uintptr_t)w->buf, .length = (uint32_t)w->len };
	wr->sg_list = w->len ? sge : NULL;
	wr->num_sge = w->len ? 1 : 0;
	wr->send_flags = w->len ? IBV_SEND_INLINE : 0;
	wr->wr.rdma.remote_addr = w->addr;
	wr->wr.rdma.rkey = (uint32_t)w->key;
	if (c->fab->iwarp) { /* the data first; the immediate follows as a message */
		wr->opcode = IBV_WR_RDMA_WRITE;
		return chain_imm_msg(ch, w->imm);
	}
	wr->opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr->imm_data = htonl(w->imm);
	return 0;
}

/* A message with an immediate, from a registration (desc[0]) or inline. */
static int chain_send_imm(struct fab_con *c, struct rdma_chain *ch, const struct fab_wr *w)
{
	const struct ibv_mr *m = w->desc ? w->desc[0] : NULL;
	struct ibv_send_wr *wr;
	struct ibv_sge *sge;

	if (c->fab->iwarp)
		return -EOPNOTSUPP;
	if (!m && w->len > c->max_inline)
		return -EINVAL;
	wr = chain_wr(ch);
	sge = chain_sge(ch, 1);
	if (!wr || !sge)
		return -E2BIG;
	*sge = (struct ibv_sge){ .addr = (uintptr_t)w->buf, .length = (uint32_t)w->len,
				 .lkey = m ? m->lkey : 0 };
	wr->sg_list = sge;
	wr->num_sge = w->len ? 1 : 0;
	wr->opcode = IBV_WR_SEND_WITH_IMM;
	wr->imm_data = htonl(w->imm);
	wr->send_flags = !m && w->len ? IBV_SEND_INLINE : 0;
	return 0;
}

static int chain_add(struct fab_con *c, struct rdma_chain *ch, const struct fab_wr *w)
{
	struct ibv_send_wr *wr;

	switch (w->kind) {
	case FAB_WR_WRITE:
		return chain_write(c, ch, w);
	case FAB_WR_WRITE_IMM:
		return chain_write_imm(c, ch, w);
	case FAB_WR_SEND_IMM:
		return chain_send_imm(c, ch, w);
	case FAB_WR_SEND_INV:
		if (!c->fab->attr.send_inv)
			return -EOPNOTSUPP;
		wr = chain_wr(ch);
		if (!wr)
			return -E2BIG;
		wr->opcode = IBV_WR_SEND_WITH_INV;
		wr->invalidate_rkey = w->rkey;
		return 0;
	}
	return -EINVAL;
}

/* Posts what ch holds as one chain, ctx on its last request. */
static int chain_post(struct fab_con *c, struct rdma_chain *ch, void *ctx)
{
	int rc;

	if (!ch->n)
		return -EINVAL;
	for (unsigned i = 0; i + 1 < ch->n; i++)
		ch->wr[i].next = &ch->wr[i + 1];
	ch->wr[ch->n - 1].wr_id = (uintptr_t)ctx;
	rc = tx_reserve(c, ch->n);
	if (!rc)
		rc = post_chain(c, &ch->wr[0], &ch->wr[ch->n - 1], ch->n);
	return rc;
}

static int nat_post(struct fab_con *c, const struct fab_wr *wrs, size_t n, void *ctx)
{
	struct rdma_chain ch;
	int rc = 0;

	ch.n = ch.nsge = 0;
	for (size_t i = 0; !rc && i < n; i++)
		rc = chain_add(c, &ch, &wrs[i]);
	return rc ? rc : chain_post(c, &ch, ctx);
}

/*
 * A type-1 window's bind: ibv_bind_mw posts it on the QP as a work request
 * of its own (type 1 binds cannot go in an ibv_post_send chain); providers
 * give each bind the next value of the key's low byte.
 */
static int nat_win_bind(struct fab_con *c, struct fab_win *w, const struct fab_mr *mr, void *buf,
			size_t len, void *ctx)
{
	struct ibv_mw_bind b = {
		.wr_id = (uintptr_t)ctx,
		.bind_info = { .mr = mr ? mr->priv : NULL, .addr = (uintptr_t)buf, .length = len,
			       .mw_access_flags = len ? IBV_ACCESS_REMOTE_WRITE : 0 },
	};
	bool sig;
	int rc;

	/* A bind of length 0 names the region too: rxe's provider reads it. */
	if (!w->priv || !b.bind_info.mr)
		return -EINVAL;
	rc = tx_reserve(c, 1);
	if (rc)
		return rc;
	pthread_mutex_lock(&c->tx_lock);
	sig = tx_sig_due(c, ctx != NULL, 1);
	b.send_flags = sig ? IBV_SEND_SIGNALED : 0;
	rc = ibv_bind_mw(c->qp, w->priv, &b);
	tx_account(c, 1, rc ? 1 : 0, sig);
	pthread_mutex_unlock(&c->tx_lock);
	if (rc)
		return rc == ENOMEM ? -EAGAIN : -rc;
	w->key = ((struct ibv_mw *)w->priv)->rkey;
	w->binds++;
	return 0;
}

static int nat_write(struct fab_con *c, const struct iovec *iov, void *const *desc,
		     size_t iov_cnt, const struct fab_rma *rma, size_t rma_cnt, bool with_imm,
		     uint32_t imm, void *ctx)
{
	struct fab_wr w = { .kind = FAB_WR_WRITE, .iov = iov, .desc = desc, .iov_cnt = iov_cnt,
			    .rma = rma, .rma_cnt = rma_cnt, .with_imm = with_imm, .imm = imm };

	return nat_post(c, &w, 1, ctx);
}

static int nat_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			 uint64_t key, uint32_t imm, void *ctx)
{
	struct fab_wr w = { .kind = FAB_WR_WRITE_IMM, .buf = buf, .len = len, .addr = addr,
			    .key = key, .imm = imm };

	return nat_post(c, &w, 1, ctx);
}

static int nat_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	const struct ibv_mr *m = desc;
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = (uint32_t)len };
	struct ibv_send_wr wr = {
		.wr_id = (uintptr_t)ctx, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
	};
	int rc;

	if (m)
		sge.lkey = m->lkey;
	else if (len <= c->max_inline)
		wr.send_flags |= IBV_SEND_INLINE;
	else
		return -EINVAL;
	/*
	 * Control messages go out from service threads; on a group thread
	 * (a callback) waiting for room could wait for ever.
	 */
	for (int tries = 0;; tries++) {
		rc = tx_reserve(c, 1);
		if (!rc)
			rc = post_chain(c, &wr, &wr, 1);
		if (rc != -EAGAIN || tries == 1000 || tls_group)
			break;
		usleep(1000);
	}
	return rc;
}

static int nat_send_imm(struct fab_con *c, const void *buf, size_t len, void *desc,
			uint32_t imm, void *ctx)
{
	struct fab_wr w = { .kind = FAB_WR_SEND_IMM, .buf = buf, .len = len,
			    .desc = desc ? &desc : NULL, .imm = imm };

	return nat_post(c, &w, 1, ctx);
}

static int nat_send_inv(struct fab_con *c, uint32_t rkey, void *ctx)
{
	struct fab_wr w = { .kind = FAB_WR_SEND_INV, .rkey = rkey };

	return nat_post(c, &w, 1, ctx);
}

const struct fab_ops fab_rdma_ops = {
	.name = "rdma",
	.open = nat_open,
	.close = nat_close,
	.attr = nat_attr,
	.mr_reg = nat_mr_reg,
	.mr_dereg = nat_mr_dereg,
	.mr_dereg_after = nat_mr_dereg_after,
	.listen = nat_listen,
	.lst_close = nat_lst_close,
	.lst_fd = nat_lst_fd,
	.lst_port = nat_lst_port,
	.lst_process = nat_lst_process,
	.lst_limit = nat_lst_limit,
	.lst_sweep = nat_lst_sweep,
	.lst_closed = nat_lst_closed,
	.reject = nat_reject_req,
	.connreq_peer = nat_connreq_peer,
	.con_connect = nat_con_connect,
	.con_accept = nat_con_accept,
	.con_shutdown = nat_con_shutdown,
	.con_rx_setup = nat_con_rx_setup,
	.con_kick = nat_con_kick,
	.con_retry_later = nat_con_retry_later,
	.con_destroy = nat_con_destroy,
	.con_local = nat_con_local,
	.con_rename = nat_con_rename,
	.write = nat_write,
	.write_imm = nat_write_imm,
	.send = nat_send,
	.send_imm = nat_send_imm,
	.send_inv = nat_send_inv,
	.post = nat_post,
	.win_alloc = nat_win_alloc,
	.win_free = nat_win_free,
	.win_bind = nat_win_bind,
};
