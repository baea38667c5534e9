// SPDX-License-Identifier: Apache-2.0
/* The DPDK node hop's liveness (doc/design.md, "Liveness"): the port's link, the peers found
 * unreachable and the health new connections are chosen by; the rules that end a link that cannot
 * work; and a resumable link falling back to the kernel path ("Falling back"). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xp_dhop_priv.h"

/* The thread's view of the link and the peers, for the control thread (xp_dhop_health()). */
static void publish(struct xp_dhop *d, uint64_t now)
{
	struct xp_hop_health h = { .link_up = d->link_up, .npeers = d->nunreachable };
	struct xp_dpdk_stats ds;

	if (!d->link_up)
		xp_dpdk_link_why(d->port, h.link_why, sizeof(h.link_why));
	for (unsigned int i = 0; i < d->nunreachable; i++) {
		h.peers[i].ip = d->unreachable[i].ip;
		memcpy(h.peers[i].why, d->unreachable[i].why, sizeof(h.peers[i].why));
	}
	xp_dpdk_stats(d->port, &ds);
	pthread_mutex_lock(&d->mu);
	d->health = h;
	d->health_since_us = d->link_since_us;
	d->link_restarts = ds.link_restarts;
	pthread_mutex_unlock(&d->mu);
	d->published_us = now;
}

/*
 * The port's upkeep (xp_dpdk_tend(): a memif client's handshake tried again), and the peers
 * found unreachable: each asked for by ARP once a second while the link is up, and reachable
 * again once it answers.
 */
void xp_dhop_port_tend(struct xp_dhop *d, uint64_t now)
{
	bool up = xp_dpdk_tend(d->port, now), changed = false;
	uint64_t asking;

	if (up != d->link_up || !d->link_since_us) {
		d->link_up = up;
		d->link_since_us = now;
		changed = true;
	}
	for (unsigned int i = 0; i < d->nunreachable;) {
		struct unreachable *u = &d->unreachable[i];

		if (changed && up)
			u->probed_us = 0; /* a link back up asks at once */
		if (xp_dpdk_peer_arp(d->port, u->ip, now, &asking) == 1) {
			*u = d->unreachable[--d->nunreachable];
			changed = true;
			continue;
		}
		if (up && (!u->probed_us || now - u->probed_us >= PROBE_GAP_US)) {
			xp_dpdk_arp_probe(d->port, u->ip, now);
			u->probed_us = now;
		}
		i++;
	}
	if (changed || now - d->published_us >= PUBLISH_GAP_US)
		publish(d, now);
}

/* New connections to ip stop taking the hop (the control thread sees it in the health) until
 * the peer answers ARP again: its MAC is forgotten, as a silent peer may be elsewhere now. */
static void peer_unreachable(struct xp_dhop *d, uint32_t ip, const char *why, uint64_t now)
{
	struct unreachable *u = NULL;

	for (unsigned int i = 0; i < d->nunreachable && !u; i++)
		if (d->unreachable[i].ip == ip)
			u = &d->unreachable[i];
	if (!u && d->nunreachable == XP_HOP_HEALTH_PEERS) {
		/* full: the oldest makes room, and is tried again by the next connection to it */
		memmove(&d->unreachable[0], &d->unreachable[1],
			sizeof(d->unreachable[0]) * (XP_HOP_HEALTH_PEERS - 1));
		d->nunreachable--;
	}
	if (!u)
		u = &d->unreachable[d->nunreachable++];
	u->ip = ip;
	u->probed_us = now;
	snprintf(u->why, sizeof(u->why), "%s", why);
	xp_dpdk_peer_forget(d->port, ip);
	publish(d, now);
}

int xp_dhop_health(const struct xp_dhop *d, struct xp_hop_health *out)
{
	uint64_t now = vm_now_ns() / 1000;

	pthread_mutex_lock((pthread_mutex_t *)&d->mu);
	*out = d->health;
	out->link_for_ms = now > d->health_since_us ? (now - d->health_since_us) / 1000 : 0;
	pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
	return 0;
}

