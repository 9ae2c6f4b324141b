/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opts.h"
#include "util.h"

/* A config file is a few dozen lines; anything this large is a wrong file. */
#define CONFIG_MAX (1u << 20)

/* getopt_long values: option i is OPT_VAL + i, its --no- form NEG_VAL + i. */
#define OPT_VAL 256
#define NEG_VAL 0x10000
#define VERSION_VAL 255 /* --version: below every option's value */

const char *opts_version(void)
{
	return RTRS_PROJECT_VERSION;
}

/* "PROG VERSION", with PROG's first word ("rtrs-key gen" is rtrs-key). */
static void version_print(const char *prog)
{
	printf("%.*s %s\n", (int)strcspn(prog, " "), prog, opts_version());
}

bool opts_version_arg(int argc, char **argv, const char *prog)
{
	if (argc < 2 || strcmp(argv[1], "--version"))
		return false;
	version_print(prog);
	return true;
}

static unsigned table_len(const struct opt *t)
{
	unsigned n = 0;

	while (t[n].name)
		n++;
	return n;
}

/* Flags get a --no-NAME form, unless their name is a negation already. */
static bool negatable(const struct opt *o)
{
	return o->type == OPT_FLAG && strncmp(o->name, "no-", 3) != 0;
}

int opts_errorf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return rc;
}

/* The default --help shows for o into buf ("" for none). */
static void default_str(const struct opt *o, char *buf, size_t len)
{
	buf[0] = 0;
	switch (o->type) {
	case OPT_FLAG:
		if (*(bool *)o->ptr)
			snprintf(buf, len, "on");
		break;
	case OPT_UINT:
	case OPT_SIZE:
		snprintf(buf, len, "%" PRIu64, *(uint64_t *)o->ptr);
		break;
	case OPT_STRING:
		if (*(const char **)o->ptr)
			snprintf(buf, len, "%s", *(const char **)o->ptr);
		break;
	case OPT_CHOICE:
		snprintf(buf, len, "%s", o->choices[*(unsigned *)o->ptr]);
		break;
	case OPT_CUSTOM:
		if (o->show)
			o->show(o, buf, len);
		break;
	default:
		break;
	}
}

void opts_man_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '*' || *s == '_' || *s == '\\')
			fputc('\\', f);
		fputc(*s, f);
	}
}

int opts_man_item(FILE *f, const char *term, const char *arg, const char *help, const char *dflt)
{
	/*
	 * The help starts a line of its own: roff takes a line that starts
	 * with '.' or '\'' as a request, which no escape of scdoc's keeps, so
	 * such a text is refused; scdoc itself reads a list, a table, a
	 * literal block or a comment into a line that starts with one of
	 * "-[]|`;", which a backslash keeps as text.
	 */
	if (*help == '.' || *help == '\'') {
		fprintf(stderr, "man page: the help of %s starts with '%c', which roff takes as a "
			"request\n", term, *help);
		return -EINVAL;
	}
	fputc('*', f);
	opts_man_text(f, term);
	fputc('*', f);
	if (arg && *arg) {
		/* "key=" takes its argument without a blank */
		fputs(term[0] && term[strlen(term) - 1] == '=' ? "_" : " _", f);
		opts_man_text(f, arg);
		fputc('_', f);
	}
	fputs("\n\t", f);
	/* Help texts start lower case, as --help has them; a man page's items are sentences. */
	if (*help >= 'a' && *help <= 'z') {
		fputc(*help - 'a' + 'A', f);
		help++;
	} else if (*help && strchr("-[]|`;", *help)) {
		fputc('\\', f);
	}
	opts_man_text(f, help);
	if (dflt && *dflt) {
		fputs(". Default: ", f);
		opts_man_text(f, dflt);
	}
	fputs(".\n\n", f);
	return 0;
}

/*
 * The table as scdoc(5) items for a man page: the options of the command
 * line, or (config) the names a config file takes. With no entry that is
 * not the config option itself, nothing.
 */
