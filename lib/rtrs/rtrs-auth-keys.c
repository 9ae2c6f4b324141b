/* SPDX-License-Identifier: MIT */
/*
 * DH-HMAC-CHAP secrets and key files (docs/security.md section 2): the
 * DHHC-1 representation (checked, parsed, formatted, generated), secrets
 * read from files, the server's key file with one line per host, and its
 * reader thread, which reads the file when an authentication asks so that
 * a file that blocks stalls only that thread. The crypto is rtrs-auth.c.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include "log.h"
#include "util.h"
#include "rtrs-auth.h"

/* Key and key files are small; anything bigger is not one. */
#define AUTH_FILE_MAX (16u << 20) /* about 100,000 hosts with controller secrets */


bool rtrs_auth_key_len_valid(size_t len)
{
	return len == 32 || len == 48 || len == 64;
}

/*
 * Why a secret was refused, worded like nvme check-dhchap-key; the key file
 * parser prefixes which secret of the line it was.
 */
#define KEY_ERRORS(X)                                                \
	X(KERR_HEADER, "Invalid key header (want DHHC-1:<00..03>:)") \
	X(KERR_HMAC, "Invalid HMAC identifier")                      \
	X(KERR_COLON, "Missing the trailing ':'")                    \
	X(KERR_LENGTH, "Invalid key length")                         \
	X(KERR_BASE64, "Base64 decoding failed")                     \
	X(KERR_CRC, "CRC mismatch")                                  \
	X(KERR_TLS_HEADER, "Invalid key header (want NVMeTLSkey-1:<01|02>:)")

enum key_err {
	KERR_NONE = -1,
#define X(id, s) id,
	KEY_ERRORS(X)
#undef X
};

static const char *const key_why[] = {
#define X(id, s) s,
	KEY_ERRORS(X)
#undef X
};

static const char *const host_key_why[] = {
#define X(id, s) "host secret: " s,
	KEY_ERRORS(X)
#undef X
};

static const char *const ctrl_key_why[] = {
#define X(id, s) "controller secret: " s,
	KEY_ERRORS(X)
#undef X
};

static const char *const tls_key_why[] = {
#define X(id, s) "TLS key: " s,
	KEY_ERRORS(X)
#undef X
};

