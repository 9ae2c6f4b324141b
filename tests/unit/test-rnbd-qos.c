/* SPDX-License-Identifier: MIT */
/*
 * The rate limits (lib/rnbd/rnbd-qos.c): token bucket arithmetic, the
 * --qos spec parser, and a context whose thread lets held items go at
 * their rate, reads apart from writes, and answers a dropped owner's (or
 * one device of it) at once; both directions served in their order where
 * they share a bucket (a write amid a flood of reads goes).
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
		{ "volume:x:iops=1", "the kind is not session, host or device" },
		{ "hosts:x:iops=1", "the kind is not session, host or device" },
		{ "host::iops=1", "an empty name" },
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
	CHECK_EQ(rnbd_qos_parse("host:nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1:bps=1G", &kind,
				name, sizeof(name), &l, &why), 0);
	CHECK(kind == RNBD_QOS_HOST && !strcmp(name, "nqn.2014-08.org.nvmexpress:uuid:1b4e28ba-2fa1") &&
	      l.bps == 1ull << 30, "a host's NQN, its ':' kept: %s", name);
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
	unsigned now_go = 0, fast_reads = 0, held, refilled;
	uint64_t t0;
	int owner_a, owner_b;

	CHECK_EQ(rnbd_qos_ctx_open(dispatch, &ctx), 0);
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_DEVICE, "d") == NULL);
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_DEVICE, "d", &l, &g), 0);
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_DEVICE, "d") == g && rnbd_qos_active(g));
	CHECK(rnbd_qos_find(ctx, RNBD_QOS_SESSION, "d") == NULL, "kinds apart");
	t0 = now_ns();
	for (int i = 0; i < N; i++) {
		items[i] = (struct rnbd_qos_item){ .g = { NULL, NULL, g }, .read = false,
						   .owner = i < 200 ? &owner_a : &owner_b };
		now_go += rnbd_qos_admit(ctx, &items[i]);
	}
	/*
	 * The burst (a second's worth, 100) goes at once, and whatever tokens
	 * came while the loop ran (1 a ms: a sanitizer build on a loaded
	 * machine takes more than one for these 300).
	 */
	refilled = (unsigned)((now_ns() - t0) / 1000000) + 1;
	CHECK(now_go >= 100 && now_go <= 100 + refilled, "the burst goes at once: %u (%u ms of "
	      "refill)", now_go, refilled);
	held = N - now_go;
	/* Reads are not held by a write limit, nor behind the held writes. */
	for (int i = 0; i < 10; i++) {
		reads[i] = (struct rnbd_qos_item){ .g = { NULL, NULL, g }, .read = true, .bytes = 4096 };
		fast_reads += rnbd_qos_admit(ctx, &reads[i]);
	}
	CHECK_EQ(fast_reads, 10);
	/* 200 held at 1000/s: done in about 0.2 s. */
	while (atomic_load(&went) < 100 && now_ns() - t0 < 5000000000ull)
		usleep(1000);
	CHECK(atomic_load(&went) >= 100, "%u went", atomic_load(&went));
	CHECK(now_ns() - t0 >= 90000000ull, "not before their tokens: %llu ns",
	      (unsigned long long)(now_ns() - t0));
	rnbd_qos_drop(ctx, &owner_b, NULL);
	while (atomic_load(&went) + atomic_load(&dropped) < held && now_ns() - t0 < 5000000000ull)
		usleep(1000);
	CHECK(atomic_load(&went) + atomic_load(&dropped) == held, "went %u dropped %u of %u",
	      atomic_load(&went), atomic_load(&dropped), held);
	CHECK(atomic_load(&dropped) > 0 && atomic_load(&dropped) <= 100);
	rnbd_qos_get(ctx, g, &l, &st);
	CHECK(l.write_iops == 1000 && st.delayed == held && st.queued == 0, "delayed %llu queued %llu",
	      (unsigned long long)st.delayed, (unsigned long long)st.queued);
	/* Lifted: inactive, items go at once. */
	l = (struct rnbd_qos_limits){ .size = sizeof(l) };
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_DEVICE, "d", &l, NULL), 0);
	CHECK(!rnbd_qos_active(g));
	CHECK_EQ(rnbd_qos_set(ctx, RNBD_QOS_SESSION, "", &l, NULL), -EINVAL);
	rnbd_qos_ctx_close(ctx);
}

