/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "log.h"
#include "opts.h"

/*
 * The libraries read no environment: a test's RTRS_LOG_LEVEL is applied
 * here, before main, to librtrs and to this program's own copy of the log
 * state (librnbd's, in the RNBD tests). Tests that need a level set it
 * themselves afterwards.
 */
__attribute__((constructor)) static void test_log_level_from_env(void)
{
	const char *env = getenv("RTRS_LOG_LEVEL");
	int level;

	if (!env)
		return;
	level = opts_log_level("test", NULL, NULL, env, LOG_WARN);
	if (level < 0)
		exit(2);
	rtrs_set_log_level(level);
	g_log_level = level;
}

uint64_t test_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

struct test_wait {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	int err;
};

static void test_conf(void *priv, int err)
{
	struct test_wait *w = priv;

	pthread_mutex_lock(&w->lock);
	w->done = true;
	w->err = err;
	pthread_cond_signal(&w->cond);
	pthread_mutex_unlock(&w->lock);
}

int test_request(struct rtrs_clt_sess *s, enum rtrs_dir dir, const void *usr, size_t usr_len,
		 void *data, size_t data_len)
{
	struct test_wait w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, 0 };
	struct rtrs_clt_req_ops ops = { .priv = &w, .conf = test_conf };
	struct iovec u = { (void *)usr, usr_len }, d = { data, data_len };
	struct rtrs_permit *permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	int rc;

	if (!permit)
		return -ENOBUFS;
	rc = rtrs_clt_request(s, dir, &ops, permit, &u, 1, &d, data_len ? 1 : 0);
	if (!rc) {
		pthread_mutex_lock(&w.lock);
		while (!w.done)
			pthread_cond_wait(&w.cond, &w.lock);
		pthread_mutex_unlock(&w.lock);
		rc = w.err;
	}
	rtrs_clt_put_permit(s, permit);
	return rc;
}

static void test_aio_conf(void *priv, int err)
{
	struct test_aio *a = priv;

	a->t_done = test_now_ms();
	atomic_store(&a->err, err);
	atomic_fetch_add(&a->calls, 1);
}

int test_aio_start(struct rtrs_clt_sess *s, struct test_aio *a, enum rtrs_dir dir, uint8_t fill)
{
	struct iovec usr = { &a->hdr, sizeof(a->hdr) }, data = { a->buf, TEST_AIO_LEN };

	memset(a->buf, fill, TEST_AIO_LEN);
	a->hdr = (struct test_hdr){ .magic = TEST_MAGIC, .op = TEST_OP_IO, .offset = 0,
				    .len = TEST_AIO_LEN };
	a->ops = (struct rtrs_clt_req_ops){ .priv = a, .conf = test_aio_conf };
	atomic_store(&a->calls, 0);
	return rtrs_clt_request(s, dir, &a->ops, a->permit, &usr, 1, &data, 1);
}

bool test_aio_wait(struct test_aio *a, unsigned ms)
{
	uint64_t end = test_now_ms() + ms;

	while (!atomic_load(&a->calls) && test_now_ms() < end)
		usleep(1000);
	return atomic_load(&a->calls) > 0;
}

const char *test_provider(void)
{
	const char *p = getenv("RTRS_TEST_PROVIDER");

	return p && *p ? p : "tcp";
}

/* True inside an rtrs-vm guest (its init marks the kernel command line). */
static bool in_test_guest(void)
{
	char line[4096] = "";
	FILE *f = fopen("/proc/cmdline", "r");

	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = '\0';
		fclose(f);
	}
	return strstr(line, "rtrsvm.guest=1") != NULL;
}

/*
 * Tests talk to loopback, or to addresses that exist only inside rtrs-vm
 * guests: a guest-side setting on the host is refused, never followed.
 */
static const char *checked_addr(const char *what, const char *a)
{
	if (strncmp(a, "127.", 4) && strcmp(a, "::1") && strcmp(a, "localhost") &&
	    !in_test_guest()) {
		fprintf(stderr, "harness: %s=%s is not loopback and this is not an rtrs-vm guest: "
			"refusing to run a guest-side test on the host\n", what, a);
		exit(2);
	}
	return a;
}

