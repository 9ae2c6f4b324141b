/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for the pieces of lib/rtrs that do not touch the network: the
 * path state table and names (rtrs.c), host:port splitting (rtrs.c), the
 * heartbeat bookkeeping helpers (rtrs-pri.h), the reconnect decision
 * (rtrs_should_reconnect, rtrs.c), admission (rtrs-srv-admit.c) and the
 * server's handshake table (rtrs-srv-hs.c).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "rtrs-pri.h"
#include "rtrs-srv-hs.h"

/* ---- path states --------------------------------------------------------- */

/* The legal transitions, written out independently of rtrs.c's table. */
static bool expect_allowed(int from, int to)
{
	static const int allowed[][2] = {
		{ RTRS_PATH_CONNECTING, RTRS_PATH_CONNECTED },
		{ RTRS_PATH_CONNECTING, RTRS_PATH_CLOSING },
		{ RTRS_PATH_CONNECTING, RTRS_PATH_CLOSED },
		{ RTRS_PATH_CONNECTED, RTRS_PATH_CLOSING },
		{ RTRS_PATH_CLOSING, RTRS_PATH_CLOSED },
		{ RTRS_PATH_CLOSED, RTRS_PATH_CONNECTING },
		/* reconnect */
		{ RTRS_PATH_CONNECTING, RTRS_PATH_RECONNECTING },
		{ RTRS_PATH_CLOSING, RTRS_PATH_RECONNECTING },
		{ RTRS_PATH_CLOSED, RTRS_PATH_RECONNECTING },
		{ RTRS_PATH_RECONNECTING, RTRS_PATH_CONNECTING },
		{ RTRS_PATH_RECONNECTING, RTRS_PATH_CLOSED },
	};

	for (unsigned i = 0; i < ARRAY_SIZE(allowed); i++)
		if (allowed[i][0] == from && allowed[i][1] == to)
			return true;
	return false;
}

static void test_path_states(void)
{
	/* In-range states plus values just outside and far outside. */
	static const int vals[] = { -1000, -2, -1, RTRS_PATH_CONNECTING, RTRS_PATH_CONNECTED,
				    RTRS_PATH_CLOSING, RTRS_PATH_CLOSED, RTRS_PATH_RECONNECTING,
				    RTRS_PATH_NUM_STATES,
				    RTRS_PATH_NUM_STATES + 1, 64, 1000, INT32_MAX };
	unsigned n_allowed = 0, n_pairs = 0;

	/* The enum this table is written against. */
	CHECK_EQ(RTRS_PATH_NUM_STATES, 5);

	for (unsigned i = 0; i < ARRAY_SIZE(vals); i++) {
		for (unsigned j = 0; j < ARRAY_SIZE(vals); j++) {
			int from = vals[i], to = vals[j];
			bool got = rtrs_path_state_allowed((enum rtrs_path_state)from,
							   (enum rtrs_path_state)to);
			bool want = expect_allowed(from, to);

			CHECK(got == want, "%d (%s) -> %d (%s): allowed %d, want %d", from,
			      rtrs_path_state_str((enum rtrs_path_state)from), to,
			      rtrs_path_state_str((enum rtrs_path_state)to), got, want);
			n_allowed += got;
			n_pairs++;
		}
	}
	CHECK_EQ(n_pairs, ARRAY_SIZE(vals) * ARRAY_SIZE(vals));
	CHECK_EQ(n_allowed, 11);

	/* Spelled out, so a failure names the transition. */
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CONNECTING, RTRS_PATH_CONNECTED));
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CONNECTING, RTRS_PATH_CLOSING));
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CONNECTING, RTRS_PATH_CLOSED));
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CONNECTED, RTRS_PATH_CLOSING));
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CLOSING, RTRS_PATH_CLOSED));
	CHECK(rtrs_path_state_allowed(RTRS_PATH_CLOSED, RTRS_PATH_CONNECTING));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CONNECTED, RTRS_PATH_CLOSED));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CONNECTED, RTRS_PATH_CONNECTING));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CLOSING, RTRS_PATH_CONNECTING));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CLOSING, RTRS_PATH_CONNECTED));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CLOSED, RTRS_PATH_CONNECTED));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CLOSED, RTRS_PATH_CLOSING));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_CONNECTED, RTRS_PATH_RECONNECTING));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_RECONNECTING, RTRS_PATH_CONNECTED));
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_RECONNECTING, RTRS_PATH_CLOSING));
	for (int s = 0; s < RTRS_PATH_NUM_STATES; s++)
		CHECK(!rtrs_path_state_allowed((enum rtrs_path_state)s, (enum rtrs_path_state)s),
		      "self transition %s allowed", rtrs_path_state_str((enum rtrs_path_state)s));
	for (int s = 0; s < RTRS_PATH_NUM_STATES; s++) {
		CHECK(!rtrs_path_state_allowed((enum rtrs_path_state)s, RTRS_PATH_NUM_STATES));
		CHECK(!rtrs_path_state_allowed(RTRS_PATH_NUM_STATES, (enum rtrs_path_state)s));
	}
	CHECK(!rtrs_path_state_allowed(RTRS_PATH_NUM_STATES, RTRS_PATH_NUM_STATES));
}

static void test_path_state_names(void)
{
	static const int bad[] = { -1000, -1, RTRS_PATH_NUM_STATES, RTRS_PATH_NUM_STATES + 1,
				   255, INT32_MAX };
	const char *s;

	CHECK(!strcmp(rtrs_path_state_str(RTRS_PATH_CONNECTING), "connecting"));
	CHECK(!strcmp(rtrs_path_state_str(RTRS_PATH_CONNECTED), "connected"));
	CHECK(!strcmp(rtrs_path_state_str(RTRS_PATH_CLOSING), "closing"));
	CHECK(!strcmp(rtrs_path_state_str(RTRS_PATH_CLOSED), "closed"));
	CHECK(!strcmp(rtrs_path_state_str(RTRS_PATH_RECONNECTING), "reconnecting"));
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		s = rtrs_path_state_str((enum rtrs_path_state)bad[i]);
		CHECK(s && !strcmp(s, "unknown"), "state %d: \"%s\"", bad[i], s ? s : "NULL");
	}
	/* Every in-range state has its own non-empty name. */
	for (int a = 0; a < RTRS_PATH_NUM_STATES; a++) {
		const char *na = rtrs_path_state_str((enum rtrs_path_state)a);

		CHECK(na && *na && strcmp(na, "unknown"), "state %d unnamed", a);
		for (int b = a + 1; b < RTRS_PATH_NUM_STATES; b++)
			CHECK(na && strcmp(na, rtrs_path_state_str((enum rtrs_path_state)b)),
			      "states %d and %d share a name", a, b);
	}
}

/* ---- rtrs_split_hostport ------------------------------------------------- */

#define HOST_FILL 'Z'

