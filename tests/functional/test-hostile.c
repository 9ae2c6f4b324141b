/* SPDX-License-Identifier: MIT */
/*
 * A server under attack by clients that do not play by the rules, each
 * speaking the tcp fabric's frames (struct rtrs_tcp_hdr: CONNECT for the
 * handshake, WRITE and SEND after it) straight on a socket, so
 * that they can do what no library client would: stop reading, send
 * nothing, replay what they saw. In every case a legitimate client still
 * connects and moves verified data, and the server's memory and file
 * descriptors stay under the bound the case states (docs/security.md):
 *   - hundreds of TCP connections that never send a request and paths that
 *     never authenticate, against a server limited to 1024 fds;
 *   - a heartbeat flood from a client that stops reading;
 *   - a client's connection request replayed while it does IO: its path
 *     stays up;
 *   - later connections of paths that were never started: each refused,
 *     none holds a path or a socket;
 *   - more sessions, and more chunk memory, than the server allows: the
 *     client is refused with ENOSPC;
 *   - continuous floods of raw connections and half-open paths from two
 *     other addresses, then from the client's own: every authenticated
 *     open succeeds (within its retries) and moves verified data, and the
 *     server's CPU under the flood stays under FLOOD_CPU_BOUND_PCT;
 *   - the same floods against a server that requires TLS, the client's
 *     opens on TLS with a derived PSK and with secure channel
 *     concatenation.
 * The server is rtrs-test-server in a process of its own (RSS and fds are
 * read from /proc).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dirent.h>

#include "check.h"
#include "harness.h"
#include "rtrs-proto.h"
#include "rtrs.h"
#include "test-proto-hdr.h"

static const char *const KEY = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
#define HOST "nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-0000-4000-8000-00000000b001"
#define SERVER "nqn.2026-11.io.rtrs:test-server"
#define IO_LEN 4096

static char keys_path[300];

/*
 * The bound on the server's RSS growth. The heartbeat flood makes 3000 to
 * 4000 short-lived paths in 4.5 s, each with its threads and their malloc
 * arenas: the server's most was 44 to 57 MiB over it in six runs here
 * (before and after 2026-11-25's changes alike) and 75 MiB once in CI, so
 * the bound is 128 MiB, still a tenth of the 1.4 GB a flood took before
 * sends were bounded. A sanitizer's build keeps more: the server then runs
 * with a small ASan quarantine (set in main), and TSan's shadow grows with
 * every thread.
 */
#if defined(__SANITIZE_ADDRESS__)
#define RSS_BOUND_KB (3 * 64 * 1024L)
#elif defined(__SANITIZE_THREAD__)
#define RSS_BOUND_KB (8 * 64 * 1024L)
#else
#define RSS_BOUND_KB (128 * 1024L)
#endif

/* ---- the tcp fabric's wire (struct rtrs_tcp_hdr, docs/protocol.md section 15) ---- */

/* A frame header, as a peer that does not play by the rules builds it. */
static struct rtrs_tcp_hdr wire_hdr(enum rtrs_tcp_op op, uint32_t len, uint64_t key, uint64_t off,
				    bool has_imm, uint32_t imm)
{
	struct rtrs_tcp_hdr h = {
		.magic = RTRS_TCP_MAGIC, .version = RTRS_TCP_VERSION, .op = (uint8_t)op,
		.flags = has_imm ? RTRS_TCP_F_IMM : 0, .len = le32_put(len), .key = le64_put(key),
		.off = le64_put(off), .imm = le32_put(imm),
	};

	return h;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -ECONNRESET;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int tcp_connect(int port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { .tv_sec = 5 };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	inet_pton(AF_INET, test_addr(), &sa.sin_addr);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	return fd;
}

/* The handshake's first message: what a connection request looks like on the wire. */
static size_t wire_connreq(const struct rtrs_msg_conn_req *m, uint8_t *out, size_t cap)
{
	struct rtrs_tcp_hdr h = wire_hdr(RTRS_TCP_CONNECT, sizeof(*m), 0, 0, false, 0);

	if (cap < sizeof(h) + sizeof(*m))
		return 0;
	memcpy(out, &h, sizeof(h));
	memcpy(out + sizeof(h), m, sizeof(*m));
	return sizeof(h) + sizeof(*m);
}

/*
 * Reads the server's answer to a connection request: 0 and *rsp on
 * ACCEPT, the server's errno on REJECT, -errno on a socket error.
 */
static int wire_answer(int fd, struct rtrs_conn_rsp *rsp)
{
	struct rtrs_tcp_frame f;
	struct rtrs_tcp_hdr h;
	struct rtrs_conn_rsp r;
	uint8_t data[RTRS_TCP_CM_MAX];
	const char *why;
	int rc = read_all(fd, &h, sizeof(h));

	if (!rc)
		rc = rtrs_tcp_hdr_decode(&h, sizeof(h), &f, &why);
	if (!rc && f.op != RTRS_TCP_ACCEPT && f.op != RTRS_TCP_REJECT)
		rc = -EPROTO;
	if (!rc)
		rc = read_all(fd, data, f.len);
	if (!rc)
		rc = rtrs_conn_rsp_decode(data, f.len, &r, &why);
	if (!rc && rsp)
		*rsp = r;
	/* A refusal may come as an accept whose response carries the errno (a verdict). */
	if (!rc && (f.op == RTRS_TCP_REJECT || r.err))
		rc = r.err ? r.err : -ECONNREFUSED;
	return rc;
}

/*
 * Sends bytes as a connection's first message and reads the answer
 * (wire_answer). *fdp keeps the socket (accepted or not) unless NULL.
 */
static int wire_handshake(int port, const void *req, size_t len, struct rtrs_conn_rsp *rsp,
			  int *fdp)
{
	int fd = tcp_connect(port), rc;

	if (fd < 0)
		return fd;
	rc = write_all(fd, req, len);
	if (!rc)
		rc = wire_answer(fd, rsp);
	if (fdp)
		*fdp = fd;
	else
		close(fd);
	return rc;
}

static void random_req(struct rtrs_conn_req *req, uint16_t cid, uint16_t cid_num, bool auth)
{
	*req = (struct rtrs_conn_req){ .cid = cid, .cid_num = cid_num, .first_conn = true,
				       .ext = true, .auth = auth, .fence = true };
	for (int i = 0; i < RTRS_UUID_LEN; i++) {
		req->sess_uuid[i] = (uint8_t)rand();
		req->paths_uuid[i] = (uint8_t)rand();
	}
}

/*
 * A connection request of a new random path (random_req) as a
 * connection's first message: wire_handshake's answer, *fdp the socket.
 */
static int random_handshake(int port, uint16_t cid, uint16_t cid_num, bool auth, int *fdp)
{
	struct rtrs_conn_req req;
	struct rtrs_msg_conn_req m;
	uint8_t buf[128];
	size_t len;

	random_req(&req, cid, cid_num, auth);
	rtrs_conn_req_encode(&m, &req);
	len = wire_connreq(&m, buf, sizeof(buf));
	return wire_handshake(port, buf, len, NULL, fdp);
}

/* A two-sided message on an established connection. */
static int wire_send(int fd, const void *buf, size_t len)
{
	struct rtrs_tcp_hdr h = wire_hdr(RTRS_TCP_SEND, (uint32_t)len, 0, 0, false, 0);
	int rc = write_all(fd, &h, sizeof(h));

	return rc ? rc : write_all(fd, buf, len);
}

/* ---- the server --------------------------------------------------------------- */

static struct proc srv;

/* Starts rtrs-test-server with at most nofile fds and extra options. */
static bool server_start_log(unsigned nofile, const char *const *extra, const char *err_path);

static bool server_start(unsigned nofile, const char *const *extra)
{
	return server_start_log(nofile, extra, NULL);
}

/* With err_path, the server's log goes to that file. */
static bool server_start_log(unsigned nofile, const char *const *extra, const char *err_path)
{
	static const char *const base[] = { "--queue-depth", "64", "--store-size", "1M",
					    "--hb-interval", "200" };
	char *argv[24] = { (char *)test_server_path() };
	struct rlimit old, lim;
	int n = 1, rc;

	for (size_t i = 0; i < ARRAY_SIZE(base); i++)
		argv[n++] = (char *)base[i];
	while (extra && *extra && n < 22)
		argv[n++] = (char *)*extra++;
	argv[n] = NULL;
	getrlimit(RLIMIT_NOFILE, &old);
	lim = old;
	if (nofile)
		lim.rlim_cur = nofile;
	setrlimit(RLIMIT_NOFILE, &lim);
	rc = proc_spawn_server_log(argv, &srv, err_path);
	setrlimit(RLIMIT_NOFILE, &old);
	CHECK(rc == 0, "server start: %s", strerror(-rc));
	return rc == 0;
}

static void server_stop(void)
{
	if (srv.pid)
		CHECK_EQ(proc_signal(&srv, SIGTERM, true), 0);
	srv.pid = 0;
}

static long proc_rss_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
			break;
	fclose(f);
	return kb;
}

