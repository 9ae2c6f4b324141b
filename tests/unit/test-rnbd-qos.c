/* SPDX-License-Identifier: MIT */
/*
 * The rate limits (lib/rnbd/rnbd-qos.c): token bucket arithmetic, the
 * --qos spec parser, and a context whose thread lets held items go at
 * their rate, reads apart from writes, and answers a dropped owner's at
 * once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rnbd-qos.h"
#include "util.h"

static void test_buckets(void)
{
	struct rnbd_qos_bucket b = { .rate = 1000, .tokens = 0 };

	CHECK(rnbd_qos_burst(1000) == 100);
	CHECK(rnbd_qos_burst(5) == 1, "at least one");
	CHECK(!rnbd_qos_can(&b, 1));
	CHECK_EQ(rnbd_qos_wait_ns(&b, 1), 1000001); /* 1 ms for a token, +1 */
	rnbd_qos_refill(&b, 1000000);
	CHECK(rnbd_qos_can(&b, 1), "%f tokens", b.tokens);
	rnbd_qos_refill(&b, 10ull * 1000000000);
	CHECK(b.tokens == 100, "capped at the burst: %f", b.tokens);
	/* A byte bucket: an amount over the burst goes once it is full. */
	b = (struct rnbd_qos_bucket){ .rate = 1 << 20, .tokens = 0 };
	CHECK(!rnbd_qos_can(&b, 1 << 20));
	rnbd_qos_refill(&b, 200000000);
	CHECK(rnbd_qos_can(&b, 1 << 20), "full: %f", b.tokens);
	b.rate = 0;
	CHECK(rnbd_qos_can(&b, 1 << 30), "no rate: no limit");
	CHECK_EQ(rnbd_qos_wait_ns(&b, 1 << 30), 0);
}

static void test_parse(void)
{
	static const struct { const char *spec, *why; } bad[] = {
		{ "session", "not KIND:NAME:LIMITS" },
		{ "session:x", "not KIND:NAME:LIMITS" },
		{ "volume:x:iops=1", "the kind is not session or device" },
		{ "session::iops=1", "an empty name" },
		{ "session:x:iops", "a limit is not KEY=VALUE" },
		{ "session:x:speed=1", "an unknown limit" },
		{ "session:x:iops=", "a limit without a value" },
		{ "session:x:iops=1k", "an IO rate that is not a number" },
		{ "device:d:bps=lots", "a byte rate that is not a size" },
		{ "device:d:iops=1,", "a limit is not KEY=VALUE" },
		{ "session:x:iops=5,iops=0", "a limit given twice" },
		{ "device:d:bps=1M,read_iops=2,bps=2M", "a limit given twice" },
		{ "device://:iops=1", "a device name of slashes only" },
	};
	struct rnbd_qos_limits l;
	enum rnbd_qos_kind kind;
	const char *why = NULL;
	char name[256];

	CHECK_EQ(rnbd_qos_parse("session:hv1:iops=2000", &kind, name, sizeof(name), &l, &why), 0);
	CHECK(kind == RNBD_QOS_SESSION && !strcmp(name, "hv1") && l.iops == 2000 && !l.bps);
	CHECK_EQ(rnbd_qos_parse("device:vm/a:b.img:read_bps=100M,write_iops=5,bps=1G", &kind, name,
				sizeof(name), &l, &why), 0);
	CHECK(kind == RNBD_QOS_DEVICE && !strcmp(name, "vm/a:b.img"), "a name with ':': %s", name);
	CHECK(l.read_bps == 100 << 20 && l.write_iops == 5 && l.bps == 1ull << 30 && !l.iops);
	CHECK_EQ(rnbd_qos_parse("device:/vm//a/:iops=1", &kind, name, sizeof(name), &l, &why), 0);
	CHECK(!strcmp(name, "vm/a"), "a device's name as the server keeps it: %s", name);
	CHECK_EQ(rnbd_qos_parse("session:/s/:iops=1", &kind, name, sizeof(name), &l, &why), 0);
	CHECK(!strcmp(name, "/s/"), "a session's name as given: %s", name);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		CHECK(rnbd_qos_parse(bad[i].spec, &kind, name, sizeof(name), &l, &why) == -EINVAL &&
		      why && strstr(why, bad[i].why), "%s: %s", bad[i].spec, why ? why : "(none)");
	}
}

