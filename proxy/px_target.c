// SPDX-License-Identifier: Apache-2.0
/* The target role: node-hop connections arrive on the node's listener, authenticate (TLS),
 * send their preamble, and are opened on the migration's local unix socket strictly in the
 * source's order (px_order.c); the reply tells the source it may start relaying. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"
#include "px_private.h"
#include "util.h"

static int tgt_open(void *ctx, uint32_t seq, void *conn)
{
	struct px_port *port = ctx;
	struct px_conn *c = conn;
	int r;

	r = IO(c->n, connect_local, port->path, c->n->conf.socket_uid, LOCAL_CONNECT_TIMEOUT_MS,
	       &c->lfd);
	if (r < 0) {
		log_err("migration %s role=target: port %u connection %u: connect to %s: %s",
			port->m->key, port->id, seq, port->path, xp_path_strerror(r));
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
	/* Raw bytes on the shared port: most likely a stock KubeVirt source. */
	px_refusal(c->n, "node hop from %s%s%s: %s; connection refused%s", c->peer,
		   key ? " for " : "", key ? key : "", px_status_str(st),
		   st == PX_ERR_MALFORMED ? " (a stock KubeVirt peer? it needs a target started "
					    "with --kubevirt)"
					  : "");
	px_conn_reply(c, st);
	px_conn_release(c);
}

/*
 * Moves an authenticated connection from the unbound list to its migration's port, parked as
 * connection seq; past --max-migration-conns it is refused instead (with a reply where the peer
 * reads one: not a raw peer's) and the migration fails. 0, or -EMFILE when refused.
 */
static int tgt_bind(struct px_conn *c, struct px_port *port, uint32_t seq)
{
	struct px_node *n = c->n;
	struct px_migration *m = port->m;

	if (m->conns_active >= n->conf.max_migration_conns) {
		log_err("migration %s role=target: port %u %sconnection %u from %s refused "
			"(migration-conn-limit): %u connections already (--max-migration-conns)",
			m->key, port->id, c->raw ? "raw " : "", seq, c->peer, m->conns_active);
		if (!c->raw)
			px_conn_reply(c, PX_ERR_LIMIT);
		px_conn_release(c);
		px_migration_fail(m, "more than %u connections (--max-migration-conns)",
				  n->conf.max_migration_conns);
		return -EMFILE;
	}
	px_conn_adopt(c, port, seq, C_TGT_PARKED);
	return 0;
}

/* The address of "ADDR:PORT" or "[ADDR]:PORT", without the port. */
static void peer_address(const char *peer, char *buf, size_t len)
{
	const char *colon = strrchr(peer, ':');
	size_t n = colon ? (size_t)(colon - peer) : strlen(peer);

	if (n >= 2 && peer[0] == '[' && peer[n - 1] == ']') {
		peer++;
		n -= 2;
	}
	snprintf(buf, len, "%.*s", (int)n, peer);
}

/*
 * Whether c may join m: every connection of a migration comes from the peer its first one came
 * from (address, and certificate subject under TLS; the subject survives a rotation of the
 * files, the address tells apart nodes that share KubeVirt's one certificate). The first one
 * binds the migration. Refused: false, with why filled in.
 */
static bool tgt_same_peer(struct px_migration *m, const struct px_conn *c, char *why, size_t len)
{
	const char *addr = c->addr;

	if (!m->peer_bound) {
		m->peer_bound = true;
		snprintf(m->peer_addr, sizeof(m->peer_addr), "%s", addr);
		snprintf(m->peer_name, sizeof(m->peer_name), "%s", c->tls.peer_name);
		return true;
	}
	if (strcmp(addr, m->peer_addr) != 0) {
		snprintf(why, len, "address %s, not %s of its first connection", addr,
			 m->peer_addr);
		return false;
	}
	if (strcmp(c->tls.peer_name, m->peer_name) != 0) {
		snprintf(why, len, "certificate \"%s\", not \"%s\" of its first connection",
			 c->tls.peer_name, m->peer_name);
		return false;
	}
	return true;
}