static void check_split_ok(int line, const char *in, uint16_t def_port, const char *want_host,
			   const char *want_port)
{
	char host[64], port[8];
	int rc;

	memset(host, HOST_FILL, sizeof(host));
	memset(port, HOST_FILL, sizeof(port));
	rc = rtrs_split_hostport(in, def_port, host, sizeof(host), port, sizeof(port));
	CHECK(rc == 0, "line %d: split(\"%s\") = %d, want 0", line, in, rc);
	if (rc)
		return;
	CHECK(memchr(host, '\0', sizeof(host)) && !strcmp(host, want_host),
	      "line %d: split(\"%s\") host \"%.*s\", want \"%s\"", line, in, (int)sizeof(host),
	      host, want_host);
	CHECK(memchr(port, '\0', sizeof(port)) && !strcmp(port, want_port),
	      "line %d: split(\"%s\") port \"%.*s\", want \"%s\"", line, in, (int)sizeof(port),
	      port, want_port);
}

static void check_split_err(int line, const char *in, size_t hostlen)
{
	char host[64], port[8];
	int rc;

	if (hostlen > sizeof(host))
		hostlen = sizeof(host);
	rc = rtrs_split_hostport(in, 4000, host, hostlen, port, sizeof(port));
	CHECK(rc == -EINVAL, "line %d: split(\"%s\", hostlen %zu) = %d, want -EINVAL", line,
	      in ? in : "NULL", hostlen, rc);
}

#define SPLIT_OK(in, def, host, port) check_split_ok(__LINE__, in, def, host, port)
#define SPLIT_ERR(in) check_split_err(__LINE__, in, 64)
#define SPLIT_ERR_LEN(in, len) check_split_err(__LINE__, in, len)

static void test_split_hostport(void)
{
	SPLIT_OK("host", 4000, "host", "4000");
	SPLIT_OK("host", 1, "host", "1");
	SPLIT_OK("host", 65535, "host", "65535");
	SPLIT_OK("host:80", 4000, "host", "80");
	SPLIT_OK("h:1", 4000, "h", "1");
	SPLIT_OK("1.2.3.4:65535", 4000, "1.2.3.4", "65535");
	SPLIT_OK("1.2.3.4", 4000, "1.2.3.4", "4000");
	SPLIT_OK("[::1]:1234", 4000, "::1", "1234");
	SPLIT_OK("[::1]", 4000, "::1", "4000");
	SPLIT_OK("[fe80::1%eth0]:9", 4000, "fe80::1%eth0", "9");
	/* Bare IPv6 (more than one colon, no brackets) is all host. */
	SPLIT_OK("::1", 4000, "::1", "4000");
	SPLIT_OK("fe80::1:80", 4000, "fe80::1:80", "4000");
	SPLIT_OK("my-host.example.com:4242", 4000, "my-host.example.com", "4242");

	SPLIT_ERR(NULL);
	SPLIT_ERR("");
	SPLIT_ERR(":80");
	SPLIT_ERR("host:");
	SPLIT_ERR("host:0");
	SPLIT_ERR("host:65536");
	SPLIT_ERR("host:99999999999999999999999");
	SPLIT_ERR("host:12x");
	SPLIT_ERR("host:-1");
	SPLIT_ERR("host: -1");
	SPLIT_ERR("[::1");
	SPLIT_ERR("[::1]x");
	SPLIT_ERR("[::1]:");
	SPLIT_ERR("[::1]:0");
	SPLIT_ERR("[::1]:65536");
	SPLIT_ERR("[]");
	SPLIT_ERR("[]:80");

	/* The host must fit with its NUL: 7 characters fit in 8 bytes, 8 do not. */
	{
		char host[8], port[8];

		CHECK_EQ(rtrs_split_hostport("abcdefg:1", 2, host, sizeof(host), port,
					     sizeof(port)), 0);
		CHECK(!strcmp(host, "abcdefg"));
		CHECK_EQ(rtrs_split_hostport("[abcdefg]", 2, host, sizeof(host), port,
					     sizeof(port)), 0);
		CHECK(!strcmp(host, "abcdefg"));
		CHECK(!strcmp(port, "2"));
	}
	SPLIT_ERR_LEN("abcdefgh", 8);
	SPLIT_ERR_LEN("abcdefgh:80", 8);
	SPLIT_ERR_LEN("[abcdefgh]:80", 8);
	SPLIT_ERR_LEN("[1:2:3:4:5]", 8);
	SPLIT_ERR_LEN("1:2:3:4:5", 8);
	SPLIT_ERR_LEN("h", 1);
	SPLIT_ERR_LEN("h", 0);
	{
		char longhost[300];

		memset(longhost, 'a', sizeof(longhost) - 1);
		longhost[sizeof(longhost) - 1] = '\0';
		SPLIT_ERR(longhost);
		longhost[200] = ':';
		longhost[201] = '8';
		longhost[202] = '\0';
		SPLIT_ERR(longhost);
	}
}

/* ---- heartbeat ----------------------------------------------------------- */

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

static void hb_init(struct rtrs_hb *hb, unsigned missed_max)
{
	memset(hb, 0, sizeof(*hb));
	atomic_init(&hb->missed, 0);
	atomic_init(&hb->last_sent_ns, 0);
	atomic_init(&hb->latency_ns, 0);
	hb->interval_ms = 100;
	hb->missed_max = missed_max;
}

static void test_heartbeat(void)
{
	struct rtrs_hb hb;
	uint64_t before, after, t0, t1, sent, lat;

	hb_init(&hb, 3);

	/* Three ticks ask for a heartbeat, the fourth declares the peer dead. */
	for (unsigned i = 0; i < 3; i++) {
		before = now_ns();
		CHECK(!rtrs_hb_tick_expired(&hb), "tick %u expired", i + 1);
		after = now_ns();
		CHECK_EQ(atomic_load(&hb.missed), i + 1);
		sent = atomic_load(&hb.last_sent_ns);
		CHECK(sent >= before && sent <= after, "tick %u: last_sent not now", i + 1);
	}
	sent = atomic_load(&hb.last_sent_ns);
	CHECK(rtrs_hb_tick_expired(&hb), "fourth tick not expired");
	/* And it stays expired, without counting or stamping a new send. */
	CHECK(rtrs_hb_tick_expired(&hb));
	CHECK_EQ(atomic_load(&hb.missed), 3);
	CHECK(atomic_load(&hb.last_sent_ns) == sent);

	/* Hearing from the peer resets the count: three more ticks are fine. */
	rtrs_hb_heard(&hb);
	CHECK_EQ(atomic_load(&hb.missed), 0);
	CHECK(!rtrs_hb_tick_expired(&hb));
	CHECK(!rtrs_hb_tick_expired(&hb));
	rtrs_hb_heard(&hb);
	CHECK(!rtrs_hb_tick_expired(&hb));
	CHECK(!rtrs_hb_tick_expired(&hb));
	CHECK(!rtrs_hb_tick_expired(&hb));
	CHECK(rtrs_hb_tick_expired(&hb));

	/* The ack records the time since the last tick. */
	hb_init(&hb, 3);
	before = now_ns();
	CHECK(!rtrs_hb_tick_expired(&hb));
	t0 = now_ns();
	sleep_ms(20);
	t1 = now_ns();
	rtrs_hb_acked(&hb);
	after = now_ns();
	lat = atomic_load(&hb.latency_ns);
	CHECK(lat >= t1 - t0, "latency %llu ns < %llu ns slept", (unsigned long long)lat,
	      (unsigned long long)(t1 - t0));
	CHECK(lat >= 20 * 1000000ull, "latency %llu ns < 20 ms", (unsigned long long)lat);
	CHECK(lat <= after - before, "latency %llu ns > %llu ns elapsed",
	      (unsigned long long)lat, (unsigned long long)(after - before));
	/* The ack neither resets nor counts misses; that is rtrs_hb_heard's job. */
	CHECK_EQ(atomic_load(&hb.missed), 1);

	/* A later tick restarts the measurement: the 20 ms above do not count. */
	before = now_ns();
	CHECK(!rtrs_hb_tick_expired(&hb));
	rtrs_hb_acked(&hb);
	after = now_ns();
	lat = atomic_load(&hb.latency_ns);
	CHECK(lat <= after - before, "latency %llu ns > %llu ns since the latest tick",
	      (unsigned long long)lat, (unsigned long long)(after - before));

	/* missed_max 1: one tick, then expired. */
	hb_init(&hb, 1);
	CHECK(!rtrs_hb_tick_expired(&hb));
	CHECK(rtrs_hb_tick_expired(&hb));
}

