/* SPDX-License-Identifier: MIT */
/*
 * JSON-RPC 2.0: the stream engine (texts in, requests run, answers out)
 * and the parameter checks. No sockets here (rpc-server.c has them), so
 * the fuzzer drives this file alone.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "rpc.h"
#include "utf8.h"

#define RPC_STR_(x) #x
#define RPC_STR(x) RPC_STR_(x)

struct rpc_stream {
	const struct rpc_method *methods;
	size_t nr_methods;
	void *priv;
	rpc_out_fn out;
	void *out_priv;
	struct json_tokener *tok;
	/*
	 * The text being received, as fed so far. Where it ends is found by
	 * scanning its brackets outside strings, byte by byte, and only the
	 * whole text is parsed: json-c's own incremental parse depends on
	 * where the bytes were split (0.16 takes "-1-1" as a number when it
	 * arrives a byte at a time, and refuses it when it arrives whole).
	 */
	char *text;
	size_t text_bytes, text_cap;
	uint64_t open_kinds;     /* one bit per open bracket, innermost lowest: 1 '[', 0 '{' */
	unsigned depth;          /* brackets open */
	unsigned values;         /* brackets and commas so far: what the parse will allocate */
	bool in_string, escaped;
	int err;                 /* the stream is over: why */
};

int rpc_utf8_prefix(const char *s, int max)
{
	int n = 0;

	while (n < max && s[n])
		n++;
	if (n < max || !s[n])
		return n;
	/* Cut: back to the start of the character the cut fell in, if it did. */
	while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
		n--;
	return n;
}

int rpc_errf(struct rpc_err *err, int code, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (err) {
		err->code = code;
		va_start(ap, fmt);
		n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		/* A message cut short is cut between characters: the answer stays UTF-8. */
		if (n >= (int)sizeof(err->msg)) {
			size_t len = sizeof(err->msg) - 1, p = len;
			unsigned char lead;

			while (p && ((unsigned char)err->msg[p - 1] & 0xc0) == 0x80)
				p--;
			lead = p ? (unsigned char)err->msg[p - 1] : 0;
			/* The last character's lead byte at p - 1: whole, or dropped. */
			if (lead >= 0xc0 && p - 1 + (lead >= 0xf0 ? 4u : lead >= 0xe0 ? 3u : 2u) > len)
				err->msg[p - 1] = '\0';
		}
	}
	return code;
}

/* ---- parameters ---- */

int rpc_params_check(struct json_object *params, const char *const *names, struct rpc_err *err)
{
	if (!params)
		return 0;
	if (!json_object_is_type(params, json_type_object))
		return rpc_errf(err, RPC_INVALID_PARAMS, "params must be an object");
	json_object_object_foreach(params, key, val) {
		size_t i;

		(void)val;
		for (i = 0; names && names[i] && strcmp(names[i], key); i++)
			;
		if (!names || !names[i])
			return rpc_errf(err, RPC_INVALID_PARAMS, "unknown parameter \"%.*s\"",
					rpc_utf8_prefix(key, 64), key);
	}
	return 0;
}

/* The parameter called name: 0 and *v, 1 when absent and optional, or an error. */
static int param_get(struct json_object *params, const char *name, bool required,
		     struct json_object **v, struct rpc_err *err)
{
	if (params && !json_object_is_type(params, json_type_object))
		return rpc_errf(err, RPC_INVALID_PARAMS, "params must be an object");
	if (!params || !json_object_object_get_ex(params, name, v) || !*v) {
		if (required)
			return rpc_errf(err, RPC_INVALID_PARAMS, "missing parameter \"%s\"", name);
		return 1;
	}
	return 0;
}

static int str_check(struct json_object *v, const char *what, const char *name,
		     struct rpc_err *err)
{
	if (!json_object_is_type(v, json_type_string))
		return rpc_errf(err, RPC_INVALID_PARAMS, "%s \"%s\" must be a string", what, name);
	if (!json_object_get_string_len(v))
		return rpc_errf(err, RPC_INVALID_PARAMS, "%s \"%s\" must not be empty", what, name);
	if (strlen(json_object_get_string(v)) != (size_t)json_object_get_string_len(v))
		return rpc_errf(err, RPC_INVALID_PARAMS, "%s \"%s\" holds a NUL byte", what, name);
	return 0;
}

