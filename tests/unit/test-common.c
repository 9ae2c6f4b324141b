/* SPDX-License-Identifier: MIT */
/*
 * Unit tests for lib/common: the integer and parsing helpers (util.h), the
 * option table parser (opts.h), the service loop (loop.h) and the memory
 * key permutation (keyperm.h), the offload workers' queue (offload.h).
 *
 * Loop tests never rely on a sleep for ordering: a "blocker" work item holds
 * the loop thread while the test queues more work, and loop_call() is used
 * as a barrier before counters are read. Sleeps only measure timers, with
 * bounds wide enough for a loaded two-core machine under ASan.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/sysmacros.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "keyperm.h"
#include "loop.h"
#include "offload.h"
#include "opts.h"
#include "util.h"

/* ---- helpers ------------------------------------------------------------ */

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* Polls until *v >= want or timeout_ms passes; returns whether it got there. */
static bool wait_uint_ge(atomic_uint *v, unsigned want, unsigned timeout_ms)
{
	uint64_t end = now_ms() + timeout_ms;

	while (atomic_load(v) < want) {
		if (now_ms() > end)
			return false;
		sleep_ms(1);
	}
	return true;
}

/* The --help text of table t into buf; opts_parse's return code. */
static int help_text(const struct opt *t, const char *usage, char *buf, size_t len)
{
	char *argv[] = { (char *)"prog", (char *)"--help", NULL };
	struct capture c;
	int fp = -1, rc, err;

	capture_begin(&c, 1);
	err = quiet_begin(2);
	rc = opts_parse(t, "prog", usage, 2, argv, &fp);
	quiet_end(2, err);
	capture_end(&c, buf, len);
	return rc;
}

/* ---- util.h: bit helpers and wire integers ------------------------------ */

static void test_bits(void)
{
	CHECK_EQ(bits_for(0), 1);
	CHECK_EQ(bits_for(1), 1);
	CHECK_EQ(bits_for(2), 2);
	CHECK_EQ(bits_for(3), 2);
	CHECK_EQ(bits_for(4), 3);
	CHECK_EQ(bits_for(255), 8);
	CHECK_EQ(bits_for(256), 9);
	CHECK_EQ(bits_for(UINT32_MAX), 32);
	CHECK_EQ(bits_for((uint64_t)UINT32_MAX + 1), 33);
	CHECK_EQ(bits_for(UINT64_MAX >> 1), 63);
	CHECK_EQ(bits_for(UINT64_MAX), 64);

	CHECK(!is_pow2(0));
	CHECK(is_pow2(1));
	CHECK(is_pow2(2));
	CHECK(!is_pow2(3));
	CHECK(is_pow2(4096));
	CHECK(!is_pow2(4097));
	CHECK(!is_pow2(4095));
	CHECK(is_pow2(1ull << 63));
	CHECK(!is_pow2((1ull << 63) + 1));
	CHECK(!is_pow2(UINT64_MAX));
	/* Every single bit is a power of two, and no two-bit value is. */
	for (unsigned i = 0; i < 64; i++) {
		CHECK(is_pow2(1ull << i), "bit %u", i);
		CHECK(bits_for(1ull << i) == i + 1, "bits_for(1 << %u) = %u", i,
		      bits_for(1ull << i));
		if (i)
			CHECK(!is_pow2((1ull << i) | 1), "bit %u | 1", i);
	}
}

static void test_le(void)
{
	struct le16 a = le16_put(0x1234);
	struct le32 b = le32_put(0x12345678u);
	struct le64 c = le64_put(0x0123456789abcdefull);
	static const uint8_t want16[] = { 0x34, 0x12 };
	static const uint8_t want32[] = { 0x78, 0x56, 0x34, 0x12 };
	static const uint8_t want64[] = { 0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01 };
	uint8_t bytes[8];

	CHECK_EQ(sizeof(a), 2);
	CHECK_EQ(sizeof(b), 4);
	CHECK_EQ(sizeof(c), 8);

	/* Byte order in memory is little-endian whatever the host is. */
	memcpy(bytes, &a, sizeof(a));
	CHECK(!memcmp(bytes, want16, sizeof(want16)), "le16 bytes %02x %02x", bytes[0], bytes[1]);
	memcpy(bytes, &b, sizeof(b));
	CHECK(!memcmp(bytes, want32, sizeof(want32)), "le32 bytes %02x %02x %02x %02x", bytes[0],
	      bytes[1], bytes[2], bytes[3]);
	memcpy(bytes, &c, sizeof(c));
	CHECK(!memcmp(bytes, want64, sizeof(want64)), "le64 first byte %02x last %02x", bytes[0],
	      bytes[7]);

	/* Reading raw little-endian bytes gives the value back. */
	memcpy(&a, want16, sizeof(a));
	CHECK_EQ(le16_get(a), 0x1234);
	memcpy(&b, want32, sizeof(b));
	CHECK_EQ(le32_get(b), 0x12345678u);
	memcpy(&c, want64, sizeof(c));
	CHECK(le64_get(c) == 0x0123456789abcdefull);

	/* Round trips, including the extremes. */
	static const uint64_t vals[] = { 0, 1, 0x80, 0xff, 0x100, 0x7fff, 0x8000, 0xffff,
					 0x10000, 0x7fffffff, 0x80000000u, UINT32_MAX,
					 (uint64_t)UINT32_MAX + 1, 0x8000000000000000ull,
					 UINT64_MAX };

	for (unsigned i = 0; i < ARRAY_SIZE(vals); i++) {
		uint64_t v = vals[i];

		CHECK(le16_get(le16_put((uint16_t)v)) == (uint16_t)v, "le16 %#llx",
		      (unsigned long long)v);
		CHECK(le32_get(le32_put((uint32_t)v)) == (uint32_t)v, "le32 %#llx",
		      (unsigned long long)v);
		CHECK(le64_get(le64_put(v)) == v, "le64 %#llx", (unsigned long long)v);
	}
}

/* ---- util.h: parse_u64 / parse_size ------------------------------------- */

#define SENTINEL 0x5a5a5a5a5a5a5a5aull

/* A parse that must succeed with the given value. */
#define CHECK_PARSE_OK(fn, s, lo, hi, want)                                           \
	do {                                                                          \
		uint64_t v_ = SENTINEL;                                               \
		int rc_ = fn((s), (lo), (hi), &v_);                                   \
		CHECK(rc_ == 0 && v_ == (uint64_t)(want), "%s(\"%s\") = %d, %llu", #fn, \
		      (s), rc_, (unsigned long long)v_);                              \
	} while (0)

/* A parse that must fail with the given errno and leave *out alone. */
#define CHECK_PARSE_ERR(fn, s, lo, hi, err)                                           \
	do {                                                                          \
		uint64_t v_ = SENTINEL;                                               \
		int rc_ = fn((s), (lo), (hi), &v_);                                   \
		CHECK(rc_ == (err), "%s(\"%s\") = %d, want %d", #fn, (s) ? (s) : "NULL", \
		      rc_, (int)(err));                                               \
		CHECK(v_ == SENTINEL, "%s(\"%s\") wrote %llu on error", #fn,          \
		      (s) ? (s) : "NULL", (unsigned long long)v_);                    \
	} while (0)

static void test_parse_u64(void)
{
	CHECK_PARSE_OK(parse_u64, "0", 0, 10, 0);
	CHECK_PARSE_OK(parse_u64, "10", 0, 10, 10);
	CHECK_PARSE_OK(parse_u64, "5", 5, 5, 5);
	CHECK_PARSE_OK(parse_u64, "007", 0, 10, 7);
	CHECK_PARSE_OK(parse_u64, "18446744073709551615", 0, UINT64_MAX, UINT64_MAX);
	CHECK_PARSE_OK(parse_u64, "4294967296", 0, UINT64_MAX, 4294967296ull);

	/* Range: both ends are inclusive, one past either is -ERANGE. */
	CHECK_PARSE_ERR(parse_u64, "11", 0, 10, -ERANGE);
	CHECK_PARSE_ERR(parse_u64, "4", 5, 10, -ERANGE);
	CHECK_PARSE_ERR(parse_u64, "0", 1, 65535, -ERANGE);
	CHECK_PARSE_ERR(parse_u64, "65536", 1, 65535, -ERANGE);
	CHECK_PARSE_OK(parse_u64, "65535", 1, 65535, 65535);

	/* Overflow of the type itself. */
	CHECK_PARSE_ERR(parse_u64, "18446744073709551616", 0, UINT64_MAX, -ERANGE);
	CHECK_PARSE_ERR(parse_u64, "99999999999999999999999", 0, UINT64_MAX, -ERANGE);

	/* Junk, empty, sign. */
	CHECK_PARSE_ERR(parse_u64, "", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, NULL, 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "abc", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "12x", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "1 ", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "1.5", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "0x10", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "4K", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "-", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "-1", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "-0", 0, UINT64_MAX, -EINVAL);
	/*
	 * A negative number behind leading blanks must be refused too:
	 * strtoull() skips the blanks and negates, so " -1" would otherwise
	 * come back as UINT64_MAX.
	 */
	CHECK_PARSE_ERR(parse_u64, " -1", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_u64, "\t-5", 0, UINT64_MAX, -EINVAL);
}

static void test_parse_size(void)
{
	CHECK_PARSE_OK(parse_size, "0", 0, UINT64_MAX, 0);
	CHECK_PARSE_OK(parse_size, "4096", 0, UINT64_MAX, 4096);
	CHECK_PARSE_OK(parse_size, "1k", 0, UINT64_MAX, 1024);
	CHECK_PARSE_OK(parse_size, "4K", 0, UINT64_MAX, 4096);
	CHECK_PARSE_OK(parse_size, "4KB", 0, UINT64_MAX, 4096);
	CHECK_PARSE_OK(parse_size, "4KiB", 0, UINT64_MAX, 4096);
	CHECK_PARSE_OK(parse_size, "3m", 0, UINT64_MAX, 3ull << 20);
	CHECK_PARSE_OK(parse_size, "3M", 0, UINT64_MAX, 3ull << 20);
	CHECK_PARSE_OK(parse_size, "3MB", 0, UINT64_MAX, 3ull << 20);
	CHECK_PARSE_OK(parse_size, "3MiB", 0, UINT64_MAX, 3ull << 20);
	CHECK_PARSE_OK(parse_size, "2g", 0, UINT64_MAX, 2ull << 30);
	CHECK_PARSE_OK(parse_size, "2G", 0, UINT64_MAX, 2ull << 30);
	CHECK_PARSE_OK(parse_size, "2GB", 0, UINT64_MAX, 2ull << 30);
	CHECK_PARSE_OK(parse_size, "2GiB", 0, UINT64_MAX, 2ull << 30);
	CHECK_PARSE_OK(parse_size, "5T", 0, UINT64_MAX, 5ull << 40);
	CHECK_PARSE_OK(parse_size, "5TiB", 0, UINT64_MAX, 5ull << 40);
	CHECK_PARSE_OK(parse_size, "0K", 0, UINT64_MAX, 0);
	CHECK_PARSE_OK(parse_size, "18446744073709551615", 0, UINT64_MAX, UINT64_MAX);

	/* Only the exact "B" and "iB" tails are accepted after a suffix. */
	CHECK_PARSE_ERR(parse_size, "4Ki", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4kib", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4Kb", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4KiBx", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4KK", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4B", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4P", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4E", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4 K", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "4K ", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "K", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, NULL, 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "-", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, "-4K", 0, UINT64_MAX, -EINVAL);
	CHECK_PARSE_ERR(parse_size, " -1", 0, UINT64_MAX, -EINVAL);

	/* Range applies to the value after the suffix is applied. */
	CHECK_PARSE_OK(parse_size, "4K", 4096, 4096, 4096);
	CHECK_PARSE_ERR(parse_size, "4K", 0, 4095, -ERANGE);
	CHECK_PARSE_ERR(parse_size, "4K", 4097, UINT64_MAX, -ERANGE);
	CHECK_PARSE_ERR(parse_size, "1M", 0, 1023 * 1024, -ERANGE);

	/* Overflow: of strtoull itself, and when the suffix shifts it out. */
	CHECK_PARSE_ERR(parse_size, "18446744073709551616", 0, UINT64_MAX, -ERANGE);
	CHECK_PARSE_OK(parse_size, "17179869183G", 0, UINT64_MAX, 17179869183ull << 30);
	CHECK_PARSE_ERR(parse_size, "17179869184G", 0, UINT64_MAX, -ERANGE);
	CHECK_PARSE_OK(parse_size, "17592186044415M", 0, UINT64_MAX, 17592186044415ull << 20);
	CHECK_PARSE_ERR(parse_size, "17592186044416M", 0, UINT64_MAX, -ERANGE);
	CHECK_PARSE_OK(parse_size, "18014398509481983K", 0, UINT64_MAX,
		       18014398509481983ull << 10);
	CHECK_PARSE_ERR(parse_size, "18014398509481984K", 0, UINT64_MAX, -ERANGE);
	CHECK_PARSE_ERR(parse_size, "18446744073709551615K", 0, UINT64_MAX, -ERANGE);
}

