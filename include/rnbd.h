/* SPDX-License-Identifier: MIT */
/*
 * librnbd: the RNBD block device server and client over librtrs.
 *
 * Conventions as in rtrs.h: 0 or a negative errno; opaque handles; option
 * structs start with their size and are initialised by *_opts_init().
 */
#ifndef RNBD_H
#define RNBD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rtrs.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RNBD_DEFAULT_PORT_NR 1234

struct rnbd_srv;

struct rnbd_srv_opts {
	size_t size;                /* sizeof(struct rnbd_srv_opts) */
	/*
	 * The transport's options (rtrs.h), handed to rtrs_srv_open as they
	 * are: listen address, port (default RNBD_DEFAULT_PORT_NR; 0 = any
	 * free port), provider, queue depth (RTRS chunks, the requests a
	 * session may have in flight), chunk size, always_invalidate,
	 * heartbeats, authentication (auth_keys_file: require DH-HMAC-CHAP)
	 * and the limits. rnbd_srv_opts_init fills librtrs's defaults.
	 */
	struct rtrs_srv_opts rtrs;
	/*
	 * Files and block devices are looked up below this directory, an
	 * absolute path; it may hold %SESSNAME%, replaced by the session's
	 * name. Names with "." or ".." components, and symlinks leading out,
	 * are refused; so is anything but a regular file or a block device.
	 * Its fixed part (up to the component holding %SESSNAME%) must be a
	 * directory when the server opens (else -EINVAL, the cause logged).
	 * Default NULL: no file or block device is exported, and OPEN of a
	 * name that is not a memory device fails with -ENOENT.
	 */
	const char *dev_search_path;
	/*
	 * Memory devices, for benchmarks: "name:size[,name:size...]" (size
	 * with K/M/G). A client opening one of these names gets that memory
	 * instead of a file; all sessions share it. Each is a multiple of
	 * 4 KiB, and together they fit in the machine's RAM and swap (they are
	 * allocated as they are written): else -EINVAL. With neither these
	 * nor a search path there is nothing to export: rnbd_srv_open refuses
	 * (-EINVAL).
	 */
	const char *mem_devices;
	const char *engine;         /* "auto" (io_uring, else threads), "io_uring", "threads" */
	unsigned engine_threads;    /* pool threads (default 4) */
	int direct;                 /* open files with O_DIRECT (block devices: buffered_bdev) */
	/*
	 * A buffered file whose file system cannot write with RWF_NOWAIT
	 * (ext4): its plain writes are done at once on the thread that
	 * received them, which copies them into the page cache, rather than
	 * handed to the engine (io_uring would pass each to a worker thread).
	 * That thread may then wait while the kernel throttles dirty pages.
	 * Default 1.
	 */
	int inline_writes;
	/*
	 * Block devices are served as the kernel's rnbd-server serves them:
	 * opened with O_DIRECT, announced with the write cache and FUA their
	 * own queue has (sysfs queue/write_cache, queue/fua), so a client
	 * flushes only where a flush means something. buffered_bdev 1 serves
	 * them through the page cache instead, announcing a write cache and
	 * FUA (flush and FUA then cost an fdatasync). Default 0.
	 */
	int buffered_bdev;
	/*
	 * Which authenticated host may use which session names and open which
	 * devices in which modes (docs/security.md section 2.6). Required
	 * with rtrs.auth_keys_file and refused without it (hosts are named by
	 * their authentication): an authenticating server without it would
	 * let every host open everything, so rnbd_srv_open refuses (-EINVAL).
	 * A session name or a device not granted is refused with -EACCES.
	 * Read at open and again by rnbd_srv_reload_access.
	 */
	const char *access_file;
	/*
	 * Rate limits at start (docs/rnbd.md section 2.7): NULL, or a
	 * NULL-terminated list of "session:NAME:LIMITS", "host:NAME:LIMITS"
	 * and "device:NAME:LIMITS", LIMITS being KEY=VALUE[,KEY=VALUE...] with the
	 * keys of struct rnbd_qos_limits (iops=2000,write_bps=100M). A spec
	 * that does not parse, or a host's on a server without authentication
	 * (rtrs.auth_keys_file: its sessions have no host), makes rnbd_srv_open
	 * refuse (-EINVAL), logging it.
	 */
	const char *const *qos;
	/*
	 * Devices one session may have open at once (each a file descriptor
	 * but for memory devices): one more OPEN is refused with -EMFILE, so
	 * that one client cannot take the process's descriptors from the
	 * others. 0: RNBD_DEFAULT_MAX_DEVS_PER_SESSION.
	 */
	unsigned max_devs_per_session;
};

