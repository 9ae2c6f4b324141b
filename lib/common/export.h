/* SPDX-License-Identifier: MIT */
/*
 * lib/common goes into a process once: librtrs.so carries log.c and util.c
 * and exports what librnbd and the programs use of them under version
 * RTRS_PRIVATE (lib/rtrs/librtrs.map), so that librtrs and librnbd share
 * one log level and one sink. RTRS_PRIVATE is not API: it is for this
 * tree's own libraries and programs and may change with any release.
 *
 * COMMON_EXPORT(name) goes on such a declaration: default visibility, and
 * the linker name rtrs_common_NAME, so that a program's own log_msg or
 * parse_size is never bound to ours, nor ours to it. Code keeps calling
 * it by its C name.
 */
#ifndef RTRS_COMMON_EXPORT_H
#define RTRS_COMMON_EXPORT_H

#define COMMON_EXPORT_VIS __attribute__((visibility("default")))
#define COMMON_LINK_NAME(name) __asm__("rtrs_common_" #name)

#endif