const char *test_addr(void)
{
	const char *a = getenv("RTRS_TEST_ADDR");

	return a && *a ? checked_addr("RTRS_TEST_ADDR", a) : "127.0.0.1";
}

const char *test_addr_n(unsigned n)
{
	static const char *const var[] = { NULL, "RTRS_TEST_ADDR2", "RTRS_TEST_ADDR3" };
	static const char *const dflt[] = { NULL, "127.0.0.2", "127.0.0.3" };
	const char *a;

	if (n == 1)
		return test_addr();
	if (n < 1 || n > 3) {
		fprintf(stderr, "harness: test_addr_n(%u): only addresses 1 to 3 exist\n", n);
		exit(2);
	}
	a = getenv(var[n - 1]);
	if (a && *a)
		return checked_addr(var[n - 1], a);
	/* Loopback's defaults are no addresses of a guest's RDMA netdev. */
	if (strncmp(test_addr(), "127.", 4)) {
		fprintf(stderr, "harness: RTRS_TEST_ADDR=%s but %s is not set: this test needs "
			"another address of the same host\n", test_addr(), var[n - 1]);
		exit(2);
	}
	return dflt[n - 1];
}

void proc_dst(const struct proc *p, char *buf, size_t len)
{
	snprintf(buf, len, "%s:%d", p->host, p->port);
}

const char *test_server_path(void)
{
	const char *p = getenv("RTRS_TEST_SERVER");

	return p ? p : "./tests/functional/rtrs-test-server";
}

int proc_spawn_server(char *const argv_in[], struct proc *p)
{
	return proc_spawn_server_log(argv_in, p, NULL);
}

#define TEST_TLS_HOST "rtrs-test-tls"
#define TEST_TLS_SERVER "nqn.2026-11.io.rtrs:test-server"
#define TEST_TLS_SECRET "DHHC-1:00:LO8u2NM6dzYMKk5cNdu/JyuHVwHasEznfJE+2d3d/R1Dlfga:"
#define TEST_TLS_KEY "NVMeTLSkey-1:01:xVmrEyQwwzeG6rJsEnhZ+zWQDNO3AFMxa4iXBiO7z9md8hNw:"

static char tls_keys_path[64];

static void tls_keys_unlink(void)
{
	if (tls_keys_path[0])
		unlink(tls_keys_path);
}

bool test_tls(void)
{
	const char *e = getenv("RTRS_TEST_TLS");

	return e && (!strcmp(e, "1") || !strcmp(e, "concat"));
}

void test_clt_tls(struct rtrs_clt_opts *o)
{
	if (!test_tls())
		return;
	const char *e = getenv("RTRS_TEST_TLS");
	bool concat = !strcmp(e, "concat");

	o->tls = concat ? RTRS_TLS_CONCAT : RTRS_TLS_REQUIRED;
	o->tls_key = concat ? NULL : TEST_TLS_KEY;
	o->auth_secret = TEST_TLS_SECRET;
	o->auth_host_name = TEST_TLS_HOST;
	o->auth_server_name = TEST_TLS_SERVER;
}

/* The key file of RTRS_TEST_TLS's servers: written once, gone at exit. */
static const char *tls_keys_file(void)
{
	int fd;

	if (tls_keys_path[0])
		return tls_keys_path;
	snprintf(tls_keys_path, sizeof(tls_keys_path), "/tmp/rtrs-test-tls-XXXXXX");
	fd = mkstemp(tls_keys_path);
	if (fd < 0 || dprintf(fd, "%s %s tls=%s\n", TEST_TLS_HOST, TEST_TLS_SECRET,
			      TEST_TLS_KEY) < 0) {
		fprintf(stderr, "harness: TLS key file: %s\n", strerror(errno));
		exit(1);
	}
	close(fd);
	atexit(tls_keys_unlink);
	return tls_keys_path;
}

