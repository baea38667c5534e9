// SPDX-License-Identifier: Apache-2.0
/* The target role: node-hop connections arrive on the node's listener, authenticate (TLS),
 * send their preamble, and are opened on the migration's local unix socket strictly in the
 * source's order (px_order.c); the reply tells the source it may start relaying. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "px_private.h"
#include "util.h"

static int tgt_open(void *ctx, uint32_t seq, void *conn)
{
	struct px_port *port = ctx;
	struct px_conn *c = conn;
	int r;

	r = IO(c->n, connect_local, port->path, LOCAL_CONNECT_TIMEOUT_MS, &c->lfd);
	if (r < 0) {
		log_err("migration %s role=target: port %u connection %u: connect to %s: %s",
			port->m->key, port->id, seq, port->path, strerror(-r));
		return r;
	}
	r = px_conn_reply(c, PX_OK);
	if (r < 0) {
		log_err("migration %s role=target: port %u connection %u: replying to %s: %s",
			port->m->key, port->id, seq, c->peer, strerror(-r));
		return r;
	}
	r = px_conn_link(c);
	if (r < 0)
		log_err("migration %s role=target: port %u connection %u: data path: %s",
			port->m->key, port->id, seq, strerror(-r));
	return r;
}

static void tgt_drop(void *ctx, uint32_t seq, void *conn, enum px_status why)
{
	struct px_conn *c = conn;

	px_conn_reply(c, why);
	px_conn_release(c);
}

static const struct px_order_ops tgt_order_ops = {
	.open = tgt_open,
	.drop = tgt_drop,
};

static void tgt_order_check(void *arg);

/* The ordering deadline nearest in time, over all ports. */
static void tgt_order_arm(struct px_migration *m)
{
	struct px_node *n = m->n;
	uint64_t d = 0;

	IO(n, timer_del, m->order_timer);
	m->order_timer = NULL;
	for (unsigned int i = 0; i < m->nports; i++) {
		uint64_t pd = px_order_deadline(m->ports[i].order);

		if (pd && (!d || pd < d))
			d = pd;
	}
	if (d && IO(n, timer_add, d, tgt_order_check, m, &m->order_timer) < 0)
		px_migration_fail(m, "out of memory arming the ordering timer");
}

static void tgt_order_check(void *arg)
{
	struct px_migration *m = arg;
	uint64_t now = px_now(m->n);

	m->order_timer = NULL;
	for (unsigned int i = 0; i < m->nports; i++) {
		struct px_port *p = &m->ports[i];
		uint32_t missing = px_order_next(p->order);
		unsigned int parked = px_order_parked(p->order);

		if (px_order_expire(p->order, now)) {
			px_migration_fail(m,
					  "port %u connection %u did not arrive within %llu ms "
					  "(%u later connections were waiting)",
					  p->id, missing,
					  (unsigned long long)m->n->conf.order_timeout_ms, parked);
			return;
		}
	}
	tgt_order_arm(m);
}

static void tgt_reject(struct px_conn *c, enum px_status st, const char *key)
{
	log_warn("node hop from %s%s%s: %s; connection refused", c->peer, key ? " for " : "",
		 key ? key : "", px_status_str(st));
	px_conn_reply(c, st);
	px_conn_release(c);
}

/* A complete preamble: bind the connection to its migration and port, then to the order. */
static void tgt_dispatch(struct px_conn *c, const struct px_preamble *p)
{
	struct px_node *n = c->n;
	struct px_migration *m;
	struct px_port *port = NULL;
	enum px_status st;

	m = px_migration_find(n, p->key, PX_ROLE_TARGET);
	if (!m) {
		tgt_reject(c, n->draining ? PX_ERR_SHUTDOWN : PX_ERR_UNKNOWN_KEY, p->key);
		return;
	}
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].id == p->port)
			port = &m->ports[i];
	if (!port) {
		tgt_reject(c, PX_ERR_UNKNOWN_PORT, p->key);
		return;
	}
	if (n->draining) {
		tgt_reject(c, PX_ERR_SHUTDOWN, p->key);
		return;
	}
	if (m->conns_active >= n->conf.max_migration_conns) {
		log_err("migration %s role=target: port %u connection %u from %s refused "
			"(migration-conn-limit): %u connections already (--max-migration-conns)",
			m->key, port->id, p->seq, c->peer, m->conns_active);
		px_conn_reply(c, PX_ERR_LIMIT);
		px_conn_release(c);
		px_migration_fail(m, "more than %u connections (--max-migration-conns)",
				  n->conf.max_migration_conns);
		return;
	}
	IO(n, watch_del, c->w);
	IO(n, timer_del, c->t);
	c->w = NULL;
	c->t = NULL;
	px_conn_list_del(&n->unbound, c);
	n->nunbound--;
	c->m = m;
	c->port = port;
	c->seq = p->seq;
	c->st = C_TGT_PARKED;
	px_conn_list_add(&m->conns, c);
	m->conns_active++;
	if (p->seq > px_order_next(port->order))
		m->conns_reordered++;
	st = px_order_arrive(port->order, p->seq, c, px_now(n));
	if (st == PX_OK && px_order_failed(port->order)) {
		/* This one opened, but a parked successor could not: the sequence is broken. */
		px_migration_fail(m, "port %u connection %u could not be opened on %s", port->id,
				  px_order_next(port->order), port->path);
		return;
	}
	if (st == PX_OK) {
		tgt_order_arm(m);
		return;
	}
	log_warn("migration %s role=target: port %u connection %u from %s: %s; refused", m->key,
		 port->id, p->seq, c->peer, px_status_str(st));
	px_conn_reply(c, st);
	px_conn_release(c);
	if (st == PX_ERR_CONNECT)
		px_migration_fail(m, "port %u connection %u could not be opened on %s", port->id,
				  p->seq, port->path);
}

