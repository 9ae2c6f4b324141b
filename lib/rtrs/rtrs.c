/* SPDX-License-Identifier: MIT */
/*
 * Pieces shared by client and server: the path state table, the reconnect
 * and multipath decisions, the log level (option defaults and addresses
 * are in rtrs-opts.c).
 */
#include <errno.h>
#include <string.h>

#include "rtrs-pri.h"

atomic_bool rtrs_test_kernel_clt;
atomic_bool rtrs_test_kernel_srv;
void (*_Atomic rtrs_test_srv_defer_checked)(void);
void (*_Atomic rtrs_test_srv_defers_cancelled)(void);
void (*_Atomic rtrs_test_srv_auth_step)(void);

static const char *const path_state_names[RTRS_PATH_NUM_STATES] = {
	[RTRS_PATH_CONNECTING] = "connecting",
	[RTRS_PATH_CONNECTED] = "connected",
	[RTRS_PATH_CLOSING] = "closing",
	[RTRS_PATH_CLOSED] = "closed",
	[RTRS_PATH_RECONNECTING] = "reconnecting",
};

/* allowed[from][to]: every legal transition, nothing else. */
static const bool path_state_allowed[RTRS_PATH_NUM_STATES][RTRS_PATH_NUM_STATES] = {
	[RTRS_PATH_CONNECTING] = { [RTRS_PATH_CONNECTED] = true, [RTRS_PATH_CLOSING] = true,
				   [RTRS_PATH_CLOSED] = true, [RTRS_PATH_RECONNECTING] = true },
	[RTRS_PATH_CONNECTED] = { [RTRS_PATH_CLOSING] = true },
	[RTRS_PATH_CLOSING] = { [RTRS_PATH_CLOSED] = true, [RTRS_PATH_RECONNECTING] = true },
	[RTRS_PATH_CLOSED] = { [RTRS_PATH_CONNECTING] = true, [RTRS_PATH_RECONNECTING] = true },
	[RTRS_PATH_RECONNECTING] = { [RTRS_PATH_CONNECTING] = true, [RTRS_PATH_CLOSED] = true },
};

const char *rtrs_path_state_str(enum rtrs_path_state s)
{
	return (unsigned)s < RTRS_PATH_NUM_STATES ? path_state_names[s] : "unknown";
}

bool rtrs_path_state_allowed(enum rtrs_path_state from, enum rtrs_path_state to)
{
	return (unsigned)from < RTRS_PATH_NUM_STATES && (unsigned)to < RTRS_PATH_NUM_STATES &&
	       path_state_allowed[from][to];
}

bool rtrs_path_change_state(_Atomic enum rtrs_path_state *state, const char *name,
			    enum rtrs_path_state to)
{
	enum rtrs_path_state from = atomic_load(state);

	if (!rtrs_path_state_allowed(from, to)) {
		log_err("%s: refused state change %s -> %s", name, rtrs_path_state_str(from),
			rtrs_path_state_str(to));
		return false;
	}
	atomic_store(state, to);
	log_dbg("%s: %s -> %s", name, rtrs_path_state_str(from), rtrs_path_state_str(to));
	return true;
}

/*
 * Rules in order, the first that matches decides: a path being shut down
 * stays down; an authentication verdict (-EKEYREJECTED, -ENOKEY) and a
 * server verdict marked do-not-retry are permanent, since the same
 * parameters would fail the same way; then the loss timeout and the
 * attempt budget bound everything else.
 */
enum rtrs_reconnect_verdict rtrs_should_reconnect(const struct rtrs_reconnect_in *in)
{
	if (in->stopping)
		return RTRS_RECONNECT_STOPPED;
	if (in->err == -EKEYREJECTED)
		return RTRS_RECONNECT_KEY_REJECTED;
	if (in->err == -ENOKEY)
		return RTRS_RECONNECT_NO_KEY;
	if (in->dnr)
		return RTRS_RECONNECT_SERVER_DNR;
	if (in->loss_timeout_ms && in->down_ms >= in->loss_timeout_ms)
		return RTRS_RECONNECT_LOSS_TIMEOUT;
	if (in->max_attempts >= 0 && in->attempts >= in->max_attempts)
		return RTRS_RECONNECT_OUT_OF_ATTEMPTS;
	return RTRS_RECONNECT_RETRY;
}

