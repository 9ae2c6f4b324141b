/* SPDX-License-Identifier: MIT */
/*
 * One option table per program: the table drives the command line parser,
 * the config file reader, --help and the defaults.
 */
#ifndef RTRS_COMMON_OPTS_H
#define RTRS_COMMON_OPTS_H

#include <stdbool.h>
#include <stdint.h>

enum opt_type {
	OPT_FLAG,    /* bool, no argument */
	OPT_UINT,    /* unsigned decimal within [min, max] */
	OPT_SIZE,    /* size with K/M/G suffix within [min, max] */
	OPT_STRING,  /* const char * */
	OPT_CHOICE,  /* one of choices[]; stores the index (unsigned) */
	OPT_LIST,    /* repeatable string; appended to a string list */
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
};

/*
 * Parses argv against the table (ending with a zeroed entry). Positional
 * arguments are left in argv[*first_pos .. argc). Returns 0, 1 when --help
 * was printed, or -EINVAL after printing a clear error.
 */
int opts_parse(const struct opt *table, const char *prog, const char *usage, int argc,
	       char **argv, int *first_pos);
void opts_help(const struct opt *table, const char *prog, const char *usage);

/*
 * Reads a config file against the same table: one option per line,
 * "name value" or "name = value" (a flag: just "name"), '#' starts a
 * comment, blank lines are skipped. Values are kept for the life of the
 * process. Read it before opts_parse() so that the command line wins.
 * Returns 0, or a negative errno after printing "prog: FILE:LINE: why".
 */
int opts_parse_file(const struct opt *table, const char *prog, const char *path);

/*
 * The value of option `name` (or -short_name) on the command line, found
 * without parsing the rest: where the config file is. NULL if absent.
 */
const char *opts_find(int argc, char **argv, const char *name, char short_name);

#endif
