/* SPDX-License-Identifier: MIT */
/*
 * rtrs_clt_shutdown_all: a stopping program's sessions stop waiting for
 * servers that do not answer. Set up first, then one shutdown (it is for
 * good, for the process):
 *   - session A to a server frozen with SIGSTOP, with fast_io_fail_ms at
 *     600 s: every permit's request on the wire unanswered, and a thread
 *     waiting for a permit;
 *   - an open in progress to a listener that accepts TCP and never answers
 *     (connect timeout 60 s), and a path being added to session C there;
 * after the shutdown, within 2 s: every request completes once with
 * -ECONNABORTED, the permit waiter gets NULL, the open and the path add
 * fail with -ESHUTDOWN; a new request is refused with -ESHUTDOWN; closing
 * each session takes less than a second; a new open fails at once with
 * -ESHUTDOWN.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "rtrs.h"
#include "test-proto-hdr.h"

#define QD 16
#define BOUND_MS 2000 /* a second's work, with room for a loaded machine */

struct io {
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	char buf[512];
	atomic_int calls;
	atomic_int err;
	_Atomic uint64_t at_ms;
};
static struct io ios[QD];

static void conf(void *priv, int err)
{
	struct io *io = priv;

	atomic_store(&io->err, err);
	atomic_store(&io->at_ms, test_now_ms());
	atomic_fetch_add(&io->calls, 1);
}

static struct rtrs_clt_sess *sess_a, *sess_c;
static char silent_dst[64];

static struct rtrs_permit *waiter_got = (struct rtrs_permit *)1;
static _Atomic uint64_t waiter_ms;

static void *waiter(void *arg)
{
	waiter_got = rtrs_clt_get_permit(sess_a, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	atomic_store(&waiter_ms, test_now_ms());
	return NULL;
}

static int open_to(const char *name, const char *dst, unsigned connect_ms,
		   struct rtrs_clt_sess **out)
{
	struct rtrs_path_addr path = { .dst = dst };
	struct rtrs_clt_opts o;

	rtrs_clt_opts_init(&o, sizeof(o));
	o.provider = test_provider();
	o.sessname = name;
	o.paths = &path;
	o.paths_num = 1;
	o.nr_io_cons = 1;
	o.connect_timeout_ms = connect_ms;
	o.fast_io_fail_ms = 600000;
	return rtrs_clt_open(&o, out);
}

static int silent_open_rc = 1;
static _Atomic uint64_t silent_open_ms;

static void *silent_opener(void *arg)
{
	struct rtrs_clt_sess *s = NULL;

	silent_open_rc = open_to("test-shutdown-b", silent_dst, 60000, &s);
	atomic_store(&silent_open_ms, test_now_ms());
	if (!silent_open_rc)
		rtrs_clt_close(s);
	return NULL;
}

static int add_rc = 1;
static _Atomic uint64_t add_ms;

static void *path_adder(void *arg)
{
	struct rtrs_path_addr path = { .dst = silent_dst };
	unsigned idx;

	add_rc = rtrs_clt_add_path(sess_c, &path, &idx);
	atomic_store(&add_ms, test_now_ms());
	return NULL;
}

/* Whether every thread of pid is stopped (SIGSTOP takes effect thread by thread). */
static bool all_stopped(pid_t pid)
{
	char path[320], line[512];
	struct dirent *e;
	bool all = true;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	d = opendir(path);
	if (!d)
		return false;
	while (all && (e = readdir(d))) {
		char *p;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue; /* gone */
		p = fgets(line, sizeof(line), f) ? strrchr(line, ')') : NULL;
		all = p && p[1] == ' ' && p[2] == 'T';
		fclose(f);
	}
	closedir(d);
	return all;
}

/* A listener that accepts TCP (the kernel does) and never says a word. */
static int silent_listener(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	inet_pton(AF_INET, test_addr(), &a.sin_addr);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 64) ||
	    getsockname(fd, (struct sockaddr *)&a, &len)) {
		close(fd);
		return -1;
	}
	snprintf(silent_dst, sizeof(silent_dst), "%s:%u", test_addr(), ntohs(a.sin_port));
	return fd;
}