static void tgt_read(struct px_conn *c)
{
	struct px_preamble p;
	struct xp_conn_why why;
	uint32_t ev;
	size_t want;
	ssize_t k;
	int r;

	/* Exactly the preamble: the bytes after it belong to the local socket. TLS may hold
	 * them decrypted already, so read until it would block, not once per event. */
	for (;;) {
		want = c->len < PX_PREAMBLE_FIXED
			       ? PX_PREAMBLE_FIXED - c->len
			       : PX_PREAMBLE_FIXED + vm_get_be16(c->buf + 16) - c->len;
		k = IO(c->n, read, c->hop, c->buf + c->len, want, &ev);
		if (k == -EAGAIN) {
			if (IO(c->n, watch_mod, c->w, ev) < 0)
				px_conn_release(c);
			return;
		}
		if (k < 0) {
			IO(c->n, why, c->hop, (int)k, &why);
			log_warn("node hop from %s: %s before the preamble was complete%s%s",
				 c->peer, k == -EPROTO ? "TLS error" : strerror((int)-k),
				 why.detail && k == -EPROTO ? ": " : "",
				 why.detail && k == -EPROTO ? why.detail : "");
			px_conn_release(c);
			return;
		}
		if (k == 0) {
			log_warn(
				"node hop from %s: closed after %zu bytes, before the preamble was "
				"complete",
				c->peer, c->len);
			px_conn_release(c);
			return;
		}
		c->len += k;
		r = px_preamble_decode(c->buf, c->len, &p);
		if (r < 0) {
			tgt_reject(c, -r, NULL);
			return;
		}
		if (r > 0) {
			tgt_dispatch(c, &p);
			return;
		}
	}
}

static void tgt_timeout(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	if (c->st == C_TGT_HANDSHAKE)
		log_warn("node hop from %s: TLS refused (handshake-timeout): no complete handshake "
			 "within %llu ms; dropped",
			 c->peer, (unsigned long long)c->n->conf.handshake_timeout_ms);
	else
		log_warn("node hop from %s: no complete preamble within %llu ms (%zu bytes); "
			 "dropped",
			 c->peer, (unsigned long long)c->n->conf.preamble_timeout_ms, c->len);
	px_conn_release(c);
}

/* Authenticated (or plain text): the preamble has its own deadline. */
static void tgt_start_preamble(struct px_conn *c)
{
	struct px_node *n = c->n;

	IO(n, timer_del, c->t);
	c->t = NULL;
	c->st = C_TGT_PREAMBLE;
	if (IO(n, timer_add, px_now(n) + n->conf.preamble_timeout_ms, tgt_timeout, c, &c->t) < 0) {
		log_err("node hop: out of memory, dropping a connection");
		px_conn_release(c);
		return;
	}
	tgt_read(c);
}

static void tgt_handshake(struct px_conn *c)
{
	struct xp_conn_why why;
	uint32_t ev = EPOLLIN;
	int r;

	r = IO(c->n, handshake, c->hop, true, &ev);
	if (r == -EAGAIN) {
		if (IO(c->n, watch_mod, c->w, ev) < 0)
			px_conn_release(c);
		return;
	}
	if (r < 0) {
		IO(c->n, why, c->hop, r, &why);
		if (why.token)
			log_warn("node hop from %s: TLS refused (%s): %s", c->peer, why.token,
				 why.detail);
		else
			log_err("node hop from %s: TLS: %s, dropping the connection", c->peer,
				strerror(-r));
		px_conn_release(c);
		return;
	}
	IO(c->n, conn_info, c->hop, &c->tls);
	tgt_start_preamble(c);
}

