// SPDX-License-Identifier: Apache-2.0
/* Every migration proves its bytes: both nodes digest each connection as it passes, and when it
 * ends the source sends its digests to the target on a short node-hop connection of its own (a
 * report); the target compares them with its own and answers. A mismatch is a corrupt
 * migration, on both nodes' stop lines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest.h"
#include "log.h"
#include "px_private.h"
#include "util.h"

/*
 * A link's digests in the migration's terms: the link's direction 0 runs from the local socket
 * to the node hop, which is the QEMU stream's own direction on a source and the way back on a
 * target.
 */
static void dg_from_result(struct px_digests *dg, const struct xp_link_result *res,
			   enum px_role role)
{
	unsigned int s = role == PX_ROLE_TARGET;

	for (unsigned int i = 0; i < 2; i++) {
		dg->bytes[i] = res->digest_bytes[i ^ s];
		dg->digest[i] = res->digest[i ^ s];
		dg->partial[i] = res->digest_partial[i ^ s];
	}
}

/* One connection's own record in the migration's sum: the same on both nodes when it matched. */
static uint64_t dg_record(uint32_t port, uint32_t seq, const struct px_digests *dg)
{
	uint8_t b[40];

	vm_put_be32(b, port);
	vm_put_be32(b + 4, seq);
	for (int i = 0; i < 2; i++) {
		vm_put_be64(b + 8 + 16 * i, dg->bytes[i]);
		vm_put_be64(b + 16 + 16 * i, dg->digest[i]);
	}
	return vm_digest_of(b, sizeof(b));
}

static void dg_format(const struct px_digests *dg, char *buf, size_t len)
{
	snprintf(buf, len, "%llu bytes %016llx, back %llu bytes %016llx",
		 (unsigned long long)dg->bytes[0], (unsigned long long)dg->digest[0],
		 (unsigned long long)dg->bytes[1], (unsigned long long)dg->digest[1]);
}

/* One ended connection with digests, on the migration and the node. */
static void tally(struct px_migration *m, int what)
{
	unsigned int *c[] = { &m->v.matched, &m->v.corrupt, &m->v.unverified };

	(*c[what])++;
	m->n->verified[what]++;
}

/* Counts a compared connection on m, and logs a mismatch loudly. */
static void account(struct px_migration *m, uint32_t port, uint32_t seq, enum px_verdict v,
		    const struct px_digests *src, const struct px_digests *tgt)
{
	char a[120], b[120];

	if (v == PX_V_MATCH) {
		tally(m, PX_VERIFIED_MATCH);
		log_debug("migration %s role=%s: port %u connection %u verified: %s", m->key,
			  px_role_str(m->role), port, seq, px_verdict_str(v));
		return;
	}
	if (v != PX_V_MISMATCH) {
		tally(m, PX_VERIFIED_UNVERIFIED);
		log_warn("migration %s role=%s: port %u connection %u not verified: %s", m->key,
			 px_role_str(m->role), port, seq, px_verdict_str(v));
		return;
	}
	tally(m, PX_VERIFIED_CORRUPT);
	dg_format(src, a, sizeof(a));
	dg_format(tgt, b, sizeof(b));
	log_err("migration %s role=%s: port %u connection %u CORRUPT: the source read %s; the "
		"target %s",
		m->key, px_role_str(m->role), port, seq, a, b);
	if (!m->v.corrupt_why[0])
		snprintf(m->v.corrupt_why, sizeof(m->v.corrupt_why),
			 "port %u connection %u: the source read %llu bytes from its QEMU, the "
			 "target %llu from the node hop, with different digests",
			 port, seq, (unsigned long long)src->bytes[0],
			 (unsigned long long)tgt->bytes[0]);
}

bool px_verify_wanted(const struct px_conn *c)
{
	const struct px_node *n = c->n;

	if (c->raw || !(c->m->target.digest || c->tls.digests))
		return false;
	switch (n->conf.digest) {
	case PX_DIGEST_ON:
		return true;
	case PX_DIGEST_OFF:
		return false;
	default:
		/* where the bytes pass through user space anyway: TLS, the DPDK hop, copy */
		return c->tls.version[0] || px_dpdk_can(c) || n->conf.copy_path;
	}
}

/* ---- source ---------------------------------------------------------------------------- */