static int refusals_logged;

static void count_refusals(void *priv, int level, const char *line)
{
	if (level == 0 && strstr(line, "t: refused state change"))
		refusals_logged++;
}

/* The one change-state function: legal changes apply, others leave the state. */
static void test_change_state(void)
{
	_Atomic enum rtrs_path_state st = RTRS_PATH_CONNECTED;

	rtrs_set_log_fn(count_refusals, NULL);
	CHECK(!rtrs_path_change_state(&st, "t", RTRS_PATH_CONNECTING));
	CHECK_EQ(atomic_load(&st), RTRS_PATH_CONNECTED);
	CHECK(!rtrs_path_change_state(&st, "t", RTRS_PATH_CLOSED));
	CHECK_EQ(atomic_load(&st), RTRS_PATH_CONNECTED);
	CHECK(rtrs_path_change_state(&st, "t", RTRS_PATH_CLOSING));
	CHECK_EQ(atomic_load(&st), RTRS_PATH_CLOSING);
	CHECK(rtrs_path_change_state(&st, "t", RTRS_PATH_CLOSED));
	CHECK(!rtrs_path_change_state(&st, "t", (enum rtrs_path_state)17));
	CHECK_EQ(atomic_load(&st), RTRS_PATH_CLOSED);
	rtrs_set_log_fn(NULL, NULL);
	CHECK_EQ(refusals_logged, 3);
}

static void test_mp_select(void)
{
	struct rtrs_mp_path p[3];
	unsigned rr = 0;
	int seq[6];

	/* Round-robin: in turn, skipping what is down or already tried. */
	for (int i = 0; i < 3; i++)
		p[i] = (struct rtrs_mp_path){ .connected = true };
	for (int k = 0; k < 6; k++)
		seq[k] = rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr);
	CHECK(seq[0] == 0 && seq[1] == 1 && seq[2] == 2 && seq[3] == 0 && seq[4] == 1 &&
	      seq[5] == 2, "rr order %d %d %d %d %d %d", seq[0], seq[1], seq[2], seq[3], seq[4],
	      seq[5]);
	p[1].connected = false;
	rr = 0;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr), 0);
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr), 2);
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr), 0);
	p[0].tried = true;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr), 2);
	p[2].tried = true;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 3, &rr), -1);
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_RR, p, 0, &rr), -1);

	/* Min-inflight: fewest in flight, ties to the lowest index. */
	p[0] = (struct rtrs_mp_path){ .connected = true, .inflight = 5 };
	p[1] = (struct rtrs_mp_path){ .connected = true, .inflight = 2 };
	p[2] = (struct rtrs_mp_path){ .connected = true, .inflight = 7 };
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_INFLIGHT, p, 3, &rr), 1);
	p[1].tried = true;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_INFLIGHT, p, 3, &rr), 0);
	p[0].connected = false;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_INFLIGHT, p, 3, &rr), 2);
	p[0] = p[1] = p[2] = (struct rtrs_mp_path){ .connected = true, .inflight = 3 };
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_INFLIGHT, p, 3, &rr), 0);

	/* Min-latency: lowest round trip; unmeasured counts as the slowest. */
	p[0] = (struct rtrs_mp_path){ .connected = true, .latency_ns = 300 };
	p[1] = (struct rtrs_mp_path){ .connected = true, .latency_ns = 100 };
	p[2] = (struct rtrs_mp_path){ .connected = true, .latency_ns = 0 };
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_LATENCY, p, 3, &rr), 1);
	p[1].connected = false;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_LATENCY, p, 3, &rr), 0);
	p[0].latency_ns = 0;
	p[0].inflight = 4;
	p[2].inflight = 1;
	CHECK_EQ(rtrs_mp_select(RTRS_MP_POLICY_MIN_LATENCY, p, 3, &rr), 2);
}

static void test_reconnect_wait(void)
{
	unsigned lo = UINT32_MAX, hi = 0, below_half = 0;

	for (int i = 0; i < 4000; i++) {
		unsigned ms = rtrs_reconnect_wait_ms(1000, 500, 0);

		lo = ms < lo ? ms : lo;
		hi = ms > hi ? ms : hi;
		below_half += ms < 1250;
	}
	/* Within [delay, delay + jitter], spread over it (not stuck at one end). */
	CHECK(lo >= 1000 && hi <= 1500, "range %u..%u", lo, hi);
	CHECK(lo < 1020 && hi > 1480, "spread %u..%u", lo, hi);
	CHECK(below_half > 1600 && below_half < 2400, "%u of 4000 below the middle", below_half);
	CHECK_EQ(rtrs_reconnect_wait_ms(200, 0, 0), 200);
	CHECK_EQ(rtrs_reconnect_wait_ms(0, 0, 0), 1);       /* never 0: that disarms */
	CHECK_EQ(rtrs_reconnect_wait_ms(10, 0, 1000), 1000); /* at least min */
	CHECK(rtrs_reconnect_wait_ms(UINT32_MAX, UINT32_MAX, 0) == UINT32_MAX);
}

/* ---- the reconnect decision ---------------------------------------------- */

struct reconnect_row {
	int line;
	struct rtrs_reconnect_in in;
	enum rtrs_reconnect_verdict want;
};

