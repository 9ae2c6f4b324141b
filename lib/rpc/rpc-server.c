/* SPDX-License-Identifier: MIT */
/*
 * JSON-RPC 2.0 server on a Unix socket: one thread, poll() over the
 * listening socket, a stop eventfd, a wake-up eventfd and every
 * connection. Connections are non-blocking; each has its stream
 * (rpc-core.c) and a queue of answers not yet written. A connection whose
 * stream ended (bad input) is closed once its last answer is out; one
 * that leaves more than RPC_OUT_MAX unread is closed at once.
 *
 * RPC_SERVER_THREADED: the poll thread only moves bytes; each connection
 * has a worker thread that feeds its stream (runs its methods) from the
 * bytes read (c->in) and wakes the poll thread when answers are queued.
 * What the two threads share of a connection is under c->lock. The poll
 * thread decides when a connection is closed (dead); the worker frees it
 * (conn_free) once it sees that (gone), after the method it runs, if any.
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

struct rpc_conn {
	struct rpc_server *s;
	int fd;
	unsigned serial;          /* for the log */
	struct rpc_stream *st;
	pthread_mutex_t lock;     /* what follows, where the worker shares it */
	char *out;                /* answers not yet written: out[off..len) */
	size_t len, off, cap;
	bool ending;              /* its stream is over: close once out is written */
	bool dead;                /* close now */
	/* RPC_SERVER_THREADED */
	pthread_cond_t cond;      /* the worker waits for input or gone */
	char *in;                 /* read, not fed yet */
	size_t in_len, in_cap;
	bool busy;                /* the worker feeds (a method runs) */
	bool gone;                /* closed: the worker frees it */
};

/* Bytes a threaded connection may have read and not fed: then it is not read. */
#define RPC_IN_MAX (RPC_REQ_MAX + 65536)
/* A threaded server's stop: how long the answers of the methods in progress may take to go. */
#define RPC_DRAIN_MS 1000

static uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

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
	pthread_mutex_t lock;     /* workers */
	pthread_cond_t cond;      /* a worker ended */
	unsigned workers;         /* worker threads not yet ended */
	/*
	 * Threaded, stopping: nothing more is read or accepted; the methods in
	 * progress end and their answers go out, for up to RPC_DRAIN_MS.
	 */
	atomic_bool draining;
	uint64_t drain_end_ms;    /* the poll thread's */
	char rbuf[65536];         /* the thread's read buffer */
};

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

/* The stream's answers (c->lock taken here: a worker's stream calls it). */
static int conn_out_locked(struct rpc_conn *c, const char *text, size_t len)
{
	if (c->len - c->off + len > RPC_OUT_MAX)
		return -ENOBUFS;
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

static int conn_out(void *priv, const char *text, size_t len)
{
	struct rpc_conn *c = priv;
	int rc;

	pthread_mutex_lock(&c->lock);
	rc = conn_out_locked(c, text, len);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

/* The outcome of feeding c's stream (c->lock held). */
static void conn_fed(struct rpc_server *s, struct rpc_conn *c, int rc)
{
	if (rc == -ENOBUFS) {
		log_warn("%s: connection %u leaves its answers unread (more than %u MiB): closed",
			 s->name, c->serial, RPC_OUT_MAX >> 20);
		c->dead = true;
	} else if (rc) {
		log_info("%s: connection %u: %s: closed after the error answer", s->name, c->serial,
			 rc == -EPROTO ? "bad request stream" : strerror(-rc));
		c->ending = true;
		c->in_len = 0; /* the stream takes nothing more */
	}
}

/* Poll thread, c->lock held. */
static void conn_flush(struct rpc_server *s, struct rpc_conn *c)
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
	}
	/* Over once written, and (threaded) once the worker has fed what was read. */
	if (c->ending && !c->busy && !c->in_len)
		c->dead = true;
}

/* Poll thread, c->lock held: what c sent is fed, here or (threaded) by its worker. */
static void conn_read(struct rpc_server *s, struct rpc_conn *c)
{
	char *buf = s->rbuf;
	ssize_t n = recv(c->fd, buf, sizeof(s->rbuf), MSG_DONTWAIT);

	if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		/* The client is done sending: answers already made still go out. */
		c->ending = true;
		return;
	}
	if (!threaded(s)) {
		int rc;

		/* Unlocked: the stream's answers take the lock (conn_out). */
		pthread_mutex_unlock(&c->lock);
		rc = rpc_stream_feed(c->st, buf, (size_t)n);
		pthread_mutex_lock(&c->lock);
		conn_fed(s, c, rc);
		return;
	}
	if (c->in_len + (size_t)n > c->in_cap) {
		size_t cap = c->in_cap ? c->in_cap : 4096;
		char *p;

		while (cap < c->in_len + (size_t)n)
			cap *= 2;
		p = realloc(c->in, cap);
		if (!p) {
			log_err("%s: connection %u: out of memory: closed", s->name, c->serial);
			c->dead = true;
			return;
		}
		c->in = p;
		c->in_cap = cap;
	}
	memcpy(c->in + c->in_len, buf, (size_t)n);
	c->in_len += (size_t)n;
	pthread_cond_signal(&c->cond);
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
 * A threaded connection's worker: feeds what the poll thread read, one
 * batch at a time (its methods run here), until the poll thread is done
 * with the connection; then frees it.
 */
