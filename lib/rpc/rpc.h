/* SPDX-License-Identifier: MIT */
/*
 * The control plane of every long-lived program of the project
 * (rnbd-server, the client daemon, nbdkit with the rnbd plugin): JSON-RPC
 * 2.0 over a Unix stream socket, JSON read and written by json-c only.
 *
 * On the stream, requests and responses are JSON texts one after the
 * other (white space between them allowed; the responses end with '\n').
 * A request may arrive in pieces or several in one read, or as a batch (an
 * array); a request without "id" is a notification and gets no answer.
 * "params" is an object or absent.
 *
 * The server has a thread of its own that serves every connection with
 * poll(): methods run there, never on an IO thread (or, with
 * RPC_SERVER_THREADED, on a thread of each connection). A text larger than
 * RPC_REQ_MAX or bytes that are not JSON get an error where one can be
 * sent, and the connection is closed; nothing else is affected. An answer
 * that would take the answers to one text past RPC_OUT_MAX is replaced by
 * an EMSGSIZE error for its request (in a batch, every answer after the
 * ones that fit), and the connection goes on. A connection is not read while more
 * than RPC_OUT_LOW of its answers wait, and is closed when they have not
 * moved for RPC_STALL_MS, when a request begun is not complete after
 * RPC_REQUEST_MS, or when it has been idle for RPC_IDLE_MS (never while
 * a method of its runs). At RPC_CONN_MAX connections, a new one takes the
 * place of the one that has made no progress (no request answered, no
 * answer written) for longest, if that is a second at least.
 *
 * Errors: JSON-RPC's own codes (enum rpc_code) for requests that are not
 * understood; a method's failure has the errno as its code (positive,
 * 1..4095), a message naming the object and the cause, and data
 * {"errno": "ENOENT"}.
 */
#ifndef RTRS_RPC_H
#define RTRS_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <json-c/json.h>

#define RPC_REQ_MAX (1u << 20)   /* bytes of one request text (a batch is one text) */
#define RPC_DEPTH_MAX 32         /* brackets a request text may nest */
#define RPC_OUT_MAX (16u << 20)  /* answers to one request text (a batch's all together) */
#define RPC_OUT_LOW (64u << 10)  /* answers waiting beyond which a connection is not read */
#define RPC_CONN_MAX 64          /* connections at once; more wait in the backlog */
#define RPC_WATCH_MAX 8          /* watches rpc_serve takes */
#define RPC_BATCH_MAX 256        /* requests in a batch */
#define RPC_VALUES_MAX 16384     /* brackets and commas in one request text */
#define RPC_IDLE_MS 30000        /* a connection with nothing under way, silent: closed */
#define RPC_REQUEST_MS 10000     /* a request text begun and not complete: closed */
#define RPC_STALL_MS 10000       /* answers waiting, not one byte of them read: closed */

enum rpc_code {
	RPC_PARSE_ERROR = -32700,
	RPC_INVALID_REQUEST = -32600,
	RPC_METHOD_NOT_FOUND = -32601,
	RPC_INVALID_PARAMS = -32602,
	RPC_INTERNAL_ERROR = -32603,
};

struct rpc_err {
	int code;                /* enum rpc_code, or an errno (positive) */
	char msg[512];
};

/*
 * A method: params is an object, or NULL when the request has none. It
 * returns 0 with *result set (a new reference; NULL answers null), or a
 * negative errno or an enum rpc_code with err's message set (rpc_errf).
 */
typedef int (*rpc_fn)(void *priv, struct json_object *params, struct json_object **result,
		      struct rpc_err *err);

struct rpc_method {
	const char *name;
	rpc_fn fn;
	const char *params;      /* for rpc.methods: "session: string, device: string" */
	const char *help;        /* for rpc.methods: one line */
};

/*
 * Sets err (code: a negative errno or an enum rpc_code) and returns code.
 * A message longer than err->msg is cut between UTF-8 characters.
 */