static int proc_fds(pid_t pid)
{
	char path[64];
	struct dirent *e;
	int n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
	d = opendir(path);
	if (!d)
		return -1;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* ---- the legitimate client ------------------------------------------------------ */

/* The legitimate client's TLS (test_continuous_floods_tls): off unless set. */
static enum rtrs_tls_mode legit_tls;

static int legit_open(int port, const char *name, bool auth, struct rtrs_clt_sess **out)
{
	struct rtrs_path_addr pa;
	struct rtrs_clt_opts o;
	char dst[64];

	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	pa = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = name;
	o.paths = &pa;
	o.paths_num = 1;
	o.provider = test_provider();
	o.nr_io_cons = 1;
	o.hb_interval_ms = 200;
	o.connect_timeout_ms = 5000;
	/*
	 * Under attack from its own address, a pending slot frees once an
	 * attacker's handshake stalls (a quarter of the handshake timeout:
	 * 750 ms in test_exhaustion); meanwhile the open is refused (EBUSY)
	 * and tries again, RTRS_OPEN_TRIES times in all: 200 ms apart spans it.
	 */
	o.reconnect_delay_ms = 200;
	o.reconnect_jitter_ms = 100;
	if (auth) {
		o.auth_secret = KEY;
		o.auth_host_name = HOST;
		o.auth_server_name = SERVER;
		o.tls = legit_tls; /* a PSK derived from the secret, or generated per path */
	}
	return rtrs_clt_open(&o, out);
}

static int legit_io(struct rtrs_clt_sess *s, enum rtrs_dir dir, uint64_t off, void *buf)
{
	struct test_hdr h = { .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = off,
			      .len = IO_LEN };

	return test_request(s, dir, &h, sizeof(h), buf, IO_LEN);
}

/* n writes and their reads: how many came back byte for byte. */
static int legit_verified(struct rtrs_clt_sess *s, int n, unsigned seed)
{
	static uint8_t out[IO_LEN], in[IO_LEN];
	int ok = 0;

	for (int i = 0; i < n; i++) {
		uint64_t off = (uint64_t)(i % 64) * IO_LEN;

		test_fill(out, IO_LEN, seed + (unsigned)i);
		memset(in, 0, IO_LEN);
		if (legit_io(s, RTRS_WRITE, off, out) || legit_io(s, RTRS_READ, off, in))
			continue;
		ok += !memcmp(in, out, IO_LEN);
	}
	return ok;
}

/* Opens, moves n verified IOs, closes: true when all of it worked. */
static bool legit_session(int port, const char *name, bool auth, int n)
{
	struct rtrs_clt_sess *s = NULL;
	int rc = legit_open(port, name, auth, &s), ok;

	CHECK(rc == 0, "the legitimate client %s connects: %s", name, strerror(-rc));
	if (rc)
		return false;
	ok = legit_verified(s, n, 17);
	CHECK(ok == n, "%s: %d of %d IOs verified", name, ok, n);
	rtrs_clt_close(s);
	return ok == n;
}

static void write_keys(void)
{
	FILE *f = fopen(keys_path, "w");

	CHECK(f != NULL, "key file");
	if (!f)
		return;
	fprintf(f, "%s %s\n", HOST, KEY);
	fclose(f);
	chmod(keys_path, 0600);
}

/* ---- half-open and raw connections --------------------------------------------- */

/* Whether the server closed fd (EOF or reset) within ms. */
static bool closed_by_peer(int fd, unsigned ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, (int)ms) <= 0)
		return false;
	return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
}

