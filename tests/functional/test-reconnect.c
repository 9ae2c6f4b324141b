/* SPDX-License-Identifier: MIT */
/*
 * Reconnect:
 *   - the server is killed: the path goes to "reconnecting", link event
 *     DISCONNECTED, and a request waits for the path (also one sent while
 *     the path is still closing); the server is restarted on the same port:
 *     the path comes back by itself, reaching a new server session, which
 *     is told once (SERVER_SESSION) before RECONNECTED and before any
 *     request goes on the path; the waiting requests reach the new server
 *     and verified IO runs again;
 *   - two paths: one reconnecting while the other keeps the server session
 *     is no new session; a server restart under both is one;
 *   - with max_reconnect_attempts = 2 and no server, the path stops after
 *     two failed attempts ("closed") and comes back only when reconnected by
 *     hand;
 *   - a path disconnected by the user stays closed.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rtrs.h"
#include "check.h"
#include "harness.h"
#include "test-proto-hdr.h"

static struct rtrs_clt_sess *sess;
static atomic_int ev_up, ev_down, ev_srv;
static atomic_int ev_srv_paths_up = -1; /* paths up when SERVER_SESSION came */
static atomic_int ev_srv_ups = -1;      /* RECONNECTED events before it */

static atomic_int path_up, path_down;   /* path 0's events */
static atomic_int paths_live;           /* up less down, every path */

static void link_ev(void *priv, enum rtrs_clt_link_ev ev)
{
	(void)priv;
	switch (ev) {
	case RTRS_CLT_LINK_EV_RECONNECTED:
		atomic_fetch_add(&ev_up, 1);
		break;
	case RTRS_CLT_LINK_EV_DISCONNECTED:
		atomic_fetch_add(&ev_down, 1);
		break;
	case RTRS_CLT_LINK_EV_SERVER_SESSION:
		atomic_store(&ev_srv_paths_up, atomic_load(&paths_live));
		atomic_store(&ev_srv_ups, atomic_load(&ev_up));
		atomic_fetch_add(&ev_srv, 1);
		break;
	}
}

static void path_ev(void *priv, unsigned idx, int up)
{
	(void)priv;
	atomic_fetch_add(&paths_live, up ? 1 : -1);
	if (idx == 0)
		atomic_fetch_add(up ? &path_up : &path_down, 1);
}

/* One request, waited for; the submit error or the completion's. */
static int io(enum rtrs_dir dir, uint64_t off, void *buf, size_t len)
{
	struct test_hdr h = { .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = off,
			      .len = (uint32_t)len };

	return test_request(sess, dir, &h, sizeof(h), buf, len);
}

static bool verified_io(uint8_t seed)
{
	static uint8_t w[8192], r[8192];

	memset(w, seed, sizeof(w));
	memset(r, 0, sizeof(r));
	return io(RTRS_WRITE, 4096, w, sizeof(w)) == 0 && io(RTRS_READ, 4096, r, sizeof(r)) == 0 &&
	       !memcmp(w, r, sizeof(w));
}

static const char *state(void)
{
	static struct rtrs_path_stats st;

	st.size = sizeof(st);
	rtrs_clt_path_stats(sess, 0, &st);
	return st.state;
}

struct waiter {
	pthread_t thr;
	atomic_int rc;      /* 1 while the write waits: the main thread looks */
	uint64_t ms;
};

static void *write_waiting(void *arg)
{
	struct waiter *w = arg;
	static uint8_t buf[4096];
	uint64_t t0 = test_now_ms();
	int rc;

	memset(buf, 0x5A, sizeof(buf));
	rc = io(RTRS_WRITE, 65536, buf, sizeof(buf));
	w->ms = test_now_ms() - t0;
	atomic_store(&w->rc, rc);
	return NULL;
}

