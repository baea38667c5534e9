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

/*
 * A resumable connection whose DPDK path failed, or that the peer resumes over the kernel path:
 * its link goes on there from where it stood (the bytes the peer may lack included), suspended
 * until a new node-hop connection carries it on (px_resume.c), with its caps, its inspector and
 * its digests as they were. One it cannot carry on there ends as a failed connection.
 */
void px_dpdk_fallback(struct px_conn *c, const struct xp_link_result *res)
{
	const struct xp_link_state *st = res->fallback;
	struct px_migration *m = c->m;
	struct px_node *n = c->n;
	struct xp_link_opts o;
	struct xp_link_result end;
	int r;

	snprintf(c->lost, sizeof(c->lost), "DPDK node hop: %s%s%.100s",
		 res->asked ? "the peer resumes it over the kernel path" : strerror(-res->err),
		 res->detail[0] ? ": " : "", res->detail);
	c->fallbacks++;
	n->dpdk_fallbacks++;
	c->fell_back = true;
	log_warn("migration %s role=%s: port %u connection %u: %s, after %llu/%llu bytes (tx/rx); "
		 "falling back to the kernel path from offset %llu, %zu bytes kept for the peer",
		 m->key, px_role_str(m->role), c->port->id, c->seq, c->lost,
		 (unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1],
		 (unsigned long long)(st->sent - st->kept_len), st->kept_len);
	memset(&c->dpdk, 0, sizeof(c->dpdk));
	px_conn_link_opts(c, &o);
	o.adopt = st;
	o.adopt_tls = c->tls.version[0] != '\0';
	r = IO(n, attach, st->fd, NULL, &o, &c->link);
	if (r == 0)
		return; /* its suspension report follows */
	IO(n, close_fd, st->fd, true);
	c->fell_back = false;
	end = *res;
	end.end = XP_END_ERROR;
	end.err = r;
	end.err_side = 1;
	end.fallback = NULL;
	snprintf(end.detail, sizeof(end.detail), "cannot go on over the kernel path (%.120s)",
		 c->lost);
	px_conn_done(c, &end, NULL);
}
