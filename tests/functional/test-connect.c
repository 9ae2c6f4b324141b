/* SPDX-License-Identifier: MIT */
/*
 * Connection establishment and its failures:
 *   - nothing listening: rtrs_clt_open fails fast with ECONNREFUSED;
 *   - a port that accepts TCP but never answers: fails at the connect
 *     timeout with ETIMEDOUT;
 *   - malformed connect requests, sent through the raw fabric layer, are
 *     rejected with the right errno, and the server logs the reason;
 *   - bad client and server options are refused with EINVAL;
 *   - a server whose port is taken keeps retrying and listens once free;
 *   - an idle listener stays idle past its handshake timeout: the fabric's
 *     own descriptors are no peer's connections to be cut;
 *   - connections made and destroyed from several threads at once start
 *     and stop the fabric's watchdog thread cleanly;
 *   - the server's connection threads carry the session's name once the
 *     session has one, not the "(new)" of before its first path's info;
 *   - a path's fabric is opened on the opener's thread: a slow one (fault
 *     injection) holds no other session's work on the service loops;
 *   - the DH-HMAC-CHAP steps (ffdhe8192) run on offload workers: the
 *     client's service loops keep their timers and, on one poll group, an
 *     open session keeps its IO going meanwhile;
 *   - a path whose device went opens its fabric again on an offload worker:
 *     the service loops keep their timers meanwhile; a disconnect or close
 *     meanwhile returns at once, and the fabric opened late is closed;
 *   - the paths after the first open together: two that are slow to
 *     connect (a proxy) come up in the time of one, two silent ones cost
 *     one connect timeout.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "threads.h"
#include "harness.h"
#include "logcap.h"
#include "loop.h"
#include "offload.h"
#include "rtrs-fabric.h"
#include "rtrs-proto.h"
#include "rtrs.h"
#ifdef RTRS_FAULT_INJECTION
#include "rtrs-fault.h"
#endif

/* ---- a raw fabric client ----------------------------------------------------- */

struct raw {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool connected, down;
	int err;
	uint8_t data[256];
	size_t len;
	uint8_t *msg;       /* last two-sided message (the info response) */
	size_t msg_len;
};

static void raw_connected(void *priv, const void *data, size_t len)
{
	struct raw *r = priv;

	pthread_mutex_lock(&r->lock);
	r->connected = true;
	r->len = len < sizeof(r->data) ? len : sizeof(r->data);
	if (data)
		memcpy(r->data, data, r->len);
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static void raw_down(void *priv, int err, const void *data, size_t len)
{
	struct raw *r = priv;

	pthread_mutex_lock(&r->lock);
	r->down = true;
	r->err = err;
	r->len = len < sizeof(r->data) ? len : sizeof(r->data);
	if (data)
		memcpy(r->data, data, r->len);
	pthread_cond_broadcast(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static void raw_imm(void *priv, uint32_t imm) {}

static void raw_recv(void *priv, void *buf, size_t len)
{
	struct raw *r = priv;

	pthread_mutex_lock(&r->lock);
	free(r->msg);
	r->msg = malloc(len);
	memcpy(r->msg, buf, len);
	r->msg_len = len;
	pthread_mutex_unlock(&r->lock);
}
static void raw_done(void *priv, void *ctx) {}
static void raw_kick(void *priv) {}

static const struct fab_con_ops raw_ops = {
	raw_connected, raw_down, raw_imm, raw_recv, raw_done, raw_kick,
};

/*
 * Sends data as a connect request; returns 1 if accepted, or the errno the
 * server put in its reject.
 */
static int raw_connect_rsp(int port, const void *data, size_t len, struct rtrs_conn_rsp *out);

/* The fabric's CM pads connection requests to a fixed size (IB and RoCE: 56 bytes). */
static bool cm_pads_requests(void)
{
	struct fab *f = NULL;
	bool pads;

	if (fab_open(test_provider(), NULL, test_addr(), "9", false, 0, &f))
		return false;
	pads = fab_attr(f)->connect_data_max == 56;
	fab_close(f);
	return pads;
}

static int raw_connect(int port, const void *data, size_t len)
{
	return raw_connect_rsp(port, data, len, NULL);
}

/* The same, also giving the decoded reject (err 0 when accepted). */
static int raw_connect_rsp(int port, const void *data, size_t len, struct rtrs_conn_rsp *out)
{
	struct raw r = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &r, .name = "raw", .tx_depth = 16 };
	struct rtrs_conn_rsp rsp = { 0 };
	struct fab_con *c = NULL;
	struct fab *f = NULL;
	char service[8];
	const char *why;
	uint64_t end = test_now_ms() + 5000;
	int rc;

	snprintf(service, sizeof(service), "%d", port);
	rc = fab_open(test_provider(), NULL, test_addr(), service, false, 0, &f);
	if (rc)
		return rc;
	rc = fab_con_connect(f, &cfg, data, len, &c);
	if (rc)
		goto out;
	pthread_mutex_lock(&r.lock);
	while (!r.connected && !r.down && test_now_ms() < end) {
		pthread_mutex_unlock(&r.lock);
		usleep(1000);
		pthread_mutex_lock(&r.lock);
	}
	if (r.connected && rtrs_conn_rsp_decode(r.data, r.len, &rsp, &why) == 0 && rsp.err)
		rc = rsp.err; /* a final refusal comes as an accept carrying the errno */
	else if (r.connected)
		rc = 1;
	else if (!r.down)
		rc = -ETIMEDOUT;
	else if (r.err == -ECONNREFUSED && rtrs_conn_rsp_decode(r.data, r.len, &rsp, &why) == 0)
		rc = rsp.err;
	else
		rc = r.err;
	if (out && rc < 0 && (r.err == -ECONNREFUSED || r.connected))
		*out = rsp;
	pthread_mutex_unlock(&r.lock);
out:
	fab_con_destroy(c);
	fab_close(f);
	return rc;
}

/* Options of a test server on the test address, any port. */
static void srv_opts(struct rtrs_srv_opts *so, uint32_t queue_depth)
{
	rtrs_srv_opts_init(so, sizeof(*so));
	so->addr = test_addr();
	so->provider = test_provider();
	so->port = 0;
	so->queue_depth = queue_depth;
}

/* Starts it and waits until it listens; its port in *port. */
static struct rtrs_srv_ctx *srv_start(const struct rtrs_srv_ops *ops,
				      const struct rtrs_srv_opts *so, int *port)
{
	struct rtrs_srv_ctx *srv = NULL;

	CHECK_EQ(rtrs_srv_open(ops, so, &srv), 0);
	CHECK_EQ(rtrs_srv_wait_listening(srv, 5000), 0);
	*port = rtrs_srv_get_port(srv);
	return srv;
}

static void good_req(struct rtrs_msg_conn_req *m, bool first)
{
	struct rtrs_conn_req r = { .cid = 0, .cid_num = 2, .first_conn = first, .ext = true };

	for (int i = 0; i < RTRS_UUID_LEN; i++) {
		r.sess_uuid[i] = (uint8_t)(rand() & 0xff);
		r.paths_uuid[i] = (uint8_t)(rand() & 0xff);
	}
	rtrs_conn_req_encode(m, &r);
}

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir, void *data,
		       size_t datalen, const void *usr, size_t usrlen)
{
	return -EIO;
}

/*
 * A server (queue depth 16) on a port of its own, and client options for
 * one path to it (dst holds its address) with one IO connection.
 */
static struct rtrs_srv_ctx *srv_and_clt(const struct rtrs_srv_ops *ops, struct rtrs_srv_opts *so,
					struct rtrs_clt_opts *o, struct rtrs_path_addr *path,
					char *dst, size_t dst_len, int *port)
{
	struct rtrs_srv_ctx *srv;

	srv_opts(so, 16);
	srv = srv_start(ops, so, port);
	snprintf(dst, dst_len, "%s:%d", test_addr(), *port);
	*path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(o, sizeof(*o));
	o->provider = test_provider();
	o->paths = path;
	o->paths_num = 1;
	o->nr_io_cons = 1;
	return srv;
}

/*
 * No thread per connection, on either fabric: the process's poll groups,
 * one per CPU, run every connection of the client and of the server, and
 * no thread carries a session's or a peer's name.
 */
static void test_thread_names(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL };
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o;
	struct rtrs_srv_ctx *srv;
	struct rtrs_clt_sess *s = NULL;
	char dst[96];
	int port, rc;

	srv = srv_and_clt(&ops, &so, &o, &path, dst, sizeof(dst), &port);
	o.sessname = "thr-names";
	rc = rtrs_clt_open(&o, &s);
	CHECK(rc == 0, "session up: %s", strerror(-rc));
	if (!rc) {
		const char *prov = test_provider();

		bool tcp = !prov || !strcmp(prov, "tcp");
		unsigned groups = tcp ? fab_tcp_groups_running() : fab_rdma_groups_running();

		CHECK_EQ(threads_named("thr-names"), 0);
		CHECK_EQ(threads_named(tcp ? "rtrs-tcp-" : "rtrs-rdma-g"), groups);
		CHECK(groups == (unsigned)sysconf(_SC_NPROCESSORS_ONLN), "%u poll groups", groups);
		CHECK_EQ(threads_named("(new)"), 0);
	}
	/*
	 * Client sessions share the process's service loops: eight sessions
	 * more, and still no more than LOOP_SHARED_MAX loop threads; none
	 * once every session is closed.
	 */
	struct rtrs_clt_sess *more[8] = { NULL };
	char names[8][16];

	for (unsigned i = 0; i < 8; i++) {
		snprintf(names[i], sizeof(names[i]), "thr-more-%u", i);
		o.sessname = names[i];
		rc = rtrs_clt_open(&o, &more[i]);
		CHECK(rc == 0, "session %u up: %s", i, strerror(-rc));
	}
	CHECK(threads_named("rtrs-clt-") >= 1 && threads_named("rtrs-clt-") <= LOOP_SHARED_MAX,
	      "%u service loop threads for 9 sessions", threads_named("rtrs-clt-"));
	for (unsigned i = 0; i < 8; i++)
		rtrs_clt_close(more[i]);
	rtrs_clt_close(s);
	/*
	 * Joined, but a thread just joined may still be listed for a moment
	 * (the kernel clears the tid pthread_join waits on before the task
	 * leaves /proc; wide in a TCG guest).
	 */
	CHECK_EQ(threads_left("rtrs-clt-"), 0);
	rtrs_srv_close(srv);
}

