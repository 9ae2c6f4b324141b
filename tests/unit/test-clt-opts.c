/* SPDX-License-Identifier: MIT */
/*
 * The client front ends' session options (lib/front/clt-opts.c), the one
 * table rtrs-perf, rnbd-client, the rnbd command, rnbd-clientd and the
 * nbdkit plugin take them from:
 *
 *   - the table: every option has one name, the command line's with '-'
 *     where the key has '_' (fast-io-fail-ms, fast_io_fail_ms), an argument
 *     and help; a time's name ends in its unit (-ms, -us); names and keys
 *     are unique and found by key;
 *   - clt_cfg_init gives librtrs's defaults but for the front ends' own
 *     (fast_io_fail_ms 30000, reconnect_delay_ms 1000), and clt_cfg_finish
 *     makes the jitter half the delay unless it was given;
 *   - the names the front ends had before are refused with the new one
 *     (clt_opts_renamed), --reconnect-delay only in the rnbd command (it
 *     took seconds there);
 *   - each option lands in its field of struct rtrs_clt_opts, a refused
 *     value leaves it as it was, with the exact reason (the same text every
 *     front end prints after its own "--NAME VALUE: " or "KEY=VALUE: ");
 *   - paths go through rtrs_addr_parse up to the front end's limit;
 *   - clt_cfg_same_paths and clt_cfg_same_opts compare values, not texts:
 *     a port or a default written out or left out is the same, another
 *     host, port, order, option value or secret is not;
 *   - as a command line (lib/common/opts.c): picks add short letters and
 *     help, the front end's own options follow, --help shows the
 *     defaults, a refused secret is not repeated, and in a config file
 *     only the path may come twice.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "check.h"
#include "clt-opts.h"

static void test_table(void)
{
	for (int i = 0; i < CLT_OPT_NR; i++) {
		const char *name = clt_opt_name((enum clt_opt_id)i), *key = clt_opt_key((enum clt_opt_id)i);

		CHECK(name && *name && key && *key, "option %d unnamed", i);
		CHECK(clt_opt_arg((enum clt_opt_id)i)[0] && clt_opt_help((enum clt_opt_id)i)[0],
		      "%s: no argument name or help", name);
		/* One name: --names-with-dashes, keys_with_underscores, otherwise the same. */
		CHECK(!strchr(name, '_') && !strchr(key, '-'), "%s / %s", name, key);
		{
			char k[64];

			snprintf(k, sizeof(k), "%s", name);
			for (char *c = k; *c; c++)
				*c = *c == '-' ? '_' : *c;
			CHECK(!strcmp(k, key), "--%s is not %s=", name, key);
		}
		/* A time carries its unit in its name. */
		if (!strcmp(clt_opt_arg((enum clt_opt_id)i), "MS"))
			CHECK(strlen(key) > 3 && !strcmp(key + strlen(key) - 3, "_ms"), "%s", key);
		if (!strcmp(clt_opt_arg((enum clt_opt_id)i), "US"))
			CHECK(strlen(key) > 3 && !strcmp(key + strlen(key) - 3, "_us"), "%s", key);
		CHECK_EQ(clt_opt_by_key(key), i);
		for (int j = 0; j < i; j++) {
			CHECK(strcmp(name, clt_opt_name((enum clt_opt_id)j)), "%s twice", name);
			CHECK(strcmp(key, clt_opt_key((enum clt_opt_id)j)), "%s twice", key);
		}
	}
	CHECK_EQ(clt_opt_by_key("io-connections"), -1);
	CHECK_EQ(clt_opt_by_key(""), -1);
	CHECK(clt_opt_secret(CLT_OPT_SECRET) && clt_opt_secret(CLT_OPT_CTRL_SECRET));
	CHECK(!clt_opt_secret(CLT_OPT_SERVER) && !clt_opt_secret(CLT_OPT_HOST_NAME));
	CHECK(!clt_opt_secret(CLT_OPT_NR));
	CHECK(!strcmp(clt_opt_name(CLT_OPT_NR), ""));
}

static void set_ok(struct clt_cfg *c, enum clt_opt_id id, const char *value);

