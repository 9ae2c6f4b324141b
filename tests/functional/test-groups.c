// SPDX-License-Identifier: MIT
/*
 * Poll groups under a flood (issue 35): every connection of this process,
 * both ends of each, on ONE group of the tcp fabric (fab_tcp_groups(1)),
 * over loopback:
 *
 *   - PINGERS connections each make round trips (a 64-byte message
 *     echoed by the server's end from its recv callback) one after the
 *     other;
 *   - one more connection floods: a thread sends messages to the server
 *     as fast as the send queue takes them, for the whole run.
 *
 * Asserted: every pinger makes at least MIN_TRIPS round trips and none
 * takes longer than MAX_RTT_MS, while the flood goes on and is itself
 * served (its frames arrive by the tens of thousands); the group's turns
 * never read more than its budget of frames for one connection, and the
 * flooder's turns did end with input left (budget_yields: it waited
 * behind the others rather than being read dry); no connection ever
 * changes group (fab_tcp_con_group before and after); every message of a
 * round trip comes back with the bytes sent.
 */
#include <errno.h>
#include <linux/io_uring.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "harness.h"
#include "rtrs-fabric.h"
#include "util.h"

#define PINGERS 16
#define MSG 64
#define RUN_MS 3000
#define MIN_TRIPS 100
/*
 * A starved pinger would wait the whole run (RUN_MS); a served one waits a
 * few turns, and on a machine whose CPUs are taken by more than this test
 * (the loaded CI runs, two busy loops beside it: 320 ms seen), a few
 * scheduler slices. A quarter of the run tells the two apart. Sanitizers
 * make every turn several times slower (TSan with both CPUs busy: 265 ms
 * seen), hence their larger bound.
 */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define MAX_RTT_MS 1500
#else
#define MAX_RTT_MS (RUN_MS / 4)
#endif
#define RX_DEPTH 64

enum role { ROLE_PINGER = 1, ROLE_FLOOD = 2 };

static void sleep_ms(unsigned ms)
{
	usleep(ms * 1000u);
}

struct end {
	struct fab_con *c;
	bool server;
	enum role role;
	unsigned idx;
	atomic_bool up;
	atomic_bool down;
	int group;
	/* pinger, client end */
	uint64_t sent_ns;
	atomic_uint trips;
	atomic_uint_fast64_t max_rtt_ns;
	atomic_uint bad;
	uint32_t seq;
	/* flood, server end */
	atomic_uint_fast64_t frames;
	char tx[MSG];
};

static struct fab *sfab, *cfab;
static struct fab_lst *lst;
static struct end cli[PINGERS + 1], srv[PINGERS + 1];
static atomic_uint nr_srv;
static atomic_bool stop, lst_stop;

static void fill(char *buf, unsigned idx, uint32_t seq)
{
	for (unsigned i = 0; i < MSG; i++)
		buf[i] = (char)(idx * 31 + seq * 7 + i);
	memcpy(buf, &seq, sizeof(seq));
}

static int send_ping(struct end *e)
{
	fill(e->tx, e->idx, ++e->seq);
	e->sent_ns = now_ns();
	return fab_send(e->c, e->tx, MSG, NULL, NULL);
}

static void on_connected(void *priv, const void *data, size_t len)
{
	struct end *e = priv;

	(void)data;
	(void)len;
	atomic_store(&e->up, true);
}

static void on_down(void *priv, int err, const void *data, size_t len)
{
	struct end *e = priv;

	(void)err;
	(void)data;
	(void)len;
	atomic_store(&e->down, true);
}

static void on_recv(void *priv, void *buf, size_t len)
{
	struct end *e = priv;

	if (e->server) {
		if (e->role == ROLE_FLOOD) {
			atomic_fetch_add(&e->frames, 1);
			return;
		}
		/* Echo: copied into tx (buf is reposted when this returns). */
		if (len != MSG) {
			atomic_fetch_add(&e->bad, 1);
			return;
		}
		memcpy(e->tx, buf, MSG);
		if (fab_send(e->c, e->tx, MSG, NULL, NULL))
			atomic_fetch_add(&e->bad, 1);
		return;
	}
	/* A pinger's answer. */
	char want[MSG];
	uint64_t rtt = now_ns() - e->sent_ns;

	fill(want, e->idx, e->seq);
	if (len != MSG || memcmp(buf, want, MSG))
		atomic_fetch_add(&e->bad, 1);
	if (rtt > atomic_load(&e->max_rtt_ns))
		atomic_store(&e->max_rtt_ns, rtt);
	atomic_fetch_add(&e->trips, 1);
	if (!atomic_load(&stop) && send_ping(e))
		atomic_fetch_add(&e->bad, 1);
}