static void test_exhaustion(void)
{
	enum { RAW = 1100, HALF = 200, NOFILE = 1024 };
	const char *extra[] = { "--auth-keys", keys_path, "--handshake-timeout", "3000", NULL };
	static int raw[RAW], half[HALF];
	int nraw = 0, nhalf = 0, accepted = 0, closed = 0, fds, most_fds = 0;
	long rss0, rss;
	uint64_t t0;

	write_keys();
	if (!server_start(NOFILE, extra))
		return;
	usleep(200 * 1000);
	rss0 = proc_rss_kb(srv.pid);
	/* Raw TCP connections that never send a thing. */
	for (int i = 0; i < RAW; i++) {
		int fd = tcp_connect(srv.port);

		if (fd < 0)
			break;
		raw[nraw++] = fd;
		if (i % 100 == 99)
			most_fds = MAX(most_fds, proc_fds(srv.pid));
	}
	CHECK(nraw == RAW, "%d raw connections made", nraw);
	/* Paths that announce 129 connections and never authenticate. */
	for (int i = 0; i < HALF; i++) {
		int fd = -1, rc = random_handshake(srv.port, 0, 129, true, &fd);

		accepted += rc == 0;
		if (fd >= 0)
			half[nhalf++] = fd;
		if (i % 20 == 19)
			most_fds = MAX(most_fds, proc_fds(srv.pid));
	}
	CHECK(accepted > 0, "half-open paths accepted: %d of %d", accepted, HALF);
	fds = proc_fds(srv.pid);
	most_fds = MAX(most_fds, fds);
	CHECK(most_fds < 600, "server fds: at most %d while attacked (limit %d)", most_fds, NOFILE);

	/* Meanwhile: the real host. */
	CHECK(legit_session(srv.port, "legit-exhaustion", true, 64),
	      "an authenticated client under attack");

	/* Every raw connection goes within the handshake timeout (3 s), and the paths too. */
	t0 = test_now_ms();
	for (int i = 0; i < nraw; i++) {
		uint64_t waited = test_now_ms() - t0;

		closed += closed_by_peer(raw[i], waited < 5000 ? (unsigned)(5000 - waited) : 1);
		close(raw[i]);
	}
	CHECK(closed == nraw, "the server closed %d of %d raw connections within 5 s", closed,
	      nraw);
	for (int i = 0; i < nhalf; i++)
		close(half[i]);
	rss = proc_rss_kb(srv.pid);
	CHECK(rss > 0 && rss - rss0 < RSS_BOUND_KB, "server RSS grew by %ld KiB (bound %ld KiB)",
	      rss - rss0, RSS_BOUND_KB);
	fprintf(stderr, "exhaustion: %d raw and %d half-open connections: server at most %d fds, "
		"RSS %ld -> %ld KiB\n", nraw, nhalf, most_fds, rss0, rss);
	server_stop();
}

/*
 * Raw TCP connections that each send one byte (not a whole request) and
 * then nothing: once a byte had come a connection no longer counted
 * against any of the listener's limits, and 1100 of them took every fd
 * of the server (512 of 512 in a review's run): a new client was closed
 * at once. Now one that stalls counts as silent, and the hard cap
 * counts every raw connection.
 */
static void test_exhaustion_one_byte(void)
{
	enum { RAW = 1100, NOFILE = 1024 };
	const char *extra[] = { "--auth-keys", keys_path, NULL };
	static int raw[RAW];
	int nraw = 0, fds, most_fds = 0;

	write_keys();
	if (!server_start(NOFILE, extra))
		return;
	usleep(200 * 1000);
	for (int i = 0; i < RAW; i++) {
		int fd = tcp_connect(srv.port);

		if (fd < 0)
			break;
		if (write(fd, "R", 1) != 1) {
			close(fd);
			break;
		}
		raw[nraw++] = fd;
		if (i % 100 == 99)
			most_fds = MAX(most_fds, proc_fds(srv.pid));
	}
	CHECK(nraw == RAW, "%d one-byte connections made", nraw);
	usleep(200 * 1000);
	fds = proc_fds(srv.pid);
	most_fds = MAX(most_fds, fds);
	CHECK(most_fds < 600, "server fds: at most %d under one-byte connections (limit %d)",
	      most_fds, NOFILE);
	CHECK(legit_session(srv.port, "legit-one-byte", true, 64),
	      "an authenticated client among one-byte connections");
	for (int i = 0; i < nraw; i++)
		close(raw[i]);
	fprintf(stderr, "exhaustion, one byte each: %d connections: server at most %d fds\n", nraw,
		most_fds);
	server_stop();
}

/* ---- a heartbeat flood from a client that stops reading -------------------- */

static atomic_bool flood_stop;
static atomic_uint_fast64_t flood_sent;
static atomic_uint flood_paths;

/* A connected path of its own (no authentication), or -errno. */
static atomic_int flood_named_port; /* the first path's local port, once its info is answered */

/*
 * A flooding path. The first waits for the answer to its info request
 * before it floods, so that the server knows its session's name by then
 * and its flood's log lines can name it (the rest flood at once).
 */
static int flood_path(struct rtrs_conn_rsp *rsp)
{
	struct rtrs_conn_req req;
	struct rtrs_msg_conn_req m;
	struct rtrs_msg_info_req ireq;
	struct rtrs_info_req info = { .imm_addr = 0, .imm_key = 1 };
	uint8_t buf[128];
	int fd = -1, rc, small = 4096;
	size_t len;

	random_req(&req, 0, 1, false);
	rtrs_conn_req_encode(&m, &req);
	len = wire_connreq(&m, buf, sizeof(buf));
	rc = wire_handshake(srv.port, buf, len, rsp, &fd);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	/* A small receive buffer that is never read: the answers back up at once. */
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	unsigned nr = atomic_fetch_add(&flood_paths, 1);

	snprintf(info.pathname, sizeof(info.pathname), "flooder%u", nr);
	rtrs_info_req_encode(&ireq, &info);
	rc = wire_send(fd, &ireq, sizeof(ireq));
	if (rc) {
		close(fd);
		return rc;
	}
	if (nr == 0) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		struct sockaddr_in sin;
		socklen_t sl = sizeof(sin);

		/* The first bytes after the info request are its answer. */
		if (poll(&pfd, 1, 5000) == 1 && !getsockname(fd, (struct sockaddr *)&sin, &sl))
			atomic_store(&flood_named_port, ntohs(sin.sin_port));
	}
	return fd;
}