static void test_defaults(void)
{
	struct rtrs_clt_opts lib;
	struct clt_cfg c;

	rtrs_clt_opts_init(&lib, sizeof(lib));
	clt_cfg_init(&c, 4);
	/* librtrs's, but for the paths (they point into c) and the front ends' own. */
	lib.paths = c.paths;
	lib.fast_io_fail_ms = 30000;
	lib.reconnect_delay_ms = 1000;
	lib.reconnect_jitter_ms = 500;
	CHECK(!memcmp(&c.opts, &lib, sizeof(lib)), "clt_cfg_init is not the front ends' defaults");
	CHECK_EQ(c.opts.paths_num, 0);
	CHECK(!c.jitter_given);
	/* The jitter: half the delay, unless given. */
	set_ok(&c, CLT_OPT_RECONNECT_DELAY, "300");
	clt_cfg_finish(&c);
	CHECK_EQ(c.opts.reconnect_jitter_ms, 150);
	set_ok(&c, CLT_OPT_RECONNECT_JITTER, "7");
	set_ok(&c, CLT_OPT_RECONNECT_DELAY, "5000");
	clt_cfg_finish(&c);
	CHECK_EQ(c.opts.reconnect_jitter_ms, 7);
	CHECK_EQ(c.log_level, -1);
	CHECK_EQ(c.max_paths, 4);
	clt_cfg_init(&c, 0);
	CHECK_EQ(c.max_paths, 1);
	clt_cfg_init(&c, 1000);
	CHECK_EQ(c.max_paths, CLT_MAX_PATHS);
}

/* Sets id to value and expects 0. */
static void set_ok(struct clt_cfg *c, enum clt_opt_id id, const char *value)
{
	char err[256] = "";

	CHECK(clt_opt_set(c, id, value, err, sizeof(err)) == 0, "%s %s: %s", clt_opt_name(id),
	      value, err);
}

/* Sets id to value and expects rc with exactly want, and c untouched. */
static void set_bad(struct clt_cfg *c, enum clt_opt_id id, const char *value, int rc,
		    const char *want)
{
	struct clt_cfg before = *c;
	char err[256] = "";
	int got = clt_opt_set(c, id, value, err, sizeof(err));

	CHECK(got == rc, "%s %s = %d, want %d", clt_opt_name(id), value ? value : "NULL", got, rc);
	CHECK(!strcmp(err, want), "%s %s: \"%s\", want \"%s\"", clt_opt_name(id),
	      value ? value : "NULL", err, want);
	CHECK(!memcmp(&before, c, sizeof(*c)), "%s %s: a refused value changed the options",
	      clt_opt_name(id), value ? value : "NULL");
}

