// SPDX-License-Identifier: Apache-2.0
/* The figures: rate meters brought up to date every tick (which also notices switchover and
 * re-shares the node cap), and the snapshots status and metrics read, px_node_foreach() and
 * px_node_info(). Reading only, but for the cap that switchover lifts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "px_private.h"

/*
 * QEMU lifts its own limit at switchover: the guest is stopped, and every byte still to go adds
 * to its downtime. A source migration's cap goes with it, unless --keep-cap-at-switchover.
 */
static void lift_cap_at_switchover(struct px_migration *m, const struct px_conn *c)
{
	struct px_insp_stats st;

	if (!c->insp || m->cap_lifted || m->n->conf.keep_cap_at_switchover ||
	    m->role != PX_ROLE_SOURCE)
		return;
	px_insp_read(c->insp, &st);
	if (!st.switchover)
		return;
	m->cap_lifted = true;
	if (m->cap || m->n->conf.node_bandwidth)
		log_info("migration %s role=source: switchover seen in the stream; its cap is "
			 "lifted for the final copy",
			 m->key);
	if (!m->n->conf.node_bandwidth)
		px_migration_apply_limit(m, 0);
}

/* What bytes sent (plain) took on the node hop: chunks in place of what they compressed. */
static uint64_t on_wire(uint64_t sent, uint64_t plain, uint64_t wire)
{
	return sent - plain + wire;
}

/*
 * A source connection's compression decisions, logged as they change with what they went on, at
 * most a line a second per connection (the state by then); not while it has never compressed.
 */
static void zwatch(const struct px_migration *m, struct px_conn *c, const struct xp_zfig *f,
		   uint64_t now)
{
	if (!c->zout_offered || f->why == XP_ZWHY_NONE || (!c->zlogged_ms && !f->on) ||
	    (f->on == c->zlogged_on && f->why == c->zlogged_why) || now - c->zlogged_ms < 1000)
		return;
	log_info("migration %s role=source: port %u connection %u compression %s: %s (worker idle "
		 "%u%%, recent chunks %u%% of their plain size; %llu bytes sent as %llu so far, "
		 "%u changes)",
		 m->key, c->port->id, c->seq, f->on ? "on" : "off", px_zwhy_str(f->why),
		 f->idle_pct, f->ratio_pct, (unsigned long long)f->tx_plain,
		 (unsigned long long)f->tx_wire, f->flips);
	c->zlogged_on = f->on;
	c->zlogged_why = f->why;
	c->zlogged_ms = now;
}

/* Brings a migration's meters up to date; adds its live bytes to node[]. */
static void migration_sample(struct px_migration *m, uint64_t now, uint64_t node[2])
{
	uint64_t mb[2] = { m->bytes[0], m->bytes[1] };
	uint64_t wire = on_wire(m->bytes[0], m->zdone.tx_plain, m->zdone.tx_wire);
	uint64_t pb[PX_PORTS_MAX][2];

	for (unsigned int i = 0; i < m->nports; i++) {
		pb[i][0] = m->ports[i].bytes[0];
		pb[i][1] = m->ports[i].bytes[1];
	}
	vm_list_each (struct px_conn, c, &m->conns, node) {
		unsigned int pi = (unsigned int)(c->port - m->ports);
		uint64_t b[2];

		if (c->st != C_LINKED)
			continue;
		struct xp_zfig zf;

		IO(m->n, link_bytes, c->link, b);
		IO(m->n, link_zfig, c->link, &zf);
		for (int d = 0; d < 2; d++) {
			vm_rate_sample(&c->rate[d], now, b[d]);
			mb[d] += b[d];
			pb[pi][d] += b[d];
			node[d] += b[d];
		}
		wire += on_wire(b[0], zf.tx_plain, zf.tx_wire);
		zwatch(m, c, &zf, now);
		lift_cap_at_switchover(m, c);
	}
	vm_rate_sample(&m->wire, now, wire);
	for (int d = 0; d < 2; d++) {
		vm_rate_sample(&m->rate[d], now, mb[d]);
		for (unsigned int i = 0; i < m->nports; i++)
			vm_rate_sample(&m->ports[i].rate[d], now, pb[i][d]);
	}
}

void px_node_tick(void *arg)
{
	struct px_node *n = arg;
	uint64_t now = px_now(n), b[2] = { n->bytes_done[0], n->bytes_done[1] };

	n->tick = NULL;
	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		migration_sample(m, now, b);
	for (int d = 0; d < 2; d++)
		vm_rate_sample(&n->rate[d], now, b[d]);
	if (n->conf.node_bandwidth)
		px_node_share(n);
	else if (n->conf.shaper == PX_SHAPE_PACING)
		vm_list_each (struct px_migration, m, &n->migrations, node)
			if (m->limit)
				px_migration_pace(m);
	vm_log_limit_flush(&n->refusals, now);
	vm_log_limit_flush(&n->accept_errors, now);
	px_dpdk_watch(n);
	/* Without a timer the meters stand still; that is all that is lost. */
	(void)IO(n, timer_add, now + TICK_MS, px_node_tick, n, &n->tick);
	/* where its own timer could not be had; last, as a drain's end may end the daemon */
	px_node_housekeep(n);
}

