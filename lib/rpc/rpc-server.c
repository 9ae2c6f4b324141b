/* SPDX-License-Identifier: MIT */
/*
 * JSON-RPC 2.0 server on a Unix socket: one thread, poll() over the
 * listening socket, a wake-up eventfd and every connection. Connections
 * are non-blocking; each has its stream (rpc-core.c), the bytes read and
 * not yet fed to it, and a queue of answers not yet written.
 *
 * A connection is read only while fewer than RPC_OUT_LOW bytes of its
 * answers wait, and fed a text at a time, so a client that does not read
 * its answers stops being served instead of growing them; it is closed
 * when its answers have not moved for stall_ms, or when one text's answers
 * pass RPC_OUT_MAX. A request begun must be complete within request_ms, a
 * connection with nothing under way is closed after idle_ms, and at
 * RPC_CONN_MAX connections the one that has made no progress for longest
 * (at least RPC_EVICT_MS) is closed for a newcomer: stuck clients cannot
 * lock the owner out. A connection whose stream ended (bad input) is
 * closed once its last answer is out.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "rpc.h"

#define RPC_IN_MAX 65536          /* bytes read from a connection at once */
#define RPC_EVICT_MS 1000         /* no progress this long: may make room for a newcomer */

struct rpc_conn {
	int fd;
	unsigned serial;          /* for the log */
	struct rpc_stream *st;
	char *in;                 /* read, not yet fed: in[in_off..in_len) */
	size_t in_off, in_len;
	char *out;                /* answers not yet written: out[off..len) */
	size_t len, off, cap;
	uint64_t progress_ms;     /* accepted, a request answered, or answers written */
	uint64_t partial_ms;      /* when the text under way began (rpc_stream_partial) */
	uint64_t rx_ms;           /* the last byte read */
	uint64_t tx_ms;           /* answers began to wait, or the last byte written */
	bool eof;                 /* the client sends no more: close once all is answered */
	bool ending;              /* its stream is over: close once out is written */
	bool dead;                /* close now */
};

struct rpc_server {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char name[64];
	const struct rpc_method *methods;
	size_t nr_methods;
	void *priv;
	int lfd, efd;
	struct stat st;           /* the socket file we made: only that one is removed */
	pthread_t thread;
	struct rpc_conn *conns[RPC_CONN_MAX];
	unsigned nr_conns, serial;
	_Atomic unsigned idle_ms, request_ms, stall_ms;
};

static uint64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static size_t out_pending(const struct rpc_conn *c)
{
	return c->len - c->off;
}

static int conn_out(void *priv, const char *text, size_t len)
{
	struct rpc_conn *c = priv;

	if (out_pending(c) + len > RPC_OUT_MAX)
		return -ENOBUFS;
	if (!out_pending(c))
		c->tx_ms = mono_ms(); /* the stall clock starts when answers begin to wait */
	if (c->off && c->off == c->len)
		c->off = c->len = 0;
	if (c->len + len > c->cap) {
		size_t cap = c->cap ? c->cap : 4096;
		char *p;

		/* Reclaim what was written before growing. */
		if (c->off) {
			memmove(c->out, c->out + c->off, c->len - c->off);
			c->len -= c->off;
			c->off = 0;
		}
		while (cap < c->len + len)
			cap *= 2;
		if (cap > c->cap) {
			p = realloc(c->out, cap);
			if (!p)
				return -ENOMEM;
			c->out = p;
			c->cap = cap;
		}
	}
	memcpy(c->out + c->len, text, len);
	c->len += len;
	return 0;
}

/* Writes what the socket takes. */
static void conn_flush(struct rpc_conn *c)
{
	while (c->off < c->len) {
		ssize_t n = send(c->fd, c->out + c->off, c->len - c->off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			c->dead = true; /* gone: EPIPE, ECONNRESET */
			return;
		}
		c->off += (size_t)n;
		c->progress_ms = c->tx_ms = mono_ms();
	}
	/* All written: a big answer's buffer goes back (a stuck client keeps none). */
	if (c->cap > RPC_OUT_LOW) {
		free(c->out);
		c->out = NULL;
		c->cap = 0;
	}
	c->off = c->len = 0;
}