/*
 * Threads but iWARP's connect threads (a pool as large as the connects
 * that ran at once: rtrs-fabric-rdma.c, con_connect_run) and the poll
 * groups (a fixed number; a thread just made carries its maker's name
 * until it names itself).
 */
static unsigned threads_but_connects(unsigned *connects)
{
	static const char *const p[] = { "rtrs-rdma-conn", "rtrs-rdma-g", NULL };
	unsigned c[2], n = threads_scan(p, c);

	*connects = c[0];
	return n - c[0] - c[1];
}

/*
 * Reconnects are state machines on the service loops, not threads: 16
 * sessions lose their server and try again every 100 to 150 ms (refused,
 * nothing listens) for 1.5 s, and the process never has a thread more
 * than before (an attempt on a thread of its own, as before, is caught by
 * one of the 150 samples), but for iWARP's connect threads, which are
 * fewer than the sessions; then the server comes back on the same port
 * and every session is up again.
 */
static void test_reconnect_threads(void)
{
	enum { N = 16 };
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL };
	struct rtrs_clt_sess *s[N] = { NULL };
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o;
	struct rtrs_srv_ctx *srv;
	char dst[96], names[N][16];
	unsigned base, most = 0, most_conn = 0, conn, up = 0;
	uint64_t failures = 0;
	int port, rc;

	srv = srv_and_clt(&ops, &so, &o, &path, dst, sizeof(dst), &port);
	o.reconnect_delay_ms = 100;
	o.reconnect_jitter_ms = 50;
	o.max_reconnect_attempts = -1;
	for (unsigned i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "recon-thr-%u", i);
		o.sessname = names[i];
		rc = rtrs_clt_open(&o, &s[i]);
		CHECK(rc == 0, "session %u up: %s", i, strerror(-rc));
	}
	base = threads_but_connects(&conn);
	rtrs_srv_close(srv);
	for (int i = 0; i < 150; i++) {
		most = MAX(most, threads_but_connects(&conn));
		most_conn = MAX(most_conn, conn);
		usleep(10 * 1000);
	}
	for (unsigned i = 0; i < N; i++) {
		struct rtrs_path_stats st = { .size = sizeof(st) };

		if (s[i] && rtrs_clt_path_stats(s[i], 0, &st) == 0)
			failures += st.reconnect_failures;
	}
	CHECK(failures >= N, "%" PRIu64 " failed reconnect attempts in 1.5 s", failures);
	CHECK(most <= base, "%u threads while %u sessions reconnect, %u before", most, N, base);
	CHECK(most_conn < N, "%u connect threads while %u sessions reconnect", most_conn, N);
	so.port = (uint16_t)port;
	srv = srv_start(&ops, &so, &port);
	for (int i = 0; i < 1000 && up < N; i++) {
		up = 0;
		for (unsigned j = 0; j < N; j++) {
			struct rtrs_attrs a = { .size = sizeof(a) };

			up += s[j] && rtrs_clt_query(s[j], &a) == 0;
		}
		if (up < N)
			usleep(10 * 1000);
	}
	CHECK(up == N, "%u of %u sessions up again once the server is back", up, N);
	for (unsigned i = 0; i < N; i++)
		rtrs_clt_close(s[i]);
	rtrs_srv_close(srv);
}

#ifdef RTRS_FAULT_INJECTION
struct slow_open {
	const struct rtrs_clt_opts *o;
	struct rtrs_clt_sess *s;
	int rc;
	uint64_t ms;
};

static void *slow_open_thread(void *arg)
{
	struct slow_open *so = arg;
	uint64_t t0 = test_now_ms();

	so->rc = rtrs_clt_open(so->o, &so->s);
	so->ms = test_now_ms() - t0;
	return NULL;
}
#endif

/*
 * An open whose fabric takes 3 s to open (a name or an RDMA address slow
 * to resolve: fault injection) while two sessions sit on the process's
 * two service loops: closing either, which runs on its loop, takes no
 * longer than usual. With the fabric opened on the loop, the one that
 * shares the slow session's loop would wait out the 3 s.
 */
static void test_slow_fabric_open(void)
{
#ifdef RTRS_FAULT_INJECTION
	enum { DELAY_MS = 3000, CLOSE_MAX_MS = 1500 };
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL };
	struct rtrs_clt_sess *c[2] = { NULL, NULL };
	struct rtrs_fault f = { .open_delay_ms = DELAY_MS };
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o, ob;
	struct rtrs_srv_ctx *srv;
	struct slow_open sl = { .o = &ob };
	char dst[96];
	pthread_t t;
	int port;

	srv = srv_and_clt(&ops, &so, &o, &path, dst, sizeof(dst), &port);
	o.sessname = "loop-a";
	CHECK_EQ(rtrs_clt_open(&o, &c[0]), 0);
	o.sessname = "loop-b";
	CHECK_EQ(rtrs_clt_open(&o, &c[1]), 0);
	ob = o;
	ob.sessname = "slow-open";
	CHECK_EQ(rtrs_fault_set(&f), 0);
	CHECK_EQ(pthread_create(&t, NULL, slow_open_thread, &sl), 0);
	usleep(300 * 1000); /* in its fabric's open by now */
	CHECK_EQ(rtrs_fault_set(NULL), 0);
	for (unsigned i = 0; i < 2; i++) {
		uint64_t t0 = test_now_ms(), ms;

		rtrs_clt_close(c[i]);
		ms = test_now_ms() - t0;
		CHECK(ms < CLOSE_MAX_MS, "closing session %u took %llu ms while another opened "
		      "its fabric", i, (unsigned long long)ms);
	}
	pthread_join(t, NULL);
	CHECK(sl.rc == 0, "the slow open: %s", strerror(-sl.rc));
	CHECK(sl.ms >= DELAY_MS, "the slow open took %llu ms: the fault did not hold it",
	      (unsigned long long)sl.ms);
	if (!sl.rc)
		rtrs_clt_close(sl.s);
	rtrs_srv_close(srv);
#endif
}

/*
 * The DH-HMAC-CHAP steps run on offload workers, not on a client's service
 * loop nor on a server's poll group: with one poll group for the whole
 * process, while a second session authenticates with ffdhe8192 (about 150
 * ms of CPU for each side's step on this machine's kind), a timer on each
 * shared client loop keeps firing every 5 ms, and the first session's
 * requests keep completing (each within 100 ms; on the group, one would
 * wait for the server's step), and a worker did the steps.
 */
struct loop_probe {
	struct loop_timer t;
	_Atomic uint64_t last, max_gap;
};

static void probe_tick(struct loop_timer *t)
{
	struct loop_probe *pr = container_of(t, struct loop_probe, t);
	uint64_t now = test_now_ms(), last = atomic_load(&pr->last);

	if (last && now - last > atomic_load(&pr->max_gap))
		atomic_store(&pr->max_gap, now - last);
	atomic_store(&pr->last, now);
}

static void probe_stop(void *arg)
{
	loop_timer_fini(arg);
}

/* A 5 ms timer on each of the shared client loops (the sessions take one of them). */
static void probes_start(struct loop_probe *pr, struct loop **loops)
{
	for (unsigned i = 0; i < LOOP_SHARED_MAX; i++) {
		CHECK_EQ(loop_shared_get("rtrs-clt", &loops[i]), 0);
		atomic_init(&pr[i].last, 0);
		atomic_init(&pr[i].max_gap, 0);
		CHECK_EQ(loop_timer_init(loops[i], &pr[i].t, probe_tick), 0);
		loop_timer_arm(&pr[i].t, 5, 5);
	}
}

/* The timers stopped: the longest a loop went without firing one, ms. */
static uint64_t probes_stop(struct loop_probe *pr, struct loop **loops)
{
	uint64_t gap = 0;

	for (unsigned i = 0; i < LOOP_SHARED_MAX; i++) {
		loop_call(loops[i], probe_stop, &pr[i].t);
		gap = MAX(gap, atomic_load(&pr[i].max_gap));
		loop_shared_put(loops[i]);
	}
	return gap;
}

/* Requests one after another on a session, each answered (with -EIO) by the server. */
struct io_probe {
	struct rtrs_clt_sess *s;
	atomic_bool stop;
	_Atomic uint64_t max_ms, done;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool answered;
};

static void io_probe_conf(void *priv, int err)
{
	struct io_probe *io = priv;

	(void)err;
	pthread_mutex_lock(&io->lock);
	io->answered = true;
	pthread_cond_signal(&io->cond);
	pthread_mutex_unlock(&io->lock);
}

