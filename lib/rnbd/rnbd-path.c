/* SPDX-License-Identifier: MIT */
/* Exported device paths (see rnbd-path.h). */
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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
	struct open_how how = {
		.flags = (unsigned)flags | O_CLOEXEC | O_NOCTTY,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	struct stat st;
	int dir, rc;

	if (!rnbd_dev_name_valid(dev_name, why))
		return -EINVAL;
	while (*dev_name == '/')
		dev_name++;
	dir = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dir < 0) {
		rc = -errno;
		REJECT(rc, "cannot open the search path");
	}
	/* Non-blocking: a FIFO or a device that waits must not hold the caller. */
	how.flags |= O_NONBLOCK;
	rc = (int)syscall(SYS_openat2, dir, dev_name, &how, sizeof(how));
	if (rc < 0) {
		rc = -errno;
		close(dir);
		if (rc == -EXDEV)
			REJECT(-EACCES, "device path leads out of the search path");
		REJECT(rc, "cannot open the device");
	}
	close(dir);
	if (fstat(rc, &st) || !(S_ISREG(st.st_mode) || S_ISBLK(st.st_mode))) {
		close(rc);
		REJECT(-ENOTBLK, "not a file or block device");
	}
	if (fcntl(rc, F_SETFL, fcntl(rc, F_GETFL) & ~O_NONBLOCK)) {
		int err = -errno;

		close(rc);
		REJECT(err, "cannot open the device");
	}
	*fd = rc;
	return 0;
}

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