int proc_spawn_server_log(char *const argv_in[], struct proc *p, const char *err_path)
{
	const char *at = getenv("RTRS_TEST_SERVER_AT");
	char *argv[64], a_prov[] = "--provider", a_addr[] = "--addr";
	int fds[2], n = 0;
	char line[256];
	size_t used = 0;
	uint64_t deadline = test_now_ms() + 30000;

	memset(p, 0, sizeof(*p));
	if (at && *at) {
		const char *colon = strrchr(at, ':');

		checked_addr("RTRS_TEST_SERVER_AT", at);

		if (!colon || (size_t)(colon - at) >= sizeof(p->host))
			return -EINVAL;
		memcpy(p->host, at, (size_t)(colon - at));
		p->port = atoi(colon + 1);
		p->out_fd = -1;
		return 0;
	}
	snprintf(p->host, sizeof(p->host), "%s", test_addr());
	while (argv_in[n] && n < 54) {
		argv[n] = argv_in[n];
		n++;
	}
	argv[n++] = a_prov;
	argv[n++] = (char *)test_provider();
	argv[n++] = a_addr;
	argv[n++] = p->host;
	if (test_tls() && strstr(argv[0], "rtrs-test-server")) {
		static char a_keys[] = "--auth-keys", a_tls[] = "--tls", a_req[] = "required";
		bool own = false;

		for (int i = 1; i < n; i++)
			own |= !strcmp(argv[i], "--auth-keys");
		if (!own) {
			argv[n++] = a_keys;
			argv[n++] = (char *)tls_keys_file();
			argv[n++] = a_tls;
			argv[n++] = a_req;
		}
	}
	argv[n] = NULL;
	if (pipe(fds))
		return -errno;
	p->pid = fork();
	if (p->pid < 0)
		return -errno;
	if (p->pid == 0) {
		/* The server must not outlive a crashed test. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (err_path) {
			int efd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

			if (efd < 0 || dup2(efd, STDERR_FILENO) < 0) {
				fprintf(stderr, "harness: %s: %s\n", err_path, strerror(errno));
				_exit(127);
			}
			close(efd);
		}
		dup2(fds[1], STDOUT_FILENO);
		close(fds[0]);
		close(fds[1]);
		execv(argv[0], argv);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fds[1]);
	p->out_fd = fds[0];
	p->port = -1;
	while (test_now_ms() < deadline && used < sizeof(line) - 1) {
		struct pollfd pfd = { .fd = p->out_fd, .events = POLLIN };
		ssize_t got;

		if (poll(&pfd, 1, 100) <= 0)
			continue;
		got = read(p->out_fd, line + used, 1);
		if (got <= 0)
			break;
		if (line[used] == '\n') {
			line[used] = '\0';
			const char *k = strstr(line, "port ");

			if (k) {
				p->port = atoi(k + 5);
				return 0;
			}
			used = 0;
			continue;
		}
		used++;
	}
	fprintf(stderr, "harness: server %s did not report its port\n", argv[0]);
	proc_signal(p, SIGKILL, true);
	return -ETIMEDOUT;
}

int proc_signal(struct proc *p, int sig, bool wait)
{
	int status = 0;

	if (p->pid == 0)
		return 0; /* not ours to signal: report a clean exit */
	if (p->pid < 0)
		return -ESRCH;
	kill(p->pid, sig);
	if (!wait)
		return 0;
	while (waitpid(p->pid, &status, 0) < 0 && errno == EINTR)
		;
	p->pid = 0;
	close(p->out_fd);
	return status;
}

bool test_wait_path(struct rtrs_clt_sess *s, unsigned idx, const char *state, unsigned ms)
{
	struct rtrs_path_stats st = { .size = sizeof(st) };
	uint64_t end = test_now_ms() + ms;

	for (;;) {
		if (rtrs_clt_path_stats(s, idx, &st) == 0 && !strcmp(st.state, state))
			return true;
		if (test_now_ms() >= end)
			return false;
		usleep(5000);
	}
}

void test_fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 13 + seed * 101 + (i >> 12));
}

bool test_file_has(const char *path, uint64_t off, const void *want, size_t len)
{
	uint8_t *got = malloc(len);
	int fd = open(path, O_RDONLY);
	bool ok = got && fd >= 0 && pread(fd, got, len, (off_t)off) == (ssize_t)len &&
		  !memcmp(got, want, len);

	if (fd >= 0)
		close(fd);
	free(got);
	return ok;
}
