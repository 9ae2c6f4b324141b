/* SPDX-License-Identifier: MIT */
/*
 * Test harness: spawn a server process, learn its port from its first line
 * of output, signal it, reap it. Servers run on test_addr() (127.0.0.1
 * unless a guest says otherwise) with port 0, so tests never collide on
 * ports.
 */
#ifndef RTRS_TEST_HARNESS_H
#define RTRS_TEST_HARNESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rtrs.h"
#include "test-proto-hdr.h"

struct proc {
	pid_t pid;          /* 0: a server this test did not start */
	int port;
	int out_fd;
	char host[64];      /* where the server listens */
};

/*
 * argv[0] is the program path; extra arguments follow, and the harness adds
 * --provider and --addr from the environment. With RTRS_TEST_SERVER_AT=
 * host:port nothing is started: the test uses that server (in another
 * guest, say). 0 or -errno.
 */
int proc_spawn_server(char *const argv[], struct proc *p);
/* The same with the server's stderr (its log) in the file err_path (created or truncated). */
int proc_spawn_server_log(char *const argv[], struct proc *p, const char *err_path);
/* "host:port" of p. */
void proc_dst(const struct proc *p, char *buf, size_t len);
/* RTRS_TEST_PROVIDER (tcp) and RTRS_TEST_ADDR (127.0.0.1). */
const char *test_provider(void);
const char *test_addr(void);
/*
 * Address n (1..3) of this host, the source of a session's nth path when a
 * test needs paths that differ: 1 is test_addr(), 2 and 3 come from
 * RTRS_TEST_ADDR2 and RTRS_TEST_ADDR3 (127.0.0.2 and 127.0.0.3; a guest
 * gives its RDMA netdev more addresses). Exits for any other n.
 */
const char *test_addr_n(unsigned n);
/* Sends sig; with wait, reaps the process and returns its status. */
int proc_signal(struct proc *p, int sig, bool wait);
/*
 * RTRS_TEST_TLS=1: the functional tests' sessions run on TLS. The servers
 * proc_spawn_server starts (rtrs-test-server, unless the test gives its own
 * --auth-keys) require it, with a key file the harness writes; a test
 * calls test_clt_tls on its client options, which then require TLS with
 * that file's host, secret and PSK. RTRS_TEST_TLS=concat: the same, the
 * clients with RTRS_TLS_CONCAT (a PSK from each path's exchange). Without
 * the variable both do nothing.
 */
bool test_tls(void);
void test_clt_tls(struct rtrs_clt_opts *o);
/* Path of the test server from $RTRS_TEST_SERVER (set by meson). */
const char *test_server_path(void);
/* Milliseconds on the monotonic clock. */
uint64_t test_now_ms(void);
/*
 * One RTRS request on an IO connection, waited for: usr as the user header,
 * data written (RTRS_WRITE) or read into (RTRS_READ); data_len 0 for none.
 * Returns the submit error or the completion's; -ENOBUFS without a permit.
 */
int test_request(struct rtrs_clt_sess *s, enum rtrs_dir dir, const void *usr, size_t usr_len,
		 void *data, size_t data_len);
/*
 * One asynchronous IO of the test protocol (test-proto-hdr.h): TEST_AIO_LEN
 * bytes at offset 0 of rtrs-test-server's store, on the caller's permit
 * (a->permit). test_aio_start fills buf with fill and sends it (0 or the
 * submit error); test_aio_wait waits up to ms for its completion: calls
 * counts them, err is the last one's, t_done its time (test_now_ms).
 */
#define TEST_AIO_LEN 4096

struct test_aio {
	struct rtrs_permit *permit;
	struct test_hdr hdr;
	struct rtrs_clt_req_ops ops;
	uint8_t buf[TEST_AIO_LEN];
	atomic_int calls;
	atomic_int err;
	uint64_t t_done;
};

int test_aio_start(struct rtrs_clt_sess *s, struct test_aio *a, enum rtrs_dir dir, uint8_t fill);
bool test_aio_wait(struct test_aio *a, unsigned ms);

/* Polls path idx of s until its state is state ("connected", ...) or ms pass. */
bool test_wait_path(struct rtrs_clt_sess *s, unsigned idx, const char *state, unsigned ms);
/* A pattern that differs with seed and along the buffer. */
void test_fill(uint8_t *p, size_t n, unsigned seed);
/* Whether the file at path holds want at off. */
bool test_file_has(const char *path, uint64_t off, const void *want, size_t len);

#endif
