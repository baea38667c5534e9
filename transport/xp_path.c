// SPDX-License-Identifier: Apache-2.0
/* Directories that less trusted users can write, resolved without following links: openat2
 * with RESOLVE_NO_SYMLINKS, or RESOLVE_IN_ROOT below a /proc/PID/root prefix (xp_path.h). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "xp_path.h"
#include "xp_sock.h"

static int sys_openat2(int dirfd, const char *path, uint64_t flags, uint64_t resolve)
{
	struct open_how how = { .flags = flags, .resolve = resolve };
	long r = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));

	return r < 0 ? -errno : (int)r;
}

/* The length of a "/proc/PID/root" prefix of path, 0 when there is none. */
static size_t proc_root_prefix(const char *path)
{
	const char *p = path + 6;

	if (strncmp(path, "/proc/", 6) || !isdigit((unsigned char)*p))
		return 0;
	while (isdigit((unsigned char)*p))
		p++;
	if (strncmp(p, "/root", 5) || (p[5] && p[5] != '/'))
		return 0;
	return (size_t)(p + 5 - path);
}

int xp_path_open_dir(const char *path, int *ret_fd)
{
	const int flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
	size_t pre = proc_root_prefix(path);
	char root_path[32];
	const char *rest;
	int root, fd;

	if (path[0] != '/')
		return -EINVAL;
	if (!pre) {
		fd = sys_openat2(AT_FDCWD, path, flags,
				 RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
		goto out;
	}
	if (pre >= sizeof(root_path))
		return -ENAMETOOLONG;
	/* The caller named that process's root: its magic link is followed, nothing below. */
	memcpy(root_path, path, pre);
	root_path[pre] = '\0';
	root = open(root_path, flags);
	if (root < 0)
		return -errno;
	for (rest = path + pre; *rest == '/'; rest++)
		;
	fd = sys_openat2(root, *rest ? rest : ".", flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
	close(root);
out:
	if (fd < 0)
		return fd;
	*ret_fd = fd;
	return 0;
}

int xp_path_split(const char *path, char *dir, size_t dirlen, const char **name)
{
	const char *slash = strrchr(path, '/');
	size_t len;

	dir[0] = '\0';
	if (!slash)
		return -EINVAL;
	len = slash == path ? 1 : (size_t)(slash - path);
	if (len >= dirlen)
		return -ENAMETOOLONG;
	memcpy(dir, path, len);
	dir[len] = '\0';
	*name = slash + 1;
	return !slash[1] || !strcmp(slash + 1, ".") || !strcmp(slash + 1, "..") ? -EINVAL : 0;
}

int xp_path_open_parent(const char *path, int *ret_fd, const char **name)
{
	char dir[4096];
	int r = xp_path_split(path, dir, sizeof(dir), name);

	return r < 0 ? r : xp_path_open_dir(dir, ret_fd);
}

int xp_path_make_dir(int dirfd, const char *name, const struct xp_unix_owner *owner,
		     int *ret_fd)
{
	int fd, r;

	if (!*name || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	if (mkdirat(dirfd, name, owner->mode) < 0 && errno != EEXIST)
		return -errno;
	/* O_NOFOLLOW with O_DIRECTORY: a link put there fails as ENOTDIR; told apart below. */
	fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		struct stat st;

		r = -errno;
		if (r == -ENOTDIR && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISLNK(st.st_mode))
			r = -ELOOP;
		return r;
	}
	if (fchmod(fd, owner->mode) < 0 ||
	    ((owner->uid >= 0 || owner->gid >= 0) && fchown(fd, owner->uid, owner->gid) < 0)) {
		r = -errno;
		close(fd);
		return r;
	}
	*ret_fd = fd;
	return 0;
}

const char *xp_path_strerror(int r)
{
	switch (r) {
	case -ELOOP:
		return "a symbolic link is in the way (vmigd never follows one there)";
	case -EXDEV:
		return "the path leads out of the process root it names";
	case -ENOSYS:
		return "this kernel has no openat2 (Linux 5.6): vmigd will not resolve the path "
		       "by a walk that follows links";
	case -ENOTSOCK:
		return "not a socket";
	case -EPERM:
		return "the socket belongs to another user (not root, vmigd or --socket-owner)";
	default:
		return strerror(-r);
	}
}