static int man_items(const struct opt *t, bool config)
{
	for (unsigned i = 0; t[i].name; i++) {
		const struct opt *o = &t[i];
		char term[96], help[1024], dflt[256];
		size_t used;

		if (config && o->type == OPT_CONFIG)
			continue;
		if (config)
			snprintf(term, sizeof(term), "%s%s", negatable(o) ? "[no-]" : "", o->name);
		else if (o->short_name)
			snprintf(term, sizeof(term), "-%c, --%s%s", o->short_name,
				 negatable(o) ? "[no-]" : "", o->name);
		else
			snprintf(term, sizeof(term), "--%s%s", negatable(o) ? "[no-]" : "", o->name);
		used = (size_t)snprintf(help, sizeof(help), "%s", o->help);
		if (o->type == OPT_CHOICE)
			for (unsigned c = 0; o->choices[c] && used < sizeof(help); c++)
				used += (size_t)snprintf(help + used, sizeof(help) - used, "%s%s",
							 c ? ", " : ": one of ", o->choices[c]);
		if (config && o->type == OPT_CUSTOM && o->repeat && used < sizeof(help))
			snprintf(help + used, sizeof(help) - used, " (may be given more than once)");
		default_str(o, dflt, sizeof(dflt));
		if (opts_man_item(stdout, term, config && o->type == OPT_FLAG ? "" : o->arg, help,
				  dflt))
			return -EINVAL;
	}
	return 0;
}

void opts_help(const struct opt *t, const char *prog, const char *usage)
{
	const char *fmt = getenv("RTRS_HELP_FORMAT");
	bool config = false;

	if (fmt && (!strcmp(fmt, "man") || !strcmp(fmt, "man-config"))) {
		/* The build makes the man page from this: a table it cannot use stops it. */
		if (man_items(t, !strcmp(fmt, "man-config")))
			exit(70);
		return;
	}
	printf("Usage: %s %s\n\nOptions:\n", prog, usage);
	for (unsigned i = 0; t[i].name; i++) {
		const struct opt *o = &t[i];
		const char *no = negatable(o) ? "[no-]" : "";
		char lhs[64], dflt[256];

		config |= o->type == OPT_CONFIG;
		if (o->short_name)
			snprintf(lhs, sizeof(lhs), "-%c, --%s%s%s%s", o->short_name, no, o->name,
				 o->arg ? " " : "", o->arg ? o->arg : "");
		else
			snprintf(lhs, sizeof(lhs), "    --%s%s%s%s", no, o->name, o->arg ? " " : "",
				 o->arg ? o->arg : "");
		printf("  %-30s %s", lhs, o->help);
		if (o->type == OPT_CHOICE) {
			printf(" [");
			for (unsigned c = 0; o->choices[c]; c++)
				printf("%s%s", c ? "|" : "", o->choices[c]);
			printf("]");
		}
		default_str(o, dflt, sizeof(dflt));
		if (dflt[0])
			printf(" (default %s)", dflt);
		printf("\n");
	}
	printf("  %-30s %s\n", "-h, --help", "show this help");
	printf("  %-30s %s\n", "--version", "show the version");
	if (config)
		printf("\nConfig file: one option per line, \"NAME VALUE\" or \"NAME = VALUE\"; a flag "
		       "as NAME,\nNAME false or no-NAME; '#' at the start of a line or after a blank "
		       "starts a\ncomment; a value in double quotes keeps blanks and '#' (\\\" and \\\\ "
		       "inside).\nThe command line wins over the file.\n");
}

