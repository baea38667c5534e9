// SPDX-License-Identifier: Apache-2.0
/* Which path a new connection takes while the DPDK node hop's link is down or its peer was found
 * unreachable (the kernel path), and the log lines when that changes, once per change: proxy's
 * policy over the transport's health (xp_hop_health). The liveness itself is xp_dhop.c's. */
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "px_private.h"

/* A link down for less than this is not logged yet, unless a connection is decided by it: a
 * memif port is down for the few milliseconds of its handshake at every start. */
#define LINK_LOG_MS 1000

static void ip_str(uint32_t ip, char *buf, size_t len)
{
	snprintf(buf, len, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 255, (ip >> 8) & 255, ip & 255);
}

static bool has_peer(const struct xp_hop_health *h, uint32_t ip)
{
	for (unsigned int i = 0; i < h->npeers; i++)
		if (h->peers[i].ip == ip)
			return true;
	return false;
}

/* Logs what changed since the last look and remembers it. force: a link down for less than
 * LINK_LOG_MS too. */
static void note(struct px_node *n, const struct xp_hop_health *h, bool force)
{
	struct xp_hop_health *was = &n->dpdk_seen;
	char ip[16];

	if (h->link_up != was->link_up && (force || h->link_up || h->link_for_ms >= LINK_LOG_MS)) {
		if (h->link_up)
			log_info("DPDK node hop: link up again; new connections go over DPDK");
		else
			log_warn("DPDK node hop: link down (%s); new connections go over the "
				 "kernel path",
				 h->link_why);
		was->link_up = h->link_up;
	}
	for (unsigned int i = 0; i < was->npeers; i++)
		if (!has_peer(h, was->peers[i].ip)) {
			ip_str(was->peers[i].ip, ip, sizeof(ip));
			log_info("DPDK node hop: peer %s answered ARP again; new connections to "
				 "it go over DPDK",
				 ip);
		}
	for (unsigned int i = 0; i < h->npeers; i++)
		if (!has_peer(was, h->peers[i].ip)) {
			ip_str(h->peers[i].ip, ip, sizeof(ip));
			log_warn("DPDK node hop: peer %s unreachable (%s); new connections to it "
				 "go over the kernel path",
				 ip, h->peers[i].why);
		}
	was->npeers = h->npeers;
	memcpy(was->peers, h->peers, sizeof(was->peers));
}

void px_dpdk_watch(struct px_node *n)
{
	struct xp_hop_health h;

	if (n->dpdk.ip && IO(n, hop_health, &h) == 0)
		note(n, &h, false);
}

bool px_dpdk_usable(struct px_node *n, uint32_t peer_ip)
{
	struct xp_hop_health h;

	if (IO(n, hop_health, &h) < 0)
		return false;
	note(n, &h, true);
	return h.link_up && !has_peer(&h, peer_ip);
}
