// SPDX-License-Identifier: Apache-2.0
/* Bandwidth caps: a migration's own cap, the node cap shared max-min fairly among migrations,
 * and the two ways they are enforced on the wire (token buckets the data path takes from, or a
 * pace per node-hop socket). Policy only: buckets and pacing are transport's mechanisms. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "px_private.h"
#include "px_share.h"
#include "units.h"
#include "util.h"

/* A migration not held back by its cap may grow by this much before its next share. */
#define SHARE_GROWTH_NUM 5
#define SHARE_GROWTH_DEN 4
#define SHARE_FLOOR	 (1024 * 1024)

/*
 * What a sender is taken to want in a share: unbounded while it is held back, else what it sent
 * in the last second plus room to grow.
 */
static uint64_t share_demand(bool held, uint64_t rate)
{
	uint64_t grow = rate * SHARE_GROWTH_NUM / SHARE_GROWTH_DEN;

	if (held)
		return UINT64_MAX;
	return grow > SHARE_FLOOR ? grow : SHARE_FLOOR;
}

/*
 * Pacing: the migration's limit split max-min fairly among its linked connections. Per-socket
 * paces leave unused what a channel does not send (QEMU hands pages to whichever channel is
 * free, and the main channel carries little), so the sum of paces is the limit times a gain that
 * is corrected once a second from what the migration delivered, while it presses against its
 * limit. The kernel also counts headers against a pace; the gain absorbs that too.
 */
void px_migration_pace(struct px_migration *m)
{
	struct px_node *n = m->n;
	struct px_share_in in[64];
	uint64_t out[64], now = px_now(n), r = vm_rate_get(&m->rate[0], 1000);
	struct px_conn *cs[64];
	unsigned int k = 0;

	if (m->limit != m->pace_limit) {
		/* The last second's rate belongs to the old limit: wait for one at the new one. */
		m->pace_limit = m->limit;
		m->pace_next_ms = now + 1500;
	} else if (m->limit && now >= m->pace_next_ms) {
		m->pace_next_ms = now + 1000;
		if (r * 10 >= m->limit * 7) {
			double g =
				m->pace_gain * (1.0 + 0.5 * ((double)m->limit / (double)r - 1.0));

			m->pace_gain = g < 0.5 ? 0.5 : g > 2.0 ? 2.0 : g;
		}
	}

	vm_list_each (struct px_conn, c, &m->conns, node) {
		uint64_t cr;

		if (k == ARRAY_SIZE(cs))
			break;
		if (c->st != C_LINKED)
			continue;
		cr = vm_rate_get(&c->rate[0], 1000);
		cs[k] = c;
		in[k].cap = 0;
		/* Held back: it sends at 90 % of its pace or more. */
		in[k].demand = share_demand(c->pacing && cr * 10 >= c->pacing * 9, cr);
		k++;
	}
	if (m->limit && k)
		px_share((uint64_t)((double)m->limit * m->pace_gain), k, in, out);
	for (unsigned int i = 0; i < k; i++) {
		uint64_t pace = m->limit ? out[i] : 0;

		if (pace != cs[i]->pacing) {
			cs[i]->pacing = pace;
			IO(n, link_set_pacing, cs[i]->link, pace);
		}
	}
}

void px_migration_apply_limit(struct px_migration *m, uint64_t limit)
{
	m->limit = limit;
	if (m->n->conf.shaper == PX_SHAPE_BUCKET) {
		if (xp_bucket_rate(m->bucket) != limit)
			xp_bucket_set_rate(m->bucket, limit);
	} else {
		px_migration_pace(m);
	}
}

/*
 * Every migration's limit: its own cap, or with a node cap its max-min fair share of it. A
 * migration is taken to want more than it sends while its bucket held it back since the last
 * tick (pacing: while it sends at 90 % of its limit); otherwise it gets what it sent plus room
 * to grow.
 */