const char *rtrs_reconnect_verdict_str(enum rtrs_reconnect_verdict v)
{
	static const char *const names[RTRS_RECONNECT_NR_VERDICTS] = {
		[RTRS_RECONNECT_RETRY] = "retry",
		[RTRS_RECONNECT_STOPPED] = "stopped",
		[RTRS_RECONNECT_KEY_REJECTED] = "key rejected",
		[RTRS_RECONNECT_NO_KEY] = "no key",
		[RTRS_RECONNECT_SERVER_DNR] = "do not retry",
		[RTRS_RECONNECT_LOSS_TIMEOUT] = "loss timeout",
		[RTRS_RECONNECT_OUT_OF_ATTEMPTS] = "out of attempts",
	};

	return (unsigned)v < RTRS_RECONNECT_NR_VERDICTS ? names[v] : "unknown";
}

int rtrs_mp_select(enum rtrs_mp_policy policy, const struct rtrs_mp_path *paths, size_t n,
		   unsigned *rr)
{
	int best = -1;

	if (policy == RTRS_MP_POLICY_RR) {
		unsigned start = n ? *rr % n : 0;

		for (size_t k = 0; k < n; k++) {
			size_t i = (start + k) % n;

			if (paths[i].connected && !paths[i].tried) {
				*rr = (unsigned)(i + 1);
				return (int)i;
			}
		}
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		const struct rtrs_mp_path *p = &paths[i];

		if (!p->connected || p->tried)
			continue;
		if (best < 0) {
			best = (int)i;
			continue;
		}
		if (policy == RTRS_MP_POLICY_MIN_LATENCY) {
			/* An unmeasured path (0) counts as the slowest. */
			uint64_t a = p->latency_ns ? p->latency_ns : UINT64_MAX;
			uint64_t b = paths[best].latency_ns ? paths[best].latency_ns : UINT64_MAX;

			if (a < b || (a == b && p->inflight < paths[best].inflight))
				best = (int)i;
		} else if (p->inflight < paths[best].inflight) {
			best = (int)i;
		}
	}
	return best;
}

unsigned rtrs_reconnect_wait_ms(unsigned delay_ms, unsigned jitter_ms, unsigned min_ms)
{
	uint64_t ms = (uint64_t)delay_ms + rand_below(jitter_ms == UINT32_MAX ? jitter_ms :
						      jitter_ms + 1);

	ms = MAX(ms, MAX(min_ms, 1u));
	return ms > UINT32_MAX ? UINT32_MAX : (unsigned)ms;
}

RTRS_EXPORT
void rtrs_set_log_level(int level)
{
	g_log_level = level < LOG_ERR ? LOG_ERR : level > LOG_DBG ? LOG_DBG : level;
}

RTRS_EXPORT
const char *rtrs_last_error(void)
{
	return err_detail_get();
}

_Static_assert(RTRS_AUTH_WIRE_NAME_MAX == 223, "rtrs_auth_name_check's message says 223");

RTRS_EXPORT
int rtrs_auth_name_check(const char *name, const char **why)
{
	const char *cause = !name || !*name ? "empty" :
			    strnlen(name, RTRS_AUTH_WIRE_NAME) > RTRS_AUTH_WIRE_NAME_MAX ?
			    "longer than 223 characters" :
			    !rtrs_auth_name_valid(name) ? "a blank or a character that is not "
							  "printable ASCII" : NULL;

	if (why)
		*why = cause;
	return cause ? -EINVAL : 0;
}

RTRS_EXPORT
void rtrs_set_log_fn(void (*fn)(void *priv, int level, const char *line), void *priv)
{
	log_set_sink(fn, priv);
}
