/* SPDX-License-Identifier: MIT */
/*
 * The JSON-RPC 2.0 control plane (lib/rpc): the stream engine fed by hand
 * (pieces, batches, notifications, every kind of bad input), then the
 * server on a real Unix socket: calls, the socket file's rules, and
 * clients that send garbage, too much, or never read, which lose their
 * connection while everyone else is served.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rpc.h"

/* ---- methods ---- */

static int m_echo(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	static const char *const names[] = { "name", "count", "force", NULL };
	const char *name = NULL;
	uint64_t count = 1;
	bool force = false;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "name", true, &name, err)) ||
	    (rc = rpc_param_u64(params, "count", false, 1, 1000, &count, err)) ||
	    (rc = rpc_param_bool(params, "force", false, &force, err)))
		return rc;
	(void)priv;
	*result = json_object_new_object();
	json_object_object_add(*result, "name", json_object_new_string(name));
	json_object_object_add(*result, "count", json_object_new_uint64(count));
	json_object_object_add(*result, "force", json_object_new_boolean(force));
	return 0;
}

static int m_missing(void *priv, struct json_object *params, struct json_object **result,
		     struct rpc_err *err)
{
	const char *dev = "?";

	rpc_param_str(params, "device", false, &dev, err);
	return rpc_errf(err, -ENOENT, "device %s: no such device", dev);
}

static atomic_int notified;

static int m_note(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	notified++;
	return 0; /* *result NULL: null */
}

static int m_bare(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	return -EBUSY; /* no message: strerror's */
}

static char big_text[1 << 20];

static void big_fill(void)
{
	memset(big_text, 'x', sizeof(big_text) - 1);
}

/* An answer of 1 MiB per call; methods of several connections run at once (threaded). */
static int m_big(void *priv, struct json_object *params, struct json_object **result,
		 struct rpc_err *err)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, big_fill);
	*result = json_object_new_string(big_text);
	return *result ? 0 : -ENOMEM;
}

/* An answer of 17 MiB: more than one request may get (RPC_OUT_MAX). */
static int m_huge(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	size_t n = RPC_OUT_MAX + (1u << 20);
	char *t = malloc(n + 1);

	if (!t)
		return -ENOMEM;
	memset(t, 'y', n);
	t[n] = 0;
	*result = json_object_new_string_len(t, (int)n);
	free(t);
	return *result ? 0 : -ENOMEM;
}

/* "slow": waits until slow_release() (at most 10 s), counting who waits. */
static pthread_mutex_t slow_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t slow_cond = PTHREAD_COND_INITIALIZER;
static bool slow_go;
static unsigned slow_waiting, slow_done;

static int m_slow(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	struct timespec dl;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 10;
	pthread_mutex_lock(&slow_lock);
	slow_waiting++;
	pthread_cond_broadcast(&slow_cond);
	while (!slow_go && pthread_cond_timedwait(&slow_cond, &slow_lock, &dl) == 0)
		;
	slow_waiting--;
	slow_done++;
	pthread_mutex_unlock(&slow_lock);
	*result = json_object_new_string("slept");
	return 0;
}

static bool slow_wait_for(unsigned waiting)
{
	struct timespec dl;
	bool ok;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 5;
	pthread_mutex_lock(&slow_lock);
	while (slow_waiting < waiting && pthread_cond_timedwait(&slow_cond, &slow_lock, &dl) == 0)
		;
	ok = slow_waiting >= waiting;
	pthread_mutex_unlock(&slow_lock);
	return ok;
}

static void slow_release(bool go)
{
	pthread_mutex_lock(&slow_lock);
	slow_go = go;
	pthread_cond_broadcast(&slow_cond);
	pthread_mutex_unlock(&slow_lock);
}

static const struct rpc_method methods[] = {
	{ "echo", m_echo, "name: string, count: integer, force: bool", "says it back" },
	{ "missing", m_missing, "device: string", "always ENOENT" },
	{ "note", m_note, "", "counts" },
	{ "bare", m_bare, "", "EBUSY" },
	{ "big", m_big, "", "1 MiB" },
	{ "huge", m_huge, "", "17 MiB" },
};
#define NR_METHODS (sizeof(methods) / sizeof(methods[0]))

/* ---- the stream ---- */

struct sink {
	char buf[4 << 20];
	size_t len;
};

static struct sink sink;

static int sink_out(void *priv, const char *text, size_t len)
{
	struct sink *s = priv;

	if (s->len + len > sizeof(s->buf))
		return -ENOBUFS;
	memcpy(s->buf + s->len, text, len);
	s->len += len;
	return 0;
}

static struct rpc_stream *stream(void)
{
	sink.len = 0;
	return rpc_stream_new(methods, sizeof(methods) / sizeof(methods[0]), NULL, sink_out, &sink);
}

/* The answers so far, parsed (one text per line). */
static struct json_object *answer(unsigned idx)
{
	char *p = sink.buf, *end = sink.buf + sink.len;

	for (unsigned i = 0; p < end; i++) {
		char *nl = memchr(p, '\n', (size_t)(end - p));

		if (!nl)
			return NULL;
		if (i == idx) {
			*nl = 0;
			struct json_object *o = json_tokener_parse(p);

			*nl = '\n';
			return o;
		}
		p = nl + 1;
	}
	return NULL;
}

static unsigned answers(void)
{
	unsigned n = 0;

	for (size_t i = 0; i < sink.len; i++)
		n += sink.buf[i] == '\n';
	return n;
}

static int err_code(struct json_object *a)
{
	struct json_object *e, *c;

	if (!a || !json_object_object_get_ex(a, "error", &e) ||
	    !json_object_object_get_ex(e, "code", &c))
		return 0;
	return json_object_get_int(c);
}

static const char *err_msg(struct json_object *a)
{
	struct json_object *e, *m;

	if (!a || !json_object_object_get_ex(a, "error", &e) ||
	    !json_object_object_get_ex(e, "message", &m))
		return "";
	return json_object_get_string(m);
}

