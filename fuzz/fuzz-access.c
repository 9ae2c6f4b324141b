/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for rnbd-server's access file (lib/rnbd/rnbd-access.c).
 *
 * Input layout: [host length:u8][host][device length:u8][device][file text].
 * The text is parsed as a file; what it accepts is then asked about the
 * host and device taken from the input, in every mode and as a session
 * name. A refusal names the file and a line the text has, with a cause;
 * an acceptance grants modes in order (what rw grants, ro grants too).
 * The text is a heap copy of exactly its length, so ASan reports a read
 * past it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "rnbd-access.h"

static char *take_str(const uint8_t **p, size_t *n)
{
	size_t len = *n ? (*p)[0] : 0;
	char *s;

	if (*n) {
		(*p)++;
		(*n)--;
	}
	len = len < *n ? len : *n;
	s = malloc(len + 1);
	FAIL_IF(!s);
	memcpy(s, *p, len);
	s[len] = '\0';
	*p += len;
	*n -= len;
	return s;
}

static unsigned count_lines(const char *s, size_t n)
{
	unsigned lines = n ? 1 : 0;

	for (size_t i = 0; i + 1 < n; i++)
		lines += s[i] == '\n';
	return lines;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *host = take_str(&data, &size), *dev = take_str(&data, &size);
	char *text = malloc(size ? size : 1), err[512];
	struct rnbd_access *a = (struct rnbd_access *)1;
	int rc;

	FAIL_IF(!text);
	memcpy(text, data, size);
	err[0] = '\0';
	rc = rnbd_access_parse(text, size, "F", &a, err, sizeof(err));
	if (rc) {
		unsigned line = 0;

		FAIL_IF(rc != -EINVAL && rc != -ENOMEM);
		FAIL_IF(a != NULL);
		FAIL_IF(strncmp(err, "F:", 2));
		/* "F: a NUL byte" names no line; every other refusal does, one the text has. */
		if (strcmp(err, "F: a NUL byte: not a text file") && rc == -EINVAL) {
			FAIL_IF(sscanf(err, "F:%u: ", &line) != 1);
			FAIL_IF(line < 1 || line > count_lines(text, size));
			FAIL_IF(strlen(strchr(err + 2, ':')) < 3);
		}
	} else {
		bool ro, rw, mig;

		FAIL_IF(!a);
		FAIL_IF(rnbd_access_lines(a) > count_lines(text, size));
		ro = rnbd_access_device(a, host, dev, RNBD_ACCESS_RO);
		rw = rnbd_access_device(a, host, dev, RNBD_ACCESS_RW);
		mig = rnbd_access_device(a, host, dev, RNBD_ACCESS_MIGRATION);
		FAIL_IF((mig && !rw) || (rw && !ro));
		(void)rnbd_access_session(a, host, dev);
		rnbd_access_free(a);
	}
	free(text);
	free(host);
	free(dev);
	return 0;
}