void px_node_share(struct px_node *n)
{
	uint64_t total = n->conf.node_bandwidth;
	struct px_share_in *in = NULL;
	uint64_t *out = NULL;
	unsigned int k = 0, i = 0;
	struct px_migration *m;

	for (m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		k++;
	if (total && k) {
		in = calloc(k, sizeof(*in));
		out = calloc(k, sizeof(*out));
		if (!in || !out) {
			/* Keep the limits of the last tick; the node bucket still holds the sum. */
			free(in);
			free(out);
			return;
		}
	}
	for (m = px_next_any(n, NULL); m; m = px_next_any(n, m)) {
		uint64_t held = xp_bucket_held(m->bucket), r = vm_rate_get(&m->rate[0], 1000);
		bool wants_more = n->conf.shaper == PX_SHAPE_BUCKET
					  ? held != m->held_seen
					  : m->limit && r * 10 >= m->limit * 9;

		m->held_seen = held;
		if (!total)
			continue;
		in[i].cap = m->cap_lifted ? 0 : m->cap;
		in[i].demand = share_demand(wants_more, r);
		i++;
	}
	if (total && k)
		px_share(total, k, in, out);
	i = 0;
	for (m = px_next_any(n, NULL); m; m = px_next_any(n, m)) {
		uint64_t own = m->cap_lifted ? 0 : m->cap;

		px_migration_apply_limit(m, total ? out[i++] : own);
	}
	free(in);
	free(out);
}

void px_migration_set_cap_now(struct px_migration *m, uint64_t cap)
{
	m->cap = cap;
	if (!m->n->conf.node_bandwidth)
		px_migration_apply_limit(m, m->cap_lifted ? 0 : cap);
}

int px_migration_set_cap(struct px_node *n, const char *key, uint64_t cap, char *err, size_t errlen)
{
	unsigned int found = 0;
	char r[32];

	vm_list_each (struct px_migration, m, &n->migrations, node) {
		if (strcmp(m->key, key))
			continue;
		px_migration_set_cap_now(m, cap);
		log_info("migration %s role=%s: cap %s%s", key, px_role_str(m->role),
			 vm_format_rate(cap, r, sizeof(r)),
			 m->cap_lifted ? " (applies no more: switchover was seen)" : "");
		found++;
	}
	if (!found) {
		snprintf(err, errlen, "unknown migration %.130s", key);
		return -ENOENT;
	}
	/* Shares move at once, not at the next tick. */
	if (n->conf.node_bandwidth)
		px_node_share(n);
	return 0;
}

void px_node_set_bandwidth(struct px_node *n, uint64_t rate)
{
	char r[32];

	n->conf.node_bandwidth = rate;
	if (n->conf.shaper == PX_SHAPE_BUCKET)
		xp_bucket_set_rate(n->bucket, rate);
	log_info("node cap %s (%s)", vm_format_rate(rate, r, sizeof(r)),
		 px_shaper_str(n->conf.shaper));
	px_node_share(n);
}

const char *px_shaper_str(enum px_shaper sh)
{
	return sh == PX_SHAPE_PACING ? "pacing" : "bucket";
}

const char *px_digest_str(enum px_digest d)
{
	return d == PX_DIGEST_ON ? "on" : d == PX_DIGEST_OFF ? "off" : "auto";
}

const char *px_zwhy_str(unsigned int why)
{
	static const char *const words[] = {
		[XP_ZWHY_NONE] = "undecided",
		[XP_ZWHY_ALWAYS] = "--compress always",
		[XP_ZWHY_CAPPED] = "its cap holds it back",
		[XP_ZWHY_IDLE_HOP] = "nothing waits for the node hop or a cap",
		[XP_ZWHY_CPU] = "its worker has no time to spare",
		[XP_ZWHY_RATIO] = "recent chunks did not shrink; it tries again later",
	};

	return why < ARRAY_SIZE(words) && words[why] ? words[why] : "?";
}

const char *px_compress_str(enum px_compress c)
{
	return c == PX_COMPRESS_OFF	 ? "off"
	       : c == PX_COMPRESS_ALWAYS ? "always"
	       : c == PX_COMPRESS_AUTO	 ? "auto"
					 : "default";
}