/* Refused as not the migration's peer: the connection goes, the migration carries on. */
static void tgt_refuse_peer(struct px_conn *c, const struct px_migration *m, uint32_t port,
			    const char *why)
{
	px_refusal(c->n,
		   "migration %s role=target: port %u connection from %s refused "
		   "(not-the-peer): %s; the migration goes on",
		   m->key, port, c->peer, why);
	if (!c->raw)
		px_conn_reply(c, PX_ERR_AUTH);
	px_conn_release(c);
}

/* A complete preamble: bind the connection to its migration and port, then to the order. */
static void tgt_dispatch(struct px_conn *c, const struct px_preamble *p)
{
	struct px_node *n = c->n;
	struct px_migration *m;
	struct px_port *port = NULL;
	enum px_status st;
	char why[400];

	/* A port's own listener serves that port of that migration only. */
	m = c->lport ? c->lport->m : px_migration_find(n, p->key, PX_ROLE_TARGET);
	/* A report may come after the stop, while the record waits for its links or reports. */
	if (!m && !c->lport && p->verify)
		m = px_verify_find(n, p->key);
	if (!m && px_node_elsewhere(n, p->key)) {
		/* Its connections were made before the takeover and stay where they are. */
		px_refusal(n,
			   "migration %s role=target: port %u connection %u from %s refused: the "
			   "migration stayed with %s at the takeover, and a connection made after "
			   "it cannot join it",
			   p->key, p->port, p->seq, c->peer, px_node_elsewhere(n, p->key));
		px_conn_reply(c, PX_ERR_SHUTDOWN);
		px_conn_release(c);
		return;
	}
	/* A stopped migration's port listener is open for reports, and for resumptions of the
	 * links its grace lets finish. */
	if (!m || strcmp(m->key, p->key) || (m->stopping && !p->verify && !p->resume)) {
		tgt_reject(c, n->draining ? PX_ERR_SHUTDOWN : PX_ERR_UNKNOWN_KEY, p->key);
		return;
	}
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].id == p->port && (!c->lport || c->lport == &m->ports[i]))
			port = &m->ports[i];
	if (!port) {
		tgt_reject(c, PX_ERR_UNKNOWN_PORT, p->key);
		return;
	}
	/* A drain lets the migrations in flight end, and their reports and resumptions. */
	if (n->draining && !p->verify && !p->resume) {
		tgt_reject(c, PX_ERR_SHUTDOWN, p->key);
		return;
	}
	/* KubeVirt's API carries no secret from target to source: in that mode a source comes
	 * without one, to the migration's own listeners only, which their private ports, TLS
	 * and the first peer protect. On the shared port every migration needs its secret. */
	if (p->has_secret ? !px_same_secret(p->secret, m->secret, PX_SECRET_LEN)
			  : !(m->kubevirt && c->lport)) {
		tgt_refuse_peer(c, m, p->port,
				p->has_secret ? "a wrong secret"
				: m->kubevirt ? "no secret on the shared port (a KubeVirt-mode "
						"migration's source without one dials its own ports)"
					      : "no secret (a source vmigd older than the "
						"target's, or not the migration's source)");
		return;
	}
	if (!tgt_same_peer(m, c, why, sizeof(why))) {
		tgt_refuse_peer(c, m, p->port, why);
		return;
	}
	if (p->verify) {
		px_verify_arrive(c, port, p);
		return;
	}
	if (p->resume) {
		px_resume_arrive(c, port, p);
		return;
	}
	c->digest = p->digest;
	/* not while the hop's link is down or the source's address unreachable (px_dpdk.c) */
	if (p->dpdk.ip && px_dpdk_can(c) && px_dpdk_usable(n, p->dpdk.ip)) {
		/*
		 * Both nodes key a link by the peer's address and the stream id, and a node can be
		 * source and target to the same peer at once: ids proposed by the node with the
		 * lower address get the top bit, so two proposals never meet.
		 */
		c->dpdk = p->dpdk;
		c->dpdk.stream &= 0x7fffffffu;
		if (p->dpdk.ip < n->dpdk.ip)
			c->dpdk.stream |= 0x80000000u;
	}
	/* Resumable: both vmigd (a preamble); over DPDK, a source that resumes such a connection
	 * over the kernel path (an older one does not: it gets PX_OK_DPDK) */
	if (p->resumable && (!c->dpdk.ip || p->dpdk_resume) && n->conf.resume_timeout_ms &&
	    getrandom(c->token, sizeof(c->token), 0) == sizeof(c->token))
		c->resumable = true;
	/* compressed chunks: in the kernel path's frames, or (asked for) the DPDK hop's stream */
	c->zin = p->compress && c->resumable && (!c->dpdk.ip || p->compress_dpdk) &&
		 n->conf.compress != PX_COMPRESS_OFF;
	if (tgt_bind(c, port, p->seq) < 0)
		return;
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
	px_refusal(n, "migration %s role=target: port %u connection %u from %s: %s; refused",
		   m->key, port->id, p->seq, c->peer, px_status_str(st));
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
		want = c->len < PX_PREAMBLE_FIXED ? PX_PREAMBLE_FIXED - c->len
						  : px_preamble_len(c->buf) - c->len;
		k = IO(c->n, read, c->hop, c->buf + c->len, want, &ev);
		if (k == -EAGAIN) {
			if (IO(c->n, watch_mod, c->w, ev) < 0)
				px_conn_release(c);
			return;
		}
		if (k < 0) {
			IO(c->n, why, c->hop, (int)k, &why);
			px_count_refusal(c->n, &why);
			px_refusal(c->n,
				   "node hop from %s: %s before the preamble was complete%s%s",
				   c->peer, k == -EPROTO ? "TLS error" : strerror((int)-k),
				   why.detail && k == -EPROTO ? ": " : "",
				   why.detail && k == -EPROTO ? why.detail : "");
			px_conn_release(c);
			return;
		}
		if (k == 0) {
			px_refusal(
				c->n,
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
	if (c->st == C_TGT_HANDSHAKE) {
		px_count_refusal_of(c->n, PX_REFUSAL_HANDSHAKE_TIMEOUT);
		px_refusal(
			c->n,
			"node hop from %s: TLS refused (handshake-timeout): no complete handshake "
			"within %llu ms; dropped",
			c->peer, (unsigned long long)c->n->conf.handshake_timeout_ms);
	} else
		px_refusal(c->n,
			   "node hop from %s: no complete preamble within %llu ms (%zu bytes); "
			   "dropped",
			   c->peer, (unsigned long long)c->n->conf.preamble_timeout_ms, c->len);
	px_conn_release(c);
}

/* A TLS client speaks first: one that has sent nothing by then is dropped (a silent
 * stranger holds a place that a peer may need), well before the handshake's deadline. */
static uint64_t silence_ms(const struct px_node *n)
{
	return n->conf.handshake_timeout_ms < PX_SILENCE_MS ? n->conf.handshake_timeout_ms
							     : PX_SILENCE_MS;
}

static void tgt_silent(void *arg)
{
	struct px_conn *c = arg;
	struct px_node *n = c->n;
	uint64_t deadline = c->accepted_ms + n->conf.handshake_timeout_ms;

	c->t = NULL;
	if (!c->heard && silence_ms(n) < n->conf.handshake_timeout_ms) {
		px_count_refusal_of(n, PX_REFUSAL_SILENT);
		px_refusal(n,
			   "node hop from %s: TLS refused (silent): not a byte within %llu ms; "
			   "dropped",
			   c->peer, (unsigned long long)silence_ms(n));
		px_conn_release(c);
		return;
	}
	if (px_now(n) >= deadline) {
		tgt_timeout(c);
		return;
	}
	if (IO(n, timer_add, deadline, tgt_timeout, c, &c->t) < 0) {
		log_err("node hop: out of memory, dropping a connection");
		px_conn_release(c);
	}
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

/*
 * A stock peer's connection on a port's own listener: no preamble, no order. The local socket
 * is opened at once (NBD's server speaks first: nothing may wait for the peer's bytes).
 */
static void tgt_raw(struct px_conn *c)
{
	struct px_node *n = c->n;
	struct px_port *port = c->lport;
	struct px_migration *m = port->m;
	char why[400];
	int r;

	if (m->failed || m->stopping || n->draining) {
		px_refusal(
			n,
			"migration %s role=target: port %u: a raw connection from %s refused: %s",
			m->key, port->id, c->peer,
			n->draining   ? "shutting down"
			: m->stopping ? "the migration was stopped"
				      : "the migration has failed");
		px_conn_release(c);
		return;
	}
	c->raw = true;
	if (!tgt_same_peer(m, c, why, sizeof(why))) {
		tgt_refuse_peer(c, m, port->id, why);
		return;
	}
	if (tgt_bind(c, port, port->next_seq) < 0)
		return;
	port->next_seq++;
	r = IO(n, connect_local, port->path, n->conf.socket_uid, LOCAL_CONNECT_TIMEOUT_MS, &c->lfd);
	if (r < 0) {
		m->conns_failed++;
		log_err("migration %s role=target: port %u raw connection %u from %s: connect to "
			"%s: %s",
			m->key, port->id, c->seq, c->peer, port->path, xp_path_strerror(r));
		px_conn_release(c);
		return;
	}
	r = px_conn_link(c);
	if (r < 0) {
		m->conns_failed++;
		log_err("migration %s role=target: port %u raw connection %u: data path: %s",
			m->key, port->id, c->seq, strerror(-r));
		px_conn_release(c);
	}
}

/* Authenticated (or plain text): a vmigd peer sends its preamble, a stock one relays raw. */
static void tgt_authenticated(struct px_conn *c)
{
	IO(c->n, conn_info, c->hop, &c->tls);
	if (c->lport && !c->tls.vmigd)
		tgt_raw(c);
	else
		tgt_start_preamble(c);
}

/* TLS on the shared node-hop port is the daemon's; on a port's own, its migration's. */
static unsigned int tgt_hs_flags(const struct px_conn *c)
{
	bool tls = c->lport ? c->lport->m->tls : c->n->conf.tls != NULL;

	return XP_HS_SERVER | (tls ? XP_HS_TLS : 0);
}

static void tgt_handshake(struct px_conn *c)
{
	struct xp_conn_why why;
	uint32_t ev = EPOLLIN;
	int r;

	r = IO(c->n, handshake, c->hop, tgt_hs_flags(c), &ev);
	if (r == -EAGAIN) {
		if (IO(c->n, watch_mod, c->w, ev) < 0)
			px_conn_release(c);
		return;
	}
	if (r < 0) {
		IO(c->n, why, c->hop, r, &why);
		px_count_refusal(c->n, &why);
		if (why.token)
			px_refusal(c->n, "node hop from %s: TLS refused (%s): %s", c->peer,
				   why.token, why.detail);
		else
			px_refusal(c->n, "node hop from %s: TLS: %s, dropping the connection",
				   c->peer, strerror(-r));
		px_conn_release(c);
		return;
	}
	tgt_authenticated(c);
}

static void tgt_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct px_conn *c = arg;

	c->heard = true;
	if (c->st == C_TGT_HANDSHAKE)
		tgt_handshake(c);
	else
		tgt_read(c);
}

/* How many unauthenticated connections on c's listener come from c's address. */
static unsigned int unbound_from(const struct px_node *n, const struct px_conn *c)
{
	unsigned int k = 0;

	vm_list_each (const struct px_conn, o, &n->unbound, node)
		k += o->lport == c->lport && !strcmp(o->addr, c->addr);
	return k;
}

/*
 * The connection to close for a newcomer on lport's listener, NULL while the listener is under
 * its bound: the oldest of the address holding most there. A flood then only ever evicts its
 * own and cannot keep the door shut by reconnecting, while a peer's burst of channels (one
 * address, dozens of connections accepted before any preamble is read) is never cut short by
 * a per-address share.
 */
static struct px_conn *tgt_victim(struct px_node *n, const struct px_port *lport,
				  const char *addr, unsigned int *ret_listener, unsigned int *ret_addr)
{
	unsigned int on_listener = 0, same = 0, most = 0;
	struct px_conn *victim = NULL;

	vm_list_each (struct px_conn, c, &n->unbound, node) {
		if (c->lport != lport)
			continue;
		on_listener++;
		same += !strcmp(c->addr, addr);
	}
	*ret_listener = on_listener;
	*ret_addr = same;
	if (on_listener < n->conf.max_unauth)
		return NULL;
	/* The list is newest first: on a tie the later match, the older connection, wins. */
	vm_list_each (struct px_conn, c, &n->unbound, node) {
		unsigned int k;

		if (c->lport != lport)
			continue;
		k = unbound_from(n, c);
		if (k >= most) {
			most = k;
			victim = c;
		}
	}
	return victim;
}

/* Makes room for a newcomer from peer (its address: addr), closing a waiting stranger if need
 * be (tgt_victim). */
static void tgt_admit(struct px_node *n, const struct px_port *lport, const char *peer,
		      const char *addr)
{
	unsigned int on_listener, from_addr;
	struct px_conn *victim;
	uint64_t now = px_now(n);

	victim = tgt_victim(n, lport, addr, &on_listener, &from_addr);
	if (!victim)
		return;
	n->unauth_refused++;
	if (now - n->unauth_logged_ms >= 1000) {
		log_warn("node hop from %s: closed the oldest unauthenticated connection from %s "
			 "(too-many-unauthenticated): %u on this listener, %u from %s "
			 "(--max-unauthenticated %u per listener); %u closed since the last such line",
			 peer, victim->addr, on_listener, from_addr, addr, n->conf.max_unauth,
			 n->unauth_refused);
		n->unauth_refused = 0;
		n->unauth_logged_ms = now;
	}
	px_conn_release(victim);
}

/* lport: the KubeVirt-mode port whose own listener lfd is, NULL for the node-hop listener. */
static void tgt_accept_on(struct px_node *n, struct xp_watch *w, int lfd, struct px_port *lport)
{
	struct xp_conn *hop;
	char peer[80], addr[64];
	int r;

	while ((r = IO(n, accept, lfd, &hop, peer, sizeof(peer))) == 0) {
		struct px_conn *c;

		peer_address(peer, addr, sizeof(addr));
		tgt_admit(n, lport, peer, addr);
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_err("node hop: out of memory, dropping a connection");
			IO(n, close, hop);
			continue;
		}
		c->n = n;
		c->hop = hop;
		c->lfd = -1;
		c->lport = lport;
		strcpy(c->peer, peer);
		strcpy(c->addr, addr);
		c->accepted_ms = px_now(n);
		vm_list_add(&n->unbound, &c->node);
		n->nunbound++;
		if (IO(n, watch_add, hop->fd, EPOLLIN, tgt_io, c, &c->w) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			px_conn_release(c);
			continue;
		}
		if (!(tgt_hs_flags(c) & XP_HS_TLS)) {
			tgt_authenticated(c);
			continue;
		}
		c->st = C_TGT_HANDSHAKE;
		if (IO(n, timer_add, c->accepted_ms + silence_ms(n), tgt_silent, c, &c->t) < 0) {
			log_err("node hop: out of memory, dropping a connection");
			px_conn_release(c);
			continue;
		}
		tgt_handshake(c);
	}
	px_accept_failed(n, w, r, lport ? "node hop (a port's own listener)" : "node hop");
}

