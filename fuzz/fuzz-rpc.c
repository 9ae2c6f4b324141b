/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the JSON-RPC stream engine (lib/rpc/rpc-core.c),
 * what every control socket runs on the bytes a client sends. The input's
 * first byte is a piece size (1..256); the rest is the stream, fed once
 * whole and once in pieces of that size. Whatever it is:
 *
 *   - both feedings end the same way and answer the same bytes (a text
 *     split across reads is the same text), but for the message of a
 *     final parse error, whose detail (json-c's) may depend on where the
 *     bytes were split: its code is the same;
 *   - every answer is one line of JSON: an object with "jsonrpc": "2.0"
 *     and exactly one of "result" and "error" (an error with an integer
 *     code and a string message), or a non-empty array of those;
 *   - a stream that ended takes nothing more.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rpc.h"

static int m_echo(void *priv, struct json_object *params, struct json_object **result,
		  struct rpc_err *err)
{
	static const char *const names[] = { "name", "count", "force", "list", NULL };
	struct json_object *list = NULL;
	const char *name = NULL;
	uint64_t count = 0;
	bool force = false;
	int rc;

	if ((rc = rpc_params_check(params, names, err)) ||
	    (rc = rpc_param_str(params, "name", true, &name, err)) ||
	    (rc = rpc_param_u64(params, "count", false, 0, 1 << 20, &count, err)) ||
	    (rc = rpc_param_bool(params, "force", false, &force, err)) ||
	    (rc = rpc_param_strs(params, "list", false, &list, err)))
		return rc;
	if (force)
		return rpc_errf(err, -ENOENT, "device %s: not found", name);
	*result = json_object_new_string(name);
	return 0;
}

static const struct rpc_method methods[] = {
	{ "echo", m_echo, "name, count, force, list", "" },
};

struct out {
	char *buf;
	size_t len, cap;
};

static int out_fn(void *priv, const char *text, size_t len)
{
	struct out *o = priv;

	if (o->len + len > o->cap) {
		size_t cap = (o->len + len) * 2;
		char *p = realloc(o->buf, cap);

		if (!p)
			return -ENOMEM;
		o->buf = p;
		o->cap = cap;
	}
	memcpy(o->buf + o->len, text, len);
	o->len += len;
	return 0;
}

static void check_one(struct json_object *a)
{
	struct json_object *v, *e, *c, *m;
	bool has_r, has_e;

	FAIL_IF(!json_object_is_type(a, json_type_object));
	FAIL_IF(!json_object_object_get_ex(a, "jsonrpc", &v) ||
		strcmp(json_object_get_string(v), "2.0"));
	FAIL_IF(!json_object_object_get_ex(a, "id", NULL));
	has_r = json_object_object_get_ex(a, "result", NULL);
	has_e = json_object_object_get_ex(a, "error", &e);
	FAIL_IF(has_r == has_e);
	if (has_e) {
		FAIL_IF(!json_object_object_get_ex(e, "code", &c) ||
			!json_object_is_type(c, json_type_int));
		FAIL_IF(!json_object_object_get_ex(e, "message", &m) ||
			!json_object_is_type(m, json_type_string));
	}
}

static void check_answers(const struct out *o)
{
	const char *p = o->buf, *end;

	if (!o->len)
		return;
	end = o->buf + o->len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		struct json_object *a;
		char *line;

		FAIL_IF(!nl);
		line = strndup(p, (size_t)(nl - p));
		FAIL_IF(!line);
		a = json_tokener_parse(line);
		free(line);
		FAIL_IF(!a);
		if (json_object_is_type(a, json_type_array)) {
			FAIL_IF(!json_object_array_length(a));
			for (size_t i = 0; i < json_object_array_length(a); i++)
				check_one(json_object_array_get_idx(a, i));
		} else {
			check_one(a);
		}
		json_object_put(a);
		p = nl + 1;
	}
}

/* Where the last answer line starts. */
static size_t last_line(const struct out *o)
{
	size_t i = o->len;

	if (i && o->buf[i - 1] == '\n')
		i--;
	while (i && o->buf[i - 1] != '\n')
		i--;
	return i;
}

/* The error code of the answer at off (0: none, or not an error). */
static int error_code(const struct out *o, size_t off)
{
	struct json_object *a, *e, *c;
	char *line;
	int code = 0;

	if (off >= o->len)
		return 0;
	line = strndup(o->buf + off, o->len - off);
	FAIL_IF(!line);
	a = json_tokener_parse(line);
	free(line);
	if (json_object_object_get_ex(a, "error", &e) && json_object_object_get_ex(e, "code", &c))
		code = json_object_get_int(c);
	json_object_put(a);
	return code;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct out whole = { 0 }, split = { 0 };
	struct rpc_stream *a, *b;
	size_t piece;
	int ra, rb = 0;

	if (!size)
		return 0;
	piece = (size_t)data[0] + 1;
	data++;
	size--;
	a = rpc_stream_new(methods, 1, NULL, out_fn, &whole);
	b = rpc_stream_new(methods, 1, NULL, out_fn, &split);
	FAIL_IF(!a || !b);
	ra = rpc_stream_feed(a, (const char *)data, size);
	for (size_t off = 0; off < size && !rb; off += piece) {
		size_t n = size - off < piece ? size - off : piece;
		char *copy = malloc(n); /* exactly the piece: ASan sees a read past it */

		FAIL_IF(!copy);
		memcpy(copy, data + off, n);
		rb = rpc_stream_feed(b, copy, n);
		free(copy);
	}
	FAIL_IF(ra != rb);
	FAIL_IF(ra != 0 && ra != -EPROTO);
	if (ra) {
		/* Up to the last answer the same bytes; the last, the same code. */
		size_t lw = last_line(&whole), ls = last_line(&split);

		FAIL_IF(lw != ls || (lw && memcmp(whole.buf, split.buf, lw)));
		FAIL_IF(!error_code(&whole, lw) || error_code(&whole, lw) != error_code(&split, ls));
	} else {
		FAIL_IF(whole.len != split.len ||
			(whole.len && memcmp(whole.buf, split.buf, whole.len)));
	}
	check_answers(&whole);
	if (ra) {
		size_t len = whole.len;

		FAIL_IF(rpc_stream_feed(a, "{}", 2) != ra);
		FAIL_IF(whole.len != len);
	}
	rpc_stream_free(a);
	rpc_stream_free(b);
	free(whole.buf);
	free(split.buf);
	return 0;
}