static void test_values(void)
{
	static const char *const num = "expected a number in ";
	struct clt_cfg c;
	char want[128];

	clt_cfg_init(&c, 4);
	set_ok(&c, CLT_OPT_PORT, "4791");
	CHECK_EQ(c.opts.port, 4791);
	set_ok(&c, CLT_OPT_PORT, "65535");
	CHECK_EQ(c.opts.port, 65535);
	snprintf(want, sizeof(want), "%s1..65535", num);
	set_bad(&c, CLT_OPT_PORT, "0", -EINVAL, want);
	set_bad(&c, CLT_OPT_PORT, "65536", -EINVAL, want);
	set_bad(&c, CLT_OPT_PORT, "12x", -EINVAL, want);
	set_bad(&c, CLT_OPT_PORT, "", -EINVAL, "needs a value");
	set_bad(&c, CLT_OPT_PORT, NULL, -EINVAL, "needs a value");

	set_ok(&c, CLT_OPT_IO_CONS, "1024");
	CHECK_EQ(c.opts.nr_io_cons, 1024);
	snprintf(want, sizeof(want), "%s0..1024", num);
	set_bad(&c, CLT_OPT_IO_CONS, "1025", -EINVAL, want);
	set_ok(&c, CLT_OPT_HB_INTERVAL, "10");
	CHECK_EQ(c.opts.hb_interval_ms, 10);
	snprintf(want, sizeof(want), "%s10..600000", num);
	set_bad(&c, CLT_OPT_HB_INTERVAL, "9", -EINVAL, want);
	set_ok(&c, CLT_OPT_FAST_IO_FAIL, "0");
	CHECK_EQ(c.opts.fast_io_fail_ms, 0);
	snprintf(want, sizeof(want), "%s0..3600000", num);
	set_bad(&c, CLT_OPT_FAST_IO_FAIL, "soon", -EINVAL, want);
	set_ok(&c, CLT_OPT_RECONNECT_DELAY, "3600000");
	CHECK_EQ(c.opts.reconnect_delay_ms, 3600000);
	set_bad(&c, CLT_OPT_RECONNECT_DELAY, "3600001", -EINVAL, want);
	set_ok(&c, CLT_OPT_MAX_RECONNECTS, "-1");
	CHECK_EQ(c.opts.max_reconnect_attempts, -1);
	set_ok(&c, CLT_OPT_MAX_RECONNECTS, "1000000");
	CHECK_EQ(c.opts.max_reconnect_attempts, 1000000);
	set_bad(&c, CLT_OPT_MAX_RECONNECTS, "-2", -EINVAL,
		"expected -1 (no limit) or a number in 0..1000000");
	set_bad(&c, CLT_OPT_MAX_RECONNECTS, "1000001", -EINVAL,
		"expected -1 (no limit) or a number in 0..1000000");
	{
		char shown[32];

		clt_opt_show(&c, CLT_OPT_MAX_RECONNECTS, shown, sizeof(shown));
		CHECK(!strcmp(shown, "1000000"), "shown %s", shown);
	}

	set_ok(&c, CLT_OPT_POLICY, "round-robin");
	CHECK_EQ(c.opts.mp_policy, RTRS_MP_POLICY_RR);
	set_ok(&c, CLT_OPT_POLICY, "min-latency");
	CHECK_EQ(c.opts.mp_policy, RTRS_MP_POLICY_MIN_LATENCY);
	set_bad(&c, CLT_OPT_POLICY, "fastest", -EINVAL,
		"expected round-robin, min-inflight or min-latency");

	set_ok(&c, CLT_OPT_SESSION, "s-1");
	CHECK(!strcmp(c.opts.sessname, "s-1"));
	set_ok(&c, CLT_OPT_SESSION, "host1.example.com");
	CHECK(!strcmp(c.opts.sessname, "host1.example.com"));
	set_bad(&c, CLT_OPT_SESSION, "..", -EINVAL,
		"expected 1..255 printable characters without blanks or '/', not '.' or '..'");
	set_bad(&c, CLT_OPT_SESSION, "a/b", -EINVAL,
		"expected 1..255 printable characters without blanks or '/', not '.' or '..'");
	set_ok(&c, CLT_OPT_PROVIDER, "verbs");
	CHECK(!strcmp(c.opts.provider, "verbs"));
	set_ok(&c, CLT_OPT_PROVIDER, "rdma");
	set_ok(&c, CLT_OPT_PROVIDER, "tcp");
	CHECK(!strcmp(c.opts.provider, "tcp"));
	/* libfabric's names are gone with it: one fabric per transport. */
	set_bad(&c, CLT_OPT_PROVIDER, "verbs;ofi_rxm", -EINVAL, "expected tcp, verbs or rdma");
	set_bad(&c, CLT_OPT_PROVIDER, "a b", -EINVAL, "expected tcp, verbs or rdma");
	set_ok(&c, CLT_OPT_HOST_NAME, "nqn.2014-08.org.nvmexpress:uuid:1");
	CHECK(!strcmp(c.opts.auth_host_name, "nqn.2014-08.org.nvmexpress:uuid:1"));
	set_bad(&c, CLT_OPT_HOST_NAME, "a b", -EINVAL,
		"expected 1..223 printable characters without blanks");
	set_ok(&c, CLT_OPT_SERVER_NAME, "srv");
	CHECK(!strcmp(c.opts.auth_server_name, "srv"));

	/* Secrets: what librtrs reads; the reason never holds the value. */
	set_ok(&c, CLT_OPT_SECRET, "DHHC-1:00:abc:");
	set_ok(&c, CLT_OPT_SECRET, "@/etc/key");
	set_ok(&c, CLT_OPT_CTRL_SECRET, "file:/etc/key");
	CHECK(!strcmp(c.opts.auth_secret, "@/etc/key") &&
	      !strcmp(c.opts.auth_ctrl_secret, "file:/etc/key"));
	set_bad(&c, CLT_OPT_SECRET, "hunter2", -EINVAL, "expected DHHC-1:..., @FILE or file:FILE");
	set_bad(&c, CLT_OPT_CTRL_SECRET, "@", -EINVAL, "expected DHHC-1:..., @FILE or file:FILE");

	set_ok(&c, CLT_OPT_LOG_LEVEL, "DEBUG");
	CHECK_EQ(c.log_level, 3);
	set_ok(&c, CLT_OPT_LOG_LEVEL, "0");
	CHECK_EQ(c.log_level, 0);
	set_bad(&c, CLT_OPT_LOG_LEVEL, "loud", -EINVAL, "expected error, warn, info or debug");
	set_bad(&c, CLT_OPT_NR, "1", -EINVAL, "no such option");
}

