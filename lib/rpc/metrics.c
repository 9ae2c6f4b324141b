/* SPDX-License-Identifier: MIT */
/* Prometheus text exposition from the management JSON, and its HTTP endpoint. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

struct buf {
	char *p;
	size_t len, cap;
	bool failed;
};

static void bput(struct buf *b, const char *s, size_t n)
{
	if (b->failed)
		return;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		char *p;

		while (cap < b->len + n + 1)
			cap *= 2;
		p = realloc(b->p, cap);
		if (!p) {
			b->failed = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
}

__attribute__((format(printf, 2, 3)))
static void bprintf(struct buf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof(tmp))
		b->failed = true;
	else
		bput(b, tmp, (size_t)n);
}

/* A label value as the format wants it: \\, \" and \n escaped. */
static void bput_label(struct buf *b, const char *name, const char *v, bool first)
{
	bprintf(b, "%s%s=\"", first ? "" : ",", name);
	for (; *v; v++) {
		if (*v == '\\')
			bput(b, "\\\\", 2);
		else if (*v == '"')
			bput(b, "\\\"", 2);
		else if (*v == '\n')
			bput(b, "\\n", 2);
		else
			bput(b, v, 1);
	}
	bput(b, "\"", 1);
}

static const char *jstr(struct json_object *o, const char *field)
{
	struct json_object *v;

	if (!field || !json_object_object_get_ex(o, field, &v))
		return "";
	return json_object_get_string(v) ? json_object_get_string(v) : "";
}

/* The sample's value: false when the object has no such field. */
static bool value_of(const struct metrics_def *d, struct json_object *o, double *out)
{
	struct json_object *v;

	if (!json_object_object_get_ex(o, d->field, &v) || !v)
		return false;
	if (d->match)
		*out = json_object_is_type(v, json_type_string) &&
		       !strcmp(json_object_get_string(v), d->match);
	else if (json_object_is_type(v, json_type_boolean))
		*out = json_object_get_boolean(v);
	else if (json_object_is_type(v, json_type_int))
		*out = (double)json_object_get_uint64(v);
	else if (json_object_is_type(v, json_type_double))
		*out = json_object_get_double(v);
	else
		return false;
	if (d->scale)
		*out *= d->scale;
	return true;
}

static void sample(struct buf *b, const struct metrics_def *d, struct json_object *outer,
		   struct json_object *inner)
{
	double v;

	if (!value_of(d, inner ? inner : outer, &v))
		return;
	bput(b, d->name, strlen(d->name));
	if (d->outer_label || d->inner_label) {
		bput(b, "{", 1);
		if (d->outer_label)
			bput_label(b, d->outer_label, jstr(outer, d->outer_field), true);
		if (d->inner_label)
			bput_label(b, d->inner_label, jstr(inner, d->inner_field), !d->outer_label);
		bput(b, "}", 1);
	}
	/* Counters are integers here; %.17g keeps them exact up to 2^53. */
	bprintf(b, " %.17g\n", v);
}

char *metrics_render(const struct metrics_def *defs, size_t nr_defs,
		     struct json_object *const *srcs, size_t nr_srcs)
{
	struct buf b = { 0 };

	for (size_t i = 0; i < nr_defs; i++) {
		const struct metrics_def *d = &defs[i];
		struct json_object *src = d->src < nr_srcs ? srcs[d->src] : NULL;

		bprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, d->type);
		if (!src)
			continue;
		if (d->shape == METRICS_OBJ) {
			sample(&b, d, src, NULL);
			continue;
		}
		for (size_t k = 0; k < json_object_array_length(src); k++) {
			struct json_object *o = json_object_array_get_idx(src, k), *in;

			if (d->shape == METRICS_ARRAY) {
				sample(&b, d, o, o);
				continue;
			}
			if (!json_object_object_get_ex(o, d->nested, &in))
				continue;
			for (size_t j = 0; j < json_object_array_length(in); j++)
				sample(&b, d, o, json_object_array_get_idx(in, j));
		}
	}
	if (b.failed || !b.p) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

/* ---- HTTP ---- */