static void *io_probe_run(void *arg)
{
	struct io_probe *io = arg;
	static char hdr[16], buf[4096];
	struct rtrs_clt_req_ops ops = { .priv = io, .conf = io_probe_conf };
	struct iovec usr = { hdr, sizeof(hdr) }, data = { buf, sizeof(buf) };

	while (!atomic_load(&io->stop)) {
		struct rtrs_permit *pm = rtrs_clt_get_permit(io->s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		uint64_t t0 = test_now_ms();

		if (!pm)
			break;
		io->answered = false;
		if (rtrs_clt_request(io->s, RTRS_READ, &ops, pm, &usr, 1, &data, 1) == 0) {
			pthread_mutex_lock(&io->lock);
			while (!io->answered)
				pthread_cond_wait(&io->cond, &io->lock);
			pthread_mutex_unlock(&io->lock);
		}
		rtrs_clt_put_permit(io->s, pm);
		if (test_now_ms() - t0 > atomic_load(&io->max_ms))
			atomic_store(&io->max_ms, test_now_ms() - t0);
		atomic_fetch_add(&io->done, 1);
		usleep(2000);
	}
	return NULL;
}

static void test_dh_off_loop(void)
{
	static const char key[] = "DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:";
	static const char host[] = "nqn.2014-08.org.nvmexpress:uuid:test-dh-off-loop";
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL };
	struct loop_probe pr[LOOP_SHARED_MAX];
	struct loop *loops[LOOP_SHARED_MAX];
	struct io_probe io = { .lock = PTHREAD_MUTEX_INITIALIZER,
			       .cond = PTHREAD_COND_INITIALIZER };
	struct rtrs_clt_sess *a = NULL, *b = NULL;
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o;
	struct rtrs_srv_ctx *srv;
	char keys[] = "/tmp/test-dh-keys.XXXXXX", dst[96];
	uint64_t gap = 0, open_ms, bound;
	unsigned workers = 0;
	pthread_t t;
	int port, fd, rc;

	fd = mkstemp(keys);
	CHECK(fd >= 0, "key file");
	if (fd < 0)
		return;
	dprintf(fd, "%s %s\n", host, key);
	close(fd);
	/* One poll group: the first session's IO shares it with the second's handshake. */
	fab_tcp_groups(1);
	fab_rdma_groups(1);
	srv_opts(&so, 16);
	so.auth_keys_file = keys;
	so.auth_dhgroups = "ffdhe8192";
	srv = srv_start(&ops, &so, &port);
	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	path.dst = dst;
	rtrs_clt_opts_init(&o, sizeof(o));
	o.provider = test_provider();
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 1;
	o.auth_host_name = host;
	o.auth_secret = key;
	o.auth_dhgroups = "ffdhe8192";
	o.sessname = "dh-first";
	rc = rtrs_clt_open(&o, &a);
	CHECK(rc == 0, "an ffdhe8192 session opens: %s", strerror(-rc));
	if (rc)
		goto out;
	io.s = a;
	CHECK_EQ(pthread_create(&t, NULL, io_probe_run, &io), 0);
	probes_start(pr, loops);
	usleep(50 * 1000);
	o.sessname = "dh-second";
	open_ms = test_now_ms();
	rc = rtrs_clt_open(&o, &b);
	open_ms = test_now_ms() - open_ms;
	workers = offload_workers();
	CHECK(rc == 0, "a second ffdhe8192 session opens: %s", strerror(-rc));
	gap = probes_stop(pr, loops);
	atomic_store(&io.stop, true);
	pthread_join(t, NULL);
	/*
	 * The bound: 100 ms, or a quarter of the open's time where the steps
	 * are slow (an emulated guest on a loaded machine, where a scheduler
	 * alone stalls a thread that long): a step on the loop would stall it
	 * about half the open.
	 */
	bound = MAX(100, open_ms / 4);
	fprintf(stderr, "ffdhe8192 open in %llu ms: the client loops' longest stall %llu ms "
		"(bound %llu); the open session's slowest request of %llu %llu ms; %u offload "
		"workers\n", (unsigned long long)open_ms, (unsigned long long)gap,
		(unsigned long long)bound, (unsigned long long)atomic_load(&io.done),
		(unsigned long long)atomic_load(&io.max_ms), workers);
	CHECK(workers >= 1, "an offload worker computed the steps");
	CHECK(gap < bound, "a client loop stalled %llu ms during the DH steps (open %llu ms)",
	      (unsigned long long)gap, (unsigned long long)open_ms);
	CHECK(atomic_load(&io.done) >= 10 && atomic_load(&io.max_ms) < bound,
	      "the open session's slowest of %llu requests took %llu ms during the DH steps",
	      (unsigned long long)atomic_load(&io.done), (unsigned long long)atomic_load(&io.max_ms));
	if (!rc)
		rtrs_clt_close(b);
	rtrs_clt_close(a);
out:
	rtrs_srv_close(srv);
	fab_tcp_groups(0);
	fab_rdma_groups(0);
	unlink(keys);
}

/*
 * A path whose device went (fault injection: its connections report
 * -ENODEV) opens its fabric again on an offload worker: with the fabric
 * taking 1.5 s to open, the server gone and back, the path reconnects and
 * the client's service loops keep their 5 ms timers meanwhile (on the loop
 * the open would stall them 1.5 s). dead: the old fabric is dead from the
 * connection's -ENODEV on (its registrations fail with -EIO, as an RDMA
 * device's do once it is removed): the path's first attempt must not
 * reuse it (it did, failed with -EIO and kept it, for ever).
 */
static void test_device_gone_reopen(bool dead)
{
	(void)dead;
#ifdef RTRS_FAULT_INJECTION
	enum { OPEN_MS = 1500 };
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL };
	struct rtrs_fault f = { .down_nodev = true, .nodev_dead = dead, .open_delay_ms = OPEN_MS };
	struct rtrs_fault_stats fst;
	struct loop_probe pr[LOOP_SHARED_MAX];
	struct loop *loops[LOOP_SHARED_MAX];
	struct rtrs_clt_sess *s = NULL;
	struct rtrs_path_stats st = { .size = sizeof(st) };
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o;
	struct rtrs_srv_ctx *srv;
	char dst[96];
	uint64_t gap = 0, t0, took = 0;
	int port, rc;

	srv = srv_and_clt(&ops, &so, &o, &path, dst, sizeof(dst), &port);
	o.sessname = "device-gone";
	o.reconnect_delay_ms = 100;
	o.reconnect_jitter_ms = 0;
	o.max_reconnect_attempts = -1;
	CHECK_EQ(rtrs_fault_set(&f), 0);
	rc = rtrs_clt_open(&o, &s);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out;
	probes_start(pr, loops);
	/* Gone: the path fails, a reconnect is refused with -ENODEV, the fabric closes. */
	t0 = test_now_ms();
	rtrs_srv_close(srv);
	usleep(400 * 1000);
	so.port = (uint16_t)port;
	srv = srv_start(&ops, &so, &port);
	for (int i = 0; i < 1000; i++) {
		struct rtrs_attrs a = { .size = sizeof(a) };

		if (rtrs_clt_query(s, &a) == 0) {
			took = test_now_ms() - t0;
			break;
		}
		usleep(10 * 1000);
	}
	gap = probes_stop(pr, loops);
	rtrs_fault_get_stats(&fst);
	CHECK_EQ(rtrs_clt_path_stats(s, 0, &st), 0);
	fprintf(stderr, "device gone%s: path back after %llu ms, %llu reconnect failures, %llu "
		"-ENODEV downs, the client loops' longest stall %llu ms\n",
		dead ? " (its fabric dead)" : "", (unsigned long long)took, (unsigned long long)st.reconnect_failures,
		(unsigned long long)fst.nodev, (unsigned long long)gap);
	CHECK(took > 0, "the path came back");
	CHECK(took >= OPEN_MS, "the path came back after %llu ms: its fabric was not opened again",
	      (unsigned long long)took);
	CHECK(fst.nodev >= 1, "a connection went down with -ENODEV");
	CHECK(log_has("opening a fabric to"), "the fabric was opened again");
	CHECK(gap < 500, "a client loop stalled %llu ms while the fabric opened again",
	      (unsigned long long)gap);
	rtrs_clt_close(s);
out:
	CHECK_EQ(rtrs_fault_set(NULL), 0);
	rtrs_srv_close(srv);
#endif
}

#ifdef RTRS_FAULT_INJECTION
/* The session's path is up (or not) within ms. */
static bool wait_up(struct rtrs_clt_sess *s, unsigned ms)
{
	for (uint64_t t0 = test_now_ms(); test_now_ms() - t0 < ms; usleep(10 * 1000)) {
		struct rtrs_attrs a = { .size = sizeof(a) };

		if (rtrs_clt_query(s, &a) == 0)
			return true;
	}
	return false;
}

/* A log line with s after mark within ms. */
static bool wait_log_since(size_t mark, const char *s, unsigned ms)
{
	for (uint64_t t0 = test_now_ms(); test_now_ms() - t0 < ms; usleep(5 * 1000))
		if (log_has_since(mark, s))
			return true;
	return log_has_since(mark, s);
}
#endif

/*
 * A path whose fabric is being opened again (its device went; fault
 * injection: the open takes 3 s) is ended by force: a disconnect and a
 * session close return at once, not when the open does, while two other
 * sessions (one on each shared service loop) keep their requests going and
 * the loops their 5 ms timers. The path reconnected by hand meanwhile
 * waits for the open under way instead of starting a second one, and the
 * fabric opened for the closed session is closed when its open ends.
 * With the open waited for on the loop (offload_cancel), each took the
 * rest of the 3 s and stalled every session on that loop.
 */
#ifdef RTRS_FAULT_INJECTION
/* Jobs that hold the offload workers until let go. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned started;
	bool go;
} blockers = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false };

static void blocker_fn(struct offload_job *j)
{
	pthread_mutex_lock(&blockers.lock);
	blockers.started++;
	pthread_cond_broadcast(&blockers.cond);
	while (!blockers.go)
		pthread_cond_wait(&blockers.cond, &blockers.lock);
	pthread_mutex_unlock(&blockers.lock);
}

static void blocker_notify(struct offload_job *j) {}

/*
 * 3. The session closed while its fabric's open is still queued (every
 * worker busy): the job is taken off the queue and never runs; no fabric
 * is opened for nobody once the workers are free.
 */
static void open_abandoned_queued(struct rtrs_srv_ops *ops, struct rtrs_srv_opts *sob,
				  struct rtrs_clt_opts *ob, int bport, struct rtrs_fault nodev,
				  struct rtrs_fault slow)
{
	struct offload_job bl[OFFLOAD_WORKERS_MAX];
	struct rtrs_fault_stats f0, f1;
	struct rtrs_srv_ctx *srvb;
	struct rtrs_clt_sess *b = NULL;
	unsigned queued = 0, started;
	uint64_t t0;
	size_t mark;
	int rc;

