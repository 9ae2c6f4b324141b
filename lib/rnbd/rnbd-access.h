/* SPDX-License-Identifier: MIT */
/*
 * Which authenticated host may use which session names and open which
 * devices in which modes: the server's access file (docs/security.md
 * section 2.6). Parsing and matching are pure (no log, no global state):
 * the unit test and the fuzzer take them alone.
 */
#ifndef RNBD_ACCESS_H
#define RNBD_ACCESS_H

#include <stdbool.h>
#include <stddef.h>

#include "rnbd-proto.h"

/* The largest access file read (like the key file's). */
#define RNBD_ACCESS_FILE_MAX (1u << 20)

struct rnbd_access;

/*
 * Parses an access file's text (len bytes, need not end in NUL): 0 and
 * *out, or -EINVAL with "FILE:LINE: cause" in err (file names the text).
 */
int rnbd_access_parse(const char *text, size_t len, const char *file, struct rnbd_access **out,
		      char *err, size_t errlen);
/*
 * Reads and parses the file at path (a regular file of at most
 * RNBD_ACCESS_FILE_MAX bytes, opened without blocking): 0 and *out, or a
 * negative errno with the file (and line) and the cause in err.
 */
int rnbd_access_load(const char *path, struct rnbd_access **out, char *err, size_t errlen);
void rnbd_access_free(struct rnbd_access *a);

/* May host use the session name sess? */
bool rnbd_access_session(const struct rnbd_access *a, const char *host, const char *sess);
/* May host open the device named dev (normalized) in mode? */
bool rnbd_access_device(const struct rnbd_access *a, const char *host, const char *dev,
			enum rnbd_access_mode mode);
/* The hosts' lines the file had (for the log). */
unsigned rnbd_access_lines(const struct rnbd_access *a);

#endif
