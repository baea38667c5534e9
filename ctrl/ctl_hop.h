/* SPDX-License-Identifier: Apache-2.0 */
/* The node's transport as vmigd builds it: the io_uring pool from the node's settings and, with
 * --dpdk, the DPDK node hop (EAL, port, sessions) handed to the io. Not the hop itself: xp_dhop.h.
 */
#ifndef CTL_HOP_H
#define CTL_HOP_H

#include <stdint.h>

#include "px_node.h"
#include "xp_io.h"
#include "xp_loop.h"

struct xp_dhop_wrap;

/* --dpdk and its companions. */
struct ctl_hop_conf {
	const char *eal;     /* EAL arguments; NULL: no hop */
	const char *address; /* "ADDR/PREFIX" on the port */
	uint16_t udp_port;
	uint32_t buffer;		 /* bytes per connection and direction */
	const struct xp_dhop_wrap *wrap; /* tests (ctl_test.h): around the port; NULL: none */
};

/* The io for px_node_new(): logs why not and returns -errno. tls (pc->tls) must outlive it. */
int ctl_io_new(struct xp_loop *loop, const struct px_config *pc, const struct ctl_hop_conf *hc,
	       struct xp_io **ret);

#endif
