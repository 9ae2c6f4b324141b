/* SPDX-License-Identifier: MIT */
/*
 * JSON output of the tools through json-c, which escapes every string (a
 * device named q"x\y.raw stays valid JSON). Adding records a failure
 * (out of memory) instead of printing a document with a hole in it.
 */
#ifndef RTRS_TOOLS_JSONOUT_H
#define RTRS_TOOLS_JSONOUT_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <json-c/json.h>

/* Adds v (NULL: allocation failed) under key; *failed set on any failure. */
static inline void jput(struct json_object *o, const char *key, struct json_object *v,
			bool *failed)
{
	if (!o || !v || json_object_object_add(o, key, v)) {
		json_object_put(v);
		*failed = true;
	}
}

/* A number printed with a fixed count of decimals, as the text output does. */
static inline struct json_object *jfixed(double v, int decimals)
{
	char s[64];

	snprintf(s, sizeof(s), "%.*f", decimals, v);
	return json_object_new_double_s(v, s);
}

/* Prints o on one line to stdout and drops it; 0, or -ENOMEM / -EIO. */
static inline int jprint(struct json_object *o, bool failed)
{
	const char *s = failed || !o ? NULL :
		json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
						  JSON_C_TO_STRING_NOSLASHESCAPE);
	int rc = s ? 0 : -ENOMEM;

	if (s && (printf("%s\n", s) < 0 || fflush(stdout)))
		rc = -EIO;
	json_object_put(o);
	return rc;
}

#endif
