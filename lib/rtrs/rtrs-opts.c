/* SPDX-License-Identifier: MIT */
/*
 * The option structs' defaults and the address syntax "[SRC@]HOST[:PORT]"
 * that every front end takes. Pure (no fabric, no threads, no log), so
 * that the front ends' parameter parsers and their fuzzers build it alone.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rtrs-pri.h"

RTRS_EXPORT
int rtrs_clt_opts_init(struct rtrs_clt_opts *o, size_t size)
{
	if (!o || size != sizeof(*o))
		return -EINVAL;
	memset(o, 0, sizeof(*o));
	o->size = size;
	o->port = RTRS_DEFAULT_PORT;
	o->provider = RTRS_DEFAULT_PROVIDER;
	o->hb_interval_ms = RTRS_DEFAULT_HB_INTERVAL_MS;
	o->hb_missed_max = RTRS_DEFAULT_HB_MISSED_MAX;
	o->connect_timeout_ms = RTRS_DEFAULT_CONNECT_TIMEOUT_MS;
	o->mp_policy = RTRS_MP_POLICY_MIN_INFLIGHT;
	o->reconnect_delay_ms = 1000;
	o->reconnect_jitter_ms = 1000;
	o->max_reconnect_attempts = -1;
	o->fast_io_fail_ms = RTRS_DEFAULT_FAST_IO_FAIL_MS;
	return 0;
}

/* A quarter of the machine's memory; 1 GiB when that cannot be told. */
RTRS_EXPORT
uint64_t rtrs_default_max_chunk_mem(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	if (pages <= 0 || psz <= 0)
		return 1ull << 30;
	return (uint64_t)pages * (uint64_t)psz / 4;
}

RTRS_EXPORT
int rtrs_srv_opts_init(struct rtrs_srv_opts *o, size_t size)
{
	if (!o || size != sizeof(*o))
		return -EINVAL;
	memset(o, 0, sizeof(*o));
	o->size = size;
	o->port = RTRS_DEFAULT_PORT;
	o->provider = RTRS_DEFAULT_PROVIDER;
	o->queue_depth = RTRS_DEFAULT_QUEUE_DEPTH;
	o->max_chunk_size = RTRS_DEFAULT_CHUNK_SIZE;
	o->hb_interval_ms = RTRS_DEFAULT_HB_INTERVAL_MS;
	o->hb_missed_max = RTRS_DEFAULT_HB_MISSED_MAX;
	o->listen_retry_ms = 1000;
	o->max_cons_per_path = 129; /* 128 CPUs and the admin connection */
	o->connect_timeout_ms = 30000;
	o->always_invalidate = 1;
	o->auth_timeout_ms = 10000;
	o->max_pending = RTRS_DEFAULT_MAX_PENDING;
	o->max_pending_per_peer = RTRS_DEFAULT_MAX_PENDING_PER_PEER;
	o->handshake_timeout_ms = RTRS_DEFAULT_HANDSHAKE_TIMEOUT_MS;
	o->max_sessions = RTRS_DEFAULT_MAX_SESSIONS;
	o->max_sessions_per_peer = RTRS_DEFAULT_MAX_SESSIONS_PER_PEER;
	o->max_chunk_mem = rtrs_default_max_chunk_mem();
	return 0;
}

/* ---- addresses ------------------------------------------------------------------ */

