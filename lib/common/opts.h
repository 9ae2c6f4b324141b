/* SPDX-License-Identifier: MIT */
/*
 * One option table per program: the table drives the command line parser,
 * the config file reader, --help and the defaults.
 */
#ifndef RTRS_COMMON_OPTS_H
#define RTRS_COMMON_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum opt_type {
	OPT_FLAG,    /* bool: --NAME sets it, --no-NAME clears it */
	OPT_UINT,    /* unsigned decimal within [min, max] */
	OPT_SIZE,    /* size with K/M/G suffix within [min, max] */
	OPT_STRING,  /* const char *, not empty */
	OPT_CHOICE,  /* one of choices[]; stores the index (unsigned) */
	OPT_LIST,    /* repeatable string; appended to a string list */
	OPT_CONFIG,  /* const char *: a config file, read before the rest of the command line */
	OPT_CUSTOM,  /* takes a value; set() checks and stores it (see struct opt) */
};

struct opt_list {
	const char **items;
	unsigned n;
};

struct opt {
	const char *name;      /* long name without dashes */
	char short_name;       /* 0 if none */
	enum opt_type type;
	void *ptr;             /* bool *, uint64_t *, const char **, unsigned *, opt_list * */
	uint64_t min, max;
	const char *const *choices; /* NULL-terminated, OPT_CHOICE */
	const char *arg;       /* argument name in --help */
	const char *help;
	/*
	 * OPT_CUSTOM: set(o, arg, err, errlen) checks arg (not empty) and
	 * stores it: 0, or a negative errno with why in err. show(o, buf,
	 * len), if given, writes the value --help shows as the default ("" for
	 * none). priv is theirs. repeat: may be given more than once in a
	 * config file, as OPT_LIST (on the command line every option may).
	 */
	int (*set)(const struct opt *o, const char *arg, char *err, size_t errlen);
	void (*show)(const struct opt *o, char *buf, size_t len);
	const void *priv;
	bool repeat;
	/* The value is a secret: no message repeats it (OPT_STRING, OPT_CUSTOM). */
	bool secret;
	/* OPT_SIZE: the value must be a power of two. */
	bool pow2;
};

/*
 * Parses argv against the table (ending with a zeroed entry). Long options
 * may be abbreviated to any unambiguous prefix; every flag also has a
 * --no-NAME form that clears it (except flags whose name starts with
 * "no-"). When the table has an OPT_CONFIG entry and the command line
 * gives it (in any form the parser accepts: -c F, --config=F, --conf F),
 * that file is read first (opts_parse_file), so the command line wins.
 * Positional arguments are left in argv[*first_pos .. argc). Returns 0, 1
 * when --help or --version was printed, or a negative errno after printing a clear
 * error (an option given without its argument: "option -p needs an argument",
 * told apart from an unknown or ambiguous option).
 */
int opts_parse(const struct opt *table, const char *prog, const char *usage, int argc,
	       char **argv, int *first_pos);
/*
 * --help: usage and the table. With RTRS_HELP_FORMAT=man in the
 * environment it prints the table as scdoc(5) items instead, and with
 * RTRS_HELP_FORMAT=man-config the names a config file takes: the man
 * pages' option lists are made from the tables at build time (docs/man/).
 */
void opts_help(const struct opt *table, const char *prog, const char *usage);
/*
 * One scdoc(5) item: *term* _arg_, then help (and ". Default: dflt" when
 * dflt is not empty) indented; the text escaped (opts_man_text). For the
 * man pages of parameter tables that are not struct opt (the nbdkit
 * plugin's). -EINVAL, with why on stderr, for a help text that roff would
 * take as a request (one that starts with '.' or '\''); the man pages of
 * such a table are not made (--help with RTRS_HELP_FORMAT=man exits 70).
 */
int opts_man_item(FILE *f, const char *term, const char *arg, const char *help, const char *dflt);
void opts_man_text(FILE *f, const char *s);
/*
 * --version: every program takes it where it takes --help (opts_parse
 * prints "PROG VERSION" and returns 1); a program with subcommands asks
 * opts_version_arg first, which prints it when argv[1] is --version.
 */
const char *opts_version(void);
bool opts_version_arg(int argc, char **argv, const char *prog);

/*
 * Reads a config file against the same table (exact names, no prefixes):
 *
 *   - one option per line: "NAME VALUE" or "NAME = VALUE"; blank lines
 *     are skipped;
 *   - a flag: "NAME" or "NAME true|false|yes|no|on|off" (also with '='),
 *     or "no-NAME" to clear it;
 *   - '#' starts a comment at the start of a line or after a blank (space
 *     or tab); elsewhere it is part of the value ("a#b" is a value);
 *   - a value in double quotes keeps blanks and '#'; inside them \" is a
 *     quote and \\ a backslash; no other escape exists;
 *   - an option other than OPT_LIST (or OPT_CUSTOM with repeat) given
 *     twice, an unknown name, a missing or extra value, a control
 *     character, a NUL byte, a config option (files do not nest), a
 *     directory or anything else that is not a regular file (a FIFO is
 *     opened without waiting for a writer, and refused), an unreadable
 *     file, or one larger than 1 MiB is an error.
 *
 * Values are kept for the life of the process. Returns 0, or a negative
 * errno after printing "prog: FILE:LINE: why" (or "prog: FILE: why").
 */
int opts_parse_file(const struct opt *table, const char *prog, const char *path);

/*
 * How a message names an option whose value a program checks after
 * parsing: "FILE:LINE: NAME" when value (a string that an OPT_STRING,
 * OPT_LIST or OPT_CUSTOM option was given) came from a line of a config
 * file that opts_parse_file read, else "--NAME" (the command line). So
 * "PROG: %s %s: why" with this and the value reads as the parser's own
 * errors do. Written to buf (len bytes, always terminated); returns buf.
 */
const char *opts_name_of(const char *name, const char *value, char *buf, size_t len);

/* The fabrics a program may name: tcp, verbs, or rdma (the same as verbs). */
bool opts_provider_valid(const char *s);

/*
 * The parser behind opts_parse_file, on text in memory: text holds len
 * bytes and has room for one more (it is rewritten in place, and string
 * options point into it, so the caller keeps it while they are used).
 * name is the file name for messages. Returns 0, or a negative errno with
 * "NAME:LINE: why" in err (errlen bytes, always terminated).
 */
int opts_parse_text(const struct opt *table, const char *name, char *text, size_t len,
		    char *err, size_t errlen);

/*
 * Says why into err (errlen bytes, always terminated) and returns rc, for
 * the parsers that report "why" to their caller as this one does.
 */
int opts_errorf(char *err, size_t errlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * Log levels by name, as RTRS_LOG_LEVEL takes them: error, warn, info,
 * debug (any case), their first three letters, "warning", or 0..3.
 * Returns the level (0 error .. 3 debug) or -EINVAL.
 */
int opts_log_level_parse(const char *s);

/*
 * The level a program logs at. A level given as an option (value, from
 * option opt_name; NULL when not given) wins; else env, the value of
 * RTRS_LOG_LEVEL in the program's environment, which the program reads
 * (the libraries read none; NULL: not set); else dflt. Returns the level, or -EINVAL after printing
 * "prog: --log-level X: ..." or "prog: RTRS_LOG_LEVEL=X: ...".
 */
int opts_log_level(const char *prog, const char *opt_name, const char *value, const char *env,
		   int dflt);

#endif
