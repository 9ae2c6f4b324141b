/* SPDX-License-Identifier: MIT */
/*
 * Permits and closing:
 *   - NOWAIT gets every permit then NULL; WAIT blocks until a put;
 *   - closing a session with requests held by the server completes every
 *     one exactly once with ECONNABORTED before rtrs_clt_close returns, and
 *     a thread waiting for a permit wakes with NULL.
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

#define QD 32

static struct rtrs_clt_sess *sess;
static struct rtrs_permit *permits[QD];

struct io {
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	char buf[512];
	atomic_int calls;
	atomic_int err;
};
static struct io ios[QD];

static void conf(void *priv, int err)
{
	struct io *io = priv;

	atomic_store(&io->err, err);
	atomic_fetch_add(&io->calls, 1);
}

static atomic_bool waiter_done;
static struct rtrs_permit *waiter_got;

static void *waiter(void *arg)
{
	waiter_got = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	atomic_store(&waiter_done, true);
	return NULL;
}

int main(void)
{
	char qd[8], a_port[] = "--port", a_zero[] = "0", a_qd[] = "--queue-depth";
	char a_async[] = "--async", a_delay[] = "--delay-us", delay[] = "300000";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_qd, qd, a_async, a_delay,
			 delay, NULL };
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	struct proc srv;
	pthread_t thr;
	char dst[32];
	int rc;

	snprintf(qd, sizeof(qd), "%d", QD);
	if (proc_spawn_server(argv, &srv))
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.provider = test_provider();
	o.sessname = "test-close";
	o.paths = &path;
	o.paths_num = 1;
	rc = rtrs_clt_open(&o, &sess);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc)
		goto out;

	/* Every permit, then none; ids are distinct and in range. */
	unsigned seen = 0;

	for (int i = 0; i < QD; i++) {
		permits[i] = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT);
		CHECK(permits[i] != NULL);
		if (permits[i] && rtrs_permit_id(permits[i]) < QD)
			seen |= 1u << rtrs_permit_id(permits[i]);
	}
	CHECK_EQ(seen, (unsigned)((1ull << QD) - 1));
	errno = 0;
	CHECK(rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT) == NULL);
	CHECK(errno == EAGAIN, "none free: errno %d, not EAGAIN", errno);

	/* A double put is refused: it must not make a phantom permit. */
	rtrs_clt_put_permit(sess, permits[0]);
	rtrs_clt_put_permit(sess, permits[0]);
	permits[0] = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT);
	CHECK(permits[0] != NULL);
	CHECK(rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_NOWAIT) == NULL,
	      "a second get after a double put finds nothing");

	/* WAIT blocks until a permit comes back. */
	pthread_create(&thr, NULL, waiter, NULL);
	usleep(100 * 1000);
	CHECK(!atomic_load(&waiter_done), "WAIT returned with no permit free");
	rtrs_clt_put_permit(sess, permits[QD - 1]);
	pthread_join(thr, NULL);
	CHECK(waiter_got == permits[QD - 1]);
	permits[QD - 1] = waiter_got;

	/* Requests the server holds for 300 ms, then close at once. */
	for (int i = 0; i < QD - 1; i++) {
		struct iovec usr = { &ios[i].hdr, sizeof(ios[i].hdr) };
		struct iovec data = { ios[i].buf, sizeof(ios[i].buf) };

		ios[i].hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO,
						.offset = (uint64_t)i * 512, .len = 512 };
		ios[i].ops = (struct rtrs_clt_req_ops){ .priv = &ios[i], .conf = conf };
		CHECK_EQ(rtrs_clt_request(sess, RTRS_WRITE, &ios[i].ops, permits[i], &usr, 1,
					  &data, 1), 0);
	}
	/* One more thread waits for a permit while the session closes. */
	atomic_store(&waiter_done, false);
	waiter_got = permits[0];
	pthread_create(&thr, NULL, waiter, NULL);
	usleep(50 * 1000);
	rtrs_clt_close(sess);
	pthread_join(thr, NULL);
	CHECK(waiter_got == NULL, "a permit waiter wakes with NULL on close");
	for (int i = 0; i < QD - 1; i++) {
		CHECK_EQ(atomic_load(&ios[i].calls), 1);
		CHECK_EQ(atomic_load(&ios[i].err), -ECONNABORTED);
	}
	/* Nothing completes after close returned. */
	usleep(400 * 1000);
	for (int i = 0; i < QD - 1; i++)
		CHECK_EQ(atomic_load(&ios[i].calls), 1);
out:
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-close");
}
