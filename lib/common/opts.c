/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "util.h"

static unsigned table_len(const struct opt *t)
{
	unsigned n = 0;

	while (t[n].name)
		n++;
	return n;
}

static void print_default(const struct opt *o)
{
	switch (o->type) {
	case OPT_UINT:
	case OPT_SIZE:
		printf(" (default %" PRIu64 ")", *(uint64_t *)o->ptr);
		break;
	case OPT_STRING:
		if (*(const char **)o->ptr)
			printf(" (default %s)", *(const char **)o->ptr);
		break;
	case OPT_CHOICE:
		printf(" (default %s)", o->choices[*(unsigned *)o->ptr]);
		break;
	default:
		break;
	}
}

void opts_help(const struct opt *t, const char *prog, const char *usage)
{
	printf("Usage: %s %s\n\nOptions:\n", prog, usage);
	for (unsigned i = 0; t[i].name; i++) {
		const struct opt *o = &t[i];
		char lhs[64];

		if (o->short_name)
			snprintf(lhs, sizeof(lhs), "-%c, --%s%s%s", o->short_name, o->name,
				 o->arg ? " " : "", o->arg ? o->arg : "");
		else
			snprintf(lhs, sizeof(lhs), "    --%s%s%s", o->name, o->arg ? " " : "",
				 o->arg ? o->arg : "");
		printf("  %-30s %s", lhs, o->help);
		if (o->type == OPT_CHOICE) {
			printf(" [");
			for (unsigned c = 0; o->choices[c]; c++)
				printf("%s%s", c ? "|" : "", o->choices[c]);
			printf("]");
		}
		print_default(o);
		printf("\n");
	}
	printf("  %-30s %s\n", "-h, --help", "show this help");
}

static int set_opt(const struct opt *o, const char *prog, const char *arg)
{
	uint64_t v;
	int rc;

	switch (o->type) {
	case OPT_FLAG:
		*(bool *)o->ptr = true;
		return 0;
	case OPT_UINT:
		rc = parse_u64(arg, o->min, o->max, &v);
		if (rc) {
			fprintf(stderr, "%s: --%s %s: expected a number in %" PRIu64 "..%" PRIu64 "\n",
				prog, o->name, arg, o->min, o->max);
			return -EINVAL;
		}
		*(uint64_t *)o->ptr = v;
		return 0;
	case OPT_SIZE:
		rc = parse_size(arg, o->min, o->max, &v);
		if (rc) {
			fprintf(stderr, "%s: --%s %s: expected a size (K/M/G) in %" PRIu64 "..%" PRIu64 "\n",
				prog, o->name, arg, o->min, o->max);
			return -EINVAL;
		}
		*(uint64_t *)o->ptr = v;
		return 0;
	case OPT_STRING:
		*(const char **)o->ptr = arg;
		return 0;
	case OPT_CHOICE:
		for (unsigned c = 0; o->choices[c]; c++) {
			if (!strcmp(o->choices[c], arg)) {
				*(unsigned *)o->ptr = c;
				return 0;
			}
		}
		fprintf(stderr, "%s: --%s %s: not one of", prog, o->name, arg);
		for (unsigned c = 0; o->choices[c]; c++)
			fprintf(stderr, " %s", o->choices[c]);
		fprintf(stderr, "\n");
		return -EINVAL;
	case OPT_LIST: {
		struct opt_list *l = o->ptr;
		const char **n = realloc(l->items, (l->n + 1) * sizeof(*n));

		if (!n)
			return -ENOMEM;
		n[l->n++] = arg;
		l->items = n;
		return 0;
	}
	}
	return -EINVAL;
}