static int b64_value(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

/*
 * Decodes standard base64 with padding, strictly: length a multiple of 4,
 * at most two '=' and only at the end, unused bits zero (as the kernel's
 * base64_decode insists). EVP_DecodeBlock is lenient about all of these and
 * counts padding as decoded zero bytes, so the checks come first and the
 * real length is computed here. Returns the decoded length or -1.
 */
static int b64_decode(const char *s, size_t n, uint8_t *out, size_t out_max)
{
	uint8_t tmp[3 * ((RTRS_AUTH_MAX_KEY_LEN + 4 + 2) / 3)];
	size_t pad = 0;
	int got;

	if (n == 0 || n % 4 || n / 4 * 3 > sizeof(tmp))
		return -1;
	while (pad < 2 && s[n - 1 - pad] == '=')
		pad++;
	for (size_t i = 0; i < n - pad; i++)
		if (b64_value(s[i]) < 0)
			return -1;
	/* The bits the padding leaves over must be zero. */
	if (pad && (b64_value(s[n - 1 - pad]) & (pad == 1 ? 0x03 : 0x0f)))
		return -1;
	if (n / 4 * 3 - pad > out_max)
		return -1;
	got = EVP_DecodeBlock(tmp, (const unsigned char *)s, (int)n);
	if (got != (int)(n / 4 * 3)) {
		ERR_clear_error();
		OPENSSL_cleanse(tmp, sizeof(tmp));
		return -1;
	}
	got -= (int)pad;
	memcpy(out, tmp, (size_t)got);
	OPENSSL_cleanse(tmp, sizeof(tmp));
	return got;
}

/*
 * Parses s[0..n) (already trimmed): a DHHC-1 secret, or with tls an NVMe
 * TLS PSK in the interchange format ("NVMeTLSkey-1:<01|02>:...:", whose
 * hash id also fixes the length: 32 bytes for 01, 48 for 02). Fills the
 * CRCs when the string got that far, so a tool can report them; out is
 * wiped on any failure.
 */
static enum key_err key_parse_kind(const char *s, size_t n, bool tls, struct rtrs_auth_key *out,
				   uint32_t *crc_stored, uint32_t *crc_computed)
{
	const char *pfx = tls ? "NVMeTLSkey-1:" : "DHHC-1:";
	size_t pl = strlen(pfx);
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	uint32_t stored, computed;
	size_t b64_len;
	int got;

	memset(out, 0, sizeof(*out));
	/* prefix hh ":" base64 ":" */
	if (n < pl + 3 || memcmp(s, pfx, pl) || s[pl + 2] != ':' ||
	    !isxdigit((unsigned char)s[pl]) || !isxdigit((unsigned char)s[pl + 1]))
		return tls ? KERR_TLS_HEADER : KERR_HEADER;
	if (s[pl] != '0' || s[pl + 1] < (tls ? '1' : '0') || s[pl + 1] > (tls ? '2' : '3'))
		return KERR_HMAC;
	if (s[n - 1] != ':' || n == pl + 3)
		return KERR_COLON;
	b64_len = n - pl - 4;
	/* 36, 52 or 68 bytes encode to 48, 72 or 92 characters. */
	if (b64_len != 48 && b64_len != 72 && b64_len != 92)
		return memchr(s + pl + 3, ':', b64_len) ? KERR_BASE64 : KERR_LENGTH;
	got = b64_decode(s + pl + 3, b64_len, raw, sizeof(raw));
	if (got < 0)
		return KERR_BASE64;
	if (!rtrs_auth_key_len_valid((size_t)got - 4) ||
	    (tls && (size_t)got - 4 != (s[pl + 1] == '1' ? 32u : 48u))) {
		OPENSSL_cleanse(raw, sizeof(raw));
		return KERR_LENGTH;
	}
	got -= 4;
	stored = (uint32_t)raw[got] | (uint32_t)raw[got + 1] << 8 |
		 (uint32_t)raw[got + 2] << 16 | (uint32_t)raw[got + 3] << 24;
	computed = rtrs_auth_crc32(raw, (size_t)got);
	if (crc_stored)
		*crc_stored = stored;
	if (crc_computed)
		*crc_computed = computed;
	if (stored != computed) {
		OPENSSL_cleanse(raw, sizeof(raw));
		return KERR_CRC;
	}
	out->hmac = (uint8_t)(s[pl + 1] - '0');
	out->len = (uint8_t)got;
	memcpy(out->key, raw, (size_t)got);
	OPENSSL_cleanse(raw, sizeof(raw));
	return KERR_NONE;
}

static enum key_err key_parse(const char *s, size_t n, struct rtrs_auth_key *out,
			      uint32_t *crc_stored, uint32_t *crc_computed)
{
	return key_parse_kind(s, n, false, out, crc_stored, crc_computed);
}

static int key_err_errno(enum key_err e)
{
	if (e == KERR_NONE)
		return 0;
	return e == KERR_CRC ? -EKEYREJECTED : -EINVAL;
}

/* Trims whitespace off both ends of s[0..*n). */
static const char *trim(const char *s, size_t *n)
{
	while (*n && isspace((unsigned char)*s)) {
		s++;
		(*n)--;
	}
	while (*n && isspace((unsigned char)s[*n - 1]))
		(*n)--;
	return s;
}

static int key_check(const char *s, bool tls, struct rtrs_auth_key *out, uint32_t *crc_stored,
		     uint32_t *crc_computed, const char **why)
{
	enum key_err e;
	size_t n;

	if (crc_stored)
		*crc_stored = 0;
	if (crc_computed)
		*crc_computed = 0;
	if (!s || !out)
		REJECT(-EINVAL, "no secret");
	n = strlen(s);
	s = trim(s, &n);
	e = key_parse_kind(s, n, tls, out, crc_stored, crc_computed);
	if (e != KERR_NONE)
		REJECT(key_err_errno(e), key_why[e]);
	return 0;
}

int rtrs_auth_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
			uint32_t *crc_computed, const char **why)
{
	return key_check(s, false, out, crc_stored, crc_computed, why);
}

int rtrs_auth_key_parse(const char *s, struct rtrs_auth_key *out, const char **why)
{
	return rtrs_auth_key_check(s, out, NULL, NULL, why);
}