static const char *path_str(struct json_object *a, const char *k1, const char *k2)
{
	struct json_object *v;

	if (!a || !json_object_object_get_ex(a, k1, &v))
		return NULL;
	if (k2 && !json_object_object_get_ex(v, k2, &v))
		return NULL;
	return json_object_get_string(v);
}

static int feed(struct rpc_stream *st, const char *s)
{
	return rpc_stream_feed(st, s, strlen(s));
}

/* One request, its answer's error code (0: a result) and message. */
static int one(const char *req, const char *msg_has)
{
	struct rpc_stream *st = stream();
	struct json_object *a;
	int code, rc;

	rc = feed(st, req);
	CHECK(rc == 0 || rc == -EPROTO, "%s: %d", req, rc);
	CHECK_EQ(answers(), 1);
	a = answer(0);
	code = err_code(a);
	if (msg_has)
		CHECK(strstr(err_msg(a), msg_has), "%s: message \"%s\" lacks \"%s\"", req,
		      err_msg(a), msg_has);
	json_object_put(a);
	rpc_stream_free(st);
	return code;
}

static void stream_requests(void)
{
	const char *req = "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":"
			  "\"sp ace \\\"q\\\" \\\\ \\u00e9\\n.raw\",\"count\":7},\"id\":\"a1\"}";
	struct rpc_stream *st = stream();
	struct json_object *a;

	/* Byte by byte: one answer, when the text is complete. */
	for (size_t i = 0; req[i]; i++) {
		CHECK_EQ(rpc_stream_feed(st, req + i, 1), 0);
		if (req[i + 1])
			CHECK_EQ(answers(), 0);
	}
	CHECK_EQ(answers(), 1);
	a = answer(0);
	CHECK(a && !strcmp(path_str(a, "id", NULL), "a1"));
	CHECK(a && !strcmp(path_str(a, "result", "name"), "sp ace \"q\" \\ \xc3\xa9\n.raw"),
	      "the name came back as it was");
	CHECK(a && !strcmp(path_str(a, "result", "count"), "7"));
	CHECK(a && !strcmp(path_str(a, "jsonrpc", NULL), "2.0"));
	json_object_put(a);
	/* Two in one piece, blanks between, then a notification: two answers. */
	sink.len = 0;
	CHECK_EQ(feed(st, " {\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"x\"},"
			  "\"id\":1}\r\n\t{\"jsonrpc\":\"2.0\",\"method\":\"missing\",\"params\":"
			  "{\"device\":\"d0\"},\"id\":2}{\"jsonrpc\":\"2.0\",\"method\":\"note\"}\n"),
		 0);
	CHECK_EQ(answers(), 2);
	CHECK_EQ(notified, 1);
	a = answer(1);
	CHECK_EQ(err_code(a), ENOENT);
	CHECK(!strcmp(err_msg(a), "device d0: no such device"), "%s", err_msg(a));
	{
		struct json_object *e, *d, *n;

		CHECK(json_object_object_get_ex(a, "error", &e) &&
		      json_object_object_get_ex(e, "data", &d) &&
		      json_object_object_get_ex(d, "errno", &n) &&
		      !strcmp(json_object_get_string(n), "ENOENT"), "data.errno is ENOENT");
	}
	json_object_put(a);
	rpc_stream_free(st);

	/* A batch: answers in an array, none for its notification. */
	st = stream();
	CHECK_EQ(feed(st, "[{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"b\"},"
			  "\"id\":10},{\"jsonrpc\":\"2.0\",\"method\":\"note\"},{\"x\":1},"
			  "{\"jsonrpc\":\"2.0\",\"method\":\"rpc.methods\",\"id\":11}]"), 0);
	CHECK_EQ(answers(), 1);
	a = answer(0);
	CHECK(json_object_is_type(a, json_type_array) && json_object_array_length(a) == 3,
	      "three answers");
	if (json_object_is_type(a, json_type_array) && json_object_array_length(a) == 3) {
		CHECK(!strcmp(path_str(json_object_array_get_idx(a, 0), "result", "name"), "b"));
		CHECK_EQ(err_code(json_object_array_get_idx(a, 1)), RPC_INVALID_REQUEST);
		struct json_object *r;

		CHECK(json_object_object_get_ex(json_object_array_get_idx(a, 2), "result", &r) &&
		      json_object_array_length(r) == NR_METHODS, "rpc.methods lists the methods");
	}
	json_object_put(a);
	/* Notifications only: nothing at all. */
	sink.len = 0;
	CHECK_EQ(feed(st, "[{\"jsonrpc\":\"2.0\",\"method\":\"note\"}]"), 0);
	CHECK_EQ(answers(), 0);
	rpc_stream_free(st);
}

static void stream_bad_requests(void)
{
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"nope\",\"id\":1}", "no method \"nope\""),
		 RPC_METHOD_NOT_FOUND);
	CHECK_EQ(one("{\"jsonrpc\":\"1.0\",\"method\":\"echo\",\"id\":1}", "\"jsonrpc\""),
		 RPC_INVALID_REQUEST);
	CHECK_EQ(one("{\"method\":\"echo\",\"id\":1}", "\"jsonrpc\""), RPC_INVALID_REQUEST);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":5,\"id\":1}", "\"method\""),
		 RPC_INVALID_REQUEST);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":{}}", "\"id\""),
		 RPC_INVALID_REQUEST);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":1,\"extra\":2}",
		     "unknown member"), RPC_INVALID_REQUEST);
	CHECK_EQ(one("[]", "empty batch"), RPC_INVALID_REQUEST);
	CHECK_EQ(one("42 ", "an object or an array"), RPC_PARSE_ERROR);
	CHECK_EQ(one("\"s\"", "an object or an array"), RPC_PARSE_ERROR);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":[\"x\"],\"id\":1}",
		     "by name"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"id\":1}",
		     "missing parameter \"name\""), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":3},\"id\":1}",
		     "must be a string"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"\"},"
		     "\"id\":1}", "must not be empty"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\\u0000b\"},"
		     "\"id\":1}", "NUL"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"count\":-1},\"id\":1}", "negative"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"count\":1.5},\"id\":1}", "integer"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"count\":18446744073709551615},\"id\":1}", "out of range"),
		 RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"force\":\"yes\"},\"id\":1}", "true or false"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"colour\":1},\"id\":1}", "unknown parameter \"colour\""), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"rpc.methods\",\"params\":{\"a\":1},\"id\":1}",
		     "no parameters"), RPC_INVALID_PARAMS);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"bare\",\"id\":1}", "busy"), EBUSY);
}