static void test_paths(void)
{
	struct clt_cfg c;

	clt_cfg_init(&c, 2);
	set_ok(&c, CLT_OPT_SERVER, "10.0.0.1@[fe80::1%eth0]:4791");
	set_bad(&c, CLT_OPT_SERVER, "127.0.0.1:0", -EINVAL, "port '0' is not a number in 1..65535");
	set_bad(&c, CLT_OPT_SERVER, "@127.0.0.1", -EINVAL, "no source address before '@'");
	set_ok(&c, CLT_OPT_SERVER, "host");
	CHECK_EQ(c.opts.paths_num, 2);
	CHECK(c.opts.paths == c.paths, "opts.paths does not point at the parsed paths");
	CHECK(!strcmp(c.opts.paths[0].src, "10.0.0.1") &&
	      !strcmp(c.opts.paths[0].dst, "[fe80::1%eth0]:4791"), "path 0: %s %s",
	      c.opts.paths[0].src, c.opts.paths[0].dst);
	/* Without :PORT the dst has none: opts.port applies, set before or after. */
	CHECK(c.opts.paths[1].src == NULL && !strcmp(c.opts.paths[1].dst, "host"), "path 1: %s",
	      c.opts.paths[1].dst);
	set_bad(&c, CLT_OPT_SERVER, "host3", -E2BIG, "at most 2 paths");
	CHECK_EQ(c.opts.paths_num, 2);
}

/* ---- as a command line ------------------------------------------------------ */

static struct {
	bool flag;
	uint64_t depth;
} own_vals;

static const struct opt own[] = {
	{ "flag", 'f', OPT_FLAG, &own_vals.flag, .help = "a flag of the front end" },
	{ "depth", 'q', OPT_UINT, &own_vals.depth, 1, 64, .arg = "N", .help = "its depth" },
	{ 0 },
};

static const struct clt_opt_pick picks[] = {
	{ CLT_OPT_SERVER, 'd', NULL },
	{ CLT_OPT_SESSION, 0, "the session's name here" },
	{ .id = CLT_OPT_PORT },
	{ .id = CLT_OPT_POLICY },
	{ .id = CLT_OPT_SECRET },
};

/* opts_parse on the words of args (at most 15); its return code, stderr in err. */
static int parse(const struct opt *t, const char *args, char *err, size_t errlen)
{
	static char words[512];
	char *argv[16] = { (char *)"prog" };
	struct capture cap;
	int argc = 1, pos, rc;

	snprintf(words, sizeof(words), "%s", args);
	for (char *w = strtok(words, " "); w && argc < 15; w = strtok(NULL, " "))
		argv[argc++] = w;
	capture_begin(&cap, 2);
	rc = opts_parse(t, "prog", "[options]", argc, argv, &pos);
	capture_end(&cap, err, errlen);
	return rc;
}

