/* SPDX-License-Identifier: MIT */
/* Exported device paths (see rnbd-path.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rnbd-export.h"
#include "rnbd-path.h"
#include "rnbd-proto.h"

int rnbd_search_root(const char *search, const char *sessname, char *out, size_t len,
		     const char **why)
{
	const size_t tok = strlen(RNBD_SESSNAME_TOKEN);
	size_t n = 0;

	if (!search || !*search)
		REJECT(-EINVAL, "empty search path");
	if (strstr(search, RNBD_SESSNAME_TOKEN) &&
	    (!sessname || !*sessname || strchr(sessname, '/') || !strcmp(sessname, ".") ||
	     !strcmp(sessname, "..")))
		REJECT(-EINVAL, "session name is not one path component");
	for (const char *p = search; *p;) {
		const char *piece = p;
		size_t plen = 1;

		if (!strncmp(p, RNBD_SESSNAME_TOKEN, tok)) {
			piece = sessname;
			plen = strlen(sessname);
			p += tok;
		} else {
			p++;
		}
		if (n + plen >= len)
			REJECT(-ENAMETOOLONG, "search path too long");
		memcpy(out + n, piece, plen);
		n += plen;
	}
	out[n] = '\0';
	return 0;
}

int rnbd_dev_open(const char *root, const char *dev_name, int flags, int *fd, const char **why)
{
	/*
	 * O_PATH: the lookup only. No driver's open runs, so a FIFO, a
	 * terminal or a watchdog below the search path learns nothing of a
	 * client asking for it; the type is checked before anything is opened.
	 */
	struct open_how how = {
		.flags = O_PATH | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	struct stat st, got;
	char self[64];
	int dir, path, rc;

	if (!rnbd_dev_name_valid(dev_name, why))
		return -EINVAL;
	while (*dev_name == '/')
		dev_name++;
	dir = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dir < 0) {
		rc = -errno;
		REJECT(rc, "cannot open the search path");
	}
	/*
	 * EAGAIN: a rename or mount somewhere raced a ".." of the walk (a
	 * link below the root may hold one); the kernel asks to try again.
	 */
	for (int tries = 0;; tries++) {
		path = (int)syscall(SYS_openat2, dir, dev_name, &how, sizeof(how));
		rc = path < 0 ? -errno : 0;
		if (rc != -EAGAIN || tries == 7)
			break;
	}
	close(dir);
	if (rc == -EXDEV)
		REJECT(-EACCES, "device path leads out of the search path");
	if (rc)
		REJECT(rc, "cannot look the device up");
	if (fstat(path, &st) || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
		close(path);
		REJECT(-ENOTBLK, "not a file or block device");
	}
	/*
	 * Opened through the O_PATH descriptor itself, not by name again: the
	 * object checked is the object opened, whatever is renamed or swapped
	 * in the directory meanwhile. fstat confirms it (same device, inode
	 * and type).
	 */
	snprintf(self, sizeof(self), "/proc/self/fd/%d", path);
	rc = open(self, flags | O_CLOEXEC | O_NOCTTY);
	if (rc < 0) {
		int err = -errno;

		close(path);
		if (err == -ENOENT)
			REJECT(-ENXIO, "cannot open it through /proc/self/fd (is /proc mounted?)");
		REJECT(err, "cannot open the device");
	}
	close(path);
	if (fstat(rc, &got) || got.st_dev != st.st_dev || got.st_ino != st.st_ino ||
	    (got.st_mode & S_IFMT) != (st.st_mode & S_IFMT)) {
		close(rc);
		REJECT(-ESTALE, "the device changed while it was being opened");
	}
	*fd = rc;
	return 0;
}

RNBD_EXPORT
void rnbd_dev_name_normalize(char *name)
{
	char *w = name;

	for (const char *r = name; *r; r++) {
		if (*r == '/' && (w == name || w[-1] == '/'))
			continue;
		*w++ = *r;
	}
	if (w > name && w[-1] == '/')
		w--;
	*w = '\0';
}