int main(void)
{
	char qd[8], a_port[] = "--port", a_zero[] = "0", a_qd[] = "--queue-depth";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_qd, qd, NULL };
	struct rtrs_permit *permits[QD];
	pthread_t thr_wait, thr_open, thr_add;
	struct rtrs_clt_sess *late = NULL;
	uint64_t t0, t;
	struct proc srv;
	char dst[32];
	int rc, lfd;

	if (strcmp(test_provider(), "tcp")) {
		printf("SKIP: the silent listener is a TCP one (provider %s)\n", test_provider());
		return 77;
	}
	if (getenv("TEST_LOG"))
		rtrs_set_log_level(3);
	lfd = silent_listener();
	CHECK(lfd >= 0, "a silent listener: %s", strerror(errno));
	snprintf(qd, sizeof(qd), "%d", QD);
	if (lfd < 0 || proc_spawn_server(argv, &srv))
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	rc = open_to("test-shutdown-a", dst, 10000, &sess_a);
	CHECK(rc == 0, "open A: %s", strerror(-rc));
	rc = rc ? rc : open_to("test-shutdown-c", dst, 60000, &sess_c);
	CHECK(rc == 0, "open C: %s", strerror(-rc));
	if (rc)
		goto out;

	/* The server stops answering; every permit's request goes out to it. */
	kill(srv.pid, SIGSTOP);
	for (t = test_now_ms(); !all_stopped(srv.pid) && test_now_ms() - t < 5000;)
		usleep(1000);
	CHECK(all_stopped(srv.pid), "the server is frozen");
	for (int i = 0; i < QD; i++) {
		struct iovec usr = { &ios[i].hdr, sizeof(ios[i].hdr) };
		struct iovec data = { ios[i].buf, sizeof(ios[i].buf) };

		permits[i] = rtrs_clt_get_permit(sess_a, RTRS_IO_CON, RTRS_PERMIT_NOWAIT);
		CHECK(permits[i] != NULL);
		if (!permits[i])
			continue;
		ios[i].hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO,
						.offset = (uint64_t)i * 512, .len = 512 };
		ios[i].ops = (struct rtrs_clt_req_ops){ .priv = &ios[i], .conf = conf };
		CHECK_EQ(rtrs_clt_request(sess_a, RTRS_WRITE, &ios[i].ops, permits[i], &usr, 1,
					  &data, 1), 0);
	}
	pthread_create(&thr_wait, NULL, waiter, NULL);
	pthread_create(&thr_open, NULL, silent_opener, NULL);
	pthread_create(&thr_add, NULL, path_adder, NULL);
	usleep(500 * 1000);
	CHECK(!atomic_load(&waiter_ms) && !atomic_load(&silent_open_ms) && !atomic_load(&add_ms),
	      "the waiter, the open and the path add wait");
	for (int i = 0; i < QD; i++)
		CHECK(atomic_load(&ios[i].calls) == 0, "request %d is answered by nobody", i);

	t0 = test_now_ms();
	rtrs_clt_shutdown_all();
	CHECK(test_now_ms() - t0 < 500, "rtrs_clt_shutdown_all returns at once (%llu ms)",
	      (unsigned long long)(test_now_ms() - t0));
	pthread_join(thr_wait, NULL);
	pthread_join(thr_open, NULL);
	pthread_join(thr_add, NULL);
	CHECK(waiter_got == NULL, "the permit waiter gets NULL");
	errno = 0;
	CHECK(rtrs_clt_get_permit(sess_a, RTRS_IO_CON, RTRS_PERMIT_NOWAIT) == NULL &&
	      errno == ECONNABORTED, "a NOWAIT get after the shutdown: NULL with ECONNABORTED "
	      "(errno %d), not EAGAIN: a caller that tries again would try for ever", errno);
	CHECK(atomic_load(&waiter_ms) - t0 < BOUND_MS, "... after %llu ms",
	      (unsigned long long)(atomic_load(&waiter_ms) - t0));
	CHECK(silent_open_rc == -ESHUTDOWN, "the open to the silent listener: %d", silent_open_rc);
	CHECK(atomic_load(&silent_open_ms) - t0 < BOUND_MS, "... gave up after %llu ms",
	      (unsigned long long)(atomic_load(&silent_open_ms) - t0));
	CHECK(add_rc == -ESHUTDOWN, "the path add to the silent listener: %d", add_rc);
	CHECK(atomic_load(&add_ms) - t0 < BOUND_MS, "... gave up after %llu ms",
	      (unsigned long long)(atomic_load(&add_ms) - t0));
	/* The requests: completed on the library's threads, each once. */
	for (int i = 0; i < QD; i++) {
		uint64_t end = t0 + BOUND_MS;

		while (!atomic_load(&ios[i].calls) && test_now_ms() < end)
			usleep(10 * 1000);
		CHECK(atomic_load(&ios[i].calls) == 1, "request %d completed once", i);
		CHECK(atomic_load(&ios[i].err) == -ECONNABORTED, "request %d: %d", i,
		      atomic_load(&ios[i].err));
		CHECK(atomic_load(&ios[i].at_ms) - t0 < BOUND_MS, "request %d after %llu ms", i,
		      (unsigned long long)(atomic_load(&ios[i].at_ms) - t0));
	}
	{
		uint64_t last = 0;

		for (int i = 0; i < QD; i++)
			if (atomic_load(&ios[i].at_ms) > last)
				last = atomic_load(&ios[i].at_ms);
		printf("after the shutdown: permit waiter %llu ms, open %llu ms, path add %llu ms, "
		       "last request %llu ms\n",
		       (unsigned long long)(atomic_load(&waiter_ms) - t0),
		       (unsigned long long)(atomic_load(&silent_open_ms) - t0),
		       (unsigned long long)(atomic_load(&add_ms) - t0),
		       (unsigned long long)(last - t0));
	}
	{
		struct iovec usr = { &ios[0].hdr, sizeof(ios[0].hdr) };

		CHECK_EQ(rtrs_clt_request(sess_a, RTRS_WRITE, &ios[0].ops, permits[0], &usr, 1,
					  NULL, 0), -ESHUTDOWN);
	}
	for (int i = 0; i < QD; i++)
		if (permits[i])
			rtrs_clt_put_permit(sess_a, permits[i]);
	t = test_now_ms();
	rtrs_clt_close(sess_a);
	rtrs_clt_close(sess_c);
	CHECK(test_now_ms() - t < 1000, "both sessions closed in %llu ms",
	      (unsigned long long)(test_now_ms() - t));
	t = test_now_ms();
	CHECK_EQ(open_to("test-shutdown-d", dst, 10000, &late), -ESHUTDOWN);
	CHECK(test_now_ms() - t < 500, "... refused at once (%llu ms)",
	      (unsigned long long)(test_now_ms() - t));
	for (int i = 0; i < QD; i++)
		CHECK(atomic_load(&ios[i].calls) == 1, "request %d: no second completion", i);
out:
	kill(srv.pid, SIGCONT);
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	close(lfd);
	return test_done("test-shutdown");
}
