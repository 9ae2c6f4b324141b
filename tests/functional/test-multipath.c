/* SPDX-License-Identifier: MIT */
/*
 * Two paths to one server (from two addresses of this host, test_addr_n:
 * 127.0.0.1 and 127.0.0.2 on tcp, two addresses of the RDMA netdev in a
 * guest, so two real sets of connections) and the path selection policies:
 *   - round-robin alternates exactly;
 *   - min-inflight sends concurrent requests to the path with fewer in
 *     flight (the server holds each IO for 100 ms), so they split evenly
 *     (but for any that completed before the last was issued);
 *   - data written over one path reads back over the other;
 *   - per-path statistics count every request and byte; reset works; the
 *     policy switches at run time; paths are added and removed at run time;
 *   - min-latency avoids a path made slow by fault injection (rtrs-fault.h:
 *     builds with -Dfault_injection=true; elsewhere that part is skipped
 *     and the test ends with 77);
 *   - a connect that hangs (RTRS_TEST_DEAD_ADDR: an address whose SYNs
 *     vanish, which verbs-suite.sh makes in its guests) stalls no other
 *     connection of its poll group, and closing its session returns at
 *     once: on siw, rdma_connect makes the TCP connection before it returns.
 *     Without the variable (tcp, the host's suite) that part is not run.
 *   - before that, with the same address: connects to the dead host that
 *     outnumber the per-destination bound of iWARP's connect threads
 *     (RDMA_CONNECT_PER_DEST_MAX, 4): no more than 4 hang in rdma_connect
 *     at once, those destroyed while they waited are dropped, and a
 *     session to the live server opens within 5 s while they hang, the
 *     pool being made small (fault injection: rdma_connect_threads 6) so
 *     that without the bound it would be full.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "rtrs.h"
#include "check.h"
#include "harness.h"
#include "test-proto-hdr.h"
#include "threads.h"
#ifdef RTRS_FAULT_INJECTION
#include "rtrs-fault.h"
#endif

#define NIO 16
#define IO_SIZE 4096

static struct rtrs_clt_sess *sess;

struct io {
	struct rtrs_permit *permit;
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	uint8_t buf[IO_SIZE];
	int err;
};

static struct io ios[NIO];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static unsigned outstanding;

static void conf(void *priv, int err)
{
	struct io *io = priv;

	io->err = err;
	pthread_mutex_lock(&lock);
	outstanding--;
	pthread_cond_broadcast(&cond);
	pthread_mutex_unlock(&lock);
}

static void start(struct io *io, enum rtrs_dir dir, uint64_t off)
{
	struct iovec usr = { &io->hdr, sizeof(io->hdr) };
	struct iovec data = { io->buf, IO_SIZE };
	int rc;

	io->hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = off,
				     .len = IO_SIZE };
	io->ops = (struct rtrs_clt_req_ops){ .priv = io, .conf = conf };
	pthread_mutex_lock(&lock);
	outstanding++;
	pthread_mutex_unlock(&lock);
	rc = rtrs_clt_request(sess, dir, &io->ops, io->permit, &usr, 1, &data, 1);
	CHECK(rc == 0, "request: %s", strerror(-rc));
	if (rc) {
		pthread_mutex_lock(&lock);
		outstanding--;
		pthread_mutex_unlock(&lock);
	}
}

static void wait_all(void)
{
	pthread_mutex_lock(&lock);
	while (outstanding)
		pthread_cond_wait(&cond, &lock);
	pthread_mutex_unlock(&lock);
}

static void stats(unsigned idx, struct rtrs_path_stats *st)
{
	st->size = sizeof(*st);
	CHECK_EQ(rtrs_clt_path_stats(sess, idx, st), 0);
}

/*
 * Min-latency: path 0 made slow (fault injection: the connections from its
 * source handle each immediate 20 ms late, heartbeat acks too); once round
 * trips are measured, the policy sends (nearly) everything to path 1. 20 ms
 * is beyond the jitter of a busy machine's round trips (with 3 ms, an ASan
 * build with both CPUs busy once sent 5 of 20 writes to the slow path).
 */