/*
 * Heartbeats as fast as the socket takes them, never reading; a new path
 * when closed. The first path sends empty writes without an immediate
 * instead, which no RTRS peer sends: the fabric closes it at the first,
 * saying so with the path's name.
 */
static void *flood_thread(void *arg)
{
	static struct rtrs_tcp_hdr burst[256];

	while (!atomic_load(&flood_stop)) {
		struct rtrs_conn_rsp rsp;
		int fd = flood_path(&rsp);
		bool silent = atomic_load(&flood_paths) == 1;
		size_t each = sizeof(burst[0]);
		size_t len = 256 * each;

		if (fd < 0) {
			usleep(10 * 1000);
			continue;
		}
		for (size_t i = 0; i < 256; i++)
			burst[i] = wire_hdr(RTRS_TCP_WRITE, 0, rsp.imm_desc.key, rsp.imm_desc.addr,
					    !silent, silent ? 0 : rtrs_to_imm(RTRS_HB_MSG_IMM, 0));
		while (!atomic_load(&flood_stop)) {
			/* Whole messages: blocking, with a timeout (SO_SNDTIMEO) to look up. */
			struct timeval tv = { .tv_usec = 100 * 1000 };
			ssize_t n;

			setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
			n = send(fd, &burst, len, MSG_NOSIGNAL);
			if (n > 0) {
				size_t rest = (size_t)n % each;

				if (rest && write_all(fd, (char *)&burst + rest, each - rest))
					break;
				atomic_fetch_add(&flood_sent, ((size_t)n + each - 1) / each);
			} else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
				continue;
			} else {
				break;
			}
		}
		close(fd);
	}
	return arg;
}

/*
 * Lines of the log file at path that contain what (shown on stderr with
 * show); how many of them also contain also. -1 if the file cannot be read.
 */
static int log_lines_with(const char *path, const char *what, const char *also, int *with_also,
			  bool show)
{
	char line[1024];
	int n = 0;
	FILE *f = fopen(path, "r");

	*with_also = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, what))
			continue;
		n++;
		if (strstr(line, also))
			(*with_also)++;
		if (show)
			fprintf(stderr, "  %s", line);
	}
	fclose(f);
	return n;
}

static void test_hb_flood(void)
{
	/*
	 * Heartbeats expected every 2 s, not 0.2: the first flooder sends
	 * none, and must be closed for what it sends, not failed for its
	 * silence after 0.6 s first.
	 */
	const char *extra[] = { "--hb-interval", "2000", NULL };
	char logpath[] = "/tmp/test-hostile-flood-XXXXXX";
	long rss0, rss, most = 0;
	int lfd, named;
	pthread_t t;
	uint64_t t0;
	bool legit;

	lfd = mkstemp(logpath);
	CHECK(lfd >= 0, "mkstemp: %s", strerror(errno));
	if (lfd < 0)
		return;
	close(lfd);
	if (!server_start_log(0, extra, logpath)) {
		unlink(logpath);
		return;
	}
	usleep(200 * 1000);
	rss0 = proc_rss_kb(srv.pid);
	atomic_store(&flood_stop, false);
	atomic_store(&flood_sent, 0);
	atomic_store(&flood_paths, 0);
	atomic_store(&flood_named_port, 0);
	CHECK_EQ(pthread_create(&t, NULL, flood_thread, NULL), 0);
	usleep(500 * 1000);
	/* The server is still itself: a client gets in and moves data during the flood. */
	legit = legit_session(srv.port, "legit-flood", false, 64);
	t0 = test_now_ms();
	while (test_now_ms() - t0 < 4000) {
		most = MAX(most, proc_rss_kb(srv.pid));
		usleep(20 * 1000);
	}
	atomic_store(&flood_stop, true);
	pthread_join(t, NULL);
	CHECK(legit, "a client during the flood");
	rss = proc_rss_kb(srv.pid);
	most = MAX(most, rss);
	CHECK(atomic_load(&flood_sent) > 10000, "%llu heartbeats sent",
	      (unsigned long long)atomic_load(&flood_sent));
	CHECK(most - rss0 < RSS_BOUND_KB, "server RSS grew by %ld KiB at most (bound %ld KiB)",
	      most - rss0, RSS_BOUND_KB);
	fprintf(stderr, "heartbeat flood: %llu heartbeats over %u paths in 4.5 s, never read: "
		"server RSS %ld -> %ld KiB (most %ld)\n",
		(unsigned long long)atomic_load(&flood_sent), atomic_load(&flood_paths), rss0,
		rss, most);
	server_stop();
	/*
	 * The log says which session floods, once the server knows it: every
	 * line about the first path (its info request answered before it
	 * flooded) names "flooder0", the fabric's about its connection too
	 * (fab_con_rename; before, it said "(new)/PEER#0").
	 */
	char port[16];
	int lines, caught;

	CHECK(atomic_load(&flood_named_port) > 0, "the first flooder's info request answered");
	snprintf(port, sizeof(port), ":%d", atomic_load(&flood_named_port));
	fprintf(stderr, "the first flooder's lines in the server's log:\n");
	lines = log_lines_with(logpath, port, "flooder0/", &named, true);
	CHECK_EQ(named, lines);
	log_lines_with(logpath, "broke the frame protocol", port, &caught, false);
	CHECK(lines > 0, "the first flooder's path is logged (%d lines with %s)", lines, port);
	CHECK_EQ(caught, 1);
	if (g_failures) {
		/* What the server said (a sanitizer's report, say) goes with the failure. */
		FILE *f = fopen(logpath, "r");
		char line[1024];

		fprintf(stderr, "server log:\n");
		while (f && fgets(line, sizeof(line), f))
			fputs(line, stderr);
		if (f)
			fclose(f);
	}
	unlink(logpath);
}

/*
 * Empty writes without an immediate, paced: frames that carry nothing and
 * ask for nothing, which no RTRS peer sends (each would cost the server a
 * read for no work). The fabric closes the connection at the first: the
 * peer's sends start to fail within 20 s even on a loaded machine, the
 * server's log says why once, naming the path, and a client still gets in
 * and moves data.
 */