void px_verify_lost(struct px_conn *c, const char *why, bool quiet)
{
	struct px_migration *m = c->m;

	tally(m, PX_VERIFIED_UNVERIFIED);
	log_warn("migration %s role=source: port %u connection %u not verified: %s", m->key,
		 c->port->id, c->seq, why);
	if (quiet)
		px_conn_free(c);
	else
		px_conn_release(c);
}

void px_verify_answered(struct px_conn *c)
{
	struct px_migration *m = c->m;
	struct px_digests tgt;
	enum px_verdict v;
	enum px_status st;
	char why[160];

	if (px_reply_decode_verified(c->buf, c->len, &v, &tgt) > 0) {
		account(m, c->port->id, c->seq, v, &c->dg, &tgt);
		px_conn_release(c);
		return;
	}
	if (px_reply_decode(c->buf, c->len, &st, NULL) > 0)
		snprintf(why, sizeof(why), "the target refused the report: %s", px_status_str(st));
	else
		snprintf(why, sizeof(why), "the target's answer to the report is malformed");
	px_verify_lost(c, why, false);
}

/* ---- target ---------------------------------------------------------------------------- */

struct px_migration *px_verify_find(struct px_node *n, const char *key)
{
	for (struct px_migration *m = px_next_any(n, NULL); m; m = px_next_any(n, m))
		if (m->role == PX_ROLE_TARGET && strcmp(m->key, key) == 0)
			return m;
	return NULL;
}

static struct px_vrec *rec_find(struct px_migration *m, uint32_t port, uint32_t seq)
{
	for (unsigned int i = 0; i < m->v.nrecs; i++)
		if (m->v.recs[i].port == port && m->v.recs[i].seq == seq)
			return &m->v.recs[i];
	return NULL;
}

/* The target's answer to the report on c, then c goes. */
static void answer(struct px_conn *c, enum px_verdict v, const struct px_digests *mine)
{
	static const struct px_digests none;
	uint8_t r[PX_REPLY_VERIFY_LEN];
	size_t len = px_reply_encode_verified(v, mine ? mine : &none, r);
	uint32_t ev;
	ssize_t k;

	/* A fresh connection's send buffer takes 44 bytes at once; a source that is gone
	 * already counts the report unverified on its own side. */
	k = IO(c->n, write, c->hop, r, len, &ev);
	if (k != (ssize_t)len)
		log_debug("migration %s role=target: port %u connection %u: the answer to the "
			  "report did not go out",
			  c->m->key, c->port->id, c->seq);
	px_conn_release(c);
}

/* Compares a report with the record it names; the record is settled either way. */
static void settle(struct px_conn *c, struct px_vrec *r)
{
	struct px_migration *m = c->m;
	enum px_verdict v = r->verdict;

	if (v == PX_V_PENDING) {
		v = px_digests_compare(&c->dg, &r->dg);
		r->verdict = v;
		m->v.waiting--;
		account(m, r->port, r->seq, v, &c->dg, &r->dg);
	}
	/* A record that timed out (PX_V_UNKNOWN) or broke stays as it is: answered so. */
	answer(c, v, &r->dg);
}

static void report_timeout(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	answer(c, PX_V_PENDING, NULL);
}

void px_verify_arrive(struct px_conn *c, struct px_port *port, const struct px_preamble *p)
{
	struct px_migration *m = port->m;
	struct px_node *n = c->n;
	struct px_vrec *r;

	px_conn_adopt(c, port, p->seq, C_TGT_VERIFY);
	c->verify = true;
	c->dg = p->dg;
	r = rec_find(m, port->id, p->seq);
	if (r) {
		settle(c, r);
		return;
	}
	/* Still carried here: answered when its link returns, or at the deadline. */
	vm_list_each (struct px_conn, x, &m->conns, node) {
		if (x->st == C_LINKED && x->port == port && x->seq == p->seq && x->digest) {
			if (IO(n, timer_add, px_now(n) + VERIFY_WAIT_MS, report_timeout, c, &c->t) <
			    0)
				answer(c, PX_V_PENDING, NULL);
			return;
		}
	}
	answer(c, PX_V_UNKNOWN, NULL);
}