/* Bytes that are not JSON, or a text too large: an error answer, and the stream ends. */
/* This process's peak resident memory, KiB. */
static long peak_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmHWM: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static void stream_garbage(void)
{
	static const char *const bad[] = {
		"{\"jsonrpc\":\"2.0\",,}", "\x01\x02\x03", "{\"a\" 1}", "{\"a\":\"\xff\xfe\"}",
		"{\"a\":1,}", "]", "{\"a\":tru}", "{\"a\":[1}",
	};
	struct rpc_stream *st;
	struct json_object *a;
	char *big;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		st = stream();
		CHECK_EQ(feed(st, bad[i]), -EPROTO);
		CHECK_EQ(answers(), 1);
		a = answer(0);
		CHECK_EQ(err_code(a), RPC_PARSE_ERROR);
		CHECK(a && json_object_object_get_ex(a, "id", NULL), "id: null");
		json_object_put(a);
		/* Nothing more is taken. */
		CHECK_EQ(feed(st, "{\"jsonrpc\":\"2.0\",\"method\":\"note\"}"), -EPROTO);
		CHECK_EQ(answers(), 1);
		rpc_stream_free(st);
	}
	/* Deeper than the tokener's limit: refused, not a stack overflow. */
	st = stream();
	big = malloc(100000);
	memset(big, '[', 99999);
	big[99999] = 0;
	CHECK_EQ(feed(st, big), -EPROTO);
	a = answer(0);
	CHECK_EQ(err_code(a), RPC_PARSE_ERROR);
	json_object_put(a);
	rpc_stream_free(st);
	free(big);
	/* A request of 1 MiB and more: refused once the limit is passed. */
	st = stream();
	big = malloc(RPC_REQ_MAX + 64);
	snprintf(big, 64, "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"");
	memset(big + strlen(big), 'n', RPC_REQ_MAX + 64 - strlen(big) - 1);
	big[RPC_REQ_MAX + 63] = 0;
	CHECK_EQ(feed(st, big), -EPROTO);
	CHECK_EQ(answers(), 1);
	a = answer(0);
	CHECK_EQ(err_code(a), RPC_INVALID_REQUEST);
	CHECK(strstr(err_msg(a), "1 MiB"), "%s", err_msg(a));
	json_object_put(a);
	rpc_stream_free(st);
	free(big);
	/* A whole text of RPC_REQ_MAX bytes is taken; one byte more is not. */
	for (size_t extra = 0; extra < 2; extra++) {
		const char *head = "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"";
		const char *tail = "\"},\"id\":5}";
		size_t total = RPC_REQ_MAX + extra, hl = strlen(head), tl = strlen(tail);

		big = malloc(total + 1);
		if (!big) {
			CHECK(big, "out of memory");
			return;
		}
		memcpy(big, head, hl);
		memset(big + hl, 'n', total - hl - tl);
		memcpy(big + total - tl, tail, tl + 1);
		st = stream();
		CHECK_EQ(feed(st, big), extra ? -EPROTO : 0);
		CHECK_EQ(answers(), 1);
		a = answer(0);
		CHECK_EQ(err_code(a), extra ? RPC_INVALID_REQUEST : 0);
		json_object_put(a);
		rpc_stream_free(st);
		free(big);
	}
	/*
	 * What json-c takes quietly and a request must not carry: a member
	 * named twice (json-c keeps the last), a NUL in a name (json-c's keys
	 * are C strings), an integer beyond 64 bits (json-c clamps it), and
	 * values enough to cost hundreds of MB ([{},{},...] in 1 MiB).
	 */
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\","
		     "\"name\":\"b\"},\"id\":1}", "given twice"), RPC_PARSE_ERROR);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"method\":\"note\",\"id\":1}",
		     "given twice"), RPC_PARSE_ERROR);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\\u0000x\":"
		     "\"a\"},\"id\":1}", "member name with a NUL"), RPC_PARSE_ERROR);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\"},"
		     "\"id\":18446744073709551616}", "beyond 64 bits"), RPC_PARSE_ERROR);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\"},"
		     "\"id\":-9223372036854775809}", "beyond 64 bits"), RPC_PARSE_ERROR);
	/* The limits themselves are taken, and an escaped backslash before u0000 is no NUL. */
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\\\\u0000\"},"
		     "\"id\":18446744073709551615}", NULL), 0);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\"},"
		     "\"id\":-9223372036854775808}", NULL), 0);
	CHECK_EQ(one("{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\"},"
		     "\"id\":0.5e300}", NULL), 0);
	{
		long before = peak_kib();
		size_t n = 3, cap = RPC_REQ_MAX - 16;

		big = malloc(cap + 1);
		memcpy(big, "[{}", 3);
		while (n + 4 < cap) {
			memcpy(big + n, ",{}", 3);
			n += 3;
		}
		big[n++] = ']';
		big[n] = 0;
		st = stream();
		CHECK_EQ(feed(st, big), -EPROTO);
		CHECK_EQ(answers(), 1);
		a = answer(0);
		CHECK_EQ(err_code(a), RPC_PARSE_ERROR);
		CHECK(strstr(err_msg(a), "values in one text"), "%s", err_msg(a));
		json_object_put(a);
		rpc_stream_free(st);
		CHECK(peak_kib() - before < 32 * 1024, "a text of 1 MiB of {} took %ld KiB more at "
		      "its peak", peak_kib() - before);
		free(big);
	}
	/* Blanks alone are no request: nothing happens, however many. */
	st = stream();
	big = malloc(3 << 20);
	memset(big, ' ', (3 << 20) - 1);
	big[(3 << 20) - 1] = 0;
	CHECK_EQ(feed(st, big), 0);
	CHECK_EQ(answers(), 0);
	CHECK_EQ(feed(st, "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"n\"},"
			  "\"id\":3}"), 0);
	CHECK_EQ(answers(), 1);
	rpc_stream_free(st);
	free(big);
}