int opts_parse(const struct opt *t, const char *prog, const char *usage, int argc,
	       char **argv, int *first_pos)
{
	unsigned n = table_len(t);
	struct option *lo = calloc(n + 2, sizeof(*lo));
	char *so = calloc(2 * n + 3, 1);
	char *sp = so;
	int rc = 0;

	if (!lo || !so) {
		free(lo);
		free(so);
		return -ENOMEM;
	}
	*sp++ = '+';
	*sp++ = 'h';
	for (unsigned i = 0; i < n; i++) {
		lo[i].name = t[i].name;
		lo[i].has_arg = t[i].type == OPT_FLAG ? no_argument : required_argument;
		lo[i].val = 256 + (int)i;
		if (t[i].short_name) {
			*sp++ = t[i].short_name;
			if (t[i].type != OPT_FLAG)
				*sp++ = ':';
		}
	}
	lo[n] = (struct option){ "help", no_argument, NULL, 'h' };
	optind = 0; /* 0, not 1: glibc then also forgets a half-parsed -abc */
	opterr = 0;
	for (;;) {
		int c = getopt_long(argc, argv, so, lo, NULL);
		const struct opt *o = NULL;

		if (c == -1)
			break;
		if (c == 'h') {
			opts_help(t, prog, usage);
			rc = 1;
			break;
		}
		if (c >= 256) {
			o = &t[c - 256];
		} else {
			for (unsigned i = 0; i < n; i++)
				if (t[i].short_name && t[i].short_name == c)
					o = &t[i];
		}
		if (!o) {
			if (optopt >= 256 || (optopt == 0 && optind > 0))
				fprintf(stderr, "%s: %s: unknown option or missing argument (see --help)\n",
					prog, argv[optind - 1]);
			else
				fprintf(stderr, "%s: -%c: unknown option or missing argument (see --help)\n",
					prog, optopt);
			rc = -EINVAL;
			break;
		}
		rc = set_opt(o, prog, optarg);
		if (rc)
			break;
	}
	*first_pos = optind;
	free(lo);
	free(so);
	return rc;
}

/*
 * Values read from config files, kept for the life of the process (options
 * point at them); held here so that they stay reachable.
 */
static char **kept;
static size_t nkept;

static char *keep_value(const char *val)
{
	char **grown = realloc(kept, (nkept + 1) * sizeof(*kept));
	char *copy;

	if (!grown)
		return NULL;
	kept = grown;
	copy = strdup(val);
	if (copy)
		kept[nkept++] = copy;
	return copy;
}

static char *trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
		*--e = '\0';
	return s;
}

int opts_parse_file(const struct opt *t, const char *prog, const char *path)
{
	FILE *f = fopen(path, "r");
	char line[4096], where[4200];
	unsigned lineno = 0;
	int rc = 0;

	if (!f) {
		rc = -errno;
		fprintf(stderr, "%s: config file %s: %s\n", prog, path, strerror(-rc));
		return rc;
	}
	while (!rc && fgets(line, sizeof(line), f)) {
		char *name, *val, *hash = strchr(line, '#');
		const struct opt *o = NULL;
		size_t len;

		lineno++;
		if (!strchr(line, '\n') && !feof(f)) {
			fprintf(stderr, "%s: %s:%u: line too long\n", prog, path, lineno);
			rc = -EINVAL;
			break;
		}
		if (hash)
			*hash = '\0';
		name = trim(line);
		if (!*name)
			continue;
		len = strcspn(name, " \t=");
		val = name + len;
		if (*val) {
			*val++ = '\0';
			val = trim(val);
			if (*val == '=')
				val = trim(val + 1);
		}
		for (unsigned i = 0; t[i].name && !o; i++)
			if (!strcmp(t[i].name, name))
				o = &t[i];
		snprintf(where, sizeof(where), "%s: %s:%u", prog, path, lineno);
		if (!o) {
			fprintf(stderr, "%s: unknown option \"%s\"\n", where, name);
			rc = -EINVAL;
		} else if (o->type == OPT_FLAG && *val) {
			fprintf(stderr, "%s: %s takes no value\n", where, name);
			rc = -EINVAL;
		} else if (o->type != OPT_FLAG && !*val) {
			fprintf(stderr, "%s: %s needs a value\n", where, name);
			rc = -EINVAL;
		} else if (o->type == OPT_STRING || o->type == OPT_LIST) {
			/* The option keeps pointing at the value. */
			char *keep = keep_value(val);

			rc = keep ? set_opt(o, where, keep) : -ENOMEM;
		} else {
			rc = set_opt(o, where, val);
		}
	}
	fclose(f);
	return rc;
}

const char *opts_find(int argc, char **argv, const char *name, char short_name)
{
	size_t n = strlen(name);

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (!strcmp(a, "--"))
			break;
		if (!strncmp(a, "--", 2) && !strncmp(a + 2, name, n)) {
			if (a[2 + n] == '=')
				return a + 3 + n;
			if (!a[2 + n] && i + 1 < argc)
				return argv[i + 1];
		}
		if (short_name && a[0] == '-' && a[1] == short_name) {
			if (a[2])
				return a + 2;
			if (i + 1 < argc)
				return argv[i + 1];
		}
	}
	return NULL;
}
