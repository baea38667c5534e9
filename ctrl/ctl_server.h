/* SPDX-License-Identifier: Apache-2.0 */
/* The control socket: a unix listener with a lock that keeps a second daemon off the same path,
 * and one request/reply exchange per connection. */
#ifndef CTL_SERVER_H
#define CTL_SERVER_H

#include "ctl_proto.h"
#include "xp_loop.h"

struct ctl_server;

/* -EADDRINUSE when another vmigd holds path (its pid in *holder when known). */
int ctl_server_new(struct xp_loop *loop, const char *path, struct px_node *n,
		   const struct ctl_daemon_info *info, int *holder, struct ctl_server **ret);
/* Removes the socket and the lock. Takes NULL. */
void ctl_server_free(struct ctl_server *s);

#endif