static void on_done(void *priv, void *ctx)
{
	(void)priv;
	(void)ctx;
}

static void on_kick(void *priv)
{
	(void)priv;
}

static const struct fab_con_ops ops = {
	.connected = on_connected, .down = on_down, .recv = on_recv, .done = on_done,
	.kick = on_kick,
};

static void on_req(void *priv, struct fab_connreq *req, const void *data, size_t len)
{
	unsigned n = atomic_load(&nr_srv);
	struct fab_con_cfg cfg = {
		.ops = &ops, .name = "grp-srv", .tx_depth = 256, .rx_depth = RX_DEPTH, .rx_size = MSG,
	};
	const uint8_t *d = data;
	struct end *e;

	(void)priv;
	if (len != 2 || n > PINGERS || d[1] > PINGERS) {
		fab_reject(lst, req, NULL, 0);
		return;
	}
	e = &srv[d[1]];
	e->server = true;
	e->role = d[0];
	e->idx = d[1];
	cfg.priv = e;
	CHECK_EQ(fab_con_accept(sfab, req, &cfg, NULL, 0, &e->c), 0);
	atomic_store(&e->up, true);
	atomic_fetch_add(&nr_srv, 1);
}

static void *lst_thread(void *arg)
{
	struct pollfd pfd = { .fd = fab_lst_fd(lst), .events = POLLIN };

	(void)arg;
	while (!atomic_load(&lst_stop)) {
		if (poll(&pfd, 1, 20) > 0)
			fab_lst_process(lst, on_req, NULL);
	}
	return NULL;
}

static void *flood_thread(void *arg)
{
	struct end *e = arg;
	static char buf[MSG];

	memset(buf, 0x5a, sizeof(buf));
	while (!atomic_load(&stop) && !atomic_load(&e->down)) {
		int rc = fab_send(e->c, buf, sizeof(buf), NULL, NULL);

		if (rc == -EAGAIN)
			sched_yield();
		else if (rc)
			break;
	}
	return NULL;
}

static bool wait_flag(atomic_bool *b, unsigned ms)
{
	for (unsigned i = 0; i < ms && !atomic_load(b); i++)
		sleep_ms(1);
	return atomic_load(b);
}