static void part_min_latency(struct rtrs_clt_opts *o)
{
#ifdef RTRS_FAULT_INJECTION
	struct rtrs_fault f = { .delay_src = o->paths[0].src, .delay_us = 20000 };
	struct rtrs_fault_stats st;
	struct rtrs_path_stats s0, s1;
	int rc;

	CHECK_EQ(rtrs_fault_set(&f), 0);
	o->mp_policy = RTRS_MP_POLICY_MIN_LATENCY;
	o->hb_interval_ms = 100;
	/*
	 * The delay is a sleep on the thread running the slow connection's
	 * callbacks. On tcp each connection gets a poll group of its own
	 * (the groups start anew: every earlier session is closed), or the
	 * fast path's heartbeat answers, sent in the same wake-up of the
	 * service loop, would wait behind the slow path's.
	 */
	o->poll_groups = 4;
	rc = rtrs_clt_open(o, &sess);
	rtrs_fault_set(NULL);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		return;
	usleep(400 * 1000); /* a few heartbeats on each path */
	stats(0, &s0);
	stats(1, &s1);
	CHECK(s0.hb_latency_ns > s1.hb_latency_ns && s0.hb_latency_ns >= 15000000,
	      "round trips %llu vs %llu ns", (unsigned long long)s0.hb_latency_ns,
	      (unsigned long long)s1.hb_latency_ns);
	ios[0].permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	for (int i = 0; i < 20; i++) {
		start(&ios[0], RTRS_WRITE, 0);
		wait_all();
		CHECK_EQ(ios[0].err, 0);
	}
	stats(0, &s0);
	stats(1, &s1);
	CHECK(s1.writes >= 18, "min-latency: slow path %llu writes, fast path %llu",
	      (unsigned long long)s0.writes, (unsigned long long)s1.writes);
	rtrs_fault_get_stats(&st);
	CHECK(st.delayed > 0, "immediates delayed: %llu", (unsigned long long)st.delayed);
	rtrs_clt_put_permit(sess, ios[0].permit);
	rtrs_clt_close(sess);
#else
	SKIP_PART("min-latency with a slow path: built without -Dfault_injection=true");
#endif
}

/* Verified IO on one session, one at a time, timing the gaps between completions. */
struct io_loop {
	struct rtrs_clt_sess *sess;
	atomic_bool stop;
	unsigned n, bad;
	uint64_t max_gap_ms;
};

static void *io_loop_thread(void *arg)
{
	struct io_loop *l = arg;
	static uint8_t wbuf[IO_SIZE], rbuf[IO_SIZE];
	uint64_t last = test_now_ms();

	while (!atomic_load(&l->stop)) {
		struct test_hdr h = { .magic = TEST_MAGIC, .op = TEST_OP_IO,
				      .offset = (uint64_t)(l->n % 64) * IO_SIZE, .len = IO_SIZE };
		int rc;

		test_fill(wbuf, IO_SIZE, l->n);
		for (int read = 0; read < 2; read++) {
			rc = test_request(l->sess, read ? RTRS_READ : RTRS_WRITE, &h, sizeof(h),
					  read ? rbuf : wbuf, IO_SIZE);
			uint64_t now = test_now_ms();

			if (now - last > l->max_gap_ms)
				l->max_gap_ms = now - last;
			last = now;
			if (rc)
				break;
		}
		if (rc || memcmp(wbuf, rbuf, IO_SIZE))
			l->bad++;
		l->n++;
	}
	return NULL;
}

/*
 * Connects to a dead host that outnumber its share of the connect threads
 * (part_dead_storm): RDMA_CONNECT_PER_DEST_MAX of rtrs-fabric-rdma.c, and
 * the pool's size for that part (test builds: rtrs_fault.rdma_connect_threads).
 */
#define DEAD_PER_DEST_MAX 4
#define DEAD_POOL_MAX 6
#define DEAD_OPENS 8

struct dead_open {
	struct rtrs_clt_opts o;
	struct rtrs_path_addr pa;
	char name[32];
	uint64_t took;
	int rc;
};

