/* SPDX-License-Identifier: MIT */
/*
 * librnbd: the RNBD block device server (and, later, client) over librtrs.
 *
 * Conventions as in rtrs.h: 0 or a negative errno; opaque handles; option
 * structs start with their size and are initialised by *_opts_init().
 */
#ifndef RNBD_H
#define RNBD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RNBD_DEFAULT_PORT_NR 1234

struct rnbd_srv;

struct rnbd_srv_opts {
	size_t size;                /* sizeof(struct rnbd_srv_opts) */
	const char *addr;           /* listen address; NULL = 0.0.0.0 */
	uint16_t port;              /* default 1234; 0 = any free port */
	const char *provider;       /* libfabric provider; default "tcp" */
	/*
	 * Devices are looked up below this directory (default "/"); it may
	 * hold %SESSNAME%, replaced by the session's name. Names with "." or
	 * ".." components, and symlinks leading out, are refused.
	 */
	const char *dev_search_path;
	/*
	 * Memory devices, for benchmarks: "name:size[,name:size...]" (size
	 * with K/M/G). A client opening one of these names gets that memory
	 * instead of a file; all sessions share it.
	 */
	const char *mem_devices;
	const char *engine;         /* "auto" (io_uring, else threads), "io_uring", "threads" */
	unsigned engine_threads;    /* pool threads (default 4) */
	int direct;                 /* open files and devices with O_DIRECT */
	uint32_t queue_depth;       /* RTRS chunks per session (default 512) */
	uint32_t max_chunk_size;    /* default 128 KiB */
	int always_invalidate;      /* default 1, see rtrs.h */
	const char *auth_keys_file; /* see rtrs.h: require DH-HMAC-CHAP */
	const char *auth_name;
	unsigned hb_interval_ms;
};

int rnbd_srv_opts_init(struct rnbd_srv_opts *opts, size_t size);
/* Starts serving; listening starts on the transport's service thread. */
int rnbd_srv_open(const struct rnbd_srv_opts *opts, struct rnbd_srv **out);
/* Waits until listening (-ETIMEDOUT), then the port. */
int rnbd_srv_port(struct rnbd_srv *srv, unsigned timeout_ms);
/*
 * Closes a device a session has open, from the server side: its IO in
 * flight completes, later IO on it fails with -ENOTCONN, and its id stays
 * reserved until the client closes it. -ENOENT if not open.
 */
int rnbd_srv_force_close(struct rnbd_srv *srv, const char *sessname, const char *dev_name);
/* Stops serving: every IO in flight is answered first. */
void rnbd_srv_close(struct rnbd_srv *srv);

#ifdef __cplusplus
}
#endif

#endif