/* Feeds the stream from c->in, a text at a time, while few answers wait. */
static void conn_feed(struct rpc_server *s, struct rpc_conn *c)
{
	while (!c->dead && !c->ending && c->in_off < c->in_len && out_pending(c) < RPC_OUT_LOW) {
		bool idle = !rpc_stream_partial(c->st);
		size_t used = 0;
		int rc = rpc_stream_feed_text(c->st, c->in + c->in_off, c->in_len - c->in_off, &used);

		c->in_off += used;
		if (rc == -ENOBUFS) {
			log_warn("%s: connection %u: answers to one request over %u MiB: closed",
				 s->name, c->serial, RPC_OUT_MAX >> 20);
			c->dead = true;
		} else if (rc < 0) {
			log_info("%s: connection %u: %s: closed after the error answer", s->name,
				 c->serial, rc == -EPROTO ? "bad request stream" : strerror(-rc));
			c->ending = true;
		} else if (rc > 0) {
			c->progress_ms = mono_ms(); /* a text answered */
		} else if (idle && rpc_stream_partial(c->st)) {
			c->partial_ms = mono_ms(); /* a text begun */
		}
	}
	if (c->in_off == c->in_len)
		c->in_off = c->in_len = 0;
}

static void conn_read(struct rpc_server *s, struct rpc_conn *c)
{
	ssize_t n;

	if (!c->in && !(c->in = malloc(RPC_IN_MAX))) {
		log_err("%s: connection %u: out of memory: closed", s->name, c->serial);
		c->dead = true;
		return;
	}
	n = recv(c->fd, c->in, RPC_IN_MAX, MSG_DONTWAIT);
	if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		/* The client is done sending: what it sent is still answered. */
		c->eof = true;
		return;
	}
	c->in_off = 0;
	c->in_len = (size_t)n;
	c->rx_ms = mono_ms();
}

/* Reads, answers and writes as far as the client lets it. */
static void conn_serve(struct rpc_server *s, struct rpc_conn *c, short re)
{
	if ((re & (POLLIN | POLLHUP | POLLERR)) && !c->eof && !c->ending && !c->in_len &&
	    out_pending(c) < RPC_OUT_LOW)
		conn_read(s, c);
	else if ((re & (POLLHUP | POLLERR)) && (c->eof || c->ending))
		c->dead = true; /* nobody reads the rest */
	/* Feed and write in turns until the input is used up or the socket is full. */
	while (!c->dead) {
		conn_feed(s, c);
		conn_flush(c);
		if (c->dead || c->ending || c->in_off == c->in_len || out_pending(c))
			break;
	}
	if (!c->dead && !out_pending(c) && (c->ending || (c->eof && c->in_off == c->in_len)))
		c->dead = true; /* all answered */
}

/* Which of c's time limits has passed (a text for the log), or NULL; *next: its next deadline. */
static const char *conn_expired(struct rpc_server *s, const struct rpc_conn *c, uint64_t now,
				uint64_t *next)
{
	uint64_t due;
	const char *why;

	if (out_pending(c)) {
		due = c->tx_ms + atomic_load(&s->stall_ms);
		why = "its answers have not been read";
	} else if (rpc_stream_partial(c->st) && !c->eof) {
		due = c->partial_ms + atomic_load(&s->request_ms);
		why = "its request has not arrived whole";
	} else if (!c->eof && !c->ending) {
		due = (c->rx_ms > c->progress_ms ? c->rx_ms : c->progress_ms) +
		      atomic_load(&s->idle_ms);
		why = "it has been idle";
	} else {
		return NULL;
	}
	if (due <= now)
		return why;
	if (due < *next)
		*next = due;
	return NULL;
}

static void conn_free(struct rpc_conn *c)
{
	close(c->fd);
	rpc_stream_free(c->st);
	free(c->in);
	free(c->out);
	free(c);
}