static atomic_uint went, dropped;

static void dispatch(struct rnbd_qos_item *it, int err)
{
	(void)it;
	if (err == -ENOTCONN)
		atomic_fetch_add(&dropped, 1);
	else if (!err)
		atomic_fetch_add(&went, 1);
}

static void test_ctx(void)
{
	enum { N = 300 };
	static struct rnbd_qos_item items[N], reads[10];
	struct rnbd_qos_limits l = { .size = sizeof(l), .write_iops = 1000 };
	struct rnbd_qos_stats st = { .size = sizeof(st) };
	struct rnbd_qos_ctx *ctx;
	struct rnbd_qos *g;
	unsigned now_go = 0, fast_reads = 0;
	uint64_t t0;
	int owner_a, owner_b;

	CHECK_EQ(rnbd_qos_ctx_open(dispatch, &ctx), 0);
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_DEVICE, "d") == NULL);
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_DEVICE, "d", &l, &g), 0);
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_DEVICE, "d") == g && rnbd_qos_active(g));
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_SESSION, "d") == NULL, "kinds apart");
	t0 = now_ns();
	for (int i = 0; i < N; i++) {
		items[i] = (struct rnbd_qos_item){ .g = { NULL, g }, .read = false,
						   .owner = i < 200 ? &owner_a : &owner_b };
		now_go += rnbd_qos_admit(ctx, &items[i]);
	}
	CHECK(now_go == 100, "the burst goes at once: %u", now_go);
	/* Reads are not held by a write limit, nor behind the held writes. */
	for (int i = 0; i < 10; i++) {
		reads[i] = (struct rnbd_qos_item){ .g = { NULL, g }, .read = true, .bytes = 4096 };
		fast_reads += rnbd_qos_admit(ctx, &reads[i]);
	}
	CHECK_EQ(fast_reads, 10);
	/* 200 held at 1000/s: done in about 0.2 s. */
	while (atomic_load(&went) < 100 && now_ns() - t0 < 5000000000ull)
		usleep(1000);
	CHECK(atomic_load(&went) >= 100, "%u went", atomic_load(&went));
	CHECK(now_ns() - t0 >= 90000000ull, "not before their tokens: %llu ns",
	      (unsigned long long)(now_ns() - t0));
	rnbd_qos_drop(ctx, &owner_b);
	while (atomic_load(&went) + atomic_load(&dropped) < 200 && now_ns() - t0 < 5000000000ull)
		usleep(1000);
	CHECK(atomic_load(&went) + atomic_load(&dropped) == 200, "went %u dropped %u",
	      atomic_load(&went), atomic_load(&dropped));
	CHECK(atomic_load(&dropped) > 0 && atomic_load(&dropped) <= 100);
	rnbd_qos_get(ctx, g, &l, &st);
	CHECK(l.write_iops == 1000 && st.delayed == 200 && st.queued == 0, "delayed %llu queued %llu",
	      (unsigned long long)st.delayed, (unsigned long long)st.queued);
	/* Lifted: inactive, items go at once. */
	l = (struct rnbd_qos_limits){ .size = sizeof(l) };
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_DEVICE, "d", &l, NULL), 0);
	CHECK(!rnbd_qos_active(g));
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_SESSION, "", &l, NULL), -EINVAL);
	rnbd_qos_ctx_close(ctx);
}

int main(void)
{
	test_buckets();
	test_parse();
	test_ctx();
	return test_done("rnbd-qos");
}