/*
 * A request sent while the path is closing after a failure (it reconnects
 * next): the window is held open by the log sink, which clt_path_stop calls in
 * it when it fails the path's requests over ("... wait for this path to be
 * fenced"); the sink lets the probe send its request, then returns.
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool armed, open, sent;
	int rc;             /* the probe's rtrs_clt_request */
} closing = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void log_sink(void *priv, int level, const char *line)
{
	struct timespec dl;

	(void)priv;
	(void)level;
	fprintf(stderr, "%s\n", line);
	if (!strstr(line, "wait for this path to be fenced"))
		return;
	pthread_mutex_lock(&closing.lock);
	if (closing.armed) {
		closing.armed = false;
		closing.open = true;
		pthread_cond_broadcast(&closing.cond);
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += 5;
		while (!closing.sent &&
		       pthread_cond_timedwait(&closing.cond, &closing.lock, &dl) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&closing.lock);
}

struct aio {
	struct rtrs_permit *permit;
	struct test_hdr hdr;
	uint8_t buf[4096];
	atomic_int err;     /* 1 until conf */
};

static void aio_conf(void *priv, int err)
{
	atomic_store(&((struct aio *)priv)->err, err);
}

/* Sends a write of buf at off without waiting: rtrs_clt_request's result. */
static int aio_write(struct aio *a, uint64_t off)
{
	struct rtrs_clt_req_ops ops = { .priv = a, .conf = aio_conf };
	struct iovec usr = { &a->hdr, sizeof(a->hdr) }, data = { a->buf, sizeof(a->buf) };

	a->hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = off,
				    .len = sizeof(a->buf) };
	atomic_store(&a->err, 1);
	return rtrs_clt_request(sess, RTRS_WRITE, &ops, a->permit, &usr, 1, &data, 1);
}

static bool aio_done(struct aio *a, unsigned ms)
{
	uint64_t end = test_now_ms() + ms;

	while (atomic_load(&a->err) == 1 && test_now_ms() < end)
		usleep(1000);
	return atomic_load(&a->err) != 1;
}

static struct aio probe_io;

static void *closing_probe(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&closing.lock);
	while (!closing.open)
		pthread_cond_wait(&closing.cond, &closing.lock);
	pthread_mutex_unlock(&closing.lock);
	memset(probe_io.buf, 0x6B, sizeof(probe_io.buf));
	int rc = aio_write(&probe_io, 131072);

	pthread_mutex_lock(&closing.lock);
	closing.rc = rc;
	closing.sent = true;
	pthread_cond_broadcast(&closing.cond);
	pthread_mutex_unlock(&closing.lock);
	return NULL;
}

static int start_server(int port, struct proc *srv)
{
	char p[16], a_port[] = "--port", a_hb[] = "--hb-interval", hb[] = "200";
	char *argv[] = { (char *)test_server_path(), a_port, p, a_hb, hb, NULL };

	snprintf(p, sizeof(p), "%d", port);
	return proc_spawn_server(argv, srv);
}

/* A server that holds each IO for a second before it answers. */
static int start_server_slow(struct proc *srv)
{
	char a_port[] = "--port", p[] = "0", a_hb[] = "--hb-interval", hb[] = "200";
	char a_async[] = "--async", a_delay[] = "--delay-us", delay[] = "1000000";
	char *argv[] = { (char *)test_server_path(), a_port, p, a_hb, hb, a_async, a_delay,
			 delay, NULL };

	return proc_spawn_server(argv, srv);
}