int rtrs_tls_key_check(const char *s, struct rtrs_auth_key *out, uint32_t *crc_stored,
		       uint32_t *crc_computed, const char **why)
{
	return key_check(s, true, out, crc_stored, crc_computed, why);
}

/* k as PREFIX<hh>:<base64(key || crc32_le(key))>: into buf; k is checked by the caller. */
static int key_format(const struct rtrs_auth_key *k, const char *prefix, char *buf, size_t len)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN + 4];
	char b64[4 * ((sizeof(raw) + 2) / 3) + 1];
	uint32_t crc;
	int n;

	crc = rtrs_auth_crc32(k->key, k->len);
	memcpy(raw, k->key, k->len);
	raw[k->len] = (uint8_t)crc;
	raw[k->len + 1] = (uint8_t)(crc >> 8);
	raw[k->len + 2] = (uint8_t)(crc >> 16);
	raw[k->len + 3] = (uint8_t)(crc >> 24);
	EVP_EncodeBlock((unsigned char *)b64, raw, k->len + 4);
	OPENSSL_cleanse(raw, sizeof(raw));
	n = snprintf(buf, len, "%s%02x:%s:", prefix, k->hmac, b64);
	OPENSSL_cleanse(b64, sizeof(b64));
	if (n < 0 || (size_t)n >= len) {
		if (len)
			OPENSSL_cleanse(buf, len);
		return -ENOSPC;
	}
	return 0;
}

int rtrs_tls_key_format(const struct rtrs_auth_key *k, char *buf, size_t len)
{
	if (!k || !buf || !((k->hmac == 1 && k->len == 32) || (k->hmac == 2 && k->len == 48)))
		return -EINVAL;
	return key_format(k, "NVMeTLSkey-1:", buf, len);
}

int rtrs_auth_key_format(const struct rtrs_auth_key *k, char *buf, size_t len)
{
	if (!k || !buf || k->hmac > RTRS_AUTH_HASH_SHA512 || !rtrs_auth_key_len_valid(k->len))
		return -EINVAL;
	return key_format(k, "DHHC-1:", buf, len);
}

int rtrs_auth_key_generate(unsigned hmac_id, size_t len, const uint8_t *secret, const char *nqn,
			   struct rtrs_auth_key *out)
{
	uint8_t raw[RTRS_AUTH_MAX_KEY_LEN];
	int rc = 0;

	if (!out || hmac_id > RTRS_AUTH_HASH_SHA512 || !rtrs_auth_key_len_valid(len))
		return -EINVAL;
	memset(out, 0, sizeof(*out));
	if (secret)
		memcpy(raw, secret, len);
	else
		rc = rtrs_auth_random(raw, len);
	if (rc)
		return rc;
	if (hmac_id && nqn) {
		/* nvme-cli 2.x: the stored secret is already transformed once. */
		struct rtrs_auth_key k = { .hmac = (uint8_t)hmac_id, .len = (uint8_t)len };
		size_t out_len = 0;

		memcpy(k.key, raw, len);
		rc = rtrs_auth_transform(&k, nqn, out->key, &out_len);
		rtrs_auth_wipe(&k, sizeof(k));
		out->len = (uint8_t)out_len;
	} else {
		memcpy(out->key, raw, len);
		out->len = (uint8_t)len;
	}
	out->hmac = (uint8_t)hmac_id;
	OPENSSL_cleanse(raw, sizeof(raw));
	if (rc)
		rtrs_auth_wipe(out, sizeof(*out));
	return rc;
}


/*
 * Reads a whole small file into a NUL-terminated buffer that the caller
 * wipes and frees (free_secret). Warns when others may read it. Grows by
 * copying, not realloc, so no stale copy of a secret is left on the heap.
 * Only a regular file: a FIFO or a device is refused before it is opened.
 */
