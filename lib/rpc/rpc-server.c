/* SPDX-License-Identifier: MIT */
/*
 * JSON-RPC 2.0 server on a Unix socket: one thread, poll() over the
 * listening socket, a stop eventfd, a wake-up eventfd and every
 * connection. Connections are non-blocking; each has its stream
 * (rpc-core.c), the bytes read and not yet fed to it, and a queue of
 * answers not yet written.
 *
 * A connection is read only while its input is used up and fewer than
 * RPC_OUT_LOW bytes of its answers wait, and fed a text at a time, so a
 * client that does not read its answers stops being served instead of
 * growing them; it is closed when its answers have not moved for
 * stall_ms (the stream keeps one text's answers within RPC_OUT_MAX; a
 * connection whose waiting answers would pass that and RPC_OUT_LOW is
 * closed as broken). A request begun
 * must be complete within request_ms, a connection with nothing under way
 * is closed after idle_ms, and at RPC_CONN_MAX connections the one that
 * has made no progress for longest (at least RPC_EVICT_MS; never one whose
 * method runs) is closed for a newcomer: stuck clients cannot lock the
 * owner out. A connection whose stream ended (bad input) is closed once
 * its last answer is out.
 *
 * RPC_SERVER_THREADED: the poll thread only moves bytes; each connection
 * has a worker thread that feeds its stream (runs its methods) from the
 * bytes read and wakes the poll thread when answers are queued. What the
 * two share of a connection is under c->lock; the poll thread reads into
 * c->in only once the worker has fed all of it. The poll thread decides
 * when a connection is closed (dead); the worker frees it (conn_free) once
 * it sees that (gone), after the method it runs, if any. A connection
 * whose method runs has no time limit.
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
/* A threaded server's stop: how long the answers of the methods in progress may take to go. */
#define RPC_DRAIN_MS 1000

struct rpc_conn {
	struct rpc_server *s;
	int fd;
	unsigned serial;          /* for the log */
	struct rpc_stream *st;
	pthread_mutex_t lock;     /* what follows, where a worker shares it */
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
	/* RPC_SERVER_THREADED */
	pthread_cond_t cond;      /* the worker waits for input or gone */
	bool busy;                /* the worker feeds (a method runs); in[] is its */
	bool hup;                 /* hung up while busy: not polled until the method ends */
	bool gone;                /* closed: the worker frees it */
};

struct rpc_server {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	char name[64];
	const struct rpc_method *methods;
	size_t nr_methods;
	void *priv;
	unsigned flags;
	int lfd, efd, wfd;        /* listening; stop; wake (a worker queued answers) */
	struct stat st;           /* the socket file we made: only that one is removed */
	pthread_t thread;
	struct rpc_conn *conns[RPC_CONN_MAX];
	unsigned nr_conns, serial;
	_Atomic unsigned idle_ms, request_ms, stall_ms;
	pthread_mutex_t lock;     /* workers */
	pthread_cond_t cond;      /* a worker ended */
	unsigned workers;         /* worker threads not yet ended */
	/*
	 * Threaded, stopping: nothing more is read or accepted; the methods in
	 * progress end and their answers go out, for up to RPC_DRAIN_MS.
	 */
	bool draining;            /* the poll thread's */
	uint64_t drain_end_ms;
};

static uint64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static bool threaded(const struct rpc_server *s)
{
	return s->flags & RPC_SERVER_THREADED;
}

/* The poll thread looks at the connections again (a worker's answers). */
static void server_wake(struct rpc_server *s)
{
	uint64_t one = 1;

	if (write(s->wfd, &one, sizeof(one)) != sizeof(one) && errno != EAGAIN)
		log_err("%s: waking the server thread: %s", s->name, strerror(errno));
}

static size_t out_pending(const struct rpc_conn *c)
{
	return c->len - c->off;
}

/* The stream's answers: c->lock is taken here (a worker's stream calls it). */
static int conn_out(void *priv, const char *text, size_t len)
{
	struct rpc_conn *c = priv;
	int rc = 0;

	pthread_mutex_lock(&c->lock);
	if (out_pending(c) + len > RPC_OUT_MAX + RPC_OUT_LOW) { /* a text's, and what waited */
		rc = -ENOBUFS;
		goto out;
	}
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
			if (!p) {
				rc = -ENOMEM;
				goto out;
			}
			c->out = p;
			c->cap = cap;
		}
	}
	memcpy(c->out + c->len, text, len);
	c->len += len;
