/* SPDX-License-Identifier: Apache-2.0 */
/* Paths in directories that less trusted users can write (a launcher's /var/run/kubevirt seen
 * through /proc/PID/root): resolved by openat2 without following a link, and unix sockets
 * made and reached there through directory fds, never by a path that could be swapped. */
#ifndef XP_PATH_H
#define XP_PATH_H

#include <stddef.h>

struct xp_unix_owner;

/*
 * Opens the directory path (absolute) as an O_PATH fd. Below a "/proc/PID/root" prefix the
 * rest resolves inside that root (RESOLVE_IN_ROOT: a link there cannot leave the launcher's
 * filesystem); any other path must have no symbolic link at all. Magic links (/proc/N/...)
 * never resolve past the prefix. -ELOOP: a link in the way; -EXDEV: it leads out of the
 * root; -ENOTDIR; -ENOSYS: the kernel has no openat2 (Linux 5.6), refused rather than
 * resolved by a walk that follows links.
 */
int xp_path_open_dir(const char *path, int *ret_fd);

/* The directory part of path into dir ("/" for "/x"; "" when there is no slash), *name pointing
 * into path at its last component. -EINVAL when there is no slash or the last component is
 * empty, "." or ".." (dir is still filled then). */
int xp_path_split(const char *path, char *dir, size_t dirlen, const char **name);

/* Opens the directory that holds path's last component, as xp_path_open_dir does; *name points
 * into path at that component. */
int xp_path_open_parent(const char *path, int *ret_fd, const char **name);

/*
 * name, a directory below dirfd (a real one: a link there is -ELOOP, another file
 * -ENOTDIR), made with mode if missing; then given owner's uid:gid (-1: left) and its mode
 * through its own fd, whatever the umask. *ret_fd: an O_RDONLY fd of it.
 */
int xp_path_make_dir(int dirfd, const char *name, const struct xp_unix_owner *owner,
		     int *ret_fd);

/* A short explanation of an error of the functions above, for an operator. */
const char *xp_path_strerror(int r);

#endif
