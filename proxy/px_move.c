// SPDX-License-Identifier: Apache-2.0
/* Moving a live migration to the vmigd that takes over: here its links quiesce (nothing held,
 * everything acknowledged and delivered) and let go; there they start suspended, from the same
 * offsets and digests, and resume over new node-hop connections as after a failed one. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "px_private.h"

/* Why m cannot move now, or NULL. */
static const char *unmovable(const struct px_migration *m)
{
	unsigned int k = 0;

	if (m->failed || m->stopping || m->moved)
		return "it is ending";
	if (m->moving)
		return "it is moving already";
	if (m->kubevirt)
		return "a KubeVirt-mode migration stays";
	vm_list_each (const struct px_conn, c, &m->conns, node) {
		if (c->st != C_LINKED || c->verify || c->resuming)
			return "a connection of it is being set up, resumed or checked";
		if (!c->resumable)
			return "a connection of it is not resumable (a stock peer, or "
			       "--resume-timeout 0)";
		if (c->dpdk.ip)
			return "a connection of it is on the DPDK node hop";
		if (c->zout_offered || c->zin)
			return "a connection of it carries compressed chunks";
		if (c->suspended)
			return "a connection of it is without its node hop";
		k++;
	}
	if (k != m->conns_total || m->conns_failed)
		return "some of its connections have ended";
	if (k > PX_MOVE_CONNS_MAX)
		return "it has too many connections";
	if (k == 0 && m->role == PX_ROLE_TARGET)
		return "a target without connections moves with the offer";
	for (unsigned int i = 0; m->role == PX_ROLE_TARGET && i < m->nports; i++)
		if (px_order_parked(m->ports[i].order))
			return "connections of it wait for their predecessors";
	return NULL;
}

static void unquiesce(struct px_migration *m)
{
	vm_list_each (struct px_conn, c, &m->conns, node) {
		if (c->quiescing || c->quiesced)
			IO(m->n, link_quiesce, c->link, false);
		c->quiescing = c->quiesced = false;
	}
}

void px_move_off(struct px_migration *m, const char *why)
{
	if (!m->moving || m->offered)
		return; /* not moving, or offered: the other vmigd's answer decides */
	m->moving = false;
	IO(m->n, timer_del, m->move_timer);
	m->move_timer = NULL;
	unquiesce(m);
	log_warn("migration %s role=%s: not moved to the vmigd taking over: %s; it carries on here",
		 m->key, px_role_str(m->role), why);
	m->move_fn(m->move_arg, m->key, m->role, NULL, why);
}

/* Every link holds still: what the other vmigd needs, with the fds it copies. */
static struct px_move *describe(struct px_migration *m)
{
	struct px_node *n = m->n;
	struct px_move *mv = calloc(1, sizeof(*mv));

	if (!mv)
		return NULL;
	strcpy(mv->key, m->key);
	mv->role = m->role;
	mv->tls = m->tls;
	mv->cap = m->cap;
	mv->age_ms = px_now(n) - m->started_ms;
	mv->dirfd = -1;
	if (m->role == PX_ROLE_TARGET) {
		memcpy(mv->secret, m->secret, sizeof(mv->secret));
		if (m->peer_bound) {
			snprintf(mv->peer_addr, sizeof(mv->peer_addr), "%s", m->peer_addr);
			snprintf(mv->peer_name, sizeof(mv->peer_name), "%s", m->peer_name);
		}
	} else {
		mv->target = m->target;
		mv->dirfd = m->dirfd;
	}
	mv->nports = m->nports;
	for (unsigned int i = 0; i < m->nports; i++) {
		const struct px_port *p = &m->ports[i];

		mv->ports[i].id = p->id;
		snprintf(mv->ports[i].path, sizeof(mv->ports[i].path), "%s", p->path);
		mv->ports[i].lfd = m->role == PX_ROLE_SOURCE ? p->lfd : -1;
		mv->ports[i].next_seq =
			m->role == PX_ROLE_SOURCE ? p->next_seq : px_order_next(p->order);
	}
	vm_list_each (struct px_conn, c, &m->conns, node) {
		struct px_move_conn *mc = &mv->conns[mv->nconns++];

		if (IO(n, link_state, c->link, &mc->st) < 0) {
			free(mv);
			return NULL;
		}
		mc->port = c->port->id;
		mc->seq = c->seq;
		mc->fd = mc->st.fd;
		memcpy(mc->token, c->token, sizeof(mc->token));
		mc->digest = c->digest;
		snprintf(mc->peer, sizeof(mc->peer), "%s", c->peer);
		snprintf(mc->addr, sizeof(mc->addr), "%s", c->addr);
	}
	return mv;
}