int rpc_param_str(struct json_object *params, const char *name, bool required, const char **out,
		  struct rpc_err *err)
{
	struct json_object *v;
	int rc = param_get(params, name, required, &v, err);

	if (rc)
		return rc > 0 ? 0 : rc;
	rc = str_check(v, "parameter", name, err);
	if (!rc)
		*out = json_object_get_string(v);
	return rc;
}

int rpc_param_u64(struct json_object *params, const char *name, bool required, uint64_t min,
		  uint64_t max, uint64_t *out, struct rpc_err *err)
{
	struct json_object *v;
	int rc = param_get(params, name, required, &v, err);
	uint64_t u;

	if (rc)
		return rc > 0 ? 0 : rc;
	if (!json_object_is_type(v, json_type_int))
		return rpc_errf(err, RPC_INVALID_PARAMS, "parameter \"%s\" must be an integer",
				name);
	if (json_object_get_int64(v) < 0)
		return rpc_errf(err, RPC_INVALID_PARAMS, "parameter \"%s\" must not be negative",
				name);
	u = json_object_get_uint64(v);
	if (u < min || u > max)
		return rpc_errf(err, RPC_INVALID_PARAMS,
				"parameter \"%s\" is %llu, out of range %llu..%llu", name,
				(unsigned long long)u, (unsigned long long)min,
				(unsigned long long)max);
	*out = u;
	return 0;
}

int rpc_param_bool(struct json_object *params, const char *name, bool required, bool *out,
		   struct rpc_err *err)
{
	struct json_object *v;
	int rc = param_get(params, name, required, &v, err);

	if (rc)
		return rc > 0 ? 0 : rc;
	if (!json_object_is_type(v, json_type_boolean))
		return rpc_errf(err, RPC_INVALID_PARAMS, "parameter \"%s\" must be true or false",
				name);
	*out = json_object_get_boolean(v);
	return 0;
}

int rpc_param_strs(struct json_object *params, const char *name, bool required,
		   struct json_object **out, struct rpc_err *err)
{
	struct json_object *v;
	int rc = param_get(params, name, required, &v, err);

	if (rc)
		return rc > 0 ? 0 : rc;
	if (!json_object_is_type(v, json_type_array))
		return rpc_errf(err, RPC_INVALID_PARAMS, "parameter \"%s\" must be an array", name);
	for (size_t i = 0; i < json_object_array_length(v); i++) {
		rc = str_check(json_object_array_get_idx(v, i), "an item of", name, err);
		if (rc)
			return rc;
	}
	*out = v;
	return 0;
}

/* ---- answers ---- */

static struct json_object *answer_new(struct json_object *id)
{
	struct json_object *a = json_object_new_object();

	if (!a)
		return NULL;
	if (json_object_object_add(a, "jsonrpc", json_object_new_string("2.0")) ||
	    json_object_object_add(a, "id", id ? json_object_get(id) : NULL)) {
		json_object_put(a);
		return NULL;
	}
	return a;
}

static struct json_object *answer_error(struct json_object *id, const struct rpc_err *e)
{
	struct json_object *a = answer_new(id), *eo = json_object_new_object(), *data = NULL;
	int code = e->code;

	if (code < 0 && code > -4096) /* a method's negative errno: the errno itself */
		code = -code;
	if (code > 0 && code < 4096) {
		const char *n = strerrorname_np(code);

		data = json_object_new_object();
		if (data)
			json_object_object_add(data, "errno",
					       json_object_new_string(n ? n : "unknown"));
	}
	if (!a || !eo ||
	    json_object_object_add(eo, "code", json_object_new_int(code)) ||
	    json_object_object_add(eo, "message",
				   json_object_new_string(e->msg[0] ? e->msg :
							  code > 0 && code < 4096 ?
							  strerror(code) : "error")) ||
	    (data && json_object_object_add(eo, "data", data)) ||
	    json_object_object_add(a, "error", eo)) {
		json_object_put(a);
		json_object_put(eo);
		return NULL;
	}
	return a;
}