/* ---- util.h: rand_below -------------------------------------------------- */

static void test_rand(void)
{
	static const uint32_t bounds[] = { 2, 3, 7, 10, 1000, 0x80000001u, UINT32_MAX };
	unsigned seen[7] = { 0 };
	bool all_below = true;
	uint8_t buf[64];

	for (unsigned i = 0; i < 100; i++) {
		CHECK_EQ(rand_below(0), 0);
		CHECK_EQ(rand_below(1), 0);
	}
	for (unsigned b = 0; b < ARRAY_SIZE(bounds); b++) {
		for (unsigned i = 0; i < 2000; i++) {
			uint32_t r = rand_below(bounds[b]);

			if (r >= bounds[b]) {
				all_below = false;
				CHECK(r < bounds[b], "rand_below(%u) = %u", bounds[b], r);
				break;
			}
		}
	}
	CHECK(all_below);

	/* Every value of a small bound shows up; missing one has p ~ 1e-600. */
	for (unsigned i = 0; i < 10000; i++) {
		uint32_t r = rand_below(7);

		if (r < 7)
			seen[r]++;
	}
	for (unsigned v = 0; v < 7; v++)
		CHECK(seen[v] > 0, "value %u never drawn from rand_below(7)", v);
	/* And roughly uniformly: expected 1428 each, sd ~35. */
	for (unsigned v = 0; v < 7; v++)
		CHECK(seen[v] > 1100 && seen[v] < 1800, "rand_below(7): %u drawn %u times", v,
		      seen[v]);

	/* rand_bytes fills the buffer (64 zero bytes after it: p = 2^-512). */
	memset(buf, 0, sizeof(buf));
	CHECK_EQ(rand_bytes(buf, sizeof(buf)), 0);
	{
		bool nonzero = false;

		for (unsigned i = 0; i < sizeof(buf); i++)
			nonzero |= buf[i] != 0;
		CHECK(nonzero);
	}
	CHECK_EQ(rand_bytes(buf, 0), 0);
}

/* ---- opts.h -------------------------------------------------------------- */

static const char *const modes[] = { "read", "write", "mixed", NULL };

struct opt_vals {
	bool verbose;
	bool quiet;
	uint64_t depth;
	uint64_t size;
	const char *name;
	unsigned mode;
	struct opt_list peers;
};

static void vals_reset(struct opt_vals *v)
{
	free(v->peers.items);
	memset(v, 0, sizeof(*v));
	v->depth = 5;
	v->size = 4096;
	v->mode = 1;
}

static void table_init(struct opt *t, struct opt_vals *v)
{
	const struct opt tab[] = {
		{ .name = "verbose", .short_name = 'v', .type = OPT_FLAG, .ptr = &v->verbose,
		  .help = "more output" },
		{ .name = "quiet", .type = OPT_FLAG, .ptr = &v->quiet, .help = "less output" },
		{ .name = "depth", .short_name = 'd', .type = OPT_UINT, .ptr = &v->depth,
		  .min = 1, .max = 128, .arg = "N", .help = "queue depth" },
		{ .name = "size", .short_name = 's', .type = OPT_SIZE, .ptr = &v->size,
		  .min = 512, .max = 1ull << 30, .arg = "BYTES", .help = "chunk size" },
		{ .name = "name", .short_name = 'n', .type = OPT_STRING, .ptr = &v->name,
		  .arg = "STR", .help = "session name" },
		{ .name = "mode", .short_name = 'm', .type = OPT_CHOICE, .ptr = &v->mode,
		  .choices = modes, .arg = "MODE", .help = "io mode" },
		{ .name = "peer", .short_name = 'p', .type = OPT_LIST, .ptr = &v->peers,
		  .arg = "ADDR", .help = "peer address" },
		{ 0 },
	};

	memcpy(t, tab, sizeof(tab));
}

#define NOPTS 8

/*
 * Parses a NULL-terminated list of arguments (argv[0] is supplied) with the
 * output silenced unless show is set. The argv array lives in *store so that
 * strings the parser keeps (OPT_STRING, OPT_LIST) stay valid.
 */
struct argv_store {
	char *argv[16];
	int argc;
};

static int parse_args(const struct opt *t, struct argv_store *st, int *first_pos,
		      const char *const *args)
{
	int out, err, rc;

	st->argc = 0;
	st->argv[st->argc++] = (char *)"prog";
	while (*args && st->argc < (int)ARRAY_SIZE(st->argv) - 1)
		st->argv[st->argc++] = (char *)*args++;
	st->argv[st->argc] = NULL;
	*first_pos = -1;
	out = quiet_begin(1);
	err = quiet_begin(2);
	rc = opts_parse(t, "prog", "[options] ARGS", st->argc, st->argv, first_pos);
	quiet_end(2, err);
	quiet_end(1, out);
	return rc;
}

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })

static void test_opts_parse(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	struct argv_store st;
	int fp, rc;

	table_init(t, &v);

	/* No arguments: defaults are untouched. */
	vals_reset(&v);
	st.argc = 1;
	st.argv[0] = (char *)"prog";
	st.argv[1] = NULL;
	rc = opts_parse(t, "prog", "", 1, st.argv, &fp);
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 1);
	CHECK(!v.verbose && !v.quiet);
	CHECK_EQ(v.depth, 5);
	CHECK_EQ(v.size, 4096);
	CHECK(v.name == NULL);
	CHECK_EQ(v.mode, 1);
	CHECK_EQ(v.peers.n, 0);

	/* Every type, long forms, both "--opt value" and "--opt=value". */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp,
			ARGS("--verbose", "--quiet", "--depth", "128", "--size=64K", "--name",
			     "sess", "--mode=mixed", "--peer", "a:1", "--peer=b:2", "--peer",
			     "[::1]:3"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, st.argc);
	CHECK(v.verbose);
	CHECK(v.quiet);
	CHECK_EQ(v.depth, 128);
	CHECK_EQ(v.size, 64 * 1024);
	CHECK(v.name && !strcmp(v.name, "sess"), "name = %s", v.name ? v.name : "NULL");
	CHECK_EQ(v.mode, 2);
	CHECK_EQ(v.peers.n, 3);
	if (v.peers.n == 3) {
		CHECK(!strcmp(v.peers.items[0], "a:1"));
		CHECK(!strcmp(v.peers.items[1], "b:2"));
		CHECK(!strcmp(v.peers.items[2], "[::1]:3"));
	}

	/* Short forms, clustered flags and attached arguments. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp,
			ARGS("-v", "-d1", "-s", "1M", "-nfoo", "-m", "read", "-px", "-p", "y"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, st.argc);
	CHECK(v.verbose);
	CHECK(!v.quiet);
	CHECK_EQ(v.depth, 1);
	CHECK_EQ(v.size, 1 << 20);
	CHECK(v.name && !strcmp(v.name, "foo"));
	CHECK_EQ(v.mode, 0);
	CHECK_EQ(v.peers.n, 2);
	if (v.peers.n == 2) {
		CHECK(!strcmp(v.peers.items[0], "x"));
		CHECK(!strcmp(v.peers.items[1], "y"));
	}
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-vd", "7"));
	CHECK_EQ(rc, 0);
	CHECK(v.verbose);
	CHECK_EQ(v.depth, 7);

	/* Positionals are left for the caller: parsing stops at the first one. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-v", "--depth", "9", "file1", "--quiet", "file2"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 4);
	CHECK(fp == 4 && !strcmp(st.argv[fp], "file1"));
	CHECK(v.verbose);
	CHECK(!v.quiet, "--quiet after a positional must not be parsed");
	CHECK_EQ(v.depth, 9);
	CHECK_EQ(st.argc, 7);

	/* "--" ends the options; what follows is positional even if dashed. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-v", "--", "--quiet"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 3);
	CHECK(fp == 3 && !strcmp(st.argv[fp], "--quiet"));
	CHECK(!v.quiet);

	/* A lone positional. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("only"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 1);

	/* Unambiguous long prefixes are getopt_long's, and accepted. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--dep", "3"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(v.depth, 3);
}

static void test_opts_errors(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	struct argv_store st;
	int fp, rc;

	table_init(t, &v);

#define CHECK_OPTS_EINVAL(...)                                                     \
	do {                                                                       \
		vals_reset(&v);                                                    \
		rc = parse_args(t, &st, &fp, ARGS(__VA_ARGS__));                   \
		CHECK(rc == -EINVAL, "opts_parse(%s) = %d, want -EINVAL", #__VA_ARGS__, rc); \
	} while (0)

	/* UINT out of range at both ends, junk, negative. */
	CHECK_OPTS_EINVAL("--depth", "0");
	CHECK_EQ(v.depth, 5);
	CHECK_OPTS_EINVAL("--depth", "129");
	CHECK_EQ(v.depth, 5);
	CHECK_OPTS_EINVAL("-d", "12x");
	CHECK_OPTS_EINVAL("--depth=-1");
	CHECK_OPTS_EINVAL("--depth=");
	CHECK_OPTS_EINVAL("--depth", "99999999999999999999999");

	/* SIZE: out of range, bad suffix. */
	CHECK_OPTS_EINVAL("--size", "511");
	CHECK_EQ(v.size, 4096);
	CHECK_OPTS_EINVAL("--size", "2G");
	CHECK_OPTS_EINVAL("--size", "4X");
	CHECK_OPTS_EINVAL("-s", "4Kx");
	CHECK_EQ(v.size, 4096);

	/* CHOICE: not in the list, case matters, prefixes are not choices. */
	CHECK_OPTS_EINVAL("--mode", "append");
	CHECK_EQ(v.mode, 1);
	CHECK_OPTS_EINVAL("--mode", "READ");
	CHECK_OPTS_EINVAL("-m", "rea");
	CHECK_OPTS_EINVAL("--mode=");

	/* Unknown options, long and short. */
	CHECK_OPTS_EINVAL("--bogus");
	CHECK_OPTS_EINVAL("--bogus=1");
	CHECK_OPTS_EINVAL("-x");
	CHECK_OPTS_EINVAL("-vx");
	CHECK(v.verbose, "-v before the unknown -x was applied");

	/* Missing arguments, long and short. */
	CHECK_OPTS_EINVAL("--depth");
	CHECK_OPTS_EINVAL("-d");
	CHECK_OPTS_EINVAL("-v", "--name");
	CHECK_OPTS_EINVAL("--peer");
	CHECK_EQ(v.peers.n, 0);

	/* A flag given an argument. */
	CHECK_OPTS_EINVAL("--verbose=yes");

	/* An error stops parsing: later options are not applied. */
	CHECK_OPTS_EINVAL("--depth", "0", "--quiet");
	CHECK(!v.quiet);

