/* SPDX-License-Identifier: MIT */
/* Prometheus text exposition from the management JSON, and its HTTP endpoint. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "rpc.h"

struct buf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void bput(struct buf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

__attribute__((format(printf, 2, 3)))
static void bprintf(struct buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(tmp))
		b->failed = true;
	else
		bput(b, tmp, (size_t)n);
}

/* A label value as the format wants it: \\, \" and \n escaped. */
static void bput_label(struct buf *b, const char *name, const char *v, bool first)
{
	bprintf(b, "%s%s=\"", first ? "" : ",", name);
	for (; *v; v++) {
		if (*v == '\\')
			bput(b, "\\\\", 2);
		else if (*v == '"')
			bput(b, "\\\"", 2);
		else if (*v == '\n')
			bput(b, "\\n", 2);
		else
			bput(b, v, 1);
	}
	bput(b, "\"", 1);
}

static const char *jstr(struct json_object *o, const char *field)
{
	struct json_object *v;

	if (!field || !json_object_object_get_ex(o, field, &v))
		return "";
	return json_object_get_string(v) ? json_object_get_string(v) : "";
}

/* The field of o, or of an object in it ("qos.delayed"): NULL when there is none. */
static struct json_object *field_of(struct json_object *o, const char *field)
{
	const char *dot = strchr(field, '.');
	struct json_object *v;
	char head[64];

	if (!dot)
		return json_object_object_get_ex(o, field, &v) ? v : NULL;
	if ((size_t)(dot - field) >= sizeof(head))
		return NULL;
	snprintf(head, sizeof(head), "%.*s", (int)(dot - field), field);
	if (!json_object_object_get_ex(o, head, &v) || !json_object_is_type(v, json_type_object))
		return NULL;
	return field_of(v, dot + 1);
}

/* The sample's value: false when the object has no such field. */
static bool value_of(const struct metrics_def *d, struct json_object *o, double *out)
{
	struct json_object *v = field_of(o, d->field);

	if (!v)
		return false;
	if (d->match)
		*out = json_object_is_type(v, json_type_string) &&
		       !strcmp(json_object_get_string(v), d->match);
	else if (json_object_is_type(v, json_type_boolean))
		*out = json_object_get_boolean(v);
	else if (json_object_is_type(v, json_type_int))
		*out = (double)json_object_get_uint64(v);
	else if (json_object_is_type(v, json_type_double))
		*out = json_object_get_double(v);
	else
		return false;
	if (d->scale)
		*out *= d->scale;
	return true;
}

static void sample(struct buf *b, const struct metrics_def *d, struct json_object *outer,
		   struct json_object *inner)
{
	double v;

	if (!value_of(d, inner ? inner : outer, &v))
		return;
	bput(b, d->name, strlen(d->name));
	for (size_t i = 0; i < METRICS_LABELS_MAX && d->labels[i].name; i++) {
		const struct metrics_label *l = &d->labels[i];

		if (!i)
			bput(b, "{", 1);
		bput_label(b, l->name, jstr(l->inner && inner ? inner : outer, l->field), !i);
	}
	if (d->labels[0].name)
		bput(b, "}", 1);
	/* Counters are integers here; %.17g keeps them exact up to 2^53. */
	bprintf(b, " %.17g\n", v);
}

char *metrics_render(const struct metrics_def *defs, size_t nr_defs,
		     struct json_object *const *srcs, size_t nr_srcs)
{
	struct buf b = { 0 };

	for (size_t i = 0; i < nr_defs; i++) {
		const struct metrics_def *d = &defs[i];
		struct json_object *src = d->src < nr_srcs ? srcs[d->src] : NULL;

		bprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, d->type);
		if (!src)
			continue;
		if (d->shape == METRICS_OBJ) {
			sample(&b, d, src, NULL);
			continue;
		}
		for (size_t k = 0; k < json_object_array_length(src); k++) {
			struct json_object *o = json_object_array_get_idx(src, k), *in;

			if (d->shape == METRICS_ARRAY) {
				sample(&b, d, o, o);
				continue;
			}
			if (!json_object_object_get_ex(o, d->nested, &in))
				continue;
			for (size_t j = 0; j < json_object_array_length(in); j++)
				sample(&b, d, o, json_object_array_get_idx(in, j));
		}
	}
	if (b.failed || !b.p) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* ---- HTTP ---- */

/*
 * libmicrohttpd runs in epoll mode without a thread of its own: ours waits
 * on its epoll descriptor (and a stop eventfd) and calls MHD_run, so that
 * the deadline of each connection is checked on the thread that owns the
 * connections. A connection past its deadline is shut down: MHD sees its
 * end and closes it within the same thread.
 */