#define RNBD_DEFAULT_MAX_DEVS_PER_SESSION 1024

/*
 * What a rate limit applies to: every IO of a session; of a device (all
 * sessions); of a host, all of the sessions it authenticated (a tenant
 * cannot escape its limits by opening more sessions). An IO passes its
 * session's limits, then its host's, then its device's.
 */
enum rnbd_qos_kind { RNBD_QOS_SESSION, RNBD_QOS_DEVICE, RNBD_QOS_HOST };

/*
 * Limits per second; 0: none. IOPS count reads (reads, read_iops) and
 * writes, write zeroes, discards and secure erases (writes, write_iops);
 * bytes count what reads and writes move. A flush is never held.
 */
struct rnbd_qos_limits {
	size_t size;       /* sizeof(struct rnbd_qos_limits), set by the caller */
	uint64_t iops, read_iops, write_iops;
	uint64_t bps, read_bps, write_bps;
};

struct rnbd_qos_stats {
	size_t size;       /* sizeof(struct rnbd_qos_stats), set by the caller */
	uint64_t delayed;  /* IOs that waited for their tokens */
	uint64_t queued;   /* IOs waiting now */
	uint64_t wait_us;  /* their waits, summed */
};

int rnbd_srv_opts_init(struct rnbd_srv_opts *opts, size_t size);
/*
 * Whether path can be a server's dev_search_path: absolute, shorter than
 * 4096 bytes, its fixed part (up to the component holding %SESSNAME%) a
 * directory now. 0, or -EINVAL (-ENAMETOOLONG) with the cause in why (len
 * bytes; why may be NULL): "not a directory", "/srv/x: No such file or
 * directory". A program
 * checks its option with it before rnbd_srv_open, which checks the same.
 */
int rnbd_search_path_check(const char *path, char *why, size_t len);
/*
 * Starts serving; listening starts on the transport's service thread.
 * -EINVAL (or -ENOKEY: a key file that lists no host) when an option is
 * refused, the option and the cause logged; otherwise a negative errno.
 */
int rnbd_srv_open(const struct rnbd_srv_opts *opts, struct rnbd_srv **out);
/* Waits until listening, then the port; not listening, rtrs_srv_wait_listening's error. */
int rnbd_srv_port(struct rnbd_srv *srv, unsigned timeout_ms);
/*
 * Closes a device a session has open, from the server side: later IO on it
 * fails with -ENOTCONN, and its id stays reserved until the client closes
 * it. Its IO in flight completes; then its store closes and its writer slot
 * is given back. Returns 0 once that is done, or -EINPROGRESS if its IO is
 * still in flight after a second (a backing file that hangs; the device is
 * released when the IO completes); -ENOENT if not open. Holds no lock of
 * the server while it waits.
 */
int rnbd_srv_force_close(struct rnbd_srv *srv, const char *sessname, const char *dev_name);
/*
 * Reads the authentication key file again and checks every line (SIGHUP):
 * 0, or the error, which librtrs logs with file and line. It never blocks
 * for longer than librtrs waits for the file (1 s). -ENOENT without a key
 * file.
 */
int rnbd_srv_check_keys(struct rnbd_srv *srv);
/*
 * rnbd_srv_check_keys, then every live path of a host the key file no
 * longer lists is closed (rtrs_srv_reload_keys): the number of paths
 * closed, or the error (then nobody is revoked).
 */
int rnbd_srv_reload_keys(struct rnbd_srv *srv);
/*
 * Reads the access file again (SIGHUP): its rules apply to every session
 * and open from now on (what is open stays open). 0; or the error, with
 * the file, the line and the cause logged and in err (errlen bytes, may
 * be NULL), and then nothing new is granted to any host until a read
 * succeeds (fail closed). -ENOENT without an access file.
 */
