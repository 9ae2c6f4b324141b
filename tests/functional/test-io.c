/* SPDX-License-Identifier: MIT */
/*
 * Verified IO through a session to a real server process (rtrs-test-server;
 * on 127.0.0.1 over tcp unless RTRS_TEST_PROVIDER/RTRS_TEST_ADDR or
 * RTRS_TEST_SERVER_AT say otherwise): every byte written is read back and
 * compared.
 *   A. sizes from 1 byte to max_io_size, contiguous and scatter-gather;
 *   B. queue depths 1..512 from several client threads;
 *   C. a server errno reaches the client's completion as that errno;
 *   D. requests the client must refuse, and a server-side range error.
 *
 * test-io --fault-eagain-every N (the test test-io-eagain) runs the same
 * with every Nth write refused as if the send queue were full, on both
 * sides: the pending lists and kicks carry the load (rtrs-fault.h; a build
 * without -Dfault_injection=true skips it).
 *
 * test-io --fault-post-fail N (verbs only; the guests' verbs suite) runs the
 * same with the Nth post of send work requests reported failed after it
 * queued them, as rxe's provider does when its doorbell fails: nothing may
 * go twice (a request answered twice fails its path with EPROTO, or
 * completes the permit's next request with the first's answer); the
 * connection fails, its path reconnects and its requests go again once.
 *
 * test-io --resegment (the test test-io-resegment; tcp only) runs the same
 * through a proxy that passes each direction's bytes on in pieces of
 * random sizes (1 byte to 9 KiB, a third of them under 40 bytes, with
 * pauses between some), so that the receiver finds frames split at every
 * kind of place: inside a header, between a header and its payload, inside
 * a payload, several frames in one read and the bytes read ahead.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rtrs.h"
#include "check.h"
#include "harness.h"
#include "test-proto-hdr.h"
#ifdef RTRS_FAULT_INJECTION
#include "rtrs-fault.h"
#endif

#define STORE_SIZE (128u << 20)
#define RTRS_TEST_SEGS 16
#define MIN_(a, b) ((a) < (b) ? (a) : (b))
#define NTHREADS 4

static struct rtrs_clt_sess *sess;
static struct rtrs_attrs attrs = { .size = sizeof(attrs) };

static uint8_t pat(uint64_t seed, size_t i)
{
	uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;

	return (uint8_t)(x >> 56);
}

static void fill(uint8_t *b, size_t n, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(seed, i);
}

/* One request and its completion. */
struct io {
	struct rtrs_permit *permit;
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	pthread_mutex_t *lock;
	pthread_cond_t *cond;
	unsigned *outstanding;
	atomic_int calls;
	int err;
	enum rtrs_dir dir;
};

static void io_conf(void *priv, int err)
{
	struct io *io = priv;

	io->err = err;
	atomic_fetch_add(&io->calls, 1);
	pthread_mutex_lock(io->lock);
	(*io->outstanding)--;
	pthread_cond_broadcast(io->cond);
	pthread_mutex_unlock(io->lock);
}

static int io_start(struct io *io, enum rtrs_dir dir, uint32_t op, uint64_t off,
		    const struct iovec *data, size_t cnt, int errno_)
{
	struct iovec usr = { &io->hdr, sizeof(io->hdr) };
	size_t len = 0;
	int rc;

	for (size_t i = 0; i < cnt; i++)
		len += data[i].iov_len;
	io->hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = op, .offset = off,
				     .len = (uint32_t)len, .errno_ = errno_ };
	io->ops = (struct rtrs_clt_req_ops){ .priv = io, .conf = io_conf };
	io->err = 1;
	io->dir = dir;
	pthread_mutex_lock(io->lock);
	(*io->outstanding)++;
	pthread_mutex_unlock(io->lock);
	rc = rtrs_clt_request(sess, dir, &io->ops, io->permit, &usr, 1, data, cnt);
	if (rc) {
		pthread_mutex_lock(io->lock);
		(*io->outstanding)--;
		pthread_mutex_unlock(io->lock);
	}
	return rc;
}

/*
 * What a request that never completed says of itself and of the session's
 * paths, so that the log tells a request the client lost from one whose
 * answer never came on a path that stayed up.
 */