out:
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* Poll thread, c->lock held: writes what the socket takes. */
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

/* c->lock held: the outcome of feeding c's stream a text (rpc_stream_feed_text). */
static void conn_fed(struct rpc_server *s, struct rpc_conn *c, int rc, bool idle)
{
	if (rc == -ENOBUFS) {
		log_warn("%s: connection %u: answers to one request over %u MiB: closed",
			 s->name, c->serial, RPC_OUT_MAX >> 20);
		c->dead = true;
	} else if (rc < 0) {
		log_info("%s: connection %u: %s: closed after the error answer", s->name,
			 c->serial, rc == -EPROTO ? "bad request stream" : strerror(-rc));
		c->ending = true;
		c->in_off = c->in_len; /* the stream takes nothing more */
	} else if (rc > 0) {
		c->progress_ms = mono_ms(); /* a text answered */
	} else if (idle && rpc_stream_partial(c->st)) {
		c->partial_ms = mono_ms(); /* a text begun */
	}
	if (c->in_off == c->in_len)
		c->in_off = c->in_len = 0;
}

/* Whether c has input to feed now: a text at a time, while few answers wait. */
static bool conn_feedable(const struct rpc_conn *c)
{
	return !c->dead && !c->ending && c->in_off < c->in_len && out_pending(c) < RPC_OUT_LOW;
}

/*
 * c->lock held, not threaded: feeds the stream from c->in. The lock is let
 * go around the feed: the stream's answers take it (conn_out).
 */
static void conn_feed(struct rpc_server *s, struct rpc_conn *c)
{
	while (conn_feedable(c)) {
		bool idle = !rpc_stream_partial(c->st);
		size_t used = 0;
		int rc;

		pthread_mutex_unlock(&c->lock);
		rc = rpc_stream_feed_text(c->st, c->in + c->in_off, c->in_len - c->in_off, &used);
		pthread_mutex_lock(&c->lock);
		c->in_off += used;
		conn_fed(s, c, rc, idle);
	}
}

/* Poll thread, c->lock held: reads once the input is used up. */
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
	if (threaded(s))
		pthread_cond_signal(&c->cond);
}

/* Whether the poll thread may read c now. */
static bool conn_readable(const struct rpc_server *s, const struct rpc_conn *c)
{
	return !c->eof && !c->ending && !c->busy && c->in_off == c->in_len &&
	       out_pending(c) < RPC_OUT_LOW && !s->draining;
}

/* Poll thread, c->lock held: reads, answers and writes as far as the client lets it. */
static void conn_serve(struct rpc_server *s, struct rpc_conn *c, short re)
{
	if ((re & (POLLIN | POLLHUP | POLLERR)) && conn_readable(s, c))
		conn_read(s, c);
	else if ((re & (POLLHUP | POLLERR)) && (c->eof || c->ending))
		c->dead = true; /* nobody reads the rest */
	else if ((re & (POLLHUP | POLLERR)) && c->busy)
		/*
		 * Hung up under a method that runs on (a client that gave up
		 * waiting): poll reports the hang-up whatever it is asked, so
		 * the fd is left out until the worker's wake; then what the
		 * client sent before it went is read as before.
		 */
		c->hup = true;
	/* Feed (here, or by the worker) and write in turns until input or room runs out. */
	while (!c->dead) {
		if (!threaded(s))
			conn_feed(s, c);
		conn_flush(c);
		if (threaded(s)) {
			/* After the flush: answers just written may be what held the input back. */
			if (!c->dead && conn_feedable(c) && !c->busy)
				pthread_cond_signal(&c->cond);
			break;
		}
		if (c->dead || c->ending || c->in_off == c->in_len || out_pending(c))
			break;
	}
	if (!c->dead && !c->busy && !out_pending(c) &&
	    (c->ending || (c->eof && c->in_off == c->in_len)))
		c->dead = true; /* all answered */
}

/*
 * c->lock held: which of c's time limits has passed (a text for the log),
 * or NULL; *next: its next deadline. None while its method runs.
 */
static const char *conn_expired(struct rpc_server *s, const struct rpc_conn *c, uint64_t now,
				uint64_t *next)
{
	uint64_t due;
	const char *why;

	if (c->busy) {
		return NULL;
	} else if (out_pending(c)) {
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
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c->in);
	free(c->out);
	free(c);
}

