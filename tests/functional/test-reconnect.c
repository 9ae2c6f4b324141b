/* SPDX-License-Identifier: MIT */
/*
 * Reconnect:
 *   - the server is killed: the path goes to "reconnecting", requests fail
 *     at once (no path), link event DISCONNECTED; the server is restarted on
 *     the same port: the path comes back by itself (RECONNECTED) and
 *     verified IO runs again;
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
static atomic_int ev_up, ev_down;

static atomic_int path_up, path_down;

static void link_ev(void *priv, enum rtrs_clt_link_ev ev)
{
	atomic_fetch_add(ev == RTRS_CLT_LINK_EV_RECONNECTED ? &ev_up : &ev_down, 1);
}

static void path_ev(void *priv, unsigned idx, int up)
{
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

static int start_server(int port, struct proc *srv)
{
	char p[16], a_port[] = "--port", a_hb[] = "--hb-interval", hb[] = "200";
	char *argv[] = { (char *)test_server_path(), a_port, p, a_hb, hb, NULL };

	snprintf(p, sizeof(p), "%d", port);
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

	if (start_server(0, &srv))
		return 1;
	port = srv.port;
	proc_dst(&srv, dst, sizeof(dst));
	path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
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
	proc_signal(&srv, SIGKILL, true);
	CHECK(test_wait_path(sess, 0, "reconnecting", 3000), "path state %s after the kill", state());
	CHECK_EQ(atomic_load(&ev_down), 1);
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
	proc_signal(&srv, SIGKILL, true);
	uint64_t t_kill = test_now_ms();

	CHECK(test_wait_path(sess, 0, "closed", 5000), "state %s after the loss timeout", state());
	CHECK(test_now_ms() - t_kill >= 600, "closed after %llu ms (loss timeout 700)",
	      (unsigned long long)(test_now_ms() - t_kill));
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK(st.reconnect_failures >= 2, "%llu attempts before giving up",
	      (unsigned long long)st.reconnect_failures);
	rtrs_clt_close(sess);
	CHECK_EQ(start_server(port, &srv), 0);
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-reconnect");
}