	sob->port = (uint16_t)bport;
	srvb = srv_start(ops, sob, &bport);
	CHECK_EQ(rtrs_fault_set(&nodev), 0);
	rc = rtrs_clt_open(ob, &b);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	CHECK_EQ(rtrs_fault_set(&slow), 0);
	if (rc) {
		rtrs_srv_close(srvb);
		return;
	}
	/* Every worker there can be, busy; the blockers beyond them wait in the queue. */
	blockers.started = 0;
	blockers.go = false;
	for (unsigned i = 0; i < OFFLOAD_WORKERS_MAX; i++) {
		offload_job_init(&bl[i], blocker_fn, blocker_notify);
		CHECK_EQ(offload_submit(&bl[i]), 0);
	}
	t0 = test_now_ms();
	pthread_mutex_lock(&blockers.lock);
	for (;;) {
		started = blockers.started;
		if (started && started == offload_workers() &&
		    started + offload_queued() == OFFLOAD_WORKERS_MAX)
			break;
		pthread_mutex_unlock(&blockers.lock);
		usleep(5 * 1000);
		pthread_mutex_lock(&blockers.lock);
		if (test_now_ms() - t0 > 5000)
			break;
	}
	pthread_mutex_unlock(&blockers.lock);
	CHECK(started && started + offload_queued() == OFFLOAD_WORKERS_MAX,
	      "%u blockers running on %u workers, %u queued", started, offload_workers(),
	      offload_queued());
	rtrs_fault_get_stats(&f0);
	mark = log_mark();
	rtrs_srv_close(srvb);
	/* The path's next attempt queues its open behind the blockers. */
	t0 = test_now_ms();
	while ((queued = offload_queued()) < OFFLOAD_WORKERS_MAX - started + 1 &&
	       test_now_ms() - t0 < 5000)
		usleep(5 * 1000);
	CHECK(queued == OFFLOAD_WORKERS_MAX - started + 1,
	      "the path's open never queued (%u jobs queued)", queued);
	rtrs_clt_close(b);
	CHECK(offload_queued() == OFFLOAD_WORKERS_MAX - started,
	      "the closed session's open is still queued");
	pthread_mutex_lock(&blockers.lock);
	blockers.go = true;
	pthread_cond_broadcast(&blockers.cond);
	pthread_mutex_unlock(&blockers.lock);
	t0 = test_now_ms();
	while (!offload_idle() && test_now_ms() - t0 < 5000)
		usleep(5 * 1000);
	CHECK(offload_idle(), "the offload workers never went idle");
	/* Without the dequeue the job runs now: a fabric opened open_delay_ms late, for nobody. */
	t0 = test_now_ms();
	do {
		usleep(20 * 1000);
		rtrs_fault_get_stats(&f1);
	} while (f1.late_closes - f0.late_closes < f1.late_opens - f0.late_opens &&
		 test_now_ms() - t0 < slow.open_delay_ms + 2000);
	CHECK(f1.late_opens == f0.late_opens && !log_has_since(mark, "opening a fabric to"),
	      "a queued open ran after its session closed (%llu fabrics opened late)",
	      (unsigned long long)(f1.late_opens - f0.late_opens));
	CHECK(f1.late_closes - f0.late_closes == f1.late_opens - f0.late_opens,
	      "a fabric opened late was left open");
	for (unsigned i = 0; i < OFFLOAD_WORKERS_MAX; i++)
		(void)offload_take(&bl[i]);
}
#endif

static void test_open_abandoned(void)
{
#ifdef RTRS_FAULT_INJECTION
	/* The bounds are far below the open's 3 s, which a wait for it would cost. */
	enum { OPEN_MS = 3000, END_MAX_MS = 500, STALL_MAX_MS = 1000 };
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = NULL }, bpath = { .dst = NULL };
	struct rtrs_fault nodev = { .down_nodev = true };
	struct rtrs_fault slow = { .down_nodev = true, .open_delay_ms = OPEN_MS };
	struct rtrs_fault_stats f0, f1;
	struct loop_probe pr[LOOP_SHARED_MAX];
	struct loop *loops[LOOP_SHARED_MAX];
	struct io_probe io[2] = {
		{ .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER },
		{ .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER },
	};
	struct rtrs_clt_sess *a[2] = { NULL, NULL }, *b = NULL;
	struct rtrs_srv_opts so, sob;
	struct rtrs_clt_opts o, ob;
	struct rtrs_srv_ctx *srv, *srvb;
	char dst[96], bdst[96];
	pthread_t t[2];
	uint64_t t0, gap, disc_ms = 0, close_ms = 0;
	size_t mark;
	int port, bport, rc;

	rtrs_fault_get_stats(&f0);
	srv = srv_and_clt(&ops, &so, &o, &path, dst, sizeof(dst), &port);
	o.sessname = "bystander-0";
	CHECK_EQ(rtrs_clt_open(&o, &a[0]), 0);
	o.sessname = "bystander-1";
	CHECK_EQ(rtrs_clt_open(&o, &a[1]), 0);
	if (!a[0] || !a[1])
		goto out_a;
	/* The path to end: its own server, whose close downs it as a removed device. */
	srvb = srv_and_clt(&ops, &sob, &ob, &bpath, bdst, sizeof(bdst), &bport);
	ob.sessname = "open-abandoned";
	ob.reconnect_delay_ms = 100;
	ob.reconnect_jitter_ms = 0;
	ob.max_reconnect_attempts = -1;
	CHECK_EQ(rtrs_fault_set(&nodev), 0);
	rc = rtrs_clt_open(&ob, &b);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	CHECK_EQ(rtrs_fault_set(&slow), 0);
	if (rc)
		goto out_b;
	probes_start(pr, loops);
	for (unsigned i = 0; i < 2; i++) {
		io[i].s = a[i];
		CHECK_EQ(pthread_create(&t[i], NULL, io_probe_run, &io[i]), 0);
	}

	/* 1. Disconnected while its fabric opens again, then reconnected by hand. */
	mark = log_mark();
	rtrs_srv_close(srvb);
	CHECK(wait_log_since(mark, "opening a fabric to", 3000), "the path opens its fabric again");
	t0 = test_now_ms();
	CHECK_EQ(rtrs_clt_disconnect_path(b, 0), 0);
	disc_ms = test_now_ms() - t0;
	CHECK(disc_ms < END_MAX_MS, "a disconnect took %llu ms while the path's fabric opened",
	      (unsigned long long)disc_ms);
	sob.port = (uint16_t)bport;
	srvb = srv_start(&ops, &sob, &bport);
	CHECK_EQ(rtrs_clt_reconnect_path(b, 0), 0);
	CHECK(wait_up(b, OPEN_MS + 3000), "the path came back");
	CHECK(log_has_since(mark, "waits for the fabric an earlier attempt is opening"),
	      "the reconnect waited for the open under way");
	CHECK(log_count_since(mark, "opening a fabric to") == 1,
	      "the path opened its fabric %u times: the reconnect did not take the open under way",
	      log_count_since(mark, "opening a fabric to"));

	/* 2. The session closed while its fabric opens again. */
	mark = log_mark();
	rtrs_srv_close(srvb);
	srvb = NULL;
	CHECK(wait_log_since(mark, "opening a fabric to", 3000), "the path opens its fabric again");
	t0 = test_now_ms();
	rtrs_clt_close(b);
	close_ms = test_now_ms() - t0;
	CHECK(close_ms < END_MAX_MS, "closing the session took %llu ms while its path's fabric "
	      "opened", (unsigned long long)close_ms);
	/* The fabric opened after the close (the second opened late) is closed when its open ends. */
	t0 = test_now_ms();
	do {
		usleep(20 * 1000);
		rtrs_fault_get_stats(&f1);
	} while ((f1.late_opens - f0.late_opens < 2 ||
		  f1.late_closes - f0.late_closes < f1.late_opens - f0.late_opens) &&
		 test_now_ms() - t0 < OPEN_MS + 2000);
	CHECK(wait_log_since(mark, "the fabric opened after its attempt ended is closed", 1000),
	      "the abandoned open's fabric was closed");
	gap = probes_stop(pr, loops);
	for (unsigned i = 0; i < 2; i++) {
		atomic_store(&io[i].stop, true);
		pthread_join(t[i], NULL);
	}
	rtrs_fault_get_stats(&f1);
	fprintf(stderr, "open abandoned: disconnect in %llu ms, close in %llu ms; %llu fabrics "
		"opened late, %llu closed; the client loops' longest stall %llu ms; the other "
		"sessions' slowest requests %llu and %llu ms (%llu and %llu requests)\n",
		(unsigned long long)disc_ms, (unsigned long long)close_ms,
		(unsigned long long)(f1.late_opens - f0.late_opens),
		(unsigned long long)(f1.late_closes - f0.late_closes), (unsigned long long)gap,
		(unsigned long long)atomic_load(&io[0].max_ms),
		(unsigned long long)atomic_load(&io[1].max_ms),
		(unsigned long long)atomic_load(&io[0].done),
		(unsigned long long)atomic_load(&io[1].done));
	CHECK(f1.late_opens - f0.late_opens == 2, "%llu fabrics opened late (2 expected)",
	      (unsigned long long)(f1.late_opens - f0.late_opens));
	CHECK(f1.late_closes - f0.late_closes == f1.late_opens - f0.late_opens,
	      "a fabric opened late was left open");
	CHECK(gap < STALL_MAX_MS, "a client loop stalled %llu ms", (unsigned long long)gap);
	for (unsigned i = 0; i < 2; i++)
		CHECK(atomic_load(&io[i].done) >= 10 && atomic_load(&io[i].max_ms) < STALL_MAX_MS,
		      "session %u: the slowest of %llu requests took %llu ms", i,
		      (unsigned long long)atomic_load(&io[i].done),
		      (unsigned long long)atomic_load(&io[i].max_ms));
	open_abandoned_queued(&ops, &sob, &ob, bport, nodev, slow);
out_b:
	CHECK_EQ(rtrs_fault_set(NULL), 0);
	if (srvb)
		rtrs_srv_close(srvb);
out_a:
	rtrs_clt_close(a[0]);
	rtrs_clt_close(a[1]);
	rtrs_srv_close(srv);
#endif
}

static void test_malformed(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	struct rtrs_msg_conn_req m;
	int port;

	srv_opts(&so, 64);
	srv = srv_start(&ops, &so, &port);
	CHECK(port > 0);

	good_req(&m, true);
	m.magic = le16_put(0x1234);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EPROTO);
	CHECK(log_wait_for("rejected: bad magic", 2000), "reason logged for bad magic");

	good_req(&m, true);
	m.version = le16_put(0x0300);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EPROTONOSUPPORT);
	CHECK(log_wait_for("unsupported protocol major version", 2000));

	good_req(&m, true);
	m.cid_num = le16_put(RTRS_MAX_CONNS + 1);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EINVAL);
	CHECK(log_wait_for("connection count out of range", 2000));

	good_req(&m, true);
	m.cid = le16_put(2);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EINVAL);
	CHECK(log_wait_for("connection id beyond connection count", 2000));

	good_req(&m, true);
	if (cm_pads_requests()) {
		/* IB and RoCE pad a request to 56 bytes: it arrives whole, zeros after 10. */
		CHECK(raw_connect(port, &m, 10) < 0, "a cut request is refused");
	} else {
		CHECK_EQ(raw_connect(port, &m, 10), -EMSGSIZE);
		CHECK(log_wait_for("connect request shorter than 56 bytes", 2000));
	}

	good_req(&m, false);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -ENXIO);
	CHECK(log_wait_for("unknown session and not a first connection", 2000));

	good_req(&m, true);
	m.cid_num = le16_put(200);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EINVAL);
	CHECK(log_wait_for("more connections per path than allowed", 2000));

	/* Another minor version of 2.x is accepted. */
	good_req(&m, true);
	m.version = le16_put(0x0207);
	CHECK_EQ(raw_connect(port, &m, sizeof(m)), 1);

	/*
	 * A peer that repeats a bad request: each refused, the log lines
	 * rate-limited (10 per 5 s for a place that refuses), and another
	 * reason still logged in the same seconds.
	 */
	{
		size_t mark = log_mark();
		uint64_t t0 = test_now_ms(), windows;
		unsigned lines;

		for (int i = 0; i < 30; i++) {
			good_req(&m, true);
			m.magic = le16_put(0x1234);
			CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EPROTO);
		}
		good_req(&m, true);
		m.version = le16_put(0x0300);
		CHECK_EQ(raw_connect(port, &m, sizeof(m)), -EPROTONOSUPPORT);
		for (uint64_t t = test_now_ms();
		     !log_has_since(mark, "unsupported protocol major version") &&
		     test_now_ms() - t < 2000;)
			usleep(10 * 1000);
		CHECK(log_has_since(mark, "unsupported protocol major version"),
		      "another reason is logged after a flood of one");
		/* The windows the refusals may have met: the one open at the start, and one per 5 s. */
		windows = 2 + (test_now_ms() - t0) / 5000;
		lines = log_count_since(mark, "rejected: bad magic");
		CHECK(lines >= 1 && lines <= 10 * windows, "%u lines for 30 refusals of one reason "
		      "(at most %u)", lines, (unsigned)(10 * windows));
	}

	rtrs_srv_close(srv);
}

