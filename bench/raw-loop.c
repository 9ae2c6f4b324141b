/* SPDX-License-Identifier: MIT */
/*
 * raw-loop: the least a request/response loop over TCP on io_uring can do,
 * the floor the native TCP fabric is held to (bench/raw-vs-rtrs.sh,
 * bench/block-chains.sh; issue 35). One connection, each side one thread
 * with one io_uring: a pass submits what it has to send and its next
 * receive and waits in one io_uring_enter, as a poll group does. Per IO:
 *   write: the client sends an 8-byte header (slot, length) and SIZE
 *          bytes; the server answers with the 8-byte header alone;
 *   read:  the client sends the header with the read flag; the server
 *          answers with the header and SIZE bytes.
 * No frames of RTRS, no permits, no keys, no heartbeats: RTRS does all of
 * those on top. Payloads land in a receive buffer, not in place.
 *
 *   raw-loop server [--port N]
 *   raw-loop client --dst HOST:PORT [--mode write|read] [--size BYTES]
 *                   [--queue-depth N] [--duration S] [--json]
 *
 * The client prints ops and ops/s (--json: {"ops", "ops_per_sec",
 * "errors"}); the server runs until it is killed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "opts.h"

#define READ_FLAG 0x80000000u
#define SLOTS_MAX 4096
#define HDR 8

static struct {
	const char *dst;
	uint64_t port, size, qd, duration;
	unsigned mode;
	bool json;
} g = { .port = 0, .size = 4096, .qd = 64, .duration = 5 };

static const char *const mode_names[] = { "write", "read", NULL };

static const struct opt options[] = {
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N", .help = "server: port (0: any)" },
	{ "dst", 'd', OPT_STRING, &g.dst, .arg = "HOST:PORT", .help = "client: the server" },
	{ "mode", 'm', OPT_CHOICE, &g.mode, .choices = mode_names, .arg = "MODE",
	  .help = "client: write or read" },
	{ "size", 's', OPT_SIZE, &g.size, 1, 1u << 20, .arg = "BYTES", .help = "client: IO size" },
	{ "queue-depth", 'q', OPT_UINT, &g.qd, 1, SLOTS_MAX, .arg = "N",
	  .help = "client: IOs in flight" },
	{ "duration", 't', OPT_UINT, &g.duration, 1, 3600, .arg = "S", .help = "client: seconds" },
	{ "json", 0, OPT_FLAG, &g.json, .help = "client: the result as JSON" },
	{ 0 },
};

/* One side: its socket, its ring, and the bytes on their way in and out. */
struct side {
	int fd;
	struct io_uring ring;
	char *in;           /* received, not yet parsed: in[0 .. in_len) */
	size_t in_len, in_cap;
	char *out[2];       /* being filled, being sent */
	size_t out_len[2], out_cap[2], out_sent;
	int filling;
	bool sending, receiving;
	char *payload;      /* what writes and read answers carry */
};