/* ---- fairness: a flood of reads and one IO of the other direction -------------- */

enum { FLOOD_DEPTH = 32 };

static struct {
	struct rnbd_qos_ctx *ctx;
	atomic_bool stop;            /* reads that go are not admitted again */
	atomic_uint reads;           /* reads that went */
	struct rnbd_qos_item *other; /* the one IO watched */
	atomic_bool other_done;
	atomic_int other_err;
	atomic_uint writes;          /* other writes that went */
	atomic_uint dropped;
	const void *drop_owner, *drop_dev; /* what rnbd_qos_drop was asked for */
	atomic_uint dropped_wrong;   /* dropped, and not of those */
} fl;

/* A read went: admitted again at once (and again while it goes at once). */
static void flood_read(struct rnbd_qos_item *it)
{
	do
		atomic_fetch_add(&fl.reads, 1);
	while (!atomic_load(&fl.stop) && rnbd_qos_admit(fl.ctx, it));
}

static void flood_dispatch(struct rnbd_qos_item *it, int err)
{
	if (it == fl.other) {
		atomic_store(&fl.other_err, err);
		atomic_store(&fl.other_done, true);
	} else if (err) {
		atomic_fetch_add(&fl.dropped, 1);
		if (err != -ENOTCONN || it->owner != fl.drop_owner || it->dev != fl.drop_dev)
			atomic_fetch_add(&fl.dropped_wrong, 1);
	} else if (it->read) {
		flood_read(it);
	} else {
		atomic_fetch_add(&fl.writes, 1);
	}
}

/* Waits until *n reaches want or the other IO is done, 60 s at most (a hang, not a timing). */
static void flood_wait(atomic_uint *n, unsigned want)
{
	uint64_t end = now_ns() + 60000000000ull;

	while (atomic_load(n) < want && !atomic_load(&fl.other_done) && now_ns() < end)
		usleep(200);
}

/*
 * A case: FLOOD_DEPTH reads of read_bytes, each admitted again as soon as
 * it went, on the device's group (limits dev), so that held reads are
 * always waiting for every token that comes; once warm reads went, the
 * other IO (its groups, direction and bytes in *other; pre, if any, is
 * admitted just before it) must go before bound more reads went. The bound
 * counts reads, not time (a second or two of their rate, whatever the
 * machine's speed): held behind the reads that came before it (at most
 * FLOOD_DEPTH), then for its own tokens, which no read takes meanwhile, it
 * goes long before; starved, it never does.
 */
static void flood_case(const char *what, const struct rnbd_qos_limits *dev,
		       const struct rnbd_qos_limits *sess, uint32_t read_bytes,
		       struct rnbd_qos_item *pre, struct rnbd_qos_item *other, unsigned warm,
		       unsigned bound)
{
	static struct rnbd_qos_item reads[FLOOD_DEPTH];
	struct rnbd_qos *gd, *gs = NULL;
	unsigned r0, n;

	memset(&fl, 0, sizeof(fl));
	CHECK_EQ(rnbd_qos_ctx_open(flood_dispatch, &fl.ctx), 0);
	/* The session's group first: the thread meets the device's first. */
	if (sess)
		CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_SESSION, "s", sess, &gs), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_DEVICE, "d", dev, &gd), 0);
	for (int i = 0; i < FLOOD_DEPTH; i++) {
		reads[i] = (struct rnbd_qos_item){ .g = { NULL, NULL, gd }, .read = true,
						   .bytes = read_bytes };
		if (rnbd_qos_admit(fl.ctx, &reads[i]))
			flood_read(&reads[i]);
	}
	flood_wait(&fl.reads, warm);
	CHECK(atomic_load(&fl.reads) >= warm, "%s: %u reads went", what, atomic_load(&fl.reads));
	other->g[0] = gs;
	other->g[2] = gd;
	if (pre) {
		pre->g[0] = gs;
		pre->g[2] = gd;
		CHECK(rnbd_qos_admit(fl.ctx, pre), "%s: the first goes at once", what);
	}
	fl.other = other;
	r0 = atomic_load(&fl.reads);
	if (rnbd_qos_admit(fl.ctx, other))
		atomic_store(&fl.other_done, true);
	flood_wait(&fl.reads, r0 + bound);
	n = atomic_load(&fl.reads) - r0;
	CHECK(atomic_load(&fl.other_done) && atomic_load(&fl.other_err) == 0,
	      "%s: not gone after %u reads (bound %u)", what, n, bound);
	if (atomic_load(&fl.other_done))
		fprintf(stderr, "%s: went after %u reads (bound %u)\n", what, n, bound);
	atomic_store(&fl.stop, true);
	rnbd_qos_ctx_close(fl.ctx); /* lets what waits go */
	CHECK(atomic_load(&fl.other_done), "%s: gone at the close", what);
}

