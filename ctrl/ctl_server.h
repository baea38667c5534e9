/* SPDX-License-Identifier: Apache-2.0 */
/* The control socket: a unix listener with a lock that keeps a second daemon off the same path,
 * and one request/reply exchange per connection. */
#ifndef CTL_SERVER_H
#define CTL_SERVER_H

#include <stdbool.h>

#include "ctl_proto.h"
#include "xp_loop.h"

struct ctl_server;

/* -EADDRINUSE when another vmigd holds path (its pid in *holder when known). */
int ctl_server_new(struct xp_loop *loop, const char *path, struct px_node *n,
		   const struct ctl_daemon_info *info, int *holder, struct ctl_server **ret);
/* The control socket and its lock handed over by the vmigd this one takes over from. */
int ctl_server_adopt(struct xp_loop *loop, const char *path, int fd, int lock_fd, struct px_node *n,
		     const struct ctl_daemon_info *info, struct ctl_server **ret);
/* Once the old vmigd has let go: the socket and lock files are this process's (its pid in the
 * lock, removed at exit); until then a failed start leaves them to the old one. */
void ctl_server_own(struct ctl_server *s);
/* The listener and the lock file's fd, to hand over; -1 once released. */
void ctl_server_fds(const struct ctl_server *s, int *fd, int *lock_fd);
/* Stops (or resumes) accepting clients; the listener stays open. 0 or -errno. */
int ctl_server_pause(struct ctl_server *s, bool pause);
/* Handed over: stops accepting and closes this process's copies of the listener and the lock,
 * leaving the socket file, the lock file and the clients being served. */
void ctl_server_release(struct ctl_server *s);
/* A request served as a client's would be (the reply malloc'd; NULL when out of memory): for
 * those a newer vmigd passes on after a takeover. */
char *ctl_server_handle(struct ctl_server *s, const char *text, size_t len);
/* The functions above, for the takeover (struct ctl_takeover_server_ops, ctl_takeover.h). */
struct ctl_takeover_server_ops;
extern const struct ctl_takeover_server_ops ctl_server_takeover_ops;
/* Removes the socket and the lock, unless released. Takes NULL. */
void ctl_server_free(struct ctl_server *s);

#endif
