// SPDX-License-Identifier: Apache-2.0
/* Resumable connections between two vmigd. When a connection's node hop fails, its link keeps
 * QEMU's socket and what it sent (transport/xp_frame.c); the source dials again and presents the
 * connection's token and where it is, the target checks them against the migration and that
 * connection, tells where it is, and the link goes on over the new connection. --resume-timeout
 * bounds the wait; past it the migration fails as it would have at once before. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "px_private.h"

/* A source tries again this soon after a failed attempt, doubling up to the most. */
#define ATTEMPT_FIRST_MS 100
#define ATTEMPT_MAX_MS	 1000
/*
 * A target node that answers every attempt this long with a refusal (ECONNREFUSED) is up with
 * no vmigd listening: the one that carried the connection is gone (stopped, or it died and was
 * started again), and the connection with it. A firewall reload that rejects for a moment is
 * shorter than this.
 */
#define REFUSED_MS 3000

bool px_resume_wanted(const struct px_conn *c)
{
	return c->n->conf.resume_timeout_ms && !c->raw && !c->verify && !c->resuming &&
	       (c->m->target.resume || c->tls.resume);
}

static uint64_t deadline(const struct px_conn *c)
{
	return c->suspended_ms + c->n->conf.resume_timeout_ms;
}

static void expired(struct px_conn *c)
{
	px_migration_fail(c->m,
			  "port %u connection %u: its node hop did not come back within %llu s "
			  "(--resume-timeout; it was lost: %s)",
			  c->port->id, c->seq,
			  (unsigned long long)(c->n->conf.resume_timeout_ms / 1000), c->lost);
}

static void on_deadline(void *arg)
{
	struct px_conn *c = arg;

	c->rt = NULL;
	if (c->suspended)
		expired(c);
}

static void attempt(void *arg);

/* Source: the next attempt, or the end when the deadline comes first. */
static void schedule(struct px_conn *c, uint64_t delay_ms)
{
	struct px_node *n = c->n;
	uint64_t at = px_now(n) + delay_ms;

	IO(n, timer_del, c->rt);
	c->rt = NULL;
	if (at >= deadline(c)) {
		if (IO(n, timer_add, deadline(c), on_deadline, c, &c->rt) < 0)
			expired(c);
		return;
	}
	if (IO(n, timer_add, at, attempt, c, &c->rt) < 0)
		px_migration_fail(c->m, "out of memory arming a resumption");
}

static void attempt(void *arg)
{
	struct px_conn *c = arg, *r;
	struct px_migration *m = c->m;

	c->rt = NULL;
	if (m->failed || !c->suspended)
		return;
	if (px_now(c->n) >= deadline(c)) {
		expired(c);
		return;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		schedule(c, ATTEMPT_MAX_MS);
		return;
	}
	r->n = c->n;
	r->m = m;
	r->port = c->port;
	r->seq = c->seq;
	r->lfd = -1;
	r->resuming = true;
	r->resumes = c;
	c->resumer = r;
	c->attempts++;
	xp_addr_format(&c->port->peer, r->peer, sizeof(r->peer));
	vm_list_add(&m->conns, &r->node);
	m->conns_active++;
	px_source_connect(r);
}

/* Why c's node hop went, kept for the deadline's message, and said once. */
static void lost_note(struct px_conn *c, const struct xp_link_result *res)
{
	struct px_migration *m = c->m;
	struct px_node *n = c->n;

	snprintf(c->lost, sizeof(c->lost), "%s%s%.100s",
		 res->asked ? "the peer resumes it over a new connection" : strerror(-res->err),
		 res->detail[0] ? ": TLS: " : "", res->detail);
	log_warn("migration %s role=%s: port %u connection %u: node hop lost after %llu/%llu bytes "
		 "(tx/rx): %s; QEMU's socket stays, %llu bytes kept for the peer; resuming "
		 "(--resume-timeout %llu s)",
		 m->key, px_role_str(m->role), c->port->id, c->seq,
		 (unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1], c->lost,
		 (unsigned long long)(c->kept_to - c->kept_from),
		 (unsigned long long)(n->conf.resume_timeout_ms / 1000));
}

