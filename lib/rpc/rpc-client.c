/* SPDX-License-Identifier: MIT */
/* JSON-RPC 2.0 client: one call per connection, with a deadline for all of it. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "rpc.h"

static uint64_t mono_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Waits for events on fd until deadline: 0, or -ETIMEDOUT / -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		uint64_t now = mono_ms();
		struct pollfd p = { .fd = fd, .events = events };
		int n;

		if (now >= deadline)
			return -ETIMEDOUT;
		n = poll(&p, 1, (int)(deadline - now));
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

static int send_all(int fd, const char *p, size_t len, uint64_t deadline)
{
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		int rc;

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		rc = wait_fd(fd, POLLOUT, deadline);
		if (rc)
			return rc;
	}
	return 0;
}

/* The answer: one JSON text, read until it is complete. */
static int read_answer(int fd, uint64_t deadline, struct json_object **out, struct rpc_err *err)
{
	struct json_tokener *tok = json_tokener_new();
	struct json_object *a = NULL;
	size_t total = 0, cap = 65536;
	char *buf = malloc(cap);
	int rc = 0;

	if (!tok || !buf) {
		json_tokener_free(tok);
		free(buf);
		return rpc_errf(err, -ENOMEM, "out of memory");
	}
	json_tokener_set_flags(tok, JSON_TOKENER_STRICT); /* no VALIDATE_UTF8: see rpc-core.c */
	while (!a) {
		ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT);
		enum json_tokener_error te;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			rc = wait_fd(fd, POLLIN, deadline);
			if (rc) {
				rpc_errf(err, rc, "no answer: %s", strerror(-rc));
				break;
			}
			continue;
		}
		if (n <= 0) {
			rc = n ? -errno : -ECONNRESET;
			rpc_errf(err, rc, "the server closed the connection without an answer");
			break;
		}
		total += (size_t)n;
		if (total > 256u << 20) {
			rc = rpc_errf(err, -EMSGSIZE, "an answer larger than 256 MiB");
			break;
		}
		a = json_tokener_parse_ex(tok, buf, (int)n);
		te = json_tokener_get_error(tok);
		if (!a && te != json_tokener_continue) {
			rc = rpc_errf(err, -EBADMSG, "the answer is not JSON: %s",
				      json_tokener_error_desc(te));
			break;
		}
	}
	json_tokener_free(tok);
	free(buf);
	*out = a;
	return rc;
}

int rpc_call(const char *path, const char *method, struct json_object *params,
	     unsigned timeout_ms, struct json_object **result, struct rpc_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	uint64_t deadline = mono_ms() + timeout_ms;
	struct json_object *req = NULL, *a = NULL, *v, *e;
	const char *text;
	size_t len;
	int fd = -1, rc;

	*result = NULL;
	memset(err, 0, sizeof(*err));
	if (strlen(path) >= sizeof(sa.sun_path))
		return rpc_errf(err, -ENAMETOOLONG, "%s: path too long", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	req = json_object_new_object();
	if (!req || json_object_object_add(req, "jsonrpc", json_object_new_string("2.0")) ||
	    json_object_object_add(req, "method", json_object_new_string(method)) ||
	    (params && json_object_object_add(req, "params", json_object_get(params))) ||
	    json_object_object_add(req, "id", json_object_new_int(1))) {
		rc = rpc_errf(err, -ENOMEM, "out of memory");
		goto out;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		rc = rpc_errf(err, -errno, "socket: %s", strerror(errno));
		goto out;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		rc = -errno;
		if (rc == -EAGAIN || rc == -EINPROGRESS) {
			rpc_errf(err, rc, "%s: the server is busy (its backlog is full)", path);
		} else {
			rpc_errf(err, rc, "%s: %s%s", path, strerror(-rc),
				 rc == -ENOENT || rc == -ECONNREFUSED ? " (is the daemon running?)" : "");
		}
		goto out;
	}
	text = json_object_to_json_string_length(req, JSON_C_TO_STRING_PLAIN |
						 JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	rc = text ? send_all(fd, text, len, deadline) : -ENOMEM;
	if (!rc)
		rc = send_all(fd, "\n", 1, deadline);
	if (rc == -ETIMEDOUT) {
		/* Not all of it: the server cannot run it. ETIMEDOUT is for a request sent. */
		rc = rpc_errf(err, -EAGAIN, "%s: sending the request: the server did not take it "
			      "within %u ms", path, timeout_ms);
		goto out;
	}
	if (rc) {
		rpc_errf(err, rc, "%s: sending the request: %s", path, strerror(-rc));
		goto out;
	}
	shutdown(fd, SHUT_WR);
	rc = read_answer(fd, deadline, &a, err);
	if (rc)
		goto out;
	if (!json_object_is_type(a, json_type_object) ||
	    !json_object_object_get_ex(a, "id", &v) || json_object_get_int(v) != 1) {
		rc = rpc_errf(err, -EBADMSG, "the answer is not a JSON-RPC response to the request");
		goto out;
	}
	if (json_object_object_get_ex(a, "error", &e)) {
		struct json_object *code, *msg;

		if (!json_object_object_get_ex(e, "code", &code) ||
		    !json_object_object_get_ex(e, "message", &msg)) {
			rc = rpc_errf(err, -EBADMSG, "an error answer without code or message");
			goto out;
		}
		rpc_errf(err, json_object_get_int(code), "%s", json_object_get_string(msg));
		rc = -EREMOTEIO;
		goto out;
	}
	if (!json_object_object_get_ex(a, "result", &v)) {
		rc = rpc_errf(err, -EBADMSG, "an answer with neither result nor error");
		goto out;
	}
	*result = json_object_get(v);
	rc = 0;
out:
	if (fd >= 0)
		close(fd);
	json_object_put(req);
	json_object_put(a);
	return rc;
}