/*
 * A threaded connection's worker: feeds what the poll thread read, a text
 * at a time (its methods run here), until the poll thread is done with the
 * connection; then frees it. While busy, c->in is the worker's alone.
 */
static void *conn_worker(void *arg)
{
	struct rpc_conn *c = arg;
	struct rpc_server *s = c->s;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		size_t used = 0;
		bool idle;
		int rc;

		while (!c->gone && !conn_feedable(c))
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->gone)
			break;
		idle = !rpc_stream_partial(c->st);
		c->busy = true;
		pthread_mutex_unlock(&c->lock);
		rc = rpc_stream_feed_text(c->st, c->in + c->in_off, c->in_len - c->in_off, &used);
		pthread_mutex_lock(&c->lock);
		c->busy = false;
		c->in_off += used;
		conn_fed(s, c, rc, idle);
		server_wake(s);
	}
	pthread_mutex_unlock(&c->lock);
	conn_free(c);
	pthread_mutex_lock(&s->lock);
	if (--s->workers == 0)
		pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* The poll thread is done with c: closed now (not threaded), or by its worker. */
static void conn_drop(struct rpc_server *s, struct rpc_conn *c)
{
	if (!threaded(s)) {
		conn_free(c);
		return;
	}
	shutdown(c->fd, SHUT_RDWR); /* the peer sees the end now, not after a method */
	pthread_mutex_lock(&c->lock);
	c->gone = true;
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

/*
 * The connection that has made no progress for longest, if RPC_EVICT_MS
 * at least and no method of its runs; else -1.
 */
static int evict_victim(const struct rpc_server *s, uint64_t now, uint64_t *next)
{
	uint64_t vprog = 0;
	int v = -1;

	for (unsigned i = 0; i < s->nr_conns; i++) {
		struct rpc_conn *c = s->conns[i];
		uint64_t prog;
		bool busy;

		/* Both under the lock: a worker answering it moves progress_ms (conn_fed). */
		pthread_mutex_lock(&c->lock);
		busy = c->busy;
		prog = c->progress_ms;
		pthread_mutex_unlock(&c->lock);
		if (!busy && (v < 0 || prog < vprog)) {
			v = (int)i;
			vprog = prog;
		}
	}
	if (v >= 0 && vprog + RPC_EVICT_MS > now) {
		if (vprog + RPC_EVICT_MS < *next)
			*next = vprog + RPC_EVICT_MS;
		return -1;
	}
	return v;
}

/* A new connection on fd: 0, or the errno (fd closed). */
static int conn_new(struct rpc_server *s, int fd, uint64_t now)
{
	struct rpc_conn *c = calloc(1, sizeof(*c));

	if (c)
		c->st = rpc_stream_new(s->methods, s->nr_methods, s->priv, conn_out, c);
	if (!c || !c->st) {
		log_err("%s: a new connection: out of memory", s->name);
		free(c);
		close(fd);
		return -ENOMEM;
	}
	c->s = s;
	c->fd = fd;
	c->serial = ++s->serial;
	c->progress_ms = c->rx_ms = now;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (threaded(s)) {
		pthread_attr_t attr;
		pthread_t t;
		int rc;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_mutex_lock(&s->lock);
		rc = pthread_create(&t, &attr, conn_worker, c);
		s->workers += !rc;
		pthread_mutex_unlock(&s->lock);
		pthread_attr_destroy(&attr);
		if (rc) {
			log_err("%s: a new connection: no thread: %s", s->name, strerror(rc));
			conn_free(c);
			return -rc;
		}
	}
	s->conns[s->nr_conns++] = c;
	return 0;
}

/* The listener is readable: accepts what waits, making room for one if at the limit. */
static void server_accept(struct rpc_server *s)
{
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
			conn_drop(s, s->conns[v]);
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
		if (conn_new(s, fd, now))
			return;
	}
}

/* The watches' prepare: the first non-zero return, else 0; lowers *timeout to theirs. */
static int watches_prepare(const struct rpc_watch *w, size_t nw, int *timeout)
{
	for (size_t i = 0; i < nw; i++) {
		int t = w[i].prepare ? w[i].prepare(w[i].priv) : -1;

		if (t < -1)
			return t;
		if (t >= 0 && (*timeout < 0 || t < *timeout))
			*timeout = t;
	}
	return 0;
}

