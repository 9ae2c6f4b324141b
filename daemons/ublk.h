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

#include <stddef.h>

#include "rnbd.h"

struct ublk_dev;

/* 0 when this kernel can make ublk devices, else a negative errno and why. */
int ublk_probe(char *why, size_t len);

/*
 * A block device for d, of session sess, started: *out, its number N
 * (/dev/ublkbN) in *dev_id. Its queue thread polls sess for d's
 * completions (rnbd_clt_poll), where the fabric allows. The caller keeps
 * d mapped until ublk_dev_remove returns. 0 or a negative errno with why.
 */
int ublk_dev_add(struct rnbd_clt_sess *sess, struct rnbd_clt_dev *d, const char *name,
		 struct ublk_dev **out, int *dev_id, char *why, size_t len);

/*
 * Stops and deletes the block device: requests still queued fail, those
 * sent to the server are waited for. After it, nothing of d is used.
 */
void ublk_dev_remove(struct ublk_dev *u);

#endif