static void test_silent_trickle(void)
{
	/* Heartbeats every 10 s: the path must not be failed for its silence first. */
	const char *extra[] = { "--hb-interval", "10000", NULL };
	char logpath[] = "/tmp/test-hostile-trickle-XXXXXX", port[16];
	static struct rtrs_tcp_hdr burst[64];
	struct rtrs_conn_rsp rsp;
	uint64_t sent = 0, t0;
	int lfd, fd, caught, named, lines, err = 0;
	bool legit;

	lfd = mkstemp(logpath);
	CHECK(lfd >= 0, "mkstemp: %s", strerror(errno));
	if (lfd < 0)
		return;
	close(lfd);
	if (!server_start_log(0, extra, logpath)) {
		unlink(logpath);
		return;
	}
	atomic_store(&flood_paths, 0);
	atomic_store(&flood_named_port, 0);
	fd = flood_path(&rsp); /* "flooder0", its info answered */
	CHECK(fd >= 0, "the trickling path connects: %s", strerror(fd < 0 ? -fd : 0));
	if (fd < 0) {
		server_stop();
		unlink(logpath);
		return;
	}
	for (size_t i = 0; i < ARRAY_SIZE(burst); i++)
		burst[i] = wire_hdr(RTRS_TCP_WRITE, 0, rsp.imm_desc.key, rsp.imm_desc.addr, false, 0);
	t0 = test_now_ms();
	while (test_now_ms() - t0 < 20000) {
		int rc = write_all(fd, burst, sizeof(burst));

		if (rc) {
			err = -rc;
			break;
		}
		sent += ARRAY_SIZE(burst);
		usleep(100);
	}
	close(fd);
	legit = legit_session(srv.port, "legit-trickle", false, 64);
	server_stop();
	fprintf(stderr, "silent trickle: %llu writes in %llu ms, then %s\n", (unsigned long long)sent,
		(unsigned long long)(test_now_ms() - t0), err ? strerror(err) : "no error");
	CHECK(err == ECONNRESET || err == EPIPE, "the server closed the trickling path (%s)",
	      err ? strerror(err) : "still open after 20 s");
	CHECK(legit, "a client after the trickle");
	CHECK(atomic_load(&flood_named_port) > 0, "the trickling path's info request answered");
	snprintf(port, sizeof(port), ":%d", atomic_load(&flood_named_port));
	fprintf(stderr, "the trickling path's lines in the server's log:\n");
	lines = log_lines_with(logpath, port, "flooder0/", &named, true);
	CHECK_EQ(named, lines);
	log_lines_with(logpath, "empty write without an immediate", port, &caught, false);
	CHECK_EQ(caught, 1);
	unlink(logpath);
}

/* ---- a replayed connection request --------------------------------------------- */

/*
 * A proxy between the client and the server that keeps the first bytes
 * the client sends on its first connection: its connection request, as
 * anyone on the network path would see it.
 */
static struct {
	int lfd, port, srv_port;
	pthread_t thread;
	atomic_bool stop;
	uint8_t first[128];
	atomic_size_t first_len;
} px;

struct pump {
	int from, to;
	bool record;
};

static void *pump_thread(void *arg)
{
	struct pump *pp = arg;
	uint8_t buf[8192];
	size_t recorded = 0;

	for (;;) {
		ssize_t n = recv(pp->from, buf, sizeof(buf), 0);

		if (n <= 0 || write_all(pp->to, buf, (size_t)n))
			break;
		if (pp->record && recorded < sizeof(px.first)) {
			size_t k = MIN((size_t)n, sizeof(px.first) - recorded);

			memcpy(px.first + recorded, buf, k);
			recorded += k;
			atomic_store(&px.first_len, recorded);
		}
	}
	shutdown(pp->to, SHUT_WR);
	shutdown(pp->from, SHUT_RD);
	free(pp);
	return NULL;
}

static void *proxy_thread(void *arg)
{
	bool first = true;

	while (!atomic_load(&px.stop)) {
		struct pollfd p = { .fd = px.lfd, .events = POLLIN };
		struct pump *a, *b;
		pthread_t t;
		int c, s;

		if (poll(&p, 1, 100) <= 0)
			continue;
		c = accept4(px.lfd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0)
			continue;
		s = tcp_connect(px.srv_port);
		if (s < 0) {
			close(c);
			continue;
		}
		struct timeval none = { 0 };

		setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof(none));
		a = malloc(sizeof(*a));
		b = malloc(sizeof(*b));
		*a = (struct pump){ .from = c, .to = s, .record = first };
		*b = (struct pump){ .from = s, .to = c };
		first = false;
		/* The pumps end with their sockets, which the test's end closes. */
		pthread_create(&t, NULL, pump_thread, a);
		pthread_detach(t);
		pthread_create(&t, NULL, pump_thread, b);
		pthread_detach(t);
	}
	return arg;
}

static bool proxy_start(int srv_port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);

	px.srv_port = srv_port;
	px.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	inet_pton(AF_INET, test_addr(), &sa.sin_addr);
	if (px.lfd < 0 || bind(px.lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(px.lfd, 16) || getsockname(px.lfd, (struct sockaddr *)&sa, &sl))
		return false;
	px.port = ntohs(sa.sin_port);
	atomic_store(&px.stop, false);
	return pthread_create(&px.thread, NULL, proxy_thread, NULL) == 0;
}

static void proxy_stop(void)
{
	atomic_store(&px.stop, true);
	pthread_join(px.thread, NULL);
	close(px.lfd);
}

static atomic_bool io_stop;
static atomic_int io_done, io_errors;

static void *io_thread(void *arg)
{
	struct rtrs_clt_sess *s = arg;

	while (!atomic_load(&io_stop)) {
		int ok = legit_verified(s, 8, (unsigned)atomic_load(&io_done));

		atomic_fetch_add(&io_done, ok);
		atomic_fetch_add(&io_errors, 8 - ok);
	}
	return NULL;
}

