/* SPDX-License-Identifier: MIT */
/*
 * The server's access file (docs/security.md section 2.6): per host name,
 * the session names it may use and the devices it may open, by mode.
 *
 *   # host                                      what it may use
 *   nqn.2014-08.org.nvmexpress:uuid:7e1d2c9a-... sessions=hv1-* rw=vm/hv1-* ro=images/base-*
 *   *                                           ro=images/base-*
 *
 * Patterns are fnmatch(3) patterns without flags ('*' matches '/' too).
 * A device pattern names devices as the client names them, normalized
 * (rnbd_dev_name_normalize: no leading, doubled or trailing '/'). Modes
 * are ordered ro < rw < migration; a pattern grants its mode and those
 * below. Lines add up; "*" as the host is every authenticated host.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rnbd-access.h"

#define ACCESS_HOST_MAX 223    /* as the key file's (RTRS_AUTH_NAME_MAX) */
#define ACCESS_PATTERN_MAX 255 /* a device name's room (RNBD_DEV_NAME_MAX - 1) */

enum acc_kind { ACC_SESSIONS, ACC_RO, ACC_RW, ACC_MIGRATION, ACC_KINDS };
static const char *const acc_kind_names[ACC_KINDS] = {
	[ACC_SESSIONS] = "sessions", [ACC_RO] = "ro", [ACC_RW] = "rw",
	[ACC_MIGRATION] = "migration",
};

struct acc_rule {
	char *host; /* "*": every host */
	enum acc_kind kind;
	char *pattern;
};

struct rnbd_access {
	struct acc_rule *rules;
	size_t nr, room;
	unsigned lines;
};

void rnbd_access_free(struct rnbd_access *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->nr; i++) {
		free(a->rules[i].host);
		free(a->rules[i].pattern);
	}
	free(a->rules);
	free(a);
}

static int acc_add(struct rnbd_access *a, const char *host, size_t hlen, enum acc_kind kind,
		   const char *pat, size_t plen)
{
	struct acc_rule *r;

	if (a->nr == a->room) {
		size_t room = a->room ? 2 * a->room : 16;
		struct acc_rule *grown = realloc(a->rules, room * sizeof(*grown));

		if (!grown)
			return -ENOMEM;
		a->rules = grown;
		a->room = room;
	}
	r = &a->rules[a->nr];
	r->host = strndup(host, hlen);
	r->pattern = strndup(pat, plen);
	r->kind = kind;
	if (!r->host || !r->pattern) {
		free(r->host);
		free(r->pattern);
		return -ENOMEM;
	}
	a->nr++;
	return 0;
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

/*
 * Whether fnmatch reads pattern p[0..n) as written: every '[' closed by a
 * ']', no '\' at the end (glibc would take either as a plain character,
 * and the rule would grant something else than the admin meant, or
 * nothing).
 */
static bool acc_pattern_ok(const char *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\\') {
			if (++i == n)
				return false;
		} else if (p[i] == '[') {
			size_t j = i + 1;

			if (j < n && (p[j] == '!' || p[j] == '^'))
				j++;
			if (j < n && p[j] == ']')
				j++; /* a ']' first is one of the set */
			while (j < n && p[j] != ']')
				j++;
			if (j == n)
				return false;
			i = j;
		}
	}
	return true;
}

/* One field "kind=pattern[,pattern...]" of a host's line. */
static int acc_field(struct rnbd_access *a, const char *host, size_t hlen, const char *f,
		     size_t flen, const char **why)
{
	const char *eq = memchr(f, '=', flen), *p, *end = f + flen;
	enum acc_kind kind;
	int rc;

	if (!eq) {
		*why = "a field is not kind=patterns (sessions=, ro=, rw=, migration=)";
		return -EINVAL;
	}
	for (kind = 0; kind < ACC_KINDS; kind++)
		if ((size_t)(eq - f) == strlen(acc_kind_names[kind]) &&
		    !memcmp(f, acc_kind_names[kind], (size_t)(eq - f)))
			break;
	if (kind == ACC_KINDS) {
		*why = "unknown kind (sessions=, ro=, rw= or migration=)";
		return -EINVAL;
	}
	for (p = eq + 1;; ) {
		const char *c = memchr(p, ',', (size_t)(end - p)), *e = c ? c : end;

		if (e == p) {
			*why = "an empty pattern";
			return -EINVAL;
		}
		if ((size_t)(e - p) > ACCESS_PATTERN_MAX) {
			*why = "a pattern longer than 255 bytes";
			return -EINVAL;
		}
		if (!acc_pattern_ok(p, (size_t)(e - p))) {
			*why = "a pattern with a '[' not closed by ']' or a '\\' at its end";
			return -EINVAL;
		}
		if (kind != ACC_SESSIONS && *p == '/') {
			*why = "a device pattern starting with '/' (devices are named below the "
			       "search path, without a leading '/')";
			return -EINVAL;
		}
		rc = acc_add(a, host, hlen, kind, p, (size_t)(e - p));
		if (rc) {
			*why = "out of memory";
			return rc;
		}
		if (!c)
			break;
		p = c + 1;
	}
	return 0;
}