struct mconn {
	struct mconn *prev, *next;
	int fd;
	bool busy;               /* a request arrived whole and is being answered */
	uint64_t since;          /* opened, or its last answer went out (ms) */
	char peer[64];
};

struct metrics_http {
	struct MHD_Daemon *d;
	metrics_fn fn;
	void *priv;
	char addr[80];           /* as given, for the log */
	unsigned port;
	int epfd, stopfd;        /* thread: what it waits on; caller: MHD's own epoll fd */
	bool caller;             /* METRICS_HTTP_CALLER: served by rpc_serve */
	pthread_t thread;
	struct mconn *conns;     /* the thread's own */
	uint64_t cut;            /* connections cut for a request too slow to arrive */
};

static uint64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static void sockaddr_text(const struct sockaddr *sa, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN] = "?";

	if (sa && sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
	} else if (sa && sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "?");
	}
}

/*
 * libmicrohttpd's own lines: to our log, rate-limited. Those about a
 * connection (a client closing early, the per-address limit) are the
 * client's doing: info; the others (the daemon's own trouble): warn.
 */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct metrics_http *h = cls;
	char line[512];
	size_t n;

	vsnprintf(line, sizeof(line), fmt, ap);
	n = strlen(line);
	while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
		line[--n] = 0;
	if (strcasestr(line, "connection"))
		log_rl(LOG_INFO, "metrics http://%s: %s", h->addr, line);
	else
		log_warn_rl("metrics http://%s: %s", h->addr, line);
}

static void notify_conn(void *cls, struct MHD_Connection *c, void **socket_ctx,
			enum MHD_ConnectionNotificationCode toe)
{
	struct metrics_http *h = cls;
	struct mconn *m = *socket_ctx;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fd = MHD_get_connection_info(
			c, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *ca = MHD_get_connection_info(
			c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

		m = calloc(1, sizeof(*m));
		if (!m || !fd) {
			/* Untracked, it is still bounded by the idle timeout. */
			free(m);
			return;
		}
		m->fd = fd->connect_fd;
		m->since = mono_ms();
		sockaddr_text(ca ? ca->client_addr : NULL, m->peer, sizeof(m->peer));
		m->next = h->conns;
		if (h->conns)
			h->conns->prev = m;
		h->conns = m;
		*socket_ctx = m;
	} else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && m) {
		if (m->prev)
			m->prev->next = m->next;
		else
			h->conns = m->next;
		if (m->next)
			m->next->prev = m->prev;
		free(m);
		*socket_ctx = NULL;
	}
}

static struct mconn *mconn_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *i = MHD_get_connection_info(
		c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return i ? i->socket_context : NULL;
}

/* An answer went out (or failed): the next request's time starts now. */
static void request_done(void *cls, struct MHD_Connection *c, void **req_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct mconn *m = mconn_of(c);

	(void)cls;
	(void)req_cls;
	(void)toe;
	if (m) {
		m->busy = false;
		m->since = mono_ms();
	}
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **req_cls)
{
	static const char not_found[] = "not found: the metrics are at /metrics\n";
	static const char not_get[] = "only GET\n";
	static const char failed[] = "the metrics could not be made\n";
	struct metrics_http *h = cls;
	struct MHD_Response *r;
	struct mconn *m = mconn_of(c);
	unsigned status = MHD_HTTP_OK;
	enum MHD_Result rc;
	char *text = NULL;

	if (m)
		m->busy = true;
	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
		r = MHD_create_response_from_buffer(sizeof(not_get) - 1, (void *)not_get,
						    MHD_RESPMEM_PERSISTENT);
	} else if (strcmp(url, "/metrics")) {
		status = MHD_HTTP_NOT_FOUND;
		r = MHD_create_response_from_buffer(sizeof(not_found) - 1, (void *)not_found,
						    MHD_RESPMEM_PERSISTENT);
	} else if (!(text = h->fn(h->priv))) {
		status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		r = MHD_create_response_from_buffer(sizeof(failed) - 1, (void *)failed,
						    MHD_RESPMEM_PERSISTENT);
	} else {
		r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	}
	if (!r) {
		free(text);
		return MHD_NO;
	}
	if (status == MHD_HTTP_OK)
		MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *len, char *why,
		      size_t whylen)
{
	char host[64];
	const char *colon, *h = addr;
	size_t hl;
	unsigned long port;
	char *end;

	if (addr[0] == '[') {
		const char *close = strchr(addr, ']');

		if (!close || close[1] != ':') {
			snprintf(why, whylen, "%s: expected [IPV6]:PORT", addr);
			return -EINVAL;
		}
		h = addr + 1;
		hl = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon) {
			snprintf(why, whylen, "%s: expected HOST:PORT (127.0.0.1:9100)", addr);
			return -EINVAL;
		}
		hl = (size_t)(colon - addr);
	}
	if (hl == 0 || hl >= sizeof(host)) {
		snprintf(why, whylen, "%s: no address before the port", addr);
		return -EINVAL;
	}
	memcpy(host, h, hl);
	host[hl] = 0;
	port = strtoul(colon + 1, &end, 10);
	if (!colon[1] || *end || port > 65535) {
		snprintf(why, whylen, "%s: the port is not a number in 0..65535", addr);
		return -EINVAL;
	}
	memset(ss, 0, sizeof(*ss));
	if (addr[0] != '[') {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;

		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		*len = sizeof(*in);
		if (inet_pton(AF_INET, host, &in->sin_addr) == 1)
			return 0;
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1)
			return 0;
	}
	snprintf(why, whylen, "%s: %s is not a numeric address", addr, host);
	return -EINVAL;
}

