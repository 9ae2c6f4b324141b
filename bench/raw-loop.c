/* SPDX-License-Identifier: MIT */
/*
 * raw-loop: the least a request/response loop over TCP on io_uring can do,
 * the floor the native TCP fabric is held to (bench/raw-vs-rtrs.sh,
 * bench/block-chains.sh; issue 35). One connection by default, each side
 * one thread with one io_uring: a pass submits what it has to send and its next
 * receive and waits in one io_uring_enter, as a poll group does. Per IO:
 *   write: the client sends an 8-byte header (slot, length) and SIZE
 *          bytes; the server answers with the 8-byte header alone;
 *   read:  the client sends the header with the read flag; the server
 *          answers with the header and SIZE bytes.
 * No frames of RTRS, no permits, no keys, no heartbeats: RTRS does all of
 * those on top. Payloads land in a receive buffer, not in place.
 *
 * With --connections N the client holds N connections on its one ring and
 * the server serves all it accepts on its one ring, as a poll group holds
 * many: the queue depth is spread over them, each IO moving to the next
 * connection (as rtrs-perf --sessions does), so at N >= QD no connection
 * carries more than one IO at a time: the floor of bench/scale.sh's
 * constant total load.
 *
 * With --syscalls a side waits on its ring for readiness (a poll) and then
 * receives and sends with recv(2) and send(2), as lib/rtrs/rtrs-fabric-tcp.c
 * does: the two models side by side (bench/raw-vs-rtrs.sh).
 *
 *   raw-loop server [--port N] [--syscalls]
 *   raw-loop client --dst HOST:PORT [--mode write|read] [--size BYTES]
 *                   [--queue-depth N] [--connections N] [--duration S] [--json]
 *                   [--syscalls]
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
#include <poll.h>
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
#define CONS_MAX 16384
#define HDR 8

static struct {
	const char *dst;
	uint64_t port, size, qd, duration, cons;
	unsigned mode;
	bool json, syscalls;
} g = { .port = 0, .size = 4096, .qd = 64, .duration = 5, .cons = 1 };

static const char *const mode_names[] = { "write", "read", NULL };

static const struct opt options[] = {
	{ "port", 'p', OPT_UINT, &g.port, 0, 65535, .arg = "N", .help = "server: port (0: any)" },
	{ "dst", 'd', OPT_STRING, &g.dst, .arg = "HOST:PORT", .help = "client: the server" },
	{ "mode", 'm', OPT_CHOICE, &g.mode, .choices = mode_names, .arg = "MODE",
	  .help = "client: write or read" },
	{ "size", 's', OPT_SIZE, &g.size, 1, 1u << 20, .arg = "BYTES", .help = "client: IO size" },
	{ "queue-depth", 'q', OPT_UINT, &g.qd, 1, SLOTS_MAX, .arg = "N",
	  .help = "client: IOs in flight" },
	{ "connections", 'n', OPT_UINT, &g.cons, 1, CONS_MAX, .arg = "N",
	  .help = "client: connections, each IO on the next" },
	{ "duration", 't', OPT_UINT, &g.duration, 1, 3600, .arg = "S", .help = "client: seconds" },
	{ "json", 0, OPT_FLAG, &g.json, .help = "client: the result as JSON" },
	{ "syscalls", 0, OPT_FLAG, &g.syscalls,
	  .help = "wait on the ring for readiness (a poll), then recv and send with system "
		  "calls, as the tcp fabric does" },
	{ 0 },
};

/* One connection of a side: its socket and the bytes on their way in and out. */
struct side {
	int fd;
	unsigned idx;       /* in sides[] */
	char *in;           /* received, not yet parsed: in[0 .. in_len) */
	size_t in_len, in_cap;
	char *out[2];       /* being filled, being sent */
	size_t out_len[2], out_cap[2], out_sent;
	int filling;
	bool sending, receiving;
	bool more;          /* --syscalls: the last recv filled the buffer: read again */
	bool closing;       /* the peer closed: freed once its last send is done */
	char *payload;      /* what writes and read answers carry */
};

/* A process's one ring, and its connections (the server's as accepted). */
static struct io_uring ring;
static struct side **sides;
static unsigned nsides;

/* A completion's user data: the connection's index, and what it was. */
enum { UD_SEND = 1, UD_RECV = 2, UD_ACCEPT = 3 };
#define UD(idx, kind) (((uint64_t)(idx) << 2) | (kind))

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

static void ring_init(unsigned entries)
{
	int rc = io_uring_queue_init(entries, &ring, 0);

	if (rc)
		die("io_uring_queue_init", -rc);
}

static struct io_uring_sqe *sqe_get(void)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

	if (!sqe) {
		io_uring_submit(&ring);
		sqe = io_uring_get_sqe(&ring);
		if (!sqe)
			die("io_uring_get_sqe", EBUSY);
	}
	return sqe;
}

/* A new connection of this side; its buffers sized for one connection of many. */
static struct side *side_new(int fd, size_t max_msg)
{
	struct side *s = calloc(1, sizeof(*s)), **grown;
	int one = 1;
	size_t buf = g.cons > 1 ? 64 << 10 : 1 << 20;