#undef CHECK_OPTS_EINVAL

	/* --help and -h print and return 1 with nothing else applied after. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--help", "--quiet"));
	CHECK_EQ(rc, 1);
	CHECK(!v.quiet);
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-h"));
	CHECK_EQ(rc, 1);
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--verbose", "--he"));
	CHECK_EQ(rc, 1);
	CHECK(v.verbose);
	vals_reset(&v);
}

/* --help goes to stdout and lists every option, the choices and defaults. */
static void test_opts_help(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	char buf[4096];
	int rc;

	table_init(t, &v);
	vals_reset(&v);
	v.name = "dflt";
	rc = help_text(t, "[options] FILE", buf, sizeof(buf));

	CHECK_EQ(rc, 1);
	CHECK(strstr(buf, "Usage: prog [options] FILE") != NULL, "help:\n%s", buf);
	CHECK(strstr(buf, "-v, --[no-]verbose") != NULL);
	CHECK(strstr(buf, "    --[no-]quiet") != NULL);
	CHECK(strstr(buf, "-d, --depth N") != NULL);
	CHECK(strstr(buf, "(default 5)") != NULL);
	CHECK(strstr(buf, "(default 4096)") != NULL);
	CHECK(strstr(buf, "(default dflt)") != NULL);
	CHECK(strstr(buf, "[read|write|mixed] (default write)") != NULL);
	CHECK(strstr(buf, "-p, --peer ADDR") != NULL);
	CHECK(strstr(buf, "-h, --help") != NULL);
	CHECK(strstr(buf, "--version") != NULL);
	vals_reset(&v);

	/* --version: "PROG VERSION" on stdout (PROG's first word), 1 as for --help. */
	{
		char *argv[] = { (char *)"prog", (char *)"-d", (char *)"7", (char *)"--version",
				 NULL };
		char want[64];
		struct capture c;
		int fp = -1, err;

		capture_begin(&c, 1);
		err = quiet_begin(2);
		rc = opts_parse(t, "prog sub", "", 4, argv, &fp);
		quiet_end(2, err);
		capture_end(&c, buf, sizeof(buf));
		snprintf(want, sizeof(want), "prog %s\n", opts_version());
		CHECK_EQ(rc, 1);
		CHECK(!strcmp(buf, want), "--version printed '%s'", buf);
		CHECK(opts_version()[0] >= '0' && opts_version()[0] <= '9');
		char *top[] = { (char *)"tool", (char *)"--version", NULL };

		capture_begin(&c, 1);
		CHECK(opts_version_arg(2, top, "tool"));
		capture_end(&c, buf, sizeof(buf));
		snprintf(want, sizeof(want), "tool %s\n", opts_version());
		CHECK(!strcmp(buf, want), "opts_version_arg printed '%s'", buf);
		CHECK(!opts_version_arg(1, top, "tool"));
		top[1] = (char *)"--versio";
		CHECK(!opts_version_arg(2, top, "tool"));
	}
	vals_reset(&v);
}

/* What opts_man_item writes for one item, into buf (NUL-terminated); its return value. */
static int man_item(char *buf, size_t len, const char *term, const char *arg, const char *help,
		    const char *dflt)
{
	FILE *f = fmemopen(buf, len, "w");
	int rc, err;

	if (!f)
		return -errno;
	err = quiet_begin(2);
	rc = opts_man_item(f, term, arg, help, dflt);
	quiet_end(2, err);
	fclose(f);
	return rc;
}

/*
 * The man pages' items (docs/man/): scdoc markup, the text escaped where
 * scdoc would read markup into it, and a text roff would take as a request
 * refused. Also the table as items through opts_help (RTRS_HELP_FORMAT).
 */
static void test_opts_man(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	char buf[4096];

	CHECK_EQ(man_item(buf, sizeof(buf), "-d, --depth", "N", "queue depth", "5"), 0);
	CHECK(!strcmp(buf, "*-d, --depth* _N_\n\tQueue depth. Default: 5.\n\n"), "item: '%s'", buf);
	CHECK_EQ(man_item(buf, sizeof(buf), "io_size=", "BYTES", "a *big* one_two \\ x", ""), 0);
	CHECK(!strcmp(buf, "*io\\_size=*_BYTES_\n\tA \\*big\\* one\\_two \\\\ x.\n\n"),
	      "escapes: '%s'", buf);
	CHECK_EQ(man_item(buf, sizeof(buf), "x", NULL, "-1: never", NULL), 0);
	CHECK(strstr(buf, "\t\\-1: never.") != NULL, "a leading '-' escaped: '%s'", buf);
	CHECK_EQ(man_item(buf, sizeof(buf), "x", NULL, "[a|b]", NULL), 0);
	CHECK(strstr(buf, "\t\\[a|b].") != NULL, "a leading '[' escaped: '%s'", buf);
	CHECK_EQ(man_item(buf, sizeof(buf), "x", NULL, ".so evil", NULL), -EINVAL);
	CHECK_EQ(man_item(buf, sizeof(buf), "x", NULL, "'br", NULL), -EINVAL);

	/* The table: long and short names, the argument, the default, flags with [no-]. */
	{
		struct capture c;

		table_init(t, &v);
		vals_reset(&v);
		setenv("RTRS_HELP_FORMAT", "man", 1);
		capture_begin(&c, 1);
		opts_help(t, "prog", "[options]");
		capture_end(&c, buf, sizeof(buf));
		CHECK(strstr(buf, "*-d, --depth* _N_\n\t") != NULL, "man:\n%s", buf);
		CHECK(strstr(buf, "*-v, --\\[no-\\]verbose*") == NULL &&
		      strstr(buf, "*-v, --[no-]verbose*") != NULL, "man:\n%s", buf);
		CHECK(strstr(buf, "Default: 5.") != NULL);
		CHECK(strstr(buf, "Usage:") == NULL, "no usage line in man items");
		setenv("RTRS_HELP_FORMAT", "man-config", 1);
		capture_begin(&c, 1);
		opts_help(t, "prog", "[options]");
		capture_end(&c, buf, sizeof(buf));
		CHECK(strstr(buf, "*depth* _N_") != NULL, "man-config:\n%s", buf);
		CHECK(strstr(buf, "--depth") == NULL, "man-config names have no dashes:\n%s", buf);
		unsetenv("RTRS_HELP_FORMAT");
		vals_reset(&v);
	}
}

/*
 * opts_parse is called more than once per process (tools parse, then parse
 * again; tests parse many tables). Each call must start from a clean getopt
 * state, including after the previous call stopped in the middle of a
 * cluster of short options ("-hv", "-xv"): getopt keeps a pointer into the
 * old argv that only optind = 0 (not 1) discards.
 */