/*
 * A client that opens 1 of its 2 connections and stops: the server must
 * close the half-made path after its connect timeout, not keep it forever.
 */
static bool wait_flag(struct raw *r, bool *flag, unsigned ms);

static void test_half_connected(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct raw r = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &r, .name = "half", .tx_depth = 16 };
	struct rtrs_msg_conn_req m;
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	struct fab_con *c = NULL;
	struct fab *f = NULL;
	char service[8];
	uint64_t t0;
	int port;

	srv_opts(&so, 16);
	so.hb_interval_ms = 100;
	so.connect_timeout_ms = 500;
	srv = srv_start(&ops, &so, &port);
	snprintf(service, sizeof(service), "%d", port);
	CHECK_EQ(fab_open(test_provider(), NULL, test_addr(), service, false, 0, &f), 0);
	good_req(&m, true);
	t0 = test_now_ms();
	CHECK_EQ(fab_con_connect(f, &cfg, &m, sizeof(m), &c), 0);
	CHECK(log_wait_for("still connecting after 500 ms, closing the path", 3000),
	      "half-connected path closed by the server");
	/* The server's close reaches the client as a disconnect. */
	wait_flag(&r, &r.down, 2000);
	pthread_mutex_lock(&r.lock);
	CHECK(r.connected && r.down, "connected %d, then down %d", r.connected, r.down);
	pthread_mutex_unlock(&r.lock);
	CHECK(test_now_ms() - t0 < 2500, "closed after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	fab_con_destroy(c);
	fab_close(f);
	rtrs_srv_close(srv);
}

static int open_client(const char *dst, unsigned timeout_ms, struct rtrs_clt_sess **s)
{
	struct rtrs_path_addr path = { .dst = dst };
	struct rtrs_clt_opts o;

	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "test-connect";
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 1;
	o.connect_timeout_ms = timeout_ms;
	return rtrs_clt_open(&o, s);
}

/* A TCP port we own that is closed, or that listens but never speaks. */
static int tcp_socket(bool listening, int *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	bind(fd, (struct sockaddr *)&a, sizeof(a));
	getsockname(fd, (struct sockaddr *)&a, &len);
	*port = ntohs(a.sin_port);
	if (listening)
		listen(fd, 16);
	return fd;
}

static void test_unreachable(void)
{
	struct rtrs_clt_sess *s = NULL;
	char dst[32];
	uint64_t t0;
	int port, fd, rc;

	/* Bound but not listening: the kernel answers with a reset. */
	fd = tcp_socket(false, &port);
	snprintf(dst, sizeof(dst), "127.0.0.1:%d", port);
	t0 = test_now_ms();
	rc = open_client(dst, 5000, &s);
	CHECK_EQ(rc, -ECONNREFUSED);
	CHECK(test_now_ms() - t0 < 2000, "refused after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	close(fd);

	/* Listening but silent: the connect timeout ends it. */
	fd = tcp_socket(true, &port);
	snprintf(dst, sizeof(dst), "127.0.0.1:%d", port);
	t0 = test_now_ms();
	rc = open_client(dst, 500, &s);
	CHECK_EQ(rc, -ETIMEDOUT);
	CHECK(test_now_ms() - t0 < 2500, "timed out after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	CHECK(log_has("connection 0 of 2 failed: Connection timed out"));
	close(fd);

	/*
	 * A name that does not resolve is said to be one (not "no such
	 * device"). '!' makes the resolver refuse it before asking any
	 * server: no query leaves this host.
	 */
	rc = open_client("no!such!host:1234", 500, &s);
	CHECK_EQ(rc, -ENXIO);
	CHECK(log_has("no!such!host"), "the name is in the log");
}

/*
 * A proxy that is slow to connect: each connection it accepts waits
 * PROXY_DELAY_MS, then is joined to the server's port and its bytes copied
 * both ways until either side closes. A path through it takes at least
 * that long to come up.
 */
#define PROXY_DELAY_MS 700

struct proxy {
	int lfd, port;
	struct sockaddr_in to;
	atomic_int pairs;   /* joined connections still copying */
	pthread_t thr;
};

struct proxy_pair {
	struct proxy *px;
	int fd;
};

static void *proxy_pair_run(void *arg)
{
	struct proxy_pair *pp = arg;
	struct proxy *px = pp->px;
	int a = pp->fd, b;
	char *buf = malloc(65536);

	free(pp);
	usleep(PROXY_DELAY_MS * 1000);
	b = socket(AF_INET, SOCK_STREAM, 0);
	if (buf && b >= 0 && connect(b, (struct sockaddr *)&px->to, sizeof(px->to)) == 0) {
		struct pollfd pf[2] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN } };

		for (;;) {
			ssize_t n;
			int from;

			if (poll(pf, 2, 20000) <= 0)
				break;
			from = pf[0].revents ? 0 : 1;
			n = read(pf[from].fd, buf, 65536);
			if (n <= 0 || write(pf[!from].fd, buf, (size_t)n) != n)
				break;
		}
	}
	if (b >= 0)
		close(b);
	close(a);
	free(buf);
	atomic_fetch_sub(&px->pairs, 1);
	return NULL;
}

static void *proxy_accept_run(void *arg)
{
	struct proxy *px = arg;

	for (;;) {
		int fd = accept(px->lfd, NULL, NULL);
		struct proxy_pair *pp;
		pthread_t t;

		if (fd < 0)
			return NULL; /* the listener was shut down */
		pp = malloc(sizeof(*pp));
		if (!pp) {
			close(fd);
			continue;
		}
		*pp = (struct proxy_pair){ px, fd };
		atomic_fetch_add(&px->pairs, 1);
		if (pthread_create(&t, NULL, proxy_pair_run, pp)) {
			atomic_fetch_sub(&px->pairs, 1);
			close(fd);
			free(pp);
			continue;
		}
		pthread_detach(t);
	}
}

/* A proxy to 127.0.0.1:to_port; false when it cannot be set up. */
static bool proxy_start(struct proxy *px, int to_port)
{
	px->to = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons((uint16_t)to_port),
				       .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	atomic_init(&px->pairs, 0);
	px->lfd = tcp_socket(true, &px->port);
	return px->lfd >= 0 && pthread_create(&px->thr, NULL, proxy_accept_run, px) == 0;
}

/* Stops accepting, then waits for the copies (their client closed). */
static void proxy_stop(struct proxy *px)
{
	shutdown(px->lfd, SHUT_RDWR);
	pthread_join(px->thr, NULL);
	close(px->lfd);
	for (int i = 0; i < 500 && atomic_load(&px->pairs); i++)
		usleep(10000);
	CHECK_EQ(atomic_load(&px->pairs), 0);
}

/* Opens paths to dst, then to the proxy: how long it took, or 0 on failure. */
static uint64_t open_timed(const char *dst, const char *slow, size_t nslow)
{
	struct rtrs_attrs attrs = { .size = sizeof(attrs) };
	struct rtrs_path_addr paths[3] = { { .dst = dst }, { .dst = slow }, { .dst = slow } };
	struct rtrs_clt_sess *s = NULL;
	struct rtrs_clt_opts o;
	uint64_t t0, took;
	int rc;

	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "test-paths-together";
	o.paths = paths;
	o.paths_num = 1 + nslow;
	o.nr_io_cons = 1;
	t0 = test_now_ms();
	rc = rtrs_clt_open(&o, &s);
	took = test_now_ms() - t0;
	CHECK(rc == 0, "open of %zu paths: %s", 1 + nslow, strerror(-rc));
	if (rc)
		return 0;
	CHECK_EQ(rtrs_clt_query(s, &attrs), 0);
	CHECK_EQ(attrs.paths_up, 1 + nslow);
	rtrs_clt_close(s);
	return took;
}

/*
 * A session's paths after the first open together: paths 1 and 2 through
 * a proxy that is slow to connect come up in about the time one of them
 * takes, not two; and with two paths at a port that listens but never
 * speaks, the open fails with ETIMEDOUT after one connect timeout.
 */
static void test_paths_together(void)
{
	char a_port[] = "--port", a_zero[] = "0";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, NULL };
	struct proxy px;
	struct proc srv;
	char dst[96], slow[32], silent[32];
	const char *colon;
	uint64_t one, two, t0, took;
	struct rtrs_clt_sess *s = NULL;
	struct rtrs_path_addr paths[3];
	struct rtrs_clt_opts o;
	int port, fd, rc;

	if (proc_spawn_server(argv, &srv)) {
		CHECK(0, "test server started");
		return;
	}
	proc_dst(&srv, dst, sizeof(dst));
	colon = strrchr(dst, ':');
	if (!colon || !proxy_start(&px, atoi(colon + 1))) {
		CHECK(0, "proxy to %s", dst);
		proc_signal(&srv, SIGTERM, true);
		return;
	}
	snprintf(slow, sizeof(slow), "127.0.0.1:%d", px.port);
	one = open_timed(dst, slow, 1);
	two = open_timed(dst, slow, 2);
	/* One after the other, two slow paths would take twice as long as one. */
	fprintf(stderr, "paths through a slow proxy: one up in %llu ms, two in %llu ms\n",
		(unsigned long long)one, (unsigned long long)two);
	CHECK(one >= PROXY_DELAY_MS && two && two < one + one / 2,
	      "one slow path came up in %llu ms, two in %llu ms", (unsigned long long)one,
	      (unsigned long long)two);
	proxy_stop(&px);

	fd = tcp_socket(true, &port);
	snprintf(silent, sizeof(silent), "127.0.0.1:%d", port);
	paths[0] = (struct rtrs_path_addr){ .dst = dst };
	paths[1] = (struct rtrs_path_addr){ .dst = silent };
	paths[2] = (struct rtrs_path_addr){ .dst = silent };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "test-paths-silent";
	o.paths = paths;
	o.paths_num = 3;
	o.nr_io_cons = 1;
	o.connect_timeout_ms = 1000;
	t0 = test_now_ms();
	rc = rtrs_clt_open(&o, &s);
	took = test_now_ms() - t0;
	CHECK_EQ(rc, -ETIMEDOUT);
	CHECK(took >= 900 && took < 1900, "two silent paths timed out together: %llu ms",
	      (unsigned long long)took);
	close(fd);
	proc_signal(&srv, SIGTERM, true);
}