void px_resume_suspended(struct px_conn *c, const struct xp_link_result *res)
{
	struct px_migration *m = c->m;
	struct px_node *n = c->n;

	c->suspended = true;
	c->suspended_ms = px_now(n);
	c->have = res->have;
	c->kept_from = res->kept_from;
	c->kept_to = res->kept_to;
	c->attempts = 0;
	if (c->adopted) {
		/* the first suspension of a link moved here: it never had a node hop here */
		c->adopted = false;
		snprintf(c->lost, sizeof(c->lost), "moved here from another vmigd at a takeover");
		log_info("migration %s role=%s: port %u connection %u: moved here after %llu/%llu "
			 "bytes (tx/rx); resuming it over a new node-hop connection "
			 "(--resume-timeout %llu s)",
			 m->key, px_role_str(m->role), c->port->id, c->seq,
			 (unsigned long long)res->bytes[0], (unsigned long long)res->bytes[1],
			 (unsigned long long)(n->conf.resume_timeout_ms / 1000));
	} else if (c->fell_back) {
		/* off the DPDK node hop: px_dpdk_fallback() said why, and c->lost keeps it */
		c->fell_back = false;
	} else {
		lost_note(c, res);
	}
	if (m->failed) {
		IO(n, link_abort, c->link);
		return;
	}
	if (m->role == PX_ROLE_SOURCE) {
		schedule(c, 0);
		return;
	}
	IO(n, timer_del, c->rt);
	c->rt = NULL;
	if (IO(n, timer_add, deadline(c), on_deadline, c, &c->rt) < 0)
		px_migration_fail(m, "out of memory arming a resumption's deadline");
	else if (c->resumer)
		px_resume_go(c);
}

/* c goes on over r's connection, from the peer's offset peer_have. */
static void resumed(struct px_conn *c, struct px_conn *r, uint64_t peer_have)
{
	struct px_migration *m = c->m;
	uint64_t gap = px_now(c->n) - c->suspended_ms;
	char tries[32] = "";

	IO(c->n, timer_del, c->rt);
	c->rt = NULL;
	c->suspended = false;
	c->resumptions++;
	c->unhopped_ms += gap;
	c->replayed += c->kept_to - peer_have;
	c->resumer = NULL;
	r->resumes = NULL;
	if (m->role == PX_ROLE_SOURCE)
		snprintf(tries, sizeof(tries), " (attempt %u)", c->attempts);
	log_info("migration %s role=%s: port %u connection %u resumed after %llu ms%s %s: %llu "
		 "bytes sent again, from offset %llu",
		 m->key, px_role_str(m->role), c->port->id, c->seq, (unsigned long long)gap, tries,
		 r->tls.describe[0] ? r->tls.describe : "tls=off",
		 (unsigned long long)(c->kept_to - peer_have), (unsigned long long)peer_have);
}

void px_resume_failed(struct px_conn *r, const char *why)
{
	struct px_conn *c = r->resumes;
	uint64_t now = px_now(r->n);

	if (!c) {
		px_conn_release(r);
		return;
	}
	if (!r->refused)
		c->refused_ms = 0;
	else if (!c->refused_ms)
		c->refused_ms = now;
	if (r->refused && now - c->refused_ms >= REFUSED_MS) {
		px_migration_fail(c->m,
				  "port %u connection %u: the target node has refused every attempt to "
				  "resume it for %u s (ECONNREFUSED: no vmigd listens there any more, "
				  "so the connection is gone with the one that carried it)",
				  c->port->id, c->seq, REFUSED_MS / 1000);
		return;
	}
	/* the first failure and every tenth say so; the rest are the same story */
	if (c->attempts == 1 || c->attempts % 10 == 0)
		log_warn("migration %s role=source: port %u connection %u: resumption attempt %u "
			 "to %s failed: %s; trying again for %llu s more",
			 c->m->key, c->port->id, c->seq, c->attempts, r->peer, why,
			 (unsigned long long)((deadline(c) - px_now(c->n)) / 1000));
	else
		log_debug("migration %s role=source: port %u connection %u: resumption attempt %u "
			  "failed: %s",
			  c->m->key, c->port->id, c->seq, c->attempts, why);
	px_conn_release(r);
	schedule(c, c->attempts < 5 ? ATTEMPT_FIRST_MS << (c->attempts - 1) : ATTEMPT_MAX_MS);
}

void px_resume_answered(struct px_conn *r)
{
	struct px_conn *c = r->resumes;
	struct px_migration *m = r->m;
	enum px_status st;
	uint64_t have;
	int e;

	if (!c) {
		px_conn_release(r);
		return;
	}
	if (px_reply_decode(r->buf, r->len, &st, NULL) <= 0) {
		px_resume_failed(r, "the target's reply is malformed");
		return;
	}
	if (st != PX_RESUMED) {
		/* the target does not know the connection (any more), or not us: no second try */
		px_migration_fail(m, "port %u connection %u: the target refused its resumption: %s",
				  c->port->id, c->seq, px_status_str(st));
		return;
	}
	have = px_reply_have(r->buf);
	e = IO(r->n, link_resume, c->link, r->hop, have);
	if (e == -ERANGE) {
		px_migration_fail(m,
				  "port %u connection %u: the target resumes it from offset %llu, "
				  "outside what this side kept (%llu to %llu)",
				  c->port->id, c->seq, (unsigned long long)have,
				  (unsigned long long)c->kept_from, (unsigned long long)c->kept_to);
		return;
	}
	if (e < 0) {
		px_resume_failed(r, strerror(-e));
		return;
	}
	r->hop = NULL; /* the link's */
	resumed(c, r, have);
	px_conn_release(r);
}

