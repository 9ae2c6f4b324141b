/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the config file parser (lib/common/opts.c,
 * opts_parse_text), against a table with every option type (the custom
 * one repeatable and secret). The input is
 * the file. Whatever it does:
 *
 *   - a refusal says where: "fuzz.conf:LINE: why", LINE within the file;
 *   - an accepted file leaves every value within its option's bounds:
 *     numbers in range, choices valid, strings and list items not empty and
 *     free of control characters;
 *   - the accepted values, written back as a config file (strings in
 *     quotes with \" and \\ escaped), parse again to the same values.
 *
 * The text is a heap copy of exactly the input plus the byte the parser
 * may write its terminator into, so ASan sees any read past it.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz-util.h"
#include "opts.h"

static const char *const colours[] = { "red", "green", "blue", NULL };

struct tags {
	const char *v[4];
	unsigned n;
};

struct vals {
	bool verbose, invalidate, no_color;
	uint64_t depth, size;
	const char *name, *config;
	unsigned colour;
	struct opt_list peers;
	struct tags tags;
};

/* OPT_CUSTOM, repeatable and secret: up to 4 words of lowercase letters. */
static int tag_set(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	struct tags *t = o->ptr;

	for (const char *p = arg; *p; p++)
		if (*p < 'a' || *p > 'z')
			return opts_errorf(err, errlen, -EINVAL, "expected lowercase letters");
	if (t->n == 4)
		return opts_errorf(err, errlen, -EINVAL, "at most 4 tags");
	t->v[t->n++] = arg;
	return 0;
}

static void table(struct opt *t, struct vals *v)
{
	const struct opt tab[] = {
		{ "verbose", 'v', OPT_FLAG, &v->verbose, .help = "h" },
		{ "invalidate", 0, OPT_FLAG, &v->invalidate, .help = "h" },
		{ "no-color", 0, OPT_FLAG, &v->no_color, .help = "h" },
		{ "depth", 'd', OPT_UINT, &v->depth, 1, 128, .arg = "N", .help = "h" },
		{ "size", 's', OPT_SIZE, &v->size, 512, 1ull << 40, .arg = "B", .help = "h" },
		{ "name", 'n', OPT_STRING, &v->name, .arg = "S", .help = "h" },
		{ "colour", 0, OPT_CHOICE, &v->colour, .choices = colours, .arg = "C", .help = "h" },
		{ "peer", 'p', OPT_LIST, &v->peers, .arg = "A", .help = "h" },
		{ "config", 'c', OPT_CONFIG, &v->config, .arg = "F", .help = "h" },
		{ "tag", 't', OPT_CUSTOM, &v->tags, .arg = "T", .help = "h", .set = tag_set,
		  .repeat = true, .secret = true },
		{ 0 },
	};

	memcpy(t, tab, sizeof(tab));
}

static void vals_init(struct vals *v)
{
	memset(v, 0, sizeof(*v));
	v->invalidate = true;
	v->depth = 5;
	v->size = 4096;
	v->colour = 1;
}

static bool clean_string(const char *s)
{
	if (!s || !*s)
		return false;
	for (; *s; s++)
		if (((unsigned char)*s < 0x20 && *s != '\t') || (unsigned char)*s == 0x7f)
			return false;
	return true;
}

/* A refusal names the file and a line the file has. */
static void check_refusal(const char *err, const uint8_t *data, size_t size)
{
	unsigned long line, lines = 1;
	char *end;

	for (size_t i = 0; i < size; i++)
		lines += data[i] == '\n';
	FAIL_IF(strncmp(err, "fuzz.conf:", 10) != 0);
	line = strtoul(err + 10, &end, 10);
	FAIL_IF(end == err + 10 || *end != ':');
	FAIL_IF(line < 1 || line > lines);
	FAIL_IF(strlen(end) < 3); /* ": " and a reason */
}

static void check_bounds(const struct vals *v)
{
	FAIL_IF(v->depth < 1 || v->depth > 128);
	FAIL_IF(v->size < 512 || v->size > 1ull << 40);
	FAIL_IF(v->colour > 2);
	FAIL_IF(v->name && !clean_string(v->name));
	FAIL_IF(v->config != NULL); /* files do not nest */
	for (unsigned i = 0; i < v->peers.n; i++)
		FAIL_IF(!clean_string(v->peers.items[i]));
	FAIL_IF(v->tags.n > 4);
	for (unsigned i = 0; i < v->tags.n; i++) {
		FAIL_IF(!v->tags.v[i][0]);
		for (const char *p = v->tags.v[i]; *p; p++)
			FAIL_IF(*p < 'a' || *p > 'z');
	}
}

/* Appends s to buf as a quoted config value. */
static size_t put_quoted(char *buf, size_t used, size_t cap, const char *s)
{
	if (used < cap)
		buf[used] = '"';
	used++;
	for (; *s; s++) {
		if (*s == '"' || *s == '\\') {
			if (used < cap)
				buf[used] = '\\';
			used++;
		}
		if (used < cap)
			buf[used] = *s;
		used++;
	}
	if (used < cap)
		buf[used] = '"';
	return used + 1;
}

static size_t put(char *buf, size_t used, size_t cap, const char *s)
{
	size_t n = strlen(s);

	if (used < cap)
		memcpy(buf + used, s, n < cap - used ? n : cap - used);
	return used + n;
}

/* The values as a config file; its length (the buffer is big enough). */
static size_t render(const struct vals *v, char *buf, size_t cap)
{
	char num[64];
	size_t used = 0;

	used = put(buf, used, cap, v->verbose ? "verbose\n" : "no-verbose\n");
	used = put(buf, used, cap, v->invalidate ? "invalidate = yes\n" : "invalidate off\n");
	used = put(buf, used, cap, v->no_color ? "no-color true\n" : "no-color false\n");
	snprintf(num, sizeof(num), "depth %llu\nsize=%llu\ncolour %s\n",
		 (unsigned long long)v->depth, (unsigned long long)v->size, colours[v->colour]);
	used = put(buf, used, cap, num);
	if (v->name) {
		used = put(buf, used, cap, "name ");
		used = put_quoted(buf, used, cap, v->name);
		used = put(buf, used, cap, "  # the name\n");
	}
	for (unsigned i = 0; i < v->peers.n; i++) {
		used = put(buf, used, cap, "peer = ");
		used = put_quoted(buf, used, cap, v->peers.items[i]);
		used = put(buf, used, cap, "\n");
	}
	for (unsigned i = 0; i < v->tags.n; i++) {
		used = put(buf, used, cap, "tag ");
		used = put(buf, used, cap, v->tags.v[i]);
		used = put(buf, used, cap, "\n");
	}
	return used;
}

static bool same(const struct vals *a, const struct vals *b)
{
	if (a->verbose != b->verbose || a->invalidate != b->invalidate ||
	    a->no_color != b->no_color || a->depth != b->depth || a->size != b->size ||
	    a->colour != b->colour || a->peers.n != b->peers.n || !a->name != !b->name)
		return false;
	if (a->name && strcmp(a->name, b->name))
		return false;
	for (unsigned i = 0; i < a->peers.n; i++)
		if (strcmp(a->peers.items[i], b->peers.items[i]))
			return false;
	if (a->tags.n != b->tags.n)
		return false;
	for (unsigned i = 0; i < a->tags.n; i++)
		if (strcmp(a->tags.v[i], b->tags.v[i]))
			return false;
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct opt t[11], t2[11];
	struct vals v, v2;
	char err[512], *text, *again;
	size_t cap, len;
	int rc;

	vals_init(&v);
	table(t, &v);
	text = malloc(size + 1);
	if (!text)
		abort();
	memcpy(text, data, size);
	rc = opts_parse_text(t, "fuzz.conf", text, size, err, sizeof(err));
	FAIL_IF(rc != 0 && rc != -EINVAL && rc != -ENOMEM);
	if (rc) {
		check_refusal(err, data, size);
	} else {
		check_bounds(&v);
		/* Written back and read again: the same values. */
		cap = 3 * size + 512;
		again = malloc(cap + 1);
		if (!again)
			abort();
		len = render(&v, again, cap);
		FAIL_IF(len > cap);
		vals_init(&v2);
		table(t2, &v2);
		rc = opts_parse_text(t2, "fuzz.conf", again, len, err, sizeof(err));
		if (rc)
			fprintf(stderr, "re-parse: %s\n", err);
		FAIL_IF(rc != 0);
		FAIL_IF(!same(&v, &v2));
		free(v2.peers.items);
		free(again);
	}
	free(v.peers.items);
	free(text);
	return 0;
}