/* ---- a client that breaks the protocol after a correct handshake ---------- */

static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rtrs_srv_op *held[4];
static atomic_int nheld;

/* Holds every IO: the test answers them itself, late. */
static int hold_rdma_ev(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir, void *data,
			size_t datalen, const void *usr, size_t usrlen)
{
	pthread_mutex_lock(&held_lock);
	if (nheld < 4)
		held[nheld++] = id;
	pthread_mutex_unlock(&held_lock);
	return nheld <= 4 ? 0 : -EIO;
}

struct rogue {
	struct raw r;
	struct fab *f;
	struct fab_con *c;
	struct rtrs_conn_rsp rsp;
	struct rtrs_desc chunk0;
	char imm_buf[64];
	struct fab_mr imm_mr;
	uint8_t hdr[64];
	struct fab_mr hdr_mr;       /* verbs: local buffers need registering */
};

static bool wait_flag(struct raw *r, bool *flag, unsigned ms)
{
	uint64_t end = test_now_ms() + ms;
	bool v;

	for (;;) {
		pthread_mutex_lock(&r->lock);
		v = *flag;
		pthread_mutex_unlock(&r->lock);
		if (v || test_now_ms() > end)
			return v;
		usleep(1000);
	}
}

/* A correct one-connection session: connect, info exchange, chunk 0. */
static int rogue_open(struct rogue *g, int port)
{
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &g->r, .name = "rogue", .tx_depth = 64 };
	struct rtrs_conn_req req = { .cid = 0, .cid_num = 1, .first_conn = true, .ext = true };
	struct rtrs_msg_conn_req m;
	static struct rtrs_msg_info_req ireq;
	struct fab_mr ireq_mr;
	struct rtrs_info_req info = { 0 };
	static atomic_int seq;
	struct rtrs_desc *chunks;
	uint32_t *gens;
	int verdict;
	bool dnr;
	struct rtrs_limits lim;
	const char *why;
	char service[8];
	int rc;

	memset(g, 0, sizeof(*g));
	/* A session name of its own: the server refuses a name in use. */
	snprintf(info.pathname, sizeof(info.pathname), "rogue%d", atomic_fetch_add(&seq, 1));
	pthread_mutex_init(&g->r.lock, NULL);
	pthread_cond_init(&g->r.cond, NULL);
	for (int i = 0; i < RTRS_UUID_LEN; i++) {
		req.sess_uuid[i] = (uint8_t)rand();
		req.paths_uuid[i] = (uint8_t)rand();
	}
	rtrs_conn_req_encode(&m, &req);
	snprintf(service, sizeof(service), "%d", port);
	if ((rc = fab_open(test_provider(), NULL, test_addr(), service, false, 0, &g->f)) ||
	    (rc = fab_con_connect(g->f, &cfg, &m, sizeof(m), &g->c)))
		return rc;
	if (!wait_flag(&g->r, &g->r.connected, 3000))
		return -ETIMEDOUT;
	if ((rc = rtrs_conn_rsp_decode(g->r.data, g->r.len, &g->rsp, &why)) || g->rsp.err)
		return rc ? rc : g->rsp.err;
	if ((rc = fab_mr_reg(g->f, g->imm_buf, sizeof(g->imm_buf), FAB_MR_REMOTE_WRITE,
			     &g->imm_mr)) ||
	    (rc = fab_mr_reg(g->f, g->hdr, sizeof(g->hdr), FAB_MR_LOCAL, &g->hdr_mr)) ||
	    (rc = fab_con_rx_setup(g->c, 2, rtrs_info_rsp_size(g->rsp.queue_depth, g->rsp.queue_depth))))
		return rc;
	info.imm_addr = g->imm_mr.base;
	info.imm_key = g->imm_mr.key;
	rtrs_info_req_encode(&ireq, &info);
	if ((rc = fab_mr_reg(g->f, &ireq, sizeof(ireq), FAB_MR_LOCAL, &ireq_mr)))
		return rc;
	rc = fab_send(g->c, &ireq, sizeof(ireq), ireq_mr.desc, NULL);
	if (rc) {
		fab_mr_dereg(&ireq_mr);
		return rc;
	}
	for (int i = 0; i < 3000; i++) {
		pthread_mutex_lock(&g->r.lock);
		bool got = g->r.msg != NULL;

		pthread_mutex_unlock(&g->r.lock);
		if (got)
			break;
		usleep(1000);
	}
	fab_mr_dereg(&ireq_mr);
	pthread_mutex_lock(&g->r.lock);
	if (!g->r.msg) {
		pthread_mutex_unlock(&g->r.lock);
		return -ETIMEDOUT;
	}
	pthread_mutex_unlock(&g->r.lock);
	lim = (struct rtrs_limits){ .queue_depth = g->rsp.queue_depth,
				    .chunk_size = g->rsp.chunk_size,
				    .max_hdr_size = g->rsp.max_hdr_size };
	chunks = calloc(lim.queue_depth, sizeof(*chunks));
	gens = calloc(lim.queue_depth, sizeof(*gens));
	lim.ext = g->rsp.ext;
	lim.key64 = g->rsp.flags & RTRS_MSG_KEY64_F;
	rc = rtrs_info_rsp_decode(g->r.msg, g->r.msg_len, &lim, chunks, gens, &verdict, &dnr, &why);
	if (!rc && verdict)
		rc = verdict;
	g->chunk0 = chunks[0];
	free(chunks);
	free(gens);
	return rc;
}

/*
 * Writes an rtrs header into chunk 0 at off (with the chunk's key xor
 * key_flip) and rings the imm.
 */
static int rogue_request(struct rogue *g, uint32_t usr_len, uint32_t off, uint32_t key_flip)
{
	struct iovec iov = { g->hdr, sizeof(struct rtrs_msg_rdma_write) };
	struct fab_rma rma = { .addr = g->chunk0.addr + off, .len = iov.iov_len,
			       .key = g->chunk0.key ^ key_flip };
	void *desc = g->hdr_mr.desc;

	rtrs_write_hdr_encode(g->hdr, usr_len);
	return fab_write(g->c, &iov, &desc, 1, &rma, 1, true,
			 rtrs_to_io_req_imm(g->rsp.queue_depth, 0, off), NULL);
}

static void rogue_close(struct rogue *g)
{
	fab_con_destroy(g->c);
	fab_mr_dereg(&g->imm_mr);
	fab_mr_dereg(&g->hdr_mr);
	fab_close(g->f);
	free(g->r.msg);
}

static void test_rogue_client(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = hold_rdma_ev };
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	struct rogue g;
	int port, rc;

	srv_opts(&so, 16);
	/* These check the server's own checks; with always_invalidate a revoked key refuses first. */
	so.always_invalidate = 0;
	srv = srv_start(&ops, &so, &port);

	/* 1. Chunk 0 reused while the server still holds its request. */
	rc = rogue_open(&g, port);
	CHECK(rc == 0, "rogue handshake: %s", strerror(-rc));
	CHECK_EQ(rogue_request(&g, 0, 0, 0), 0);
	for (int i = 0; i < 2000 && !nheld; i++)
		usleep(1000);
	CHECK_EQ(nheld, 1);
	CHECK_EQ(rogue_request(&g, 0, 0, 0), 0);
	CHECK(log_wait_for("request for chunk 0 which is still in use", 2000));
	CHECK(wait_flag(&g.r, &g.r.down, 2000), "the server closed the rogue path");
	CHECK_EQ(nheld, 1);
	rogue_close(&g);
	/*
	 * The user answers after the path is gone: dropped, nothing hangs.
	 * (The op may be freed with its session right after: answering twice
	 * would be a use after free, so the double answer is not tried here.)
	 */
	CHECK_EQ(rtrs_srv_resp_rdma(held[0], 0), -ENOTCONN);

	/* 2. A user header longer than its offset (the kernel's underflow). */
	rc = rogue_open(&g, port);
	CHECK(rc == 0, "rogue handshake: %s", strerror(-rc));
	CHECK_EQ(rogue_request(&g, 100, 8, 0), 0);
	CHECK(log_wait_for("invalid IO request: user header longer than its offset", 2000));
	CHECK(wait_flag(&g.r, &g.r.down, 2000), "the server closed the rogue path");
	CHECK_EQ(nheld, 1);
	rogue_close(&g);

	/*
	 * 3. A wrong remote key. tcp drops the connection; verbs completes the
	 * write in error (remote access) and the QP dies. Either way only that
	 * path goes, promptly, and nothing reaches the server's user.
	 */
	rc = rogue_open(&g, port);
	CHECK(rc == 0, "rogue handshake: %s", strerror(-rc));
	log_clear();
	CHECK_EQ(rogue_request(&g, 0, 0, 0x5555), 0);
	CHECK(wait_flag(&g.r, &g.r.down, 3000), "a bad key fails the connection");
	CHECK(g.r.err != 0, "with an error: %d", g.r.err);
	CHECK(log_wait_for("path closed", 3000), "the server closed that path");
	CHECK_EQ(nheld, 1);
	rogue_close(&g);

	rtrs_srv_close(srv);
}

/*
 * Chunk keys cannot be guessed. On tcp every connection of the server's
 * domain may aim a write at any key of that domain (the provider checks
 * the key, not who sends it), so a session that could work out another
 * session's key from its own could write into its chunks. An attacker
 * session learns its own chunk key and tries the keys around it, each try
 * on a fresh connection (a wrong key costs the connection). A control
 * write with the victim's real key shows that the probe sees a key that
 * works: keys from a plain counter fail this test on its first guess.
 */