/* The connection that has made no progress for longest, if RPC_EVICT_MS at least; else -1. */
static int evict_victim(const struct rpc_server *s, uint64_t now, uint64_t *next)
{
	int v = -1;

	for (unsigned i = 0; i < s->nr_conns; i++)
		if (v < 0 || s->conns[i]->progress_ms < s->conns[v]->progress_ms)
			v = (int)i;
	if (v >= 0 && s->conns[v]->progress_ms + RPC_EVICT_MS > now) {
		if (s->conns[v]->progress_ms + RPC_EVICT_MS < *next)
			*next = s->conns[v]->progress_ms + RPC_EVICT_MS;
		return -1;
	}
	return v;
}

/* The listener is readable: accepts what waits, making room for one if at the limit. */
static void server_accept(struct rpc_server *s)
{
	struct rpc_conn *c;
	uint64_t now = mono_ms(), next;
	bool waits = true;        /* poll said so; after an accept, only accept4 knows */
	int fd, v;

	for (;;) {
		if (s->nr_conns == RPC_CONN_MAX) {
			next = UINT64_MAX;
			v = waits ? evict_victim(s, now, &next) : -1;
			if (v < 0)
				return; /* the next round polls the listener again if it may */
			log_info("%s: connection %u: no progress in %llu ms, closed for a new one "
				 "(%u connections at most)", s->name, s->conns[v]->serial,
				 (unsigned long long)(now - s->conns[v]->progress_ms), RPC_CONN_MAX);
			conn_free(s->conns[v]);
			s->conns[v] = s->conns[--s->nr_conns];
		}
		fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    errno != ECONNABORTED)
				log_err("%s: accept: %s", s->name, strerror(errno));
			return;
		}
		waits = false;
		c = calloc(1, sizeof(*c));
		if (c)
			c->st = rpc_stream_new(s->methods, s->nr_methods, s->priv, conn_out, c);
		if (!c || !c->st) {
			log_err("%s: a new connection: out of memory", s->name);
			if (c)
				free(c);
			close(fd);
			return;
		}
		c->fd = fd;
		c->serial = ++s->serial;
		c->progress_ms = c->rx_ms = now;
		s->conns[s->nr_conns++] = c;
	}
}

static void *server_thread(void *arg)
{
	struct rpc_server *s = arg;
	struct pollfd pfd[RPC_CONN_MAX + 2];

	for (;;) {
		uint64_t now = mono_ms(), next = UINT64_MAX;
		unsigned n = 0;
		int timeout;

		/* Time limits first: what expired goes, the rest say when to wake. */
		for (unsigned i = 0; i < s->nr_conns;) {
			struct rpc_conn *c = s->conns[i];
			const char *why = conn_expired(s, c, now, &next);

			if (why) {
				log_info("%s: connection %u: closed: %s", s->name, c->serial, why);
				conn_free(c);
				s->conns[i] = s->conns[--s->nr_conns];
			} else {
				i++;
			}
		}
		pfd[n++] = (struct pollfd){ .fd = s->efd, .events = POLLIN };
		/* At the limit, new clients wait in the backlog until one can make room. */
		pfd[n++] = (struct pollfd){
			.fd = s->nr_conns < RPC_CONN_MAX || evict_victim(s, now, &next) >= 0 ? s->lfd : -1,
			.events = POLLIN,
		};
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];
			bool rd = !c->eof && !c->ending && !c->in_len && out_pending(c) < RPC_OUT_LOW;

			pfd[n++] = (struct pollfd){
				.fd = c->fd,
				.events = (short)((rd ? POLLIN : 0) | (out_pending(c) ? POLLOUT : 0)),
			};
		}
		timeout = next == UINT64_MAX ? -1 : next > now + 60000 ? 60000 : (int)(next - now) + 1;
		if (poll(pfd, n, timeout) < 0) {
			if (errno == EINTR)
				continue;
			log_err("%s: poll: %s", s->name, strerror(errno));
			break;
		}
		if (pfd[0].revents)
			break;
		for (unsigned i = 0; i < s->nr_conns; i++)
			if (pfd[2 + i].revents)
				conn_serve(s, s->conns[i], pfd[2 + i].revents);
		/* Closed ones out, in place (pfd is rebuilt next round). */
		for (unsigned i = 0; i < s->nr_conns;) {
			if (s->conns[i]->dead) {
				conn_free(s->conns[i]);
				s->conns[i] = s->conns[--s->nr_conns];
			} else {
				i++;
			}
		}
		if (pfd[1].revents & POLLIN)
			server_accept(s);
	}
	return NULL;
}

