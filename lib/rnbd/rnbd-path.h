/* SPDX-License-Identifier: MIT */
/*
 * Where an exported device lives: the server's search path (which may hold
 * %SESSNAME%, replaced by the session's name to give each session its own
 * directory) plus the name the client asked for. The name may not leave
 * the search path, neither by "." and ".." (refused before any lookup) nor
 * by symlinks (the kernel resolves below the search path only:
 * openat2 RESOLVE_BENEATH).
 */
#ifndef RNBD_PATH_H
#define RNBD_PATH_H

#include <stddef.h>

#define RNBD_SESSNAME_TOKEN "%SESSNAME%"

/*
 * The search path for session sessname, every %SESSNAME% replaced. The
 * session name must be one path component. 0, -EINVAL or -ENAMETOOLONG.
 */
int rnbd_search_root(const char *search, const char *sessname, char *out, size_t len,
		     const char **why);

/*
 * Opens dev_name below root with open(2) flags; *fd is the new descriptor.
 * Only a regular file or a block device is opened: the name is looked up
 * first (O_PATH, which opens nothing), its type checked, and then that very
 * object is opened (through /proc/self/fd) and checked again to be the
 * same (device, inode, type). 0, or a negative errno: -EINVAL (a name no
 * client may ask for), -EACCES (it leads out of root), -ENOTBLK (neither a
 * file nor a block device), -ESTALE (it changed under the open), -ENXIO
 * (no /proc), or what the lookup or open found (-ENOENT ...).
 */
int rnbd_dev_open(const char *root, const char *dev_name, int flags, int *fd, const char **why);

/*
 * A device name in its one spelling, in place: leading, trailing and
 * repeated '/' dropped ("/a//b/" -> "a/b"), so that one device has one name.
 */
void rnbd_dev_name_normalize(char *name);

#endif