static void test_opts_twice(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	struct argv_store st1, st2;
	int fp, rc;

	table_init(t, &v);

	vals_reset(&v);
	rc = parse_args(t, &st1, &fp, ARGS("--depth", "3", "pos"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 3);
	vals_reset(&v);
	rc = parse_args(t, &st2, &fp, ARGS("-d", "4", "a", "b"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(fp, 3);
	CHECK_EQ(v.depth, 4);

	/* After an error part way through the argument list. */
	vals_reset(&v);
	rc = parse_args(t, &st1, &fp, ARGS("-v", "--bogus", "-d", "9"));
	CHECK_EQ(rc, -EINVAL);
	vals_reset(&v);
	rc = parse_args(t, &st2, &fp, ARGS("-d", "6"));
	CHECK_EQ(rc, 0);
	CHECK_EQ(v.depth, 6);
	CHECK_EQ(fp, 3);

	/* After --help stopped inside a cluster: "-hv" leaves 'v' pending. */
	vals_reset(&v);
	rc = parse_args(t, &st1, &fp, ARGS("-hv"));
	CHECK_EQ(rc, 1);
	CHECK(!v.verbose);
	vals_reset(&v);
	rc = parse_args(t, &st2, &fp, ARGS("-d", "3"));
	CHECK_EQ(rc, 0);
	CHECK(!v.verbose, "second parse applied -v left over from the first");
	CHECK_EQ(v.depth, 3);
	CHECK_EQ(fp, 3);

	/* After an unknown option inside a cluster: "-xv" leaves 'v' pending. */
	vals_reset(&v);
	rc = parse_args(t, &st1, &fp, ARGS("-xv"));
	CHECK_EQ(rc, -EINVAL);
	vals_reset(&v);
	rc = parse_args(t, &st2, &fp, ARGS("pos"));
	CHECK_EQ(rc, 0);
	CHECK(!v.verbose, "second parse applied -v left over from the first");
	CHECK_EQ(fp, 1);
	vals_reset(&v);
}

/* opts_parse's error on stderr for args, into msg; its return code. */
static int parse_err(const struct opt *t, struct argv_store *st, const char *const *args,
		     char *msg, size_t len)
{
	struct capture c;
	int fp, rc;

	st->argc = 0;
	st->argv[st->argc++] = (char *)"prog";
	while (*args && st->argc < (int)ARRAY_SIZE(st->argv) - 1)
		st->argv[st->argc++] = (char *)*args++;
	st->argv[st->argc] = NULL;
	capture_begin(&c, 2);
	rc = opts_parse(t, "prog", "[options]", st->argc, st->argv, &fp);
	capture_end(&c, msg, len);
	return rc;
}

/*
 * What a refused option is told as: a missing argument is not an unknown
 * option ("-p" alone was called one), an argument to a flag, an unknown
 * or ambiguous name.
 */
static void test_opts_messages(void)
{
	static const struct { const char *args[3]; const char *want; } cases[] = {
		{ { "-d" }, "prog: option -d needs an argument (see --help)" },
		{ { "-v", "-d" }, "prog: option -d needs an argument" },
		{ { "-vd" }, "prog: option -d needs an argument" },
		{ { "--depth" }, "prog: option --depth needs an argument (see --help)" },
		{ { "--dep" }, "prog: option --depth needs an argument" },
		{ { "--peer" }, "prog: option --peer needs an argument" },
		{ { "-x" }, "prog: unknown option -x (see --help)" },
		{ { "--bogus" }, "prog: --bogus: unknown or ambiguous option" },
		{ { "--verbose=1" }, "prog: option --verbose takes no argument (--verbose=1)" },
		{ { "--no-quiet=no" }, "prog: option --no-quiet takes no argument" },
	};
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	struct argv_store st;
	char msg[512];

	table_init(t, &v);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		vals_reset(&v);
		CHECK_EQ(parse_err(t, &st, cases[i].args, msg, sizeof(msg)), -EINVAL);
		CHECK(strstr(msg, cases[i].want) != NULL, "%s: got \"%s\", want \"%s\"",
		      cases[i].args[0], msg, cases[i].want);
		CHECK(!strstr(msg, "unknown") || !strstr(cases[i].want, "needs"),
		      "%s called unknown: %s", cases[i].args[0], msg);
	}
	vals_reset(&v);
}

/* ---- loop.h -------------------------------------------------------------- */

/* Holds the loop thread until released, so that tests can queue behind it. */
struct blocker {
	struct loop_work w;
	struct loop *loop;
	atomic_uint started;
	atomic_uint release;
	atomic_uint done;
};

static void blocker_fn(struct loop_work *w)
{
	struct blocker *b = container_of(w, struct blocker, w);

	atomic_store(&b->started, 1);
	while (!atomic_load(&b->release))
		sleep_ms(1);
	atomic_store(&b->done, 1);
}

static void blocker_init(struct blocker *b, struct loop *l)
{
	memset(b, 0, sizeof(*b));
	b->loop = l;
	loop_work_init(&b->w, blocker_fn);
}

/* Queues b and returns once the loop thread is inside it. */
static bool blocker_hold(struct blocker *b)
{
	loop_queue(b->loop, &b->w);
	return wait_uint_ge(&b->started, 1, 5000);
}

struct counted_work {
	struct loop_work w;
	struct loop *loop;
	atomic_uint runs;
	atomic_uint in_thread;
	atomic_uint requeue;       /* re-queue itself while runs < requeue */
	unsigned *order;           /* shared sequence, written on the loop thread */
	unsigned *order_n;
	unsigned id;
};

static void counted_fn(struct loop_work *w)
{
	struct counted_work *c = container_of(w, struct counted_work, w);
	unsigned runs = atomic_fetch_add(&c->runs, 1) + 1;

	if (loop_in_thread(c->loop))
		atomic_fetch_add(&c->in_thread, 1);
	if (c->order)
		c->order[(*c->order_n)++] = c->id;
	if (runs < atomic_load(&c->requeue))
		loop_queue(c->loop, &c->w);
}

static void counted_init(struct counted_work *c, struct loop *l, unsigned id)
{
	memset(c, 0, sizeof(*c));
	c->loop = l;
	c->id = id;
	loop_work_init(&c->w, counted_fn);
}

static void noop(void *arg)
{
}

/* Waits for everything queued so far to have run. */
static void barrier(struct loop *l)
{
	loop_call(l, noop, NULL);
}

struct call_ctx {
	struct loop *loop;
	atomic_uint ran;
	atomic_uint in_thread;
	unsigned delay_ms;
};

static void call_fn(void *arg)
{
	struct call_ctx *c = arg;

	if (c->delay_ms)
		sleep_ms(c->delay_ms);
	if (loop_in_thread(c->loop))
		atomic_fetch_add(&c->in_thread, 1);
	atomic_fetch_add(&c->ran, 1);
}

/* A work item that uses loop_call from the loop thread itself. */
struct nested_call {
	struct loop_work w;
	struct call_ctx call;
	atomic_uint ran_before_return;
};

static void nested_call_fn(struct loop_work *w)
{
	struct nested_call *n = container_of(w, struct nested_call, w);

	loop_call(n->call.loop, call_fn, &n->call);
	atomic_store(&n->ran_before_return, atomic_load(&n->call.ran));
}

static void test_loop_work(void)
{
	struct loop *l = NULL;
	struct counted_work a, b, c;
	struct blocker blk;
	struct call_ctx call;
	struct nested_call nested;
	unsigned order[16], order_n = 0;
	int rc;

	rc = loop_create("test-loop", &l);
	CHECK_EQ(rc, 0);
	if (rc)
		return;
	CHECK(!loop_in_thread(l), "main thread is not the loop thread");

	/* loop_queue runs the work on the loop thread. */
	counted_init(&a, l, 1);
	loop_queue(l, &a.w);
	CHECK(wait_uint_ge(&a.runs, 1, 5000), "queued work never ran");
	barrier(l);
	CHECK_EQ(atomic_load(&a.runs), 1);
	CHECK_EQ(atomic_load(&a.in_thread), 1);

	/* Queued twice before it runs: runs once. Then queued again: runs again. */
	counted_init(&a, l, 1);
	blocker_init(&blk, l);
	CHECK(blocker_hold(&blk), "blocker never started");
	loop_queue(l, &a.w);
	loop_queue(l, &a.w);
	loop_queue(l, &a.w);
	CHECK_EQ(atomic_load(&a.runs), 0);
	atomic_store(&blk.release, 1);
	barrier(l);
	CHECK_EQ(atomic_load(&a.runs), 1);
	loop_queue(l, &a.w);
	barrier(l);
	CHECK_EQ(atomic_load(&a.runs), 2);
	CHECK_EQ(atomic_load(&a.in_thread), 2);

	/* FIFO order, and a double queue does not move an item back. */
	counted_init(&a, l, 1);
	counted_init(&b, l, 2);
	counted_init(&c, l, 3);
	a.order = b.order = c.order = order;
	a.order_n = b.order_n = c.order_n = &order_n;
	blocker_init(&blk, l);
	CHECK(blocker_hold(&blk), "blocker never started");
	loop_queue(l, &a.w);
	loop_queue(l, &b.w);
	loop_queue(l, &a.w);
	loop_queue(l, &c.w);
	atomic_store(&blk.release, 1);
	barrier(l);
	CHECK_EQ(order_n, 3);
	CHECK(order_n == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3,
	      "order %u %u %u", order[0], order[1], order[2]);

	/* A work item may queue itself again from its own function. */
	counted_init(&a, l, 1);
	atomic_store(&a.requeue, 5);
	loop_queue(l, &a.w);
	CHECK(wait_uint_ge(&a.runs, 5, 5000), "self re-queue stopped at %u",
	      atomic_load(&a.runs));
	barrier(l);
	CHECK_EQ(atomic_load(&a.runs), 5);
	CHECK_EQ(atomic_load(&a.in_thread), 5);

	/* loop_call runs on the loop thread and returns only after fn did. */
	memset(&call, 0, sizeof(call));
	call.loop = l;
	call.delay_ms = 30;
	loop_call(l, call_fn, &call);
	CHECK_EQ(atomic_load(&call.ran), 1);
	CHECK_EQ(atomic_load(&call.in_thread), 1);

	/* loop_call behind queued work: the work has run by the time it returns. */
	counted_init(&a, l, 1);
	blocker_init(&blk, l);
	CHECK(blocker_hold(&blk), "blocker never started");
	loop_queue(l, &a.w);
	atomic_store(&blk.release, 1);
	memset(&call, 0, sizeof(call));
	call.loop = l;
	loop_call(l, call_fn, &call);
	CHECK_EQ(atomic_load(&blk.done), 1);
	CHECK_EQ(atomic_load(&a.runs), 1);
	CHECK_EQ(atomic_load(&call.ran), 1);

	/* loop_call from the loop thread runs fn inline instead of deadlocking. */
	memset(&nested, 0, sizeof(nested));
	nested.call.loop = l;
	loop_work_init(&nested.w, nested_call_fn);
	loop_queue(l, &nested.w);
	barrier(l);
	CHECK_EQ(atomic_load(&nested.call.ran), 1);
	CHECK_EQ(atomic_load(&nested.call.in_thread), 1);
	CHECK_EQ(atomic_load(&nested.ran_before_return), 1);

	loop_destroy(l);
}

/* An fd handler: a pipe's read end, fed from the test thread. */
struct pipe_handler {
	struct loop_fd h;
	struct loop *loop;
	atomic_uint calls;
	atomic_uint bytes;
	atomic_uint in_thread;
};

static void pipe_cb(struct loop_fd *h, uint32_t events)
{
	struct pipe_handler *p = container_of(h, struct pipe_handler, h);
	char buf[64];
	ssize_t n;

	if (loop_in_thread(p->loop))
		atomic_fetch_add(&p->in_thread, 1);
	atomic_fetch_add(&p->calls, 1);
	while ((n = read(h->fd, buf, sizeof(buf))) > 0)
		atomic_fetch_add(&p->bytes, (unsigned)n);
}

static void pipe_del(void *arg)
{
	struct pipe_handler *p = arg;

	loop_del_fd(p->loop, &p->h);
}

static void test_loop_fd(void)
{
	struct loop *l = NULL;
	struct pipe_handler p;
	int fds[2];
	unsigned calls;

	if (pipe2(fds, O_NONBLOCK | O_CLOEXEC)) {
		CHECK(0, "pipe2: %s", strerror(errno));
		return;
	}
	CHECK_EQ(loop_create("test-fd", &l), 0);
	if (!l)
		return;
	memset(&p, 0, sizeof(p));
	p.loop = l;
	p.h.fd = fds[0];
	p.h.cb = pipe_cb;
	CHECK_EQ(loop_add_fd(l, &p.h, EPOLLIN), 0);
	CHECK_EQ(write(fds[1], "abc", 3), 3);
	CHECK(wait_uint_ge(&p.bytes, 3, 5000), "fd handler read %u bytes", atomic_load(&p.bytes));
	barrier(l);
	CHECK_EQ(atomic_load(&p.bytes), 3);
	CHECK(atomic_load(&p.calls) >= 1);
	CHECK_EQ(atomic_load(&p.in_thread), atomic_load(&p.calls));

	/* Adding the same fd twice is refused by epoll. */
	CHECK_EQ(loop_add_fd(l, &p.h, EPOLLIN), -EEXIST);

	/* After loop_del_fd (on the loop thread) the handler is not called. */
	loop_call(l, pipe_del, &p);
	calls = atomic_load(&p.calls);
	CHECK_EQ(write(fds[1], "de", 2), 2);
	sleep_ms(50);
	barrier(l);
	CHECK_EQ(atomic_load(&p.calls), calls);
	CHECK_EQ(atomic_load(&p.bytes), 3);

	loop_destroy(l);
	close(fds[0]);
	close(fds[1]);
}

/*
 * Handlers may remove fds (loop.h). A handler removed by another handler of
 * the same epoll_wait batch must not be called afterwards: its owner may
 * free it right after loop_del_fd. Two pipes are made ready while a blocker
 * holds the loop thread, so both come back in one batch; each handler
 * removes the other, so exactly one of them may run.
 */
struct del_pair;

struct del_fd {
	struct loop_fd h;
	struct del_pair *pair;
	unsigned idx;
};

struct del_pair {
	struct del_fd fd[2];
	struct loop *loop;
	atomic_uint calls[2];
	atomic_uint removed[2];
	atomic_uint called_after_removal;
};

static void del_pair_cb(struct loop_fd *h, uint32_t events)
{
	struct del_fd *f = container_of(h, struct del_fd, h);
	struct del_pair *d = f->pair;
	unsigned me = f->idx;
	char buf[8];

	while (read(h->fd, buf, sizeof(buf)) > 0)
		;
	atomic_fetch_add(&d->calls[me], 1);
	if (atomic_load(&d->removed[me]))
		atomic_fetch_add(&d->called_after_removal, 1);
	loop_del_fd(d->loop, &d->fd[!me].h);
	atomic_store(&d->removed[!me], 1);
}

static void del_pair_cleanup(void *arg)
{
	struct del_pair *d = arg;

	loop_del_fd(d->loop, &d->fd[0].h);
	loop_del_fd(d->loop, &d->fd[1].h);
}

static void test_loop_del_in_handler(void)
{
	struct loop *l = NULL;
	struct del_pair d;
	struct blocker blk;
	int p0[2], p1[2];

	if (pipe2(p0, O_NONBLOCK | O_CLOEXEC) || pipe2(p1, O_NONBLOCK | O_CLOEXEC)) {
		CHECK(0, "pipe2: %s", strerror(errno));
		return;
	}
	CHECK_EQ(loop_create("test-del", &l), 0);
	if (!l)
		return;
	memset(&d, 0, sizeof(d));
	d.loop = l;
	for (unsigned i = 0; i < 2; i++) {
		d.fd[i].pair = &d;
		d.fd[i].idx = i;
		d.fd[i].h.fd = i ? p1[0] : p0[0];
		d.fd[i].h.cb = del_pair_cb;
		CHECK_EQ(loop_add_fd(l, &d.fd[i].h, EPOLLIN), 0);
	}

	blocker_init(&blk, l);
	CHECK(blocker_hold(&blk), "blocker never started");
	CHECK_EQ(write(p0[1], "x", 1), 1);
	CHECK_EQ(write(p1[1], "y", 1), 1);
	atomic_store(&blk.release, 1);
	barrier(l);
	sleep_ms(20);
	barrier(l);
	CHECK_EQ(atomic_load(&d.calls[0]) + atomic_load(&d.calls[1]), 1);
	CHECK(atomic_load(&d.called_after_removal) == 0,
	      "a handler ran after another handler of the same batch removed it "
	      "(calls %u and %u)", atomic_load(&d.calls[0]), atomic_load(&d.calls[1]));

	loop_call(l, del_pair_cleanup, &d);
	loop_destroy(l);
	close(p0[0]);
	close(p0[1]);
	close(p1[0]);
	close(p1[1]);
}

struct timer_ctx {
	struct loop_timer t;
	struct loop *loop;
	atomic_uint fired;
	atomic_uint in_thread;
	atomic_uint_fast64_t first_ns;
};

static void timer_cb(struct loop_timer *t)
{
	struct timer_ctx *c = container_of(t, struct timer_ctx, t);
	uint64_t zero = 0;

	atomic_compare_exchange_strong(&c->first_ns, &zero, now_ns());
	if (loop_in_thread(c->loop))
		atomic_fetch_add(&c->in_thread, 1);
	atomic_fetch_add(&c->fired, 1);
}

static void timer_fini_fn(void *arg)
{
	loop_timer_fini(arg);
}

static bool timer_setup(struct timer_ctx *c, struct loop *l)
{
	int rc;

	memset(c, 0, sizeof(*c));
	c->loop = l;
	rc = loop_timer_init(l, &c->t, timer_cb);
	CHECK_EQ(rc, 0);
	return rc == 0;
}

static void test_loop_timers(void)
{
	struct loop *l = NULL;
	struct timer_ctx one, per, dis;
	uint64_t t0, elapsed_ms;
	unsigned n;

	CHECK_EQ(loop_create("test-timer", &l), 0);
	if (!l)
		return;

	/* One shot: fires once, not before its time, on the loop thread. */
	if (timer_setup(&one, l)) {
		t0 = now_ns();
		loop_timer_arm(&one.t, 30, 0);
		CHECK(wait_uint_ge(&one.fired, 1, 5000), "one-shot timer never fired");
		sleep_ms(100);
		barrier(l);
		CHECK_EQ(atomic_load(&one.fired), 1);
		CHECK_EQ(atomic_load(&one.in_thread), 1);
		CHECK(atomic_load(&one.first_ns) >= t0 + 30 * 1000000ull,
		      "one-shot fired after %llu ns, armed for 30 ms",
		      (unsigned long long)(atomic_load(&one.first_ns) - t0));
		/* Re-arming a fired one-shot fires it again. */
		loop_timer_arm(&one.t, 10, 0);
		CHECK(wait_uint_ge(&one.fired, 2, 5000), "re-armed one-shot never fired");
		sleep_ms(50);
		barrier(l);
		CHECK_EQ(atomic_load(&one.fired), 2);
		loop_call(l, timer_fini_fn, &one.t);
		CHECK(!loop_timer_live(&one.t), "a finished timer is not live");
	}

	/* Periodic: 20 ms over ~300 ms. */
	if (timer_setup(&per, l)) {
		t0 = now_ns();
		loop_timer_arm(&per.t, 20, 20);
		sleep_ms(300);
		loop_timer_arm(&per.t, 0, 0);
		elapsed_ms = (now_ns() - t0) / 1000000ull;
		barrier(l);
		n = atomic_load(&per.fired);
		CHECK(n >= 8, "20 ms timer fired %u times in %llu ms", n,
		      (unsigned long long)elapsed_ms);
		CHECK(n <= 20 && n <= elapsed_ms / 20 + 1, "20 ms timer fired %u times in %llu ms",
		      n, (unsigned long long)elapsed_ms);
		CHECK_EQ(atomic_load(&per.in_thread), n);
		/* Disarmed (armed with 0): nothing more. */
		sleep_ms(100);
		barrier(l);
		CHECK_EQ(atomic_load(&per.fired), n);
		loop_call(l, timer_fini_fn, &per.t);
	}

	/* Disarm of a fast periodic timer after it has fired a few times. */
	if (timer_setup(&dis, l)) {
		loop_timer_arm(&dis.t, 5, 5);
		CHECK(wait_uint_ge(&dis.fired, 3, 5000), "5 ms timer fired %u times",
		      atomic_load(&dis.fired));
		loop_timer_arm(&dis.t, 0, 0);
		barrier(l);
		n = atomic_load(&dis.fired);
		sleep_ms(60);
		barrier(l);
		CHECK_EQ(atomic_load(&dis.fired), n);
		/* A disarmed timer can be armed again. */
		loop_timer_arm(&dis.t, 5, 0);
		CHECK(wait_uint_ge(&dis.fired, n + 1, 5000), "re-armed timer never fired");
		loop_call(l, timer_fini_fn, &dis.t);
		/* Arming after fini is a no-op rather than a crash. */
		loop_timer_arm(&dis.t, 5, 5);
		sleep_ms(30);
		barrier(l);
		CHECK_EQ(atomic_load(&dis.fired), n + 1);
	}

	loop_destroy(l);
}

/*
 * Many one-shot timers in one loop's heap, armed from another thread in a
 * shuffled order with due times 10..200 ms and a slack of 20 ms, a third
 * of them disarmed again and some re-armed: each armed one fires exactly
 * once, never before its due time (measured from its arming), and those
 * disarmed never; then a loop with no timer left sleeps (its timerfd is
 * disarmed: no spurious callbacks afterwards).
 */
#define HEAP_TIMERS 200

struct heap_timer {
	struct loop_timer t;
	uint64_t armed_ns;
	unsigned due_ms;
	bool want;
	atomic_uint fired;
	atomic_uint early;
};

static void heap_timer_cb(struct loop_timer *t)
{
	struct heap_timer *h = container_of(t, struct heap_timer, t);

	if (now_ns() < h->armed_ns + h->due_ms * 1000000ull)
		atomic_fetch_add(&h->early, 1);
	atomic_fetch_add(&h->fired, 1);
}

static void heap_fini_all(void *arg)
{
	struct heap_timer *h = arg;

	for (unsigned i = 0; i < HEAP_TIMERS; i++)
		loop_timer_fini(&h[i].t);
}

static void test_loop_timer_heap(void)
{
	static struct heap_timer h[HEAP_TIMERS];
	unsigned order[HEAP_TIMERS], fired = 0, want = 0;
	struct loop *l = NULL;

	CHECK_EQ(loop_create("test-heap", &l), 0);
	if (!l)
		return;
	memset(h, 0, sizeof(h));
	srand(7);
	for (unsigned i = 0; i < HEAP_TIMERS; i++) {
		CHECK_EQ(loop_timer_init(l, &h[i].t, heap_timer_cb), 0);
		loop_timer_slack(&h[i].t, 20);
		order[i] = i;
	}
	for (unsigned i = HEAP_TIMERS - 1; i > 0; i--) {
		unsigned j = (unsigned)rand() % (i + 1), x = order[i];

		order[i] = order[j];
		order[j] = x;
	}
	for (unsigned k = 0; k < HEAP_TIMERS; k++) {
		struct heap_timer *t = &h[order[k]];

		t->due_ms = 10 + (unsigned)rand() % 191;
		t->want = true;
		t->armed_ns = now_ns();
		loop_timer_arm(&t->t, t->due_ms, 0);
	}
	for (unsigned i = 0; i < HEAP_TIMERS; i += 3) {
		loop_timer_arm(&h[i].t, 0, 0); /* disarmed before its time: never fires */
		h[i].want = false;
		if (i % 2 == 0) {
			/* ... and this one armed again, later. */
			h[i].due_ms = 50;
			h[i].want = true;
			h[i].armed_ns = now_ns();
			loop_timer_arm(&h[i].t, h[i].due_ms, 0);
		}
	}
	sleep_ms(400);
	barrier(l);
	for (unsigned i = 0; i < HEAP_TIMERS; i++) {
		unsigned f = atomic_load(&h[i].fired);

		want += h[i].want;
		fired += f;
		CHECK(f == (h[i].want ? 1u : 0u), "timer %u fired %u times (armed: %d, %u ms)", i, f,
		      h[i].want, h[i].due_ms);
		CHECK(!atomic_load(&h[i].early), "timer %u fired before its %u ms", i, h[i].due_ms);
	}
	CHECK_EQ(fired, want);
	/* Nothing armed: nothing more fires. */
	sleep_ms(100);
	barrier(l);
	unsigned after = 0;

	for (unsigned i = 0; i < HEAP_TIMERS; i++)
		after += atomic_load(&h[i].fired);
	CHECK_EQ(after, fired);
	loop_call(l, heap_fini_all, h);
	loop_destroy(l);
}

struct releaser {
	struct blocker *b;
	unsigned after_ms;
};

static void *releaser_thread(void *arg)
{
	struct releaser *r = arg;

	sleep_ms(r->after_ms);
	atomic_store(&r->b->release, 1);
	return NULL;
}

static void test_loop_destroy(void)
{
	struct loop *l = NULL;
	struct counted_work a, b, c;
	struct blocker blk;
	struct releaser rel;
	unsigned order[8], order_n = 0;
	pthread_t th;
	int rc;

	/* Destroying an idle loop, and loop_destroy(NULL), just work. */
	CHECK_EQ(loop_create("test-idle", &l), 0);
	loop_destroy(l);
	loop_destroy(NULL);

	/*
	 * Work still queued when loop_destroy is called runs, in order, before
	 * it returns: the loop thread is held in a blocker while destroy starts,
	 * and a helper thread lets it go.
	 */
	l = NULL;
	CHECK_EQ(loop_create("test-destroy", &l), 0);
	if (!l)
		return;
	blocker_init(&blk, l);
	counted_init(&a, l, 1);
	counted_init(&b, l, 2);
	counted_init(&c, l, 3);
	a.order = b.order = c.order = order;
	a.order_n = b.order_n = c.order_n = &order_n;
	atomic_store(&c.requeue, 2);
	CHECK(blocker_hold(&blk), "blocker never started");
	loop_queue(l, &a.w);
	loop_queue(l, &b.w);
	loop_queue(l, &c.w);
	rel.b = &blk;
	rel.after_ms = 100;
	rc = pthread_create(&th, NULL, releaser_thread, &rel);
	CHECK_EQ(rc, 0);
	if (rc)
		atomic_store(&blk.release, 1);
	loop_destroy(l);
	/* Joined: everything the loop thread was to do is done. */
	CHECK_EQ(atomic_load(&blk.done), 1);
	CHECK_EQ(atomic_load(&a.runs), 1);
	CHECK_EQ(atomic_load(&b.runs), 1);
	/* c re-queued itself once during teardown; that ran too. */
	CHECK_EQ(atomic_load(&c.runs), 2);
	CHECK_EQ(atomic_load(&a.in_thread), 1);
	CHECK_EQ(order_n, 4);
	CHECK(order_n == 4 && order[0] == 1 && order[1] == 2 && order[2] == 3 && order[3] == 3,
	      "order %u %u %u %u", order[0], order[1], order[2], order[3]);
	if (!rc)
		pthread_join(th, NULL);
}

/* ---- keyperm.h: memory keys ---------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Sorted a[], any two equal? */
static bool has_dup(uint64_t *a, size_t n)
{
	qsort(a, n, sizeof(*a), cmp_u64);
	for (size_t i = 1; i < n; i++)
		if (a[i] == a[i - 1])
			return true;
	return false;
}

/* Speck32/64 deciphered, round by round backwards: only to find the block that enciphers to 0. */
static uint32_t speck32_decipher(const struct keyperm *kp, uint32_t block)
{
	uint16_t x = (uint16_t)(block >> 16), y = (uint16_t)block;

	for (int i = 21; i >= 0; i--) {
		y = (uint16_t)(y ^ x);
		y = (uint16_t)(y >> 2 | y << 14);
		x = (uint16_t)((uint16_t)(x ^ kp->rk32[i]) - y);
		x = (uint16_t)(x << 7 | x >> 9);
	}
	return (uint32_t)x << 16 | y;
}

static void test_keyperm(void)
{
	/* The paper's vectors (appendix C), key words most significant first. */
	static const uint8_t paper[KEYPERM_SECRET_LEN] = {
		0x00, 0x01, 0x02, 0x03, 0x08, 0x09, 0x0a, 0x0b,
		0x10, 0x11, 0x12, 0x13, 0x18, 0x19, 0x1a, 0x1b, /* 1b1a1918 ... 03020100 */
		0x00, 0x01, 0x08, 0x09, 0x10, 0x11, 0x18, 0x19, /* 1918 1110 0908 0100 */
	};
	enum { N = 200000 };
	static uint64_t k[N];
	struct keyperm kp, kp2;
	unsigned bits_total = 0, bits_min = 64, same_as_other = 0;
	bool in64 = true, in32 = true, adjacent = false;

	keyperm_init_secret(&kp, paper);
	CHECK_EQ(keyperm_speck64(&kp, 0x3b7265747475432dull), 0x8c6fa548454e028bull);
	CHECK_EQ(keyperm_speck32(&kp, 0x6574694cu), 0xa86842f2u);

	CHECK_EQ(keyperm_init(&kp), 0);
	CHECK_EQ(keyperm_init(&kp2), 0);

	/* 64-bit keys: in range, distinct, nothing like their counters. */
	for (uint64_t i = 0; i < N; i++) {
		k[i] = keyperm_key64(&kp, KEYPERM_KEY64_MIN + i);
		in64 &= k[i] >= KEYPERM_KEY64_MIN;
		same_as_other += k[i] == keyperm_key64(&kp2, KEYPERM_KEY64_MIN + i);
		if (i) {
			unsigned d = (unsigned)__builtin_popcountll(k[i] ^ k[i - 1]);

			bits_total += d;
			bits_min = MIN(bits_min, d);
			adjacent |= k[i] - k[i - 1] < 1024 || k[i - 1] - k[i] < 1024;
		}
	}
	CHECK(in64, "every 64-bit key is at least 2^32");
	CHECK(!adjacent, "no key lies within 1024 of the one before it");
	/* Consecutive keys differ in half their bits on average (32 +- 0.1). */
	CHECK(bits_total > 31.9 * (N - 1) && bits_total < 32.1 * (N - 1),
	      "mean bit distance %.3f", (double)bits_total / (N - 1));
	CHECK(bits_min > 4, "closest consecutive pair differs in %u bits", bits_min);
	CHECK(same_as_other < 2, "two secrets agree on %u of %d keys", same_as_other, N);
	CHECK(!has_dup(k, N), "64-bit keys of distinct counters are distinct");
	/* The top of the range, where a counter would end. */
	CHECK(keyperm_key64(&kp, UINT64_MAX) >= KEYPERM_KEY64_MIN);

	/* 32-bit keys: 1 .. 2^32 - 1, distinct, at both ends of the counter. */
	for (uint32_t i = 0; i < N; i++) {
		k[i] = keyperm_key32(&kp, i);
		in32 &= k[i] >= 1;
	}
	CHECK(!has_dup(k, N), "32-bit keys of distinct counters are distinct");
	for (uint32_t i = 0; i < N; i++) {
		k[i] = keyperm_key32(&kp, KEYPERM_KEY32_MAX - 1 - i);
		in32 &= k[i] >= 1;
	}
	CHECK(in32, "every 32-bit key is in 1 .. 2^32 - 1");
	CHECK(!has_dup(k, N), "32-bit keys at the counter's end are distinct");

	/* Counters spread over the upper half of the range (9973 is prime). */
	for (uint32_t i = 0; i < N; i++)
		k[i] = keyperm_key32(&kp, 0x80000000u + i * 9973u % 0x7fffffffu);
	CHECK(!has_dup(k, N), "32-bit keys of scattered counters are distinct");

	/*
	 * The walk: the counter whose block enciphers to 0 (found by
	 * deciphering 0) gets the cipher of 0, the next value on its orbit.
	 */
	{
		uint32_t v0 = speck32_decipher(&kp, 0);

		if (v0) /* else 0 is a fixed point (odds 2^-32): no counter reaches it */
			CHECK_EQ(keyperm_key32(&kp, v0 - 1), keyperm_speck32(&kp, 0));
		CHECK_EQ(keyperm_speck32(&kp, speck32_decipher(&kp, 0x12345678u)), 0x12345678u);
	}
	keyperm_clear(&kp);
	keyperm_clear(&kp2);
}

/* ---- opts.h: config files ------------------------------------------------ */

static void write_conf(char *path, const char *text, size_t len)
{
	int fd;

	strcpy(path, "/tmp/rtrs-opts-test.XXXXXX");
	fd = mkstemp(path);
	if (fd < 0 || write(fd, text, len) != (ssize_t)len)
		abort();
	close(fd);
}

/* Whether anything opened the file inotify fd in watches since the last call. */
static bool opened_since(int in)
{
	char buf[4096] __attribute__((aligned(8)));
	bool opened = false;
	ssize_t n;

	while ((n = read(in, buf, sizeof(buf))) > 0)
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *e = (const void *)p;

			opened |= (e->mask & IN_OPEN) != 0;
			p += sizeof(*e) + e->len;
		}
	return opened;
}

/* Opens path for writing after 1 s, unless told to stop first. */
struct fifo_writer {
	const char *path;
	atomic_bool stop;
};

static void *fifo_writer_fn(void *arg)
{
	struct fifo_writer *fw = arg;
	int fd;

	for (int i = 0; i < 100 && !atomic_load(&fw->stop); i++)
		sleep_ms(10);
	if (atomic_load(&fw->stop))
		return NULL;
	fd = open(fw->path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd >= 0)
		close(fd);
	return NULL;
}

/*
 * Runs opts_parse_file on text with stderr captured: the return code, and
 * what it printed in msg.
 */
static int parse_conf_len(const struct opt *t, const char *text, size_t len, char *path,
			  char *msg, size_t msglen)
{
	struct capture c;
	int rc;

	write_conf(path, text, len);
	capture_begin(&c, 2);
	rc = opts_parse_file(t, "prog", path);
	capture_end(&c, msg, msglen);
	unlink(path);
	return rc;
}

static int parse_conf(const struct opt *t, const char *text, char *path, char *msg,
		      size_t msglen)
{
	return parse_conf_len(t, text, strlen(text), path, msg, msglen);
}

static void test_opts_file(void)
{
	struct opt t[NOPTS];
	struct opt_vals v = { 0 };
	char path[64], msg[512], want[600];
	int rc;

	table_init(t, &v);
	vals_reset(&v);
	rc = parse_conf(t, "# a comment\n\n  verbose\n"
			   "depth = 64   # trailing comment\n"
			   "size 1M\n"
			   "name=my session name\n"
			   "mode\tmixed\n"
			   "peer a:1\npeer = b:2\n", path, msg, sizeof(msg));
	CHECK_EQ(rc, 0);
	CHECK(!*msg, "printed: %s", msg);
	CHECK(v.verbose && !v.quiet);
	CHECK_EQ(v.depth, 64);
	CHECK_EQ(v.size, 1 << 20);
	CHECK(v.name && !strcmp(v.name, "my session name"), "%s", v.name ? v.name : "NULL");
	CHECK_EQ(v.mode, 2);
	CHECK_EQ(v.peers.n, 2);
	/* A value checked later names its line (the path is gone, the name stays). */
	{
		char where[128], cli[] = "x";

		snprintf(want, sizeof(want), "%s:6: name", path);
		opts_name_of("name", v.name, where, sizeof(where));
		CHECK(!strcmp(where, want), "%s", where);
		snprintf(want, sizeof(want), "%s:9: peer", path);
		opts_name_of("peer", v.peers.n == 2 ? v.peers.items[1] : NULL, where, sizeof(where));
		CHECK(!strcmp(where, want), "%s", where);
		opts_name_of("name", cli, where, sizeof(where));
		CHECK(!strcmp(where, "--name"), "%s", where);
		opts_name_of("name", NULL, where, sizeof(where));
		CHECK(!strcmp(where, "--name"), "%s", where);
		CHECK(opts_provider_valid("tcp") && opts_provider_valid("rdma") &&
		      !opts_provider_valid("tpc") && !opts_provider_valid(NULL));
	}

	/* The command line after the file wins, and clears a flag the file set. */
	{
		struct argv_store st;
		int fp;

		rc = parse_args(t, &st, &fp, ARGS("--depth", "8", "--no-verbose"));
		CHECK_EQ(rc, 0);
		CHECK_EQ(v.depth, 8);
		CHECK_EQ(v.size, 1 << 20);
		CHECK(!v.verbose, "--no-verbose did not clear the file's verbose");
	}

	/*
	 * '#' is a comment only at the start or after a blank; a quoted value
	 * keeps blanks and '#', with \" and \\ the only escapes.
	 */
	vals_reset(&v);
	rc = parse_conf(t, "name a#b   # comment\npeer x#1#2\npeer \"  q #x \\\"y\\\" \\\\z \" # c\n"
			   "peer=#5\npeer \"\\\\\"\n", path, msg, sizeof(msg));
	CHECK_EQ(rc, 0);
	CHECK(!*msg, "printed: %s", msg);
	CHECK(v.name && !strcmp(v.name, "a#b"), "%s", v.name ? v.name : "NULL");
	CHECK_EQ(v.peers.n, 4);
	if (v.peers.n == 4) {
		CHECK(!strcmp(v.peers.items[0], "x#1#2"), "%s", v.peers.items[0]);
		CHECK(!strcmp(v.peers.items[1], "  q #x \"y\" \\z "), "[%s]", v.peers.items[1]);
		CHECK(!strcmp(v.peers.items[2], "#5"), "%s", v.peers.items[2]);
		CHECK(!strcmp(v.peers.items[3], "\\"), "%s", v.peers.items[3]);
	}

	/* Flags: bare, with a truth value, or negated; CRLF line ends. */
	vals_reset(&v);
	v.quiet = true;
	rc = parse_conf(t, "verbose = yes\r\nno-quiet\r\n", path, msg, sizeof(msg));
	CHECK_EQ(rc, 0);
	CHECK(v.verbose && !v.quiet);
	vals_reset(&v);
	v.verbose = true;
	rc = parse_conf(t, "verbose false\nquiet on\n", path, msg, sizeof(msg));
	CHECK_EQ(rc, 0);
	CHECK(!v.verbose && v.quiet);

	/* Errors print "prog: FILE:LINE: why" and leave later lines unread. */
	static const struct {
		const char *text, *why;
		unsigned line;
	} bad[] = {
		{ "depth 64\nnosuch 1\n", "unknown option \"nosuch\"", 2 },
		{ "verbose maybe\n", "verbose maybe: expected true, false", 1 },
		{ "no-verbose yes\n", "no-verbose takes no value", 1 },
		{ "no-depth 3\n", "unknown option \"no-depth\"", 1 },
		{ "depth\n", "depth needs a value", 1 },
		{ "depth # 5\n", "depth needs a value", 1 },
		{ "\n\ndepth 999\n", "depth 999: expected a number in 1..128", 3 },
		{ "mode sideways\n", "mode sideways: not one of read write mixed", 1 },
		{ "size 1Q\n", "size 1Q: expected a size", 1 },
		{ "depth 4\ndepth 5\n", "depth set again (first on line 1)", 2 },
		{ "verbose\nno-verbose\n", "verbose set again (first on line 1)", 2 },
		{ "name \"abc\n", "no closing quote", 1 },
		{ "name \"abc\\\n", "no closing quote", 1 },
		{ "name \"a\\tb\"\n", "unknown escape \\t", 1 },
		{ "name \"a\"b\n", "text after the closing quote", 1 },
		{ "name \"a\" b\n", "text after the closing quote", 1 },
		{ "name \"\"\n", "name needs a value", 1 },
		{ "name a\x01" "b\n", "control character 0x01", 1 },
		{ "peer a\n\x1b[31m\n", "control character 0x1b", 2 },
		{ "--depth 3\n", "unknown option \"--depth\"", 1 },
		{ "dep 3\n", "unknown option \"dep\"", 1 },
	};
	for (unsigned i = 0; i < ARRAY_SIZE(bad); i++) {
		vals_reset(&v);
		rc = parse_conf(t, bad[i].text, path, msg, sizeof(msg));
		snprintf(want, sizeof(want), "prog: %s:%u: %s", path, bad[i].line, bad[i].why);
		CHECK_EQ(rc, -EINVAL);
		CHECK(!strncmp(msg, want, strlen(want)), "case %u: got \"%s\", want \"%s...\"", i,
		      msg, want);
	}
	/* A NUL byte, where a C string would end the line quietly. */
	vals_reset(&v);
	rc = parse_conf_len(t, "depth 7\nname ab\0cd\n", 19, path, msg, sizeof(msg));
	snprintf(want, sizeof(want), "prog: %s:2: NUL byte", path);
	CHECK_EQ(rc, -EINVAL);
	CHECK(!strncmp(msg, want, strlen(want)), "got \"%s\"", msg);

	/* Files that are not config files. */
	rc = parse_conf(t, "", path, msg, sizeof(msg));
	CHECK_EQ(rc, 0);
	{
		struct capture c;

		char fifo[128];
		uint64_t t0;

		capture_begin(&c, 2);
		CHECK_EQ(opts_parse_file(t, "prog", "/nonexistent/rtrs.conf"), -ENOENT);
		CHECK_EQ(opts_parse_file(t, "prog", "/tmp"), -EISDIR);
		capture_end(&c, msg, sizeof(msg));
		CHECK(strstr(msg, "prog: config file /nonexistent/rtrs.conf: No such file") != NULL,
		      "%s", msg);
		CHECK(strstr(msg, "prog: config file /tmp: is a directory") != NULL, "%s", msg);
		/* A FIFO nobody writes: refused at once, not waited on in open(). */
		snprintf(fifo, sizeof(fifo), "%s.fifo", path);
		unlink(fifo);
		CHECK_EQ(mkfifo(fifo, 0600), 0);
		/* A writer comes after 1 s, so that a parse that waits fails rather than hangs. */
		struct fifo_writer fw = { .path = fifo };
		pthread_t th;

		int in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

		CHECK(in >= 0 && inotify_add_watch(in, fifo, IN_OPEN) >= 0);
		CHECK_EQ(pthread_create(&th, NULL, fifo_writer_fn, &fw), 0);
		t0 = now_ms();
		capture_begin(&c, 2);
		CHECK_EQ(opts_parse_file(t, "prog", fifo), -EINVAL);
		CHECK_EQ(opts_parse_file(t, "prog", "/dev/null"), -EINVAL);
		capture_end(&c, msg, sizeof(msg));
		CHECK(now_ms() - t0 < 1000, "a FIFO held the parse for %" PRIu64 " ms", now_ms() - t0);
		CHECK(!opened_since(in), "the refused FIFO was opened");
		close(in);
		atomic_store(&fw.stop, true);
		pthread_join(th, NULL);
		CHECK(strstr(msg, "not a regular file (a FIFO)") && strstr(msg, fifo), "%s", msg);
		CHECK(strstr(msg, "/dev/null: not a regular file (a character device)"), "%s", msg);
		unlink(fifo);
	}
	{
		size_t big = (1u << 20) + 1;
		char *text = malloc(big);

		memset(text, '#', big);
		rc = parse_conf_len(t, text, big, path, msg, sizeof(msg));
		CHECK_EQ(rc, -EFBIG);
		CHECK(strstr(msg, "larger than 1048576 bytes") != NULL, "%s", msg);
		free(text);
	}
	vals_reset(&v);
}

/*
 * A table with a config option: the file is read first in whatever form
 * the command line names it (abbreviated, short, attached), the command
 * line wins, and a config line in the file is refused.
 */
static void test_opts_config(void)
{
	struct opt_vals v = { 0 };
	const char *cfg = NULL;
	struct opt t[NOPTS + 1];
	char path[64], nested[64], line[128], msg[512];
	struct argv_store st;
	int fp, rc, err;

	table_init(t, &v);
	t[NOPTS - 1] = (struct opt){ .name = "config", .short_name = 'c', .type = OPT_CONFIG,
				     .ptr = &cfg, .arg = "FILE", .help = "config file" };
	t[NOPTS] = (struct opt){ 0 };
	write_conf(path, "depth 64\nverbose\nname from-file\n", 32);

	static const char *const forms[][3] = {
		{ "--config", NULL, NULL }, { "--conf", NULL, NULL }, { "--con", NULL, NULL },
		{ "-c", NULL, NULL }, { "--config=", NULL, NULL }, { "-c", "", "attached" },
	};
	for (unsigned i = 0; i < ARRAY_SIZE(forms); i++) {
		char joined[128];

		vals_reset(&v);
		cfg = NULL;
		if (forms[i][2] || strchr(forms[i][0], '=')) {
			snprintf(joined, sizeof(joined), "%s%s", forms[i][0], path);
			rc = parse_args(t, &st, &fp, ARGS("--depth", "9", joined, "pos"));
		} else {
			rc = parse_args(t, &st, &fp, ARGS("--depth", "9", forms[i][0], path, "pos"));
		}
		CHECK_EQ(rc, 0);
		CHECK(cfg && !strcmp(cfg, path), "form %u: config = %s", i, cfg ? cfg : "NULL");
		CHECK(v.verbose, "form %u (%s): the file was not read", i, forms[i][0]);
		CHECK(v.name && !strcmp(v.name, "from-file"));
		CHECK_EQ(v.depth, 9); /* the command line wins, even when it comes first */
		CHECK(st.argv[fp] && !strcmp(st.argv[fp], "pos"));
	}

	/* A flag the file sets is cleared by --no-NAME. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--no-verbose", "-c", path));
	CHECK_EQ(rc, 0);
	CHECK(!v.verbose);
	CHECK_EQ(v.depth, 64);

	/* --help is not held up by a config file. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-c", "/nonexistent/x.conf", "--help"));
	CHECK_EQ(rc, 1);

	/* A config file given twice, empty, missing, or naming another. */
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("-c", path, "--config", path));
	CHECK_EQ(rc, -EINVAL);
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--config="));
	CHECK_EQ(rc, -EINVAL);
	vals_reset(&v);
	rc = parse_args(t, &st, &fp, ARGS("--con", "/nonexistent/x.conf"));
	CHECK_EQ(rc, -ENOENT);
	snprintf(line, sizeof(line), "depth 3\nconfig %s\n", path);
	write_conf(nested, line, strlen(line));
	vals_reset(&v);
	err = quiet_begin(2);
	rc = parse_args(t, &st, &fp, ARGS("--conf", nested));
	quiet_end(2, err);
	CHECK_EQ(rc, -EINVAL);
	CHECK(!v.verbose, "the nested file was read");
	unlink(nested);
	rc = parse_conf(t, line, nested, msg, sizeof(msg)); /* a file of its own, removed */
	CHECK_EQ(rc, -EINVAL);
	CHECK(strstr(msg, ":2: config: config files do not nest") != NULL, "%s", msg);
	unlink(path);
	vals_reset(&v);
}