static void *dead_open_thread(void *arg)
{
	struct dead_open *d = arg;
	struct rtrs_clt_sess *s = NULL;
	uint64_t t0 = test_now_ms();

	d->rc = rtrs_clt_open(&d->o, &s);
	d->took = test_now_ms() - t0;
	if (!d->rc)
		rtrs_clt_close(s);
	return NULL;
}

/*
 * Sockets of this host's network namespace in SYN_SENT to addr (IPv4):
 * siw's too. By their local address and port: a table that changes while
 * it is read may show a socket twice.
 */
static unsigned syn_sent_to(const char *addr, char *lines, size_t size)
{
	enum { SEEN_MAX = 64 };
	char want[16], line[256], seen[SEEN_MAX][64];
	struct in_addr in;
	unsigned n = 0;
	FILE *f;

	if (inet_pton(AF_INET, addr, &in) != 1)
		return 0;
	snprintf(want, sizeof(want), "%08X:", (unsigned)in.s_addr); /* as /proc/net/tcp prints it */
	f = fopen("/proc/net/tcp", "r");
	while (f && fgets(line, sizeof(line), f)) {
		char loc[64], rem[64], st[8];
		unsigned i;

		if (sscanf(line, "%*s %63s %63s %7s", loc, rem, st) != 3 || strcmp(st, "02") ||
		    strncmp(rem, want, strlen(want)))
			continue;
		for (i = 0; i < n && strcmp(seen[i], loc); i++)
			;
		if (i == n && n < SEEN_MAX)
			snprintf(seen[n++], sizeof(seen[0]), "%s", loc);
		if (lines && strlen(lines) + strlen(line) + 2 < size) {
			strcat(lines, "# ");
			strcat(lines, line);
		}
	}
	if (f)
		fclose(f);
	return n;
}

struct dead_watch {
	const char *dead;
	atomic_bool stop, live; /* live: a live host's connects may be in rdma_connect too */
	unsigned max_in_connect, max_syn;
	char syn_lines[4096]; /* /proc/net/tcp's lines when max_syn was seen */
};

/* Samples, every 10 ms, connect threads in rdma_connect (write(2) on the CM's channel). */
static void *dead_watch_thread(void *arg)
{
	struct dead_watch *w = arg;

	while (!atomic_load(&w->stop)) {
		unsigned c = threads_in_syscall("rtrs-rdma-conn", SYS_write);
		char lines[sizeof(w->syn_lines)] = "";
		unsigned s = syn_sent_to(w->dead, lines, sizeof(lines));

		if (!atomic_load(&w->live) && c > w->max_in_connect)
			w->max_in_connect = c;
		if (s > w->max_syn) {
			w->max_syn = s;
			memcpy(w->syn_lines, lines, sizeof(lines));
		}
		usleep(10000);
	}
	return NULL;
}

/*
 * Many connects to a dead host at once (DEAD_OPENS sessions opening to it,
 * each giving up at its 2 s connect timeout; on siw each connect hangs in
 * rdma_connect for the kernel's TCP connect timeout, about two minutes):
 * no more than DEAD_PER_DEST_MAX of them may be in rdma_connect at any
 * time, and those past that, destroyed while they waited, are dropped
 * (threads beyond the hung ones took them).
 * Then, while those hang, a session to the live server opens within 5 s:
 * the pool (DEAD_POOL_MAX threads here) had threads left for it. The
 * connect threads for the dead host go on after this part (the next one,
 * part_blocked_connect, expects that; its groups are these: one).
 */