void px_target_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	tgt_accept_on(arg, w, lfd, NULL);
}

void px_target_accept_port(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct px_port *port = arg;

	tgt_accept_on(port->m->n, w, lfd, port);
}

/* A target's socket path is QEMU's, never removed here; the connections its port's own
 * listener (KubeVirt mode) accepted and that have not said who they are go with it. */
static void tgt_port_closed(struct px_port *p)
{
	struct px_node *n = p->m->n;
	struct px_conn *c, *next;

	vm_list_for_each_entry_safe (c, next, &n->unbound, node) {
		if (c->lport == p)
			px_conn_free(c);
	}
}

/*
 * A KubeVirt-mode target's sources reach it only through its ports' own listeners: those stay
 * until the record goes, for the reports of connections that end after the stop (they take
 * nothing else once stopping). In plain text such a target has no vmigd sources (raw), so no
 * reports.
 */
static bool tgt_stop_keeps_ports(const struct px_migration *m)
{
	return m->kubevirt && m->tls;
}

const struct px_role_ops px_target_ops = {
	.port_closed = tgt_port_closed,
	.stop_keeps_ports = tgt_stop_keeps_ports,
};

/* Whether a running target was started with exactly these arguments (ports as a set), and
 * listens on the TCP ports asked for, where some are. */