/* Flags have a --[no-] form in --help and say when they default to on. */
static void test_opts_negation(void)
{
	struct opt_vals v = { 0 };
	bool on = true;
	const struct opt t[] = {
		{ .name = "verbose", .short_name = 'v', .type = OPT_FLAG, .ptr = &v.verbose,
		  .help = "more output" },
		{ .name = "invalidate", .type = OPT_FLAG, .ptr = &on, .help = "revoke keys" },
		{ .name = "no-color", .type = OPT_FLAG, .ptr = &v.quiet, .help = "plain" },
		{ 0 },
	};
	char buf[2048];
	struct argv_store st;
	int fp = -1, rc;

	rc = parse_args(t, &st, &fp, ARGS("--no-invalidate", "--no-color", "-v", "--no-verb"));
	CHECK_EQ(rc, 0);
	CHECK(!on && v.quiet && !v.verbose);
	rc = parse_args(t, &st, &fp, ARGS("--invalidate"));
	CHECK_EQ(rc, 0);
	CHECK(on);
	/* A flag already named no-X has no --no-no-X; --no alone is ambiguous. */
	rc = parse_args(t, &st, &fp, ARGS("--no-no-color"));
	CHECK_EQ(rc, -EINVAL);
	rc = parse_args(t, &st, &fp, ARGS("--no"));
	CHECK_EQ(rc, -EINVAL);

	rc = help_text(t, "", buf, sizeof(buf));
	CHECK_EQ(rc, 1);
	CHECK(strstr(buf, "-v, --[no-]verbose") != NULL, "%s", buf);
	CHECK(strstr(buf, "--[no-]invalidate") && strstr(buf, "revoke keys (default on)"), "%s",
	      buf);
	CHECK(strstr(buf, "    --no-color ") != NULL, "%s", buf);
	CHECK(strstr(buf, "Config file") == NULL, "no config option, no config help");
}