int rnbd_srv_reload_access(struct rnbd_srv *srv, char *err, size_t errlen);
/*
 * Sets the rate limits of a session name, a host name or a device name
 * (all zero: none), at once for its IO from now on, whether or not it is
 * connected or open; IO waiting already goes at the new rate. 0, or
 * -EINVAL (a name empty or longer than 255 bytes, l->size too small),
 * -EOPNOTSUPP (a host's, on a server without authentication), -ENOMEM.
 */
int rnbd_srv_qos_set(struct rnbd_srv *srv, enum rnbd_qos_kind kind, const char *name,
		     const struct rnbd_qos_limits *l);
/* Its limits and counters (st may be NULL): 0, or -ENOENT when none was ever set. */
int rnbd_srv_qos_get(struct rnbd_srv *srv, enum rnbd_qos_kind kind, const char *name,
		     struct rnbd_qos_limits *l, struct rnbd_qos_stats *st);
/*
 * A rate limit as rnbd_srv_opts.qos takes it, checked without a server
 * (a program checks its options with it as it reads them):
 * "session:NAME:KEY=VALUE[,KEY=VALUE...]", "host:NAME:..." (NAME as the
 * host authenticates, e.g. its NQN) or "device:NAME:...", keys
 * iops, read_iops, write_iops, bps, read_bps, write_bps (bytes: K, M, G
 * suffixes, powers of 1024), each at most once; the name is what lies
 * between the first and the last ':', a device's normalized as the server
 * keeps it ("/vm//a/" is "vm/a"). 0 and *kind, name (namelen bytes), *l;
 * or -EINVAL and why (a static string).
 */
int rnbd_qos_parse(const char *spec, enum rnbd_qos_kind *kind, char *name, size_t namelen,
		   struct rnbd_qos_limits *l, const char **why);
/*
 * Stops serving: every IO in flight is answered first (so this waits for a
 * backing file that hangs), and every device is released.
 */
void rnbd_srv_close(struct rnbd_srv *srv);

/* One device a session has open, as rnbd_srv_list reports it. */
struct rnbd_srv_dev_stats {
	size_t size;                /* sizeof(struct rnbd_srv_dev_stats) */
	const char *session;        /* strings valid during the callback only */
	const char *device;
	uint32_t device_id;
	const char *mode;           /* "ro", "rw", "migration" */
	bool closed;                /* force-closed; the client has not closed it yet */
	uint64_t reads, writes;     /* completed without error */
	uint64_t read_bytes, write_bytes;
	uint64_t other;             /* flush, discard, secure erase, write zeroes */
	uint64_t errors;            /* IO answered with an error by the store */
	unsigned inflight;
};

/*
 * Calls fn for every device of every session, from a snapshot taken under
 * the server's locks: fn runs after they are released, so it may block
 * (write to a slow socket) without holding up the server, and may call
 * into it. Returns how many, or -EINVAL, -ENOMEM.
 */
int rnbd_srv_list(struct rnbd_srv *srv,
		  void (*fn)(void *priv, const struct rnbd_srv_dev_stats *st), void *priv);

/*
 * The server's transport, for what RTRS reports (rtrs_srv_sessions,
 * rtrs_srv_get_stats): valid until rnbd_srv_close.
 */
struct rtrs_srv_ctx *rnbd_srv_rtrs(struct rnbd_srv *srv);

/*
 * librnbd logs like librtrs, and these set both: level 0 error .. 3 debug
 * (warn until set; the libraries read no environment, the programs take
 * RTRS_LOG_LEVEL), and where lines go (NULL: stderr).
 */
void rnbd_set_log_level(int level);
void rnbd_set_log_fn(void (*fn)(void *priv, int level, const char *line), void *priv);

/* ---- client ------------------------------------------------------------------ */

struct rnbd_clt_sess;
struct rnbd_clt_dev;

/* Access modes and IO operations, as on the wire (docs/protocol.md section 13). */
enum rnbd_clt_mode { RNBD_CLT_RO = 0, RNBD_CLT_RW = 1, RNBD_CLT_MIGRATION = 2 };

enum rnbd_clt_op {
	RNBD_CLT_READ = 0,
	RNBD_CLT_WRITE = 1,
	RNBD_CLT_FLUSH = 2,
	RNBD_CLT_DISCARD = 3,
	RNBD_CLT_SECURE_ERASE = 4,
	RNBD_CLT_WRITE_ZEROES = 5,
};