/* stopping, err, dnr, attempts, max_attempts, down_ms, loss_timeout_ms -> verdict */
#define RC(stop, e, d, att, max, down, loss, v)                                         \
	{ __LINE__,                                                                     \
	  { .err = (e), .dnr = (d), .stopping = (stop), .attempts = (att),              \
	    .max_attempts = (max), .down_ms = (down), .loss_timeout_ms = (loss) },      \
	  RTRS_RECONNECT_##v }

/* The transient errors, then the same rows for each of them. */
#define TRANSIENT_ROWS(e)                                                               \
	RC(0, e, 0, 0, -1, 0, 0, RETRY),        /* -1: forever */                       \
	RC(0, e, 0, 1, -1, 0, 0, RETRY),                                                \
	RC(0, e, 0, 1000000, -1, 0, 0, RETRY),                                          \
	RC(0, e, 0, INT32_MAX, -1, 0, 0, RETRY),                                        \
	RC(0, e, 0, 0, 0, 0, 0, OUT_OF_ATTEMPTS), /* 0: never, even the first */        \
	RC(0, e, 0, 1, 0, 0, 0, OUT_OF_ATTEMPTS),                                       \
	RC(0, e, 0, 0, 1, 0, 0, RETRY),                                                 \
	RC(0, e, 0, 1, 1, 0, 0, OUT_OF_ATTEMPTS),                                       \
	RC(0, e, 0, 0, 5, 0, 0, RETRY),                                                 \
	RC(0, e, 0, 4, 5, 0, 0, RETRY),         /* N - 1 retries */                     \
	RC(0, e, 0, 5, 5, 0, 0, OUT_OF_ATTEMPTS), /* N stops */                         \
	RC(0, e, 0, 6, 5, 0, 0, OUT_OF_ATTEMPTS),                                       \
	RC(0, e, 0, INT32_MAX - 1, INT32_MAX, 0, 0, RETRY),                             \
	RC(0, e, 0, INT32_MAX, INT32_MAX, 0, 0, OUT_OF_ATTEMPTS),                       \
	/* loss timeout: 0 is none; reached stops, just below does not */               \
	RC(0, e, 0, 0, -1, UINT64_MAX, 0, RETRY),                                       \
	RC(0, e, 0, 0, -1, 999, 1000, RETRY),                                           \
	RC(0, e, 0, 0, -1, 1000, 1000, LOSS_TIMEOUT),                                   \
	RC(0, e, 0, 0, -1, 1001, 1000, LOSS_TIMEOUT),                                   \
	RC(0, e, 0, 0, -1, UINT64_MAX, 1000, LOSS_TIMEOUT),                             \
	RC(0, e, 0, 0, -1, 0, 1, RETRY),                                                \
	RC(0, e, 0, 0, -1, 1, 1, LOSS_TIMEOUT),                                         \
	RC(0, e, 0, 0, -1, UINT32_MAX - 1ull, UINT32_MAX, RETRY),                      \
	RC(0, e, 0, 0, -1, UINT32_MAX, UINT32_MAX, LOSS_TIMEOUT),                       \
	/* ... and is checked before the attempts */                                   \
	RC(0, e, 0, 5, 5, 1000, 1000, LOSS_TIMEOUT),                                    \
	RC(0, e, 0, 5, 5, 999, 1000, OUT_OF_ATTEMPTS),                                  \
	RC(0, e, 0, 0, 0, 1000, 1000, LOSS_TIMEOUT),                                    \
	RC(0, e, 0, 0, 0, 999, 1000, OUT_OF_ATTEMPTS),                                  \
	RC(0, e, 0, 4, 5, 999, 1000, RETRY),                                            \
	/* the rules above it win */                                                    \
	RC(0, e, 1, 0, -1, 0, 0, SERVER_DNR),                                           \
	RC(1, e, 0, 0, -1, 0, 0, STOPPED)

/* Precedence: stopping > -EKEYREJECTED > -ENOKEY > dnr > loss timeout > attempts. */
static const struct reconnect_row reconnect_rows[] = {
	/* Stopping beats everything. */
	RC(1, 0, 0, 0, -1, 0, 0, STOPPED),
	RC(1, -ETIMEDOUT, 0, 0, 5, 0, 0, STOPPED),
	RC(1, -EKEYREJECTED, 0, 0, -1, 0, 0, STOPPED),
	RC(1, -ENOKEY, 0, 0, -1, 0, 0, STOPPED),
	RC(1, 0, 1, 0, -1, 0, 0, STOPPED),
	RC(1, 0, 0, 0, -1, 5000, 1000, STOPPED),
	RC(1, 0, 0, 5, 5, 0, 0, STOPPED),
	RC(1, 0, 0, 0, 0, 0, 0, STOPPED),
	RC(1, -EKEYREJECTED, 1, 10, 0, 5000, 1000, STOPPED),
	RC(1, -ENOKEY, 1, 10, 0, 5000, 1000, STOPPED),
	RC(1, -ECONNRESET, 1, 10, 0, 5000, 1000, STOPPED),

	/* -EKEYREJECTED never retries, whatever the limits, and beats dnr. */
	RC(0, -EKEYREJECTED, 0, 0, -1, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 1000, -1, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 0, 0, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 0, 5, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 4, 5, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 5, 5, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 0, -1, 0, 1000, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 0, -1, 999, 1000, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 0, -1, 1000, 1000, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 0, 5, 5, 1000, 1000, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 1, 0, -1, 0, 0, KEY_REJECTED),
	RC(0, -EKEYREJECTED, 1, 5, 0, 5000, 1000, KEY_REJECTED),

	/* -ENOKEY likewise. */
	RC(0, -ENOKEY, 0, 0, -1, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 1000, -1, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 0, 0, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 0, 5, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 4, 5, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 5, 5, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 0, 0, -1, 0, 1000, NO_KEY),
	RC(0, -ENOKEY, 0, 0, -1, 999, 1000, NO_KEY),
	RC(0, -ENOKEY, 0, 0, -1, 1000, 1000, NO_KEY),
	RC(0, -ENOKEY, 0, 5, 5, 1000, 1000, NO_KEY),
	RC(0, -ENOKEY, 1, 0, -1, 0, 0, NO_KEY),
	RC(0, -ENOKEY, 1, 5, 0, 5000, 1000, NO_KEY),

	/* dnr never retries, and beats the loss timeout and the attempts. */
	RC(0, 0, 1, 0, -1, 0, 0, SERVER_DNR),
	RC(0, -ETIMEDOUT, 1, 0, -1, 0, 0, SERVER_DNR),
	RC(0, -ECONNREFUSED, 1, 0, -1, 0, 0, SERVER_DNR),
	RC(0, -EPROTO, 1, 0, -1, 0, 0, SERVER_DNR),
	RC(0, -EIO, 1, 0, 5, 0, 0, SERVER_DNR),
	RC(0, -ECONNRESET, 1, 0, 0, 0, 0, SERVER_DNR),
	RC(0, -ECONNREFUSED, 1, 5, 5, 0, 0, SERVER_DNR),
	RC(0, -ECONNREFUSED, 1, 0, -1, 999, 1000, SERVER_DNR),
	RC(0, -ECONNREFUSED, 1, 0, -1, 1000, 1000, SERVER_DNR),
	RC(0, -ECONNREFUSED, 1, 5, 5, 1000, 1000, SERVER_DNR),

	/* Transient errors (0 included) retry while the limits allow it. */
	TRANSIENT_ROWS(-ETIMEDOUT),
	TRANSIENT_ROWS(-ECONNRESET),
	TRANSIENT_ROWS(-ECONNREFUSED),
	TRANSIENT_ROWS(-EPROTO),
	TRANSIENT_ROWS(-EIO),
	TRANSIENT_ROWS(0),
	/* Other errnos are no verdict of their own either. */
	RC(0, -EACCES, 0, 0, -1, 0, 0, RETRY),
	RC(0, -ENOMEM, 0, 0, -1, 0, 0, RETRY),
	RC(0, -EHOSTUNREACH, 0, 4, 5, 0, 0, RETRY),
	RC(0, -EHOSTUNREACH, 0, 5, 5, 0, 0, OUT_OF_ATTEMPTS),
};

static void test_should_reconnect(void)
{
	unsigned seen[RTRS_RECONNECT_NR_VERDICTS] = { 0 };

	/* The enum this table is written against. */
	CHECK_EQ(RTRS_RECONNECT_NR_VERDICTS, 7);

	for (unsigned i = 0; i < ARRAY_SIZE(reconnect_rows); i++) {
		const struct reconnect_row *r = &reconnect_rows[i];
		struct rtrs_reconnect_in in = r->in;
		enum rtrs_reconnect_verdict got = rtrs_should_reconnect(&in);

		CHECK(got == r->want,
		      "line %d: stopping %d err %d dnr %d attempts %d/%d down %llu/%u ms: "
		      "%s, want %s", r->line, r->in.stopping, r->in.err, r->in.dnr,
		      r->in.attempts, r->in.max_attempts, (unsigned long long)r->in.down_ms,
		      r->in.loss_timeout_ms, rtrs_reconnect_verdict_str(got),
		      rtrs_reconnect_verdict_str(r->want));
		/* A decision, not a side effect: the input is left alone. */
		CHECK(!memcmp(&in, &r->in, sizeof(in)), "line %d: input changed", r->line);
		if ((unsigned)r->want < RTRS_RECONNECT_NR_VERDICTS)
			seen[r->want]++;
	}
	/* Every verdict is somebody's expectation. */
	for (int v = 0; v < RTRS_RECONNECT_NR_VERDICTS; v++)
		CHECK(seen[v] > 0, "no row expects %s", rtrs_reconnect_verdict_str(v));
}

static void test_reconnect_verdict_names(void)
{
	static const int bad[] = { -1000, -1, RTRS_RECONNECT_NR_VERDICTS,
				   RTRS_RECONNECT_NR_VERDICTS + 1, 255, INT32_MAX };

	CHECK(!strcmp(rtrs_reconnect_verdict_str(RTRS_RECONNECT_RETRY), "retry"));
	for (int a = 0; a < RTRS_RECONNECT_NR_VERDICTS; a++) {
		const char *na = rtrs_reconnect_verdict_str((enum rtrs_reconnect_verdict)a);

		CHECK(na && *na && strcmp(na, "unknown"), "verdict %d unnamed", a);
		for (int b = a + 1; b < RTRS_RECONNECT_NR_VERDICTS; b++) {
			const char *nb = rtrs_reconnect_verdict_str((enum rtrs_reconnect_verdict)b);

			CHECK(na && nb && strcmp(na, nb), "verdicts %d and %d share a name", a, b);
		}
	}
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		const char *s = rtrs_reconnect_verdict_str((enum rtrs_reconnect_verdict)bad[i]);

		CHECK(s && !strcmp(s, "unknown"), "verdict %d: \"%s\"", bad[i], s ? s : "NULL");
	}
}