/* Says why into why (whylen bytes, may be 0) and returns -EINVAL. */
__attribute__((format(printf, 3, 4)))
static int addr_fail(char *why, size_t whylen, const char *fmt, ...)
{
	va_list ap;

	if (why && whylen) {
		va_start(ap, fmt);
		vsnprintf(why, whylen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* Printable ASCII without blanks: what addresses and ports are made of. */
static bool addr_chars_ok(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
			return false;
	return true;
}

static bool has_bracket(const char *s, size_t n)
{
	return memchr(s, '[', n) || memchr(s, ']', n);
}

/* How many times c occurs in s[0 .. n). */
static unsigned count_char(const char *s, size_t n, char c)
{
	unsigned k = 0;

	for (size_t i = 0; i < n; i++)
		k += s[i] == c;
	return k;
}

struct hostport {
	const char *host;     /* brackets removed; not terminated */
	size_t host_len;
	uint16_t port;        /* 0: none given */
};

/*
 * "HOST", "HOST:PORT", "[HOST]" or "[HOST]:PORT" in s (terminated): a host
 * with more than one colon and no brackets is a bare IPv6 address, all of
 * it host. 0, or -EINVAL with why.
 */
static int hostport_parse(const char *s, struct hostport *hp, char *why, size_t whylen)
{
	const char *colon = NULL;
	uint64_t v;

	hp->port = 0;
	if (*s == '[') {
		const char *rb = strchr(s, ']');

		if (!rb)
			return addr_fail(why, whylen, "no ']' after '['");
		hp->host = s + 1;
		hp->host_len = (size_t)(rb - s - 1);
		if (rb[1] == ':')
			colon = rb + 1;
		else if (rb[1])
			return addr_fail(why, whylen, "text after ']'");
	} else {
		size_t n = strlen(s);

		if (count_char(s, n, ':') == 1)
			colon = strchr(s, ':');
		hp->host = s;
		hp->host_len = colon ? (size_t)(colon - s) : n;
	}
	if (!hp->host_len)
		return addr_fail(why, whylen, "no host");
	if (has_bracket(hp->host, hp->host_len))
		return addr_fail(why, whylen, "'[' or ']' inside the host (brackets go around "
				 "an IPv6 address: [ADDR]:PORT)");
	if (hp->host_len > RTRS_ADDR_HOST_MAX)
		return addr_fail(why, whylen, "host longer than %d bytes", RTRS_ADDR_HOST_MAX);
	if (colon) {
		if (parse_u64(colon + 1, 1, 65535, &v))
			return addr_fail(why, whylen, "port '%s' is not a number in 1..65535",
					 colon + 1);
		hp->port = (uint16_t)v;
	}
	return 0;
}

/* The source address (n bytes at s): brackets removed, no port. */
static int src_parse(const char *s, size_t n, char *out, char *why, size_t whylen)
{
	if (!n)
		return addr_fail(why, whylen, "no source address before '@'");
	if (*s == '[') {
		const char *rb = memchr(s, ']', n);

		if (!rb)
			return addr_fail(why, whylen, "no ']' after '[' in the source address");
		if (rb != s + n - 1)
			return addr_fail(why, whylen, rb[1] == ':' ? "the source address takes no port"
					 : "text after ']' in the source address");
		s++;
		n -= 2;
		if (!n)
			return addr_fail(why, whylen, "no source address inside '[]'");
	}
	if (has_bracket(s, n))
		return addr_fail(why, whylen, "'[' or ']' inside the source address");
	/* One colon is HOST:PORT; an IPv6 address has two or more. */
	if (count_char(s, n, ':') == 1)
		return addr_fail(why, whylen, "the source address takes no port");
	if (n > RTRS_ADDR_HOST_MAX)
		return addr_fail(why, whylen, "source address longer than %d bytes",
				 RTRS_ADDR_HOST_MAX);
	memcpy(out, s, n);
	out[n] = '\0';
	return 0;
}

static int addr_parse(const char *text, uint16_t default_port, struct rtrs_addr *a, char *why,
		      size_t whylen)
{
	const char *at, *dst;
	struct hostport hp;
	int rc;

	if (!text || !*text)
		return addr_fail(why, whylen, "empty address, expected [SRC@]HOST[:PORT]");
	if (!addr_chars_ok(text))
		return addr_fail(why, whylen, "expected [SRC@]HOST[:PORT], printable and without "
				 "blanks");
	at = strchr(text, '@');
	dst = at ? at + 1 : text;
	if (at && strchr(dst, '@'))
		return addr_fail(why, whylen, "more than one '@'");
	if (at) {
		rc = src_parse(text, (size_t)(at - text), a->src, why, whylen);
		if (rc)
			return rc;
		if (!*dst)
			return addr_fail(why, whylen, "no host after '@'");
	}
	rc = hostport_parse(dst, &hp, why, whylen);
	if (rc)
		return rc;
	memcpy(a->host, hp.host, hp.host_len);
	a->host[hp.host_len] = '\0';
	a->has_port = hp.port != 0;
	a->port = hp.port ? hp.port : default_port;
	/* A host with a colon is an IPv6 address: in brackets, before a port or not. */
	if (a->has_port)
		snprintf(a->dst, sizeof(a->dst), strchr(a->host, ':') ? "[%s]:%u" : "%s:%u",
			 a->host, hp.port);
	else
		snprintf(a->dst, sizeof(a->dst), strchr(a->host, ':') ? "[%s]" : "%s", a->host);
	return 0;
}

RTRS_EXPORT
int rtrs_addr_parse(const char *text, uint16_t default_port, struct rtrs_addr *a, char *why,
		    size_t whylen)
{
	int rc;

	if (why && whylen)
		why[0] = '\0';
	if (!a || a->size != sizeof(*a))
		return addr_fail(why, whylen, "struct rtrs_addr of a size this library does not know");
	memset((char *)a + sizeof(a->size), 0, sizeof(*a) - sizeof(a->size));
	rc = addr_parse(text, default_port, a, why, whylen);
	/* A refused text leaves nothing of itself behind (a source parsed before the host). */
	if (rc)
		memset((char *)a + sizeof(a->size), 0, sizeof(*a) - sizeof(a->size));
	return rc;
}

RTRS_EXPORT
void rtrs_addr_path(const struct rtrs_addr *a, struct rtrs_path_addr *p)
{
	p->src = a->src[0] ? a->src : NULL;
	p->dst = a->dst;
}

int rtrs_split_hostport(const char *in, uint16_t default_port, char *host, size_t hostlen,
			char *port, size_t portlen)
{
	struct hostport hp;

	if (!in || !*in || !addr_chars_ok(in) || hostport_parse(in, &hp, NULL, 0))
		return -EINVAL;
	if (hp.host_len >= hostlen)
		return -EINVAL;
	memcpy(host, hp.host, hp.host_len);
	host[hp.host_len] = '\0';
	snprintf(port, portlen, "%u", hp.port ? hp.port : default_port);
	return 0;
}