static void tgt_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct px_conn *c = arg;

	if (c->st == C_TGT_HANDSHAKE)
		tgt_handshake(c);
	else
		tgt_read(c);
}

/* Connections that have not yet authenticated are bounded; the excess is closed at once. */
static bool tgt_admit(struct px_node *n, const char *peer)
{
	uint64_t now = px_now(n);

	if (n->nunbound < n->conf.max_unauth)
		return true;
	n->unauth_refused++;
	if (now - n->unauth_logged_ms >= 1000) {
		log_warn("node hop from %s: refused (too-many-unauthenticated): %u connections are "
			 "still authenticating (--max-unauthenticated %u); %u refused since the "
			 "last such line",
			 peer, n->nunbound, n->conf.max_unauth, n->unauth_refused);
		n->unauth_refused = 0;
		n->unauth_logged_ms = now;
	}
	return false;
}

void px_target_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct px_node *n = arg;
	struct xp_conn *hop;
	char peer[80];
	int r;

	while ((r = IO(n, accept, lfd, &hop, peer, sizeof(peer))) == 0) {
		struct px_conn *c;

		if (!tgt_admit(n, peer)) {
			IO(n, close, hop);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_err("node hop: out of memory, dropping a connection");
			IO(n, close, hop);
			continue;
		}
		c->n = n;
		c->hop = hop;
		c->lfd = -1;
		strcpy(c->peer, peer);
		px_conn_list_add(&n->unbound, c);
		n->nunbound++;
		if (IO(n, watch_add, hop->fd, EPOLLIN, tgt_io, c, &c->w) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			px_conn_release(c);
			continue;
		}
		if (!n->conf.tls) {
			IO(n, conn_info, c->hop, &c->tls);
			tgt_start_preamble(c);
			continue;
		}
		c->st = C_TGT_HANDSHAKE;
		if (IO(n, timer_add, px_now(n) + n->conf.handshake_timeout_ms, tgt_timeout, c,
		       &c->t) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			px_conn_release(c);
			continue;
		}
		tgt_handshake(c);
	}
	if (r != -EAGAIN && r != -EINTR && r != -ECONNABORTED)
		log_err("node hop: accept: %s", strerror(-r));
}

int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, uint64_t cap, struct px_portmap *out,
		    char *err, size_t errlen)
{
	struct px_portmap t = { 0 };
	struct px_migration *m;
	uint32_t ids[PX_PORTS_MAX] = { 0 };
	char list[PX_PORTS_MAX * 120] = "", note[64];
	int r;

	r = px_check_key(n, key, PX_ROLE_TARGET, err, errlen);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < nports && i < PX_PORTS_MAX; i++)
		ids[i] = ports[i].id;
	r = px_check_ports(nports, ids, err, errlen);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < nports; i++) {
		r = px_check_path(ports[i].path, err, errlen);
		if (r < 0)
			return r;
	}
	m = px_migration_new(n, key, PX_ROLE_TARGET);
	if (!m)
		goto fail_nomem;
	m->nports = nports;
	px_migration_set_cap_now(m, cap);
	for (unsigned int i = 0; i < nports; i++) {
		struct px_port *p = &m->ports[i];
		size_t used = strlen(list);

		p->id = ports[i].id;
		strcpy(p->path, ports[i].path);
		r = px_order_new(&tgt_order_ops, p, ORDER_MAX_PARKED, n->conf.order_timeout_ms,
				 &p->order);
		if (r < 0)
			goto fail_free;
		t.ports[i] = p->id;
		snprintf(list + used, sizeof(list) - used, "%s%u=%s", i ? "," : "", p->id, p->path);
	}
	strcpy(t.key, key);
	strcpy(t.address, n->advertise);
	t.port = xp_addr_port(&n->bound);
	t.nports = nports;
	m->next = n->migrations;
	n->migrations = m;
	log_info("migration %s role=target start ports=%s%s", key, list,
		 px_cap_note(cap, note, sizeof(note)));
	*out = t;
	return 0;

fail_free:
	for (unsigned int i = 0; i < nports; i++)
		px_order_free(m->ports[i].order);
	px_migration_discard(m);
fail_nomem:
	snprintf(err, errlen, "out of memory");
	return -ENOMEM;
}

int px_target_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	struct px_migration *m = px_migration_find(n, key, PX_ROLE_TARGET);

	if (!m) {
		snprintf(err, errlen, "unknown migration %.130s: no target listener with that key",
			 key);
		return -ENOENT;
	}
	px_migration_stop(m);
	return 0;
}