	grown = realloc(sides, (nsides + 1) * sizeof(*sides));
	if (!s || !grown)
		die("malloc", ENOMEM);
	sides = grown;
	s->idx = nsides;
	sides[nsides++] = s;
	s->fd = fd;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	s->in_cap = 4 * (max_msg + HDR) + buf;
	s->out_cap[0] = s->out_cap[1] = buf;
	s->in = malloc(s->in_cap);
	s->out[0] = malloc(s->out_cap[0]);
	s->out[1] = malloc(s->out_cap[1]);
	/* What every connection sends: one buffer of the largest size, touched once. */
	static char *payload;

	if (!payload) {
		payload = malloc(1u << 20);
		if (!payload)
			die("malloc", ENOMEM);
		memset(payload, 0x5a, 1u << 20);
	}
	s->payload = payload;
	if (!s->in || !s->out[0] || !s->out[1])
		die("malloc", ENOMEM);
	return s;
}

static void side_free(struct side *s)
{
	sides[s->idx] = NULL;
	close(s->fd);
	free(s->in);
	free(s->out[0]);
	free(s->out[1]);
	free(s);
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
 * --syscalls: what s has to send goes now with send(2), as far as the
 * socket takes it; the rest waits for a POLLOUT on the ring.
 */
static void side_send_now(struct side *s)
{
	int f = s->filling;
	size_t off = 0;

	while (off < s->out_len[f]) {
		ssize_t n = send(s->fd, s->out[f] + off, s->out_len[f] - off,
				 MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0)
			die("send", errno);
		off += (size_t)n;
	}
	memmove(s->out[f], s->out[f] + off, s->out_len[f] - off);
	s->out_len[f] -= off;
}

/* --syscalls: one recv(2) into s->in; its bytes (0: the peer closed), -EAGAIN for none. */
static ssize_t side_recv_now(struct side *s, bool *more)
{
	size_t room = s->in_cap - s->in_len;
	ssize_t n;

	do
		n = recv(s->fd, s->in + s->in_len, room, MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	*more = n > 0 && (size_t)n == room;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return -EAGAIN;
	if (n < 0)
		die("recv", errno);
	s->in_len += (size_t)n;
	return n;
}

static void side_arm_poll(struct side *s)
{
	side_send_now(s);
	if (!s->sending && s->out_len[s->filling]) {
		struct io_uring_sqe *sqe = sqe_get();

		io_uring_prep_poll_add(sqe, s->fd, POLLOUT);
		io_uring_sqe_set_data64(sqe, UD(s->idx, UD_SEND));
		s->sending = true;
	}
	if (!s->receiving) {
		struct io_uring_sqe *sqe = sqe_get();

		io_uring_prep_poll_add(sqe, s->fd, POLLIN);
		io_uring_sqe_set_data64(sqe, UD(s->idx, UD_RECV));
		s->receiving = true;
	}
}

/* What s has to send (when none is on its way) and its next receive, queued on the ring. */
static void side_arm(struct side *s)
{
	if (g.syscalls) {
		side_arm_poll(s);
		return;
	}
	if (!s->sending && s->out_len[s->filling]) {
		struct io_uring_sqe *sqe = sqe_get();

		s->filling ^= 1; /* the other buffer fills meanwhile */
		s->out_sent = 0;
		io_uring_prep_send(sqe, s->fd, s->out[s->filling ^ 1], s->out_len[s->filling ^ 1],
				   MSG_NOSIGNAL);
		io_uring_sqe_set_data64(sqe, UD(s->idx, UD_SEND));
		s->sending = true;
	}
	if (!s->receiving) {
		struct io_uring_sqe *sqe = sqe_get();

		io_uring_prep_recv(sqe, s->fd, s->in + s->in_len, s->in_cap - s->in_len, 0);
		io_uring_sqe_set_data64(sqe, UD(s->idx, UD_RECV));
		s->receiving = true;
	}
}

/*
 * A completion of s: a receive's bytes (returned; 0: the peer closed), or
 * a send's (-EAGAIN returned).
 */
static ssize_t side_complete(struct side *s, unsigned kind, int res)
{
	if (g.syscalls) {
		/* A poll fired: receiving takes what is there, sending goes with the next arm. */
		bool more;

		if (kind == UD_SEND) {
			s->sending = false;
			return -EAGAIN;
		}
		s->receiving = false;
		(void)more;
		return side_recv_now(s, &s->more);
	}
	if (kind == UD_RECV) {
		s->receiving = false;
		if (res > 0)
			s->in_len += (size_t)res;
		if (res < 0 && res != -EAGAIN && res != -EINTR)
			die("recv", -res);
		return res < 0 ? -EAGAIN : res;
	}
	/* The send: what is left of it goes again with the next pass. */
	int done = s->filling ^ 1;

	if (res < 0)
		die("send", -res);
	s->out_sent += (size_t)res;
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
	return -EAGAIN;
}

/* One pass: the ring submitted and waited on once; every completion is given to fn. */
static void pass(void (*fn)(struct io_uring_cqe *cqe))
{
	struct io_uring_cqe *cqe;
	unsigned head, seen = 0;
	int rc = io_uring_submit_and_wait(&ring, 1);

	if (rc < 0 && rc != -EINTR)
		die("io_uring_enter", -rc);
	io_uring_for_each_cqe(&ring, head, cqe) {
		seen++;
		fn(cqe);
	}
	io_uring_cq_advance(&ring, seen);
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

static int lfd;

static void accept_arm(void)
{
	struct io_uring_sqe *sqe = sqe_get();

	io_uring_prep_accept(sqe, lfd, NULL, NULL, SOCK_CLOEXEC);
	io_uring_sqe_set_data64(sqe, UD(0, UD_ACCEPT));
}

static void srv_cqe(struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	unsigned kind = ud & 3;
	struct side *s;

	if (kind == UD_ACCEPT) {
		if (cqe->res >= 0)
			side_arm(side_new(cqe->res, 1u << 20));
		accept_arm();
		return;
	}
	s = sides[ud >> 2];
	if (side_complete(s, kind, cqe->res) == 0)
		s->closing = true;
	if (s->closing) {
		if (!s->sending || g.syscalls)
			side_free(s);
		return;
	}
	parse(s, srv_msg);
	side_arm(s);
	/* --syscalls: a read that filled the buffer is followed by the next one. */
	while (g.syscalls && kind == UD_RECV && s->more) {
		if (side_recv_now(s, &s->more) == 0) {
			side_free(s);
			return;
		}
		parse(s, srv_msg);
		side_arm(s);
	}
}

static int server(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)g.port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int one = 1;

	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		die("socket", errno);
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) || listen(lfd, 4096) ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl))
		die("listen", errno);
	printf("raw-loop listening on port %u\n", ntohs(sa.sin_port));
	fflush(stdout);
	ring_init(4096);
	accept_arm();
	for (;;)
		pass(srv_cqe);
	return 0;
}

