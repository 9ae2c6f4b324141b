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
 *   - every connection has its own CM event channel, completion channel
 *     and thread: the thread sleeps in epoll
 *     on both and on an eventfd for kicks, never busy-polls;
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
#include "util.h"

#define RDMA_CQ_BATCH 64
#define RDMA_RESOLVE_MS 5000   /* address and route resolution */
#define RDMA_INLINE 64         /* inline bytes asked for: immediates' data, key records */
#define RDMA_SGE_MAX 16        /* local vectors per operation, at most */
#define RDMA_CHAIN_MAX 16      /* work requests in one post (fab_post) */
#define RDMA_CHAIN_SGE 48      /* ... and their vectors */
#define RDMA_IMM_MSG_LEN 4     /* an immediate carried as a message (iWARP) */
#define RDMA_RX_MIN 64         /* the smallest receive buffer */
#define RDMA_CQ_ACK_BATCH 64   /* completion events acknowledged at a time */
#define RDMA_SIG_EVERY_MAX 64  /* at most this many send requests go unsignalled in a row */
#define NAT_CONNECT_PORT_TRIES 8 /* iWARP: CM ids tried when a port meets a TIME_WAIT socket */
/* soft-iWARP's vendor id ("bmt"): its sends go out on a kernel TCP socket. */
#define RDMA_SIW_VENDOR_ID 0x626d74
/* Private data the CM carries (IBA 12.7 via the RDMA CM's 36-byte header; MPA on iWARP). */
#define RDMA_IB_CONNECT_MAX 56
#define RDMA_IB_ACCEPT_MAX 196
#define RDMA_IB_REJECT_MAX 148
#define RDMA_IW_PDATA_MAX 255 /* MPA carries 512; rdma_cm's length field is a byte */
/* The IB CM's reject reason for a consumer's reject, which carries its private data. */
#define RDMA_IB_REJ_CONSUMER 28
/* ... and the CM's when nothing listens on the service (the port). */
#define RDMA_IB_REJ_NO_LISTENER 8