static void report_lost(const struct io *ios, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		if (atomic_load(&ios[i].calls))
			continue;
		fprintf(stderr, "  without a completion: slot %u, %s of %u bytes at %llu\n", i,
			ios[i].dir == RTRS_WRITE ? "write" : "read", ios[i].hdr.len,
			(unsigned long long)ios[i].hdr.offset);
	}
	for (unsigned p = 0;; p++) {
		struct rtrs_path_stats st = { .size = sizeof(st) };

		if (rtrs_clt_path_stats(sess, p, &st))
			break;
		fprintf(stderr, "  path %s: %s, inflight %u, reads %llu, writes %llu, "
			"reconnects %llu (failed %llu), failovers %llu, last error %d, "
			"heartbeat %llu ns\n", st.name, st.state, st.inflight,
			(unsigned long long)st.reads, (unsigned long long)st.writes,
			(unsigned long long)st.reconnects,
			(unsigned long long)st.reconnect_failures,
			(unsigned long long)st.failovers, st.last_error,
			(unsigned long long)st.hb_latency_ns);
	}
}

/*
 * Waits for every request of a batch (ios[0 .. n)). A completion that
 * never comes (a frame lost or misread) fails the test after WAIT_MAX_S
 * instead of hanging it: the requests still point into this stack, so it
 * exits.
 */
#define WAIT_MAX_S 90
static void wait_all(pthread_mutex_t *lock, pthread_cond_t *cond, unsigned *outstanding,
		     const struct io *ios, unsigned n)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until); /* the clock of PTHREAD_COND_INITIALIZER */
	until.tv_sec += WAIT_MAX_S;
	pthread_mutex_lock(lock);
	while (*outstanding) {
		if (pthread_cond_timedwait(cond, lock, &until) == ETIMEDOUT && *outstanding) {
			CHECK(0, "%u requests still without a completion after %d s", *outstanding,
			      WAIT_MAX_S);
			report_lost(ios, n);
			exit(test_done("test-io"));
		}
	}
	pthread_mutex_unlock(lock);
}

static enum rtrs_clt_con_type sync_con_type = RTRS_IO_CON;

/* Synchronous single request; returns the completion errno or the submit error. */
static int io_sync(enum rtrs_dir dir, uint32_t op, uint64_t off, const struct iovec *data,
		   size_t cnt, int errno_)
{
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	unsigned outstanding = 0;
	struct io io = { .lock = &lock, .cond = &cond, .outstanding = &outstanding };
	int rc;

	io.permit = rtrs_clt_get_permit(sess, sync_con_type, RTRS_PERMIT_WAIT);
	rc = io_start(&io, dir, op, off, data, cnt, errno_);
	if (!rc) {
		wait_all(&lock, &cond, &outstanding, &io, 1);
		rc = io.err;
		CHECK_EQ(atomic_load(&io.calls), 1);
	}
	rtrs_clt_put_permit(sess, io.permit);
	return rc;
}

/* Splits [buf, len) into up to n iovecs of uneven sizes. */
static size_t split(uint8_t *buf, size_t len, struct iovec *iov, size_t n)
{
	size_t cnt = 0, off = 0;

	while (off < len && cnt < n) {
		size_t left = len - off;
		size_t take = cnt == n - 1 ? left : MIN_(left, left / 3 + 1);

		iov[cnt++] = (struct iovec){ buf + off, take };
		off += take;
	}
	return cnt;
}

static void part_sizes(void)
{
	const size_t sizes[] = { 1, 2, 3, 7, 511, 512, 513, 4095, 4096, 4097, 8191, 65536,
				 100000, 126975, attrs.max_io_size };
	uint8_t *w = malloc(attrs.max_io_size), *r = malloc(attrs.max_io_size);

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t n = sizes[i];
		uint64_t off = (uint64_t)i * attrs.max_io_size;

		for (int sg = 0; sg < 2; sg++) {
			struct iovec wi[RTRS_TEST_SEGS], ri[RTRS_TEST_SEGS];
			size_t wc, rc_;
			int rc;

			if (n > attrs.max_io_size)
				continue;
			fill(w, n, n * 2 + (size_t)sg);
			memset(r, 0xA5, n);
			wc = sg ? split(w, n, wi, 5) : (wi[0] = (struct iovec){ w, n }, 1);
			rc_ = sg ? split(r, n, ri, 3) : (ri[0] = (struct iovec){ r, n }, 1);
			rc = io_sync(RTRS_WRITE, TEST_OP_IO, off, wi, wc, 0);
			CHECK(rc == 0, "write %zu bytes (sg %d): %s", n, sg, strerror(-rc));
			rc = io_sync(RTRS_READ, TEST_OP_IO, off, ri, rc_, 0);
			CHECK(rc == 0, "read %zu bytes (sg %d): %s", n, sg, strerror(-rc));
			CHECK(memcmp(w, r, n) == 0, "%zu bytes (sg %d) read back differ", n, sg);
		}
	}
	free(w);
	free(r);
}

