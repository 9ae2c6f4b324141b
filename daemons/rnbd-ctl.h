/* SPDX-License-Identifier: MIT */
/*
 * rnbd-server's control socket requests, parsed without touching the
 * server (the fuzzer calls rnbd_ctl_parse on its own):
 *
 *   list                         every open device and its counters
 *   force-close SESSION DEVICE   close a device a session has open
 *
 * One line: words separated by blanks (spaces or tabs), a final '\n' (and
 * a '\r' before it) optional, no other control character, nothing after
 * the line.
 */
#ifndef RNBD_CTL_H
#define RNBD_CTL_H

#include <stddef.h>

#define RNBD_CTL_LINE_MAX 1024 /* bytes of a request, its newline included */
#define RNBD_CTL_SESS_MAX 255  /* an RTRS session name */
#define RNBD_CTL_DEV_MAX 254   /* an RNBD device name */

enum rnbd_ctl_cmd { RNBD_CTL_LIST, RNBD_CTL_FORCE_CLOSE };

struct rnbd_ctl_req {
	enum rnbd_ctl_cmd cmd;
	char sess[RNBD_CTL_SESS_MAX + 1]; /* force-close: not empty */
	char dev[RNBD_CTL_DEV_MAX + 1];
};

/*
 * The request in buf[0..len). Returns 0 and fills req, or -EINVAL with
 * *why set to the answer's text ("unknown command (...)", "force-close
 * needs SESSION DEVICE", ...).
 */
int rnbd_ctl_parse(const char *buf, size_t len, struct rnbd_ctl_req *req, const char **why);

#endif