/* Stores arg into o (not a flag); 0, or a negative errno with why in err. */
static int set_opt(const struct opt *o, const char *arg, char *err, size_t errlen)
{
	uint64_t v;

	switch (o->type) {
	case OPT_FLAG:
		*(bool *)o->ptr = true;
		return 0;
	case OPT_UINT:
		if (parse_u64(arg, o->min, o->max, &v))
			return opts_errorf(err, errlen, -EINVAL, "expected a number in %" PRIu64 "..%"
					 PRIu64, o->min, o->max);
		*(uint64_t *)o->ptr = v;
		return 0;
	case OPT_SIZE:
		if (parse_size(arg, o->min, o->max, &v))
			return opts_errorf(err, errlen, -EINVAL, "expected a size (K/M/G) in %" PRIu64
					 "..%" PRIu64, o->min, o->max);
		if (o->pow2 && (v & (v - 1)))
			return opts_errorf(err, errlen, -EINVAL, "%" PRIu64 " is not a power of two",
					   v);
		*(uint64_t *)o->ptr = v;
		return 0;
	case OPT_STRING:
	case OPT_CONFIG:
		if (!*arg)
			return opts_errorf(err, errlen, -EINVAL, "empty value");
		*(const char **)o->ptr = arg;
		return 0;
	case OPT_CHOICE: {
		size_t used;

		for (unsigned c = 0; o->choices[c]; c++) {
			if (!strcmp(o->choices[c], arg)) {
				*(unsigned *)o->ptr = c;
				return 0;
			}
		}
		used = (size_t)snprintf(err, errlen, "not one of");
		for (unsigned c = 0; o->choices[c] && used < errlen; c++)
			used += (size_t)snprintf(err + used, errlen - used, " %s", o->choices[c]);
		return -EINVAL;
	}
	case OPT_LIST: {
		struct opt_list *l = o->ptr;
		const char **n;

		if (!*arg)
			return opts_errorf(err, errlen, -EINVAL, "empty value");
		n = realloc(l->items, (l->n + 1) * sizeof(*n));
		if (!n)
			return opts_errorf(err, errlen, -ENOMEM, "out of memory");
		n[l->n++] = arg;
		l->items = n;
		return 0;
	}
	case OPT_CUSTOM:
		if (!*arg)
			return opts_errorf(err, errlen, -EINVAL, "empty value");
		return o->set(o, arg, err, errlen);
	}
	return opts_errorf(err, errlen, -EINVAL, "bad option table");
}

/* The getopt_long tables for t: every option, every --no- form, --help. */
static int getopt_tables(const struct opt *t, unsigned n, struct option **lo_out, char **so_out)
{
	struct option *lo = calloc(2 * n + 3, sizeof(*lo));
	char *so = calloc(2 * n + 4, 1);
	char *sp = so;
	unsigned k = 0;

	if (!lo || !so) {
		free(lo);
		free(so);
		return -ENOMEM;
	}
	*sp++ = '+';
	*sp++ = ':'; /* a missing argument comes back as ':', told apart from an unknown option */
	*sp++ = 'h';
	for (unsigned i = 0; i < n; i++) {
		lo[k++] = (struct option){ t[i].name,
					   t[i].type == OPT_FLAG ? no_argument : required_argument,
					   NULL, OPT_VAL + (int)i };
		if (t[i].short_name) {
			*sp++ = t[i].short_name;
			if (t[i].type != OPT_FLAG)
				*sp++ = ':';
		}
	}
	/* The negations live in strings of their own, freed with the table. */
	for (unsigned i = 0; i < n; i++) {
		char *neg;

		if (!negatable(&t[i]))
			continue;
		if (asprintf(&neg, "no-%s", t[i].name) < 0) {
			for (unsigned j = 0; j < k; j++)
				if (lo[j].val >= NEG_VAL)
					free((char *)lo[j].name);
			free(lo);
			free(so);
			return -ENOMEM;
		}
		lo[k++] = (struct option){ neg, no_argument, NULL, NEG_VAL + (int)i };
	}
	lo[k++] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[k] = (struct option){ "version", no_argument, NULL, VERSION_VAL };
	*lo_out = lo;
	*so_out = so;
	return 0;
}

static void getopt_tables_free(struct option *lo, char *so)
{
	for (unsigned j = 0; lo[j].name; j++)
		if (lo[j].val >= NEG_VAL)
			free((char *)lo[j].name);
	free(lo);
	free(so);
}

/* The table entry a getopt_long value stands for; NULL for '?' and the like. */
static const struct opt *opt_of(const struct opt *t, unsigned n, int c, bool *neg)
{
	*neg = false;
	if (c >= NEG_VAL && (unsigned)(c - NEG_VAL) < n) {
		*neg = true;
		return &t[c - NEG_VAL];
	}
	if (c >= OPT_VAL && (unsigned)(c - OPT_VAL) < n)
		return &t[c - OPT_VAL];
	for (unsigned i = 0; c > 0 && c < OPT_VAL && i < n; i++)
		if (t[i].short_name == c)
			return &t[i];
	return NULL;
}