/* Shuts down the connections whose request has not arrived in time; the next deadline (ms). */
static uint64_t reap(struct metrics_http *h, uint64_t now)
{
	uint64_t next = UINT64_MAX;

	for (struct mconn *m = h->conns; m; m = m->next) {
		uint64_t due = m->since + METRICS_HTTP_REQ_MS;

		if (m->busy || m->fd < 0)
			continue;
		if (due <= now) {
			log_rl(LOG_INFO, "metrics http://%s: %s sent no whole request in %u ms: closed",
				    h->addr, m->peer, METRICS_HTTP_REQ_MS);
			shutdown(m->fd, SHUT_RDWR);
			m->fd = -1; /* MHD closes it; once is enough */
			h->cut++;
		} else if (due < next) {
			next = due;
		}
	}
	return next;
}

/* Closes what is overdue; the ms until something else is due (at most a second). */
static int http_prepare(void *arg)
{
	struct metrics_http *h = arg;
	MHD_UNSIGNED_LONG_LONG mhd_ms;
	uint64_t now = mono_ms(), next = reap(h, now);
	int timeout = 1000;

	if (next != UINT64_MAX && next - now < (uint64_t)timeout)
		timeout = (int)(next - now) + 1;
	if (MHD_get_timeout(h->d, &mhd_ms) == MHD_YES && mhd_ms < (MHD_UNSIGNED_LONG_LONG)timeout)
		timeout = (int)mhd_ms;
	return timeout;
}

/* libmicrohttpd's work: what is readable, and its timeouts (it checks them itself). */
static int http_run(void *arg, bool readable)
{
	struct metrics_http *h = arg;

	(void)readable;
	MHD_run(h->d);
	return 0;
}

void metrics_http_watch(struct metrics_http *h, struct rpc_watch *w)
{
	*w = (struct rpc_watch){ .fd = h->epfd, .prepare = http_prepare, .fn = http_run,
				 .priv = h };
}

static void *http_thread(void *arg)
{
	struct metrics_http *h = arg;
	struct epoll_event ev[4];

	for (;;) {
		int timeout = http_prepare(h), n;

		n = epoll_wait(h->epfd, ev, 4, timeout);
		if (n < 0 && errno != EINTR) {
			log_err("metrics http://%s: epoll_wait: %s", h->addr, strerror(errno));
			break;
		}
		for (int i = 0; i < n; i++)
			if (ev[i].data.fd == h->stopfd)
				return NULL;
		MHD_run(h->d);
	}
	return NULL;
}

/* A listening socket on ss: its fd, or a negative errno. */
static int listen_on(const struct sockaddr_storage *ss, socklen_t len)
{
	int one = 1, fd = socket(ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    (ss->ss_family == AF_INET6 &&
	     setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one))) ||
	    bind(fd, (const struct sockaddr *)ss, len) || listen(fd, 64)) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	return fd;
}

int metrics_addr_check(const char *addr, char *why, size_t whylen)
{
	struct sockaddr_storage ss;
	socklen_t len;

	return parse_addr(addr, &ss, &len, why, whylen);
}

int metrics_http_start(const char *addr, metrics_fn fn, void *priv, struct metrics_http **out,
		       char *why, size_t whylen)
{
	return metrics_http_start_flags(addr, fn, priv, 0, out, why, whylen);
}

