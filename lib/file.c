// SPDX-License-Identifier: Apache-2.0
/* vm_file_read_checked(): a trusted small file read without blocking and checked for type, size,
 * owner and mode on the descriptor it is read from (no window between check and read). */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "file.h"

static const char *kind(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFIFO:
		return "a FIFO";
	case S_IFCHR:
		return "a character device";
	case S_IFBLK:
		return "a block device";
	case S_IFDIR:
		return "a directory";
	case S_IFSOCK:
		return "a socket";
	default:
		return "not a regular file";
	}
}

/* "others", "its group" or "its group and others", for the bits of mode in grp/oth. */
static const char *who(mode_t m, mode_t grp, mode_t oth)
{
	if ((m & grp) && (m & oth))
		return "its group and others";
	return (m & oth) ? "others" : "its group";
}

/* The owner or mode problem of st, in msg, and what to do about it; NULL: none. */
static const char *mode_problem(const struct stat *st, const char *path, const char *what,
				unsigned int flags, char *msg, size_t msglen)
{
	mode_t m = st->st_mode & 07777;
	uid_t euid = geteuid();

	if (st->st_uid != 0 && st->st_uid != euid) {
		if (euid == 0)
			snprintf(msg, msglen, "%s %s is owned by uid %u, not root", what, path,
				 (unsigned int)st->st_uid);
		else
			snprintf(msg, msglen,
				 "%s %s is owned by uid %u, neither root nor vmigd's uid %u", what,
				 path, (unsigned int)st->st_uid, (unsigned int)euid);
		return "chown it";
	}
	if (m & (S_IWGRP | S_IWOTH)) {
		snprintf(msg, msglen, "%s %s is writable by %s (mode %04o)", what, path,
			 who(m, S_IWGRP, S_IWOTH), (unsigned int)m);
		return "chmod go-w it";
	}
	if ((flags & VM_FILE_SECRET) && (m & (S_IRGRP | S_IROTH | S_IXGRP | S_IXOTH))) {
		snprintf(msg, msglen, "%s %s is readable by %s (mode %04o)", what, path,
			 who(m, S_IRGRP | S_IXGRP, S_IROTH | S_IXOTH), (unsigned int)m);
		return "chmod 600 it";
	}
	return NULL;
}

static int read_all(int fd, size_t hint, size_t max, char **data, size_t *len)
{
	size_t cap = (hint < max ? hint : max) + 1, n = 0;
	char *buf = malloc(cap + 1), *bigger;
	ssize_t got;

	if (!buf)
		return -ENOMEM;
	for (;;) {
		if (n == cap) {
			if (cap > max) {
				free(buf);
				return -EFBIG;
			}
			cap = cap * 2 > max + 1 ? max + 1 : cap * 2;
			bigger = realloc(buf, cap + 1);
			if (!bigger) {
				free(buf);
				return -ENOMEM;
			}
			buf = bigger;
		}
		got = read(fd, buf + n, cap - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			got = -errno;
			free(buf);
			return (int)got;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	if (n > max) {
		free(buf);
		return -EFBIG;
	}
	buf[n] = '\0';
	*data = buf;
	*len = n;
	return 0;
}

int vm_file_read_checked(const char *path, const char *what, unsigned int flags, size_t max,
			 char **data, size_t *len, char *msg, size_t msglen)
{
	struct statvfs vfs;
	struct stat st;
	const char *hint;
	bool warn = false;
	int fd, r;

	msg[0] = '\0';
	/* O_NONBLOCK: opening a FIFO without a writer must not wait; fstat() then refuses it. */
	fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		r = -errno;
		snprintf(msg, msglen, "cannot read %s %s: %s", what, path, strerror(-r));
		return r;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		snprintf(msg, msglen, "cannot read %s %s: %s", what, path, strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(msg, msglen, "%s %s is %s, not a regular file", what, path,
			 kind(st.st_mode));
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		goto out;
	}
	if ((size_t)st.st_size > max) {
		snprintf(msg, msglen, "%s %s is larger than %zu bytes (%lld)", what, path, max,
			 (long long)st.st_size);
		r = -EFBIG;
		goto out;
	}
	hint = mode_problem(&st, path, what, flags, msg, msglen);
	if (hint) {
		/* A secret volume: mounted read-only by the kubelet, its modes set by the pod's
		 * spec (KubeVirt's: 0644), not by us. Nobody writes it through this mount. */
		warn = fstatvfs(fd, &vfs) == 0 && (vfs.f_flag & ST_RDONLY);
		snprintf(msg + strlen(msg), msglen - strlen(msg), "; %s",
			 warn ? "allowed: it is on a read-only mount (a Kubernetes secret volume?)"
			      : hint);
		if (!warn) {
			r = -EPERM;
			goto out;
		}
	}
	r = read_all(fd, (size_t)st.st_size, max, data, len);
	if (r == -EFBIG)
		snprintf(msg, msglen, "%s %s is larger than %zu bytes", what, path, max);
	else if (r < 0)
		snprintf(msg, msglen, "cannot read %s %s: %s", what, path, strerror(-r));
	else
		r = warn;
out:
	close(fd);
	return r;
}