static void offer(struct px_migration *m)
{
	struct px_move *mv = describe(m);

	IO(m->n, timer_del, m->move_timer);
	m->move_timer = NULL;
	if (!mv) {
		px_move_off(m, "its links cannot be described (out of memory)");
		return;
	}
	m->offered = true;
	log_info("migration %s role=%s: its %u connections hold still, everything sent "
		 "acknowledged and everything taken delivered; offered to the vmigd taking over",
		 m->key, px_role_str(m->role), mv->nconns);
	m->move_fn(m->move_arg, m->key, m->role, mv, NULL);
}

static void move_due(void *arg)
{
	struct px_migration *m = arg;
	char why[96];

	m->move_timer = NULL;
	if (m->quiet == 0) {
		offer(m);
		return;
	}
	snprintf(why, sizeof(why), "%u of its connections did not hold still within %d ms",
		 m->quiet, PX_MOVE_QUIESCE_MS);
	vm_list_each (struct px_conn, c, &m->conns, node) {
		uint64_t acked, sent;

		if (!c->quiescing)
			continue;
		IO(m->n, link_range, c->link, &acked, &sent);
		log_info("migration %s role=%s: port %u connection %u did not hold still: %llu of "
			 "the %llu bytes it sent acknowledged",
			 m->key, px_role_str(m->role), c->port->id, c->seq,
			 (unsigned long long)acked, (unsigned long long)sent);
	}
	px_move_off(m, why);
}

int px_migration_move_begin(struct px_node *n, const char *key, enum px_role role, px_move_fn fn,
			    void *arg, char *why, size_t whylen)
{
	struct px_migration *m = px_migration_find(n, key, role);
	const char *no;

	if (!m) {
		snprintf(why, whylen, "no such migration");
		return -ENOENT;
	}
	no = unmovable(m);
	if (no) {
		snprintf(why, whylen, "%s", no);
		return -EBUSY;
	}
	m->quiet = 0;
	vm_list_each (struct px_conn, c, &m->conns, node)
		m->quiet++;
	/* with no connection to wait for, the offer is due at once (never from here) */
	if (IO(n, timer_add, px_now(n) + (m->quiet ? PX_MOVE_QUIESCE_MS : 0), move_due, m,
	       &m->move_timer) < 0) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	m->moving = true;
	m->offered = false;
	m->move_fn = fn;
	m->move_arg = arg;
	vm_list_each (struct px_conn, c, &m->conns, node) {
		c->quiescing = true;
		IO(n, link_quiesce, c->link, true);
	}
	return 0;
}

void px_move_quiesced(struct px_conn *c, const struct xp_link_result *res)
{
	struct px_migration *m = c->m;
	char why[128];

	if (!m->moving || !c->quiescing)
		return; /* late: the move is off, and the link was told to go on */
	c->quiescing = false;
	if (res->err) {
		snprintf(why, sizeof(why), "port %u connection %u cannot hold still (%s)",
			 c->port->id, c->seq, "a direction is at its end, or it lost its node hop");
		px_move_off(m, why);
		return;
	}
	c->quiesced = true;
	if (--m->quiet == 0)
		offer(m);
}

void px_migration_move_end(struct px_node *n, struct px_move *mv, bool moved, const char *to)
{
	struct px_migration *m = px_migration_find(n, mv->key, mv->role);

	free(mv);
	if (!m || !m->moving || !m->offered)
		return;
	m->moving = m->offered = false;
	if (!moved) {
		unquiesce(m);
		log_warn("migration %s role=%s: %s did not take it; it carries on here", m->key,
			 px_role_str(m->role), to);
		return;
	}
	m->moved = true;
	snprintf(m->moved_to, sizeof(m->moved_to), "%s", to);
	/* Its sockets are the other's now: the listeners close here, their files stay. */
	if (m->dirfd >= 0)
		close(m->dirfd);
	m->dirfd = -1;
	for (unsigned int i = 0; i < m->nports; i++)
		px_port_close(&m->ports[i]);
	vm_list_each (struct px_conn, c, &m->conns, node)
		IO(n, link_release, c->link);
	log_info("migration %s role=%s: moved to %s with its %u connections, which resume there",
		 m->key, px_role_str(m->role), to, m->conns_active);
	vm_list_del(&m->node);
	m->stopping = true;
	vm_list_add(&n->stopped, &m->node);
	px_node_dirty(n);
	px_node_share(n);
}

