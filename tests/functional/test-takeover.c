/* SPDX-License-Identifier: MIT */
/*
 * A session taken over by its successor, with a fence (docs/protocol.md
 * section 10, "A successor"). The server is a slow device for one write:
 * it holds the first write 1.5 s and stores it only then; later writes
 * are stored at once.
 *   1. A client process opens session "test-takeover" and sends W1 (0x11),
 *      which the server holds; the process is killed (SIGKILL) 100 ms
 *      later, as a crashed rnbd-clientd is.
 *   2. Its successor opens the same session name from the same address at
 *      once: the open succeeds (the name is not refused as taken), and
 *      only once the server has finished W1 (>= 1.5 s after W1 was sent).
 *   3. The successor writes W2 (0x22) to the same range; after W1's hold
 *      would have ended, reading back gives 0x22: the dead client's write
 *      did not land after its successor's.
 *   4. Another host's session name is still refused at once (-EPERM, do
 *      not retry) while its holder is connected.
 * Without the fence the successor is refused (the name is taken) or, if
 * admitted at once, W1 lands after W2 and the read gives 0x11.
 */
#include <errno.h>
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

#define LEN TEST_AIO_LEN
#define HOLD_MS 1500

static void opts(struct rtrs_clt_opts *o, struct rtrs_path_addr *path, const char *src,
		 const char *dst)
{
	*path = (struct rtrs_path_addr){ .src = src, .dst = dst };
	rtrs_clt_opts_init(o, sizeof(*o));
	o->sessname = "test-takeover";
	o->provider = test_provider();
	o->paths = path;
	o->paths_num = 1;
	o->nr_io_cons = 1;
	o->reconnect_delay_ms = 100;
	o->reconnect_jitter_ms = 50;
}

/* The client that dies: opens, sends W1, says so on fd, and waits to be killed. */
static void doomed(const char *dst, int fd)
{
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	struct rtrs_clt_sess *s;
	static struct test_aio w1;
	char ok = 1;

	opts(&o, &path, test_addr_n(1), dst);
	if (rtrs_clt_open(&o, &s))
		_exit(1);
	w1.permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	if (test_aio_start(s, &w1, RTRS_WRITE, 0x11))
		_exit(1);
	if (write(fd, &ok, 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

int main(void)
{
	char a_port[] = "--port", a_zero[] = "0", a_async[] = "--async", a_late[] = "--apply-late";
	char a_hold[] = "--hold-first-us", hold[] = "1500000";
	char *argv[] = { (char *)test_server_path(), a_port, a_zero, a_async, a_late, a_hold, hold,
			 NULL };
	struct rtrs_path_addr path;
	struct rtrs_clt_opts o;
	struct rtrs_clt_sess *s = NULL, *other = NULL;
	static struct test_aio w2, r;
	struct proc srv;
	char dst[96], ok = 0;
	uint64_t t_w1, t_open;
	int fds[2], rc, st;
	pid_t child;

	if (proc_spawn_server(argv, &srv))
		return 1;
	proc_dst(&srv, dst, sizeof(dst));
	if (pipe(fds))
		return 1;
	/* 1. The doomed client, in a process of its own (forked before this one uses librtrs). */
	child = fork();
	if (child == 0) {
		close(fds[0]);
		doomed(dst, fds[1]);
	}
	close(fds[1]);
	CHECK(read(fds[0], &ok, 1) == 1 && ok == 1, "the first client opened and sent W1");
	t_w1 = test_now_ms();
	close(fds[0]);
	usleep(100 * 1000);
	kill(child, SIGKILL);
	waitpid(child, &st, 0);
	CHECK(WIFSIGNALED(st), "the first client was killed (status %d)", st);
	if (!ok)
		goto out;

	/* 2. Its successor: admitted, once W1 is finished. */
	opts(&o, &path, test_addr_n(1), dst);
	rc = rtrs_clt_open(&o, &s);
	t_open = test_now_ms();
	CHECK(rc == 0, "the successor's open: %s", strerror(-rc));
	if (rc)
		goto out;
	CHECK(t_open - t_w1 >= HOLD_MS, "the successor was admitted %llu ms after W1, before the "
	      "server finished it", (unsigned long long)(t_open - t_w1));
	CHECK(t_open - t_w1 < HOLD_MS + 5000, "the successor waited %llu ms",
	      (unsigned long long)(t_open - t_w1));

	/* 3. W2, then the read: W2's bytes. */
	w2.permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	r.permit = rtrs_clt_get_permit(s, RTRS_IO_CON, RTRS_PERMIT_WAIT);
	CHECK_EQ(test_aio_start(s, &w2, RTRS_WRITE, 0x22), 0);
	CHECK(test_aio_wait(&w2, 8000), "W2 completed");
	CHECK_EQ(atomic_load(&w2.err), 0);
	while (test_now_ms() < t_w1 + HOLD_MS + 300)
		usleep(10000);
	CHECK_EQ(test_aio_start(s, &r, RTRS_READ, 0), 0);
	CHECK(test_aio_wait(&r, 8000), "read completed");
	CHECK_EQ(atomic_load(&r.err), 0);
	CHECK(r.buf[0] == 0x22 && r.buf[LEN - 1] == 0x22,
	      "read %#x: the dead client's write landed after its successor's", r.buf[0]);

	/* 4. From another address, the name is another host's: refused, final, at once. */
	opts(&o, &path, test_addr_n(2), dst);
	o.reconnect_delay_ms = 0;
	t_open = test_now_ms();
	rc = rtrs_clt_open(&o, &other);
	CHECK(rc == -EPERM, "another host's open of the name: %d (%s)", rc, strerror(-rc));
	CHECK(test_now_ms() - t_open < 3000, "refused after %llu ms",
	      (unsigned long long)(test_now_ms() - t_open));
	if (!rc)
		rtrs_clt_close(other);

	rtrs_clt_put_permit(s, w2.permit);
	rtrs_clt_put_permit(s, r.permit);
	rtrs_clt_close(s);
out:
	rc = proc_signal(&srv, SIGTERM, true);
	CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "server exit status %d", rc);
	return test_done("test-takeover");
}
