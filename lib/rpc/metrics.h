/* SPDX-License-Identifier: MIT */
/*
 * Prometheus metrics of the long-lived programs (docs/management.md): the
 * text exposition format (version 0.0.4) made from the same JSON the
 * management methods answer, by a table per program that says which
 * number of which object is which metric; and an HTTP endpoint
 * (libmicrohttpd) serving GET /metrics on an address the admin chooses.
 */
#ifndef RTRS_METRICS_H
#define RTRS_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include <json-c/json.h>

/* Where a metric's samples come from in the program's JSON sources. */
enum metrics_src {
	METRICS_OBJ,      /* an object: one sample, no label */
	METRICS_ARRAY,    /* an array of objects: a sample each, labels from their fields */
	METRICS_NESTED,   /* an array of objects each with an array (nested): a sample per
			     inner object, labels from outer and inner fields */
};

/* A label: its name, and the field of the outer object (or of the inner one) it takes. */
struct metrics_label {
	const char *name;        /* NULL: no more labels */
	const char *field;
	bool inner;              /* METRICS_NESTED: of the inner object */
};

#define METRICS_LABELS_MAX 4

struct metrics_def {
	const char *name;        /* rnbd_server_path_reads_total */
	const char *type;        /* "counter" or "gauge" */
	const char *help;
	unsigned src;            /* index of the JSON source (metrics_render's srcs) */
	enum metrics_src shape;
	const char *nested;      /* METRICS_NESTED: the inner array's field ("paths") */
	/*
	 * The labels, in this order. The program's table makes them unique
	 * within the family: metrics_render writes what it is given.
	 */
	struct metrics_label labels[METRICS_LABELS_MAX];
	const char *field;       /* the number ("qos.delayed": of an object in the sample's);
				    a boolean is 1 or 0; a string compared with match gives 1 or 0 */
	const char *match;
	double scale;            /* 0: 1 (ns to seconds: 1e-9) */
};

/*
 * The exposition of defs over srcs (JSON values, not consumed): a new
 * string (free()), or NULL without memory. Families with no sample are
 * written with their HELP and TYPE only. Label values are escaped as the
 * format says (backslash, double quote, newline).
 */
char *metrics_render(const struct metrics_def *defs, size_t nr_defs,
		     struct json_object *const *srcs, size_t nr_srcs);

struct metrics_http;

/* The exposition, made on each scrape: a new string, or NULL (500). */
typedef char *(*metrics_fn)(void *priv);

/*
 * Serves GET /metrics on addr ("HOST:PORT", a numeric IPv4 or [IPv6]
 * address; port 0: any free one) from a thread of its own (or the caller's:
 * METRICS_HTTP_CALLER, below), with
 * libmicrohttpd in epoll mode (any number of descriptors in the process).
 * At most METRICS_HTTP_CONN_MAX connections, METRICS_HTTP_PER_IP_MAX from
 * one address; a request must have arrived whole METRICS_HTTP_REQ_MS after
 * its connection opened or its last answer went out, or the connection
 * is closed (a slow sender cannot hold a place); a connection silent for
 * METRICS_HTTP_IDLE_S is closed. libmicrohttpd's own lines go to the log
 * (log.h) at warn, rate-limited. 0, or a negative errno with why (a
 * message for the user naming addr and the cause: "127.0.0.1:9464:
 * cannot listen: Address already in use (EADDRINUSE)").
 */
#define METRICS_HTTP_CONN_MAX 64
#define METRICS_HTTP_PER_IP_MAX 8
#define METRICS_HTTP_REQ_MS 5000
#define METRICS_HTTP_IDLE_S 10
int metrics_http_start(const char *addr, metrics_fn fn, void *priv, struct metrics_http **out,
		       char *why, size_t whylen);
/*
 * No thread of its own: served by rpc_serve (rpc.h) on the caller's thread
 * through the watch metrics_http_watch fills in.
 */
#define METRICS_HTTP_CALLER 1u
/* metrics_http_start with flags (METRICS_HTTP_CALLER, or 0). */
int metrics_http_start_flags(const char *addr, metrics_fn fn, void *priv, unsigned flags,
			     struct metrics_http **out, char *why, size_t whylen);
struct rpc_watch;
/* The watch that serves h (started with METRICS_HTTP_CALLER) in rpc_serve. */
void metrics_http_watch(struct metrics_http *h, struct rpc_watch *w);
/* addr checked as metrics_http_start takes it, nothing started: 0, or -EINVAL with why. */
int metrics_addr_check(const char *addr, char *why, size_t whylen);
/* The port it listens on. */
unsigned metrics_http_port(struct metrics_http *h);
void metrics_http_stop(struct metrics_http *h);

#endif