static void test_replay(void)
{
	const char *extra[] = { "--auth-keys", keys_path, NULL };
	struct rtrs_path_stats ps = { .size = sizeof(ps) };
	struct rtrs_clt_sess *s = NULL;
	struct rtrs_conn_rsp rsp;
	pthread_t io;
	int rc, refused = 0;

	write_keys();
	if (!server_start(0, extra))
		return;
	if (!proxy_start(srv.port)) {
		CHECK(false, "proxy: %s", strerror(errno));
		server_stop();
		return;
	}
	rc = legit_open(px.port, "legit-replay", true, &s);
	CHECK(rc == 0, "the client through the proxy: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK(atomic_load(&px.first_len) > sizeof(struct rtrs_tcp_hdr), "the request was seen");
	atomic_store(&io_stop, false);
	pthread_create(&io, NULL, io_thread, s);
	usleep(300 * 1000);
	for (int i = 0; i < 5; i++) {
		/* Straight to the server, as someone on the path would. */
		rc = wire_handshake(srv.port, px.first, atomic_load(&px.first_len), &rsp, NULL);
		refused += rc != 0;
		usleep(400 * 1000);
	}
	usleep(600 * 1000); /* three of the server's heartbeat intervals */
	atomic_store(&io_stop, true);
	pthread_join(io, NULL);
	CHECK_EQ(refused, 5);
	CHECK(atomic_load(&io_done) > 100, "%d IOs verified during the replays",
	      atomic_load(&io_done));
	CHECK_EQ(atomic_load(&io_errors), 0);
	CHECK_EQ(rtrs_clt_path_stats(s, 0, &ps), 0);
	CHECK(!strcmp(ps.state, "connected"), "path state: %s", ps.state);
	CHECK(ps.reconnects == 0, "the path reconnected %llu times",
	      (unsigned long long)ps.reconnects);
	rtrs_clt_close(s);
out:
	server_stop();
	proxy_stop();
}

/* ---- final refusals ----------------------------------------------------------- */

/*
 * A refusal marked "do not retry" reaches the client whatever the client
 * does meanwhile: here it sends more than its request (as a client that
 * pipelines) and reads the answer only 100 ms later. A reject whose
 * connection the server tears down at once is lost that way (the unread
 * bytes turn the close into a reset); the verdict must still arrive, with
 * its errno and the flag.
 */
static void test_final_refusal(void)
{
	const char *extra[] = { NULL };
	int got = 0, dnr = 0;

	if (!server_start(0, extra))
		return;
	for (int i = 0; i < 40; i++) {
		struct rtrs_conn_req req;
		struct rtrs_msg_conn_req m;
		struct rtrs_conn_rsp rsp;
		uint8_t buf[256];
		size_t len;
		int fd = tcp_connect(srv.port);

		if (fd < 0)
			continue;
		/* Not a first connection of an unknown session: final, -ENXIO. */
		random_req(&req, 0, 2, true);
		req.first_conn = false;
		rtrs_conn_req_encode(&m, &req);
		len = wire_connreq(&m, buf, sizeof(buf));
		memset(buf + len, 0x5a, 64);
		if (write_all(fd, buf, len + 64) == 0) {
			usleep(100 * 1000);
			if (wire_answer(fd, &rsp) == -ENXIO) {
				got++;
				dnr += rsp.dnr;
			}
		}
		close(fd);
	}
	CHECK(got == 40, "%d of 40 final refusals arrived with their errno", got);
	CHECK_EQ(dnr, got);
	CHECK(legit_session(srv.port, "legit-refusals", false, 16), "a client after the refusals");
	server_stop();
}

/*
 * Later connections (cid 1) of paths nobody started: a path begins with its
 * connection 0, so each is refused (-EAGAIN, the client starts its path
 * again) and none makes a path, which would be one that never met the
 * pending limits: the attacker's sockets, all held open, leave the server
 * with none of them.
 */
static void test_later_connection(void)
{
	enum { N = 100 };
	const char *extra[] = { NULL };
	static int fds[N];
	int nfd = 0, refused = 0, fd0, most = 0;

	if (!server_start(0, extra))
		return;
	usleep(100 * 1000);
	fd0 = proc_fds(srv.pid);
	for (int i = 0; i < N; i++) {
		int fd = -1, rc = random_handshake(srv.port, 1, 2, false, &fd);

		refused += rc == -EAGAIN;
		if (fd >= 0)
			fds[nfd++] = fd;
	}
	usleep(200 * 1000);
	most = proc_fds(srv.pid);
	CHECK(refused == N, "%d of %d later connections of unknown paths refused with EAGAIN",
	      refused, N);
	CHECK(most - fd0 < 20, "server fds %d -> %d with %d such sockets held open", fd0, most,
	      nfd);
	CHECK(legit_session(srv.port, "legit-later", false, 16), "a client after them");
	for (int i = 0; i < nfd; i++)
		close(fds[i]);
	server_stop();
}

/* ---- sessions and chunk memory ------------------------------------------------ */

static void test_session_limits(void)
{
	/* 64 chunks of 128 KiB: 8 MiB a session. */
	const char *by_count[] = { "--max-sessions", "3", NULL };
	const char *by_mem[] = { "--max-chunk-mem", "20M", NULL };
	struct rtrs_clt_sess *s[4] = { 0 };
	char name[32];
	int rc;

	for (int round = 0; round < 2; round++) {
		if (!server_start(0, round ? by_mem : by_count))
			return;
		int allowed = round ? 2 : 3;

		for (int i = 0; i <= allowed; i++) {
			snprintf(name, sizeof(name), "limit%d-%d", round, i);
			rc = legit_open(srv.port, name, false, &s[i]);
			if (i < allowed) {
				CHECK(rc == 0, "session %d of %d: %s", i + 1, allowed, strerror(-rc));
			} else {
				CHECK_EQ(rc, -ENOSPC);
				s[i] = NULL;
			}
		}
		/* One goes: there is room again. */
		if (s[0]) {
			rtrs_clt_close(s[0]);
			s[0] = NULL;
		}
		usleep(300 * 1000);
		snprintf(name, sizeof(name), "limit%d-again", round);
		CHECK(legit_session(srv.port, name, false, 16), "a session once another left");
		for (int i = 0; i < 4; i++)
			if (s[i])
				rtrs_clt_close(s[i]);
		memset(s, 0, sizeof(s));
		server_stop();
	}
}

/* ---- continuous floods from other addresses and from the client's own --------- */

/*
 * A flooder: from src, as fast as pacing_us lets it, either raw TCP
 * connections that never send a byte (half == false: each closed with a
 * reset after HOLD newer ones, so the server sees a standing crowd and a
 * steady churn), or half-open paths (half == true: a valid connection
 * request for an authenticated session, then silence: never a
 * negotiation).
 */
struct flooder {
	int port;
	const char *src;
	bool half;
	unsigned pacing_us;
	atomic_bool stop;
	atomic_uint_fast64_t made;
	pthread_t t;
};

enum { FLOOD_HOLD = 128 };

static int flood_socket(const struct flooder *f, bool block)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)f->port) };
	struct sockaddr_in src = { .sin_family = AF_INET };
	struct linger lg = { .l_onoff = 1, .l_linger = 0 }; /* a reset at close: no TIME_WAIT */
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (block ? 0 : SOCK_NONBLOCK), 0);

	if (fd < 0)
		return -errno;
	inet_pton(AF_INET, f->src, &src.sin_addr);
	inet_pton(AF_INET, test_addr(), &sa.sin_addr);
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	if (bind(fd, (struct sockaddr *)&src, sizeof(src)) ||
	    (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) && errno != EINPROGRESS)) {
		int rc = -errno;

		close(fd);
		return rc;
	}
	return fd;
}