/*
 * Log levels by name, and which source wins: the option, the program's
 * RTRS_LOG_LEVEL (passed in: the helper reads no environment), the default.
 */
static void test_opts_log_level(void)
{
	static const struct {
		const char *s;
		int level;
	} names[] = {
		{ "error", 0 }, { "ERR", 0 }, { "warn", 1 }, { "Warning", 1 }, { "war", 1 },
		{ "info", 2 }, { "inf", 2 }, { "debug", 3 }, { "DEB", 3 }, { "0", 0 }, { "3", 3 },
		{ "", -EINVAL }, { "4", -EINVAL }, { "errors", -EINVAL }, { "verbose", -EINVAL },
		{ "in", -EINVAL }, { "03", -EINVAL }, { " info", -EINVAL },
	};
	const char *saved = getenv("RTRS_LOG_LEVEL");
	char *keep = saved ? strdup(saved) : NULL;
	int err;

	for (unsigned i = 0; i < ARRAY_SIZE(names); i++)
		CHECK(opts_log_level_parse(names[i].s) == names[i].level, "\"%s\" -> %d, want %d",
		      names[i].s, opts_log_level_parse(names[i].s), names[i].level);
	CHECK_EQ(opts_log_level_parse(NULL), -EINVAL);

	CHECK_EQ(opts_log_level("prog", "--log-level", NULL, NULL, 1), 1);
	CHECK_EQ(opts_log_level("prog", "--log-level", "debug", NULL, 1), 3);
	CHECK_EQ(opts_log_level("prog", "--log-level", NULL, "error", 2), 0);
	CHECK_EQ(opts_log_level("prog", "--log-level", "info", "error", 0), 2);
	err = quiet_begin(2);
	CHECK_EQ(opts_log_level("prog", "--log-level", NULL, "loud", 2), -EINVAL);
	CHECK_EQ(opts_log_level("prog", "--log-level", "7", "error", 2), -EINVAL);
	quiet_end(2, err);
	CHECK_EQ(opts_log_level("prog", "--log-level", "warn", "loud", 2), 1); /* the option wins */
	/* The environment itself is the program's to read, not the helper's. */
	setenv("RTRS_LOG_LEVEL", "error", 1);
	CHECK_EQ(opts_log_level("prog", "--log-level", NULL, NULL, 2), 2);
	if (keep)
		setenv("RTRS_LOG_LEVEL", keep, 1);
	else
		unsetenv("RTRS_LOG_LEVEL");
	free(keep);
}

