/* SPDX-License-Identifier: MIT */
/*
 * What a test's code under test prints: silence it (quiet_begin/end) or
 * capture it (capture_begin/end) on stdout or stderr.
 */
#ifndef RTRS_TEST_CAPTURE_H
#define RTRS_TEST_CAPTURE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Points fd (1 or 2) at /dev/null; returns the saved descriptor. */
static inline int quiet_begin(int fd)
{
	int saved, nul;

	fflush(stdout);
	fflush(stderr);
	saved = dup(fd);
	nul = open("/dev/null", O_WRONLY | O_CLOEXEC);
	if (saved < 0 || nul < 0) {
		perror("quiet_begin");
		exit(1);
	}
	dup2(nul, fd);
	close(nul);
	return saved;
}

static inline void quiet_end(int fd, int saved)
{
	fflush(stdout);
	fflush(stderr);
	dup2(saved, fd);
	close(saved);
}

/* What is written to fd (1 or 2) between capture_begin and capture_end. */
struct capture {
	FILE *f;
	int fd, saved;
};

static inline void capture_begin(struct capture *c, int fd)
{
	c->f = tmpfile();
	if (!c->f) {
		perror("tmpfile");
		exit(1);
	}
	fflush(stdout);
	fflush(stderr);
	c->fd = fd;
	c->saved = dup(fd);
	dup2(fileno(c->f), fd);
}

/* The text into buf (len bytes, terminated). */
static inline void capture_end(struct capture *c, char *buf, size_t len)
{
	size_t n;

	fflush(stdout);
	fflush(stderr);
	dup2(c->saved, c->fd);
	close(c->saved);
	rewind(c->f);
	n = fread(buf, 1, len - 1, c->f);
	buf[n] = '\0';
	fclose(c->f);
}

#endif
