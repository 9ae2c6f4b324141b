/* SPDX-License-Identifier: MIT */
/*
 * A peer that dies or freezes during IO:
 *   - server SIGKILLed with 64 IOs in flight: every IO completes once, with
 *     ECONNABORTED, quickly (the socket closes); later requests fail at once;
 *   - server SIGSTOPped: nothing on the wire says so; the heartbeat fails the
 *     path and every IO completes with ECONNABORTED within the bound
 *     hb_interval * (hb_missed + 1) plus scheduling slack;
 *   - client frozen: the server's heartbeat closes the path and reports the
 *     session down within the same bound.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rtrs.h"
#include "check.h"
#include "harness.h"
#include "test-proto-hdr.h"

#define HB_MS 200
#define HB_MISSED 3
#define QD 64
#define IO_SIZE 8192
/* Detection bound plus slack for a loaded 2-core machine. */
#define HB_BOUND_MS (HB_MS * (HB_MISSED + 1) + 1000)

static struct rtrs_clt_sess *sess;

struct io {
	struct rtrs_permit *permit;
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	uint8_t buf[IO_SIZE];
	atomic_int completions;
};

static struct io ios[QD];
static atomic_uint live, ok_count, err_count, wrong_err;
static atomic_uint_fast64_t last_err_ms;

static int submit(struct io *io)
{
	struct iovec usr = { &io->hdr, sizeof(io->hdr) };
	struct iovec data = { io->buf, IO_SIZE };
	unsigned slot = (unsigned)(io - ios);

	io->hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO,
				     .offset = (uint64_t)slot * IO_SIZE, .len = IO_SIZE };
	return rtrs_clt_request(sess, RTRS_WRITE, &io->ops, io->permit, &usr, 1, &data, 1);
}

static void conf(void *priv, int err)
{
	struct io *io = priv;

	atomic_fetch_add(&io->completions, 1);
	if (err) {
		atomic_fetch_add(&err_count, 1);
		if (err != -ECONNABORTED)
			atomic_fetch_add(&wrong_err, 1);
		atomic_store(&last_err_ms, test_now_ms());
		atomic_fetch_sub(&live, 1);
		return;
	}
	atomic_fetch_add(&ok_count, 1);
	if (submit(io)) {
		atomic_store(&last_err_ms, test_now_ms());
		atomic_fetch_sub(&live, 1);
	}
}

static int open_session(int port)
{
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	char dst[32];

	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), port);
	path = (struct rtrs_path_addr){ .dst = dst };
	rtrs_clt_opts_init(&o, sizeof(o));
	o.provider = test_provider();
	o.sessname = "test-peer-death";
	o.paths = &path;
	o.paths_num = 1;
	o.hb_interval_ms = HB_MS;
	o.hb_missed_max = HB_MISSED;
	o.fast_io_fail_ms = 0; /* what is checked here: failing at once */
	return rtrs_clt_open(&o, &sess);
}

/* Runs IO at QD until the server gets sig; checks how the IO ended. */
static void run(int sig, unsigned bound_ms)
{
	char hb[16], missed[16], a_port[] = "--port", a_zero[] = "0", a_async[] = "--async";
	char a_hb[] = "--hb-interval", a_missed[] = "--hb-missed";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_async, a_hb, hb,
			 a_missed, missed, NULL };
	struct proc srv;
	uint64_t t_sig, waited;
	unsigned total = 0;
	int rc;

	snprintf(hb, sizeof(hb), "%d", HB_MS);
	snprintf(missed, sizeof(missed), "%d", HB_MISSED);
	if (proc_spawn_server(argv, &srv)) {
		CHECK(0, "server did not start");
		return;
	}
	rc = open_session(srv.port);
	CHECK(rc == 0, "open: %s", strerror(-rc));
	if (rc) {
		proc_signal(&srv, SIGKILL, true);
		return;
	}
	atomic_store(&ok_count, 0);
	atomic_store(&err_count, 0);
	atomic_store(&wrong_err, 0);
	for (int i = 0; i < QD; i++) {
		ios[i].permit = rtrs_clt_get_permit(sess, RTRS_IO_CON, RTRS_PERMIT_WAIT);
		ios[i].ops = (struct rtrs_clt_req_ops){ .priv = &ios[i], .conf = conf };
		atomic_store(&ios[i].completions, 0);
		atomic_fetch_add(&live, 1);
		CHECK_EQ(submit(&ios[i]), 0);
	}
	usleep(500 * 1000);
	CHECK(atomic_load(&ok_count) > 0, "IO ran before the signal");
	t_sig = test_now_ms();
	proc_signal(&srv, sig, sig == SIGKILL);
	while (atomic_load(&live) && test_now_ms() - t_sig < 30000)
		usleep(1000);
	waited = atomic_load(&last_err_ms) - t_sig;
	CHECK_EQ(atomic_load(&live), 0);
	CHECK(waited <= bound_ms, "%s: last IO failed %llu ms after the signal (bound %u)",
	      strsignal(sig), (unsigned long long)waited, bound_ms);
	CHECK_EQ(atomic_load(&wrong_err), 0);
	CHECK(atomic_load(&err_count) >= 1, "some IO was in flight and failed");
	for (int i = 0; i < QD; i++) {
		/* Each IO ended exactly once with an error: ok completions resubmitted. */
		total += (unsigned)atomic_load(&ios[i].completions);
	}
	CHECK_EQ(total, atomic_load(&ok_count) + atomic_load(&err_count));
	/* No path: a new request fails synchronously. */
	CHECK_EQ(submit(&ios[0]), -ECONNABORTED);
	printf("%s: %u IOs done, %u failed with ECONNABORTED %llu ms after the signal\n",
	       strsignal(sig), atomic_load(&ok_count), atomic_load(&err_count),
	       (unsigned long long)waited);
	for (int i = 0; i < QD; i++)
		rtrs_clt_put_permit(sess, ios[i].permit);
	rtrs_clt_close(sess);
	if (sig == SIGSTOP) {
		proc_signal(&srv, SIGCONT, false);
		proc_signal(&srv, SIGKILL, true);
	}
}