static void test_cli(void)
{
	static char out[8192];
	static struct clt_cfg c;
	struct capture cap;
	char err[1024];
	struct opt *t;
	unsigned n = 0;
	int rc;

	clt_cfg_init(&c, 3);
	c.opts.sessname = "front-end-default";
	t = clt_opts_table(&c, picks, sizeof(picks) / sizeof(picks[0]), own);
	CHECK(t != NULL);
	if (!t)
		return;
	while (t[n].name)
		n++;
	CHECK_EQ(n, 7);
	CHECK(!strcmp(t[0].name, "server") && t[0].short_name == 'd' && t[0].type == OPT_CUSTOM);
	CHECK(!strcmp(t[1].name, "session") && !strcmp(t[1].help, "the session's name here"));
	CHECK(!strcmp(t[2].name, "port") && !strcmp(t[2].help, clt_opt_help(CLT_OPT_PORT)));
	CHECK(!strcmp(t[5].name, "flag") && !strcmp(t[6].name, "depth"));

	rc = parse(t, "-d h1 --server=src@h2:7 --port 99 --policy round-robin --session s -f -q 8",
		   err, sizeof(err));
	CHECK(rc == 0, "rc %d: %s", rc, err);
	CHECK_EQ(c.opts.paths_num, 2);
	CHECK(c.opts.paths_num == 2 && !strcmp(c.opts.paths[1].src, "src") &&
	      !strcmp(c.opts.paths[1].dst, "h2:7"));
	CHECK_EQ(c.opts.port, 99);
	CHECK_EQ(c.opts.mp_policy, RTRS_MP_POLICY_RR);
	CHECK(!strcmp(c.opts.sessname, "s"));
	CHECK(own_vals.flag && own_vals.depth == 8);

	/* Refusals: the option, the value, the table's reason; never a secret. */
	CHECK_EQ(parse(t, "--port 0", err, sizeof(err)), -EINVAL);
	CHECK(!strcmp(err, "prog: --port 0: expected a number in 1..65535\n"), "%s", err);
	CHECK_EQ(parse(t, "--server h:0", err, sizeof(err)), -EINVAL);
	CHECK(!strcmp(err, "prog: --server h:0: port '0' is not a number in 1..65535\n"), "%s",
	      err);
	CHECK_EQ(parse(t, "--server h3 --server h4", err, sizeof(err)), -E2BIG);
	CHECK(!strcmp(err, "prog: --server h4: at most 3 paths\n"), "%s", err);
	CHECK_EQ(parse(t, "--secret hunter2", err, sizeof(err)), -EINVAL);
	CHECK(!strcmp(err, "prog: --secret: expected DHHC-1:..., @FILE or file:FILE\n"), "%s", err);
	CHECK_EQ(parse(t, "--session=", err, sizeof(err)), -EINVAL);
	CHECK(!strcmp(err, "prog: --session : empty value\n"), "%s", err);

	/* --help: the picked names, the front end's help, the current values as defaults. */
	capture_begin(&cap, 1);
	opts_help(t, "prog", "[options]");
	capture_end(&cap, out, sizeof(out));
	CHECK(strstr(out, "-d, --server [SRC@]HOST[:PORT]") != NULL, "%s", out);
	CHECK(strstr(out, "the session's name here (default s)") != NULL, "%s", out);
	CHECK(strstr(out, "(default 99)") && strstr(out, "(default round-robin)"), "%s", out);
	CHECK(strstr(out, "-q, --depth N") != NULL, "%s", out);

	/* A config file: the path may come again, nothing else. */
	{
		char text[] = "server h3\nport 5\n";
		char twice[] = "port 5\nport 6\n";

		clt_cfg_init(&c, 3);
		CHECK_EQ(opts_parse_text(t, "f.conf", text, strlen(text), err, sizeof(err)), 0);
		CHECK_EQ(c.opts.paths_num, 1);
		CHECK_EQ(opts_parse_text(t, "f.conf", twice, strlen(twice), err, sizeof(err)), -EINVAL);
		CHECK(!strcmp(err, "f.conf:2: port set again (first on line 1)"), "%s", err);
	}
	{
		char text[] = "server h1\nserver h2\nsecret nope\n";

		clt_cfg_init(&c, 3);
		CHECK_EQ(opts_parse_text(t, "g.conf", text, strlen(text), err, sizeof(err)), -EINVAL);
		CHECK_EQ(c.opts.paths_num, 2);
		CHECK(!strcmp(err, "g.conf:3: secret: expected DHHC-1:..., @FILE or file:FILE"),
		      "%s", err);
	}
	free(t);
}

/* The names of before: refused with today's, each where it meant something else. */
static bool renamed(const char *args, bool rnbd, const char *want)
{
	static char words[256];
	char *argv[16] = { (char *)"prog" }, err[512];
	struct capture cap;
	int argc = 1, rc;

	snprintf(words, sizeof(words), "%s", args);
	for (char *w = strtok(words, " "); w && argc < 15; w = strtok(NULL, " "))
		argv[argc++] = w;
	capture_begin(&cap, 2);
	rc = clt_opts_renamed("prog", argc, argv, rnbd);
	capture_end(&cap, err, sizeof(err));
	CHECK(rc == (want ? -EINVAL : 0) && !strcmp(err, want ? want : ""), "%s: %d \"%s\"", args,
	      rc, err);
	return true;
}