/*
 * The config file the command line names, found with the same getopt
 * tables the real parse uses, so that whatever spelling that parse accepts
 * (-cF, --conf F, --config=F) counts. Reads it unless --help comes too.
 * Errors in other options are left to the real parse.
 */
static int read_config_option(const struct opt *t, unsigned n, const char *prog, int argc,
			      char **argv, const struct option *lo, const char *so)
{
	const struct opt *cfg = NULL;
	const char *path = NULL;
	bool help = false;
	char err[64];

	optind = 0;
	opterr = 0;
	for (;;) {
		int c = getopt_long(argc, argv, so, lo, NULL);
		const struct opt *o;
		bool neg;

		if (c == -1)
			break;
		if (c == 'h')
			help = true;
		o = opt_of(t, n, c, &neg);
		if (!o || o->type != OPT_CONFIG)
			continue;
		if (path) {
			fprintf(stderr, "%s: --%s given twice (%s, %s)\n", prog, o->name, path, optarg);
			return -EINVAL;
		}
		if (set_opt(o, optarg, err, sizeof(err))) {
			fprintf(stderr, "%s: --%s: %s\n", prog, o->name, err);
			return -EINVAL;
		}
		cfg = o;
		path = optarg;
	}
	if (!cfg || help)
		return 0;
	return opts_parse_file(t, prog, path);
}

/*
 * What getopt_long refused (c is ':' or '?'), said: an option without its
 * argument, one given an argument it takes none of, an unknown or
 * ambiguous one. optopt is the short option's letter, the long option's
 * value, or 0 for a long option getopt could not name.
 */
static void bad_option(const struct opt *t, unsigned n, const char *prog, int c, int argc,
		       char **argv)
{
	const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
	const struct opt *o;
	bool neg;

	o = optopt > 0 ? opt_of(t, n, optopt, &neg) : NULL;
	if (c == ':' && o && optopt < OPT_VAL)
		fprintf(stderr, "%s: option -%c needs an argument (see --help)\n", prog, optopt);
	else if (c == ':' && o)
		fprintf(stderr, "%s: option --%s needs an argument (see --help)\n", prog, o->name);
	else if (o && optopt >= OPT_VAL)
		fprintf(stderr, "%s: option --%s%s takes no argument (%s)\n", prog,
			neg ? "no-" : "", o->name, arg);
	else if (optopt == VERSION_VAL || optopt == 'h')
		fprintf(stderr, "%s: %s takes no argument\n", prog, arg);
	else if (optopt > 0 && optopt < OPT_VAL)
		fprintf(stderr, "%s: unknown option -%c (see --help)\n", prog, optopt);
	else
		fprintf(stderr, "%s: %s: unknown or ambiguous option (see --help)\n", prog, arg);
}

int opts_parse(const struct opt *t, const char *prog, const char *usage, int argc,
	       char **argv, int *first_pos)
{
	unsigned n = table_len(t);
	bool has_config = false;
	struct option *lo;
	char *so;
	int rc;

	*first_pos = argc;
	rc = getopt_tables(t, n, &lo, &so);
	if (rc) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return rc;
	}
	for (unsigned i = 0; i < n; i++)
		has_config |= t[i].type == OPT_CONFIG;
	if (has_config) {
		rc = read_config_option(t, n, prog, argc, argv, lo, so);
		if (rc) {
			getopt_tables_free(lo, so);
			return rc;
		}
	}
	optind = 0; /* 0, not 1: glibc then also forgets a half-parsed -abc */
	opterr = 0;
	for (;;) {
		int c = getopt_long(argc, argv, so, lo, NULL);
		const struct opt *o;
		char err[256];
		bool neg;

		if (c == -1)
			break;
		if (c == 'h') {
			opts_help(t, prog, usage);
			rc = 1;
			break;
		}
		if (c == VERSION_VAL) {
			version_print(prog);
			rc = 1;
			break;
		}
		o = opt_of(t, n, c, &neg);
		if (!o) {
			bad_option(t, n, prog, c, argc, argv);
			rc = -EINVAL;
			break;
		}
		if (o->type == OPT_CONFIG)
			continue; /* read above, before everything else */
		if (neg) {
			*(bool *)o->ptr = false;
			continue;
		}
		rc = set_opt(o, optarg, err, sizeof(err));
		if (rc) {
			if (o->secret)
				fprintf(stderr, "%s: --%s: %s\n", prog, o->name, err);
			else
				fprintf(stderr, "%s: --%s %s: %s\n", prog, o->name, optarg, err);
			break;
		}
	}
	*first_pos = optind;
	getopt_tables_free(lo, so);
	return rc;
}