static void rates_of(const struct vm_rate r[2], struct px_rates *out)
{
	out->tx_1s = vm_rate_get(&r[0], 1000);
	out->tx_10s = vm_rate_get(&r[0], 10000);
	out->rx_1s = vm_rate_get(&r[1], 1000);
	out->rx_10s = vm_rate_get(&r[1], 10000);
}

static const char *const state_names[] = {
	[C_SRC_HELD] = "delayed",	 [C_SRC_CONNECT] = "connecting",
	[C_SRC_HANDSHAKE] = "handshake", [C_SRC_SEND] = "preamble",
	[C_SRC_REPLY] = "waiting-reply", [C_SRC_AWAIT] = "waiting-server",
	[C_TGT_HANDSHAKE] = "handshake", [C_TGT_PREAMBLE] = "preamble",
	[C_TGT_PARKED] = "parked",	 [C_LINKED] = "linked",
	[C_TGT_VERIFY] = "report",	 [C_TGT_RESUME] = "resuming",
};

/* One connection's entry; its live figures also go into the migration's and its port's. */
static void conn_info(struct px_migration *m, struct px_conn *c, struct px_migration_info *mi,
		      struct px_conn_info *i, uint64_t *shaped_ns)
{
	struct px_port_info *pi = &mi->ports[c->port - m->ports];
	uint64_t b[2] = { 0, 0 }, sn = 0;
	struct xp_zfig zf = { 0 };
	struct px_insp_stats st;

	pi->conns_active++;
	if (c->st == C_LINKED) {
		IO(m->n, link_bytes, c->link, b);
		sn = IO(m->n, link_shaped_ns, c->link);
		IO(m->n, link_zfig, c->link, &zf);
		px_zinfo_add(&mi->z, &zf);
		mi->zconns_on += zf.on;
		mi->zconns += c->zout_offered;
		mi->wire_tx += on_wire(b[0], zf.tx_plain, zf.tx_wire);
		*shaped_ns += sn;
		mi->bytes_tx += b[0];
		mi->bytes_rx += b[1];
		pi->bytes_tx += b[0];
		pi->bytes_rx += b[1];
	}
	if (!strncmp(c->tls.crypto, "ktls", 4))
		mi->mode = "ktls";
	if (c->insp) {
		px_insp_read(c->insp, &st);
		px_insp_fold(&mi->insp, &st, true);
	}
	if (c->st == C_LINKED && c->resumable) {
		struct px_resume_info *ri = &mi->resume;
		uint64_t kept = IO(m->n, link_kept, c->link);

		ri->conns++;
		ri->suspended += c->suspended;
		ri->resumptions += c->resumptions;
		ri->fallbacks += c->fallbacks;
		ri->replayed += c->replayed;
		ri->unhopped_ms += c->unhopped_ms +
				   (c->suspended ? px_now(m->n) - c->suspended_ms : 0);
		ri->kept += kept;
		if (i) {
			i->resumable = true;
			i->suspended = c->suspended;
			i->resumptions = c->resumptions;
			i->fallbacks = c->fallbacks;
			i->replayed = c->replayed;
			i->unhopped_ms = c->unhopped_ms;
			i->kept = kept;
		}
	} else if (c->st == C_LINKED && !c->resuming) {
		mi->resume.all = false;
	}
	if (!i)
		return;
	i->port = c->port->id;
	i->seq = c->seq;
	/* an ended connection's digest report, either role; an attempt to resume one */
	i->state = c->verify ? "report" : c->resuming ? "resuming" : state_names[c->st];
	i->tls = c->tls.version[0] ? c->tls.version : NULL;
	i->cipher = c->tls.cipher;
	i->crypto = c->tls.crypto;
	i->resumed = c->tls.resumed;
	i->raw = c->raw;
	i->path = c->dpdk.ip ? "dpdk" : "kernel";
	i->bytes_tx = b[0];
	i->bytes_rx = b[1];
	rates_of(c->rate, &i->rate);
	i->shaped_ms = sn / 1000000;
	i->pacing = c->pacing;
	i->inspected = c->insp != NULL;
	if (c->insp)
		i->insp = st;
	if (c->zout_offered || c->zin) {
		i->zmode = c->zin ? "in" : px_compress_str(px_compress_mode(m));
		i->zon = zf.on;
		i->zwhy = c->zout_offered ? px_zwhy_str(zf.why) : NULL;
		i->zidle_pct = zf.idle_pct;
		i->zratio_pct = zf.ratio_pct;
		px_zinfo_add(&i->z, &zf);
	}
}