/* The connection of port numbered seq, if it is resumable and carried. */
static struct px_conn *find(struct px_migration *m, const struct px_port *port, uint32_t seq)
{
	vm_list_each (struct px_conn, o, &m->conns, node)
		if (o->port == port && o->seq == seq && o->st == C_LINKED && o->resumable &&
		    !o->resuming)
			return o;
	return NULL;
}

/* A resumption turned away: the connection it names (if any) is not touched. */
static void refuse(struct px_conn *c, struct px_migration *m, uint32_t port, uint32_t seq,
		   const char *why)
{
	m->resume_refused++;
	c->n->resume_refused++;
	px_refusal(c->n,
		   "migration %s role=target: port %u connection %u: a resumption from %s "
		   "refused (%s); the migration goes on",
		   m->key, port, seq, c->peer, why);
	px_conn_reply(c, PX_ERR_RESUME);
	px_conn_release(c);
}

static void resumer_timeout(void *arg)
{
	struct px_conn *r = arg;

	r->t = NULL;
	log_warn("migration %s role=target: port %u connection %u: its link did not let go of its "
		 "old node hop within %llu ms; the resumption from %s is turned away",
		 r->m->key, r->port->id, r->seq,
		 (unsigned long long)r->n->conf.connect_timeout_ms, r->peer);
	px_conn_reply(r, PX_ERR_RESUME);
	px_conn_release(r);
}

void px_resume_arrive(struct px_conn *c, struct px_port *port, const struct px_preamble *p)
{
	struct px_migration *m = port->m;
	struct px_node *n = c->n;
	struct px_conn *o = find(m, port, p->seq);
	uint64_t acked, sent;
	char why[160];

	if (!o || !px_same_secret(o->token, p->token, PX_TOKEN_LEN)) {
		refuse(c, m, p->port, p->seq,
		       o ? "a wrong token" : "no resumable connection of that number");
		return;
	}
	if (o->suspended) {
		acked = o->kept_from;
		sent = o->kept_to;
	} else {
		IO(n, link_range, o->link, &acked, &sent);
	}
	/* checked before the live link is touched: a forged offset costs the stream nothing */
	if (p->have < acked || p->have > sent) {
		snprintf(why, sizeof(why), "offset %llu, outside what this side keeps, %llu to %llu",
			 (unsigned long long)p->have, (unsigned long long)acked,
			 (unsigned long long)sent);
		refuse(c, m, p->port, p->seq, why);
		return;
	}
	if (o->resumer) {
		/* an older attempt of the source's waits still: the newer one wins */
		px_conn_reply(o->resumer, PX_ERR_RESUME);
		px_conn_release(o->resumer);
	}
	px_conn_adopt(c, port, p->seq, C_TGT_RESUME);
	c->resuming = true;
	c->peer_have = p->have;
	c->resumes = o;
	o->resumer = c;
	if (o->suspended) {
		px_resume_go(o);
		return;
	}
	/* The source saw its hop fail before this side did: let go of it first. */
	if (IO(n, timer_add, px_now(n) + n->conf.connect_timeout_ms, resumer_timeout, c, &c->t) < 0)
		px_migration_fail(m, "out of memory waiting for a link to let go of its node hop");
	else
		IO(n, link_suspend, o->link);
}

void px_resume_go(struct px_conn *o)
{
	struct px_conn *r = o->resumer;
	struct px_migration *m = o->m;
	uint8_t buf[PX_REPLY_MAX];
	size_t len = px_reply_encode_resumed(o->have, buf);
	uint32_t ev;
	ssize_t k;
	int e;

	IO(o->n, timer_del, r->t);
	r->t = NULL;
	/* a fresh connection's send buffer takes the few bytes at once */
	k = IO(o->n, write, r->hop, buf, len, &ev);
	if (k != (ssize_t)len) {
		log_warn("migration %s role=target: port %u connection %u: the resumption from %s "
			 "broke before the reply; waiting for the next",
			 m->key, o->port->id, o->seq, r->peer);
		px_conn_release(r);
		return;
	}
	e = IO(o->n, link_resume, o->link, r->hop, r->peer_have);
	if (e < 0) {
		px_migration_fail(m, "port %u connection %u: cannot resume its link: %s",
				  o->port->id, o->seq, strerror(-e));
		return;
	}
	r->hop = NULL; /* the link's */
	resumed(o, r, r->peer_have);
	px_conn_release(r);
}

void px_resume_ended(struct px_conn *c)
{
	struct px_conn *r = c->resumer;

	if (!r)
		return;
	if (r->st == C_TGT_RESUME)
		px_conn_reply(r, PX_ERR_RESUME);
	px_conn_release(r);
}

void px_resume_forget(struct px_conn *c)
{
	IO(c->n, timer_del, c->rt);
	c->rt = NULL;
	if (c->resumer)
		c->resumer->resumes = NULL;
	if (c->resumes)
		c->resumes->resumer = NULL;
	c->resumer = c->resumes = NULL;
}