/*
 * Shared buckets serve both directions in the order IO came: a write amid
 * a read flood that takes every IOPS token as it comes, a 1 MiB write that
 * needs a full byte bucket amid 4 KiB reads, and a write first held by its
 * session's own limit, then by its device's byte limit that another
 * session's reads drain. Each burst holds fewer reads than the flood, or
 * less than the write needs, so that the reads held take every token even
 * from a thread that comes late (starved, the write never goes).
 */
static void test_fairness(void)
{
	struct rnbd_qos_limits dev = { .size = sizeof(dev), .iops = 100 };
	struct rnbd_qos_limits sess = { .size = sizeof(sess), .write_iops = 10 };
	struct rnbd_qos_item w = { .read = false, .bytes = 4096 }, pre;

	/*
	 * 100/s, a burst of 10: it goes after the 32 reads before it and a
	 * burst; the bound is two seconds of reads.
	 */
	flood_case("a write amid reads, iops", &dev, NULL, 4096, NULL, &w, 20, 200);

	/*
	 * 10 MiB/s (2560 reads/s), a burst of 1 MiB; a write of the whole
	 * burst goes after the 32 reads before it, then its bucket fills for
	 * it alone. The bound is half a second of reads.
	 */
	dev = (struct rnbd_qos_limits){ .size = sizeof(dev), .bps = 10u << 20 };
	w = (struct rnbd_qos_item){ .read = false, .bytes = 1u << 20 };
	flood_case("a 1 MiB write amid 4 KiB reads, bps", &dev, NULL, 4096, NULL, &w, 512, 1280);

	/*
	 * Its session's write_iops (10/s, a burst of 1) holds it first: pre,
	 * a write without bytes (write zeroes), takes the token and passes the
	 * device's byte limit. Then the device's bytes (1 MiB/s: 256 reads/s,
	 * a burst of 25), which the reads drain: it goes after its session's
	 * tenth of a second (26 reads and a burst) and the 32 reads before it
	 * at the device. The bound is two seconds of reads.
	 */
	dev = (struct rnbd_qos_limits){ .size = sizeof(dev), .bps = 1u << 20 };
	w = (struct rnbd_qos_item){ .read = false, .bytes = 4096 };
	pre = (struct rnbd_qos_item){ .read = false, .bytes = 0 };
	flood_case("a write held by its session, then amid reads on its device", &dev, &sess, 4096,
		   &pre, &w, 50, 512);
}

/*
 * A read held by its own direction's limit (read_bps) holds no write back:
 * 50 writes beside a read flood held at 10 reads/s all go before 20 more
 * reads went (held behind every read before them, they would wait for 32).
 */
