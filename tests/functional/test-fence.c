/* SPDX-License-Identifier: MIT */
/*
 * Write fencing (docs/protocol.md section 10). Two paths; the server is a
 * slow device: it holds every write 600 ms and stores it only then.
 *   1. W1 (0x11) goes out on path 0; the client fails path 0 while the
 *      server still holds W1.
 *   2. W1 must not be re-issued before the server has fenced path 0 (its
 *      held copy answered): it completes once, successfully, after the
 *      fence.
 *   3. W2 (0x22) to the same range completes after it.
 *   4. Reading back gives 0x22: the stale copy of W1 did not land after W2.
 * Without fencing the re-issued W1 collides with the held one on the
 * server (its chunk is busy) or lands after W2, and this test fails.
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

#define LEN TEST_AIO_LEN

static struct rtrs_clt_sess *sess;

int main(void)
{
	char a_port[] = "--port", a_zero[] = "0", a_async[] = "--async", a_delay[] = "--delay-us";
	char delay[] = "600000", a_late[] = "--apply-late";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_async, a_delay, delay,
			 a_late, NULL };
	struct rtrs_path_addr paths[2];
	struct rtrs_clt_opts o;
	static struct test_aio w1, w2, r;
	struct rtrs_path_stats st = { .size = sizeof(st) };
	struct proc srv;
	char dst[96];
	uint64_t t0;
	int rc;

	if (proc_spawn_server(argv, &srv))
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	paths[0] = (struct rtrs_path_addr){ .src = test_addr_n(1), .dst = dst };
	paths[1] = (struct rtrs_path_addr){ .src = test_addr_n(2), .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	test_clt_tls(&o);
	o.sessname = "test-fence";
	o.provider = test_provider();
	o.paths = paths;
	o.paths_num = 2;
	o.nr_io_cons = 1;
	o.mp_policy = RTRS_MP_POLICY_RR; /* the first request takes path 0 */
	o.fast_io_fail_ms = 10000;
	o.reconnect_delay_ms = 100;
	o.reconnect_jitter_ms = 50;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out;
	w1.permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	w2.permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	r.permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);

	/* 1. W1 on path 0, held by the server; then path 0 fails. */
	t0 = test_now_ms();
	CHECK_EQ(test_aio_start(sess, &w1, RTRS_WRITE, 0x11), 0);
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK_EQ(st.inflight, 1);
	usleep(100 * 1000);
	CHECK_EQ(rtrs_clt_reconnect_path(sess, 0), 0); /* fails the path with W1 in flight */

	/* 2. W1 completes once, successfully, and only after the fence. */
	CHECK(test_aio_wait(&w1, 8000), "W1 completed");
	CHECK_EQ(atomic_load(&w1.err), 0);
	CHECK(w1.t_done - t0 >= 600, "W1 completed after %llu ms, before the held copy was done",
	      (unsigned long long)(w1.t_done - t0));

	/* 3. W2, newer, same range. */
	CHECK_EQ(test_aio_start(sess, &w2, RTRS_WRITE, 0x22), 0);
	CHECK(test_aio_wait(&w2, 8000), "W2 completed");
	CHECK_EQ(atomic_load(&w2.err), 0);

	/* 4. Give any stale copy time to land, then read: W2's bytes survive. */
	usleep(800 * 1000);
	CHECK_EQ(test_aio_start(sess, &r, RTRS_READ, 0), 0);
	CHECK(test_aio_wait(&r, 8000), "read completed");
	CHECK_EQ(atomic_load(&r.err), 0);
	CHECK(r.buf[0] == 0x22 && r.buf[LEN - 1] == 0x22, "read %#x: the newer write was lost",
	      r.buf[0]);
	usleep(100 * 1000);
	CHECK_EQ(atomic_load(&w1.calls), 1);
	CHECK_EQ(atomic_load(&w2.calls), 1);
	rtrs_clt_path_stats(sess, 0, &st);
	CHECK_EQ(st.failovers, 1);

	rtrs_clt_put_permit(sess, w1.permit);
	rtrs_clt_put_permit(sess, w2.permit);
	rtrs_clt_put_permit(sess, r.permit);
	rtrs_clt_close(sess);
out:
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-fence");
}