static struct json_object *answer_result(struct json_object *id, struct json_object *result)
{
	struct json_object *a = answer_new(id);

	if (!a || json_object_object_add(a, "result", result)) {
		json_object_put(a);
		json_object_put(result);
		return NULL;
	}
	return a;
}

static int stream_send(struct rpc_stream *st, struct json_object *a)
{
	size_t len;
	const char *s;
	int rc;

	if (!a)
		return -ENOMEM;
	s = json_object_to_json_string_length(a, JSON_C_TO_STRING_PLAIN |
					      JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	rc = s ? st->out(st->out_priv, s, len) : -ENOMEM;
	if (!rc)
		rc = st->out(st->out_priv, "\n", 1);
	json_object_put(a);
	return rc;
}

static size_t answer_len(struct json_object *a)
{
	size_t len = 0;

	if (!json_object_to_json_string_length(a, JSON_C_TO_STRING_PLAIN |
					       JSON_C_TO_STRING_NOSLASHESCAPE, &len))
		return SIZE_MAX;
	return len;
}

/* An EMSGSIZE error answer in place of a (same id): a request whose answer does not fit. */
static struct json_object *answer_too_big(struct json_object *a, size_t len, bool batch)
{
	struct json_object *id = NULL;
	struct rpc_err e;

	json_object_object_get_ex(a, "id", &id);
	if (batch)
		rpc_errf(&e, EMSGSIZE, "the answers to this batch pass %u MiB: ask for less in "
			 "one batch", RPC_OUT_MAX >> 20);
	else
		rpc_errf(&e, EMSGSIZE, "the answer is %zu bytes, more than the %u MiB one "
			 "request may get", len, RPC_OUT_MAX >> 20);
	return answer_error(id, &e);
}

/* A single request's answer, or its EMSGSIZE error when it passes RPC_OUT_MAX. */
static struct json_object *answer_fit(struct json_object *a)
{
	size_t len = answer_len(a);
	struct json_object *b;

	if (len == SIZE_MAX) {
		json_object_put(a);
		return NULL;
	}
	if (len < RPC_OUT_MAX) /* and its newline */
		return a;
	b = answer_too_big(a, len, false);
	json_object_put(a);
	return b;
}

/*
 * A batch's answers whose text with its newline would pass RPC_OUT_MAX:
 * they are kept in order while they and the errors of all after them fit,
 * and the rest become EMSGSIZE errors, so that every request is answered.
 */
static int batch_fit(struct json_object *arr)
{
	size_t n = json_object_array_length(arr), total = 2, used = 2;
	size_t len[RPC_BATCH_MAX], elen[RPC_BATCH_MAX], rest = 0;
	struct json_object *err[RPC_BATCH_MAX] = { 0 };
	int rc = 0;

	for (size_t i = 0; i < n; i++) {
		len[i] = answer_len(json_object_array_get_idx(arr, i));
		if (len[i] == SIZE_MAX)
			return -ENOMEM;
		total += len[i] + 1;
	}
	if (total < RPC_OUT_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		err[i] = answer_too_big(json_object_array_get_idx(arr, i), 0, true);
		elen[i] = err[i] ? answer_len(err[i]) : SIZE_MAX;
		if (elen[i] == SIZE_MAX) {
			rc = -ENOMEM;
			goto out;
		}
		rest += elen[i] + 1;
	}
	for (size_t i = 0; i < n; i++) {
		rest -= elen[i] + 1;
		if (used + len[i] + 1 + rest < RPC_OUT_MAX) {
			used += len[i] + 1;
			continue;
		}
		if (json_object_array_put_idx(arr, i, err[i])) {
			rc = -ENOMEM;
			goto out;
		}
		err[i] = NULL; /* the array's now */
		used += elen[i] + 1;
	}
out:
	for (size_t i = 0; i < n; i++)
		json_object_put(err[i]);
	return rc;
}

static int send_error(struct rpc_stream *st, int code, const char *msg)
{
	struct rpc_err e;

	rpc_errf(&e, code, "%s", msg);
	return stream_send(st, answer_error(NULL, &e));
}

/* ---- requests ---- */

static int methods_list(struct rpc_stream *st, struct json_object **result)
{
	struct json_object *arr = json_object_new_array();

	for (size_t i = 0; arr && i < st->nr_methods; i++) {
		const struct rpc_method *m = &st->methods[i];
		struct json_object *o = json_object_new_object();

		if (!o || json_object_object_add(o, "name", json_object_new_string(m->name)) ||
		    json_object_object_add(o, "params", json_object_new_string(m->params ?
										  m->params : "")) ||
		    json_object_object_add(o, "help", json_object_new_string(m->help ?
										m->help : "")) ||
		    json_object_array_add(arr, o)) {
			json_object_put(o);
			json_object_put(arr);
			return -ENOMEM;
		}
	}
	*result = arr;
	return arr ? 0 : -ENOMEM;
}

static bool id_valid(struct json_object *id)
{
	return !id || json_object_is_type(id, json_type_string) ||
	       json_object_is_type(id, json_type_int) ||
	       json_object_is_type(id, json_type_double);
}

/*
 * One request: its answer (a new object), or NULL for a notification
 * (*oom set when an answer could not be made).
 */
static struct json_object *request_run(struct rpc_stream *st, struct json_object *req, bool *oom)
{
	struct json_object *id = NULL, *v, *params = NULL, *result = NULL, *a;
	bool has_id = false;
	const char *method;
	struct rpc_err e = { 0 };
	int rc;

	if (!json_object_is_type(req, json_type_object)) {
		rpc_errf(&e, RPC_INVALID_REQUEST, "a request is an object");
		goto invalid;
	}
	json_object_object_foreach(req, key, val) {
		(void)val;
		if (strcmp(key, "jsonrpc") && strcmp(key, "method") && strcmp(key, "params") &&
		    strcmp(key, "id")) {
			rpc_errf(&e, RPC_INVALID_REQUEST, "unknown member \"%.*s\" in the request",
				 rpc_utf8_prefix(key, 64), key);
			goto invalid;
		}
	}
	has_id = json_object_object_get_ex(req, "id", &id);
	if (!id_valid(id)) {
		id = NULL;
		rpc_errf(&e, RPC_INVALID_REQUEST, "\"id\" must be a string, a number or null");
		goto invalid;
	}
	if (!json_object_object_get_ex(req, "jsonrpc", &v) ||
	    !json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "2.0")) {
		rpc_errf(&e, RPC_INVALID_REQUEST, "\"jsonrpc\" must be \"2.0\"");
		goto invalid;
	}
	if (!json_object_object_get_ex(req, "method", &v) ||
	    !json_object_is_type(v, json_type_string)) {
		rpc_errf(&e, RPC_INVALID_REQUEST, "\"method\" must be a string");
		goto invalid;
	}
	method = json_object_get_string(v);
	if (json_object_object_get_ex(req, "params", &params) &&
	    !json_object_is_type(params, json_type_object)) {
		rpc_errf(&e, RPC_INVALID_PARAMS, "\"params\" must be an object (parameters by name)");
		goto answer;
	}
	if (!strcmp(method, "rpc.methods")) {
		rc = params && json_object_object_length(params) ?
		     rpc_errf(&e, RPC_INVALID_PARAMS, "rpc.methods takes no parameters") :
		     methods_list(st, &result);
	} else {
		size_t i;

		for (i = 0; i < st->nr_methods && strcmp(st->methods[i].name, method); i++)
			;
		if (i == st->nr_methods) {
			rpc_errf(&e, RPC_METHOD_NOT_FOUND, "no method \"%.*s\" (rpc.methods lists them)",
				 rpc_utf8_prefix(method, 64), method);
			goto answer;
		}
		rc = st->methods[i].fn(st->priv, params, &result, &e);
	}
	if (rc) {
		json_object_put(result);
		if (e.msg[0])
			e.code = rc; /* the method's words, the code it returned */
		else
			rpc_errf(&e, rc, "%s", rc < 0 && rc > -4096 ? strerror(-rc) : "error");
		goto answer;
	}
	if (!has_id) {
		json_object_put(result);
		return NULL;
	}
	a = answer_result(id, result);
	*oom = !a;
	return a;
answer:
	if (!has_id)
		return NULL;
	a = answer_error(id, &e);
	*oom = !a;
	return a;
invalid:
	/* Not a request, so not a notification either: answered with its id, or null. */
	a = answer_error(has_id ? id : NULL, &e);
	*oom = !a;
	return a;
}