static bool same_target(const struct px_migration *m, unsigned int nports,
			const struct px_port_info *ports, const struct px_start *o, bool tls)
{
	if (m->nports != nports || m->kubevirt != o->kubevirt || m->tls != tls ||
	    m->opts.cap != o->cap)
		return false;
	for (unsigned int i = 0; i < nports; i++) {
		unsigned int j;

		for (j = 0; j < m->nports; j++)
			if (m->ports[j].id == ports[i].id &&
			    !strcmp(m->ports[j].path, ports[i].path) &&
			    (!ports[i].tcp || ports[i].tcp == m->ports[j].tcp))
				break;
		if (j == m->nports)
			return false;
	}
	return true;
}

/* What target start answers: vmigd's own form, or KubeVirt's map of per-port listeners. */
static void target_map(const struct px_migration *m, struct px_portmap *out)
{
	struct px_node *n = m->n;

	memset(out, 0, sizeof(*out));
	strcpy(out->key, m->key);
	strcpy(out->address, n->advertise);
	out->kubevirt = m->kubevirt;
	out->tls = m->tls;
	out->has_secret = true;
	memcpy(out->secret, m->secret, PX_SECRET_LEN);
	out->dpdk = n->dpdk;
	out->digest = n->conf.digest != PX_DIGEST_OFF;
	out->resume = n->conf.resume_timeout_ms > 0;
	out->resume_dpdk = out->resume && n->dpdk.ip;
	out->compress = out->resume && n->conf.compress != PX_COMPRESS_OFF;
	out->compress_dpdk = out->compress && out->resume_dpdk;
	out->port = m->kubevirt ? 0 : xp_addr_port(&n->bound);
	out->nports = m->nports;
	for (unsigned int i = 0; i < m->nports; i++) {
		out->ports[i] = m->ports[i].id;
		out->tcp[i] = m->ports[i].tcp;
	}
}