static int guess_write(struct rogue *g, uint64_t addr, uint64_t key)
{
	struct iovec iov = { g->hdr, 64 };
	struct fab_rma rma = { .addr = addr, .len = iov.iov_len, .key = key };
	void *desc = g->hdr_mr.desc;

	memset(g->hdr, 0xa5, sizeof(g->hdr));
	return fab_write(g->c, &iov, &desc, 1, &rma, 1, false, 0, NULL);
}

static void test_guessed_keys(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = hold_rdma_ev };
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	struct rogue victim, attacker, probe;
	unsigned landed = 0, refused = 0;
	uint64_t known;
	int port, rc;

	srv_opts(&so, 16);
	so.always_invalidate = 1;
	srv = srv_start(&ops, &so, &port);

	rc = rogue_open(&victim, port);
	CHECK(rc == 0, "victim handshake: %s", strerror(-rc));
	if (rc)
		goto out_victim;
	if (fab_attr(victim.f)->prov_key) {
		printf("# guessed keys: the %s provider picks memory keys itself, skipped\n",
		       test_provider());
		goto out_victim;
	}
	rc = rogue_open(&attacker, port);
	CHECK(rc == 0, "attacker handshake: %s", strerror(-rc));
	if (rc) {
		rogue_close(&attacker);
		goto out_victim;
	}
	known = attacker.chunk0.key;
	CHECK(known >= (uint64_t)1 << 32, "always_invalidate chunk keys use 64 bits: 0x%llx",
	      (unsigned long long)known);

	/* The control: the victim's real key, from the attacker's connection, lands. */
	CHECK_EQ(guess_write(&attacker, victim.chunk0.addr, victim.chunk0.key), 0);
	CHECK(!wait_flag(&attacker.r, &attacker.r.down, 500),
	      "a right key from another session's connection is accepted (the probe works)");
	rogue_close(&attacker);

	/* The guesses: the keys registered around the attacker's own. */
	for (int d = -24; d <= 24; d++) {
		uint64_t key = known + (uint64_t)(int64_t)d;

		if (!d)
			continue;
		rc = rogue_open(&probe, port);
		CHECK(rc == 0, "probe handshake: %s", strerror(-rc));
		if (rc) {
			rogue_close(&probe);
			break;
		}
		CHECK_EQ(guess_write(&probe, victim.chunk0.addr, key), 0);
		if (wait_flag(&probe.r, &probe.r.down, 2000))
			refused++;
		else
			landed++;
		rogue_close(&probe);
	}
	CHECK(landed == 0 && refused == 48, "guessed keys: %u landed, %u refused", landed, refused);
	CHECK(!wait_flag(&victim.r, &victim.r.down, 10), "the victim's path is still up");
out_victim:
	rogue_close(&victim);
	rtrs_srv_close(srv);
}

/*
 * Connection data must fit what the provider carries (55 bytes on verbs,
 * 256 on tcp): longer data is refused, never silently cut.
 */
/*
 * A client that never authenticates, against a server that requires it:
 * it never receives a chunk address or key (no message at all), and it is
 * disconnected: at once when it skips to the info request, after the auth
 * timeout when it stays silent. Neither can add connections to its path,
 * and one that does not speak authentication is refused outright.
 */
struct unauth {
	struct raw r;
	struct fab *f;
	struct fab_con *c;
	struct rtrs_msg_conn_req m;
	struct rtrs_conn_rsp rsp;
};

static int unauth_open(struct unauth *u, int port, bool auth)
{
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &u->r, .name = "unauth",
				   .tx_depth = 16, .rx_depth = 4, .rx_size = 8192 };
	struct rtrs_conn_req req = { .cid = 0, .cid_num = 2, .first_conn = true, .ext = true,
				     .auth = auth };
	char service[8];
	const char *why;
	int rc;

	memset(u, 0, sizeof(*u));
	pthread_mutex_init(&u->r.lock, NULL);
	pthread_cond_init(&u->r.cond, NULL);
	for (int i = 0; i < RTRS_UUID_LEN; i++) {
		req.sess_uuid[i] = (uint8_t)rand();
		req.paths_uuid[i] = (uint8_t)rand();
	}
	rtrs_conn_req_encode(&u->m, &req);
	snprintf(service, sizeof(service), "%d", port);
	if ((rc = fab_open(test_provider(), NULL, test_addr(), service, false, 0, &u->f)) ||
	    (rc = fab_con_connect(u->f, &cfg, &u->m, sizeof(u->m), &u->c)))
		return rc;
	pthread_mutex_lock(&u->r.lock);
	for (int i = 0; i < 3000 && !u->r.connected && !u->r.down; i++) {
		pthread_mutex_unlock(&u->r.lock);
		usleep(1000);
		pthread_mutex_lock(&u->r.lock);
	}
	pthread_mutex_unlock(&u->r.lock);
	if (!u->r.connected) {
		if (u->r.err == -ECONNREFUSED &&
		    rtrs_conn_rsp_decode(u->r.data, u->r.len, &u->rsp, &why) == 0)
			return u->rsp.err;
		return u->r.err ? u->r.err : -ETIMEDOUT;
	}
	return rtrs_conn_rsp_decode(u->r.data, u->r.len, &u->rsp, &why);
}

static void unauth_close(struct unauth *u)
{
	fab_con_destroy(u->c);
	fab_close(u->f);
	free(u->r.msg);
}

static void test_never_authenticates(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_srv_stats st = { .size = sizeof(st) };
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	const char *dir = test_tmpdir("/tmp", "rtrs-test-connect");
	char keys[256];
	static struct rtrs_msg_info_req ireq;
	struct rtrs_info_req info = { .pathname = "unauth", .imm_key = 1 };
	struct fab_mr ireq_mr;
	struct unauth u;
	uint64_t t0;
	FILE *f;
	int rc, port;

	CHECK(dir != NULL);
	if (!dir)
		return;
	snprintf(keys, sizeof(keys), "%s/hosts", dir);
	f = fopen(keys, "w");
	fprintf(f, "nqn.test-host DHHC-1:00:ia6zGodOr4SEG0Zzaw398rpY0wqipUWj4jWjUh4HWUz6aQ2n:\n");
	fclose(f);
	chmod(keys, 0600);
	srv_opts(&so, 16);
	so.hb_interval_ms = 100;
	so.auth_keys_file = keys;
	so.auth_timeout_ms = 600;
	srv = srv_start(&ops, &so, &port);

	/* 1. Does not speak authentication: refused, and told not to retry. */
	{
		struct rtrs_msg_conn_req m0;
		struct rtrs_conn_rsp rsp = { 0 };

		good_req(&m0, true); /* no RTRS_CONN_AUTH */
		CHECK_EQ(raw_connect_rsp(port, &m0, sizeof(m0), &rsp), -EACCES);
		CHECK(rsp.dnr, "the reject says do not retry");
		CHECK(log_wait_for("authentication required and the client does not speak it",
				   2000));
	}

	/* 2. Skips authentication and asks for the chunks: closed, nothing sent. */
	rc = unauth_open(&u, port, true);
	CHECK(rc == 0, "connect: %s", strerror(-rc));
	CHECK(u.rsp.flags & RTRS_MSG_AUTH_F, "the server asks for authentication");
	info.imm_addr = 0;
	rtrs_info_req_encode(&ireq, &info);
	CHECK_EQ(fab_mr_reg(u.f, &ireq, sizeof(ireq), FAB_MR_LOCAL, &ireq_mr), 0);
	CHECK_EQ(fab_send(u.c, &ireq, sizeof(ireq), ireq_mr.desc, NULL), 0);
	CHECK(wait_flag(&u.r, &u.r.down, 2000), "the server closed the path");
	CHECK(u.r.msg == NULL, "no message (no chunk address or key) reached the client");
	CHECK(log_wait_for("message before authentication", 2000));
	fab_mr_dereg(&ireq_mr);
	unauth_close(&u);

	/* 3. Silent: closed after the auth timeout; no second connection meanwhile. */
	rc = unauth_open(&u, port, true);
	CHECK(rc == 0, "connect: %s", strerror(-rc));
	t0 = test_now_ms();
	/* It has a session, but the session has no chunk memory (and no keys). */
	CHECK_EQ(rtrs_srv_get_stats(srv, &st), 0);
	CHECK_EQ(st.sessions, 1u);
	CHECK_EQ(st.chunk_bytes, 0u);
	CHECK_EQ(st.key_rotations, 0u);
	{
		struct rtrs_msg_conn_req m1 = u.m;
		struct rtrs_conn_req r1;
		const char *why;

		CHECK_EQ(rtrs_conn_req_decode(&u.m, sizeof(u.m), &r1, &why), 0);
		r1.cid = 1;
		rtrs_conn_req_encode(&m1, &r1);
		CHECK_EQ(raw_connect(port, &m1, sizeof(m1)), -EACCES);
		CHECK(log_wait_for("connection before the path authenticated", 2000));
	}
	CHECK(wait_flag(&u.r, &u.r.down, 3000), "the silent client was disconnected");
	CHECK(test_now_ms() - t0 >= 550 && test_now_ms() - t0 < 2000,
	      "after the timeout: %llu ms", (unsigned long long)(test_now_ms() - t0));
	CHECK(u.r.msg == NULL, "no message reached the silent client");
	CHECK(log_wait_for("not authenticated after 600 ms", 2000));
	unauth_close(&u);
	CHECK_EQ(rtrs_srv_get_stats(srv, &st), 0);
	CHECK_EQ(st.auth_timeouts, 1u);
	CHECK_EQ(st.auth_ok, 0u);
	rtrs_srv_close(srv);
}

static void test_cm_data_limit(void)
{
	struct raw r = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &r, .name = "big", .tx_depth = 16 };
	size_t limit = strcmp(test_provider(), "verbs") ? 256 : 55;
	uint8_t data[600] = { 0 };
	struct fab_con *c = NULL;
	struct fab *f = NULL;

	CHECK(sizeof(struct rtrs_msg_conn_req) == 56 && sizeof(struct rtrs_msg_conn_rsp) == 56,
	      "RTRS connection messages are the kernel's 56 bytes");
	CHECK_EQ(fab_open(test_provider(), NULL, test_addr(), "9", false, 0, &f), 0);
	if (!f)
		return;
	/* The native fabric knows its CM's limit: 56 on IB and RoCE, 255 on iWARP (rdma_cm's byte-sized length). */
	if (fab_attr(f)->connect_data_max)
		limit = fab_attr(f)->connect_data_max;
	CHECK(sizeof(struct rtrs_msg_conn_req) <= limit, "a request fits the CM's %zu bytes",
	      limit);
	CHECK(limit < sizeof(data), "limit %zu", limit);
	CHECK_EQ(fab_con_connect(f, &cfg, data, limit + 1, &c), -EMSGSIZE);
	CHECK(c == NULL);
	CHECK(log_has("bytes of connection data exceed the provider's"));
	fab_close(f);
}