/* ---- offload.h: classes take turns ---------------------------------------- */

/*
 * A gate holds a worker until it is opened; a step records its name in the
 * order steps ran. With every worker but one held by a gate, the one left
 * runs the queue one job at a time, so the order is the queue's.
 */
struct gate {
	struct offload_job j;
	atomic_bool open, in;
};

struct step {
	struct offload_job j;
	char name[4];
};

static pthread_mutex_t steps_lock = PTHREAD_MUTEX_INITIALIZER;
static char steps_ran[64];
static atomic_uint steps_n;

static void gate_fn(struct offload_job *j)
{
	struct gate *g = (struct gate *)j;

	atomic_store(&g->in, true);
	while (!atomic_load(&g->open))
		sleep_ms(1);
}

static void step_fn(struct offload_job *j)
{
	struct step *s = (struct step *)j;

	pthread_mutex_lock(&steps_lock);
	strcat(steps_ran, s->name);
	pthread_mutex_unlock(&steps_lock);
	atomic_fetch_add(&steps_n, 1);
}

static void steps_init(struct step *st, const char *const *names, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		offload_job_init(&st[i].j, step_fn, NULL);
		/* A name's letter is its class: "A1" and "A2" take turns with "B1". */
		char cls[2] = { names[i][0], 0 };

		offload_job_class(&st[i].j, offload_class_of(cls));
		snprintf(st[i].name, sizeof(st[i].name), "%s", names[i]);
	}
	pthread_mutex_lock(&steps_lock);
	steps_ran[0] = 0;
	pthread_mutex_unlock(&steps_lock);
	atomic_store(&steps_n, 0);
}