void xp_dhop_link_fail(struct dhop_link *l, int err, int side, const char *fmt, ...)
{
	va_list ap;

	if (l->res.end != XP_END_CLEAN || l->res.err)
		return; /* the first reason stands */
	l->res.end = XP_END_ERROR;
	l->res.err = err;
	l->res.err_side = side;
	va_start(ap, fmt);
	vsnprintf(l->res.detail, sizeof(l->res.detail), fmt, ap);
	va_end(ap);
}

/* Falling back, QEMU's socket failed as what came in order was delivered to it: the link ends
 * with that error (the hop's failure that began it is in the log only: QEMU's is what counts). */
void xp_dhop_fall_broken(struct dhop_link *l, int err)
{
	char why[sizeof(l->res.detail)];

	snprintf(why, sizeof(why), "%s", l->res.detail);
	l->falling = false;
	l->res.end = XP_END_ERROR;
	l->res.err = err;
	l->res.err_side = 0;
	l->res.asked = false;
	snprintf(l->res.detail, sizeof(l->res.detail),
		 "delivering what came over DPDK before falling back to the kernel path (%.100s)",
		 why[0] ? why : "suspended");
}

/*
 * Liveness over DPDK, which the TCP connection cannot tell (it tells of a peer daemon that died;
 * this, of a DPDK path that broke or never worked), within the bounds doc/design.md states: the
 * port's link down DEAD_US; nothing heard from the peer since set-up DEAD_US while bytes of ours
 * wait on it (its ARP unanswered, or the peer silent); nothing heard PEER_SILENT_US while bytes
 * wait, once it was heard. A stream with nothing waiting may stay quiet: libvirt's own
 * connection does for most of a migration. A peer that failed a link unheard is unreachable for
 * new connections until it answers ARP again (xp_dhop_port_tend()).
 */
static bool link_dead(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	uint64_t since = d->link_since_us > l->begun_us ? d->link_since_us : l->begun_us, asking;
	struct xp_rel_stats rs;
	char ip[16], why[160];

	if (!d->link_up && now - since > DEAD_US) {
		xp_dpdk_link_why(d->port, why, sizeof(why));
		xp_dhop_link_fail(l, -ENETDOWN, 1, "DPDK link down for %llu s: %s",
				  DEAD_US / 1000000ull, why);
		return true;
	}
	xp_rel_stats(l->rel, &rs);
	if (rs.frames_received != l->last_frames_in || !xp_rel_waiting(l->rel)) {
		l->heard |= rs.frames_received != l->last_frames_in;
		l->last_frames_in = rs.frames_received;
		l->last_heard_us = now;
		return false;
	}
	if (now - l->last_heard_us <= (l->heard ? PEER_SILENT_US : DEAD_US))
		return false;
	if (!d->link_up) {
		/* the port, not the peer: a link set up just before it went down gets here first */
		xp_dpdk_link_why(d->port, why, sizeof(why));
		xp_dhop_link_fail(l, -ENETDOWN, 1, "DPDK link down for %llu s: %s",
				  (now - d->link_since_us) / 1000000ull, why);
		return true;
	}
	snprintf(ip, sizeof(ip), "%u.%u.%u.%u", l->c.peer_ip >> 24, (l->c.peer_ip >> 16) & 255,
		 (l->c.peer_ip >> 8) & 255, l->c.peer_ip & 255);
	if (l->heard)
		xp_dhop_link_fail(
			l, -ETIMEDOUT, 1,
			"peer silent for %llu s: no frame from it over DPDK while bytes of ours "
			"waited on it",
			PEER_SILENT_US / 1000000ull);
	else if (xp_dpdk_peer_arp(d->port, l->c.peer_ip, now, &asking) != 1)
		/* asked for, or forgotten a moment ago by another link to it that failed so */
		xp_dhop_link_fail(
			l, -EHOSTUNREACH, 1,
			"ARP for %s unanswered for %llu s: no frame from the peer over DPDK since "
			"the link was set up",
			ip, DEAD_US / 1000000ull);
	else
		xp_dhop_link_fail(
			l, -ETIMEDOUT, 1,
			"peer silent for %llu s: no frame from it over DPDK since the link was "
			"set up, with bytes of ours waiting",
			DEAD_US / 1000000ull);
	peer_unreachable(d, l->c.peer_ip, l->res.detail, now);
	return true;
}