/* A whole text: a request or a batch. */
static int text_run(struct rpc_stream *st, struct json_object *text)
{
	struct json_object *arr, *a;
	bool oom = false;
	size_t n;

	if (!json_object_is_type(text, json_type_array)) {
		a = request_run(st, text, &oom);
		if (oom)
			return -ENOMEM;
		return a ? stream_send(st, answer_fit(a)) : 0;
	}
	n = json_object_array_length(text);
	if (!n)
		return send_error(st, RPC_INVALID_REQUEST, "an empty batch");
	if (n > RPC_BATCH_MAX)
		return send_error(st, RPC_INVALID_REQUEST, "a batch of more than 256 requests");
	arr = json_object_new_array();
	if (!arr)
		return -ENOMEM;
	for (size_t i = 0; i < n && !oom; i++) {
		a = request_run(st, json_object_array_get_idx(text, i), &oom);
		if (a && json_object_array_add(arr, a)) {
			json_object_put(a);
			oom = true;
		}
	}
	if (oom) {
		json_object_put(arr);
		return -ENOMEM;
	}
	if (!json_object_array_length(arr)) { /* notifications only */
		json_object_put(arr);
		return 0;
	}
	if (batch_fit(arr)) {
		json_object_put(arr);
		return -ENOMEM;
	}
	return stream_send(st, arr);
}

