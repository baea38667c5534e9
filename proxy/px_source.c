// SPDX-License-Identifier: Apache-2.0
/* The source role: QEMU connects to a unix socket per logical port; each connection gets its
 * sequence number in accept order, its own node-hop connection (TLS first, then the preamble),
 * and is relayed only once the target answered that it opened the local side in order. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "px_private.h"

/*
 * Raw over TLS 1.3: how long a source waits for a stock target's first record (its session
 * ticket, or the alert that refuses our certificate) before it relays anyway. A Go server sends
 * its ticket at once; one that sends none costs this much once per connection.
 */
#define RAW_AWAIT_MS 1000

static void src_error(struct px_conn *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void src_error(struct px_conn *c, const char *fmt, ...)
{
	char msg[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (c->verify) {
		/* a report, not a QEMU connection: the migration itself is not hurt */
		px_verify_lost(c, msg, false);
		return;
	}
	if (c->resuming) {
		/* an attempt to carry a connection on: the next one follows */
		px_resume_failed(c, msg);
		return;
	}
	c->m->conns_failed++;
	log_err("migration %s role=source: port %u connection %u to %s: %s", c->m->key, c->port->id,
		c->seq, c->peer, msg);
	px_conn_release(c);
}

static void src_link(struct px_conn *c);

static void src_timeout(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	if (c->st == C_SRC_AWAIT) {
		log_debug("migration %s role=source: port %u connection %u: no record from %s "
			  "within %d ms of the handshake; relaying",
			  c->m->key, c->port->id, c->seq, c->peer, RAW_AWAIT_MS);
		src_link(c);
	} else if (c->st == C_SRC_HANDSHAKE) {
		px_count_refusal_of(c->n, PX_REFUSAL_HANDSHAKE_TIMEOUT);
		src_error(c,
			  "TLS refused (handshake-timeout): no complete handshake within %llu ms",
			  (unsigned long long)c->n->conf.handshake_timeout_ms);
	} else
		src_error(c, c->st == C_SRC_CONNECT ? "connect timed out"
			     : c->st == C_SRC_SEND  ? "sending the preamble timed out"
						    : "no reply from the target in time");
}

/* TLS errors during set-up name the refusal; others are plain socket errors. */
static void src_io_error(struct px_conn *c, const char *what, ssize_t k)
{
	struct xp_conn_why why;

	IO(c->n, why, c->hop, (int)k, &why);
	px_count_refusal(c->n, &why);
	if (why.token)
		src_error(c, "TLS refused (%s) %s: %s", why.token, what, why.detail);
	else if (why.detail)
		src_error(c, "%s: TLS: %s", what, why.detail);
	else
		src_error(c, "%s: %s", what, strerror((int)-k));
}

static void src_io(struct xp_watch *w, int fd, uint32_t events, void *arg);

/* Waits for events on the node-hop socket; the deadline is set on entering a state, not reset. */
static void src_set_wait(struct px_conn *c, enum conn_state st, uint32_t events, uint64_t ms)
{
	struct px_node *n = c->n;

	if (c->st != st || !c->t) {
		IO(n, timer_del, c->t);
		c->t = NULL;
		if (IO(n, timer_add, px_now(n) + ms, src_timeout, c, &c->t) < 0)
			goto nomem;
	}
	c->st = st;
	if ((c->w ? IO(n, watch_mod, c->w, events)
		  : IO(n, watch_add, c->hop->fd, events, src_io, c, &c->w)) < 0)
		goto nomem;
	return;
nomem:
	src_error(c, "out of memory");
}

static void src_read_reply(struct px_conn *c);

static void src_send(struct px_conn *c)
{
	uint32_t ev = EPOLLOUT;
	ssize_t k = 0;

	while (c->off < c->len) {
		k = IO(c->n, write, c->hop, c->buf + c->off, c->len - c->off, &ev);
		if (k <= 0)
			break;
		c->off += k;
	}
	if (k < 0 && k != -EAGAIN) {
		src_io_error(c, "sending the preamble", k);
		return;
	}
	if (c->off < c->len) {
		src_set_wait(c, C_SRC_SEND, ev, c->n->conf.connect_timeout_ms);
		return;
	}
	c->len = 0;
	/* The target answers only once it could open the local socket in order. */
	src_read_reply(c);
}

static void src_start_send(struct px_conn *c)
{
	struct px_preamble p = { .version = PX_PROTO_VERSION, .port = c->port->id, .seq = c->seq };
	int r;

	strcpy(p.key, c->m->key);
	p.has_secret = c->m->target.has_secret;
	memcpy(p.secret, c->m->target.secret, PX_SECRET_LEN);
	if (c->resuming) {
		if (!c->resumes) {
			px_conn_release(c); /* the connection it was for has gone */
			return;
		}
		p.resume = true;
		memcpy(p.token, c->resumes->token, PX_TOKEN_LEN);
		p.have = c->resumes->have;
	} else if (c->verify) {
		p.verify = true;
		p.dg = c->dg;
	} else {
		p.digest = c->digest = px_verify_wanted(c);
	}
	p.resumable = px_resume_wanted(c);
	p.compress = c->zout_offered =
		p.resumable && !c->resuming && c->m->target.compress && px_compress_wanted(c);
	c->zdpdk_offered = false;
	/* not while the hop's link is down or the target's address unreachable (px_dpdk.c) */
	c->dpdk_offered = !c->verify && !c->resuming && px_dpdk_can(c) &&
			  px_dpdk_usable(c->n, c->m->target.dpdk.ip);
	if (c->dpdk_offered) {
		/* the target sets the top bit (px_target.c says why) */
		p.dpdk = c->n->dpdk;
		p.dpdk.stream = (c->n->dpdk_next++ % 0x7fffffffu) + 1;
		p.dpdk_resume = c->dpdk_resume_offered = p.resumable && c->m->target.resume_dpdk;
		p.compress_dpdk = c->zdpdk_offered =
			p.compress && p.dpdk_resume && c->m->target.compress_dpdk;
	}
	r = px_preamble_encode(&p, c->buf, sizeof(c->buf));
	if (r < 0) {
		src_error(c, "cannot encode the preamble: %s", strerror(-r));
		return;
	}
	c->len = r;
	c->off = 0;
	src_send(c);
}

static void src_link(struct px_conn *c)
{
	int r = px_conn_link(c);

	if (r < 0)
		src_error(c, "cannot hand to the data path: %s", strerror(-r));
}

/* Raw: relay once the server's first record is in (TLS 1.3), or at once. */
static void src_await(struct px_conn *c)
{
	struct xp_conn_why why;
	uint32_t ev = EPOLLIN;
	int r;

	r = IO(c->n, await_server, c->hop, &ev);
	if (r == -EAGAIN) {
		src_set_wait(c, C_SRC_AWAIT, ev, RAW_AWAIT_MS);
		return;
	}
	if (r < 0) {
		IO(c->n, why, c->hop, r, &why);
		px_count_refusal(c->n, &why);
		if (why.token)
			src_error(c, "TLS refused (%s): %s", why.token, why.detail);
		else
			src_error(c, "after the handshake: %s", strerror(-r));
		return;
	}
	src_link(c);
}

/* Connected: TLS first when configured (done at once in plain text), then the preamble. */
static void src_handshake(struct px_conn *c)
{
	struct xp_conn_why why;
	uint32_t ev = EPOLLIN;
	int r;

	/* A digest report takes no part in resumption: it neither offers nor keeps a ticket, so
	 * that it never changes which session a migration's own connections resume. */
	r = IO(c->n, handshake, c->hop, (c->m->tls ? XP_HS_TLS : 0) | (c->verify ? XP_HS_FRESH : 0),
	       &ev);
	if (r == -EAGAIN) {
		src_set_wait(c, C_SRC_HANDSHAKE, ev, c->n->conf.handshake_timeout_ms);
		return;
	}
	if (r < 0) {
		IO(c->n, why, c->hop, r, &why);
		px_count_refusal(c->n, &why);
		if (!why.token) {
			src_error(c, "TLS: %s", strerror(-r));
			return;
		}
		src_error(c, "TLS refused (%s): %s%s", why.token, why.detail,
			  why.closed ? " (is the target over its --max-unauthenticated, "
				       "shutting down, or not speaking TLS?)"
				     : "");
		return;
	}
	IO(c->n, conn_info, c->hop, &c->tls);
	/* KubeVirt's map and no vmigd on the far side (no ALPN): a stock peer, raw. */
	c->raw = c->m->kubevirt && !c->tls.vmigd;
	if (c->raw && (c->verify || c->resuming)) {
		src_error(c, "the target no longer speaks vmigd's protocol on this port");
		return;
	}
	if (c->raw)
		src_await(c);
	else
		src_start_send(c);
}

static void src_read_reply(struct px_conn *c)
{
	enum px_status st;
	uint32_t ev = EPOLLIN;
	ssize_t k = 0;
	size_t want;
	int r = 0;

	/* exactly the reply: on the kernel path QEMU's bytes follow it */
	while (c->len < (want = px_reply_len(c->buf, c->len))) {
		k = IO(c->n, read, c->hop, c->buf + c->len, want - c->len, &ev);
		if (k <= 0)
			break;
		c->len += k;
	}
	if (k == 0 && c->len < want) {
		src_error(c, "the target closed the connection before replying");
		return;
	}
	if (k < 0 && k != -EAGAIN) {
		src_io_error(c, "reading the reply", k);
		return;
	}
	if (c->len < want) {
		src_set_wait(c, C_SRC_REPLY, ev,
			     c->verify
				     ? VERIFY_ANSWER_MS
				     : c->n->conf.order_timeout_ms + c->n->conf.connect_timeout_ms);
		return;
	}
	if (c->verify) {
		px_verify_answered(c);
		return;
	}
	if (c->resuming) {
		px_resume_answered(c);
		return;
	}
	r = px_reply_decode(c->buf, c->len, &st, &c->dpdk);
	if (r < 0) {
		src_error(c, "the target's reply is malformed (not a vmigd of this protocol?)");
		return;
	}
	if (st == PX_ERR_LIMIT) {
		src_error(c, "refused (migration-conn-limit) by the target: %s", px_status_str(st));
		return;
	}
	if ((st == PX_OK_DPDK || st == PX_OK_DPDK_RESUMABLE) && !c->dpdk_offered) {
		src_error(c, "the target chose the DPDK node hop, which this side did not offer");
		return;
	}
	if ((st == PX_OK_RESUMABLE && !px_resume_wanted(c)) ||
	    (st == PX_OK_DPDK_RESUMABLE && !c->dpdk_resume_offered)) {
		src_error(c, "the target made resumable a connection this side did not offer");
		return;
	}
	if (st != PX_OK && st != PX_OK_DPDK && st != PX_OK_RESUMABLE &&
	    st != PX_OK_DPDK_RESUMABLE) {
		src_error(c, "refused by the target: %s", px_status_str(st));
		return;
	}
	if (st != PX_OK_DPDK && st != PX_OK_DPDK_RESUMABLE)
		memset(&c->dpdk, 0, sizeof(c->dpdk));
	if (st == PX_OK_RESUMABLE || st == PX_OK_DPDK_RESUMABLE) {
		c->resumable = true;
		px_reply_token(c->buf, c->token);
	}
	/* the target decodes chunks on a resumable kernel-path connection it was asked for */
	c->zout_offered = c->zout_offered && (st == PX_OK_RESUMABLE ||
					      (st == PX_OK_DPDK_RESUMABLE && c->zdpdk_offered));
	src_link(c);
}

static void src_io(struct xp_watch *w, int fd, uint32_t events, void *arg)
{
	struct px_conn *c = arg;
	int r;

	switch (c->st) {
	case C_SRC_CONNECT:
		r = IO(c->n, connected, c->hop);
		if (r < 0) {
			c->refused = r == -ECONNREFUSED;
			src_error(c, "connect: %s", strerror(-r));
			return;
		}
		src_handshake(c);
		return;
	case C_SRC_HANDSHAKE:
		src_handshake(c);
		return;
	case C_SRC_SEND:
		src_send(c);
		return;
	case C_SRC_REPLY:
		src_read_reply(c);
		return;
	case C_SRC_AWAIT:
		src_await(c);
		return;
	default:
		return;
	}
}

void px_source_connect(struct px_conn *c)
{
	int r = IO(c->n, connect, &c->port->peer, c->m->peer_str, &c->hop);

	if (r < 0) {
		c->refused = r == -ECONNREFUSED;
		src_error(c, "connect: %s", strerror(-r));
		return;
	}
	if (r == 0) {
		src_handshake(c);
		return;
	}
	src_set_wait(c, C_SRC_CONNECT, EPOLLOUT, c->n->conf.connect_timeout_ms);
}

static void src_hold_done(void *arg)
{
	struct px_conn *c = arg;

	c->t = NULL;
	px_source_connect(c);
}

void px_source_accept(struct xp_watch *w, int lfd, uint32_t events, void *arg)
{
	struct px_port *port = arg;
	struct px_migration *m = port->m;
	struct px_node *n = m->n;
	int fd, r;

	while ((r = IO(n, accept_local, lfd, &fd)) == 0) {
		unsigned int hold;
		struct px_conn *c;

		if (m->conns_active >= n->conf.max_migration_conns) {
			log_err("migration %s role=source: port %u connection %u refused "
				"(migration-conn-limit): %u connections already "
				"(--max-migration-conns)",
				m->key, port->id, port->next_seq++, m->conns_active);
			IO(n, close_fd, fd, true);
			px_migration_fail(m, "more than %u connections (--max-migration-conns)",
					  n->conf.max_migration_conns);
			continue;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			log_err("migration %s: out of memory, dropping a connection", m->key);
			IO(n, close_fd, fd, false);
			continue;
		}
		c->n = n;
		c->m = m;
		c->port = port;
		c->lfd = fd;
		c->seq = port->next_seq++;
		xp_addr_format(&port->peer, c->peer, sizeof(c->peer));
		vm_list_add(&m->conns, &c->node);
		m->conns_active++;
		hold = m->opts.hook.hold_ms
			       ? m->opts.hook.hold_ms(m->opts.hook.arg, port->id, c->seq)
			       : 0;
		if (hold) {
			c->st = C_SRC_HELD;
			if (IO(n, timer_add, px_now(n) + hold, src_hold_done, c, &c->t) < 0)
				src_error(c, "out of memory");
			continue;
		}
		px_source_connect(c);
	}
	px_accept_failed(n, w, r, port->path);
}

static int make_socket_path(const char *dir, const char *key, uint32_t port, char *buf, size_t len)
{
	int r = port ? snprintf(buf, len, "%s/migrationproxy/%s-%u-source.sock", dir, key, port)
		     : snprintf(buf, len, "%s/migrationproxy/%s-source.sock", dir, key);

	return r < (int)len ? 0 : -ENAMETOOLONG;
}

/* Whether a running source was started with exactly this target, directory and options. */
static bool same_source(const struct px_migration *m, const struct px_portmap *t, const char *dir,
			const struct px_start *o, bool tls)
{
	char path[sizeof(m->ports[0].path)];

	if (m->tls != tls || m->opts.cap != o->cap || m->opts.compress != o->compress ||
	    m->kubevirt != t->kubevirt ||
	    strcmp(m->target.address, t->address) || m->target.port != t->port ||
	    m->nports != t->nports)
		return false;
	for (unsigned int i = 0; i < t->nports; i++) {
		if (m->ports[i].id != t->ports[i] || m->target.tcp[i] != t->tcp[i] ||
		    make_socket_path(dir, t->key, t->ports[i], path, sizeof(path)) < 0 ||
		    strcmp(path, m->ports[i].path))
			return false;
	}
	return true;
}

/* A path a live source migration (not except) listens on: two keys can name the same file
 * ("col" port 1 and "col-1" port 0), and the second must not take the first one's socket. */
static const struct px_port *path_served(const struct px_node *n, const char *path,
					 const struct px_migration *except)
{
	vm_list_each (const struct px_migration, m, &n->migrations, node) {
		if (m == except || m->role != PX_ROLE_SOURCE)
			continue;
		for (unsigned int i = 0; i < m->nports; i++)
			if (m->ports[i].lfd >= 0 && !strcmp(m->ports[i].path, path))
				return &m->ports[i];
	}
	return NULL;
}

/*
 * dir/migrationproxy/, where QEMU's user may write dir (a launcher's /var/run/kubevirt): dir
 * resolved without links (below /proc/PID/root: inside that root), migrationproxy made if
 * missing and then given its owner and mode through its own fd, never through a link put
 * there. m->dirfd holds it for the sockets.
 */
static int socket_dir(struct px_migration *m, int basefd, const char *dir, char *err,
		      size_t errlen)
{
	struct px_node *n = m->n;
	struct xp_unix_owner o = { n->conf.socket_uid, n->conf.socket_gid, 0750 };
	int r = xp_path_make_dir(basefd, "migrationproxy", &o, &m->dirfd);

	if (r < 0)
		snprintf(err, errlen, "cannot prepare %.200s/migrationproxy (owner %d:%d, mode 0750): %s",
			 dir, o.uid, o.gid,
			 r == -ENOTDIR ? "a file that is not a directory is in the way"
				       : xp_path_strerror(r));
	return r;
}

/* Source start's checks of its arguments, before anything is made; *tls: its node hop's. */
static int src_check_start(struct px_node *n, const struct px_portmap *t, const char *dir,
			   const struct px_start *opts, bool *tls, char *err, size_t errlen)
{
	int r;

	r = px_check_key(n, t->key, err, errlen);
	if (r < 0)
		return r;
	r = px_check_ports(t->nports, t->ports, err, errlen);
	if (r < 0)
		return r;
	r = px_tls_choose(n, opts->tls, tls, err, errlen);
	if (r < 0)
		return r;
	if (*tls) {
		struct xp_io_info info = { 0 };

		IO(n, info, &info);
		if (info.tls_client_problem) {
			snprintf(err, errlen, "%s", info.tls_client_problem);
			return -EINVAL;
		}
	}
	if (dir[0] != '/') {
		snprintf(err, errlen, "directory %.200s: give an absolute path", dir);
		return -EINVAL;
	}
	return 0;
}

/* Each port's peer and socket path, refused where another migration (but old) serves it. */
static int src_plan_ports(struct px_migration *m, const struct px_portmap *t, const char *dir,
			  const struct px_migration *old, char *err, size_t errlen)
{
	for (unsigned int i = 0; i < t->nports; i++) {
		struct px_port *p = &m->ports[i];
		const struct px_port *taken;
		int r;

		p->id = t->ports[i];
		p->tcp = t->kubevirt ? t->tcp[i] : t->port;
		xp_addr_from_host(t->address, p->tcp, &p->peer);
		r = make_socket_path(dir, t->key, p->id, p->path, sizeof(p->path));
		if (r < 0) {
			snprintf(err, errlen,
				 "socket path too long (at most %zu bytes) under %.60s",
				 sizeof(p->path) - 1, dir);
			return r;
		}
		taken = path_served(m->n, p->path, old);
		if (taken) {
			snprintf(err, errlen,
				 "socket %.100s is served by migration %.100s (port %u)", p->path,
				 taken->m->key, taken->id);
			return -EEXIST;
		}
	}
	return 0;
}

int px_source_start(struct px_node *n, const struct px_portmap *t, const char *dir,
		    const struct px_start *opts, struct px_port_info *out, char *err, size_t errlen)
{
	struct xp_unix_owner owner = { .uid = n->conf.socket_uid,
				       .gid = n->conf.socket_gid,
				       .mode = 0660 };
	char note[64];
	struct px_migration *m, *old;
	int basefd = -1;
	bool tls;
	int r;

	r = src_check_start(n, t, dir, opts, &tls, err, errlen);
	if (r < 0)
		return r;
	old = px_migration_find(n, t->key, PX_ROLE_SOURCE);
	if (old && same_source(old, t, dir, opts, tls)) {
		for (unsigned int i = 0; i < old->nports; i++) {
			out[i].id = old->ports[i].id;
			out[i].tcp = old->ports[i].tcp;
			strcpy(out[i].path, old->ports[i].path);
		}
		return 0;
	}
	r = xp_path_open_dir(dir, &basefd);
	if (r < 0) {
		snprintf(err, errlen, "directory %.200s: %s%s", dir,
			 r == -ENOENT ? "does not exist" : xp_path_strerror(r),
			 r == -ELOOP ? "; give it without links (/run, not /var/run), or as "
				       "/proc/PID/root/... of the process it belongs to"
				     : "");
		return r;
	}
	m = px_migration_new(n, t->key, PX_ROLE_SOURCE);
	if (!m) {
		close(basefd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = xp_addr_from_host(t->address, t->port, &m->peer);
	if (r < 0) {
		snprintf(err, errlen, "bad target address %s", t->address);
		goto fail;
	}
	if (t->kubevirt)
		xp_addr_host(&m->peer, m->peer_str, sizeof(m->peer_str));
	else
		xp_addr_format(&m->peer, m->peer_str, sizeof(m->peer_str));
	m->kubevirt = t->kubevirt;
	m->tls = tls;
	m->opts = *opts;
	m->target = *t;
	m->nports = t->nports;
	px_migration_set_cap_now(m, opts->cap);
	r = src_plan_ports(m, t, dir, old, err, errlen);
	if (r < 0)
		goto fail;
	/* Nothing changes on disk before the request is known to be good. */
	r = socket_dir(m, basefd, dir, err, errlen);
	if (r < 0)
		goto fail;
	/* Only now, once the new one can start: the old listeners go (as stop). */
	if (old) {
		log_warn("migration %s role=source: started again with another target or options; "
			 "the old listeners stop",
			 t->key);
		px_migration_stop(old);
	}
	for (unsigned int i = 0; i < t->nports; i++) {
		struct px_port *p = &m->ports[i];

		r = IO(n, listen_unix, m->dirfd, px_port_name(p), &owner, &p->lfd);
		if (r < 0) {
			snprintf(err, errlen, "cannot listen on %s: %s", p->path,
				 r == -EEXIST ? "a file that is not a socket is in the way"
					      : xp_path_strerror(r));
			goto fail;
		}
		r = IO(n, watch_add, p->lfd, EPOLLIN, px_source_accept, p, &p->w);
		if (r < 0) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		out[i].id = p->id;
		out[i].tcp = p->tcp;
		strcpy(out[i].path, p->path);
	}
	close(basefd);
	vm_list_add(&n->migrations, &m->node);
	log_info("migration %s role=source start ports=%u%s target=%s%s sockets=%s%s%s%s", t->key,
		 m->ports[0].id, m->nports > 1 ? ",..." : "", m->peer_str,
		 m->kubevirt ? " kubevirt" : "", m->ports[0].path, m->nports > 1 ? ",..." : "",
		 tls == (n->conf.tls != NULL) ? ""
		 : tls			      ? " tls=on"
					      : " tls=off",
		 px_cap_note(opts->cap, note, sizeof(note)));
	return 0;

fail:
	close(basefd);
	for (unsigned int i = 0; i < m->nports; i++)
		px_port_close(&m->ports[i]);
	px_migration_discard(m);
	return r;
}

int px_source_stop(struct px_node *n, const char *key, char *err, size_t errlen)
{
	struct px_migration *m = px_migration_find(n, key, PX_ROLE_SOURCE);

	if (!m) {
		snprintf(err, errlen, "unknown migration %.130s: no source listener with that key",
			 key);
		return -ENOENT;
	}
	px_migration_stop(m);
	return 0;
}

/* A source's socket is its own: it goes with its listener. */
static void src_port_closed(struct px_port *p)
{
	if (p->m->dirfd >= 0)
		xp_unix_unlink_at(p->m->dirfd, px_port_name(p));
}

static bool src_stop_keeps_ports(const struct px_migration *m)
{
	return false;
}

const struct px_role_ops px_source_ops = {
	.port_closed = src_port_closed,
	.stop_keeps_ports = src_stop_keeps_ports,
};