static void test_renamed(void)
{
	renamed("--dst h1", false, "prog: --dst is now --server\n");
	renamed("-q 1 --sessname=s", false, "prog: --sessname is now --session\n");
	renamed("--cons 2", false, "prog: --cons is now --io-connections\n");
	renamed("--fast-io-fail-tmo 5", true,
		"prog: --fast-io-fail-tmo is now --fast-io-fail-ms (milliseconds; it took seconds)\n");
	renamed("--ctrl-loss-tmo 5", true, "prog: --ctrl-loss-tmo is now "
		"--reconnect-loss-timeout-ms (milliseconds; it took seconds)\n");
	renamed("--reconnect-delay 1", true,
		"prog: --reconnect-delay is now --reconnect-delay-ms (milliseconds; it took "
		"seconds)\n");
	/* Elsewhere it was milliseconds, and is a prefix of the new name: it still works. */
	renamed("--reconnect-delay 1", false, NULL);
	renamed("--reconnect-delay-ms 1 --fast-io-fail 3 --server h", true, NULL);
	renamed("-- --dst", false, NULL);
}

/* A finished cfg from NULL-terminated pairs of option and value. */
static void cfg_of(struct clt_cfg *c, const enum clt_opt_id *ids, const char *const *values,
		   size_t n)
{
	clt_cfg_init(c, CLT_MAX_PATHS);
	for (size_t i = 0; i < n; i++)
		set_ok(c, ids[i], values[i]);
	clt_cfg_finish(c);
}

static void test_same(void)
{
	static const enum clt_opt_id given_ids[] = { CLT_OPT_SERVER, CLT_OPT_IO_CONS };
	static const char *const given[] = { "127.0.0.1", "1" };
	/* As rnbd-clientd saves a session: ports and every live value written out. */
	static const enum clt_opt_id saved_ids[] = {
		CLT_OPT_SERVER, CLT_OPT_IO_CONS, CLT_OPT_POLICY, CLT_OPT_FAST_IO_FAIL,
		CLT_OPT_RECONNECT_DELAY, CLT_OPT_RECONNECT_JITTER, CLT_OPT_MAX_RECONNECTS,
		CLT_OPT_LOSS_TIMEOUT };
	static const char *const saved[] = { "127.0.0.1:1234", "01", "min-inflight", "30000",
					     "1000", "500", "-1", "0" };
	static struct clt_cfg a, b; /* large: not on the stack */

	cfg_of(&a, given_ids, given, 2);
	cfg_of(&b, saved_ids, saved, sizeof(saved) / sizeof(saved[0]));
	CHECK(clt_cfg_same_paths(&a, &b) && clt_cfg_same_opts(&a, &b),
	      "defaults and the default port written out differ");
	set_ok(&b, CLT_OPT_POLICY, "round-robin");
	CHECK(clt_cfg_same_paths(&a, &b) && !clt_cfg_same_opts(&a, &b), "another policy");
	cfg_of(&b, given_ids, given, 2);
	set_ok(&b, CLT_OPT_SECRET, "@/nowhere");
	CHECK(!clt_cfg_same_opts(&a, &b), "a secret given");
	cfg_of(&b, given_ids, given, 2);
	set_ok(&b, CLT_OPT_PORT, "4000");
	CHECK(!clt_cfg_same_paths(&a, &b) && clt_cfg_same_opts(&a, &b),
	      "a path without a port takes opts.port");
	cfg_of(&b, given_ids, (const char *const[]){ "127.0.0.1:1235", "1" }, 2);
	CHECK(!clt_cfg_same_paths(&a, &b), "another port");
	cfg_of(&b, given_ids, (const char *const[]){ "10.0.0.1@127.0.0.1", "1" }, 2);
	CHECK(!clt_cfg_same_paths(&a, &b), "a source address");
	set_ok(&a, CLT_OPT_SERVER, "127.0.0.2");
	cfg_of(&b, (const enum clt_opt_id[]){ CLT_OPT_SERVER, CLT_OPT_SERVER },
	       (const char *const[]){ "127.0.0.2", "127.0.0.1" }, 2);
	CHECK(!clt_cfg_same_paths(&a, &b), "the same paths in another order");
}

int main(void)
{
	test_table();
	test_renamed();
	test_defaults();
	test_values();
	test_paths();
	test_same();
	test_cli();
	return test_done("test-clt-opts");
}