/* Whether the link is over on this path, and how: its result is filled in. */
static bool link_over(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	if (l->res.end != XP_END_CLEAN || l->res.err)
		return true;
	if (atomic_load(&l->abort)) {
		l->res.end = XP_END_ABORTED;
		return true;
	}
	if (atomic_load(&l->suspend) && l->c.resumable && l->rel) {
		/* the peer resumes it over the kernel path (it lost this one first) */
		l->res.end = XP_END_ERROR;
		l->res.err_side = 1;
		l->res.asked = true;
		return true;
	}
	if (l->local_in_done && l->local_out_done && xp_rel_send_done(l->rel))
		return true;
	if (l->tcp_gone) {
		/* The peer ends its link once it has every byte of ours and we have all of its. */
		if (l->local_in_done && l->local_out_done)
			return true;
		xp_dhop_link_fail(
			l, -ECONNRESET, 1,
			"the peer vmigd closed the node-hop connection before the stream ended");
		return true;
	}
	return link_dead(d, l, now);
}

/*
 * A resumable link whose DPDK path failed, or that was asked to, goes on over the kernel path
 * (doc/design.md, "Falling back"): first it delivers what came in order, then fb says where it
 * stood. false: it ends as it is (not resumable, or its QEMU's side is what failed).
 */
static bool fall_start(struct dhop_link *l)
{
	if (!l->c.resumable || !l->rel || l->drop_rx || l->res.end != XP_END_ERROR ||
	    l->res.err_side != 1)
		return false;
	l->falling = true;
	l->out_ready = true; /* tried until it answers EAGAIN */
	return true;
}

/* Falling back: true once all that came in order is delivered and fb is filled in. */
static bool fall_drained(struct dhop_link *l)
{
	struct iovec iov[2];
	uint8_t *kept = NULL;
	size_t n;

	if (!l->falling)
		return true; /* it broke on the way: xp_dhop_fall_broken() */
	if (l->drop_rx) {
		/* QEMU closed after its end of stream: nothing to go on with, it ends as it is */
		l->falling = false;
		return true;
	}
	if (xp_rel_read_space(l->rel, iov) > 0 || !xp_dhop_z_drained(l))
		return false;
	if (xp_dhop_z_out(l)) {
		/* chunks: what the peer may lack is the plain bytes of those it had not whole */
		int r = xp_dhop_z_kept(l, &kept, &n);

		if (r < 0) {
			xp_dhop_fall_broken(l, r);
		return true;
	}
	} else if ((n = xp_rel_unacked(l->rel, iov)) && !(kept = malloc(n))) {
		xp_dhop_fall_broken(l, -ENOMEM);
		return true;
	} else if (n) {
		memcpy(kept, iov[0].iov_base, iov[0].iov_len);
		memcpy(kept + iov[0].iov_len, iov[1].iov_base, iov[1].iov_len);
	}
	memset(&l->fb, 0, sizeof(l->fb));
	l->fb.fd = l->c.local_fd;
	l->fb.sent = atomic_load_explicit(&l->bytes[0], memory_order_relaxed);
	l->fb.have = atomic_load_explicit(&l->bytes[1], memory_order_relaxed);
	l->fb.kept = kept;
	l->fb.kept_len = n;
	for (unsigned int i = 0; i < 2; i++) {
		int r = l->dg[i] ? vm_digest_save(l->dg[i], l->fb.dg[i], sizeof(l->fb.dg[i])) : 0;

		if (r < 0) {
			free(kept);
			l->fb.kept = NULL;
			xp_dhop_fall_broken(l, r);
			return true;
		}
		l->fb.dg_len[i] = (size_t)r;
	}
	l->falling = false;
	l->res.end = XP_END_FALLBACK;
	l->res.fallback = &l->fb;
	l->res.have = l->fb.have;
	l->res.kept_from = l->fb.sent - n;
	l->res.kept_to = l->fb.sent;
	return true;
}

/* Whether the link has ended on this path (over, or fallen back): its result is filled in. */
bool xp_dhop_link_ended(struct xp_dhop *d, struct dhop_link *l, uint64_t now)
{
	if (l->falling)
		return fall_drained(l);
	if (!link_over(d, l, now))
		return false;
	return !fall_start(l) || fall_drained(l);
}