int metrics_http_start_flags(const char *addr, metrics_fn fn, void *priv, unsigned flags,
			     struct metrics_http **out, char *why, size_t whylen)
{
	struct sockaddr_storage ss, bound;
	socklen_t len, blen = sizeof(bound);
	const union MHD_DaemonInfo *ei;
	struct epoll_event ev = { .events = EPOLLIN };
	struct metrics_http *h;
	int rc = parse_addr(addr, &ss, &len, why, whylen), lfd;

	if (rc)
		return rc;
	lfd = listen_on(&ss, len);
	if (lfd < 0) {
		snprintf(why, whylen, "%s: cannot listen: %s (%s)", addr, strerror(-lfd),
			 strerrorname_np(-lfd) ? strerrorname_np(-lfd) : "?");
		return lfd;
	}
	h = calloc(1, sizeof(*h));
	if (!h) {
		close(lfd);
		return -ENOMEM;
	}
	h->fn = fn;
	h->priv = priv;
	h->epfd = h->stopfd = -1;
	if (!getsockname(lfd, (struct sockaddr *)&bound, &blen))
		h->port = ntohs(bound.ss_family == AF_INET6 ?
				((struct sockaddr_in6 *)&bound)->sin6_port :
				((struct sockaddr_in *)&bound)->sin_port);
	/* The log names the port it got ("127.0.0.1:0" named none). */
	snprintf(h->addr, sizeof(h->addr), "%.*s:%u", (int)(strrchr(addr, ':') - addr), addr,
		 h->port);
	/* MHD owns lfd from here. Its logger goes first, or it logs the options before it. */
	h->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_ERROR_LOG |
				(ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				0, NULL, NULL, answer, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, h,
				MHD_OPTION_LISTEN_SOCKET, lfd,
				MHD_OPTION_NOTIFY_CONNECTION, notify_conn, h,
				MHD_OPTION_NOTIFY_COMPLETED, request_done, h,
				MHD_OPTION_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_CONN_MAX,
				MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)METRICS_HTTP_PER_IP_MAX,
				MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)METRICS_HTTP_IDLE_S,
				MHD_OPTION_END);
	if (!h->d) {
		rc = -EIO;
		snprintf(why, whylen, "%s: libmicrohttpd did not start (its reason is logged above)",
			 addr);
		goto fail;
	}
	ei = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
	if (flags & METRICS_HTTP_CALLER) {
		if (!ei) {
			rc = -EIO;
			snprintf(why, whylen, "%s: no epoll descriptor", addr);
			goto fail;
		}
		h->caller = true;
		h->epfd = ei->epoll_fd; /* MHD's: not closed here */
		*out = h;
		return 0;
	}
	h->epfd = epoll_create1(EPOLL_CLOEXEC);
	h->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (!ei || h->epfd < 0 || h->stopfd < 0) {
		rc = ei ? -errno : -EIO;
		snprintf(why, whylen, "%s: %s", addr, ei ? strerror(-rc) : "no epoll descriptor");
		goto fail;
	}
	ev.data.fd = ei->epoll_fd;
	if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, ei->epoll_fd, &ev)) {
		rc = -errno;
		goto fail_why;
	}
	ev.data.fd = h->stopfd;
	if (epoll_ctl(h->epfd, EPOLL_CTL_ADD, h->stopfd, &ev)) {
		rc = -errno;
		goto fail_why;
	}
	rc = -pthread_create(&h->thread, NULL, http_thread, h);
	if (rc)
		goto fail_why;
	*out = h;
	return 0;
fail_why:
	snprintf(why, whylen, "%s: %s", addr, strerror(-rc));
fail:
	if (h->d)
		MHD_stop_daemon(h->d);
	if (h->epfd >= 0)
		close(h->epfd);
	if (h->stopfd >= 0)
		close(h->stopfd);
	free(h);
	return rc;
}

unsigned metrics_http_port(struct metrics_http *h)
{
	return h->port;
}

void metrics_http_stop(struct metrics_http *h)
{
	uint64_t one = 1;

	if (!h)
		return;
	if (h->caller) {
		MHD_stop_daemon(h->d);
		free(h);
		return;
	}
	if (write(h->stopfd, &one, sizeof(one)) != sizeof(one))
		log_err("metrics http://%s: waking its thread: %s", h->addr, strerror(errno));
	pthread_join(h->thread, NULL);
	MHD_stop_daemon(h->d);
	close(h->epfd);
	close(h->stopfd);
	free(h);
}
