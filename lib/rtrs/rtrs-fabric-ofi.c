/* SPDX-License-Identifier: MIT */
/*
 * The fabric layer over libfabric: the only file in the project that calls
 * fi_*. Behaviour it relies on was measured with libfabric 1.17 (the tcp
 * provider: docs/architecture.md section 6); the rules that shape this file:
 *   - one set of hints for tcp and verbs; act only on what comes back;
 *   - the tcp provider progresses only while a thread reads the CQ, and CM
 *     events only inside fi_eq_read: every connection has a thread that
 *     blocks (fd + fi_trywait + epoll) and reads both;
 *   - never busy-poll;
 *   - classify completions by FI_REMOTE_WRITE, errors by op_context only;
 *   - memory keys come from per-domain counters when the provider does not
 *     choose them, passed through a keyed permutation (keyperm.h) so that
 *     no peer can infer one key from another: 32-bit keys come round after
 *     2^31 - 1 registrations and skip keys still in use; 64-bit keys
 *     (FAB_MR_KEY64) never repeat.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "keyperm.h"
#include "log.h"
#include "rtrs-fabric.h"
#include "util.h"

#define FAB_API_VERSION FI_VERSION(1, 17)
/*
 * Completions read at a time. More than one progress round can add: the tcp
 * provider reads up to its 9000-byte prefetch buffer per round and reports
 * each write with immediate (48 bytes on the wire, 24 at the least) to the
 * CQ, overflowing into a list it allocates; a smaller batch lets a peer
 * that floods immediates grow that list without bound.
 */
#define FAB_CQ_BATCH 512
#define FAB_SIG_EVERY_MAX 64u   /* at most this many counted sends without a completion in a row */
#define FAB_CM_BUF 256 /* >= any provider's FI_OPT_CM_DATA_SIZE we accept */
#define RTRS_CM_DATA_MAX_PORTABLE 55 /* verbs: 56 minus the provider's header */
#define FAB_IMM_MSG_LEN 4 /* an immediate carried as a message */

struct fab {
	const struct fab_ops *ops; /* first: struct fab_obj */
	struct fi_info *info;
	struct fid_fabric *fabric;
	/*
	 * The domain, and how many objects on it are open (connections, each
	 * with its endpoint and CQ, and memory registrations), under
	 * dom_lock. fab_trim closes it while nothing is open, which frees
	 * what the provider keeps for objects long gone (its MR map's tree
	 * nodes); the next object opens it again (dom_hold).
	 */
	pthread_mutex_t dom_lock;
	struct fid_domain *domain;
	unsigned dom_users;
	struct fab_attr attr;
	bool prov_key;
	bool imm_by_send;   /* no remote CQ data: immediates travel as messages */
	bool tx_counted;    /* the provider queues sends without bound: count them */
	atomic_uint_fast64_t next_key;   /* 32-bit keys: counter, round and round */
	atomic_uint_fast64_t next_key64; /* FAB_MR_KEY64: counter from 2^32, never again */
	struct keyperm keys;             /* the domain's secret permutation of both */
};

/* A socket the provider accepted that has not sent its connection request. */
struct lst_raw {
	unsigned long ino;  /* the socket's inode: fd numbers come round again */
	int fd;
	uint64_t since_ms;
	bool spoke;         /* bytes wait in it: its request came, the provider reads it next */
	char peer[INET6_ADDRSTRLEN];
};

struct fab_lst {
	const struct fab_ops *ops;
	struct fab *fab;
	struct fid_pep *pep;
	struct fid_eq *eq;
	int fd;
	int port;
	/* Raw connections at the listener (lst_sweep); the loop thread only. */
	struct fab_lst_limits lim;
	struct lst_raw *raw;
	size_t nr_raw;
	uint64_t last_sweep_ms;
	unsigned unswept;   /* lst_process rounds since the last sweep */
	uint64_t closed;
	int info_fd;        /* /proc/self/fdinfo/<fd>, open for good: fds may run out */
	char *info_buf;
	size_t info_cap;
};

struct fab_connreq {
	const struct fab_ops *ops;
	struct fi_info *info;
};

struct fab_rx {
	char *buf;
	struct fab_mr mr;
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
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_eq *eq;
	bool dom_held;      /* one of the fab's domain users (dom_hold) */
	int cq_fd, eq_fd, wake_fd, epfd;
	struct fab_rx rx;
	pthread_t thread;
	bool thread_started;
	atomic_bool stop;
	atomic_bool down;      /* down() was called (or the owner shut us down) */
	atomic_bool shutdown;  /* fab_con_shutdown() was called */
	atomic_bool kicked;    /* ops->kick is due */
	atomic_bool retry;     /* ops->kick again after a short wait */
	atomic_uint tx_posted; /* tx_counted: posted and not completed */
	unsigned tx_max;       /* ... at most this many (the granted tx size) */
	atomic_uint tx_unsig;  /* counted sends without a ctx so far (tx_comp) */
	unsigned tx_sig_every; /* ... every this many asks for a completion */
	char tx_sig_mark;      /* the context of those completions: its address */
	pthread_mutex_t rx_lock; /* rx pool set up from another thread */
	/* Whoever reads the CQ and runs callbacks: the thread, or a poller. */
	pthread_mutex_t cq_lock;
	_Atomic(struct fab_poller *) poller; /* fab_con_set_poller */
	/* The thread's: the poller's sleeps at its last yielded lap, if it was asleep. */
	unsigned yield_sleeps;
	bool yield_asleep;
	atomic_bool poll_eq_due;  /* a poller met an error: the thread reads the EQ */
	struct fi_cq_data_entry comps[FAB_CQ_BATCH]; /* the thread's, too big for its stack */
	/* The flood watchdog (wd_*): its list, and what it saw of this thread. */
	struct fab_con *wd_next, *wd_prev;
	bool wd_listed;
	atomic_uint_fast64_t read_since_ms; /* the thread is in fi_cq_read since; 0: not */
	uint64_t wd_seen_since;
	uint64_t wd_cpu0_ns;
	atomic_bool flooded;
	/* The thread's: reads without a completion after a wake by the CQ (con_dry_lap). */
	uint64_t dry_laps;
	uint64_t dry_cpu0_ns;
};

static int ofi_con_rx_setup(struct fab_con *c, size_t count, size_t size);
static bool raw_is_waiting_socket(int fd);

/*
 * The flood watchdog. The tcp provider reads a connection's socket inside
 * fi_cq_read for as long as the socket has data, and queues a completion
 * for every write with immediate it meets (allocating past the CQ's size):
 * a peer that sends immediates faster than we take them keeps our thread
 * in one fi_cq_read for ever while that queue grows. No well-behaved peer
 * can: it has at most a queue depth of requests out before it needs our
 * answers, which need fi_cq_read to return. So a thread that burns
 * FAB_READ_CPU_MAX_MS of CPU in one fi_cq_read is being flooded; one
 * watchdog thread per process looks at them and resets the connection's
 * socket, which ends the read. CPU time, not wall time: a thread that is
 * merely preempted on a busy machine is no flood. While a look finds some
 * thread in a read, the next comes FAB_WD_TICK_MS later; while it finds
 * none, once the process has used FAB_WD_TICK_MS more of CPU (its CPU
 * clock, which the kernel reads at its scheduler tick): a flood burns CPU
 * and so wakes the watchdog within a tick or two, while an idle process
 * with many sessions does not wake it at all (it woke 200 times a second
 * before). Measured here (bench/RESULTS.md), the longest read of
 * well-behaved traffic took 3 ms of CPU (128 KiB writes at queue depth 64,
 * 4 KiB at 512); a flood queues about 80 bytes of completions per 48 read,
 * some 10 MB in 15 ms.
 */
#define FAB_READ_CPU_MAX_MS 15
#define FAB_WD_TICK_MS 5

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;        /* the first connection wakes an idle watchdog */
	struct fab_con *head;
} wd = { .lock = PTHREAD_MUTEX_INITIALIZER };