/*
 * However the bytes are split, the same texts, the same answers, the same
 * end: json-c 0.16 alone took {"a":-1-1} a byte at a time and refused it
 * whole. Brackets inside strings, escaped quotes and texts back to back
 * are where a boundary could be taken wrongly.
 */
static void stream_split(void)
{
	static const char *const texts[] = {
		"{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":-1-1},\"id\":1}",
		"{\"a\":--",
		"{\"a\":1e5e5}",
		"{\"a\":nul}",
		"{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"]}\\\"{[\\\\\"},"
		"\"id\":2}[{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"x\"},"
		"\"id\":3}] {\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"y\"},\"id\":4}",
		"{\"a\":[1}",
		"[{\"a\":1]",
	};
	static char whole[sizeof(sink.buf)];

	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		const char *t = texts[i];
		struct rpc_stream *st = stream();
		size_t whole_len;
		int ra, rb = 0;

		ra = feed(st, t);
		rpc_stream_free(st);
		whole_len = sink.len;
		memcpy(whole, sink.buf, whole_len);
		st = stream();
		for (size_t k = 0; t[k] && !rb; k++)
			rb = rpc_stream_feed(st, t + k, 1);
		rpc_stream_free(st);
		CHECK(ra == rb, "%s: %d whole, %d a byte at a time", t, ra, rb);
		CHECK(whole_len == sink.len && !memcmp(whole, sink.buf, whole_len),
		      "%s: the same answers whole and a byte at a time", t);
	}
	/* -1-1 is no number, however it arrives. */
	CHECK_EQ(one(texts[0], "not JSON"), RPC_PARSE_ERROR);
	/* Three texts back to back, brackets and quotes in a name: three answers. */
	{
		struct rpc_stream *st = stream();
		struct json_object *a;

		CHECK_EQ(feed(st, texts[4]), 0);
		CHECK_EQ(answers(), 3);
		a = answer(0);
		CHECK(a && !strcmp(path_str(a, "result", "name"), "]}\"{[\\"), "%s",
		      path_str(a, "result", "name"));
		json_object_put(a);
		rpc_stream_free(st);
	}
	/* A bracket closing what it did not open ends the stream at once. */
	CHECK_EQ(one("{\"a\":[1}", "closes no object"), RPC_PARSE_ERROR);
	CHECK_EQ(one("[{\"a\":1]", "closes no array"), RPC_PARSE_ERROR);
	/* RPC_DEPTH_MAX levels are JSON (not a request); one more is refused at once. */
	{
		char deep[6 * RPC_DEPTH_MAX + 3];
		size_t n = 0;

		for (unsigned k = 1; k < RPC_DEPTH_MAX; k++)
			n += (size_t)sprintf(deep + n, "{\"a\":");
		n += (size_t)sprintf(deep + n, "{}");
		for (unsigned k = 1; k < RPC_DEPTH_MAX; k++)
			deep[n++] = '}';
		deep[n] = 0;
		CHECK_EQ(one(deep, NULL), RPC_INVALID_REQUEST);
		n = 0;
		for (unsigned k = 0; k <= RPC_DEPTH_MAX; k++)
			deep[n++] = '[';
		deep[n] = 0;
		CHECK_EQ(one(deep, "deeper than 32"), RPC_PARSE_ERROR);
	}
}

/* ---- the server ---- */

static char dir[128], sock[108];

static int raw_connect(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a))) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Reads until the peer closes (or 5 s): the bytes read. */
static size_t read_to_close(int fd, char *buf, size_t cap)
{
	size_t n = 0;

	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (poll(&p, 1, 5000) <= 0)
			return (size_t)-1;
		k = read(fd, buf + n, cap - n - 1);
		if (k <= 0)
			break;
		n += (size_t)k;
		if (n == cap - 1)
			break;
	}
	buf[n] = 0;
	return n;
}

/* Reads until lines newlines came (or 5 s without a byte): the bytes read, or -1. */
static size_t read_lines(int fd, char *buf, size_t cap, unsigned lines)
{
	size_t n = 0;
	unsigned seen = 0;

	while (seen < lines && n < cap - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		ssize_t k;

		if (poll(&p, 1, 5000) <= 0) {
			fprintf(stderr, "read_lines: nothing for 5 s after %zu bytes, %u lines\n", n,
				seen);
			return (size_t)-1;
		}
		k = read(fd, buf + n, cap - n - 1);
		if (k <= 0)
			break;
		for (ssize_t i = 0; i < k; i++)
			seen += buf[n + (size_t)i] == '\n';
		n += (size_t)k;
	}
	buf[n] = 0;
	return seen == lines ? n : (size_t)-1;
}