struct fab {
	const struct fab_ops *ops; /* first: struct fab_obj */
	struct ibv_context *verbs; /* the device every connection of this fab uses */
	struct ibv_pd *pd;
	struct fab_attr attr;
	bool iwarp;
	bool sigpipe_guard;        /* siw: posting can raise SIGPIPE (below) */
	bool server;
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

struct fab_con {
	const struct fab_ops *ops;
	struct fab *fab;
	struct fab_con_cfg cfg;
	/*
	 * The name log lines give: name_made until a rename, then name_later
	 * (con_rename, once). A logger may still hold name_made: it never
	 * changes, and neither does name_later once published.
	 */
	_Atomic(const char *) name;
	char name_made[64];
	char name_later[64];
	bool renamed;               /* under name_lock */
	char tname[16];             /* the thread's name (con_rename), under name_lock */
	pthread_mutex_t name_lock;
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	bool own_id;            /* destroy id with the connection */
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	bool qp_made;
	unsigned cq_unacked;    /* completion events not yet acknowledged */
	int wake_fd, epfd;
	struct fab_rx rx;
	pthread_mutex_t rx_lock; /* rx pool set up from another thread */
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	atomic_bool down;       /* down() was called (or the owner shut us down) */
	atomic_bool shutdown;   /* fab_con_shutdown() was called */
	atomic_bool kicked;     /* ops->kick is due */
	atomic_bool retry;      /* ops->kick again after a short wait */
	atomic_int early_err;   /* a connect that failed at once: down() from the thread */
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
	size_t max_inline;      /* granted */
	uint64_t poll_ns;       /* busy-poll this long before sleeping */
	struct ibv_wc wcs[RDMA_CQ_BATCH];
};

static int nat_con_rx_setup(struct fab_con *c, size_t count, size_t size);

/* ---- helpers ------------------------------------------------------------------ */

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
 * error the event means. Before a connection's thread runs: resolution.
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

/* Resolves id's address (and route, when route) to dst from src. */
static int id_resolve(struct rdma_event_channel *ch, struct rdma_cm_id *id, struct fab *f,
		      bool route)
{
	int rc;

	if (rdma_resolve_addr(id, f->has_src ? (struct sockaddr *)&f->src : NULL,
			      (struct sockaddr *)&f->dst, RDMA_RESOLVE_MS))
		return -errno;
	rc = cm_wait(ch, RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_RESOLVE_MS + 1000);
	if (rc || !route)
		return rc;
	if (rdma_resolve_route(id, RDMA_RESOLVE_MS))
		return -errno;
	return cm_wait(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, RDMA_RESOLVE_MS + 1000);
}

/* The most private data the CM carries for op on this fab's transport. */
static size_t pdata_max(const struct fab *f, int op)
{
	if (f->iwarp)
		return RDMA_IW_PDATA_MAX;
	return op == 0 ? RDMA_IB_CONNECT_MAX : op == 1 ? RDMA_IB_ACCEPT_MAX : RDMA_IB_REJECT_MAX;
}

/* ---- fabric and domain ----------------------------------------------------------- */

/* The device's limits as the upper layers see them. */
static int fab_setup_device(struct fab *f, struct ibv_context *verbs)
{
	struct ibv_device_attr da;
	struct fab_attr *a = &f->attr;

	if (ibv_query_device(verbs, &da))
		return -errno;
	f->verbs = verbs;
	f->iwarp = verbs->device->transport_type == IBV_TRANSPORT_IWARP;
	f->sigpipe_guard = f->iwarp && da.vendor_id == RDMA_SIW_VENDOR_ID;
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
	log_dbg("fabric: device %s (%s), max_qp_wr %d, max_sge %d, max_cqe %d",
		ibv_get_device_name(verbs->device), f->iwarp ? "iWARP" : "IB/RoCE", da.max_qp_wr,
		da.max_sge, da.max_cqe);
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
		rc = id_resolve(ch, id, f, false);
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

static void nat_close(struct fab *f)
{
	if (!f)
		return;
	if (f->lid && !f->listening)
		rdma_destroy_id(f->lid);
	if (f->lch && !f->listening)
		rdma_destroy_event_channel(f->lch);
	if (f->pd && ibv_dealloc_pd(f->pd))
		log_warn("fabric: a protection domain still in use at close");
	free(f);
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
			len = ev->param.conn.private_data_len;
			if (len && ev->param.conn.private_data)
				memcpy(data, ev->param.conn.private_data, len);
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

/* ---- connections --------------------------------------------------------------------- */

static void con_down(struct fab_con *c, int err, const void *data, size_t len)
{
	/* After our own shutdown the owner already knows; say nothing. */
	if (atomic_exchange(&c->down, true) || atomic_load(&c->shutdown))
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

	return -ibv_post_recv(c->id->qp, &wr, &bad);
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
	size_t i = (size_t)((char *)(uintptr_t)wr_id - c->rx.buf) / c->rx.size;
	int rc = rx_post(c, i);

	if (rc && !atomic_load(&c->down)) {
		log_err("%s: reposting a receive failed: %s", c->name, strerror(-rc));
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

/* A signalled send completed: the room of the requests it covers comes back. */
static void tx_complete(struct fab_con *c)
{
	unsigned covers = 0;

	pthread_mutex_lock(&c->tx_lock);
	if (c->tx_count) {
		covers = c->tx_fifo[c->tx_head];
		c->tx_head = (c->tx_head + 1) % c->tx_max;
		c->tx_count--;
	}
	pthread_mutex_unlock(&c->tx_lock);
	if (!covers) {
		log_err_rl("%s: a send completion that no signalled request accounts for", c->name);
		return;
	}
	atomic_fetch_sub_explicit(&c->tx_posted, covers, memory_order_relaxed);
}

/*
 * Completions with an error come for unsignalled requests too; they only
 * come once the connection failed, when the send queue's room no longer
 * matters.
 */
static void handle_wc(struct fab_con *c, const struct ibv_wc *wc)
{
	bool recv = wc->opcode & IBV_WC_RECV;

	if (wc->status != IBV_WC_SUCCESS) {
		if (atomic_load(&c->down) || atomic_load(&c->shutdown))
			return; /* flushes after the connection went away */
		if (wc->status != IBV_WC_WR_FLUSH_ERR)
			log_err_rl("%s: completion error: %s (vendor error 0x%x)", c->name,
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
	if (!is_rx_buf(c, wc->wr_id)) {
		log_err_rl("%s: receive completion with an unknown buffer", c->name);
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

/* A CM event on the connection's own channel. */
static void handle_cm(struct fab_con *c)
{
	struct rdma_cm_event *ev;
	uint8_t data[UINT8_MAX + 1]; /* private_data_len is a byte */

	while (rdma_get_cm_event(c->ch, &ev) == 0) {
		enum rdma_cm_event_type type = ev->event;
		int status = ev->status;
		size_t len = ev->param.conn.private_data_len;

		if (len && ev->param.conn.private_data)
			memcpy(data, ev->param.conn.private_data, len);
		else
			len = 0;
		rdma_ack_cm_event(ev);
		if (atomic_load(&c->down))
			continue;
		switch (type) {
		case RDMA_CM_EVENT_ESTABLISHED:
			c->cfg.ops->connected(c->cfg.priv, data, len);
			break;
		case RDMA_CM_EVENT_REJECTED:
			/*
			 * A consumer's reject carries its data; the CM's own (no
			 * listener on the port, a timeout) carries padding.
			 */
			if (!c->fab->iwarp && status != RDMA_IB_REJ_CONSUMER)
				len = 0;
			log_dbg("%s: rejected (status %d, %zu bytes)", c->name, status, len);
			if (!len) {
				char local[64];

				/* No server's answer: the CM's own (on iWARP, an MPA reject or a close). */
				sockaddr_str(rdma_get_local_addr(c->id), local, sizeof(local));
				if (c->fab->iwarp && status < 0)
					log_warn_rl("%s: refused by the peer's connection manager, not "
						    "by a server (%s, from %s)", c->name,
						    strerror(-status), local);
				else if (!c->fab->iwarp && status == RDMA_IB_REJ_NO_LISTENER)
					log_warn_rl("%s: refused from %s: nothing listens at the "
						    "destination", c->name, local);
				else
					log_warn_rl("%s: refused by the peer's connection manager, not "
						    "by a server (reject reason %d, from %s)", c->name,
						    status, local);
			}
			con_down(c, -ECONNREFUSED, len ? data : NULL, len);
			break;
		case RDMA_CM_EVENT_UNREACHABLE:
		case RDMA_CM_EVENT_CONNECT_ERROR:
			log_dbg("%s: %s (status %d)", c->name, rdma_event_str(type), status);
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
			log_dbg("%s: ignoring %s", c->name, rdma_event_str(type));
		}
	}
}

/* Takes the completion channel's events; the CQ is to be armed again. */
static void cc_drain(struct fab_con *c)
{
	struct ibv_cq *cq;
	void *ctx;

	while (ibv_get_cq_event(c->cc, &cq, &ctx) == 0) {
		if (++c->cq_unacked >= RDMA_CQ_ACK_BATCH) {
			ibv_ack_cq_events(c->cq, c->cq_unacked);
			c->cq_unacked = 0;
		}
	}
}

/*
 * The completion thread: reads the CQ until it is empty, arms it, reads
 * once more (what came between the last read and the arming), then sleeps
 * on the completion channel, the CM channel and the kick eventfd.
 */
static void *con_thread(void *arg)
{
	struct fab_con *c = arg;
	bool armed = false;
	unsigned laps = 0;

	/* Under the lock: a rename before this thread got here is not undone. */
	pthread_mutex_lock(&c->name_lock);
	pthread_setname_np(pthread_self(), c->tname);
	pthread_mutex_unlock(&c->name_lock);
	while (!atomic_load(&c->stop)) {
		int n;

		if (atomic_load(&c->shutdown)) {
			/* Shut down: nothing of it matters any more. Wait to be stopped. */
			struct pollfd pw = { .fd = c->wake_fd, .events = POLLIN };
			uint64_t v;

			if (poll(&pw, 1, 1000) > 0 && read(c->wake_fd, &v, sizeof(v)) < 0 &&
			    errno != EAGAIN)
				log_warn("%s: eventfd read: %s", c->name, strerror(errno));
			continue;
		}
		int early = atomic_exchange(&c->early_err, 0);

		if (early)
			con_down(c, early, NULL, 0);
		n = ibv_poll_cq(c->cq, RDMA_CQ_BATCH, c->wcs);
		if (n < 0) {
			log_err("%s: polling the completion queue failed", c->name);
			con_down(c, -EIO, NULL, 0);
			n = 0;
		}
		for (int i = 0; i < n; i++)
			handle_wc(c, &c->wcs[i]);
		/* A busy connection still hears of a disconnect. */
		if (n > 0 && (++laps & 63) == 0)
			handle_cm(c);
		bool kick = atomic_exchange(&c->kicked, false);

		/* Retries after -EAGAIN: on any completion, else after 1 ms. */
		if (n > 0 && atomic_exchange(&c->retry, false))
			kick = true;
		if (kick && !atomic_load(&c->down))
			c->cfg.ops->kick(c->cfg.priv);
		if (n > 0 || kick)
			continue;
		if (c->poll_ns && !armed) {
			/* Busy-poll a while before sleeping: a wake-up costs more than a short spin. */
			struct timespec t;
			uint64_t until, now;

			clock_gettime(CLOCK_MONOTONIC, &t);
			until = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec + c->poll_ns;
			do {
				n = ibv_poll_cq(c->cq, RDMA_CQ_BATCH, c->wcs);
				clock_gettime(CLOCK_MONOTONIC, &t);
				now = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
			} while (n == 0 && now < until && !atomic_load(&c->kicked) &&
				 !atomic_load(&c->stop));
			for (int i = 0; i < n; i++)
				handle_wc(c, &c->wcs[i]);
			if (n != 0 || atomic_load(&c->kicked))
				continue;
		}
		if (!armed) {
			if (ibv_req_notify_cq(c->cq, 0)) {
				log_err("%s: arming the completion queue failed", c->name);
				con_down(c, -EIO, NULL, 0);
			}
			armed = true;
			continue;
		}
		struct epoll_event evs[3];
		bool retry = atomic_load(&c->retry);
		int ne = epoll_wait(c->epfd, evs, ARRAY_SIZE(evs), retry ? 1 : 10000);

		if (ne == 0 && retry && atomic_exchange(&c->retry, false))
			atomic_store(&c->kicked, true);
		for (int i = 0; i < ne; i++) {
			uint64_t v;

			if (evs[i].data.fd == c->cc->fd) {
				cc_drain(c);
				armed = false;
			} else if (evs[i].data.fd == c->ch->fd) {
				handle_cm(c);
			} else if (evs[i].data.fd == c->wake_fd &&
				   read(c->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN) {
				log_warn("%s: eventfd read: %s", c->name, strerror(errno));
			}
		}
	}
	return NULL;
}

static void con_free(struct fab_con *c)
{
	if (c->thread_started) {
		uint64_t one = 1;

		atomic_store(&c->stop, true);
		if (write(c->wake_fd, &one, sizeof(one)) < 0)
			log_warn("%s: eventfd write: %s", c->name, strerror(errno));
		pthread_join(c->thread, NULL);
	}
	if (c->qp_made)
		rdma_destroy_qp(c->id);
	if (c->id && c->own_id)
		rdma_destroy_id(c->id);
	if (c->cq) {
		if (c->cq_unacked)
			ibv_ack_cq_events(c->cq, c->cq_unacked);
		ibv_destroy_cq(c->cq);
	}
	if (c->cc)
		ibv_destroy_comp_channel(c->cc);
	if (c->ch)
		rdma_destroy_event_channel(c->ch);
	if (c->rx.mr)
		ibv_dereg_mr(c->rx.mr);
	free(c->rx.buf);
	pthread_mutex_destroy(&c->rx_lock);
	pthread_mutex_destroy(&c->tx_lock);
	pthread_mutex_destroy(&c->name_lock);
	free(c->tx_fifo);
	if (c->epfd >= 0)
		close(c->epfd);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c);
}

static int epoll_add(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

/* Wakes the thread from its sleep. */
static void con_wake(struct fab_con *c)
{
	uint64_t one = 1;

	if (write(c->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("%s: eventfd write: %s", c->name, strerror(errno));
}

/* A connection object with its channels and fds; no id, CQ or QP yet. */
static int con_new(struct fab *f, const struct fab_con_cfg *cfg, struct fab_con **out)
{
	struct fab_con *c = calloc(1, sizeof(*c));
	int rc;

	if (!c)
		return -ENOMEM;
	c->ops = &fab_rdma_ops;
	c->fab = f;
	c->cfg = *cfg;
	c->wake_fd = c->epfd = -1;
	snprintf(c->name_made, sizeof(c->name_made), "%s", cfg->name);
	atomic_init(&c->name, c->name_made);
	snprintf(c->tname, sizeof(c->tname), "%.15s", cfg->name);
	pthread_mutex_init(&c->name_lock, NULL);
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_mutex_init(&c->tx_lock, NULL);
	c->poll_ns = (uint64_t)cfg->poll_us * 1000;
	c->ch = channel_open();
	c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (!c->ch || c->wake_fd < 0 || c->epfd < 0) {
		rc = errno ? -errno : -ENOMEM;
		con_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

/* The CQ and the QP on c->id (which is resolved, or a request's), and the receive pool. */
static int con_qp(struct fab_con *c)
{
	struct fab *f = c->fab;
	const struct fab_con_cfg *cfg = &c->cfg;
	struct ibv_qp_init_attr qa = { 0 };
	size_t tx = MIN(MAX(cfg->tx_depth, 16), f->attr.max_queue);
	size_t rx_depth = cfg->rx_depth;
	size_t rxq = MIN(MAX(MAX(rx_depth, cfg->rx_queue), 16), f->attr.max_queue);
	int rc;

	if (c->id->verbs != f->verbs) {
		log_err("%s: the route goes through another RDMA device (%s)", c->name,
			c->id->verbs ? ibv_get_device_name(c->id->verbs->device) : "?");
		return -ENODEV;
	}
	if (rx_depth > rxq) {
		log_warn("%s: %zu receives wanted, the device grants %zu", c->name, rx_depth, rxq);
		rx_depth = rxq;
	}
	c->cc = ibv_create_comp_channel(f->verbs);
	if (!c->cc)
		return errno ? -errno : -ENOMEM;
	rc = set_nonblock(c->cc->fd);
	if (rc)
		return rc;
	c->cq = ibv_create_cq(f->verbs, (int)(tx + rxq + 16), c, c->cc, 0);
	if (!c->cq) {
		rc = errno ? -errno : -ENOMEM;
		log_err("%s: ibv_create_cq: %s", c->name, strerror(-rc));
		return rc;
	}
	qa.send_cq = c->cq;
	qa.recv_cq = c->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = (uint32_t)tx;
	qa.cap.max_recv_wr = (uint32_t)rxq;
	qa.cap.max_send_sge = (uint32_t)f->attr.iov_limit;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = RDMA_INLINE;
	if (rdma_create_qp(c->id, f->pd, &qa)) {
		rc = -errno;
		log_err("%s: rdma_create_qp (send %zu, receive %zu): %s", c->name, tx, rxq,
			strerror(-rc));
		return rc;
	}
	c->qp_made = true;
	if (qa.cap.max_inline_data < RDMA_INLINE) {
		log_err("%s: the device grants %u inline bytes, %d needed", c->name,
			qa.cap.max_inline_data, RDMA_INLINE);
		return -EOPNOTSUPP;
	}
	c->max_inline = qa.cap.max_inline_data;
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

/* Starts the thread; *out is set first, since callbacks read it from the first event. */
static int con_start(struct fab_con *c, struct fab_con **out)
{
	int rc = epoll_add(c->epfd, c->cc->fd);

	if (!rc)
		rc = epoll_add(c->epfd, c->ch->fd);
	if (!rc)
		rc = epoll_add(c->epfd, c->wake_fd);
	if (rc)
		return rc;
	*out = c;
	c->thread_started = true;
	rc = -pthread_create(&c->thread, NULL, con_thread, c);
	if (rc) {
		c->thread_started = false;
		*out = NULL;
	}
	return rc;
}

/*
 * The CM id of c, resolved, with its QP and thread, connecting: 0 when
 * under way (*out is c), or a negative errno with c freed, but for
 * -EADDRNOTAVAIL from rdma_connect, where c is left to the caller.
 */
static int nat_con_connect_id(struct fab *f, struct fab_con *c, struct rdma_conn_param *param,
			      struct fab_con **out)
{
	int rc;

	if (rdma_create_id(c->ch, &c->id, c, RDMA_PS_TCP)) {
		rc = -errno;
		goto fail;
	}
	c->own_id = true;
	rc = id_resolve(c->ch, c->id, f, true);
	if (rc) {
		log_err("%s: resolving the address: %s", c->name, strerror(-rc));
		goto fail;
	}
	rc = con_qp(c);
	if (rc)
		goto fail;
	rc = con_start(c, out);
	if (rc)
		goto fail;
	if (!rdma_connect(c->id, param))
		return 0;
	rc = -errno;
	if (rc == -ECONNREFUSED) {
		/*
		 * iWARP connects the TCP socket here, and nobody listening is
		 * said at once; the owner hears it as on IB and RoCE, from the
		 * thread, as a refusal.
		 */
		char local[64];

		sockaddr_str(rdma_get_local_addr(c->id), local, sizeof(local));
		log_warn_rl("%s: refused at once from %s: nothing listens at the destination",
			    c->name, local);
		atomic_store(&c->early_err, rc);
		con_wake(c);
		return 0;
	}
	*out = NULL;
	if (rc == -EADDRNOTAVAIL)
		return rc;
	log_err("%s: rdma_connect: %s", c->name, strerror(-rc));
fail:
	con_free(c);
	return rc;
}

static int nat_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			    size_t len, struct fab_con **out)
{
	struct rdma_conn_param param = {
		.private_data = data, .private_data_len = (uint8_t)len,
		.retry_count = 7, .rnr_retry_count = 7,
	};
	struct fab_con *c;
	int rc;

	if (f->server)
		return -EINVAL;
	if (len > pdata_max(f, 0)) {
		log_err("%s: %zu bytes of connection data exceed the provider's %zu", cfg->name,
			len, pdata_max(f, 0));
		return -EMSGSIZE;
	}
	/*
	 * iWARP binds the TCP socket to a port the RDMA CM picked from its own
	 * space, which knows nothing of the kernel's sockets in TIME_WAIT: a
	 * pick that meets one fails the connect with -EADDRNOTAVAIL (seen on
	 * siw, a session opened among hundreds closed just before). A new CM
	 * id picks another port: a few tries, then the error.
	 */
	for (unsigned tries = 1;; tries++) {
		rc = con_new(f, cfg, &c);
		if (rc)
			return rc;
		rc = nat_con_connect_id(f, c, &param, out);
		if (rc != -EADDRNOTAVAIL)
			return rc;
		con_free(c);
		if (tries == NAT_CONNECT_PORT_TRIES) {
			log_err("%s: rdma_connect: %s (%u ports tried)", cfg->name, strerror(-rc),
				tries);
			return rc;
		}
		log_dbg("%s: rdma_connect: %s; again from another port", cfg->name,
			strerror(-rc));
	}
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
	rc = con_new(f, cfg, &c);
	if (rc)
		return rc;
	c->id = req->id;
	rc = con_qp(c);
	if (rc)
		goto fail;
	if (rdma_migrate_id(c->id, c->ch)) {
		rc = -errno;
		goto fail;
	}
	migrated = true;
	rc = con_start(c, out);
	if (rc)
		goto fail;
	if (rdma_accept(c->id, &param)) {
		rc = -errno;
		log_err("%s: rdma_accept: %s", c->name, strerror(-rc));
		*out = NULL;
		goto fail;
	}
	/* The connection owns the request's id from here on. */
	c->own_id = true;
	req->answered = true;
	req->accepted = true;
	return 0;

fail:
	/*
	 * The id stays the listener's, which refuses and frees it: back on
	 * the listener's channel first, since ours closes with the connection
	 * (and closing a channel destroys the ids on it).
	 */
	if (migrated && rdma_migrate_id(c->id, f->lch))
		log_err("%s: handing the request back to the listener: %s", c->name,
			strerror(errno));
	con_free(c);
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
	atomic_store(&c->retry, true);
}

static void nat_con_kick(struct fab_con *c)
{
	if (!atomic_exchange(&c->kicked, true))
		con_wake(c);
}

static void nat_con_shutdown(struct fab_con *c)
{
	if (!c || atomic_exchange(&c->shutdown, true))
		return;
	/* Flushes the queue pair; the peer sees a disconnect. */
	if (c->id)
		rdma_disconnect(c->id);
}

static void nat_con_destroy(struct fab_con *c)
{
	if (!c)
		return;
	atomic_store(&c->shutdown, true);
	con_free(c);
}

static void nat_con_rename(struct fab_con *c, const char *name)
{
	pthread_mutex_lock(&c->name_lock);
	if (!c->renamed) {
		snprintf(c->name_later, sizeof(c->name_later), "%s", name);
		atomic_store_explicit(&c->name, c->name_later, memory_order_release);
		c->renamed = true;
	}
	snprintf(c->tname, sizeof(c->tname), "%.15s", name);
	if (c->thread_started)
		pthread_setname_np(c->thread, c->tname);
	pthread_mutex_unlock(&c->name_lock);
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
static int post_send(struct fab_con *c, struct ibv_send_wr *first, struct ibv_send_wr **bad)
{
	static const struct timespec zero;
	sigset_t pipe_set, old, pending;
	bool was_pending;
	int rc;

	if (!c->fab->sigpipe_guard)
		return ibv_post_send(c->id->qp, first, bad);
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE);
	rc = ibv_post_send(c->id->qp, first, bad);
	if (!was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
		while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
			;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
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
	if (rc) {
		for (struct ibv_send_wr *w = bad; w; w = w->next)
			unposted++;
		if (!bad)
			unposted = n;
	}
	tx_account(c, n, unposted, sig);
	pthread_mutex_unlock(&c->tx_lock);
	if (rc)
		return rc == ENOMEM ? -EAGAIN : -rc;
	return 0;
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
	rc = ibv_bind_mw(c->id->qp, w->priv, &b);
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
	 * Control messages go out from service threads, never from this
	 * connection's completion thread, so waiting for room is safe here.
	 */
	for (int tries = 0;; tries++) {
		rc = tx_reserve(c, 1);
		if (!rc)
			rc = post_chain(c, &wr, &wr, 1);
		if (rc != -EAGAIN || tries == 1000 || pthread_equal(pthread_self(), c->thread))
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
