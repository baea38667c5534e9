/* SPDX-License-Identifier: Apache-2.0 */
/* A live migration moved at a takeover (px_node.h's struct px_move) as one JSON line and the fds
 * it names by index: what the old vmigd writes and the new one checks. Pure, fuzzed. */
#ifndef CTL_MOVE_H
#define CTL_MOVE_H

#include <json-c/json.h>

#include "px_node.h"

/* The most fds one move names: a source's listeners and directory, and QEMU's sockets. */
#define CTL_MOVE_FDS_MAX (PX_PORTS_MAX + 1 + PX_MOVE_CONNS_MAX)

/* A new {"op":"move",...} object; mv's fds go into fds (*nfds of them, at most
 * CTL_MOVE_FDS_MAX) in the order the object names them. NULL when out of memory. */
struct json_object *ctl_move_to_json(const struct px_move *mv, int *fds, unsigned int *nfds);
/*
 * Back: fds[i] is the fd index i names; each is used at most once, and -1 in mv where an index
 * names none. 0, or -EPROTO with one line in err. *mv is written either way (its fds -1 on
 * failure); the caller closes fds.
 */
int ctl_move_from_json(struct json_object *o, const int *fds, unsigned int nfds, struct px_move *mv,
		       char *err, size_t errlen);

#endif