static int read_secret_file(const char *path, char **out, size_t *out_len, const char **why)
{
	size_t cap = 4096, len = 0;
	char *buf = NULL;
	struct stat st;
	int fd, rc = 0;

	/* Only a regular file is opened: a FIFO or a device named by mistake is not. */
	fd = open_regular(path, &st);
	if (fd == -EISDIR)
		REJECT(-EISDIR, "the key file is a directory");
	if (fd == -EINVAL)
		REJECT(-EINVAL, "the key file is not a regular file");
	if (fd < 0)
		REJECT(fd, "cannot open the key file");
	if (st.st_mode & (S_IRGRP | S_IROTH))
		log_warn_rl("auth: key file %s is readable by group or others "
			    "(it holds secrets: chmod 600)", path);
	if (st.st_size > 0 && (uint64_t)st.st_size < AUTH_FILE_MAX)
		cap = (size_t)st.st_size + 2; /* its bytes, room to see EOF, the NUL */
	buf = malloc(cap);
	if (!buf) {
		close(fd);
		REJECT(-ENOMEM, "out of memory");
	}
	for (;;) {
		ssize_t r;

		if (len + 1 == cap) {
			char *nb;

			if (cap >= AUTH_FILE_MAX) {
				rc = -EFBIG;
				if (why)
					*why = "the key file is too large";
				break;
			}
			nb = malloc(cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				if (why)
					*why = "out of memory";
				break;
			}
			memcpy(nb, buf, len);
			OPENSSL_cleanse(buf, cap);
			free(buf);
			buf = nb;
			cap *= 2;
		}
		r = read(fd, buf + len, cap - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = -errno;
			if (why)
				*why = "cannot read the key file";
			break;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	if (rc) {
		OPENSSL_cleanse(buf, cap);
		free(buf);
		return rc;
	}
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
	return 0;
}

static void free_secret(char *buf, size_t len)
{
	if (buf) {
		OPENSSL_cleanse(buf, len);
		free(buf);
	}
}

/*
 * Next line of buf: *p moves past it; returns the line trimmed (length in
 * *n), or NULL at the end. Blank lines and '#' comments come back empty.
 */
static const char *next_line(const char **p, const char *end, size_t *n)
{
	const char *s = *p, *nl;

	if (s >= end)
		return NULL;
	nl = memchr(s, '\n', (size_t)(end - s));
	*n = (size_t)((nl ? nl : end) - s);
	*p = nl ? nl + 1 : end;
	s = trim(s, n);
	if (*n && *s == '#')
		*n = 0;
	return s;
}

static int key_load(const char *arg, bool tls, struct rtrs_auth_key *out, const char **why)
{
	const char *path = NULL, *p, *end, *l;
	char *buf = NULL;
	size_t len, n;
	int rc;

	if (!arg || !out)
		REJECT(-EINVAL, "no secret");
	memset(out, 0, sizeof(*out));
	if (arg[0] == '@')
		path = arg + 1;
	else if (!strncmp(arg, "file:", 5))
		path = arg + 5;
	if (!path)
		return tls ? rtrs_tls_key_check(arg, out, NULL, NULL, why) :
			     rtrs_auth_key_parse(arg, out, why);
	if (!*path)
		REJECT(-EINVAL, "empty key file name");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	p = buf;
	end = buf + len;
	rc = -ENOKEY;
	if (why)
		*why = "the key file holds no secret";
	while ((l = next_line(&p, end, &n))) {
		enum key_err e;

		if (!n)
			continue;
		e = key_parse_kind(l, n, tls, out, NULL, NULL);
		rc = key_err_errno(e);
		if (rc && why)
			*why = key_why[e];
		break;
	}
	free_secret(buf, len);
	return rc;
}

int rtrs_auth_key_load(const char *arg, struct rtrs_auth_key *out, const char **why)
{
	return key_load(arg, false, out, why);
}

int rtrs_tls_key_load(const char *arg, struct rtrs_auth_key *out, const char **why)
{
	return key_load(arg, true, out, why);
}

/* Splits the next whitespace-separated field off s[0..*n). */
static const char *next_field(const char **s, const char *end, size_t *n)
{
	const char *f = *s;

	while (f < end && isspace((unsigned char)*f))
		f++;
	if (f == end)
		return NULL;
	*s = f;
	while (*s < end && !isspace((unsigned char)**s))
		(*s)++;
	*n = (size_t)(*s - f);
	return f;
}

/*
 * One non-blank line of a server key file:
 * "<host> <host secret> [<ctrl secret>] [tls=<TLS PSK>]".
 * Sets *match when it is host's line, and then fills hkey, ckey and tkey
 * (tkey may be NULL).
 */
static int keyfile_line(const char *l, size_t n, const char *host, size_t host_len,
			bool *match, const char **name, size_t *name_len,
			struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey,
			struct rtrs_auth_key *tkey, const char **why)
{
	const char *f[5], *p = l, *end = l + n;
	size_t fl[5];
	unsigned nf = 0;
	bool have_c = false, have_t = false;
	enum key_err e;

	while (nf < 5 && (f[nf] = next_field(&p, end, &fl[nf])))
		nf++;
	if (nf < 2)
		REJECT(-EINVAL, "missing the host secret");
	if (nf > 4)
		REJECT(-EINVAL, "too many fields");
	if (fl[0] > RTRS_AUTH_NAME_MAX)
		REJECT(-EINVAL, "host name too long");
	*match = fl[0] == host_len && !memcmp(f[0], host, host_len);
	*name = f[0];
	*name_len = fl[0];
	memset(ckey, 0, sizeof(*ckey));
	if (tkey)
		memset(tkey, 0, sizeof(*tkey));
	e = key_parse(f[1], fl[1], hkey, NULL, NULL);
	if (e != KERR_NONE)
		REJECT(-EINVAL, host_key_why[e]);
	for (unsigned i = 2; i < nf; i++) {
		if (fl[i] > 4 && !memcmp(f[i], "tls=", 4)) {
			struct rtrs_auth_key t;

			if (have_t)
				REJECT(-EINVAL, "two TLS keys");
			have_t = true;
			e = key_parse_kind(f[i] + 4, fl[i] - 4, true, &t, NULL, NULL);
			if (e == KERR_NONE && tkey)
				*tkey = t;
			rtrs_auth_wipe(&t, sizeof(t));
			if (e != KERR_NONE)
				REJECT(-EINVAL, tls_key_why[e]);
			continue;
		}
		if (have_c || have_t)
			REJECT(-EINVAL, have_c ? "too many fields" :
					"the controller secret comes before tls=");
		have_c = true;
		e = key_parse(f[i], fl[i], ckey, NULL, NULL);
		if (e != KERR_NONE)
			REJECT(-EINVAL, ctrl_key_why[e]);
	}
	return 0;
}

/*
 * A key file parsed whole: its host lines in file order (v) and sorted by
 * name (by_name), so that a lookup is a binary search and a host listed
 * twice is found by one sort, not by comparing every pair: a NEGOTIATE
 * costs the same with ten thousand hosts in the file as with ten.
 */
struct kf_ent {
	const char *name;           /* into names, NUL-terminated */
	size_t len;
	unsigned line;
	struct rtrs_auth_key h, c, t;
};

struct kf_index {
	struct kf_ent *v;
	struct kf_ent **by_name;
	size_t n;
	char *names;
};

static void kf_index_free(struct kf_index *ix)
{
	if (ix->v) {
		OPENSSL_cleanse(ix->v, ix->n * sizeof(*ix->v));
		free(ix->v);
	}
	free(ix->by_name);
	free(ix->names);
	memset(ix, 0, sizeof(*ix));
}

static int name_cmp(const char *a, size_t al, const char *b, size_t bl)
{
	int c = memcmp(a, b, al < bl ? al : bl);

	return c ? c : (al > bl) - (al < bl);
}

/* By name, then by line: a name's later lines follow its first. */
static int kf_ent_cmp(const void *pa, const void *pb)
{
	const struct kf_ent *a = *(const struct kf_ent *const *)pa;
	const struct kf_ent *b = *(const struct kf_ent *const *)pb;
	int c = name_cmp(a->name, a->len, b->name, b->len);

	return c ? c : (a->line > b->line) - (a->line < b->line);
}

/* By name alone: a lookup's probe against the sorted entries. */
static int kf_ent_cmp_name(const void *pa, const void *pb)
{
	const struct kf_ent *a = *(const struct kf_ent *const *)pa;
	const struct kf_ent *b = *(const struct kf_ent *const *)pb;

	return name_cmp(a->name, a->len, b->name, b->len);
}

/*
 * Parses every line of buf[0..len) into ix. On -EINVAL *line is the first
 * line at fault: one that does not parse, or the second listing of a host.
 */
static int kf_index_build(const char *buf, size_t len, struct kf_index *ix, unsigned *line,
			  const char **why)
{
	const char *p = buf, *end = buf + len, *l;
	struct kf_ent e = { 0 };
	size_t n, cap = 0, used = 0;
	unsigned lineno = 0, bad = 0, dup = 0;
	int rc = 0;

	memset(ix, 0, sizeof(*ix));
	if (line)
		*line = 0;
	/* Each name is followed by a separator in its line: len + 1 holds them all. */
	ix->names = malloc(len + 1);
	if (!ix->names)
		REJECT(-ENOMEM, "out of memory");
	while ((l = next_line(&p, end, &n))) {
		const char *name;
		bool match;

		lineno++;
		if (!n)
			continue;
		rc = keyfile_line(l, n, "", 0, &match, &name, &e.len, &e.h, &e.c, &e.t, why);
		if (rc) {
			bad = lineno;
			break;
		}
		if (ix->n == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			struct kf_ent *v = malloc(ncap * sizeof(*v));

			if (!v) {
				rc = -ENOMEM;
				if (why)
					*why = "out of memory";
				break;
			}
			if (ix->v) {
				memcpy(v, ix->v, ix->n * sizeof(*v));
				OPENSSL_cleanse(ix->v, ix->n * sizeof(*v));
				free(ix->v);
			}
			ix->v = v;
			cap = ncap;
		}
		memcpy(ix->names + used, name, e.len);
		ix->names[used + e.len] = '\0';
		e.name = ix->names + used;
		e.line = lineno;
		used += e.len + 1;
		ix->v[ix->n++] = e;
	}
	OPENSSL_cleanse(&e, sizeof(e));
	if (rc != -ENOMEM && ix->n) {
		ix->by_name = malloc(ix->n * sizeof(*ix->by_name));
		if (!ix->by_name) {
			rc = -ENOMEM;
			if (why)
				*why = "out of memory";
		} else {
			for (size_t i = 0; i < ix->n; i++)
				ix->by_name[i] = &ix->v[i];
			qsort(ix->by_name, ix->n, sizeof(*ix->by_name), kf_ent_cmp);
			for (size_t i = 1; i < ix->n; i++) {
				const struct kf_ent *x = ix->by_name[i - 1], *y = ix->by_name[i];

				if (!name_cmp(x->name, x->len, y->name, y->len) &&
				    (!dup || y->line < dup))
					dup = y->line;
			}
		}
	}
	/* The lines before a bad one were all read: a host twice among them comes first. */
	if (dup && rc != -ENOMEM && (!bad || dup < bad)) {
		rc = -EINVAL;
		bad = dup;
		if (why)
			*why = "host listed twice";
	}
	if (rc) {
		if (line && rc == -EINVAL)
			*line = bad;
		kf_index_free(ix);
	}
	return rc;
}

/* host's keys from a built index; host NULL asks only whether it lists any. */
static int kf_index_find(const struct kf_index *ix, const char *host, struct rtrs_auth_key *hkey,
			 struct rtrs_auth_key *ckey, const char **why)
{
	struct kf_ent key, *kp = &key, **hit;

	memset(hkey, 0, sizeof(*hkey));
	if (ckey)
		memset(ckey, 0, sizeof(*ckey));
	if (!ix->n)
		REJECT(host ? -ESRCH : -ENOKEY, "the key file lists no host");
	if (!host)
		return 0;
	key.name = host;
	key.len = strlen(host);
	key.line = 0;
	hit = bsearch(&kp, ix->by_name, ix->n, sizeof(*ix->by_name), kf_ent_cmp_name);
	if (!hit)
		REJECT(-ESRCH, "host not in the key file");
	*hkey = (*hit)->h;
	if (ckey)
		*ckey = (*hit)->c;
	return 0;
}

/*
 * A lookup's start: *line 0, the keys zeroed; -EINVAL without a key to
 * fill or for a host name no key file line can hold.
 */
static int lookup_start(const char *host, struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey,
			unsigned *line, const char **why)
{
	size_t n = host ? strlen(host) : 0;

	if (line)
		*line = 0;
	if (!hkey)
		REJECT(-EINVAL, "no key to fill");
	memset(hkey, 0, sizeof(*hkey));
	if (ckey)
		memset(ckey, 0, sizeof(*ckey));
	if (host && (!n || n > RTRS_AUTH_NAME_MAX))
		REJECT(-EINVAL, "bad host name");
	return 0;
}

int rtrs_auth_keyfile_parse(const char *buf, size_t len, const char *host,
			    struct rtrs_auth_key *hkey, struct rtrs_auth_key *ckey, unsigned *line,
			    const char **why)
{
	struct kf_index ix;
	int rc = lookup_start(host, hkey, ckey, line, why);

	if (rc)
		return rc;
	/*
	 * Every line is checked, not just up to the host's: a typo anywhere is
	 * reported at once rather than when that host first connects, and a
	 * host listed twice is an error rather than a matter of line order.
	 */
	rc = kf_index_build(buf, len, &ix, line, why);
	if (rc)
		return rc;
	rc = kf_index_find(&ix, host, hkey, ckey, why);
	kf_index_free(&ix);
	return rc;
}

int rtrs_auth_keyfile_lookup(const char *path, const char *host, struct rtrs_auth_key *hkey,
			     struct rtrs_auth_key *ckey, unsigned *line, const char **why)
{
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (line)
		*line = 0;
	if (!path)
		REJECT(-EINVAL, "no key file");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	rc = rtrs_auth_keyfile_parse(buf, len, host, hkey, ckey, line, why);
	free_secret(buf, len);
	return rc;
}

int rtrs_auth_keyfile_each(const char *path,
			   int (*fn)(void *arg, const char *host, size_t host_len,
				     const struct rtrs_auth_key *hkey,
				     const struct rtrs_auth_key *tkey),
			   void *arg, unsigned *line, const char **why)
{
	struct kf_index ix;
	char *buf = NULL;
	size_t len = 0;
	int rc;

	if (line)
		*line = 0;
	if (!path || !fn)
		REJECT(-EINVAL, "no key file");
	rc = read_secret_file(path, &buf, &len, why);
	if (rc)
		return rc;
	rc = kf_index_build(buf, len, &ix, line, why);
	free_secret(buf, len);
	if (rc)
		return rc;
	for (size_t i = 0; i < ix.n && !rc; i++)
		rc = fn(arg, ix.v[i].name, ix.v[i].len, &ix.v[i].h, &ix.v[i].t);
	kf_index_free(&ix);
	return rc;
}

/*
 * The server's key file, read on a thread of its own: a file that blocks
 * (a hung network file system) then stalls that thread only. A lookup asks
 * for a read that starts after it asked (so a key changed in the file
 * counts from the next connection) and waits for it a bounded time. The
 * reader holds a reference: if it is stuck when the owner lets go, the
 * last one to leave frees the object.
 */
struct rtrs_keyfile {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned refs;              /* the owner's and the reader's */
	bool stop;
	uint64_t asked, done;       /* read generations */
	struct kf_index ix;         /* the last read, parsed (secrets; its text is wiped) */
	int err;                    /* ... or why it failed */
	unsigned line;              /* with -EINVAL: the line at fault */
	const char *why;
	bool parsed;                /* ix/err are those of the text whose text_sum is sum */
	uint64_t sum[3];
	char path[];
};

/*
 * Whether a key file's text changed since it was parsed: its length and two
 * unrelated 64-bit hashes (FNV-1a, and a multiply-xorshift one), 2^-128
 * odds of an edit going unseen. Not OpenSSL's SHA-256: the reader thread
 * then never touches OpenSSL's per-thread state (an error state that a
 * detached thread racing the process's exit was reported to leak).
 */
static void text_sum(const char *buf, size_t len, uint64_t sum[3])
{
	uint64_t a = 0xcbf29ce484222325ull, b = 0x243f6a8885a308d3ull;

	for (size_t i = 0; i < len; i++) {
		a = (a ^ (uint8_t)buf[i]) * 0x100000001b3ull;
		b = (b ^ (uint8_t)buf[i]) * 0x9e3779b97f4a7c15ull;
		b ^= b >> 29;
	}
	sum[0] = len;
	sum[1] = a;
	sum[2] = b;
}

static void keyfile_unref(struct rtrs_keyfile *kf)
{
	bool last;

	pthread_mutex_lock(&kf->lock);
	last = --kf->refs == 0;
	pthread_mutex_unlock(&kf->lock);
	if (!last)
		return;
	kf_index_free(&kf->ix);
	pthread_cond_destroy(&kf->cond);
	pthread_mutex_destroy(&kf->lock);
	free(kf);
}

static void *keyfile_reader(void *arg)
{
	struct rtrs_keyfile *kf = arg;

	pthread_setname_np(pthread_self(), "rtrs-keyfile");
	pthread_mutex_lock(&kf->lock);
	for (;;) {
		while (!kf->stop && kf->done == kf->asked)
			pthread_cond_wait(&kf->cond, &kf->lock);
		if (kf->stop)
			break;
		uint64_t gen = kf->asked;
		const char *why = NULL;
		struct kf_index ix = { 0 };
		unsigned line = 0;
		uint64_t sum[3];
		bool same = false, got = false;
		char *buf = NULL;
		size_t len = 0;
		int rc;

		pthread_mutex_unlock(&kf->lock);
		/*
		 * Read every time; parsed here, once per read however many lookups
		 * wait for it, and only when the text changed: a storm of opens
		 * against a file of thousands of hosts costs a read and a hash each.
		 */
		rc = read_secret_file(kf->path, &buf, &len, &why);
		if (!rc) {
			got = true;
			text_sum(buf, len, sum);
			/* The reader alone writes parsed and sum: no lock to read them. */
			same = kf->parsed && !memcmp(sum, kf->sum, sizeof(kf->sum));
			if (!same)
				rc = kf_index_build(buf, len, &ix, &line, &why);
			free_secret(buf, len);
		}
		pthread_mutex_lock(&kf->lock);
		if (!same) {
			kf_index_free(&kf->ix);
			kf->ix = ix;
			kf->err = rc;
			kf->line = line;
			kf->why = why;
			/* A read that failed is not cached: the next one tries again. */
			kf->parsed = got && (rc == 0 || rc == -EINVAL);
			if (kf->parsed)
				memcpy(kf->sum, sum, sizeof(kf->sum));
		}
		kf->done = gen;
		pthread_cond_broadcast(&kf->cond);
	}
	pthread_mutex_unlock(&kf->lock);
	keyfile_unref(kf);
	return NULL;
}

int rtrs_keyfile_new(const char *path, struct rtrs_keyfile **out)
{
	size_t n = path ? strlen(path) : 0;
	struct rtrs_keyfile *kf;
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	if (!n)
		return -EINVAL;
	kf = calloc(1, sizeof(*kf) + n + 1);
	if (!kf)
		return -ENOMEM;
	memcpy(kf->path, path, n + 1);
	pthread_mutex_init(&kf->lock, NULL);
	cond_init_mono(&kf->cond);
	kf->refs = 2;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = -pthread_create(&t, &attr, keyfile_reader, kf);
	pthread_attr_destroy(&attr);
	if (rc) {
		pthread_cond_destroy(&kf->cond);
		pthread_mutex_destroy(&kf->lock);
		free(kf);
		return rc;
	}
	*out = kf;
	return 0;
}

void rtrs_keyfile_free(struct rtrs_keyfile *kf)
{
	if (!kf)
		return;
	pthread_mutex_lock(&kf->lock);
	kf->stop = true;
	pthread_cond_broadcast(&kf->cond);
	pthread_mutex_unlock(&kf->lock);
	keyfile_unref(kf);
}

const char *rtrs_keyfile_path(const struct rtrs_keyfile *kf)
{
	return kf->path;
}

int rtrs_keyfile_lookup(struct rtrs_keyfile *kf, const char *host, struct rtrs_auth_key *hkey,
			struct rtrs_auth_key *ckey, unsigned *line, const char **why)
{
	struct timespec dl = deadline_ms(RTRS_KEYFILE_WAIT_MS);
	uint64_t want;
	int rc = lookup_start(host, hkey, ckey, line, why), w = 0;

	if (rc)
		return rc;
	pthread_mutex_lock(&kf->lock);
	want = ++kf->asked;
	pthread_cond_broadcast(&kf->cond);
	while (kf->done < want && w != ETIMEDOUT)
		w = pthread_cond_timedwait(&kf->cond, &kf->lock, &dl);
	if (kf->done < want) {
		rc = -ETIMEDOUT;
		if (why)
			*why = "reading the key file did not finish in time";
	} else if (kf->err) {
		rc = kf->err;
		if (why)
			*why = kf->why;
		if (line && rc == -EINVAL)
			*line = kf->line;
	} else {
		rc = kf_index_find(&kf->ix, host, hkey, ckey, why);
	}
	pthread_mutex_unlock(&kf->lock);
	return rc;
}