void px_move_finish(struct px_migration *m)
{
	log_info("migration %s role=%s: its links here have let go (%s carries it on, and writes "
		 "its stop line)",
		 m->key, px_role_str(m->role), m->moved_to);
}

/* ---- the new side ---- */

static struct px_port *port_of(struct px_migration *m, uint32_t id)
{
	for (unsigned int i = 0; i < m->nports; i++)
		if (m->ports[i].id == id)
			return &m->ports[i];
	return NULL;
}

/* The move's own consistency: what a bad description would trip over further on. */
static int check_move(struct px_node *n, const struct px_move *mv, char *err, size_t errlen)
{
	uint32_t ids[PX_PORTS_MAX];
	int r = px_check_key(n, mv->key, err, errlen);

	if (r < 0)
		return r;
	if (px_migration_find(n, mv->key, mv->role)) {
		snprintf(err, errlen, "a migration with that key and role is here already");
		return -EEXIST;
	}
	if (mv->nports > PX_PORTS_MAX || mv->nconns > PX_MOVE_CONNS_MAX) {
		snprintf(err, errlen, "too many ports or connections");
		return -EINVAL;
	}
	for (unsigned int i = 0; i < mv->nports; i++)
		ids[i] = mv->ports[i].id;
	r = px_check_ports(mv->nports, ids, err, errlen);
	if (r < 0)
		return r;
	if (mv->role == PX_ROLE_SOURCE &&
	    (mv->target.kubevirt || mv->target.nports != mv->nports || mv->dirfd < 0)) {
		snprintf(err, errlen, "a source without its target's map or socket directory");
		return -EINVAL;
	}
	for (unsigned int i = 0; i < mv->nports; i++) {
		if (mv->role == PX_ROLE_SOURCE && mv->ports[i].lfd < 0) {
			snprintf(err, errlen, "port %u comes without its listener", ids[i]);
			return -EINVAL;
		}
		if (!mv->ports[i].path[0] ||
		    memchr(mv->ports[i].path, 0, sizeof(mv->ports[i].path)) == NULL) {
			snprintf(err, errlen, "port %u has no path", ids[i]);
			return -EINVAL;
		}
	}
	for (unsigned int i = 0; i < mv->nconns; i++) {
		bool known = false;

		for (unsigned int j = 0; j < mv->nports; j++)
			known |= mv->ports[j].id == mv->conns[i].port;
		for (unsigned int j = 0; j < i; j++)
			if (mv->conns[j].port == mv->conns[i].port &&
			    mv->conns[j].seq == mv->conns[i].seq)
				known = false;
		if (!known || mv->conns[i].fd < 0) {
			snprintf(err, errlen,
				 "connection %u names no port of it, twice, or no socket", i);
			return -EINVAL;
		}
	}
	return 0;
}

/* The migration's record, with its ports and no connection yet. */
static int adopt_record(struct px_node *n, struct px_move *mv, struct px_migration **ret, char *err,
			size_t errlen)
{
	struct px_start o = { .cap = mv->cap, .tls = mv->tls ? PX_TLS_ON : PX_TLS_OFF };
	struct px_migration *m;
	bool tls;
	int r;

	r = px_tls_choose(n, o.tls, &tls, err, errlen);
	if (r < 0)
		return r;
	if (mv->role == PX_ROLE_TARGET) {
		struct px_port_info ports[PX_PORTS_MAX];
		struct px_portmap out;

		memset(ports, 0, sizeof(ports));
		for (unsigned int i = 0; i < mv->nports; i++) {
			ports[i].id = mv->ports[i].id;
			strcpy(ports[i].path, mv->ports[i].path);
		}
		o.has_secret = true;
		memcpy(o.secret, mv->secret, sizeof(o.secret));
		r = px_target_start(n, mv->key, mv->nports, ports, &o, &out, err, errlen);
		if (r < 0)
			return r;
		m = px_migration_find(n, mv->key, PX_ROLE_TARGET);
		m->peer_bound = mv->peer_addr[0] != '\0';
		snprintf(m->peer_addr, sizeof(m->peer_addr), "%s", mv->peer_addr);
		snprintf(m->peer_name, sizeof(m->peer_name), "%s", mv->peer_name);
		for (unsigned int i = 0; i < m->nports; i++)
			px_order_set_next(m->ports[i].order, mv->ports[i].next_seq);
	} else {
		m = px_migration_new(n, mv->key, PX_ROLE_SOURCE);
		if (!m) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		m->target = mv->target;
		if (xp_addr_from_host(mv->target.address, mv->target.port, &m->peer) < 0) {
			px_migration_discard(m);
			snprintf(err, errlen, "bad target address %s", mv->target.address);
			return -EINVAL;
		}
		xp_addr_format(&m->peer, m->peer_str, sizeof(m->peer_str));
		m->tls = tls;
		m->opts = o;
		m->nports = mv->nports;
		px_migration_set_cap_now(m, mv->cap);
		for (unsigned int i = 0; i < m->nports; i++) {
			struct px_port *p = &m->ports[i];

			p->id = mv->ports[i].id;
			p->tcp = mv->target.port;
			xp_addr_from_host(mv->target.address, p->tcp, &p->peer);
			strcpy(p->path, mv->ports[i].path);
			p->next_seq = mv->ports[i].next_seq;
		}
		vm_list_add(&n->migrations, &m->node);
	}
	m->started_ms = px_now(n) > mv->age_ms ? px_now(n) - mv->age_ms : 0;
	*ret = m;
	return 0;
}

