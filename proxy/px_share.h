/* SPDX-License-Identifier: Apache-2.0 */
/* Max-min fair shares of a node's bandwidth cap among its migrations: each gets what it asks for
 * if that is no more than an equal share of what is left, and the rest is split among the others.
 * A pure function, so the policy is tested apart from the clock and the sockets. */
#ifndef PX_SHARE_H
#define PX_SHARE_H

#include <stdint.h>

/* Bandwidth in bytes/s; UINT64_MAX is "unbounded". */
struct px_share_in {
	uint64_t cap;	 /* the migration's own cap; 0: none */
	uint64_t demand; /* what it would send if let; UINT64_MAX while it is held back */
};

/*
 * out[i] = min(cap, demand, level), the level chosen so that the sum is total when demand allows
 * (water-filling). total 0: no node cap, out[i] is the migration's own cap (0: none). With a node
 * cap, out[i] is never 0, so that an idle migration can start.
 */
void px_share(uint64_t total, unsigned int n, const struct px_share_in *in, uint64_t *out);

#endif