/* One line (without its newline): a comment, blank, or a host's. */
static int acc_line(struct rnbd_access *a, const char *l, size_t len, const char **why)
{
	const char *end = l + len, *host, *p;
	size_t hlen, fields = 0;
	int rc;

	if (len && l[len - 1] == '\r')
		end--;
	for (p = l; p < end; p++)
		if ((unsigned char)*p < 0x20 && *p != '\t') {
			*why = "a control character";
			return -EINVAL;
		}
	for (p = l; p < end && is_blank(*p); p++)
		;
	if (p == end || *p == '#')
		return 0;
	host = p;
	while (p < end && !is_blank(*p))
		p++;
	hlen = (size_t)(p - host);
	if (hlen > ACCESS_HOST_MAX) {
		*why = "a host name longer than 223 bytes";
		return -EINVAL;
	}
	/* Host names are matched exactly: "*" alone is every host. */
	if (memchr(host, '=', hlen)) {
		*why = "a host name with '=' (a line starts with its host, then kind=patterns: "
		       "is the host missing?)";
		return -EINVAL;
	}
	if (memchr(host, '*', hlen) && hlen != 1) {
		*why = "a host name with '*' (host names are matched exactly; \"*\" alone is "
		       "every host)";
		return -EINVAL;
	}
	for (const char *h = host; h < host + hlen; h++)
		if ((unsigned char)*h >= 0x7f) {
			*why = "a host name with a byte an authenticated name cannot have "
			       "(printable ASCII only)";
			return -EINVAL;
		}
	for (;;) {
		const char *f;

		while (p < end && is_blank(*p))
			p++;
		if (p == end)
			break;
		f = p;
		while (p < end && !is_blank(*p))
			p++;
		rc = acc_field(a, host, hlen, f, (size_t)(p - f), why);
		if (rc)
			return rc;
		fields++;
	}
	if (!fields) {
		*why = "a host with nothing granted (sessions=, ro=, rw=, migration=)";
		return -EINVAL;
	}
	a->lines++;
	return 0;
}

int rnbd_access_parse(const char *text, size_t len, const char *file, struct rnbd_access **out,
		      char *err, size_t errlen)
{
	struct rnbd_access *a = calloc(1, sizeof(*a));
	const char *p = text, *end = text + len, *why = NULL;
	unsigned line = 0;
	int rc = 0;

	*out = NULL;
	if (!a) {
		snprintf(err, errlen, "%s: out of memory", file);
		return -ENOMEM;
	}
	if (memchr(text, '\0', len)) {
		snprintf(err, errlen, "%s: a NUL byte: not a text file", file);
		rnbd_access_free(a);
		return -EINVAL;
	}
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *e = nl ? nl : end;

		line++;
		rc = acc_line(a, p, (size_t)(e - p), &why);
		if (rc) {
			snprintf(err, errlen, "%s:%u: %s", file, line, why);
			rnbd_access_free(a);
			return rc;
		}
		p = nl ? nl + 1 : end;
	}
	*out = a;
	return 0;
}

int rnbd_access_load(const char *path, struct rnbd_access **out, char *err, size_t errlen)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd, rc;

	*out = NULL;
	/* Only a regular file is opened: a FIFO or a device named by mistake is not. */
	fd = open_regular(path, &st);
	if (fd == -EINVAL || fd == -EISDIR) {
		snprintf(err, errlen, "%s: not a regular file (%s)", path, file_type_name(st.st_mode));
		return -EINVAL;
	}
	if (fd < 0) {
		snprintf(err, errlen, "%s: %s", path, strerror(-fd));
		return fd;
	}
	if (st.st_size > RNBD_ACCESS_FILE_MAX) {
		rc = -EFBIG;
		snprintf(err, errlen, "%s: larger than %u bytes", path, RNBD_ACCESS_FILE_MAX);
		goto out;
	}
	buf = malloc(RNBD_ACCESS_FILE_MAX + 1);
	if (!buf) {
		rc = -ENOMEM;
		snprintf(err, errlen, "%s: out of memory", path);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf + got, RNBD_ACCESS_FILE_MAX + 1 - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			snprintf(err, errlen, "%s: %s", path, strerror(-rc));
			goto out;
		}
		if (!n)
			break;
		got += (size_t)n;
		if (got > RNBD_ACCESS_FILE_MAX) {
			rc = -EFBIG;
			snprintf(err, errlen, "%s: larger than %u bytes", path, RNBD_ACCESS_FILE_MAX);
			goto out;
		}
	}
	rc = rnbd_access_parse(buf, got, path, out, err, errlen);
out:
	free(buf);
	close(fd);
	return rc;
}

static bool acc_host_is(const struct acc_rule *r, const char *host)
{
	return !strcmp(r->host, "*") || !strcmp(r->host, host);
}

bool rnbd_access_session(const struct rnbd_access *a, const char *host, const char *sess)
{
	for (size_t i = 0; a && i < a->nr; i++) {
		const struct acc_rule *r = &a->rules[i];

		if (r->kind == ACC_SESSIONS && acc_host_is(r, host) &&
		    !fnmatch(r->pattern, sess, 0))
			return true;
	}
	return false;
}

bool rnbd_access_device(const struct rnbd_access *a, const char *host, const char *dev,
			enum rnbd_access_mode mode)
{
	enum acc_kind need = mode == RNBD_ACCESS_RO ? ACC_RO :
			     mode == RNBD_ACCESS_RW ? ACC_RW : ACC_MIGRATION;

	for (size_t i = 0; a && i < a->nr; i++) {
		const struct acc_rule *r = &a->rules[i];

		if (r->kind != ACC_SESSIONS && r->kind >= need && acc_host_is(r, host) &&
		    !fnmatch(r->pattern, dev, 0))
			return true;
	}
	return false;
}

unsigned rnbd_access_lines(const struct rnbd_access *a)
{
	return a ? a->lines : 0;
}
