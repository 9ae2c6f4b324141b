/* SPDX-License-Identifier: MIT */
/*
 * Test harness: spawn a server process, learn its port from its first line
 * of output, signal it, reap it. Servers always run on 127.0.0.1 with port
 * 0, so tests never collide on ports.
 */
#ifndef RTRS_TEST_HARNESS_H
#define RTRS_TEST_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct proc {
	pid_t pid;
	int port;
	int out_fd;
};

/* argv[0] is the program path; extra arguments follow. 0 or -errno. */
int proc_spawn_server(char *const argv[], struct proc *p);
/* Sends sig; with wait, reaps the process and returns its status. */
int proc_signal(struct proc *p, int sig, bool wait);
/* Path of the test server from $RTRS_TEST_SERVER (set by meson). */
const char *test_server_path(void);
/* Milliseconds on the monotonic clock. */
uint64_t test_now_ms(void);

#endif