struct metrics_http {
	struct MHD_Daemon *d;
	metrics_fn fn;
	void *priv;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url,
			      const char *method, const char *version, const char *upload,
			      size_t *upload_size, void **req_cls)
{
	static const char not_found[] = "not found: the metrics are at /metrics\n";
	static const char not_get[] = "only GET\n";
	static const char failed[] = "the metrics could not be made\n";
	struct metrics_http *h = cls;
	struct MHD_Response *r;
	unsigned status = MHD_HTTP_OK;
	enum MHD_Result rc;
	char *text = NULL;

	if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
		status = MHD_HTTP_METHOD_NOT_ALLOWED;
		r = MHD_create_response_from_buffer(sizeof(not_get) - 1, (void *)not_get,
						    MHD_RESPMEM_PERSISTENT);
	} else if (strcmp(url, "/metrics")) {
		status = MHD_HTTP_NOT_FOUND;
		r = MHD_create_response_from_buffer(sizeof(not_found) - 1, (void *)not_found,
						    MHD_RESPMEM_PERSISTENT);
	} else if (!(text = h->fn(h->priv))) {
		status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		r = MHD_create_response_from_buffer(sizeof(failed) - 1, (void *)failed,
						    MHD_RESPMEM_PERSISTENT);
	} else {
		r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
	}
	if (!r) {
		free(text);
		return MHD_NO;
	}
	if (status == MHD_HTTP_OK)
		MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
	rc = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rc;
}

static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *len, char *why,
		      size_t whylen)
{
	char host[64];
	const char *colon, *h = addr;
	size_t hl;
	unsigned long port;
	char *end;

	if (addr[0] == '[') {
		const char *close = strchr(addr, ']');

		if (!close || close[1] != ':') {
			snprintf(why, whylen, "%s: expected [IPV6]:PORT", addr);
			return -EINVAL;
		}
		h = addr + 1;
		hl = (size_t)(close - h);
		colon = close + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon) {
			snprintf(why, whylen, "%s: expected HOST:PORT (127.0.0.1:9100)", addr);
			return -EINVAL;
		}
		hl = (size_t)(colon - addr);
	}
	if (hl == 0 || hl >= sizeof(host)) {
		snprintf(why, whylen, "%s: no address before the port", addr);
		return -EINVAL;
	}
	memcpy(host, h, hl);
	host[hl] = 0;
	port = strtoul(colon + 1, &end, 10);
	if (!colon[1] || *end || port > 65535) {
		snprintf(why, whylen, "%s: the port is not a number in 0..65535", addr);
		return -EINVAL;
	}
	memset(ss, 0, sizeof(*ss));
	if (addr[0] != '[') {
		struct sockaddr_in *in = (struct sockaddr_in *)ss;

		in->sin_family = AF_INET;
		in->sin_port = htons((uint16_t)port);
		*len = sizeof(*in);
		if (inet_pton(AF_INET, host, &in->sin_addr) == 1)
			return 0;
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;

		in6->sin6_family = AF_INET6;
		in6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*in6);
		if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1)
			return 0;
	}
	snprintf(why, whylen, "%s: %s is not a numeric address", addr, host);
	return -EINVAL;
}

int metrics_addr_check(const char *addr, char *why, size_t whylen)
{
	struct sockaddr_storage ss;
	socklen_t len;

	return parse_addr(addr, &ss, &len, why, whylen);
}

int metrics_http_start(const char *addr, metrics_fn fn, void *priv, struct metrics_http **out,
		       char *why, size_t whylen)
{
	struct sockaddr_storage ss;
	struct metrics_http *h;
	socklen_t len;
	int rc = parse_addr(addr, &ss, &len, why, whylen);

	if (rc)
		return rc;
	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->fn = fn;
	h->priv = priv;
	h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
				(ss.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				0, NULL, NULL, answer, h, MHD_OPTION_SOCK_ADDR, &ss,
				MHD_OPTION_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
				MHD_OPTION_END);
	if (!h->d) {
		rc = errno ? -errno : -EADDRNOTAVAIL;
		snprintf(why, whylen, "%s: cannot listen: %s", addr, strerror(-rc));
		free(h);
		return rc;
	}
	*out = h;
	return 0;
}

unsigned metrics_http_port(struct metrics_http *h)
{
	const union MHD_DaemonInfo *i = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);

	return i ? i->port : 0;
}

void metrics_http_stop(struct metrics_http *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->d);
	free(h);
}