static void part_dead_storm(struct rtrs_clt_opts *o, const char *dst)
{
	const char *dead = getenv("RTRS_TEST_DEAD_ADDR");
	const char *dev = getenv("RTRS_TEST_RDMA_DEV");
	bool iwarp = dev && !strcmp(dev, "siw");
	struct rtrs_path_addr pa = { .src = test_addr_n(1), .dst = dst };
	struct dead_watch w = { .dead = dead };
	static struct dead_open d[DEAD_OPENS];
	pthread_t t[DEAD_OPENS], wt;
	const char *colon = strrchr(dst, ':');
	struct rtrs_clt_sess *live;
	char dead_dst[96];
	uint64_t t0, took;
	int rc;

	if (!dead || !*dead) {
		printf("# dead storm: not run (RTRS_TEST_DEAD_ADDR, an address whose SYNs "
		       "vanish, is made only in verbs-suite.sh's guests)\n");
		return;
	}
	snprintf(dead_dst, sizeof(dead_dst), "%s%s", dead, colon ? colon : ":1234");
#ifdef RTRS_FAULT_INJECTION
	struct rtrs_fault pool = { .rdma_connect_threads = DEAD_POOL_MAX };

	CHECK_EQ(rtrs_fault_set(&pool), 0);
#else
	printf("# dead storm: the connect threads' pool is not made small (built without "
	       "-Dfault_injection=true): a live host's connects would find threads anyway\n");
#endif
	o->poll_groups = 1; /* every session is closed: the groups start anew, one */
	o->mp_policy = RTRS_MP_POLICY_MIN_INFLIGHT;
	o->hb_interval_ms = 1000;
	o->paths_num = 1;
	CHECK_EQ(pthread_create(&wt, NULL, dead_watch_thread, &w), 0);
	for (int i = 0; i < DEAD_OPENS; i++) {
		d[i].o = *o;
		d[i].pa = (struct rtrs_path_addr){ .src = test_addr_n(1), .dst = dead_dst };
		snprintf(d[i].name, sizeof(d[i].name), "test-multipath-dead%d", i);
		d[i].o.sessname = d[i].name;
		d[i].o.paths = &d[i].pa;
		d[i].o.connect_timeout_ms = 2000;
		CHECK_EQ(pthread_create(&t[i], NULL, dead_open_thread, &d[i]), 0);
	}
	for (int i = 0; i < DEAD_OPENS; i++) {
		pthread_join(t[i], NULL);
		CHECK(d[i].rc < 0, "a session to %s opened", dead_dst);
		CHECK(d[i].took < 2000 + 5000, "opening a session to %s took %llu ms "
		      "(connect timeout 2000)", dead_dst, (unsigned long long)d[i].took);
	}
	usleep(500 * 1000); /* those that waited are dropped */
	/*
	 * Those beyond the bound waited (no thread of their own) and were
	 * destroyed at their connect timeout: a thread more than the hung
	 * ones took them, to drop them, not waiting two minutes for a place.
	 */
	unsigned conn_threads = threads_named("rtrs-rdma-conn");

	CHECK(!iwarp || conn_threads > DEAD_PER_DEST_MAX, "%u connect threads: the connects "
	      "destroyed while they waited for %s were not dropped", conn_threads, dead);

	atomic_store(&w.live, true);
	o->paths = &pa;
	o->connect_timeout_ms = 10000;
	o->sessname = "test-multipath-live";
	t0 = test_now_ms();
	rc = rtrs_clt_open(o, &live);
	took = test_now_ms() - t0;
	CHECK(rc == 0, "open a session to %s while connects to %s hang: %s", dst, dead_dst,
	      strerror(-rc));
	CHECK(took < 5000, "opening a session to %s took %llu ms while connects to %s hang", dst,
	      (unsigned long long)took, dead_dst);
	if (!rc)
		rtrs_clt_close(live);
	atomic_store(&w.live, false);
#ifdef RTRS_FAULT_INJECTION
	rtrs_fault_set(NULL);
#endif
	usleep(300 * 1000);
	atomic_store(&w.stop, true);
	pthread_join(wt, NULL);
	printf("# dead storm: %u connect threads at most in rdma_connect, %u SYN_SENT to %s at "
	       "most, %u connect threads once the opens failed, a session to %s opened in "
	       "%llu ms\n", w.max_in_connect, w.max_syn, dead, conn_threads, dst,
	       (unsigned long long)took);
	CHECK(w.max_syn <= DEAD_PER_DEST_MAX, "%u connects to %s at once (at most %u)", w.max_syn,
	      dead, DEAD_PER_DEST_MAX);
	if (w.max_syn > DEAD_PER_DEST_MAX)
		printf("# dead storm: SYN_SENT to %s then:\n%s", dead, w.syn_lines);
	if (!iwarp)
		return; /* no connect threads: IB's CM connects without waiting */
	CHECK(w.max_in_connect <= DEAD_PER_DEST_MAX, "%u connect threads in rdma_connect to %s "
	      "at once (at most %u)", w.max_in_connect, dead, DEAD_PER_DEST_MAX);
	CHECK(w.max_in_connect >= DEAD_PER_DEST_MAX, "only %u connects to %s hung at once (the "
	      "part needs %u)", w.max_in_connect, dead, DEAD_PER_DEST_MAX);
}