/*
 * KubeVirt mode: each port gets a listener of its own, on the node hop's address, on the TCP
 * port asked for (want[i], a restart keeping what was published) or any. The caller closes
 * what was opened when one fails.
 */
static int listen_ports(struct px_migration *m, const unsigned int *want, char *err, size_t errlen)
{
	struct px_node *n = m->n;
	int r;

	for (unsigned int i = 0; i < m->nports; i++) {
		struct px_port *p = &m->ports[i];
		struct xp_addr a = n->bound, bound;

		xp_addr_set_port(&a, want[i]);
		r = IO(n, listen_tcp, &a, &p->lfd, &bound);
		if (r < 0 && want[i]) {
			snprintf(err, errlen, "cannot listen for port %u on TCP port %u: %s (%s)",
				 p->id, want[i], strerror(-r), strerrorname_np(-r));
			return r;
		}
		if (r < 0) {
			snprintf(err, errlen, "cannot listen for port %u: %s", p->id, strerror(-r));
			return r;
		}
		p->tcp = xp_addr_port(&bound);
		r = IO(n, watch_add, p->lfd, EPOLLIN, px_target_accept_port, p, &p->w);
		if (r < 0) {
			snprintf(err, errlen, "out of memory");
			return r;
		}
	}
	return 0;
}