static void test_bad_options(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_path_addr path = { .dst = "127.0.0.1:1" };
	struct rtrs_srv_opts so;
	struct rtrs_clt_opts o;
	struct rtrs_srv_ctx *srv;
	struct rtrs_clt_sess *s;
	char longname[300];
	const char *names[] = { "a/b", ".", "..", "", "tab\there", longname };
	const struct { uint32_t qd, chunk; } srv_bad[] = {
		{ 0, 131072 }, { 65536, 131072 }, { 64, 12345 }, { 64, 4096 }, { 65535, 1u << 20 },
		/* Fits the immediate, but not always_invalidate's info response on tcp (64 KiB). */
		{ 2048, 65536 },
	};

	memset(longname, 'x', 256);
	longname[256] = '\0';
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		rtrs_clt_opts_init(&o, sizeof(o));
		o.sessname = names[i];
		o.paths = &path;
		o.paths_num = 1;
		CHECK_EQ(rtrs_clt_open(&o, &s), -EINVAL);
	}
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "ok";
	o.paths = &path;
	o.paths_num = 0;
	CHECK_EQ(rtrs_clt_open(&o, &s), -EINVAL);
	o.paths_num = 129;
	CHECK_EQ(rtrs_clt_open(&o, &s), -EINVAL);
	path.dst = "127.0.0.1:99999";
	o.paths_num = 1;
	CHECK_EQ(rtrs_clt_open(&o, &s), -EINVAL);
	path.dst = "127.0.0.1:1";
	path.src = "no-such-host.invalid";
	CHECK_EQ(rtrs_clt_open(&o, &s), -EINVAL);
	CHECK(log_has("source address no-such-host.invalid"), "bad source named in the log");
	path.src = NULL;
	CHECK_EQ(rtrs_clt_opts_init(&o, sizeof(o) - 1), -EINVAL);

	for (size_t i = 0; i < sizeof(srv_bad) / sizeof(srv_bad[0]); i++) {
		rtrs_srv_opts_init(&so, sizeof(so));
		so.queue_depth = srv_bad[i].qd;
		so.max_chunk_size = srv_bad[i].chunk;
		CHECK_EQ(rtrs_srv_open(&ops, &so, &srv), -EINVAL);
	}
}

static void test_listen_retry(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	int port, fd, one = 1;

	/* Hold the port with a listening socket so the server cannot bind. */
	fd = tcp_socket(true, &port);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	srv_opts(&so, 16);
	so.port = (uint16_t)port;
	so.listen_retry_ms = 100;
	CHECK_EQ(rtrs_srv_open(&ops, &so, &srv), 0);
	/* Not listening: the cause, not a timeout. */
	CHECK_EQ(rtrs_srv_wait_listening(srv, 500), -EADDRINUSE);
	CHECK(log_has("cannot listen on 127.0.0.1"), "the retry is logged");
	close(fd);
	CHECK_EQ(rtrs_srv_wait_listening(srv, 3000), 0);
	CHECK_EQ(rtrs_srv_get_port(srv), port);
	rtrs_srv_close(srv);
}

/* CPU time this process used, all threads, in ms. */
static uint64_t cpu_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * A listener with nobody connecting, well past its handshake timeout. The
 * sweep that cuts TCP connections which never send a request must cut
 * only those: an earlier fabric once cut a signal socket of its own in the
 * listener's wait set, which then read as ready for ever and the service
 * loop spun on it, both CPUs' worth. The server must stay idle, cut
 * nothing and still take a session.
 */
static void test_idle_listener(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev };
	struct rtrs_srv_stats st = { .size = sizeof(st) };
	struct rtrs_path_addr path;
	struct rtrs_clt_sess *sess = NULL;
	struct rtrs_clt_opts o;
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	uint64_t t0, c0, wall, cpu;
	size_t mark = log_len; /* no server runs: nothing logs now */
	char dst[96];
	int port, rc;

	srv_opts(&so, 16);
	so.handshake_timeout_ms = 200;
	srv = srv_start(&ops, &so, &port);
	if (!srv)
		return;
	usleep(600 * 1000); /* three timeouts: anything cut is cut by now */
	t0 = test_now_ms();
	c0 = cpu_ms();
	usleep(1000 * 1000);
	wall = test_now_ms() - t0;
	cpu = cpu_ms() - c0;
	CHECK(cpu * 4 < wall, "an idle server used %llu ms of CPU in %llu ms",
	      (unsigned long long)cpu, (unsigned long long)wall);
	CHECK_EQ(rtrs_srv_get_stats(srv, &st), 0);
	CHECK_EQ(st.raw_closed, 0);
	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.sessname = "after-idle";
	o.provider = test_provider();
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 1;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "a session after the idle time: %s", strerror(-rc));
	if (!rc)
		rtrs_clt_close(sess);
	rtrs_srv_close(srv);
	/* Read once nothing logs any more. */
	CHECK(!strstr(log_since(mark), "sent no connection request"),
	      "the listener cut a connection nobody made");
}

/*
 * Connections come and go on two threads at once, so the count of
 * connections in the process goes through 0 again and again while another
 * connection is being made: the flood watchdog (one thread per process)
 * was then started by the first connection and stopped by the last, so it
 * was stopped and started concurrently (it now lives as long as the
 * process once started). Thread A makes and destroys connections; thread B
 * makes one, keeps it until A has destroyed two more, destroys it, and so
 * on. A's destroys must never wait for B. Before, B's start of the
 * watchdog revived the one A had just stopped (and was joining), so A
 * waited for B's connection to go while B waited for A: the server's loop
 * did so in test-auth over verbs, its client waiting for the server.
 */
#define CHURN_ROUNDS 400
#define CHURN_WAIT_MS 3000

static atomic_int churn_a_rounds, churn_errors, churn_stalls;
static atomic_bool churn_a_done;

static int churn_fab(struct fab **f)
{
	/* A port nobody listens on: the connects fail later, by themselves. */
	return fab_open(test_provider(), NULL, test_addr(), "9", false, 0, f);
}

static void *churn_a(void *arg)
{
	struct raw r = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &r, .name = "churn-a", .tx_depth = 16 };
	struct fab *f = NULL;

	if (churn_fab(&f))
		atomic_fetch_add(&churn_errors, 1);
	for (int i = 0; f && i < CHURN_ROUNDS; i++) {
		struct fab_con *c = NULL;

		if (fab_con_connect(f, &cfg, NULL, 0, &c))
			atomic_fetch_add(&churn_errors, 1);
		else
			fab_con_destroy(c);
		atomic_fetch_add(&churn_a_rounds, 1);
	}
	if (f)
		fab_close(f);
	atomic_store(&churn_a_done, true);
	return arg;
}

static void *churn_b(void *arg)
{
	struct raw r = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct fab_con_cfg cfg = { .ops = &raw_ops, .priv = &r, .name = "churn-b", .tx_depth = 16 };
	struct fab *f = NULL;

	if (churn_fab(&f)) {
		atomic_fetch_add(&churn_errors, 1);
		return arg;
	}
	while (!atomic_load(&churn_a_done)) {
		struct fab_con *c = NULL;
		int seen = atomic_load(&churn_a_rounds);
		uint64_t end = test_now_ms() + CHURN_WAIT_MS;

		if (fab_con_connect(f, &cfg, NULL, 0, &c)) {
			atomic_fetch_add(&churn_errors, 1);
			break;
		}
		while (atomic_load(&churn_a_rounds) < seen + 2 && !atomic_load(&churn_a_done) &&
		       test_now_ms() < end)
			usleep(200);
		if (atomic_load(&churn_a_rounds) < seen + 2 && !atomic_load(&churn_a_done))
			atomic_fetch_add(&churn_stalls, 1); /* A waits for this connection */
		fab_con_destroy(c);
	}
	fab_close(f);
	return arg;
}

static void test_watchdog_churn(void)
{
	pthread_t a, b;
	uint64_t end = test_now_ms() + 90000;

	CHECK_EQ(pthread_create(&a, NULL, churn_a, NULL), 0);
	CHECK_EQ(pthread_create(&b, NULL, churn_b, NULL), 0);
	while (!atomic_load(&churn_a_done) && test_now_ms() < end)
		usleep(10 * 1000);
	CHECK(atomic_load(&churn_a_done), "%d of %d connections made and destroyed in 90 s",
	      atomic_load(&churn_a_rounds), CHURN_ROUNDS);
	if (!atomic_load(&churn_a_done)) {
		/* A thread hangs in the library: nothing more can be checked. */
		fprintf(stderr, "test-connect: a connection's destroy hangs; giving up\n");
		_exit(test_done("test-connect"));
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	CHECK_EQ(atomic_load(&churn_errors), 0);
	CHECK(atomic_load(&churn_stalls) == 0,
	      "%d times a destroy waited %d ms for another thread's connection to go",
	      atomic_load(&churn_stalls), CHURN_WAIT_MS);
}

int main(void)
{
	srand(12345);
	rtrs_set_log_fn(log_sink, NULL);
	rtrs_set_log_level(2); /* info: path closes are logged there */
	bool tcp = !strcmp(test_provider(), "tcp");

	test_bad_options();
	test_cm_data_limit();
	test_thread_names();
	test_reconnect_threads();
	test_slow_fabric_open();
	test_dh_off_loop();
	test_device_gone_reopen(false);
	test_device_gone_reopen(true);
	test_open_abandoned();
	if (tcp)
		test_unreachable(); /* plain TCP sockets play the peer */
	if (tcp)
		test_paths_together();
	test_malformed();
	test_half_connected();
	test_rogue_client();
	test_guessed_keys();
	test_never_authenticates();
	test_idle_listener();
	test_watchdog_churn();
	if (tcp)
		test_listen_retry(); /* a TCP socket holds the port */
	rtrs_set_log_fn(NULL, NULL);
	if (g_failures)
		fprintf(stderr, "captured log:\n%s", log_text());
	return test_done("test-connect");
}
