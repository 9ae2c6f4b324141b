/* SPDX-License-Identifier: MIT */
/*
 * The server's handshake of a path as a transition table (rtrs-srv-hs.h).
 * An entry either moves the path (GO) or refuses the event with an errno
 * (NO); an event without an entry in a state is refused with -EPROTO.
 */
#include <errno.h>
#include <stdint.h>

#include "rtrs-pri.h"
#include "rtrs-srv-hs.h"

struct hs_rule {
	uint8_t go;                 /* the next state + 1; 0: refused */
	int16_t err;                /* refused: the errno */
	const char *why;
};

#define GO(s) { .go = (s) + 1 }
#define NO(e, w) { .err = (e), .why = (w) }

static const struct hs_rule hs_table[SRV_HS_NR_STATES][SRV_HS_NR_EVENTS] = {
	[SRV_HS_AUTH] = {
		[SRV_HS_EV_CONNREQ] = NO(-EACCES, "connection before the path authenticated"),
		[SRV_HS_EV_AUTH_MSG] = GO(SRV_HS_AUTH),
		[SRV_HS_EV_HOST_OK] = GO(SRV_HS_HOST_OK),
		[SRV_HS_EV_AUTH_DONE] = GO(SRV_HS_WAIT_INFO),
		[SRV_HS_EV_CONCAT_DONE] = GO(SRV_HS_CONCAT),
		[SRV_HS_EV_AUTH_FAILED] = GO(SRV_HS_AUTH_FAILED),
		[SRV_HS_EV_MSG] = NO(-EACCES, "message before authentication"),
	},
	[SRV_HS_HOST_OK] = {
		[SRV_HS_EV_CONNREQ] = GO(SRV_HS_HOST_OK),
		[SRV_HS_EV_AUTH_MSG] = GO(SRV_HS_HOST_OK),
		[SRV_HS_EV_HOST_OK] = GO(SRV_HS_HOST_OK),
		[SRV_HS_EV_AUTH_DONE] = GO(SRV_HS_WAIT_INFO),
		[SRV_HS_EV_CONCAT_DONE] = GO(SRV_HS_CONCAT),
		[SRV_HS_EV_AUTH_FAILED] = GO(SRV_HS_AUTH_FAILED),
		[SRV_HS_EV_MSG] = NO(-EACCES, "message before authentication"),
	},
	[SRV_HS_WAIT_INFO] = {
		[SRV_HS_EV_CONNREQ] = GO(SRV_HS_WAIT_INFO),
		[SRV_HS_EV_AUTH_MSG] = NO(-EPROTO, "authentication message not expected"),
		[SRV_HS_EV_MSG] = GO(SRV_HS_INFO),
	},
	[SRV_HS_INFO] = {
		[SRV_HS_EV_CONNREQ] = NO(-EEXIST, "connection after the information request"),
		[SRV_HS_EV_AUTH_MSG] = NO(-EPROTO, "authentication message not expected"),
		[SRV_HS_EV_MSG] = NO(-EPROTO, "a second information request"),
		[SRV_HS_EV_INFO_OK] = GO(SRV_HS_DONE),
		[SRV_HS_EV_REFUSE] = GO(SRV_HS_REFUSED),
	},
	[SRV_HS_AUTH_FAILED] = {
		[SRV_HS_EV_CONNREQ] = NO(-EACCES, "the path failed authentication"),
		[SRV_HS_EV_AUTH_MSG] = NO(-EPROTO, "authentication message not expected"),
		[SRV_HS_EV_MSG] = NO(-EACCES, "message after failed authentication"),
	},
	[SRV_HS_REFUSED] = {
		[SRV_HS_EV_CONNREQ] = NO(-EEXIST, "connection of a refused path"),
	},
	[SRV_HS_DONE] = {
		[SRV_HS_EV_CONNREQ] = NO(-EEXIST, "connection of a connected path"),
	},
	[SRV_HS_CONCAT] = {
		[SRV_HS_EV_CONNREQ] = NO(-EPROTO, "connection of a concatenation's path"),
		[SRV_HS_EV_AUTH_MSG] = NO(-EPROTO, "authentication message after the concatenation"),
		[SRV_HS_EV_MSG] = NO(-EPROTO, "message on a concatenation's connection"),
	},
};

static const char *const hs_state_names[SRV_HS_NR_STATES] = {
	[SRV_HS_AUTH] = "auth",
	[SRV_HS_HOST_OK] = "host-ok",
	[SRV_HS_WAIT_INFO] = "wait-info",
	[SRV_HS_INFO] = "info",
	[SRV_HS_AUTH_FAILED] = "auth-failed",
	[SRV_HS_REFUSED] = "refused",
	[SRV_HS_DONE] = "done",
	[SRV_HS_CONCAT] = "concat",
};

static const char *const hs_event_names[SRV_HS_NR_EVENTS] = {
	[SRV_HS_EV_CONNREQ] = "connreq",
	[SRV_HS_EV_AUTH_MSG] = "auth-msg",
	[SRV_HS_EV_HOST_OK] = "host-ok",
	[SRV_HS_EV_AUTH_DONE] = "auth-done",
	[SRV_HS_EV_AUTH_FAILED] = "auth-failed",
	[SRV_HS_EV_MSG] = "msg",
	[SRV_HS_EV_MSG_OTHER] = "msg-other-con",
	[SRV_HS_EV_INFO_OK] = "info-ok",
	[SRV_HS_EV_REFUSE] = "refuse",
	[SRV_HS_EV_CONCAT_DONE] = "concat-done",
};

int rtrs_srv_hs_next(int state, int ev, int *next, const char **why)
{
	const struct hs_rule *r;

	if ((unsigned)state >= SRV_HS_NR_STATES || (unsigned)ev >= SRV_HS_NR_EVENTS) {
		*why = "no such state or event";
		return -EINVAL;
	}
	r = &hs_table[state][ev];
	if (r->go) {
		*next = r->go - 1;
		*why = NULL;
		return 0;
	}
	*why = r->err ? r->why : "not expected in this state of the handshake";
	return r->err ? r->err : -EPROTO;
}

bool rtrs_srv_hs_host_proven(int state)
{
	return state == SRV_HS_HOST_OK || state == SRV_HS_WAIT_INFO || state == SRV_HS_INFO ||
	       state == SRV_HS_REFUSED || state == SRV_HS_DONE || state == SRV_HS_CONCAT;
}

const char *rtrs_srv_hs_state_str(int state)
{
	return (unsigned)state < SRV_HS_NR_STATES ? hs_state_names[state] : "unknown";
}

const char *rtrs_srv_hs_event_str(int ev)
{
	return (unsigned)ev < SRV_HS_NR_EVENTS ? hs_event_names[ev] : "unknown";
}