static void die(const char *what, int err)
{
	fprintf(stderr, "raw-loop: %s: %s\n", what, strerror(err));
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void side_init(struct side *s, int fd, size_t max_msg)
{
	int one = 1, rc;

	s->fd = fd;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	rc = io_uring_queue_init(8, &s->ring, 0);
	if (rc)
		die("io_uring_queue_init", -rc);
	s->in_cap = 4 * (max_msg + HDR) + (1 << 20);
	s->out_cap[0] = s->out_cap[1] = 1 << 20;
	s->in = malloc(s->in_cap);
	s->out[0] = malloc(s->out_cap[0]);
	s->out[1] = malloc(s->out_cap[1]);
	s->payload = malloc(max_msg);
	if (!s->in || !s->out[0] || !s->out[1] || !s->payload)
		die("malloc", ENOMEM);
	memset(s->payload, 0x5a, max_msg);
}

/* Appends a message to the buffer being filled. */
static void reserve(struct side *s, size_t more)
{
	int f = s->filling;

	while (s->out_len[f] + more > s->out_cap[f]) {
		s->out_cap[f] *= 2;
		s->out[f] = realloc(s->out[f], s->out_cap[f]);
		if (!s->out[f])
			die("realloc", ENOMEM);
	}
}

static void put(struct side *s, uint32_t slot, uint32_t len, bool with_payload)
{
	char *o;

	reserve(s, HDR + (with_payload ? len : 0));
	o = s->out[s->filling] + s->out_len[s->filling];

	memcpy(o, &slot, 4);
	memcpy(o + 4, &len, 4);
	if (with_payload)
		memcpy(o + HDR, s->payload, len);
	s->out_len[s->filling] += HDR + (with_payload ? len : 0);
}

/*
 * One pass: the send of what was filled (when none is on its way) and a
 * receive, submitted with the wait; then what completed. Returns the
 * bytes received (0: the peer closed).
 */
static ssize_t pass(struct side *s)
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	ssize_t got = -EAGAIN;

	if (!s->sending && s->out_len[s->filling]) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);

		s->filling ^= 1; /* the other buffer fills meanwhile */
		s->out_sent = 0;
		io_uring_prep_send(sqe, s->fd, s->out[s->filling ^ 1], s->out_len[s->filling ^ 1],
				   MSG_NOSIGNAL);
		io_uring_sqe_set_data64(sqe, 1);
		s->sending = true;
	}
	if (!s->receiving) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&s->ring);

		io_uring_prep_recv(sqe, s->fd, s->in + s->in_len, s->in_cap - s->in_len, 0);
		io_uring_sqe_set_data64(sqe, 2);
		s->receiving = true;
	}
	int rc = io_uring_submit_and_wait(&s->ring, 1);

	if (rc < 0 && rc != -EINTR)
		die("io_uring_enter", -rc);
	io_uring_for_each_cqe(&s->ring, head, cqe) {
		seen++;
		if (io_uring_cqe_get_data64(cqe) == 2) {
			s->receiving = false;
			got = cqe->res;
			if (got > 0)
				s->in_len += (size_t)got;
			continue;
		}
		/* The send: what is left of it goes again with the next pass. */
		int sent = cqe->res;
		int done = s->filling ^ 1;

		if (sent < 0)
			die("send", -sent);
		s->out_sent += (size_t)sent;
		s->sending = false;
		if (s->out_sent < s->out_len[done]) {
			/* Partial: move the rest to the front and send it before the new bytes. */
			size_t rest = s->out_len[done] - s->out_sent;
			char *f;

			reserve(s, rest);
			f = s->out[s->filling];
			memmove(f + rest, f, s->out_len[s->filling]);
			memcpy(f, s->out[done] + s->out_sent, rest);
			s->out_len[s->filling] += rest;
		}
		s->out_len[done] = 0;
	}
	io_uring_cq_advance(&s->ring, seen);
	if (got < 0 && got != -EAGAIN && got != -EINTR)
		die("recv", (int)-got);
	return got;
}

/* Complete messages in s->in: handled by fn, then dropped. */
static void parse(struct side *s, size_t (*fn)(struct side *s, uint32_t slot, uint32_t len,
					     const char *p, size_t avail))
{
	size_t off = 0;

	while (s->in_len - off >= HDR) {
		uint32_t slot, len;
		size_t used;

		memcpy(&slot, s->in + off, 4);
		memcpy(&len, s->in + off + 4, 4);
		used = fn(s, slot, len, s->in + off + HDR, s->in_len - off - HDR);
		if (!used)
			break;
		off += used;
	}
	memmove(s->in, s->in + off, s->in_len - off);
	s->in_len -= off;
}

/* Server: a request whole: its answer. */
static size_t srv_msg(struct side *s, uint32_t slot, uint32_t len, const char *p, size_t avail)
{
	bool read = slot & READ_FLAG;

	(void)p;
	if (len > (1u << 20))
		die("request", EPROTO);
	if (!read && avail < len)
		return 0;
	put(s, slot, len, read);
	return HDR + (read ? 0 : len);
}

