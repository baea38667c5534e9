// SPDX-License-Identifier: Apache-2.0
/* Builds the node's transport (ctl_hop.h): the io_uring pool's settings from the node's, and the
 * DPDK node hop where --dpdk asks for one. proxy/ gets the io whole and never sees the hop. */
#include <errno.h>
#include <string.h>

#include "ctl_hop.h"
#include "log.h"
#include "xp_dhop.h"

static int hop_new(const struct px_config *pc, const struct ctl_hop_conf *hc, struct xp_dhop **ret)
{
	struct xp_dhop_conf dc = {
		.eal = hc->eal,
		.address = hc->address,
		.udp_port = hc->udp_port,
		.link_buffer = hc->buffer,
		/* as many as the kernel path carries (--max-connections) */
		.max_links = pc->slots * pc->threads,
		.wrap = hc->wrap,
	};
	char err[256];
	int r;

	r = xp_dhop_new(&dc, ret, err, sizeof(err));
	if (r < 0)
		log_err("cannot open the DPDK node hop: %s", err[0] ? err : strerror(-r));
	return r;
}

int ctl_io_new(struct xp_loop *loop, const struct px_config *pc, const struct ctl_hop_conf *hc,
	       struct xp_io **ret)
{
	struct xp_pool_conf pool = {
		.threads = pc->threads,
		.slots = pc->slots,
		.pipe_size = pc->pipe_size,
		.path = pc->copy_path ? XP_PATH_COPY : XP_PATH_SPLICE,
		.cpus = pc->pin ? &pc->cpus : NULL,
	};
	struct xp_dhop *hop = NULL;
	int r;

	if (hc && hc->eal) {
		r = hop_new(pc, hc, &hop);
		if (r < 0)
			return r;
	}
	r = xp_io_new(loop, &pool, pc->tls, hop, ret);
	if (r < 0)
		goto free_hop;
	return 0;

free_hop:
	xp_dhop_free(hop);
	return r;
}