/* The watches' fn, after the wait (pfd: their poll entries): the first non-zero return. */
static int watches_run(const struct rpc_watch *w, size_t nw, const struct pollfd *pfd)
{
	for (size_t i = 0; i < nw; i++) {
		int rc = w[i].fn(w[i].priv, pfd[i].revents != 0);

		if (rc)
			return rc;
	}
	return 0;
}

/* rpc_serve without a server: the watches alone. */
static int serve_watches(const struct rpc_watch *w, size_t nw)
{
	struct pollfd pfd[RPC_WATCH_MAX];

	for (;;) {
		int timeout = -1, rc = watches_prepare(w, nw, &timeout);

		if (rc)
			return rc;
		for (size_t i = 0; i < nw; i++)
			pfd[i] = (struct pollfd){ .fd = w[i].fd, .events = POLLIN };
		if (poll(pfd, nw, timeout) < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			log_err("rpc_serve: poll: %s", strerror(errno));
			return rc;
		}
		rc = watches_run(w, nw, pfd);
		if (rc)
			return rc;
	}
}

/*
 * The loop is asked to end (stopped, or a watch's value rc, kept in
 * *ended): true to end now; threaded, it drains first (the answers of
 * the methods in progress go out).
 */
static bool serve_ending(struct rpc_server *s, int rc, int *ended)
{
	*ended = rc;
	if (!threaded(s))
		return true;
	s->drain_end_ms = mono_ms() + RPC_DRAIN_MS;
	s->draining = true;
	return false;
}

/*
 * The server's loop, on its thread or (RPC_SERVER_CALLER) rpc_serve's
 * with the watches w: returns 0 when stopped (efd), or a watch's value.
 */
static int serve(struct rpc_server *s, const struct rpc_watch *w, size_t nw)
{
	struct pollfd pfd[RPC_CONN_MAX + 3 + RPC_WATCH_MAX];
	int ended = 0;

	for (;;) {
		uint64_t now = mono_ms(), next = UINT64_MAX;
		bool pending = false;
		unsigned n = 0;
		int timeout, rc;

		/* Time limits first: what expired goes, the rest say when to wake. */
		for (unsigned i = 0; i < s->nr_conns && !s->draining;) {
			struct rpc_conn *c = s->conns[i];
			const char *why;

			pthread_mutex_lock(&c->lock);
			why = conn_expired(s, c, now, &next);
			pthread_mutex_unlock(&c->lock);
			if (why) {
				log_info("%s: connection %u: closed: %s", s->name, c->serial, why);
				conn_drop(s, c);
				s->conns[i] = s->conns[--s->nr_conns];
			} else {
				i++;
			}
		}
		pfd[n++] = (struct pollfd){ .fd = s->draining ? -1 : s->efd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = s->wfd, .events = POLLIN };
		/* At the limit, new clients wait in the backlog until one can make room. */
		pfd[n++] = (struct pollfd){
			.fd = s->draining ? -1 :
			      s->nr_conns < RPC_CONN_MAX || evict_victim(s, now, &next) >= 0 ? s->lfd :
			      -1,
			.events = POLLIN,
		};
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];

			pthread_mutex_lock(&c->lock);
			if (!c->busy)
				c->hup = false;
			pfd[n++] = (struct pollfd){
				.fd = c->hup ? -1 : c->fd,
				.events = (short)((conn_readable(s, c) ? POLLIN : 0) |
						  (out_pending(c) ? POLLOUT : 0)),
			};
			pending |= c->busy || c->in_off < c->in_len || out_pending(c);
			pthread_mutex_unlock(&c->lock);
		}
		timeout = next == UINT64_MAX ? -1 : next > now + 60000 ? 60000 : (int)(next - now) + 1;
		if (s->draining) {
			/* Done when no method runs and every answer is out, or at the deadline. */
			if (!pending || now >= s->drain_end_ms)
				break;
			timeout = (int)(s->drain_end_ms - now);
		} else if ((rc = watches_prepare(w, nw, &timeout))) {
			if (serve_ending(s, rc, &ended))
				break;
			continue;
		}
		for (size_t i = 0; i < nw; i++)
			pfd[n + i] = (struct pollfd){ .fd = s->draining ? -1 : w[i].fd, .events = POLLIN };
		if (poll(pfd, n + nw, timeout) < 0) {
			int err = errno;

			if (err == EINTR)
				continue;
			log_err("%s: poll: %s", s->name, strerror(err));
			if (!ended)
				ended = -err;
			break;
		}
		rc = s->draining ? 0 : watches_run(w, nw, pfd + n);
		if (pfd[0].revents || rc) {
			if (serve_ending(s, rc, &ended))
				break;
			continue;
		}
		if (pfd[1].revents) {
			uint64_t v;

			if (read(s->wfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				log_err("%s: wake-up: %s", s->name, strerror(errno));
		}
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];

			pthread_mutex_lock(&c->lock);
			/* A worker's answers (wfd) are written whatever poll said of the socket. */
			if (pfd[3 + i].revents || (pfd[1].revents && out_pending(c)) ||
			    (pfd[1].revents && !c->busy && (c->ending || c->eof)))
				conn_serve(s, c, pfd[3 + i].revents);
			pthread_mutex_unlock(&c->lock);
		}
		/* Closed ones out, in place (pfd is rebuilt next round). */
		for (unsigned i = 0; i < s->nr_conns;) {
			struct rpc_conn *c = s->conns[i];
			bool dead;

			pthread_mutex_lock(&c->lock);
			dead = c->dead;
			pthread_mutex_unlock(&c->lock);
			if (dead) {
				conn_drop(s, c);
				s->conns[i] = s->conns[--s->nr_conns];
			} else {
				i++;
			}
		}
		if (pfd[2].revents & POLLIN)
			server_accept(s);
	}
	return ended;
}