void px_node_foreach(struct px_node *n, px_migration_fn fn, void *arg)
{
	vm_list_each (struct px_migration, m, &n->migrations, node) {
		struct px_conn_info *ci =
			calloc(m->conns_active ? m->conns_active : 1, sizeof(*ci));
		char host[64] = "";
		struct px_migration_info mi = {
			.key = m->key,
			.role = m->role,
			.nports = m->nports,
			.peer = m->role == PX_ROLE_SOURCE ? m->peer_str : NULL,
			.peer_host =
				m->role == PX_ROLE_SOURCE
					? (xp_addr_host(&m->peer, host, sizeof(host)) < 0 ? NULL
											  : host)
				: m->peer_bound ? m->peer_addr
						: NULL,
			.started_ms = m->started_ms,
			.conns_total = m->conns_total,
			.conns_active = m->conns_active,
			.conns_failed = m->conns_failed,
			.conns_reordered = m->conns_reordered,
			.conns_verified = m->v.matched,
			.conns_corrupt = m->v.corrupt,
			.conns_unverified = m->v.unverified,
			.bytes_tx = m->bytes[0],
			.bytes_rx = m->bytes[1],
			.state = m->failed ? "failed" : "active",
			.error = m->failed ? m->error : NULL,
			.cap = m->cap,
			.limit = m->limit,
			.cap_lifted = m->cap_lifted,
			.mode = m->tls ? "tls" : "plain",
			.kubevirt = m->kubevirt,
			.tls = m->tls,
			.inspected = n->conf.inspect,
			.insp = m->insp_done,
			.resume = { .resumptions = m->resumptions,
				    .fallbacks = m->fallbacks,
				    .refused = m->resume_refused,
				    .replayed = m->replayed,
				    .unhopped_ms = m->unhopped_ms,
				    .all = m->conns_total > 0 && !m->unresumable },
			.zmode = m->role == PX_ROLE_SOURCE ? px_compress_str(px_compress_mode(m))
							   : NULL,
			.z = m->zdone,
			.wire_tx = on_wire(m->bytes[0], m->zdone.tx_plain, m->zdone.tx_wire),
			.wire_1s = vm_rate_get(&m->wire, 1000),
			.wire_10s = vm_rate_get(&m->wire, 10000),
		};
		uint64_t shaped_ns = m->shaped_ns_done;

		rates_of(m->rate, &mi.rate);
		for (unsigned int i = 0; i < m->nports; i++) {
			struct px_port_info *pi = &mi.ports[i];

			pi->id = m->ports[i].id;
			pi->tcp = m->ports[i].tcp;
			if (m->role == PX_ROLE_SOURCE)
				pi->peer_port = pi->tcp;
			else
				pi->listen = pi->tcp;
			strcpy(pi->path, m->ports[i].path);
			pi->bytes_tx = m->ports[i].bytes[0];
			pi->bytes_rx = m->ports[i].bytes[1];
			pi->conns_total = m->ports[i].conns_total;
			rates_of(m->ports[i].rate, &pi->rate);
		}
		vm_list_each (struct px_conn, c, &m->conns, node)
			conn_info(m, c, &mi,
				  ci && mi.nconns < m->conns_active ? &ci[mi.nconns++] : NULL,
				  &shaped_ns);
		mi.shaped_ms = shaped_ns / 1000000;
		px_insp_estimate(&mi.insp);
		mi.conns = ci;
		fn(&mi, arg);
		free(ci);
	}
}

static void dpdk_info(struct px_node *n, struct px_node_info *ni)
{
	if (IO(n, hop_stats, &ni->dpdk.stats) < 0)
		return;
	ni->dpdk.on = true;
	ni->dpdk.sealed = n->conf.tls != NULL;
	px_dpdk_format(&n->dpdk, ni->dpdk.address, sizeof(ni->dpdk.address));
}

void px_node_info(struct px_node *n, struct px_node_info *out)
{
	struct px_node_info ni = {
		.bandwidth = n->conf.node_bandwidth,
		.shaper = n->conf.shaper,
		.inspect = n->conf.inspect,
		.digest = px_digest_str(n->conf.digest),
		.verified = n->verified[PX_VERIFIED_MATCH],
		.corrupt = n->verified[PX_VERIFIED_CORRUPT],
		.unverified = n->verified[PX_VERIFIED_UNVERIFIED],
		.bytes_tx = n->bytes_done[0],
		.bytes_rx = n->bytes_done[1],
		.conns_total = n->conns_total,
	};

	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m)) {
		ni.migrations += !m->stopping;
		ni.conns_active += m->conns_active;
		vm_list_each (struct px_conn, c, &m->conns, node) {
			uint64_t b[2];

			if (c->st != C_LINKED)
				continue;
			IO(n, link_bytes, c->link, b);
			ni.bytes_tx += b[0];
			ni.bytes_rx += b[1];
		}
	}
	rates_of(n->rate, &ni.rate);
	dpdk_info(n, &ni);
	memcpy(ni.ended_source, n->ended[PX_ROLE_SOURCE], sizeof(ni.ended_source));
	memcpy(ni.ended_target, n->ended[PX_ROLE_TARGET], sizeof(ni.ended_target));
	memcpy(ni.tls_refusals, n->tls_refusals, sizeof(ni.tls_refusals));
	ni.resume_refused = n->resume_refused;
	ni.dpdk.fallbacks = n->dpdk_fallbacks;
	if (n->conf.tls) {
		ni.tls.on = true;
		xp_tls_expiry(n->conf.tls, &ni.tls.node_expiry, &ni.tls.ca_expiry);
	}
	*out = ni;
}