static void *flooder_thread(void *arg)
{
	struct flooder *f = arg;
	int ring[FLOOD_HOLD];
	unsigned n = 0;

	for (unsigned i = 0; i < FLOOD_HOLD; i++)
		ring[i] = -1;
	while (!atomic_load(&f->stop)) {
		int fd = flood_socket(f, f->half);

		if (fd >= 0 && f->half) {
			struct rtrs_conn_req r;
			struct rtrs_msg_conn_req m;
			uint8_t buf[256];
			size_t len;

			random_req(&r, 0, 2, true);
			rtrs_conn_req_encode(&m, &r);
			len = wire_connreq(&m, buf, sizeof(buf));
			if (write_all(fd, buf, len)) {
				close(fd);
				fd = -1;
			}
		}
		if (fd >= 0) {
			if (ring[n % FLOOD_HOLD] >= 0)
				close(ring[n % FLOOD_HOLD]);
			ring[n++ % FLOOD_HOLD] = fd;
			atomic_fetch_add(&f->made, 1);
		}
		usleep(fd >= 0 ? f->pacing_us : 1000);
	}
	for (unsigned i = 0; i < FLOOD_HOLD; i++)
		if (ring[i] >= 0)
			close(ring[i]);
	return NULL;
}

static long proc_cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
	fclose(f);
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut,
			 &st) != 2)
		return -1;
	return (long)(ut + st);
}

/*
 * Authenticated opens while floods run, each followed by verified IO.
 * Returns how many failed; *cpu_pct is the server's CPU (% of one core)
 * over the window.
 */
static int opens_under_flood(int port, struct flooder *fl, unsigned nfl, const char *what,
			     unsigned opens, double *cpu_pct)
{
	uint64_t t0, made0 = 0, made1 = 0;
	long c0, c1;

	int failed = 0;

	for (unsigned i = 0; i < nfl; i++) {
		fl[i].port = port;
		atomic_store(&fl[i].stop, false);
		atomic_store(&fl[i].made, 0);
		CHECK_EQ(pthread_create(&fl[i].t, NULL, flooder_thread, &fl[i]), 0);
	}
	usleep(500 * 1000); /* the crowd stands */
	/* The flood alone first: what it costs the server. */
	for (unsigned i = 0; i < nfl; i++)
		made0 += atomic_load(&fl[i].made);
	c0 = proc_cpu_ticks(srv.pid);
	t0 = test_now_ms();
	usleep(2000 * 1000);
	c1 = proc_cpu_ticks(srv.pid);
	uint64_t ms = test_now_ms() - t0;

	for (unsigned i = 0; i < nfl; i++)
		made1 += atomic_load(&fl[i].made);
	*cpu_pct = ms ? (double)(c1 - c0) * 1000.0 / (double)sysconf(_SC_CLK_TCK) / (double)ms *
			100.0 : 0;
	double rate = ms ? (double)(made1 - made0) * 1000.0 / (double)ms : 0;

	/* Then the opens, the flood going on. */
	t0 = test_now_ms();
	for (unsigned i = 0; i < opens; i++) {
		char name[64];

		snprintf(name, sizeof(name), "legit-%s-%u", what, i);
		if (!legit_session(port, name, true, 4))
			failed++;
	}
	ms = test_now_ms() - t0;
	for (unsigned i = 0; i < nfl; i++) {
		atomic_store(&fl[i].stop, true);
		pthread_join(fl[i].t, NULL);
	}
	printf("test-hostile: %s: %.0f flood connections/s cost the server %.0f%% of a CPU; "
	       "beside them %u authenticated opens, %d failed, in %llu ms\n", what, rate,
	       *cpu_pct, opens, failed, (unsigned long long)ms);
	return failed;
}

/*
 * The server's CPU under the floods alone (two seconds of them, before
 * the opens): about 6,800 connections/s from other addresses cost it 22 %
 * of one core here, 2,100/s from the client's own 8 % (73 % and 23 %
 * while every accept probed every held connection with FIONREAD). The
 * bound leaves room for a loaded machine. A sanitizer's build is slower
 * by several times: its figure is printed, not bound.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLOOD_CPU_BOUND_PCT 1000.0
#else
#define FLOOD_CPU_BOUND_PCT 60.0
#endif

/*
 * The flooders: from other addresses raw connects (two) and half-open
 * paths; from the client's own, half-open paths and raw connects.
 */
static void floods_init(struct flooder other[3], struct flooder own[2])
{
	memset(other, 0, 3 * sizeof(*other));
	memset(own, 0, 2 * sizeof(*own));
	other[0] = (struct flooder){ .src = test_addr_n(2), .half = false, .pacing_us = 200 };
	other[1] = (struct flooder){ .src = test_addr_n(3), .half = false, .pacing_us = 200 };
	other[2] = (struct flooder){ .src = test_addr_n(3), .half = true, .pacing_us = 2000 };
	own[0] = (struct flooder){ .src = test_addr(), .half = true, .pacing_us = 2000 };
	own[1] = (struct flooder){ .src = test_addr(), .half = false, .pacing_us = 500 };
}

