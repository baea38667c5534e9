/* SPDX-License-Identifier: Apache-2.0 */
/* Test machinery: a port (xp_hop_port_ops) that wraps another and damages what arrives there, a
 * share of datagrams dropped, duplicated, or held back behind the next one. Only the test build
 * of the daemon (vmigd-test) and tests/tools/dpdk-stream link it; the vmigd binary has none. */
#ifndef XP_IMPAIR_H
#define XP_IMPAIR_H

#include <stdint.h>

#include "xp_hop.h"

struct xp_impair;

struct xp_impair_conf {
	unsigned int loss_pct, dup_pct, reorder_pct; /* of the datagrams that arrive, 0 to 100 */
	uint32_t seed;				     /* of the draws (a linear congruential one) */
};

struct xp_impair_stats {
	uint64_t dropped, duplicated, reordered;
};

/* Wraps inner_ops over inner, which must outlive it. -ENOMEM. */
int xp_impair_new(const struct xp_impair_conf *conf, const struct xp_hop_port_ops *inner_ops,
		  void *inner, struct xp_impair **ret);
/* The wrapping port's ops (zero copy when the inner port's are); its port is im. */
const struct xp_hop_port_ops *xp_impair_ops(const struct xp_impair *im);
/* From any thread: the counts so far. */
void xp_impair_stats(const struct xp_impair *im, struct xp_impair_stats *out);
/* Takes NULL. */
void xp_impair_free(struct xp_impair *im);

#endif