/*
 * Admission of pending paths (rtrs_admit_decide): below the limits all
 * come in; at a limit the oldest stalled one in that scope goes; the one
 * in all goes first, and is not counted again for the peer; where every
 * one in the scope is progressing, nothing goes and the newcomer is
 * refused (-EBUSY), as with a limit of 0.
 */
static void test_admit(void)
{
	const struct rtrs_admit_limits lim = { .max_total = 4, .max_per_peer = 2 };
	struct rtrs_admit_entry p[] = {
		{ "10.0.0.1", 500, true }, { "10.0.0.2", 100, true }, { "10.0.0.1", 300, true },
		{ "10.0.0.3", 200, true },
	};
	struct rtrs_admit_evict ev[2];

	/* Below both limits. */
	CHECK_EQ(rtrs_admit_decide(p, 0, "10.0.0.9", &lim, ev), 0);
	CHECK_EQ(rtrs_admit_decide(p, 2, "10.0.0.9", &lim, ev), 0);
	/* The peer's limit: its oldest (created 300) goes, the others stay. */
	CHECK_EQ(rtrs_admit_decide(p, 3, "10.0.0.1", &lim, ev), 1);
	CHECK_EQ(ev[0].idx, 2u);
	CHECK(ev[0].per_peer && ev[0].count == 2, "scope %d, count %u", ev[0].per_peer,
	      ev[0].count);
	/* The limit in all: the oldest of all (10.0.0.2, 100), another peer's. */
	CHECK_EQ(rtrs_admit_decide(p, 4, "10.0.0.9", &lim, ev), 1);
	CHECK_EQ(ev[0].idx, 1u);
	CHECK(!ev[0].per_peer && ev[0].count == 4, "scope %d, count %u", ev[0].per_peer,
	      ev[0].count);
	/* Both: 10.0.0.2 goes for the total, then 10.0.0.1's oldest for the peer. */
	CHECK_EQ(rtrs_admit_decide(p, 4, "10.0.0.1", &lim, ev), 2);
	CHECK(ev[0].idx == 1 && !ev[0].per_peer, "first %zu", ev[0].idx);
	CHECK(ev[1].idx == 2 && ev[1].per_peer, "second %zu", ev[1].idx);
	/* The one evicted in all is the peer's own oldest: nothing more to do for the peer. */
	struct rtrs_admit_entry q[] = {
		{ "10.0.0.1", 100, true }, { "10.0.0.1", 300, true }, { "10.0.0.2", 200, true },
		{ "10.0.0.3", 400, true },
	};

	CHECK_EQ(rtrs_admit_decide(q, 4, "10.0.0.1", &lim, ev), 1);
	CHECK(ev[0].idx == 0 && !ev[0].per_peer, "evicted %zu", ev[0].idx);
	/*
	 * Progressing handshakes are never cut short: the peer's oldest (300)
	 * is progressing, so its stalled newer one (500) goes; with both
	 * progressing the newcomer is refused. In all, the oldest stalled one
	 * goes (200, not the progressing 100).
	 */
	p[2].stalled = false;
	CHECK_EQ(rtrs_admit_decide(p, 3, "10.0.0.1", &lim, ev), 1);
	CHECK(ev[0].idx == 0 && ev[0].per_peer, "evicted %zu", ev[0].idx);
	p[0].stalled = false;
	CHECK_EQ(rtrs_admit_decide(p, 3, "10.0.0.1", &lim, ev), -EBUSY);
	p[1].stalled = false;
	CHECK_EQ(rtrs_admit_decide(p, 4, "10.0.0.9", &lim, ev), 1);
	CHECK(ev[0].idx == 3 && !ev[0].per_peer, "evicted %zu", ev[0].idx);
	/* ... and when that frees no room for the peer, nothing goes at all. */
	CHECK_EQ(rtrs_admit_decide(p, 4, "10.0.0.1", &lim, ev), -EBUSY);
	p[3].stalled = false;
	CHECK_EQ(rtrs_admit_decide(p, 4, "10.0.0.9", &lim, ev), -EBUSY);
	/* A limit of 0: nothing pending may exist, nothing can go. */
	const struct rtrs_admit_limits none = { .max_total = 0, .max_per_peer = 2 };

	CHECK_EQ(rtrs_admit_decide(p, 0, "10.0.0.1", &none, ev), -EBUSY);
}