static void test_continuous_floods(void)
{
	const char *extra[] = { "--auth-keys", keys_path, "--handshake-timeout", "3000", NULL };
	struct flooder other[3], own[2];
	double cpu;

	floods_init(other, own);
	write_keys();
	if (!server_start(0, extra))
		return;
	/* From other addresses: raw connects (two flooders) and half-open paths. */
	CHECK_EQ(opens_under_flood(srv.port, other, 3, "others", 16, &cpu), 0);
	CHECK(cpu <= FLOOD_CPU_BOUND_PCT, "the server spent %.0f%% of a CPU under the floods", cpu);
	/* From the client's own address: every open gets in within its retries. */
	CHECK_EQ(opens_under_flood(srv.port, own, 2, "own-address", 8, &cpu), 0);
	CHECK(cpu <= FLOOD_CPU_BOUND_PCT, "the server spent %.0f%% of a CPU under the floods", cpu);
	/* Still itself afterwards. */
	CHECK(legit_session(srv.port, "legit-after-floods", true, 16), "a session after the floods");
	server_stop();
}

/*
 * The same floods against a server that requires TLS: the raw connections
 * wait for a ClientHello that never comes, the half-open paths' requests
 * come in the clear and are refused at admission; the legitimate client's
 * opens, with a derived PSK and with secure channel concatenation (whose
 * first connection is in the clear, as theirs), all get in.
 */
static void test_continuous_floods_tls(void)
{
	const char *extra[] = { "--auth-keys", keys_path, "--handshake-timeout", "3000",
				"--tls", "required", NULL };
	struct flooder other[3], own[2];
	double cpu;

	if (strcmp(test_provider(), "tcp")) {
		/* Nothing to test: RDMA paths have no TLS (not a skip: tcp runs it). */
		printf("test-hostile: floods against TLS: no TLS on provider %s\n", test_provider());
		return;
	}
	floods_init(other, own);
	write_keys();
	if (!server_start(0, extra))
		return;
	legit_tls = RTRS_TLS_REQUIRED;
	CHECK_EQ(opens_under_flood(srv.port, other, 3, "others-tls", 8, &cpu), 0);
	CHECK(cpu <= FLOOD_CPU_BOUND_PCT, "the server spent %.0f%% of a CPU under the floods", cpu);
	legit_tls = RTRS_TLS_CONCAT;
	CHECK_EQ(opens_under_flood(srv.port, other, 3, "others-concat", 8, &cpu), 0);
	CHECK(cpu <= FLOOD_CPU_BOUND_PCT, "the server spent %.0f%% of a CPU under the floods", cpu);
	CHECK_EQ(opens_under_flood(srv.port, own, 2, "own-address-concat", 8, &cpu), 0);
	CHECK(cpu <= FLOOD_CPU_BOUND_PCT, "the server spent %.0f%% of a CPU under the floods", cpu);
	legit_tls = RTRS_TLS_REQUIRED;
	CHECK(legit_session(srv.port, "legit-tls-after-floods", true, 16),
	      "a TLS session after the floods");
	legit_tls = RTRS_TLS_OFF;
	server_stop();
}

/*
 * test-hostile --flood PORT SECONDS: the floods of test_continuous_floods
 * from the two other addresses, against a server someone else runs (the
 * storm test runs them beside its storm); stops early on SIGTERM. Prints
 * what it made.
 */
static volatile sig_atomic_t flood_term;

static void on_term(int sig)
{
	(void)sig;
	flood_term = 1;
}

static int flood_main(int port, unsigned secs)
{
	struct flooder fl[3] = {
		{ .src = test_addr_n(2), .half = false, .pacing_us = 200 },
		{ .src = test_addr_n(3), .half = false, .pacing_us = 200 },
		{ .src = test_addr_n(3), .half = true, .pacing_us = 2000 },
	};
	uint64_t made = 0;

	signal(SIGTERM, on_term);
	for (unsigned i = 0; i < 3; i++) {
		fl[i].port = port;
		if (pthread_create(&fl[i].t, NULL, flooder_thread, &fl[i])) {
			fprintf(stderr, "test-hostile --flood: cannot start a flooder\n");
			return 1;
		}
	}
	for (unsigned ms = 0; ms < secs * 1000 && !flood_term; ms += 50)
		usleep(50 * 1000);
	for (unsigned i = 0; i < 3; i++) {
		atomic_store(&fl[i].stop, true);
		pthread_join(fl[i].t, NULL);
		made += atomic_load(&fl[i].made);
	}
	printf("test-hostile --flood: %llu raw connections and half-open paths from %s and %s\n",
	       (unsigned long long)made, test_addr_n(2), test_addr_n(3));
	return 0;
}

int main(int argc, char **argv)
{
	const char *dir;
	struct rlimit lim;

	if (argc == 4 && !strcmp(argv[1], "--flood")) {
		signal(SIGPIPE, SIG_IGN);
		return flood_main(atoi(argv[2]), (unsigned)atoi(argv[3]));
	}
	if (argc != 1) {
		fprintf(stderr, "usage: test-hostile [--flood PORT SECONDS]\n");
		return 2;
	}
	dir = test_tmpdir("/tmp", "rtrs-test-hostile");

	if (!dir)
		return 1;
	snprintf(keys_path, sizeof(keys_path), "%s/hosts", dir);
	/* This process holds the attackers' sockets: as many fds as it may. */
	getrlimit(RLIMIT_NOFILE, &lim);
	lim.rlim_cur = lim.rlim_max;
	setrlimit(RLIMIT_NOFILE, &lim);
	if (lim.rlim_cur < 4096) {
		fprintf(stderr, "test-hostile: needs 4096 fds, has %llu\n",
			(unsigned long long)lim.rlim_cur);
		return 77;
	}
	signal(SIGPIPE, SIG_IGN);
	srand((unsigned)getpid());
#if defined(__SANITIZE_ADDRESS__)
	{
		/* The server inherits it: freed memory is not held back for long. */
		const char *o = getenv("ASAN_OPTIONS");
		char opts[512];

		snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=4", o ? o : "", o ? ":" : "");
		setenv("ASAN_OPTIONS", opts, 1);
	}
#endif
	rtrs_set_log_level(0);
	test_exhaustion();
	test_exhaustion_one_byte();
	test_hb_flood();
	test_silent_trickle();
	test_replay();
	test_final_refusal();
	test_later_connection();
	test_session_limits();
	test_continuous_floods();
	test_continuous_floods_tls();
	return test_done("test-hostile");
}