static void *conn_worker(void *arg)
{
	struct rpc_conn *c = arg;
	struct rpc_server *s = c->s;
	char *buf = NULL;
	size_t cap = 0;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		size_t len;
		int rc;

		while (!c->gone && !c->in_len)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->gone)
			break;
		/* Take the bytes: the poll thread reads on into an empty c->in meanwhile. */
		len = c->in_len;
		if (cap < c->in_cap) {
			char *p = realloc(buf, c->in_cap);

			if (!p) {
				c->dead = true;
				server_wake(s);
				continue; /* until gone */
			}
			buf = p;
			cap = c->in_cap;
		}
		memcpy(buf, c->in, len);
		c->in_len = 0;
		c->busy = true;
		pthread_mutex_unlock(&c->lock);
		rc = rpc_stream_feed(c->st, buf, len);
		pthread_mutex_lock(&c->lock);
		c->busy = false;
		conn_fed(s, c, rc);
		server_wake(s);
	}
	pthread_mutex_unlock(&c->lock);
	free(buf);
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

static void server_accept(struct rpc_server *s)
{
	struct rpc_conn *c;
	int fd;

	while (s->nr_conns < RPC_CONN_MAX) {
		fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
			    errno != ECONNABORTED)
				log_err("%s: accept: %s", s->name, strerror(errno));
			return;
		}
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
		c->s = s;
		c->fd = fd;
		c->serial = ++s->serial;
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
				return;
			}
		}
		s->conns[s->nr_conns++] = c;
	}
}

static void *server_thread(void *arg)
{
	struct rpc_server *s = arg;
	struct pollfd pfd[RPC_CONN_MAX + 3];

	for (;;) {
		bool drain = atomic_load(&s->draining), pending = false;
		int timeout = -1;
		unsigned n = 0;

		pfd[n++] = (struct pollfd){ .fd = drain ? -1 : s->efd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = s->wfd, .events = POLLIN };
		/* At the limit, new clients wait in the backlog. */
		pfd[n++] = (struct pollfd){ .fd = s->nr_conns < RPC_CONN_MAX && !drain ? s->lfd : -1,
					    .events = POLLIN };
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];

			pthread_mutex_lock(&c->lock);
			/* A threaded connection with a request pending is not read further. */
			pfd[n++] = (struct pollfd){
				.fd = c->fd,
				.events = (short)((c->ending || drain || c->in_len >= RPC_IN_MAX ? 0 :
						   POLLIN) | (c->off < c->len ? POLLOUT : 0)),
			};
			pending |= c->busy || c->in_len || c->off < c->len;
			pthread_mutex_unlock(&c->lock);
		}
		if (drain) {
			uint64_t now = mono_ms();

			/* Done when no method runs and every answer is out, or at the deadline. */
			if (!pending || now >= s->drain_end_ms)
				break;
			timeout = (int)(s->drain_end_ms - now);
		}
		if (poll(pfd, n, timeout) < 0) {
			if (errno == EINTR)
				continue;
			log_err("%s: poll: %s", s->name, strerror(errno));
			break;
		}
		if (pfd[0].revents) {
			if (!threaded(s))
				break;
			/* Threaded: the answers of the methods in progress go out first. */
			s->drain_end_ms = mono_ms() + RPC_DRAIN_MS;
			atomic_store(&s->draining, true);
			continue;
		}
		if (pfd[1].revents) {
			uint64_t v;

			if (read(s->wfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				log_err("%s: wake-up: %s", s->name, strerror(errno));
		}
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];
			short re = pfd[3 + i].revents;

			pthread_mutex_lock(&c->lock);
			if ((re & (POLLIN | POLLHUP | POLLERR)) && !c->ending && !drain)
				conn_read(s, c);
			else if (re & (POLLHUP | POLLERR))
				c->dead = true; /* ending, and nobody reads the rest */
			if (!c->dead)
				conn_flush(s, c);
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
	if (write(s->efd, &one, sizeof(one)) != sizeof(one))
		log_err("%s: waking the server thread: %s", s->name, strerror(errno));
	pthread_join(s->thread, NULL);
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