struct rpc_stream *rpc_stream_new(const struct rpc_method *methods, size_t nr_methods,
				  void *priv, rpc_out_fn out, void *out_priv)
{
	struct rpc_stream *st = calloc(1, sizeof(*st));

	if (!st)
		return NULL;
	/* One more level than the scanner lets through: json-c counts the top. */
	st->tok = json_tokener_new_ex(RPC_DEPTH_MAX + 1);
	if (!st->tok) {
		free(st);
		return NULL;
	}
	/* UTF-8 is checked by utf8_valid(), with the overlong forms json-c takes. */
	json_tokener_set_flags(st->tok, JSON_TOKENER_STRICT);
	st->methods = methods;
	st->nr_methods = nr_methods;
	st->priv = priv;
	st->out = out;
	st->out_priv = out_priv;
	return st;
}

void rpc_stream_free(struct rpc_stream *st)
{
	if (!st)
		return;
	json_tokener_free(st->tok);
	free(st->text);
	free(st);
}

static bool only_blanks(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != ' ' && p[i] != '\t' && p[i] != '\n' && p[i] != '\r')
			return false;
	return true;
}

static int text_append(struct rpc_stream *st, const char *buf, size_t n)
{
	if (!n)
		return 0;
	if (st->text_bytes + n > st->text_cap) {
		size_t cap = st->text_cap ? st->text_cap : 4096;
		char *p;

		while (cap < st->text_bytes + n)
			cap *= 2;
		p = realloc(st->text, cap);
		if (!p)
			return -ENOMEM;
		st->text = p;
		st->text_cap = cap;
	}
	memcpy(st->text + st->text_bytes, buf, n);
	st->text_bytes += n;
	return 0;
}

/*
 * Scans up to n bytes of the text being received and returns how many
 * belong to it; *done when its last bracket closed. -1 and *why when its
 * brackets cannot be JSON: one closes what another opened, or they nest
 * deeper than RPC_DEPTH_MAX.
 */