static uint64_t thread_cpu_ns(pthread_t t)
{
	struct timespec ts;
	clockid_t cid;

	if (pthread_getcpuclockid(t, &cid) || clock_gettime(cid, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Resets the sockets in the connection's CQ wait set: its endpoint's. A
 * shutdown would not do: the peer's data still queues behind it, and the
 * provider goes on reading. connect() to AF_UNSPEC disconnects a TCP
 * socket at once: its queues are dropped, the peer gets a reset, and the
 * next read fails.
 */
static void con_kill_sockets(struct fab_con *c)
{
	char path[64], line[256];
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", c->cq_fd);
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		int fd;

		if (sscanf(line, "tfd: %d", &fd) == 1 && raw_is_waiting_socket(fd)) {
			struct sockaddr sa = { .sa_family = AF_UNSPEC };

			if (connect(fd, &sa, sizeof(sa)))
				shutdown(fd, SHUT_RDWR);
		}
	}
	fclose(f);
}

/* Looks at c; returns whether its thread is in a read. */
static bool wd_check(struct fab_con *c)
{
	uint64_t since = atomic_load_explicit(&c->read_since_ms, memory_order_relaxed);
	uint64_t cpu, ms;

	if (!since || atomic_load(&c->flooded) || !c->thread_started)
		return since != 0;
	cpu = thread_cpu_ns(c->thread);
	if (since != c->wd_seen_since) {
		/* A read the watchdog has not seen yet: its start. */
		c->wd_seen_since = since;
		c->wd_cpu0_ns = cpu;
		return true;
	}
	ms = (cpu - c->wd_cpu0_ns) / 1000000;
	if (ms < FAB_READ_CPU_MAX_MS)
		return true;
	if (atomic_exchange(&c->flooded, true))
		return true;
	log_err_rl("%s: the peer sends faster than it may (one completion read took %llu ms "
		   "of CPU): closing the connection", c->name, (unsigned long long)ms);
	con_kill_sockets(c);
	return true;
}

/*
 * The flood the watchdog cannot see: writes that make no completion (no
 * immediate), sent no faster than the reader takes them. Each read ends
 * soon, finding nothing, and the thread wakes again at once for the next
 * bytes: no read is long, but the thread burns CPU for as long as the
 * peer likes. A peer of this project or the kernel's never sends that:
 * each of its requests and messages makes a completion here, so a wake
 * by the CQ that reads none is a message still arriving in pieces (a
 * large write on a slow path takes some hundreds of wakes, each of a few
 * microseconds). After FAB_DRY_LAPS such reads in a row the thread notes
 * its CPU time, and every FAB_DRY_LAPS reads after looks again (a system
 * call per FAB_DRY_LAPS, none on the common path): FAB_DRY_CPU_MAX_MS of
 * CPU without a completion closes the connection as the watchdog does.
 */
#define FAB_DRY_LAPS 256
#define FAB_DRY_CPU_MAX_MS 50

static void con_dry_lap(struct fab_con *c)
{
	struct timespec ts;
	uint64_t cpu, ms;

	if (++c->dry_laps % FAB_DRY_LAPS || atomic_load(&c->flooded) ||
	    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts))
		return;
	cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (c->dry_laps == FAB_DRY_LAPS) {
		c->dry_cpu0_ns = cpu;
		return;
	}
	ms = (cpu - c->dry_cpu0_ns) / 1000000;
	if (ms < FAB_DRY_CPU_MAX_MS)
		return;
	/* As wd_check: the same flag, so only one of the two says it. */
	if (atomic_exchange(&c->flooded, true))
		return;
	log_err_rl("%s: the peer sends faster than it may (%llu reads found no completion, "
		   "%llu ms of CPU): closing the connection", c->name,
		   (unsigned long long)c->dry_laps, (unsigned long long)ms);
	con_kill_sockets(c);
}

/*
 * Until the process has used FAB_WD_TICK_MS more of CPU, without the lock.
 * Where the kernel will not sleep on that clock (a sandbox that filters
 * it), false from then on: the caller ticks on the wall clock instead.
 */
static bool wd_cpu_sleep(void)
{
	static const struct timespec tick = { 0, FAB_WD_TICK_MS * 1000000L };
	static bool refused;
	int rc;

	if (refused)
		return false;
	pthread_mutex_unlock(&wd.lock);
	rc = clock_nanosleep(CLOCK_PROCESS_CPUTIME_ID, 0, &tick, NULL);
	pthread_mutex_lock(&wd.lock);
	if (rc && rc != EINTR) {
		log_warn("fabric: the flood watchdog cannot sleep on the process's CPU clock (%s): "
			 "it looks every %d ms instead", strerror(rc), FAB_WD_TICK_MS);
		refused = true;
		return false;
	}
	return true;
}

_Static_assert(FAB_WD_TICK_MS < 1000, "the watchdog's tick is a timespec's nanoseconds");

/*
 * The watchdog lives as long as the process once started (a thread that
 * stops and starts with the connections would race its own restart); with
 * no connection to watch it sleeps until one comes. Between looks it
 * waits FAB_WD_TICK_MS, or, when no thread was in a read, sleeps on the
 * process's CPU clock without the lock (connections come and go then).
 */
static void *wd_thread(void *arg)
{
	pthread_setname_np(pthread_self(), "rtrs-fabric-wd");
	pthread_mutex_lock(&wd.lock);
	for (;;) {
		if (!wd.head) {
			pthread_cond_wait(&wd.cond, &wd.lock);
			continue;
		}
		bool reading = false;

		for (struct fab_con *c = wd.head; c; c = c->wd_next)
			reading |= wd_check(c);
		if (!reading && wd_cpu_sleep())
			continue;
		struct timespec dl = deadline_ms(FAB_WD_TICK_MS);

		pthread_cond_timedwait(&wd.cond, &wd.lock, &dl);
	}
	pthread_mutex_unlock(&wd.lock);
	return arg;
}

static void wd_start(void)
{
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	cond_init_mono(&wd.cond);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &attr, wd_thread, NULL);
	pthread_attr_destroy(&attr);
	if (rc)
		log_warn("fabric: no flood watchdog: %s", strerror(rc));
}

/* Watches c from now on. */
static void wd_add(struct fab_con *c)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, wd_start);
	pthread_mutex_lock(&wd.lock);
	if (!wd.head)
		pthread_cond_signal(&wd.cond);
	c->wd_prev = NULL;
	c->wd_next = wd.head;
	if (wd.head)
		wd.head->wd_prev = c;
	wd.head = c;
	c->wd_listed = true;
	pthread_mutex_unlock(&wd.lock);
}

/* Stops watching c (under the lock: the watchdog never sees it freed). */
static void wd_del(struct fab_con *c)
{
	pthread_mutex_lock(&wd.lock);
	if (!c->wd_listed) {
		pthread_mutex_unlock(&wd.lock);
		return;
	}
	if (c->wd_prev)
		c->wd_prev->wd_next = c->wd_next;
	else
		wd.head = c->wd_next;
	if (c->wd_next)
		c->wd_next->wd_prev = c->wd_prev;
	c->wd_listed = false;
	pthread_mutex_unlock(&wd.lock);
}

/* Translate a libfabric return value (negative FI_E*) to a negative errno. */
static int fab_errno(ssize_t rc)
{
	if (rc >= 0)
		return 0;
	switch (-rc) {
	case FI_EAGAIN: return -EAGAIN;
	case FI_ETRUNC: return -EMSGSIZE;
	case FI_ENOKEY: return -ENOKEY;
	case FI_ENOAV: return -EADDRNOTAVAIL;
	case FI_EOVERRUN: return -EOVERFLOW;
	case FI_ENOCQ: case FI_ENOEQ: return -ENOENT;
	case FI_EOTHER: case FI_EAVAIL: case FI_EBADFLAGS: return -EIO;
	default:
		/* The common FI_E* codes alias errno values. */
		return -rc < FI_ERRNO_OFFSET ? (int)rc : -EIO;
	}
}

static const char *fab_strerror(ssize_t rc)
{
	return fi_strerror((int)(rc < 0 ? -rc : rc));
}

static void sockaddr_str(const void *sa, char *buf, size_t len)
{
	const struct sockaddr *s = sa;
	char host[INET6_ADDRSTRLEN] = "?";

	if (!sa) {
		snprintf(buf, len, "?");
		return;
	}
	if (s->sa_family == AF_INET) {
		const struct sockaddr_in *in = sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
	} else if (s->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "family-%d", s->sa_family);
	}
}

/* ---- fabric and domain --------------------------------------------------- */

static struct fi_info *fab_hints(const char *prov)
{
	struct fi_info *h = fi_allocinfo();

	if (!h)
		return NULL;
	/*
	 * A request split over several writes relies on write-after-write
	 * order; a fence ack on the key table written before it, on
	 * send-after-write order.
	 */
	h->tx_attr->msg_order = FI_ORDER_WAW | FI_ORDER_RMA_WAW | FI_ORDER_SAW;
	h->ep_attr->type = FI_EP_MSG;
	h->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE;
	/*
	 * No FI_CONTEXT: operations without a requested completion pass the
	 * connection as context, which a provider needing FI_CONTEXT forbids.
	 */
	h->mode = FI_RX_CQ_DATA;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				  FI_MR_PROV_KEY;
	h->domain_attr->cq_data_size = 4;
	h->domain_attr->threading = FI_THREAD_SAFE;
	h->fabric_attr->prov_name = strdup(prov);
	if (!h->fabric_attr->prov_name) {
		fi_freeinfo(h);
		return NULL;
	}
	return h;
}

/* Puts a numeric or named source address into the hints. */
static int hints_set_src(struct fi_info *h, const char *src)
{
	struct addrinfo ai = { .ai_socktype = SOCK_STREAM }, *res;
	int rc = getaddrinfo(src, NULL, &ai, &res);

	if (rc) {
		log_err("fabric: source address %s: %s", src, gai_strerror(rc));
		err_detail("cannot resolve the source address %s: %s", src, gai_strerror(rc));
		return -EINVAL;
	}
	h->src_addr = malloc(res->ai_addrlen);
	if (!h->src_addr) {
		freeaddrinfo(res);
		return -ENOMEM;
	}
	memcpy(h->src_addr, res->ai_addr, res->ai_addrlen);
	h->src_addrlen = res->ai_addrlen;
	h->addr_format = res->ai_family == AF_INET6 ? FI_SOCKADDR_IN6 : FI_SOCKADDR_IN;
	freeaddrinfo(res);
	return 0;
}

/*
 * libfabric's registration cache (the verbs provider has one on by
 * default): closing an MR only returns it to the cache, and registering the
 * same buffer again hands back the same MR, key and all. A revoked chunk key
 * (always_invalidate) would then work again; so the cache is off in every
 * process that uses this library. libfabric reads the setting when it first
 * initialises, which is the first fi_getinfo: here.
 */
static void mr_cache_off(void)
{
	setenv("FI_MR_CACHE_MAX_COUNT", "0", 1);
}