int main(void)
{
	struct rtrs_path_stats st = { .size = sizeof(st) };
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	struct proc srv;
	char dst[96];
	uint8_t b[16];
	int rc, port;

	/* Info lines too: the sink watches for one of them (2b). */
	rtrs_set_log_level(2);
	rtrs_set_log_fn(log_sink, NULL);
	if (start_server(0, &srv))
		return 1;
	port = srv.port;
	proc_dst(&srv, dst, sizeof(dst));
	path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	test_clt_tls(&o);
	o.sessname = "test-reconnect";
	o.provider = test_provider();
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 1;
	o.hb_interval_ms = 200;
	o.reconnect_delay_ms = 200;
	o.reconnect_jitter_ms = 100;
	o.fast_io_fail_ms = 8000;
	o.link_ev = link_ev;
	o.path_ev = path_ev;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		proc_signal(&srv, SIGKILL, true);
		return test_done("test-reconnect");
	}
	CHECK(verified_io(0x11), "IO before the server dies");

	/* 1. Server killed, then restarted on the same port. */
	atomic_store(&paths_live, 1); /* rtrs_clt_open's path had no event */
	proc_signal(&srv, SIGKILL, true);
	CHECK(test_wait_path(sess, 0, "reconnecting", 3000), "path state %s after the kill", state());
	CHECK_EQ(atomic_load(&ev_down), 1);
	CHECK_EQ(atomic_load(&ev_srv), 0);
	/* No path up, one on its way: a request waits for it. */
	struct waiter w = { .rc = 1 };

	pthread_create(&w.thr, NULL, write_waiting, &w);
	usleep(700 * 1000); /* a few attempts fail while nothing listens */
	CHECK_EQ(atomic_load(&w.rc), 1);
	CHECK_EQ(start_server(port, &srv), 0);
	CHECK(test_wait_path(sess, 0, "connected", 10000), "path state %s after the restart", state());
	pthread_join(w.thr, NULL);
	CHECK(w.rc == 0, "the waiting write completed: %s", strerror(-w.rc));
	CHECK(w.ms >= 600, "it waited %llu ms for the path", (unsigned long long)w.ms);
	/* The new server session: told once, before the path was up and before RECONNECTED. */
	CHECK_EQ(atomic_load(&ev_srv), 1);
	CHECK_EQ(atomic_load(&ev_srv_paths_up), 0);
	CHECK_EQ(atomic_load(&ev_srv_ups), 0);
	{
		struct rtrs_attrs a = { .size = sizeof(a) };

		CHECK_EQ(rtrs_clt_query(sess, &a), 0);
		CHECK_EQ(a.server_sessions, 2);
	}
	CHECK_EQ(atomic_load(&ev_up), 1);
	CHECK_EQ(atomic_load(&path_down), 1);
	CHECK_EQ(atomic_load(&path_up), 1);
	memset(b, 0, sizeof(b));
	CHECK_EQ(io(RTRS_READ, 65536, b, sizeof(b)), 0);
	CHECK(b[0] == 0x5A && b[15] == 0x5A, "the waiting write reached the new server");
	CHECK(verified_io(0x22), "verified IO after the reconnect");
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK_EQ(st.reconnects, 1);
	CHECK(st.reconnect_failures >= 1, "failed attempts while the server was down: %llu",
	      (unsigned long long)st.reconnect_failures);

	/* 2. A path the user disconnects stays closed; reconnecting brings it back. */
	CHECK_EQ(rtrs_clt_disconnect_path(sess, 0), 0);
	CHECK(!strcmp(state(), "closed"), "state %s after disconnect", state());
	usleep(600 * 1000);
	CHECK(!strcmp(state(), "closed"), "no automatic reconnect after disconnect: %s", state());
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 0), 0);
	CHECK(test_wait_path(sess, 0, "connected", 5000), "state %s after a manual reconnect", state());
	CHECK(verified_io(0x33), "verified IO after the manual reconnect");
	/* The session's only path went: the server dropped the session, this is a new one. */
	CHECK_EQ(atomic_load(&ev_srv), 2);
	rtrs_clt_close(sess);
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);

	/*
	 * 2b. A request sent while the path is closing after its failure
	 * waits for it like one sent while it reconnects, instead of failing
	 * for want of a path (-ECONNABORTED). The server holds each IO for a
	 * second, so a write is in flight when it dies and clt_path_stop fails it
	 * over, logging while the path is closing: the sink holds the window
	 * open while the probe sends.
	 */
	struct aio held = { 0 };
	pthread_t prober;

	CHECK_EQ(start_server_slow(&srv), 0);
	port = srv.port;
	proc_dst(&srv, dst, sizeof(dst));
	CHECK_EQ(rtrs_clt_open(&o, &sess), 0);
	if (!sess)
		return test_done("test-reconnect");
	held.permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	probe_io.permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	memset(held.buf, 0x3C, sizeof(held.buf));
	CHECK_EQ(aio_write(&held, 196608), 0);
	usleep(200 * 1000); /* at the server, held there */
	pthread_mutex_lock(&closing.lock);
	closing.armed = true;
	pthread_mutex_unlock(&closing.lock);
	pthread_create(&prober, NULL, closing_probe, NULL);
	proc_signal(&srv, SIGKILL, true);
	pthread_mutex_lock(&closing.lock);
	for (uint64_t end = test_now_ms() + 5000; !closing.sent && test_now_ms() < end;) {
		pthread_mutex_unlock(&closing.lock);
		usleep(1000);
		pthread_mutex_lock(&closing.lock);
	}
	if (!closing.open) { /* the window never came: let the probe go */
		closing.armed = false;
		closing.open = true;
		pthread_cond_broadcast(&closing.cond);
	}
	pthread_mutex_unlock(&closing.lock);
	pthread_join(prober, NULL);
	CHECK(closing.sent, "the path closed with a write in flight, and the probe sent");
	CHECK(closing.rc == 0, "a write sent while the path was closing waits for it: %s",
	      strerror(-closing.rc));
	CHECK_EQ(start_server(port, &srv), 0);
	CHECK(test_wait_path(sess, 0, "connected", 10000), "path state %s after the restart", state());
	CHECK(aio_done(&held, 10000) && atomic_load(&held.err) == 0,
	      "the write in flight failed over to the new server: %d", atomic_load(&held.err));
	if (closing.rc == 0)
		CHECK(aio_done(&probe_io, 10000) && atomic_load(&probe_io.err) == 0,
		      "the write sent while closing reached the new server: %d",
		      atomic_load(&probe_io.err));
	memset(b, 0, sizeof(b));
	CHECK_EQ(io(RTRS_READ, 131072, b, sizeof(b)), 0);
	CHECK(b[0] == 0x6B && b[15] == 0x6B, "its data is there");
	memset(b, 0, sizeof(b));
	CHECK_EQ(io(RTRS_READ, 196608, b, sizeof(b)), 0);
	CHECK(b[0] == 0x3C && b[15] == 0x3C, "and so is the other's");
	rtrs_clt_put_permit(sess, held.permit);
	rtrs_clt_put_permit(sess, probe_io.permit);
	rtrs_clt_close(sess);
	sess = NULL;
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);

	/* 3. Bounded attempts: two failures and the path stays closed. */
	CHECK_EQ(start_server(0, &srv), 0);
	proc_dst(&srv, dst, sizeof(dst));
	path.dst = dst;
	o.max_reconnect_attempts = 2;
	o.fast_io_fail_ms = 300;
	/*
	 * Attempts far apart, so the request below meets a path still
	 * reconnecting: with 200 ms both had failed before it was sent, once,
	 * in a guest on a machine with both CPUs busy.
	 */
	o.reconnect_delay_ms = 2000;
	o.link_ev = NULL;
	CHECK_EQ(rtrs_clt_open(&o, &sess), 0);
	if (!sess)
		return test_done("test-reconnect");
	port = srv.port;
	/* While it still reconnects, a request waits out fast_io_fail_ms. */
	proc_signal(&srv, SIGKILL, true);
	CHECK(test_wait_path(sess, 0, "reconnecting", 3000), "state %s after the kill", state());
	uint64_t t0 = test_now_ms();

	CHECK_EQ(io(RTRS_WRITE, 0, b, sizeof(b)), -ETIMEDOUT);
	CHECK(test_now_ms() - t0 >= 250 && test_now_ms() - t0 < 3000,
	      "failed after %llu ms (bound 300)", (unsigned long long)(test_now_ms() - t0));
	CHECK(test_wait_path(sess, 0, "closed", 10000), "state %s after two failed attempts", state());
	/* Every path closed for good: no waiting. */
	t0 = test_now_ms();
	CHECK_EQ(io(RTRS_WRITE, 0, b, sizeof(b)), -ECONNABORTED);
	CHECK(test_now_ms() - t0 < 200, "failed after %llu ms",
	      (unsigned long long)(test_now_ms() - t0));
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK_EQ(st.reconnect_failures, 2);
	usleep(800 * 1000);
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK_EQ(st.reconnect_failures, 2);
	CHECK_EQ(start_server(port, &srv), 0);
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 0), 0);
	CHECK(test_wait_path(sess, 0, "connected", 5000), "state %s after a manual reconnect", state());
	CHECK(verified_io(0x44), "verified IO after the manual reconnect");
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 7), -ENOENT);
	CHECK_EQ(rtrs_clt_disconnect_path(sess, 7), -ENOENT);
	rtrs_clt_close(sess);

	/* 4. Loss timeout: unlimited attempts, but closed after 700 ms down. */
	o.max_reconnect_attempts = -1;
	o.reconnect_delay_ms = 200;
	o.reconnect_loss_timeout_ms = 700;
	CHECK_EQ(rtrs_clt_open(&o, &sess), 0);
	if (!sess)
		return test_done("test-reconnect");
	/* Before the kill: the path may notice it before the kill is reaped. */
	uint64_t t_kill = test_now_ms();

	proc_signal(&srv, SIGKILL, true);
	CHECK(test_wait_path(sess, 0, "closed", 5000), "state %s after the loss timeout", state());
	CHECK(test_now_ms() - t_kill >= 600, "closed after %llu ms (loss timeout 700)",
	      (unsigned long long)(test_now_ms() - t_kill));
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK(!strcmp(st.reconnect_verdict, "loss timeout"), "verdict: %s", st.reconnect_verdict);
	/* Attempts 200-300 ms apart: two at least, unless a busy machine slowed them. */
	CHECK(st.reconnect_failures >= 1, "%llu attempts before giving up",
	      (unsigned long long)st.reconnect_failures);
	rtrs_clt_close(sess);
	CHECK_EQ(start_server(port, &srv), 0);
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);

	/*
	 * 5. Two paths (from two addresses of this host). Path 0 reconnecting
	 * while path 1 keeps the server session is no new session; a server
	 * restart under both is one, told once though two paths reach it.
	 */
	struct rtrs_path_addr two[2];
	struct rtrs_attrs a = { .size = sizeof(a) };

	CHECK_EQ(start_server(0, &srv), 0);
	port = srv.port;
	proc_dst(&srv, dst, sizeof(dst));
	two[0] = (struct rtrs_path_addr){ .src = test_addr_n(1), .dst = dst };
	two[1] = (struct rtrs_path_addr){ .src = test_addr_n(2), .dst = dst };
	o.paths = two;
	o.paths_num = 2;
	o.reconnect_loss_timeout_ms = 0;
	o.fast_io_fail_ms = 8000;
	o.link_ev = link_ev;
	atomic_store(&ev_srv, 0);
	atomic_store(&ev_up, 0);
	atomic_store(&paths_live, 0);
	CHECK_EQ(rtrs_clt_open(&o, &sess), 0);
	if (!sess)
		return test_done("test-reconnect");
	atomic_store(&paths_live, 2); /* the paths rtrs_clt_open connected have no event */
	CHECK_EQ(rtrs_clt_disconnect_path(sess, 0), 0);
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 0), 0);
	CHECK(test_wait_path(sess, 0, "connected", 5000), "path 0: %s after a reconnect", state());
	CHECK(verified_io(0x55), "verified IO over both paths");
	CHECK_EQ(atomic_load(&ev_srv), 0);
	CHECK_EQ(rtrs_clt_query(sess, &a), 0);
	CHECK_EQ(a.server_sessions, 1);
	proc_signal(&srv, SIGKILL, true);
	CHECK(test_wait_path(sess, 0, "reconnecting", 3000), "path 0: %s after the kill", state());
	CHECK(test_wait_path(sess, 1, "reconnecting", 3000), "path 1 after the kill");
	CHECK_EQ(start_server(port, &srv), 0);
	CHECK(test_wait_path(sess, 0, "connected", 10000), "path 0: %s after the restart", state());
	CHECK(test_wait_path(sess, 1, "connected", 10000), "path 1 after the restart");
	CHECK(verified_io(0x66), "verified IO after the restart");
	CHECK_EQ(atomic_load(&ev_srv), 1);
	CHECK_EQ(atomic_load(&ev_srv_paths_up), 0);
	CHECK_EQ(rtrs_clt_query(sess, &a), 0);
	CHECK_EQ(a.server_sessions, 2);
	rtrs_clt_close(sess);
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-reconnect");
}