/* Flags of an IO (wire values). */
#define RNBD_CLT_F_FUA (1u << 9)
#define RNBD_CLT_F_PREFLUSH (1u << 10)
#define RNBD_CLT_F_NOUNMAP (1u << 11) /* write zeroes: keep the blocks allocated */
/*
 * Not sent: rnbd_clt_submit does not wait for an IO slot, it returns
 * -EAGAIN when none is free (for a caller with other work than waiting:
 * it submits again once one of its IO completes, or a moment later).
 */
#define RNBD_CLT_F_NOWAIT (1u << 31)

/*
 * Opens a session (the RTRS session, shared by the devices mapped through
 * it) and exchanges SESS_INFO. opts as for rtrs_clt_open (port default
 * 1234 here); its link_ev and priv are the library's, and opts->link_ev, if
 * set, is still called after the library's own handling (with every
 * event, RTRS_CLT_LINK_EV_SERVER_SESSION included: the devices are then
 * being opened again). IO waits for a path in librtrs (fast_io_fail_ms);
 * after a new server session, IO on a device also waits for the device to
 * be opened again, and fails with that open's error if it fails.
 */
int rnbd_clt_sess_open(const struct rtrs_clt_opts *opts, struct rnbd_clt_sess **out);
/* Unmaps (force) what is still mapped and closes the session. */
void rnbd_clt_sess_close(struct rnbd_clt_sess *sess);
/*
 * The session's transport, for what RTRS manages and reports (paths,
 * their statistics, the policy, reconnects: rtrs.h); valid until
 * rnbd_clt_sess_close. Closing it is rnbd_clt_sess_close's business.
 */
struct rtrs_clt_sess *rnbd_clt_rtrs(struct rnbd_clt_sess *sess);

/*
 * Whether dev_name can name a device at all (1..RNBD_DEV_NAME_MAX-1 bytes,
 * no control characters, no "." or ".." component, not only slashes): 0,
 * or -EINVAL with the reason in *why (a static string; why may be NULL).
 * Checks nothing on a server: a caller can refuse a name before it opens
 * a session for it.
 */
int rnbd_dev_name_check(const char *dev_name, const char **why);
/*
 * A device name in its one spelling, in place: leading, trailing and
 * repeated '/' dropped ("/a//b/" -> "a/b"), as a server and rnbd_clt_map
 * take it, so that names a caller keeps compare as the devices they name.
 */
void rnbd_dev_name_normalize(char *name);
/*
 * Maps device dev_name (a path below the server's search path) in mode.
 * -EPERM: the server's sharing rule refused the mode; -EEXIST: this
 * session has mapped that name already; -EINVAL for a name
 * rnbd_dev_name_check refuses (its reason in rtrs_last_error()).
 */
int rnbd_clt_map(struct rnbd_clt_sess *sess, const char *dev_name, enum rnbd_clt_mode mode,
		 struct rnbd_clt_dev **out);
/*
 * Unmaps: normal fails with -EBUSY while IO is in flight; force refuses new
 * IO (-ENODEV), waits for what is in flight, then closes. The handle is
 * gone when this returns 0.
 */
int rnbd_clt_unmap(struct rnbd_clt_dev *dev, bool force);
/*
 * Opens the device again on the server: one disconnected, or one the
 * server closed ("closed": its old id is closed first). -EALREADY if it
 * is mapped, -EBUSY while it is being opened or unmapped.
 */
int rnbd_clt_remap(struct rnbd_clt_dev *dev);
/*
 * Changes the size this client uses: bytes, whole blocks, at least one and
 * at most the size the server gave when the device was last opened
 * (-EINVAL otherwise); no server call. A reopen (reconnect, remap) sets
 * the server's size again.
 */
int rnbd_clt_resize(struct rnbd_clt_dev *dev, uint64_t size);

struct rnbd_clt_dev_info {
	size_t size;                /* sizeof(struct rnbd_clt_dev_info), set by the caller */
	uint64_t bytes;             /* device size */
	uint32_t logical_block_size;
	uint32_t physical_block_size;
	uint32_t max_io;            /* bytes per read or write piece (larger ones are split):
				       the transport's and the server's max_hw_sectors */
	bool read_only;
	bool discard, write_zeroes, secure_erase;
	bool write_cache;           /* flush means something */
	bool fua;
	/*
	 * "mapped", "disconnected", "reopening", "unmapping" (a forced unmap
	 * waits for IO), "closed" (the server closed it: IO fails with
	 * -ENOTCONN; rnbd_clt_remap opens it again)
	 */
	const char *state;
	uint32_t queue_depth;       /* IO slots of the session (IO in flight at most) */
};