static void test_offload_classes(void)
{
	struct gate gates[OFFLOAD_WORKERS_MAX + 1];
	unsigned held = 0;

	/* Every worker the pool will make, held: until a gate stays queued. */
	for (unsigned i = 0; i <= OFFLOAD_WORKERS_MAX; i++) {
		offload_job_init(&gates[i].j, gate_fn, NULL);
		atomic_init(&gates[i].open, false);
		atomic_init(&gates[i].in, false);
		CHECK(offload_submit(&gates[i].j) == 0, "gate %u queued", i);
		uint64_t end = now_ms() + 1000;

		while (!atomic_load(&gates[i].in) && now_ms() < end)
			sleep_ms(1);
		if (!atomic_load(&gates[i].in)) {
			offload_cancel(&gates[i].j); /* no worker for it: every one is held */
			break;
		}
		held++;
	}
	CHECK(held >= 2 && held <= OFFLOAD_WORKERS_MAX, "%u workers held (at least 2)", held);
	CHECK(offload_workers() == held, "%u workers, %u held", offload_workers(), held);

	/* Five jobs of one class, then one each of two others: A's others wait their turns. */
	static const char *const order1[] = { "A1", "A2", "A3", "A4", "A5", "B1", "C1" };
	struct step st1[7], st2[7], *st = st1;

	steps_init(st, order1, 7);
	for (unsigned i = 0; i < 7; i++)
		CHECK(offload_submit(&st[i].j) == 0, "%s queued", order1[i]);
	CHECK(offload_submit(&st[0].j) == -EBUSY, "a queued job is not queued twice");
	atomic_store(&gates[0].open, true);
	CHECK(wait_uint_ge(&steps_n, 7, 5000), "7 steps ran (%u)", atomic_load(&steps_n));
	CHECK(!strcmp(steps_ran, "A1B1C1A2A3A4A5"), "the classes took turns: %s", steps_ran);
	for (unsigned i = 0; i < 7; i++)
		CHECK(offload_take(&st[i].j), "%s done", order1[i]);

	/* Cancelled: a class's first job (its next keeps the class's place), one behind it. */
	static const char *const order2[] = { "A1", "A2", "A3", "A4", "B1", "C1", "C2" };

	st = st2; /* fresh jobs: the first ones' workers may still hold the pool's lock */
	steps_init(st, order2, 7);
	atomic_store(&gates[0].open, false);
	atomic_store(&gates[0].in, false);
	CHECK(offload_submit(&gates[0].j) == 0, "the gate queued again");
	while (!atomic_load(&gates[0].in))
		sleep_ms(1);
	for (unsigned i = 0; i < 7; i++)
		CHECK(offload_submit(&st[i].j) == 0, "%s queued", order2[i]);
	offload_cancel(&st[0].j); /* A's first: A2 heads the class, before B */
	offload_cancel(&st[2].j); /* behind A2 */
	offload_cancel(&st[6].j); /* the last job queued */
	atomic_store(&gates[0].open, true);
	CHECK(wait_uint_ge(&steps_n, 4, 5000), "4 steps ran (%u)", atomic_load(&steps_n));
	sleep_ms(20);
	CHECK(!strcmp(steps_ran, "A2B1C1A4"), "cancelled jobs left, the rest in turns: %s",
	      steps_ran);
	CHECK(atomic_load(&st[0].j.state) == OFFLOAD_IDLE && !offload_take(&st[0].j),
	      "a cancelled job is idle and never done");

	for (unsigned i = 0; i < held; i++)
		atomic_store(&gates[i].open, true);
	for (unsigned i = 0; i < held; i++)
		offload_cancel(&gates[i].j);
	CHECK(offload_idle(), "nothing queued or running at the end");
}

/*
 * offload_cancel_nowait: a job that runs is not waited for; it finishes
 * without running again (it was submitted again while it ran) and its
 * notify says when. A job out of the pool is simply out.
 */
struct nowait {
	struct gate g;
	atomic_int runs, notified;
};

static void nowait_fn(struct offload_job *j)
{
	struct nowait *n = (struct nowait *)j;

	atomic_fetch_add(&n->runs, 1);
	gate_fn(j);
}

static void nowait_notify(struct offload_job *j)
{
	atomic_fetch_add(&((struct nowait *)j)->notified, 1);
}

static void test_offload_cancel_nowait(void)
{
	struct nowait n = { 0 };

	offload_job_init(&n.g.j, nowait_fn, nowait_notify);
	CHECK(offload_cancel_nowait(&n.g.j), "an idle job is out of the pool");
	CHECK(offload_submit(&n.g.j) == 0, "queued");
	for (int i = 0; i < 5000 && !atomic_load(&n.g.in); i++)
		sleep_ms(1);
	CHECK(atomic_load(&n.g.in), "running");
	CHECK(offload_submit(&n.g.j) == 0, "submitted again while it runs");
	CHECK(!offload_cancel_nowait(&n.g.j), "a running job is not waited for");
	CHECK(atomic_load(&n.notified) == 0, "not done yet");
	atomic_store(&n.g.open, true);
	for (int i = 0; i < 5000 && !atomic_load(&n.notified); i++)
		sleep_ms(1);
	CHECK(atomic_load(&n.notified) == 1, "its notify once it is done");
	offload_cancel(&n.g.j); /* waits out the notify's hold of the pool */
	CHECK(atomic_load(&n.runs) == 1, "not run again: %d runs", atomic_load(&n.runs));
	CHECK(offload_idle(), "nothing queued or running at the end");
}

/*
 * open_regular: a regular file (or a link to one) is opened; a directory,
 * a FIFO or a character device is refused without being opened (inotify
 * sees every open but O_PATH's), and a missing file says so.
 */
static void test_open_regular(void)
{
	const char *dir = test_tmpdir("/tmp", "open-regular");
	char f[256], fifo[256], chr[256], link[256];
	struct stat st;
	int fd, in;
	char c;

	CHECK(dir != NULL);
	if (!dir)
		return;
	snprintf(f, sizeof(f), "%s/file", dir);
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	snprintf(chr, sizeof(chr), "%s/chr", dir);
	snprintf(link, sizeof(link), "%s/link", dir);
	fd = open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	CHECK(fd >= 0 && write(fd, "x", 1) == 1);
	close(fd);
	CHECK_EQ(symlink(f, link), 0);
	CHECK_EQ(mkfifo(fifo, 0600), 0);

	fd = open_regular(link, &st);
	CHECK(fd >= 0, "%s: %s", link, strerror(-fd));
	CHECK(S_ISREG(st.st_mode) && st.st_size == 1);
	CHECK(fd >= 0 && read(fd, &c, 1) == 1 && c == 'x');
	CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC));
	if (fd >= 0)
		close(fd);
	CHECK_EQ(open_regular(dir, &st), -EISDIR);
	CHECK_EQ(open_regular("/nonexistent/file", &st), -ENOENT);

	in = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	CHECK(in >= 0);
	CHECK(inotify_add_watch(in, fifo, IN_OPEN) >= 0);
	CHECK_EQ(open_regular(fifo, &st), -EINVAL);
	CHECK(S_ISFIFO(st.st_mode) && !strcmp(file_type_name(st.st_mode), "a FIFO"));
	CHECK(!opened_since(in), "the refused FIFO was opened");
	/* The check itself sees an open. */
	fd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	CHECK(fd >= 0 && opened_since(in));
	if (fd >= 0)
		close(fd);
	if (geteuid() == 0 && mknod(chr, S_IFCHR | 0600, makedev(1, 3)) == 0) {
		CHECK(inotify_add_watch(in, chr, IN_OPEN) >= 0);
		CHECK_EQ(open_regular(chr, &st), -EINVAL);
		CHECK(!strcmp(file_type_name(st.st_mode), "a character device"));
		CHECK(!opened_since(in), "the refused character device was opened");
		unlink(chr);
	} else {
		fprintf(stderr, "test-common: no character device case (needs root)\n");
	}
	close(in);
	unlink(link);
	unlink(fifo);
	unlink(f);
	rmdir(dir);
}

int main(void)
{
	test_bits();
	test_open_regular();
	test_le();
	test_parse_u64();
	test_parse_size();
	test_rand();
	test_keyperm();
	test_opts_parse();
	test_opts_errors();
	test_opts_help();
	test_opts_man();
	test_opts_twice();
	test_opts_messages();
	test_opts_file();
	test_opts_config();
	test_opts_negation();
	test_opts_log_level();
	test_loop_work();
	test_loop_fd();
	test_loop_del_in_handler();
	test_loop_timers();
	test_loop_timer_heap();
	test_loop_destroy();
	test_offload_classes();
	test_offload_cancel_nowait();
	return test_done("common");
}