/*
 * Admission by a proven host's name (rtrs_admit_held_decide): only that
 * host's held paths count, from any address; below the limit the path is
 * in; at it the host's oldest stalled one goes (never another host's,
 * however stalled, never a progressing one); with all of the host's
 * progressing, the newcomer is refused (-EBUSY); a limit of 0 refuses all.
 */
static void test_admit_held(void)
{
	struct rtrs_admit_entry h[] = {
		{ "hostA", 100, false }, { "hostB", 50, true }, { "hostA", 300, false },
		{ "hostB", 60, true }, { "hostA", 200, false },
	};
	struct rtrs_admit_evict ev = { .idx = 99 };

	/* hostA holds 3: below 4 it is in; hostB's 2 stalled ones do not count for it. */
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostA", 4, &ev), 0);
	CHECK_EQ(ev.idx, 99u);
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostC", 1, &ev), 0);
	/* At 3, all of hostA's progressing: refused, nothing goes (hostB's stalled ones stay). */
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostA", 3, &ev), -EBUSY);
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostA", 2, &ev), -EBUSY);
	/* One of hostA's stalls: the oldest stalled one of hostA goes (300, then 200). */
	h[2].stalled = true;
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostA", 3, &ev), 1);
	CHECK(ev.idx == 2 && ev.per_peer && ev.count == 3, "evicted %zu (%d, %u)", ev.idx,
	      ev.per_peer, ev.count);
	h[4].stalled = true;
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostA", 3, &ev), 1);
	CHECK_EQ(ev.idx, 4u);
	/* hostB at its limit: its own oldest stalled one (50). */
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostB", 2, &ev), 1);
	CHECK_EQ(ev.idx, 1u);
	/* However many entries in all: no total limit applies. */
	CHECK_EQ(rtrs_admit_held_decide(h, 5, "hostB", 3, &ev), 0);
	/* A limit of 0: refused. */
	CHECK_EQ(rtrs_admit_held_decide(h, 0, "hostA", 0, &ev), -EBUSY);
}

/*
 * Who waited goes first (rtrs_admit_waits, rtrs_admit_queue, the waiters'
 * table): while its host has a live waiter, a newcomer never refused
 * takes neither a free place nor a stalled path's, and one that comes
 * back is taken as the limits allow; the table counts refusals per (host, uuid),
 * forgets who got in, lets waiters of other hosts and dead ones (not seen
 * for RTRS_ADMIT_WAITER_LIVE_MS) count for nothing, and when full gives
 * the place of the entry refused least, seen longest ago.
 */
/*
 * A fence the server received (rtrs_fence_decide): a path it no longer
 * holds, or holds in another incarnation than the fence names (the client
 * reconnected it before the fence arrived), is acked at once and left up;
 * the incarnation named (or any, from a client that names none) is
 * stopped and drained; the path the fence came on cannot fence itself.
 */
static void test_fence_decide(void)
{
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = false, .recon = 3 }),
		 RTRS_FENCE_ACK);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = false, .recon = -1 }),
		 RTRS_FENCE_ACK);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .recon = 3,
							     .path_recon = 3 }), RTRS_FENCE_STOP);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .recon = 3,
							     .path_recon = 4 }), RTRS_FENCE_ACK);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .recon = 65535,
							     .path_recon = 0 }), RTRS_FENCE_ACK);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .recon = -1,
							     .path_recon = 9 }), RTRS_FENCE_STOP);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .self = true,
							     .recon = 2, .path_recon = 2 }),
		 RTRS_FENCE_SELF);
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .self = true,
							     .recon = -1, .path_recon = 2 }),
		 RTRS_FENCE_SELF);
	/* Its own earlier incarnation: gone, as for any other path. */
	CHECK_EQ(rtrs_fence_decide(&(struct rtrs_fence_in){ .found = true, .self = true,
							     .recon = 1, .path_recon = 2 }),
		 RTRS_FENCE_ACK);
}

/*
 * A session name the server still holds (rtrs_takeover_decide): free, it
 * proceeds; another host's, refused at once; this host's holder with a
 * connected path is waited for until live_ms, then refused as a live
 * client, or (its paths silent: a dead kernel client, cut only after 25 s)
 * the newcomer retries; a holder with no path up but requests still at the user is
 * waited for until drain_ms, then the newcomer retries.
 */
static void test_takeover(void)
{
	struct rtrs_takeover_in in = { .live_ms = 3000, .drain_ms = 5000 };

	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_PROCEED);
	in.held = true;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_TAKEN);
	in.same_host = true;
	in.paths_up = 1;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_WAIT);
	in.waited_ms = 2999;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_WAIT);
	in.waited_ms = 3000;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_TAKEN);
	in.silent = true;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_RETRY);
	in.waited_ms = 2999;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_WAIT);
	in.waited_ms = 3000;
	in.paths_up = 0;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_WAIT);
	in.waited_ms = 5000;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_RETRY);
	in.held = false;
	CHECK_EQ(rtrs_takeover_decide(&in), RTRS_TAKEOVER_PROCEED);
}

