/* SPDX-License-Identifier: MIT */
/*
 * Backing stores of the RNBD server: a file or block device, or memory.
 *
 * A store executes block requests (read, write, flush, discard, secure
 * erase, write zeroes, with FUA and PREFLUSH) and calls each request's done
 * callback exactly once with 0 or a negative errno: from one of the
 * engine's threads for files and block devices, on the submitting thread
 * for memory stores and for requests refused before any IO. File and block device stores run on an engine: io_uring through
 * liburing where the kernel allows it, else a pool of threads doing the
 * same with plain system calls. What each operation becomes:
 *
 *   read, write      preadv / pwritev (FUA: RWF_DSYNC)
 *   PREFLUSH         fdatasync before the request
 *   flush            fdatasync
 *   discard          file: fallocate(PUNCH_HOLE | KEEP_SIZE); device: BLKDISCARD
 *   secure erase     device: BLKSECDISCARD; file: -EOPNOTSUPP
 *   write zeroes     file: fallocate(ZERO_RANGE), or PUNCH_HOLE without NOUNMAP;
 *                    device: BLKZEROOUT
 */
#ifndef RNBD_BACKEND_H
#define RNBD_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "rnbd-proto.h"

struct rnbd_store;
struct rnbd_engine;

struct rnbd_breq {
	enum rnbd_io_op op;
	uint32_t flags;               /* RNBD_F_FUA, RNBD_F_PREFLUSH, RNBD_F_NOUNMAP */
	uint64_t offset;              /* bytes */
	uint32_t len;                 /* bytes */
	void *buf;                    /* read and write */
	void (*done)(struct rnbd_breq *r, int err);
	/* The store's own. */
	struct rnbd_store *store;
	STAILQ_ENTRY(rnbd_breq) link; /* the engine's pool queue */
	int stage;
};

/* What a store offers; the server's OPEN_RSP is made from it. */
struct rnbd_store_info {
	uint64_t size;                /* bytes, whole logical blocks */
	uint32_t logical_block_size;
	uint32_t physical_block_size;
	bool block_device;
	bool discard;                 /* discard works (files: hole punching) */
	bool secure_erase;            /* advertised for memory; block devices are tried on
					 request (BLKSECDISCARD) but not advertised */
	bool write_zeroes;
	/*
	 * A write cache (flush means something) and FUA, as the server
	 * announces them: files and block devices served through the page
	 * cache have both; a block device opened with O_DIRECT has what its
	 * queue has (sysfs queue/write_cache and queue/fua; both when those
	 * cannot be read), as the kernel's rnbd-server announces it.
	 */
	bool write_cache;
	bool fua;
	bool direct;                  /* opened with O_DIRECT */
	dev_t dev;                    /* identity of the backing object, for the sharing rule */
	ino_t ino;
};

enum rnbd_engine_kind {
	RNBD_ENGINE_AUTO,             /* io_uring, else threads */
	RNBD_ENGINE_URING,
	RNBD_ENGINE_THREADS,
};

/*
 * An engine with its threads. threads: the pool size (also the io_uring
 * engine's helpers for what io_uring cannot do); depth: io_uring entries.
 */
int rnbd_engine_open(enum rnbd_engine_kind kind, unsigned threads, unsigned depth,
		     struct rnbd_engine **out);
/*
 * Buffered files on a file system without RWF_NOWAIT writes: plain writes
 * done at once on the submitting thread (rnbd_srv_opts.inline_writes).
 * Before any store is opened on e.
 */
void rnbd_engine_set_inline_writes(struct rnbd_engine *e, bool on);
/* "io_uring" or "threads" (what AUTO became). */
const char *rnbd_engine_name(const struct rnbd_engine *e);
/*
 * io_uring engines: flush stages run (a FLUSH, a PREFLUSH, a FUA write to
 * the page cache) and the fdatasync calls the flusher made for them; fewer
 * calls than flushes when several were queued at once.
 */
void rnbd_engine_flush_stats(struct rnbd_engine *e, uint64_t *flushes, uint64_t *syncs);
/*
 * Stops the engine's pool threads, flushers and reaper and frees it. Close
 * every store on it first (rnbd_store_close waits for the store's requests
 * to complete): requests still in flight here are never completed.
 */
void rnbd_engine_close(struct rnbd_engine *e);

/*
 * A store over an open file or block device (the store owns fd from here,
 * also on failure). direct: fd was opened with O_DIRECT (buffers and
 * offsets must then be aligned to the logical block size).
 */
int rnbd_store_fd(struct rnbd_engine *e, int fd, bool direct, struct rnbd_store **out);
/* The device name the store's log lines give (its export's; unset: "a store"). */
void rnbd_store_set_name(struct rnbd_store *s, const char *name);
/* A store in memory, size bytes of zeros (benchmarks, tests). */
int rnbd_store_memory(uint64_t size, struct rnbd_store **out);

const struct rnbd_store_info *rnbd_store_info(const struct rnbd_store *s);
/*
 * Queues r (r->store is set here). Requests beyond the store's size, or
 * unaligned for O_DIRECT, complete with -EINVAL; done may run before this
 * returns.
 */
void rnbd_store_submit(struct rnbd_store *s, struct rnbd_breq *r);
/* Waits for the store's requests to complete and closes it. */
void rnbd_store_close(struct rnbd_store *s);

#endif
