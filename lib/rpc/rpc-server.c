/* SPDX-License-Identifier: MIT */
/*
 * JSON-RPC 2.0 server on a Unix socket: one thread, poll() over the
 * listening socket, a wake-up eventfd and every connection. Connections
 * are non-blocking; each has its stream (rpc-core.c) and a queue of
 * answers not yet written. A connection whose stream ended (bad input)
 * is closed once its last answer is out; one that leaves more than
 * RPC_OUT_MAX unread is closed at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "rpc.h"

struct rpc_conn {
	int fd;
	unsigned serial;          /* for the log */
	struct rpc_stream *st;
	char *out;                /* answers not yet written: out[off..len) */
	size_t len, off, cap;
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
	char rbuf[65536];         /* the thread's read buffer */
};

static int conn_out(void *priv, const char *text, size_t len)
{
	struct rpc_conn *c = priv;

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
	if (c->ending)
		c->dead = true;
}

static void conn_read(struct rpc_server *s, struct rpc_conn *c)
{
	char *buf = s->rbuf;
	ssize_t n = recv(c->fd, buf, sizeof(s->rbuf), MSG_DONTWAIT);
	int rc;

	if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
		return;
	if (n <= 0) {
		/* The client is done sending: answers already made still go out. */
		c->ending = true;
		return;
	}
	rc = rpc_stream_feed(c->st, buf, (size_t)n);
	if (rc == -ENOBUFS) {
		log_warn("%s: connection %u leaves its answers unread (more than %u MiB): closed",
			 s->name, c->serial, RPC_OUT_MAX >> 20);
		c->dead = true;
	} else if (rc) {
		log_info("%s: connection %u: %s: closed after the error answer", s->name, c->serial,
			 rc == -EPROTO ? "bad request stream" : strerror(-rc));
		c->ending = true;
	}
}

static void conn_free(struct rpc_conn *c)
{
	close(c->fd);
	rpc_stream_free(c->st);
	free(c->out);
	free(c);
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
		c->fd = fd;
		c->serial = ++s->serial;
		s->conns[s->nr_conns++] = c;
	}
}

static void *server_thread(void *arg)
{
	struct rpc_server *s = arg;
	struct pollfd pfd[RPC_CONN_MAX + 2];

	for (;;) {
		unsigned n = 0;

		pfd[n++] = (struct pollfd){ .fd = s->efd, .events = POLLIN };
		/* At the limit, new clients wait in the backlog. */
		pfd[n++] = (struct pollfd){ .fd = s->nr_conns < RPC_CONN_MAX ? s->lfd : -1,
					    .events = POLLIN };
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];

			pfd[n++] = (struct pollfd){
				.fd = c->fd,
				.events = (short)((c->ending ? 0 : POLLIN) |
						  (c->off < c->len ? POLLOUT : 0)),
			};
		}
		if (poll(pfd, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			log_err("%s: poll: %s", s->name, strerror(errno));
			break;
		}
		if (pfd[0].revents)
			break;
		for (unsigned i = 0; i < s->nr_conns; i++) {
			struct rpc_conn *c = s->conns[i];
			short re = pfd[2 + i].revents;

			if ((re & (POLLIN | POLLHUP | POLLERR)) && !c->ending)
				conn_read(s, c);
			else if (re & (POLLHUP | POLLERR))
				c->dead = true; /* ending, and nobody reads the rest */
			if (!c->dead)
				conn_flush(s, c);
		}
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