static void test_admit_waiters(void)
{
	static struct rtrs_admit_waiter w[4];
	const uint8_t a[16] = { 1 }, b[16] = { 2 }, c[16] = { 3 }, d[16] = { 4 }, e[16] = { 5 };
	unsigned waits, most;

	memset(w, 0, sizeof(w));
	CHECK_EQ(rtrs_admit_queue(0, 0, 0), 0);        /* room and nobody waiting: anyone */
	CHECK_EQ(rtrs_admit_queue(0, 0, 5), -EBUSY);   /* room kept for who waited */
	CHECK_EQ(rtrs_admit_queue(1, 0, 1), -EBUSY);   /* a place freed: the waiters first */
	CHECK_EQ(rtrs_admit_queue(2, 3, 3), 2);        /* one that came back: as the limits allow */
	CHECK_EQ(rtrs_admit_queue(0, 1, 7), 0);        /* ... whoever waited longer */
	CHECK_EQ(rtrs_admit_queue(-EBUSY, 9, 0), -EBUSY);

	/* A flood's paths, refused once each and never back; a client that tries again. */
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", a, 1000);
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", b, 1001);
	rtrs_admit_waits(w, 4, "10.0.0.1", c, 1002, &waits, &most);
	CHECK(waits == 0 && most == 1, "newcomer: waits %u most %u", waits, most);
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", c, 1002);
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", c, 1200);
	rtrs_admit_waits(w, 4, "10.0.0.1", c, 1300, &waits, &most);
	CHECK(waits == 2 && most == 1, "retrying client: waits %u most %u", waits, most);
	CHECK_EQ(rtrs_admit_queue(1, waits, most), 1);
	rtrs_admit_waits(w, 4, "10.0.0.1", e, 1300, &waits, &most);
	CHECK(waits == 0 && most == 2, "another new flood path: waits %u most %u", waits, most);
	CHECK_EQ(rtrs_admit_queue(1, waits, most), -EBUSY);
	CHECK_EQ(rtrs_admit_queue(0, waits, most), -EBUSY);
	/* Another host's waiters do not count; dead ones neither. */
	rtrs_admit_waits(w, 4, "10.0.0.2", d, 1300, &waits, &most);
	CHECK(waits == 0 && most == 0, "other host: waits %u most %u", waits, most);
	rtrs_admit_waits(w, 4, "10.0.0.1", d, 1200 + RTRS_ADMIT_WAITER_LIVE_MS, &waits, &most);
	CHECK(most == 0, "dead waiters count: most %u", most);
	/* Full: the entry refused least and seen longest ago (a) makes room. */
	rtrs_admit_waiter_note(w, 4, "10.0.0.2", d, 1400);
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", e, 1500);
	rtrs_admit_waits(w, 4, "10.0.0.1", a, 1500, &waits, &most);
	CHECK_EQ(waits, 0);
	rtrs_admit_waits(w, 4, "10.0.0.1", c, 1500, &waits, &most);
	CHECK_EQ(waits, 2);
	/* A host that holds half the table makes room from its own: b goes, not d. */
	memset(w, 0, sizeof(w));
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", a, 100);
	rtrs_admit_waiter_note(w, 4, "10.0.0.3", b, 200);
	rtrs_admit_waiter_note(w, 4, "10.0.0.3", c, 300);
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", d, 400);
	rtrs_admit_waiter_note(w, 4, "10.0.0.3", e, 500);
	rtrs_admit_waits(w, 4, "10.0.0.1", a, 600, &waits, &most);
	CHECK(waits == 1 && most == 1, "10.0.0.1's oldest kept: waits %u most %u", waits, most);
	rtrs_admit_waits(w, 4, "10.0.0.3", b, 600, &waits, &most);
	CHECK_EQ(waits, 0);
	rtrs_admit_waits(w, 4, "10.0.0.3", e, 600, &waits, &most);
	CHECK_EQ(waits, 1);
	/* In: forgotten, its place free. */
	rtrs_admit_waiter_note(w, 4, "10.0.0.1", c, 700);
	rtrs_admit_waiter_forget(w, 4, "10.0.0.1", c);
	rtrs_admit_waits(w, 4, "10.0.0.1", c, 1500, &waits, &most);
	CHECK(waits == 0 && most == 1, "after it got in: waits %u most %u", waits, most);
}

/*
 * The receives a client posts on each IO connection (verbs): as the
 * kernel's client, 2 x queue depth, so that a server may answer every read
 * with a send with invalidate and the response; never fewer than before
 * (queue depth + 16).
 */
static void test_clt_io_rx_depth(void)
{
	CHECK_EQ(rtrs_clt_io_rx_depth(512), 1024);
	CHECK_EQ(rtrs_clt_io_rx_depth(65535), 131070);
	CHECK_EQ(rtrs_clt_io_rx_depth(16), 32);
	CHECK_EQ(rtrs_clt_io_rx_depth(8), 24);
	CHECK_EQ(rtrs_clt_io_rx_depth(1), 17);
}

/* ---- the server's handshake table (rtrs-srv-hs.c) ------------------------ */

/* What each (state, event) does, written out apart from the table; the rest is -EPROTO. */
static const struct {
	int state, ev, next, err;
} hs_expect[] = {
	{ SRV_HS_AUTH, SRV_HS_EV_CONNREQ, -1, -EACCES },
	{ SRV_HS_AUTH, SRV_HS_EV_AUTH_MSG, SRV_HS_AUTH, 0 },
	{ SRV_HS_AUTH, SRV_HS_EV_HOST_OK, SRV_HS_HOST_OK, 0 },
	{ SRV_HS_AUTH, SRV_HS_EV_AUTH_DONE, SRV_HS_WAIT_INFO, 0 },
	{ SRV_HS_AUTH, SRV_HS_EV_AUTH_FAILED, SRV_HS_AUTH_FAILED, 0 },
	{ SRV_HS_AUTH, SRV_HS_EV_MSG, -1, -EACCES },
	{ SRV_HS_HOST_OK, SRV_HS_EV_CONNREQ, SRV_HS_HOST_OK, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_AUTH_MSG, SRV_HS_HOST_OK, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_HOST_OK, SRV_HS_HOST_OK, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_AUTH_DONE, SRV_HS_WAIT_INFO, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_AUTH_FAILED, SRV_HS_AUTH_FAILED, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_MSG, -1, -EACCES },
	{ SRV_HS_WAIT_INFO, SRV_HS_EV_CONNREQ, SRV_HS_WAIT_INFO, 0 },
	{ SRV_HS_WAIT_INFO, SRV_HS_EV_MSG, SRV_HS_INFO, 0 },
	{ SRV_HS_INFO, SRV_HS_EV_CONNREQ, -1, -EEXIST },
	{ SRV_HS_INFO, SRV_HS_EV_INFO_OK, SRV_HS_DONE, 0 },
	{ SRV_HS_INFO, SRV_HS_EV_REFUSE, SRV_HS_REFUSED, 0 },
	{ SRV_HS_AUTH_FAILED, SRV_HS_EV_CONNREQ, -1, -EACCES },
	{ SRV_HS_AUTH_FAILED, SRV_HS_EV_MSG, -1, -EACCES },
	{ SRV_HS_REFUSED, SRV_HS_EV_CONNREQ, -1, -EEXIST },
	{ SRV_HS_DONE, SRV_HS_EV_CONNREQ, -1, -EEXIST },
	{ SRV_HS_AUTH, SRV_HS_EV_CONCAT_DONE, SRV_HS_CONCAT, 0 },
	{ SRV_HS_HOST_OK, SRV_HS_EV_CONCAT_DONE, SRV_HS_CONCAT, 0 },
	{ SRV_HS_CONCAT, SRV_HS_EV_CONNREQ, -1, -EPROTO },
	{ SRV_HS_CONCAT, SRV_HS_EV_AUTH_MSG, -1, -EPROTO },
	{ SRV_HS_CONCAT, SRV_HS_EV_MSG, -1, -EPROTO },
};

/* Runs evs from the start; the state reached, or -errno of the first refused. */
static int hs_walk(bool auth, const int *evs, size_t n)
{
	int st = rtrs_srv_hs_initial(auth), next, rc;
	const char *why;

	for (size_t i = 0; i < n; i++) {
		rc = rtrs_srv_hs_next(st, evs[i], &next, &why);
		if (rc) {
			CHECK(why && *why, "a refusal names its rule");
			return rc;
		}
		st = next;
	}
	return st;
}