/* ---- config files ---------------------------------------------------------------- */

/*
 * Buffers read from config files, kept for the life of the process
 * (options point into them); held here so that they stay reachable, with
 * where their lines ended, so that a value can be traced to its line
 * (opts_name_of).
 */
struct kept_file {
	char *text;
	size_t len;
	char *path;
	size_t *nl;  /* offsets of the '\n's, ascending */
	size_t nnl;
};
static struct kept_file *kept;
static size_t nkept;

static bool blank(char c)
{
	return c == ' ' || c == '\t';
}

static char *skip_blanks(char *s)
{
	while (blank(*s))
		s++;
	return s;
}

/* "true" and the like; 0 or 1, or -1 for anything else. */
static int parse_bool(const char *s)
{
	static const char *const yes[] = { "true", "yes", "on" }, *const no[] = { "false", "no", "off" };

	for (unsigned i = 0; i < ARRAY_SIZE(yes); i++) {
		if (!strcmp(s, yes[i]))
			return 1;
		if (!strcmp(s, no[i]))
			return 0;
	}
	return -1;
}

static const struct opt *find_name(const struct opt *t, const char *name)
{
	for (unsigned i = 0; t[i].name; i++)
		if (!strcmp(t[i].name, name))
			return &t[i];
	return NULL;
}

/*
 * A double-quoted value at q (on its opening quote), unescaped in place.
 * *val is the value; 0, or -EINVAL with why in err.
 */
static int unquote(char *q, char **val, const char *where, char *err, size_t errlen)
{
	char *r = q + 1, *w = q;

	*val = q;
	for (;;) {
		if (!*r)
			return opts_errorf(err, errlen, -EINVAL, "%s: no closing quote", where);
		if (*r == '"')
			break;
		if (*r == '\\') {
			r++;
			if (!*r)
				continue; /* no closing quote */
			if (*r != '"' && *r != '\\')
				return opts_errorf(err, errlen, -EINVAL, "%s: unknown escape \\%c in quotes "
						 "(only \\\" and \\\\)", where, *r);
		}
		*w++ = *r++;
	}
	*w = '\0';
	r++;
	if (*r && !blank(*r))
		return opts_errorf(err, errlen, -EINVAL, "%s: text after the closing quote", where);
	r = skip_blanks(r);
	if (*r && *r != '#')
		return opts_errorf(err, errlen, -EINVAL, "%s: text after the closing quote", where);
	return 0;
}