static int server(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)g.port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int one = 1, lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (lfd < 0)
		die("socket", errno);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 16) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl))
		die("listen", errno);
	printf("raw-loop listening on port %u\n", ntohs(sa.sin_port));
	fflush(stdout);
	for (;;) {
		struct side s = { 0 };
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

		if (fd < 0)
			continue;
		side_init(&s, fd, 1u << 20);
		for (;;) {
			ssize_t got = pass(&s);

			if (got == 0)
				break;
			parse(&s, srv_msg);
		}
		io_uring_queue_exit(&s.ring);
		close(fd);
		free(s.in);
		free(s.out[0]);
		free(s.out[1]);
		free(s.payload);
	}
	return 0;
}

static uint64_t c_ops, c_end;
static uint64_t c_inflight;

/* Client: an answer whole: the next request in its slot, until the time is up. */
static size_t clt_msg(struct side *s, uint32_t slot, uint32_t len, const char *p, size_t avail)
{
	bool read = slot & READ_FLAG;

	(void)p;
	if (read && avail < len)
		return 0;
	c_ops++;
	if (now_ns() < c_end)
		put(s, slot, (uint32_t)g.size, !read);
	else
		c_inflight--;
	return HDR + (read ? len : 0);
}

static int client(void)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res;
	struct side s = { 0 };
	char host[256], *colon;
	uint32_t flag = g.mode == 1 ? READ_FLAG : 0;
	uint64_t start;
	int fd;

	if (!g.dst || strlen(g.dst) >= sizeof(host) || !(colon = strrchr(g.dst, ':'))) {
		fprintf(stderr, "raw-loop: client needs --dst HOST:PORT\n");
		return 2;
	}
	memcpy(host, g.dst, (size_t)(colon - g.dst));
	host[colon - g.dst] = 0;
	if (getaddrinfo(host, colon + 1, &hints, &res))
		die("getaddrinfo", EINVAL);
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen))
		die("connect", errno);
	freeaddrinfo(res);
	side_init(&s, fd, g.size);
	start = now_ns();
	c_end = start + g.duration * 1000000000u;
	c_inflight = g.qd;
	for (uint32_t i = 0; i < g.qd; i++)
		put(&s, i | flag, (uint32_t)g.size, !flag);
	while (c_inflight) {
		if (pass(&s) == 0)
			die("the server closed the connection", ECONNRESET);
		parse(&s, clt_msg);
	}
	double secs = (double)(now_ns() - start) / 1e9;

	if (g.json)
		printf("{\"ops\": %" PRIu64 ", \"ops_per_sec\": %.0f, \"errors\": 0}\n", c_ops,
		       (double)c_ops / secs);
	else
		printf("%s %" PRIu64 " B: %" PRIu64 " ops in %.2f s, %.0f ops/s\n",
		       mode_names[g.mode], g.size, c_ops, secs, (double)c_ops / secs);
	shutdown(fd, SHUT_RDWR);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	int pos, rc = opts_parse(options, "raw-loop", "server|client [options]", argc, argv, &pos);

	if (rc)
		return rc > 0 ? 0 : 2;
	if (pos < argc && !strcmp(argv[pos], "server")) {
		rc = opts_parse(options, "raw-loop", "server [options]", argc - pos, argv + pos,
				&pos);
		return rc ? (rc > 0 ? 0 : 2) : server();
	}
	if (pos < argc && !strcmp(argv[pos], "client")) {
		rc = opts_parse(options, "raw-loop", "client [options]", argc - pos, argv + pos,
				&pos);
		return rc ? (rc > 0 ? 0 : 2) : client();
	}
	fprintf(stderr, "raw-loop: server or client (see --help)\n");
	return 2;
}