struct qd_thread {
	pthread_t thr;
	unsigned idx, slots, round;
	uint64_t region;
	unsigned mismatches, errors;
};

static void *qd_worker(void *arg)
{
	struct qd_thread *t = arg;
	pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
	pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
	unsigned outstanding = 0;
	uint64_t slot_bytes = t->region / t->slots;
	struct io *ios = calloc(t->slots, sizeof(*ios));
	uint8_t **wb = calloc(t->slots, sizeof(*wb)), **rb = calloc(t->slots, sizeof(*rb));
	size_t *len = calloc(t->slots, sizeof(*len));

	for (unsigned i = 0; i < t->slots; i++) {
		ios[i] = (struct io){ .lock = &lock, .cond = &cond, .outstanding = &outstanding };
		ios[i].permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		/* Sizes from 1 byte to max_io_size, different per slot and round. */
		len[i] = 1 + ((size_t)(i * 7919 + t->idx * 104729 + t->round * 15485863) %
			      MIN_(slot_bytes, attrs.max_io_size));
		if (i == 0)
			len[i] = MIN_(slot_bytes, attrs.max_io_size);
		wb[i] = malloc(len[i]);
		rb[i] = malloc(len[i]);
		fill(wb[i], len[i], ((uint64_t)t->round << 40) | ((uint64_t)t->idx << 20) | i);
		memset(rb[i], 0x5A, len[i]);
	}
	for (int dir = 0; dir < 2; dir++) {
		for (unsigned i = 0; i < t->slots; i++) {
			struct iovec v = { dir == 0 ? wb[i] : rb[i], len[i] };
			uint64_t off = t->idx * t->region + i * slot_bytes;
			int rc = io_start(&ios[i], dir == 0 ? RTRS_WRITE : RTRS_READ, TEST_OP_IO,
					  off, &v, 1, 0);

			if (rc) {
				t->errors++;
				fprintf(stderr, "qd thread %u: submit: %s\n", t->idx, strerror(-rc));
			}
		}
		wait_all(&lock, &cond, &outstanding, ios, t->slots);
		for (unsigned i = 0; i < t->slots; i++)
			if (ios[i].err)
				t->errors++;
	}
	for (unsigned i = 0; i < t->slots; i++) {
		if (memcmp(wb[i], rb[i], len[i]))
			t->mismatches++;
		if (atomic_load(&ios[i].calls) != 2)
			t->errors++;
		rtrs_clt_put_permit(sess, ios[i].permit);
		free(wb[i]);
		free(rb[i]);
	}
	free(ios);
	free(wb);
	free(rb);
	free(len);
	return NULL;
}

static void part_queue_depths(void)
{
	const unsigned qds[] = { 1, 2, 3, 8, 64, 256, 512 };

	for (size_t q = 0; q < sizeof(qds) / sizeof(qds[0]); q++) {
		unsigned qd = qds[q], nthr = qd < NTHREADS ? qd : NTHREADS;
		struct qd_thread th[NTHREADS] = { 0 };
		unsigned mism = 0, errs = 0;

		for (unsigned round = 0; round < 2; round++) {
			for (unsigned i = 0; i < nthr; i++) {
				th[i] = (struct qd_thread){ .idx = i, .round = round,
							    .slots = qd / nthr + (i < qd % nthr),
							    .region = STORE_SIZE / nthr };
				pthread_create(&th[i].thr, NULL, qd_worker, &th[i]);
			}
			for (unsigned i = 0; i < nthr; i++) {
				pthread_join(th[i].thr, NULL);
				mism += th[i].mismatches;
				errs += th[i].errors;
			}
		}
		CHECK(mism == 0, "qd %u: %u buffers read back differ", qd, mism);
		CHECK(errs == 0, "qd %u: %u IO errors", qd, errs);
		printf("queue depth %u with %u threads: verified\n", qd, nthr);
	}
}