static ssize_t text_scan(struct rpc_stream *st, const char *buf, size_t n, bool *done,
			 const char **why)
{
	*done = false;
	for (size_t i = 0; i < n; i++) {
		char c = buf[i];

		if (st->in_string) {
			if (st->escaped)
				st->escaped = false;
			else if (c == '\\')
				st->escaped = true;
			else if (c == '"')
				st->in_string = false;
			continue;
		}
		switch (c) {
		case '"':
			st->in_string = true;
			break;
		case ',':
		case '{':
		case '[':
			/*
			 * json-c allocates an object per value, hundreds of
			 * bytes for an object ("[{},{},...]": 1 MiB of it took
			 * 260 MB): the values are counted before any is.
			 */
			if (++st->values > RPC_VALUES_MAX) {
				*why = "more than " RPC_STR(RPC_VALUES_MAX) " values in one text";
				return -1;
			}
			if (c == ',')
				break;
			if (st->depth == RPC_DEPTH_MAX) {
				*why = "nested deeper than " RPC_STR(RPC_DEPTH_MAX) " levels";
				return -1;
			}
			st->open_kinds = st->open_kinds << 1 | (c == '[');
			st->depth++;
			break;
		case '}':
		case ']':
			if (!st->depth || (st->open_kinds & 1) != (c == ']')) {
				*why = c == '}' ? "a '}' closes no object" : "a ']' closes no array";
				return -1;
			}
			st->open_kinds >>= 1;
			if (!--st->depth) {
				*done = true;
				return (ssize_t)i + 1;
			}
			break;
		}
	}
	return (ssize_t)n;
}

/*
 * What json-c takes without a word and a request must not carry, in the
 * whole text: a NUL in a member name ("\\u0000": json-c's keys are C
 * strings, so "session\\u0000x" would name "session"), and an integer beyond 64
 * bits (json-c clamps it: an id answered as another, a value refused as
 * one the client never sent). NULL, or why; *colons: the colons outside
 * strings, an object's members each.
 */
static const char *text_check(const char *t, size_t n, size_t *colons)
{
	bool in_string = false, nul = false;

	*colons = 0;

	for (size_t i = 0; i < n; i++) {
		if (in_string) {
			if (t[i] == '"') {
				size_t k = i + 1;

				in_string = false;
				while (k < n && strchr(" \t\r\n", t[k]))
					k++;
				/* A value's NUL is its parameter's to refuse, by name. */
				if (nul && k < n && t[k] == ':')
					return "a member name with a NUL character (\\u0000)";
			} else if (t[i] == '\\' && i + 1 < n) {
				nul |= t[i + 1] == 'u' && n - i >= 6 && !memcmp(t + i + 2, "0000", 4);
				i++;
			}
			continue;
		}
		nul = false;
		if (t[i] == '"') {
			in_string = true;
		} else if (t[i] == ':') {
			(*colons)++;
		} else if (t[i] == '-' || (t[i] >= '0' && t[i] <= '9')) {
			bool neg = t[i] == '-';
			size_t d = i + neg, e = d;

			while (e < n && t[e] >= '0' && t[e] <= '9')
				e++;
			if (e < n && (t[e] == '.' || t[e] == 'e' || t[e] == 'E')) {
				/* A fraction: a double, which json-c keeps as one. */
				while (e < n && strchr("0123456789.eE+-", t[e]))
					e++;
			} else {
				/* An integer: at most 2^64 - 1, or down to -2^63. */
				const char *lim = neg ? "9223372036854775808" : "18446744073709551615";
				size_t len = e - d, ll = strlen(lim);

				while (len > 1 && t[d] == '0')
					d++, len--;
				if (len > ll || (len == ll && memcmp(t + d, lim, ll) > 0))
					return "an integer beyond 64 bits";
			}
			i = e - 1;
		}
	}
	return NULL;
}

/* An object's members, in the value and all it holds. */
static size_t members_of(struct json_object *v)
{
	size_t n = 0;

	if (json_object_is_type(v, json_type_object)) {
		json_object_object_foreach(v, key, val) {
			(void)key;
			n += 1 + members_of(val);
		}
	} else if (json_object_is_type(v, json_type_array)) {
		for (size_t i = 0; i < json_object_array_length(v); i++)
			n += members_of(json_object_array_get_idx(v, i));
	}
	return n;
}