struct add_dead {
	struct rtrs_clt_sess *sess;
	struct rtrs_path_addr addr;
	int rc;
};

static void *add_dead_thread(void *arg)
{
	struct add_dead *a = arg;
	unsigned idx;

	a->rc = rtrs_clt_add_path(a->sess, &a->addr, &idx);
	return NULL;
}

/*
 * A path to an address whose SYNs vanish (a host that died with its
 * neighbour entry still cached): its connect hangs until the kernel's TCP
 * connect timeout (siw connects its socket inside rdma_connect). One poll
 * group for the process, so every connection shares it: session a's IO
 * goes on throughout (every request within a second, the server holding
 * each 100 ms), while a's own new path to there fails at its connect
 * timeout, and while session b's new path is stuck connecting; then the
 * process shuts down, and b's add and both closes return at once. Last:
 * the shutdown is for good.
 */
static void part_blocked_connect(struct rtrs_clt_opts *o, const char *dst)
{
	const char *dead = getenv("RTRS_TEST_DEAD_ADDR");
	struct rtrs_path_addr pa = { .src = test_addr_n(1), .dst = dst };
	struct rtrs_path_addr pb = { .src = test_addr_n(2), .dst = dst };
	struct io_loop l = { 0 };
	struct add_dead ad = { 0 };
	struct rtrs_clt_sess *a, *b;
	const char *colon = strrchr(dst, ':');
	char dead_dst[96];
	pthread_t io, add;
	uint64_t t0, took;
	int rc;

	if (!dead || !*dead) {
		printf("# blocked connect: not run (RTRS_TEST_DEAD_ADDR, an address whose SYNs "
		       "vanish, is made only in verbs-suite.sh's guests)\n");
		return;
	}
	snprintf(dead_dst, sizeof(dead_dst), "%s%s", dead, colon ? colon : ":1234");
	o->mp_policy = RTRS_MP_POLICY_MIN_INFLIGHT;
	o->hb_interval_ms = 1000;
	o->poll_groups = 1; /* every session here is closed: the groups start anew, one */
	o->paths = &pa;
	o->paths_num = 1;
	o->connect_timeout_ms = 3000;
	o->sessname = "test-multipath-a";
	rc = rtrs_clt_open(o, &a);
	CHECK(rc == 0, "open a: %s", strerror(-rc));
	if (rc)
		return;
	o->paths = &pb;
	o->connect_timeout_ms = 20000;
	o->sessname = "test-multipath-b";
	rc = rtrs_clt_open(o, &b);
	CHECK(rc == 0, "open b: %s", strerror(-rc));
	if (rc) {
		rtrs_clt_close(a);
		return;
	}
	l.sess = a;
	CHECK_EQ(pthread_create(&io, NULL, io_loop_thread, &l), 0);
	usleep(500 * 1000);

	/* a's own path to there: fails at a's connect timeout; a's IO goes on. */
	struct rtrs_path_addr da = { .src = test_addr_n(1), .dst = dead_dst };
	unsigned idx;

	t0 = test_now_ms();
	rc = rtrs_clt_add_path(a, &da, &idx);
	took = test_now_ms() - t0;
	CHECK(rc < 0, "a path to %s connected", dead_dst);
	CHECK(took < 3000 + 5000, "adding the path to %s took %llu ms (connect timeout 3000)",
	      dead_dst, (unsigned long long)took);

	/*
	 * b's path to there, stuck connecting (20 s connect timeout): a's IO
	 * goes on; then the process shuts down (rtrs_clt_shutdown_all: the
	 * add fails at once) and both sessions close, at once.
	 */
	ad = (struct add_dead){ .sess = b, .addr = { .src = test_addr_n(2), .dst = dead_dst } };
	CHECK_EQ(pthread_create(&add, NULL, add_dead_thread, &ad), 0);
	usleep(2500 * 1000);
	atomic_store(&l.stop, true);
	pthread_join(io, NULL);
	printf("# blocked connect: %u round trips, the longest gap %llu ms\n", l.n,
	       (unsigned long long)l.max_gap_ms);
	CHECK_EQ(l.bad, 0);
	CHECK(l.n >= 10, "%u round trips", l.n);
	CHECK(l.max_gap_ms < 1000, "session a's IO stalled %llu ms while a connect hung",
	      (unsigned long long)l.max_gap_ms);
	t0 = test_now_ms();
	rtrs_clt_shutdown_all();
	pthread_join(add, NULL);
	took = test_now_ms() - t0;
	CHECK(ad.rc < 0, "b's path to %s: %d", dead_dst, ad.rc);
	CHECK(took < 2000, "adding a path connecting to %s went on %llu ms after the shutdown",
	      dead_dst, (unsigned long long)took);
	t0 = test_now_ms();
	rtrs_clt_close(b);
	rtrs_clt_close(a);
	took = test_now_ms() - t0;
	CHECK(took < 2000, "closing the sessions took %llu ms", (unsigned long long)took);
}