static void part_errno(void)
{
	const int errs[] = { 1, 5, 28, 61, 95, 125, 511 };
	uint8_t buf[4096];
	struct iovec v = { buf, sizeof(buf) };

	for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
		CHECK_EQ(io_sync(RTRS_WRITE, TEST_OP_FAIL, 0, &v, 1, errs[i]), -errs[i]);
		CHECK_EQ(io_sync(RTRS_READ, TEST_OP_FAIL, 0, &v, 1, errs[i]), -errs[i]);
		CHECK_EQ(io_sync(RTRS_WRITE, TEST_OP_FAIL, 0, NULL, 0, errs[i]), -errs[i]);
	}
	/* The immediate has 9 bits for errno: larger ones arrive as EIO. */
	CHECK_EQ(io_sync(RTRS_WRITE, TEST_OP_FAIL, 0, &v, 1, 600), -EIO);
}

static void part_refusals(void)
{
	struct rtrs_clt_req_ops ops = { .conf = io_conf };
	struct rtrs_permit *p = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	uint8_t *big = malloc(attrs.max_io_size + 1), hdr[8192] = { 0 };
	struct iovec data = { big, attrs.max_io_size + 1 };
	struct iovec usr = { hdr, attrs.max_hdr_size };
	struct iovec many[17];
	struct iovec zero = { big, 0 };

	for (int i = 0; i < 17; i++)
		many[i] = (struct iovec){ big + i, 1 };
	CHECK_EQ(rtrs_clt_request(sess, RTRS_WRITE, &ops, p, NULL, 0, &data, 1), -EMSGSIZE);
	CHECK_EQ(rtrs_clt_request(sess, RTRS_WRITE, &ops, p, &usr, 1, NULL, 0), -EMSGSIZE);
	CHECK_EQ(rtrs_clt_request(sess, RTRS_READ, &ops, p, NULL, 0, many, 17), -EMSGSIZE);
	CHECK_EQ(rtrs_clt_request(sess, RTRS_WRITE, &ops, p, NULL, 0, &zero, 1), -EINVAL);
	CHECK_EQ(rtrs_clt_request(sess, (enum rtrs_dir)7, &ops, p, NULL, 0, NULL, 0), -EINVAL);
	CHECK_EQ(rtrs_clt_request(sess, RTRS_WRITE, NULL, p, NULL, 0, NULL, 0), -EINVAL);
	rtrs_clt_put_permit(sess, p);
	free(big);

	/* The server refuses a range beyond its store. */
	uint8_t b[16];
	struct iovec v = { b, sizeof(b) };

	CHECK_EQ(io_sync(RTRS_WRITE, TEST_OP_IO, STORE_SIZE - 8, &v, 1, 0), -ERANGE);
	/* A header of exactly max_hdr_size minus the rtrs header is fine. */
	CHECK_EQ(attrs.max_hdr_size, 4096);
}

/* ---- the resegmenting proxy (--resegment) ------------------------------------ */

static struct {
	int lfd;
	struct sockaddr_in to;
	atomic_ullong pieces;
} rs;

struct rs_pipe {
	int from, to;
	unsigned seed;
};

/* Passes from's bytes on to to in pieces of random sizes, until either side ends. */
static void *rs_pipe_thread(void *arg)
{
	struct rs_pipe *p = arg;
	char *buf = malloc(1 << 16);

	if (!buf)
		goto out;
	for (;;) {
		ssize_t got = read(p->from, buf, 1 << 16), off = 0;

		if (got <= 0)
			break;
		while (off < got) {
			unsigned r = (unsigned)rand_r(&p->seed);
			size_t piece = r % 3 == 0 ? 1 + r / 3 % 40 : r % 3 == 1 ? 1 + r / 3 % 600 :
						    1 + r / 3 % 9000;
			ssize_t w;

			piece = MIN_(piece, (size_t)(got - off));
			w = send(p->to, buf + off, piece, MSG_NOSIGNAL);
			if (w <= 0)
				goto done;
			off += w;
			atomic_fetch_add(&rs.pieces, 1);
			if (r % 7 == 0)
				usleep(50); /* the receiver reads what came so far */
		}
	}
done:
	free(buf);
out:
	shutdown(p->to, SHUT_WR);
	shutdown(p->from, SHUT_RD);
	free(p);
	return NULL;
}