static void test_direction_apart(void)
{
	const struct rnbd_qos_limits dev = { .size = sizeof(dev), .iops = 1000,
					     .read_bps = 10 * 4096 };
	static struct rnbd_qos_item reads[FLOOD_DEPTH], writes[50];
	struct rnbd_qos *gd;
	unsigned r0;

	memset(&fl, 0, sizeof(fl));
	CHECK_EQ(rnbd_qos_ctx_open(flood_dispatch, &fl.ctx), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_DEVICE, "d", &dev, &gd), 0);
	for (int i = 0; i < FLOOD_DEPTH; i++) {
		reads[i] = (struct rnbd_qos_item){ .g = { NULL, NULL, gd }, .read = true, .bytes = 4096 };
		if (rnbd_qos_admit(fl.ctx, &reads[i]))
			flood_read(&reads[i]);
	}
	r0 = atomic_load(&fl.reads);
	for (int i = 0; i < 50; i++) {
		writes[i] = (struct rnbd_qos_item){ .g = { NULL, NULL, gd }, .read = false,
						    .bytes = 4096 };
		if (rnbd_qos_admit(fl.ctx, &writes[i]))
			atomic_fetch_add(&fl.writes, 1);
	}
	for (uint64_t end = now_ns() + 60000000000ull;
	     atomic_load(&fl.writes) < 50 && atomic_load(&fl.reads) - r0 < 20 && now_ns() < end;)
		usleep(1000);
	CHECK_EQ(atomic_load(&fl.writes), 50);
	atomic_store(&fl.stop, true);
	rnbd_qos_ctx_close(fl.ctx);
}

/*
 * One device of an owner dropped (a force-close): its items held are
 * answered with -ENOTCONN at once, not as their tokens come (1/s here),
 * and only those: the owner's other device and another owner's items on
 * the device stay held.
 */
static void test_drop_dev(void)
{
	const struct rnbd_qos_limits l = { .size = sizeof(l), .write_iops = 1 };
	static struct rnbd_qos_item it[12];
	struct rnbd_qos_stats st = { .size = sizeof(st) };
	int owner_a, owner_b, dev_x, dev_y;
	unsigned held = 0;
	struct rnbd_qos *g;

	memset(&fl, 0, sizeof(fl));
	fl.drop_owner = &owner_a;
	fl.drop_dev = &dev_x;
	CHECK_EQ(rnbd_qos_ctx_open(flood_dispatch, &fl.ctx), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_DEVICE, "d", &l, &g), 0);
	for (int i = 0; i < 12; i++) {
		it[i] = (struct rnbd_qos_item){
			.g = { NULL, NULL, g }, .read = false, .bytes = 4096,
			.owner = i < 9 ? &owner_a : &owner_b,
			.dev = i < 6 || i > 8 ? &dev_x : &dev_y,
		};
		if (rnbd_qos_admit(fl.ctx, &it[i]))
			atomic_fetch_add(&fl.writes, 1);
		else
			held++;
	}
	CHECK_EQ(held, 11); /* the first took the burst */
	rnbd_qos_drop(fl.ctx, &owner_a, &dev_x);
	for (uint64_t end = now_ns() + 60000000000ull;
	     atomic_load(&fl.dropped) < 5 && now_ns() < end;)
		usleep(1000);
	CHECK_EQ(atomic_load(&fl.dropped), 5);
	CHECK_EQ(atomic_load(&fl.dropped_wrong), 0);
	rnbd_qos_get(fl.ctx, g, NULL, &st);
	CHECK_EQ(st.queued + atomic_load(&fl.writes), 7); /* 6 held still, or went meanwhile */
	atomic_store(&fl.stop, true);
	rnbd_qos_ctx_close(fl.ctx);
	CHECK_EQ(atomic_load(&fl.dropped), 5);
	CHECK_EQ(atomic_load(&fl.writes), 7);
}

/*
 * A host's limit is shared by its sessions: what one session took, the
 * other cannot; a session held by its own limit claims none of its host's
 * tokens meanwhile; another host's sessions do not wait for it. The host
 * allows 300/s (a burst of 30); session s1 1 write/s (a burst of 1).
 */