/*
 * fi_getinfo says only "no data" whether the provider is missing or the
 * address does not resolve: a name that does not resolve is -ENXIO (and
 * logged with the resolver's reason), anything else -ENODEV.
 */
static int no_provider_errno(const char *node, const char *service)
{
	struct addrinfo ai = { .ai_socktype = SOCK_STREAM }, *res = NULL;
	int rc;

	if (!node)
		return -ENODEV;
	rc = getaddrinfo(node, service, &ai, &res);
	if (res)
		freeaddrinfo(res);
	if (!rc)
		return -ENODEV;
	log_err("fabric: %s: %s", node, gai_strerror(rc));
	err_detail("cannot resolve %s: %s", node, gai_strerror(rc));
	return rc == EAI_SYSTEM ? -errno : -ENXIO;
}

static int ofi_open(const char *prov, const char *src, const char *node, const char *service,
		    bool server, size_t queue, struct fab **out)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	struct fi_info *hints;
	struct fab *f;
	int rc;

	pthread_once(&once, mr_cache_off);
	f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->ops = &fab_ofi_ops;
	hints = fab_hints(prov);
	if (!hints) {
		free(f);
		return -ENOMEM;
	}
	if (src && *src) {
		rc = hints_set_src(hints, src);
		if (rc) {
			fi_freeinfo(hints);
			free(f);
			return rc;
		}
	}
	/*
	 * Ask for the queue sizes we will use: verbs checks endpoints against
	 * what fi_getinfo returned (384 by default); a provider that cannot
	 * grant them is asked again with its defaults, and connections clamp.
	 * A provider without 4-byte remote CQ data (iWARP: siw) is taken next,
	 * with immediates carried as messages that follow their write.
	 */
	for (int attempt = 0; attempt < 4; attempt++) {
		bool sized = !(attempt & 1), imm = attempt < 2;

		if ((!queue && !sized) || f->info)
			continue;
		hints->tx_attr->size = sized ? queue : 0;
		hints->rx_attr->size = sized ? queue : 0;
		hints->domain_attr->cq_data_size = imm ? 4 : 0;
		hints->mode = imm ? FI_RX_CQ_DATA : 0;
		rc = fi_getinfo(FAB_API_VERSION, node, service, server ? FI_SOURCE : 0, hints,
				&f->info);
		if (rc != -FI_ENODATA)
			break;
	}
	fi_freeinfo(hints);
	if (rc) {
		log_dbg("fabric: no %s provider for %s:%s: %s", prov, node ? node : "*",
			service, fab_strerror(rc));
		rc = rc == -FI_ENODATA ? no_provider_errno(node, service) : fab_errno(rc);
		free(f);
		return rc;
	}
	f->imm_by_send = f->info->domain_attr->cq_data_size < 4;
	if (f->imm_by_send && !(f->info->tx_attr->msg_order & FI_ORDER_SAW)) {
		log_err("fabric: provider %s has neither immediate data nor send-after-write order",
			prov);
		rc = -EOPNOTSUPP;
		goto out_free_info;
	}
	if (f->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		log_err("fabric: provider %s needs endpoint-bound MRs (not supported)", prov);
		rc = -EOPNOTSUPP;
		goto out_free_info;
	}
	rc = keyperm_init(&f->keys);
	if (rc) {
		log_err("fabric: no randomness for memory keys: %s", strerror(-rc));
		goto out_free_info;
	}
	rc = fi_fabric(f->info->fabric_attr, &f->fabric, NULL);
	if (rc) {
		rc = fab_errno(rc);
		goto out_free_info;
	}
	rc = fi_domain(f->fabric, f->info, &f->domain, NULL);
	if (rc) {
		rc = fab_errno(rc);
		goto out_close_fabric;
	}
	pthread_mutex_init(&f->dom_lock, NULL);

	uint64_t mm = f->info->domain_attr->mr_mode;
	struct fab_attr *a = &f->attr;

	snprintf(a->prov_name, sizeof(a->prov_name), "%s", f->info->fabric_attr->prov_name);
	a->mr_local = mm & FI_MR_LOCAL;
	a->virt_addr = mm & FI_MR_VIRT_ADDR;
	f->prov_key = mm & FI_MR_PROV_KEY;
	/* Either way, every incoming immediate then takes a posted receive. */
	a->rx_cq_data = ((f->info->mode | f->info->rx_attr->mode) & FI_RX_CQ_DATA) ||
			f->imm_by_send;
	a->imm_by_send = f->imm_by_send;
	a->iov_limit = MAX(f->info->tx_attr->iov_limit, 1);
	a->rma_iov_limit = MAX(f->info->tx_attr->rma_iov_limit, 1);
	a->max_queue = MIN(f->info->tx_attr->size, f->info->rx_attr->size);
	a->inject_size = f->info->tx_attr->inject_size;
	a->prov_key = f->prov_key;
	/*
	 * verbs has a send queue of the granted size and says -FI_EAGAIN when
	 * it is full; tcp grows its queue on demand, so there every send asks
	 * for a completion and the connection counts them (tx_reserve).
	 */
	f->tx_counted = strcmp(a->prov_name, "verbs") != 0;
	atomic_init(&f->next_key, 0);
	atomic_init(&f->next_key64, KEYPERM_KEY64_MIN);
	log_dbg("fabric: %s mr_local=%d virt_addr=%d prov_key=%d rx_cq_data=%d imm_by_send=%d iov=%zu rma_iov=%zu",
		a->prov_name, a->mr_local, a->virt_addr, f->prov_key, a->rx_cq_data,
		f->imm_by_send, a->iov_limit, a->rma_iov_limit);
	*out = f;
	return 0;

out_close_fabric:
	fi_close(&f->fabric->fid);
out_free_info:
	fi_freeinfo(f->info);
	free(f);
	return rc;
}

static void ofi_close(struct fab *f)
{
	if (!f)
		return;
	if (f->dom_users)
		log_warn("fabric: closed with %u objects open on its domain", f->dom_users);
	if (f->domain)
		fi_close(&f->domain->fid);
	pthread_mutex_destroy(&f->dom_lock);
	if (f->fabric)
		fi_close(&f->fabric->fid);
	fi_freeinfo(f->info);
	keyperm_clear(&f->keys);
	free(f);
}

static const struct fab_attr *ofi_attr(const struct fab *f)
{
	return &f->attr;
}

/* The domain for one more object, opened again if fab_trim closed it; dom_drop when it goes. */
static int dom_hold(struct fab *f, struct fid_domain **out)
{
	int rc = 0;

	pthread_mutex_lock(&f->dom_lock);
	if (!f->domain)
		rc = fi_domain(f->fabric, f->info, &f->domain, NULL);
	if (!rc) {
		f->dom_users++;
		*out = f->domain;
	}
	pthread_mutex_unlock(&f->dom_lock);
	if (rc) {
		log_err("fabric: fi_domain: %s", fab_strerror(rc));
		return fab_errno(rc);
	}
	return 0;
}

static void dom_drop(struct fab *f)
{
	pthread_mutex_lock(&f->dom_lock);
	f->dom_users--;
	pthread_mutex_unlock(&f->dom_lock);
}

static void ofi_trim(struct fab *f)
{
	pthread_mutex_lock(&f->dom_lock);
	if (f->domain && !f->dom_users) {
		int rc = fi_close(&f->domain->fid);

		if (rc) { /* something open on it that is not counted: keep it, and say so */
			log_warn("fabric: %s domain not released: %s", f->attr.prov_name,
				 fab_strerror(rc));
		} else {
			f->domain = NULL;
			log_dbg("fabric: %s domain released: nothing open on it", f->attr.prov_name);
		}
	}
	pthread_mutex_unlock(&f->dom_lock);
}

static int ofi_mr_reg(struct fab *f, void *buf, size_t len, unsigned access, struct fab_mr *mr)
{
	struct fid_domain *dom;
	struct fid_mr *fmr;
	uint64_t acc = 0, key;
	int rc;

	memset(mr, 0, sizeof(*mr));
	mr->buf = buf;
	mr->len = len;
	/* Local-only memory needs no registration unless the provider says so. */
	if (access == FAB_MR_LOCAL && !f->attr.mr_local)
		return 0;
	/*
	 * Sources of sends and writes, sinks of receives; never FI_READ: we
	 * issue no RDMA reads, and on iWARP the verbs provider grants remote
	 * write to every MR registered for FI_READ (a read's sink must be
	 * remotely writable there), which would leave the chunk area and the
	 * header buffers writable by any peer that finds their key.
	 */
	if (access & FAB_MR_LOCAL)
		acc |= FI_SEND | FI_RECV | FI_WRITE;
	if (access & FAB_MR_REMOTE_WRITE)
		acc |= FI_REMOTE_WRITE;
	/*
	 * Requested keys must be unique in the domain (libfabric's fi_mr(3)).
	 * Keys for 32-bit wire fields come from a counter that takes 2^31 - 1
	 * registrations to come round, so a key a peer saw recently does not
	 * become valid again soon; keys still registered after a wrap are
	 * skipped (the provider refuses them with -FI_ENOKEY). 64-bit keys
	 * never come round: a revoked one is never valid again. Both go
	 * through the domain's keyed permutation: any connection of the domain
	 * may name any key, so a key must not tell its neighbours.
	 */
	rc = dom_hold(f, &dom);
	if (rc)
		return rc;
	for (int tries = 0;; tries++) {
		if (f->prov_key)
			key = 0;
		else if (access & FAB_MR_KEY64)
			key = keyperm_key64(&f->keys, atomic_fetch_add(&f->next_key64, 1));
		else
			key = keyperm_key31(&f->keys,
					    (uint32_t)(atomic_fetch_add(&f->next_key, 1) %
						       KEYPERM_KEY31_MAX));
		/* The context is the fab: ofi_mr_dereg gives the domain back through it. */
		rc = fi_mr_reg(dom, buf, len, acc, 0, key, 0, &fmr, f);
		if (rc != -FI_ENOKEY || f->prov_key || tries == 64)
			break;
	}
	if (rc) {
		dom_drop(f);
		log_err("fabric: registering %zu bytes failed: %s", len, fab_strerror(rc));
		return fab_errno(rc);
	}
	key = fi_mr_key(fmr);
	if (key > UINT32_MAX && !(access & FAB_MR_KEY64)) {
		log_err("fabric: provider key 0x%llx does not fit 32 bits",
			(unsigned long long)key);
		fi_close(&fmr->fid);
		dom_drop(f);
		return -EOVERFLOW;
	}
	mr->priv = fmr;
	mr->ops = &fab_ofi_ops;
	mr->key = key;
	mr->desc = f->attr.mr_local ? fi_mr_desc(fmr) : NULL;
	mr->base = f->attr.virt_addr ? (uint64_t)(uintptr_t)buf : 0;
	return 0;
}

