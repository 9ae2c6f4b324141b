/* SPDX-License-Identifier: MIT */
/*
 * librnbd.so is built with hidden visibility: a function is exported only
 * when its definition carries RNBD_EXPORT, and then only if librnbd.map
 * names it too. Every RNBD_EXPORT function is declared in include/rnbd.h
 * (tests/unit/linkage.sh checks it, and debian/librnbd0.symbols keeps the
 * list stable).
 */
#ifndef RNBD_EXPORT_H
#define RNBD_EXPORT_H

#define RNBD_EXPORT __attribute__((visibility("default")))

#endif