/* Accepts the client's connections, each to a connection of its own to the server. */
static void *rs_accept_thread(void *arg)
{
	unsigned seed = 1;

	(void)arg;
	for (;;) {
		int one = 1, c = accept(rs.lfd, NULL, NULL), s;
		struct rs_pipe *up, *down;
		pthread_t t;

		if (c < 0)
			break;
		s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&rs.to, sizeof(rs.to))) {
			close(c);
			if (s >= 0)
				close(s);
			continue;
		}
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		up = malloc(sizeof(*up));
		down = malloc(sizeof(*down));
		if (!up || !down)
			abort();
		*up = (struct rs_pipe){ .from = c, .to = s, .seed = seed++ };
		*down = (struct rs_pipe){ .from = s, .to = c, .seed = seed++ };
		/* Detached: the process ends with the test. */
		if (pthread_create(&t, NULL, rs_pipe_thread, up) || pthread_detach(t) ||
		    pthread_create(&t, NULL, rs_pipe_thread, down) || pthread_detach(t))
			abort();
	}
	return NULL;
}

/* Starts the proxy in front of the server at host:port; dst becomes the proxy's address. */
static int rs_start(const char *host, int port, char *dst, size_t len)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t al = sizeof(a);
	pthread_t t;

	rs.to = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	if (inet_pton(AF_INET, host, &rs.to.sin_addr) != 1)
		return -EINVAL;
	rs.lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (rs.lfd < 0 || bind(rs.lfd, (struct sockaddr *)&a, sizeof(a)) || listen(rs.lfd, 64) ||
	    getsockname(rs.lfd, (struct sockaddr *)&a, &al))
		return -errno;
	if (pthread_create(&t, NULL, rs_accept_thread, NULL) || pthread_detach(t))
		return -EAGAIN;
	snprintf(dst, len, "127.0.0.1:%u", ntohs(a.sin_port));
	return 0;
}

/*
 * --fault-post-fail: the post failed once, and the path failed for it, not
 * for a request answered twice (EPROTO), and came back.
 */
static __attribute__((noinline)) void post_fail_check(unsigned at)
{
#ifdef RTRS_FAULT_INJECTION
	struct rtrs_fault_stats st;
	struct rtrs_path_stats ps = { .size = sizeof(ps) };

	rtrs_fault_get_stats(&st);
	CHECK(st.posts_failed == 1, "posts reported failed after queuing: %llu",
	      (unsigned long long)st.posts_failed);
	CHECK_EQ(rtrs_clt_path_stats(sess, 0, &ps), 0);
	CHECK(ps.reconnects >= 1, "reconnects after the failed post: %llu",
	      (unsigned long long)ps.reconnects);
	CHECK(ps.last_error != -EPROTO, "the path failed with %s", strerror(-ps.last_error));
	printf("post %u failed after queuing: the path failed with %s, reconnected %llu time(s)\n",
	       at, strerror(-ps.last_error), (unsigned long long)ps.reconnects);
	rtrs_fault_set(NULL);
#else
	(void)at;
#endif
}

