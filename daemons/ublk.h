/* SPDX-License-Identifier: MIT */
/*
 * A mapped RNBD device as a Linux block device (/dev/ublkbN) through ublk,
 * the kernel's userspace block driver (linux/ublk_cmd.h, Linux 6.0+ with
 * ublk_drv): the device is added and started over /dev/ublk-control with
 * io_uring URING_CMDs, and one queue thread fetches the kernel's requests
 * from /dev/ublkcN and sends each to the RNBD device (rnbd_clt_submit),
 * committing the result when it comes back. Flush, FUA, discard and write
 * zeroes (with NOUNMAP) become RNBD's; the size, block sizes, largest IO,
 * queue depth and what the device offers come from its OPEN_RSP
 * (rnbd_clt_dev_info).
 */
#ifndef RNBD_UBLK_H
#define RNBD_UBLK_H

#include <linux/ublk_cmd.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rnbd.h"

struct ublk_dev;

/* 0 when this kernel can make ublk devices, else a negative errno and why. */
int ublk_probe(char *why, size_t len);

/*
 * A block device for d, of session sess, started: *out, its number N
 * (/dev/ublkbN) in *dev_id. Its queue thread polls sess for d's
 * completions (rnbd_clt_poll), where the fabric allows. The caller keeps
 * d mapped until ublk_dev_remove returns. 0 or a negative errno with why.
 *
 * before_start (may be NULL) is called with priv and N once the kernel has
 * numbered the device and before it starts (/dev/ublkbN appears, and
 * with it IO the kernel holds for a next daemon if this one dies): where
 * the caller records the device, so that no instant exists in which it
 * lives and nothing names it. If the add fails after it, the device is
 * deleted and the caller drops its record.
 */
typedef void ublk_before_start_fn(void *priv, int dev_id);
int ublk_dev_add(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		 ublk_before_start_fn *before_start, void *priv, struct ublk_dev **out,
		 int *dev_id, char *why, size_t len);

/*
 * Stops and deletes the block device: requests still queued fail, those
 * sent to the server are waited for. After it, nothing of d is used.
 */
void ublk_dev_remove(struct ublk_dev *u);

/*
 * A new size (whole blocks) for the block device, announced to the kernel
 * (a size change event): 0, or -EOPNOTSUPP where the kernel cannot change
 * a live ublk device's size (UBLK_F_UPDATE_SIZE, Linux 6.16); then
 * ublk_dev_can_resize is false from the start.
 */
int ublk_dev_resize(struct ublk_dev *u, uint64_t bytes);
bool ublk_dev_can_resize(const struct ublk_dev *u);

/*
 * Devices outlive their daemon (UBLK_F_USER_RECOVERY with REISSUE): when
 * the process that serves one ends, however it ends, the kernel keeps
 * /dev/ublkbN and holds its IO; what the process had taken and not
 * answered is given again to the next one. That one attaches with
 * ublk_dev_recover.
 */
struct ublk_state {
	int state;          /* UBLK_S_DEV_LIVE, _QUIESCED (waits for a daemon), _DEAD */
	bool recoverable;   /* made with user recovery */
	int pid;            /* the daemon that serves (served) it */
	unsigned queue_depth;
	bool marked;        /* added by an rnbd-clientd of this pid namespace (ublk_mark) */
	uint64_t ident;     /* this instance of the device (ublk_dev_ident), 0 unknown */
};

/*
 * What tells this instance of device N from a later one of the same number:
 * the inode of its /sys/class/ublk-char/ublkcN (the kernel's sysfs node,
 * made anew, with a new number, for every device it adds). 0 when unknown.
 */
uint64_t ublk_dev_ident(int dev_id);

/*
 * The mark each device's ADD_DEV carries in ublksrv_flags (which the
 * kernel keeps and GET_DEV_INFO returns, and which no ublk driver reads):
 * UBLK_MARK_MAGIC ("RNBD" in the high half) and, in the low half, the
 * inode of the adder's pid namespace, so that a pid the device names is a
 * pid of this namespace. 0 (devices unmarked, none ever found ours) where
 * the namespace cannot be known.
 */
#define UBLK_MARK_MAGIC 0x524e424400000000ULL
uint64_t ublk_mark(void);

/*
 * The add lock: an flock on /dev/ublk-control (so every rnbd-clientd that
 * sees the same devices meets it, whatever its --runtime-dir) held by
 * ublk_dev_add from before ADD_DEV until START_DEV has returned, and by
 * rnbd-clientd's orphan_scan while it deletes dead devices no record
 * names: with it held, no such device is in the middle of an add, even
 * where the kernel names no pid for the adder. The threads of one process
 * share it (the flock is taken by the first and let go by the last), so
 * only processes exclude each other. Waits up to wait_ms for it: 0, to
 * give ublk_add_unlock, or a negative errno (-EWOULDBLOCK: another process
 * held it all that time).
 */
int ublk_add_lock(unsigned wait_ms);
void ublk_add_unlock(int taken);

/* Device N's state: 0, -ENODEV when there is none, or another negative errno. */
int ublk_dev_state(int dev_id, struct ublk_state *st);

/* Stops and deletes device N, left by a daemon and not taken over: its held IO fails. */
int ublk_dev_abandon(int dev_id);

/*
 * Attaches to /dev/ublkb<dev_id>, left by a daemon that ended, as the
 * block device of d (mapped again by the caller): waits up to wait_ms for
 * the kernel to have let the old daemon go (-EBUSY after it: another
 * daemon still serves it; -ESHUTDOWN as soon as stop() says so), then
 * serves the device, its held IO first. 0 with *out, or a negative errno
 * with why. *touched says whether the recovery started: on a failure
 * before (no memory, the kernel refusing START_USER_RECOVERY) the device
 * is left as it was, its IO held, for another try; after, it is stopped
 * (its held IO fails).
 */
int ublk_dev_recover(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		     int dev_id, unsigned wait_ms, bool (*stop)(void), bool *touched,
		     struct ublk_dev **out, char *why, size_t len);

/*
 * A planned handover to the next daemon: requests that come from now on
 * are left for the kernel to give the next daemon; those sent to the RNBD
 * device are waited for, up to wait_ms, and answered. Then the queue
 * thread ends; the process is to exit without removing the device (its
 * exit hands the device to the kernel). Returns how many were still
 * unanswered (given again to the next daemon: the server fences them,
 * docs/protocol.md section 10). u is not freed.
 */
unsigned ublk_dev_handover(struct ublk_dev *u, unsigned wait_ms);

#endif