/* KubeVirt mode's ports: only KubeVirt's logical ports, and a TCP port of its own (into want[])
 * only in that mode. */
static int check_kubevirt(unsigned int nports, const struct px_port_info *ports,
			  const struct px_start *opts, unsigned int *want, char *err, size_t errlen)
{
	for (unsigned int i = 0; i < nports; i++) {
		if (opts->kubevirt && !px_kubevirt_port(ports[i].id)) {
			snprintf(err, errlen,
				 "port %u is not one of KubeVirt's logical ports (0 libvirt, 49152 QEMU, "
				 "49153 NBD): give vmigd's own ports without --kubevirt",
				 ports[i].id);
			return -EINVAL;
		}
		if (ports[i].tcp && (!opts->kubevirt || ports[i].tcp > 65535)) {
			snprintf(err, errlen,
				 "port %u: a TCP port of its own (%u) needs KubeVirt mode, 1 to 65535",
				 ports[i].id, ports[i].tcp);
			return -EINVAL;
		}
		want[i] = ports[i].tcp;
	}
	return 0;
}

int px_target_start(struct px_node *n, const char *key, unsigned int nports,
		    const struct px_port_info *ports, const struct px_start *opts,
		    struct px_portmap *out, char *err, size_t errlen)
{
	struct px_migration *m, *old;
	uint32_t ids[PX_PORTS_MAX] = { 0 };
	unsigned int want[PX_PORTS_MAX] = { 0 };
	char list[PX_PORTS_MAX * 120] = "", note[64];
	bool tls;
	int r;