static void *server_thread(void *arg)
{
	serve(arg, NULL, 0);
	return NULL;
}

int rpc_serve(struct rpc_server *s, const struct rpc_watch *w, size_t n)
{
	if (n > RPC_WATCH_MAX || (s && !(s->flags & RPC_SERVER_CALLER)))
		return -EINVAL;
	return s ? serve(s, w, n) : serve_watches(w, n);
}

/* Whether something answers on the Unix socket a: 1 yes, 0 no (stale), or a negative errno. */
static int socket_alive(const struct sockaddr_un *a)
{
	/* Non-blocking: a live but stuck program with a full backlog is alive (EAGAIN), not waited for. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), rc;

	if (fd < 0)
		return -errno;
	rc = connect(fd, (const struct sockaddr *)a, sizeof(*a)) ? -errno : 1;
	close(fd);
	if (rc == -EAGAIN || rc == -EINPROGRESS)
		rc = 1;
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
	return rpc_server_start_flags(path, name, methods, nr_methods, priv, 0, out);
}

int rpc_server_start_flags(const char *path, const char *name, const struct rpc_method *methods,
			   size_t nr_methods, void *priv, unsigned flags, struct rpc_server **out)
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
	s->flags = flags;
	s->idle_ms = RPC_IDLE_MS;
	s->request_ms = RPC_REQUEST_MS;
	s->stall_ms = RPC_STALL_MS;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->wfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->efd < 0 || s->wfd < 0 || s->lfd < 0) {
		rc = -errno;
		goto fail;
	}
	rc = server_bind(s, path);
	if (rc)
		goto fail;
	rc = flags & RPC_SERVER_CALLER ? 0 : -pthread_create(&s->thread, NULL, server_thread, s);
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
	if (s->wfd >= 0)
		close(s->wfd);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	free(s);
	return rc;
}

void rpc_server_stop(struct rpc_server *s)
{
	struct stat st;
	uint64_t one = 1;

	if (!s)
		return;
	if (!(s->flags & RPC_SERVER_CALLER)) {
		if (write(s->efd, &one, sizeof(one)) != sizeof(one))
			log_err("%s: waking the server thread: %s", s->name, strerror(errno));
		pthread_join(s->thread, NULL);
	}
	for (unsigned i = 0; i < s->nr_conns; i++)
		conn_drop(s, s->conns[i]);
	/* Threaded: each worker ends after the method it runs, if any. */
	pthread_mutex_lock(&s->lock);
	while (s->workers)
		pthread_cond_wait(&s->cond, &s->lock);
	pthread_mutex_unlock(&s->lock);
	close(s->lfd);
	close(s->efd);
	close(s->wfd);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
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
