/* SPDX-License-Identifier: MIT */
/*
 * rtrs_addr_parse, the one parser of "[SRC@]HOST[:PORT]" every front end
 * uses, through librtrs.so as a program sees it: what each part becomes
 * (brackets off, the default port, the dst a path takes), the limits, and
 * every malformed text refused with -EINVAL and its exact reason, leaving
 * nothing of itself in the result.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "rtrs.h"

static void check_ok(int line, const char *in, uint16_t def, const char *src, const char *host,
		     unsigned port, int has_port, const char *dst)
{
	struct rtrs_addr a = { .size = sizeof(a) };
	char why[256] = "unchanged";
	int rc = rtrs_addr_parse(in, def, &a, why, sizeof(why));

	CHECK(rc == 0, "line %d: \"%s\" = %d (%s), want 0", line, in, rc, why);
	if (rc)
		return;
	CHECK(!why[0], "line %d: \"%s\": why \"%s\" on success", line, in, why);
	CHECK(!strcmp(a.src, src), "line %d: \"%s\": src \"%s\", want \"%s\"", line, in, a.src, src);
	CHECK(!strcmp(a.host, host), "line %d: \"%s\": host \"%s\", want \"%s\"", line, in, a.host,
	      host);
	CHECK(a.port == port && a.has_port == has_port, "line %d: \"%s\": port %u/%d, want %u/%d",
	      line, in, a.port, a.has_port, port, has_port);
	CHECK(!strcmp(a.dst, dst), "line %d: \"%s\": dst \"%s\", want \"%s\"", line, in, a.dst, dst);
}

static void check_err(int line, const char *in, const char *want)
{
	struct rtrs_addr a = { .size = sizeof(a) };
	char why[256] = "";
	int rc;

	memset(a.host, 'Z', sizeof(a.host));
	rc = rtrs_addr_parse(in, 1234, &a, why, sizeof(why));
	CHECK(rc == -EINVAL, "line %d: \"%s\" = %d, want -EINVAL", line, in ? in : "NULL", rc);
	CHECK(!strcmp(why, want), "line %d: \"%s\": why \"%s\", want \"%s\"", line,
	      in ? in : "NULL", why, want);
	CHECK(a.size == sizeof(a) && !a.src[0] && !a.host[0] && !a.dst[0] && !a.port &&
	      !a.has_port, "line %d: \"%s\": a refusal left a result behind", line, in ? in : "");
}

#define OK(in, def, src, host, port, has_port, dst) \
	check_ok(__LINE__, in, def, src, host, port, has_port, dst)
#define ERR(in, want) check_err(__LINE__, in, want)

static const char *const BLANKS = "expected [SRC@]HOST[:PORT], printable and without blanks";
static const char *const HOST_BRACKET =
	"'[' or ']' inside the host (brackets go around an IPv6 address: [ADDR]:PORT)";

static void test_good(void)
{
	OK("host", 1234, "", "host", 1234, 0, "host");
	OK("host", 0, "", "host", 0, 0, "host");
	OK("host:80", 1234, "", "host", 80, 1, "host:80");
	OK("h:1", 0, "", "h", 1, 1, "h:1");
	OK("1.2.3.4:65535", 1234, "", "1.2.3.4", 65535, 1, "1.2.3.4:65535");
	OK("my-host.example.com:4242", 1, "", "my-host.example.com", 4242, 1,
	   "my-host.example.com:4242");
	/* IPv6: in brackets, or bare (more than one colon) and then all host. */
	OK("[::1]:1234", 9, "", "::1", 1234, 1, "[::1]:1234");
	OK("[::1]", 9, "", "::1", 9, 0, "[::1]");
	OK("::1", 9, "", "::1", 9, 0, "[::1]");
	OK("fe80::1:80", 9, "", "fe80::1:80", 9, 0, "[fe80::1:80]");
	OK("[fe80::1%eth0]:9", 1, "", "fe80::1%eth0", 9, 1, "[fe80::1%eth0]:9");
	/* Brackets around a name or an IPv4 address are allowed, and dropped. */
	OK("[host]:7", 1, "", "host", 7, 1, "host:7");
	/* A source: a name or an address, IPv6 in brackets or bare. */
	OK("10.0.0.1@host:80", 1, "10.0.0.1", "host", 80, 1, "host:80");
	OK("eth0-addr.local@10.0.0.2", 1234, "eth0-addr.local", "10.0.0.2", 1234, 0, "10.0.0.2");
	OK("[fe80::2]@[fe80::1]:9", 1, "fe80::2", "fe80::1", 9, 1, "[fe80::1]:9");
	OK("fe80::2@[fe80::1]", 5, "fe80::2", "fe80::1", 5, 0, "[fe80::1]");
	OK("::1@::1", 5, "::1", "::1", 5, 0, "[::1]");
}

