/* SPDX-License-Identifier: MIT */
/*
 * Whether bytes are well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF): what JSON takes. Header only, so the
 * codecs that are built on their own (rnbd-proto, the JSON-RPC core) and
 * their fuzzers use it without a library.
 */
#ifndef RTRS_COMMON_UTF8_H
#define RTRS_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool utf8_valid(const void *s, size_t n)
{
	const unsigned char *p = s;

	for (size_t i = 0; i < n;) {
		unsigned c = p[i], len, min;
		uint32_t cp;

		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xe0) == 0xc0) {
			len = 2, min = 0x80, cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			len = 3, min = 0x800, cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			len = 4, min = 0x10000, cp = c & 0x07;
		} else {
			return false;
		}
		if (n - i < len)
			return false;
		for (unsigned k = 1; k < len; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (p[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		i += len;
	}
	return true;
}

#endif