int main(int argc, char **argv)
{
	struct fab_tcp_group_stats st0, st1;
	pthread_t lt, ft;
	char port[16];
	int rc;

	/* The group as on a kernel before 5.11: liburing's own timeouts complete among ours. */
	if (argc > 1 && !strcmp(argv[1], "--old-kernel"))
		fab_tcp_features_mask(IORING_FEAT_EXT_ARG);
	fab_tcp_groups(1);
	rc = fab_open("tcp", NULL, "127.0.0.1", "0", true, 256, &sfab);
	CHECK_EQ(rc, 0);
	if (rc)
		return test_done("test-groups");
	CHECK_EQ(fab_listen(sfab, &lst), 0);
	snprintf(port, sizeof(port), "%d", fab_lst_port(lst));
	CHECK_EQ(fab_open("tcp", NULL, "127.0.0.1", port, false, 256, &cfab), 0);
	CHECK_EQ(fab_tcp_groups_running(), 1);
	CHECK_EQ(pthread_create(&lt, NULL, lst_thread, NULL), 0);

	for (unsigned i = 0; i <= PINGERS; i++) {
		struct end *e = &cli[i];
		uint8_t hello[2] = { i < PINGERS ? ROLE_PINGER : ROLE_FLOOD, (uint8_t)i };
		struct fab_con_cfg cfg = {
			.ops = &ops, .priv = e, .name = "grp-clt", .tx_depth = 256,
			.rx_depth = RX_DEPTH, .rx_size = MSG,
		};

		e->role = hello[0];
		e->idx = i;
		CHECK_EQ(fab_con_connect(cfab, &cfg, hello, sizeof(hello), &e->c), 0);
		CHECK(wait_flag(&e->up, 5000), "connection %u up", i);
	}
	for (unsigned i = 0; i < 5000 && atomic_load(&nr_srv) < PINGERS + 1; i++)
		sleep_ms(1);
	CHECK_EQ(atomic_load(&nr_srv), PINGERS + 1);
	for (unsigned i = 0; i <= PINGERS; i++) {
		cli[i].group = fab_tcp_con_group(cli[i].c);
		srv[i].group = fab_tcp_con_group(srv[i].c);
		CHECK(cli[i].group == 0 && srv[i].group == 0, "connection %u on group %d/%d", i,
		      cli[i].group, srv[i].group);
	}
	CHECK_EQ(fab_tcp_group_stats(0, &st0), 0);
	CHECK_EQ(st0.nr_cons, 2 * (PINGERS + 1));

	/* The flood first, then the round trips alongside it. */
	CHECK_EQ(pthread_create(&ft, NULL, flood_thread, &cli[PINGERS]), 0);
	sleep_ms(200);
	for (unsigned i = 0; i < PINGERS; i++)
		CHECK_EQ(send_ping(&cli[i]), 0);
	sleep_ms(RUN_MS);
	atomic_store(&stop, true);
	pthread_join(ft, NULL);
	sleep_ms(300); /* the last round trips come back */

	uint64_t flood = atomic_load(&srv[PINGERS].frames);
	unsigned min_trips = ~0u;
	uint64_t max_rtt = 0;

	for (unsigned i = 0; i < PINGERS; i++) {
		struct end *e = &cli[i];

		CHECK_EQ(atomic_load(&e->bad), 0);
		CHECK_EQ(atomic_load(&srv[i].bad), 0);
		CHECK(!atomic_load(&e->down), "pinger %u stayed up", i);
		min_trips = MIN(min_trips, atomic_load(&e->trips));
		max_rtt = MAX(max_rtt, (uint64_t)atomic_load(&e->max_rtt_ns));
		CHECK_EQ(fab_tcp_con_group(e->c), e->group);
		CHECK_EQ(fab_tcp_con_group(srv[i].c), srv[i].group);
	}
	CHECK_EQ(fab_tcp_con_group(cli[PINGERS].c), cli[PINGERS].group);
	CHECK_EQ(fab_tcp_con_group(srv[PINGERS].c), srv[PINGERS].group);
	CHECK_EQ(fab_tcp_group_stats(0, &st1), 0);
	printf("test-groups: %u pingers beside a flood on one group: at least %u round trips "
	       "each in %u ms, slowest %.1f ms; flood %llu frames; group passes %llu, turns "
	       "ended by the budget %llu, most frames in a turn %u (budget %u)\n",
	       PINGERS, min_trips, RUN_MS, max_rtt / 1e6, (unsigned long long)flood,
	       (unsigned long long)(st1.passes - st0.passes),
	       (unsigned long long)(st1.budget_yields - st0.budget_yields), st1.max_turn_frames,
	       st1.turn_budget);
	CHECK(min_trips >= MIN_TRIPS, "a pinger made only %u round trips in %u ms beside the flood",
	      min_trips, RUN_MS);
	CHECK(max_rtt <= MAX_RTT_MS * 1000000ull, "a round trip took %.1f ms beside the flood",
	      max_rtt / 1e6);
	CHECK(flood >= 10000, "the flood itself was served: %llu frames",
	      (unsigned long long)flood);
	CHECK(st1.max_turn_frames <= st1.turn_budget, "a turn read %u frames, budget %u",
	      st1.max_turn_frames, st1.turn_budget);
	CHECK(st1.budget_yields > st0.budget_yields, "the flooder's turns never ended by budget");

	for (unsigned i = 0; i <= PINGERS; i++) {
		fab_con_shutdown(cli[i].c);
		fab_con_destroy(cli[i].c);
	}
	atomic_store(&lst_stop, true);
	pthread_join(lt, NULL);
	for (unsigned i = 0; i <= PINGERS; i++)
		if (srv[i].c) {
			fab_con_shutdown(srv[i].c);
			fab_con_destroy(srv[i].c);
		}
	fab_lst_close(lst);
	fab_close(cfab);
	fab_close(sfab);
	CHECK_EQ(fab_tcp_groups_running(), 0);
	return test_done("test-groups");
}