const char *rpc_text_check(const char *text, size_t n, struct json_object *v)
{
	size_t colons;
	const char *why = text_check(text, n, &colons);

	/* json-c keeps the last of two members of one name: the count shows it. */
	if (!why && members_of(v) != colons)
		why = "a member name given twice in one object";
	return why;
}

/* The text received, whole: its value, or NULL and *te why it is none. */
static struct json_object *text_parse(struct rpc_stream *st, enum json_tokener_error *te)
{
	struct json_object *v;

	json_tokener_reset(st->tok);
	v = json_tokener_parse_ex(st->tok, st->text, (int)st->text_bytes);
	*te = json_tokener_get_error(st->tok);
	if (!v && *te == json_tokener_continue)
		*te = json_tokener_error_parse_eof;
	if (v && json_tokener_get_parse_end(st->tok) != st->text_bytes) {
		json_object_put(v);
		v = NULL;
		*te = json_tokener_error_parse_unexpected;
	}
	return v;
}

static void parse_error(struct rpc_stream *st, const char *why)
{
	char msg[160];

	snprintf(msg, sizeof(msg), "not JSON: %s", why);
	send_error(st, RPC_PARSE_ERROR, msg);
	st->err = -EPROTO;
}

/*
 * Feeds buf until it is used up, or (one) a text was answered; *used: the
 * bytes taken. st->err, or 1 when one and a text was answered.
 */
static int feed(struct rpc_stream *st, const char *buf, size_t len, bool one, size_t *used)
{
	const char *start = buf;
	int answered = 0;

	while (!st->err && len) {
		size_t room = RPC_REQ_MAX + 1 - st->text_bytes, n = len < room ? len : room;
		struct json_object *text;
		enum json_tokener_error te;
		const char *why = NULL;
		bool done;
		ssize_t took;

		/* Blanks between texts are no part of one (nor count toward its size). */
		if (!st->text_bytes && only_blanks(buf, 1)) {
			buf++;
			len--;
			continue;
		}
		/* A request is an object, a batch an array: no other text is one. */
		if (!st->text_bytes && *buf != '{' && *buf != '[') {
			send_error(st, RPC_PARSE_ERROR, "not JSON-RPC: a request is an object or an array");
			st->err = -EPROTO;
			break;
		}
		took = text_scan(st, buf, n, &done, &why);
		if (took < 0) {
			parse_error(st, why);
			break;
		}
		st->err = text_append(st, buf, (size_t)took);
		if (st->err)
			break;
		buf += took;
		len -= (size_t)took;
		if (st->text_bytes > RPC_REQ_MAX) {
			send_error(st, RPC_INVALID_REQUEST, "a request larger than 1 MiB");
			st->err = -EPROTO;
			break;
		}
		if (!done)
			continue;
		text = text_parse(st, &te);
		if (!text || !utf8_valid((const unsigned char *)st->text, st->text_bytes)) {
			json_object_put(text);
			parse_error(st, text ? "invalid UTF-8" : json_tokener_error_desc(te));
			break;
		}
		why = rpc_text_check(st->text, st->text_bytes, text);
		if (why) {
			json_object_put(text);
			parse_error(st, why);
			break;
		}
		st->text_bytes = 0;
		st->values = 0;
		st->err = text_run(st, text);
		json_object_put(text);
		if (one) {
			answered = 1;
			break;
		}
	}
	*used = (size_t)(buf - start);
	return st->err ? st->err : answered;
}

int rpc_stream_feed(struct rpc_stream *st, const char *buf, size_t len)
{
	size_t used;

	return feed(st, buf, len, false, &used);
}

int rpc_stream_feed_text(struct rpc_stream *st, const char *buf, size_t len, size_t *used)
{
	return feed(st, buf, len, true, used);
}

size_t rpc_stream_partial(const struct rpc_stream *st)
{
	return st->text_bytes;
}