/* The target's records that no report settled in time. */
static void records_expire(void *arg)
{
	struct px_migration *m = arg;
	struct px_node *n = m->n;
	uint64_t now = px_now(n), next = 0;

	m->v.timer = NULL;
	for (unsigned int i = 0; i < m->v.nrecs; i++) {
		struct px_vrec *r = &m->v.recs[i];

		if (r->verdict != PX_V_PENDING)
			continue;
		if (now >= r->ended_ms + VERIFY_WAIT_MS) {
			r->verdict = PX_V_UNKNOWN;
			m->v.waiting--;
			tally(m, PX_VERIFIED_UNVERIFIED);
			log_warn("migration %s role=target: port %u connection %u not verified: no "
				 "report from the source within %d ms of its end",
				 m->key, r->port, r->seq, VERIFY_WAIT_MS);
		} else if (!next || r->ended_ms + VERIFY_WAIT_MS < next) {
			next = r->ended_ms + VERIFY_WAIT_MS;
		}
	}
	if (next && IO(m->n, timer_add, next, records_expire, m, &m->v.timer) < 0)
		log_err("migration %s: out of memory arming the digest timer", m->key);
	px_node_dirty(n);
}

/* Target: keeps the record of an ended connection, and answers a report that waited for it. */
static void target_ended(struct px_conn *c, const struct xp_link_result *res)
{
	struct px_migration *m = c->m;
	struct px_node *n = c->n;
	struct px_vrec *r;

	if (m->v.nrecs == m->v.caprecs) {
		unsigned int cap = m->v.caprecs ? 2 * m->v.caprecs : 16;
		struct px_vrec *recs = realloc(m->v.recs, cap * sizeof(*recs));

		if (!recs) {
			tally(m, PX_VERIFIED_UNVERIFIED);
			log_err("migration %s: out of memory keeping a connection's digests",
				m->key);
			return;
		}
		m->v.recs = recs;
		m->v.caprecs = cap;
	}
	r = &m->v.recs[m->v.nrecs++];
	r->port = c->port->id;
	r->seq = c->seq;
	dg_from_result(&r->dg, res, m->role);
	r->ended_ms = px_now(n);
	if (res->end != XP_END_CLEAN) {
		r->verdict = PX_V_BROKEN;
		tally(m, PX_VERIFIED_UNVERIFIED);
	} else {
		r->verdict = PX_V_PENDING;
		m->v.waiting++;
		m->v.sum ^= dg_record(r->port, r->seq, &r->dg);
		if (!m->v.timer && IO(n, timer_add, r->ended_ms + VERIFY_WAIT_MS, records_expire, m,
				      &m->v.timer) < 0)
			log_err("migration %s: out of memory arming the digest timer", m->key);
	}
	vm_list_each (struct px_conn, x, &m->conns, node) {
		if (x->st == C_TGT_VERIFY && x->port == c->port && x->seq == c->seq) {
			IO(n, timer_del, x->t);
			x->t = NULL;
			settle(x, r);
			return;
		}
	}
}

bool px_verify_ended(struct px_conn *c, const struct xp_link_result *res)
{
	struct px_migration *m = c->m;

	if (!c->digest)
		return false;
	m->v.total++;
	if (!res->digested) {
		tally(m, PX_VERIFIED_UNVERIFIED);
		return false;
	}
	if (m->role == PX_ROLE_TARGET) {
		target_ended(c, res);
		return false;
	}
	if (res->end != XP_END_CLEAN) {
		/* the error is the story; the target keeps its record as broken */
		tally(m, PX_VERIFIED_UNVERIFIED);
		return false;
	}
	/* The source: the same record reports the connection to the target. */
	dg_from_result(&c->dg, res, m->role);
	m->v.sum ^= dg_record(c->port->id, c->seq, &c->dg);
	px_insp_free(c->insp);
	c->insp = NULL;
	c->link = NULL;
	c->verify = true;
	c->len = c->off = 0;
	c->st = C_SRC_CONNECT;
	px_source_connect(c);
	return true;
}

bool px_verify_busy(const struct px_migration *m)
{
	return m->v.waiting > 0;
}

void px_verify_note(struct px_migration *m, char *buf, size_t len)
{
	if (!m->v.total)
		snprintf(buf, len, " verified=none");
	else
		snprintf(buf, len, " verified=%u/%u digest=%016llx", m->v.matched, m->v.total,
			 (unsigned long long)m->v.sum);
}

void px_verify_free(struct px_migration *m)
{
	IO(m->n, timer_del, m->v.timer);
	m->v.timer = NULL;
	free(m->v.recs);
	m->v.recs = NULL;
	m->v.nrecs = m->v.caprecs = 0;
}