/* Whether something answers on the Unix socket a: 1 yes, 0 no (stale), or a negative errno. */
static int socket_alive(const struct sockaddr_un *a)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;

	if (fd < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)a, sizeof(*a)) ? -errno : 1;
	close(fd);
	return rc == -ECONNREFUSED ? 0 : rc;
}

/*
 * Binds s->lfd to path. Something already there is replaced only when it
 * is a socket nobody answers on (left by a program that died): a file of
 * any other kind, or a live program's socket, is refused, so a mistyped
 * path never deletes a disk image.
 */
static int server_bind(struct rpc_server *s, const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int rc;

	memcpy(a.sun_path, path, strlen(path) + 1);
	rc = bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) ? -errno : 0;
	if (rc == -EADDRINUSE) {
		if (lstat(path, &st))
			return -errno;
		if (!S_ISSOCK(st.st_mode)) {
			log_err("%s: %s exists and is not a socket: not replacing it", s->name, path);
			return -EEXIST;
		}
		rc = socket_alive(&a);
		if (rc) {
			if (rc > 0)
				log_err("%s: another program answers on %s", s->name, path);
			return rc > 0 ? -EADDRINUSE : rc;
		}
		if (unlink(path) && errno != ENOENT)
			return -errno;
		rc = bind(s->lfd, (struct sockaddr *)&a, sizeof(a)) ? -errno : 0;
	}
	/* Before listen(), nobody can connect: the mode is set in time. */
	if (!rc && chmod(path, 0600))
		rc = -errno;
	if (!rc && listen(s->lfd, 16))
		rc = -errno;
	if (!rc && stat(path, &s->st))
		rc = -errno;
	return rc;
}

int rpc_server_start(const char *path, const char *name, const struct rpc_method *methods,
		     size_t nr_methods, void *priv, struct rpc_server **out)
{
	struct rpc_server *s;
	int rc;

	if (!path || !*path || !methods)
		return -EINVAL;
	if (strlen(path) >= sizeof(s->path))
		return -ENAMETOOLONG;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	memcpy(s->path, path, strlen(path) + 1);
	snprintf(s->name, sizeof(s->name), "%s", name ? name : "control");
	s->methods = methods;
	s->nr_methods = nr_methods;
	s->priv = priv;
	s->idle_ms = RPC_IDLE_MS;
	s->request_ms = RPC_REQUEST_MS;
	s->stall_ms = RPC_STALL_MS;
	s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->efd < 0 || s->lfd < 0) {
		rc = -errno;
		goto fail;
	}
	rc = server_bind(s, path);
	if (rc)
		goto fail;
	rc = -pthread_create(&s->thread, NULL, server_thread, s);
	if (rc) {
		unlink(path);
		goto fail;
	}
	*out = s;
	return 0;
fail:
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->efd >= 0)
		close(s->efd);
	free(s);
	return rc;
}

void rpc_server_stop(struct rpc_server *s)
{
	struct stat st;
	uint64_t one = 1;

	if (!s)
		return;
	if (write(s->efd, &one, sizeof(one)) != sizeof(one))
		log_err("%s: waking the server thread: %s", s->name, strerror(errno));
	pthread_join(s->thread, NULL);
	for (unsigned i = 0; i < s->nr_conns; i++)
		conn_free(s->conns[i]);
	close(s->lfd);
	close(s->efd);
	if (!stat(s->path, &st) && st.st_dev == s->st.st_dev && st.st_ino == s->st.st_ino)
		unlink(s->path);
	free(s);
}

void rpc_server_set_times(struct rpc_server *s, unsigned idle_ms, unsigned request_ms,
			  unsigned stall_ms)
{
	atomic_store(&s->idle_ms, idle_ms);
	atomic_store(&s->request_ms, request_ms);
	atomic_store(&s->stall_ms, stall_ms);
}