static void ofi_mr_dereg(struct fab_mr *mr)
{
	if (mr && mr->priv) {
		struct fid_mr *fmr = mr->priv;
		struct fab *f = fmr->fid.context;

		fi_close(&fmr->fid);
		dom_drop(f);
		mr->priv = NULL;
		mr->ops = NULL;
	}
}

/* ---- listening --------------------------------------------------------------- */

static int eq_open(struct fab *f, struct fid_eq **eq, int *fd)
{
	struct fi_eq_attr attr = { .size = 64, .wait_obj = FI_WAIT_FD };
	int rc;

	rc = fi_eq_open(f->fabric, &attr, eq, NULL);
	if (rc)
		return fab_errno(rc);
	rc = fi_control(&(*eq)->fid, FI_GETWAIT, fd);
	if (rc) {
		fi_close(&(*eq)->fid);
		*eq = NULL;
		return fab_errno(rc);
	}
	return 0;
}

static int ofi_listen(struct fab *f, struct fab_lst **out)
{
	struct fab_lst *l = calloc(1, sizeof(*l));
	struct sockaddr_storage ss;
	size_t sslen = sizeof(ss);
	int rc;

	if (!l)
		return -ENOMEM;
	l->ops = &fab_ofi_ops;
	l->fab = f;
	l->info_fd = -1;
	rc = eq_open(f, &l->eq, &l->fd);
	if (rc)
		goto out_free;
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", l->fd);
	l->info_fd = open(path, O_RDONLY | O_CLOEXEC);
	if (l->info_fd < 0)
		log_warn("listener: cannot open %s (%s): connections that send no request "
			 "are not limited", path, strerror(errno));
	rc = fi_passive_ep(f->fabric, f->info, &l->pep, NULL);
	if (rc) {
		rc = fab_errno(rc);
		goto out_close_eq;
	}
	rc = fi_pep_bind(l->pep, &l->eq->fid, 0);
	if (rc) {
		rc = fab_errno(rc);
		goto out_close_pep;
	}
	rc = fi_listen(l->pep);
	if (rc) {
		rc = fab_errno(rc);
		goto out_close_pep;
	}
	if (fi_getname(&l->pep->fid, &ss, &sslen) == 0) {
		if (ss.ss_family == AF_INET)
			l->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		else if (ss.ss_family == AF_INET6)
			l->port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	*out = l;
	return 0;

out_close_pep:
	fi_close(&l->pep->fid);
out_close_eq:
	fi_close(&l->eq->fid);
	if (l->info_fd >= 0)
		close(l->info_fd);
out_free:
	free(l);
	return rc;
}

static void ofi_lst_close(struct fab_lst *l)
{
	if (!l)
		return;
	fi_close(&l->pep->fid);
	fi_close(&l->eq->fid);
	if (l->info_fd >= 0)
		close(l->info_fd);
	free(l->info_buf);
	free(l->raw);
	free(l);
}

/* The listener's fdinfo, read whole from its start (it is made anew on each read). */
static const char *lst_read_info(struct fab_lst *l)
{
	size_t len = 0;

	if (l->info_fd < 0)
		return NULL;
	for (;;) {
		ssize_t n;

		if (len + 1 >= l->info_cap) {
			size_t cap = l->info_cap ? l->info_cap * 2 : 16384;
			char *nb = realloc(l->info_buf, cap);

			if (!nb)
				return NULL;
			l->info_buf = nb;
			l->info_cap = cap;
		}
		n = pread(l->info_fd, l->info_buf + len, l->info_cap - 1 - len, (off_t)len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return NULL;
		if (n == 0)
			break;
		len += (size_t)n;
	}
	l->info_buf[len] = '\0';
	return l->info_buf;
}

/*
 * Raw connections: the tcp provider accepts every TCP connection at once
 * and keeps it, a thread-less fd in the listener's epoll set, until a
 * connection request arrives; one that never sends would be kept for
 * ever, and enough of them use up the process's fds. The set is read from
 * /proc/self/fdinfo of that epoll fd (only this thread, in fi_eq_read,
 * adds or closes them, so the fds listed stay valid until we return). A
 * socket past its deadline, or the oldest beyond a limit, is shut down:
 * the provider then reads EOF and frees it as a failed request.
 */
static int raw_cmp(const void *a, const void *b)
{
	const struct lst_raw *x = a, *y = b;
	int c = strcmp(x->peer, y->peer);

	if (c)
		return c;
	return x->since_ms < y->since_ms ? -1 : x->since_ms > y->since_ms;
}

/*
 * A connected TCP socket: not the listening one, and not the wait set's own
 * signal (an AF_UNIX socket pair, which must never be shut down: libfabric
 * writes to it, and the write would raise SIGPIPE).
 */
static bool raw_is_waiting_socket(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int acc = 0, type = 0;
	socklen_t len = sizeof(acc), tlen = sizeof(type);

	if (getsockname(fd, (struct sockaddr *)&ss, &sl) ||
	    (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
		return false;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) || type != SOCK_STREAM)
		return false;
	return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == 0 && !acc;
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

static bool raw_close(struct fab_lst *l, struct lst_raw *r)
{
	if (r->fd < 0)
		return false;
	shutdown(r->fd, SHUT_RDWR);
	r->fd = -1;
	l->closed++;
	return true;
}

static void ofi_lst_sweep(struct fab_lst *l)
{
	const struct fab_lst_limits *lim = &l->lim;
	uint64_t now = now_ms();
	struct lst_raw *cur = NULL;
	size_t n = 0, cap = 0, late = 0, over = 0;
	const char *info, *line, *next;

	if (!lim->max_total && !lim->timeout_ms)
		return;
	l->last_sweep_ms = now;
	l->unswept = 0;
	info = lst_read_info(l);
	if (!info) {
		log_warn_rl("listener: cannot read its fdinfo: %s", strerror(errno));
		return;
	}
	for (line = info; line && *line; line = next) {
		unsigned long ino = 0;
		const char *p;
		int fd;

		next = strchr(line, '\n');
		if (next)
			next++;
		p = strstr(line, " ino:");
		if (sscanf(line, "tfd: %d", &fd) != 1 || !p || (next && p > next) ||
		    sscanf(p, " ino:%lx", &ino) != 1 || !raw_is_waiting_socket(fd))
			continue;
		if (n == cap) {
			struct lst_raw *nc = realloc(cur, (cap = cap ? cap * 2 : 64) * sizeof(*cur));

			if (!nc)
				break;
			cur = nc;
		}
		struct lst_raw *r = &cur[n++];

		*r = (struct lst_raw){ .ino = ino, .fd = fd, .since_ms = now };
		for (size_t i = 0; i < l->nr_raw; i++) {
			if (l->raw[i].ino == ino) {
				r->since_ms = l->raw[i].since_ms;
				memcpy(r->peer, l->raw[i].peer, sizeof(r->peer));
				break;
			}
		}
		if (r->since_ms == now)
			raw_peer(fd, r->peer, sizeof(r->peer));
		int ready = 0;

		r->spoke = ioctl(fd, FIONREAD, &ready) == 0 && ready > 0;
	}
	if (n)
		qsort(cur, n, sizeof(*cur), raw_cmp);
	/*
	 * Past the deadline; then the oldest of a peer over its share, and
	 * the oldest over the limit in all. The limits count only the silent
	 * ones: a socket whose request is in (a storm of clients connecting
	 * at once, faster than the provider reads them) is the provider's
	 * next to read, not a flood's.
	 */
	for (size_t i = 0; i < n && lim->timeout_ms; i++)
		if (now - cur[i].since_ms >= lim->timeout_ms)
			late += raw_close(l, &cur[i]);
	if (lim->max_per_peer) {
		for (size_t i = 0; i < n;) {
			size_t j = i, alive = 0;

			while (j < n && !strcmp(cur[j].peer, cur[i].peer)) {
				alive += cur[j].fd >= 0 && !cur[j].spoke;
				j++;
			}
			for (size_t k = i; k < j && alive > lim->max_per_peer; k++)
				if (!cur[k].spoke && raw_close(l, &cur[k])) {
					alive--;
					over++;
				}
			i = j;
		}
	}
	if (lim->max_total) {
		size_t alive = 0;

		for (size_t i = 0; i < n; i++)
			alive += cur[i].fd >= 0 && !cur[i].spoke;
		while (alive > lim->max_total) {
			struct lst_raw *oldest = NULL;

			for (size_t i = 0; i < n; i++)
				if (cur[i].fd >= 0 && !cur[i].spoke &&
				    (!oldest || cur[i].since_ms < oldest->since_ms))
					oldest = &cur[i];
			raw_close(l, oldest);
			alive--;
			over++;
		}
	}
	if (late || over)
		log_warn_rl("listener: closed %zu connections that sent no connection request "
			    "(%zu after %u ms, %zu over the limits of %u, %u per peer)", late + over,
			    late, lim->timeout_ms, over, lim->max_total, lim->max_per_peer);
	/* Keep what is still open for the next sweep. */
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		if (cur[i].fd >= 0)
			cur[k++] = cur[i];
	free(l->raw);
	l->raw = cur;
	l->nr_raw = k;
}

static void ofi_lst_limit(struct fab_lst *l, const struct fab_lst_limits *lim)
{
	l->lim = *lim;
}

static uint64_t ofi_lst_closed(const struct fab_lst *l)
{
	return l->closed;
}

static int ofi_lst_fd(const struct fab_lst *l)
{
	return l->fd;
}

static int ofi_lst_port(const struct fab_lst *l)
{
	return l->port;
}

static int ofi_lst_process(struct fab_lst *l,
			   void (*cb)(void *priv, struct fab_connreq *req, const void *data, size_t len),
			   void *priv)
{
	uint64_t raw[(sizeof(struct fi_eq_cm_entry) + FAB_CM_BUF) / 8 + 1];
	struct fi_eq_cm_entry *ev = (struct fi_eq_cm_entry *)raw;
	uint32_t event;

	for (;;) {
		ssize_t rd = fi_eq_read(l->eq, &event, raw, sizeof(raw), 0);

		/*
		 * Each read may accept one more socket: a flood of them is
		 * swept as it comes (every 8 reads, or 5 ms), never all the
		 * fds first.
		 */
		if (l->lim.max_total && (++l->unswept >= 8 || now_ms() - l->last_sweep_ms >= 5))
			ofi_lst_sweep(l);
		if (rd == -FI_EAGAIN) {
			struct fid *fids[1] = { &l->eq->fid };

			/* Sleep only when the fd is sure to signal new events. */
			if (fi_trywait(l->fab->fabric, fids, 1) == FI_SUCCESS)
				return 0;
			continue;
		}
		if (rd == -FI_EAVAIL) {
			struct fi_eq_err_entry err = { 0 };

			fi_eq_readerr(l->eq, &err, 0);
			log_warn("listener: connection request error: %s", fi_strerror(err.err));
			continue;
		}
		if (rd < 0) {
			log_err("listener: fi_eq_read: %s", fab_strerror(rd));
			return fab_errno(rd);
		}
		if (event != FI_CONNREQ) {
			log_dbg("listener: ignoring event %u", event);
			continue;
		}
		if ((size_t)rd < sizeof(*ev)) {
			log_warn("listener: short connection request event");
			if (ev->info)
				fi_freeinfo(ev->info);
			continue;
		}
		struct fab_connreq req = { .ops = &fab_ofi_ops, .info = ev->info };

		cb(priv, &req, ev->data, (size_t)rd - sizeof(*ev));
		fi_freeinfo(req.info);
	}
}

static int ofi_reject(struct fab_lst *l, struct fab_connreq *req, const void *data, size_t len)
{
	return fab_errno(fi_reject(l->pep, req->info->handle, data, len));
}

static void ofi_connreq_peer(const struct fab_connreq *req, char *buf, size_t len)
{
	sockaddr_str(req->info->dest_addr, buf, len);
}

/* ---- connections ------------------------------------------------------------- */

/* Fails rather than let the provider truncate connection data. */
static int check_cm_data(struct fab_con *c, size_t len)
{
	size_t max = 0, optlen = sizeof(max);

	if (fi_getopt(&c->ep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &max, &optlen))
		max = RTRS_CM_DATA_MAX_PORTABLE;
	if (len > max) {
		log_err("%s: %zu bytes of connection data exceed the provider's %zu", c->name, len,
			max);
		return -EMSGSIZE;
	}
	return 0;
}

static void con_down(struct fab_con *c, int err, const void *data, size_t len)
{
	/* After our own shutdown the owner already knows; say nothing. */
	if (atomic_exchange(&c->down, true) || atomic_load(&c->shutdown))
		return;
	c->cfg.ops->down(c->cfg.priv, err, data, len);
}

static int rx_post(struct fab_con *c, size_t i)
{
	struct iovec iov = { .iov_base = c->rx.buf + i * c->rx.size, .iov_len = c->rx.size };
	void *desc = c->rx.mr.desc;
	struct fi_msg msg = {
		.msg_iov = &iov, .desc = &desc, .iov_count = c->rx.size ? 1 : 0,
		.context = iov.iov_base,
	};

	return fab_errno(fi_recvmsg(c->ep, &msg, FI_COMPLETION));
}

static bool is_rx_ctx(const struct fab_con *c, const void *ctx)
{
	const char *p = ctx;

	/* count is published last (release): buf and size are valid once seen. */
	size_t count = __atomic_load_n(&c->rx.count, __ATOMIC_ACQUIRE);

	return count && p >= c->rx.buf && p < c->rx.buf + count * c->rx.size;
}

static void rx_repost(struct fab_con *c, void *ctx)
{
	int rc = rx_post(c, (size_t)((char *)ctx - c->rx.buf) / c->rx.size);

	if (rc && !atomic_load(&c->down)) {
		log_err("%s: reposting a receive failed: %s", c->name, strerror(-rc));
		con_down(c, rc, NULL, 0);
	}
}

static void handle_comp(struct fab_con *c, const struct fi_cq_data_entry *e)
{
	if ((e->flags & FI_REMOTE_WRITE) && (e->flags & FI_REMOTE_CQ_DATA)) {
		/* On verbs an immediate consumed one posted receive. */
		if (e->op_context && is_rx_ctx(c, e->op_context))
			rx_repost(c, e->op_context);
		c->cfg.ops->imm(c->cfg.priv, (uint32_t)e->data);
	} else if (e->flags & FI_RECV) {
		if (!is_rx_ctx(c, e->op_context)) {
			log_err_rl("%s: receive completion with unknown context", c->name);
			return;
		}
		if (c->fab->imm_by_send && e->len == FAB_IMM_MSG_LEN) {
			/* An immediate carried as a message (RTRS messages are longer). */
			struct le32 imm;

			memcpy(&imm, e->op_context, sizeof(imm));
			rx_repost(c, e->op_context);
			c->cfg.ops->imm(c->cfg.priv, le32_get(imm));
			return;
		}
		c->cfg.ops->recv(c->cfg.priv, e->op_context, e->len);
		rx_repost(c, e->op_context);
	} else {
		bool mark = e->op_context == &c->tx_sig_mark;

		if (c->fab->tx_counted)
			atomic_fetch_sub_explicit(&c->tx_posted, mark ? c->tx_sig_every : 1,
						  memory_order_relaxed);
		if (e->op_context && e->op_context != c && !mark)
			c->cfg.ops->done(c->cfg.priv, e->op_context);
	}
}

static void handle_cq_error(struct fab_con *c)
{
	struct fi_cq_err_entry err = { 0 };
	char buf[128];

	if (fi_cq_readerr(c->cq, &err, 0) < 0)
		return;
	if (atomic_load(&c->down) || atomic_load(&c->shutdown))
		return; /* flushes after the connection went away */
	if (err.err == ECANCELED) {
		/* Flushed because the peer went away: a disconnect, not an error. */
		con_down(c, -ECONNRESET, NULL, 0);
		return;
	}
	log_err_rl("%s: completion error: %s (%s)", c->name, fi_strerror(err.err),
		   fi_cq_strerror(c->cq, err.prov_errno, err.err_data, buf, sizeof(buf)));
	con_down(c, err.err ? -err.err : -EIO, NULL, 0);
}

static void handle_eq(struct fab_con *c)
{
	uint64_t raw[(sizeof(struct fi_eq_cm_entry) + FAB_CM_BUF) / 8 + 1];
	struct fi_eq_cm_entry *ev = (struct fi_eq_cm_entry *)raw;
	uint32_t event;

	for (;;) {
		ssize_t rd = fi_eq_read(c->eq, &event, raw, sizeof(raw), 0);

		if (rd == -FI_EAGAIN)
			return;
		if (rd == -FI_EAVAIL) {
			struct fi_eq_err_entry err = { 0 };

			if (fi_eq_readerr(c->eq, &err, 0) < 0)
				return;
			if (err.err == ECONNREFUSED)
				con_down(c, -ECONNREFUSED, err.err_data, err.err_data_size);
			else
				con_down(c, err.err ? -err.err : -EIO, NULL, 0);
			continue;
		}
		if (rd < 0) {
			con_down(c, fab_errno(rd), NULL, 0);
			return;
		}
		switch (event) {
		case FI_CONNECTED:
			if (!atomic_load(&c->down))
				c->cfg.ops->connected(c->cfg.priv, ev->data,
						      (size_t)rd > sizeof(*ev) ?
						      (size_t)rd - sizeof(*ev) : 0);
			break;
		case FI_SHUTDOWN:
			con_down(c, -ECONNRESET, NULL, 0);
			break;
		default:
			log_dbg("%s: ignoring EQ event %u", c->name, event);
		}
	}
}

/*
 * One read of the CQ and the callbacks of what it found, the kick
 * included when one is due: the completion thread's lap and fab_con_poll
 * both, under cq_lock. Returns what fi_cq_read said; *eq_due is set when
 * the EQ should be read next (an error may have come with an event).
 */
static ssize_t con_read_cq(struct fab_con *c, bool *eq_due)
{
	struct fi_cq_data_entry *comps = c->comps;
	ssize_t n;

	atomic_store_explicit(&c->read_since_ms, now_ms(), memory_order_relaxed);
	n = fi_cq_read(c->cq, comps, FAB_CQ_BATCH);
	atomic_store_explicit(&c->read_since_ms, 0, memory_order_relaxed);
	if (atomic_load(&c->flooded) && !atomic_load(&c->down)) {
		con_down(c, -EPROTO, NULL, 0);
		*eq_due = true;
	}
	if (n > 0) {
		for (ssize_t i = 0; i < n; i++)
			if (!atomic_load(&c->down))
				handle_comp(c, &comps[i]);
	} else if (n == -FI_EAVAIL) {
		handle_cq_error(c);
		*eq_due = true;
	} else if (n != -FI_EAGAIN) {
		con_down(c, fab_errno(n), NULL, 0);
		*eq_due = true;
	}
	bool kick = atomic_exchange(&c->kicked, false);

	/* Retries after -EAGAIN: on any completion, else after 1 ms. */
	if (n > 0 && atomic_exchange(&c->retry, false))
		kick = true;
	if (kick && !atomic_load(&c->down))
		c->cfg.ops->kick(c->cfg.priv);
	return n;
}

/* A poller holds the CQ now (struct fab_poller): the thread leaves it alone. */
static bool con_yields_cq(struct fab_con *c)
{
	struct fab_poller *p = atomic_load_explicit(&c->poller, memory_order_acquire);

	return p && (atomic_load(&p->waiting) > 0 ||
		     now_ms() - atomic_load(&p->last_ms) < FAB_POLL_LEASE_MS);
}

/*
 * A lap of the thread while a poller holds the CQ: wait for the EQ, a
 * kick or the lease, then read the EQ and run a due kick. A retry after
 * -EAGAIN still comes after 1 ms: the poller reads completions, but only
 * this thread waits for time.
 *
 * A poller found in the same wait as a lap before is idle: the lap then
 * also waits on the CQ's fd, for up to a second instead of a lease, so an
 * idle polled session does not wake this thread 100 times a second.
 * Whatever ends the poller's wait on the CQ ends this one too; a poller
 * that woke for another reason and stopped polling leaves the CQ armed,
 * so its next completion wakes this thread, and the lap after looks at
 * the lease again. After a wake on the CQ's fd the next lap is a short
 * one: the fd stays readable until the poller reads the queue.
 */
static void con_lap_yielded(struct fab_con *c, bool *eq_due)
{
	struct fab_poller *p = atomic_load_explicit(&c->poller, memory_order_acquire);
	struct pollfd pfd[3] = { { .fd = c->eq_fd, .events = POLLIN },
				 { .fd = c->wake_fd, .events = POLLIN },
				 { .fd = c->cq_fd, .events = POLLIN } };
	bool retry = atomic_load(&c->retry);
	/* waiting, then sleeps: the poller counts a sleep before it waits. */
	bool asleep = p && atomic_load(&p->waiting) > 0;
	unsigned sleeps = p ? atomic_load(&p->sleeps) : 0;
	bool idle = !retry && asleep && c->yield_asleep && sleeps == c->yield_sleeps;
	int np = poll(pfd, idle ? 3 : 2, retry ? 1 : idle ? 1000 : FAB_POLL_LEASE_MS);
	uint64_t v;

	c->yield_asleep = asleep && !(idle && np > 0 && pfd[2].revents);
	c->yield_sleeps = sleeps;
	if (np > 0 && (pfd[1].revents & POLLIN) && read(c->wake_fd, &v, sizeof(v)) < 0 &&
	    errno != EAGAIN)
		log_warn("%s: eventfd read: %s", c->name, strerror(errno));
	if (np < 0 || (np > 0 && (pfd[0].revents || pfd[1].revents)) ||
	    atomic_exchange(&c->poll_eq_due, false))
		*eq_due = true;
	pthread_mutex_lock(&c->cq_lock);
	if (*eq_due) {
		struct fid *eq = &c->eq->fid;

		handle_eq(c);
		/*
		 * On tcp reading the EQ leaves its wait fd's signal set: only
		 * fi_trywait resets it, and a lap that never did would find
		 * eq_fd readable at once, lap after lap.
		 */
		*eq_due = fi_trywait(c->fab->fabric, &eq, 1) != FI_SUCCESS;
	}
	bool kick = atomic_exchange(&c->kicked, false);

	if (np == 0 && retry && atomic_exchange(&c->retry, false))
		kick = true;
	if (kick && !atomic_load(&c->down))
		c->cfg.ops->kick(c->cfg.priv);
	pthread_mutex_unlock(&c->cq_lock);
}

/*
 * The completion thread. CQ entries are read until none are left; the EQ
 * (connect, disconnect) is read when its fd fires and every 64 laps, since
 * on tcp every fi_eq_read costs a system call and events there are rare.
 * Before sleeping, fi_trywait makes sure both fds will signal anything new.
 * While a poller holds the CQ (fab_con_set_poller), only the EQ and kicks.
 */
static void *con_thread(void *arg)
{
	struct fab_con *c = arg;
	struct fid *fids[2] = { &c->cq->fid, &c->eq->fid };
	bool eq_due = true, cq_woke = false;
	unsigned laps = 0;

	/* Under the lock: a rename before this thread got here is not undone. */
	pthread_mutex_lock(&c->name_lock);
	pthread_setname_np(pthread_self(), c->tname);
	pthread_mutex_unlock(&c->name_lock);
	while (!atomic_load(&c->stop)) {
		ssize_t n;

		if (atomic_load(&c->shutdown)) {
			/*
			 * Shut down: nothing of it matters any more, and reading
			 * would only make the provider queue what a peer that
			 * broke the rules still sends. Wait to be stopped.
			 */
			struct pollfd pw = { .fd = c->wake_fd, .events = POLLIN };
			uint64_t v;

			if (poll(&pw, 1, 1000) > 0 && read(c->wake_fd, &v, sizeof(v)) < 0 &&
			    errno != EAGAIN)
				log_warn("%s: eventfd read: %s", c->name, strerror(errno));
			continue;
		}
		if (con_yields_cq(c)) {
			con_lap_yielded(c, &eq_due);
			continue;
		}
		pthread_mutex_lock(&c->cq_lock);
		n = con_read_cq(c, &eq_due);
		if (eq_due || (++laps & 63) == 0 || atomic_exchange(&c->poll_eq_due, false)) {
			handle_eq(c);
			eq_due = false;
		}
		pthread_mutex_unlock(&c->cq_lock);
		if (n > 0 || n == -FI_EAVAIL) {
			c->dry_laps = 0;
			cq_woke = false;
			continue;
		}
		if (cq_woke)
			con_dry_lap(c);
		cq_woke = false;
		/* fi_trywait progresses the socket too: the watchdog sees it likewise. */
		pthread_mutex_lock(&c->cq_lock);
		atomic_store_explicit(&c->read_since_ms, now_ms(), memory_order_relaxed);
		int tw = fi_trywait(c->fab->fabric, fids, 2);

		atomic_store_explicit(&c->read_since_ms, 0, memory_order_relaxed);
		pthread_mutex_unlock(&c->cq_lock);
		if (tw != FI_SUCCESS) {
			eq_due = true;
			cq_woke = true;
			continue;
		}
		struct epoll_event evs[3];
		bool retry = atomic_load(&c->retry);
		int ne = epoll_wait(c->epfd, evs, ARRAY_SIZE(evs), retry ? 1 : 1000);

		if (ne == 0 && retry && atomic_exchange(&c->retry, false))
			atomic_store(&c->kicked, true);
		else if (ne == 0)
			eq_due = true; /* idle: a cheap moment to look */
		for (int i = 0; i < ne; i++) {
			uint64_t v;

			if (evs[i].data.fd == c->cq_fd)
				cq_woke = true;
			else if (evs[i].data.fd == c->eq_fd)
				eq_due = true;
			else if (evs[i].data.fd == c->wake_fd &&
				 read(c->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				log_warn("%s: eventfd read: %s", c->name, strerror(errno));
		}
	}
	return NULL;
}

/* fab_con_poll: the CQ once on the caller's thread, unless another reads it now. */
static int ofi_con_poll(struct fab_con *c)
{
	bool eq_due = false;
	ssize_t n;

	if (atomic_load(&c->shutdown) || atomic_load(&c->stop))
		return 0;
	if (pthread_mutex_trylock(&c->cq_lock))
		return 0;
	n = con_read_cq(c, &eq_due);
	pthread_mutex_unlock(&c->cq_lock);
	if (eq_due) {
		/* The EQ is the thread's: wake it to read. */
		uint64_t one = 1;

		atomic_store(&c->poll_eq_due, true);
		if (write(c->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
			log_warn("%s: eventfd write: %s", c->name, strerror(errno));
	}
	return n > 0 ? (int)n : 0;
}

static int ofi_con_trywait(struct fab_con *c)
{
	struct fid *fid = &c->cq->fid;
	int tw;

	if (atomic_load(&c->shutdown) || atomic_load(&c->stop))
		return 0;
	pthread_mutex_lock(&c->cq_lock);
	tw = fi_trywait(c->fab->fabric, &fid, 1);
	pthread_mutex_unlock(&c->cq_lock);
	return tw == FI_SUCCESS ? 0 : -EAGAIN;
}

static int ofi_con_wait_fd(const struct fab_con *c)
{
	return c->cq_fd;
}

static void ofi_con_set_poller(struct fab_con *c, struct fab_poller *p)
{
	uint64_t one = 1;

	atomic_store_explicit(&c->poller, p, memory_order_release);
	/* Without one any more: the thread must read the CQ at once, not after its wait. */
	if (!p && write(c->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("%s: eventfd write: %s", c->name, strerror(errno));
}

/*
 * A connection's completions come from its thread's malloc arena; what a
 * peer made the provider queue there (a flood, a burst) stays with the
 * process unless given back. After a flood at once, else at most every
 * 100 ms (a session's teardown frees many connections together).
 */
static void con_trim_heap(bool flooded)
{
	static atomic_uint_fast64_t last_ms;
	uint64_t now = now_ms(), last = atomic_load(&last_ms);

	if (!flooded && now - last < 100)
		return;
	if (!atomic_compare_exchange_strong(&last_ms, &last, now) && !flooded)
		return;
	malloc_trim(0);
}

static void con_free(struct fab_con *c)
{
	bool flooded = atomic_load(&c->flooded);

	wd_del(c);
	if (c->thread_started) {
		uint64_t one = 1;

		atomic_store(&c->stop, true);
		if (write(c->wake_fd, &one, sizeof(one)) < 0)
			log_warn("%s: eventfd write: %s", c->name, strerror(errno));
		pthread_join(c->thread, NULL);
	}
	if (c->ep)
		fi_close(&c->ep->fid);
	ofi_mr_dereg(&c->rx.mr);
	free(c->rx.buf);
	if (c->cq)
		fi_close(&c->cq->fid);
	if (c->eq)
		fi_close(&c->eq->fid);
	if (c->dom_held)
		dom_drop(c->fab);
	pthread_mutex_destroy(&c->rx_lock);
	pthread_mutex_destroy(&c->cq_lock);
	pthread_mutex_destroy(&c->name_lock);
	if (c->epfd >= 0)
		close(c->epfd);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	free(c);
	con_trim_heap(flooded);
}

static int epoll_add(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };

	return epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

static int con_create(struct fab *f, struct fi_info *base, const struct fab_con_cfg *cfg,
		      struct fab_con **out)
{
	struct fi_cq_attr cq_attr = { 0 };
	struct fid_domain *dom;
	struct fab_con *c;
	struct fi_info *info;
	size_t rx_depth, cq_size;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->ops = &fab_ofi_ops;
	c->fab = f;
	c->cfg = *cfg;
	c->cq_fd = c->eq_fd = c->wake_fd = c->epfd = -1;
	snprintf(c->name_made, sizeof(c->name_made), "%s", cfg->name);
	atomic_init(&c->name, c->name_made);
	snprintf(c->tname, sizeof(c->tname), "%.15s", cfg->name);
	pthread_mutex_init(&c->name_lock, NULL);
	atomic_init(&c->stop, false);
	atomic_init(&c->down, false);
	atomic_init(&c->shutdown, false);
	atomic_init(&c->kicked, false);
	pthread_mutex_init(&c->rx_lock, NULL);
	pthread_mutex_init(&c->cq_lock, NULL);

	/* Receives: messages, plus one per immediate where the provider needs it. */
	rx_depth = cfg->rx_depth;
	c->rx.size = cfg->rx_size;
	if (f->attr.rx_cq_data && c->rx.size < 64)
		c->rx.size = 64;

	info = fi_dupinfo(base);
	if (!info) {
		rc = -ENOMEM;
		goto out_free;
	}
	/* Within what the domain was granted (fab_open's queue). */
	info->tx_attr->size = MIN(MAX(cfg->tx_depth, 16), f->attr.max_queue);
	c->tx_max = (unsigned)info->tx_attr->size;
	c->tx_sig_every = MIN(MAX(c->tx_max / 4, 1u), FAB_SIG_EVERY_MAX);
	info->rx_attr->size = MIN(MAX(MAX(rx_depth, cfg->rx_queue), 16), f->attr.max_queue);
	if (rx_depth > info->rx_attr->size) {
		log_warn("%s: %zu receives wanted, the provider grants %zu", c->name, rx_depth,
			 (size_t)info->rx_attr->size);
		rx_depth = info->rx_attr->size;
	}
	cq_size = info->tx_attr->size + info->rx_attr->size + 16;
	rc = dom_hold(f, &dom);
	if (rc) {
		fi_freeinfo(info);
		goto out_free;
	}
	c->dom_held = true;
	rc = fi_endpoint(dom, info, &c->ep, NULL);
	fi_freeinfo(info);
	if (rc) {
		log_err("%s: fi_endpoint: %s", c->name, fab_strerror(rc));
		rc = fab_errno(rc);
		goto out_free;
	}
	cq_attr.size = cq_size;
	cq_attr.format = FI_CQ_FORMAT_DATA;
	cq_attr.wait_obj = FI_WAIT_FD;
	rc = fi_cq_open(dom, &cq_attr, &c->cq, NULL);
	if (rc) {
		rc = fab_errno(rc);
		goto out_free;
	}
	rc = eq_open(f, &c->eq, &c->eq_fd);
	if (rc)
		goto out_free;
	rc = fi_control(&c->cq->fid, FI_GETWAIT, &c->cq_fd);
	if (rc) {
		rc = fab_errno(rc);
		goto out_free;
	}
	rc = fi_ep_bind(c->ep, &c->eq->fid, 0);
	if (!rc)
		rc = fi_ep_bind(c->ep, &c->cq->fid, FI_TRANSMIT | FI_RECV | FI_SELECTIVE_COMPLETION);
	if (!rc)
		rc = fi_enable(c->ep);
	if (rc) {
		log_err("%s: endpoint setup: %s", c->name, fab_strerror(rc));
		rc = fab_errno(rc);
		goto out_free;
	}
	if (rx_depth) {
		rc = ofi_con_rx_setup(c, rx_depth, c->rx.size);
		if (rc)
			goto out_free;
	}

	c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->wake_fd < 0 || c->epfd < 0) {
		rc = -errno;
		goto out_free;
	}
	rc = epoll_add(c->epfd, c->cq_fd);
	if (!rc)
		rc = epoll_add(c->epfd, c->eq_fd);
	if (!rc)
		rc = epoll_add(c->epfd, c->wake_fd);
	if (rc)
		goto out_free;
	/* The owner's callbacks run on the thread and read *out from the first event on. */
	*out = c;
	c->thread_started = true;
	rc = -pthread_create(&c->thread, NULL, con_thread, c);
	if (rc) {
		c->thread_started = false;
		*out = NULL;
		goto out_free;
	}
	wd_add(c);
	return 0;

out_free:
	con_free(c);
	return rc;
}

/* Undoes con_create for a connection whose connect or accept failed. */
static void con_abandon(struct fab_con *c, struct fab_con **out)
{
	*out = NULL;
	con_free(c);
}

static int ofi_con_connect(struct fab *f, const struct fab_con_cfg *cfg, const void *data,
			   size_t len, struct fab_con **out)
{
	struct fab_con *c;
	int rc;

	rc = con_create(f, f->info, cfg, out);
	if (rc)
		return rc;
	c = *out;
	rc = check_cm_data(c, len);
	if (rc) {
		con_abandon(c, out);
		return rc;
	}
	rc = fi_connect(c->ep, f->info->dest_addr, data, len);
	if (rc) {
		log_err("%s: fi_connect: %s", c->name, fab_strerror(rc));
		con_abandon(c, out);
		return fab_errno(rc);
	}
	return 0;
}

static int ofi_con_accept(struct fab *f, struct fab_connreq *req, const struct fab_con_cfg *cfg,
			  const void *data, size_t len, struct fab_con **out)
{
	struct fab_con *c;
	int rc;

	rc = con_create(f, req->info, cfg, out);
	if (rc)
		return rc;
	c = *out;
	rc = check_cm_data(c, len);
	if (rc) {
		con_abandon(c, out);
		return rc;
	}
	rc = fi_accept(c->ep, data, len);
	if (rc) {
		log_err("%s: fi_accept: %s", c->name, fab_strerror(rc));
		con_abandon(c, out);
		return fab_errno(rc);
	}
	return 0;
}

static int ofi_con_rx_setup(struct fab_con *c, size_t count, size_t size)
{
	size_t bytes;
	char *buf;
	int rc;

	if (c->fab->attr.rx_cq_data && size < 64)
		size = 64;
	size = MAX(size, 1);
	if (mul_overflow(count, size, &bytes) || !count)
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
	rc = ofi_mr_reg(c->fab, buf, bytes, FAB_MR_LOCAL, &c->rx.mr);
	if (rc) {
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

static void ofi_con_retry_later(struct fab_con *c)
{
	uint64_t one = 1;

	atomic_store(&c->retry, true);
	/*
	 * From a poller's thread (fab_con_poll runs kicks too), the completion
	 * thread may be asleep already: wake it, so that the retry comes after
	 * 1 ms as on its own thread, not at its idle timeout.
	 */
	if (c->thread_started && !pthread_equal(pthread_self(), c->thread) &&
	    write(c->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("%s: eventfd write: %s", c->name, strerror(errno));
}

static void ofi_con_kick(struct fab_con *c)
{
	uint64_t one = 1;

	if (atomic_exchange(&c->kicked, true))
		return;
	if (write(c->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_warn("%s: eventfd write: %s", c->name, strerror(errno));
}

static void ofi_con_shutdown(struct fab_con *c)
{
	if (!c || atomic_exchange(&c->shutdown, true))
		return;
	fi_shutdown(c->ep, 0);
}

static void ofi_con_destroy(struct fab_con *c)
{
	if (!c)
		return;
	atomic_store(&c->shutdown, true);
	con_free(c);
}

static void ofi_con_rename(struct fab_con *c, const char *name)
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

static void ofi_con_local(const struct fab_con *c, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	size_t sslen = sizeof(ss);

	if (fi_getname(&c->ep->fid, &ss, &sslen))
		snprintf(buf, len, "?");
	else
		sockaddr_str(&ss, buf, len);
}

/*
 * tx_counted: room for one more send, or -EAGAIN; tx_unreserve gives it
 * back when posting failed. Each counted send asks for a completion, which
 * gives it back in handle_comp.
 */
static int tx_reserve(struct fab_con *c)
{
	if (!c->fab->tx_counted)
		return 0;
	if (atomic_fetch_add_explicit(&c->tx_posted, 1, memory_order_relaxed) >= c->tx_max) {
		atomic_fetch_sub_explicit(&c->tx_posted, 1, memory_order_relaxed);
		return -EAGAIN;
	}
	return 0;
}

static void tx_unreserve(struct fab_con *c)
{
	if (c->fab->tx_counted)
		atomic_fetch_sub_explicit(&c->tx_posted, 1, memory_order_relaxed);
}

/*
 * Which sends ask for a completion, and with what context. One with a ctx
 * always. Where sends are counted (tx_counted), one without a ctx only
 * every tx_sig_every-th, with the context tx_sig_mark: an endpoint
 * completes its sends in the order they were queued, so that completion
 * gives back the room of the tx_sig_every sends it closes (handle_comp).
 * A completion is not free: libfabric 1.17's tcp writes its CQ's wait fd
 * for every one, and the reader pays a read for it as well. *mark says
 * which kind this one is, for tx_post_failed.
 */
static uint64_t tx_comp(struct fab_con *c, void *ctx, void **context, bool *mark)
{
	*mark = false;
	*context = ctx ? ctx : c;
	if (ctx)
		return FI_COMPLETION;
	if (!c->fab->tx_counted)
		return 0;
	if ((atomic_fetch_add_explicit(&c->tx_unsig, 1, memory_order_relaxed) + 1) %
	    c->tx_sig_every)
		return 0;
	*context = &c->tx_sig_mark;
	*mark = true;
	return FI_COMPLETION;
}

/*
 * A counted send the provider refused: its room back. A mark gives back
 * the room of all it stood for (their completions will never say it); an
 * unsignalled one keeps its room until the next mark, which counts it.
 */
static void tx_post_failed(struct fab_con *c, void *ctx, bool mark)
{
	if (!c->fab->tx_counted)
		return;
	if (ctx)
		tx_unreserve(c);
	else if (mark)
		atomic_fetch_sub_explicit(&c->tx_posted, c->tx_sig_every, memory_order_relaxed);
}

/* An immediate as a 4-byte message, injected: no buffer outlives the call. */
static ssize_t imm_send(struct fab_con *c, uint32_t imm)
{
	struct le32 v = le32_put(imm);

	return fi_inject(c->ep, &v, sizeof(v), 0);
}

static int ofi_write(struct fab_con *c, const struct iovec *iov, void *const *desc, size_t iov_cnt,
		     const struct fab_rma *rma, size_t rma_cnt, bool with_imm, uint32_t imm,
		     void *ctx)
{
	struct fi_rma_iov riov[8];
	struct fi_msg_rma msg = {
		.msg_iov = iov, .desc = (void **)desc, .iov_count = iov_cnt,
		.rma_iov = riov, .rma_iov_count = rma_cnt, .data = imm,
	};
	bool imm_msg = with_imm && c->fab->imm_by_send, mark;
	uint64_t flags = with_imm && !imm_msg ? FI_REMOTE_CQ_DATA : 0;
	ssize_t rc;

	if (rma_cnt > ARRAY_SIZE(riov) || rma_cnt > c->fab->attr.rma_iov_limit ||
	    iov_cnt > c->fab->attr.iov_limit)
		return -EINVAL;
	if (tx_reserve(c))
		return -EAGAIN;
	for (size_t i = 0; i < rma_cnt; i++)
		riov[i] = (struct fi_rma_iov){ .addr = rma[i].addr, .len = rma[i].len,
					       .key = rma[i].key };
	flags |= tx_comp(c, ctx, &msg.context, &mark);
	rc = fi_writemsg(c->ep, &msg, flags);
	if (rc)
		tx_post_failed(c, ctx, mark);
	/*
	 * The immediate follows as a message: send-after-write order makes its
	 * arrival mean the data is placed. If it meets -EAGAIN the caller posts
	 * the whole write again, which only rewrites the same bytes.
	 */
	if (!rc && imm_msg)
		rc = imm_send(c, imm);
	return fab_errno(rc);
}

static int ofi_write_imm(struct fab_con *c, const void *buf, size_t len, uint64_t addr,
			 uint64_t key, uint32_t imm, void *ctx)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct fi_rma_iov riov = { .addr = addr, .len = len, .key = key };
	struct fi_msg_rma msg = {
		.msg_iov = &iov, .iov_count = len ? 1 : 0, .rma_iov = &riov, .rma_iov_count = 1,
		.context = ctx ? ctx : c, .data = imm,
	};
	uint64_t comp;
	ssize_t rc;
	bool mark;

	if (len > c->fab->attr.inject_size)
		return -EMSGSIZE;
	if (c->fab->imm_by_send) {
		/* The data first; the immediate follows (send-after-write order). */
		if (len) {
			rc = fi_inject_write(c->ep, buf, len, 0, addr, key);
			if (rc)
				return fab_errno(rc);
		}
		if (!ctx)
			return fab_errno(imm_send(c, imm));
		/* A completion wanted: the 4-byte message, copied, with one. */
		struct le32 v = le32_put(imm);
		struct iovec viov = { .iov_base = &v, .iov_len = sizeof(v) };
		struct fi_msg m = { .msg_iov = &viov, .iov_count = 1, .context = ctx };

		return fab_errno(fi_sendmsg(c->ep, &m, FI_INJECT | FI_COMPLETION));
	}
	if (!ctx && !c->fab->tx_counted)
		return fab_errno(fi_inject_writedata(c->ep, buf, len, imm, 0, addr, key));
	if (tx_reserve(c))
		return -EAGAIN;
	comp = tx_comp(c, ctx, &msg.context, &mark);
	rc = fi_writemsg(c->ep, &msg, FI_INJECT | FI_REMOTE_CQ_DATA | comp);
	if (rc)
		tx_post_failed(c, ctx, mark);
	return fab_errno(rc);
}

static int ofi_send(struct fab_con *c, const void *buf, size_t len, void *desc, void *ctx)
{
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct fi_msg msg = {
		.msg_iov = &iov, .desc = &desc, .iov_count = 1,
	};
	ssize_t rc;
	bool mark;

	/*
	 * Control messages go out from service threads, never from this
	 * connection's completion thread, so waiting for room is safe here.
	 */
	for (int tries = 0;; tries++) {
		if (tx_reserve(c)) {
			rc = -FI_EAGAIN;
		} else {
			uint64_t comp = tx_comp(c, ctx, &msg.context, &mark);

			rc = fi_sendmsg(c->ep, &msg, comp);
			if (rc)
				tx_post_failed(c, ctx, mark);
		}
		if (rc != -FI_EAGAIN || tries == 1000 || pthread_equal(pthread_self(), c->thread))
			break;
		usleep(1000);
	}
	return fab_errno(rc);
}

const struct fab_ops fab_ofi_ops = {
	.name = "libfabric",
	.open = ofi_open,
	.close = ofi_close,
	.attr = ofi_attr,
	.mr_reg = ofi_mr_reg,
	.mr_dereg = ofi_mr_dereg,
	.trim = ofi_trim,
	.listen = ofi_listen,
	.lst_close = ofi_lst_close,
	.lst_fd = ofi_lst_fd,
	.lst_port = ofi_lst_port,
	.lst_process = ofi_lst_process,
	.lst_limit = ofi_lst_limit,
	.lst_sweep = ofi_lst_sweep,
	.lst_closed = ofi_lst_closed,
	.reject = ofi_reject,
	.connreq_peer = ofi_connreq_peer,
	.con_connect = ofi_con_connect,
	.con_accept = ofi_con_accept,
	.con_shutdown = ofi_con_shutdown,
	.con_rx_setup = ofi_con_rx_setup,
	.con_kick = ofi_con_kick,
	.con_retry_later = ofi_con_retry_later,
	.con_destroy = ofi_con_destroy,
	.con_local = ofi_con_local,
	.con_rename = ofi_con_rename,
	.write = ofi_write,
	.write_imm = ofi_write_imm,
	.send = ofi_send,
	.con_poll = ofi_con_poll,
	.con_trywait = ofi_con_trywait,
	.con_wait_fd = ofi_con_wait_fd,
	.con_set_poller = ofi_con_set_poller,
};