int main(void)
{
	char a_port[] = "--port", a_zero[] = "0", a_async[] = "--async", a_delay[] = "--delay-us";
	char delay[] = "100000";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_async, a_delay, delay, NULL };
	struct rtrs_attrs attrs = { .size = sizeof(attrs) };
	struct rtrs_path_addr paths[2];
	struct rtrs_path_stats s0, s1;
	struct rtrs_clt_opts o;
	struct proc srv;
	char dst[96];
	int rc;

	if (proc_spawn_server(argv, &srv))
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	paths[0] = (struct rtrs_path_addr){ .src = test_addr_n(1), .dst = dst };
	paths[1] = (struct rtrs_path_addr){ .src = test_addr_n(2), .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	test_clt_tls(&o);
	o.sessname = "test-multipath";
	o.provider = test_provider();
	o.paths = paths;
	o.paths_num = 2;
	o.nr_io_cons = 1;
	o.mp_policy = RTRS_MP_POLICY_RR;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK_EQ(rtrs_clt_query(sess, &attrs), 0);
	CHECK_EQ(attrs.paths_num, 2);
	CHECK_EQ(attrs.paths_up, 2);
	stats(0, &s0);
	stats(1, &s1);
	CHECK(!strcmp(s0.state, "connected") && !strcmp(s1.state, "connected"));
	CHECK(strcmp(s0.name, s1.name) == 0, "both paths go to %s", dst);
	for (int i = 0; i < NIO; i++)
		ios[i].permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);

	/* Round-robin, one at a time: exactly alternating. */
	for (int i = 0; i < NIO; i++) {
		memset(ios[i].buf, 0x30 + i, IO_SIZE);
		start(&ios[i], RTRS_WRITE, (uint64_t)i * IO_SIZE);
		wait_all();
		CHECK_EQ(ios[i].err, 0);
	}
	stats(0, &s0);
	stats(1, &s1);
	CHECK_EQ(s0.writes, NIO / 2);
	CHECK_EQ(s1.writes, NIO / 2);
	CHECK_EQ(s0.write_bytes + s1.write_bytes, (uint64_t)NIO * IO_SIZE);
	CHECK_EQ(s0.inflight + s1.inflight, 0);

	/* Read back what the other path wrote, all at once (still round-robin). */
	CHECK_EQ(rtrs_clt_reset_path_stats(sess, 0), 0);
	CHECK_EQ(rtrs_clt_reset_path_stats(sess, 1), 0);
	for (int i = 0; i < NIO; i++) {
		memset(ios[i].buf, 0, IO_SIZE);
		start(&ios[i], RTRS_READ, (uint64_t)((i + 1) % NIO) * IO_SIZE);
	}
	wait_all();
	for (int i = 0; i < NIO; i++) {
		uint8_t want = (uint8_t)(0x30 + (i + 1) % NIO);

		CHECK_EQ(ios[i].err, 0);
		CHECK(ios[i].buf[0] == want && ios[i].buf[IO_SIZE - 1] == want,
		      "read %d returned %#x, want %#x", i, ios[i].buf[0], want);
	}
	stats(0, &s0);
	stats(1, &s1);
	CHECK_EQ(s0.reads + s1.reads, NIO);
	CHECK_EQ(s0.writes + s1.writes, 0);
	CHECK_EQ(s0.read_bytes + s1.read_bytes, (uint64_t)NIO * IO_SIZE);

	/*
	 * Min-inflight: requests issued together, each held 100 ms by the
	 * server, go to whichever path has fewer in flight: an even split.
	 */
	CHECK_EQ(rtrs_clt_set_mp_policy(sess, RTRS_MP_POLICY_MIN_INFLIGHT), 0);
	CHECK_EQ(rtrs_clt_set_mp_policy(sess, (enum rtrs_mp_policy)9), -EINVAL);
	rtrs_clt_reset_path_stats(sess, 0);
	rtrs_clt_reset_path_stats(sess, 1);
	for (int i = 0; i < NIO; i++)
		start(&ios[i], RTRS_WRITE, (uint64_t)i * IO_SIZE);
	stats(0, &s0);
	stats(1, &s1);
	/* Enough of them at once for the policy to balance (siw, loaded: 4 of 16 done early). */
	CHECK(s0.inflight + s1.inflight >= NIO / 2, "held in flight: %u + %u", s0.inflight,
	      s1.inflight);
	/*
	 * Each request that completed before the last was issued (a loaded
	 * machine can stall this thread past the server's hold) lets its path
	 * take one more: the split is even but for those.
	 */
	int early = NIO - (int)(s0.inflight + s1.inflight);

	wait_all();
	stats(0, &s0);
	stats(1, &s1);
	CHECK_EQ(s0.writes + s1.writes, NIO);
	CHECK(abs((int)s0.writes - (int)s1.writes) <= early, "split %llu/%llu, %d done early",
	      (unsigned long long)s0.writes, (unsigned long long)s1.writes, early);

	/* Unknown path index. */
	CHECK_EQ(rtrs_clt_path_stats(sess, 2, &s0), -ENOENT);
	CHECK_EQ(rtrs_clt_reset_path_stats(sess, 2), -ENOENT);

	/* Runtime management: add a third path, use it, remove the first. */
	struct rtrs_path_addr third = { .src = test_addr_n(3), .dst = dst };
	struct rtrs_path_stats s2 = { .size = sizeof(s2) };
	unsigned idx = 99;

	CHECK_EQ(rtrs_clt_add_path(sess, &third, &idx), 0);
	CHECK_EQ(idx, 2);
	CHECK_EQ(rtrs_clt_query(sess, &attrs), 0);
	CHECK_EQ(attrs.paths_num, 3);
	CHECK_EQ(attrs.paths_up, 3);
	CHECK_EQ(rtrs_clt_set_mp_policy(sess, RTRS_MP_POLICY_RR), 0);
	for (int k = 0; k < 3; k++)
		rtrs_clt_reset_path_stats(sess, (unsigned)k);
	for (int i = 0; i < 9; i++) {
		start(&ios[i], RTRS_WRITE, (uint64_t)i * IO_SIZE);
		wait_all();
	}
	stats(0, &s0);
	stats(1, &s1);
	stats(2, &s2);
	CHECK(s0.writes == 3 && s1.writes == 3 && s2.writes == 3, "rr over 3: %llu %llu %llu",
	      (unsigned long long)s0.writes, (unsigned long long)s1.writes,
	      (unsigned long long)s2.writes);
	CHECK_EQ(rtrs_clt_remove_path(sess, 0), 0);
	CHECK_EQ(rtrs_clt_remove_path(sess, 0), -ENOENT);
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 0), -ENOENT);
	for (int k = 0; k < 3; k++)
		rtrs_clt_reset_path_stats(sess, (unsigned)k);
	for (int i = 0; i < 4; i++) {
		start(&ios[i], RTRS_WRITE, (uint64_t)i * IO_SIZE);
		wait_all();
		CHECK_EQ(ios[i].err, 0);
	}
	stats(0, &s0);
	stats(1, &s1);
	stats(2, &s2);
	CHECK(!strcmp(s0.state, "closed") && s0.writes == 0, "removed path: %s, %llu writes",
	      s0.state, (unsigned long long)s0.writes);
	CHECK_EQ(s1.writes + s2.writes, 4);
	char bad_dst[96];
	struct rtrs_path_addr bad = { .dst = bad_dst };

	snprintf(bad_dst, sizeof(bad_dst), "%s:1", test_addr());

	CHECK(rtrs_clt_add_path(sess, &bad, &idx) < 0, "a path nobody listens on is refused");
	CHECK_EQ(rtrs_clt_query(sess, &attrs), 0);
	CHECK_EQ(attrs.paths_num, 3);
	struct rtrs_reconnect_params rp = { .size = sizeof(rp) }, rp2 = rp;

	CHECK_EQ(rtrs_clt_get_reconnect(sess, &rp), 0);
	CHECK_EQ(rp.fast_io_fail_ms, o.fast_io_fail_ms); /* what the session opened with */
	CHECK_EQ(rp.max_attempts, o.max_reconnect_attempts);
	rp = (struct rtrs_reconnect_params){ .size = sizeof(rp), .delay_ms = 500, .jitter_ms = 100,
					     .max_attempts = 5, .loss_timeout_ms = 60000,
					     .fast_io_fail_ms = 7000 };
	CHECK_EQ(rtrs_clt_set_reconnect(sess, &rp), 0);
	CHECK_EQ(rtrs_clt_get_reconnect(sess, &rp2), 0);
	/* Field by field: the struct's tail padding is nobody's value. */
	CHECK(rp2.delay_ms == rp.delay_ms && rp2.jitter_ms == rp.jitter_ms &&
	      rp2.max_attempts == rp.max_attempts && rp2.loss_timeout_ms == rp.loss_timeout_ms &&
	      rp2.fast_io_fail_ms == rp.fast_io_fail_ms,
	      "the values set are in force: %u %u %d %u %u", rp2.delay_ms, rp2.jitter_ms,
	      rp2.max_attempts, rp2.loss_timeout_ms, rp2.fast_io_fail_ms);
	rp.max_attempts = -2;
	CHECK_EQ(rtrs_clt_set_reconnect(sess, &rp), -EINVAL);
	rp.max_attempts = 5;
	rp.loss_timeout_ms = 86400001;
	CHECK_EQ(rtrs_clt_set_reconnect(sess, &rp), -EINVAL);
	rp.size = sizeof(rp) - 1;
	CHECK_EQ(rtrs_clt_set_reconnect(sess, &rp), -EINVAL);
	CHECK_EQ(rtrs_clt_get_reconnect(sess, &rp2), 0);
	CHECK_EQ(rp2.loss_timeout_ms, 60000); /* a refused set changes nothing */
	CHECK_EQ(rtrs_clt_get_mp_policy(sess), (int)RTRS_MP_POLICY_RR);

	for (int i = 0; i < NIO; i++)
		rtrs_clt_put_permit(sess, ios[i].permit);
	rtrs_clt_close(sess);

	part_min_latency(&o);
	part_dead_storm(&o, dst);
	part_blocked_connect(&o, dst);
out:
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-multipath");
}
