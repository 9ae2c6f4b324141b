/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "rnbd-ctl.h"
#include "util.h"

#define REFUSE(msg) REJECT(-EINVAL, msg)

static bool blank(char c)
{
	return c == ' ' || c == '\t';
}

/* The next word at *p (before end): its start and length; 0 when none is left. */
static size_t next_word(const char **p, const char *end, const char **word)
{
	const char *s = *p, *e;

	while (s < end && blank(*s))
		s++;
	for (e = s; e < end && !blank(*e); e++)
		;
	*word = s;
	*p = e;
	return (size_t)(e - s);
}

int rnbd_ctl_parse(const char *buf, size_t len, struct rnbd_ctl_req *req, const char **why)
{
	const char *end = buf + len, *p = buf, *w[4];
	size_t wl[4];
	unsigned nw = 0;

	if (why)
		*why = NULL;
	memset(req, 0, sizeof(*req));
	if (len > RNBD_CTL_LINE_MAX)
		REFUSE("request longer than 1024 bytes");
	if (len && end[-1] == '\n')
		end--;
	if (end > buf && end[-1] == '\r')
		end--;
	for (const char *c = buf; c < end; c++) {
		unsigned char u = (unsigned char)*c;

		if (u == '\n')
			REFUSE("one command per connection");
		if ((u < 0x20 && u != '\t') || u == 0x7f)
			REFUSE("control character in the request");
	}
	while (nw < 4 && (wl[nw] = next_word(&p, end, &w[nw])))
		nw++;
	if (!nw)
		REFUSE("empty request (list, force-close SESSION DEVICE)");
	if (wl[0] == 4 && !memcmp(w[0], "list", 4)) {
		if (nw != 1)
			REFUSE("list takes no arguments");
		req->cmd = RNBD_CTL_LIST;
		return 0;
	}
	if (wl[0] == 11 && !memcmp(w[0], "force-close", 11)) {
		if (nw != 3)
			REFUSE("force-close needs SESSION DEVICE");
		if (wl[1] > RNBD_CTL_SESS_MAX)
			REFUSE("session name longer than 255 bytes");
		if (wl[2] > RNBD_CTL_DEV_MAX)
			REFUSE("device name longer than 254 bytes");
		req->cmd = RNBD_CTL_FORCE_CLOSE;
		memcpy(req->sess, w[1], wl[1]);
		memcpy(req->dev, w[2], wl[2]);
		return 0;
	}
	REFUSE("unknown command (list, force-close SESSION DEVICE)");
}