static void test_limits(void)
{
	char host[300], in[1024], want[512];
	struct rtrs_addr a = { .size = sizeof(a) };
	char why[256];

	/* 255 bytes of host and of source fit; the dst has room for brackets and a port. */
	memset(host, 'h', 255);
	host[255] = '\0';
	snprintf(in, sizeof(in), "%s@%s:65535", host, host);
	snprintf(want, sizeof(want), "%s:65535", host);
	OK(in, 1, host, host, 65535, 1, want);
	memset(host, ':', 255);
	host[0] = 'f';
	snprintf(in, sizeof(in), "[%s]:65535", host);
	OK(in, 1, "", host, 65535, 1, in);
	/* 256 do not. */
	memset(host, 'h', 256);
	host[256] = '\0';
	ERR(host, "host longer than 255 bytes");
	snprintf(in, sizeof(in), "[%s]:1", host);
	ERR(in, "host longer than 255 bytes");
	snprintf(in, sizeof(in), "%s@h", host);
	ERR(in, "source address longer than 255 bytes");
	snprintf(in, sizeof(in), "[%s]@h", host);
	ERR(in, "source address longer than 255 bytes");

	/* why: NULL, or too short for the reason, and still terminated. */
	CHECK_EQ(rtrs_addr_parse("h:0", 1, &a, NULL, 0), -EINVAL);
	memset(why, 'x', sizeof(why));
	CHECK_EQ(rtrs_addr_parse("h:0", 1, &a, why, 5), -EINVAL);
	CHECK(!strcmp(why, "port"), "truncated why \"%.8s\"", why);
	CHECK(why[5] == 'x', "wrote past whylen");
	/* A size this library does not know. */
	a.size = sizeof(a) - 1;
	CHECK_EQ(rtrs_addr_parse("h", 1, &a, why, sizeof(why)), -EINVAL);
	CHECK(strstr(why, "size") != NULL, "why \"%s\"", why);
	CHECK_EQ(rtrs_addr_parse("h", 1, NULL, why, sizeof(why)), -EINVAL);
}

static void test_malformed(void)
{
	ERR(NULL, "empty address, expected [SRC@]HOST[:PORT]");
	ERR("", "empty address, expected [SRC@]HOST[:PORT]");
	ERR("a b", BLANKS);
	ERR("host:80 ", BLANKS);
	ERR("a\tb", BLANKS);
	ERR("h\x7f", BLANKS);
	ERR("h\xc3\xa9", BLANKS);
	ERR("h\n", BLANKS);

	/* The host and its port. */
	ERR(":80", "no host");
	ERR("[]", "no host");
	ERR("[]:80", "no host");
	ERR("host:", "port '' is not a number in 1..65535");
	ERR("host:0", "port '0' is not a number in 1..65535");
	ERR("host:65536", "port '65536' is not a number in 1..65535");
	ERR("host:99999999999999999999999", "port '99999999999999999999999' is not a number in "
	    "1..65535");
	ERR("host:12x", "port '12x' is not a number in 1..65535");
	ERR("host:-1", "port '-1' is not a number in 1..65535");
	ERR("host:+1", "port '+1' is not a number in 1..65535");
	ERR("host:0x10", "port '0x10' is not a number in 1..65535");
	ERR("[::1", "no ']' after '['");
	ERR("[::1:80", "no ']' after '['");
	ERR("[::1]x", "text after ']'");
	ERR("[::1]]:1", "text after ']'");
	ERR("[::1]:", "port '' is not a number in 1..65535");
	ERR("[::1]:0", "port '0' is not a number in 1..65535");
	ERR("[::1]:65536", "port '65536' is not a number in 1..65535");
	ERR("a]b", HOST_BRACKET);
	ERR("a[b:1", HOST_BRACKET);
	ERR("[a[b]:1", HOST_BRACKET);
	ERR("::1]", HOST_BRACKET);

	/* The source. */
	ERR("@127.0.0.1", "no source address before '@'");
	ERR("@", "no source address before '@'");
	ERR("src@", "no host after '@'");
	ERR("a@b@c", "more than one '@'");
	ERR("a@@c", "more than one '@'");
	ERR("10.0.0.1:5@host", "the source address takes no port");
	ERR("[::1@host", "no ']' after '[' in the source address");
	ERR("[@host", "no ']' after '[' in the source address");
	ERR("[::1]:5@host", "the source address takes no port");
	ERR("[::1]x@host", "text after ']' in the source address");
	ERR("[a]b]@host", "text after ']' in the source address");
	ERR("[]@host", "no source address inside '[]'");
	ERR("s]@host", "'[' or ']' inside the source address");
	ERR("[a[b]@host", "'[' or ']' inside the source address");
	/* The host after a good source is checked as without one. */
	ERR("10.0.0.1@host:0", "port '0' is not a number in 1..65535");
	ERR("10.0.0.1@:80", "no host");
	ERR("10.0.0.1@[::1", "no ']' after '['");
}

static void test_path(void)
{
	struct rtrs_addr a = { .size = sizeof(a) };
	struct rtrs_path_addr p = { .src = "stale", .dst = "stale" };

	CHECK_EQ(rtrs_addr_parse("[::1]:7", 1, &a, NULL, 0), 0);
	rtrs_addr_path(&a, &p);
	CHECK(p.src == NULL, "no source: src %s", p.src);
	CHECK(p.dst == a.dst && !strcmp(p.dst, "[::1]:7"), "dst %s", p.dst);
	CHECK_EQ(rtrs_addr_parse("10.1.1.1@h", 1, &a, NULL, 0), 0);
	rtrs_addr_path(&a, &p);
	CHECK(p.src == a.src && !strcmp(p.src, "10.1.1.1"), "src %s", p.src);
	CHECK(!strcmp(p.dst, "h"), "dst %s", p.dst);
}

int main(void)
{
	test_good();
	test_limits();
	test_malformed();
	test_path();
	return test_done("test-addr");
}