int rpc_errf(struct rpc_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* How many bytes of s, at most max, end on a UTF-8 character's end: for "%.*s". */
int rpc_utf8_prefix(const char *s, int max);

/*
 * Parameters, checked: each returns 0, or RPC_INVALID_PARAMS with err
 * naming the parameter and what is wrong. A missing optional parameter
 * leaves *out as it was. rpc_params_check refuses parameters not in
 * names (NULL-terminated) and params that are not an object.
 */
int rpc_params_check(struct json_object *params, const char *const *names, struct rpc_err *err);
int rpc_param_str(struct json_object *params, const char *name, bool required, const char **out,
		  struct rpc_err *err);
int rpc_param_u64(struct json_object *params, const char *name, bool required, uint64_t min,
		  uint64_t max, uint64_t *out, struct rpc_err *err);
int rpc_param_bool(struct json_object *params, const char *name, bool required, bool *out,
		   struct rpc_err *err);
/* An array of strings (each not empty); *out points into params. */
int rpc_param_strs(struct json_object *params, const char *name, bool required,
		   struct json_object **out, struct rpc_err *err);

/*
 * What json-c takes without a word and a text must not carry, checked in
 * text (n bytes, parsed whole with JSON_TOKENER_STRICT as v): a member name
 * given twice in one object (json-c keeps the last), a NUL in a member
 * name, an integer beyond 64 bits (json-c clamps it). NULL, or why. The
 * stream engine checks every request so; rnbd-clientd its mappings file.
 */
const char *rpc_text_check(const char *text, size_t n, struct json_object *v);

/* ---- the stream engine (no sockets: the server and the fuzzer use it) ---- */

struct rpc_stream;

/* Where a stream's answers go: 0, or a negative errno to stop the stream. */
typedef int (*rpc_out_fn)(void *priv, const char *text, size_t len);

struct rpc_stream *rpc_stream_new(const struct rpc_method *methods, size_t nr_methods,
				  void *priv, rpc_out_fn out, void *out_priv);
void rpc_stream_free(struct rpc_stream *st);
/*
 * Feeds len bytes of the stream: every request completed is run and
 * answered. 0; or -EPROTO once the stream cannot go on (not JSON, a text
 * too large: answered with an error first), or out's error; after an
 * error the stream takes nothing more.
 */
int rpc_stream_feed(struct rpc_stream *st, const char *buf, size_t len);
/*
 * The same, but it stops once a text was answered: 1 then, 0 when buf was
 * used up without a text ending, or the error; *used says how much of buf
 * it took. The server feeds a connection's input this way so that it can
 * stop while answers wait.
 */
int rpc_stream_feed_text(struct rpc_stream *st, const char *buf, size_t len, size_t *used);
/* Bytes of a text begun and not yet complete (0: between texts). */
size_t rpc_stream_partial(const struct rpc_stream *st);

/* ---- the server ---- */

struct rpc_server;

/*
 * Listens on the Unix socket at path (mode 0600; a stale socket there,
 * one nobody answers on, is replaced; any other file, or a live server's
 * socket, is refused: -EEXIST / -EADDRINUSE) and serves it on a thread
 * of its own until rpc_server_stop. name is for the log ("rnbd-server
 * control"). The method "rpc.methods" is always there: every method with
 * its parameters and help.
 */
int rpc_server_start(const char *path, const char *name, const struct rpc_method *methods,
		     size_t nr_methods, void *priv, struct rpc_server **out);
/*
 * Each connection's requests run on a thread of the connection's own, in
 * their order: a method that blocks (a map waiting for its server) holds
 * only the requests that came after it on its connection. Methods of
 * different connections then run at the same time, and must be safe so;
 * rpc_server_stop reads nothing more, waits for those in progress (and
 * for those read already), and gives their answers up to a second to go
 * out.
 */
#define RPC_SERVER_THREADED 1u
/* rpc_server_start with flags (RPC_SERVER_THREADED, or 0). */
int rpc_server_start_flags(const char *path, const char *name, const struct rpc_method *methods,
			   size_t nr_methods, void *priv, unsigned flags, struct rpc_server **out);
/*
 * No thread of its own: the server is served by rpc_serve on the caller's
 * thread (a daemon's main thread, which also takes its signals there).
 */
#define RPC_SERVER_CALLER 2u
/*
 * Stops the thread, closes every connection, removes the socket if still
 * ours; threaded, after the methods in progress have returned.
 * RPC_SERVER_CALLER: after rpc_serve has returned.
 */
void rpc_server_stop(struct rpc_server *s);

/*
 * Something else that rpc_serve's thread serves beside the server: fd is
 * polled for reading (a negative fd: none, prepare's time only). Before
 * each wait prepare (may be NULL) does what is due and returns the ms
 * until it wants to run again (-1: no limit); after it, fn runs with
 * whether fd was readable. A non-zero return of either ends rpc_serve
 * with that value (0 is for going on).
 */
struct rpc_watch {
	int fd;
	int (*prepare)(void *priv);
	int (*fn)(void *priv, bool readable);
	void *priv;
};
/*
 * Serves s (started with RPC_SERVER_CALLER; NULL: none) and the n watches
 * on the calling thread until a watch ends it: returns that watch's value
 * (the server's requests in progress answered first, as rpc_server_stop
 * would). A negative errno when waiting fails (the cause logged).
 */
int rpc_serve(struct rpc_server *s, const struct rpc_watch *w, size_t n);
/*
 * Other times than RPC_IDLE_MS, RPC_REQUEST_MS and RPC_STALL_MS (tests), in
 * force from the thread's next wake-up.
 */
void rpc_server_set_times(struct rpc_server *s, unsigned idle_ms, unsigned request_ms,
			  unsigned stall_ms);

/* ---- the client ---- */

/*
 * Calls method with params (an object, or NULL; not consumed) on the
 * server at path, waiting at most timeout_ms for the whole exchange. 0
 * with *result (a new reference, possibly NULL for null); -EREMOTEIO when
 * the server answered with an error (in err); -ETIMEDOUT when the whole
 * request was sent and no answer came in time (the method may still run
 * to its end); another negative errno when the call did not happen
 * (-EAGAIN: the server took not all of the request in time) or its answer
 * was not understood (err says why).
 */
int rpc_call(const char *path, const char *method, struct json_object *params,
	     unsigned timeout_ms, struct json_object **result, struct rpc_err *err);

#endif