static void test_srv_hs(void)
{
	unsigned n_go = 0;

	CHECK_EQ(SRV_HS_NR_STATES, 8);
	CHECK_EQ(SRV_HS_NR_EVENTS, 10);
	for (int st = -2; st < SRV_HS_NR_STATES + 2; st++) {
		for (int ev = -2; ev < SRV_HS_NR_EVENTS + 2; ev++) {
			int next = -100, rc, want_next = -1, want_err = -EPROTO;
			const char *why = NULL;

			rc = rtrs_srv_hs_next(st, ev, &next, &why);
			if (st < 0 || st >= SRV_HS_NR_STATES || ev < 0 || ev >= SRV_HS_NR_EVENTS) {
				CHECK_EQ(rc, -EINVAL);
				continue;
			}
			for (unsigned i = 0; i < ARRAY_SIZE(hs_expect); i++)
				if (hs_expect[i].state == st && hs_expect[i].ev == ev) {
					want_next = hs_expect[i].next;
					want_err = hs_expect[i].err;
				}
			if (want_err) {
				CHECK(rc == want_err && next == -100 && why && *why,
				      "%s on %s: %d (%s), want %d", rtrs_srv_hs_event_str(ev),
				      rtrs_srv_hs_state_str(st), rc, why ? why : "-", want_err);
			} else {
				CHECK(rc == 0 && next == want_next, "%s on %s: %d -> %s, want %s",
				      rtrs_srv_hs_event_str(ev), rtrs_srv_hs_state_str(st), rc,
				      rtrs_srv_hs_state_str(next), rtrs_srv_hs_state_str(want_next));
				n_go++;
			}
			/* Nothing leads back to where authentication is still owed. */
			if (!rc && st != SRV_HS_AUTH)
				CHECK(next != SRV_HS_AUTH, "%s leads back to auth",
				      rtrs_srv_hs_state_str(st));
			/* The path is connected only by the response, after the request. */
			if (!rc && next == SRV_HS_DONE)
				CHECK(st == SRV_HS_INFO && ev == SRV_HS_EV_INFO_OK);
			/* A message on another connection is never taken before the path is up. */
			if (ev == SRV_HS_EV_MSG_OTHER)
				CHECK_EQ(rc, -EPROTO);
		}
		CHECK(strcmp(rtrs_srv_hs_state_str(st), "unknown") ||
		      st < 0 || st >= SRV_HS_NR_STATES);
	}
	CHECK_EQ(n_go, 15);

	/* Whole handshakes, as clients run them. */
	static const int plain[] = { SRV_HS_EV_CONNREQ, SRV_HS_EV_CONNREQ, SRV_HS_EV_MSG,
				     SRV_HS_EV_INFO_OK };
	static const int authed[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_AUTH_MSG, SRV_HS_EV_HOST_OK,
				      SRV_HS_EV_AUTH_DONE, SRV_HS_EV_CONNREQ, SRV_HS_EV_MSG,
				      SRV_HS_EV_INFO_OK };
	/* Bidirectional: more connections come between SUCCESS1 and SUCCESS2. */
	static const int bidir[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_AUTH_MSG, SRV_HS_EV_HOST_OK,
				     SRV_HS_EV_CONNREQ, SRV_HS_EV_AUTH_MSG, SRV_HS_EV_AUTH_DONE,
				     SRV_HS_EV_CONNREQ, SRV_HS_EV_MSG, SRV_HS_EV_REFUSE };
	static const int early_con[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_CONNREQ };
	static const int early_info[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_MSG };
	static const int failed_con[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_AUTH_FAILED,
					  SRV_HS_EV_CONNREQ };
	static const int auth_unasked[] = { SRV_HS_EV_CONNREQ, SRV_HS_EV_AUTH_MSG };
	static const int info_twice[] = { SRV_HS_EV_MSG, SRV_HS_EV_MSG };
	static const int late_con[] = { SRV_HS_EV_MSG, SRV_HS_EV_INFO_OK, SRV_HS_EV_CONNREQ };
	/* Secure channel concatenation: the exchange, then nothing more on that path. */
	static const int concat[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_AUTH_MSG, SRV_HS_EV_HOST_OK,
				      SRV_HS_EV_CONCAT_DONE };
	static const int concat_info[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_HOST_OK,
					   SRV_HS_EV_CONCAT_DONE, SRV_HS_EV_MSG };
	static const int concat_con[] = { SRV_HS_EV_AUTH_MSG, SRV_HS_EV_HOST_OK,
					  SRV_HS_EV_CONCAT_DONE, SRV_HS_EV_CONNREQ };

	CHECK_EQ(hs_walk(false, plain, ARRAY_SIZE(plain)), SRV_HS_DONE);
	CHECK_EQ(hs_walk(true, plain, ARRAY_SIZE(plain)), -EACCES);
	CHECK_EQ(hs_walk(true, authed, ARRAY_SIZE(authed)), SRV_HS_DONE);
	CHECK_EQ(hs_walk(true, bidir, ARRAY_SIZE(bidir)), SRV_HS_REFUSED);
	CHECK_EQ(hs_walk(true, early_con, ARRAY_SIZE(early_con)), -EACCES);
	CHECK_EQ(hs_walk(true, early_info, ARRAY_SIZE(early_info)), -EACCES);
	CHECK_EQ(hs_walk(true, failed_con, ARRAY_SIZE(failed_con)), -EACCES);
	CHECK_EQ(hs_walk(false, auth_unasked, ARRAY_SIZE(auth_unasked)), -EPROTO);
	CHECK_EQ(hs_walk(false, info_twice, ARRAY_SIZE(info_twice)), -EPROTO);
	CHECK_EQ(hs_walk(false, late_con, ARRAY_SIZE(late_con)), -EEXIST);
	CHECK_EQ(hs_walk(true, concat, ARRAY_SIZE(concat)), SRV_HS_CONCAT);
	CHECK_EQ(hs_walk(true, concat_info, ARRAY_SIZE(concat_info)), -EPROTO);
	CHECK_EQ(hs_walk(true, concat_con, ARRAY_SIZE(concat_con)), -EPROTO);

	/* Admission stops counting a path as pending once its host is proven. */
	CHECK(!rtrs_srv_hs_host_proven(SRV_HS_AUTH));
	CHECK(!rtrs_srv_hs_host_proven(SRV_HS_AUTH_FAILED));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_HOST_OK));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_WAIT_INFO));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_INFO));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_REFUSED));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_DONE));
	CHECK(rtrs_srv_hs_host_proven(SRV_HS_CONCAT));
	CHECK(!rtrs_srv_hs_host_proven(-1) && !rtrs_srv_hs_host_proven(SRV_HS_NR_STATES));
}

int main(void)
{
	test_clt_io_rx_depth();
	test_path_states();
	test_path_state_names();
	test_split_hostport();
	test_heartbeat();
	test_change_state();
	test_mp_select();
	test_reconnect_wait();
	test_should_reconnect();
	test_reconnect_verdict_names();
	test_admit();
	test_admit_held();
	test_admit_waiters();
	test_takeover();
	test_fence_decide();
	test_srv_hs();
	return test_done("state");
}
