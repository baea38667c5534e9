/* SPDX-License-Identifier: Apache-2.0 */
/* Which NIC carries each migration's node hop, and what its link did: the route to the peer
 * looked up as the migration starts and again when addresses or routes change, link events
 * logged and kept per migration (down now, since when, how often), and the policy for a link
 * that goes down (doc/design.md): convergence held, the migration failed after a bound. */
#ifndef CTL_NIC_H
#define CTL_NIC_H

#include <stdbool.h>
#include <stdint.h>

#include "cv_watch.h"
#include "px_node.h"
#include "xp_loop.h"
#include "ctl_netlink.h"

struct ctl_nic;

/* What status and metrics show of one migration's NIC, or of the node's. */
struct ctl_nic_view {
	struct ctl_nic_info nic;
	uint64_t speed;	    /* bytes/s, from nic.speed_mbps */
	bool speed_known;   /* a device said it; veth, dummy and bridges never do */
	bool link_up;	    /* as the last link event (or lookup) said */
	uint64_t down_ms;   /* down for this long now; 0 while up */
	unsigned int downs; /* times it went down while the migration ran */
	char error[200];    /* the route cannot be looked up now: why (nic holds the last) */
};

/* Follows n's migrations from loop: a look at them every second, link and address events as
 * they come. While a migration's link is down its convergence watch (in conv, which may be
 * NULL) is held; down for down_timeout_s (0: never), a migration that has not reached QEMU's
 * switchover is failed. 0 or -errno. */
int ctl_nic_new(struct xp_loop *loop, struct px_node *n, struct cv_set *conv,
		unsigned int down_timeout_s, struct ctl_nic **ret);
/* Takes NULL. */
void ctl_nic_free(struct ctl_nic *c);
/* The migration's NIC as of now; false where its peer is not known yet (a target before its
 * first connection) or no route was ever found. */
bool ctl_nic_migration(struct ctl_nic *c, const struct px_migration_info *mi,
		       struct ctl_nic_view *out);
/* The interface that holds the node hop's advertised address; false where none does (an
 * address of another host, a name). */
bool ctl_nic_node(struct ctl_nic *c, struct ctl_nic_view *out);

#endif