/* Whether the server closed fd within ms (a send then fails with EPIPE; nothing is read). */
static bool wait_closed(int fd, unsigned ms)
{
	for (unsigned t = 0; t < ms; t += 20) {
		if (send(fd, " ", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EPIPE)
			return true;
		usleep(20 * 1000);
	}
	return false;
}

/* This process's resident memory (the server runs in it), KiB. */
static long rss_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;

	while (f && fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static uint64_t now_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

static bool call_echo_ok(const char *name)
{
	struct json_object *p = json_object_new_object(), *r = NULL, *v;
	struct rpc_err e;
	bool ok;

	json_object_object_add(p, "name", json_object_new_string(name));
	ok = !rpc_call(sock, "echo", p, 5000, &r, &e) && json_object_object_get_ex(r, "name", &v) &&
	     !strcmp(json_object_get_string(v), name);
	json_object_put(p);
	json_object_put(r);
	return ok;
}

static void server_calls(unsigned flags)
{
	struct rpc_server *s;
	struct json_object *r = NULL, *p;
	struct rpc_err e;
	struct stat st;
	char buf[4096];
	int fd;

	CHECK_EQ(rpc_server_start_flags(sock, "test", methods, NR_METHODS, NULL, flags, &s), 0);
	CHECK(!stat(sock, &st) && S_ISSOCK(st.st_mode) && (st.st_mode & 0777) == 0600,
	      "a socket, mode 0600 (%o)", st.st_mode & 0777);
	CHECK(call_echo_ok("sp ace \"q\".raw"), "a name with a space and quotes");
	p = json_object_new_object();
	json_object_object_add(p, "device", json_object_new_string("d\"1"));
	CHECK_EQ(rpc_call(sock, "missing", p, 5000, &r, &e), -EREMOTEIO);
	CHECK_EQ(e.code, ENOENT);
	CHECK(!strcmp(e.msg, "device d\"1: no such device"), "%s", e.msg);
	json_object_put(p);
	CHECK_EQ(rpc_call(sock, "nope", NULL, 5000, &r, &e), -EREMOTEIO);
	CHECK_EQ(e.code, RPC_METHOD_NOT_FOUND);
	CHECK_EQ(rpc_call(sock, "rpc.methods", NULL, 5000, &r, &e), 0);
	CHECK(json_object_is_type(r, json_type_array) && json_object_array_length(r) == NR_METHODS);
	json_object_put(r);
	/* A second server on the same socket: refused, the first goes on. */
	{
		struct rpc_server *s2 = NULL;

		CHECK_EQ(rpc_server_start(sock, "test2", methods, NR_METHODS, NULL, &s2), -EADDRINUSE);
	}
	/* Garbage: an error answer, then the connection closes; others go on. */
	fd = raw_connect();
	CHECK(fd >= 0);
	CHECK_EQ(write(fd, "garbage{", 8), 8);
	CHECK(read_to_close(fd, buf, sizeof(buf)) != (size_t)-1, "closed by the server");
	CHECK(strstr(buf, "-32700"), "parse error answered: %s", buf);
	close(fd);
	CHECK(call_echo_ok("after garbage"));
	/* 1 MiB and more in one request: an error, closed; others go on. */
	{
		static char big[RPC_REQ_MAX + 4096];
		size_t off = 0;

		off = (size_t)snprintf(big, sizeof(big), "{\"jsonrpc\":\"2.0\",\"method\":\"echo\","
					"\"params\":{\"name\":\"");
		memset(big + off, 'n', sizeof(big) - off);
		fd = raw_connect();
		/* The server may close before all is sent: EPIPE is fine. */
		for (size_t sent = 0; sent < sizeof(big);) {
			ssize_t k = send(fd, big + sent, sizeof(big) - sent, MSG_NOSIGNAL);

			if (k <= 0)
				break;
			sent += (size_t)k;
		}
		CHECK(read_to_close(fd, buf, sizeof(buf)) != (size_t)-1, "closed by the server");
		CHECK(strstr(buf, "1 MiB"), "too large answered: %.200s", buf);
		close(fd);
	}
	CHECK(call_echo_ok("after a large one"));
	/*
	 * Clients that ask and never read: each holds the answers to one text
	 * (1 MiB here), not all it asked for (the server reads no more while
	 * they wait); everyone else is served meanwhile. Before, 8 such clients
	 * asking 12 MiB each held 96 MiB until they went away.
	 */
	{
		const char *req = "{\"jsonrpc\":\"2.0\",\"method\":\"big\",\"id\":1}";
		int sz = 4096, fds[8];
		long before = rss_kib(), grown;
		bool gone = true;

		for (int k = 0; k < 8; k++) {
			fds[k] = raw_connect();
			CHECK(fds[k] >= 0);
			setsockopt(fds[k], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
			for (int i = 0; i < 12; i++)
				CHECK(send(fds[k], req, strlen(req), MSG_NOSIGNAL) > 0);
		}
		CHECK(call_echo_ok("while 8 never read"));
		usleep(300 * 1000);
		CHECK(call_echo_ok("while 8 never read, again"));
		grown = rss_kib() - before;
		printf("8 clients that never read (12 MiB asked each): the server grew by %ld KiB\n",
		       grown);
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
		/* A sanitizer's allocator keeps what was freed for a while: the bound is not its. */
		CHECK(grown < 40 * 1024, "8 clients that never read grew the server by %ld KiB", grown);
#endif
		/* Answers not read for the stall time: closed (EPIPE at the client's next send). */
		rpc_server_set_times(s, RPC_IDLE_MS, RPC_REQUEST_MS, 300);
		CHECK(call_echo_ok("wakes the server to the new times"));
		for (int k = 0; k < 8; k++) {
			gone = gone && wait_closed(fds[k], 3000);
			close(fds[k]);
		}
		CHECK(gone, "clients that do not read their answers are closed");
		rpc_server_set_times(s, RPC_IDLE_MS, RPC_REQUEST_MS, RPC_STALL_MS);
	}
	/*
	 * Answers too large for one text: a single one becomes its request's
	 * EMSGSIZE error; a batch's are kept in order while they fit and the
	 * rest get that error, every request answered with its id; the
	 * connection goes on (an echo on it after each is answered).
	 */
	{
		size_t cap = RPC_OUT_MAX + (2u << 20), n;
		char *in = malloc(cap), batch[64 * 20];
		const char *huge = "{\"jsonrpc\":\"2.0\",\"method\":\"huge\",\"id\":\"h\"}\n"
				   "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":"
				   "\"after\"},\"id\":2}\n";
		size_t off = 0;

		fd = raw_connect();
		CHECK(in && fd >= 0 && send(fd, huge, strlen(huge), MSG_NOSIGNAL) > 0);
		n = in ? read_lines(fd, in, cap, 2) : 0;
		CHECK(n != (size_t)-1 && n < 4096, "a 17 MiB answer: %zu bytes came", n);
		if (n != (size_t)-1) {
			CHECK(strstr(in, "{\"jsonrpc\":\"2.0\",\"id\":\"h\",\"error\":{\"code\":90,") ==
			      in, "%.300s", in);
			CHECK(strstr(in, "more than the 16 MiB") && strstr(in, "EMSGSIZE"), "%.300s", in);
			CHECK(strstr(in, "\"id\":2,\"result\":{\"name\":\"after\""), "%.300s", in);
		}
		close(fd);

		off += (size_t)snprintf(batch + off, sizeof(batch) - off, "[");
		for (int i = 0; i < 20; i++)
			off += (size_t)snprintf(batch + off, sizeof(batch) - off,
						"%s{\"jsonrpc\":\"2.0\",\"method\":\"big\",\"id\":%d}",
						i ? "," : "", i);
		snprintf(batch + off, sizeof(batch) - off,
			 "]\n{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":"
			 "\"after\"},\"id\":21}\n");
		fd = raw_connect();
		CHECK(in && fd >= 0 && send(fd, batch, strlen(batch), MSG_NOSIGNAL) > 0);
		n = in ? read_lines(fd, in, cap, 2) : 0;
		CHECK(n != (size_t)-1 && n < RPC_OUT_MAX + 4096, "20 MiB asked in a batch: %zu bytes",
		      n);
		if (n != (size_t)-1) {
			char *nl = strchr(in, '\n');
			struct json_object *arr = NULL;
			unsigned results = 0, errors = 0;
			bool ordered = true;

			if (nl) {
				*nl = 0;
				arr = json_tokener_parse(in);
			}
			CHECK(arr && json_object_is_type(arr, json_type_array) &&
			      json_object_array_length(arr) == 20, "the batch's 20 answers");
			for (size_t i = 0; arr && i < json_object_array_length(arr); i++) {
				struct json_object *a = json_object_array_get_idx(arr, i), *v, *c;

				if (!json_object_object_get_ex(a, "id", &v) ||
				    json_object_get_int(v) != (int)i)
					ordered = false;
				if (json_object_object_get_ex(a, "result", &v) &&
				    json_object_get_string_len(v) == (1 << 20) - 1 && !errors)
					results++;
				else if (json_object_object_get_ex(a, "error", &v) &&
					 json_object_object_get_ex(v, "code", &c) &&
					 json_object_get_int(c) == EMSGSIZE)
					errors++;
			}
			CHECK(ordered && results >= 14 && results + errors == 20,
			      "%u answers, then %u EMSGSIZE errors, in order %d", results, errors,
			      ordered);
			json_object_put(arr);
			CHECK(nl && strstr(nl + 1, "\"id\":21,\"result\":{\"name\":\"after\""),
			      "the echo after the batch");
		}
		close(fd);
		free(in);
		CHECK(call_echo_ok("after a batch too large to answer"));
	}
	/* Many connections at once, each answered. */
	{
		int fds[RPC_CONN_MAX + 8];
		const char *req = "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"m\"},"
				  "\"id\":7}\n";
		unsigned ok = 0;

		for (int i = 0; i < RPC_CONN_MAX + 8; i++) {
			fds[i] = raw_connect();
			if (fds[i] >= 0 && write(fds[i], req, strlen(req)) > 0)
				shutdown(fds[i], SHUT_WR);
		}
		for (int i = 0; i < RPC_CONN_MAX + 8; i++) {
			if (fds[i] < 0)
				continue;
			if (read_to_close(fds[i], buf, sizeof(buf)) != (size_t)-1 &&
			    strstr(buf, "\"result\""))
				ok++;
			close(fds[i]);
		}
		CHECK_EQ(ok, RPC_CONN_MAX + 8);
	}
	rpc_server_stop(s);
	CHECK(stat(sock, &st) && errno == ENOENT, "the socket is removed");
	CHECK(rpc_call(sock, "echo", NULL, 1000, &r, &e) < 0 && e.msg[0], "%s", e.msg);
}

/*
 * RPC_SERVER_THREADED: a method that blocks holds only its own connection.
 * Connection A asks for "slow" twice and then "echo"; while the first slow
 * runs, another connection's echo is answered at once, and so is a third
 * connection's slow (concurrent with A's). Released, A's answers come in
 * order. Stopping the server waits for a method in progress, and its
 * answer goes out.
 */
static const struct rpc_method slow_methods[] = {
	{ "echo", m_echo, "name: string", "says it back" },
	{ "slow", m_slow, "", "waits to be released" },
};

struct stop_arg {
	struct rpc_server *s;
	bool done;
};

static void *stopper(void *arg)
{
	struct stop_arg *a = arg;

	rpc_server_stop(a->s);
	__atomic_store_n(&a->done, true, __ATOMIC_SEQ_CST);
	return NULL;
}

static void server_threaded(void)
{
	const char *reqs = "{\"jsonrpc\":\"2.0\",\"method\":\"slow\",\"id\":1}"
			   "{\"jsonrpc\":\"2.0\",\"method\":\"slow\",\"id\":2}"
			   "{\"jsonrpc\":\"2.0\",\"method\":\"echo\",\"params\":{\"name\":\"a\"},"
			   "\"id\":3}";
	const char *one = "{\"jsonrpc\":\"2.0\",\"method\":\"slow\",\"id\":9}";
	struct stop_arg stop = { 0 };
	struct rpc_server *s;
	char buf[4096];
	pthread_t t;
	int a, b;

	slow_release(false);
	CHECK_EQ(rpc_server_start_flags(sock, "test", slow_methods, 2, NULL, RPC_SERVER_THREADED,
					&s), 0);
	a = raw_connect();
	CHECK(a >= 0 && write(a, reqs, strlen(reqs)) == (ssize_t)strlen(reqs));
	shutdown(a, SHUT_WR);
	CHECK(slow_wait_for(1), "A's first slow runs");
	CHECK(call_echo_ok("while A's slow runs"), "another connection is answered");
	b = raw_connect();
	CHECK(b >= 0 && write(b, one, strlen(one)) == (ssize_t)strlen(one));
	shutdown(b, SHUT_WR);
	CHECK(slow_wait_for(2), "a third connection's slow runs beside A's");
	CHECK_EQ(slow_waiting, 2); /* A's second waits for its first: one at a time per connection */
	slow_release(true);
	CHECK(read_to_close(a, buf, sizeof(buf)) != (size_t)-1, "A answered and closed");
	{
		char *i1 = strstr(buf, "\"id\":1"), *i2 = strstr(buf, "\"id\":2");
		char *i3 = strstr(buf, "\"id\":3");

		CHECK(i1 && i2 && i3 && i1 < i2 && i2 < i3, "A's answers in order: %s", buf);
	}
	CHECK(read_to_close(b, buf, sizeof(buf)) != (size_t)-1 && strstr(buf, "slept"),
	      "B answered: %s", buf);
	close(a);
	close(b);
	/*
	 * A client that hangs up while its method runs (it gave up waiting):
	 * the server does not spin on the hang-up meanwhile (poll reports it
	 * whatever it is asked), and serves on once the method ends.
	 */
	slow_release(false);
	a = raw_connect();
	CHECK(a >= 0 && write(a, one, strlen(one)) == (ssize_t)strlen(one));
	CHECK(slow_wait_for(1), "a slow runs");
	close(a);
	{
		struct timespec c0, c1;
		uint64_t cpu_ms;

		usleep(50 * 1000);
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
		usleep(500 * 1000);
		clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
		cpu_ms = (uint64_t)((c1.tv_sec - c0.tv_sec) * 1000 + (c1.tv_nsec - c0.tv_nsec) / 1000000);
		CHECK(cpu_ms < 150, "the server used %" PRIu64 " ms of CPU in 500 ms while a hung-up "
		      "client's method ran", cpu_ms);
	}
	slow_release(true);
	CHECK(call_echo_ok("after a hung-up client's method ended"));
	/* A stop waits for the method in progress, and then is done. */
	slow_release(false);
	a = raw_connect();
	CHECK(a >= 0 && write(a, one, strlen(one)) == (ssize_t)strlen(one));
	CHECK(slow_wait_for(1), "a slow runs");
	stop.s = s;
	pthread_create(&t, NULL, stopper, &stop);
	usleep(200 * 1000);
	CHECK(!__atomic_load_n(&stop.done, __ATOMIC_SEQ_CST), "the stop waits for the method");
	slow_release(true);
	pthread_join(t, NULL);
	CHECK(__atomic_load_n(&stop.done, __ATOMIC_SEQ_CST));
	CHECK(read_to_close(a, buf, sizeof(buf)) != (size_t)-1 && strstr(buf, "slept"),
	      "the method's answer went out before the stop closed it: %s", buf);
	close(a);
}

static void server_socket_file(void)
{
	struct rpc_server *s = NULL;
	int fd;

	/* A regular file at the path is never replaced. */
	fd = open(sock, O_CREAT | O_WRONLY, 0600);
	CHECK(fd >= 0);
	close(fd);
	CHECK_EQ(rpc_server_start(sock, "test", methods, NR_METHODS, NULL, &s), -EEXIST);
	CHECK(!access(sock, F_OK), "the file is still there");
	unlink(sock);
	/* A stale socket (nobody listens) is. */
	{
		struct sockaddr_un a = { .sun_family = AF_UNIX };

		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
		CHECK_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
		close(fd);
	}
	CHECK_EQ(rpc_server_start(sock, "test", methods, NR_METHODS, NULL, &s), 0);
	CHECK(call_echo_ok("after a stale socket"));
	rpc_server_stop(s);
	CHECK_EQ(rpc_server_start("", "test", methods, NR_METHODS, NULL, &s), -EINVAL);
}

/*
 * Idle and half-sent connections cannot lock the owner out: at the limit a
 * newcomer takes the place of the one that has made no progress for
 * longest; and both kinds are closed after their time.
 */
static void server_stuck_clients(void)
{
	struct rpc_server *s;
	int fds[RPC_CONN_MAX];
	char buf[256];
	uint64_t t0;

	CHECK_EQ(rpc_server_start(sock, "test", methods, NR_METHODS, NULL, &s), 0);
	for (int i = 0; i < RPC_CONN_MAX; i++) {
		fds[i] = raw_connect();
		CHECK(fds[i] >= 0);
		/* Half of them send the beginning of a request, and no more. */
		if (i % 2)
			CHECK(write(fds[i], "{\"jsonrpc\":", 11) == 11);
	}
	usleep(100 * 1000);
	t0 = now_ms();
	CHECK(call_echo_ok("past 64 stuck clients"), "the owner is locked out");
	printf("64 stuck clients: a call answered after %llu ms\n",
	       (unsigned long long)(now_ms() - t0));
	CHECK(now_ms() - t0 < 4000, "answered after %llu ms", (unsigned long long)(now_ms() - t0));
	CHECK(call_echo_ok("past 64 stuck clients, again"));
	for (int i = 0; i < RPC_CONN_MAX; i++)
		close(fds[i]);
	rpc_server_stop(s);

	/* An idle connection and a request never finished: closed after their times. */
	CHECK_EQ(rpc_server_start(sock, "test", methods, NR_METHODS, NULL, &s), 0);
	rpc_server_set_times(s, 300, 300, 300);
	fds[0] = raw_connect();
	fds[1] = raw_connect();
	CHECK(fds[0] >= 0 && fds[1] >= 0);
	CHECK(write(fds[1], "{\"jsonrpc\":\"2.0\",", 17) == 17);
	t0 = now_ms();
	CHECK(read_to_close(fds[0], buf, sizeof(buf)) == 0, "an idle connection is closed");
	CHECK(read_to_close(fds[1], buf, sizeof(buf)) == 0, "a request never finished: closed");
	CHECK(now_ms() - t0 < 3000, "closed after %llu ms", (unsigned long long)(now_ms() - t0));
	close(fds[0]);
	close(fds[1]);
	/* A request that arrives slowly but within its time is answered. */
	fds[0] = raw_connect();
	CHECK(write(fds[0], "{\"jsonrpc\":\"2.0\",", 17) == 17);
	usleep(100 * 1000);
	CHECK(write(fds[0], "\"method\":\"echo\",\"params\":{\"name\":\"s\"},\"id\":1}", 46) == 46);
	shutdown(fds[0], SHUT_WR);
	CHECK(read_to_close(fds[0], buf, sizeof(buf)) != (size_t)-1 && strstr(buf, "\"result\""),
	      "a request in two pieces 100 ms apart: %s", buf);
	close(fds[0]);
	rpc_server_stop(s);
}

/* ---- served on the caller's thread (RPC_SERVER_CALLER, rpc_serve) ---- */

struct caller_arg {
	int efd;
	bool echo_ok;
	unsigned prepared, ran;
};

/* A client of the served server: one call, then the eventfd that ends rpc_serve. */
static void *caller_client(void *arg)
{
	struct caller_arg *a = arg;
	uint64_t one = 1;

	a->echo_ok = call_echo_ok("served by the caller");
	CHECK_EQ(write(a->efd, &one, sizeof(one)), (ssize_t)sizeof(one));
	return NULL;
}

static int caller_end_fn(void *priv, bool readable)
{
	struct caller_arg *a = priv;
	uint64_t v;

	if (!readable)
		return 0;
	CHECK_EQ(read(a->efd, &v, sizeof(v)), (ssize_t)sizeof(v));
	return 7;
}

static int caller_tick_prepare(void *priv)
{
	((struct caller_arg *)priv)->prepared++;
	return 10;
}

static int caller_tick_fn(void *priv, bool readable)
{
	CHECK(!readable, "a watch without fd is never readable");
	((struct caller_arg *)priv)->ran++;
	return 0;
}

static void server_caller(void)
{
	struct caller_arg a = { .efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) };
	struct rpc_watch w[2] = {
		{ .fd = -1, .prepare = caller_tick_prepare, .fn = caller_tick_fn, .priv = &a },
		{ .fd = a.efd, .fn = caller_end_fn, .priv = &a },
	};
	struct rpc_server *s;
	pthread_t t;
	uint64_t one = 1;

	CHECK(a.efd >= 0);
	/* No server: the watches alone, ended by the first non-zero return. */
	CHECK_EQ(write(a.efd, &one, sizeof(one)), (ssize_t)sizeof(one));
	CHECK_EQ(rpc_serve(NULL, w, 2), 7);
	CHECK(a.prepared >= 1 && a.ran >= 1, "prepare %u, fn %u", a.prepared, a.ran);
	/* A server with a thread of its own is not the caller's to serve. */
	CHECK_EQ(rpc_server_start(sock, "test", methods, NR_METHODS, NULL, &s), 0);
	CHECK_EQ(rpc_serve(s, w, 2), -EINVAL);
	rpc_server_stop(s);
	CHECK_EQ(rpc_server_start_flags(sock, "test", methods, NR_METHODS, NULL, RPC_SERVER_CALLER, &s), 0);
	a.prepared = a.ran = 0;
	CHECK_EQ(pthread_create(&t, NULL, caller_client, &a), 0);
	CHECK_EQ(rpc_serve(s, w, 2), 7);
	pthread_join(t, NULL);
	CHECK(a.echo_ok, "the method answered on the serving thread");
	CHECK(a.prepared >= 1 && a.ran >= 1, "prepare %u, fn %u", a.prepared, a.ran);
	rpc_server_stop(s);
	CHECK(access(sock, F_OK) && errno == ENOENT, "socket removed at stop");
	close(a.efd);
}

/* Messages cut short are cut between UTF-8 characters (an answer stays UTF-8). */
static void messages_utf8(void)
{
	char name[80], text[700], req[200];
	struct rpc_err e;

	memset(text, 'a', 509);
	strcpy(text + 509, "\xc3\xa9tail");
	rpc_errf(&e, 1, "%s", text);
	CHECK(strlen(e.msg) == 511 && !strcmp(e.msg + 509, "\xc3\xa9"), "%zu", strlen(e.msg));
	memset(text, 'a', 510);
	strcpy(text + 510, "\xc3\xa9tail");
	rpc_errf(&e, 1, "%s", text);
	CHECK_EQ(strlen(e.msg), 510);
	memset(text, 'a', 508);
	strcpy(text + 508, "\xe2\x82\xac");
	rpc_errf(&e, 1, "%sx", text);
	CHECK_EQ(strlen(e.msg), 511);
	memset(text, 'a', 509);
	strcpy(text + 509, "\xe2\x82\xac");
	rpc_errf(&e, 1, "%s", text);
	CHECK_EQ(strlen(e.msg), 509);
	CHECK_EQ(rpc_utf8_prefix("ab\xc3\xa9", 3), 2);
	CHECK_EQ(rpc_utf8_prefix("ab\xc3\xa9", 4), 4);
	CHECK_EQ(rpc_utf8_prefix("ab", 64), 2);
	/* An unknown method's name, cut at 64 bytes, inside a two-byte character. */
	memset(name, 'm', 63);
	strcpy(name + 63, "\xc3\xa9");
	snprintf(req, sizeof(req), "{\"jsonrpc\":\"2.0\",\"method\":\"%s\",\"id\":1}", name);
	CHECK_EQ(one(req, NULL), RPC_METHOD_NOT_FOUND);
	{
		struct rpc_stream *st = stream();
		struct json_object *a;
		char want[80];

		feed(st, req);
		a = answer(0);
		memset(want, 'm', 63);
		strcpy(want + 63, "\" (rpc");
		CHECK(strstr(err_msg(a), want), "%s", err_msg(a));
		json_object_put(a);
		rpc_stream_free(st);
	}
}

int main(void)
{
	const char *d = test_tmpdir(NULL, "test-rpc");

	if (!d) {
		fprintf(stderr, "no temporary directory\n");
		return 1;
	}
	snprintf(dir, sizeof(dir), "%s", d);
	snprintf(sock, sizeof(sock), "%.90s/ctl.sock", dir);
	stream_requests();
	stream_bad_requests();
	stream_garbage();
	messages_utf8();
	stream_split();
	server_calls(0);
	server_calls(RPC_SERVER_THREADED);
	server_stuck_clients();
	server_threaded();
	server_socket_file();
	server_caller();
	return test_done("rpc");
}