int main(int argc, char **argv)
{
	char qd[16], store[32], a_port[] = "--port", a_zero[] = "0", a_qd[] = "--queue-depth";
	char a_store[] = "--store-size", a_every[] = "--fault-eagain-every", every[16] = "";
	char *srv_argv[] = { (char *)test_server_path(), a_port, a_zero, a_qd, qd, a_store, store,
			     NULL, NULL, NULL };
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	struct proc srv;
	char dst[64];
	int rc, status;
	bool resegment = false;
	unsigned post_fail = 0;

	if (argc == 3 && !strcmp(argv[1], "--fault-post-fail")) {
		char *end;
		unsigned long n = strtoul(argv[2], &end, 10);

		if (*end || n < 1 || n > 1000000) {
			fprintf(stderr, "test-io: --fault-post-fail %s: expected 1 to 1000000\n",
				argv[2]);
			return 2;
		}
		if (strcmp(test_provider(), "verbs"))
			SKIP("--fault-post-fail: the rdma fabric's posts (provider %s)",
			     test_provider());
#ifdef RTRS_FAULT_INJECTION
		struct rtrs_fault f = { .rdma_post_fail_at = (unsigned)n };

		CHECK_EQ(rtrs_fault_set(&f), 0);
		post_fail = (unsigned)n;
#else
		SKIP("--fault-post-fail: built without -Dfault_injection=true");
#endif
	} else if (argc == 3 && !strcmp(argv[1], a_every)) {
		char *end;
		unsigned long n = strtoul(argv[2], &end, 10);

		if (*end || n < 2 || n > 1000000) {
			fprintf(stderr, "test-io: %s %s: expected 2 to 1000000\n", a_every, argv[2]);
			return 2;
		}
#ifdef RTRS_FAULT_INJECTION
		struct rtrs_fault f = { .eagain_every = (unsigned)n };

		CHECK_EQ(rtrs_fault_set(&f), 0);
		snprintf(every, sizeof(every), "%lu", n);
		srv_argv[7] = a_every; /* the server's writes too */
		srv_argv[8] = every;
#else
		SKIP("%s: built without -Dfault_injection=true", a_every);
#endif
	} else if (argc == 2 && !strcmp(argv[1], "--resegment")) {
		if (strcmp(test_provider(), "tcp") || getenv("RTRS_TEST_SERVER_AT"))
			SKIP("--resegment: a tcp server of its own only (provider %s)", test_provider());
		resegment = true;
	} else if (argc != 1) {
		fprintf(stderr, "usage: test-io [%s N | --fault-post-fail N | --resegment]\n",
			a_every);
		return 2;
	}
	snprintf(qd, sizeof(qd), "%u", 512);
	snprintf(store, sizeof(store), "%u", STORE_SIZE);
	rc = proc_spawn_server(srv_argv, &srv);
	if (rc)
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	if (resegment) {
		rc = rs_start(srv.host, srv.port, dst, sizeof(dst));
		CHECK(rc == 0, "the resegmenting proxy: %s", strerror(-rc));
		if (rc)
			goto out;
	}
	path = (struct rtrs_path_addr){ .src = test_addr(), .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	test_clt_tls(&o);
	o.provider = test_provider();
	o.sessname = "test-io";
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 3;
	rc = rtrs_clt_open(&o, &sess);
	/* A server in another guest may still be starting: give it a minute. */
	for (int i = 0; rc && srv.pid == 0 && i < 60; i++) {
		sleep(1);
		rc = rtrs_clt_open(&o, &sess);
	}
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK_EQ(rtrs_clt_query(sess, &attrs), 0);
	CHECK_EQ(attrs.queue_depth, 512);
	CHECK_EQ(attrs.max_io_size, 128 * 1024 - 4096);
	part_sizes();
	/* Admin permits travel on the admin connection: the same, verified. */
	sync_con_type = RTRS_ADMIN_CON;
	part_sizes();
	sync_con_type = RTRS_IO_CON;
	part_errno();
	part_refusals();
	part_queue_depths();
	if (post_fail)
		post_fail_check(post_fail);
	rtrs_clt_close(sess);
	if (every[0]) {
#ifdef RTRS_FAULT_INJECTION
		struct rtrs_fault_stats st;

		/* The fault bit: the load above went through refused writes. */
		rtrs_fault_get_stats(&st);
		CHECK(st.eagain > 100, "writes refused with -EAGAIN: %llu",
		      (unsigned long long)st.eagain);
		rtrs_fault_set(NULL);
#endif
	}
	if (resegment) /* the stream went through in pieces, many more than frames */
		CHECK(atomic_load(&rs.pieces) > 100000, "pieces passed on: %llu",
		      (unsigned long long)atomic_load(&rs.pieces));
out:
	status = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server exit status %d", status);
	return test_done("test-io");
}