static uint64_t c_ops, c_end;
static uint64_t c_inflight;
static unsigned c_next; /* the connection the next IO goes to */

/* Client: an answer whole: the next request on the next connection, until the time is up. */
static size_t clt_msg(struct side *s, uint32_t slot, uint32_t len, const char *p, size_t avail)
{
	bool read = slot & READ_FLAG;

	(void)p;
	if (read && avail < len)
		return 0;
	c_ops++;
	if (now_ns() < c_end) {
		struct side *to = sides[c_next];

		c_next = (c_next + 1) % nsides;
		put(to, slot, (uint32_t)g.size, !read);
		if (to != s)
			side_arm(to);
	} else {
		c_inflight--;
	}
	return HDR + (read ? len : 0);
}

static void clt_cqe(struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	struct side *s = sides[ud >> 2];

	if (side_complete(s, ud & 3, cqe->res) == 0)
		die("the server closed a connection", ECONNRESET);
	parse(s, clt_msg);
	side_arm(s);
	while (g.syscalls && (ud & 3) == UD_RECV && s->more) {
		if (side_recv_now(s, &s->more) == 0)
			die("the server closed a connection", ECONNRESET);
		parse(s, clt_msg);
		side_arm(s);
	}
}

static int client(void)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res;
	char host[256], *colon;
	uint32_t flag = g.mode == 1 ? READ_FLAG : 0;
	uint64_t start;

	if (!g.dst || strlen(g.dst) >= sizeof(host) || !(colon = strrchr(g.dst, ':'))) {
		fprintf(stderr, "raw-loop: client needs --dst HOST:PORT\n");
		return 2;
	}
	memcpy(host, g.dst, (size_t)(colon - g.dst));
	host[colon - g.dst] = 0;
	if (getaddrinfo(host, colon + 1, &hints, &res))
		die("getaddrinfo", EINVAL);
	ring_init(4096);
	for (uint64_t i = 0; i < g.cons; i++) {
		int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen))
			die("connect", errno);
		side_new(fd, g.size);
	}
	freeaddrinfo(res);
	start = now_ns();
	c_end = start + g.duration * 1000000000u;
	c_inflight = g.qd;
	for (uint32_t i = 0; i < g.qd; i++) {
		put(sides[c_next], i | flag, (uint32_t)g.size, !flag);
		c_next = (c_next + 1) % nsides;
	}
	for (unsigned i = 0; i < nsides; i++)
		side_arm(sides[i]);
	while (c_inflight)
		pass(clt_cqe);
	double secs = (double)(now_ns() - start) / 1e9;

	if (g.json)
		printf("{\"ops\": %" PRIu64 ", \"ops_per_sec\": %.0f, \"errors\": 0}\n", c_ops,
		       (double)c_ops / secs);
	else
		printf("%s %" PRIu64 " B: %" PRIu64 " ops in %.2f s, %.0f ops/s\n",
		       mode_names[g.mode], g.size, c_ops, secs, (double)c_ops / secs);
	for (unsigned i = 0; i < nsides; i++)
		shutdown(sides[i]->fd, SHUT_RDWR);
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