int rnbd_clt_dev_info(struct rnbd_clt_dev *dev, struct rnbd_clt_dev_info *info);

/*
 * IO on a mapped device: offset and len in bytes, whole logical blocks
 * (flush: 0 and 0). Reads fill buf, writes send it; discard, secure erase
 * and write zeroes carry no data (buf NULL). Requests larger than max_io
 * are split and their pieces sent one after the other (discard, secure
 * erase and write zeroes at the server's limits for them). While the session
 * reconnects, IO waits for the device to be open again up to the session's
 * fast_io_fail_ms. The result is 0 or a negative errno: -EROFS (read-only
 * mapping), -ENODEV (unmapped, or a forced unmap under way), -EINVAL (range
 * or alignment; FUA or PREFLUSH on a read, NOUNMAP on anything but write
 * zeroes, unknown flags), -EOPNOTSUPP (discard, secure erase or write zeroes
 * on a device that does not offer it: see rnbd_clt_dev_info), -ENOTCONN (the
 * server closed the device: from the first, the device is "closed" and
 * its IO fails so unsent), -ETIMEDOUT (not open again within
 * fast_io_fail_ms), -ECONNABORTED (no path and none coming), or the server's
 * error. -EROFS, -EOPNOTSUPP and -EINVAL are decided here, with nothing sent.
 */

/*
 * Asynchronous form. Takes one of the session's IO slots (its RTRS queue
 * depth less one permit kept for admin messages), waiting for one to be
 * free (with RNBD_CLT_F_NOWAIT: -EAGAIN at once when none is; while the
 * session has no path, a slot is waited for only as long as an IO waits
 * for a path: -ECONNABORTED or -ETIMEDOUT, as rtrs_clt_get_permit); then returns 0, and done(priv,
 * result) is called exactly once, from a library thread (or from this call
 * itself), or returns a negative errno and done is not called. Called from
 * a done callback it does not wait: -EAGAIN when no slot is free (keep at
 * most queue_depth IO in flight and a callback that submits again always
 * finds its own). A done callback must not unmap, close or call
 * rnbd_clt_io; it may still be running when a forced unmap returns (the
 * session's close waits for it). buf stays in use until done.
 */
typedef void (*rnbd_clt_done_fn)(void *priv, int result);

int rnbd_clt_submit(struct rnbd_clt_dev *dev, enum rnbd_clt_op op, uint32_t flags,
		    uint64_t offset, void *buf, uint32_t len, rnbd_clt_done_fn done, void *priv);

/*
 * Runs the session's IO completions on the calling thread (rtrs_clt_poll):
 * the done callbacks of rnbd_clt_submit come from this call, with no
 * hand-off, while a thread polls. Returns how many completions of the
 * transport it ran, 0 on timeout or when an IO may have ended on a library
 * thread (a failover, an IO held across a reconnect): the caller looks at
 * what its done callbacks recorded, and polls again until all are in.
 * -EOPNOTSUPP on a fabric without polled completions (RDMA devices): done
 * callbacks come from library threads, as without polling.
 */
int rnbd_clt_poll(struct rnbd_clt_sess *sess, int timeout_ms);
/*
 * To sleep in the caller's own loop between polls (rtrs_clt_poll_fd,
 * rtrs_clt_poll_wait_begin and rtrs_clt_poll_wait_end in rtrs.h): the fd
 * that turns readable when rnbd_clt_poll has something to do; 0 when the
 * caller may sleep on it, -EAGAIN when it should poll instead; the end of
 * every such sleep.
 */
int rnbd_clt_poll_fd(struct rnbd_clt_sess *sess);
int rnbd_clt_poll_wait_begin(struct rnbd_clt_sess *sess);
void rnbd_clt_poll_wait_end(struct rnbd_clt_sess *sess);

/* Synchronous form: submits and waits for the result. */
int rnbd_clt_io(struct rnbd_clt_dev *dev, enum rnbd_clt_op op, uint32_t flags,
		uint64_t offset, void *buf, uint32_t len);

#ifdef __cplusplus
}
#endif

#endif