/* One line, without its newline and free of control characters. */
static int parse_line(const struct opt *t, unsigned *seen, unsigned lineno, char *s,
		      const char *where, char *err, size_t errlen)
{
	char *name, *name_end, *rest, *val = NULL;
	const struct opt *o;
	bool neg = false;
	unsigned i;
	int rc;

	name = skip_blanks(s);
	if (!*name || *name == '#')
		return 0;
	name_end = name + strcspn(name, " \t=");
	rest = skip_blanks(name_end);
	if (*rest == '=')
		rest = skip_blanks(rest + 1);
	if (*rest == '"') {
		rc = unquote(rest, &val, where, err, errlen);
		if (rc)
			return rc;
	} else if (*rest && !(*rest == '#' && blank(rest[-1]))) {
		/* Up to a comment: a '#' after a blank. */
		char *e;

		val = rest;
		for (e = rest + 1; *e && !(*e == '#' && blank(e[-1])); e++)
			;
		while (e > rest && blank(e[-1]))
			e--;
		*e = '\0';
	}
	*name_end = '\0';

	o = find_name(t, name);
	if (!o && !strncmp(name, "no-", 3)) {
		o = find_name(t, name + 3);
		neg = o && negatable(o);
		if (!neg)
			o = NULL;
	}
	if (!o)
		return opts_errorf(err, errlen, -EINVAL, "%s: unknown option \"%s\"", where, name);
	if (o->type == OPT_CONFIG)
		return opts_errorf(err, errlen, -EINVAL, "%s: %s: config files do not nest", where,
				 name);
	i = (unsigned)(o - t);
	if (o->type != OPT_LIST && !(o->type == OPT_CUSTOM && o->repeat) && seen[i])
		return opts_errorf(err, errlen, -EINVAL, "%s: %s set again (first on line %u)", where,
				 o->name, seen[i]);
	seen[i] = lineno;
	if (o->type == OPT_FLAG) {
		int b = val ? parse_bool(val) : 1;

		if (neg && val)
			return opts_errorf(err, errlen, -EINVAL, "%s: %s takes no value", where, name);
		if (b < 0)
			return opts_errorf(err, errlen, -EINVAL, "%s: %s %s: expected true, false, yes, "
					 "no, on or off", where, name, val);
		*(bool *)o->ptr = neg ? false : b;
		return 0;
	}
	if (!val || !*val)
		return opts_errorf(err, errlen, -EINVAL, "%s: %s needs a value", where, name);
	{
		char why[256];

		rc = set_opt(o, val, why, sizeof(why));
		if (rc && o->secret)
			return opts_errorf(err, errlen, rc, "%s: %s: %s", where, name, why);
		if (rc)
			return opts_errorf(err, errlen, rc, "%s: %s %s: %s", where, name, val, why);
	}
	return 0;
}

int opts_parse_text(const struct opt *t, const char *name, char *text, size_t len, char *err,
		    size_t errlen)
{
	unsigned n = table_len(t), lineno = 0;
	unsigned *seen = calloc(n ? n : 1, sizeof(*seen));
	char *p = text, *end = text + len;
	int rc = 0;

	if (!seen)
		return opts_errorf(err, errlen, -ENOMEM, "%s: out of memory", name);
	err[0] = '\0';
	text[len] = '\0';
	while (!rc && p < end) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		char *le = nl ? nl : end;
		char where[4200];

		lineno++;
		snprintf(where, sizeof(where), "%s:%u", name, lineno);
		*le = '\0';
		if (le > p && le[-1] == '\r')
			*--le = '\0';
		for (char *c = p; c < le; c++) {
			unsigned char u = (unsigned char)*c;

			if ((u < 0x20 && u != '\t') || u == 0x7f) {
				rc = opts_errorf(err, errlen, -EINVAL, "%s: %s 0x%02x", where,
					       u ? "control character" : "NUL byte", u);
				break;
			}
		}
		if (!rc)
			rc = parse_line(t, seen, lineno, p, where, err, errlen);
		p = (nl ? nl : end) + 1;
	}
	free(seen);
	return rc;
}

/* The whole file, NUL-terminated; 0 or a negative errno with why in err. */
static int read_config(const char *path, char **out, size_t *outlen, char *err, size_t errlen)
{
	/* Only a regular file is opened: a FIFO or a device named by mistake is not. */
	size_t len = 0, cap = 4096;
	struct stat st;
	char *buf = NULL;
	int fd = open_regular(path, &st), rc = 0;

	if (fd == -EISDIR)
		return opts_errorf(err, errlen, -EISDIR, "%s: is a directory, not a config file",
				   path);
	if (fd == -EINVAL)
		return opts_errorf(err, errlen, -EINVAL, "%s: not a regular file (%s), not a "
				   "config file", path, file_type_name(st.st_mode));
	if (fd < 0)
		return opts_errorf(err, errlen, fd, "%s: %s", path, strerror(-fd));
	if (st.st_size > CONFIG_MAX) {
		rc = opts_errorf(err, errlen, -EFBIG, "%s: larger than %u bytes: not a config file",
			       path, CONFIG_MAX);
		goto out;
	}
	for (;;) {
		ssize_t k;

		if (cap - len < 2) {
			char *grown;

			if (cap > CONFIG_MAX) {
				rc = opts_errorf(err, errlen, -EFBIG, "%s: larger than %u bytes: not a "
					       "config file", path, CONFIG_MAX);
				goto out;
			}
			cap *= 2;
			grown = realloc(buf, cap);
			if (!grown) {
				rc = opts_errorf(err, errlen, -ENOMEM, "%s: out of memory", path);
				goto out;
			}
			buf = grown;
		}
		if (!buf && !(buf = malloc(cap))) {
			rc = opts_errorf(err, errlen, -ENOMEM, "%s: out of memory", path);
			goto out;
		}
		k = read(fd, buf + len, cap - len - 1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			rc = opts_errorf(err, errlen, -errno, "%s: %s", path, strerror(errno));
			goto out;
		}
		if (!k)
			break;
		len += (size_t)k;
	}
	if (len > CONFIG_MAX)
		rc = opts_errorf(err, errlen, -EFBIG, "%s: larger than %u bytes: not a config file",
			       path, CONFIG_MAX);
out:
	close(fd);
	if (rc) {
		free(buf);
		return rc;
	}
	buf[len] = '\0';
	*out = buf;
	*outlen = len;
	return 0;
}