/* ---- the server side: a frozen client ------------------------------------ */

static pthread_mutex_t ev_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int up_events, down_events;
static atomic_uint_fast64_t down_ms;

static int srv_rdma_ev(void *priv, struct rtrs_srv_op *id, enum rtrs_dir dir, void *data,
		       size_t datalen, const void *usr, size_t usrlen)
{
	rtrs_srv_resp_rdma(id, 0);
	return 0;
}

static int srv_link_ev(struct rtrs_srv_sess *s, enum rtrs_srv_link_ev ev, void *priv)
{
	pthread_mutex_lock(&ev_lock);
	if (ev == RTRS_SRV_LINK_EV_CONNECTED) {
		up_events++;
	} else {
		/* The time first: the test, seeing the count, reads it unlocked. */
		down_ms = test_now_ms();
		down_events++;
	}
	pthread_mutex_unlock(&ev_lock);
	return 0;
}

static void frozen_client(void)
{
	struct rtrs_srv_ops ops = { .rdma_ev = srv_rdma_ev, .link_ev = srv_link_ev };
	const char *perf = getenv("RTRS_PERF");
	struct rtrs_srv_opts so;
	struct rtrs_srv_ctx *srv;
	char dst[32], hb[16];
	uint64_t t_stop;
	pid_t pid;

	if (!perf || access(perf, X_OK))
		SKIP("RTRS_PERF does not name the rtrs-perf binary");
	rtrs_srv_opts_init(&so, sizeof(so));
	so.addr = test_addr();
	so.provider = test_provider();
	so.port = 0;
	so.queue_depth = 64;
	so.hb_interval_ms = HB_MS;
	so.hb_missed_max = HB_MISSED;
	CHECK_EQ(rtrs_srv_open(&ops, &so, &srv), 0);
	CHECK_EQ(rtrs_srv_wait_listening(srv, 5000), 0);
	snprintf(dst, sizeof(dst), "%s:%d", test_addr(), rtrs_srv_get_port(srv));
	snprintf(hb, sizeof(hb), "%d", HB_MS);
	pid = fork();
	if (pid == 0) {
		execl(perf, perf, "client", "--server", dst, "-t", "60", "-q", "4",
		      "--hb-interval", hb, "--provider", test_provider(), (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 5000 && !up_events; i++)
		usleep(1000);
	CHECK_EQ(up_events, 1);
	usleep(300 * 1000);
	t_stop = test_now_ms();
	kill(pid, SIGSTOP);
	for (int i = 0; i < 10000 && !down_events; i++)
		usleep(1000);
	CHECK_EQ(down_events, 1);
	CHECK(down_ms - t_stop <= HB_BOUND_MS, "server noticed after %llu ms",
	      (unsigned long long)(down_ms - t_stop));
	printf("frozen client: session down %llu ms after SIGSTOP\n",
	       (unsigned long long)(down_ms - t_stop));
	kill(pid, SIGKILL);
	kill(pid, SIGCONT);
	waitpid(pid, NULL, 0);
	rtrs_srv_close(srv);
}

int main(void)
{
	rtrs_set_log_level(0);
	run(SIGKILL, 1000);
	run(SIGSTOP, HB_BOUND_MS);
	frozen_client();
	return test_done("test-peer-death");
}