static void test_host(void)
{
	const struct rnbd_qos_limits lh = { .size = sizeof(lh), .iops = 300 };
	const struct rnbd_qos_limits ls1 = { .size = sizeof(ls1), .write_iops = 1 };
	const struct rnbd_qos_limits lh2 = { .size = sizeof(lh2), .iops = 100000 };
	static struct rnbd_qos_item s1[50], s2[120], other[100];
	struct rnbd_qos_stats st = { .size = sizeof(st) };
	struct rnbd_qos *gh, *gs1, *gh2;
	unsigned go1 = 0, go2 = 0, go3 = 0, refilled;
	uint64_t t0;
	int a, b, c;

	memset(&fl, 0, sizeof(fl));
	CHECK_EQ(rnbd_qos_ctx_open(flood_dispatch, &fl.ctx), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_HOST, "nqn.h1", &lh, &gh), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_SESSION, "s1", &ls1, &gs1), 0);
	CHECK_EQ(rnbd_qos_set(fl.ctx, RNBD_QOS_HOST, "nqn.h2", &lh2, &gh2), 0);
	CHECK(rnbd_qos_find(fl.ctx, RNBD_QOS_HOST, "nqn.h1") == gh &&
	      rnbd_qos_find(fl.ctx, RNBD_QOS_SESSION, "nqn.h1") == NULL, "kinds apart");
	t0 = now_ns();
	/* s1's writes: its own burst of 1 goes; the rest wait for s1, not for the host. */
	for (int i = 0; i < 50; i++) {
		s1[i] = (struct rnbd_qos_item){ .g = { gs1, gh, NULL }, .bytes = 4096, .owner = &a };
		go1 += rnbd_qos_admit(fl.ctx, &s1[i]);
	}
	/* s2, unlimited itself, gets what is left of its host's burst: 29. */
	for (int i = 0; i < 120; i++) {
		s2[i] = (struct rnbd_qos_item){ .g = { NULL, gh, NULL }, .bytes = 4096, .owner = &b };
		go2 += rnbd_qos_admit(fl.ctx, &s2[i]);
	}
	/* Another host's session: none of it waits. */
	for (int i = 0; i < 100; i++) {
		other[i] = (struct rnbd_qos_item){ .g = { NULL, gh2, NULL }, .read = true,
						   .bytes = 4096, .owner = &c };
		go3 += rnbd_qos_admit(fl.ctx, &other[i]);
	}
	refilled = (unsigned)((now_ns() - t0) * 300 / 1000000000ull) + 1;
	CHECK(go1 >= 1 && go1 <= 1 + refilled / 300 + 1, "s1: its burst goes: %u", go1);
	CHECK(go2 >= 29 && go2 <= 29 + refilled, "s2: the host's burst less s1's one: %u (%u of "
	      "refill)", go2, refilled);
	CHECK_EQ(go3, 100);
	/* s2's held ones pass at the host's rate (about 0.3 s); s1's stay held by s1. */
	atomic_store(&fl.writes, 0);
	for (uint64_t end = now_ns() + 60000000000ull;
	     atomic_load(&fl.writes) < 120 - go2 && now_ns() < end;)
		usleep(1000);
	CHECK(atomic_load(&fl.writes) >= 120 - go2, "s2's held writes went: %u of %u",
	      atomic_load(&fl.writes), 120 - go2);
	CHECK(now_ns() - t0 >= (120 - go2 - 30) * 1000000000ull / 300,
	      "not before the host's tokens: %llu ns", (unsigned long long)(now_ns() - t0));
	rnbd_qos_get(fl.ctx, gh, NULL, &st);
	CHECK(st.delayed >= 120 - go2 && st.delayed < 120 - go2 + 50,
	      "the host delayed s2's held ones (and none of s1's at the host yet): %llu",
	      (unsigned long long)st.delayed);
	rnbd_qos_drop(fl.ctx, &a, NULL);
	atomic_store(&fl.stop, true);
	rnbd_qos_ctx_close(fl.ctx);
}

int main(void)
{
	test_buckets();
	test_parse();
	test_ctx();
	test_fairness();
	test_direction_apart();
	test_drop_dev();
	test_host();
	return test_done("rnbd-qos");
}