int opts_parse_file(const struct opt *t, const char *prog, const char *path)
{
	char err[4608], *text = NULL;
	struct kept_file *grown, *k;
	size_t len = 0, nnl = 0;
	int rc;

	rc = read_config(path, &text, &len, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "%s: config file %s\n", prog, err);
		return rc;
	}
	for (size_t i = 0; i < len; i++)
		nnl += text[i] == '\n';
	grown = realloc(kept, (nkept + 1) * sizeof(*kept));
	if (grown)
		kept = grown;
	k = grown ? &kept[nkept] : NULL;
	if (k) {
		*k = (struct kept_file){ .text = text, .len = len, .path = strdup(path),
					 .nl = malloc((nnl ? nnl : 1) * sizeof(size_t)) };
		if (!k->path || !k->nl) {
			free(k->path);
			free(k->nl);
			k = NULL;
		}
	}
	if (!k) {
		free(text);
		fprintf(stderr, "%s: config file %s: out of memory\n", prog, path);
		return -ENOMEM;
	}
	for (size_t i = 0; i < len; i++)
		if (text[i] == '\n')
			k->nl[k->nnl++] = i;
	nkept++;
	rc = opts_parse_text(t, path, text, len, err, sizeof(err));
	if (rc)
		fprintf(stderr, "%s: %s\n", prog, err);
	return rc;
}

const char *opts_name_of(const char *name, const char *value, char *buf, size_t len)
{
	for (size_t i = 0; value && i < nkept; i++) {
		const struct kept_file *k = &kept[i];
		size_t off, lo = 0, hi = k->nnl;

		if (value < k->text || value > k->text + k->len)
			continue;
		/* Its line: one more than the newlines before it. */
		off = (size_t)(value - k->text);
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (k->nl[mid] < off)
				lo = mid + 1;
			else
				hi = mid;
		}
		snprintf(buf, len, "%s:%zu: %s", k->path, lo + 1, name);
		return buf;
	}
	snprintf(buf, len, "--%s", name);
	return buf;
}

bool opts_provider_valid(const char *s)
{
	return s && (!strcmp(s, "tcp") || !strcmp(s, "verbs") || !strcmp(s, "rdma"));
}

/* ---- log levels ------------------------------------------------------------------ */

int opts_log_level_parse(const char *s)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };

	if (!s)
		return -EINVAL;
	if (s[0] >= '0' && s[0] <= '3' && !s[1])
		return s[0] - '0';
	if (!strcasecmp(s, "warning"))
		return 1;
	for (unsigned i = 0; i < ARRAY_SIZE(names); i++)
		if (!strcasecmp(s, names[i]) || (strlen(s) == 3 && !strncasecmp(s, names[i], 3)))
			return (int)i;
	return -EINVAL;
}

int opts_log_level(const char *prog, const char *opt_name, const char *value, const char *env,
		   int dflt)
{
	int level;

	if (value) {
		level = opts_log_level_parse(value);
		if (level < 0)
			fprintf(stderr, "%s: %s %s: expected error, warn, info or debug\n", prog,
				opt_name, value);
		return level;
	}
	if (env) {
		level = opts_log_level_parse(env);
		if (level < 0)
			fprintf(stderr, "%s: RTRS_LOG_LEVEL=%s: expected error, warn, info or debug\n",
				prog, env);
		return level;
	}
	return dflt;
}
