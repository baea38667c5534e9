/* SPDX-License-Identifier: Apache-2.0 */
/* A link of any of the transport's data paths (the io_uring pool's, the DPDK hop's): each starts
 * with struct xp_link, whose ops say how to reach it. Not for creating links: each path has its own
 * attach. */
#ifndef XP_LINK_H
#define XP_LINK_H

#include <stdint.h>

struct xp_link;

/* Every call runs on the control thread. */
struct xp_link_ops {
	/* Asks the data path to cut the link; its done callback follows. Idempotent. */
	void (*abort)(struct xp_link *l);
	/* Live byte counters, [0]: from the local socket to the peer, [1]: back. */
	void (*bytes)(const struct xp_link *l, uint64_t out[2]);
	/* Time the local socket's bytes waited for their buckets so far, in ns. */
	uint64_t (*shaped_ns)(const struct xp_link *l);
	/* Paces what the link sends to the peer (bytes/s, 0: none); a path without pacing
	 * ignores it. */
	void (*set_pacing)(struct xp_link *l, uint64_t rate);
};

/* The head of every link: a data path embeds it first in a link of its own. */
struct xp_link {
	const struct xp_link_ops *ops;
};

static inline void xp_link_abort(struct xp_link *l)
{
	l->ops->abort(l);
}

static inline void xp_link_bytes(const struct xp_link *l, uint64_t out[2])
{
	l->ops->bytes(l, out);
}

static inline uint64_t xp_link_shaped_ns(const struct xp_link *l)
{
	return l->ops->shaped_ns(l);
}

static inline void xp_link_set_pacing(struct xp_link *l, uint64_t rate)
{
	l->ops->set_pacing(l, rate);
}

#endif
