/* SPDX-License-Identifier: MIT */
/*
 * The server's handshake of one path as a transition table: from the
 * connection request of connection 0 to the information response (the
 * path is connected) or a refusal. Pure: a step takes the state and what
 * happened, and says whether that is allowed, the state it leads to, or
 * the errno the path (or the connection request) is refused with. The
 * path's atomic state is moved by compare-and-swap (srv_hs_step in
 * rtrs-srv-session.c), since events come from the service loop
 * (connection requests, the information response) and from connection
 * 0's completion thread (messages, authentication). docs/architecture.md
 * section 7.4 has the table.
 */
#ifndef RTRS_SRV_HS_H
#define RTRS_SRV_HS_H

#include <stdbool.h>

enum rtrs_srv_hs_state {
	SRV_HS_AUTH,          /* authentication required, the host not proven yet */
	SRV_HS_HOST_OK,       /* the host proved who it is; its transaction goes on */
	SRV_HS_WAIT_INFO,     /* authenticated, or none needed: the information request may come */
	SRV_HS_INFO,          /* the information request is being answered (service loop) */
	SRV_HS_AUTH_FAILED,   /* FAILURE1 went out: closed once the client read it */
	SRV_HS_REFUSED,       /* a verdict went out in place of the response: closed likewise */
	SRV_HS_DONE,          /* the response went out: the path is connected */
	SRV_HS_CONCAT,        /* a concatenation's exchange is done, its PSK kept: the client closes */
	SRV_HS_NR_STATES,
};

enum rtrs_srv_hs_event {
	SRV_HS_EV_CONNREQ,    /* a connection request for connection 1 .. n-1 */
	SRV_HS_EV_AUTH_MSG,   /* an authentication message on connection 0 */
	SRV_HS_EV_HOST_OK,    /* the transaction proved the host (R1 checked) */
	SRV_HS_EV_AUTH_DONE,  /* the transaction completed */
	SRV_HS_EV_AUTH_FAILED, /* the transaction failed */
	SRV_HS_EV_MSG,        /* another message on connection 0: an information request */
	SRV_HS_EV_MSG_OTHER,  /* a message on a connection other than 0 */
	SRV_HS_EV_INFO_OK,    /* the information response is going out */
	SRV_HS_EV_REFUSE,     /* a verdict is going out in place of it */
	SRV_HS_EV_CONCAT_DONE, /* a concatenation connection's transaction completed */
	SRV_HS_NR_EVENTS,
};

/* Where a path's handshake starts. */
static inline enum rtrs_srv_hs_state rtrs_srv_hs_initial(bool auth_required)
{
	return auth_required ? SRV_HS_AUTH : SRV_HS_WAIT_INFO;
}

/*
 * What ev does in state: 0 and *next (which may be state), or a negative
 * errno: the event is refused (a connection request is rejected with it,
 * a message fails the path with it) and the state stays. *why names the
 * rule for the log. An out-of-range state or event: -EINVAL.
 */
int rtrs_srv_hs_next(int state, int ev, int *next, const char **why);

/*
 * The host has proven who it is (with authentication) in this state:
 * admission no longer counts the path as pending, and the connection
 * requests of its other connections are taken.
 */
bool rtrs_srv_hs_host_proven(int state);

const char *rtrs_srv_hs_state_str(int state);
const char *rtrs_srv_hs_event_str(int ev);

#endif