/* One connection: its link starts suspended (its report follows through px_conn_done). */
static int adopt_conn(struct px_migration *m, struct px_move_conn *mc, char *err, size_t errlen)
{
	struct px_node *n = m->n;
	struct xp_link_opts o;
	struct px_conn *c = calloc(1, sizeof(*c));
	int r;

	if (!c) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->n = n;
	c->m = m;
	c->port = port_of(m, mc->port);
	c->seq = mc->seq;
	c->lfd = -1;
	c->resumable = c->adopted = true;
	c->digest = mc->digest;
	memcpy(c->token, mc->token, sizeof(c->token));
	snprintf(c->peer, sizeof(c->peer), "%s", mc->peer);
	snprintf(c->addr, sizeof(c->addr), "%s", mc->addr);
	/* no inspector: the stream is followed from its start or not at all */
	px_conn_link_opts(c, &o);
	o.adopt = &mc->st;
	o.adopt_tls = m->tls;
	r = IO(n, attach, mc->fd, NULL, &o, &c->link);
	if (r < 0) {
		free(c);
		snprintf(err, errlen, "port %u connection %u: cannot carry its link: %s", mc->port,
			 mc->seq, strerror(-r));
		return r;
	}
	mc->fd = -1; /* the link's */
	c->st = C_LINKED;
	vm_list_add(&m->conns, &c->node);
	m->conns_active++;
	m->conns_total++;
	c->port->conns_total++;
	n->conns_total++;
	return 0;
}

int px_migration_adopt(struct px_node *n, struct px_move *mv, const char *from, char *err,
		       size_t errlen)
{
	struct px_migration *m;
	int r;

	r = check_move(n, mv, err, errlen);
	if (r < 0)
		return r;
	r = adopt_record(n, mv, &m, err, errlen);
	if (r < 0)
		return r;
	for (unsigned int i = 0; i < mv->nconns; i++) {
		r = adopt_conn(m, &mv->conns[i], err, errlen);
		if (r < 0)
			goto undo;
	}
	if (m->role == PX_ROLE_SOURCE) {
		for (unsigned int i = 0; i < m->nports; i++) {
			struct px_port *p = &m->ports[i];

			p->lfd = mv->ports[i].lfd;
			mv->ports[i].lfd = -1;
			r = IO(n, watch_add, p->lfd, EPOLLIN, px_source_accept, p, &p->w);
			if (r < 0) {
				snprintf(err, errlen, "out of memory");
				goto undo;
			}
		}
		m->dirfd = mv->dirfd;
		mv->dirfd = -1;
	}
	px_node_share(n);
	log_info("migration %s role=%s: moved here from %s with %u connections, %s; each resumes "
		 "over a new node-hop connection",
		 m->key, px_role_str(m->role), from, mv->nconns, m->peer_str[0] ? m->peer_str : "");
	return 0;

undo:
	/* What was handed to links goes back without a reset: the old vmigd carries on. */
	snprintf(m->moved_to, sizeof(m->moved_to), "%s again", from);
	m->moved = true;
	if (m->dirfd >= 0) {
		close(m->dirfd);
		m->dirfd = -1;
	}
	for (unsigned int i = 0; i < m->nports; i++) {
		IO(n, watch_del, m->ports[i].w);
		m->ports[i].w = NULL;
		if (m->ports[i].lfd >= 0)
			close(m->ports[i].lfd);
		m->ports[i].lfd = -1;
	}
	vm_list_each (struct px_conn, c, &m->conns, node)
		IO(n, link_release, c->link);
	vm_list_del(&m->node);
	m->stopping = true;
	vm_list_add(&n->stopped, &m->node);
	px_node_dirty(n);
	return r;
}
