/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for rnbd-server's control socket requests
 * (daemons/rnbd-ctl.c, rnbd_ctl_parse). The input is one request as the
 * server reads it. Whatever it is:
 *
 *   - a refusal gives a reason (the text the client is answered);
 *   - an accepted request is list, or force-close with a session and a
 *     device name that are not empty, within their bounds, and hold no
 *     blank or control character;
 *   - an accepted request written back as a line parses to the same.
 *
 * The request is a heap copy of exactly its length.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rnbd-ctl.h"

static bool word(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (!n || n > max)
		return false;
	for (; *s; s++)
		if ((unsigned char)*s <= ' ' || (unsigned char)*s == 0x7f)
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct rnbd_ctl_req req, again;
	char line[RNBD_CTL_LINE_MAX + 2];
	const char *why = NULL;
	char *b = dup_exact(data, size);
	int rc, n;

	rc = rnbd_ctl_parse(b, size, &req, &why);
	free(b);
	FAIL_IF(rc != 0 && rc != -EINVAL);
	CHECK_WHY(rc, why);
	if (size > RNBD_CTL_LINE_MAX)
		FAIL_IF(rc == 0);
	if (rc)
		return 0;
	switch (req.cmd) {
	case RNBD_CTL_LIST:
		FAIL_IF(req.sess[0] || req.dev[0]);
		n = snprintf(line, sizeof(line), "list\n");
		break;
	case RNBD_CTL_FORCE_CLOSE:
		FAIL_IF(!word(req.sess, RNBD_CTL_SESS_MAX));
		FAIL_IF(!word(req.dev, RNBD_CTL_DEV_MAX));
		n = snprintf(line, sizeof(line), "force-close %s %s\n", req.sess, req.dev);
		break;
	default:
		FAIL_IF(true);
		return 0;
	}
	/* The longest accepted request fits in a line: written back, the same. */
	FAIL_IF(n < 0 || (size_t)n > RNBD_CTL_LINE_MAX);
	b = dup_exact((const uint8_t *)line, (size_t)n);
	rc = rnbd_ctl_parse(b, (size_t)n, &again, &why);
	free(b);
	FAIL_IF(rc != 0);
	FAIL_IF(again.cmd != req.cmd || strcmp(again.sess, req.sess) || strcmp(again.dev, req.dev));
	return 0;
}