	r = px_check_key(n, key, err, errlen);
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
	r = check_kubevirt(nports, ports, opts, want, err, errlen);
	if (r < 0)
		return r;
	r = px_tls_choose(n, opts->tls, &tls, err, errlen);
	if (r < 0)
		return r;
	if (!opts->kubevirt && tls != (n->conf.tls != NULL)) {
		snprintf(err, errlen,
			 "TLS %s for this migration needs per-port listeners (--kubevirt): the "
			 "shared "
			 "node-hop port is %s",
			 tls ? "on" : "off", n->conf.tls ? "TLS" : "plain text (--no-tls)");
		return -EINVAL;
	}
	old = px_migration_find(n, key, PX_ROLE_TARGET);
	if (old && same_target(old, nports, ports, opts, tls)) {
		target_map(old, out);
		return 0;
	}
	if (old) {
		log_warn("migration %s role=target: started again with other arguments; the old "
			 "listeners stop",
			 key);
		px_migration_stop(old);
	}
	m = px_migration_new(n, key, PX_ROLE_TARGET);
	if (!m)
		goto fail_nomem;
	m->nports = nports;
	m->kubevirt = opts->kubevirt;
	m->tls = tls;
	m->opts = *opts;
	if (opts->has_secret) {
		memcpy(m->secret, opts->secret, sizeof(m->secret));
	} else if (getrandom(m->secret, sizeof(m->secret), 0) != sizeof(m->secret)) {
		r = -errno;
		px_migration_discard(m);
		snprintf(err, errlen, "cannot make the migration's secret: %s", strerror(-r));
		return r;
	}
	px_migration_set_cap_now(m, opts->cap);
	for (unsigned int i = 0; i < nports; i++) {
		struct px_port *p = &m->ports[i];
		size_t used = strlen(list);

		p->id = ports[i].id;
		strcpy(p->path, ports[i].path);
		r = px_order_new(&tgt_order_ops, p, ORDER_MAX_PARKED, n->conf.order_timeout_ms,
				 &p->order);
		if (r < 0)
			goto fail_free;
		snprintf(list + used, sizeof(list) - used, "%s%u=%s", i ? "," : "", p->id, p->path);
	}
	if (m->kubevirt) {
		r = listen_ports(m, want, err, errlen);
		if (r < 0)
			goto fail_listen;
	}
	vm_list_add(&n->migrations, &m->node);
	target_map(m, out);
	log_info("migration %s role=target start ports=%s%s%s%s", key, list,
		 m->kubevirt ? " kubevirt" : "",
		 tls == (n->conf.tls != NULL) ? ""
		 : tls			      ? " tls=on"
					      : " tls=off",
		 px_cap_note(opts->cap, note, sizeof(note)));
	return 0;

fail_listen:
	for (unsigned int i = 0; i < nports; i++)
		px_port_close(&m->ports[i]);
	for (unsigned int i = 0; i < nports; i++)
		px_order_free(m->ports[i].order);
	px_migration_discard(m);
	return r;
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

int px_target_secret(struct px_node *n, const char *key, uint8_t out[PX_SECRET_LEN])
{
	struct px_migration *m = px_migration_find(n, key, PX_ROLE_TARGET);

	if (!m)
		return -ENOENT;
	memcpy(out, m->secret, PX_SECRET_LEN);
	return 0;
}
